"""What is left of a damaged state file: its intact records, and the file kept aside.

Owns: the record framing shared by the consumer-group journal
(``storage/streams/groups.py``) and the controller's Raft log
(``cluster/controller/raft_store.py``)::

    record := u32 length | u32 crc32c(payload) | payload     (little-endian; length >= 1)

``scan`` walks such records and, where one fails its checks, finds the next
intact record again instead of stopping: first where the damaged record's
own length says the next one starts (one damaged byte inside a payload), if
the record there is intact; else by trying every later byte position (a
damaged length), where a position is taken only if the record there is
intact and is either the file's last or followed by another intact record:
with so many positions tried, one chance CRC match on damaged bytes (one in
2^32 per position) must not be enough, two in a row would be needed. (So
an intact record found by searching, between two damaged stretches, is
counted as damaged too.) A damaged stretch after which nothing
intact is found is the file's *tail*: what a write torn by a crash leaves
(or damage at the very end, which cannot be told from it).

``keep_aside`` keeps a damaged file as ``<name>.damaged-<UTC time>`` beside
it before its owner repairs it, so the evidence outlives the repair.

Must not know: what the payloads mean. Thread contract: pure functions.
"""

from __future__ import annotations

import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from crc32c import crc32c

from storage.checkpoint import fsync_dir, read_file, write_atomic

FRAME = struct.Struct("<II")  # payload length, crc32c(payload)
FRAME_BYTES = FRAME.size


def frame(payload: bytes) -> bytes:
    """One record: the header, then ``payload`` (not empty)."""
    assert payload, "an empty record cannot be framed"
    return FRAME.pack(len(payload), crc32c(payload)) + payload


@dataclass(frozen=True)
class Damage:
    """Bytes ``[start, end)`` that hold no intact record. ``tail``: nothing
    intact follows them (they run to the end of the data)."""

    start: int
    end: int
    tail: bool

    @property
    def size(self) -> int:
        return self.end - self.start


Record = tuple[int, int, memoryview]  # (position, end, payload)


def scan(data: bytes, start: int, *, max_length: int,
         plausible: Callable[[memoryview], bool] = lambda payload: True,
         resync: bool = True) -> Iterator[Record | Damage]:
    """The records of ``data[start:]`` in order, with a ``Damage`` for each
    stretch between them that holds none (see the module docstring).

    Args:
        max_length: the longest payload a writer makes; longer is damage.
        plausible: a cheap check of an intact payload (e.g. a known type
            byte), applied before the CRC.
        resync: False: the first damaged record ends the scan (one tail
            ``Damage`` from it to the end), for callers that refuse any.
    """
    view = memoryview(data)
    n = len(data)

    def intact(pos: int) -> int:
        """The end of an intact record at ``pos``, else -1."""
        if pos + FRAME_BYTES > n:
            return -1
        length, crc = FRAME.unpack_from(data, pos)
        end = pos + FRAME_BYTES + length
        if not 0 < length <= max_length or end > n:
            return -1
        payload = view[pos + FRAME_BYTES:end]
        if not plausible(payload) or crc32c(payload) != crc:
            return -1
        return end

    def resumes_at(pos: int) -> bool:
        end = intact(pos)
        return end >= 0 and (end == n or intact(end) >= 0)

    pos = start
    while pos < n:
        end = intact(pos)
        if end >= 0:
            yield pos, end, view[pos + FRAME_BYTES:end]
            pos = end
            continue
        found = -1
        if resync and pos + FRAME_BYTES <= n:
            (length, _crc) = FRAME.unpack_from(data, pos)
            own_next = pos + FRAME_BYTES + length
            if 0 < length <= max_length and own_next < n and intact(own_next) >= 0:
                found = own_next
        if resync and found < 0:
            found = next((q for q in range(pos + 1, n - FRAME_BYTES) if resumes_at(q)), -1)
        if found < 0:
            yield Damage(pos, n, tail=True)
            return
        yield Damage(pos, found, tail=False)
        pos = found


def keep_aside(path: Path) -> Path:
    """Keep ``path`` as it is now under ``<name>.damaged-<UTC time>`` (a hard
    link, or a copy where links are refused) and return that name. The
    caller then repairs by writing a new file and renaming it over ``path``,
    never by changing it in place (a link shares the bytes).

    Raises:
        StorageError: a disk error (nothing is repaired then).
    """
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = path.with_name(f"{path.name}.damaged-{stamp}")
    k = 1
    while target.exists():
        target = path.with_name(f"{path.name}.damaged-{stamp}-{k}")
        k += 1
    try:
        os.link(path, target)
    except OSError:
        write_atomic(target, read_file(path) or b"")  # (small files)
    else:
        fsync_dir(path.parent)
    return target
