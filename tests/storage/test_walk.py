"""storage._walk (Segment.read's batch walk in C) against the Python walk it
stands in for: the same chunks, counts and next offsets for every read."""

from __future__ import annotations

import tempfile
from pathlib import Path
from types import SimpleNamespace

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


def _read(log, start, max_count, view, walk):
    saved = segment._walk
    segment._walk = walk
    try:
        r = log.read(start, max_count=max_count, view=view)
    finally:
        segment._walk = saved
    return [bytes(c) for c in r.chunks], r.count, r.next_offset


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.integers(1, 40), min_size=1, max_size=30),
    payloads=st.lists(st.integers(0, 300), min_size=1, max_size=4),
    reads=st.lists(st.tuples(st.floats(0, 1), st.one_of(st.none(), st.integers(1, 200)), st.booleans()),
                   min_size=1, max_size=12),
)
def test_reads_match_the_python_walk(sizes, payloads, reads):
    from storage import _walk

    calls = []

    def counted(*args):
        calls.append(args[1])
        return _walk.batches(*args)

    c_walk = SimpleNamespace(batches=counted)
    with tempfile.TemporaryDirectory() as d:
        log = _batch_log(Path(d) / "p", sizes, payloads)
        try:
            end = log.log_end_offset
            for where, max_count, view in reads:
                start = min(int(where * end), end - 1)
                got = _read(log, start, max_count, view, c_walk)
                assert got == _read(log, start, max_count, view, None), (start, max_count, view)
                chunks, count, next_offset = got
                assert count == min(end - start, max_count or end)
                assert next_offset == start + count
        finally:
            log.close()
    assert calls  # the C walk did the reads compared


def _one_log_buffer(tmp_path, sizes):
    log = _batch_log(tmp_path / "p", sizes, [10])
    try:
        seg = log._segs[0]
        data = seg.pread(0, seg.size)
    finally:
        log.close()
    return data


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
