"""A small load generator for what redis-benchmark cannot express.

Owns: filling a stream fast (pipelined XADD over one raw socket) and
consumer-group loops (XREADGROUP COUNT n then XACK of what came back): a
group's consumers in processes of their own over a finished stream, or in
threads beside running producers. Talks RESP over a plain socket with
hiredis parsing replies, so the client costs as little as it can and the
server's cost is what the figures show.
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


def _percentiles_ms(latencies: list[float]) -> tuple[float | None, float | None]:
    """(p50, p99) in ms of round-trip times in seconds; (None, None) for none."""
    if not latencies:
        return None, None
    latencies = sorted(latencies)
    return 1000 * latencies[len(latencies) // 2], 1000 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]


def _group_consumer(port: int, key: str, group: str, consumer: str, count: int, barrier, results) -> None:
    """One consumer process of ``group_consumers``: connect, wait for the
    others at ``barrier``, then XREADGROUP ``>`` and XACK each batch until a
    read comes back empty. Puts (consumer, started, ended, requests, entries,
    latencies, error) on ``results``, started and ended by ``time.monotonic``
    (CLOCK_MONOTONIC, one clock for every process of the machine)."""
    try:
        client = Client(port)
        read = _cmd("XREADGROUP", "GROUP", group, consumer, "COUNT", str(count), "STREAMS", key, ">")
        latencies: list[float] = []
        entries = requests = 0
        barrier.wait(60)
        started = time.monotonic()
        while True:
            t0 = time.monotonic()
            client.send(read)
            reply = client.replies(1)[0]
            latencies.append(time.monotonic() - t0)
            requests += 1
            # Nothing prefilled is left undelivered in the group once ">"
            # answers nothing (no producer runs): this consumer is done.
            batches = [(k, [e[0] for e in batch]) for k, batch in reply or () if batch]
            if not batches:
                break
            for batch_key, ids in batches:  # a Partita topic key replies with partition keys
                t0 = time.monotonic()
                acked = client.call("XACK", batch_key, group, *ids)
                latencies.append(time.monotonic() - t0)
                requests += 1
                if acked != len(ids):
                    raise RuntimeError(f"XACK of {len(ids)} IDs just read acked {acked}")
                entries += len(ids)
        ended = time.monotonic()
        client.close()
        results.put((consumer, started, ended, requests, entries, latencies, None))
    except BaseException as e:  # reported by the parent, which then fails
        barrier.abort()
        results.put((consumer, None, None, 0, 0, [], f"{type(e).__name__}: {e}"))


def group_consumers(port: int, key: str, consumers: int, *, count: int = 100, group: str = "g",
                    timeout_s: float = 1800.0) -> tuple[float, int, int, float | None, float | None]:
    """Consume the whole (prefilled, no longer written) stream ``key``
    through a new group, ``consumers`` consumers c1..c<n> at once.

    Each consumer is its own OS process on its own connection (one Python
    process's threads share the GIL: the client would be what the figures
    measure), looping ``XREADGROUP GROUP <group> c<i> COUNT <count> STREAMS
    <key> >`` then ``XACK`` of the batch until its read comes back empty.
    The processes connect first and start together; the time runs from that
    start to the last consumer's end. Afterwards the group must have nothing
    pending and the entries acked must be the stream's length, or this
    raises. Returns (seconds, requests, entries, p50_ms, p99_ms), a request
    being one XREADGROUP or one XACK round trip.
    """
    import multiprocessing
    import queue
    import threading

    admin = Client(port)
    admin.call("XGROUP", "CREATE", key, group, "0")
    admin.close()
    ctx = multiprocessing.get_context("spawn")  # nothing of this process (servers, sockets) in the children
    barrier = ctx.Barrier(consumers + 1)
    results = ctx.Queue()
    procs = [ctx.Process(target=_group_consumer, args=(port, key, group, f"c{i}", count, barrier, results),
                         name=f"group-consumer-c{i}", daemon=True)
             for i in range(1, consumers + 1)]
    outs = []
    try:
        for proc in procs:
            proc.start()
        try:
            barrier.wait(60)
        except threading.BrokenBarrierError:
            pass  # a consumer failed before the start: its error is on the queue
        deadline = time.monotonic() + timeout_s
        while len(outs) < consumers:
            try:
                outs.append(results.get(timeout=max(1.0, deadline - time.monotonic())))
            except queue.Empty:
                raise RuntimeError(f"{consumers - len(outs)} group consumers still running after {timeout_s} s")
            if outs[-1][-1] is not None:
                break
    finally:
        for proc in procs:
            proc.join(10 if len(outs) == consumers else 0)
            if proc.is_alive():
                proc.terminate()
                proc.join()
    errors = [f"{out[0]}: {out[-1]}" for out in outs if out[-1] is not None]
    if errors:
        raise RuntimeError("group consumer failed: " + "; ".join(errors))
    admin = Client(port)
    pending = admin.call("XPENDING", key, group)[0]
    length = admin.call("XLEN", key)
    admin.close()
    entries = sum(out[4] for out in outs)
    if pending != 0 or entries != length:
        raise RuntimeError(f"group {group!r} on {key!r}: {entries} entries acked of {length}, "
                           f"{pending} still pending")
    seconds = max(out[2] for out in outs) - min(out[1] for out in outs)
    p50, p99 = _percentiles_ms([lat for out in outs for lat in out[5]])
    return seconds, sum(out[3] for out in outs), entries, p50, p99


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
            p50, p99 = _percentiles_ms(state["latencies"])
            return seconds, state["requests"], state["entries"], p50, p99

    return Handle()
