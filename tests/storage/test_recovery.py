"""Crash recovery: torn and corrupt tails, lost indexes, bounded start-up work."""

import logging
import os
import random
import shutil

import pytest

from storage.errors import StorageError
from storage.files import RECOVERY_POINT_FILE
from storage.records import HEADER_BYTES
from storage.log import LogConfig, PartitionLog
from tests.storage.helpers import entries, read_all

CFG = LogConfig(segment_bytes=4096, index_interval_bytes=256)


def build(path, batches=12, flush_before_last=True):
    """A log whose last batch is past the recovery point; returns
    (model before the last batch, model with it, position of the last batch)."""
    log = PartitionLog.open(path, CFG)
    ms = 1
    for i in range(batches - 1):
        log.append(entries(ms, 1 + i % 3, b"p%d" % i))
        ms += 1 + i % 3
    if flush_before_last:
        log.flush()
    before = read_all(log)
    seg = log._segs[-1]
    last_pos = seg.size
    log.append(entries(ms, 4, b"last"))
    after = read_all(log)
    log.abandon()  # kill -9: no flush, no clean checkpoint
    return before, after, last_pos, seg.log_path


def recovery_lines(caplog):
    return [r for r in caplog.records if r.name == "partita.storage" and "recovery cut" in r.getMessage()]


def test_unclean_shutdown_with_intact_tail_loses_nothing(tmp_path, caplog):
    before, after, _, _ = build(tmp_path / "p")
    log = PartitionLog.open(tmp_path / "p", CFG)
    assert read_all(log) == after
    assert recovery_lines(caplog) == []


def test_cut_at_every_byte_of_the_last_batch(tmp_path, caplog):
    src = tmp_path / "src"
    before, after, last_pos, log_path = build(src)
    full = os.path.getsize(log_path)
    rel = os.path.relpath(log_path, src)
    for cut in range(last_pos, full):
        caplog.clear()
        d = tmp_path / f"c{cut}"
        shutil.copytree(src, d)
        os.truncate(d / rel, cut)
        log = PartitionLog.open(d, CFG)
        assert read_all(log) == before, cut
        assert log.log_end_offset == before[-1][0] + 1
        lines = recovery_lines(caplog)
        if cut == last_pos:
            assert lines == []
        else:
            assert len(lines) == 1, cut
            assert "torn" in lines[0].getMessage()
        # the log keeps working after recovery
        log.append(entries(10**6, 1))
        log.close()
        log = PartitionLog.open(d, CFG)
        assert log.log_end_offset == before[-1][0] + 2
        log.close()
        shutil.rmtree(d)


def test_random_bit_flips_in_the_tail(tmp_path, caplog):
    src = tmp_path / "src"
    before, after, last_pos, log_path = build(src)
    full = os.path.getsize(log_path)
    rel = os.path.relpath(log_path, src)
    rnd = random.Random(1234)
    for trial in range(60):
        caplog.clear()
        d = tmp_path / f"f{trial}"
        shutil.copytree(src, d)
        bit = rnd.randrange((full - last_pos) * 8)
        with open(d / rel, "r+b") as f:
            f.seek(last_pos + bit // 8)
            b = f.read(1)[0]
            f.seek(last_pos + bit // 8)
            f.write(bytes([b ^ (1 << (bit % 8))]))
        log = PartitionLog.open(d, CFG)
        assert read_all(log) == before, bit
        lines = recovery_lines(caplog)
        assert len(lines) == 1
        log.close()
        shutil.rmtree(d)


def test_corruption_in_an_unflushed_middle_segment_cuts_later_segments(tmp_path, caplog):
    d = tmp_path / "p"
    log = PartitionLog.open(d, CFG)
    ms = 1
    for i in range(100):
        log.append(entries(ms, 2, b"x" * 40))
        ms += 2
    assert log.segment_count >= 4
    segs = [s.log_path for s in log._segs]
    second = log._segs[1]
    keep = read_all(log)
    keep = [e for e in keep if e[0] < second.base_offset + 2]  # first batch of segment 1 survives
    # corrupt the second batch of segment 1; nothing was flushed (recovery point 0)
    h = second.header_at(0)
    log.abandon()
    with open(segs[1], "r+b") as f:
        f.seek(h[1] + 100)
        f.write(b"\xde\xad")
    log = PartitionLog.open(d, CFG)
    assert read_all(log) == keep
    assert log.segment_count == 2
    assert not os.path.exists(segs[2])
    (line,) = recovery_lines(caplog)
    msg = line.getMessage()
    assert "CRC mismatch" in msg and f"offset {second.base_offset + 2}" in msg and "later segment" in msg


def test_missing_and_corrupt_indexes_are_rebuilt(tmp_path):
    d = tmp_path / "p"
    log = PartitionLog.open(d, CFG)
    ms = 1
    for i in range(200):
        log.append(entries(ms, 3, b"y" * 10))
        ms += 3
    want = read_all(log)
    ids = [log.entry_id(o) for o in range(0, 600, 7)]
    log.close()
    names = sorted(os.listdir(d))
    for n in names:
        if n.endswith(".index") and n < names[-1]:
            os.unlink(d / n)
            break
    idx = [n for n in names if n.endswith(".idindex")]
    with open(d / idx[2], "r+b") as f:
        f.write(os.urandom(50))
    with open(d / idx[3], "ab") as f:
        f.write(b"junk")
    log = PartitionLog.open(d, CFG)
    assert read_all(log) == want
    for i, o in enumerate(range(0, 600, 7)):
        assert log.find_offset(*ids[i]) == o
    log.close()


def count_io(monkeypatch):
    stats = {"bytes": 0, "opens": 0}
    real_pread, real_open = os.pread, os.open

    def pread(fd, n, pos):
        data = real_pread(fd, n, pos)
        stats["bytes"] += len(data)
        return data

    def open_(path, *a, **kw):
        stats["opens"] += 1
        return real_open(path, *a, **kw)

    monkeypatch.setattr(os, "pread", pread)
    monkeypatch.setattr(os, "open", open_)
    return stats


def test_recovery_reads_only_the_tail(tmp_path, monkeypatch):
    d = tmp_path / "p"
    cfg = LogConfig(segment_bytes=64 * 1024, index_interval_bytes=4096)
    log = PartitionLog.open(d, cfg)
    ms = 1
    for i in range(2000):
        log.append(entries(ms, 10, b"z" * 100))
        ms += 10
    log.flush()
    log.append(entries(ms, 10, b"tail"))
    total = log.size_bytes
    nseg = log.segment_count
    assert nseg > 50
    log.abandon()
    stats = count_io(monkeypatch)
    log = PartitionLog.open(d, cfg)
    assert log.log_end_offset == 20010
    assert stats["bytes"] < 2 * 65536, (stats, total)
    assert stats["opens"] < 20, stats
    log.close()
    # clean shutdown: reopening scans nothing past the last index entry
    stats["bytes"] = stats["opens"] = 0
    log = PartitionLog.open(d, cfg)
    assert stats["bytes"] < 3 * 4096 + 65536
    log.close()


def test_lost_recovery_checkpoint_means_full_scan_not_data_loss(tmp_path, caplog):
    d = tmp_path / "p"
    log = PartitionLog.open(d, CFG)
    for i in range(50):
        log.append(entries(1 + 5 * i, 5))
    want = read_all(log)
    log.close()
    (d / RECOVERY_POINT_FILE).write_bytes(b"garbage")
    log = PartitionLog.open(d, CFG)
    assert read_all(log) == want
    assert recovery_lines(caplog) == []


# -- preallocation (zeros written ahead of the active segment's end) ----------

PRE = LogConfig(segment_bytes=1 << 20, index_interval_bytes=4096, preallocate_bytes=64 * 1024)


def _fill(log, batches, ms=1):
    for i in range(batches):
        log.append(entries(ms, 10, b"z" * 100))
        ms += 10
    return ms


def _zero_tail(seg):
    with open(seg.log_path, "rb") as f:
        f.seek(seg.size)
        return f.read()


def test_zeros_written_ahead_are_dropped_silently_after_a_crash(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="partita.storage")
    d = tmp_path / "p"
    log = PartitionLog.open(d, PRE)
    _fill(log, 30)
    log.flush()
    _fill(log, 5, ms=10_000)
    seg = log._segs[-1]
    tail = _zero_tail(seg)
    assert 0 < len(tail) <= 64 * 1024 and tail.count(0) == len(tail)
    want = read_all(log)
    log.abandon()
    log = PartitionLog.open(d, PRE)
    assert read_all(log) == want
    assert recovery_lines(caplog) == []  # nothing was lost: no "recovery cut" warning
    assert any("preallocated zeros" in r.getMessage() for r in caplog.records)
    assert os.path.getsize(log._segs[-1].log_path) == log._segs[-1].size
    log.append(entries(20_000, 1))  # and it writes ahead again
    assert _zero_tail(log._segs[-1]).count(0) >= 64 * 1024
    log.close()


def test_a_clean_close_and_a_roll_leave_no_zeros(tmp_path):
    d = tmp_path / "p"
    log = PartitionLog.open(d, PRE)
    _fill(log, 30)
    log.roll()
    sealed = log._segs[0]
    assert os.path.getsize(sealed.log_path) == sealed.size
    _fill(log, 3, ms=10_000)
    assert os.path.getsize(log._segs[-1].log_path) > log._segs[-1].size
    log.close()
    for info in PartitionLog.open(d, PRE).segments():
        assert os.path.getsize(info.path) == info.size_bytes


def test_recovery_finds_the_recovery_point_in_front_of_the_zeros(tmp_path, monkeypatch):
    """Everything flushed, then kill -9: the recovery point is the last
    batch's end, where the zeros start. Recovery scans from there, not from
    the start of the 1 MiB segment."""
    d = tmp_path / "p"
    log = PartitionLog.open(d, PRE)
    _fill(log, 600)
    log.flush()
    assert log._segs[-1].size > 700 * 1024 and log.segment_count == 1
    want = read_all(log)
    log.abandon()
    stats = count_io(monkeypatch)
    log = PartitionLog.open(d, PRE)
    assert stats["bytes"] < 200 * 1024, stats
    assert read_all(log) == want


def test_a_torn_write_into_zeros_is_cut_with_a_warning(tmp_path, caplog):
    """The last batch only half on disk (its second half still the zeros
    written ahead): a CRC mismatch, not a tail of zeros."""
    before, after, last_pos, log_path = build(tmp_path / "src")
    d = tmp_path / "p"
    log = PartitionLog.open(d, PRE)
    for off, ms, seq, data in before:
        log.append([(ms, seq, data)])
    log.flush()
    seg = log._segs[-1]
    pos = seg.size
    log.append(entries(100_000, 20, b"torn" * 30))
    end = seg.size
    log.abandon()
    with open(seg.log_path, "r+b") as f:
        f.seek(pos + (end - pos) // 2)
        f.write(bytes(end - pos - (end - pos) // 2))
    log = PartitionLog.open(d, PRE)
    assert [e[1:] for e in read_all(log)] == [e[1:] for e in before]
    assert [r.getMessage() for r in recovery_lines(caplog)] and "CRC" in recovery_lines(caplog)[0].getMessage()


def test_no_room_for_zeros_still_appends(tmp_path, monkeypatch):
    from storage import segment

    d = tmp_path / "p"
    log = PartitionLog.open(d, PRE)
    real = os.pwrite

    def full_disk(fd, data, pos):
        if len(data) >= 4096 and bytes(data).count(0) == len(data):  # zero_ahead's chunk
            raise OSError(28, "No space left on device")
        return real(fd, data, pos)

    monkeypatch.setattr(segment.os, "pwrite", full_disk)
    _fill(log, 3)
    seg = log._segs[-1]
    assert seg.file_size == seg.size == os.path.getsize(seg.log_path)
    want = read_all(log)
    log.close()
    assert read_all(PartitionLog.open(d, PRE)) == want


# -- CRCs of trusted data: checked once, from the start of a segment on --------

ONE_SEGMENT = LogConfig(segment_bytes=1 << 20, index_interval_bytes=256)


def _reopened(path, batches=40):
    """A one-segment log of ``batches`` small batches, closed cleanly and
    opened again: all below the recovery point, trusted, not yet checked."""
    log = PartitionLog.open(path, ONE_SEGMENT)
    _fill(log, batches)
    log.close()
    log = PartitionLog.open(path, ONE_SEGMENT)
    assert len(log._segs) == 1
    return log


def _count_crcs(monkeypatch):
    from storage import segment

    calls = []
    real = segment.crc32c

    def counted(data):
        calls.append(len(data))
        return real(data)

    monkeypatch.setattr(segment, "crc32c", counted)
    return calls


def test_a_read_checks_each_trusted_batch_once(tmp_path, monkeypatch):
    """The first read from a segment's start CRC-checks its batches; a read
    of them again serves them without (the C walk), and once every batch
    is checked the segment is as trusted as one written by this process."""
    log = _reopened(tmp_path / "p")
    try:
        seg = log._segs[0]
        assert seg.check_crc and seg.crc_ok_to == 0
        calls = _count_crcs(monkeypatch)
        first = log.read(0, max_count=10, view=True)
        checked = len(calls)
        assert checked >= 1 and seg.crc_ok_to > 0
        again = log.read(0, max_count=10, view=True)
        assert [bytes(c) for c in again.chunks] == [bytes(c) for c in first.chunks]
        assert len(calls) == checked  # nothing checked twice
        whole = log.read(0, view=True)
        assert whole.count == log.log_end_offset
        assert not seg.check_crc and seg.crc_ok_to == seg.size
        n = len(calls)
        log.read(0, view=True)
        log.read_after_id(0, 0, None, view=True)
        assert len(calls) == n
    finally:
        log.close()


def test_a_read_in_the_middle_checks_without_trusting_what_it_skipped(tmp_path, monkeypatch):
    """Batches checked after a gap do not extend the checked prefix: a later
    read of them checks them again, and a batch damaged in the gap is still
    refused."""
    log = _reopened(tmp_path / "p")
    try:
        seg = log._segs[0]
        calls = _count_crcs(monkeypatch)
        mid = log.log_end_offset // 2
        log.read(mid, max_count=5, view=True)
        assert calls and seg.crc_ok_to == 0
        n = len(calls)
        log.read(mid, max_count=5, view=True)
        assert len(calls) > n  # checked again: not part of the checked prefix
        # Damage a batch in the first half on disk, then read from the start.
        pos, _ = seg.locate(100)  # the 11th batch of 10 entries
        with open(seg.log_path, "r+b") as f:
            f.seek(pos + HEADER_BYTES + 1)
            f.write(b"\xff")
        seg.unmap()
        with pytest.raises(StorageError, match="CRC mismatch"):
            log.read(0, view=True)
        assert seg.crc_ok_to == pos  # the prefix stops in front of the damage
        assert log.read(0, max_count=3, view=True).count == 3  # what precedes it is served
    finally:
        log.close()


def test_a_base_offset_out_of_line_after_the_checked_prefix_is_refused(tmp_path):
    """A batch's base offset is outside its CRC (followers re-base copied
    batches): continuity is what catches it, also right after the checked
    prefix, where the C walk hands over to the checking loop."""
    log = _reopened(tmp_path / "p")
    try:
        seg = log._segs[0]
        assert log.read(0, max_count=50, view=True).count == 50  # checks the first 5 batches
        pos = seg.crc_ok_to
        with open(seg.log_path, "r+b") as f:
            f.seek(pos)
            f.write((seg.crc_ok_offset + 1).to_bytes(8, "little"))
        seg.unmap()
        # A read that ends with that batch: nothing after it would show the gap.
        with pytest.raises(StorageError, match=r"base offset 51 where 50 was expected"):
            log.read(0, max_count=60, view=True)
    finally:
        log.close()


def test_recovery_checked_data_is_not_checked_again(tmp_path, monkeypatch):
    """After kill -9 recovery CRC-checks every batch from the recovery point
    on; reads check only those below it."""
    before, after, last_pos, _ = build(tmp_path / "p")
    log = PartitionLog.open(tmp_path / "p", CFG)
    try:
        seg = log._segs[-1]
        assert seg.crc_check_end == last_pos  # the last batch was checked by recovery
        calls = _count_crcs(monkeypatch)
        assert read_all(log) == after
        assert not seg.check_crc and len(calls) < len(after)
    finally:
        log.close()
