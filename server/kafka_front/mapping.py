"""Kafka records and stream entries: one is the other (docs/kafka.md, "The mapping").

Owns both directions:

- a produced record becomes a stream entry (encoded once, with the ID the
  broker assigns: ``Produced.make_entries``): its key is the field ``key``, its value the field ``value`` (each
  left out when null), then each header as a further field named by the
  header's key, in order. A null header value is stored as an empty value.
  A record with a null key that carries a header named ``key`` (or a null
  value and a header ``value``) is refused (INVALID_RECORD): read back, that
  header would be taken for the key, so the mapping could not be undone;
- a stored entry becomes a record: its key is the value of its first field
  named ``key``, its value the value of its first field named ``value``
  (null when there is none), and every other field a header, in order (a
  second ``key`` or ``value`` field is a header of that name). So an entry
  written by Kafka reads back as the very record, and one written by XADD
  keeps every field and their order, except that ``key`` and ``value``
  come first when it is read back into Redis after a round trip;
- the record batches a fetch returns: one batch per run of entries of one
  stored batch with the same ID milliseconds, base offset the run's first
  offset, offset deltas the offsets (entries deleted with XDEL leave gaps,
  as compaction does in Kafka), timestamp type LogAppendTime and the ID's
  milliseconds as the timestamp, no producer id, uncompressed.

``server/kafka_front/_kmap.c`` does the two loops per record in C (the
produced entries, the fetched records); this module's Python versions are the
reference the tests compare them with, and the fallback without a compiler.

Must not know: partitions, offsets assignment, the broker, sockets.
"""

from __future__ import annotations

import struct
from typing import Sequence

import crc32c

from server.kafka import errors as E
from server.kafka import records
from server.kafka.records import CorruptRecordError
from storage.entry_codec import encode_body, with_body

KEY = b"key"
VALUE = b"value"
_REFUSED = ("a record with a null key (value) carries a header named 'key' ('value'): it would read back "
            "as the record's key (value)")

_LENGTH = struct.Struct(">I")

try:
    from server.kafka_front import _kmap
except ImportError:  # built without a C compiler: the loops stay in Python
    _kmap = None


# -- produce: records -> entry bodies -------------------------------------------------

def record_body(key: bytes | None, value: bytes | None, headers: Sequence[tuple[bytes, bytes | None]]) -> bytes:
    """The stream-v1 body (``*<n> $f $v ...``) of one record. Raises
    CorruptRecordError(INVALID_RECORD) for a record the mapping could not
    give back (module docstring)."""
    fields = []
    if key is not None:
        fields += (KEY, key)
    if value is not None:
        fields += (VALUE, value)
    for hkey, hvalue in headers:
        if (key is None and hkey == KEY) or (value is None and hkey == VALUE):
            raise CorruptRecordError(E.INVALID_RECORD, _REFUSED)
        fields += (hkey, b"" if hvalue is None else hvalue)
    return encode_body(fields)


def record_bytes(key: bytes | None, value: bytes | None, headers: Sequence[tuple[bytes, bytes | None]]) -> int:
    """The field and value bytes of the entry a record becomes (what
    ``max-entry-bytes`` limits)."""
    n = (3 + len(key) if key is not None else 0) + (5 + len(value) if value is not None else 0)
    for hkey, hvalue in headers:
        n += len(hkey) + (len(hvalue) if hvalue is not None else 0)
    return n


def read(data, max_uncompressed_bytes: int) -> list[records.RecordBatch]:
    """The batches of a produced ``records`` field, ready for ``entries_of``
    (their records left unread when the C reader will read them)."""
    return records.read_batches(data, max_uncompressed_bytes=max_uncompressed_bytes,
                                parse_records=_kmap is None)


class Produced:
    """The records of a produce's batches for one partition, checked:
    ``count``, ``largest`` (the field and value bytes of the largest entry)
    and ``make_entries(ms, seq)``, the stored entries with IDs from (ms,
    seq) on and their bytes (what ``Session.append_records`` calls). Raises
    CorruptRecordError: CORRUPT_MESSAGE for records that do not parse,
    INVALID_RECORD for one the mapping refuses."""

    __slots__ = ("batches", "count", "largest", "_bodies")

    def __init__(self, batches: Sequence[records.RecordBatch]) -> None:
        self.batches = batches
        self.count = 0
        self.largest = 0
        self._bodies: list[bytes] | None = None
        if _kmap is None:
            self._bodies = []
            for batch in batches:
                for r in batch.records:
                    self._bodies.append(record_body(r.key, r.value, r.headers))
                    self.largest = max(self.largest, record_bytes(r.key, r.value, r.headers))
            self.count = len(self._bodies)
            if not self.count:
                raise CorruptRecordError(E.INVALID_RECORD, "the batches hold no record")
            return
        for batch in batches:
            _, largest, refused, _ = self._c(batch, -1, 0)
            if refused >= 0:
                raise CorruptRecordError(E.INVALID_RECORD, _REFUSED)
            self.count += batch.record_count
            self.largest = max(self.largest, largest)
        if not self.count:
            raise CorruptRecordError(E.INVALID_RECORD, "the batches hold no record")

    @staticmethod
    def _c(batch: records.RecordBatch, ms: int, seq: int) -> tuple:
        try:
            return _kmap.produce_entries(batch.raw_records, batch.record_count, ms, seq)
        except ValueError as e:
            raise CorruptRecordError(E.CORRUPT_MESSAGE, f"bad record in batch: {e}") from None

    def make_entries(self, ms: int, seq: int) -> tuple[list, int]:
        if self._bodies is not None:
            entries = [(ms, seq + i, with_body((ms, seq + i), body)) for i, body in enumerate(self._bodies)]
            return entries, sum(len(e) for _, _, e in entries)
        out: list = []
        total = 0
        for batch in self.batches:
            if batch.record_count:
                entries, _, _, size = self._c(batch, ms, seq + len(out))
                out += entries
                total += size
        return out, total


# -- fetch: stored entries -> record batches -------------------------------------------

def record_of(fields: list[bytes]) -> tuple[bytes | None, bytes | None, list[tuple[bytes, bytes]]]:
    """``(key, value, headers)`` of an entry's fields (module docstring)."""
    key = value = None
    headers = []
    for i in range(0, len(fields) - 1, 2):
        name = fields[i]
        if key is None and name == KEY:
            key = fields[i + 1]
        elif value is None and name == VALUE:
            value = fields[i + 1]
        else:
            headers.append((name, fields[i + 1]))
    return key, value, headers


def batches_of(chunks: Sequence, entries: list[tuple[int, int, int]], leader_epoch: int = -1) -> bytearray:
    """Record batches of the stored entries a read returned: ``chunks``
    (stream-v1 entries back to back, a chunk never spanning two stored
    batches) and ``entries`` (each one's ``(offset, ms, seq)``)."""
    out = bytearray()
    i = 0
    for chunk in chunks:
        if _kmap is not None:
            i, starts = _kmap.fetch_batches(out, chunk, entries, i, leader_epoch)
            view = memoryview(out)
            for start in starts:
                end = start + 12 + _LENGTH.unpack_from(out, start + 8)[0]
                _LENGTH.pack_into(out, start + 17, crc32c.crc32c(view[start + 21:end]))
            view.release()
            continue
        fields_list = _split_fields(bytes(chunk))
        n = len(fields_list)
        run_start = 0
        while run_start < n:
            ms = entries[i + run_start][1]
            run_end = run_start + 1
            while run_end < n and entries[i + run_end][1] == ms:
                run_end += 1
            base = entries[i + run_start][0]
            recs = []
            for j in range(run_start, run_end):
                key, value, headers = record_of(fields_list[j])
                recs.append(records.Record(entries[i + j][0] - base, 0, key, value, headers))
            out += records.encode_batch(records.RecordBatch(
                base_offset=base, records=recs, base_timestamp=ms, max_timestamp=ms,
                attributes=records.ATTR_TIMESTAMP_LOG_APPEND, last_offset_delta=recs[-1].offset_delta,
                partition_leader_epoch=leader_epoch))
            run_start = run_end
        i += n
    assert i == len(entries), (i, len(entries))
    return out


def _split_fields(data: bytes) -> list[list[bytes]]:
    """Every entry's fields in ``data`` (as many entries as it holds)."""
    out = []
    pos = 0
    end_all = len(data)
    index = data.index
    while pos < end_all:
        # *2\r\n $<n>\r\n <id>\r\n *<k>\r\n then k bulk strings
        end = index(b"\r\n", pos + 5)
        pos = end + 2 + int(data[pos + 5:end]) + 2
        end = index(b"\r\n", pos)
        k = int(data[pos + 1:end])
        pos = end + 2
        fields = []
        for _ in range(k):
            end = index(b"\r\n", pos)
            n = int(data[pos + 1:end])
            fields.append(data[end + 2:end + 2 + n])
            pos = end + 4 + n
        out.append(fields)
    return out
