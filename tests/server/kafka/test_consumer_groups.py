"""The consumer group protocol's state machine (server/kafka_front/consumer_groups.py, KIP-848) on
trio's autojump clock: joins and the group epoch, the uniform and range assignors, incremental
reconciliation (a partition moves only once its old owner released it), fencing, leaving, the
session and revocation timeouts, static members, who may commit, and a group id being of one type."""

from __future__ import annotations

import types

import pytest
import trio

from server.kafka import errors as E
from server.kafka_front.consumer_groups import (
    RECONCILING,
    STABLE,
    ConsumerCoordinator,
    HeartbeatError,
    assign_range,
    assign_uniform,
)
from server.kafka_front.groups import Coordinator

TOPICS = {"t": 6}
SESSION_MS = 45_000
REBALANCE_MS = 30_000


def beat(c, member_id, epoch, owned=None, names=None, instance_id=None, assignor=None, group="g",
         regex=None, topics=TOPICS):
    return c.heartbeat(group, member_id, epoch, instance_id, None, REBALANCE_MS if epoch == 0 else -1,
                       ["t"] if epoch == 0 and names is None and regex is None else names, regex, assignor,
                       owned, topics, "client", "/127.0.0.1")


class Consumer:
    """A client's view of its membership: its epoch and the partitions it owns."""

    def __init__(self, c, member_id, **kw):
        self.c, self.member_id, self.kw = c, member_id, kw
        self.epoch = 0
        self.owned: dict[str, set[int]] = {}

    def join(self):
        r = beat(self.c, self.member_id, 0, **self.kw)
        self.apply(r)
        return r

    def apply(self, r):
        self.epoch = r.member_epoch
        if r.assignment is not None:
            self.owned = {t: set(ps) for t, ps in r.assignment.items() if ps}

    def heartbeat(self):
        """One heartbeat, reporting what it owns (as librdkafka does after a change)."""
        r = beat(self.c, self.member_id, self.epoch, owned={t: set(ps) for t, ps in self.owned.items()})
        self.apply(r)
        return r


def converge(consumers, rounds=10):
    """Heartbeat every consumer in turn until nothing changes (bounded)."""
    for _ in range(rounds):
        before = [(x.epoch, x.owned) for x in consumers]
        for x in consumers:
            x.heartbeat()
        if [(x.epoch, x.owned) for x in consumers] == before:
            return
    raise AssertionError("the group did not converge")


def partitions_of(consumers):
    out = []
    for x in consumers:
        out.extend((t, p) for t, ps in x.owned.items() for p in ps)
    return out


def assert_disjoint_and_covering(consumers, topics=TOPICS):
    got = partitions_of(consumers)
    assert len(got) == len(set(got)), got
    assert sorted(got) == [(t, p) for t in sorted(topics) for p in range(topics[t])]


def owners_now(c, group="g"):
    """Every partition held (assigned or being revoked) by a member, with its holders."""
    g = c.groups[group]
    held: dict[tuple[str, int], list[str]] = {}
    for m in g.members.values():
        for src in (m.assigned, m.revoking):
            for t, ps in src.items():
                for p in ps:
                    held.setdefault((t, p), []).append(m.member_id)
    return held


async def test_a_first_member_gets_every_partition_at_epoch_1(autojump_clock):
    c = ConsumerCoordinator()
    a = Consumer(c, "a")
    r = a.join()
    assert (r.member_id, r.member_epoch) == ("a", 1)
    assert r.assignment == {"t": set(range(6))}
    assert c.state_of("g") == STABLE
    r = a.heartbeat()
    assert r.member_epoch == 1 and r.assignment is None  # nothing changed: no assignment sent
    r = beat(c, "", 0)  # v0: the coordinator names the member
    assert r.member_id and r.member_id != "a" and r.member_epoch == 2


async def test_a_partition_moves_only_after_its_old_owner_revoked_it(autojump_clock):
    c = ConsumerCoordinator()
    a, b = Consumer(c, "a"), Consumer(c, "b")
    a.join()
    r = b.join()
    assert r.member_epoch == 2 and r.assignment == {}  # its target is still a's
    assert c.groups["g"].epoch == 2 and c.state_of("g") == RECONCILING
    r = beat(c, "a", 1)  # a heartbeat without owned partitions: revoke first, epoch stays
    a.apply(r)
    assert r.member_epoch == 1 and sum(len(ps) for ps in r.assignment.values()) == 3
    assert b.heartbeat().assignment is None  # a has not released them yet
    r = beat(c, "a", 1)  # still not told that a released them: nothing moves
    assert r.member_epoch == 1
    assert all(len(holders) == 1 for holders in owners_now(c).values())
    r = a.heartbeat()  # reports it owns only the 3 it kept: the revocation is done
    assert r.member_epoch == 2
    r = b.heartbeat()
    assert r.member_epoch == 2 and sum(len(ps) for ps in r.assignment.values()) == 3
    assert_disjoint_and_covering([a, b])
    assert c.state_of("g") == STABLE


async def test_three_members_get_two_partitions_each(autojump_clock):
    c = ConsumerCoordinator()
    members = [Consumer(c, m) for m in "abc"]
    for x in members:
        x.join()
        converge(members[:members.index(x) + 1])
        assert_disjoint_and_covering(members[:members.index(x) + 1])
    assert sorted(len(x.owned["t"]) for x in members) == [2, 2, 2]
    assert c.state_of("g") == STABLE


async def test_range_assignor_gives_contiguous_ranges(autojump_clock):
    c = ConsumerCoordinator()
    members = [Consumer(c, m, assignor="range") for m in "ab"]
    for x in members:
        x.join()
    converge(members)
    assert members[0].owned == {"t": {0, 1, 2}} and members[1].owned == {"t": {3, 4, 5}}
    assert c.groups["g"].assignor == "range"


def test_assignors_with_different_subscriptions():
    m = {mid: types.SimpleNamespace(subscribes=lambda t, s=subs: t in s)
         for mid, subs in (("a", {"x"}), ("b", {"x", "y"}))}
    out = assign_uniform(m, {"x": 2, "y": 2}, {})
    assert out["a"] == {"x": {0, 1}} and out["b"] == {"y": {0, 1}}
    out = assign_range(m, {"x": 3, "y": 2})
    assert out["a"] == {"x": {0, 1}} and out["b"] == {"x": {2}, "y": {0, 1}}


async def test_a_member_leaving_gives_its_partitions_to_the_others(autojump_clock):
    c = ConsumerCoordinator()
    a, b = Consumer(c, "a"), Consumer(c, "b")
    a.join()
    b.join()
    converge([a, b])
    r = beat(c, "b", -1)
    assert (r.member_id, r.member_epoch) == ("b", -1)
    epoch = c.groups["g"].epoch
    converge([a])
    assert a.owned == {"t": set(range(6))} and a.epoch == epoch
    with pytest.raises(HeartbeatError) as e:
        beat(c, "b", 3)
    assert e.value.code == E.UNKNOWN_MEMBER_ID


async def test_a_silent_member_is_removed_after_the_session_timeout(autojump_clock):
    c = ConsumerCoordinator(types.SimpleNamespace(kafka_consumer_session_timeout_ms=SESSION_MS,
                                                  kafka_consumer_heartbeat_interval_ms=5000))
    async with trio.open_nursery() as n:
        n.start_soon(c.run)
        a, b = Consumer(c, "a"), Consumer(c, "b")
        a.join()
        b.join()
        converge([a, b])
        for _ in range(SESSION_MS // 5000 + 2):  # a keeps heartbeating, b is silent
            await trio.sleep(5)
            a.heartbeat()
        assert list(c.groups["g"].members) == ["a"]
        assert a.owned == {"t": set(range(6))}
        n.cancel_scope.cancel()


async def test_a_member_that_does_not_revoke_in_its_rebalance_timeout_is_removed(autojump_clock):
    c = ConsumerCoordinator()
    async with trio.open_nursery() as n:
        n.start_soon(c.run)
        a, b = Consumer(c, "a"), Consumer(c, "b")
        a.join()
        b.join()
        beat(c, "a", 1)  # told to revoke 3 partitions; it keeps heartbeating without releasing them
        for _ in range(REBALANCE_MS // 5000 + 1):
            await trio.sleep(5)
            if "a" in c.groups["g"].members:
                beat(c, "a", 1)
            b.heartbeat()
        assert list(c.groups["g"].members) == ["b"]
        converge([b])
        assert b.owned == {"t": set(range(6))}
        n.cancel_scope.cancel()


async def test_epochs_are_fenced_and_a_lost_response_is_forgiven(autojump_clock):
    c = ConsumerCoordinator()
    a, b = Consumer(c, "a"), Consumer(c, "b")
    a.join()
    b.join()
    converge([a, b])
    assert a.epoch == 2
    for epoch in (3, 7):
        with pytest.raises(HeartbeatError) as e:
            beat(c, "a", epoch)
        assert e.value.code == E.FENCED_MEMBER_EPOCH
    with pytest.raises(HeartbeatError) as e:  # the previous epoch without its owned partitions
        beat(c, "a", 1)
    assert e.value.code == E.FENCED_MEMBER_EPOCH
    r = beat(c, "a", 1, owned=a.owned)  # the previous epoch, owning what it has: a lost response
    assert r.member_epoch == 2
    with pytest.raises(HeartbeatError) as e:
        beat(c, "a", 1, group="other")
    assert e.value.code == E.GROUP_ID_NOT_FOUND
    with pytest.raises(HeartbeatError) as e:
        beat(c, "nobody", 2)
    assert e.value.code == E.UNKNOWN_MEMBER_ID
    with pytest.raises(HeartbeatError) as e:
        beat(c, "c", 0, assignor="sticky")
    assert e.value.code == E.UNSUPPORTED_ASSIGNOR
    with pytest.raises(HeartbeatError) as e:
        beat(c, "c", 0, regex="(")
    assert e.value.code == E.INVALID_REGULAR_EXPRESSION


async def test_a_fenced_member_rejoins_with_epoch_0_and_gets_its_partitions_back(autojump_clock):
    c = ConsumerCoordinator()
    a, b = Consumer(c, "a"), Consumer(c, "b")
    a.join()
    b.join()
    converge([a, b])
    mine = b.owned
    b.owned, b.epoch = {}, 0
    b.join()
    assert b.owned == mine
    converge([a, b])
    assert_disjoint_and_covering([a, b])


async def test_static_member_leaves_for_a_while_and_its_instance_takes_the_assignment_back(autojump_clock):
    c = ConsumerCoordinator()
    a = Consumer(c, "a", instance_id="i1")
    b = Consumer(c, "b", instance_id="i2")
    a.join()
    b.join()
    converge([a, b])
    with pytest.raises(HeartbeatError) as e:  # the same instance while its member lives
        beat(c, "b2", 0, instance_id="i2")
    assert e.value.code == E.UNRELEASED_INSTANCE_ID
    epoch = c.groups["g"].epoch
    assert beat(c, "b", -2, instance_id="i2").member_epoch == -2
    mine = b.owned
    a.heartbeat()
    assert c.groups["g"].epoch == epoch  # no rebalance: its partitions wait for it
    b2 = Consumer(c, "b2", instance_id="i2")
    r = b2.join()
    assert r.member_epoch == b.epoch and b2.owned == mine
    assert c.groups["g"].epoch == epoch
    converge([a, b2])
    assert_disjoint_and_covering([a, b2])


async def test_a_regex_subscription_follows_new_topics(autojump_clock):
    c = ConsumerCoordinator()
    a = Consumer(c, "a", regex="t-.*", topics={"t-1": 2, "u": 1})
    a.join()
    assert a.owned == {"t-1": {0, 1}}
    r = beat(c, "a", a.epoch, topics={"t-1": 2, "t-2": 1, "u": 1})
    assert r.member_epoch == 2 and r.assignment == {"t-1": {0, 1}, "t-2": {0}}


async def test_commits_need_the_current_member_epoch(autojump_clock):
    c = ConsumerCoordinator()
    a = Consumer(c, "a")
    a.join()
    assert c.check_commit("g", "a", 1, 9) == E.NONE
    assert c.check_commit("g", "a", 0, 9) == E.STALE_MEMBER_EPOCH
    assert c.check_commit("g", "a", 1, 8) == E.UNSUPPORTED_VERSION
    assert c.check_commit("g", "x", 1, 9) == E.UNKNOWN_MEMBER_ID
    assert c.check_commit("g", "", -1, 9) == E.UNKNOWN_MEMBER_ID  # an admin commit while it has members
    assert c.check_commit("empty", "", -1, 9) == E.NONE
    assert c.check_fetch("g", "a", 1) == E.NONE
    assert c.check_fetch("g", "a", 2) == E.STALE_MEMBER_EPOCH
    assert c.check_fetch("g", None, -1) == E.NONE


async def test_a_group_id_is_of_one_type_while_it_has_members(autojump_clock):
    classic = Coordinator()
    c = classic.consumer = ConsumerCoordinator()
    Consumer(c, "a").join()
    r = await classic.join("g", "", None, 10_000, 30_000, "consumer", [("range", b"")], "client", "/h", False)
    assert r.error == E.INCONSISTENT_GROUP_PROTOCOL
    assert classic.state_of("g") == STABLE and classic.group_ids() == ["g"]
    assert classic.delete("g") == E.NON_EMPTY_GROUP
    beat(c, "a", -1)
    assert not classic.is_consumer_group("g")
