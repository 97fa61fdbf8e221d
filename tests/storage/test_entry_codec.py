"""The stored entry format (``storage.entry_codec``) and the batch header's
entry-format byte.

The codec round-trips any entry; new batches say stream-v1 (1); batches
written before the byte existed (0 there, as the old layout's reserved u32
left it) open and read as stream-v1 on every read path; a batch in a format
this version does not know is refused with a ``CORRUPT`` error naming it,
never sent, never cut by recovery.
"""

from __future__ import annotations

import struct
from array import array
from itertools import accumulate

import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from storage import records
from storage.entry_codec import (
    ENTRY_FORMAT_STREAM_V1,
    ENTRY_FORMAT_UNSET,
    decode_entry,
    encode_entry,
    encode_pair,
    split_entries,
)
from storage.errors import CORRUPT, InvalidBatchError, StorageError
from storage.log import LogConfig, PartitionLog
from storage.streams.ids import MAX_ID, MIN_ID
from storage.streams.stream import Stream

U64 = 2**64 - 1

# -- the codec ---------------------------------------------------------------


def test_stream_v1_is_a_binary_safe_resp2_array():
    fields = [b"f\r\n\x00", b"", b"\xff" * 3, b"v"]
    enc = encode_entry((5, 1), fields)
    assert enc == (b"*2\r\n$3\r\n5-1\r\n*4\r\n$4\r\nf\r\n\x00\r\n$0\r\n\r\n"
                   b"$3\r\n\xff\xff\xff\r\n$1\r\nv\r\n")
    assert decode_entry(enc) == ((5, 1), fields)
    assert decode_entry(memoryview(enc)) == ((5, 1), fields)
    assert split_entries([enc[:7], enc[7:] + enc]) == [enc, enc]


_ids = st.tuples(st.integers(0, U64), st.integers(0, U64))
_fields = st.lists(st.tuples(st.binary(max_size=40), st.binary(max_size=40)), min_size=1, max_size=5).map(
    lambda pairs: [item for pair in pairs for item in pair])


@settings(max_examples=300, deadline=None)
@given(entries=st.lists(st.tuples(_ids, _fields), min_size=1, max_size=6), cuts=st.lists(st.integers(0, 2000)))
def test_encode_decode_split_round_trip(entries, cuts):
    encoded = [encode_entry(sid, fields) for sid, fields in entries]
    assert [decode_entry(e) for e in encoded] == entries
    for (sid, fields), e in zip(entries, encoded):
        if len(fields) == 2:
            assert encode_pair(sid, fields[0], fields[1]) == e
    # A read's chunks cut the concatenation anywhere.
    data = b"".join(encoded)
    points = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    chunks = [memoryview(data)[a:b] for a, b in zip(points, points[1:])]
    assert split_entries(chunks) == encoded


# -- batches written the old way, and in unknown formats ---------------------

_OLD_TAIL = struct.Struct("<HHIIIQQQQQ")  # bytes 16..72 before the entry-format byte: u32 reserved 0 at 28


def raw_batch(base: int, entries: list[tuple[int, int, bytes]], reserved_u32: int = 0,
              epoch: int = 0, timestamp_ms: int = 1000) -> bytes:
    """A batch laid out as Partita wrote it before the entry-format byte
    existed (independent of ``storage.records``): byte 28 is the low byte of
    the reserved u32, 0 then. ``reserved_u32`` lets a test put another
    format number there, with a valid CRC."""
    n = len(entries)
    ids = array("Q", [v for ms, seq, _ in entries for v in (ms, seq)]).tobytes()
    ends = array("I", accumulate(len(e) for _, _, e in entries)).tobytes()
    body = _OLD_TAIL.pack(1, 0, epoch, n, reserved_u32, entries[0][0], entries[0][1],
                          entries[-1][0], entries[-1][1], timestamp_ms) + ids + ends + b"".join(e for _, _, e in entries)
    return struct.pack("<QII", base, 16 + len(body), crc32c(body)) + body


def _entries(first_ms: int, n: int) -> list[tuple[int, int, bytes]]:
    return [(ms, 0, encode_entry((ms, 0), [b"n", b"%d" % ms, b"pad", b"x" * (ms % 7)]))
            for ms in range(first_ms, first_ms + n)]


def _write_log(directory, batches: list[bytes]) -> None:
    directory.mkdir(parents=True)
    (directory / "00000000000000000000.log").write_bytes(b"".join(batches))


def _entry_format_bytes(directory) -> list[int]:
    """Byte 28 of every batch in the partition's segments, in order."""
    out = []
    for path in sorted(directory.glob("*.log")):
        data, pos = path.read_bytes(), 0
        while pos < len(data):
            out.append(data[pos + 28])
            pos += records.unpack_header(data, pos)[records.H_LENGTH]
    return out


def _every_read(log: PartitionLog) -> dict:
    """What each read path serves of the whole log, as single entries."""
    start, end = log.log_start_offset, log.log_end_offset
    return {
        "pread": split_entries(log.read(start).chunks),
        "view": split_entries(log.read(start, view=True).chunks),
        "with_ids": split_entries(log.read(start, with_ids=True).chunks),
        "after_id": split_entries(log.read_after_id(0, 0, None, True).chunks),
        "reverse": split_entries(log.read_reverse(start, end).chunks)[::-1],
        "entry_at": [log.entry_at(o) for o in range(start, end)],
    }


def test_new_batches_name_stream_v1(tmp_path):
    log = PartitionLog.open(tmp_path / "p", LogConfig())
    log.append(_entries(1, 3))
    log.append(_entries(4, 1))
    log.close()
    assert _entry_format_bytes(tmp_path / "p") == [ENTRY_FORMAT_STREAM_V1] * 2


def test_a_log_written_before_the_entry_format_byte_reads_as_stream_v1(tmp_path):
    old = _entries(1, 5) + _entries(6, 1) + _entries(7, 4)
    _write_log(tmp_path / "p", [raw_batch(0, old[:5]), raw_batch(5, old[5:6]), raw_batch(6, old[6:])])
    log = PartitionLog.open(tmp_path / "p", LogConfig())
    assert log.log_end_offset == 10 and log.last_id == (10, 0)  # recovery kept every batch
    want = [e for _, _, e in old]
    for _ in range(2):  # the first reads CRC-check (Python walk), the next walk in C
        assert _every_read(log) == dict.fromkeys(_every_read(log), want)
    stream = Stream(log, tmp_path / "p" / "stream.meta")
    assert [decode_entry(e)[0] for e in split_entries(stream.range(MIN_ID, MAX_ID).chunks)] == \
        [(ms, seq) for ms, seq, _ in old]
    # Appended to by this version: old and new batches read as one stream.
    stream.add([b"n", b"new"], id_given=(11, 0))
    assert split_entries(log.read(0, view=True).chunks) == want + [encode_entry((11, 0), [b"n", b"new"])]
    assert _entry_format_bytes(tmp_path / "p") == [ENTRY_FORMAT_UNSET] * 3 + [ENTRY_FORMAT_STREAM_V1]
    # A batch re-encoded from an old one keeps its byte (a follower's suffix, a cut prefix).
    suffix, _ = log.read_batches(2, 1 << 20)
    assert suffix[28] == ENTRY_FORMAT_UNSET
    log.truncate_to(8)
    assert split_entries(log.read(0).chunks) == want[:8]
    assert _entry_format_bytes(tmp_path / "p") == [ENTRY_FORMAT_UNSET] * 3
    log.close()
    # A follower copies old batches as they are.
    follower = PartitionLog.open(tmp_path / "f", LogConfig())
    follower.append_raw(raw_batch(0, old[:5]))
    assert split_entries(follower.read(0).chunks) == want[:5]
    follower.close()


def test_a_batch_in_an_unknown_entry_format_is_refused_not_served(tmp_path):
    good, unknown = _entries(1, 3), _entries(4, 2)
    _write_log(tmp_path / "p", [raw_batch(0, good), raw_batch(3, unknown, reserved_u32=7)])
    log = PartitionLog.open(tmp_path / "p", LogConfig())
    assert log.log_end_offset == 5  # kept: its CRC is good, a later version may read it
    for _ in range(2):  # CRC-checking walk, then the C walk
        for read in (lambda: log.read(0), lambda: log.read(0, view=True), lambda: log.read(0, with_ids=True),
                     lambda: log.read_after_id(0, 0, None, True), lambda: log.read_reverse(0, 5),
                     lambda: log.entry_at(3)):
            with pytest.raises(StorageError, match=r"corrupt batch at position \d+: unknown entry format 7 "
                                                   r"\(this version reads stream-v1: 0 or 1\)") as info:
                read()
            assert info.value.code == CORRUPT
        # What precedes it is served.
        assert split_entries(log.read(0, 3, view=True).chunks) == [e for _, _, e in good]
        assert split_entries(log.read(0, max_count=3).chunks) == [e for _, _, e in good]
    log.close()
    follower = PartitionLog.open(tmp_path / "f", LogConfig())
    with pytest.raises(InvalidBatchError, match="unknown entry format 7"):
        follower.append_raw(raw_batch(0, unknown, reserved_u32=7))
    assert follower.log_end_offset == 0
    follower.close()
