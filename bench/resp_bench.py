"""Protocol codec throughput on canned bytes, without sockets.

    python bench/resp_bench.py [--seconds 1.0]

Times ``server.resp.RequestParser`` on unpipelined and pipelined XADD
requests (whole receives, and receives cut mid-command, which take the exact
Python path), inline commands, and ``server.reply.encode`` of typical replies
in RESP2 and RESP3. Prints operations per second and microseconds per op.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from server.reply import Map, Raw, encode  # noqa: E402
from server.resp import RequestParser, encode_command  # noqa: E402

XADD = encode_command([b"XADD", b"orders", b"*", b"item", b"book", b"qty", b"1"])


def bench(name: str, fn, per_call: int, seconds: float) -> None:
    calls = 0
    started = time.perf_counter()
    deadline = started + seconds
    while time.perf_counter() < deadline:
        for _ in range(10):
            fn()
        calls += 10
    elapsed = time.perf_counter() - started
    ops = calls * per_call / elapsed
    print(f"{name:<44} {ops:>12,.0f} ops/s {1e6 / ops:>8.2f} us/op")


def parse_whole(parser: RequestParser, data: bytes):
    def run():
        parser.feed(data)
        while parser.get_command() is not None:
            pass

    return run


def parse_chunks(parser: RequestParser, chunks: list[bytes]):
    def run():
        for chunk in chunks:
            parser.feed(chunk)
            while parser.get_command() is not None:
                pass

    return run


def parse_split(parser: RequestParser, data: bytes, cut: int):
    first, second = data[:cut], data[cut:]

    def run():
        parser.feed(first)
        while parser.get_command() is not None:
            pass
        parser.feed(second)
        while parser.get_command() is not None:
            pass

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=1.0)
    args = ap.parse_args()
    s = args.seconds
    pipeline16 = XADD * 16
    bench("parse XADD, one per receive (hiredis path)", parse_whole(RequestParser(), XADD), 1, s)
    bench("parse XADD x16 pipelined, one receive", parse_whole(RequestParser(), pipeline16), 16, s)
    bench("parse XADD x16, receive cut mid-command", parse_split(RequestParser(), pipeline16, len(pipeline16) // 2 + 3), 16, s)
    bench("parse inline PING", parse_whole(RequestParser(), b"PING\r\n"), 1, s)
    stream = XADD * 1000
    chunks = [stream[i : i + 16384] for i in range(0, len(stream), 16384)]
    bench("parse 1000 XADD streamed in 16 KiB receives", parse_chunks(RequestParser(), chunks), 1000, s)
    entry = b"*2\r\n$15\r\n1700000000000-0\r\n*4\r\n$4\r\nitem\r\n$4\r\nbook\r\n$3\r\nqty\r\n$1\r\n1\r\n"
    raw100 = Raw(100, [entry * 100])
    hello = Map([("server", "redis"), ("version", "8.10.0"), ("proto", 3), ("id", 7), ("mode", "standalone")])
    for protocol in (2, 3):
        bench(f"encode bulk ID reply RESP{protocol}", lambda: encode(b"1700000000000-0", protocol), 1, s)
        bench(f"encode HELLO map RESP{protocol}", lambda: encode(hello, protocol), 1, s)
        bench(f"encode XRANGE 100 stored entries RESP{protocol}", lambda: encode(raw100, protocol), 1, s)


if __name__ == "__main__":
    main()
