from storage.handles import FileCache
from storage.index import SegmentIndex


def make(tmp_path, cache):
    return SegmentIndex(cache, str(tmp_path / "0.index"), str(tmp_path / "0.idindex"), 0, 0)


def test_lookups_in_memory_and_on_disk(tmp_path):
    cache = FileCache(8)
    idx = make(tmp_path, cache)
    idx.load()
    for i in range(100):
        idx.append(rel_offset=10 * i, position=1000 * i, first_ms=50 * i + 7, first_seq=i % 3)
    for on_disk in (False, True):
        if on_disk:
            idx.unload()
            idx = SegmentIndex(cache, idx.offset_path, idx.id_path, 800, 2400)
            assert not idx.in_memory and len(idx) == 100
        assert idx.floor_offset(0) == (0, 0)
        assert idx.floor_offset(15) == (10, 1000)
        assert idx.floor_offset(10**6) == (990, 99000)
        assert idx.ceiling_offset(11) == (20, 2000)
        assert idx.ceiling_offset(991) is None
        assert idx.count_below(20) == 2
        assert idx.floor_id(0, 0) == -1
        assert idx.floor_id(57, 1) == 1
        assert idx.floor_id(57, 0) == 0
        assert idx.entry(1) == (57, 1, 10, 1000)
        assert idx.last() == (50 * 99 + 7, 0, 990, 99000)


def test_truncate_and_persist(tmp_path):
    cache = FileCache(8)
    idx = make(tmp_path, cache)
    idx.load()
    for i in range(10):
        idx.append(i, i * 100, i, 0)
    assert idx.persist()
    assert not idx.persist()
    idx.truncate_from(4)
    assert len(idx) == 4
    idx.persist()
    assert (tmp_path / "0.index").stat().st_size == 32
    assert (tmp_path / "0.idindex").stat().st_size == 96


def test_sealed_indexes_are_read_once_and_held_in_a_bounded_lru(tmp_path, monkeypatch):
    import os

    from storage import index as index_mod

    cache = FileCache(64)
    sealed = []
    for k in range(index_mod.SEALED_CACHE_MAX + 2):
        d = tmp_path / f"s{k}"
        d.mkdir()
        idx = make(d, cache)
        idx.load()
        for i in range(50):
            idx.append(rel_offset=10 * i, position=100 * i, first_ms=i + 1, first_seq=0)
        idx.unload()
        sealed.append(SegmentIndex(cache, idx.offset_path, idx.id_path, 400, 1200))
    reads = []
    real_pread = os.pread
    monkeypatch.setattr(index_mod.os, "pread", lambda *a: reads.append(a) or real_pread(*a))
    first = sealed[0]
    assert first.floor_offset(15) == (10, 100) and first.floor_id(3, 0) == 2
    assert len(reads) == 2  # both files read once, then bisects in memory
    assert first.ceiling_offset(11) == (20, 200) and first.entry(49) == (50, 0, 490, 4900)
    assert len(reads) == 2
    for idx in sealed[1:]:
        assert idx.floor_offset(0) == (0, 0)
    assert len(index_mod._sealed_lru) == index_mod.SEALED_CACHE_MAX  # bounded
    assert first._sealed is None  # the least recently used one was dropped
    # Becoming active again drops the sealed copy (the files may change).
    last = sealed[-1]
    last.load()
    assert last._sealed is None and id(last) not in index_mod._sealed_lru
    assert last.floor_offset(15) == (10, 100)
