"""Hand-over effects on the durable group state (real GroupStore, fake clock)."""

from __future__ import annotations

from cluster.membership import TopicGroupMembership, hand_over, take_queued
from storage.streams.groups import GroupStore

TIMEOUT_MS = 1000


def make(tmp_path, partitions=2):
    stores = {}
    for p in range(partitions):
        d = tmp_path / f"p{p}"
        d.mkdir()
        stores[p] = GroupStore.open(d)
        stores[p].create_group(b"g", (0, 0), 0)
    m = TopicGroupMembership(b"t", b"g", partitions, TIMEOUT_MS, lambda p: stores[p])
    return m, stores


def deliver(store, consumer, ids, now_ms):
    store.deliver(b"g", consumer, ids, ids[-1], None, now_ms)


def test_dead_members_pending_entries_move_to_the_new_owner_and_are_queued(tmp_path):
    m, stores = make(tmp_path)
    m.heartbeat(b"a", 0)
    m.heartbeat(b"b", 0)
    assert sorted(m.assigned(b"a") + m.assigned(b"b")) == [0, 1]
    pb = m.assigned(b"b")[0]
    deliver(stores[pb], b"b", [(1, 0), (2, 0)], 0)
    # b goes silent; a keeps reading.
    m.heartbeat(b"a", 500)
    assert m.assigned(b"b") == [pb]
    written = m.heartbeat(b"a", 1000)
    assert m.assigned(b"a") == [0, 1] and stores[pb] in written
    g = stores[pb].group(b"g")
    assert {sid: (pe.consumer, pe.delivery_count) for sid, pe in g.pel.items()} == {
        (1, 0): (b"a", 1), (2, 0): (b"a", 1)}
    assert m.take_redeliveries(pb, b"a", 1) == [(1, 0)]
    assert m.take_redeliveries(pb, b"a", 0) == [(2, 0)]
    assert m.take_redeliveries(pb, b"a", 0) == []


def test_the_transfer_is_durable(tmp_path):
    m, stores = make(tmp_path, partitions=1)
    m.heartbeat(b"a", 0)
    deliver(stores[0], b"a", [(5, 0)], 0)
    m.leave(b"a", 10)  # nobody left: the entry stays with a
    m.heartbeat(b"b", 20)  # b takes partition 0 and a's pending entry
    stores[0].close()
    reopened = GroupStore.open(tmp_path / "p0")
    assert reopened.group(b"g").pel.get((5, 0)).consumer == b"b"
    reopened.close()


def test_revocation_waits_for_the_old_owner_to_ack(tmp_path):
    m, stores = make(tmp_path)
    m.heartbeat(b"a", 0)
    deliver(stores[1], b"a", [(7, 0)], 0)
    m.heartbeat(b"b", 10)
    moving = [p for p, _, _ in m.coordinator.revoking()]
    assert moving == [1]  # a keeps its lowest partition (sticky), b takes the other
    m.sync(20)
    assert m.assigned(b"b") == [] and m.owner_of(1) is None
    stores[1].ack(b"g", [(7, 0)])
    m.sync(30)
    assert m.assigned(b"b") == [1] and m.owner_of(1) == b"b"
    assert m.take_redeliveries(1, b"b", 0) == []


def test_a_partition_led_elsewhere_is_handed_over_by_its_leader(tmp_path):
    """In a cluster the coordinator does not touch the group state of a
    partition another node leads: the handover is noted for the new owner's
    next read (``take_over``), which the leader applies (``hand_over``: every
    pending entry made the owner's, all of them queued, oldest first)."""
    m, stores = make(tmp_path)
    m.away = lambda p: p == 1
    m.heartbeat(b"a", 0)
    deliver(stores[1], b"a", [(1, 0), (2, 0)], 0)
    m.heartbeat(b"b", 10)
    assert m.assigned(b"a") == [0] and [p for p, _, _ in m.coordinator.revoking()] == [1]
    m.sync(20)
    assert m.owner_of(1) is None  # the leader has not said a's count there is 0
    m.remote_pending[1] = 2
    m.sync(30)
    assert m.owner_of(1) is None
    m.leave(b"a", 40)  # a leaves: partition 1 passes to b at once, its state untouched here
    assert m.owner_of(1) == b"b" and m.take_over == {1: b"b"} and 1 not in m.remote_pending
    assert stores[1].group(b"g").pel.get((1, 0)).consumer == b"a"
    queue, wrote = hand_over(stores[1], b"g", b"b", 50)  # what the leader does on b's read
    assert queue == [(1, 0), (2, 0)] and wrote
    assert take_queued(queue, stores[1].group(b"g").consumer(b"b"), 1) == ([(1, 0)], 1)


def test_a_revocation_on_a_partition_led_elsewhere_ends_when_its_leader_counts_nothing_pending(tmp_path):
    m, stores = make(tmp_path)
    m.away = lambda p: p == 1
    m.heartbeat(b"a", 0)
    m.heartbeat(b"b", 10)
    m.remote_pending[1] = 0
    m.sync(20)
    assert m.assigned(b"b") == [1] and m.take_over == {1: b"b"}


def test_a_handover_noted_for_a_leader_applies_here_once_this_node_leads_the_partition(tmp_path):
    m, stores = make(tmp_path, partitions=1)
    away = [True]
    m.away = lambda p: away[0]
    m.heartbeat(b"a", 0)
    deliver(stores[0], b"a", [(3, 0)], 0)
    m.leave(b"a", 10)
    m.heartbeat(b"b", 20)
    assert m.take_over == {0: b"b"}
    away[0] = False  # the partition's leadership moved to the coordinator's node
    assert stores[0] in m.sync(30)
    assert m.take_over == {} and stores[0].group(b"g").pel.get((3, 0)).consumer == b"b"
    assert m.take_redeliveries(0, b"b", 0) == [(3, 0)]


def test_a_snapshot_restored_on_a_new_coordinator_keeps_each_member_on_its_partitions(tmp_path):
    """A failover: the next coordinator takes the snapshot the last one
    kept; the members keep their partitions, and each owned partition is
    handed to its owner again (the redelivery queue was soft state)."""
    m, stores = make(tmp_path)
    m.heartbeat(b"a", 0)
    m.heartbeat(b"b", 10)
    m.away = lambda p: p == 1
    m.remote_pending[1] = 0
    m.sync(30)
    assert m.assigned(b"a") == [0] and m.assigned(b"b") == [1]
    snapshot = m.snapshot()
    deliver(stores[0], b"a", [(4, 0)], 40)
    n = TopicGroupMembership(b"t", b"g", 2, TIMEOUT_MS, lambda p: stores[p])
    n.away = lambda p: p == 1
    assert n.restore(*snapshot, 100)
    assert n.assigned(b"a") == [0] and n.assigned(b"b") == [1] and n.take_over == {0: b"a", 1: b"b"}
    n.sync(110)  # partition 0 is led here: handed to a at once, its entry queued for it
    assert n.take_over == {1: b"b"} and n.take_redeliveries(0, b"a", 0) == [(4, 0)]
    n.heartbeat(b"a", 100 + TIMEOUT_MS)  # b never came back: it expires, a gets partition 1
    assert n.assigned(b"a") == [0, 1] and n.take_over == {1: b"a"}


def test_a_snapshot_that_does_not_fit_is_not_restored(tmp_path):
    m, stores = make(tmp_path)
    assert not m.restore([b"a"], [b"a"], [b"a"], 0)  # another partition count
    assert not m.restore([b"a"], [b"a", b"x"], [b"a", b"x"], 0)  # an owner that is no member
    assert not m.restore([b"a", b"b"], [b"a", b"a"], [b"a", b"a"], 0)  # not balanced
    assert m.coordinator.members == {} and m.take_over == {}
