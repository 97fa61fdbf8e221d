"""A small load generator for what redis-benchmark cannot express.

Owns: filling a stream fast (pipelined XADD over one raw socket) and
consumer-group loops (XREADGROUP COUNT n then XACK of what came back) by a
group's consumers, each in a process of its own, over a finished stream or
beside running producers, every run checked to have acked every entry.
Talks RESP over a plain socket with hiredis parsing replies, so the client
costs as little as it can and the server's cost is what the figures show.
"""

from __future__ import annotations

import socket
import time
from typing import Callable

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


def _consumer(port: int, group: str, consumer: str, keys: list[str], count: int, block_ms: int | None,
              total: int | None, acked, barrier, results) -> None:
    """One consumer process of ``_run_consumers``: connect, wait for the
    others at ``barrier``, then XREADGROUP ``>`` on ``keys`` and XACK each
    batch on the key the reply names (a Partita topic key replies with
    partition keys). With ``total`` None it stops when a read comes back
    empty (a finished stream: nothing is left undelivered in the group);
    otherwise when ``acked`` (a shared counter every consumer adds its acked
    entries to) has reached ``total``. Puts (consumer, started, ended,
    requests, entries, latencies, error) on ``results``: started and ended by
    ``time.monotonic`` (CLOCK_MONOTONIC, one clock for every process of the
    machine), ended after the last empty read, or with ``total`` after this
    consumer's last XACK."""
    try:
        client = Client(port)
        block = [] if block_ms is None else ["BLOCK", str(block_ms)]
        read = _cmd("XREADGROUP", "GROUP", group, consumer, "COUNT", str(count), *block,
                    "STREAMS", *keys, *[">"] * len(keys))
        latencies: list[float] = []
        entries = requests = 0
        barrier.wait(60)
        started = ended = time.monotonic()
        while total is None or acked.value < total:
            t0 = time.monotonic()
            client.send(read)
            reply = client.replies(1)[0]
            latencies.append(time.monotonic() - t0)
            requests += 1
            batches = [(k, [e[0] for e in batch]) for k, batch in reply or () if batch]
            if not batches and total is None:
                break
            for batch_key, ids in batches:
                t0 = time.monotonic()
                n = client.call("XACK", batch_key, group, *ids)
                ended = time.monotonic()
                latencies.append(ended - t0)
                requests += 1
                if n != len(ids):
                    raise RuntimeError(f"XACK of {len(ids)} IDs just read acked {n}")
                entries += len(ids)
                if total is not None:
                    with acked.get_lock():
                        acked.value += len(ids)
        if total is None:
            ended = time.monotonic()
        client.close()
        results.put((consumer, started, ended, requests, entries, latencies, None))
    except BaseException as e:  # reported by the parent, which then fails
        barrier.abort()
        results.put((consumer, None, None, 0, 0, [], f"{type(e).__name__}: {e}"))


def _run_consumers(port: int, group: str, consumer_keys: list[list[str]], *, count: int,
                   block_ms: int | None, total: int | None, while_running: Callable[[], None] | None,
                   timeout_s: float) -> list[tuple]:
    """Run one consumer process per entry of ``consumer_keys`` (consumer
    c<i> reads the keys of entry i-1; see ``_consumer`` for when it stops)
    and return their result tuples, or raise if one failed or they did not
    all finish within ``timeout_s``.

    Each consumer is its own OS process on its own connection (one Python
    process's threads share the GIL: the client would be what the figures
    measure). The processes connect first and start together;
    ``while_running`` (the producers, if any) is called once they have.
    """
    import multiprocessing
    import queue
    import threading

    ctx = multiprocessing.get_context("spawn")  # nothing of this process (servers, sockets) in the children
    consumers = len(consumer_keys)
    barrier = ctx.Barrier(consumers + 1)
    results = ctx.Queue()
    acked = ctx.Value("q", 0)
    procs = [ctx.Process(target=_consumer, args=(port, group, f"c{i}", keys, count, block_ms, total, acked,
                                                  barrier, results),
                         name=f"group-consumer-c{i}", daemon=True)
             for i, keys in enumerate(consumer_keys, start=1)]
    outs: list[tuple] = []
    try:
        for proc in procs:
            proc.start()
        try:
            barrier.wait(60)
        except threading.BrokenBarrierError:
            pass  # a consumer failed before the start: its error is on the queue
        else:
            if while_running is not None:
                while_running()
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
            if proc.pid is None:
                continue  # a start failed (that error is raised): never started
            proc.join(10 if len(outs) == consumers else 0)
            if proc.is_alive():
                proc.terminate()
                proc.join()
    errors = [f"{out[0]}: {out[-1]}" for out in outs if out[-1] is not None]
    if errors:
        raise RuntimeError("group consumer failed: " + "; ".join(errors))
    return outs


def _check_drained(port: int, group: str, keys: list[str], outs: list[tuple], produced: int | None) -> int:
    """Raise unless ``group`` has nothing pending on any of ``keys`` (plain
    or partition keys: the streams the group reads) and the consumers acked
    exactly the entries the keys hold (and ``produced`` of them, if given);
    returns the entries acked."""
    admin = Client(port)
    pending = {key: admin.call("XPENDING", key, group)[0] for key in keys}
    length = sum(admin.call("XLEN", key) for key in keys)
    admin.close()
    entries = sum(out[4] for out in outs)
    if any(pending.values()) or entries != length or produced not in (None, length):
        left = {key: n for key, n in pending.items() if n}
        raise RuntimeError(f"group {group!r} on {keys}: {entries} entries acked of {length}"
                           f"{'' if produced is None else f' ({produced} produced)'}, "
                           f"{sum(left.values())} still pending {left or ''}".rstrip())
    return entries


def _figures(outs: list[tuple], entries: int) -> tuple[float, int, int, float | None, float | None]:
    """(seconds from the first consumer's start to the last one's end,
    requests, entries, p50_ms, p99_ms) of ``_run_consumers``' results."""
    seconds = max(out[2] for out in outs) - min(out[1] for out in outs)
    p50, p99 = _percentiles_ms([lat for out in outs for lat in out[5]])
    return seconds, sum(out[3] for out in outs), entries, p50, p99


def group_consumers(port: int, key: str, consumers: int, *, count: int = 100, group: str = "g",
                    timeout_s: float = 1800.0) -> tuple[float, int, int, float | None, float | None]:
    """Consume the whole (prefilled, no longer written) stream ``key``
    through a new group, ``consumers`` consumers c1..c<n> at once.

    Each consumer, in its own process (``_run_consumers``), loops
    ``XREADGROUP GROUP <group> c<i> COUNT <count> STREAMS <key> >`` then
    ``XACK`` of the batch until its read comes back empty. The time runs
    from the consumers' common start to the last one's end. Afterwards the
    group must have nothing pending and the entries acked must be the
    stream's length, or this raises. Returns (seconds, requests, entries,
    p50_ms, p99_ms), a request being one XREADGROUP or one XACK round trip.
    """
    admin = Client(port)
    admin.call("XGROUP", "CREATE", key, group, "0")
    admin.close()
    outs = _run_consumers(port, group, [[key]] * consumers, count=count, block_ms=None, total=None,
                          while_running=None, timeout_s=timeout_s)
    return _figures(outs, _check_drained(port, group, [key], outs, None))


def mixed_consume(port: int, consumer_keys: list[list[str]], stream_keys: list[str], total: int,
                  produce: Callable[[], None], *, group: str = "g", count: int = 100, block_ms: int = 100,
                  timeout_s: float = 600.0) -> tuple[float, int, int, float | None, float | None]:
    """Consume ``total`` entries through the (existing) group ``group``
    while ``produce()`` writes them.

    One consumer process per entry of ``consumer_keys`` (``_run_consumers``)
    loops ``XREADGROUP GROUP <group> c<i> COUNT <count> BLOCK <block_ms>
    STREAMS <its keys> > ...`` and XACKs each batch on the key the reply
    names (a Partita topic key replies with partition keys). The consumers
    connect first; ``produce()`` runs once they have started together. Every
    consumer adds what it acked to one shared counter and stops once the
    counter reaches ``total``: all entries produced are then read and acked
    (a consumer waiting in BLOCK sees it when its read returns). Afterwards
    the group must have nothing pending on any of ``stream_keys`` (the
    partition keys or streams the group reads) and they must hold exactly
    ``total`` entries, all acked, or this raises. Returns (seconds from the
    consumers' start to the last XACK, requests, entries, p50_ms, p99_ms);
    requests are the consumers' XREADGROUPs and XACKs.
    """
    outs = _run_consumers(port, group, consumer_keys, count=count, block_ms=block_ms, total=total,
                          while_running=produce, timeout_s=timeout_s)
    return _figures(outs, _check_drained(port, group, stream_keys, outs, total))
