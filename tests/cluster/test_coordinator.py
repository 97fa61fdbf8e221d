"""The group coordinator with a controllable clock: membership, sticky
balanced assignment, cooperative revocation, session timeouts."""

from __future__ import annotations

from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from cluster.coordinator import GroupCoordinator, Handover

TIMEOUT_MS = 1000


def owned(c: GroupCoordinator) -> dict[bytes, list[int]]:
    return {name: c.assigned(name) for name in sorted(c.members)}


def test_first_member_gets_everything_then_joiners_take_their_share():
    c = GroupCoordinator(6, TIMEOUT_MS)
    c.heartbeat(b"a", 0)
    assert c.assigned(b"a") == [0, 1, 2, 3, 4, 5]
    assert c.take_handovers() == [Handover(p, None, b"a") for p in range(6)]
    c.heartbeat(b"b", 10)
    # Cooperative: the three partitions moving to b are revoked from a first;
    # a keeps reading the other three meanwhile, b reads nothing yet.
    moving = [p for p, _, _ in c.revoking()]
    assert len(moving) == 3 and all(o == b"a" and t == b"b" for _, o, t in c.revoking())
    assert c.assigned(b"a") == [p for p in range(6) if p not in moving]
    assert c.assigned(b"b") == [] and c.take_handovers() == []
    for p in moving:
        c.release(p)
    assert c.assigned(b"b") == moving
    assert c.take_handovers() == [Handover(p, b"a", b"b") for p in moving]


def test_six_partitions_three_members_two_each():
    c = GroupCoordinator(6, TIMEOUT_MS)
    for i, name in enumerate([b"a", b"b", b"c"]):
        c.heartbeat(name, i)
        for p, _, _ in c.revoking():
            c.release(p)
    assert [len(v) for v in owned(c).values()] == [2, 2, 2]
    assert sorted(p for v in owned(c).values() for p in v) == list(range(6))


def _settled(names, partitions=6):
    c = GroupCoordinator(partitions, TIMEOUT_MS)
    for name in names:
        c.heartbeat(name, 0)
        for p, _, _ in c.revoking():
            c.release(p)
    c.take_handovers()
    return c


def test_a_silent_member_dies_after_the_session_timeout():
    c = _settled([b"a", b"b", b"c"])
    before = owned(c)
    for t in (300, 600, 900):
        c.heartbeat(b"a", t)
        c.heartbeat(b"b", t)
    assert owned(c) == before  # c is silent but not dead yet (last seen at 0)
    c.heartbeat(b"a", 1000)
    assert b"c" not in c.members
    after = owned(c)
    assert sorted(after) == [b"a", b"b"] and [len(v) for v in after.values()] == [3, 3]
    # Only c's partitions moved; a and b kept theirs (sticky).
    assert set(before[b"a"]) <= set(after[b"a"]) and set(before[b"b"]) <= set(after[b"b"])
    handovers = c.take_handovers()
    assert sorted(h.partition for h in handovers) == sorted(before[b"c"])
    assert all(h.previous == b"c" for h in handovers)


def test_a_blocked_reader_stays_alive():
    c = _settled([b"a", b"b"])
    c.begin_read(b"b", 0)
    c.heartbeat(b"a", 5000)
    assert b"b" in c.members and len(c.assigned(b"b")) == 3
    c.end_read(b"b", 5000)
    c.heartbeat(b"a", 5999)
    assert b"b" in c.members
    c.heartbeat(b"a", 6000)
    assert b"b" not in c.members and len(c.assigned(b"a")) == 6


def test_a_joiner_moves_only_the_partitions_it_takes():
    c = _settled([b"a", b"b"])
    before = owned(c)
    c.heartbeat(b"c", 1)
    moving = {p: (o, t) for p, o, t in c.revoking()}
    assert len(moving) == 2 and all(t == b"c" for _, t in moving.values())
    # Exactly one partition leaves each of a and b.
    assert sorted(o for o, _ in moving.values()) == [b"a", b"b"]
    for name in (b"a", b"b"):
        assert set(c.assigned(name)) == set(before[name]) - set(moving)


def test_revocation_is_forced_after_the_session_timeout():
    c = _settled([b"a"])
    c.heartbeat(b"b", 100)
    moving = [p for p, _, _ in c.revoking()]
    c.heartbeat(b"a", 600)
    c.heartbeat(b"b", 600)
    assert c.assigned(b"b") == []
    c.heartbeat(b"a", 1100)  # a is alive, but never released: forced
    assert c.assigned(b"b") == moving
    assert [h.previous for h in c.take_handovers()] == [b"a"] * len(moving)


def test_leave_moves_partitions_at_once():
    c = _settled([b"a", b"b", b"c"])
    gone = c.assigned(b"b")
    assert c.leave(b"b", 5) is True and c.leave(b"b", 5) is False
    assert sorted(len(v) for v in owned(c).values()) == [3, 3]
    assert sorted(h.partition for h in c.take_handovers()) == sorted(gone)


def test_growing_partitions_assigns_the_new_ones():
    c = _settled([b"a", b"b"], partitions=2)
    c.set_partition_count(4, 10)
    assert sorted(len(v) for v in owned(c).values()) == [2, 2]
    assert {h.partition for h in c.take_handovers()} == {2, 3}


def test_everyone_gone_leaves_partitions_unowned_until_someone_reads():
    c = _settled([b"a"], partitions=3)
    c.expire(10_000)
    assert c.members == {} and c.owner == [None, None, None]
    c.heartbeat(b"z", 10_001)
    assert c.assigned(b"z") == [0, 1, 2]
    assert [h.previous for h in c.take_handovers()] == [None, None, None]


class CoordinatorMachine(RuleBasedStateMachine):
    """Random joins, reads, leaves, releases and clock jumps keep the invariants:
    balanced targets, at most one reader per partition, owners alive."""

    def __init__(self):
        super().__init__()
        self.c = GroupCoordinator(7, TIMEOUT_MS)
        self.now = 0

    @rule(name=st.sampled_from([b"a", b"b", b"c", b"d"]))
    def read(self, name):
        self.c.heartbeat(name, self.now)

    @rule(name=st.sampled_from([b"a", b"b", b"c", b"d"]))
    def leave(self, name):
        self.c.leave(name, self.now)

    @rule(ms=st.integers(min_value=0, max_value=1500))
    def tick(self, ms):
        self.now += ms
        self.c.expire(self.now)

    @rule(data=st.data())
    def release_one(self, data):
        revoking = self.c.revoking()
        if revoking:
            p, _, _ = data.draw(st.sampled_from(revoking))
            self.c.release(p)

    @rule(extra=st.integers(min_value=0, max_value=2))
    def grow(self, extra):
        self.c.set_partition_count(self.c.partitions + extra, self.now)

    @invariant()
    def one_reader_per_partition(self):
        c = self.c
        readers: dict[int, list[bytes]] = {}
        for name in c.members:
            for p in c.assigned(name):
                readers.setdefault(p, []).append(name)
        assert all(len(v) == 1 for v in readers.values())
        for p in range(c.partitions):
            if c.owner[p] is not None and c.members:
                assert c.owner[p] in c.members or p not in readers
        if c.members:
            counts = [sum(1 for t in c.target if t == name) for name in c.members]
            assert max(counts) - min(counts) <= 1 and sum(counts) == c.partitions

    @invariant()
    def handovers_go_to_live_members(self):
        for h in self.c.take_handovers():
            assert h.owner in self.c.members


CoordinatorMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
TestCoordinatorMachine = CoordinatorMachine.TestCase
