"""Replication state machines, step by step, and two replica managers joined by
an in-memory peer link (cluster.peer.link.MemoryLink to the leader's
PeerService) under trio's autojump clock (no sockets)."""

from __future__ import annotations

import dataclasses
import logging
import types
from pathlib import Path

import pytest
import trio

from cluster import replication as rp
from cluster.nodes import ClusterState, Node, Placement, crc16, key_slot, parse_cluster_nodes, ClusterConfigError
from cluster.errors import BadRequest, Paused
from cluster.peer.link import MemoryLink
from cluster.peer.messages import (EpochPartition, EpochRequest, FetchPartition, FetchRequest, FetchResponse,
                                   PauseRequest)
from cluster.runtime.replication import PAUSE_MS
from cluster.peer.service import PAUSE_MAX_MS, PeerService
from cluster.replica_manager import NotEnoughReplicasError, NotLeaderError, ReplicaManager, Settings
from cluster.topics import TopicRegistry
from storage.log import LogConfig, PartitionLog
from storage.streams.groups import groups_of


# ---------------------------------------------------------------- slots


def test_crc16_and_key_slot_match_redis_cluster():
    # Redis Cluster spec: crc16("123456789") == 0x31C3; hash tags pick the slot.
    assert crc16(b"123456789") == 0x31C3
    assert key_slot(b"foo") == 12182  # CLUSTER KEYSLOT foo
    assert key_slot(b"{user1000}.following") == key_slot(b"{user1000}.followers") == key_slot(b"user1000")
    assert key_slot(b"foo{}{bar}") == key_slot(b"foo{}{bar}")  # empty tag: the whole key
    assert key_slot(b"foo{}{bar}") != key_slot(b"bar")


def test_placement_spreads_leaders_and_replicas():
    nodes = parse_cluster_nodes("3@h:3,1@h:1,2@h:2")
    p = Placement(nodes, 1)
    assert [n.id for n in p.nodes] == [1, 2, 3]
    assert p.replication_factor == 3
    assert [p.replicas(s) for s in range(3)] == [[1, 2, 3], [2, 3, 1], [3, 1, 2]]
    assert p.slot_range(0) == (0, 5461) and p.slot_range(2)[1] == 16383
    covered = [p.shard_of_slot(s) for s in range(16384)]
    assert all(covered[a] == s for s in range(3) for a in p.slot_range(s))


@pytest.mark.parametrize("text, why", [
    ("1@h", "not <node-id>@<host>:<port>"),
    ("1@h:1@", "not <node-id>@<host>:<port>\\[@<bus-port>\\[@<kafka-port>\\]\\]"),
    ("1@h:1@2@", "not <node-id>@<host>:<port>"),
    ("1@h:1@2@70000", "not <node-id>@<host>:<port>"),
    ("1@h:1@x", "not <node-id>@<host>:<port>"),
    ("1@h:1,1@h:2", "twice"),
    ("0@h:1", "start at 1"),
])
def test_bad_cluster_nodes_are_refused(text, why):
    with pytest.raises(ClusterConfigError, match=why):
        parse_cluster_nodes(text)


def test_placement_refuses_unknown_node_and_large_rf():
    nodes = [Node(1, "h", 1), Node(2, "h", 2)]
    with pytest.raises(ClusterConfigError, match="not one of"):
        Placement(nodes, 5)
    with pytest.raises(ClusterConfigError, match="needs at least 3 nodes"):
        Placement(nodes, 1, 3)


def test_cluster_state_adopts_only_newer_epochs_and_persists(tmp_path):
    p = Placement(parse_cluster_nodes("1@h:1,2@h:2,3@h:3"), 1)
    st = ClusterState(p, tmp_path)
    assert st.shards == [(1, 1), (2, 1), (3, 1)]
    assert not st.adopt(0, 9, 5, {9})  # not a replica
    assert st.adopt(0, 2, 2, {1, 2})
    assert not st.adopt(0, 1, 1, {1})  # an older record (a replay at start-up): ignored
    assert ClusterState(p, tmp_path).shards[0] == (2, 2)  # survived a restart
    # Once the replay is done, the committed metadata wins over the file.
    assert st.adopt(0, 3, 1, {3}, rewind=True) and st.shards[0] == (3, 1)


@pytest.mark.parametrize("content", [b"{not json", b"[" * 100000, b'{"shards": [[1, "x"]]}'])
def test_an_unreadable_cluster_state_refuses_to_start_naming_the_file(tmp_path, content):
    """Nested deeper than the parser goes (RecursionError) included."""
    p = Placement(parse_cluster_nodes("1@h:1,2@h:2,3@h:3"), 1)
    (tmp_path / "cluster.state").write_bytes(content)
    with pytest.raises(ClusterConfigError, match="cluster.state: unreadable cluster state"):
        ClusterState(p, tmp_path)


def test_a_peer_view_moves_nothing_and_is_logged_rate_limited(tmp_path, caplog):
    """Issue 28: a view from anywhere but the committed metadata (here a
    forged one naming node 2 at epoch 999999999) changes no leader and no
    epoch; it is logged once per source within the rate limit."""
    import logging

    p = Placement(parse_cluster_nodes("1@h:1,2@h:2,3@h:3"), 1)
    st = ClusterState(p, tmp_path)
    with caplog.at_level(logging.WARNING, logger="partita.cluster"):
        for _ in range(3):
            st.note_peer_view(b"2:999999999,2:1,3:1", "node 3")
        st.note_peer_view(b"garbage", "node 2")
        st.note_peer_view(st.encode(), "node 1")  # the same view: nothing to say
    assert st.shards == [(1, 1), (2, 1), (3, 1)] and st.version == 0
    assert ClusterState(p, tmp_path).shards == [(1, 1), (2, 1), (3, 1)]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert "node 3's view" in lines[0] and "node 2 leading shard 0 at epoch 999999999" in lines[0]
    assert "node 2's view" in lines[1] and "unreadable" in lines[1]


def test_cluster_nodes_name_the_bus_port_or_imply_port_plus_10000():
    from cluster.nodes import bus_port_of

    nodes = parse_cluster_nodes("1@127.0.0.1:7001@17101,2@127.0.0.1:7002")
    assert [(n.port, n.bus_port, n.entry) for n in nodes] == [
        (7001, 17101, "127.0.0.1:7001@17101"), (7002, 17002, "127.0.0.1:7002@17002")]
    assert bus_port_of(nodes, 1) == 17101 and bus_port_of(nodes, 2) == 17002
    assert bus_port_of(nodes, 2, cluster_port=9999) == 9999  # cluster-port wins (a node behind a proxy)
    with pytest.raises(ClusterConfigError, match="bus port would be port \\+ 10000 = 70001; name one"):
        parse_cluster_nodes("1@h:60001")
    assert parse_cluster_nodes("1@h:60001@7000")[0].bus_port == 7000


def test_cluster_nodes_may_name_the_kafka_port():
    nodes = parse_cluster_nodes("1@127.0.0.1:7001@17101@9101,2@127.0.0.1:7002@0@9102,3@127.0.0.1:7003")
    assert [(n.bus_port, n.kafka_port) for n in nodes] == [(17101, 9101), (17002, 9102), (17003, 0)]
    assert nodes[0].entry == "127.0.0.1:7001@17101"  # what CLUSTER NODES shows: Redis's form


def test_a_cluster_state_that_cannot_be_saved_still_changes_in_memory(tmp_path, monkeypatch, caplog):
    """The file only seeds a restart (the controller's metadata log has the
    truth): a failed write is logged, and the leader change it recorded
    still takes effect, so a committed record is never half applied."""
    import errno
    import logging

    import cluster.nodes
    from storage.errors import StorageError

    p = Placement(parse_cluster_nodes("1@h:1,2@h:2,3@h:3"), 1)
    st = ClusterState(p, tmp_path)

    def full(path, data, **kw):
        raise StorageError(f"write {path} failed: ENOSPC (No space left on device)", errno.ENOSPC)

    monkeypatch.setattr(cluster.nodes, "write_atomic", full)
    with caplog.at_level(logging.WARNING, logger="partita.cluster"):
        assert st.adopt(0, 2, 2, {1, 2})
        assert st.adopt(1, 3, 2, {1, 3})
    assert st.shards[:2] == [(2, 2), (3, 2)] and st.isr[1] == {1, 3}
    assert sum("cluster state not saved" in r.getMessage() for r in caplog.records) == 2
    monkeypatch.undo()
    assert ClusterState(p, tmp_path).shards[0] == (1, 1)  # the file kept the last state it could write


# ---------------------------------------------------------- leader rules


def _log(tmp_path: Path, name: str = "p") -> PartitionLog:
    return PartitionLog.open(tmp_path / name, LogConfig(segment_bytes=4096))


def _append(plog: PartitionLog, n: int, epoch: int = 1) -> None:
    for _ in range(n):
        ms = plog.last_id[0] + 1
        plog.append([(ms, 0, b"*2\r\n$3\r\n%d-0\r\n*2\r\n$1\r\nf\r\n$1\r\nv\r\n" % ms)], epoch)


def test_high_watermark_is_the_isr_minimum_and_never_goes_back(tmp_path):
    plog = _log(tmp_path)
    ls = rp.LeaderState(1, [1, 2, 3], 1, plog, now_ms=0, lag_max_ms=1000)
    _append(plog, 10)
    assert plog.high_watermark == 0
    assert not ls.on_fetch(2, 10, 1)  # node 3 has nothing yet
    assert ls.on_fetch(3, 4, 1) and plog.high_watermark == 4
    ls.on_fetch(3, 2, 2)  # a follower that went back (restart) does not move the HW back
    assert plog.high_watermark == 4
    assert ls.on_fetch(3, 10, 3) and plog.high_watermark == 10


def test_lagging_follower_leaves_the_isr_and_rejoins_when_caught_up(tmp_path):
    plog = _log(tmp_path)
    ls = rp.LeaderState(1, [1, 2, 3], 1, plog, now_ms=0, lag_max_ms=1000)
    _append(plog, 5)
    ls.on_fetch(2, 5, 100)
    assert not ls.check_lag(900)
    assert ls.check_lag(1001)  # node 3 never caught up within lag_max_ms
    assert ls.isr == {1, 2} and plog.high_watermark == 5
    _append(plog, 5)
    ls.on_fetch(2, 10, 1100)
    assert plog.high_watermark == 10
    ls.on_fetch(3, 7, 1200)  # below the HW: still out
    assert 3 not in ls.isr
    ls.on_fetch(3, 10, 1300)
    assert ls.isr == {1, 2, 3}


def test_min_insync_freezes_the_high_watermark_and_refuses_acks_all(tmp_path):
    plog = _log(tmp_path)
    ls = rp.LeaderState(1, [1, 2, 3], 1, plog, now_ms=0, min_insync=3, lag_max_ms=10)
    _append(plog, 3)
    ls.on_fetch(2, 3, 5)
    ls.check_lag(100)  # node 2 caught up at 5, node 3 never: both lag now? only 3 is behind
    assert ls.isr == {1, 2}
    assert not ls.accepts_acks_all()
    _append(plog, 2)
    ls.on_fetch(2, 5, 101)
    assert plog.high_watermark == 0  # frozen below min-insync-replicas
    ls.min_insync = 2
    assert ls.update_hw() and plog.high_watermark == 5


def test_truncation_kip_101_uncommitted_tail(tmp_path):
    leader, follower = _log(tmp_path, "l"), _log(tmp_path, "f")
    _append(leader, 5, epoch=1)
    _append(follower, 7, epoch=1)  # two entries the leader never had
    assert rp.truncation_offset(follower, leader.end_offset_for_epoch(follower.latest_epoch)) == 5


def test_truncation_kip_279_several_epochs(tmp_path):
    leader, follower = _log(tmp_path, "l"), _log(tmp_path, "f")
    _append(leader, 5, epoch=1)
    _append(leader, 5, epoch=3)  # the leader's epoch 3 started at 5...
    _append(follower, 5, epoch=1)
    _append(follower, 3, epoch=2)  # ...while this replica led epoch 2 alone
    answer = leader.end_offset_for_epoch(follower.latest_epoch)
    assert answer == (1, 5)
    assert rp.truncation_offset(follower, answer) == 5
    follower.truncate_to(5)
    _append(follower, 0)
    assert rp.truncation_offset(follower, leader.end_offset_for_epoch(follower.latest_epoch)) is None


def test_truncation_when_leader_has_no_such_old_epoch(tmp_path):
    follower = _log(tmp_path, "f")
    _append(follower, 3, epoch=1)
    assert rp.truncation_offset(follower, (-1, -1)) == 0
    empty = _log(tmp_path, "e")
    assert rp.truncation_offset(empty, (-1, -1)) is None


def test_read_batches_is_what_append_raw_takes(tmp_path):
    leader, follower = _log(tmp_path, "l"), _log(tmp_path, "f")
    _append(leader, 200)  # several segments of 4 KiB
    assert leader.segment_count > 2
    off = 0
    while off < leader.log_end_offset:
        data, off = leader.read_batches(off, 1000)
        follower.append_raw(data)
    assert follower.log_end_offset == 200
    # A start inside a batch gets the batch's suffix.
    plog = _log(tmp_path, "x")
    plog.append([(1, 0, b"a"), (2, 0, b"b"), (3, 0, b"c")], 1)
    data, nxt = plog.read_batches(1, 1 << 20)
    copy = _log(tmp_path, "y")
    copy.truncate_to(0)
    copy.restart_at(1)
    copy.append_raw(data)
    assert nxt == 3 and copy.log_end_offset == 3 and copy.log_start_offset == 1


# ------------------------------------------------ two managers, in memory


def _key_led_by(placement: Placement, node: int) -> bytes:
    for i in range(10000):
        key = b"s%d" % i
        if placement.replicas(placement.shard_of_slot(key_slot(key)))[0] == node:
            return key
    raise AssertionError


def MemoryEndpoint(leader: ReplicaManager) -> MemoryLink:
    """A link to the leader's peer service (its long poll sleeps on the clock)."""
    return MemoryLink(PeerService(leader))


class Node2:
    def __init__(self, tmp_path: Path, my_id: int, clock) -> None:
        cfg = types.SimpleNamespace(segment_bytes=4096, stream_node_max_entries=100, acks="all",
                                    min_insync_replicas=1)
        self.registry = TopicRegistry.open(tmp_path / f"n{my_id}", cfg)
        placement = Placement([Node(1, "h", 1), Node(2, "h", 2)], my_id)
        self.manager = ReplicaManager(self.registry, placement, ClusterState(placement, tmp_path / f"n{my_id}"),
                                      Settings(lag_max_ms=1000, fetch_wait_ms=200), clock_ms=clock)

    def append(self, key: bytes, n: int) -> None:
        for i in range(n):
            stream, pkey = self.registry.append_target(key, [b"f", b"%d" % i])
            self.manager.before_append(pkey.rsplit(b"#", 1)[0], 0)
            stream.add([b"f", b"%d" % i])


def _fetched_topics(follower: "Node2", leader_id: int) -> set[bytes]:
    """The topics the follower's next fetch from ``leader_id`` asks for."""
    return {part.topic for part in follower.manager.fetch_request(leader_id).partitions}


async def _fetch_a_while(follower: "Node2", leader: "Node2", leader_id: int, seconds: float = 1.0) -> None:
    """Run the follower's fetcher against the leader for ``seconds`` (virtual time)."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(follower.manager.run_fetcher, leader_id, MemoryEndpoint(leader.manager))
        await trio.sleep(seconds)
        nursery.cancel_scope.cancel()


@pytest.fixture
def pair(tmp_path):
    now = [0]

    def clock():
        return int(trio.current_time() * 1000) if trio.lowlevel.current_root_task() else now[0]

    a, b = Node2(tmp_path, 1, clock), Node2(tmp_path, 2, clock)
    yield a, b
    a.registry.close()
    b.registry.close()


def _files(reg: TopicRegistry, topic: bytes) -> bytes:
    """Every stored batch of the topic in offset order (segments may roll at
    other offsets on each replica; the batches are the same bytes)."""
    d = reg.log_manager.topic_dir(topic)
    return b"".join(p.read_bytes() for p in sorted(d.rglob("*.log")))


async def test_follower_copies_batches_state_and_groups(pair, autojump_clock):
    a, b = pair
    key = _key_led_by(a.manager.placement, 1)
    a.append(key, 50)
    stream = a.registry.get(key)
    store = groups_of(stream)
    with pytest.raises(NotLeaderError):
        b.manager.before_append(key, 0)
    noted: list = []  # what the follower hands to the fsync policy (on_applied)
    b.manager.on_applied = noted.append
    endpoint = MemoryEndpoint(a.manager)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(b.manager.run_fetcher, 1, endpoint)
        await trio.sleep(1)
        assert a.registry.get(key).log.high_watermark == 50
        assert any(x is b.registry.get(key).log for x in noted)  # the batches' log
        noted.clear()
        store.create_group(b"g", (0, 0), 0)
        stream.delete([stream.range((0, 0), (2**64 - 1, 2**64 - 1), count=3).count and
                       tuple(stream.log.entry_id(1))])
        await trio.sleep(1)
        # The deletion marker's log and the group store, with no new batch.
        assert {id(x) for x in noted} == {id(b.registry.get(key).log), id(groups_of(b.registry.get(key)))}
        a.append(key, 5)
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    copy = b.registry.get(key)
    assert copy.log.log_end_offset == 55 and copy.log.high_watermark <= 55
    assert _files(a.registry, key) == _files(b.registry, key)  # byte-identical
    assert copy.log.is_deleted(1)
    assert groups_of(copy).group(b"g") is not None
    assert copy.meta == stream.meta


async def test_a_fetch_response_leaves_out_the_partitions_it_would_not_change(pair, autojump_clock):
    """Kafka's incremental fetch: an idle partition costs the leader no
    answer to build and send and the follower none to apply; the request
    still names it, so the leader keeps counting the follower caught up."""
    a, b = pair
    placement = a.manager.placement
    busy, idle = [k for k in (b"s%d" % i for i in range(10000))
                  if placement.replicas(placement.shard_of_slot(key_slot(k)))[0] == 1][:2]
    a.append(busy, 10)
    a.append(idle, 10)
    await _fetch_a_while(b, a, 1)
    assert [b.registry.get(k).log.high_watermark for k in (busy, idle)] == [10, 10]

    def answered() -> tuple[list[bytes], bool]:
        response, news = a.manager.serve_fetch(b.manager.fetch_request(1))
        b.manager.apply_fetch(1, response)
        return [p.topic for p in response.partitions], news

    assert answered() == ([], False)  # caught up on both: nothing to send
    a.append(busy, 5)
    assert answered() == ([busy], True)  # the new batches
    assert answered() == ([busy], True)  # the high watermark that this fetch's offset moved
    assert answered() == ([], False)
    assert [b.registry.get(k).log.high_watermark for k in (busy, idle)] == [15, 10]
    assert _files(a.registry, busy) == _files(b.registry, busy)
    assert a.manager.leader_state(idle, 0).isr == {1, 2}


async def test_isr_shrinks_when_the_follower_is_unreachable(pair, autojump_clock):
    a, b = pair
    key = _key_led_by(a.manager.placement, 1)
    a.append(key, 1)
    endpoint = MemoryEndpoint(a.manager)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(b.manager.run_fetcher, 1, endpoint)
        await trio.sleep(1)
        endpoint.up = False
        a.append(key, 1)
        for _ in range(20):
            await trio.sleep(0.1)
            a.manager.tick()
        ls = a.manager.leader_state(key, 0)
        assert ls.isr == {1}
        a.registry.alter_config(key, [(b"min-insync-replicas", b"2")])
        with pytest.raises(NotEnoughReplicasError, match="NOTENOUGHREPLICAS"):
            a.manager.before_append(key, 0)
        endpoint.up = True
        await trio.sleep(1)
        assert ls.isr == {1, 2}
        a.manager.before_append(key, 0)
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("why", ["offline", "full", "state"])
async def test_a_partition_this_replica_cannot_write_leaves_the_isr_alone(pair, autojump_clock, monkeypatch,
                                                                         caplog, why):
    """A follower whose copy of one partition refuses writes goes on
    applying the others of the same fetch; only that partition's ISR drops
    it. Offline after a failed fsync (until a restart), the partition is no
    longer fetched and its shard is reported (``offline_shards``: the
    heartbeat tells the controller); on a full disk its batches are fetched
    and refused, logged once. When only its stream state cannot be written
    (an XDEL's marker, disk full) the batches apply and the state is
    refused, logged once. What the disk refused is asked for again a second
    later (``APPLY_RETRY_MS``), not in the next fetch: a busy loop otherwise."""
    import errno
    import logging
    import os

    from storage.errors import StorageError

    a, b = pair
    keys = [k for k in (b"s%d" % i for i in range(10000))
            if a.manager.placement.replicas(a.manager.placement.shard_of_slot(key_slot(k)))[0] == 1][:2]
    for key in keys:
        a.append(key, 5)
    await _fetch_a_while(b, a, 1)
    bad, good = (b.registry.get(key).log for key in keys)
    assert bad.log_end_offset == good.log_end_offset == 5
    assert b.manager.offline_shards() == []

    if why == "offline":
        def eio(fd):
            raise OSError(errno.EIO, "Input/output error")

        monkeypatch.setattr(os, "fdatasync", eio)
        with pytest.raises(StorageError):
            bad.flush()
        monkeypatch.undo()
    refusals = []  # each time this disk refused the bad partition's changes
    if why == "full":
        def enospc(batches):
            refusals.append(batches)
            raise StorageError("append refused: No space left on device", errno.ENOSPC)

        monkeypatch.setattr(bad, "append_raw", enospc)
    else:
        import cluster.replica_manager as rm

        real_apply_state = rm.apply_state

        def apply_state(stream, blob):
            if stream.log is bad:
                refusals.append(blob)
                raise StorageError("delete markers refused: No space left on device", errno.ENOSPC)
            return real_apply_state(stream, blob)

        monkeypatch.setattr(rm, "apply_state", apply_state)
        leader_copy = a.registry.get(keys[0])
        assert leader_copy.delete([leader_copy.log.entry_id(1)]) == 1  # the stream's state changes
    for key in keys:
        a.append(key, 5)
    with caplog.at_level(logging.WARNING, logger="partita.replication"):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(b.manager.run_fetcher, 1, MemoryEndpoint(a.manager))
            for _ in range(30):
                await trio.sleep(0.1)
                a.manager.tick()
            nursery.cancel_scope.cancel()
    refused = [r for r in caplog.records if "not applied" in r.getMessage()]
    fetched = _fetched_topics(b, 1)
    assert a.manager.leader_state(keys[1], 0).isr == {1, 2}
    if why != "offline":
        # 3 s of fetching: asked again once a second, not in every fetch.
        assert 2 <= len(refusals) <= 4, len(refusals)
        assert keys[0] not in fetched
        await trio.sleep(1.01)
        assert keys[0] in _fetched_topics(b, 1)
    if why == "state":
        assert good.log_end_offset == bad.log_end_offset == 10  # the batches applied
        assert not bad.is_deleted(1) and b.registry.get(keys[0]).meta != a.registry.get(keys[0]).meta
        assert len(refused) == 1 and "fetched stream and group state not applied" in refused[0].getMessage()
        assert not any(r.exc_info for r in caplog.records)
        return
    assert good.log_end_offset == 10 and bad.log_end_offset == 5
    assert a.manager.leader_state(keys[0], 0).isr == {1}
    if why == "offline":
        assert b.manager.offline_shards() == [b.manager.shard_of(keys[0], 0)]
        assert keys[0] not in fetched and keys[1] in fetched
        assert refused == []
    else:
        assert b.manager.offline_shards() == []
        assert len(refused) == 1 and "No space left" in refused[0].getMessage()
    assert not any(r.exc_info for r in caplog.records)


async def test_a_new_leader_gives_its_followers_the_lag_time_before_proposing_a_shrink(pair, autojump_clock):
    """A node that starts leading a shard holding no partition of it yet
    must not propose an ISR without the followers that have not fetched
    from it yet: they get lag_max_ms from the start of the leadership, as a
    LeaderState's followers do (a shrink proposed at once left a committed
    ISR of one, and the shard leaderless when that node died)."""
    a, _ = pair
    m = a.manager
    shard = next(s for s in range(m.placement.shard_count) if m.placement.replicas(s) == [2, 1])
    m.state.controlled = True
    m.state.adopt(shard, 1, 2, {1, 2})  # node 1 now leads it, node 2 never fetched here
    assert m.isr_proposals() == []
    await trio.sleep(0.9)
    assert m.isr_proposals() == []
    await trio.sleep(0.2)  # past lag_max_ms (1 s) with no fetch: drop it
    assert (shard, {1}) in m.isr_proposals()


async def test_old_leader_truncates_its_unreplicated_tail_after_failover(pair, autojump_clock):
    a, b = pair
    key = _key_led_by(a.manager.placement, 1)
    a.append(key, 10)
    await _fetch_a_while(b, a, leader_id=1)
    a.append(key, 3)  # never fetched by b: not acknowledged with acks=all
    shard = a.manager.shard_of(key, 0)
    # b takes over at epoch 2 and writes; a learns and follows b.
    for node in (a, b):  # the controller's committed record, applied on both
        node.manager.state.adopt(shard, 2, 2, {1, 2})
    b.append(key, 4)
    await _fetch_a_while(a, b, leader_id=2)
    assert a.manager.fetch_counts["truncations"] == 1
    la, lb = a.registry.get(key).log, b.registry.get(key).log
    assert la.log_end_offset == lb.log_end_offset == 14
    assert la.epochs() == lb.epochs() == [(1, 0), (2, 10)]
    assert _files(a.registry, key) == _files(b.registry, key)


async def test_a_truncation_this_disk_refuses_holds_back_only_its_partition(pair, autojump_clock, monkeypatch,
                                                                            caplog):
    """A follower whose disk refuses one partition's cut by epoch (full, or
    a failed fsync of its epoch checkpoint) goes on with the others of the
    same leader, logs it once, and asks again a second later: the refusal
    does not abort the whole fetch round (before: an exception out of the
    fetcher, and the partitions after it never truncated)."""
    import errno
    import logging

    from storage.errors import StorageError

    a, b = pair
    placement = a.manager.placement
    shard = a.manager.shard_of(_key_led_by(placement, 1), 0)
    keys = [k for k in (b"s%d" % i for i in range(10000)) if a.manager.shard_of(k, 0) == shard][:2]
    for key in keys:
        a.append(key, 10)
    await _fetch_a_while(b, a, leader_id=1)
    for key in keys:
        a.append(key, 3)  # never fetched by b
    for node in (a, b):
        node.manager.state.adopt(shard, 2, 2, {1, 2})
    for key in keys:
        b.append(key, 4)
    refused = []
    bad = a.registry.get(keys[0]).log

    def enospc(offset):
        refused.append(offset)
        raise StorageError("write leader-epoch.checkpoint failed: ENOSPC (No space left on device)", errno.ENOSPC)

    monkeypatch.setattr(bad, "truncate_to", enospc)
    with caplog.at_level(logging.WARNING, logger="partita.replication"):
        await _fetch_a_while(a, b, leader_id=2, seconds=2.5)
    good = a.registry.get(keys[1]).log
    assert good.log_end_offset == 14 and good.epochs() == [(1, 0), (2, 10)]
    assert bad.log_end_offset == 13
    assert 2 <= len(refused) <= 4, refused  # once a second, not every fetch
    assert not any(r.exc_info for r in caplog.records)
    assert len([r for r in caplog.records if "truncation not applied" in r.getMessage()]) == 1
    monkeypatch.undo()
    await _fetch_a_while(a, b, leader_id=2, seconds=1.5)
    assert bad.log_end_offset == 14 and bad.epochs() == [(1, 0), (2, 10)]


async def test_a_high_watermark_checkpoint_this_disk_refuses_is_tried_again_rarely(pair, autojump_clock,
                                                                                  monkeypatch, caplog):
    """The high-watermark checkpoint only shortens what a restart shows at
    once (docs/guarantees.md): a disk that refuses it keeps the partition
    online, but it is not written (and the disk error logged) at every
    tick: tried again ``HW_RETRY_MS`` later, warned about once."""
    import errno
    import logging

    import cluster.replica_manager as rm
    from storage.errors import StorageError

    a, b = pair
    key = _key_led_by(a.manager.placement, 1)
    real = rm.write_atomic
    tried = []

    def failing(path, data, **kw):
        if path.name == rm.HW_CHECKPOINT:
            tried.append(data)
            raise StorageError(f"write {path} failed: EIO (Input/output error)", errno.EIO)
        return real(path, data, **kw)

    monkeypatch.setattr(rm, "write_atomic", failing)
    with caplog.at_level(logging.WARNING, logger="partita.replication"):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(b.manager.run_fetcher, 1, MemoryEndpoint(a.manager))
            for _ in range(150):  # 15 s of ticks, the high watermark moving all along
                a.append(key, 1)
                await trio.sleep(0.1)
                a.manager.tick()
            nursery.cancel_scope.cancel()
    assert a.registry.get(key).log.high_watermark > 100
    assert 2 <= len(tried) <= 3, len(tried)
    assert len([r for r in caplog.records if "high watermark checkpoint" in r.getMessage()]) == 1
    assert a.manager.offline_shards() == []


async def test_a_diverging_follower_is_told_to_truncate_before_it_appends(pair, autojump_clock):
    """The leader checks a fetch's last epoch against its own log (KIP-595):
    a follower whose truncation step was skipped (its REPLEPOCH answer was
    lost, say) must not append the leader's entries after an unrelated
    tail. Here b wrote one epoch-1 entry a never had; a leads at epoch 2."""
    a, b = pair
    key = _key_led_by(a.manager.placement, 1)
    shard = a.manager.shard_of(key, 0)
    a.append(key, 1)
    await _fetch_a_while(b, a, leader_id=1)  # b has the topic and a's first entry
    for node in (a, b):
        node.manager.state.adopt(shard, 2, 2, {1, 2})
    b.append(key, 1)  # b leads at epoch 2 for one entry, which a never fetches
    for node in (a, b):
        node.manager.state.adopt(shard, 1, 3, {1, 2})
    a.append(key, 3)  # a leads at epoch 3
    followed = b.manager._follows(1)
    for f in followed.values():
        f.epoch_truncated = 3  # as if the truncation step had been done
    await _fetch_a_while(b, a, leader_id=1)
    la, lb = a.registry.get(key).log, b.registry.get(key).log
    assert lb.log_end_offset == la.log_end_offset == 4
    assert lb.epochs() == la.epochs()
    assert _files(a.registry, key) == _files(b.registry, key)


class CorruptingLink:
    """A link to the leader's peer service that spoils each fetched
    partition with ``spoil`` while ``corrupt`` is set (a leader, or anyone
    answering on its bus address, sending malformed data)."""

    def __init__(self, leader: "Node2", spoil) -> None:
        self.inner = MemoryEndpoint(leader.manager)
        self.reply_timeout_s = self.inner.reply_timeout_s
        self.spoil = spoil
        self.corrupt = True
        self.spoiled = trio.Event()

    async def call(self, request):
        response = await self.inner.call(request)
        if not self.corrupt or not isinstance(response, FetchResponse):
            return response
        parts = tuple(self.spoil(p) if not p.error else p for p in response.partitions)
        if parts != response.partitions:
            self.spoiled.set()
        return dataclasses.replace(response, partitions=parts)


def _flip_a_byte(p):
    if not p.batches:
        return p
    tail = bytes([p.batches[-1] ^ 0xFF])
    return dataclasses.replace(p, batches=p.batches[:-1] + tail)


def _garbage_state(p):
    return dataclasses.replace(p, state=b"\x05\x00\x00\x00garbage")


@pytest.mark.parametrize("spoil", [_flip_a_byte, _garbage_state])
async def test_a_malformed_fetch_reply_is_logged_and_fetched_again_never_appended(pair, autojump_clock, caplog,
                                                                                   spoil):
    """Batches that fail their CRC, or a stream state blob that does not
    parse, are not applied (nothing appended, nothing truncated): the
    follower logs one line naming the partition, not a traceback, and asks
    again; once the leader's replies are whole it catches up."""
    a, b = pair
    key = _key_led_by(a.manager.placement, 1)
    a.append(key, 20)
    link = CorruptingLink(a, spoil)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(b.manager.run_fetcher, 1, link)
        await link.spoiled.wait()
        await trio.sleep(5)  # several fetch rounds, every one spoiled
        assert b.registry.get(key).log.log_end_offset == 0
        link.corrupt = False
        await trio.sleep(5)
        nursery.cancel_scope.cancel()
    assert _files(a.registry, key) == _files(b.registry, key)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    malformed = [r.getMessage() for r in caplog.records if "malformed" in r.getMessage()]
    assert len(malformed) == 1 and key.decode() in malformed[0], malformed


async def test_a_fetch_from_a_node_that_is_no_other_member_is_refused(pair, autojump_clock):
    a, _b = pair
    service = PeerService(a.manager)
    for stranger in (99, 1):  # not in the cluster; the leader itself
        with pytest.raises(BadRequest, match=f"node {stranger} is not another member"):
            await service.fetch(FetchRequest(stranger, b"", 0, 1000, b""))


async def test_a_partition_number_the_topic_never_had_is_unknown_and_never_created(pair, autojump_clock):
    """A peer's fetch or epoch query naming partition -1 (or one past the
    last) of an existing topic is answered UNKNOWN_PARTITION by every node,
    whichever leads the shard such a number would map to, and no partition
    is made for it on disk."""
    a, b = pair
    key = _key_led_by(a.manager.placement, 1)
    a.append(key, 3)
    await _fetch_a_while(b, a, leader_id=1)  # b has the topic too
    topic_id = a.registry.topic_id(key) or ""
    for node in (a, b):
        service = PeerService(node.manager)
        for n in (-1, 1, 2**70):
            fetch = FetchRequest(3 - node.manager.my_id, b"", 0, 1000, b"",
                                 (FetchPartition(key, n, topic_id, 0, -1, b"", b""),))
            answer = (await service.fetch(fetch)).partitions
            assert [(p.n, p.error) for p in answer] == [(n, rp.UNKNOWN_PARTITION)]
            ends = service.serve_now(EpochRequest((EpochPartition(key, n, 1),))).ends
            assert [e.error for e in ends] == [rp.UNKNOWN_PARTITION]
        assert node.registry.partitions_of(key) == 1
        assert sorted(p.name for p in node.registry.log_manager.topic_dir(key).iterdir() if p.is_dir()) \
            == ["partition-0"]


async def test_a_fetch_response_carries_at_most_the_leaders_byte_limit_whatever_it_asks(pair, autojump_clock):
    """A fetch naming one partition many times with a huge max-bytes (a
    stranger's, on an unauthenticated bus) gets at most the leader's
    ``fetch_response_max_bytes`` of batches (plus one batch: the first is
    sent whole), not the whole log once per mention."""
    a, _b = pair
    key = _key_led_by(a.manager.placement, 1)
    a.append(key, 200)  # 200 batches
    a.manager.settings.fetch_response_max_bytes = 2000
    whole = a.registry.get(key).log.read_batches(0, 1 << 30)[0]
    one = len(a.registry.get(key).log.read_batches(0, 1)[0])
    part = FetchPartition(key, 0, a.registry.topic_id(key) or "", 0, -1, b"", b"")
    answer = await PeerService(a.manager).fetch(FetchRequest(2, b"", 0, 10**18, b"", (part,) * 50))
    sent = sum(len(p.batches) for p in answer.partitions)
    assert len(whole) > 4 * 2000 and 0 < sent <= 2000 + one
    assert answer.partitions[0].batches == whole[:len(answer.partitions[0].batches)]


async def test_a_pause_longer_than_a_failover_asks_for_is_refused_and_writes_go_on(pair, autojump_clock):
    a, _b = pair
    key = _key_led_by(a.manager.placement, 1)
    shard = a.manager.shard_of(key, 0)
    service = PeerService(a.manager)
    assert PAUSE_MS <= PAUSE_MAX_MS
    for ms in (PAUSE_MAX_MS + 1, 10**12, -1):
        with pytest.raises(BadRequest, match="expected a pause of 0 to"):
            service.serve_now(PauseRequest(shard, a.manager.state.epoch(shard), ms))
    a.append(key, 1)  # not paused
    service.serve_now(PauseRequest(shard, a.manager.state.epoch(shard), PAUSE_MS))
    with pytest.raises(Paused):
        a.append(key, 1)


def test_group_journal_is_fetched_like_a_log(tmp_path):
    from storage.streams.groups import GroupStore
    from storage.streams.replica_state import apply_group_changes, group_changes

    class S:  # just enough of a Stream for groups_of()
        def __init__(self, d):
            d.mkdir()
            self.meta_path = d / "stream.meta"

    leader, follower = S(tmp_path / "l"), S(tmp_path / "f")
    lstore = groups_of(leader)
    lstore.create_group(b"g", (0, 0), 0)
    gen, pos, snap, records = group_changes(leader, -1, -1)
    assert snap is not None and records == b""  # unknown position: a snapshot first
    apply_group_changes(follower, snap, records)
    lstore.create_consumer(b"g", b"c", 1)
    lstore.deliver(b"g", b"c", [(1, 0), (2, 0)], (2, 0), 2, 5)
    lstore.ack(b"g", [(1, 0)])
    gen2, pos2, snap2, records2 = group_changes(leader, gen, pos)
    assert snap2 is None and records2 and pos2 > pos  # only the records since
    apply_group_changes(follower, snap2, records2)
    fstore = groups_of(follower)
    pel = lambda store: [(sid, e.consumer, e.delivery_count) for sid, e in store.group(b"g").pel.items()]  # noqa: E731
    assert pel(fstore) == pel(lstore) == [((2, 0), b"c", 1)]
    assert fstore.group(b"g").last_id == (2, 0)
    fstore.close()
    reopened = GroupStore.open(tmp_path / "f")  # the follower journaled what it applied
    assert pel(reopened) == [((2, 0), b"c", 1)]
    lstore.compact()
    _, _, snap3, _ = group_changes(leader, gen2, pos2)
    assert snap3 is not None  # the leader compacted: the old position is gone


def test_a_topic_copied_under_an_empty_id_keeps_it(tmp_path):
    """A leader whose topic.meta was rebuilt has no topic ID: its followers must
    copy that (empty) ID, not invent one — they would see a different
    incarnation on every fetch and throw their copy away each time."""
    cfg = types.SimpleNamespace(segment_bytes=4096, stream_node_max_entries=100)
    reg = TopicRegistry.open(tmp_path / "f", cfg)
    try:
        reg.adopt_topic(b"t", b'{"version": 1, "partitions": 1, "config": {}}')
        assert reg.topic_id(b"t") == ""
        reg.adopt_topic(b"t", b'{"version": 1, "partitions": 1, "config": {}}')
        assert reg.topic_id(b"t") == "" and reg.generation == 1  # nothing replaced
    finally:
        reg.close()


def test_a_half_created_topic_is_removed_at_start(tmp_path):
    """Killed inside TOPIC creation: a topic directory with no topic.meta and no
    partition was never acknowledged; it must not come back as an empty topic
    (without a topic ID) at the next start."""
    cfg = types.SimpleNamespace(segment_bytes=4096, stream_node_max_entries=100)
    (tmp_path / "d" / "topics" / "t.half").mkdir(parents=True)
    reg = TopicRegistry.open(tmp_path / "d", cfg)
    try:
        assert reg.topics() == [] and not (tmp_path / "d" / "topics" / "t.half").exists()
    finally:
        reg.close()
