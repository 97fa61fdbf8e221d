"""One segment: a ``.log`` file of batches plus its two sparse indexes.

Owns: positions inside one ``.log`` file: appending a batch with one
``pwritev`` (truncating back on failure), finding the batch that holds an
offset or an ID (index bisect + one bounded read), slicing runs of entries out
of one ``pread`` buffer, scanning and CRC-checking batches during recovery,
and truncation. File layouts: ``storage.records`` (batches) and
``storage.index`` (indexes).

Only the last segment of a partition (the active one) is written; its index
lives in memory. Sealed segments read everything with ``pread`` through the
shared ``FileCache`` and keep only a few numbers in memory. Reads that ask
for views (``ReadAccumulator.view``) slice a read-only mapping of the file
instead; the ``FileCache``'s ``mappings`` bound how many are mapped at
once, and how many more stay alive unmapped because a reader still holds
views of them (past that, reads copy instead of mapping). A mapping
reaches ``_MAP_AHEAD_BYTES`` past the file's end (``_map_file``), so the
batches appended after it was made, which consumers chasing producers
read, are sliced from it too; only the bytes below ``size`` are ever
sliced (``_view``): the pages past the file's end would fault (SIGBUS).

Preallocation (``LogConfig.preallocate_bytes``, on under ``fsync always``):
the active segment's file is kept zero-filled a little past its last batch
(``zero_ahead``), so the fdatasync after an append writes data into blocks
the file already has and need not commit a size change to the file system's
journal (about half of each group-commit fsync's cost on ext4,
bench/RESULTS.md). ``size`` is always the end of the last batch;
``file_size`` counts the zeros too. ``trim`` cuts them (durably) before the
segment is sealed or the log closed; after a crash, recovery cuts a tail of
zeros without a warning (``ZERO_TAIL``): it holds nothing.

Thread contract: main thread only. ``FlushTicket`` fsyncs the segment's
files through descriptors it pinned in the ``FileCache``, never these objects.

Must not know: deletion markers' files, checkpoints, leader epochs,
retention, other segments.
"""

from __future__ import annotations

import mmap
import os
import struct
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from pathlib import Path

from crc32c import crc32c

from storage import records
from storage.entry_codec import ENTRY_FORMAT_MAX_READABLE, unreadable
from storage.errors import READ_FAILED, StorageError, append_or_undo, raise_storage_error
from storage.files import ID_INDEX_SUFFIX, INDEX_SUFFIX, LOG_SUFFIX, segment_path
from storage.handles import FileCache
from storage.index import SegmentIndex
from storage.records import HEADER_BYTES, HEADER

try:
    from storage import _walk
except ImportError:  # built without a C compiler: the walk stays in Python
    _walk = None

_HEAD29 = struct.Struct("<QIIHHIIB")  # base, length, crc, version, flags, epoch, count, entry format
_LAST_IDS = struct.Struct("<QQQ")  # last_ms, last_seq, max_timestamp_ms at header byte 48
_WINDOW_BYTES = 64 * 1024
_READ_CAP_BYTES = 16 * 1024 * 1024
_SCAN_CHUNK_BYTES = 4 * 1024 * 1024
# Zero-copy reads (``ReadAccumulator.view``) slice a read-only shared mapping
# of the ``.log`` file. A mapping covers the file as it was when mapped and,
# with the C helper (``_map_file``), this much past its end: the active
# segment's appends until then need no new mapping.
_MAP_AHEAD_BYTES = 64 * 1024 * 1024
# A file grown past its mapping is remapped once it has grown this much
# since it was mapped (reads of the newer tail use ``pread`` meanwhile): a
# mapping of the file's size alone (no C helper) would otherwise be made
# anew for every read of a few new batches.
_REMAP_BYTES = 4 * 1024 * 1024
_ZEROS = bytes(1024 * 1024)  # written ahead of the active segment's end (preallocation)
_ZEROS_VIEW = memoryview(_ZEROS)  # slices without a copy
# The first stretch of zeros written ahead; each next one is twice the last,
# up to LogConfig.preallocate_bytes: a partition written rarely writes few.
_FIRST_AHEAD_BYTES = 64 * 1024
# recover_from's reason for a tail that is only preallocated zeros: not damage.
ZERO_TAIL = "preallocated zeros"


@dataclass(slots=True)
class ReadAccumulator:
    """What a read has gathered so far across segments."""
    max_count: int | None
    max_bytes: int | None
    split: bool          # one chunk per entry (reverse reads)
    want_ids: bool
    chunks: list = field(default_factory=list)
    entries: list | None = None  # with want_ids: (offset, ms, seq) per entry, or (ms, seq) with id_pairs
    count: int = 0
    nbytes: int = 0
    done: bool = False
    # Chunks may be memoryviews of the segment's mapping instead of slices of
    # a ``pread`` buffer (no copy). Only for a caller that uses the chunks at
    # once and keeps none: a view of a file truncated meanwhile (a follower
    # cutting its log back) would fault when read.
    view: bool = False
    id_pairs: bool = False


class Segment:
    """A ``.log`` file and its indexes; see the module docstring."""

    def __init__(self, directory: Path, base_offset: int, cache: FileCache,
                 index_interval_bytes: int, log_bytes: int = 0,
                 index_bytes: int = 0, id_index_bytes: int = 0) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.cache = cache
        self.index_interval_bytes = index_interval_bytes
        self.log_path = str(segment_path(directory, base_offset, LOG_SUFFIX))
        self.size = log_bytes  # the end of the last batch
        self.file_size = log_bytes  # the file's size: zeros written ahead included
        self.end_offset = base_offset  # offset after the last batch
        self.index = SegmentIndex(
            cache, str(segment_path(directory, base_offset, INDEX_SUFFIX)),
            str(segment_path(directory, base_offset, ID_INDEX_SUFFIX)),
            index_bytes, id_index_bytes)
        self.index_checked = False
        # Bytes this process neither wrote nor CRC-checked in recovery (data
        # below the recovery point at open, up to ``crc_check_end``): reads
        # check each batch's CRC and offset continuity before serving it, so
        # a file damaged on disk gives an error, never garbage on a client's
        # connection. The batches checked from the start of the file on,
        # without a gap, are not checked again (``crc_ok_to``, the position
        # they end at, and ``crc_ok_offset``, the offset that follows): the
        # C walk serves them; once they cover ``crc_check_end`` the segment
        # is as trusted as one this process wrote.
        self.check_crc = False
        self.crc_check_end = 0
        self.crc_ok_to = 0
        self.crc_ok_offset = base_offset
        self._last_indexed_pos = -1
        self._first_id: tuple[int, int] | None = None
        self._first_ts: int | None = None
        self._last_info: tuple[int, int, int] | None = None  # last_ms, last_seq, max_ts
        self._map: memoryview | None = None  # read-only view of the mapping's [0, _map_len), see _view
        self._map_len = 0
        self._map_whole: memoryview | None = None  # the whole mapping: [0, _map_cap), past the file's end
        self._map_cap = 0
        self._mapped_at = 0  # the segment's size when mapped
        self._ahead = 0  # the last stretch of zeros zero_ahead wrote

    def __repr__(self) -> str:
        return f"Segment({self.base_offset}, end={self.end_offset}, size={self.size})"

    @classmethod
    def create(cls, directory: Path, base_offset: int, cache: FileCache,
               index_interval_bytes: int) -> "Segment":
        seg = cls(directory, base_offset, cache, index_interval_bytes)
        try:
            fd = os.open(seg.log_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            os.close(fd)
        except OSError as exc:
            raise_storage_error(f"create {seg.log_path}", exc)
        for p in (seg.index.offset_path, seg.index.id_path):
            try:
                os.truncate(p, 0)
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise_storage_error(f"truncate {p}", exc)
        seg.index_checked = True
        seg.activate()
        return seg

    # -- raw I/O -------------------------------------------------------------

    def _read_fd(self) -> int:
        """The ``.log``'s descriptor for a read: a failure to open it is a read error."""
        try:
            return self.cache.get(self.log_path)
        except StorageError as exc:
            raise exc.reading() from exc.__cause__

    def pread(self, pos: int, n: int) -> bytes:
        fd = self._read_fd()
        try:
            return os.pread(fd, n, pos)
        except OSError as exc:
            raise_storage_error(f"read {self.log_path}", exc, READ_FAILED)

    def _view(self) -> memoryview | None:
        """The mapping's view of the segment's bytes (None when unmapped):
        of ``[0, size)``, or of as much of it as the mapping reaches. Cut
        anew when batches were appended inside the mapping since the last
        cut; never longer than ``size`` (past the file's end, pages fault)."""
        view = self._map
        if view is not None and self._map_len < self.size and self._map_len < self._map_cap:
            self._map_len = min(self.size, self._map_cap)
            self._map = view = self._map_whole[:self._map_len]
        return view

    def mapped(self, end: int) -> memoryview | None:
        """A memoryview of the mapped file (``_view``) when it covers ``[0,
        end)``, mapping (or remapping a file grown past its mapping) when
        worthwhile; else None and the caller uses ``pread``."""
        view = self._view()
        mappings = self.cache.mappings
        if view is not None and end <= self._map_len:
            mappings.touch(self)
            return view
        size = self.size
        if end > size or (view is not None and size - self._mapped_at < _REMAP_BYTES) or size < HEADER_BYTES:
            return None
        if not mappings.may_map():
            return None
        self.unmap()
        try:
            whole = memoryview(_map_file(self._read_fd(), size))
        except (OSError, ValueError):
            return None  # no mapping (an odd file system, a file shorter than expected): pread
        self._map_whole = whole
        self._map_cap = len(whole)
        self._mapped_at = self._map_len = size
        self._map = whole[:size]
        mappings.add(self)
        return self._map

    def unmap(self) -> None:
        """Drop the mapping (before truncating or deleting the file). Views a
        reader still holds keep it alive until they go."""
        view, whole = self._map, self._map_whole
        if view is None:
            return
        self._map = self._map_whole = None
        self._map_len = self._map_cap = 0
        self.cache.mappings.remove(self)
        m = whole.obj
        try:
            view.release()
            whole.release()
            m.close()
        except BufferError:
            self.cache.mappings.retire(m)  # slices still exported: unmapped when the last one is dropped

    def header_at(self, pos: int) -> tuple:
        raw = self.pread(pos, HEADER_BYTES)
        if len(raw) < HEADER_BYTES:
            raise StorageError(f"{self.log_path}: no batch header at position {pos}")
        return HEADER.unpack(raw)

    def _corrupt(self, pos: int, why: str) -> StorageError:
        return StorageError(f"{self.log_path}: corrupt batch at position {pos}: {why}")

    # -- active / sealed -----------------------------------------------------

    def activate(self) -> None:
        """Load the index into memory so appends can extend it."""
        self.index.load()
        last = self.index.last()
        self._last_indexed_pos = last[3] if last else -1

    def seal(self) -> None:
        """Write the pending index entries; drop the in-memory index."""
        self.index.unload()

    def persist_index(self) -> None:
        self.index.persist()

    # -- append --------------------------------------------------------------

    def append(self, head: bytes, body: bytes, base_offset: int, count: int,
               first_ms: int, first_seq: int, last_ms: int, last_seq: int,
               timestamp_ms: int) -> None:
        """Write one encoded batch at the end; on failure truncate back."""
        assert base_offset == self.end_offset
        pos = self.size
        fd = self.cache.get(self.log_path)
        try:
            total = append_or_undo(fd, [head, body], pos, f"append to {self.log_path}")
        except StorageError:
            self.file_size = pos  # append_or_undo cut the file there
            raise
        self._after_append(pos, total, base_offset, count, first_ms, first_seq,
                           last_ms, last_seq, timestamp_ms)

    def _after_append(self, pos: int, total: int, base_offset: int, count: int,
                      first_ms: int, first_seq: int, last_ms: int, last_seq: int,
                      timestamp_ms: int) -> None:
        if self._last_indexed_pos < 0 or pos - self._last_indexed_pos >= self.index_interval_bytes:
            self.index.append(base_offset - self.base_offset, pos, first_ms, first_seq)
            self._last_indexed_pos = pos
        if pos == 0:
            self._first_id = (first_ms, first_seq)
            self._first_ts = timestamp_ms
        self._last_info = (last_ms, last_seq, timestamp_ms if self._last_info is None
                           else max(timestamp_ms, self._last_info[2]))
        self.size = pos + total
        if self.size > self.file_size:
            self.file_size = self.size
        self.end_offset = base_offset + count

    def zero_ahead(self, need: int, most: int) -> None:
        """Before an append that ends at ``need``: extend the file with zeros
        past it (preallocation, see the module docstring) by a stretch that
        starts at 64 KiB and doubles each time, up to ``most``. A failed
        write (a full disk) leaves the file as it was: the append itself
        reports a real failure."""
        start = self.file_size
        if need <= start:
            return
        self._ahead = min(most, max(_FIRST_AHEAD_BYTES, 2 * self._ahead))
        end = need + self._ahead
        fd = self.cache.get(self.log_path)
        pos = start
        try:
            while pos < end:
                pos += os.pwrite(fd, _ZEROS_VIEW[: min(len(_ZEROS), end - pos)], pos)
        except OSError:
            try:
                os.ftruncate(fd, start)
            except OSError:
                pass  # zeros past file_size are harmless: overwritten, or cut as ZERO_TAIL
            return
        self.file_size = end

    def trim(self) -> None:
        """Cut the zeros written ahead, durably (before the segment is sealed
        or its log closed: a segment below the recovery point is trusted to
        end with its last batch)."""
        if self.file_size <= self.size:
            return
        fd = self.cache.get(self.log_path)
        try:
            os.ftruncate(fd, self.size)
            os.fdatasync(fd)
        except OSError as exc:
            raise_storage_error(f"truncate {self.log_path}", exc)
        self.file_size = self.size

    def _zeros_from(self, pos: int, end: int) -> bool:
        """Whether bytes ``[pos, end)`` of the file are all zero."""
        while pos < end:
            chunk = self.pread(pos, min(len(_ZEROS), end - pos))
            if not chunk or chunk != _ZEROS[: len(chunk)]:
                return False
            pos += len(chunk)
        return True

    def append_raw(self, data, count_end_offset: int, batches: list[tuple]) -> None:
        """Write already-encoded batches (``batches``: (pos_in_data, header) each)."""
        pos = self.size
        fd = self.cache.get(self.log_path)
        try:
            append_or_undo(fd, [data], pos, f"append to {self.log_path}")
        except StorageError:
            self.file_size = pos
            raise
        for p, h in batches:
            self._after_append(pos + p, h[records.H_LENGTH], h[records.H_BASE], h[records.H_COUNT],
                               h[records.H_FIRST_MS], h[records.H_FIRST_SEQ],
                               h[records.H_LAST_MS], h[records.H_LAST_SEQ], h[records.H_MAX_TS])
        assert self.end_offset == count_end_offset

    # -- metadata ------------------------------------------------------------

    @property
    def empty(self) -> bool:
        return self.size == 0

    def first_id(self) -> tuple[int, int] | None:
        if self._first_id is None and self.size:
            h = self.header_at(0)
            self._first_id = (h[records.H_FIRST_MS], h[records.H_FIRST_SEQ])
            self._first_ts = h[records.H_MAX_TS]
        return self._first_id

    def first_timestamp_ms(self) -> int | None:
        self.first_id()
        return self._first_ts

    def last_info(self) -> tuple[int, int, int] | None:
        """``(last_ms, last_seq, largest max_timestamp_ms)`` of the segment."""
        if self._last_info is None and self.size:
            h, max_ts = self._tail()
            self._last_info = (h[records.H_LAST_MS], h[records.H_LAST_SEQ], max_ts)
        return self._last_info

    def last_header(self) -> tuple | None:
        """The header of the segment's last batch (None when it has none)."""
        return self._tail()[0] if self.size else None

    def _tail(self) -> tuple[tuple, int]:
        """``(last batch's header, largest max_timestamp_ms)`` of the batches
        from the last index entry on."""
        self.ensure_index()
        last = self.index.last()
        start = last[3] if last else 0
        max_ts = 0
        h = None
        for _pos, h in self._headers(start, self.size):
            max_ts = max(max_ts, h[records.H_MAX_TS])
        if h is None:
            raise self._corrupt(start, "no batch where the index points")
        return h, max_ts

    # -- index validity ------------------------------------------------------

    def ensure_index(self) -> None:
        """Check a sealed segment's index once; rebuild it if it is missing or
        wrong. A rebuild that finds a damaged batch header raises (a
        ``CORRUPT`` StorageError), and so does the next call: the index is
        never built from a header that does not continue the one before."""
        if self.index_checked:
            return
        if not self._index_looks_valid():
            self.rebuild_index()
        self.index_checked = True

    def _index_looks_valid(self) -> bool:
        if self.index.in_memory:
            return True
        n = self.index.file_entry_count()
        if self.size == 0:
            return n == 0
        if not n:
            return False
        first = self.index.entry(0)
        if first[2] != 0 or first[3] != 0:
            return False
        ms, seq, rel, pos = self.index.entry(n - 1)
        if pos + HEADER_BYTES > self.size:
            return False
        h = self.header_at(pos)
        return (h[records.H_BASE] == self.base_offset + rel
                and (h[records.H_FIRST_MS], h[records.H_FIRST_SEQ]) == (ms, seq)
                and pos + h[records.H_LENGTH] <= self.size)

    def rebuild_index(self) -> None:
        """Rebuild both indexes from the batch headers (no CRC check, but each
        batch's base offset must continue the one before: a damaged header
        raises ``CORRUPT`` and leaves the index as it was)."""
        found = []
        last_pos = -1
        expected = self.base_offset
        for pos, h in self._headers(0, self.size):
            if h[records.H_BASE] != expected:
                raise self._corrupt(pos, f"base offset {h[records.H_BASE]} where {expected} was expected")
            expected += h[records.H_COUNT]
            if last_pos < 0 or pos - last_pos >= self.index_interval_bytes:
                found.append((h[records.H_BASE] - self.base_offset, pos, h[records.H_FIRST_MS], h[records.H_FIRST_SEQ]))
                last_pos = pos
        was_active = self.index.in_memory
        self.index.reset()
        for entry in found:
            self.index.append(*entry)
        self._last_indexed_pos = last_pos
        self.index.persist()
        if not was_active:
            self.index.unload()

    # -- lookups -------------------------------------------------------------

    def _headers(self, pos: int, stop_pos: int):
        """Yield ``(pos, header)`` for each batch from ``pos`` up to ``stop_pos``."""
        mapped = self._view()  # mapped by a read already
        if stop_pos > self._map_len:
            mapped = None
        buf = b"" if mapped is None else mapped
        buf_pos = 0 if mapped is not None else pos
        while pos < stop_pos:
            if pos + HEADER_BYTES > buf_pos + len(buf):
                buf = self.pread(pos, max(HEADER_BYTES, min(_WINDOW_BYTES, stop_pos - pos)))
                buf_pos = pos
                if len(buf) < HEADER_BYTES:
                    raise self._corrupt(pos, "batch header past the end of the file")
            h = HEADER.unpack_from(buf, pos - buf_pos)
            if h[records.H_LENGTH] < HEADER_BYTES or h[records.H_COUNT] == 0:
                raise self._corrupt(pos, f"batch length {h[records.H_LENGTH]}")
            yield pos, h
            pos += h[records.H_LENGTH]

    def locate(self, offset: int) -> tuple[int, tuple]:
        """``(position, header)`` of the batch holding ``offset``."""
        assert self.base_offset <= offset < self.end_offset, (offset, self)
        self.ensure_index()
        rel = offset - self.base_offset
        lo = self.index.floor_offset(rel)
        start = lo[1] if lo else 0
        hi = self.index.ceiling_offset(rel + 1)
        stop = hi[1] if hi else self.size
        for pos, h in self._headers(start, stop):
            if offset < h[records.H_BASE] + h[records.H_COUNT]:
                if h[records.H_BASE] > offset:
                    break
                return pos, h
        raise self._corrupt(start, f"offset {offset} not found between positions {start} and {stop}")

    def entry_id(self, offset: int) -> tuple[int, int]:
        pos, h = self.locate(offset)
        i = offset - h[records.H_BASE]
        raw = self.pread(pos + HEADER_BYTES + 16 * i, 16)
        return struct.unpack("<QQ", raw)

    def entry_at(self, offset: int) -> bytes:
        pos, h = self.locate(offset)
        why = unreadable(h[records.H_ENTRY_FORMAT])
        if why:
            raise self._corrupt(pos, why)
        n = h[records.H_COUNT]
        i = offset - h[records.H_BASE]
        ends_raw = self.pread(pos + HEADER_BYTES + 16 * n + 4 * (i - 1 if i else 0), 8 if i else 4)
        if i:
            s, e = struct.unpack("<II", ends_raw)
        else:
            s, e = 0, struct.unpack("<I", ends_raw)[0]
        d = records.data_start(pos, n)
        return self.pread(d + s, e - s)

    def check_crc_below(self, end_pos: int) -> None:
        """Reads must CRC-check the batches in ``[0, end_pos)`` before
        serving them (a file opened, not written, by this process)."""
        self.check_crc = end_pos > 0
        self.crc_check_end = end_pos
        self.crc_ok_to = 0
        self.crc_ok_offset = self.base_offset

    def _crc_prefix_to(self, end: int, next_offset: int) -> int:
        """The batch that continues the checked prefix (at ``crc_ok_to``,
        base ``crc_ok_offset``) passed its check: the prefix now ends at
        ``end``, before ``next_offset``. Returns ``end``."""
        self.crc_ok_to = end
        self.crc_ok_offset = next_offset
        if end >= self.crc_check_end:
            self.check_crc = False
        return end

    def find_id_mapped(self, ms: int, seq: int) -> tuple[int, int] | None:
        """``find_id``'s walk in C over the file's mapping (``storage._walk.
        find``): ``(offset, position of its batch)``, ``(-1, -1)`` for
        ``end_offset``; None when the file is not mapped far enough."""
        view = self._view()
        if view is None or _walk is None:
            return None
        self.ensure_index()
        self.cache.mappings.touch(self)
        return _walk.find(view, self.size, self.index.id_entries(), self.base_offset, ms, seq)

    def read_after_mapped(self, above: tuple[int, int], lo: int, stop: int, left: int, chunks: list) -> tuple | None:
        """XREAD's read in this segment in one C call (``storage._walk.
        after``): the entries from the first whose ID is at or above
        ``above``, up to offset ``stop`` (at most ``left``; -1: no bound),
        appended to ``chunks`` as views of the mapping (``ReadAccumulator.
        view``): ``(next offset, count, done)``. None, nothing appended,
        unless the file is mapped, its CRCs checked and that first entry at
        or after offset ``lo``, before ``stop``: the caller's general path.
        The walk stops at the mapping's end (a newer tail is the caller's)
        and at a batch it cannot take whole, as ``read``'s C walk does."""
        if self.check_crc or _walk is None:
            return None
        view = self._view()
        if view is None:
            view = self.mapped(HEADER_BYTES)
            if view is None:
                return None
        else:
            self.cache.mappings.touch(self)
        if not self.index_checked:
            self.ensure_index()
        return _walk.after(view, self.size, self.index.id_entries(), self.base_offset, above[0], above[1],
                           lo, min(stop, self.end_offset), left, chunks)

    def find_id(self, ms: int, seq: int) -> int:
        """The first offset in this segment whose ID is >= (ms, seq), else ``end_offset``."""
        self.ensure_index()
        found = self.find_id_mapped(ms, seq)
        if found is not None:
            return self.end_offset if found[0] < 0 else found[0]
        i = self.index.floor_id(ms, seq)
        if i >= 0:
            start = self.index.entry(i)[3]
        elif len(self.index) and self.index.entry(0)[3] == 0:
            return self.base_offset  # the first batch is indexed and starts above the target
        else:
            start = 0  # an index that lacks the first batch (one not written before a restart)
        stop = self.index.entry(i + 1)[3] if i + 1 < len(self.index) else self.size
        target = (ms, seq)
        for pos, h in self._headers(start, stop):
            if (h[records.H_LAST_MS], h[records.H_LAST_SEQ]) >= target:
                n = h[records.H_COUNT]
                raw = self.pread(pos + HEADER_BYTES, 16 * n)
                ids = memoryview(raw).cast("Q")
                j = bisect_left(range(n), target, key=lambda k: (ids[2 * k], ids[2 * k + 1]))
                return h[records.H_BASE] + j
        return self.base_offset + self.index.entry(i + 1)[2] if i + 1 < len(self.index) else self.end_offset

    # -- reads ---------------------------------------------------------------

    def read(self, start: int, stop: int, deleted, acc: ReadAccumulator) -> int:
        """Append entries in ``[start, stop)`` to ``acc``; return the next offset.

        ``deleted`` is a sorted sequence of deleted offsets of this segment (or
        empty). Contiguous live entries of one batch become one memoryview
        slice of one ``pread`` buffer, or of the file's mapping when
        ``acc.view`` (up to the mapping's end; a newer tail is read).
        """
        stop = min(stop, self.end_offset)
        cur = start
        base_offset = self.base_offset
        index = self.index
        head29 = _HEAD29.unpack_from
        check_crc = self.check_crc
        crc_ok_to = self.crc_ok_to  # batches below it passed their check already
        expect_base = None
        chunks = acc.chunks
        max_count, max_bytes = acc.max_count, acc.max_bytes
        split, want_ids = acc.split, acc.want_ids
        use_map = acc.view
        # The common case's walk is C (storage/_walk.c): whole batches, no
        # deleted entries, no byte bound, one chunk per batch, no CRC.
        # With CRCs to check, the C walk serves only the batches already
        # checked (``crc_ok_to``); this loop checks the others.
        walk = (_walk.batches if _walk is not None and not deleted and max_bytes is None
                and not split else None)
        started = None
        view = self.mapped(HEADER_BYTES) if use_map and walk is not None else None
        if view is not None:
            # A mapped file: finding the start batch (``locate``) is C too.
            self.ensure_index()
            left = -1 if max_count is None else max_count - acc.count
            end = min(self.size, self._map_len, crc_ok_to if check_crc else self.size)
            started = _walk.read(view, end, index.offset_keys(), base_offset, cur, stop, left, chunks, acc.entries,
                                  acc.id_pairs)
        if started is None:
            pos, h = self.locate(start)
            next_len = h[records.H_LENGTH]
        else:
            pos, cur, count, nbytes, done = started
            acc.count += count
            acc.nbytes += nbytes
            if done:
                acc.done = True
            next_len = HEADER_BYTES  # the batch at pos is left to the loop below
        while cur < stop and not acc.done:
            mapped = self.mapped(pos + next_len) if use_map else None
            if mapped is not None:
                # The mapped file is the buffer: batches are sliced from it
                # up to the mapping's end, then read as below.
                buf = mv = mapped
                buf_pos, p = 0, pos
            else:
                stop_est = stop
                if max_count is not None:
                    stop_est = min(stop, cur + (max_count - acc.count) + (len(deleted) and 64))
                hi = index.ceiling_offset(stop_est - base_offset)
                want = (hi[1] if hi and hi[1] > pos else self.size) - pos
                if max_bytes is not None:
                    want = min(want, (max_bytes - acc.nbytes) * 2 + 4096)
                want = max(min(want, _READ_CAP_BYTES), next_len, HEADER_BYTES)
                buf = self.pread(pos, want)
                mv = memoryview(buf)
                buf_pos, p = pos, 0
            size = len(buf)
            if size - p < next_len:
                raise self._corrupt(pos, "batch runs past the end of the file")
            ok_end = crc_ok_to - buf_pos if check_crc else size  # in buf: batches checked already
            while True:
                if walk is not None and p < ok_end:
                    left = -1 if max_count is None else max_count - acc.count
                    p0 = p
                    p, cur, count, nbytes, done = walk(mv, p, min(size, ok_end), cur, stop, left, chunks,
                                                       acc.entries, acc.id_pairs)
                    if p != p0:
                        expect_base = None  # continuity across the walked batches was checked before
                    acc.count += count
                    acc.nbytes += nbytes
                    if done:
                        acc.done = True
                    if done or cur >= stop:
                        break
                    # The batch at p is one the walk leaves to this loop.
                if p + HEADER_BYTES > size:
                    next_len = HEADER_BYTES
                    break
                b_base, length, _crc, _ver, _flags, _epoch, n, entry_format = head29(buf, p)
                if length < HEADER_BYTES + 20 * n or n == 0:  # garbage: never loop on it
                    raise self._corrupt(buf_pos + p, f"batch length {length} for {n} entries")
                if p + length > size:
                    next_len = length
                    break
                if check_crc and p >= ok_end:
                    if crc32c(mv[p + 16: p + length]) != _crc:
                        raise self._corrupt(buf_pos + p, "CRC mismatch (damaged on disk)")
                    if expect_base is not None and b_base != expect_base:
                        raise self._corrupt(buf_pos + p, f"base offset {b_base} where {expect_base} was expected")
                    expect_base = b_base + n
                    if p == ok_end:  # the batch after the checked prefix must continue it
                        if b_base != self.crc_ok_offset:
                            raise self._corrupt(buf_pos + p, f"base offset {b_base} where {self.crc_ok_offset} "
                                                "was expected")
                        crc_ok_to = self._crc_prefix_to(crc_ok_to + length, expect_base)
                        ok_end += length
                b_end = b_base + n
                if b_end <= cur:
                    p += length
                    continue
                if entry_format > ENTRY_FORMAT_MAX_READABLE:  # never sent as stream-v1 entries
                    raise self._corrupt(buf_pos + p, unreadable(entry_format))
                i0 = cur - b_base
                i1 = n if b_end <= stop else stop - b_base
                d = p + HEADER_BYTES + 20 * n
                ends = mv[d - 4 * n: d].cast("I")
                runs = None
                if deleted:
                    lo = bisect_left(deleted, b_base + i0)
                    hi_d = bisect_left(deleted, b_base + i1)
                    if lo < hi_d:
                        runs = []
                        a = i0
                        for k in range(lo, hi_d):
                            x = deleted[k] - b_base
                            if x > a:
                                runs.append((a, x))
                            a = x + 1
                        if a < i1:
                            runs.append((a, i1))
                if runs is None:
                    runs = ((i0, i1),)
                reached = i1
                for r0, r1 in runs:
                    if max_count is not None and r1 - r0 >= max_count - acc.count:
                        r1 = r0 + (max_count - acc.count)
                        acc.done = True
                    rel0 = ends[r0 - 1] if r0 else 0
                    if max_bytes is not None:
                        j = bisect_right(ends, rel0 + max_bytes - acc.nbytes, r0, r1)
                        if j == r0 and acc.count == 0:
                            j = r0 + 1
                        if j < r1:
                            r1 = j
                            acc.done = True
                    if r1 > r0:
                        if split:
                            prev = rel0
                            for k in range(r0, r1):
                                e = ends[k]
                                chunks.append(mv[d + prev: d + e])
                                prev = e
                        else:
                            chunks.append(mv[d + rel0: d + ends[r1 - 1]])
                        acc.count += r1 - r0
                        acc.nbytes += ends[r1 - 1] - rel0
                        if want_ids:
                            q = mv[p + HEADER_BYTES: d - 4 * n].cast("Q")[2 * r0: 2 * r1].tolist()
                            if acc.id_pairs:
                                acc.entries.extend(zip(q[0::2], q[1::2]))
                            else:
                                acc.entries.extend(zip(range(b_base + r0, b_base + r1), q[0::2], q[1::2]))
                    if acc.done:
                        reached = r1
                        break
                cur = b_base + reached
                if acc.done or cur >= stop:
                    break
                p += length
            pos = buf_pos + p
        return cur

    # -- recovery ------------------------------------------------------------

    def recover_from(self, pos: int, expected_base: int, max_batch_bytes: int):
        """CRC-check batches from ``pos`` to the end of the file, indexing them.

        The in-memory index must already hold only entries below ``pos``.
        Returns ``(valid_end_pos, end_offset, reason)``; ``reason`` is None
        when the whole file was valid, otherwise why the tail at
        ``valid_end_pos`` is bad (the caller truncates).
        """
        assert self.index.in_memory
        last = self.index.last()
        self._last_indexed_pos = last[3] if last else -1
        offset = expected_base
        file_size = self.size
        while pos < file_size:
            chunk = self.pread(pos, min(max(_SCAN_CHUNK_BYTES, HEADER_BYTES), file_size - pos))
            p = 0
            while p < len(chunk):
                why = records.check_batch(chunk, p, len(chunk) - p, offset, max_batch_bytes)
                if why is not None and why.startswith("torn") and pos + len(chunk) < file_size:
                    break  # the batch continues past this chunk: read more
                if why is not None:
                    self.size = pos + p
                    self.end_offset = offset
                    return pos + p, offset, ZERO_TAIL if self._zeros_from(pos + p, file_size) else why
                h = HEADER.unpack_from(chunk, p)
                self.size = pos + p  # _after_append sets size and end offset
                self._after_append(pos + p, h[records.H_LENGTH], h[records.H_BASE], h[records.H_COUNT],
                                   h[records.H_FIRST_MS], h[records.H_FIRST_SEQ], h[records.H_LAST_MS],
                                   h[records.H_LAST_SEQ], h[records.H_MAX_TS])
                offset = h[records.H_BASE] + h[records.H_COUNT]
                p += h[records.H_LENGTH]
            if p == 0:
                big = self.pread(pos, min(file_size - pos, max_batch_bytes + HEADER_BYTES + 64 * 1024 * 1024))
                why = records.check_batch(big, 0, len(big), offset, max_batch_bytes)
                if why is not None:
                    self.size = pos
                    self.end_offset = offset
                    return pos, offset, ZERO_TAIL if self._zeros_from(pos, file_size) else why
                h = HEADER.unpack_from(big, 0)
                self._after_append(pos, h[records.H_LENGTH], h[records.H_BASE], h[records.H_COUNT],
                                   h[records.H_FIRST_MS], h[records.H_FIRST_SEQ], h[records.H_LAST_MS],
                                   h[records.H_LAST_SEQ], h[records.H_MAX_TS])
                offset = h[records.H_BASE] + h[records.H_COUNT]
                p = h[records.H_LENGTH]
            pos += p
        self.size = pos
        self.end_offset = offset
        return pos, offset, None

    def position_of(self, offset: int) -> int | None:
        """The position where the batch starting at ``offset`` starts (or the
        end of the last batch when that batch ends right before ``offset``),
        walking headers from the index; None if no batch boundary is at
        ``offset`` (an offset past the last batch among them)."""
        self.ensure_index()
        rel = offset - self.base_offset
        lo = self.index.floor_offset(max(rel - 1, 0)) if rel > 0 else None
        start = lo[1] if lo else 0
        pos = start
        end = self.base_offset if start == 0 else None  # the offset after the batches walked
        try:
            for pos, h in self._headers(start, self.size):
                if h[records.H_BASE] == offset:
                    return pos
                if h[records.H_BASE] > offset:
                    return None
                end = h[records.H_BASE] + h[records.H_COUNT]
                pos += h[records.H_LENGTH]
        except StorageError:
            # At open, size still counts zeros written ahead: they end the batches.
            if not self._zeros_from(pos, min(pos + HEADER_BYTES, self.size)):
                return None
        return pos if end == offset and pos <= self.size else None

    def truncate_at(self, pos: int, end_offset: int) -> None:
        """Cut the ``.log`` at ``pos`` (a batch boundary) = ``end_offset``."""
        self.unmap()
        fd = self.cache.get(self.log_path)
        try:
            os.ftruncate(fd, pos)
        except OSError as exc:
            raise_storage_error(f"truncate {self.log_path}", exc)
        self.index.truncate_from(end_offset - self.base_offset)
        last = self.index.last()
        self._last_indexed_pos = last[3] if last else -1
        self.size = self.file_size = pos
        self.end_offset = end_offset
        if pos == 0:
            self._first_id = self._first_ts = None
        self._last_info = None
        if pos:
            self.last_info()

    def delete_files(self) -> None:
        """Close and unlink this segment's files (``.log`` first)."""
        self.unmap()
        for path in (self.log_path, self.index.offset_path, self.index.id_path):
            self.cache.close(path)
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise_storage_error(f"delete {path}", exc)


def _map_file(fd: int, size: int) -> mmap.mmap:
    """A read-only shared mapping of the file ``fd`` from its start: of its
    ``size`` bytes and, with the C helper (``storage._walk.map_file``),
    ``_MAP_AHEAD_BYTES`` more past its end, which only bytes appended later
    may be read through (``Segment._view``). An ``mmap.mmap`` either way:
    ``server._mapsend`` splices its slices, and ``close`` refuses while
    views of it are alive (``Segment.unmap``)."""
    if _walk is None:
        return mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    m = mmap.mmap(-1, size + _MAP_AHEAD_BYTES, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)  # address space only
    try:
        _walk.map_file(m, fd)
    except BaseException:
        m.close()  # its range may be unmapped: never read
        raise
    return m
