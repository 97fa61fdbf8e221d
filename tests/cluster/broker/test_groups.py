"""The broker's group operations (``cluster.broker.groups``), called as a
front-end calls them: a ``Broker`` over a real ``TopicRegistry`` in a
temporary directory, a fake durability that records what each operation
notes for the fsync policy, a fake wall clock for the group state, and
trio's autojump clock for blocking reads.

Each checks what the session returns (plain values, stored chunks,
dataclasses), the receipt its reply would wait for, and the refusals' codes.
"""

from __future__ import annotations

import pytest
import trio

from cluster.broker import XAddPlan
from cluster.broker import groups as ops
from cluster.broker.groups import GroupOpError, GroupRead
from cluster.errors import TryAgain
from storage.entry_codec import decode_entry, split_entries
from storage.streams.groups import GROUP_EXISTS, GroupError, groups_of
from storage.streams.ids import StreamIdError, parse_strict_id
from tests.cluster.broker.conftest import Clock

SESSION_TIMEOUT_MS = 1000


class RecordingDurability:
    """The ``note_write`` half of the fsync policy: every write noted, and
    under ``always`` a new group-commit sequence for each."""

    def __init__(self) -> None:
        self.noted: list = []
        self.seq = 0

    def note_write(self, log, policy: str) -> int:
        self.noted.append(log)
        if policy != "always":
            return 0
        self.seq += 1
        return self.seq


@pytest.fixture
def broker(make_broker):
    b = make_broker(clock_ms=Clock(), fsync="always", group_session_timeout_ms=SESSION_TIMEOUT_MS)
    b.durability = RecordingDurability()
    return b


def add(session, key: bytes, *fields: bytes):
    return session.append(XAddPlan(key, list(fields)))


def fields_of(delivery) -> list:
    """The field/value lists of a delivery's entries (decoded here, for the test)."""
    return [decode_entry(e)[1] for chunk in delivery.chunks for e in split_entries([chunk])]


def read(group=b"g", consumer=b"c", keys=(b"s",), starts=(None,), **kwargs) -> GroupRead:
    return GroupRead(group, consumer, list(keys), list(starts), **kwargs)


def test_a_delivery_waits_for_the_group_state_under_fsync_always(broker):
    session = broker.session()
    for n in range(3):
        add(session, b"s", b"n", b"%d" % n)
    session.group_create(b"s", b"g", (0, 0))
    stream = broker.topics.get(b"s")
    store = groups_of(stream)
    assert session.take_receipt().flush_seq > 0
    broker.durability.noted.clear()

    served = session.read_group_nowait(read(count=2))
    assert [(d.key, d.count) for d in served] == [(b"s", 2)]
    assert fields_of(served[0]) == [[b"n", b"0"], [b"n", b"1"]]
    receipt = session.take_receipt()
    assert receipt is not None and receipt.flush_seq == broker.durability.seq  # the delivery's journal write
    assert broker.durability.noted == [store]

    assert session.ack(b"s", b"g", [(0, 0)]) == 0  # nothing pending with that ID: nothing written
    assert session.take_receipt() is None
    pending = session.pending(b"s", b"g", (0, 0), (2**64 - 1, 2**64 - 1), 10)
    ids = [sid for sid, *_ in pending]
    assert session.ack(b"s", b"g", ids) == 2
    assert session.take_receipt().flush_seq == broker.durability.seq


def test_nothing_to_serve_waits_unless_it_may_not(broker):
    session = broker.session()
    add(session, b"s", b"f", b"v")
    session.group_create(b"s", b"g", None)  # $: nothing new for the group
    session.take_receipt()
    assert session.read_group_nowait(read()) == []  # no BLOCK: the null reply
    assert session.take_receipt() is not None  # it created its consumer (Redis 7.2+), journalled
    assert session.read_group_nowait(read(block_ms=100)) is None  # would wait: left to read_group
    session.may_block = False  # inside a transaction
    assert session.read_group_nowait(read(block_ms=100)) == []
    assert session.take_receipt() is None  # reads that served an existing consumer nothing wrote nothing


def test_history_gives_entries_gone_from_the_stream_as_ids(broker):
    session = broker.session()
    first = add(session, b"s", b"f", b"1")
    add(session, b"s", b"f", b"2")
    session.group_create(b"s", b"g", (0, 0))
    session.read_group_nowait(read())
    session.delete(b"s", [first])
    (history,) = session.read_group_nowait(read(starts=[parse_strict_id(b"0")]))
    assert history.count == 2 and history.gone
    assert history.chunks[0] == tuple(first)  # the front-end replies [id, nil]
    assert decode_entry(bytes(history.chunks[1]))[1] == [b"f", b"2"]
    assert session.pending(b"s", b"g", (0, 0), (2**64 - 1, 0), 10)[1][3] == 2  # redelivered: count + 1


def test_dead_lettering_past_max_deliveries(broker):
    session = broker.session()
    signalled = []
    broker.keys.subscribe(signalled.append)
    sid = add(session, b"s", b"job", b"7")
    session.group_create(b"s", b"g", (0, 0), max_deliveries=1, dead_letter_key=b"dl")
    session.read_group_nowait(read(consumer=b"worker"))
    session.take_receipt()
    broker.durability.noted.clear()

    (history,) = session.read_group_nowait(read(consumer=b"worker", starts=[parse_strict_id(b"0")]))
    assert history.count == 0  # the second delivery would pass MAXDELIVERIES 1
    dl = broker.topics.get(b"dl")
    assert dl.length == 1
    entry = dl.range((0, 0), (2**64 - 1, 2**64 - 1), None)
    assert decode_entry(b"".join(bytes(c) for c in entry.chunks))[1] == [
        b"job", b"7", b"dl-source-key", b"s", b"dl-source-id", b"%d-%d" % tuple(sid), b"dl-group", b"g",
        b"dl-consumer", b"worker", b"dl-deliveries", b"1"]
    store = groups_of(broker.topics.get(b"s"))
    assert broker.durability.noted[-2:] == [dl.log, store]  # the append, then the PEL removal
    assert session.take_receipt().flush_seq == broker.durability.seq
    assert b"dl" in signalled
    (info,) = session.group_infos(b"s")
    assert (info.pending, info.max_deliveries, info.dead_letter_key, info.dead_lettered) == (0, 1, b"dl", 1)


def _group_on_two_partitions(broker):
    """A session and the clock, topic ``t`` of 2 partitions holding one
    entry each, and group ``g`` on it from the start."""
    session = broker.session()
    broker.topics.create_topic(b"t", 2)
    for p in (0, 1):
        add(session, b"t#%d" % p, b"p", b"%d" % p)
    session.group_create(b"t", b"g", (0, 0))
    return session, broker.clock_ms


def test_a_dead_members_entries_go_first_to_the_new_owner(broker):
    session, clock = _group_on_two_partitions(broker)

    taken = session.read_group_nowait(read(consumer=b"a", keys=[b"t"]))  # (a member's read needs no wait)
    assert sorted(d.key for d in taken) == [b"t#0", b"t#1"]  # alone: both partitions
    clock.now_ms += 10
    joined = trio.run(session.read_group, read(consumer=b"b", keys=[b"t"]))
    assert joined == []  # b's partition is revoked from a, which still has its entry pending
    (view,) = session.topic_groups(b"t")
    assert [m.name for m in view.members] == [b"a", b"b"]

    clock.now_ms += SESSION_TIMEOUT_MS  # a is silent, b reads: a is dead
    broker.durability.noted.clear()
    got = trio.run(session.read_group, read(consumer=b"b", keys=[b"t"]))
    assert sorted(d.key for d in got) == [b"t#0", b"t#1"]  # a's pending entries, first
    assert sorted(f for d in got for f in fields_of(d)) == [[b"p", b"0"], [b"p", b"1"]]
    for p in (0, 1):
        rows = session.pending(b"t#%d" % p, b"g", (0, 0), (2**64 - 1, 2**64 - 1), 10)
        assert [(owner, deliveries) for _, owner, _, deliveries in rows] == [(b"b", 2)]
    assert session.take_receipt().flush_seq > 0  # the hand-over's claims and redeliveries
    (view,) = session.topic_groups(b"t")
    assert [m.name for m in view.members] == [b"b"]
    assert [p.owner for p in view.partitions] == [b"b", b"b"]
    consumers = session.consumer_infos(b"t", b"g")
    assert [(c.name, c.pending, c.member) for c in consumers] == [(b"a", 0, False), (b"b", 2, True)]


def test_a_member_reading_only_its_pending_entries_stays_alive(broker):
    """A member that re-reads its history (ID 0) for longer than the
    session timeout, e.g. while its XACKs fail, is not silent: its
    partitions and pending entries stay its own."""
    session, clock = _group_on_two_partitions(broker)
    taken = trio.run(session.read_group, read(consumer=b"a", keys=[b"t"]))
    assert sorted(d.key for d in taken) == [b"t#0", b"t#1"]  # alone: both partitions
    for _ in range(3):
        clock.now_ms += SESSION_TIMEOUT_MS // 2
        again = trio.run(session.read_group, read(consumer=b"a", keys=[b"t"], starts=[parse_strict_id(b"0")]))
        assert sorted(d.key for d in again) == [b"t#0", b"t#1"]
    assert trio.run(session.read_group, read(consumer=b"b", keys=[b"t"])) == []  # b joins: a owns both still
    (view,) = session.topic_groups(b"t")
    assert [m.name for m in view.members] == [b"a", b"b"]
    for p in (0, 1):
        rows = session.pending(b"t#%d" % p, b"g", (0, 0), (2**64 - 1, 2**64 - 1), 10)
        assert [owner for _, owner, _, _ in rows] == [b"a"]


async def test_a_members_read_that_finds_nothing_is_left_to_read_group_which_waits(broker, autojump_clock):
    """The no-wait call serves a topic's member too; one that finds nothing
    and may wait returns None, having done what a read does first (b joins,
    its partition is revoked from a), and ``read_group``'s wait then serves
    b once the partition is released to it."""
    session, clock = _group_on_two_partitions(broker)
    taken = session.read_group_nowait(read(consumer=b"a", keys=[b"t"]))
    assert sorted(d.key for d in taken) == [b"t#0", b"t#1"]
    assert session.read_group_nowait(read(consumer=b"b", keys=[b"t"], block_ms=0)) is None
    (view,) = session.topic_groups(b"t")
    assert [m.name for m in view.members] == [b"a", b"b"]
    (revoked,) = [p for p in view.partitions if p.owner is None]  # a still has its entry pending there
    got: list = []

    async def b_waits() -> None:
        got.extend(await broker.session().read_group(read(consumer=b"b", keys=[b"t"], block_ms=0)))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(b_waits)
        await trio.sleep(1)
        assert got == []
        ((sid, owner, _, _),) = session.pending(revoked.key, b"g", (0, 0), (2**64 - 1, 2**64 - 1), 10)
        assert owner == b"a"
        assert session.ack(revoked.key, b"g", [sid]) == 1
        add(session, revoked.key, b"p", b"new")
    assert [d.key for d in got] == [revoked.key]
    assert fields_of(got[0]) == [[b"p", b"new"]]


async def test_blocked_readers_are_served_in_arrival_order(broker, autojump_clock):
    session = broker.session()
    add(session, b"s", b"f", b"0")
    session.group_create(b"s", b"g", None)
    got: dict = {}

    async def reader(name: bytes) -> None:
        got[name] = await broker.session().read_group(read(consumer=name, count=1, block_ms=0))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader, b"first")
        await trio.sleep(1)
        nursery.start_soon(reader, b"second")
        await trio.sleep(1)
        add(session, b"s", b"f", b"1")  # one entry: the first to arrive gets it
        await trio.sleep(1)
        assert list(got) == [b"first"]
        add(session, b"s", b"f", b"2")
    assert [fields_of(got[n][0]) for n in (b"first", b"second")] == [[[b"f", b"1"]], [[b"f", b"2"]]]
    assert broker.blocked_readers == {}


async def test_a_blocked_read_times_out_or_is_refused_when_its_group_goes(broker, autojump_clock):
    session = broker.session()
    add(session, b"s", b"f", b"0")
    session.group_create(b"s", b"g", None)
    assert await session.read_group(read(block_ms=500)) == []
    assert trio.current_time() >= 0.5

    async def destroy_soon() -> None:
        await trio.sleep(1)
        assert broker.session().group_destroy(b"s", b"g") == 1

    async with trio.open_nursery() as nursery:
        nursery.start_soon(destroy_soon)
        with pytest.raises(GroupOpError) as refused:
            await session.read_group(read(block_ms=0))
    assert refused.value.code == ops.NO_GROUP_TO_READ  # Redis 7.2+: the command's own NOGROUP


def test_refusals_come_in_redis_order(broker):
    session = broker.session()
    bad_id = StreamIdError()
    with pytest.raises(GroupOpError) as e:  # the key's group is checked before its ID
        session.read_group_nowait(read(starts=[bad_id]))
    assert (e.value.code, e.value.fields) == (ops.NO_GROUP_TO_READ, {"key": b"s", "group": b"g"})
    add(session, b"s", b"f", b"v")
    session.group_create(b"s", b"g", (0, 0))
    with pytest.raises(StreamIdError):
        session.read_group_nowait(read(starts=[bad_id]))
    with pytest.raises(GroupOpError) as e:
        session.group_set_id(b"missing", b"g", None, None, late=bad_id)
    assert e.value.code == ops.KEY_MISSING
    with pytest.raises(GroupOpError) as e:
        session.group_set_id(b"s", b"nope", None, None, late=bad_id)
    assert e.value.code == ops.NO_GROUP_FOR_KEY
    assert session.ack(b"missing", b"g", (), late=bad_id) == 0  # XACK of a missing key: 0, no error
    with pytest.raises(GroupOpError) as e:
        session.group_create(b"s", b"g2", None, max_deliveries=3, dead_letter_key=b"s")
    assert e.value.code == ops.DEAD_LETTER_IS_SOURCE
    assert session.group_infos(b"s")[0].name == b"g"  # nothing created


def test_a_group_command_on_a_topic_runs_on_every_partition(broker):
    session = broker.session()
    broker.topics.create_topic(b"t", 3)
    session.group_create(b"t", b"g", None)
    with pytest.raises(GroupError) as busy:  # every partition has it: BUSYGROUP
        session.group_create(b"t", b"g", None)
    assert busy.value.code == GROUP_EXISTS
    for p in range(3):
        assert groups_of(broker.topics.get(b"t#%d" % p)).group(b"g") is not None
    assert session.group_create_consumer(b"t", b"g", b"c") == 1
    infos = session.group_infos(b"t")
    assert [(i.name, i.consumers, i.partitions) for i in infos] == [(b"g", 1, 3)]
    assert session.group_destroy(b"t", b"g") == 1
    assert session.group_infos(b"t") == []


# ----------------------------------------------------- Redis 8: XNACK, CLAIM


def _pending_rows(session, key=b"s", group=b"g") -> list:
    return session.pending(key, group, (0, 0), (2**64 - 1, 2**64 - 1), 100)


def test_nack_releases_by_mode_and_wakes_the_key(broker):
    session = broker.session()
    signalled = []
    broker.keys.subscribe(signalled.append)
    ids = [add(session, b"s", b"f", b"%d" % n) for n in range(3)]
    session.group_create(b"s", b"g", (0, 0))
    session.read_group_nowait(read(count=2))
    session.take_receipt()
    signalled.clear()
    released = session.nack(b"s", b"g", ops.NACK_SILENT, [ids[0], ids[0], ids[1], ids[2]])
    assert released == 3  # ids[0] twice (1 -> 0 -> 0), ids[1]; ids[2] was never delivered
    assert session.take_receipt().flush_seq > 0 and signalled == [b"s"]
    assert [(owner, idle, n) for _, owner, idle, n in _pending_rows(session)] == [(None, -1, 0), (None, -1, 0)]
    assert session.nack(b"s", b"g", ops.NACK_FATAL, [ids[2]], force=True) == 1
    assert session.nack(b"s", b"g", ops.NACK_FAIL, [ids[1]], retry_count=9) == 1
    assert session.nack(b"s", b"g", ops.NACK_FAIL, [(99, 0)], force=True) == 0  # not in the stream
    assert [n for *_, n in _pending_rows(session)] == [0, 9, 2**63 - 1]
    assert session.groups_full(b"s", 0)[0].nacked_count == 3
    with pytest.raises(GroupOpError) as refused:
        session.nack(b"s", b"nope", ops.NACK_FAIL, [ids[0]])
    assert refused.value.code == ops.NO_KEY_OR_GROUP


def test_a_claim_read_serves_idle_entries_first_with_what_they_had(broker):
    session = broker.session()
    clock = broker.clock_ms
    ids = [add(session, b"s", b"f", b"%d" % n) for n in range(5)]
    session.group_create(b"s", b"g", (0, 0), max_deliveries=2, dead_letter_key=b"dl")
    session.read_group_nowait(read(consumer=b"a", count=3))
    clock.now_ms += 100
    session.claim(b"s", b"g", b"a", [ids[0]], justid=True, idle_ms=5000)  # idle 5100 from now
    session.claim(b"s", b"g", b"a", [ids[1]], retry_count=2)  # its next delivery passes MAXDELIVERIES 2
    session.nack(b"s", b"g", ops.NACK_FAIL, [ids[2]])
    clock.now_ms += 50
    (got,) = session.read_group_nowait(read(consumer=b"b", count=4, claim_ms=1000))
    assert [e[:2] for e in got.claims] == [(-1, 1), (5050, 1), (0, 0), (0, 0)]
    assert [fields_of_one(c) for c in got.chunks] == [[b"f", b"2"], [b"f", b"0"], [b"f", b"3"], [b"f", b"4"]]
    assert broker.topics.get(b"dl") is None  # ids[1] is not idle 1000 yet
    clock.now_ms += 1000
    assert session.read_group_nowait(read(consumer=b"b", claim_ms=1040)) == []  # ids[1] dead-lettered
    assert broker.topics.get(b"dl").length == 1
    assert [(sid, owner, n) for sid, owner, _, n in _pending_rows(session)] == [
        (tuple(ids[0]), b"b", 2), (tuple(ids[2]), b"b", 2), (tuple(ids[3]), b"b", 1), (tuple(ids[4]), b"b", 1)]


def fields_of_one(chunk) -> list:
    return decode_entry(bytes(chunk))[1]


async def test_a_blocked_claim_read_wakes_when_an_entry_gets_idle_enough(broker, autojump_clock):
    session = broker.session()
    clock = broker.clock_ms
    add(session, b"s", b"f", b"0")
    session.group_create(b"s", b"g", (0, 0))
    session.read_group_nowait(read(consumer=b"a"))
    got: list = []

    async def reader() -> None:
        got.append(await broker.session().read_group(read(consumer=b"b", block_ms=0, claim_ms=3000)))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader)
        await trio.sleep(1)
        assert not got
        clock.now_ms += 3000  # the wall clock catches up with the read's own timer
    ((delivery,),) = got
    assert delivery.claims == [(3000, 1)]
    assert trio.current_time() >= 3  # it slept until the entry was due, not in a busy loop


def test_max_count_and_max_size_cap_a_group_read_over_its_keys(broker):
    session = broker.session()
    for key in (b"a", b"b"):
        for n in range(3):
            add(session, key, b"f", b"x" * 50)
        session.group_create(key, b"g", (0, 0))
    got = session.read_group_nowait(read(keys=[b"a", b"b"], starts=[None, None], count=2, max_count=3))
    assert [(d.key, d.count) for d in got] == [(b"a", 2), (b"b", 1)]
    got = session.read_group_nowait(read(keys=[b"a", b"b"], starts=[None, None], max_size=1))
    assert [(d.key, d.count) for d in got] == [(b"a", 1)]  # the first entry, whatever its size
    assert [n for *_, n in _pending_rows(session, b"b")] == [1]  # only what was served was delivered


class _Leaders:
    """A cluster's view where another node (2) leads the odd partitions of
    every topic: their group changes are "forwarded" (``forward``), run here
    by a session of their own as that leader would run the XGROUP it gets,
    and a leader's refusal comes back as ``Refused`` (its text)."""

    def __init__(self, broker):
        from cluster.peer.messages import GroupResponse

        self.sent = []
        leader_session = broker.session()

        async def forward(request, leader, client_id):
            from cluster.errors import Refused

            self.sent.append((request.op, request.key, leader))
            await trio.sleep(0)
            try:
                if request.op == "create":
                    leader_session.group_create(request.key, request.group, request.last_id)
                    return GroupResponse()
                if request.op == "setid":
                    leader_session.group_set_id(request.key, request.group, request.last_id, None)
                    return GroupResponse()
                return GroupResponse(leader_session.group_destroy(request.key, request.group))
            except (GroupError, GroupOpError) as e:
                code = "BUSYGROUP" if e.code == GROUP_EXISTS else "NOGROUP"
                raise Refused(f"{code} from the leader") from None

        class Link:  # asked for the partitions' groups before a change (``serve_group_info``)
            reply_timeout_s = 0.0

            async def call(self, request):
                await trio.sleep(0)
                return leader_session.serve_group_info(request)

        state = type("State", (), {"leader": staticmethod(lambda shard: 2 if shard % 2 else 1)})
        self.manager = type("Manager", (), {"my_id": 1, "state": state,
                                            "shard_of": staticmethod(lambda topic, n: n),
                                            "leader_state": staticmethod(lambda topic, n: object())})
        self.fanout = type("FanOut", (), {"led_elsewhere": staticmethod(lambda key: True)})
        self.forwarder = type("Forwarder", (), {"forward": staticmethod(forward)})
        self.link = lambda node, purpose: Link()

    def note_group_write(self, session, store):
        pass


async def test_xgroup_on_a_topic_led_by_several_nodes_is_sent_to_each_partitions_leader(broker):
    """In a cluster, XGROUP CREATE / SETID / DESTROY of a topic whose
    partitions other nodes lead: the awaitable of the combined answer, the
    odd partitions' changes sent to their leader; BUSYGROUP only when every
    partition (here or there) had the group."""
    session = broker.session()
    session.create_topic(b"t", 4)
    session.group_create(b"t#1", b"g", (0, 0))  # one partition has it already
    leaders = broker.replication = _Leaders(broker)
    try:
        assert await session.group_create(b"t", b"g", None) is None
        assert sorted((op, key) for op, key, _ in leaders.sent) == [("create", b"t#1"), ("create", b"t#3")]
        with pytest.raises(Exception) as busy:  # every partition has it now: the first refusal, relayed
            await session.group_create(b"t", b"g", None)
        assert ops._is_busy(busy.value)
        assert await session.group_set_id(b"t", b"g", (5, 0), None) is None
        assert [[tuple(g.last_id) for g in session.group_infos(b"t#%d" % n)] for n in range(4)] == [[(5, 0)]] * 4
        broker.replication = None
        assert session.group_destroy(b"t#3", b"g") == 1  # (by its leader)
        broker.replication = leaders
        with pytest.raises(GroupOpError) as missing:  # asked first: nothing changed, nothing sent
            await session.group_set_id(b"t", b"g", (6, 0), None)
        assert (missing.value.code, missing.value.fields["key"]) == (ops.NO_GROUP_FOR_KEY, b"t#3")
        assert [[tuple(g.last_id) for g in session.group_infos(b"t#%d" % n)] for n in range(3)] == [[(5, 0)]] * 3
        assert await session.group_create(b"t", b"g", None) is None  # whole again
        assert await session.group_destroy(b"t", b"g") == 1
        assert await session.group_destroy(b"t", b"g") == 0
        session.may_block = False
        with pytest.raises(Exception, match="a transaction cannot change their groups"):
            session.group_destroy(b"t", b"g")
    finally:
        broker.replication = None


class _InfoLeaders:
    """A cluster's view where node 2 leads the partitions ``away`` says
    (the coordinator is partition 0's leader): a ``GroupInfoRequest`` to it
    is served by a session of its own over the same registry, as node 2's
    bus would (``serve_group_info``); ``down``: node 2 cannot be reached."""

    def __init__(self, broker, away):
        from cluster.peer.link import Unreachable
        from cluster.runtime.fanout import FanOut

        self.asked = []
        self.down = False
        leader_session = broker.session()
        outer = self

        class Link:
            reply_timeout_s = 0.0

            async def call(self, request):
                outer.asked.append(request)
                await trio.sleep(0)
                if outer.down:
                    raise Unreachable("link down")
                return leader_session.serve_group_info(request)

        state = type("State", (), {"leader": staticmethod(lambda shard: 2 if away(shard) else 1),
                                   "epoch": staticmethod(lambda shard: 1)})
        self.manager = type("Manager", (), {"my_id": 1, "state": state,
                                            "shard_of": staticmethod(lambda topic, n: n),
                                            "leader_state": staticmethod(lambda topic, n: object())})
        self.fanout = type("FanOut", (), {"led_elsewhere": staticmethod(lambda key: True),
                                          "in_transaction": staticmethod(lambda key: FanOut.in_transaction(None, key))})
        self.link = lambda node, purpose: Link()

    def note_group_write(self, session, store):
        pass


@pytest.mark.parametrize("away", [lambda n: n % 2 == 1, lambda n: n != 1], ids=["coordinator-here",
                                                                               "coordinator-away"])
async def test_a_topics_group_views_gathered_from_its_leaders_merge_as_one_nodes(broker, away):
    """XINFO GROUPS / CONSUMERS and TOPIC GROUPS of a topic whose partitions
    another node leads: one ``GroupInfoRequest`` per node (the coordinator,
    partition 0's leader, gives the memberships too), merged by the one
    merge a single node uses: the same views as the single node's."""
    session = broker.session()
    clock = broker.clock_ms
    session.create_topic(b"t", 4)
    for n in range(3):
        for i in range(3):
            add(session, b"t#%d" % n, b"n", b"%d" % n, b"i", b"%d" % i)
    session.group_create(b"t", b"g", (0, 0))
    session.group_create(b"t", b"h", None)
    await session.read_group(read(consumer=b"a", keys=[b"t"], count=2))
    clock.now_ms += 7
    session.read_group_nowait(read(consumer=b"x", keys=[b"t#1"], starts=[None], count=1))
    first = session.pending(b"t#0", b"g", (0, 0), (2**64 - 1, 2**64 - 1), 1)[0][0]
    assert session.ack(b"t#0", b"g", [first]) == 1
    clock.now_ms += 5
    single = (session.group_infos(b"t"), session.consumer_infos(b"t", b"g"), session.topic_groups(b"t"),
              session.topic_groups(b"t", b"h"))
    assert [c.name for c in single[1]] == [b"a", b"x"] and single[2][0].members[0].name == b"a"
    leaders = broker.replication = _InfoLeaders(broker, away)
    try:
        across = (await session.group_infos(b"t"), await session.consumer_infos(b"t", b"g"),
                  await session.topic_groups(b"t"), await session.topic_groups(b"t", b"h"))
        assert across == single
        coordinator = 2 if away(0) else 1
        assert all(r.partitions == tuple(n for n in range(4) if away(n)) and r.members == (coordinator == 2)
                   for r in leaders.asked)
        with pytest.raises(GroupOpError):
            await session.consumer_infos(b"t", b"nope")
        leaders.down = True
        with pytest.raises(TryAgain, match=r"partition t#\d(, t#\d)* leader node 2 unreachable: link down"):
            await session.topic_groups(b"t")
        session.may_block = False
        with pytest.raises(Exception, match="a transaction cannot read from other nodes"):
            session.group_infos(b"t")
    finally:
        broker.replication = None
