"""Share groups on the broker (``cluster.broker.shares``): acquisition, acknowledgement and
release by offset over a real ``Broker``, the group's Redis state checked through the group
operations XPENDING / XINFO use, on a fake wall clock (lock expiry) and trio's autojump clock
(a waiting acquisition)."""

from __future__ import annotations

import pytest
import trio

from cluster.broker import XAddPlan
from cluster.broker.groups import GroupRead
from cluster.broker.shares import ACCEPT, BAD_ACKNOWLEDGEMENT, NOT_ACQUIRED, REJECT, RELEASE, ShareStateError
from storage.entry_codec import decode_entry
from tests.cluster.broker.conftest import Clock

LOCK_MS = 30_000
G = b"g"


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def session(make_broker, clock):
    s = make_broker(clock_ms=clock).session()
    s.create_topic(b"s")
    return s


def add(session, value: bytes, key: bytes = b"s") -> None:
    session.append(XAddPlan(key, [b"value", value]))


async def acquire(session, member: bytes, max_records: int = 100, limit: int = 5, wait_ms: int = 0):
    got = await session.share_acquire(G, member, [(b"s", 0)], max_records=max_records, max_bytes=0,
                                      lock_ms=LOCK_MS, delivery_limit=limit, wait_ms=wait_ms)
    return got[(b"s", 0)]


def values(records) -> list[bytes]:
    return [decode_entry(c)[1][1] for c in records.chunks]


def owners(session) -> dict[bytes, int]:
    return dict(session.pending_summary(b"s", G).consumers)


async def test_the_group_starts_at_the_end_and_acquired_records_are_the_members_pending_entries(session):
    add(session, b"before")
    first = await acquire(session, b"m1")
    assert first.entries == [] and first.high_watermark == 1  # made at `$`: share.auto.offset.reset=latest
    add(session, b"a")
    add(session, b"b")
    got = await acquire(session, b"m1")
    assert values(got) == [b"a", b"b"]
    assert [e[0] for e in got.entries] == [1, 2] and got.delivery_counts == [1, 1]
    assert owners(session) == {b"m1": 2}  # XPENDING: the member is the consumer


async def test_accepted_records_leave_and_released_ones_go_first_to_anyone_with_count_plus_one(session):
    await acquire(session, b"m1")
    for v in (b"a", b"b", b"c"):
        add(session, v)
    await acquire(session, b"m1", max_records=2)
    session.share_acknowledge(G, b"m1", b"s", 0, [(0, 0, [ACCEPT]), (1, 1, [RELEASE])])
    assert owners(session) == {}  # released: pending with no owner
    assert session.pending_summary(b"s", G).count == 1
    got = await acquire(session, b"m2")
    assert values(got) == [b"b", b"c"] and got.delivery_counts == [2, 1]
    assert owners(session) == {b"m2": 2}


async def test_a_lock_that_expired_lets_another_member_acquire_the_record(session, clock):
    await acquire(session, b"m1")
    add(session, b"a")
    await acquire(session, b"m1")
    assert (await acquire(session, b"m2")).entries == []  # still locked by m1
    clock.now_ms += LOCK_MS
    got = await acquire(session, b"m2")
    assert values(got) == [b"a"] and got.delivery_counts == [2]
    with pytest.raises(ShareStateError) as e:  # m1's lock is gone
        session.share_acknowledge(G, b"m1", b"s", 0, [(0, 0, [ACCEPT])])
    assert e.value.code == NOT_ACQUIRED


async def test_past_the_delivery_limit_a_record_is_archived(session):
    await acquire(session, b"m1")
    add(session, b"a")
    for count in (1, 2):
        got = await acquire(session, b"m1", limit=2)
        assert got.delivery_counts == [count]
        session.share_acknowledge(G, b"m1", b"s", 0, [(0, 0, [RELEASE])])
    assert (await acquire(session, b"m1", limit=2)).entries == []
    assert session.pending_summary(b"s", G).count == 0  # archived: acknowledged


async def test_acknowledgements_of_records_not_held_apply_nothing(session):
    await acquire(session, b"m1")
    add(session, b"a")
    add(session, b"b")
    await acquire(session, b"m1", max_records=1)
    for batches, code in (([(0, 1, [ACCEPT])], NOT_ACQUIRED),  # offset 1 is not acquired
                          ([(0, 1, [ACCEPT, ACCEPT, ACCEPT])], BAD_ACKNOWLEDGEMENT),
                          ([(0, 0, [7])], BAD_ACKNOWLEDGEMENT),
                          ([(5, 5, [ACCEPT])], NOT_ACQUIRED)):
        with pytest.raises(ShareStateError) as e:
            session.share_acknowledge(G, b"m1", b"s", 0, batches)
        assert e.value.code == code
    assert owners(session) == {b"m1": 1}
    with pytest.raises(ShareStateError):
        session.share_acknowledge(G, b"m2", b"s", 0, [(0, 0, [ACCEPT])])  # another member's


async def test_reject_dead_letters_when_the_group_has_a_dead_letter_stream(session):
    await acquire(session, b"m1")
    session.group_configure(b"s", G, 10, b"dl")
    add(session, b"a")
    await acquire(session, b"m1")
    session.share_acknowledge(G, b"m1", b"s", 0, [(0, 0, [REJECT])])
    assert session.pending_summary(b"s", G).count == 0
    assert session.length(b"dl") == 1


async def test_an_xreadgroup_consumer_and_a_member_share_the_entries(session):
    await acquire(session, b"m1")
    for i in range(6):
        add(session, b"%d" % i)
    redis = session.read_group_nowait(GroupRead(G, b"worker", [b"s"], [None], count=2))
    kafka = await acquire(session, b"m1", max_records=2)
    redis += session.read_group_nowait(GroupRead(G, b"worker", [b"s"], [None], count=2))
    assert sum(d.count for d in redis) + len(kafka.entries) == 6
    assert owners(session) == {b"m1": 2, b"worker": 4}


async def test_a_waiting_acquisition_wakes_for_an_append(session, autojump_clock):
    await acquire(session, b"m1")
    result = []

    async def waiter():
        result.append(await acquire(session, b"m1", wait_ms=5000))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.sleep(1)
        add(session, b"a")
    assert values(result[0]) == [b"a"]


async def test_release_of_a_member_frees_what_it_held_and_deletes_its_consumer(session):
    await acquire(session, b"m1")
    add(session, b"a")
    await acquire(session, b"m1")
    session.share_release(G, b"m1", [(b"s", 0)])
    assert [c.name for c in session.consumer_infos(b"s", G)] == []
    got = await acquire(session, b"m2")
    assert values(got) == [b"a"] and got.delivery_counts == [2]
