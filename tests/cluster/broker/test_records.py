"""The broker's partition-and-offset operations (cluster/broker/records.py, ``RecordOps``), on a
real topic registry without sockets: appends as one log batch with IDs from the clock, reads by
offset up to the high watermark, offsets by time through the ID index, layouts, refusals."""

from __future__ import annotations

import types

import pytest
import trio
import trio.testing

from cluster.broker import EntryTooLargeError, Trim, XAddPlan
from cluster.errors import NotEnoughReplicas
from cluster.runtime.replication import Replication
from cluster.topics import PARTITION_OUT_OF_RANGE, UNKNOWN_TOPIC, TopicError
from storage.entry_codec import decode_entry
from storage.errors import OffsetOutOfRangeError
from storage.streams import StreamId
from tests.cluster.broker.conftest import append


def test_an_append_is_one_log_batch_with_ids_from_the_clock(make_broker):
    broker = make_broker()
    session = broker.session()
    session.create_topic(b"t", 2)
    done = append(session, b"t", 1, [b"a", b"b", b"c"])
    assert (done.base_offset, done.log_start_offset) == (0, 0)
    assert session.describe_topic(b"t")["partitions"][1]["log-end-offset"] == 3
    assert session.range(b"t#1", (0, 0), (2**64 - 1, 2**64 - 1)).count == 3
    read = session.read_records(b"t", 1, 0, 1 << 20)
    assert [(o, ms) for o, ms, _ in read.entries] == [(0, done.timestamp_ms), (1, done.timestamp_ms),
                                                       (2, done.timestamp_ms)]
    # the next append's IDs follow (the next ms, or the same one's next sequence numbers)
    again = append(session, b"t", 1, [b"d"])
    assert again.base_offset == 3
    read = session.read_records(b"t", 1, 3, 1 << 20)
    (offset, ms, seq), = read.entries
    assert offset == 3 and (ms, seq) > (done.timestamp_ms, 2) and ms == again.timestamp_ms
    data = b"".join(bytes(c) for c in read.chunks)
    assert decode_entry(data) == ((ms, seq), [b"v", b"d"])


def test_an_append_after_xsetid_below_trimmed_entries_goes_above_them(make_broker):
    # XSETID may go below entries trimmed away (Redis 7.2); the log still
    # holds their IDs, so the records' IDs must exceed them, as XADD *'s do.
    session = make_broker().session()
    future_ms = 10**15  # beyond any wall clock: IDs continue from it
    session.append(XAddPlan(b"t", [b"f", b"v"], id_ms=future_ms, id_seq=0, trim=Trim("MAXLEN", maxlen=0)))
    assert session.set_id(b"t", StreamId(5, 0), None, None)
    done = append(session, b"t", 0, [b"a", b"b"])
    assert (done.base_offset, done.timestamp_ms) == (1, future_ms)
    assert session.append(XAddPlan(b"t", [b"f", b"v"])) == (future_ms, 3)


def test_reads_stop_at_the_end_and_refuse_past_it(make_broker):
    broker = make_broker()
    session = broker.session()
    session.create_topic(b"t")
    append(session, b"t", 0, [b"x" * 100] * 50)
    small = session.read_records(b"t", 0, 10, 300)
    assert 1 <= len(small.entries) < 10 and small.entries[0][0] == 10  # a byte budget, at least one entry
    assert session.read_records(b"t", 0, 50, 1 << 20).entries == []
    with pytest.raises(OffsetOutOfRangeError):
        session.read_records(b"t", 0, 51, 1 << 20)


def test_refusals_name_the_topic_or_partition(make_broker):
    broker = make_broker(max_entry_bytes=10)
    session = broker.session()
    session.create_topic(b"t")
    with pytest.raises(TopicError) as refused:
        append(session, b"nope", 0, [b"x"])
    assert refused.value.code == UNKNOWN_TOPIC
    with pytest.raises(TopicError) as refused:
        append(session, b"t", 1, [b"x"])
    assert refused.value.code == PARTITION_OUT_OF_RANGE
    with pytest.raises(TopicError):
        session.read_records(b"t#0", 0, 0, 10)  # Kafka names topics, never partition keys
    with pytest.raises(EntryTooLargeError):
        append(session, b"t", 0, [b"x" * 20])
    assert session.length(b"t") == 0  # nothing written


def test_offsets_by_time_are_the_id_index(make_broker):
    broker = make_broker()
    session = broker.session()
    for ms in (1000, 2000, 2000, 5000):
        session.append(XAddPlan(b"t", [b"f", b"v"], id_ms=ms))
    assert session.offset_at_time(b"t", 0, 0) == (0, 1000)
    assert session.offset_at_time(b"t", 0, 1001) == (1, 2000)
    assert session.offset_at_time(b"t", 0, 2001) == (3, 5000)
    assert session.offset_at_time(b"t", 0, 5001) is None
    offsets = session.record_offsets(b"t", 0)
    assert (offsets.log_start_offset, offsets.high_watermark, offsets.last_offset, offsets.last_ms) == (0, 4, 3, 5000)
    session.delete(b"t", [(5000, 0)])  # XDEL of the newest: the newest live entry is the one before
    assert session.record_offsets(b"t", 0)[2:] == (2, 2000)


def test_layouts_on_a_single_node(make_broker):
    broker = make_broker()
    session = broker.session()
    session.create_topic(b"t", 3)
    layouts = session.record_topics([b"t", b"missing", b"t#1"])
    assert layouts[b"missing"] is None and layouts[b"t#1"] is None
    assert [(p.leader, p.replicas, p.isr) for p in layouts[b"t"].partitions] == [(0, [0], [0])] * 3
    assert layouts[b"t"].topic_id and session.record_topics() == {b"t": layouts[b"t"]}
    generation = session.topics_generation()
    session.alter_topic_partitions(b"t", 4)
    assert session.topics_generation() != generation


def test_validate_only_checks_change_nothing(make_broker):
    broker = make_broker()
    session = broker.session()
    session.create_topic(b"t")
    for args, code in [((b"t", 1), "topic-exists"), ((b"a#b", 1), "topic-name-has-hash"),
                       ((b"new", 0), "bad-partition-count"),
                       ((b"new", 1, [(b"retention-ms", b"x")]), "config-not-an-integer"),
                       ((b"new", 1, [], [3]), "replication-factor-fixed")]:
        with pytest.raises(TopicError) as refused:
            session.check_new_topic(*args)
        assert refused.value.code == code
    session.check_new_topic(b"new", 2, [(b"retention-ms", b"1000")], [1])
    with pytest.raises(TopicError):
        session.check_topic_growth(b"t", 0)
    with pytest.raises(TopicError):
        session.check_topic_config([(b"segment-bytes", b"1")])
    session.check_topic_config([(b"segment-bytes", b"default")])
    assert session.topic_names() == [b"t"]


async def test_a_waiting_fetch_is_woken_by_an_append(make_broker):
    broker = make_broker()
    session = broker.session()
    session.create_topic(b"t")
    woken = []

    async def wait():
        woken.append(await session.wait_for_records([(b"t", 0)], 30))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait)
        await trio.testing.wait_all_tasks_blocked()
        append(broker.session(), b"t", 0, [b"x"])
    assert woken == [True]
    assert await session.wait_for_records([(b"t", 0)], 0.01) is False


class OneLeaderReplication:
    """A cluster node that leads every partition of an acks 1 topic, with
    ``in_sync`` of its 3 replicas in sync (min-insync-replicas 2)."""

    controller = None

    def __init__(self) -> None:
        self.in_sync = 3
        self.manager = self

    def is_replicated(self) -> bool:
        return True

    def canonical_key(self, topic: bytes, n: int) -> bytes:
        return b"%s#%d" % (topic, n)

    def check_key(self, key: bytes) -> None:
        pass  # led here

    def before_append(self, session, pkey: bytes, stream) -> bool:
        return False  # the topic is acks 1

    note_pending = staticmethod(Replication.note_pending)

    def leader_state(self, topic: bytes, n: int):
        in_sync = self.in_sync
        return types.SimpleNamespace(isr=list(range(in_sync)), min_insync=2, epoch=1,
                                     accepts_acks_all=lambda: in_sync >= 2)


def test_every_acks_all_batch_checks_the_in_sync_replicas(make_broker):
    """A Kafka producer with acks=all on an acks 1 topic: once too few
    replicas are in sync, each batch is refused before anything is written,
    also a second batch to a partition whose first still waits for its
    replicas in the same round (Kafka checks every produce request)."""
    broker = make_broker()
    session = broker.session()
    session.create_topic(b"t", 2)
    broker.replication = OneLeaderReplication()
    append(session, b"t", 0, [b"a"], acks_all=True)
    broker.replication.in_sync = 1
    for n in (0, 1):
        with pytest.raises(NotEnoughReplicas):
            append(session, b"t", n, [b"b"], acks_all=True)
    broker.replication = None
    assert [len(session.read_records(b"t", n, 0, 1 << 20).entries) for n in (0, 1)] == [1, 0]  # the first only
