"""The stored batch format: encode, decode, check. Pure functions, no I/O.

Owns: the byte layout of one batch (docs/storage-format.md has the same table).
All integers are little-endian.

    pos  size  field
    0    8     base_offset        offset of the first entry
    8    4     batch_length       bytes in the whole batch, header included
    12   4     crc                CRC32C (Castagnoli) of bytes [16, batch_length)
    16   2     format_version     1
    18   2     flags              0 (reserved)
    20   4     leader_epoch
    24   4     entry_count        >= 1
    28   1     entry_format       how the entries are encoded (storage.entry_codec):
                                  1 stream-v1; 0 in batches written before this
                                  byte existed (read as stream-v1)
    29   1     reserved           0
    30   2     producer_records   k: producer records in the trailer (0 in batches
                                  written before the field existed)
    32   8     first_ms           ID of the first entry
    40   8     first_seq
    48   8     last_ms            ID of the last entry
    56   8     last_seq
    64   8     max_timestamp_ms   wall clock of the append (Kafka LogAppendTime);
                                  drives segment_ms and retention_ms
    72   16*n  ID table           n x (u64 ms, u64 seq)
    72+16n 4*n end table          n x u32: end of entry i, relative to the data start
    72+20n ...  data              the entries, back to back, in the entry format
    len-44k 44*k trailer          k producer records (``ProducerRecord``): which
                                  producer appended which entries, for the
                                  producer-state table (storage.producers)

Entry ``i`` of a batch at ``pos`` spans ``[d + end[i-1], d + end[i])`` with
``d = pos + 72 + 20n`` and ``end[-1] = 0``, so N contiguous entries are one
slice of the file; reads never see the trailer.

A producer record (44 bytes): u8 kind (1 idempotent id, Redis IDMP; 2
sequence, Kafka's idempotent producer), u8 reserved, i16 producer epoch, u32
index of the first entry it covers, u32 entries covered, 16 bytes producer,
16 bytes token (docs/storage-format.md "Producer records").

Must not know: files, segments, offsets outside the batch, what the entry
bytes say (storage.entry_codec).
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Sequence
from itertools import accumulate
from typing import NamedTuple

from crc32c import crc32c

from storage.entry_codec import ENTRY_FORMAT_STREAM_V1, unreadable

assert sys.byteorder == "little", "the entry tables are read with memoryview.cast"

FORMAT_VERSION = 1
HEADER = struct.Struct("<QIIHHIIBxHQQQQQ")
HEADER_BYTES = HEADER.size  # 72
CRC_START = 16
ID_BYTES = 16
END_BYTES = 4
PER_ENTRY_BYTES = ID_BYTES + END_BYTES
U32_MAX = 0xFFFFFFFF
U64_MAX = 0xFFFFFFFFFFFFFFFF
# Offsets are below 2^63 (Kafka's signed 64-bit offsets): a larger number
# read from a file name or a checkpoint is damage, never an offset.
MAX_OFFSET = 2**63 - 1

# Field positions in the tuple HEADER.unpack returns.
H_BASE, H_LENGTH, H_CRC, H_VERSION, H_FLAGS, H_EPOCH, H_COUNT, H_ENTRY_FORMAT, H_PRODUCERS = range(9)
H_FIRST_MS, H_FIRST_SEQ, H_LAST_MS, H_LAST_SEQ, H_MAX_TS = range(9, 14)

_HEAD16 = struct.Struct("<QII")
_TAIL56 = struct.Struct("<HHIIBxHQQQQQ")
_ONE = struct.Struct("<HHIIBxHQQQQQQQI")  # tail + one ID + one end

# Producer records (the trailer).
KIND_IDEMPOTENT_ID = 1  # Redis IDMP: token = digest of the idempotent-id
KIND_SEQUENCE = 2  # Kafka idempotent producer: token = base sequence
PRODUCER_KINDS = (KIND_IDEMPOTENT_ID, KIND_SEQUENCE)
PRODUCER_RECORD = struct.Struct("<BxhII16s16s")
PRODUCER_RECORD_BYTES = PRODUCER_RECORD.size  # 44
MAX_PRODUCER_RECORDS = 0xFFFF


class ProducerRecord(NamedTuple):
    """Which producer appended entries ``[index, index + count)`` of a batch."""

    kind: int
    epoch: int
    index: int
    count: int
    producer: bytes  # 16 bytes
    token: bytes  # 16 bytes


def encode_batch(
    base_offset: int,
    entries: Sequence[tuple[int, int, bytes]],
    leader_epoch: int,
    timestamp_ms: int,
    entry_format: int = ENTRY_FORMAT_STREAM_V1,
    producers: Sequence[ProducerRecord] = (),
) -> tuple[bytes, bytes]:
    """One batch as ``(head, body)``; write them back to back (``os.pwritev``).

    ``head`` is the first 16 bytes (base offset, length, CRC); ``body`` the
    CRC-covered rest. IDs must strictly increase (asserted by the caller).
    The entries are encoded in ``entry_format`` (a batch re-encoded from
    another keeps that one's); ``producers`` become the trailer.
    """
    n = len(entries)
    assert 0 < n <= U32_MAX
    if n == 1 and not producers:  # the common XADD case: one pack, one concatenation
        ms, seq, enc = entries[0]
        body = _ONE.pack(FORMAT_VERSION, 0, leader_epoch, 1, entry_format, 0, ms, seq, ms, seq,
                         timestamp_ms, ms, seq, len(enc)) + enc
        return _HEAD16.pack(base_offset, CRC_START + len(body), crc32c(body)), body
    assert len(producers) <= MAX_PRODUCER_RECORDS
    ids = array("Q")
    encs = []
    for ms, seq, enc in entries:
        ids.append(ms)
        ids.append(seq)
        encs.append(enc)
    ends = array("I", accumulate(len(e) for e in encs))
    first_ms, first_seq = ids[0], ids[1]
    last_ms, last_seq = ids[-2], ids[-1]
    tail = _TAIL56.pack(
        FORMAT_VERSION, 0, leader_epoch, n, entry_format, len(producers),
        first_ms, first_seq, last_ms, last_seq, timestamp_ms,
    )
    trailer = []
    for rec in producers:
        assert 0 <= rec.index and rec.count > 0 and rec.index + rec.count <= n, rec
        trailer.append(PRODUCER_RECORD.pack(*rec))
    body = b"".join([tail, ids.tobytes(), ends.tobytes(), *encs, *trailer])
    length = CRC_START + len(body)
    assert length <= U32_MAX, "batch too large"
    head = _HEAD16.pack(base_offset, length, crc32c(body))
    return head, body


def producer_records(buf, pos: int = 0, header: tuple | None = None) -> list[ProducerRecord]:
    """The producer records of the (checked) batch at ``buf[pos:]``."""
    h = header if header is not None else HEADER.unpack_from(buf, pos)
    k = h[H_PRODUCERS]
    if not k:
        return []
    start = pos + h[H_LENGTH] - PRODUCER_RECORD_BYTES * k
    return [ProducerRecord(*PRODUCER_RECORD.unpack_from(buf, start + PRODUCER_RECORD_BYTES * i)) for i in range(k)]


def records_within(recs: Sequence[ProducerRecord], start: int, stop: int) -> list[ProducerRecord]:
    """The records of ``recs`` whose entries lie within ``[start, stop)`` of
    their batch, their ``index`` made relative to ``start`` (for a batch
    re-encoded from a part of another; a record whose entries are cut in two
    is dropped)."""
    return [rec._replace(index=rec.index - start) for rec in recs
            if start <= rec.index and rec.index + rec.count <= stop]


def unpack_header(buf, pos: int = 0) -> tuple:
    """The header tuple at ``buf[pos:]`` (fields by the ``H_*`` constants)."""
    return HEADER.unpack_from(buf, pos)


def check_batch(buf, pos: int, available: int, expected_base: int | None,
                max_batch_bytes: int) -> str | None:
    """Why the batch at ``buf[pos:pos+available]`` is not whole and valid, or None.

    Checks length bounds, version, base offset continuity and the CRC; used by
    recovery and ``append_raw``. The reason text goes into the recovery log line.
    """
    if available < HEADER_BYTES:
        return f"torn header ({available} of {HEADER_BYTES} bytes)"
    h = HEADER.unpack_from(buf, pos)
    length, count = h[H_LENGTH], h[H_COUNT]
    if h[H_VERSION] != FORMAT_VERSION:
        return f"unknown format version {h[H_VERSION]}"
    least = HEADER_BYTES + PER_ENTRY_BYTES * count + PRODUCER_RECORD_BYTES * h[H_PRODUCERS]
    if count == 0 or length < least or length > max_batch_bytes + least:
        return f"bad batch length {length} for {count} entries"
    if expected_base is not None and h[H_BASE] != expected_base:
        return f"base offset {h[H_BASE]} where {expected_base} was expected"
    if length > available:
        return f"torn batch ({available} of {length} bytes)"
    view = memoryview(buf)[pos + CRC_START: pos + length]
    if crc32c(view) != h[H_CRC]:
        return "CRC mismatch"
    return None


def check_tables(buf, pos: int) -> str | None:
    """Structural check of a CRC-valid batch: a readable entry format, IDs
    strictly increase, the end table is monotonic and matches the batch
    length with its trailer, producer records of a known kind within the
    entries. O(n); for ``append_raw``."""
    h = HEADER.unpack_from(buf, pos)
    why = unreadable(h[H_ENTRY_FORMAT])
    if why:
        return why
    n = h[H_COUNT]
    ids = id_table(buf, pos, n)
    ends = end_table(buf, pos, n)
    prev = -1
    for i in range(n):
        key = (ids[2 * i] << 64) | ids[2 * i + 1]
        if key <= prev:
            return "IDs do not increase"
        prev = key
    if (ids[0], ids[1]) != (h[H_FIRST_MS], h[H_FIRST_SEQ]) or (ids[-2], ids[-1]) != (h[H_LAST_MS], h[H_LAST_SEQ]):
        return "first/last ID do not match the ID table"
    last = 0
    for i in range(n):
        if ends[i] < last:
            return "end table not monotonic"
        last = ends[i]
    k = h[H_PRODUCERS]
    if HEADER_BYTES + PER_ENTRY_BYTES * n + last + PRODUCER_RECORD_BYTES * k != h[H_LENGTH]:
        return "end table does not match the batch length"
    for rec in producer_records(buf, pos, h):
        if rec.kind not in PRODUCER_KINDS:
            return f"unknown producer record kind {rec.kind}"
        if rec.count == 0 or rec.index + rec.count > n:
            return "producer record outside the batch's entries"
    return None


def id_table(buf, pos: int, count: int) -> memoryview:
    """The batch's IDs as a u64 view: entry i is ``(v[2i], v[2i+1])``."""
    start = pos + HEADER_BYTES
    return memoryview(buf)[start: start + ID_BYTES * count].cast("Q")


def end_table(buf, pos: int, count: int) -> memoryview:
    """The batch's entry ends as a u32 view (relative to ``data_start``)."""
    start = pos + HEADER_BYTES + ID_BYTES * count
    return memoryview(buf)[start: start + END_BYTES * count].cast("I")


def data_start(pos: int, count: int) -> int:
    return pos + HEADER_BYTES + PER_ENTRY_BYTES * count


def entries_of(buf, pos: int) -> list[tuple[int, int, bytes]]:
    """Decode a whole batch (tests, truncation of a batch's tail)."""
    h = HEADER.unpack_from(buf, pos)
    n = h[H_COUNT]
    ids = id_table(buf, pos, n)
    ends = end_table(buf, pos, n)
    d = data_start(pos, n)
    out = []
    prev = 0
    for i in range(n):
        out.append((ids[2 * i], ids[2 * i + 1], bytes(buf[d + prev: d + ends[i]])))
        prev = ends[i]
    return out


def with_base_offset(batch: bytes, base_offset: int) -> bytes:
    """A copy of a stored batch with another base offset (the CRC does not cover it)."""
    return struct.pack("<Q", base_offset) + batch[8:]
