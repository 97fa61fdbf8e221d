"""Kafka records and stream entries: one is the other (docs/kafka.md, "The mapping").

Owns both directions:

- a produced record becomes the body of a stream entry
  (``storage.entry_codec.encode_body``: the broker puts the ID it assigns in
  front): its key is the field ``key``, its value the field ``value`` (each
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
produce bodies, the fetch records); this module's Python versions are the
reference the tests compare them with, and the fallback without a compiler.

Must not know: partitions, offsets assignment, the broker, sockets.
"""

from __future__ import annotations

from typing import Sequence

from server.kafka import errors as E
from server.kafka import records
from server.kafka.records import CorruptRecordError

KEY = b"key"
VALUE = b"value"

try:
    from server.kafka_front import _kmap
except ImportError:  # built without a C compiler: the loops stay in Python
    _kmap = None


# -- produce: records -> entry bodies -------------------------------------------------

def record_body(key: bytes | None, value: bytes | None, headers: Sequence[tuple[bytes, bytes | None]]) -> bytes:
    """The stream-v1 body (``*<n> $f $v ...``) of one record. Raises
    CorruptRecordError(INVALID_RECORD) for a record the mapping could not
    give back (module docstring)."""
    n = 0
    parts = []
    if key is not None:
        parts.append(b"$3\r\nkey\r\n$%d\r\n%s\r\n" % (len(key), key))
        n += 2
    if value is not None:
        parts.append(b"$5\r\nvalue\r\n$%d\r\n%s\r\n" % (len(value), value))
        n += 2
    for hkey, hvalue in headers:
        if (key is None and hkey == KEY) or (value is None and hkey == VALUE):
            raise CorruptRecordError(E.INVALID_RECORD, f"a record with a null {hkey.decode()} carries a header "
                                                       f"named '{hkey.decode()}': it would read back as the "
                                                       f"record's {hkey.decode()}")
        if hvalue is None:
            hvalue = b""
        parts.append(b"$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(hkey), hkey, len(hvalue), hvalue))
        n += 2
    return b"*%d\r\n%s" % (n, b"".join(parts))


def record_bytes(key: bytes | None, value: bytes | None, headers: Sequence[tuple[bytes, bytes | None]]) -> int:
    """The field and value bytes of the entry a record becomes (what
    ``max-entry-bytes`` limits)."""
    n = (3 + len(key) if key is not None else 0) + (5 + len(value) if value is not None else 0)
    for hkey, hvalue in headers:
        n += len(hkey) + (len(hvalue) if hvalue is not None else 0)
    return n


def bodies_of(batches: Sequence[records.RecordBatch]) -> tuple[list[bytes], int]:
    """The entry body of every record of ``batches``, in order, and the
    largest entry's field and value bytes."""
    bodies = []
    largest = 0
    for batch in batches:
        for r in batch.records:
            bodies.append(record_body(r.key, r.value, r.headers))
            size = record_bytes(r.key, r.value, r.headers)
            if size > largest:
                largest = size
    return bodies, largest


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


def batches_of(chunks: Sequence, entries: Sequence[tuple[int, int, int]], leader_epoch: int = -1) -> bytearray:
    """Record batches of the stored entries a read returned: ``chunks``
    (stream-v1 entries back to back, a chunk never spanning two stored
    batches) and ``entries`` (each one's ``(offset, ms, seq)``)."""
    out = bytearray()
    i = 0
    for chunk in chunks:
        data = bytes(chunk)
        if _kmap is not None:
            i = _kmap.fetch_batches(out, data, entries, i, leader_epoch)
            continue
        start = i
        # how many entries this chunk holds: parse until its bytes are used up
        fields_list = _split_fields(data)
        n = len(fields_list)
        run_start = 0
        while run_start < n:
            ms = entries[start + run_start][1]
            run_end = run_start + 1
            while run_end < n and entries[start + run_end][1] == ms:
                run_end += 1
            base = entries[start + run_start][0]
            recs = []
            for j in range(run_start, run_end):
                key, value, headers = record_of(fields_list[j])
                recs.append(records.Record(entries[start + j][0] - base, 0, key, value, headers))
            out += records.encode_batch(records.RecordBatch(
                base_offset=base, records=recs, base_timestamp=ms, max_timestamp=ms,
                attributes=records.ATTR_TIMESTAMP_LOG_APPEND, last_offset_delta=recs[-1].offset_delta,
                partition_leader_epoch=leader_epoch))
            run_start = run_end
        i = start + n
    assert i == len(entries), (i, len(entries))
    return out


def _split_fields(data: bytes) -> list[list[bytes]]:
    """Every entry's fields in ``data`` (as many entries as it holds)."""
    out = []
    pos = 0
    end_all = len(data)
    index = data.index
    while pos < end_all:
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
