"""The topic registry: keys to topics and partitions, lifecycle, persistence."""

from __future__ import annotations

import types

import pytest

from cluster.topics import TopicError, TopicRegistry, split_partition_key
from storage.streams.ids import StreamId


def test_split_partition_key():
    assert split_partition_key(b"orders") == (b"orders", None)
    assert split_partition_key(b"orders#3") == (b"orders", 3)
    assert split_partition_key(b"orders#0") == (b"orders", 0)
    assert split_partition_key(b"a#b") == (b"a#b", None)
    assert split_partition_key(b"a#1#2") == (b"a#1", 2)
    assert split_partition_key(b"#x") == (b"#x", None)
    for bad in (b"orders#01", b"#3", b"t#1234567890"):
        with pytest.raises(TopicError):
            split_partition_key(bad)


@pytest.fixture
def registry(tmp_path):
    config = types.SimpleNamespace(segment_bytes=4096, stream_node_max_entries=100)
    reg = TopicRegistry.open(tmp_path / "data", config)
    yield reg
    reg.close()


def test_get_or_create_and_lookup(registry):
    assert registry.get(b"s") is None
    assert not registry.exists(b"s") and registry.key_count() == 0
    stream = registry.get_or_create(b"s")
    assert registry.get(b"s") is stream and registry.get(b"s#0") is stream
    assert registry.exists(b"s") and registry.exists(b"s#0")
    assert sorted(registry.keys()) == [b"s"] and registry.key_count() == 1
    with pytest.raises(TopicError, match="out of range"):
        registry.get(b"s#1")
    with pytest.raises(TopicError, match="out of range"):
        registry.get_or_create(b"new#2")
    assert registry.get_or_create(b"new#0") is registry.get(b"new")


def test_binary_and_empty_keys(registry):
    keys = [b"", b"a/b", b"..", b"\x00\xff\r\n", b"x" * 300]
    for i, key in enumerate(keys):
        registry.get_or_create(key).add([b"f", b"%d" % i], id_given=StreamId(1, i + 1))
    assert sorted(registry.keys()) == sorted(keys)
    for i, key in enumerate(keys):
        assert registry.get(key).last_id == (1, i + 1)


def test_reopen_keeps_topics_and_stream_state(tmp_path):
    config = types.SimpleNamespace()
    reg = TopicRegistry.open(tmp_path / "d", config)
    s = reg.get_or_create(b"orders")
    s.add([b"a", b"1"], id_given=StreamId(5, 0))
    s.add([b"a", b"2"], id_given=StreamId(6, 0))
    s.delete([StreamId(6, 0)])
    s.set_id(StreamId(9, 0), entries_added=7)
    reg.close()
    reg = TopicRegistry.open(tmp_path / "d", config)
    try:
        s = reg.get(b"orders")
        assert s is not None and s.length == 1
        assert s.last_id == (9, 0) and s.entries_added == 7 and s.max_deleted_entry_id == (6, 0)
    finally:
        reg.close()


def test_delete_removes_files(registry, tmp_path):
    s = registry.get_or_create(b"gone")
    s.add([b"a", b"1"], id_given=StreamId(1, 0))
    topic_dir = registry.log_manager.topic_dir(b"gone")
    assert topic_dir.exists()
    assert registry.delete(b"gone") is True
    assert not topic_dir.exists()
    assert registry.delete(b"gone") is False
    assert registry.get(b"gone") is None
    # A new topic of the same name starts empty.
    assert registry.get_or_create(b"gone").length == 0


def test_flush_all(registry):
    for key in (b"a", b"b", b"c"):
        registry.get_or_create(key)
    assert registry.flush_all() == 3
    assert registry.key_count() == 0 and list(registry.keys()) == []


def test_rename_is_refused_clearly(registry):
    registry.get_or_create(b"a")
    with pytest.raises(TopicError, match="RENAME is not supported"):
        registry.rename(b"a", b"b")
