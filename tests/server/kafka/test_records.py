"""Record batches (magic 2): batches kafka-python's builder writes decode, kafka-python reads
ours, every codec round-trips, and bad batches get Kafka's error code, never another
exception or an unbounded allocation."""

from __future__ import annotations

import struct

import crc32c
import cramjam
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kafka.record.legacy_records import LegacyRecordBatchBuilder

from server.kafka import errors, records

CODECS = [records.COMPRESSION_NONE, records.COMPRESSION_GZIP, records.COMPRESSION_SNAPPY,
          records.COMPRESSION_LZ4, records.COMPRESSION_ZSTD]
CODEC_IDS = [records.COMPRESSION_NAMES[c] for c in CODECS]


def kafka_python_batch(compression: int, n: int = 16, **producer) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=compression, is_transactional=producer.get("transactional", False),
        producer_id=producer.get("producer_id", -1), producer_epoch=producer.get("producer_epoch", -1),
        base_sequence=producer.get("base_sequence", -1), batch_size=1 << 20)
    for i in range(n):
        builder.append(i, timestamp=1_700_000_000_000 + 3 * i, key=None if i % 4 == 0 else b"key-%d" % i,
                       value=None if i == 5 else b"value %d " % i * 8,
                       headers=[("trace", b"t%d" % i), ("empty", None)] if i % 2 else [])
    return bytes(builder.build())


@pytest.mark.parametrize("compression", CODECS, ids=CODEC_IDS)
def test_kafka_python_batches_decode(compression):
    data = kafka_python_batch(compression, producer_id=4242, producer_epoch=3, base_sequence=17)
    [batch] = records.read_batches(data)
    assert (batch.compression, batch.base_offset, batch.last_offset_delta) == (compression, 0, 15)
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (4242, 3, 17)
    assert (batch.base_timestamp, batch.max_timestamp) == (1_700_000_000_000, 1_700_000_000_045)
    assert not (batch.is_transactional or batch.is_control or batch.is_log_append_time)
    assert len(batch.records) == 16
    for i, r in enumerate(batch.records):
        assert (r.offset_delta, r.timestamp_delta) == (i, 3 * i)
        assert r.key == (None if i % 4 == 0 else b"key-%d" % i)
        assert r.value == (None if i == 5 else b"value %d " % i * 8)
        assert r.headers == ([(b"trace", b"t%d" % i), (b"empty", None)] if i % 2 else [])


def test_transactional_flag_and_several_batches_in_one_records_field():
    data = kafka_python_batch(0, 2, transactional=True, producer_id=1, producer_epoch=0, base_sequence=0) \
        + kafka_python_batch(records.COMPRESSION_LZ4, 3)
    first, second = records.read_batches(data)
    assert first.is_transactional and len(first.records) == 2
    assert not second.is_transactional and len(second.records) == 3


@pytest.mark.parametrize("compression", CODECS, ids=CODEC_IDS)
def test_kafka_python_reads_our_batches(compression):
    batch = records.make_batch(
        [(b"k%d" % i if i else None, b"v" * i, [(b"h", b"x"), (b"n", None)] if i % 2 else []) for i in range(16)],
        base_offset=1000, timestamps_ms=[5_000 + i for i in range(16)], compression=compression,
        partition_leader_epoch=7, producer_id=9, producer_epoch=1, base_sequence=100)
    kbatch = DefaultRecordBatch(records.encode_batch(batch))
    assert kbatch.validate_crc()
    assert (kbatch.base_offset, kbatch.leader_epoch, kbatch.compression_type) == (1000, 7, compression)
    assert (kbatch.producer_id, kbatch.producer_epoch, kbatch.base_sequence) == (9, 1, 100)
    got = [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in kbatch]
    assert got == [(1000 + i, 5_000 + i, b"k%d" % i if i else None, b"v" * i,
                    [("h", b"x"), ("n", None)] if i % 2 else []) for i in range(16)]


_record = st.tuples(st.one_of(st.none(), st.binary(max_size=20)), st.one_of(st.none(), st.binary(max_size=300)),
                    st.lists(st.tuples(st.binary(max_size=8), st.one_of(st.none(), st.binary(max_size=8))),
                             max_size=3))


@pytest.mark.parametrize("compression", CODECS, ids=CODEC_IDS)
@settings(max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(st.lists(_record, min_size=1, max_size=20), st.integers(0, 2**62), st.integers(-(2**40), 2**40),
       st.booleans())
def test_round_trip(compression, recs, base_offset, base_ts, log_append_time):
    timestamps = [base_ts + i * 1000 for i in range(len(recs))]
    batch = records.make_batch(recs, base_offset=base_offset, timestamps_ms=timestamps,
                               compression=compression, log_append_time=log_append_time)
    data = records.encode_batch(batch)
    [back] = records.read_batches(data)
    batch.crc = back.crc
    assert back == batch


def test_snappy_raw_and_xerial_framed_are_both_read():
    recs = [(b"k", b"snappy " * 50, [])]
    xerial = records.encode_batch(records.make_batch(recs, base_offset=0, timestamps_ms=[1],
                                                     compression=records.COMPRESSION_SNAPPY))
    assert _records_section(xerial).startswith(b"\x82SNAPPY\x00")  # as Kafka's Java client writes
    plain = _records_section(records.encode_batch(records.make_batch(recs, base_offset=0, timestamps_ms=[1])))
    raw = _with_body(xerial, bytes(cramjam.snappy.compress_raw(plain)))  # as librdkafka writes
    for data in (xerial, raw):
        assert records.read_batches(data)[0].records[0].value == b"snappy " * 50


def _records_section(batch_bytes: bytes) -> bytes:
    return batch_bytes[records.HEADER_BYTES:]


def _with_body(batch_bytes: bytes, body: bytes, *, count: int | None = None, attributes: int | None = None,
               magic: int = 2) -> bytes:
    """``batch_bytes`` with its records section replaced, length and CRC made right again."""
    out = bytearray(batch_bytes[:records.HEADER_BYTES] + body)
    struct.pack_into(">i", out, 8, len(out) - 12)
    struct.pack_into(">b", out, 16, magic)
    if count is not None:
        struct.pack_into(">i", out, 57, count)
    if attributes is not None:
        struct.pack_into(">h", out, 21, attributes)
    struct.pack_into(">I", out, 17, crc32c.crc32c(bytes(out[21:])))
    return bytes(out)


PLAIN = records.encode_batch(records.make_batch([(b"a", b"b", []), (None, b"c", [(b"h", None)])],
                                                base_offset=0, timestamps_ms=[1, 2]))


@pytest.mark.parametrize("mutate,code,match", [
    (lambda b: b[:-1] + bytes([b[-1] ^ 1]), errors.CORRUPT_MESSAGE, "CRC"),
    (lambda b: b[:30], errors.CORRUPT_MESSAGE, "bytes with"),
    (lambda b: b[:10], errors.CORRUPT_MESSAGE, "less than a batch header"),
    (lambda b: b[:8] + struct.pack(">i", 40) + b[12:], errors.CORRUPT_MESSAGE, "less than the minimum"),
    (lambda b: _with_body(b, _records_section(b), magic=1), errors.INVALID_RECORD, "magic 1"),
    (lambda b: _with_body(b, _records_section(b), magic=0), errors.INVALID_RECORD, "magic 0"),
    (lambda b: _with_body(b, _records_section(b), attributes=5), errors.UNSUPPORTED_COMPRESSION_TYPE, "type 5"),
    (lambda b: _with_body(b, _records_section(b), attributes=7), errors.UNSUPPORTED_COMPRESSION_TYPE, "type 7"),
    (lambda b: _with_body(b, _records_section(b), count=3), errors.CORRUPT_MESSAGE, "bad record"),
    (lambda b: _with_body(b, _records_section(b), count=1), errors.CORRUPT_MESSAGE, "bytes after"),
    (lambda b: _with_body(b, _records_section(b), count=-1), errors.CORRUPT_MESSAGE, "negative record count"),
    (lambda b: _with_body(b, _records_section(b), count=2**31 - 1), errors.CORRUPT_MESSAGE, "records in"),
    (lambda b: _with_body(b, b"\x00" * 9, attributes=records.COMPRESSION_ZSTD), errors.CORRUPT_MESSAGE,
     "zstd data does not decompress"),
    (lambda b: _with_body(b, b"garbage", attributes=records.COMPRESSION_SNAPPY), errors.CORRUPT_MESSAGE,
     "snappy"),
    (lambda b: _with_body(b, b"\x82SNAPPY\x00" + b"\x00" * 8 + b"\x00\x00\x10\x00ab",
                          attributes=records.COMPRESSION_SNAPPY), errors.CORRUPT_MESSAGE, "xerial"),
])
def test_bad_batches_get_kafkas_error_code(mutate, code, match):
    with pytest.raises(records.CorruptRecordError, match=match) as e:
        records.read_batches(mutate(PLAIN))
    assert e.value.code == code


def test_older_message_formats_are_refused_as_kafka_4_does():
    builder = LegacyRecordBatchBuilder(magic=1, compression_type=0, batch_size=1 << 20)
    builder.append(0, timestamp=1, key=b"k", value=b"v")
    with pytest.raises(records.CorruptRecordError) as e:
        records.read_batches(bytes(builder.build()))
    assert e.value.code == errors.INVALID_RECORD


def test_a_partial_trailing_batch_is_skipped_only_when_allowed():
    data = PLAIN + PLAIN[:40]
    assert len(records.read_batches(data, allow_partial=True)) == 1
    with pytest.raises(records.CorruptRecordError):
        records.read_batches(data)


@pytest.mark.parametrize("compression", [records.COMPRESSION_GZIP, records.COMPRESSION_SNAPPY,
                                         records.COMPRESSION_LZ4, records.COMPRESSION_ZSTD],
                         ids=CODEC_IDS[1:])
def test_a_decompression_bomb_is_refused_at_the_limit(compression):
    bomb = records.encode_batch(records.make_batch([(None, b"\x00" * 4_000_000, [])], base_offset=0,
                                                   timestamps_ms=[1], compression=compression))
    assert len(bomb) < 200_000
    with pytest.raises(records.CorruptRecordError, match="past 1000000") as e:
        records.read_batches(bomb, max_uncompressed_bytes=1_000_000)
    assert e.value.code == errors.MESSAGE_TOO_LARGE
    assert records.read_batches(bomb, max_uncompressed_bytes=5_000_000)[0].records[0].value == b"\x00" * 4_000_000


@settings(max_examples=300, deadline=None, database=None)
@given(st.binary(max_size=120))
def test_garbage_raises_only_corrupt_record_error(data):
    try:
        records.read_batches(data)
    except records.CorruptRecordError:
        pass


@pytest.mark.parametrize("compression", CODECS, ids=CODEC_IDS)
@settings(max_examples=30, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_flipped_record_bytes_with_a_valid_crc_raise_only_corrupt_record_error(compression, data):
    # A producer's bug rather than a line error: the CRC is right, the records are not.
    body = _records_section(kafka_python_batch(compression, 3))
    i = data.draw(st.integers(0, len(body) - 1))
    mutated = body[:i] + bytes([body[i] ^ data.draw(st.integers(1, 255))]) + body[i + 1:]
    try:
        records.read_batches(_with_body(PLAIN, mutated, count=3, attributes=compression))
    except records.CorruptRecordError:
        pass
