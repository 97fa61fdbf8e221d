"""Coverage-guided fuzzing of the request parser with atheris (optional).

Not collected by pytest (no ``test_`` prefix) and not a declared dependency:
``pip install atheris`` (a wheel exists for CPython 3.11 on x86-64 Linux),
then::

    python tests/reliability/fuzz_atheris.py -atheris_runs=200000
    python tests/reliability/fuzz_atheris.py -max_total_time=600 corpus_dir/

Each input's first byte picks a split stride; the rest is fed to
``server.resp.RequestParser`` whole, split at that stride, and byte by byte.
A crash is any exception other than ``ProtocolError``, or split-dependent
results (except the fast path's ``+simple`` / ``(bignum`` element leniency,
an xfail in test_protocol_fuzz.py). Same
properties as ``test_protocol_fuzz.py``, driven by coverage instead of
hypothesis.
"""

from __future__ import annotations

import sys
from pathlib import Path

import atheris

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

with atheris.instrument_imports():
    from server.resp import RequestParser
    from server.errors import ProtocolError


def run(data: bytes, stride: int) -> tuple[list, str | None]:
    parser = RequestParser(max_bulk_bytes=1 << 20, query_buffer_limit_bytes=1 << 20)
    out: list = []
    for i in range(0, max(len(data), 1), stride):
        parser.feed(data[i:i + stride])
        while True:
            try:
                argv = parser.get_command()
            except ProtocolError as e:
                return out, e.message
            if argv is None:
                break
            out.append(argv)
    return out, None


def one_input(raw: bytes) -> None:
    if not raw:
        return
    stride, data = 1 + raw[0] % 17, raw[1:]
    whole = run(data, max(len(data), 1))
    split = run(data, stride)
    bytewise = run(data, 1)
    if b"+" not in data and b"(" not in data and not (whole == split == bytewise):
        raise AssertionError(f"{data!r}: whole {whole} / stride {stride} {split} / bytewise {bytewise}")


if __name__ == "__main__":
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
