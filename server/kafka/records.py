"""Kafka record batches, magic 2: the bytes inside a ``records`` field.

Owns: reading the record batches a producer sends (CRC-32C check, the
attribute bits, decompression, each record's key, value and headers, offset
and timestamp deltas, producer id / epoch / base sequence) and writing the
batches a Fetch response carries. Errors carry the Kafka error code a
Produce response gives for the partition (``CorruptRecordError.code``).

Must not know: topics, partitions, offsets assigned by the log, streams,
sockets, the request that carried the bytes.

Batch layout (Kafka's ``DefaultRecordBatch``), big-endian::

    base_offset int64 | batch_length int32 (bytes after this field)
    partition_leader_epoch int32 | magic int8 (= 2) | crc uint32
    --- the CRC-32C (Castagnoli) covers from here to the end of the batch ---
    attributes int16 | last_offset_delta int32 | base_timestamp int64
    max_timestamp int64 | producer_id int64 | producer_epoch int16
    base_sequence int32 | record_count int32 | records...

Attributes: bits 0-2 compression (0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd),
bit 3 timestamp type (1 = log append time), bit 4 transactional, bit 5
control batch, bit 6 delete horizon set. When compressed, everything after
``record_count`` is one compressed block.

Record layout (varints are zig-zag, as protobuf's sint)::

    length varint | attributes int8 | timestamp_delta varlong
    offset_delta varint | key_length varint (-1 null) | key
    value_length varint (-1 null) | value
    header_count varint | per header: key_length varint, key (UTF-8),
                                      value_length varint (-1 null), value

Codecs come from ``cramjam`` (one maintained package of Rust bindings for
snappy, lz4, zstd and gzip, with wheels for every platform and no system
libraries). Snappy is accepted both raw and in the xerial framing Kafka's
Java client writes; lz4 is the standard frame format (magic 2 fixed the
frame checksum the v0/v1 formats got wrong); zstd and gzip standard frames.
Decompression is bounded: a batch may not inflate past
``max_uncompressed_bytes``, so a small hostile frame cannot make the broker
allocate without limit.

The v0/v1 message formats are not read: every client exercised here sends
magic 2 once the broker advertises Produce v3 or later (which Partita's
lowest Produce version is, as Kafka 4's is).
"""

from __future__ import annotations

import dataclasses
import struct

import cramjam
import crc32c

from server.kafka import errors
from server.kafka.codec import DecodeError, read_varlong

COMPRESSION_NONE = 0
COMPRESSION_GZIP = 1
COMPRESSION_SNAPPY = 2
COMPRESSION_LZ4 = 3
COMPRESSION_ZSTD = 4
COMPRESSION_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}

ATTR_COMPRESSION_MASK = 0x07
ATTR_TIMESTAMP_LOG_APPEND = 0x08
ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20
ATTR_DELETE_HORIZON = 0x40

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_PARTITION_LEADER_EPOCH = -1

MAGIC = 2
_HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_BYTES = _HEADER.size  # 61
_LOG_OVERHEAD = 12  # base_offset + batch_length
_CRC_START = 21  # attributes' offset in the batch
_LENGTH_AND_MAGIC = struct.Struct(">qiib")  # base offset, length, leader epoch, magic
_MAGIC_OFFSET = 16
# Uncompressed records a batch may inflate to unless the caller says otherwise
# (Kafka's message.max.bytes default is about 1 MiB; a compressed batch is
# checked against this after inflating).
UNCOMPRESSED_MAX_BYTES_DEFAULT = 64 * 1024 * 1024

_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER_BYTES = 16
_INT32 = struct.Struct(">i")


class CorruptRecordError(Exception):
    """Record bytes a broker refuses; ``code`` is the Kafka error code for the partition."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclasses.dataclass(slots=True)
class Record:
    """One record; offset and timestamp are deltas from its batch's base."""

    offset_delta: int
    timestamp_delta: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[bytes, bytes | None]] = dataclasses.field(default_factory=list)
    attributes: int = 0


@dataclasses.dataclass(slots=True)
class RecordBatch:
    base_offset: int
    records: list[Record]
    base_timestamp: int
    max_timestamp: int
    attributes: int = 0
    last_offset_delta: int = 0
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    base_sequence: int = NO_SEQUENCE
    crc: int = 0
    # Read with ``parse_records=False``: the records section as is
    # (decompressed), ``record_count`` records, and ``records`` empty.
    raw_records: bytes | memoryview = b""
    record_count: int = 0

    @property
    def compression(self) -> int:
        return self.attributes & ATTR_COMPRESSION_MASK

    @property
    def is_log_append_time(self) -> bool:
        return bool(self.attributes & ATTR_TIMESTAMP_LOG_APPEND)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & ATTR_TRANSACTIONAL)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & ATTR_CONTROL)

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta


# --------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------


def read_batches(data, *, max_uncompressed_bytes: int = UNCOMPRESSED_MAX_BYTES_DEFAULT,
                 allow_partial: bool = False, parse_records: bool = True) -> list[RecordBatch]:
    """Every record batch in a ``records`` field.

    A producer's records must be whole batches; a Fetch response may end with
    a partial one, which ``allow_partial`` skips (as a consumer does). With
    ``parse_records`` False the records are not read: each batch keeps its
    records section (decompressed) in ``raw_records`` for a faster reader
    (the Kafka front-end's C one), which must refuse what ``_read_records``
    refuses.

    Raises:
        CorruptRecordError: a bad size, magic, CRC, compression or record
            (code CORRUPT_MESSAGE, INVALID_RECORD, UNSUPPORTED_COMPRESSION_TYPE
            or MESSAGE_TOO_LARGE, as Kafka answers the same batch).
    """
    view = memoryview(data)
    batches = []
    pos = 0
    end = len(view)
    while pos < end:
        if end - pos < _LOG_OVERHEAD + 5:
            if allow_partial:
                break
            raise CorruptRecordError(errors.CORRUPT_MESSAGE, f"{end - pos} bytes left, less than a batch header")
        _, length, _, magic = _LENGTH_AND_MAGIC.unpack_from(view, pos)
        if pos + _LOG_OVERHEAD + length > end:
            if allow_partial:
                break
            raise CorruptRecordError(errors.CORRUPT_MESSAGE,
                                     f"batch of {length} bytes with {end - pos - _LOG_OVERHEAD} left")
        if magic != MAGIC:
            raise CorruptRecordError(errors.INVALID_RECORD,
                                     f"record batch magic {magic}: only magic {MAGIC} batches are accepted")
        if length < HEADER_BYTES - _LOG_OVERHEAD:
            raise CorruptRecordError(
                errors.CORRUPT_MESSAGE, f"batch length {length} is less than the minimum {HEADER_BYTES - _LOG_OVERHEAD}")
        batch_end = pos + _LOG_OVERHEAD + length
        batches.append(_read_batch(view[pos:batch_end], max_uncompressed_bytes, parse_records))
        pos = batch_end
    return batches


def _read_batch(b: memoryview, max_uncompressed_bytes: int, parse_records: bool = True) -> RecordBatch:
    (base_offset, _length, leader_epoch, _magic, crc, attributes, last_offset_delta, base_ts,
     max_ts, producer_id, producer_epoch, base_sequence, count) = _HEADER.unpack_from(b, 0)
    actual = crc32c.crc32c(b[_CRC_START:])
    if actual != crc:
        raise CorruptRecordError(errors.CORRUPT_MESSAGE,
                                 f"record batch CRC {actual:#010x} does not match the stored {crc:#010x}")
    if count < 0:
        raise CorruptRecordError(errors.CORRUPT_MESSAGE, f"negative record count {count}")
    codec_id = attributes & ATTR_COMPRESSION_MASK
    if codec_id == COMPRESSION_NONE:
        body = b[HEADER_BYTES:] if not parse_records else bytes(b[HEADER_BYTES:])
    else:
        body = bytes(_decompress(codec_id, b[HEADER_BYTES:], max_uncompressed_bytes))
    if not parse_records:
        return RecordBatch(base_offset, [], base_ts, max_ts, attributes, last_offset_delta, leader_epoch,
                           producer_id, producer_epoch, base_sequence, crc, body, count)
    try:
        records, pos = _read_records(body, count)
    except (DecodeError, IndexError, struct.error) as e:
        raise CorruptRecordError(errors.CORRUPT_MESSAGE, f"bad record in batch: {e}") from None
    if pos != len(body):
        raise CorruptRecordError(errors.CORRUPT_MESSAGE,
                                 f"{len(body) - pos} bytes after the batch's {count} records")
    return RecordBatch(base_offset, records, base_ts, max_ts, attributes, last_offset_delta,
                       leader_epoch, producer_id, producer_epoch, base_sequence, crc)


def _read_records(buf: bytes, count: int) -> tuple[list[Record], int]:
    """``count`` records from the start of ``buf``; returns them and the end position.

    The hot loop of Produce: a varint of one byte (nearly every delta and
    count) is read inline, longer ones by ``read_varlong``; ``buf`` is
    ``bytes`` so that indexing and slicing are cheap.
    """
    records = []
    append = records.append
    pos = 0
    end = len(buf)
    if count > end:  # every record takes at least 7 bytes; refuse a count the bytes cannot hold
        raise DecodeError(f"{count} records in {end} bytes")
    for _ in range(count):
        b = buf[pos]
        if b < 0x80:
            length = (b >> 1) ^ -(b & 1)
            pos += 1
        else:
            length, pos = read_varlong(buf, pos, 5)
        rec_end = pos + length
        if length < 0 or rec_end > end:
            raise DecodeError(f"record length {length} with {end - pos} bytes left")
        attrs = buf[pos]
        b = buf[pos + 1]
        if b < 0x80:
            ts_delta = (b >> 1) ^ -(b & 1)
            pos += 2
        else:
            ts_delta, pos = read_varlong(buf, pos + 1, 10)
        b = buf[pos]
        if b < 0x80:
            off_delta = (b >> 1) ^ -(b & 1)
            pos += 1
        else:
            off_delta, pos = read_varlong(buf, pos, 5)
        key, pos = _read_bytes(buf, pos, rec_end)
        value, pos = _read_bytes(buf, pos, rec_end)
        b = buf[pos]
        if b < 0x80:
            n = (b >> 1) ^ -(b & 1)
            pos += 1
        else:
            n, pos = read_varlong(buf, pos, 5)
        headers = []
        if n:
            if n < 0 or n > rec_end - pos:
                raise DecodeError(f"{n} headers")
            for _ in range(n):
                hkey, pos = _read_bytes(buf, pos, rec_end)
                if hkey is None:
                    raise DecodeError("null header key")
                hvalue, pos = _read_bytes(buf, pos, rec_end)
                headers.append((hkey, hvalue))
        if pos != rec_end:
            raise DecodeError(f"record declared {length} bytes, its fields take {length + pos - rec_end}")
        append(Record(off_delta, ts_delta, key, value, headers, attrs))
    return records, pos


def _read_bytes(buf: bytes, pos: int, rec_end: int) -> tuple[bytes | None, int]:
    """A varint length (-1: null) and that many bytes, inside a record ending at ``rec_end``."""
    b = buf[pos]
    if b < 0x80:
        n = (b >> 1) ^ -(b & 1)
        pos += 1
    elif buf[pos + 1] < 0x80:
        z = (b & 0x7F) | (buf[pos + 1] << 7)
        n = (z >> 1) ^ -(z & 1)
        pos += 2
    else:
        n, pos = read_varlong(buf, pos, 5)
    if n >= 0:
        e = pos + n
        if e > rec_end:
            raise DecodeError(f"{n} bytes run past their record")
        return buf[pos:e], e
    if n == -1:
        return None, pos
    raise DecodeError(f"length {n}")


def _decompress(codec_id: int, data: memoryview, limit: int) -> bytes | bytearray:
    try:
        if codec_id == COMPRESSION_SNAPPY:
            return _snappy_decompress(data, limit)
        if codec_id == COMPRESSION_GZIP:
            mod = cramjam.gzip
        elif codec_id == COMPRESSION_LZ4:
            mod = cramjam.lz4
        elif codec_id == COMPRESSION_ZSTD:
            mod = cramjam.zstd
        else:
            raise CorruptRecordError(errors.UNSUPPORTED_COMPRESSION_TYPE, f"unknown compression type {codec_id}")
        return _bounded(mod.decompress_into, data, limit)
    except cramjam.DecompressionError as e:
        raise CorruptRecordError(
            errors.CORRUPT_MESSAGE, f"{COMPRESSION_NAMES[codec_id]} data does not decompress: {e}") from None


def _bounded(decompress_into, data, limit: int) -> bytearray:
    """Decompress into a buffer that grows fourfold up to ``limit``; never past it.

    cramjam's ``decompress_into`` fails rather than overflow the buffer it is
    given, so a guess that is too small costs a retry, and a stream that
    inflates past ``limit`` is refused without being inflated in full.
    """
    size = min(limit, max(64 * 1024, 8 * len(data)))
    while True:
        out = bytearray(size)
        try:
            n = decompress_into(data, out)
        except cramjam.DecompressionError as e:
            if "failed to write whole buffer" not in str(e):
                raise
            if size >= limit:
                raise CorruptRecordError(
                    errors.MESSAGE_TOO_LARGE, f"batch inflates past {limit} bytes") from None
            size = min(limit, size * 4)
            continue
        del out[n:]
        return out


def _snappy_decompress(data: memoryview, limit: int) -> bytes:
    if bytes(data[:8]) != _XERIAL_MAGIC:
        return _snappy_raw(data, limit)
    # xerial framing (snappy-java's SnappyOutputStream, as the Java client
    # writes): 16-byte header, then blocks of int32 length + raw snappy.
    parts = []
    total = 0
    pos = _XERIAL_HEADER_BYTES
    end = len(data)
    while pos < end:
        if pos + 4 > end:
            raise CorruptRecordError(errors.CORRUPT_MESSAGE, "truncated xerial snappy block length")
        n, = _INT32.unpack_from(data, pos)
        pos += 4
        if n < 0 or pos + n > end:
            raise CorruptRecordError(errors.CORRUPT_MESSAGE, f"xerial snappy block of {n} bytes")
        block = _snappy_raw(data[pos:pos + n], limit - total, limit)
        total += len(block)
        parts.append(block)
        pos += n
    return b"".join(parts)


def _snappy_raw(data: memoryview, room: int, limit: int | None = None) -> bytes:
    """One raw snappy block that must inflate to at most ``room`` bytes (of a batch's ``limit``)."""
    size = cramjam.snappy.decompress_raw_len(data)  # from the block's own length preamble
    if size > room:
        raise CorruptRecordError(errors.MESSAGE_TOO_LARGE, f"batch inflates past {limit or room} bytes")
    out = bytearray(size)
    n = cramjam.snappy.decompress_raw_into(data, out)
    del out[n:]
    return bytes(out)


# --------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------


def _write_varint(out: bytearray, n: int) -> None:
    z = (n << 1) ^ (n >> 63)
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)


def _write_records(out: bytearray, records) -> None:
    wv = _write_varint
    for r in records:
        body = bytearray()
        body.append(r.attributes)
        wv(body, r.timestamp_delta)
        wv(body, r.offset_delta)
        if r.key is None:
            body.append(1)  # zig-zag -1
        else:
            wv(body, len(r.key))
            body += r.key
        if r.value is None:
            body.append(1)
        else:
            wv(body, len(r.value))
            body += r.value
        wv(body, len(r.headers))
        for hkey, hval in r.headers:
            wv(body, len(hkey))
            body += hkey
            if hval is None:
                body.append(1)
            else:
                wv(body, len(hval))
                body += hval
        wv(out, len(body))
        out += body


def encode_batch(batch: RecordBatch) -> bytes:
    """The bytes of ``batch`` (its ``crc`` is ignored and computed).

    ``attributes`` may ask for compression; the records are then compressed
    as one block with the same libraries the reader uses (snappy in the
    xerial framing Kafka's Java consumer expects).
    """
    assert batch.records, "Kafka has no empty batches outside compaction"
    body = bytearray()
    _write_records(body, batch.records)
    codec_id = batch.attributes & ATTR_COMPRESSION_MASK
    if codec_id != COMPRESSION_NONE:
        body = _compress(codec_id, body)
    out = bytearray(HEADER_BYTES)
    out += body
    _HEADER.pack_into(out, 0, batch.base_offset, len(out) - _LOG_OVERHEAD, batch.partition_leader_epoch,
                      MAGIC, 0, batch.attributes, batch.last_offset_delta, batch.base_timestamp,
                      batch.max_timestamp, batch.producer_id, batch.producer_epoch, batch.base_sequence,
                      len(batch.records))
    struct.pack_into(">I", out, _MAGIC_OFFSET + 1, crc32c.crc32c(memoryview(out)[_CRC_START:]))
    return bytes(out)


def _compress(codec_id: int, data: bytearray) -> bytes:
    if codec_id == COMPRESSION_GZIP:
        return bytes(cramjam.gzip.compress(data))
    if codec_id == COMPRESSION_SNAPPY:
        out = bytearray(_XERIAL_MAGIC + b"\x00\x00\x00\x01\x00\x00\x00\x01")
        block_bytes = 32 * 1024
        for i in range(0, len(data), block_bytes):
            block = bytes(cramjam.snappy.compress_raw(data[i:i + block_bytes]))
            out += _INT32.pack(len(block))
            out += block
        return bytes(out)
    if codec_id == COMPRESSION_LZ4:
        return bytes(cramjam.lz4.compress(data))
    if codec_id == COMPRESSION_ZSTD:
        return bytes(cramjam.zstd.compress(data))
    raise ValueError(f"unknown compression type {codec_id}")


def make_batch(records: list[tuple[bytes | None, bytes | None, list[tuple[bytes, bytes | None]]]],
               *, base_offset: int, timestamps_ms: list[int], compression: int = COMPRESSION_NONE,
               log_append_time: bool = False, partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
               producer_id: int = NO_PRODUCER_ID, producer_epoch: int = NO_PRODUCER_EPOCH,
               base_sequence: int = NO_SEQUENCE) -> RecordBatch:
    """A batch of ``(key, value, headers)`` at consecutive offsets from ``base_offset``."""
    assert records and len(timestamps_ms) == len(records)
    base_ts = timestamps_ms[0]
    attributes = compression | (ATTR_TIMESTAMP_LOG_APPEND if log_append_time else 0)
    return RecordBatch(
        base_offset=base_offset,
        records=[Record(i, ts - base_ts, k, v, list(h)) for i, ((k, v, h), ts) in
                 enumerate(zip(records, timestamps_ms))],
        base_timestamp=base_ts, max_timestamp=max(timestamps_ms), attributes=attributes,
        last_offset_delta=len(records) - 1, partition_leader_epoch=partition_leader_epoch,
        producer_id=producer_id, producer_epoch=producer_epoch, base_sequence=base_sequence)
