"""Sparse per-segment indexes: offset -> file position, and stream ID -> offset.

Owns: the two index files of one segment and lookups in them. Both get one
entry for the first batch of the segment and then one for every batch that
starts at least ``index_interval_bytes`` after the last indexed batch, so
entry ``i`` of both files describes the same batch. Layouts (little-endian):

    .index    8 bytes/entry:  u32 position, u32 relative offset
              (read as one u64 = relative_offset << 32 | position, so a
              bisect over a memoryview finds an offset with no Python decode)
    .idindex 24 bytes/entry:  u64 first_ms, u64 first_seq, u32 relative offset, u32 position

Memory: the active segment keeps its entries in a ``bytearray`` (bounded by
``segment_bytes / index_interval_bytes`` entries) and writes the unwritten
tail to the files on ``persist()`` (flush, roll, close). A sealed segment's
index is read into memory on its first lookup and kept while it is among the
``SEALED_CACHE_MAX`` most recently used sealed indexes (process-wide LRU), so
memory stays bounded however much data there is, and a lookup is a bisect in
memory instead of one ``pread`` per probe (a read of a stream longer than one
segment used to cost ~40 preads). The indexes are derived data: recovery
rebuilds them from the ``.log`` when they are missing, short or inconsistent.

Thread contract: main thread only (a flush ticket fsyncs the files through
descriptors it pinned in the ``FileCache``).

Must not know: the batch format beyond the numbers it is given.
"""

from __future__ import annotations

import bisect
import os
import struct
from collections import OrderedDict

from storage.errors import READ_FAILED, StorageError, raise_storage_error
from storage.handles import FileCache

OFFSET_ENTRY_BYTES = 8
ID_ENTRY_BYTES = 24
_ID_ENTRY = struct.Struct("<QQII")
_OFF_ENTRY = struct.Struct("<II")  # position, relative offset
# Sealed indexes held in memory at most (LRU). One costs 32 B per indexed
# batch: at most ~1 MiB for a 128 MiB segment with 4 KiB batches.
SEALED_CACHE_MAX = 16
_sealed_lru: OrderedDict[int, "SegmentIndex"] = OrderedDict()


class SegmentIndex:
    """The ``.index`` and ``.idindex`` of one segment, in memory or on disk."""

    def __init__(self, cache: FileCache, offset_path: str, id_path: str,
                 offset_file_bytes: int, id_file_bytes: int) -> None:
        self.cache = cache
        self.offset_path = offset_path
        self.id_path = id_path
        self.offset_file_bytes = offset_file_bytes
        self.id_file_bytes = id_file_bytes
        self._off: bytearray | None = None  # in-memory entries (active segment)
        self._ids: bytearray | None = None
        self._persisted = 0  # entries already in the files (memory mode)
        self._sealed: tuple | None = None  # (offset keys, ids) read from the files (LRU)
        self.write_seq = 0  # bumps on every write to the files
        self.synced_seq = 0  # write_seq covered by the last completed fsync

    # -- state ---------------------------------------------------------------

    @property
    def in_memory(self) -> bool:
        return self._off is not None

    def file_entry_count(self) -> int | None:
        """Entries in the files, or None when the two files disagree in shape."""
        if self.offset_file_bytes % OFFSET_ENTRY_BYTES or self.id_file_bytes % ID_ENTRY_BYTES:
            return None
        n = self.offset_file_bytes // OFFSET_ENTRY_BYTES
        if n != self.id_file_bytes // ID_ENTRY_BYTES:
            return None
        return n

    def __len__(self) -> int:
        if self._off is not None:
            return len(self._off) // OFFSET_ENTRY_BYTES
        return self.file_entry_count() or 0

    def load(self) -> None:
        """Read the files into memory (the segment becomes active)."""
        if self._off is not None:
            return
        self._drop_sealed()
        n = self.file_entry_count() or 0
        self._off = bytearray(self._pread(self.offset_path, n * OFFSET_ENTRY_BYTES))
        self._ids = bytearray(self._pread(self.id_path, n * ID_ENTRY_BYTES))
        if len(self._off) != n * OFFSET_ENTRY_BYTES or len(self._ids) != n * ID_ENTRY_BYTES:
            n = min(len(self._off) // OFFSET_ENTRY_BYTES, len(self._ids) // ID_ENTRY_BYTES)
            del self._off[n * OFFSET_ENTRY_BYTES:]
            del self._ids[n * ID_ENTRY_BYTES:]
        self._persisted = n

    def unload(self) -> None:
        """Write what is pending and drop the in-memory copy (segment sealed)."""
        if self._off is None:
            return
        self.persist()
        self._off = self._ids = None
        self._drop_sealed()

    def _drop_sealed(self) -> None:
        if self._sealed is not None:
            self._sealed = None
            _sealed_lru.pop(id(self), None)

    def _sealed_keys(self) -> tuple:
        """The sealed files' entries in memory: ``(offset keys, ids)``."""
        found = self._sealed
        if found is not None:
            _sealed_lru.move_to_end(id(self))
            return found
        n = self.file_entry_count() or 0
        off = self._pread(self.offset_path, n * OFFSET_ENTRY_BYTES)
        ids = self._pread(self.id_path, n * ID_ENTRY_BYTES)
        n = min(n, len(off) // OFFSET_ENTRY_BYTES, len(ids) // ID_ENTRY_BYTES)
        found = self._sealed = (memoryview(off)[: n * OFFSET_ENTRY_BYTES].cast("Q"),
                                _MemIds(memoryview(ids), n))
        _sealed_lru[id(self)] = self
        while len(_sealed_lru) > SEALED_CACHE_MAX:
            _, old = _sealed_lru.popitem(last=False)
            old._sealed = None
        return found

    def _pread(self, path: str, n: int) -> bytes:
        if n == 0:
            return b""
        try:
            fd = self.cache.get(path, create=True)
        except StorageError as exc:
            raise exc.reading() from exc.__cause__
        try:
            return os.pread(fd, n, 0)
        except OSError as exc:
            raise_storage_error(f"read {path}", exc, READ_FAILED)

    # -- writes --------------------------------------------------------------

    def append(self, rel_offset: int, position: int, first_ms: int, first_seq: int) -> None:
        assert self._off is not None, "only the active segment's index grows"
        self._off += _OFF_ENTRY.pack(position, rel_offset)
        self._ids += _ID_ENTRY.pack(first_ms, first_seq, rel_offset, position)

    def persist(self) -> bool:
        """Write the entries not yet in the files; True if anything was written."""
        if self._off is None:
            return False
        n = len(self._off) // OFFSET_ENTRY_BYTES
        if n == self._persisted and self.offset_file_bytes == n * OFFSET_ENTRY_BYTES \
                and self.id_file_bytes == n * ID_ENTRY_BYTES:
            return False
        k = self._persisted
        self._write_tail(self.offset_path, self._off, k * OFFSET_ENTRY_BYTES)
        self._write_tail(self.id_path, self._ids, k * ID_ENTRY_BYTES)
        self.offset_file_bytes = n * OFFSET_ENTRY_BYTES
        self.id_file_bytes = n * ID_ENTRY_BYTES
        self._persisted = n
        self.write_seq += 1
        return True

    def _write_tail(self, path: str, buf: bytearray, start: int) -> None:
        fd = self.cache.get(path, create=True)
        try:
            view = memoryview(buf)[start:]
            pos = start
            while view:
                w = os.pwrite(fd, view, pos)
                view = view[w:]
                pos += w
            os.ftruncate(fd, len(buf))
        except OSError as exc:
            raise_storage_error(f"write {path}", exc)

    def truncate_from(self, rel_offset: int) -> None:
        """Drop entries for batches at relative offsets >= ``rel_offset``."""
        self.load()
        keep = self.count_below(rel_offset)
        del self._off[keep * OFFSET_ENTRY_BYTES:]
        del self._ids[keep * ID_ENTRY_BYTES:]
        self._persisted = min(self._persisted, keep)

    def reset(self) -> None:
        """Forget all entries (a rebuild follows)."""
        self._drop_sealed()
        self._off = bytearray()
        self._ids = bytearray()
        self._persisted = 0
        self.offset_file_bytes = -1  # force persist() to rewrite the files
        self.id_file_bytes = -1

    # -- lookups -------------------------------------------------------------

    def _offset_keys(self):
        if self._off is not None:
            return memoryview(self._off).cast("Q")
        return self._sealed_keys()[0]

    def _id_keys(self):
        if self._ids is not None:
            view = memoryview(self._ids)
            n = len(view) // ID_ENTRY_BYTES
            return _MemIds(view, n)
        return self._sealed_keys()[1]

    def offset_keys(self):
        """The offset index as u64 keys ``rel_offset << 32 | position`` (a
        buffer, for ``storage._walk``)."""
        return self._offset_keys()

    def id_entries(self):
        """The ID index's entries as raw bytes, 24 each (a buffer, for
        ``storage._walk``)."""
        if self._ids is not None:
            return self._ids
        ids = self._sealed_keys()[1]
        return ids.view[: ids.n * ID_ENTRY_BYTES]

    def count_below(self, rel_offset: int) -> int:
        """Number of entries whose relative offset is < ``rel_offset``."""
        return bisect.bisect_left(self._offset_keys(), rel_offset << 32)

    def floor_offset(self, rel_offset: int) -> tuple[int, int] | None:
        """``(rel_offset, position)`` of the last entry at or below ``rel_offset``."""
        keys = self._offset_keys()
        i = bisect.bisect_right(keys, (rel_offset << 32) | 0xFFFFFFFF) - 1
        if i < 0:
            return None
        k = keys[i]
        return k >> 32, k & 0xFFFFFFFF

    def ceiling_offset(self, rel_offset: int) -> tuple[int, int] | None:
        """``(rel_offset, position)`` of the first entry at or above ``rel_offset``."""
        keys = self._offset_keys()
        i = bisect.bisect_left(keys, rel_offset << 32)
        if i >= len(keys):
            return None
        k = keys[i]
        return k >> 32, k & 0xFFFFFFFF

    def entry(self, i: int) -> tuple[int, int, int, int]:
        """Entry i as ``(first_ms, first_seq, rel_offset, position)``."""
        return self._id_keys()[i]

    def last(self) -> tuple[int, int, int, int] | None:
        n = len(self)
        return self.entry(n - 1) if n else None

    def floor_id(self, ms: int, seq: int) -> int:
        """Index of the last entry whose first ID is <= (ms, seq); -1 if none."""
        ids = self._id_keys()
        return bisect.bisect_right(ids, (ms, seq), key=_first_id) - 1


def _first_id(entry) -> tuple[int, int]:
    return entry[0], entry[1]


class _MemIds:
    __slots__ = ("view", "n")

    def __init__(self, view: memoryview, n: int) -> None:
        self.view, self.n = view, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if i < 0:
            i += self.n
        if not 0 <= i < self.n:
            raise IndexError(i)
        return _ID_ENTRY.unpack_from(self.view, i * ID_ENTRY_BYTES)
