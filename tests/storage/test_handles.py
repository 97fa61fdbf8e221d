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
