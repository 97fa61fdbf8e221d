"""Deletion markers, log start, truncation, retention, leader epochs, disk errors."""

import errno
import os

import pytest

from storage.checkpoint import read_rows
from storage.errors import StorageError, add_disk_error_listener
from storage.log import LogConfig, PartitionLog
from tests.storage.helpers import entries, read_all

CFG = LogConfig(segment_bytes=2048, index_interval_bytes=256)


def make(path, config=CFG, **kw):
    return PartitionLog.open(path, config, **kw)


def fill(log, batches, per=3, payload=b"d" * 20, epoch=0):
    ms = log.last_id[0] + 1
    for _ in range(batches):
        log.append(entries(ms, per, payload), leader_epoch=epoch)
        ms += per


# -- deletion markers ---------------------------------------------------------

def test_deleted_entries_are_skipped_and_survive_restart(tmp_path):
    log = make(tmp_path / "p")
    fill(log, 20)
    assert log.delete_entries([5, 6, 7, 30, 59, 59, 1000]) == 5
    assert log.delete_entries([5]) == 0
    assert log.live_count == 55
    r = log.read(0, with_ids=True)
    assert r.count == 55 and [e[0] for e in r.entries] == [o for o in range(60) if o not in (5, 6, 7, 30, 59)]
    # a run is split only where a deleted entry sits
    r = log.read(3, end_offset=10)
    assert r.count == 4 and len(r.chunks) == 3  # [3,4] [8] [9] (batches 3..5, 6..8, 9..11)
    r = log.read(0, max_count=6, with_ids=True)
    assert [e[0] for e in r.entries] == [0, 1, 2, 3, 4, 8] and r.next_offset == 9
    assert log.entry_at(6) is None
    rr = log.read_reverse(0, 10, with_ids=True)
    assert [e[0] for e in rr.entries] == [9, 8, 4, 3, 2, 1, 0]
    log.flush()
    log.delete_entries([40])  # not flushed: still written to the markers file
    log.close()
    log = make(tmp_path / "p")
    assert log.live_count == 54
    assert log.is_deleted(40) and log.is_deleted(5) and not log.is_deleted(4)
    assert log.last_id == (60, 0)  # markers do not change last_id


def test_markers_dropped_on_truncate_so_offsets_are_reborn_live(tmp_path):
    log = make(tmp_path / "p")
    fill(log, 10)
    log.delete_entries([25, 26, 3])
    log.truncate_to(20)
    assert log.live_count == 19
    fill(log, 3)
    assert not log.is_deleted(25)
    log.close()
    log = make(tmp_path / "p")
    assert not log.is_deleted(25) and log.is_deleted(3)
    assert log.live_count == 28


# -- log start ------------------------------------------------------------------

def test_advance_log_start_offset(tmp_path):
    log = make(tmp_path / "p")
    fill(log, 60)
    nseg = log.segment_count
    log.delete_entries([1, 100])
    base = log.segment_base_at_or_below(100)
    assert 0 < base <= 100
    log.advance_log_start_offset(100)
    assert log.log_start_offset == 100
    assert log.live_count == 180 - 100 - 1
    assert log._segs[0].base_offset == base
    assert log.segment_count < nseg
    with pytest.raises(Exception):
        log.read(99)
    assert log.read(100).count == 79
    assert log.find_offset(0, 0) == 100
    log.close()
    log = make(tmp_path / "p")
    assert log.log_start_offset == 100 and log.live_count == 79
    # trim everything: the active segment stays, last_id survives
    log.advance_log_start_offset(log.log_end_offset)
    assert log.live_count == 0 and log.read(180).count == 0
    log.roll()
    log.advance_log_start_offset(180)
    log.close()
    log = make(tmp_path / "p")
    assert log.last_id == (180, 0) and log.log_start_offset == 180 == log.log_end_offset


def test_advance_beyond_high_watermark_is_refused(tmp_path):
    log = make(tmp_path / "p", hw_follows_end=False)
    fill(log, 3)
    log.set_high_watermark(4)
    assert log.read(0).count == 4
    with pytest.raises(Exception):
        log.advance_log_start_offset(5)


# -- truncate -----------------------------------------------------------------

def test_truncate_inside_a_batch(tmp_path):
    log = make(tmp_path / "p")
    fill(log, 30)
    want = read_all(log)[:44]
    log.truncate_to(44)  # 44 = batch 14 (42..44) + 2
    assert log.log_end_offset == 44 and log.last_id == (44, 0)
    assert read_all(log) == want
    log.close()
    log = make(tmp_path / "p")
    assert read_all(log) == want
    log.truncate_to(0)
    assert log.log_end_offset == 0 and log.read(0).count == 0
    log.append(entries(1, 1))
    log.close()


# -- retention ----------------------------------------------------------------

def test_retention_by_time_and_bytes(tmp_path):
    now = [1_000_000]
    cfg = LogConfig(segment_bytes=2048, index_interval_bytes=256, retention_ms=10_000)
    log = make(tmp_path / "p", cfg, clock_ms=lambda: now[0])
    for i in range(40):
        fill(log, 1)
        now[0] += 1000
    segs = log.segments()
    assert len(segs) >= 4
    removed = log.apply_retention(now[0])
    assert removed >= 1
    assert log.log_start_offset == log.segments()[0].base_offset
    assert log.segment_count == len(segs) - removed
    # every remaining sealed segment is younger than retention
    assert log.apply_retention(now[0]) == 0
    sealed = log.segment_count - 1
    assert log.apply_retention(now[0] + 10**9) == sealed
    assert log.segment_count == 1  # only the active segment is left
    cfg = LogConfig(segment_bytes=2048, index_interval_bytes=256, retention_bytes=5000)
    log2 = make(tmp_path / "q", cfg)
    fill(log2, 200)
    log2.apply_retention(0)
    assert log2.size_bytes - log2._segs[0].size < 5000 <= log2.size_bytes or log2.segment_count == 1


def test_retention_never_passes_high_watermark(tmp_path):
    cfg = LogConfig(segment_bytes=2048, index_interval_bytes=256, retention_ms=0)
    log = make(tmp_path / "p", cfg, hw_follows_end=False)
    fill(log, 100)
    log.set_high_watermark(0)
    assert log.apply_retention(10**15) == 0
    log.set_high_watermark(log._segs[2].base_offset)
    assert log.apply_retention(10**15) == 2


# -- epochs ---------------------------------------------------------------------

def test_leader_epochs(tmp_path):
    log = make(tmp_path / "p")
    assert log.latest_epoch == -1
    fill(log, 3, epoch=1)   # 0..8
    fill(log, 2, epoch=3)   # 9..14
    fill(log, 2, epoch=3)   # 15..20
    fill(log, 1, epoch=5)   # 21..23
    assert log.epochs() == [(1, 0), (3, 9), (5, 21)]
    assert log.end_offset_for_epoch(0) == (-1, -1)
    assert log.end_offset_for_epoch(1) == (1, 9)
    assert log.end_offset_for_epoch(2) == (1, 9)
    assert log.end_offset_for_epoch(3) == (3, 21)
    assert log.end_offset_for_epoch(4) == (3, 21)
    assert log.end_offset_for_epoch(5) == (5, 24)
    assert log.end_offset_for_epoch(9) == (5, 24)
    log.truncate_to(12)
    assert log.epochs() == [(1, 0), (3, 9)]
    log.close()
    log = make(tmp_path / "p")
    assert log.epochs() == [(1, 0), (3, 9)] and log.latest_epoch == 3
    log.advance_log_start_offset(10)
    assert log.epochs() == [(3, 10)]


def test_append_raw_copies_batches(tmp_path):
    leader = make(tmp_path / "l")
    fill(leader, 10, epoch=2)
    follower = make(tmp_path / "f")
    raw = b"".join(seg.pread(0, seg.size) for seg in leader._segs)
    assert follower.append_raw(raw) == 0
    assert read_all(follower) == read_all(leader)
    assert follower.epochs() == [(2, 0)]
    bad = bytearray(raw)
    bad[-1] ^= 1
    f2 = make(tmp_path / "f2")
    with pytest.raises(ValueError):
        f2.append_raw(bytes(bad))
    assert f2.log_end_offset == 0
    with pytest.raises(ValueError):
        follower.append_raw(raw)  # base offsets do not match the end offset


# -- disk errors ----------------------------------------------------------------

def test_enospc_on_append_leaves_log_consistent(tmp_path, monkeypatch):
    log = make(tmp_path / "p")
    fill(log, 10)
    log.flush()
    want = read_all(log)
    seen = []
    add_disk_error_listener(lambda what, exc: seen.append(exc.errno))
    real_pwritev, real_pwrite = os.pwritev, os.pwrite

    def short_then_fail(fd, bufs, pos):
        # a partial write lands on disk, then the disk is full
        real_pwrite(fd, bytes(bufs[0])[:10], pos)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwritev", short_then_fail)
    with pytest.raises(StorageError) as info:
        log.append(entries(1000, 5))
    assert "ENOSPC" in str(info.value) and info.value.errno == errno.ENOSPC
    assert seen == [errno.ENOSPC]
    assert read_all(log) == want
    assert log.log_end_offset == 30
    monkeypatch.setattr(os, "pwritev", real_pwritev)
    log.append(entries(1000, 5))
    assert log.log_end_offset == 35
    log.abandon()
    log = make(tmp_path / "p")
    assert read_all(log)[:30] == want and log.log_end_offset == 35


def test_eio_on_fsync_takes_the_log_offline_for_writes_until_it_is_reopened(tmp_path, monkeypatch, caplog):
    """After a failed fsync the kernel may have dropped the pages it could
    not write, and it reports that to one fsync only: a later fsync that
    succeeds proves nothing. So the log refuses every later write and flush
    (the failure's errno), keeps serving reads, closes without moving its
    recovery point, and the next open scans everything after it."""
    log = make(tmp_path / "p")
    fill(log, 3)
    want = read_all(log)

    def eio(fd):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", eio)
    monkeypatch.setattr(os, "fdatasync", eio)  # log files are fdatasync'ed (appends)
    with pytest.raises(StorageError, match="EIO"):
        log.flush()
    assert log.recovery_point == 0
    monkeypatch.undo()  # the disk answers again: still offline
    for refused in (log.flush, lambda: log.append(entries(1000, 1)),
                    lambda: log.delete_entries([0]), lambda: log.begin_flush()):
        with pytest.raises(StorageError, match="offline since an fsync failed \\(EIO\\)") as info:
            refused()
        assert info.value.errno == errno.EIO
    assert log.recovery_point == 0 and log.log_end_offset == 9
    assert read_all(log) == want and not log.is_deleted(0)
    assert any("offline for writes after a failed fsync" in r.getMessage() for r in caplog.records)
    log.close()  # no flush, no error
    assert log.closed
    assert read_rows(tmp_path / "p" / "recovery-point.checkpoint", 1) in (None, [(0,)])
    log = make(tmp_path / "p")
    assert read_all(log) == want  # scanned from the recovery point, CRC-checked
    log.append(entries(1000, 1))
    log.flush()
    assert log.recovery_point == 10
    log.close()


def test_a_failed_sync_reported_to_a_ticket_takes_the_log_offline(tmp_path):
    """The group commit's C thread syncs a ticket's descriptors itself and
    reports the failure to ``finish``: the same as a failed ``run``."""
    log = make(tmp_path / "p")
    fill(log, 2)
    ticket = log.begin_flush()
    with pytest.raises(StorageError, match="EIO"):
        ticket.finish(OSError(errno.EIO, "Input/output error"))
    log.end_flush(ticket)
    assert log.recovery_point == 0
    with pytest.raises(StorageError, match="offline"):
        log.append(entries(1000, 1))
    with pytest.raises(StorageError, match="offline"):
        log.begin_flush()
    log.close()


def test_an_index_that_cannot_be_written_skips_the_checkpoint_not_the_fsync(tmp_path, monkeypatch):
    """A full disk while appends still land in zeros written ahead: the
    active index (written only with the recovery-point checkpoint) fails,
    the log's own fsync still counts; the checkpoint waits for a later flush."""
    from storage import index

    cfg = LogConfig(segment_bytes=1 << 20, index_interval_bytes=64, preallocate_bytes=4096)
    log = PartitionLog.open(tmp_path / "p", cfg)
    fill(log, 3)
    log.flush()
    rp_file = tmp_path / "p" / "recovery-point.checkpoint"
    written = rp_file.read_bytes()
    fill(log, 3)
    real = os.pwrite

    def no_space(fd, data, pos):
        if os.readlink(f"/proc/self/fd/{fd}").endswith(("index", "idindex")):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data, pos)

    monkeypatch.setattr(index.os, "pwrite", no_space)
    log._rp_checkpoint_ms = 0  # a checkpoint is due
    log.flush()
    assert log.recovery_point == log.log_end_offset == 18
    assert rp_file.read_bytes() == written
    want = read_all(log)
    monkeypatch.undo()
    log.abandon()
    assert read_all(PartitionLog.open(tmp_path / "p", cfg)) == want


def test_a_recovery_point_that_cannot_be_written_at_close_is_not_fatal(tmp_path, monkeypatch, caplog):
    """A full disk at shutdown: the data is fsynced, only the checkpoint is
    missing, so close() warns and closes; the next open scans the tail."""
    from storage import log as log_module
    from storage.log_manager import LogManager

    lm = LogManager(tmp_path, default_config=CFG)
    a, b = lm.partition(b"t", 0), lm.partition(b"t", 1)
    fill(a, 3)
    fill(b, 2)
    want = (read_all(a), read_all(b))

    def no_space(path, data, **kw):
        raise StorageError(f"write {path} failed: ENOSPC (No space left on device)", errno.ENOSPC)

    monkeypatch.setattr(log_module, "write_atomic", no_space)
    lm.close()  # both logs closed, no error
    assert a.closed and b.closed
    assert any("recovery point not written at close" in r.getMessage() for r in caplog.records)
    monkeypatch.undo()
    lm = LogManager(tmp_path, default_config=CFG)
    assert (read_all(lm.partition(b"t", 0)), read_all(lm.partition(b"t", 1))) == want
    lm.close()


def test_a_log_that_fails_to_close_does_not_keep_the_others_open(tmp_path, monkeypatch):
    from storage.log_manager import LogManager

    lm = LogManager(tmp_path, default_config=CFG)
    a, b = lm.partition(b"t", 0), lm.partition(b"t", 1)
    fill(a, 2)
    fill(b, 2)

    def eio(fd):
        raise OSError(errno.EIO, "Input/output error")

    real_fdatasync = os.fdatasync
    broken = a._segs[-1].log_path

    def fdatasync(fd):
        if os.readlink(f"/proc/self/fd/{fd}") == broken:
            eio(fd)
        return real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    with pytest.raises(StorageError, match="EIO"):
        lm.close()
    assert b.closed and b.recovery_point == b.log_end_offset


def _eio_syncing(monkeypatch, fragment: str) -> None:
    """fsync/fdatasync of a file (or directory) whose path contains
    ``fragment`` fails with EIO, as a failing disk's writeback does."""
    for name in ("fsync", "fdatasync"):
        real = getattr(os, name)

        def sync(fd, real=real):
            if fragment in os.readlink(f"/proc/self/fd/{fd}"):
                raise OSError(errno.EIO, "Input/output error")
            real(fd)

        monkeypatch.setattr(os, name, sync)


def _idempotent(index: int = 0):
    from storage.producers import idmp_producer, idmp_token
    from storage.records import KIND_IDEMPOTENT_ID, ProducerRecord

    return [ProducerRecord(KIND_IDEMPOTENT_ID, 0, index, 1, idmp_producer(b"p"), idmp_token(b"i"))]


@pytest.mark.parametrize("fragment, write", [
    # A new leader's first append checkpoints its epoch first.
    ("leader-epoch.checkpoint", lambda log: log.append(entries(1000, 1), leader_epoch=1)),
    # The first idempotent append writes the snapshot that marks the log as
    # holding producer records (without it a restart forgets them: duplicates).
    (".producers", lambda log: log.append(entries(1000, 1), producers=_idempotent())),
    # A trim checkpoints the new log start before dropping anything.
    ("log-start-offset.checkpoint", lambda log: log.advance_log_start_offset(3)),
    # A follower cut back by epoch.
    ("leader-epoch.checkpoint", lambda log: log.truncate_to(0)),
    # The recovery point only shortens recovery, but a disk that fails its
    # fsync is failing: offline too (not retried, and logged, every second).
    # The flush itself succeeded (the data is synced); the next write is refused.
    ("recovery-point.checkpoint", lambda log: (log.flush(), log.append(entries(1000, 1)))),
])
def test_a_failed_sync_of_a_side_file_takes_the_log_offline_for_writes(tmp_path, monkeypatch, caplog, fragment, write):
    """The log's correctness depends on its side files as on its segments
    (docs/guarantees.md): a failed fsync of one takes the log offline for
    writes as a segment's does, so its leader reports it and the controller
    moves the shard, rather than every later write failing the same way
    while the log stays online."""
    log = make(tmp_path / "p")
    fill(log, 3)
    want = read_all(log)
    _eio_syncing(monkeypatch, fragment)
    with pytest.raises(StorageError, match="EIO"):
        write(log)
    monkeypatch.undo()  # the disk answers again: still offline
    for refused in (lambda: log.append(entries(2000, 1), leader_epoch=2), log.flush,
                    lambda: log.delete_entries([4])):
        with pytest.raises(StorageError, match="offline since an fsync failed \\(EIO\\)"):
            refused()
    assert log.sync_failure is not None and log.sync_failure.errno == errno.EIO
    assert any("offline for writes after a failed fsync" in r.getMessage() for r in caplog.records)
    log.close()
    log = make(tmp_path / "p")
    assert read_all(log)[: len(want)] == want[: len(read_all(log))]
    log.append(entries(3000, 1), leader_epoch=3)
    log.close()
