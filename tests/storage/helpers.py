"""Shared helpers for storage tests: entry encoding and a reference model."""

from __future__ import annotations

from storage.entry_codec import encode_pair, split_entries
from storage.log import PartitionLog


def enc(ms: int, seq: int, payload: bytes = b"v") -> bytes:
    """The stored encoding (stream-v1) of entry ``ms-seq`` with one field/value pair."""
    return encode_pair((ms, seq), b"f", payload)


def entries(first_ms: int, n: int, payload: bytes = b"v") -> list[tuple[int, int, bytes]]:
    return [(first_ms + i, 0, enc(first_ms + i, 0, payload)) for i in range(n)]


def read_all(log: PartitionLog, start: int | None = None) -> list[tuple[int, int, int, bytes]]:
    """(offset, ms, seq, bytes) of every live entry, via with_ids + per-entry reads."""
    start = log.log_start_offset if start is None else start
    r = log.read(start, with_ids=True)
    encoded = split_entries(r.chunks)
    assert len(encoded) == len(r.entries) == r.count
    return [(off, ms, seq, e) for (off, ms, seq), e in zip(r.entries, encoded)]
