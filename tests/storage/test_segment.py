from storage import records
from storage.handles import FileCache
from storage.segment import ReadAccumulator, Segment
from tests.storage.helpers import enc


def test_append_read_find_truncate(tmp_path):
    seg = Segment.create(tmp_path, 100, FileCache(8), index_interval_bytes=64)
    off = 100
    for b in range(20):
        ents = [(10 * b + k + 1, 0, enc(10 * b + k + 1, 0)) for k in range(3)]
        head, body = records.encode_batch(off, ents, 0, 1000 + b)
        seg.append(head, body, off, 3, ents[0][0], 0, ents[-1][0], 0, 1000 + b)
        off += 3
    assert seg.end_offset == 160 and len(seg.index) > 5
    acc = ReadAccumulator(None, None, False, True, [], [])
    assert seg.read(104, 110, (), acc) == 110
    assert acc.count == 6 and [e[0] for e in acc.entries] == list(range(104, 110))
    assert b"".join(acc.chunks) == b"".join(enc(ms, 0) for ms in (12, 13, 21, 22, 23, 31))
    assert seg.find_id(21, 0) == 106 and seg.find_id(14, 0) == 106 and seg.find_id(0, 0) == 100
    assert seg.find_id(10**9, 0) == 160
    assert seg.entry_id(159) == (193, 0)
    assert seg.last_info() == (193, 0, 1019)
    pos, h = seg.locate(130)
    assert h[records.H_BASE] == 130
    seg.truncate_at(pos, 130)
    assert seg.end_offset == 130 and seg.size == pos
    assert seg.last_info() == (93, 0, 1009)
    seg.seal()
    sealed = Segment(tmp_path, 100, seg.cache, 64, seg.size, seg.index.offset_file_bytes, seg.index.id_file_bytes)
    sealed.end_offset = 130
    assert sealed.find_id(21, 0) == 106 and sealed.entry_at(106) == enc(21, 0)
