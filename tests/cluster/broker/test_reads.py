"""The broker's reads (cluster/broker/reads.py) on a real topic registry.

Topic keys of several partitions behind one call (lengths summed, ranges
merged by ID, reads fanned out under partition keys), the read executor's
plans (``one_partition`` declines what is not one partition), deferred
appends seen by every session's reads, and ``Entries`` as the reply type:
views of the log files' mappings from the reads a front-end sends at once,
copies from the blocking read.
"""

from __future__ import annotations

import mmap
import types

import pytest
import trio
from trio.testing import wait_all_tasks_blocked

from cluster import topics
from cluster.broker import AFTER_LAST, LAST_ENTRY, ReadPlan, XAddPlan
from cluster.errors import TryAgain
from cluster.runtime.fanout import FanOut, read_part
from cluster.topics import TopicError
from storage.entry_codec import decode_entry, split_entries
from storage.streams import Entries, StreamId


@pytest.fixture
def broker(make_broker):
    return make_broker()


def add(session, key: bytes, ms: int, seq: int = 0, value: bytes = b"v") -> None:
    session.append(XAddPlan(key, [b"f", value], ms, seq))


def ids(entries: Entries) -> list[tuple[int, int]]:
    return [tuple(decode_entry(e)[0]) for e in split_entries(entries.chunks)]


def mapped(entries: Entries) -> bool:
    """Whether every chunk is a view of a segment file's mapping."""
    return bool(entries.chunks) and all(
        type(c) is memoryview and isinstance(c.obj, mmap.mmap) for c in entries.chunks)


@pytest.fixture
def topic(broker):
    """Topic ``t`` of 3 partitions: t#0 holds 1-0 4-0, t#1 holds 2-0 4-0, t#2 holds 3-0."""
    session = broker.session()
    session.create_topic(b"t", 3)
    for key, ms in ((b"t#0", 1), (b"t#1", 2), (b"t#2", 3), (b"t#0", 4), (b"t#1", 4)):
        add(session, key, ms)
    return session


def test_a_topic_length_is_the_sum_of_its_partitions(broker, topic):
    assert topic.length(b"t") == 5
    assert [topic.length(b"t#%d" % n) for n in range(3)] == [2, 2, 1]
    assert topic.length(b"missing") == 0
    with pytest.raises(TopicError) as info:
        topic.length(b"t#3")
    assert info.value.code == topics.PARTITION_OUT_OF_RANGE


def test_a_topic_range_merges_its_partitions_by_id_equal_ids_in_partition_order(broker, topic):
    lo, hi = StreamId(0, 0), StreamId(2**64 - 1, 2**64 - 1)
    assert ids(topic.range(b"t", lo, hi)) == [(1, 0), (2, 0), (3, 0), (4, 0), (4, 0)]
    assert ids(topic.range(b"t", lo, hi, rev=True)) == [(4, 0), (4, 0), (3, 0), (2, 0), (1, 0)]
    assert ids(topic.range(b"t", lo, hi, count=2)) == [(1, 0), (2, 0)]
    assert ids(topic.range(b"t", StreamId(2, 0), StreamId(3, 0))) == [(2, 0), (3, 0)]
    assert topic.range(b"t", lo, hi, count=0).count == 0
    assert topic.range(b"t", hi, lo).count == 0
    assert topic.range(b"missing", lo, hi) is None


def test_equal_ids_come_in_partition_order_both_ways(broker):
    session = broker.session()
    session.create_topic(b"e", 2)
    add(session, b"e#1", 5, value=b"from-1")
    add(session, b"e#0", 5, value=b"from-0")
    lo, hi = StreamId(0, 0), StreamId(9, 0)

    def values(found):
        return [decode_entry(e)[1][1] for e in split_entries(found.chunks)]

    assert values(session.range(b"e", lo, hi)) == [b"from-0", b"from-1"]
    assert values(session.range(b"e", lo, hi, rev=True)) == [b"from-0", b"from-1"]


def test_a_read_after_an_id_fans_a_topic_key_out_under_its_partition_keys(broker, topic):
    found = topic.read_after(ReadPlan([b"t"], [StreamId(1, 0)]))
    assert [(key, ids(entries)) for key, entries in found] == [
        (b"t#0", [(4, 0)]), (b"t#1", [(2, 0), (4, 0)]), (b"t#2", [(3, 0)])]
    found = topic.read_after(ReadPlan([b"t#1", b"missing", b"t"], [StreamId(0, 0)] * 3, count=1))
    assert [(key, ids(entries)) for key, entries in found] == [
        (b"t#1", [(2, 0)]), (b"t#0", [(1, 0)]), (b"t#1", [(2, 0)]), (b"t#2", [(3, 0)])]
    assert topic.read_after(ReadPlan([b"t"], [AFTER_LAST])) == []  # each partition's own last ID
    # "+": each partition's last entry
    found = topic.read_after(ReadPlan([b"t"], [LAST_ENTRY], count=10))
    assert [(key, ids(entries)) for key, entries in found] == [
        (b"t#0", [(4, 0)]), (b"t#1", [(4, 0)]), (b"t#2", [(3, 0)])]


def test_max_count_and_max_size_cap_the_whole_read_over_its_keys_in_order(broker, topic):
    """Redis 8.10's MAXCOUNT / MAXSIZE (``cluster.broker.budget``): COUNT
    per key, these over the keys (a topic's partitions in partition order);
    the first entry is served whatever its size."""
    zero = StreamId(0, 0)
    found = topic.read_after(ReadPlan([b"t", b"t#1"], [zero, zero], count=1, max_count=4))
    assert [(key, ids(entries)) for key, entries in found] == [
        (b"t#0", [(1, 0)]), (b"t#1", [(2, 0)]), (b"t#2", [(3, 0)]), (b"t#1", [(2, 0)])]
    found = topic.read_after(ReadPlan([b"t"], [zero], max_count=3))
    assert [(key, ids(entries)) for key, entries in found] == [(b"t#0", [(1, 0), (4, 0)]), (b"t#1", [(2, 0)])]
    found = topic.read_after(ReadPlan([b"t"], [zero], max_size=1))
    assert [(key, ids(entries)) for key, entries in found] == [(b"t#0", [(1, 0)])]
    one = len(split_entries(topic.read_after(ReadPlan([b"t#0"], [zero], count=1))[0][1].chunks)[0])
    found = topic.read_after(ReadPlan([b"t"], [zero], max_size=3 * one + 2 * (16 + 3)))
    assert [(key, ids(entries)) for key, entries in found] == [(b"t#0", [(1, 0), (4, 0)]), (b"t#1", [(2, 0)])]


def test_a_one_partition_plan_is_declined_unless_its_key_is_one_existing_partition(broker, topic):
    add(topic, b"s", 7)
    for key in (b"t", b"missing", b"t#9", b"bad#01"):
        assert topic.read_after(ReadPlan((key,), ((0, 0),), 0, None, True)) is None
    found = topic.read_after(ReadPlan((b"s",), ((0, 0),), 0, None, True))
    assert [(key, ids(entries)) for key, entries in found] == [(b"s", [(7, 0)])]
    assert topic.read_after(ReadPlan((b"t#2",), ((3, 0),), 0, None, True)) == []


def test_every_read_sees_the_appends_another_session_deferred(broker, topic):
    writer = broker.session(1)
    writer.may_defer = True
    reader = broker.session(2)
    writer.append(XAddPlan(b"t#2", [b"f", b"late"]))
    assert writer.deferred is not None and broker.has_deferred()  # not in the log yet
    assert reader.length(b"t") == 6
    assert not broker.has_deferred()
    writer.append(XAddPlan(b"t#2", [b"f", b"later"]))
    found = reader.range(b"t#2", StreamId(4, 0), StreamId(2**64 - 1, 0))
    assert [decode_entry(e)[1][1] for e in split_entries(found.chunks)] == [b"late", b"later"]
    writer.append(XAddPlan(b"s", [b"f", b"new"]))  # creates s: its entry deferred
    found = reader.read_after(ReadPlan((b"s",), ((0, 0),), 0, None, True))
    assert [decode_entry(e)[1][1] for _, entries in found for e in split_entries(entries.chunks)] == [b"new"]
    writer.append(XAddPlan(b"s", [b"f", b"newer"]))
    assert reader.stream_info(b"s").length == 2


def test_reads_a_front_end_sends_at_once_are_views_of_the_mapping(broker, topic):
    found = topic.read_after(ReadPlan([b"t#1"], [StreamId(0, 0)]))
    assert type(found[0][1]) is Entries and mapped(found[0][1])
    assert mapped(topic.range(b"t#1", StreamId(0, 0), StreamId(9, 0)))


async def read_while(session, plan: ReadPlan, action) -> list:
    """What ``session.wait_for_entries(plan)`` returns when ``action()``
    runs once it waits."""
    got = []

    async def read():
        got.append(await session.wait_for_entries(plan))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read)
        await wait_all_tasks_blocked()
        assert not got and session.broker.keys.blocked_clients == 1
        action()
    assert session.broker.keys.blocked_clients == 0
    return got[0]


async def test_the_blocking_read_waits_for_an_append_and_copies(broker, topic):
    writer = broker.session(1)
    [(key, entries)] = await read_while(broker.session(2), ReadPlan([b"t"], [AFTER_LAST], block_ms=0),
                                        lambda: add(writer, b"t#2", 9))
    assert key == b"t#2" and ids(entries) == [(9, 0)]
    assert not mapped(entries)  # it reached the caller across awaits: copies


async def test_the_blocking_read_times_out_and_answers_at_once_when_it_may_not_wait(broker, topic,
                                                                                    autojump_clock):
    start = trio.current_time()
    assert await topic.wait_for_entries(ReadPlan([b"t"], [AFTER_LAST], block_ms=250)) == []
    assert trio.current_time() - start == pytest.approx(0.25)
    topic.may_block = False  # inside a transaction
    assert await topic.wait_for_entries(ReadPlan([b"t"], [AFTER_LAST], block_ms=0)) == []
    found = await topic.wait_for_entries(ReadPlan([b"t#0"], [StreamId(1, 0)], block_ms=0))
    assert [(key, ids(entries)) for key, entries in found] == [(b"t#0", [(4, 0)])]


async def test_a_key_that_became_a_topic_of_several_partitions_while_waiting_is_read_whole(broker):
    other = broker.session()
    add(other, b"g", 1)

    def grow_and_append():
        other.alter_topic_partitions(b"g", 2)
        add(other, b"g#1", 5)

    found = await read_while(broker.session(), ReadPlan([b"g"], [AFTER_LAST], block_ms=0), grow_and_append)
    assert [(key, ids(entries)) for key, entries in found] == [(b"g#1", [(5, 0)])]


def test_stream_info_is_data_of_one_partition(broker, topic):
    info = topic.stream_info(b"t#1")
    assert (info.length, info.last_id, info.entries_added, info.radix_tree_keys) == (2, StreamId(4, 0), 2, 1)
    assert decode_entry(info.first_entry)[0] == StreamId(2, 0) and decode_entry(info.last_entry)[0] == (4, 0)
    assert info.groups == 0 and info.entries is None
    full = topic.stream_info(b"t#1", full=True, count=1)
    assert ids(full.entries) == [(2, 0)] and full.first_entry is None
    assert topic.stream_info(b"missing") is None
    with pytest.raises(TopicError) as refused:
        topic.stream_info(b"t")
    assert refused.value.code == topics.NEEDS_PARTITION_KEY


def test_the_keyspace(broker, topic):
    session = broker.session()
    add(session, b"a", 1)
    add(session, b"b", 1)
    assert session.count_existing([b"t", b"t#2", b"a", b"a", b"nope", b"t#01"]) == 4
    assert session.key_names() == [b"a", b"b", b"t"] and session.key_count() == 3
    seen = []
    cursor = 0
    while True:
        cursor, keys = session.scan_keys(cursor, 1)
        seen += keys
        if cursor == 0:
            break
    assert sorted(seen) == [b"a", b"b", b"t"]
    assert session.rename(b"nope", b"x") is None
    assert session.rename(b"a", b"a") is False and session.rename(b"a", b"b", nx=True) is False
    assert session.rename(b"a", b"c") is True and session.key_names() == [b"b", b"c", b"t"]
    assert session.rename(b"c", b"a") is True and session.rename(b"t#0", b"t") is False
    for src, dst in ((b"t#1", b"x"), (b"a", b"x#2")):  # a partition alone; a partition's name
        with pytest.raises(TopicError):
            session.rename(src, dst)
    signalled = []
    broker.keys.subscribe(signalled.append)
    assert session.delete_keys([b"a", b"nope", b"t#1"]) == 2
    assert signalled == [b"a", b"t#1"] and session.key_names() == [b"b"]
    session.flush_all()
    assert session.key_count() == 0 and signalled[-1] == b"b"


def test_topic_administration(broker):
    session = broker.session()
    session.create_topic(b"d")  # default-partitions
    session.alter_topic_partitions(b"d", 2)
    session.alter_topic_config(b"d", [(b"retention-ms", b"1000")])
    desc = session.describe_topic(b"d")
    assert [p["key"] for p in desc["partitions"]] == [b"d#0", b"d#1"]
    assert desc["config"]["retention-ms"] == (1000, True) and "replication" not in desc["partitions"][0]
    assert session.topic_names() == [b"d"]
    refusals = [
        (lambda: session.create_topic(b"x", 1, (), [2]), topics.REPLICATION_FACTOR_FIXED),
        (lambda: session.create_topic(b"d", 1), topics.TOPIC_EXISTS),
        (lambda: session.describe_topic(b"d#1"), topics.TOPIC_NEEDS_TOPIC),
        (lambda: session.delete_topic(b"d#1"), topics.TOPIC_DELETE_NEEDS_TOPIC),
        (lambda: session.require_topic(b"d#1"), topics.TOPIC_NEEDS_TOPIC),
        (lambda: session.alter_topic_partitions(b"d#1", 3), topics.TOPIC_NEEDS_TOPIC),
        (lambda: session.alter_topic_config(b"d#1", [(b"fsync", b"always")]), topics.TOPIC_NEEDS_TOPIC),
        (lambda: session.alter_topic_config(b"d", [(b"fsync", b"always"), (b"FSYNC", b"default")]),
         topics.CONFIG_REPEATED),
        (lambda: session.require_topic(b"nope"), topics.UNKNOWN_TOPIC),
    ]
    for call, code in refusals:
        with pytest.raises(TopicError) as info:
            call()
        assert info.value.code == code
    session.create_topic(b"x", 1, (), [1])
    session.require_topic(b"d")
    session.delete_topic(b"d")
    assert session.topic_names() == [b"x"]


class _FanOutHere(FanOut):
    """A cluster's ``FanOut`` whose partitions are "led elsewhere" but read
    from this registry (as each leader would: ``read_part``)."""

    def __init__(self, broker):
        super().__init__(types.SimpleNamespace(topics=broker.topics))
        self.broker = broker
        self.asked = []

    def led_elsewhere(self, key):
        return True

    async def read_parts(self, parts, client_id=0):
        self.asked.append((parts[0].topic, parts[0].op, parts[0].count))
        await trio.sleep(0)
        return [read_part(self.broker.topics.stream_of(p.topic, p.n), p) for p in parts]

    async def wait_for_entries(self, topic, starts, timeout_s):
        keys = [b"%s#%d" % (topic, n) for n in range(len(starts))]
        return await self.broker.keys.wait_for_keys(keys, timeout_s)


async def test_in_a_cluster_a_topic_wide_read_fans_out_and_merges_as_here(broker, topic):
    """A topic whose partitions other nodes lead: XLEN, XRANGE and XREAD
    return the awaitable of the fan-out (``Replication.fanout``), merged as
    the local read merges; inside a transaction they are refused."""
    from cluster.errors import ClusterError

    lo, hi = StreamId(0, 0), StreamId(2**64 - 1, 2**64 - 1)
    here = (topic.length(b"t"), ids(topic.range(b"t", lo, hi, count=4)), ids(topic.range(b"t", lo, hi, rev=True)),
            [(k, ids(e)) for k, e in topic.read_after(ReadPlan([b"t"], [StreamId(1, 0)], count=1))],
            [(k, ids(e)) for k, e in topic.read_after(ReadPlan([b"t"], [LAST_ENTRY]))])
    fanout = _FanOutHere(broker)
    broker.replication = types.SimpleNamespace(fan_out_refusal=lambda key: None, fanout=fanout,
                                               before_append=lambda session, pkey, stream: False,
                                               leads_key=lambda key: True)  # (the partition keys read here)
    across = (await topic.length(b"t"), ids(await topic.range(b"t", lo, hi, count=4)),
              ids(await topic.range(b"t", lo, hi, rev=True)),
              [(k, ids(e)) for k, e in await topic.read_after(ReadPlan([b"t"], [StreamId(1, 0)], count=1))],
              [(k, ids(e)) for k, e in await topic.read_after(ReadPlan([b"t"], [LAST_ENTRY]))])
    assert across == here
    assert fanout.asked == [(b"t", "len", 0), (b"t", "range", 4), (b"t", "revrange", 0), (b"t", "after", 1),
                            (b"t", "revrange", 1)]
    assert topic.length(b"t#1") == 2  # a partition key: led here or -MOVED, the routing's call
    assert await topic.read_after(ReadPlan([b"t"], [AFTER_LAST])) == []
    # XREAD BLOCK: ``$`` resolved once per partition, woken by an append to any.
    got = []
    async with trio.open_nursery() as nursery:
        async def blocked():
            got.extend(await broker.session().wait_for_entries(ReadPlan([b"t"], [AFTER_LAST], block_ms=0)))
        nursery.start_soon(blocked)
        await wait_all_tasks_blocked()
        add(broker.session(), b"t#2", 9)
    assert [(k, ids(e)) for k, e in got] == [(b"t#2", [(9, 0)])]
    assert fanout.asked[5:] == [(b"t", "after-last", 0), (b"t", "after", 0)]

    async def unreachable(topic, starts, timeout_s):
        raise TryAgain("partition t#1 leader node 2 unreachable: link down")

    fanout.wait_for_entries = unreachable  # a leader lost while the reader waits: its error, as it is
    with pytest.raises(TryAgain, match="unreachable"):
        await topic.wait_for_entries(ReadPlan([b"t"], [AFTER_LAST], block_ms=0))
    topic.may_block = False
    with pytest.raises(ClusterError, match="a transaction cannot read from other nodes"):
        topic.length(b"t")
    broker.replication = None