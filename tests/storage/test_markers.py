from storage.handles import FileCache
from storage.markers import RECORD_BYTES, DeletionMarkers


def test_add_load_and_torn_tail(tmp_path):
    cache = FileCache(8)
    m = DeletionMarkers(tmp_path, cache)
    m.add(0, [5, 9])
    m.add(0, [2])
    assert list(m.get(0)) == [2, 5, 9]
    assert m.count_in(3, 10) == 2
    cache.close_all()
    path = tmp_path / "00000000000000000000.xdel"
    with open(path, "ab") as f:
        f.write(b"\x01\x02\x03")  # torn record
    m2 = DeletionMarkers(tmp_path, FileCache(8))
    m2.load(0, keep_below=9)  # 9 is past the log end after a crash
    assert list(m2.get(0)) == [2, 5]
    assert path.stat().st_size == 2 * RECORD_BYTES
    m2.truncate_from(5)
    assert list(m2.get(0)) == [2] and m2.is_deleted(0, 2) and not m2.is_deleted(0, 5)
    m2.drop_segment(0)
    assert not path.exists()
