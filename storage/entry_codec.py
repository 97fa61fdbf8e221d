"""The stored form of a stream entry: a named, versioned format.

Owns: the bytes of one entry in a batch's data area (``storage.records``
treats them as opaque), the names of the entry formats a batch header's
``entry_format`` byte can hold, and the functions that encode, decode and
split entries. Every encoding and decoding of entries goes through here; the
pipelined-XADD scanner in C (``server/_xaddrun.c``) builds the same bytes
itself, and tests/server/test_xaddrun.py checks them against ``encode_entry``.

Entry formats (the ``entry_format`` byte, docs/storage-format.md):

=====================  =====================================================
0 ``ENTRY_FORMAT_UNSET``  batches written before the byte existed (it was a
                       reserved zero): read as stream-v1, never written
1 ``ENTRY_FORMAT_STREAM_V1``  stream-v1 (below); what every batch is written with
2..255                 unknown: a read refuses the batch (``CORRUPT``), a
                       follower refuses to copy it (``append_raw``)
=====================  =====================================================

stream-v1 is a RESP2 array ``[id, [field, value, ...]]``, binary-safe::

    *2\\r\\n $<len(id)>\\r\\n <ms>-<seq>\\r\\n *<2k>\\r\\n   then for each of the 2k
    fields and values: $<len>\\r\\n <bytes>\\r\\n

Why this encoding is kept: a read sends the stored bytes as the reply.
XRANGE / XREAD of N entries is ``*N\\r\\n`` followed by slices of the log
(views of the segment file's mapping: zero copy), with nothing decoded or
encoded per entry, which is what makes XREAD COUNT 1000 cost a fraction of
Redis's CPU per entry (bench/RESULTS.md). The entry is the same in RESP2
and RESP3 replies (RESP3 changes only the outer container). A front-end
speaking another protocol decodes entries with ``decode_entry`` /
``split_entries``; a format it could send as stored would be a new number.

Must not know: batches, files, offsets, stream semantics (which IDs are
valid), sockets.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

ENTRY_FORMAT_UNSET = 0
ENTRY_FORMAT_STREAM_V1 = 1
# The largest entry_format byte this version reads (storage/_walk.c has the
# same bound): 0 and 1 are both stream-v1.
ENTRY_FORMAT_MAX_READABLE = ENTRY_FORMAT_STREAM_V1


def unreadable(entry_format: int) -> str | None:
    """Why a batch with this ``entry_format`` byte cannot be read, or None."""
    if entry_format <= ENTRY_FORMAT_MAX_READABLE:
        return None
    return f"unknown entry format {entry_format} (this version reads stream-v1: 0 or 1)"


def encode_entry(stream_id: tuple[int, int], fields: Sequence[bytes]) -> bytes:
    """stream-v1: ``*2 $id *<len(fields)> $f $v ...``."""
    assert len(fields) % 2 == 0 and fields, "an entry has field/value pairs"
    id_text = b"%d-%d" % (stream_id[0], stream_id[1])
    parts = [b"*2\r\n$%d\r\n%s\r\n*%d\r\n" % (len(id_text), id_text, len(fields))]
    for item in fields:
        parts.append(b"$%d\r\n" % len(item))
        parts.append(bytes(item))
        parts.append(b"\r\n")
    return b"".join(parts)


def encode_pair(stream_id: tuple[int, int], field: bytes, value: bytes) -> bytes:
    """``encode_entry(stream_id, [field, value])``, the common XADD entry:
    one format, no join."""
    id_text = b"%d-%d" % (stream_id[0], stream_id[1])
    return b"*2\r\n$%d\r\n%s\r\n*2\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (
        len(id_text), id_text, len(field), field, len(value), value)


def encode_body(fields: Sequence[bytes]) -> bytes:
    """The part of a stream-v1 entry after its ID: ``*<len(fields)> $f $v ...``.
    A front-end that converts its own records (the Kafka one) makes the
    bodies, and the broker puts the IDs it assigns in front
    (``with_body``). Unlike ``encode_entry`` it takes no fields at all: a
    Kafka record with neither key, value nor headers is an entry of none."""
    assert len(fields) % 2 == 0
    parts = [b"*%d\r\n" % len(fields)]
    for item in fields:
        parts.append(b"$%d\r\n" % len(item))
        parts.append(bytes(item))
        parts.append(b"\r\n")
    return b"".join(parts)


def with_body(stream_id: tuple[int, int], body: bytes) -> bytes:
    """The stored entry of ID ``stream_id`` and ``body`` (``encode_body``):
    ``with_body(id, encode_body(fields)) == encode_entry(id, fields)``."""
    id_text = b"%d-%d" % (stream_id[0], stream_id[1])
    return b"*2\r\n$%d\r\n%s\r\n%s" % (len(id_text), id_text, body)


def decode_entry(encoded: bytes | memoryview) -> tuple[tuple[int, int], list[bytes]]:
    """The inverse of ``encode_entry``: ``((ms, seq), fields)`` (for XINFO,
    dead-lettering and tests, not the read path)."""
    data = bytes(encoded)
    assert data.startswith(b"*2\r\n$")
    pos = 5
    end = data.index(b"\r\n", pos)
    n = int(data[pos:end])
    id_text = data[end + 2 : end + 2 + n]
    pos = end + 2 + n + 2
    assert data[pos : pos + 1] == b"*"
    end = data.index(b"\r\n", pos)
    count = int(data[pos + 1 : end])
    pos = end + 2
    fields = []
    for _ in range(count):
        assert data[pos : pos + 1] == b"$"
        end = data.index(b"\r\n", pos)
        n = int(data[pos + 1 : end])
        fields.append(data[end + 2 : end + 2 + n])
        pos = end + 2 + n + 2
    ms, _, seq = id_text.partition(b"-")
    return (int(ms), int(seq)), fields


def split_entries(chunks: Iterable[bytes | memoryview]) -> list[bytes]:
    """Cut the concatenation of encoded entries (a read's chunks) back into
    single entries."""
    data = b"".join(bytes(c) for c in chunks)
    out = []
    pos = 0
    while pos < len(data):
        start = pos
        # *2\r\n $n\r\n id\r\n *k\r\n then k bulk strings
        pos = data.index(b"\r\n", pos) + 2
        end = data.index(b"\r\n", pos)
        pos = end + 2 + int(data[pos + 1 : end]) + 2
        end = data.index(b"\r\n", pos)
        count = int(data[pos + 1 : end])
        pos = end + 2
        for _ in range(count):
            end = data.index(b"\r\n", pos)
            pos = end + 2 + int(data[pos + 1 : end]) + 2
        out.append(data[start:pos])
    return out
