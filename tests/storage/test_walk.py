"""storage._walk (Segment.read's batch walk in C) against the Python walk it
stands in for: the same chunks, counts and next offsets for every read."""

from __future__ import annotations

import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storage import segment
from storage.log import LogConfig, PartitionLog
from tests.storage.helpers import entries


def test_the_extension_is_built_and_used():
    """Every install with a C compiler builds it (pyproject ext-modules); a
    build that silently fell back to the Python walk must fail CI."""
    from storage import _walk

    assert segment._walk is _walk


def _batch_log(path: Path, sizes: list[int], payloads: list[int]) -> PartitionLog:
    log = PartitionLog.open(path, LogConfig(segment_bytes=4096, index_interval_bytes=512))
    ms = 1
    for i, n in enumerate(sizes):
        log.append(entries(ms, n, b"x" * payloads[i % len(payloads)]))
        ms += n
    return log


def _read(log, start, max_count, view, walk, ids=None):
    """``ids``: None, ``"triples"`` (with_ids) or ``"pairs"`` (with_ids, id_pairs)."""
    saved = segment._walk
    segment._walk = walk
    try:
        r = log.read(start, max_count=max_count, view=view, with_ids=ids is not None, id_pairs=ids == "pairs")
    finally:
        segment._walk = saved
    return [bytes(c) for c in r.chunks], r.count, r.next_offset, r.entries


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.integers(1, 40), min_size=1, max_size=30),
    payloads=st.lists(st.integers(0, 300), min_size=1, max_size=4),
    reads=st.lists(st.tuples(st.floats(0, 1), st.one_of(st.none(), st.integers(1, 200)), st.booleans(),
                             st.sampled_from([None, "triples", "pairs"])),
                   min_size=1, max_size=12),
)
def test_reads_match_the_python_walk(sizes, payloads, reads):
    """The C walk gives what the Python loop gives: chunks, counts, next
    offsets and, with ``with_ids``, each entry's (offset, ms, seq), or with
    ``id_pairs`` too (a group read) its (ms, seq)."""
    from storage import _walk

    calls = []

    def counted(fn):
        def call(*args):
            calls.append(fn.__name__)
            return fn(*args)
        return call

    c_walk = SimpleNamespace(batches=counted(_walk.batches), read=counted(_walk.read), find=_walk.find,
                             map_file=_walk.map_file)
    with tempfile.TemporaryDirectory() as d:
        log = _batch_log(Path(d) / "p", sizes, payloads)
        try:
            end = log.log_end_offset
            for where, max_count, view, with_ids in reads:
                start = min(int(where * end), end - 1)
                got = _read(log, start, max_count, view, c_walk, with_ids)
                assert got == _read(log, start, max_count, view, None, with_ids), (start, max_count, view)
                chunks, count, next_offset, ids = got
                assert count == min(end - start, max_count or end)
                assert next_offset == start + count
                if with_ids is None:
                    assert ids is None
                elif with_ids == "triples":
                    assert [offset for offset, _, _ in ids] == list(range(start, next_offset))
                else:
                    triples = _read(log, start, max_count, view, None, "triples")[3]
                    assert ids == [(ms, seq) for _, ms, seq in triples]
        finally:
            log.close()
    # The C walk did the reads compared: a view read starts in C over the
    # mapping (read), a pread one walks its buffer (batches).
    assert ("read" in calls) == any(view for _, _, view, _ in reads)
    assert "batches" in calls or all(view for _, _, view, _ in reads)


def _find(log, ms, seq, walk):
    saved = segment._walk
    segment._walk = walk
    try:
        return log.find_offset(ms, seq), log.find_offset(ms, seq, inclusive=False)
    finally:
        segment._walk = saved


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.integers(1, 40), min_size=1, max_size=30),
    payloads=st.lists(st.integers(0, 300), min_size=1, max_size=4),
    targets=st.lists(st.tuples(st.integers(0, 1300), st.integers(0, 2)), min_size=1, max_size=12),
    mapped=st.booleans(),
)
def test_id_lookups_match_the_python_walk(sizes, payloads, targets, mapped):
    """``_walk.find`` (Segment.find_id over a mapped file) against the Python
    header walk, for IDs before, inside, between and after the batches
    (the log's IDs are ms-0 for ms = 1, 2, ...)."""
    from storage import _walk

    with tempfile.TemporaryDirectory() as d:
        log = _batch_log(Path(d) / "p", sizes, payloads)
        try:
            if mapped:
                for seg in log._segs:
                    seg.mapped(seg.size)
            c_used = sum(seg._map is not None for seg in log._segs)
            for ms, seq in targets:
                assert _find(log, ms, seq, _walk) == _find(log, ms, seq, None), (ms, seq)
        finally:
            log.close()
    assert c_used or not mapped


def _one_log_buffer(tmp_path, sizes):
    log = _batch_log(tmp_path / "p", sizes, [10])
    try:
        seg = log._segs[0]
        data = seg.pread(0, seg.size)
    finally:
        log.close()
    return data


def _find_then_walk(view, seg, above, lo, stop, left):
    """What ``_walk.after`` stands in for: ``find``, the offset checked
    against ``[lo, stop)``, then ``batches`` from its batch."""
    from storage import _walk

    found = _walk.find(view, seg.size, seg.index.id_entries(), seg.base_offset, *above)
    if found is None or not lo <= found[0] < stop:
        return None
    chunks = []
    _, end, count, _, done = _walk.batches(view, found[1], min(seg.size, len(view)), found[0], stop, left, chunks)
    return [bytes(c) for c in chunks], end, count, done


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.integers(1, 40), min_size=1, max_size=30),
    payloads=st.lists(st.integers(0, 300), min_size=1, max_size=4),
    mapped_at=st.one_of(st.just(1.0), st.just(1.0), st.floats(0.3, 1)),
    reads=st.lists(st.tuples(st.one_of(st.floats(0, 1), st.floats(0, 1), st.integers(0, 1300)), st.integers(0, 2),
                             st.integers(-1, 8), st.integers(-1, 300), st.integers(-1, 200)),
                   min_size=1, max_size=12),
)
def test_after_is_find_then_walk(sizes, payloads, mapped_at, reads):
    """``_walk.after`` (XREAD's read in a segment) against the two calls it
    joins, on segments mapped whole or in part (a file grown since it was
    mapped), for IDs before, inside, between and after the batches, log
    starts and stops anywhere, any bound."""
    from storage import _walk

    with tempfile.TemporaryDirectory() as d:
        log = _batch_log(Path(d) / "p", sizes, payloads)
        try:
            for seg in log._segs:
                whole = seg.mapped(seg.size) if seg.size else None
                if whole is None:
                    continue
                view = whole[:max(int(seg.size * mapped_at), 1)]
                span = seg.end_offset - seg.base_offset
                for target, seq, back, ahead, left in reads:
                    # An ID in this segment (the log's IDs are <offset + 1>-0) or any ID;
                    # the log's start and the read's stop around the offset it finds.
                    at = seg.base_offset + int(target * span) if isinstance(target, float) else target
                    ms, lo, stop = at + 1, at - back, at + ahead
                    chunks = []
                    got = _walk.after(view, seg.size, seg.index.id_entries(), seg.base_offset, ms, seq,
                                      lo, stop, left, chunks)
                    want = _find_then_walk(view, seg, (ms, seq), lo, stop, left)
                    assert (None if got is None else ([bytes(c) for c in chunks], *got)) == want
                    assert got is not None or chunks == []
                    del chunks
                del view, whole
        finally:
            log.close()


def test_the_walk_leaves_a_batch_cut_by_the_buffer_end_to_the_caller(tmp_path):
    from storage import _walk

    data = _one_log_buffer(tmp_path, [3, 4, 5])
    first = int.from_bytes(data[8:12], "little")
    second = int.from_bytes(data[first + 8:first + 12], "little")
    mv = memoryview(data)
    chunks = []
    # The buffer ends inside the second batch: only the first is walked.
    assert _walk.batches(mv, 0, first + second - 1, 0, 12, -1, chunks) == (first, 3, 3, len(bytes(chunks[0])), False)
    # Whole buffer, from offset 5 (inside the second batch), at most 3 entries.
    chunks = []
    p, cur, count, nbytes, done = _walk.batches(mv, 0, len(data), 5, 12, 3, chunks)
    assert (p, cur, count, done) == (first + second, 8, 3, True)
    assert sum(map(len, chunks)) == nbytes and len(chunks) == 2


def test_the_walk_stops_at_a_malformed_header(tmp_path):
    from storage import _walk

    data = bytearray(_one_log_buffer(tmp_path, [3, 4]))
    first = int.from_bytes(data[8:12], "little")
    data[first + 24:first + 28] = (0).to_bytes(4, "little")  # a batch of 0 entries
    chunks = []
    assert _walk.batches(memoryview(bytes(data)), 0, len(data), 0, 7, -1, chunks)[:3] == (first, 3, 3)


def _general_after(log, ms, seq, max_count, view):
    """XREAD's read as it was before ``read_after_id``: find, then read."""
    start = max(log.find_offset(ms, seq, inclusive=False), log.log_start_offset)
    if start >= log.log_end_offset:
        return [], 0
    r = log.read(start, max_count=max_count, view=view)
    return [bytes(c) for c in r.chunks], r.count


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.integers(1, 40), min_size=1, max_size=30),
    payloads=st.lists(st.integers(0, 300), min_size=1, max_size=4),
    deleted=st.one_of(st.just([]), st.lists(st.floats(0, 1), max_size=6)),
    start_at=st.one_of(st.none(), st.none(), st.floats(0, 1)),
    hw_at=st.one_of(st.none(), st.none(), st.floats(0, 1)),
    mapped=st.booleans(),
    crc=st.sampled_from([False, False, True]),
    reads=st.lists(st.tuples(st.integers(0, 1300), st.integers(0, 2), st.one_of(st.none(), st.integers(0, 200))),
                   min_size=1, max_size=10),
)
def test_reads_after_an_id_match_find_then_read(sizes, payloads, deleted, start_at, hw_at, mapped, crc, reads):
    """``PartitionLog.read_after_id`` (one C pass where it can) against
    ``find_offset`` + ``read``, with deleted entries, a log start moved by
    retention, a high watermark below the end (a follower's log), segments
    mapped or not, and CRCs still to check (a log opened after a restart)."""
    with tempfile.TemporaryDirectory() as d:
        log = _batch_log(Path(d) / "p", sizes, payloads)
        try:
            end = log.log_end_offset
            log.delete_entries({min(int(f * end), end - 1) for f in deleted})
            if start_at is not None:
                log.advance_log_start_offset(int(start_at * end))
            if hw_at is not None:
                log.hw_follows_end = False
                log.set_high_watermark(int(hw_at * end))
            for seg in log._segs:
                if mapped:
                    seg.mapped(seg.size)
                seg.check_crc_below(seg.size if crc else 0)
            for ms, seq, max_count in reads:
                for view in (True, False):
                    got = log.read_after_id(ms, seq, max_count, view)
                    assert ([bytes(c) for c in got.chunks], got.count) == _general_after(log, ms, seq, max_count, view)
        finally:
            log.close()


def test_a_plain_read_after_an_id_is_one_pass_in_c(tmp_path, monkeypatch):
    """No deleted entries, no CRCs to check, a mapped segment: the read is
    found and walked in one C call (``_walk.after``), without
    ``Segment.read`` (whose own C start the test above compares too); one
    that runs past the segment goes on in it."""
    from storage import _walk

    log = _batch_log(tmp_path / "p", [5, 10, 20, 30, 3, 7] * 4, [10, 100])
    try:
        assert len(log._segs) > 3
        expected = {ms: _general_after(log, ms, 0, 10, True) for ms in (0, 3, 50, 100, 200)}
        calls = []

        def after(*args):
            calls.append("after")
            return _walk.after(*args)

        monkeypatch.setattr(segment.Segment, "read", None)  # the general path would fail
        monkeypatch.setattr(segment, "_walk", SimpleNamespace(after=after))  # and so would any other C call
        for ms, want in expected.items():
            got = log.read_after_id(ms, 0, 10, view=True)
            assert ([bytes(c) for c in got.chunks], got.count) == want
            assert got.count == 10 and got.next_offset == ms + 10
        assert calls == ["after"] * len(expected)
        monkeypatch.undo()
        # From the last entry of a segment on: the next segment is read by Segment.read.
        seg = log._segs[0]
        last = seg.end_offset
        got = log.read_after_id(last - 1, 0, 50, view=True)  # IDs are <offset + 1>-0
        assert ([bytes(c) for c in got.chunks], got.count) == _general_after(log, last - 1, 0, 50, True)
        assert got.count == 50
    finally:
        log.close()


def test_after_checks_its_arguments():
    """``after`` takes its ten arguments as its format did: wrong count, a
    chunks argument that is not a list, a number that is not an integer are
    TypeErrors, nothing read."""
    from storage import _walk

    view = memoryview(bytes(200))
    args = [view, 200, b"", 0, 1, 0, 0, 10, -1, []]
    with pytest.raises(TypeError):
        _walk.after(*args[:9])
    with pytest.raises(TypeError):
        _walk.after(*args, [])
    with pytest.raises(TypeError):
        _walk.after(*args[:9], ())
    with pytest.raises(TypeError):
        _walk.after(view, "200", *args[2:])
    with pytest.raises(OverflowError):
        _walk.after(view, 200, b"", 2**64, *args[4:])
    assert args[9] == []
