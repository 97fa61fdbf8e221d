import os

import pytest

from storage.log import LogConfig
from storage.log_manager import LogManager, decode_topic, encode_topic
from tests.storage.helpers import entries

KEYS = [b"orders", b"", b"A/../\x00\xff", b"%41", b"t.x", b"y" * 1000, "é".encode()]


@pytest.mark.parametrize("key", KEYS)
def test_topic_names_are_reversible(key):
    name = encode_topic(key)
    assert len(name) < 255 and "/" not in name and name not in (".", "..")
    if name.startswith("t."):
        assert decode_topic(name) == key


def test_topic_names_do_not_collide():
    names = {encode_topic(k) for k in KEYS + [b"ORDERS", b"Orders"]}
    assert len(names) == len(KEYS) + 2
    assert len({n.lower() for n in names}) == len(names)


@pytest.mark.parametrize("name", ["t.%ZZ", "t.%4", "t.Upper", "t.%61", "t.\u0100", "h.x", "x"])
def test_names_no_key_is_written_as_decode_to_none(name):
    assert decode_topic(name) is None


def test_stray_entries_are_skipped_with_a_warning(tmp_path, caplog):
    lm = LogManager(tmp_path)
    lm.partition(b"a", 0).append(entries(1, 1))
    lm.close()
    topics = tmp_path / "topics"
    (topics / "t.b").write_bytes(b"a file")
    (topics / "t.Bad").mkdir()
    (topics / ("h." + "0" * 64)).mkdir()
    (topics / "t.a" / "partition-01").mkdir()
    (topics / "t.a" / "partition-2").write_bytes(b"")
    lm = LogManager(tmp_path)
    with caplog.at_level("WARNING", logger="partita.storage"):
        assert lm.topics() == [b"a"]
        assert lm.partitions_on_disk(b"a") == [0]
    for name, why in [("t.b", "not a directory"), ("t.Bad", "not a topic directory name"),
                      ("h." + "0" * 64, "no readable topic.key"),
                      ("t.a/partition-01", "not a partition directory name"),
                      ("t.a/partition-2", "not a directory")]:
        assert f"{topics / name}: {why}: skipped" in caplog.text
    lm.close()


def test_partitions_meta_and_reopen(tmp_path):
    lm = LogManager(tmp_path, default_config=LogConfig(segment_bytes=4096))
    for key in KEYS:
        for n in range(2):
            lm.partition(key, n).append(entries(1, 3, key[:10]))
        lm.write_topic_meta(key, b"meta:" + key)
    assert lm.partition(KEYS[0], 0) is lm.partition(KEYS[0], 0)
    assert sorted(lm.topics()) == sorted(KEYS)
    lm.close()
    lm = LogManager(tmp_path)
    assert lm.open_partitions() == []  # lazy
    assert sorted(lm.topics()) == sorted(KEYS)
    for key in KEYS:
        assert lm.read_topic_meta(key) == b"meta:" + key
        assert lm.partitions_on_disk(key) == [0, 1]
        assert lm.partition(key, 1).log_end_offset == 3
    assert len(lm.open_partitions()) == len(KEYS)
    lm.close()


def test_delete_topic(tmp_path):
    lm = LogManager(tmp_path)
    lm.partition(b"a", 0).append(entries(1, 1))
    lm.partition(b"b", 0).append(entries(1, 1))
    lm.delete_topic(b"a")
    assert lm.topics() == [b"b"]
    assert lm.read_topic_meta(b"a") is None
    assert lm.partition(b"a", 0).log_end_offset == 0  # recreated empty
    lm.close()


def test_many_partitions_bounded_fds(tmp_path):
    lm = LogManager(tmp_path, max_open_files=16)
    for i in range(200):
        lm.partition(b"t%d" % i, 0).append(entries(1, 2))
    assert len(lm.cache) <= 16
    for i in range(200):
        assert lm.partition(b"t%d" % i, 0).read(0).count == 2
    assert len(lm.cache) <= 16
    lm.close()
    fds = len(os.listdir("/proc/self/fd"))
    lm = LogManager(tmp_path, max_open_files=16)
    assert len(lm.topics()) == 200
    for i in range(200):
        assert lm.partition(b"t%d" % i, 0).log_end_offset == 2
    assert len(os.listdir("/proc/self/fd")) <= fds + 16
    lm.close()
