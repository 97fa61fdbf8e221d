"""PartitionLog core behaviour: append, read, find_offset, flush, reopen."""

import mmap
import os

import pytest

from storage.errors import OffsetOutOfRangeError
from storage.log import LogConfig, PartitionLog
from tests.storage.helpers import enc, entries, read_all

SMALL = LogConfig(segment_bytes=2048, index_interval_bytes=256)


def make(tmp_path, config=SMALL, **kw):
    return PartitionLog.open(tmp_path / "p", config, **kw)


def fill(log, batches, per_batch=3, payload=b"v" * 20):
    ms = log.last_id[0] + 1
    for _ in range(batches):
        log.append(entries(ms, per_batch, payload))
        ms += per_batch


def test_empty_log(tmp_path):
    log = make(tmp_path)
    assert (log.log_start_offset, log.log_end_offset, log.high_watermark) == (0, 0, 0)
    assert log.last_id == (0, 0)
    assert log.live_count == 0
    r = log.read(0)
    assert (r.count, r.chunks, r.next_offset) == (0, [], 0)
    assert log.find_offset(0, 0) == 0
    log.close()


def test_append_assigns_contiguous_offsets(tmp_path):
    log = make(tmp_path)
    assert log.append(entries(1, 3)) == 0
    assert log.append(entries(4, 2)) == 3
    assert log.log_end_offset == 5 == log.high_watermark == log.live_count
    assert log.last_id == (5, 0)


def test_append_asserts_increasing_ids(tmp_path):
    log = make(tmp_path)
    log.append(entries(5, 1))
    with pytest.raises(AssertionError):
        log.append([(5, 0, b"x")])
    with pytest.raises(AssertionError):
        log.append([(7, 0, b"x"), (6, 0, b"y")])


def test_read_returns_exact_bytes_across_segments(tmp_path):
    log = make(tmp_path)
    fill(log, 60)
    assert log.segment_count > 3
    r = log.read(0)
    assert r.count == 180 and r.next_offset == 180
    assert b"".join(r.chunks) == b"".join(enc(i, 0, b"v" * 20) for i in range(1, 181))
    # one chunk per batch: runs are not split per entry
    assert len(r.chunks) == 60


def test_read_limits(tmp_path):
    log = make(tmp_path)
    fill(log, 40)
    r = log.read(7, max_count=10, with_ids=True)
    assert r.count == 10 and r.next_offset == 17
    assert [e[0] for e in r.entries] == list(range(7, 17))
    assert [(e[1], e[2]) for e in r.entries] == [(i + 1, 0) for i in range(7, 17)]
    r = log.read(7, end_offset=9)
    assert r.count == 2 and r.next_offset == 9
    size = len(enc(1, 0, b"v" * 20))
    r = log.read(0, max_bytes=size * 4 + 1)
    assert r.count == 4 and sum(len(c) for c in r.chunks) == size * 4
    r = log.read(0, max_bytes=1)  # at least one entry
    assert r.count == 1
    r = log.read(120)
    assert r.next_offset == 120 and r.count == 0
    with pytest.raises(OffsetOutOfRangeError):
        log.read(121)


def test_read_reverse(tmp_path):
    log = make(tmp_path)
    fill(log, 30)
    r = log.read_reverse(10, 50, max_count=7, with_ids=True)
    assert [e[0] for e in r.entries] == list(range(49, 42, -1))
    assert [bytes(c) for c in r.chunks] == [enc(o + 1, 0, b"v" * 20) for o in range(49, 42, -1)]
    r = log.read_reverse(0, 90)
    assert r.count == 90 and bytes(r.chunks[-1]) == enc(1, 0, b"v" * 20)


def test_find_offset(tmp_path):
    log = make(tmp_path)
    for i in range(50):
        log.append([(10 * i + 1, 0, b"a"), (10 * i + 1, 1, b"b"), (10 * i + 5, 0, b"c")])
    # entry ids: offset 3i -> (10i+1,0), 3i+1 -> (10i+1,1), 3i+2 -> (10i+5,0)
    assert log.find_offset(0, 0) == 0
    assert log.find_offset(1, 0, inclusive=False) == 1
    assert log.find_offset(101, 1) == 31
    assert log.find_offset(101, 1, inclusive=False) == 32
    assert log.find_offset(102, 0) == 32
    assert log.find_offset(106, 0) == 33
    assert log.find_offset(495, 0) == 149
    assert log.find_offset(495, 0, inclusive=False) == 150
    assert log.find_offset(10**9, 0) == 150
    for off in range(150):
        ms, seq = log.entry_id(off)
        assert log.find_offset(ms, seq) == off
        assert log.find_offset(ms, seq, inclusive=False) == off + 1


def test_entry_at_and_binary_safety(tmp_path):
    log = make(tmp_path)
    blob = bytes(range(256)) * 3
    log.append([(1, 0, blob), (2, 0, b"")])
    assert log.entry_at(0) == blob
    assert log.entry_at(1) == b""
    assert log.entry_at(2) is None
    assert log.entry_id(1) == (2, 0)


def test_flush_and_reopen(tmp_path):
    log = make(tmp_path)
    fill(log, 40)
    log.flush()
    assert log.recovery_point == 120
    fill(log, 5)
    before = read_all(log)
    log.close()
    log = make(tmp_path)
    assert log.log_end_offset == 135 and log.recovery_point == 135
    assert log.last_id == (135, 0)
    assert read_all(log) == before
    fill(log, 1)
    assert log.log_end_offset == 138
    log.close()


def test_group_commit_ticket(tmp_path):
    log = make(tmp_path)
    fill(log, 10)
    ticket = log.begin_flush()
    fill(log, 10)  # appends (and rolls) while the ticket is in flight
    ticket.run()
    log.end_flush(ticket)
    assert log.recovery_point == 30
    log.flush()
    assert log.recovery_point == 60


def test_a_deferred_checkpoint_is_written_later_and_never_stale(tmp_path):
    """``finish(None, defer_checkpoint=True)`` leaves the recovery-point file
    to ``write_checkpoint`` (the server writes it on a worker thread after
    the round); a checkpoint written late never replaces a later one, nor
    claims offsets of a log cut back meanwhile."""
    from storage.checkpoint import encode_rows
    from storage.files import RECOVERY_POINT_FILE

    now = [1_000_000]
    log = make(tmp_path, LogConfig(segment_bytes=1 << 20), clock_ms=lambda: now[0])
    rp_file = tmp_path / "p" / RECOVERY_POINT_FILE
    before = rp_file.read_bytes() if rp_file.exists() else None

    def flushed(defer):
        now[0] += 1000
        ticket = log.begin_flush()
        assert ticket.checkpoints
        for fd, full in ticket.sync_targets():
            os.fsync(fd) if full else os.fdatasync(fd)
        ticket.finish(None, defer_checkpoint=defer)
        log.end_flush(ticket)
        return ticket

    fill(log, 3)
    first = flushed(True)
    assert log.recovery_point == 9 and first.checkpoints  # durable, the file not yet written
    assert (rp_file.read_bytes() if rp_file.exists() else None) == before
    first.write_checkpoint()
    assert rp_file.read_bytes() == encode_rows([(9,)]) and not first.checkpoints
    # Two in flight, written out of order: the earlier one is skipped.
    fill(log, 2)
    second = flushed(True)
    fill(log, 2)
    flushed(False)  # written at once: 21
    second.write_checkpoint()
    assert rp_file.read_bytes() == encode_rows([(21,)])
    # A log cut back after the round: its checkpoint is not written.
    fill(log, 2)
    third = flushed(True)
    log.truncate_to(12)
    third.write_checkpoint()
    assert rp_file.read_bytes() == encode_rows([(12,)])
    log.close()
    log = make(tmp_path, LogConfig(segment_bytes=1 << 20))
    assert log.log_end_offset == 12 and len(read_all(log)) == 12
    log.close()


def test_segments_info(tmp_path):
    log = make(tmp_path)
    fill(log, 30)
    infos = log.segments()
    assert len(infos) == log.segment_count
    assert infos[0].base_offset == 0
    for a, b in zip(infos, infos[1:]):
        assert a.end_offset == b.base_offset
    assert sum(i.size_bytes for i in infos) == log.size_bytes


def test_view_reads_match_copies_while_the_active_segment_grows_and_is_cut(tmp_path, monkeypatch):
    from storage import segment

    monkeypatch.setattr(segment, "_MAP_AHEAD_BYTES", 1000)  # the mapping reaches 1000 bytes past the file's end
    monkeypatch.setattr(segment, "_REMAP_BYTES", 4000)
    log = make(tmp_path, LogConfig(segment_bytes=1 << 20, index_interval_bytes=256))
    fill(log, 10)

    def same(start=0):
        viewed = log.read(start, view=True)
        copied = log.read(start)
        assert b"".join(viewed.chunks) == b"".join(copied.chunks)
        assert (viewed.count, viewed.next_offset) == (copied.count, copied.next_offset)
        return viewed.chunks

    chunks = same()
    mapping = chunks[0].obj
    assert all(c.obj is mapping for c in chunks)  # mapped at the first view read
    fill(log, 3)  # within the mapping's reach: the new tail is sliced from it
    chunks = same()
    assert all(c.obj is mapping for c in chunks)
    fill(log, 6)  # past the mapping, less than _REMAP_BYTES since it was made: the newest tail is read with pread
    chunks = same()
    assert chunks[0].obj is mapping and isinstance(chunks[-1].obj, bytes)
    assert same(28) and same(log.log_end_offset - 1)
    fill(log, 20)  # now _REMAP_BYTES past it: remapped (the read's first chunks still slice the old mapping)
    chunks = same()
    remapped = chunks[-1].obj
    assert isinstance(remapped, mmap.mmap) and remapped is not mapping
    chunks = same()
    assert all(c.obj is remapped for c in chunks)
    del chunks, remapped, mapping
    log.truncate_to(7)  # cutting the file drops the mapping first
    assert len(same()) and log.read(0, view=True).count == 7
    log.close()


def test_a_view_read_of_the_active_segments_tail_slices_the_mapping_right_after_an_append(tmp_path):
    """A consumer chasing producers reads the batches appended since its
    last read: they come as views of the mapping made by an earlier read
    (the mapping reaches past the file's end), not as copies read anew."""
    log = make(tmp_path, LogConfig(segment_bytes=1 << 20, index_interval_bytes=256))
    fill(log, 10)
    mapping = log.read(0, view=True).chunks[0].obj
    for _ in range(20):
        start = log.log_end_offset
        fill(log, 1)
        tail = log.read(start, view=True)
        assert tail.count == 3 and all(isinstance(c, memoryview) and c.obj is mapping for c in tail.chunks)
        assert b"".join(tail.chunks) == b"".join(log.read(start).chunks)
    log.close()


def test_a_cut_after_view_reads_of_the_mapped_tail_serves_only_the_new_bytes(tmp_path):
    """A follower cutting its log back after reads of the tail through the
    mapping (which reaches past the file's end): views held of bytes below
    the cut stay readable, reads after it see the batches appended since,
    never the cut ones, and nothing touches a page past the file's end (a
    SIGBUS would end the test process)."""
    log = make(tmp_path, LogConfig(segment_bytes=1 << 20, index_interval_bytes=256))
    fill(log, 10)
    log.read(0, view=True)
    fill(log, 10)
    held = log.read(0, max_count=6, view=True)
    held_bytes = [bytes(c) for c in held.chunks]
    log.read(20, view=True)  # the tail, through the mapping
    log.truncate_to(9)
    assert [bytes(c) for c in held.chunks] == held_bytes
    assert log.read(9, view=True).count == 0
    log.append(entries(log.last_id[0] + 1000, 3, b"w" * 20))
    viewed = log.read(0, view=True)
    copied = log.read(0)
    assert viewed.count == 12 and b"".join(viewed.chunks) == b"".join(copied.chunks)
    assert b"".join(log.read(9, view=True).chunks) == b"".join(enc(log.last_id[0] - 2 + i, 0, b"w" * 20)
                                                             for i in range(3))
    log.close()


def test_mapped_segments_are_bounded(tmp_path):
    log = make(tmp_path)
    mappings = log.cache.mappings
    mappings.max_mapped = 2
    fill(log, 60)
    assert log.segment_count > 3
    for seg in log._segs:
        r = log.read(seg.base_offset, max_count=1, view=True)
        assert r.count == 1
        assert mappings.mapped <= 2
    mapped = [seg for seg in log._segs if seg in mappings]
    assert mapped == log._segs[-2:]  # the least recently read were unmapped
    log.close()
    assert mappings.mapped == 0


def test_a_view_read_across_more_segments_than_may_be_mapped(tmp_path):
    """Mappings evicted while the read still holds views of them stay valid
    until the views go (the read's chunks are intact)."""
    log = make(tmp_path)
    log.cache.mappings.max_mapped = 2
    fill(log, 60)
    assert log.segment_count > 3
    viewed = log.read(0, view=True)
    assert log.cache.mappings.mapped <= 2
    assert b"".join(viewed.chunks) == b"".join(log.read(0).chunks)
    assert viewed.count == 180
    log.close()


@pytest.mark.parametrize("lose_index", [False, True])
def test_id_lookups_after_a_restart_in_a_young_segment(tmp_path, lose_index):
    """Found by the preallocating state machine: a segment rolled less than a
    checkpoint interval before a clean close had no index entry on disk, and
    after the restart ``find_offset`` answered its base offset for any ID in
    it (an exclusive XREAD/XRANGE start would return that entry again). The
    close now writes the index; a lookup no longer trusts an index that
    lacks the segment's first batch (a lost one)."""
    cfg = LogConfig(segment_bytes=1024, index_interval_bytes=128)
    log = make(tmp_path, cfg)
    log.append([(0, 1, enc(0, 1, b""))])
    log.flush()
    log.roll()
    log.append([(0, 2, enc(0, 2, b"")), (0, 3, enc(0, 3, b""))])
    log.append([(0, 5, enc(0, 5, b""))])
    want = {(ms, seq, inc): log.find_offset(ms, seq, inc)
            for ms, seq in [(0, 0), (0, 1), (0, 2), (0, 3), (0, 4), (0, 5), (0, 6)] for inc in (True, False)}
    assert want[(0, 2, False)] == 2 and want[(0, 4, True)] == 3 and want[(0, 5, False)] == 4
    log.close()
    if lose_index:
        for suffix in (".index", ".idindex"):
            os.truncate(tmp_path / "p" / ("%020d" % 1 + suffix), 0)
    log = make(tmp_path, cfg)
    assert {k: log.find_offset(*k) for k in want} == want
