"""The partition log: a directory of segments with contiguous offsets.

Owns: which segments a partition has and the offsets around them
(``log_start_offset``, ``log_end_offset``, ``high_watermark``,
``recovery_point``), appends and rolls, reads across segments, ID lookups,
deletion markers, ``truncate_to``, log start moves and retention, leader
epochs, flushing (including the group-commit split) and recovery at open.
The contract is docs/storage-api.md; byte layouts are docs/storage-format.md.

Checkpoint files in the partition directory (``storage.checkpoint`` text
format, replaced atomically):

    recovery-point.checkpoint    1 row: recovery_point
    log-start-offset.checkpoint  1 row: log_start_offset last_ms last_seq
    leader-epoch.checkpoint      rows:  epoch start_offset

Recovery: segments wholly below the recovery point are trusted (their
indexes are checked lazily). From the batch that starts at the recovery point
to the end of the last segment every batch's length, base offset and CRC are
checked and the indexes rebuilt; the first bad batch and everything after it
is cut, with one WARNING on logger ``partita.storage`` (a cut below the
recovery point, zeros included, is reported as lost flushed data).
A batch's entry-format byte is not checked there (a CRC-valid batch a later
version wrote is kept, not cut): reads refuse a batch whose entry format
this version cannot read (``CORRUPT``, ``storage.entry_codec``).
``close()`` writes recovery point = log end offset, so a clean restart scans
nothing. Checkpoints are bounded when read and then checked against the
recovered log (a recovery point or log start past its end, epochs its
batches contradict): repaired from the log and rewritten, with a WARNING;
see docs/storage-format.md "Checkpoints".

A failed sync (of a segment, or of a checkpoint or producer snapshot the log
depends on: ``SyncError``) takes the log offline for writes until it is reopened: the
kernel may have dropped the pages it could not write and reports the error
to one fsync only, so a later fsync that succeeds proves nothing about them.
Appends, deletion markers and flushes then raise ``StorageError`` (the
failure's errno); reads go on; ``close()`` neither flushes nor moves the
recovery point, so the next open scans and CRC-checks everything after it.

Memory: a few numbers per segment, the active segment's index, deletion
markers (8 B per deleted entry) and leader epochs. Nothing per entry.

Thread contract: one thread (the "main" thread) calls everything, except
``FlushTicket.run()``, which may run on any thread: it only fsyncs
descriptors the ``FileCache`` keeps open for it (pinned from ``begin_flush``
to ``end_flush``) and writes the recovery-point checkpoint under ``_rp_lock``.

Must not know: RESP, stream semantics (IDs are opaque increasing pairs here),
trio, the cluster.
"""

from __future__ import annotations

import bisect
import errno
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from storage import records
from storage.checkpoint import (
    CorruptCheckpointError, encode_rows, read_rows, remove_stale_tmp,
    write_atomic, write_rows,
)
from storage.errors import (BatchTooLargeError, BeyondHighWatermarkError, InvalidBatchError, OffsetOutOfRangeError,
                            StorageError, SyncError, raise_storage_error)
from storage.files import (
    ID_INDEX_SUFFIX, INDEX_SUFFIX, LEADER_EPOCH_FILE, LOG_START_FILE, LOG_SUFFIX,
    MARKERS_SUFFIX, RECOVERY_POINT_FILE, parse_base_offset, segment_path,
)
from storage.handles import FileCache
from storage.markers import DeletionMarkers
from storage.producers import SNAPSHOT_SUFFIX as PRODUCER_SNAPSHOT_SUFFIX
from storage.producers import ProducerState, ReplayedBatch
from storage.segment import ZERO_TAIL, ReadAccumulator, Segment

MiB = 1024 * 1024
RECOVERY_CHECKPOINT_INTERVAL_MS = 1000
# A flush ticket pins at most this share of the FileCache's descriptors (at
# least _TICKET_FDS_MIN): with the rounds' own bound (cluster/broker/durability.py)
# pinned ones never crowd out the files the main thread opens meanwhile.
_TICKET_CACHE_SHARE = 8
_TICKET_FDS_MIN = 4


def _offline_on_sync_failure(method):
    """A write of the log whose fsync fails, of a segment or of a file the
    log depends on (its leader epochs, log start, producer snapshots,
    recovery point): the log goes offline for writes (``_take_offline``)."""
    @functools.wraps(method)
    def write(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except SyncError as exc:
            self._take_offline(exc)
            raise

    return write


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def _id_after(ms: int, seq: int) -> tuple[int, int] | None:
    """The ID right after (ms, seq); None after the last possible one."""
    if seq < records.U64_MAX:
        return ms, seq + 1
    if ms < records.U64_MAX:
        return ms + 1, 0
    return None


@dataclass(frozen=True)
class LogConfig:
    """Per-partition settings (Kafka's topic configs of the same names)."""
    segment_bytes: int = 128 * MiB
    segment_ms: int = 7 * 24 * 3600 * 1000
    retention_ms: int = -1
    retention_bytes: int = -1
    index_interval_bytes: int = 4096
    max_batch_bytes: int = 64 * MiB
    # At most this many zeros kept written ahead of the active segment's end
    # (0: none); see storage.segment. The server sets it under ``fsync always``.
    preallocate_bytes: int = 0

    def __post_init__(self) -> None:
        assert 0 < self.segment_bytes <= 2**31, "positions are u32"
        assert 0 < self.max_batch_bytes <= 2**31
        assert self.index_interval_bytes > 0
        assert self.segment_ms > 0
        assert self.preallocate_bytes >= 0


@dataclass(slots=True)
class ReadResult:
    """``chunks`` concatenated are exactly ``count`` encoded entries."""
    count: int
    chunks: list
    next_offset: int
    entries: list | None = None  # [(offset, ms, seq)] when with_ids=True ((ms, seq) with id_pairs)


@dataclass(frozen=True)
class SegmentInfo:
    base_offset: int
    end_offset: int
    size_bytes: int
    path: str


class FlushTicket:
    """One group-commit flush: ``run()`` on any thread, between
    ``PartitionLog.begin_flush()`` and ``PartitionLog.end_flush()`` on the main
    thread. ``run()`` raises ``StorageError`` if an fsync fails; then
    ``end_flush`` does not advance the recovery point.

    The descriptors are the log's ``FileCache``'s own, pinned by
    ``begin_flush`` (so the cache cannot close them, nor their numbers name
    another file, while another thread syncs them) and unpinned by
    ``end_flush``, which every ticket must reach, run or not. ``partial``: the
    ticket covers only the oldest of the log's unsynced segments (a ticket
    pins at most an eighth of the cache); the log needs another flush for
    the rest."""

    def __init__(self, log: "PartitionLog", fds: list[int], target: int, generation: int,
                 checkpoint: bytes | None, markers_seen: dict[int, int], dir_seq: int, *,
                 dir_fd: int = -1, index_seen: list | None = None, partial: bool = False) -> None:
        self._log = log
        self._pinned = fds  # unpinned by end_flush
        self._fds = list(fds)  # still to sync: emptied by finish
        self.target_offset = target
        self.generation = generation
        self._checkpoint = checkpoint
        self._markers_seen = markers_seen
        self._dir_seq = dir_seq
        self._index_seen = index_seen or []
        self.ok = False
        self.ran = False
        self.partial = partial
        self.dir_fd = dir_fd  # the partition directory's descriptor among ``fds``, if any

    @property
    def checkpoints(self) -> bool:
        """Whether the ticket carries a recovery-point checkpoint to write
        (once a second at most: a temporary file, its fsync, a rename and
        the directory's fsync, ~0.6 ms): a caller on an event loop finishes
        it with ``defer_checkpoint`` and writes it on a worker thread."""
        return self._checkpoint is not None

    def sync_targets(self) -> list[tuple[int, bool]]:
        """The descriptors ``run()`` syncs, each with whether it needs a full
        ``fsync`` (the directory) rather than ``fdatasync``: for a caller that
        syncs them itself, on a thread of its own, and then calls ``finish``."""
        dir_fd = self.dir_fd
        return [(fd, fd == dir_fd) for fd in self._fds]

    def run(self) -> None:
        """fsync every pinned descriptor, then persist the recovery point."""
        failure = None
        for fd, full in self.sync_targets():
            try:
                # Appends need only the data and the size: fdatasync skips
                # the timestamp journal write (the directory gets fsync).
                if full:
                    os.fsync(fd)
                else:
                    os.fdatasync(fd)
            except OSError as exc:
                failure = exc
                break
        self.finish(failure)

    def finish(self, failure: OSError | None, defer_checkpoint: bool = False) -> None:
        """After the syncs of ``sync_targets`` (``failure``: the first that
        failed, or None): persist the recovery point (with
        ``defer_checkpoint``: later, ``write_checkpoint``); raises
        ``StorageError`` for a failure. Any thread. (The descriptors stay
        pinned until ``end_flush``.)"""
        assert not self.ran, "a ticket runs once"
        self.ran = True
        self._fds = []
        if failure is not None:
            try:
                raise_storage_error(f"fsync {self._log.directory}", failure, sync=True)
            except StorageError as exc:
                self._log._take_offline(exc)
                raise
        if not defer_checkpoint:
            self.write_checkpoint()
        self.ok = True

    def write_checkpoint(self) -> None:
        """Persist the recovery point this ticket's syncs reached, if it
        carries a checkpoint; after a successful ``finish``, on any thread,
        also after ``end_flush``. Skipped when the log moved on meanwhile (cut
        back, closed, or a later checkpoint already written): the file only
        shortens recovery, so a late one is harmless and a stale one is
        never written."""
        checkpoint, self._checkpoint = self._checkpoint, None
        if checkpoint is not None:
            log = self._log
            with log._rp_lock:
                if log._generation == self.generation and not log._closed \
                        and self.target_offset > log._persisted_rp:
                    try:
                        write_atomic(log.directory / RECOVERY_POINT_FILE, checkpoint)
                        log._persisted_rp = self.target_offset
                    except SyncError as exc:
                        # The data is fsynced, but this disk fails its
                        # syncs: offline, as for any file of the log (not
                        # retried and logged every second).
                        log._take_offline(exc)
                    except StorageError as exc:
                        # The data is fsynced: the flush succeeded. The
                        # checkpoint only shortens recovery (an old one
                        # means a longer scan, never a wrong log), so a
                        # full disk must not turn durable writes into
                        # refused ones. Retried by the next flush.
                        log.logger.warning("%s: recovery point not checkpointed (%s); "
                                           "the next flush retries", log.directory, exc)

    def release(self) -> None:
        """Main thread: unpin the descriptors (``end_flush`` does it; once)."""
        pinned, self._pinned = self._pinned, []
        self._fds = []
        for fd in pinned:
            self._log.cache.unpin(fd)


class PartitionLog:
    """One partition; see the module docstring and docs/storage-api.md."""

    # How many logs of this process a failed sync took offline: a caller
    # looking for them (``TopicRegistry.offline_partitions``) skips the
    # search while it is 0.
    taken_offline = 0

    # -- opening -------------------------------------------------------------

    @classmethod
    def open(cls, path: Path, config: LogConfig | None = None, *,
             logger: logging.Logger | None = None,
             clock_ms: Callable[[], int] | None = None,
             file_cache: FileCache | None = None,
             hw_follows_end: bool = True) -> "PartitionLog":
        """Open (creating if missing) and recover the partition in ``path``."""
        log = cls.__new__(cls)
        log.directory = Path(path)
        log.config = config or LogConfig()
        log.logger = logger or logging.getLogger("partita.storage")
        log._clock_ms = clock_ms or wall_clock_ms
        log._own_cache = file_cache is None
        log.cache = file_cache if file_cache is not None else FileCache()
        log.hw_follows_end = hw_follows_end
        log._closed = False
        log._generation = 0
        log._rp_lock = threading.Lock()
        log._dir_seq = 0
        log._dir_synced_seq = 0
        log._markers_dirty: dict[int, int] = {}
        log._change_seq = 0
        log._rp_checkpoint_ms = 0
        log.sync_failure: StorageError | None = None  # set by a failed sync: offline for writes
        log._load()
        return log

    def _load(self) -> None:
        d = self.directory
        try:
            d.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise_storage_error(f"create {d}", exc)
        remove_stale_tmp(d)
        logs: dict[int, int] = {}
        others: dict[str, dict[int, int]] = {INDEX_SUFFIX: {}, ID_INDEX_SUFFIX: {}, MARKERS_SUFFIX: {}}
        producer_snapshots = []
        try:
            for entry in os.scandir(d):
                base = parse_base_offset(entry.name, LOG_SUFFIX)
                if base is not None:
                    logs[base] = entry.stat().st_size
                    continue
                base = parse_base_offset(entry.name, PRODUCER_SNAPSHOT_SUFFIX)
                if base is not None:
                    producer_snapshots.append(base)
                    continue
                for suffix, table in others.items():
                    base = parse_base_offset(entry.name, suffix)
                    if base is not None:
                        table[base] = entry.stat().st_size
        except OSError as exc:
            raise_storage_error(f"list {d}", exc)
        for suffix, table in others.items():
            for base in [b for b in table if b not in logs]:  # orphans of a half-done delete
                try:
                    os.unlink(segment_path(d, base, suffix))
                except OSError as exc:
                    raise_storage_error(f"delete orphan in {d}", exc)
                del table[base]

        # Every number read from a file is bounded before use (offsets below
        # 2^63, IDs u64, epochs u32), then checked against the log itself.
        start_row = self._read_checkpoint(LOG_START_FILE, (records.MAX_OFFSET, records.U64_MAX, records.U64_MAX))
        rp_row = self._read_checkpoint(RECOVERY_POINT_FILE, (records.MAX_OFFSET,))
        epoch_rows = self._read_checkpoint(LEADER_EPOCH_FILE, (records.U32_MAX, records.MAX_OFFSET), single=False)
        ckpt_start, ckpt_last = (start_row[0], (start_row[1], start_row[2])) if start_row else (0, (0, 0))
        rp_ckpt = rp_row[0] if rp_row else None
        for base in [b for b in logs if b > records.MAX_OFFSET]:
            self.logger.warning("%s: ignoring %s: its base offset is out of range (offsets end at %d), "
                                "so it is not part of the log; left in place", d,
                                segment_path(d, base, LOG_SUFFIX).name, records.MAX_OFFSET)
            del logs[base]

        interval = self.config.index_interval_bytes
        if not logs:
            self._segs = [Segment.create(d, ckpt_start, self.cache, interval)]
            self._dir_seq += 1
        else:
            self._segs = [
                Segment(d, b, self.cache, interval, logs[b],
                        others[INDEX_SUFFIX].get(b, 0), others[ID_INDEX_SUFFIX].get(b, 0))
                for b in sorted(logs)
            ]
            for seg, nxt in zip(self._segs, self._segs[1:]):
                seg.end_offset = nxt.base_offset
            for seg in self._segs:  # trusted, not yet checked: reads verify CRCs
                seg.check_crc_below(seg.size)
        self.markers = DeletionMarkers(d, self.cache)
        self._bases = [s.base_offset for s in self._segs]

        rp = max(rp_ckpt or 0, self._segs[0].base_offset)
        self._recover(rp)
        end = self.log_end_offset
        last = self._last_header()
        start_past_end = start_row is not None and ckpt_start > end
        if start_past_end:
            self.log_start_offset = self._log_start_past_end(ckpt_start, ckpt_last, last)
        else:
            self.log_start_offset = max(ckpt_start, self._segs[0].base_offset)
        # finish a deletion of whole segments that a crash interrupted
        while len(self._segs) > 1 and self._segs[0].end_offset <= self.log_start_offset:
            self._delete_segment(self._segs.pop(0))
            self._dir_seq += 1
        self._bases = [s.base_offset for s in self._segs]
        self.recovery_point = min(max(rp, self._segs[0].base_offset), end)
        self._persisted_rp = self.recovery_point
        if rp_ckpt is not None and rp_ckpt > end:
            # The checkpoint promised more than the log holds (_recover said
            # what is missing): replace it, or every start would say so again.
            self._write_at_open(RECOVERY_POINT_FILE, [(self.recovery_point,)])
        self._epochs = self._checked_epochs(epoch_rows, last)
        for seg in self._segs:
            if seg.base_offset in others[MARKERS_SUFFIX]:
                self.markers.load(seg.base_offset, min(seg.end_offset, end))
        self._deleted_live = self.markers.count_in(self.log_start_offset, end)
        self.last_id = ckpt_last if last is None else (last[records.H_LAST_MS], last[records.H_LAST_SEQ])
        if start_past_end:
            self._write_at_open(LOG_START_FILE, [(self.log_start_offset, *self.last_id)])
        self._hw = end if self.hw_follows_end else min(self.recovery_point, end)
        # The producer-state table: loaded when first needed (storage.producers).
        self.producers = ProducerState(d, self._clock_ms, lambda: self.log_end_offset, self._producer_batches,
                                       producer_snapshots, self.logger)
        self.producers.drop_above(end)  # snapshots of a tail the log lost

    def _read_checkpoint(self, name: str, limits: tuple[int, ...], single: bool = True):
        """The rows of a checkpoint (the one row when ``single``), each value
        within ``limits``; None, with a WARNING, when it is corrupt."""
        try:
            rows = read_rows(self.directory / name, len(limits), limits)
            if single and rows is not None and len(rows) != 1:
                raise CorruptCheckpointError(f"{len(rows)} rows where 1 was expected")
        except CorruptCheckpointError as exc:
            self.logger.warning("%s: ignoring corrupt %s (%s)", self.directory, name, exc)
            return None
        return rows[0] if single and rows is not None else rows

    def _write_at_open(self, name: str, rows: list[tuple[int, ...]]) -> None:
        """Replace a checkpoint that open found wrong; a failure (a full disk)
        is logged, not fatal: the next open decides the same way."""
        try:
            write_rows(self.directory / name, rows)
        except StorageError as exc:
            self.logger.warning("%s: %s not rewritten (%s)", self.directory, name, exc)

    def _last_header(self) -> tuple | None:
        """The header of the log's last batch; None for a log with none."""
        for seg in reversed(self._segs):
            if seg.size:
                return seg.last_header()
        return None

    def _log_start_past_end(self, ckpt_start: int, ckpt_last: tuple[int, int], last: tuple | None) -> int:
        """The log start when the checkpoint's is past the recovered log's
        end. That is legitimate only when the log lost entries appended
        before the checkpoint was written (a power loss after a trim under
        ``fsync everysec``): every entry left was trimmed then, and the log
        starts at its end. If instead the log still holds the last ID the
        checkpoint recorded, it never ended before that start: the file is
        damaged, and the log starts where its segments do (no entry hidden,
        no segment deleted)."""
        first = self._segs[0].base_offset
        end = self.log_end_offset
        name = self.directory / LOG_START_FILE
        log_last = (0, 0) if last is None else (last[records.H_LAST_MS], last[records.H_LAST_SEQ])
        if last is not None and log_last >= ckpt_last:
            self.logger.warning(
                "%s: log start %d is past the log end %d, yet the log still holds the last ID it "
                "recorded (%d-%d): the file is damaged; ignored, the log starts at %d (entries "
                "trimmed before may be visible again)", name, ckpt_start, end, *ckpt_last, first)
            return first
        self.logger.warning(
            "%s: log start %d is past the log end %d (entries up to ID %d-%d, appended before the "
            "trim, were lost): the log starts at its end, %d", name, ckpt_start, end, *ckpt_last, end)
        return end

    def _checked_epochs(self, rows: list | None, last: tuple | None) -> list[tuple[int, int]]:
        """The leader epochs of the checkpoint, checked against the log: rows
        past the log end are dropped (a cut tail, or a refused first append),
        and what is left must increase and end with the epoch of the last
        batch. Otherwise the list is rebuilt from the batch headers (each
        batch carries its epoch) and rewritten, with a WARNING."""
        end = self.log_end_offset
        kept = [(e, s) for e, s in rows or () if s < end]
        if last is None:
            return kept
        ordered = all(a[0] < b[0] and a[1] < b[1] for a, b in zip(kept, kept[1:]))
        if ordered and kept and kept[-1][0] == last[records.H_EPOCH] and kept[-1][1] <= last[records.H_BASE]:
            return kept
        name = self.directory / LEADER_EPOCH_FILE
        try:
            rebuilt = self._epochs_from_log()
        except StorageError as exc:
            rebuilt = [(last[records.H_EPOCH], self.log_start_offset)]
            self.logger.warning("%s: the log's batches could not be walked (%s): taking epoch %d from "
                                "offset %d", name, exc, *rebuilt[0])
        found = "missing or corrupt" if rows is None else f"says {rows}"
        self.logger.warning("%s %s, but the log's last batch (offset %d) has epoch %d: rebuilt from the "
                            "log as %s", name, found, last[records.H_BASE], last[records.H_EPOCH], rebuilt)
        self._write_at_open(LEADER_EPOCH_FILE, rebuilt)
        return rebuilt

    def _epochs_from_log(self) -> list[tuple[int, int]]:
        """``(epoch, start offset)`` of each epoch the batch headers carry (a
        walk of every header: only when the checkpoint is damaged)."""
        found: list[tuple[int, int]] = []
        for seg in self._segs:
            for _pos, h in seg._headers(0, seg.size):
                if not found or h[records.H_EPOCH] > found[-1][0]:
                    found.append((h[records.H_EPOCH], h[records.H_BASE]))
        return found

    def _recover(self, rp: int) -> None:
        """Check every batch from the recovery point on; cut a bad tail.

        Everything below ``rp`` was fsynced: a cut below it, zeros there, or
        a log that ends before it is lost data (or a damaged checkpoint),
        and the WARNING says which offsets of which file."""
        started = time.monotonic()
        segs = self._segs
        k = max(bisect.bisect_right([s.base_offset for s in segs], rp) - 1, 0)
        seg = segs[k]
        seg.activate()
        start_pos = None
        if rp > seg.base_offset:
            start_pos = seg.position_of(rp)
        if start_pos is None:
            start_pos, expected = 0, seg.base_offset
        else:
            expected = rp
        seg.index.truncate_from(expected - seg.base_offset)
        seg.index_checked = True
        cut = None
        for j in range(k, len(segs)):
            seg = segs[j]
            if j > k:
                seg.activate()
                seg.index.reset()
                seg.index_checked = True
                if seg.base_offset != expected:
                    cut = (j, 0, f"segment starts at {seg.base_offset} where {expected} was expected")
                    break
                start_pos = 0
            file_bytes = seg.size
            # recover_from checks every batch from start_pos on
            seg.check_crc_below(start_pos)
            pos, expected, why = seg.recover_from(start_pos, expected, self.config.max_batch_bytes)
            if why == ZERO_TAIL and expected >= rp:  # preallocated, never written: nothing is lost
                self.logger.info("%s: dropped %d bytes of preallocated zeros at the end of segment %d",
                                 self.directory, file_bytes - pos, seg.base_offset)
                seg.truncate_at(pos, expected)
                continue
            if why is not None:
                if why == ZERO_TAIL:
                    why = "only zeros where flushed batches were"
                cut = (j, pos, why)
                seg.size = file_bytes
                break
        if cut is not None:
            j, pos, why = cut
            seg = segs[j]
            cut_bytes = seg.size - pos
            later = segs[j + 1:]
            cut_bytes += sum(s.size for s in later)
            offset = expected
            seg.truncate_at(pos, offset)
            for s in later:
                self._delete_segment(s)
            del segs[j + 1:]
            self._dir_seq += 1
            lost = (f"; offsets {offset}..{rp - 1} were below the recovery point {rp} (flushed): "
                    f"lost from {seg.log_path}") if offset < rp else ""
            self.logger.warning(
                "%s: recovery cut the log at offset %d (segment %d, position %d): %s; "
                "removed %d bytes and %d later segment(s)%s",
                self.directory, offset, seg.base_offset, pos, why, cut_bytes, len(later), lost)
        elif expected < rp:
            self.logger.warning(
                "%s: %s (%d) is past the log end %d: offsets %d..%d below it are missing after %s "
                "(flushed data lost, or the checkpoint is damaged); the recovery point is now %d",
                self.directory, RECOVERY_POINT_FILE, rp, expected, expected, rp - 1, segs[-1].log_path, expected)
        if expected > rp:  # batches written after the last flush: the work a restart did
            self.logger.info("%s: recovery checked offsets %d..%d (written after the last flush) in %.3fs",
                             self.directory, rp, expected - 1, time.monotonic() - started)
        for s in segs[k:-1]:
            s.persist_index()
            s.seal()
        segs[-1].persist_index()
        self._bases = [s.base_offset for s in segs]

    # -- offsets -------------------------------------------------------------

    @property
    def log_end_offset(self) -> int:
        return self._segs[-1].end_offset

    @property
    def closed(self) -> bool:
        """True after ``close()``, ``abandon()`` or ``delete()``."""
        return self._closed

    @property
    def high_watermark(self) -> int:
        return self._hw

    def set_high_watermark(self, offset: int) -> None:
        assert not self.hw_follows_end, "the high watermark follows the end offset"
        self._hw = max(self.log_start_offset, min(offset, self.log_end_offset))

    @property
    def live_count(self) -> int:
        return self.log_end_offset - self.log_start_offset - self._deleted_live

    @property
    def latest_epoch(self) -> int:
        return self._epochs[-1][0] if self._epochs else -1

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self._segs)

    @property
    def segment_count(self) -> int:
        return len(self._segs)

    def segments(self) -> list[SegmentInfo]:
        return [SegmentInfo(s.base_offset, s.end_offset, s.size, s.log_path) for s in self._segs]

    def _segment_for(self, offset: int) -> int:
        return max(bisect.bisect_right(self._bases, offset) - 1, 0)

    def segment_base_at_or_below(self, offset: int) -> int:
        """Base offset of the segment holding ``offset`` (what ``~`` trims to)."""
        return self._bases[self._segment_for(offset)]

    # -- writes --------------------------------------------------------------

    @_offline_on_sync_failure
    def append(self, entries: Sequence[tuple[int, int, bytes]], leader_epoch: int = 0,
               producers: Sequence[records.ProducerRecord] = ()) -> int:
        """Append one batch; return its base offset. See the API doc.
        ``producers``: the producer records of an idempotent append, written
        in the batch (its trailer) and applied to ``self.producers``."""
        if self.sync_failure is not None:
            self._refuse("append to")
        assert self._check_ids(entries), "IDs must increase and exceed last_id"
        assert leader_epoch >= self.latest_epoch, "leader epochs never go back"
        now = self._clock_ms()
        base = self.log_end_offset
        if producers:
            self.producers.before_records(base)
        head, body = records.encode_batch(base, entries, leader_epoch, now, producers=producers)
        total = len(head) + len(body)
        if total > self.config.max_batch_bytes:
            raise BatchTooLargeError(f"batch of {total} bytes exceeds max_batch_bytes {self.config.max_batch_bytes}")
        self._maybe_roll_for(total, len(entries), now)
        seg = self._segs[-1]
        first, last = entries[0], entries[-1]
        new_epoch = leader_epoch > self.latest_epoch
        if new_epoch:  # durable before the batch that needs it
            self._add_epoch((leader_epoch, base))
        try:
            seg.append(head, body, base, len(entries), first[0], first[1], last[0], last[1], now)
        except BaseException:
            if new_epoch:
                self._drop_epoch_after(base)
            raise
        self.last_id = (last[0], last[1])
        if self.hw_follows_end:
            self._hw = seg.end_offset
        if producers:
            self.producers.applied(base, now, producers, [entries[r.index][:2] for r in producers])
            self.producers.maybe_snapshot(seg.end_offset)
        return base

    def _check_ids(self, entries) -> bool:
        if not entries:
            return False
        prev = self.last_id
        for ms, seq, _ in entries:
            if (ms, seq) <= prev:
                return False
            prev = (ms, seq)
        return True

    @_offline_on_sync_failure
    def append_raw(self, batches: bytes) -> int:
        """Append whole stored batches (a follower copying the leader's bytes).

        Raises:
            InvalidBatchError: bad CRC or structure, wrong base offset, or IDs
                not above ``last_id``. Nothing is written then.
        """
        if self.sync_failure is not None:
            self._refuse("append to")
        buf = bytes(batches)
        expected = base = self.log_end_offset
        parsed = []
        pos = 0
        last_id = self.last_id
        epoch = self.latest_epoch
        with_producers = []
        while pos < len(buf):
            why = records.check_batch(buf, pos, len(buf) - pos, expected, self.config.max_batch_bytes) \
                or records.check_tables(buf, pos)
            if why:
                raise InvalidBatchError(f"batch at byte {pos}: {why}")
            h = records.unpack_header(buf, pos)
            if (h[records.H_FIRST_MS], h[records.H_FIRST_SEQ]) <= last_id:
                raise InvalidBatchError(f"batch at byte {pos}: IDs do not exceed the last ID")
            if h[records.H_EPOCH] < epoch:
                raise InvalidBatchError(f"batch at byte {pos}: leader epoch goes back")
            epoch = h[records.H_EPOCH]
            last_id = (h[records.H_LAST_MS], h[records.H_LAST_SEQ])
            parsed.append((pos, h))
            if h[records.H_PRODUCERS]:
                with_producers.append((pos, h))
            expected += h[records.H_COUNT]
            pos += h[records.H_LENGTH]
        if not parsed:
            return base
        if with_producers:
            self.producers.before_records(base)
        first_h = parsed[0][1]
        self._maybe_roll_for(len(buf), expected - base, first_h[records.H_MAX_TS])
        seg = self._segs[-1]
        new_epochs = []
        for _pos, h in parsed:
            if h[records.H_EPOCH] > (new_epochs[-1][0] if new_epochs else self.latest_epoch):
                new_epochs.append((h[records.H_EPOCH], h[records.H_BASE]))
        if new_epochs:  # durable before the batches that need them
            self._add_epoch(*new_epochs)
        try:
            seg.append_raw(buf, expected, parsed)
        except BaseException:
            if new_epochs:
                self._drop_epoch_after(base)
            raise
        self.last_id = last_id
        if self.hw_follows_end:
            self._hw = seg.end_offset
        if with_producers:
            state = self.producers
            for pos, h in with_producers:
                recs = records.producer_records(buf, pos, h)
                ids = records.id_table(buf, pos, h[records.H_COUNT])
                state.applied(h[records.H_BASE], h[records.H_MAX_TS], recs,
                              [(ids[2 * r.index], ids[2 * r.index + 1]) for r in recs])
            state.maybe_snapshot(seg.end_offset)
        return base

    def _producer_batches(self, start: int):
        """The batches at or after ``start`` that carry producer records, as
        ``ReplayedBatch`` (what the producer-state table replays)."""
        segs = self._segs
        i = self._segment_for(start)
        while i < len(segs):
            seg = segs[i]
            i += 1
            if seg.end_offset <= start or seg.size == 0:
                continue
            pos = 0
            if start > seg.base_offset:
                pos = seg.position_of(start)
                if pos is None:  # not a batch boundary (a snapshot is always one): from the batch holding it
                    pos = seg.locate(start)[0]
            for bpos, h in seg._headers(pos, seg.size):
                if h[records.H_PRODUCERS]:
                    raw = seg.pread(bpos, h[records.H_LENGTH])
                    recs = records.producer_records(raw, 0, h)
                    ids = records.id_table(raw, 0, h[records.H_COUNT])
                    batch: ReplayedBatch = (h[records.H_BASE], h[records.H_MAX_TS], recs,
                                            [(ids[2 * r.index], ids[2 * r.index + 1]) for r in recs])
                    yield batch

    def _maybe_roll_for(self, nbytes: int, count: int, now_ms: int) -> None:
        """Before an append of ``nbytes``: roll if it does not belong in the
        active segment, and keep zeros written ahead of it (preallocation)."""
        seg = self._segs[-1]
        if seg.size and (seg.size + nbytes > self.config.segment_bytes
                         or now_ms - (seg.first_timestamp_ms() or now_ms) >= self.config.segment_ms
                         or seg.end_offset + count - seg.base_offset > records.U32_MAX):
            self.roll()
            seg = self._segs[-1]
        most = self.config.preallocate_bytes
        if most and seg.size + nbytes > seg.file_size:
            seg.zero_ahead(seg.size + nbytes, most)

    @_offline_on_sync_failure
    def roll(self) -> None:
        """Start a new active segment at the log end offset (no-op when the
        active segment is empty)."""
        active = self._segs[-1]
        if active.size == 0:
            return
        active.trim()
        active.seal()
        seg = Segment.create(self.directory, active.end_offset, self.cache, self.config.index_interval_bytes)
        seg.end_offset = active.end_offset
        self._segs.append(seg)
        self._bases.append(seg.base_offset)
        self._dir_seq += 1
        self.producers.on_roll(seg.base_offset)

    def maybe_roll(self, now_ms: int) -> bool:
        """Roll if the active segment is older than ``segment_ms``."""
        seg = self._segs[-1]
        ts = seg.first_timestamp_ms()
        if seg.size and ts is not None and now_ms - ts >= self.config.segment_ms:
            self.roll()
            return True
        return False

    def delete_entries(self, offsets: Iterable[int]) -> int:
        """Mark entries deleted (XDEL); return how many were newly marked."""
        if self.sync_failure is not None:
            self._refuse("mark deletions in")
        start, end = self.log_start_offset, self.log_end_offset
        by_seg: dict[int, list[int]] = {}
        for off in sorted(set(offsets)):
            if not start <= off < end:
                continue
            base = self._bases[self._segment_for(off)]
            if self.markers.is_deleted(base, off):
                continue
            by_seg.setdefault(base, []).append(off)
        n = 0
        for base, offs in by_seg.items():
            self.markers.add(base, offs)
            self._change_seq += 1
            self._markers_dirty[base] = self._change_seq
            n += len(offs)
        self._deleted_live += n
        return n

    def deleted_offsets(self) -> list[int]:
        """Every deletion marker at or above the log start, ascending."""
        start = self.log_start_offset
        return [o for base in self._bases for o in self.markers.get(base) if o >= start]

    def is_deleted(self, offset: int) -> bool:
        return self.markers.is_deleted(self._bases[self._segment_for(offset)], offset)

    @_offline_on_sync_failure
    def advance_log_start_offset(self, offset: int) -> None:
        """Move the log start (XTRIM, MINID, retention); drop whole segments below.

        The checkpoint is written before any file is removed.
        """
        if offset <= self.log_start_offset:
            return
        if offset > self.high_watermark:
            raise BeyondHighWatermarkError(
                f"log start {offset} beyond the high watermark {self.high_watermark}")
        self._deleted_live -= self.markers.count_in(self.log_start_offset, offset)
        self.log_start_offset = offset
        self._write_log_start()
        while len(self._segs) > 1 and self._segs[0].end_offset <= offset:
            self._delete_segment(self._segs.pop(0))
            self._bases.pop(0)
            self._dir_seq += 1
        if self._epochs and self._epochs[0][1] < offset:
            keep = [(e, s) for e, s in self._epochs if s >= offset]
            below = [(e, s) for e, s in self._epochs if s < offset]
            if not keep or keep[0][1] > offset:
                keep.insert(0, (below[-1][0], offset))
            self._epochs = keep
            write_rows(self.directory / LEADER_EPOCH_FILE, self._epochs)

    def _write_log_start(self) -> None:
        write_rows(self.directory / LOG_START_FILE,
                   [(self.log_start_offset, self.last_id[0], self.last_id[1])])

    def _delete_segment(self, seg: Segment) -> None:
        seg.delete_files()
        self.markers.drop_segment(seg.base_offset)
        self._markers_dirty.pop(seg.base_offset, None)

    @_offline_on_sync_failure
    def truncate_to(self, offset: int) -> None:
        """Drop every entry at and above ``offset``."""
        if offset >= self.log_end_offset:
            return
        with self._rp_lock:
            self._generation += 1
            if self._persisted_rp > offset:
                # Lowered before anything is cut: a crash in between must not
                # leave a checkpoint that promises offsets the log lost (the
                # next open would report them as lost flushed data).
                write_atomic(self.directory / RECOVERY_POINT_FILE, encode_rows([(offset,)]))
                self._persisted_rp = offset
        # Snapshots above the cut go before anything is cut; the table is
        # reloaded from one below it when next needed.
        self.producers.drop_above(offset)
        if offset <= self.log_start_offset:
            self._empty_at(offset)
        else:
            while self._segs[-1].base_offset >= offset:
                self._delete_segment(self._segs.pop())
                self._bases.pop()
            seg = self._segs[-1]
            if not seg.index.in_memory:
                seg.ensure_index()
                seg.activate()
            if offset == seg.end_offset:
                pass  # only whole later segments were dropped
            elif (loc := seg.locate(offset))[1][records.H_BASE] == offset:
                pos = loc[0]
                seg.truncate_at(pos, offset)
            else:
                pos, h = loc
                b_base = h[records.H_BASE]
                raw = seg.pread(pos, h[records.H_LENGTH])
                keep = records.entries_of(raw, 0)[: offset - b_base]
                seg.truncate_at(pos, b_base)
                head, body = records.encode_batch(
                    b_base, keep, h[records.H_EPOCH], h[records.H_MAX_TS], h[records.H_ENTRY_FORMAT],
                    records.records_within(records.producer_records(raw, 0, h), 0, len(keep)))
                seg.append(head, body, b_base, len(keep), keep[0][0], keep[0][1],
                           keep[-1][0], keep[-1][1], h[records.H_MAX_TS])
            self.markers.truncate_from(offset)
            self._deleted_live = self.markers.count_in(self.log_start_offset, offset)
            info = seg.last_info()
            self.last_id = (info[0], info[1])
        self._dir_seq += 1
        self._hw = min(self._hw, self.log_end_offset) if not self.hw_follows_end else self.log_end_offset
        if self._epochs and self._epochs[-1][1] >= offset:
            self._epochs = [(e, s) for e, s in self._epochs if s < offset]
            write_rows(self.directory / LEADER_EPOCH_FILE, self._epochs)
        if self.recovery_point > offset:
            self.recovery_point = offset

    def _empty_at(self, offset: int) -> None:
        for seg in self._segs:
            self._delete_segment(seg)
        self._segs = [Segment.create(self.directory, offset, self.cache, self.config.index_interval_bytes)]
        self._segs[0].end_offset = offset
        self._bases = [offset]
        self.log_start_offset = offset
        self.last_id = (0, 0)
        self._deleted_live = 0
        self._write_log_start()
        self.producers.forget_all()

    @_offline_on_sync_failure
    def restart_at(self, offset: int) -> None:
        """Drop every entry and continue the log at ``offset`` (a follower
        whose copy ends below the leader's log start: Kafka's
        truncate-fully-and-start-at)."""
        self.truncate_to(self.log_start_offset)
        if offset != self.log_start_offset:
            with self._rp_lock:
                self._generation += 1
            self._empty_at(offset)
            self._dir_seq += 1
            self._hw = offset
            self._epochs = []
            write_rows(self.directory / LEADER_EPOCH_FILE, self._epochs)
            self.recovery_point = offset
            with self._rp_lock:
                write_atomic(self.directory / RECOVERY_POINT_FILE, encode_rows([(self.recovery_point,)]))
                self._persisted_rp = self.recovery_point

    def apply_retention(self, now_ms: int) -> int:
        """Delete whole old segments by ``retention_ms`` / ``retention_bytes``,
        oldest first, never the active one, never past the high watermark.
        Returns how many segments were removed."""
        cfg = self.config
        if cfg.retention_ms < 0 and cfg.retention_bytes < 0:
            return 0
        total = self.size_bytes
        new_start = None
        n = 0
        for seg in self._segs[:-1]:
            if seg.end_offset > self.high_watermark:
                break
            by_time = cfg.retention_ms >= 0 and now_ms - seg.last_info()[2] > cfg.retention_ms
            by_size = cfg.retention_bytes >= 0 and total - seg.size >= cfg.retention_bytes
            if not (by_time or by_size):
                break
            total -= seg.size
            new_start = seg.end_offset
            n += 1
        if new_start is not None and new_start > self.log_start_offset:
            self.advance_log_start_offset(new_start)
        return n

    # -- leader epochs -------------------------------------------------------

    def _add_epoch(self, *rows: tuple[int, int]) -> None:
        """New ``(epoch, start offset)`` rows, checkpointed before the batches
        they describe are written: a batch on disk never lacks its epoch (a
        crash in between leaves a row at the log end, which open drops)."""
        self._epochs.extend(rows)
        try:
            write_rows(self.directory / LEADER_EPOCH_FILE, self._epochs)
        except BaseException:
            del self._epochs[len(self._epochs) - len(rows):]
            raise

    def _drop_epoch_after(self, end: int) -> None:
        """The append that needed the rows from ``end`` on failed: forget
        them. The file keeps them until its next rewrite; open drops rows at
        or past the log end."""
        while self._epochs and self._epochs[-1][1] >= end:
            self._epochs.pop()

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """KIP-101: ``(largest epoch <= epoch, its end offset)``; ``(-1, -1)``
        when the log has no epoch that old."""
        eps = self._epochs
        if eps and epoch == eps[-1][0]:
            return epoch, self.log_end_offset
        i = bisect.bisect_right([e for e, _ in eps], epoch)
        if i == 0:
            return -1, -1
        if i == len(eps):
            return eps[-1][0], self.log_end_offset
        return eps[i - 1][0], eps[i][1]

    def epochs(self) -> list[tuple[int, int]]:
        return list(self._epochs)

    # -- reads ---------------------------------------------------------------

    def _check_start(self, start: int) -> None:
        if start < self.log_start_offset or start > self.log_end_offset:
            raise OffsetOutOfRangeError(
                f"offset {start} outside [{self.log_start_offset}, {self.log_end_offset}]")

    def read(self, start_offset: int, end_offset: int | None = None, max_count: int | None = None,
             max_bytes: int | None = None, with_ids: bool = False, view: bool = False,
             past_hw: bool = False, id_pairs: bool = False) -> ReadResult:
        """Entries from ``start_offset`` on, stopping at ``end_offset`` (exclusive),
        the high watermark (the log's end with ``past_hw``: a reader that takes
        what a new leader holds, as a Kafka group coordinator loads its offsets),
        ``max_count`` live entries or ``max_bytes`` (at least one entry is
        returned when any is available). ``view``: chunks may be views of the
        file's mapping (``ReadAccumulator.view``: use them at once).
        ``with_ids``: ``entries`` names each entry's (offset, ms, seq), or
        with ``id_pairs`` its (ms, seq) (a group's delivery)."""
        self._check_start(start_offset)
        limit = self.log_end_offset if past_hw else self._hw
        stop = limit if end_offset is None else min(end_offset, limit)
        acc = ReadAccumulator(max_count, max_bytes, False, with_ids, [], [] if with_ids else None, view=view,
                              id_pairs=id_pairs)
        cur = start_offset
        if max_count is not None and max_count <= 0:
            return ReadResult(0, [], cur, acc.entries)
        segs = self._segs
        i = self._segment_for(cur)
        markers = self.markers
        while cur < stop and not acc.done and i < len(segs):
            seg = segs[i]
            if cur < seg.end_offset:
                cur = seg.read(cur, stop, markers.get(seg.base_offset), acc)
            if cur >= seg.end_offset:
                i += 1
        return ReadResult(acc.count, acc.chunks, max(cur, start_offset), acc.entries)

    def read_batches(self, start_offset: int, max_bytes: int) -> tuple[bytes, int]:
        """Whole stored batches from ``start_offset`` (not stopping at the high
        watermark), at most ``max_bytes`` unless the first batch alone is
        larger: what a follower fetches. Returns ``(bytes, next_offset)``.

        A ``start_offset`` inside a batch (a follower that truncated inside
        one) gets that batch's suffix re-encoded as a batch of its own, with
        the same epoch and timestamp, as ``truncate_to`` keeps a prefix.
        Deletion markers are not applied: the follower gets every entry.
        """
        self._check_start(start_offset)
        out: list[bytes] = []
        size = 0
        cur = start_offset
        i = self._segment_for(cur)
        segs = self._segs
        while i < len(segs) and cur < self.log_end_offset:
            seg = segs[i]
            if cur >= seg.end_offset:
                i += 1
                continue
            pos, h = seg.locate(cur)
            if h[records.H_BASE] != cur:
                raw = seg.pread(pos, h[records.H_LENGTH])
                skip = cur - h[records.H_BASE]
                keep = records.entries_of(raw, 0)[skip:]
                head, body = records.encode_batch(
                    cur, keep, h[records.H_EPOCH], h[records.H_MAX_TS], h[records.H_ENTRY_FORMAT],
                    records.records_within(records.producer_records(raw, 0, h), skip, h[records.H_COUNT]))
                out.append(head + body)
                size += len(out[-1])
                cur = h[records.H_BASE] + h[records.H_COUNT]
                if size >= max_bytes:
                    break
                continue
            stop_pos = seg.size
            taken_end = pos
            new_cur = cur
            for bpos, bh in seg._headers(pos, stop_pos):
                if size + (bpos + bh[records.H_LENGTH] - pos) > max_bytes and (size or bpos > pos):
                    break
                taken_end = bpos + bh[records.H_LENGTH]
                new_cur = bh[records.H_BASE] + bh[records.H_COUNT]
            if taken_end > pos:
                out.append(seg.pread(pos, taken_end - pos))
                size += taken_end - pos
            cur = new_cur
            if taken_end < stop_pos or size >= max_bytes:
                break
            i += 1
        return b"".join(out), cur

    def read_reverse(self, start_offset: int, end_offset: int, max_count: int | None = None,
                     with_ids: bool = False) -> ReadResult:
        """Entries in ``[start_offset, end_offset)``, newest first (one chunk
        per entry). ``next_offset`` is the lowest offset examined."""
        self._check_start(start_offset)
        hi = min(end_offset, self._hw)
        chunks: list = []
        entries: list | None = [] if with_ids else None
        count = 0
        while hi > start_offset and (max_count is None or count < max_count):
            seg = self._segs[self._segment_for(hi - 1)]
            seg.ensure_index()
            fl = seg.index.floor_offset(hi - 1 - seg.base_offset)
            lo = max(start_offset, seg.base_offset + (fl[0] if fl else 0))
            sub = ReadAccumulator(None, None, True, with_ids, [], [] if with_ids else None)
            seg.read(lo, hi, self.markers.get(seg.base_offset), sub)
            take = sub.count if max_count is None else min(sub.count, max_count - count)
            if take:
                chunks.extend(reversed(sub.chunks[sub.count - take:]))
                if with_ids:
                    entries.extend(reversed(sub.entries[sub.count - take:]))
                count += take
            hi = lo
        return ReadResult(count, chunks, hi, entries)

    def read_after_id(self, ms: int, seq: int, max_count: int | None = None, view: bool = False) -> ReadResult:
        """Entries whose IDs are above (ms, seq), at most ``max_count``, up to
        the high watermark: XREAD's read, what ``read(max(find_offset(ms, seq,
        inclusive=False), log_start_offset), max_count=...)`` gives. With
        ``view`` (chunks may be views of the mappings, as for ``read``) the
        common case is one C call: the start in a mapped segment without
        deleted entries or unchecked CRCs found and walked from its batch
        (``Segment.read_after_mapped``); the rest of a read that goes on
        past it is ``read``'s."""
        stop = self._hw
        # The lowest ID wanted (``_id_after``, inline: every XREAD).
        above = (ms, seq + 1) if seq < records.U64_MAX else _id_after(ms, seq)
        if view and above is not None and (max_count is None or max_count > 0):
            seg = self._segment_for_id(above)
            if seg is not None and not self.markers.get(seg.base_offset):
                chunks: list = []
                found = seg.read_after_mapped(above, self.log_start_offset, stop,
                                              -1 if max_count is None else max_count, chunks)
                if found is not None:
                    end, count, done = found
                    if done or end >= stop:
                        return ReadResult(count, chunks, end)
                    rest = self.read(end, max_count=None if max_count is None else max_count - count, view=True)
                    chunks += rest.chunks
                    return ReadResult(count + rest.count, chunks, rest.next_offset)
        start = max(self.find_offset(ms, seq, inclusive=False), self.log_start_offset)
        if start >= self.log_end_offset:
            return ReadResult(0, [], start)
        return self.read(start, max_count=max_count, view=view)

    def find_offset(self, ms: int, seq: int, inclusive: bool = True) -> int:
        """First offset whose ID is >= (ms, seq) (``>`` if not inclusive);
        ``log_end_offset`` when none. Deleted entries are not skipped (reads do that)."""
        if not inclusive:
            after = _id_after(ms, seq)
            if after is None:
                return self.log_end_offset
            ms, seq = after
        end = self.log_end_offset
        seg = self._segment_for_id((ms, seq))
        if seg is None:
            return end
        first = seg.first_id()
        result = seg.find_id(ms, seq) if first <= (ms, seq) else seg.base_offset
        return min(max(result, self.log_start_offset), end)

    def _segment_for_id(self, target: tuple[int, int]) -> Segment | None:
        """The segment where IDs ``>= target`` begin: the last non-empty one
        whose first ID is at or below it, else the first; None when every
        segment is empty."""
        segs = self._segs
        hi = len(segs) if segs[-1].size else len(segs) - 1
        if not hi:
            return None
        lo = 0
        while lo < hi:  # bisect_right on the segments' first IDs (XREAD's every read: no key function)
            mid = (lo + hi) // 2
            if target < segs[mid].first_id():
                hi = mid
            else:
                lo = mid + 1
        return segs[lo - 1 if lo else 0]

    def entry_id(self, offset: int) -> tuple[int, int]:
        if not self.log_start_offset <= offset < self.log_end_offset:
            raise OffsetOutOfRangeError(f"no entry at offset {offset}")
        return self._segs[self._segment_for(offset)].entry_id(offset)

    def entry_at(self, offset: int) -> bytes | None:
        if not self.log_start_offset <= offset < self.log_end_offset or self.is_deleted(offset):
            return None
        return self._segs[self._segment_for(offset)].entry_at(offset)

    # -- durability ----------------------------------------------------------

    def _take_offline(self, failure: StorageError) -> None:
        """A sync failed (any thread): no later write or flush may succeed."""
        if self.sync_failure is None:
            self.sync_failure = failure
            PartitionLog.taken_offline += 1
            self.logger.error("%s: offline for writes after a failed fsync (%s); its "
                              "entries after offset %d may not be on disk: reopen (restart) to recover",
                              self.directory, failure.message, self.recovery_point)

    def _refuse(self, what: str) -> None:
        code = self.sync_failure.errno
        raise StorageError(f"{what} {self.directory} refused: offline since an fsync failed "
                           f"({errno.errorcode.get(code, 'EIO') if code else 'EIO'})", code)

    def begin_flush(self) -> FlushTicket:
        """Main thread: write pending index entries and pin (in the
        ``FileCache``) the descriptors of everything not yet fsynced: from
        the recovery point on, as many segments as an eighth of the cache's
        descriptors allow (at least one; ``ticket.partial`` when some are
        left for the next flush). Raises ``StorageError`` once a sync has
        failed (the log is offline for writes), or if a file cannot be
        opened (nothing stays pinned then)."""
        assert not self._closed
        if self.sync_failure is not None:
            self._refuse("fsync")
        cache = self.cache
        fds_max = max(_TICKET_FDS_MIN, cache.max_open_files // _TICKET_CACHE_SHARE)
        first = self._segment_for(self.recovery_point)
        # A segment pins at most 3 (its log and 2 index files), the directory 1.
        last = min(len(self._segs), first + max(1, (fds_max - 1) // 3))
        partial = last < len(self._segs)
        target = self._segs[last - 1].end_offset if partial else self.log_end_offset
        checkpoint = None
        now = self._clock_ms()
        if target != self._persisted_rp and (
                now - self._rp_checkpoint_ms >= RECOVERY_CHECKPOINT_INTERVAL_MS
                or self._segment_for(target) != self._segment_for(self._persisted_rp)):
            checkpoint = encode_rows([(target,)])
        fds: list[int] = []
        active = self._segs[-1]
        try:
            index_seen = []
            for seg in self._segs[first:last]:
                # The active segment's index is written with the recovery
                # point checkpoint (once a second at most), not every round:
                # an index that stops short of the end is still a valid sparse
                # index, and recovery scans past the checkpoint anyway. So an
                # fsync=always round is one fsync of the log, not two.
                if seg is not active:
                    seg.persist_index()
                elif checkpoint is not None:
                    try:
                        seg.persist_index()
                    except StorageError:
                        # Derived data, needed on disk only with the
                        # checkpoint: skip that (retried in a second)
                        # rather than fail the fsync of the log itself (a
                        # full disk while appends still land in zeros
                        # written ahead of the end).
                        checkpoint = None
                        self._rp_checkpoint_ms = now
                with_index = seg.index.write_seq != seg.index.synced_seq
                if with_index or seg.end_offset > self.recovery_point:
                    fds.append(cache.pin(seg.log_path))
                if with_index:
                    fds.append(cache.pin(seg.index.offset_path, create=True))
                    fds.append(cache.pin(seg.index.id_path, create=True))
                    index_seen.append((seg.index, seg.index.write_seq))
            # Deletion markers (of any segment, old ones too) as the rest of
            # the share allows.
            markers_seen = {}
            for base, seq in self._markers_dirty.items():
                if len(fds) >= fds_max - 1:
                    partial = True
                    break
                path = self.markers.file_of(base)
                if path is not None:
                    fds.append(cache.pin(path, create=True))
                markers_seen[base] = seq
            dir_seq = self._dir_seq
            dir_fd = -1
            if dir_seq != self._dir_synced_seq:
                dir_fd = cache.pin(str(self.directory), directory=True)
                fds.append(dir_fd)
        except BaseException:
            for fd in fds:
                cache.unpin(fd)
            raise
        if checkpoint is not None:
            self._rp_checkpoint_ms = now
        return FlushTicket(self, fds, target, self._generation, checkpoint, markers_seen, dir_seq,
                           dir_fd=dir_fd, index_seen=index_seen, partial=partial)

    def end_flush(self, ticket: FlushTicket) -> None:
        """Main thread, after every ticket (run, failed or never run): unpin
        its descriptors; after a successful ``run()``, advance the recovery
        point."""
        ticket.release()
        if not ticket.ok:
            return
        if ticket.generation == self._generation:
            self.recovery_point = max(self.recovery_point, min(ticket.target_offset, self.log_end_offset))
            for base, seq in ticket._markers_seen.items():
                if self._markers_dirty.get(base) == seq:
                    del self._markers_dirty[base]
            self._dir_synced_seq = max(self._dir_synced_seq, ticket._dir_seq)
            for index, seq in ticket._index_seen:
                index.synced_seq = max(index.synced_seq, seq)

    def flush(self) -> None:
        """fsync everything appended so far; advance ``recovery_point``."""
        while True:
            ticket = self.begin_flush()
            try:
                ticket.run()
            finally:
                self.end_flush(ticket)
            if not ticket.partial:
                return

    def close(self) -> None:
        """Flush, write recovery point = log end offset, close descriptors.
        A log offline after a failed sync is closed without either (its
        failure was raised and logged when it happened)."""
        if self._closed:
            return
        if self.sync_failure is not None:
            self.abandon()
            if self._own_cache:
                self.cache.close_all()
            return
        self.flush()
        try:
            self.producers.on_close(self.log_end_offset)
        except StorageError as exc:
            self.logger.warning("%s: producer snapshot not written at close (%s); "
                                "the next open replays from an older one", self.directory, exc)
        try:
            # The active index goes with a checkpoint, and this one (below)
            # is written whether or not the flush wrote it.
            self._segs[-1].persist_index()
            self._segs[-1].trim()  # a clean restart finds the file ending with its last batch
        except StorageError as exc:
            self.logger.warning("%s: %s (the next open recovers without it)", self.directory, exc)
        with self._rp_lock:
            if self._persisted_rp != self.recovery_point:
                try:
                    write_atomic(self.directory / RECOVERY_POINT_FILE, encode_rows([(self.recovery_point,)]))
                    self._persisted_rp = self.recovery_point
                except StorageError as exc:
                    # Everything is fsynced (above); without the checkpoint
                    # the next open scans from the older one (a full disk).
                    self.logger.warning("%s: recovery point not written at close (%s); "
                                        "the next open scans a longer tail", self.directory, exc)
            self._closed = True
        for seg in self._segs:
            seg.unmap()
        self.cache.close_under(str(self.directory))
        if self._own_cache:
            self.cache.close_all()

    def abandon(self) -> None:
        """Drop descriptors without flushing (tests simulate a crash with this)."""
        with self._rp_lock:  # a flush worker must not write a checkpoint after this
            self._closed = True
        for seg in self._segs:
            seg.unmap()
        self.cache.close_under(str(self.directory))

    def delete(self) -> None:
        """Close without flushing and remove the directory's files (topic deleted)."""
        import shutil
        self.abandon()
        try:
            shutil.rmtree(self.directory)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise_storage_error(f"delete {self.directory}", exc)

