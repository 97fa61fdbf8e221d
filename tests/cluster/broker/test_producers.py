"""Idempotent appends in the broker (cluster/broker/producers.py): XADD IDMP /
IDMPAUTO and XCFGSET, and the Kafka idempotent producer's batches
(``append_records`` with a ``ProducerBatch``) and producer ids, on a real
topic registry with a fake clock."""

from __future__ import annotations

import types

import pytest

from cluster.broker import (
    FENCED,
    OUT_OF_ORDER,
    RECORD_BATCH_MAX_BYTES,
    Broker,
    Idempotence,
    ProducerBatch,
    ProducerRefused,
    Trim,
    XAddPlan,
)
from cluster.topics import TopicError, TopicRegistry
from storage.entry_codec import decode_entry, split_entries
from storage.streams import StreamId
from tests.cluster.broker.conftest import append


class Clock:
    def __init__(self, now_ms: int = 1_700_000_000_000) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


class RecordingDurability:
    def __init__(self) -> None:
        self.noted: list = []

    def note_write(self, log, policy: str) -> int:
        self.noted.append(log)
        return len(self.noted) if policy == "always" else 0


def idmp(session, key: bytes, pid: bytes, iid: bytes | None, *fields: bytes, **kw):
    return session.append(XAddPlan(key, list(fields or (b"f", b"v")), idmp=Idempotence(pid, iid), **kw))


def info(session, key: bytes = b"s"):
    return session.stream_info(key).idmp


# -- XADD IDMP / IDMPAUTO -------------------------------------------------------------


def test_a_retry_answers_the_original_id_and_writes_nothing(make_broker):
    session = make_broker(clock_ms=Clock()).session()
    first = idmp(session, b"s", b"p1", b"payment-abc", b"amount", b"100")
    again = idmp(session, b"s", b"p1", b"payment-abc", b"amount", b"200")
    assert again == first
    assert session.length(b"s") == 1
    found = session.range(b"s", StreamId(0, 0), StreamId(2**64 - 1, 2**64 - 1), None, False)
    assert [decode_entry(e) for e in split_entries(found.chunks)] == [(first, [b"amount", b"100"])]
    got = info(session)
    assert (got.pids_tracked, got.iids_tracked, got.iids_added, got.iids_duplicates) == (1, 1, 1, 1)
    assert (got.duration_s, got.maxsize) == (100, 100)


def test_a_duplicate_reply_waits_for_the_originals_durability(make_broker):
    broker = make_broker(clock_ms=Clock(), fsync="always")
    broker.durability = RecordingDurability()
    writer, retrier = broker.session(), broker.session()
    writer.may_defer = retrier.may_defer = True
    idmp(writer, b"s", b"p", b"i")
    assert writer.deferred is None  # never deferred: the record is in the entry's batch
    assert idmp(retrier, b"s", b"p", b"i") is not None
    assert retrier.take_receipt().flush_seq  # the retry's reply waits as the original's does


def test_producers_and_ids_are_separate_and_idmpauto_ignores_the_pairs_order(make_broker):
    session = make_broker(clock_ms=Clock()).session()
    a = idmp(session, b"s", b"p1", b"req")
    b = idmp(session, b"s", b"p2", b"req")
    c = idmp(session, b"s", b"p1", None, b"x", b"1", b"y", b"2")
    assert len({a, b, c}) == 3
    assert idmp(session, b"s", b"p1", None, b"y", b"2", b"x", b"1") == c
    assert idmp(session, b"s", b"p2", None, b"y", b"2", b"x", b"1") != c  # another producer
    assert idmp(session, b"s", b"p1", None, b"x", b"1", b"y", b"3") != c
    assert session.length(b"s") == 5
    assert info(session).pids_tracked == 2


def test_a_duplicate_is_not_trimmed_and_nomkstream_creates_nothing(make_broker):
    session = make_broker(clock_ms=Clock()).session()
    assert idmp(session, b"s", b"p", b"i", nomkstream=True) is None
    assert not session.exists(b"s")
    first = idmp(session, b"s", b"p", b"i")
    idmp(session, b"s", b"p", b"j")
    assert idmp(session, b"s", b"p", b"i", trim=Trim("MAXLEN", maxlen=0)) == first
    assert session.length(b"s") == 2  # a duplicate writes nothing, trims nothing


def test_maxsize_keeps_the_newest_ids_of_each_producer(make_broker):
    session = make_broker(clock_ms=Clock()).session()
    idmp(session, b"s", b"p1", b"init")
    assert session.configure_idempotence(b"s", 60, 3)
    ids = {(pid, i): idmp(session, b"s", pid, b"req-%d" % i) for pid in (b"p1", b"p2") for i in range(1, 5)}
    for pid in (b"p1", b"p2"):
        assert idmp(session, b"s", pid, b"req-1") != ids[(pid, 1)]  # evicted
        assert idmp(session, b"s", pid, b"req-4") == ids[(pid, 4)]
    got = info(session)
    assert (got.pids_tracked, got.iids_tracked, got.maxsize, got.duration_s) == (2, 6, 3, 60)


def test_duration_forgets_ids_once_it_elapsed(make_broker):
    clock = Clock()
    session = make_broker(clock_ms=clock).session()
    idmp(session, b"s", b"p", b"warm-up")
    assert session.configure_idempotence(b"s", 2, None)
    first = idmp(session, b"s", b"p", b"i")
    clock.now_ms += 1_999
    assert idmp(session, b"s", b"p", b"i") == first
    clock.now_ms += 1
    assert idmp(session, b"s", b"p", b"i") != first
    assert info(session).iids_tracked == 1


def test_xcfgset_forgets_the_ids_only_when_a_value_changes(make_broker):
    session = make_broker(clock_ms=Clock(), stream_idmp_duration=100, stream_idmp_maxsize=100).session()
    first = idmp(session, b"s", b"p", b"i")
    assert session.configure_idempotence(b"s", 100, 100)  # the defaults again: nothing forgotten
    assert idmp(session, b"s", b"p", b"i") == first
    assert session.configure_idempotence(b"s", 50, None)
    assert info(session).iids_tracked == 0
    second = idmp(session, b"s", b"p", b"i")
    assert second != first
    assert idmp(session, b"s", b"p", b"i") == second
    got = info(session)
    assert (got.iids_added, got.iids_duplicates, got.duration_s, got.maxsize) == (2, 2, 50, 100)
    assert not session.configure_idempotence(b"missing", 5, None)


def test_the_server_defaults_apply_where_xcfgset_set_nothing(make_broker):
    session = make_broker(clock_ms=Clock(), stream_idmp_duration=7, stream_idmp_maxsize=2).session()
    for i in range(3):
        idmp(session, b"s", b"p", b"%d" % i)
    got = info(session)
    assert (got.duration_s, got.maxsize, got.iids_tracked) == (7, 2, 2)


def test_on_a_topic_key_a_producer_goes_to_one_partition(make_broker):
    session = make_broker(clock_ms=Clock(), default_partitions=4).session()
    session.append(XAddPlan(b"t", [b"f", b"v"]))  # creates the topic
    first = {pid: idmp(session, b"t", pid, b"req") for pid in (b"a", b"b", b"c", b"d", b"e")}
    for pid, entry_id in first.items():
        assert idmp(session, b"t", pid, b"req") == entry_id  # round-robin would have moved it
    assert session.length(b"t") == 6
    assert session.configure_idempotence(b"t", 9, None)
    assert {session.stream_info(b"t#%d" % n).idmp.duration_s for n in range(4)} == {9}


def test_the_ids_survive_a_restart(tmp_path):
    config = types.SimpleNamespace(segment_bytes=1 << 20, stream_node_max_entries=100, fsync="everysec",
                                   max_blocked_clients=0, default_partitions=1, group_session_timeout_ms=10_000)
    registry = TopicRegistry.open(tmp_path / "data", config)
    session = Broker(registry, config).session()
    first = idmp(session, b"s", b"p", b"i")
    session.configure_idempotence(b"s", None, 50)
    second = idmp(session, b"s", b"p", b"i")
    idmp(session, b"s", b"p", b"i")
    registry.close()
    registry = TopicRegistry.open(tmp_path / "data", config)
    session = Broker(registry, config).session()
    assert idmp(session, b"s", b"p", b"i") == second != first
    got = info(session)
    assert (got.maxsize, got.iids_added, got.iids_duplicates) == (50, 2, 2)
    registry.close()


# -- Kafka's idempotent producer -----------------------------------------------------


def produce(session, pid: int, epoch: int, seq: int, n: int = 1, tag: bytes = b"v", topic: bytes = b"t"):
    """A batch of ``n`` records of producer ``pid`` at ``epoch`` from sequence ``seq``."""
    return append(session, topic, 0, [tag] * n, producer=ProducerBatch(pid, epoch, seq))


def refusal(session, *args, **kw) -> str:
    """What ``produce`` refuses (nothing written)."""
    with pytest.raises(ProducerRefused) as refused:
        produce(session, *args, **kw)
    return refused.value.outcome


def restartable(tmp_path, node_id: int = 0, clock_ms=None):
    """A broker over ``tmp_path / "data"``, made again by each call (a restart)."""
    config = types.SimpleNamespace(segment_bytes=1 << 20, stream_node_max_entries=100, fsync="everysec",
                                   max_blocked_clients=0, default_partitions=1, group_session_timeout_ms=10_000,
                                   node_id=node_id)
    registry = TopicRegistry.open(tmp_path / "data", config)
    broker = Broker(registry, config) if clock_ms is None else Broker(registry, config, clock_ms=clock_ms)
    return registry, broker.session()


def test_produce_accepts_in_sequence_and_answers_a_retry_with_the_original_offsets(make_broker):
    clock = Clock()
    session = make_broker(clock_ms=clock).session()
    session.append(XAddPlan(b"t", [b"f", b"v"]))
    first = produce(session, 7, 0, 0, 3)
    assert (first.base_offset, first.duplicate) == (1, False)
    second = produce(session, 7, 0, 3, 2)
    assert (second.base_offset, second.duplicate) == (4, False)
    clock.now_ms += 1000
    again = produce(session, 7, 0, 0, 3, b"other")
    assert again == first._replace(duplicate=True)  # the original's offsets and append time
    assert session.length(b"t") == 6
    assert session.describe_topic(b"t")["partitions"][0]["log-end-offset"] == 6


def test_produce_refuses_gaps_old_epochs_and_a_new_epoch_not_at_zero(make_broker):
    session = make_broker(clock_ms=Clock()).session()
    session.append(XAddPlan(b"t", [b"f", b"v"]))
    assert not produce(session, 1, 3, 10, 2).duplicate  # an unknown producer starts anywhere
    assert refusal(session, 1, 3, 13) == OUT_OF_ORDER  # 12 expected
    assert refusal(session, 1, 3, 11) == OUT_OF_ORDER  # inside the last batch
    assert refusal(session, 1, 2, 12) == FENCED
    assert refusal(session, 1, 4, 5) == OUT_OF_ORDER
    produce(session, 1, 4, 0)
    assert refusal(session, 1, 3, 12) == FENCED  # the old epoch is fenced now
    assert refusal(session, 1, 3, 10, 2) == FENCED  # ... and so are its retries
    assert session.length(b"t") == 4


def test_a_refusal_says_what_was_expected(make_broker):
    session = make_broker(clock_ms=Clock()).session()
    session.create_topic(b"t")
    produce(session, 1, 0, 0, 2)
    with pytest.raises(ProducerRefused) as refused:
        produce(session, 1, 0, 5)
    assert str(refused.value) == ("out of order sequence number 5 for producer 1 at epoch 0 on partition t#0: "
                                  "2 expected")


def test_produce_remembers_the_last_five_batches(make_broker):
    session = make_broker(clock_ms=Clock()).session()
    session.append(XAddPlan(b"t", [b"f", b"v"]))
    offsets = [produce(session, 9, 0, n).base_offset for n in range(6)]
    for n in range(1, 6):
        got = produce(session, 9, 0, n)
        assert (got.duplicate, got.base_offset) == (True, offsets[n])
    assert refusal(session, 9, 0, 0) == OUT_OF_ORDER  # out of the window
    assert not produce(session, 9, 0, 6).duplicate


def test_produce_sequences_wrap(make_broker):
    session = make_broker(clock_ms=Clock()).session()
    session.append(XAddPlan(b"t", [b"f", b"v"]))
    produce(session, 5, 0, 2**31 - 2, 2)
    assert not produce(session, 5, 0, 0).duplicate


def test_a_produce_duplicate_waits_for_the_originals_durability(make_broker):
    broker = make_broker(clock_ms=Clock(), fsync="always")
    broker.durability = RecordingDurability()
    session = broker.session()
    session.append(XAddPlan(b"t", [b"f", b"v"]))
    produce(session, 5, 0, 0)
    session.take_receipt()
    assert produce(session, 5, 0, 0).duplicate
    assert session.take_receipt().flush_seq


def test_produce_needs_an_existing_partition(make_broker):
    session = make_broker(clock_ms=Clock()).session()
    with pytest.raises(TopicError):
        produce(session, 5, 0, 0, topic=b"missing")


def test_a_large_batch_is_deduplicated_whole(make_broker):
    # An idempotent batch is one log batch whatever its size (its producer
    # record covers all of it), where a plain one is split every
    # RECORD_BATCH_MAX_BYTES.
    session = make_broker(clock_ms=Clock()).session()
    session.create_topic(b"t")
    n = 3 * RECORD_BATCH_MAX_BYTES // 1000
    first = produce(session, 3, 0, 0, n, b"x" * 1000)
    again = produce(session, 3, 0, 0, n, b"x" * 1000)
    assert again == first._replace(duplicate=True)
    assert session.length(b"t") == n


def test_kafka_producers_and_idmp_share_a_partitions_table(make_broker):
    # XADD IDMP and a Kafka producer deduplicate on the same partition, each
    # by its own kind of record; XCFGSET forgets IDMP's ids, not Kafka's
    # sequences, and XINFO's idempotence fields count IDMP producers only.
    session = make_broker(clock_ms=Clock()).session()
    session.create_topic(b"t")
    entry = idmp(session, b"t", b"p", b"i")
    kafka = produce(session, 1, 0, 0, 2)
    assert idmp(session, b"t", b"p", b"i") == entry
    assert produce(session, 1, 0, 0, 2).duplicate
    assert info(session, b"t").pids_tracked == 1
    assert session.configure_idempotence(b"t", 50, None)
    assert idmp(session, b"t", b"p", b"i") != entry
    assert produce(session, 1, 0, 0, 2) == kafka._replace(duplicate=True)
    assert session.length(b"t") == 4


def test_a_retry_after_a_restart_is_dropped(tmp_path):
    registry, session = restartable(tmp_path)
    session.create_topic(b"t")
    produce(session, 4, 0, 0, 2)
    last = produce(session, 4, 0, 2, 3)
    registry.close()
    registry, session = restartable(tmp_path)
    assert produce(session, 4, 0, 2, 3) == last._replace(duplicate=True)
    assert refusal(session, 4, 0, 9) == OUT_OF_ORDER
    assert produce(session, 4, 0, 5).base_offset == 5
    registry.close()


def test_producer_ids_never_repeat_across_restarts(tmp_path):
    registry, session = restartable(tmp_path, node_id=5)
    ids = [session.new_producer_id() for _ in range(2500)]
    assert len(set(ids)) == len(ids) and ids == sorted(ids)
    assert all(0 <= pid < 2**63 and pid >> 43 == 5 for pid in ids)  # this node's ids only
    registry.close()
    registry, session = restartable(tmp_path, node_id=5)
    assert session.new_producer_id() > ids[-1]
    registry.close()
    registry, other = restartable(tmp_path / "other", node_id=6)
    assert other.new_producer_id() >> 43 == 6
    registry.close()


def test_a_damaged_producer_ids_file_falls_back_on_the_clock(tmp_path, caplog):
    clock = Clock(1_800_000_000_000)
    registry, session = restartable(tmp_path, clock_ms=clock)
    first = []
    for _ in range(3):  # one a millisecond: the clock's floor stays above them
        first.append(session.new_producer_id())
        clock.now_ms += 1
    registry.close()
    (tmp_path / "data" / "producer-ids").write_bytes(b"garbage")
    registry, session = restartable(tmp_path, clock_ms=clock)
    assert session.new_producer_id() > max(first)
    assert "producer ids continue from the clock" in caplog.text
    registry.close()
