"""The topic registry: keys to topics and partitions, lifecycle, persistence."""

from __future__ import annotations

import json

import types
from contextlib import contextmanager

import pytest

from cluster import topics
from cluster.topics import TopicError, TopicRegistry, split_partition_key
from storage.errors import StorageError
from storage.streams.ids import StreamId


@contextmanager
def refused(code: str, **fields):
    """The block raises ``TopicError`` with ``code`` (and these fields)."""
    with pytest.raises(TopicError) as info:
        yield
    assert info.value.code == code
    assert {k: info.value.fields[k] for k in fields} == fields


def test_split_partition_key():
    assert split_partition_key(b"orders") == (b"orders", None)
    assert split_partition_key(b"orders#3") == (b"orders", 3)
    assert split_partition_key(b"orders#0") == (b"orders", 0)
    assert split_partition_key(b"a#b") == (b"a#b", None)
    assert split_partition_key(b"a#1#2") == (b"a#1", 2)
    assert split_partition_key(b"#x") == (b"#x", None)
    for bad in (b"orders#01", b"#3", b"t#1234567890"):
        with refused(topics.BAD_PARTITION_KEY, key=bad):
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
    with refused(topics.PARTITION_OUT_OF_RANGE, partition=1, topic=b"s", partitions=1):
        registry.get(b"s#1")
    with refused(topics.NEW_TOPIC_PARTITION_OUT_OF_RANGE, partition=2, partitions=1):
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


def test_a_topic_meta_nested_too_deep_for_the_parser_is_unreadable(tmp_path):
    """JSON nested deeper than the parser goes (json raises RecursionError):
    a ValueError like any other garbage, for a blob from a peer
    (``adopt_topic``'s callers turn those down), and on disk the server
    refuses to start naming the file."""
    nested = b"[" * 100000
    with pytest.raises(ValueError):
        topics.TopicMeta.from_bytes(nested)
    config = types.SimpleNamespace()
    reg = TopicRegistry.open(tmp_path / "d", config)
    reg.get_or_create(b"t")
    with pytest.raises(ValueError):
        reg.adopt_topic(b"u", nested)
    path = reg.log_manager.topic_dir(b"t") / "topic.meta"
    reg.close()
    path.write_bytes(nested)
    with pytest.raises(topics.TopicMetaError, match=f"unreadable topic metadata {path}"):
        TopicRegistry.open(tmp_path / "d", config)


@pytest.mark.parametrize("blob", [b"[]", b"null", b"7", b'{"config": []}', b'{"config": "x"}',
                                  b'{"id": 5}', b'{"id": null}', b'{"id": ["x"]}'])
def test_a_topic_meta_that_is_not_an_object_is_a_value_error(registry, blob):
    """A ``topic.meta`` (from disk, or a peer's in a committed topic record)
    that is JSON but not an object, or whose config is not one, or whose
    topic id is not a string (never coerced into one): a ValueError,
    which ``adopt_topic``'s callers turn down, not an AttributeError (which
    the metadata driver takes for a bug and stops the node on)."""
    with pytest.raises(ValueError):
        topics.TopicMeta.from_bytes(blob)
    with pytest.raises(ValueError):
        registry.adopt_topic(b"u", blob)
    assert not registry.exists(b"u")


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


def test_rename_moves_a_topic_with_its_config_and_id_and_replaces_the_target(registry):
    registry.create_topic(b"a", 2, [(b"retention-ms", b"60000")])
    registry.get_or_create(b"a#1").add([b"f", b"v"])
    registry.get_or_create(b"b").add([b"f", b"old"])
    topic_id = registry.topic_id(b"a")
    changed = []
    registry.on_change = changed.append
    assert registry.rename_target(b"a", b"b") == (b"a", b"b")
    registry.rename(b"a", b"b")
    assert sorted(registry.keys()) == [b"b"] and registry.partitions_of(b"b") == 2
    assert registry.get(b"b#1").length == 1 and registry.config_value(b"b", "retention-ms") == 60000
    assert registry.topic_id(b"b") == topic_id
    # Replication hears: the old b is gone, b is a's topic, a is gone.
    assert changed == [b"b", b"b", b"a"]
    with refused(topics.RENAME_PARTITION):
        registry.rename_target(b"b#1", b"c")
    with refused(topics.RENAME_TO_PARTITION):
        registry.rename_target(b"b", b"c#0")
    registry.close()
    reopened = TopicRegistry.open(registry.log_manager.data_dir)
    assert sorted(reopened.keys()) == [b"b"] and reopened.get(b"b#1").length == 1
    reopened.close()


def test_a_follower_renames_its_copy_when_it_adopts_the_new_name(registry):
    registry.get_or_create(b"a").add([b"f", b"v"])
    blob = registry.topic_meta_blob(b"a")  # the leader's topic.meta under its new name: same ID
    registry.adopt_topic(b"z", blob)
    assert sorted(registry.keys()) == [b"z"] and registry.get(b"z").length == 1


def test_a_leaders_config_value_that_topic_alter_refuses_is_ignored_when_adopted(registry, caplog):
    """A peer's topic.meta is read by the rule a topic.meta on disk is:
    a config value TOPIC ALTER refuses (not a number, out of range) is
    ignored with a warning and the server's value applies, instead of
    being taken as it is and failing where it is used."""
    registry.create_topic(b"a", 1, [(b"retention-ms", b"60000")])
    meta = json.loads(registry.topic_meta_blob(b"a"))
    meta["config"] = {"retention-ms": [1], "segment-bytes": -5, "max-entry-bytes": 10}
    with caplog.at_level("WARNING", logger="partita.topics"):
        registry.adopt_topic(b"a", json.dumps(meta).encode())
    assert registry.config_value(b"a", "retention-ms") == registry.config_value(b"zz", "retention-ms")
    assert registry.config_value(b"a", "max-entry-bytes") == 10  # (a good value of the same blob applies)
    assert "topic 'a' has retention-ms [1], a value TOPIC ALTER refuses: ignored" in caplog.text
    assert "topic 'a' has segment-bytes -5, a value TOPIC ALTER refuses: ignored" in caplog.text
    registry.log_config_for(b"a")  # builds: nothing of the refused values is left


# ------------------------------------------------------- multi-partition topics


def _cfg(**kw):
    base = dict(segment_bytes=4096, stream_node_max_entries=100, default_partitions=1)
    base.update(kw)
    return types.SimpleNamespace(**base)


def test_default_partitions_for_auto_created_topics(tmp_path):
    reg = TopicRegistry.open(tmp_path / "d", _cfg(default_partitions=3))
    try:
        stream, pkey = reg.append_target(b"orders", [b"a", b"1"])
        assert reg.partition_count(b"orders") == 3 and pkey == b"orders#0"
        assert reg.is_multi(b"orders") and not reg.is_multi(b"orders#1")
        assert reg.expand(b"orders") == [b"orders#0", b"orders#1", b"orders#2"]
        assert reg.expand(b"other") == [b"other"]
        with refused(topics.NEEDS_PARTITION_KEY, topic=b"orders", partitions=3):
            reg.get(b"orders")
        assert reg.get(b"orders#2") is not None
    finally:
        reg.close()


def test_create_alter_describe_delete(registry):
    registry.create_topic(b"t", 2, [(b"retention-ms", b"60000"), (b"SEGMENT-BYTES", b"64kb")])
    with refused(topics.TOPIC_EXISTS, topic=b"t"):
        registry.create_topic(b"t", 2)
    with refused(topics.TOPIC_NAME_HAS_HASH, topic=b"a#b"):
        registry.create_topic(b"a#b", 1)
    with refused(topics.BAD_PARTITION_COUNT, partitions=0):
        registry.create_topic(b"z", 0)
    with refused(topics.UNKNOWN_CONFIG, name=b"nope"):
        registry.create_topic(b"z", 1, [(b"nope", b"1")])
    with refused(topics.CONFIG_NOT_ONE_OF, name="fsync", value="sometimes"):
        registry.create_topic(b"z", 1, [(b"fsync", b"sometimes")])
    with refused(topics.CONFIG_OUT_OF_RANGE, name="segment-bytes", value="12"):
        registry.create_topic(b"z", 1, [(b"segment-bytes", b"12")])
    assert not registry.exists(b"z")

    assert registry.config_value(b"t", "retention-ms") == 60000
    assert registry.config_value(b"t", "segment-bytes") == 65536
    assert registry.config_value(b"t", "retention-bytes") == -1  # builtin default
    assert registry.log_config_for(b"t").segment_bytes == 65536
    with refused(topics.PARTITIONS_ONLY_GROW, topic=b"t", partitions=2):
        registry.alter_partitions(b"t", 1)
    assert registry.alter_partitions(b"t", 4) == [2, 3]
    registry.alter_config(b"t", [(b"retention-ms", b"default"), (b"max-entry-bytes", b"10")])
    assert registry.config_value(b"t", "retention-ms") == -1
    assert registry.max_entry_bytes(b"t") == 10
    desc = registry.describe(b"t")
    assert [p["key"] for p in desc["partitions"]] == [b"t#0", b"t#1", b"t#2", b"t#3"]
    assert desc["config"]["max-entry-bytes"] == (10, True)
    with refused(topics.UNKNOWN_TOPIC, topic=b"missing"):
        registry.alter_partitions(b"missing", 2)
    assert registry.delete(b"t")
    assert not registry.exists(b"t")


def test_topic_config_and_partitions_survive_reopen(tmp_path):
    reg = TopicRegistry.open(tmp_path / "d", _cfg())
    reg.create_topic(b"t", 3, [(b"fsync", b"always"), (b"partition-key-field", b"user")])
    stream, pkey = reg.append_target(b"t", [b"user", b"alice"])
    stream.add([b"user", b"alice"])
    reg.close()
    reg = TopicRegistry.open(tmp_path / "d", _cfg())
    try:
        assert reg.partition_count(b"t") == 3
        assert reg.config_value(b"t", "fsync") == "always"
        again, pkey2 = reg.append_target(b"t", [b"user", b"alice"])
        assert pkey2 == pkey and again.length == 1
        # The durability layer learns the topic's policy from the log or group store.
        assert reg.fsync_policy_of(again.log) == "always"
        assert reg.fsync_policy_of(types.SimpleNamespace(directory=tmp_path / "x" / "y")) is None
    finally:
        reg.close()


def test_altered_log_config_reaches_open_logs(registry):
    registry.create_topic(b"t", 1)
    stream = registry.get(b"t")
    registry.alter_config(b"t", [(b"segment-bytes", b"2048"), (b"retention-bytes", b"5000")])
    assert stream.log.config.segment_bytes == 2048 and stream.log.config.retention_bytes == 5000
    registry.config.segment_bytes = 8192  # a CONFIG SET of the server default
    registry.alter_config(b"t", [(b"segment-bytes", b"default")])
    assert stream.log.config.segment_bytes == 8192


def test_retention_by_bytes_deletes_old_segments(registry, caplog):
    registry.create_topic(b"t", 2, [(b"segment-bytes", b"1024"), (b"retention-bytes", b"3000")])
    for i in range(200):
        stream, _ = registry.append_target(b"t", [b"n", b"%d" % i])
        stream.add([b"n", b"%d" % i])
    before = [registry.get(b"t#%d" % n).log.size_bytes for n in range(2)]
    assert all(b > 6000 for b in before)
    with caplog.at_level("INFO", logger="partita.topics"):
        actions = registry.apply_retention(now_ms=0)
    assert actions and {a.partition for a in actions} == {0, 1}
    for n in range(2):
        log = registry.get(b"t#%d" % n).log
        assert 3000 <= log.size_bytes < 3000 + 1024 and log.log_start_offset > 0
    assert sum("Retention: deleted segment" in r.message for r in caplog.records) == len(actions)
    assert registry.stats.retention_segments_deleted == len(actions)
    # Nothing left to delete: a second pass is a no-op.
    assert registry.apply_retention(now_ms=0) == []


def test_retention_by_time(registry):
    registry.create_topic(b"t", 1, [(b"retention-ms", b"1000"), (b"segment-bytes", b"1024")])
    stream = registry.get(b"t")
    for i in range(60):
        stream.add([b"n", b"%d" % i], id_given=StreamId(1000 + i, 0))
    segments = stream.log.segment_count
    assert segments > 2
    # Entry IDs (and batch timestamps) are wall-clock now; far in the future everything is old,
    # but the active segment is never deleted.
    actions = registry.apply_retention(now_ms=2**62)
    assert len(actions) >= segments - 1
    assert stream.length < 60 and stream.last_id == (1059, 0)


def test_sibling_keys(registry):
    assert registry.sibling_keys(b"t", b"t#2") == [b"t#2"]
    assert registry.sibling_keys(b"t#2", b"t#2") == [b"t"]


def test_logs_under_fsync_always_write_zeros_ahead(tmp_path):
    """Preallocation follows the effective fsync policy: the server's, or a
    topic's own, and changes with either (``refresh_log_configs``)."""
    from cluster.topics import PREALLOCATE_BYTES_ALWAYS

    config = types.SimpleNamespace(segment_bytes=4096, stream_node_max_entries=100, fsync="everysec")
    reg = TopicRegistry.open(tmp_path / "data", config)
    try:
        reg.create_topic(b"plain", 1)
        reg.create_topic(b"safe", 1, [(b"fsync", b"always")])
        plain, safe = reg.get_or_create(b"plain"), reg.get_or_create(b"safe")
        assert plain.log.config.preallocate_bytes == 0
        assert safe.log.config.preallocate_bytes == PREALLOCATE_BYTES_ALWAYS > 0
        config.fsync = "always"  # CONFIG SET fsync always
        reg.refresh_log_configs()
        assert plain.log.config.preallocate_bytes == PREALLOCATE_BYTES_ALWAYS
        reg.alter_config(b"safe", [(b"fsync", b"no")])
        assert safe.log.config.preallocate_bytes == 0
    finally:
        reg.close()


def test_run_target_is_the_sticky_partitioners_choice(registry):
    """A pipelined run of keyless XADDs to a topic of several partitions
    goes to the partition the round-robin counter points at; the counter
    moves on only when the run is taken (``took_run``)."""
    registry.create_topic(b"t", 3)
    first = registry.run_target(b"t")
    assert first[1] == b"t#0" and first[0] is registry.get(b"t#0")
    assert first[2] == [b"t#0"]  # readers of the partition key wake too; the topic key is the one written
    assert registry.run_target(b"t")[1] == b"t#0"  # not taken: the counter stays
    registry.took_run(b"t")
    assert registry.run_target(b"t")[1] == b"t#1"
    registry.took_run(b"t")
    # The per-entry choice shares the counter.
    assert registry.append_target(b"t", [b"f", b"v"])[1] == b"t#2"
    assert registry.run_target(b"t")[1] == b"t#0"
    # Nothing to choose (or the general path's error to give): None.
    registry.create_topic(b"one", 1)
    registry.create_topic(b"keyed", 4, [(b"partition-key-field", b"user")])
    for key in (b"t#1", b"one", b"keyed", b"missing", b"t#9", b"t#01"):
        assert registry.run_target(key) is None, key


def _fail_epoch_checkpoint(stream) -> None:
    """The partition's next leader-epoch checkpoint write fails (EISDIR)."""
    (stream.log.directory / "leader-epoch.checkpoint.tmp").mkdir()


def test_a_refused_first_xadd_leaves_no_topic(registry):
    """An XADD answered with an error leaves no key (as in Redis), also on
    disk; it used to leave an empty stream (EXISTS 1, XLEN 0)."""
    stream, _ = registry.append_target(b"k", [b"f", b"v"])
    _fail_epoch_checkpoint(stream)
    with pytest.raises(StorageError):
        stream.add([b"f", b"v"])
    assert not registry.exists(b"k") and registry.key_count() == 0
    assert not registry.log_manager.topic_dir(b"k").exists()
    stream, _ = registry.append_target(b"k", [b"f", b"v"])  # a later XADD creates it afresh
    assert stream.add([b"f", b"v"]) and registry.get(b"k").length == 1


def test_a_refused_xadd_keeps_a_topic_that_holds_anything(registry):
    registry.create_topic(b"created", 1)
    stream = registry.get(b"created")
    _fail_epoch_checkpoint(stream)
    with pytest.raises(StorageError):
        stream.add([b"f", b"v"])
    assert registry.exists(b"created")  # TOPIC CREATE made it, not the refused XADD

    stream, _ = registry.append_target(b"written", [b"f", b"v"])
    stream.add([b"f", b"v"])
    stream.log.truncate_to(0)
    _fail_epoch_checkpoint(stream)
    with pytest.raises(StorageError):
        stream.add([b"f", b"v"])
    assert registry.exists(b"written")  # an XADD was answered with an ID before


def test_refused_deferred_first_xadds_to_a_new_topic_of_two_partitions(tmp_path):
    config = types.SimpleNamespace(segment_bytes=4096, stream_node_max_entries=100, default_partitions=2)
    registry = TopicRegistry.open(tmp_path / "data", config)
    try:
        for fail_both, key in ((False, b"t"), (True, b"u")):
            streams = [registry.append_target(key, [b"f", b"v"])[0] for _ in range(2)]
            assert streams[0] is not streams[1]  # round-robin: one entry for each partition
            for s in streams:
                s.add([b"f", b"v"], defer=True)
            for s in streams[: 2 if fail_both else 1]:
                _fail_epoch_checkpoint(s)
            outcomes = []
            for s in streams:  # as server/appends.py commits a round
                try:
                    outcomes.append(s.commit())
                except StorageError:
                    outcomes.append("refused")
            assert outcomes == (["refused", "refused"] if fail_both else ["refused", 1])
            assert registry.exists(key) is not fail_both
    finally:
        registry.close()
