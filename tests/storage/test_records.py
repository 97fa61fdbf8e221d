from crc32c import crc32c

from storage import records


def test_batch_round_trip_and_layout():
    ents = [(5, 0, b"abc"), (5, 1, b""), (7, 0, b"\x00\r\n\xff")]
    head, body = records.encode_batch(42, ents, leader_epoch=3, timestamp_ms=99)
    batch = head + body
    h = records.unpack_header(batch)
    assert h[records.H_BASE] == 42
    assert h[records.H_LENGTH] == len(batch)
    assert h[records.H_CRC] == crc32c(batch[16:])
    assert h[records.H_VERSION] == 1
    assert h[records.H_EPOCH] == 3
    assert h[records.H_COUNT] == 3
    assert (h[records.H_FIRST_MS], h[records.H_FIRST_SEQ]) == (5, 0)
    assert (h[records.H_LAST_MS], h[records.H_LAST_SEQ]) == (7, 0)
    assert h[records.H_MAX_TS] == 99
    assert records.HEADER_BYTES == 72
    assert len(batch) == 72 + 20 * 3 + 3 + 0 + 4
    assert records.entries_of(batch, 0) == ents
    assert list(records.end_table(batch, 0, 3)) == [3, 3, 7]
    d = records.data_start(0, 3)
    assert batch[d:] == b"abc\x00\r\n\xff"
    assert records.check_batch(batch, 0, len(batch), 42, 1 << 20) is None
    assert records.check_tables(batch, 0) is None


def test_check_batch_reports_torn_and_corrupt():
    head, body = records.encode_batch(0, [(1, 0, b"x" * 50)], 0, 0)
    batch = head + body
    assert records.check_batch(batch, 0, 10, 0, 1 << 20).startswith("torn header")
    assert records.check_batch(batch, 0, len(batch) - 1, 0, 1 << 20).startswith("torn batch")
    assert "expected" in records.check_batch(batch, 0, len(batch), 1, 1 << 20)
    bad = bytearray(batch)
    bad[-1] ^= 1
    assert records.check_batch(bytes(bad), 0, len(bad), 0, 1 << 20) == "CRC mismatch"


def test_check_tables_rejects_decreasing_ids():
    head, body = records.encode_batch(0, [(2, 0, b"a"), (1, 0, b"b")], 0, 0)
    assert records.check_tables(head + body, 0) == "IDs do not increase"


def test_with_base_offset_keeps_crc_valid():
    head, body = records.encode_batch(0, [(1, 0, b"a")], 0, 0)
    moved = records.with_base_offset(head + body, 10)
    assert records.check_batch(moved, 0, len(moved), 10, 1 << 20) is None
