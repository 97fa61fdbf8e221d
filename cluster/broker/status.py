"""What a node can tell about itself and its cluster, at one moment: the
status the HTTP front-end renders as Prometheus metrics and as the console.

Owns: ``snapshot(broker)``, one read of every topic and partition held here
(log offsets, sizes, segments, entries appended, where it is led, its ISR and
followers' lag on its leader), every consumer group on those partitions (lag,
pending entries, consumers, the member a topic-level group assigned the
partition to), the members of topic-level groups, the node's fsync rounds,
and in a cluster the nodes, shards and controller as this node knows them.

It only reads: group state through the session's XINFO calls
(``group_infos``, ``consumer_infos``), memberships without expiring anyone
(a dead member stays listed as not alive until a read hands its partitions
over), replication through the replica manager's views. Partitions this
node holds no replica of are listed by the cluster's metadata only, never
opened (opening one would create its directory).

Must not know: HTTP, Prometheus, JSON, metric names, the console.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from cluster.topics import partition_key


@dataclass(frozen=True, slots=True)
class PartitionStatus:
    """One partition. The log fields are None where no replica is held here."""

    topic: bytes
    partition: int
    key: bytes  # the partition's key (``topic#n``; the bare name for a one-partition topic)
    held: bool  # a replica lives on this node
    leading: bool  # this node serves its writes (always, on a single node)
    leader: int | None  # node id in a cluster, else None
    epoch: int | None
    replicas: tuple[int, ...]
    isr: tuple[int, ...]  # the leader's ISR on the leader, else the controller's committed view
    replica_lag: tuple[tuple[int, int], ...]  # (follower, entries behind), on the leader only
    log_start_offset: int | None = None
    log_end_offset: int | None = None
    high_watermark: int | None = None
    size_bytes: int | None = None
    segments: int | None = None
    entries: int | None = None  # XLEN
    entries_added: int | None = None  # entries ever appended (Redis's entries-added)


@dataclass(frozen=True, slots=True)
class ConsumerStatus:
    name: bytes
    pending: int
    idle_ms: int


@dataclass(frozen=True, slots=True)
class GroupPartitionStatus:
    """One consumer group on one partition held here."""

    topic: bytes
    partition: int
    group: bytes
    consumers: tuple[ConsumerStatus, ...]
    pending: int
    lag: int | None  # None: Redis's rules cannot tell (XINFO GROUPS's nil)
    entries_read: int | None
    last_id: tuple[int, int]
    owner: bytes | None  # the member a topic-level group assigned the partition to


@dataclass(frozen=True, slots=True)
class MemberStatus:
    """A member of a group reading a whole multi-partition topic."""

    topic: bytes
    group: bytes
    name: bytes
    partitions: tuple[int, ...]
    alive: bool
    idle_ms: int


@dataclass(frozen=True, slots=True)
class TopicStatus:
    name: bytes
    partitions: int


@dataclass(frozen=True, slots=True)
class NodeStatus:
    id: int
    host: str
    port: int
    bus_port: int
    fenced: bool  # the controller fenced it (no heartbeat): it leads nothing


@dataclass(frozen=True, slots=True)
class ShardStatus:
    shard: int
    first_slot: int
    last_slot: int
    leader: int
    epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ClusterStatus:
    node_id: int
    nodes: tuple[NodeStatus, ...]
    shards: tuple[ShardStatus, ...]
    controller_role: str  # leader, follower, candidate, precandidate
    controller_leader: int | None
    controller_term: int
    controller_voters: tuple[int, ...]
    elections_won: int
    leader_changes: int  # shard leader changes this node applied since it started


@dataclass(frozen=True, slots=True)
class BrokerStatus:
    topics: tuple[TopicStatus, ...]
    partitions: tuple[PartitionStatus, ...]
    groups: tuple[GroupPartitionStatus, ...]
    members: tuple[MemberStatus, ...]
    cluster: ClusterStatus | None
    entries_in: int  # entries appended here (every partition, since start)
    entries_out: int  # entries served to readers
    fsync_rounds: dict[str, Any]  # policy -> cluster.histogram.Histogram of round durations


def snapshot(broker: Any, may_see: Callable[[bytes], bool] | None = None) -> BrokerStatus:
    """The status of ``broker`` now; ``may_see(topic)`` False leaves a topic
    (and its groups) out (an ACL user's key patterns)."""
    session = broker.session()
    session.commit_deferred()  # the counters count every append before this
    topics = broker.topics
    replication = broker.replication
    manager = replication.manager if replication is not None else None
    names = [t for t in (topics.topics() if hasattr(topics, "topics") else [])
             if may_see is None or may_see(t)]
    topic_rows, partitions, groups = [], [], []
    for topic in names:
        count = topics.partitions_of(topic)
        topic_rows.append(TopicStatus(topic, count))
        for n in range(count):
            part = _partition(topics, manager, topic, n, count)
            partitions.append(part)
            if part.held:
                groups.extend(_groups(session, topics, topic, n, part.key))
    members = [m for t in names for m in _members(topics, t, broker.clock_ms())]
    stats = getattr(topics, "stats", None)
    durability = broker.durability
    session.take_receipt()  # reads only: nothing to wait for
    return BrokerStatus(
        tuple(topic_rows), tuple(partitions), tuple(groups), tuple(members),
        _cluster(replication) if replication is not None else None,
        stats.entries_in if stats is not None else 0, stats.entries_out if stats is not None else 0,
        dict(durability.round_durations) if durability is not None else {})


def _partition(topics: Any, manager: Any, topic: bytes, n: int, count: int) -> PartitionStatus:
    key = topic if count == 1 else partition_key(topic, n)
    if manager is None:
        placed: dict[str, Any] = {"held": True, "leading": True, "leader": None, "epoch": None,
                                  "replicas": (), "isr": (), "replica_lag": ()}
    else:
        shard = manager.shard_of(topic, n)
        replicas = tuple(manager.placement.replicas(shard))
        leader = manager.state.leader(shard)
        held = manager.my_id in replicas
        leading = held and leader == manager.my_id
        view = manager.partition_view(topic, n) if leading else {}
        lags = manager.replica_lags(topic, n) if leading else {}
        placed = {"held": held, "leading": leading, "leader": leader, "epoch": manager.state.epoch(shard),
                  "replicas": replicas,
                  "isr": tuple(view.get("isr") or sorted(manager.state.isr[shard])),
                  "replica_lag": tuple(sorted(lags.items()))}
    if not placed["held"]:
        return PartitionStatus(topic, n, key, **placed)
    stream = topics.stream_of(topic, n)
    plog = stream.log
    return PartitionStatus(
        topic, n, key, **placed, log_start_offset=plog.log_start_offset, log_end_offset=plog.log_end_offset,
        high_watermark=plog.high_watermark, size_bytes=plog.size_bytes, segments=plog.segment_count,
        entries=stream.length, entries_added=stream.entries_added)


def _groups(session: Any, topics: Any, topic: bytes, n: int, key: bytes) -> list[GroupPartitionStatus]:
    membership = {g: m for (t, g), m in topics.coordinators.items() if t == topic}
    out = []
    for info in session.group_infos(key):
        consumers = tuple(ConsumerStatus(c.name, c.pending, c.idle_ms)
                          for c in session.consumer_infos(key, info.name))
        m = membership.get(info.name)
        out.append(GroupPartitionStatus(topic, n, info.name, consumers, info.pending, info.lag,
                                        info.entries_read, tuple(info.last_id),
                                        m.owner_of(n) if m is not None else None))
    return out


def _members(topics: Any, topic: bytes, now_ms: int) -> list[MemberStatus]:
    out = []
    for (t, group), m in sorted(getattr(topics, "coordinators", {}).items()):
        if t != topic:
            continue
        coordinator = m.coordinator
        for member in sorted(coordinator.members.values(), key=lambda x: x.name):
            out.append(MemberStatus(topic, group, member.name, tuple(m.assigned(member.name)),
                                    coordinator.is_alive(member.name, now_ms), max(now_ms - member.last_seen_ms, 0)))
    return out


def _cluster(replication: Any) -> ClusterStatus:
    manager = replication.manager
    placement, state = manager.placement, manager.state
    nodes = tuple(NodeStatus(node.id, node.host, node.port, node.bus_port, node.id in state.fenced)
                  for node in sorted(placement.nodes, key=lambda x: x.id))
    shards = tuple(ShardStatus(s, *placement.slot_range(s), state.leader(s), state.epoch(s),
                               tuple(placement.replicas(s)), tuple(sorted(state.isr[s])))
                   for s in range(placement.shard_count))
    controller = replication.controller
    raft = controller.raft if controller is not None else None
    return ClusterStatus(
        manager.my_id, nodes, shards,
        raft.role if raft is not None else "none",
        raft.leader_id if raft is not None else None,
        raft.term if raft is not None else 0,
        tuple(controller.voters) if controller is not None else (),
        controller.counts["elections_won"] if controller is not None else 0,
        state.leader_changes)
