"""Deletion markers (XDEL): which offsets of a partition are deleted.

Owns: the ``<base>.xdel`` file of each segment and the sorted in-memory
copies. Log bytes are never rewritten: a deletion appends a 12-byte record

    u64 offset (little-endian), u32 CRC32C of those 8 bytes

to the marker file of the segment holding the entry. A torn or corrupt record
(power loss in the middle of the write) ends the file: it is cut at load.
Markers die with their segment (retention, trims) and are rewritten without
the cut entries on ``truncate_to`` and recovery, so a reused offset is never
born deleted.

Memory: 8 bytes per deleted entry (sorted ``array('Q')`` per segment); it
grows with the number of deletions, not with the number of entries.

Thread contract: main thread only; a flush ticket fsyncs the files through
descriptors it pinned in the ``FileCache``.

Must not know: batches, indexes, streams.
"""

from __future__ import annotations

import bisect
import logging
import os
import struct
from array import array
from pathlib import Path

from crc32c import crc32c

from storage.checkpoint import write_atomic
from storage.errors import append_or_undo, raise_storage_error
from storage.files import MARKERS_SUFFIX, segment_path
from storage.handles import FileCache

RECORD = struct.Struct("<QI")
RECORD_BYTES = RECORD.size  # 12


def encode_record(offset: int) -> bytes:
    raw = struct.pack("<Q", offset)
    return raw + struct.pack("<I", crc32c(raw))


class DeletionMarkers:
    """All deletion markers of one partition, by segment base offset."""

    def __init__(self, directory: Path, cache: FileCache) -> None:
        self.directory = directory
        self.cache = cache
        self._by_segment: dict[int, array] = {}
        self._file_bytes: dict[int, int] = {}

    def path(self, base: int) -> str:
        return str(segment_path(self.directory, base, MARKERS_SUFFIX))

    def load(self, base: int, keep_below: int) -> None:
        """Read ``<base>.xdel``; drop torn records and offsets >= ``keep_below``."""
        path = self.path(base)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise_storage_error(f"read {path}", exc)
        offsets = []
        good = 0
        for pos in range(0, len(data) - RECORD_BYTES + 1, RECORD_BYTES):
            off, crc = RECORD.unpack_from(data, pos)
            if crc32c(data[pos: pos + 8]) != crc:
                break
            offsets.append(off)
            good = pos + RECORD_BYTES
        kept = sorted({o for o in offsets if base <= o < keep_below})
        self._by_segment[base] = array("Q", kept)
        if good != len(data):
            # A torn last record (kill -9 mid-write) or damage: say so, since
            # the entries those records deleted are visible again.
            logging.getLogger("partita.storage").warning(
                "%s: dropped %d bytes of torn or corrupt deletion markers after %d good record(s)",
                path, len(data) - good, len(offsets))
        if good != len(data) or len(kept) != len(offsets):
            self._rewrite(base)
        else:
            self._file_bytes[base] = good

    def get(self, base: int):
        return self._by_segment.get(base, ())

    def is_deleted(self, base: int, offset: int) -> bool:
        arr = self._by_segment.get(base)
        if not arr:
            return False
        i = bisect.bisect_left(arr, offset)
        return i < len(arr) and arr[i] == offset

    def add(self, base: int, offsets: list[int]) -> None:
        """Persist new markers (sorted, not yet present) for segment ``base``."""
        if not offsets:
            return
        path = self.path(base)
        fd = self.cache.get(path, create=True)
        pos = self._file_bytes.get(base, 0)
        data = b"".join(encode_record(o) for o in offsets)
        append_or_undo(fd, [data], pos, f"append to {path}")
        self._file_bytes[base] = pos + len(data)
        arr = self._by_segment.setdefault(base, array("Q"))
        if not arr or offsets[0] > arr[-1]:
            arr.extend(offsets)
        else:
            for o in offsets:
                arr.insert(bisect.bisect_left(arr, o), o)

    def count_in(self, lo: int, hi: int) -> int:
        """Markers with ``lo <= offset < hi``."""
        total = 0
        for arr in self._by_segment.values():
            if arr and arr[0] < hi and arr[-1] >= lo:
                total += bisect.bisect_left(arr, hi) - bisect.bisect_left(arr, lo)
        return total

    def truncate_from(self, offset: int) -> None:
        """Forget markers at or above ``offset`` (files rewritten atomically)."""
        for base in list(self._by_segment):
            arr = self._by_segment[base]
            if arr and arr[-1] >= offset:
                del arr[bisect.bisect_left(arr, offset):]
                self._rewrite(base)

    def _rewrite(self, base: int) -> None:
        arr = self._by_segment[base]
        path = self.path(base)
        self.cache.close(path)
        write_atomic(Path(path), b"".join(encode_record(o) for o in arr))
        self._file_bytes[base] = len(arr) * RECORD_BYTES

    def drop_segment(self, base: int) -> None:
        self._by_segment.pop(base, None)
        self._file_bytes.pop(base, None)
        path = self.path(base)
        self.cache.close(path)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise_storage_error(f"delete {path}", exc)

    def file_of(self, base: int) -> str | None:
        """The markers file of segment ``base`` (what a flush syncs), or
        None if it has none."""
        return self.path(base) if base in self._file_bytes else None
