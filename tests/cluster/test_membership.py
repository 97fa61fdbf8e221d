"""Hand-over effects on the durable group state (real GroupStore, fake clock)."""

from __future__ import annotations

from cluster.membership import TopicGroupMembership
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
