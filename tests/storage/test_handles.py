import os

from storage.handles import FileCache


def test_lru_bounds_open_files(tmp_path):
    cache = FileCache(4)
    paths = [str(tmp_path / f"f{i}") for i in range(10)]
    fds = [cache.get(p, create=True) for p in paths]
    assert len(cache) == 4 and cache.opens == 10
    for fd in fds[:6]:
        try:
            os.fstat(fd)
        except OSError:
            pass
        else:
            # a reused fd number must belong to a cached file
            assert fd in fds[6:]
    assert cache.get(paths[-1]) == fds[-1]  # hit: no reopen
    assert cache.opens == 10
    cache.get(paths[0])
    assert cache.opens == 11 and len(cache) == 4
    cache.close_under(str(tmp_path))
    assert len(cache) == 0
    cache.close_all()


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_pinned_descriptor_stays_open_until_unpinned(tmp_path):
    """A pinned descriptor is never closed to make room, and one closed
    (its file deleted, its log closed) while pinned keeps its number until
    its last unpin: another thread may be syncing it."""
    cache = FileCache(4)
    paths = [str(tmp_path / f"f{i}") for i in range(8)]
    before = _open_fds()
    pinned = cache.pin(paths[0], create=True)
    assert cache.pin(paths[0]) == pinned  # pinned twice: unpinned twice
    for p in paths[1:]:
        cache.get(p, create=True)
    assert len(cache) == 4 and cache.peek(paths[0]) == pinned  # the LRU one, passed over
    cache.close(paths[0])
    assert cache.peek(paths[0]) is None and len(cache) == 4  # out of the cache, still counted
    os.fstat(pinned)
    reopened = cache.get(paths[0])
    assert reopened != pinned and len(cache) == 4
    cache.unpin(pinned)
    os.fstat(pinned)
    cache.unpin(pinned)  # the last pin: closed now
    assert cache.pinned == 0 and len(cache) == 3
    cache.close_all()
    assert _open_fds() == before


def test_a_directory_is_cached_and_closed_with_its_files(tmp_path):
    cache = FileCache(4)
    d = tmp_path / "p"
    d.mkdir()
    fd = cache.pin(str(d), directory=True)
    os.fsync(fd)  # opened read-only as a directory
    cache.get(str(d / "f"), create=True)
    cache.close_under(str(d))
    os.fstat(fd)  # pinned: closed at its unpin
    assert len(cache) == 1
    cache.unpin(fd)
    assert len(cache) == 0


def test_every_descriptor_pinned_opens_past_the_bound_rather_than_fail(tmp_path):
    cache = FileCache(4)
    fds = [cache.pin(str(tmp_path / f"f{i}"), create=True) for i in range(5)]
    assert len(cache) == 5
    for fd in fds:
        cache.unpin(fd)
    cache.get(str(tmp_path / "g"), create=True)
    assert len(cache) == 4  # back under the bound at the next open
    cache.close_all()


def test_a_log_flushes_many_segments_within_its_cache(tmp_path, monkeypatch):
    """A log with more unsynced segments than its file cache holds (never
    flushed, as under fsync no) is flushed a few segments per ticket: the
    process never holds more than the cache's descriptors, and the flush
    reaches the end. Its tickets pin at most an eighth of the cache (4 at
    least) and say when they leave segments for the next."""
    from storage.log import LogConfig, PartitionLog
    from tests.storage.helpers import entries

    cache = FileCache(16)
    log = PartitionLog.open(tmp_path / "p", LogConfig(segment_bytes=1024), file_cache=cache)
    try:
        for i in range(40):
            log.append(entries(1 + 10 * i, 10, b"x" * 40))
        assert len(log.segments()) > 16 and log.recovery_point == 0
        ticket = log.begin_flush()
        assert ticket.partial and len(ticket.sync_targets()) <= 4
        log.end_flush(ticket)  # never run: nothing advances, nothing stays pinned
        assert log.recovery_point == 0 and cache.pinned == 0
        outside = _open_fds() - len(cache)  # descriptors not the cache's
        most = [0]
        real_fdatasync = os.fdatasync

        def counting(fd):
            most[0] = max(most[0], _open_fds() - outside)
            real_fdatasync(fd)

        monkeypatch.setattr(os, "fdatasync", counting)
        log.flush()
        monkeypatch.undo()
        assert log.recovery_point == log.log_end_offset == 400
        assert 0 < most[0] <= 16 and len(cache) <= 16 and cache.pinned == 0
    finally:
        log.close()
        cache.close_all()


def test_views_kept_from_many_partitions_hold_few_descriptors(tmp_path):
    """Views of segment mappings kept while more segments are read (the
    replies of a pipeline of reads over many partitions, sent at once)
    keep a mapping, and its descriptor, alive after the segment is
    unmapped: past a few such mappings, reads copy instead of mapping, so
    the descriptors stay bounded however many partitions are read."""
    from storage.log import PartitionLog
    from storage.handles import MAX_MAPPED_SEGMENTS, MAX_RETIRED_MAPPINGS
    from tests.storage.helpers import entries

    cache = FileCache(16)
    logs = [PartitionLog.open(tmp_path / f"p{i}", file_cache=cache) for i in range(64)]
    try:
        for lg in logs:
            lg.append(entries(1, 10, b"x" * 40))
        outside = _open_fds() - len(cache)
        held = []
        most = 0
        for lg in logs:
            held.append(lg.read(0, view=True))
            most = max(most, _open_fds() - len(cache) - outside)
        assert all(r.count == 10 for r in held)
        want = [b"".join(lg.read(0).chunks) for lg in logs]
        assert [b"".join(r.chunks) for r in held] == want  # copies or views, the same bytes
        assert most <= MAX_MAPPED_SEGMENTS + MAX_RETIRED_MAPPINGS, most
        held.clear()
        assert _open_fds() - len(cache) - outside <= MAX_MAPPED_SEGMENTS
    finally:
        for lg in logs:
            lg.close()
        cache.close_all()
