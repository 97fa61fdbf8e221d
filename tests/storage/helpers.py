"""Shared helpers for storage tests: entry encoding and a reference model."""

from __future__ import annotations

from storage.log import PartitionLog


def enc(ms: int, seq: int, payload: bytes = b"v") -> bytes:
    """The RESP encoding of entry ``ms-seq`` with one field/value pair."""
    ident = b"%d-%d" % (ms, seq)
    return (b"*2\r\n$%d\r\n%s\r\n*2\r\n$1\r\nf\r\n$%d\r\n%s\r\n"
            % (len(ident), ident, len(payload), payload))


def entries(first_ms: int, n: int, payload: bytes = b"v") -> list[tuple[int, int, bytes]]:
    return [(first_ms + i, 0, enc(first_ms + i, 0, payload)) for i in range(n)]


def read_all(log: PartitionLog, start: int | None = None) -> list[tuple[int, int, int, bytes]]:
    """(offset, ms, seq, bytes) of every live entry, via with_ids + per-entry reads."""
    start = log.log_start_offset if start is None else start
    r = log.read(start, with_ids=True)
    body = b"".join(bytes(c) for c in r.chunks)
    out = []
    pos = 0
    for off, ms, seq in r.entries:
        e = enc_len_of(body, pos)
        out.append((off, ms, seq, body[pos:pos + e]))
        pos += e
    assert pos == len(body)
    return out


def enc_len_of(body: bytes, pos: int) -> int:
    """Length of the RESP array entry that starts at ``pos`` (test entries only)."""
    p = pos
    def line_end(p):
        return body.index(b"\r\n", p) + 2
    assert body[p:p + 4] == b"*2\r\n"
    p += 4
    n = int(body[p + 1:body.index(b"\r\n", p)])
    p = line_end(p) + n + 2
    k = int(body[p + 1:body.index(b"\r\n", p)])
    p = line_end(p)
    for _ in range(k):
        n = int(body[p + 1:body.index(b"\r\n", p)])
        p = line_end(p) + n + 2
    return p - pos
