"""A small load generator for what redis-benchmark cannot express.

Owns: filling a stream fast (pipelined XADD over one raw socket) and a
consumer-group loop (XREADGROUP COUNT n then XACK of what came back). Talks
RESP over a plain socket with hiredis parsing replies, so the client costs as
little as it can and the server's cost is what the figures show.
"""

from __future__ import annotations

import socket
import time

import hiredis


def _cmd(*parts: bytes | str) -> bytes:
    out = [b"*%d\r\n" % len(parts)]
    for p in parts:
        b = p.encode() if isinstance(p, str) else p
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


class Client:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = hiredis.Reader()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def replies(self, n: int) -> list:
        out = []
        while len(out) < n:
            reply = self.reader.gets()
            if reply is False:
                chunk = self.sock.recv(1 << 20)
                if not chunk:
                    raise ConnectionError("server closed the connection")
                self.reader.feed(chunk)
                continue
            if isinstance(reply, hiredis.ReplyError):
                raise RuntimeError(f"server error: {reply}")
            out.append(reply)
        return out

    def call(self, *parts: bytes | str):
        self.send(_cmd(*parts))
        return self.replies(1)[0]

    def close(self) -> None:
        self.sock.close()


def fill_stream(port: int, key: str, count: int, *, value_bytes: int = 100, pipeline: int = 1000) -> None:
    """Append ``count`` entries of one field with a ``value_bytes`` value."""
    client = Client(port)
    one = _cmd("XADD", key, "*", "field", "v" * value_bytes)
    sent = 0
    while sent < count:
        n = min(pipeline, count - sent)
        client.send(one * n)
        client.replies(n)
        sent += n
    client.close()


def group_consume(port: int, key: str, total: int, *, count: int = 100, group: str = "g",
                  consumer: str = "c1") -> tuple[float, int, int, float | None, float | None]:
    """Read ``total`` entries through a group, acking each batch.

    Returns (seconds, requests, entries, p50_ms, p99_ms), a request being one
    XREADGROUP or one XACK round trip.
    """
    client = Client(port)
    client.call("XGROUP", "CREATE", key, group, "0")
    latencies: list[float] = []
    entries = requests = 0
    started = time.monotonic()
    while entries < total:
        t0 = time.monotonic()
        reply = client.call("XREADGROUP", "GROUP", group, consumer, "COUNT", str(count), "STREAMS", key, ">")
        latencies.append(time.monotonic() - t0)
        requests += 1
        if not reply:
            break
        batch = reply[0][1]
        ids = [e[0] for e in batch]
        if not ids:
            break
        t0 = time.monotonic()
        client.call("XACK", key, group, *ids)
        latencies.append(time.monotonic() - t0)
        requests += 1
        entries += len(ids)
    seconds = time.monotonic() - started
    client.close()
    latencies.sort()
    p50 = 1000 * latencies[len(latencies) // 2] if latencies else None
    p99 = 1000 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] if latencies else None
    return seconds, requests, entries, p50, p99


def mixed_consume(port: int, consumer_keys: list[list[str]], total: int, *, group: str = "g",
                  count: int = 100, block_ms: int = 100, timeout_s: float = 600.0):
    """Start one consumer thread per entry of ``consumer_keys``; returns a handle.

    Each consumer loops ``XREADGROUP GROUP <group> c<i> COUNT <count> BLOCK
    <block_ms> STREAMS <its keys> > ...`` and XACKs each batch on the key the
    reply names (a Partita topic key replies with partition keys), until the
    consumers together have read ``total`` entries. ``handle.join()`` returns
    (seconds since start, requests, entries, p50_ms, p99_ms).
    """
    import threading

    state = {"entries": 0, "requests": 0, "latencies": [], "error": None}
    lock = threading.Lock()
    started = time.monotonic()
    deadline = started + timeout_s

    def consume(i: int, keys: list[str]) -> None:
        client = Client(port)
        cmd = ["XREADGROUP", "GROUP", group, f"c{i}", "COUNT", str(count), "BLOCK", str(block_ms),
               "STREAMS", *keys, *([">"] * len(keys))]
        try:
            while time.monotonic() < deadline:
                with lock:
                    if state["entries"] >= total:
                        return
                t0 = time.monotonic()
                reply = client.call(*cmd)
                lat = [time.monotonic() - t0]
                got = 0
                requests = 1
                for key, batch in reply or ():
                    ids = [e[0] for e in batch]
                    if ids:
                        t0 = time.monotonic()
                        client.call("XACK", key, group, *ids)
                        lat.append(time.monotonic() - t0)
                        requests += 1
                        got += len(ids)
                with lock:
                    state["entries"] += got
                    state["requests"] += requests
                    state["latencies"].extend(lat)
        except Exception as e:  # noqa: BLE001 - reported by join()
            state["error"] = e
        finally:
            client.close()

    threads = [threading.Thread(target=consume, args=(i, keys), daemon=True)
               for i, keys in enumerate(consumer_keys)]
    for t in threads:
        t.start()

    class Handle:
        def join(self):
            for t in threads:
                t.join(max(0.0, deadline - time.monotonic()) + 5)
            if state["error"] is not None:
                raise RuntimeError(f"consumer failed: {state['error']}")
            seconds = time.monotonic() - started
            lats = sorted(state["latencies"])
            p50 = 1000 * lats[len(lats) // 2] if lats else None
            p99 = 1000 * lats[min(len(lats) - 1, int(len(lats) * 0.99))] if lats else None
            return seconds, state["requests"], state["entries"], p50, p99

    return Handle()
