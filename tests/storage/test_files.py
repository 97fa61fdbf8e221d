from storage.files import LOG_SUFFIX, base_name, parse_base_offset, segment_path


def test_names_sort_like_offsets(tmp_path):
    offsets = [0, 9, 10, 4213, 10**19]
    names = [base_name(o) + LOG_SUFFIX for o in offsets]
    assert sorted(names) == names
    assert names[0] == "00000000000000000000.log"
    assert [parse_base_offset(n, LOG_SUFFIX) for n in names] == offsets
    assert segment_path(tmp_path, 42, ".index").name == "00000000000000000042.index"


def test_parse_rejects_other_names():
    for name in ["0.log", "0000000000000000000a.log", "00000000000000000000.index",
                 "00000000000000000000.log.tmp", "٠٠٠٠٠٠٠٠٠٠٠٠٠٠٠٠٠٠٠٠.log"]:
        assert parse_base_offset(name, ".log") is None
