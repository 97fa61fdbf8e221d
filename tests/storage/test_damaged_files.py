"""Checkpoints and segment files that contradict the log they describe.

Each damaged file is detected at open, logged with a WARNING that names it
and says what was done, and the log is repaired from what its segments hold
(or a read is refused with a clean error): never trusted blindly
(docs/guarantees.md, "Damaged files")."""

import os

import pytest

from storage.checkpoint import write_rows
from storage.errors import CORRUPT, READ_FAILED, WRITE_FAILED, StorageError
from storage.files import LEADER_EPOCH_FILE, LOG_START_FILE, RECOVERY_POINT_FILE
from storage.log import LogConfig, PartitionLog
from tests.storage.helpers import entries, read_all

CFG = LogConfig(segment_bytes=4096, index_interval_bytes=256)


def build(path, n=60):
    """A cleanly closed log of ``n`` entries (one per batch, several segments);
    returns what it serves."""
    log = PartitionLog.open(path, CFG)
    for i in range(n):
        log.append(entries(1 + i, 1, b"x" * 100))
    want = read_all(log)
    log.close()
    return want


def warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "partita.storage" and r.levelname == "WARNING"]


def segment_names(path) -> list[str]:
    return sorted(n for n in os.listdir(path) if n.endswith(".log"))


def test_a_recovery_point_past_the_log_end_is_repaired(tmp_path, caplog):
    d = tmp_path / "p"
    want = build(d)
    names = segment_names(d)
    write_rows(d / RECOVERY_POINT_FILE, [(99_999_999_999,)])
    log = PartitionLog.open(d, CFG)
    assert log.log_end_offset == 60 and log.recovery_point == 60
    assert read_all(log) == want
    (msg,) = warnings(caplog)
    assert "recovery-point.checkpoint (99999999999) is past the log end 60: offsets 60..99999999998" in msg
    assert names[-1] in msg
    log.append(entries(1000, 1))
    assert segment_names(d) == names
    log.close()
    caplog.clear()
    log = PartitionLog.open(d, CFG)
    assert log.log_end_offset == 61 and warnings(caplog) == []
    log.close()


def test_a_recovery_point_inside_the_last_batch_scans_its_segment(tmp_path, caplog):
    d = tmp_path / "p"
    log = PartitionLog.open(d, CFG)
    log.append(entries(1, 5))
    log.close()
    write_rows(d / RECOVERY_POINT_FILE, [(3,)])  # no batch starts or ends there
    log = PartitionLog.open(d, CFG)
    assert log.log_end_offset == 5 and warnings(caplog) == []
    log.close()


def test_a_zeroed_segment_below_the_recovery_point_is_lost_data_not_preallocation(tmp_path, caplog):
    d = tmp_path / "p"
    build(d)
    last = d / segment_names(d)[-1]
    base = int(last.name[:-4])
    last.write_bytes(bytes(last.stat().st_size))
    log = PartitionLog.open(d, CFG)
    assert log.log_end_offset == base
    (msg,) = warnings(caplog)
    assert f"recovery cut the log at offset {base}" in msg and "only zeros where flushed batches were" in msg
    assert f"offsets {base}..59 were below the recovery point 60 (flushed): lost from {last}" in msg
    assert not any("preallocated zeros" in r.getMessage() for r in caplog.records)
    log.close()


def test_a_log_start_past_the_end_of_a_log_that_lost_nothing_is_ignored(tmp_path, caplog):
    d = tmp_path / "p"
    want = build(d)
    names = segment_names(d)
    write_rows(d / LOG_START_FILE, [(99_999_999_999, 0, 0)])
    log = PartitionLog.open(d, CFG)
    assert log.log_start_offset == 0 and read_all(log) == want
    assert segment_names(d) == names  # nothing deleted on the file's word
    (msg,) = warnings(caplog)
    assert "log-start-offset.checkpoint: log start 99999999999 is past the log end 60" in msg and "ignored" in msg
    log.close()
    caplog.clear()
    log = PartitionLog.open(d, CFG)  # rewritten: nothing to say the next time
    assert log.log_start_offset == 0 and warnings(caplog) == []
    log.close()


def test_a_log_start_past_the_end_of_a_log_that_lost_its_tail_is_kept(tmp_path, caplog):
    """Trimmed past the last flush, then the unflushed tail is lost (power
    loss under fsync everysec): every entry left was trimmed."""
    d = tmp_path / "p"
    cfg = LogConfig(segment_bytes=1 << 20)
    log = PartitionLog.open(d, cfg)
    for i in range(30):
        log.append(entries(1 + i, 1, b"x" * 100))
    log.flush()
    flushed = log.log_end_offset
    (seg,) = log.segments()
    for i in range(30, 60):
        log.append(entries(1 + i, 1, b"x" * 100))
    log.advance_log_start_offset(55)
    log.abandon()
    os.truncate(seg.path, seg.size_bytes)  # the power loss: what was not flushed is gone
    log = PartitionLog.open(d, cfg)
    assert log.log_end_offset == flushed and log.log_start_offset == flushed and log.live_count == 0
    assert log.last_id == (flushed, 0)
    assert any("log start 55 is past the log end 30" in m for m in warnings(caplog))
    log.close()


def test_epochs_out_of_range_are_rebuilt_from_the_batches(tmp_path, caplog):
    d = tmp_path / "p"
    log = PartitionLog.open(d, CFG)
    for i, epoch in enumerate([0, 0, 3, 3, 3, 7, 9, 9]):
        log.append(entries(1 + i, 1, b"x" * 1000), leader_epoch=epoch)
    want = log.epochs()
    assert want == [(0, 0), (3, 2), (7, 5), (9, 6)]
    log.close()
    (d / LEADER_EPOCH_FILE).write_bytes(b"0\n1\n100000000000000000000 0\n")
    log = PartitionLog.open(d, CFG)
    assert log.epochs() == want and log.latest_epoch == 9
    assert any("leader-epoch.checkpoint missing or corrupt" in m and "rebuilt from the log" in m
               for m in warnings(caplog))
    log.append(entries(100, 1), leader_epoch=9)  # used to fail: the epoch did not fit the batch header
    log.close()
    caplog.clear()
    log = PartitionLog.open(d, CFG)
    assert log.epochs() == want and warnings(caplog) == []
    log.close()


@pytest.mark.parametrize("rows", [[(7, 0)], [(0, 500)], [(0, 0), (0, 3)], []])
def test_epochs_the_batches_contradict_are_rebuilt(tmp_path, caplog, rows):
    d = tmp_path / "p"
    build(d, 10)
    write_rows(d / LEADER_EPOCH_FILE, rows)
    log = PartitionLog.open(d, CFG)
    assert log.epochs() == [(0, 0)]
    assert any("rebuilt from the log as [(0, 0)]" in m for m in warnings(caplog))
    log.close()


def test_a_segment_name_out_of_offset_range_is_ignored(tmp_path, caplog):
    d = tmp_path / "p"
    want = build(d)
    (d / "99999999999999999999.log").write_bytes(b"junk")
    log = PartitionLog.open(d, CFG)
    assert read_all(log) == want and log.log_end_offset == 60
    log.append(entries(1000, 1))
    assert (d / "99999999999999999999.log").read_bytes() == b"junk"
    (msg,) = warnings(caplog)
    assert "ignoring 99999999999999999999.log: its base offset is out of range" in msg
    log.close()


def test_a_damaged_first_header_is_refused_and_no_index_is_built_from_it(tmp_path):
    d = tmp_path / "p"
    build(d)
    first = d / segment_names(d)[0]
    raw = bytearray(first.read_bytes())
    raw[0:8] = (2**60).to_bytes(8, "little")
    first.write_bytes(bytes(raw))
    os.unlink(first.with_suffix(".index"))  # so the read rebuilds it from the headers
    log = PartitionLog.open(d, CFG)
    for _ in range(2):  # and again: the half-built index is not kept
        with pytest.raises(StorageError, match=r"corrupt batch at position 0: base offset 1152921504606846976 "
                                               r"where 0 was expected") as info:
            log.read(0)
        assert info.value.code == CORRUPT
    log.close()


def test_a_missing_segment_is_a_read_error(tmp_path):
    d = tmp_path / "p"
    build(d)
    log = PartitionLog.open(d, CFG)
    os.unlink(d / segment_names(d)[0])
    with pytest.raises(StorageError, match="open .* failed: ENOENT") as info:
        log.read(0)
    assert info.value.code == READ_FAILED
    log.close()


def test_an_epoch_checkpoint_that_fails_refuses_the_first_append_whole(tmp_path):
    """The epoch is on disk before the batch that needs it: when it cannot
    be, nothing is appended (it used to be written after the batch)."""
    d = tmp_path / "p"
    log = PartitionLog.open(d, CFG)
    (d / (LEADER_EPOCH_FILE + ".tmp")).mkdir()  # the atomic write of the checkpoint fails (EISDIR)
    with pytest.raises(StorageError) as info:
        log.append(entries(1, 1))
    assert info.value.code == WRITE_FAILED
    assert log.log_end_offset == 0 and log.size_bytes == 0 and log.epochs() == []
    (d / (LEADER_EPOCH_FILE + ".tmp")).rmdir()
    log.append(entries(2, 1))
    log.abandon()
    log = PartitionLog.open(d, CFG)
    assert [e[1] for e in read_all(log)] == [2] and log.epochs() == [(0, 0)]
    log.close()


def test_a_failed_first_append_leaves_an_epoch_row_that_open_drops(tmp_path, caplog):
    d = tmp_path / "p"
    log = PartitionLog.open(d, CFG)
    seg = log.segments()[0].path
    log.abandon()
    write_rows(d / LEADER_EPOCH_FILE, [(0, 0)])  # what a crash between the two writes leaves
    log = PartitionLog.open(d, CFG)
    assert log.epochs() == [] and warnings(caplog) == []
    assert os.path.getsize(seg) == 0
    log.close()
