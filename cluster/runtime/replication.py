"""Replication in a running node: routing, acks, fetcher tasks.

Owns: building the ``cluster.replica_manager.ReplicaManager`` from the
config (``node-id``, ``cluster-nodes`` ...), the node's peer links (one per
peer and purpose, ``cluster.peer.link.Links``, made by the factory the
composition root injects) and its ``PeerService`` (what it answers peers),
the background tasks (one fetcher per leader this node follows, restarted
when the cluster view changes; the ISR/high-watermark tick; the controller,
cluster/runtime/controller_driver.py), ``route`` (``Moved`` for keys led
elsewhere, ``TryAgain`` once the controller lease lapsed; the front-end
calls it in cluster mode only), the acks=all wait a connection does before
sending an XADD's or a group write's reply, ``WAIT``'s count, waking blocked
readers when a high watermark moves, handing topic changes to the
controller, the cluster-wide topic catalogue (``topic_names``,
``describe_topic``: TOPIC LIST and DESCRIBE from the controller's
committed metadata), the forwarded XADD (``forwarder``,
cluster/runtime/forwarding.py), topic-wide reads across nodes (``fanout``,
cluster/runtime/fanout.py), and the coordinated leadership move
(``take_shard``: CLUSTER FAILOVER, preferred leaders, reassignment).

What it needs of the front-end is the ``Host`` below (set as ``host`` by
the composition root): key signals and waits, and the fsync policy for what
a follower appends.

Must not know: the front-end's protocol and sockets (``PeerLink``s are
injected), the replication rules themselves (cluster/replication.py).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any, Callable, Protocol

import trio

from cluster.controller.metadata import Metadata
from cluster.errors import ClusterDown, ClusterError, CrossSlot, Moved, NotEnoughReplicas, Paused, Refused, TryAgain
from cluster.nodes import ClusterState, Node, Placement, parse_cluster_nodes
from cluster.peer.link import Links, PeerLink
from cluster.peer.messages import PauseRequest, PauseResponse
from cluster.peer.service import TOPICS_CHANGED, PeerService, groups_changed
from cluster.replica_manager import ReplicaManager, Settings
from cluster.runtime.controller_driver import Controller, NotReady
from cluster.runtime.fanout import FanOut
from cluster.runtime.forwarding import Forwarder
from cluster.topics import UNKNOWN_TOPIC, TopicError, TopicMeta, partition_key, split_partition_key
from storage.streams.replica_state import state_version

log = logging.getLogger("partita.replication")
TICK_S = 0.1
FAILOVER_TIMEOUT_S = 10.0
PAUSE_MS = 15000
# Commands whose keys must hash to one slot, as Redis Cluster requires of
# every multi-key command (-CROSSSLOT): they change their keys together, on
# one node. Others run when every key is led here.
ONE_SLOT = frozenset({"rename", "renamenx"})
# Commands with keys that every node answers from the committed metadata
# (``describe_topic``): not routed (no -MOVED, no lease).
ANY_NODE = frozenset({"topic|describe"})
# What TOPIC DESCRIBE shows of a partition's log (TopicRegistry.describe_partition)
# only where this node holds a copy.
PARTITION_FIGURES = ("length", "log-start-offset", "log-end-offset", "segments", "bytes",
                     "last-generated-id", "producers")
# Commands that take a multi-partition topic key on any node: the broker
# reads partitions led elsewhere from their leaders (cluster/runtime/fanout.py),
# or asks them and the group coordinator for the groups (XINFO GROUPS /
# CONSUMERS, TOPIC GROUPS: cluster/broker/topic_groups.py). XINFO STREAM
# needs a partition key: any node refuses a topic key as one node does.
FANS_OUT = frozenset({"xlen", "xrange", "xrevrange", "xread", "xinfo|groups", "xinfo|consumers", "topic|groups",
                      "xinfo|stream"})
# Commands a READONLY connection has served from a follower copy of the
# key's partition, committed entries only (Redis Cluster's replica reads):
# the stream reads. Writes and every group command (XREADGROUP, XPENDING,
# XINFO GROUPS ...) go to the leader (-MOVED).
FOLLOWER_READS = frozenset({"xlen", "xrange", "xrevrange", "xread", "xinfo|stream"})
# Commands that take a multi-partition topic key on the leader of its slot
# (``-MOVED`` elsewhere): XADD picks the partition there and forwards the
# entry (cluster/runtime/forwarding.py); the topic's group coordinator is
# there (cluster/broker/topic_groups.py): XREADGROUP, and XGROUP, which
# changes the membership it holds and has each partition's leader change
# the partition's group (cluster/broker/groups.py).
SLOT_LED = frozenset({"xadd", "xreadgroup", "xgroup|create", "xgroup|setid", "xgroup|destroy",
                      "xgroup|createconsumer", "xgroup|delconsumer", "xgroup|config"})


class FailoverError(Exception):
    """A leadership move that could not be made (the reason is the message)."""


class PendingWrites(dict):
    """A receipt's ``repl_pending`` (``note_pending``): what its acks=all
    wait checks, by key, and in ``epochs`` the leader epoch of each
    partition ``(topic, n)`` at its first write among them. A wait fails
    when the partition is led here at another epoch by then: in between this
    node lost it (its writes truncated away as it followed the new leader)
    and took it back, and the positions it would compare are of the new
    epoch's log and journal, which the writes may not be in."""

    __slots__ = ("epochs",)

    def __init__(self) -> None:
        super().__init__()
        self.epochs: dict[tuple[bytes, int], int] = {}


def _written_epochs(pending: dict) -> dict[tuple[bytes, int], int]:
    """The leader epochs ``pending``'s writes were made at (none recorded:
    a plain dict, e.g. ``unreplicated``'s, waits as of now)."""
    return pending.epochs if type(pending) is PendingWrites else {}


class AcksFailed(Exception):
    """An acks=all write was appended but can no longer be acknowledged."""


class Host(Protocol):
    """What replication needs of the front-end that runs it (``ServerState``)."""

    def signal_key_modified(self, key: bytes) -> None:
        """A key changed: wake its blocked readers (and long-polling fetches)."""

    async def wait_for_keys(self, keys: list[bytes], timeout_s: float | None, *, internal: bool = False) -> bool:
        """Wait until one of ``keys`` is signalled; False on timeout."""

    durability: Any  # ``note_write(target, policy) -> seq``, ``when_durable(seq, callback)``


def build(config: Any, topics: Any, connect: Callable[[Node], PeerLink]) -> "Replication | None":
    """The node's replication, or None on a single node (no cluster-nodes).
    ``connect(node)`` makes a link to a peer (the front-end's transport)."""
    if not config.cluster_nodes:
        return None
    nodes = parse_cluster_nodes(config.cluster_nodes)
    placement = Placement(nodes, config.node_id, config.replication_factor, joining=bool(config.cluster_join))
    state = ClusterState(placement, Path(config.dir))
    settings = Settings(lag_max_ms=config.replica_lag_time_max_ms,
                        fetch_wait_ms=config.replica_fetch_wait_max_ms,
                        fetch_max_bytes=config.replica_fetch_max_bytes)
    manager = ReplicaManager(topics, placement, state, settings)

    def apply(name: str, value: Any) -> None:  # CONFIG SET reaches the running replication
        if name == "replica-lag-time-max-ms":
            settings.lag_max_ms = value
            for ls in manager.leaders.values():
                ls.lag_max_ms = value
        elif name == "replica-fetch-wait-max-ms":
            settings.fetch_wait_ms = value
        elif name == "replica-fetch-max-bytes":
            settings.fetch_max_bytes = value

    config.on_change(apply)
    repl = Replication(config, topics, manager, connect)
    repl.controller = Controller(config, repl)
    return repl


def _follower_synced(error: Exception | None, sent: int | None) -> None:
    """Nobody waits for a follower's fsync-always round; a failure has taken
    the log offline (its heartbeat reports the shard)."""


class Replication:
    def __init__(self, config: Any, topics: Any, manager: ReplicaManager,
                 connect: Callable[[Node], PeerLink]) -> None:
        self.config = config
        self.topics = topics
        self.manager = manager
        self.host: Host | None = None  # set by the composition root
        self.controller: Any = None  # cluster.runtime.controller_driver.Controller, set by build()
        self.links = Links(lambda node_id: connect(manager.placement.by_id[node_id]))
        self.service = PeerService(manager, replication=self)
        self.forwarder = Forwarder(self)
        self.fanout = FanOut(self)
        self._moving: set[int] = set()  # shards this node is taking back
        self._hw_changed = trio.Event()
        manager.on_hw_advance = self._on_hw_advance
        self._group_progress = trio.Event()
        manager.on_group_progress = self._on_group_progress
        manager.on_applied = self._note_follower_write
        self._writes: dict[bytes, tuple] = {}  # partition key -> (stamp, leader state, acks=all, shard)
        # acks=all replies waiting: partition key -> [(end offset, leader
        # epoch written at, event or _AcksWaiter)]
        self._ack_waiters: dict[bytes, list[tuple[int, int, Any]]] = {}
        self._config_generation = 0

        def config_changed(name: str, value: Any) -> None:
            self._config_generation += 1

        config.on_change(config_changed)
        # Topic metadata changes made here, not yet handed to the controller (in order).
        self._topic_news: list[bytes] = []
        self._topic_news_ready = trio.Event()
        topics.on_change = self.broadcast_topic
        topics.key_filter = self.leads_key

    def _note_follower_write(self, target: Any) -> None:
        """A follower appended fetched batches to a log, or changes to a
        group store: it reaches the disk by the node's (or the topic's)
        fsync policy, as the leader's own writes do (within a second under
        everysec; a round of the group commit under always, though no reply
        waits on it). Before, a follower synced only when it closed its
        logs: its recovery point stood still, so a restart CRC-checked its
        whole log, and a power loss could take more than the last second."""
        host = self.host
        if host is None:
            return
        durability = host.durability
        seq = durability.note_write(target, self.config.fsync)
        if seq:
            durability.when_durable(seq, _follower_synced)

    def link(self, node_id: int, purpose: str = "fetch") -> PeerLink:
        """The link to ``node_id`` for ``purpose`` (a connection of its own)."""
        return self.links.get(node_id, purpose)

    # -- routing ------------------------------------------------------------

    def route(self, spec: Any, argv: list[bytes], replica_reads: bool = False) -> ClusterError | None:
        """``Moved`` for the first key this node does not lead when one node
        leads every key, ``CrossSlot`` when none does; an error for a
        multi-partition topic key whose partitions are not all led here,
        except those of ``SLOT_LED``: they run where the topic key's slot is
        led (XADD forwards to the chosen partition's leader,
        cluster/runtime/forwarding.py; the group coordinator of XREADGROUP
        and XGROUP is there, cluster/broker/topic_groups.py), and the
        commands of ``FANS_OUT``: they run on any node, which reads the
        partitions led elsewhere from their leaders (cluster/runtime/fanout.py).
        ``replica_reads`` (a READONLY connection): the commands of
        ``FOLLOWER_READS`` run here on keys whose partition this node holds
        a follower copy of that has heard from its leader
        (``ReplicaManager.committed_copy``), reading its committed entries;
        the controller lease is not asked for them (a follower's view is
        committed data whoever leads; how far it trails is
        docs/replication.md's).
        ``spec`` is the command's (``name``, ``flags``, ``key_indexes``)."""
        if spec.name in ANY_NODE:
            return None
        try:
            indexes = spec.key_indexes(argv)
        except Exception:  # noqa: BLE001 - malformed: the handler answers it
            return None
        manager = self.manager
        if indexes and manager.placement.shard_count == 0:
            return ClusterDown("this node is joining the cluster and holds no slots yet")
        topics = self.topics
        if spec.name in ONE_SLOT and len({manager.key_shard(argv[i])[0] for i in indexes}) > 1:
            return CrossSlot()
        admin = spec.name.startswith("topic|")  # TOPIC ... runs where the topic name's slot is led
        copies = 0  # keys served from a follower copy (``replica_reads``)
        moved: Moved | None = None  # the first key led elsewhere
        leaders: set[int] = set()  # of the keys routed by their slot
        for i in indexes:
            key = argv[i]
            try:
                if (not admin or spec.name in FANS_OUT) and topics.is_multi(key):
                    if spec.name in SLOT_LED:
                        manager.check_key(key)  # -MOVED to the topic key's slot leader
                        leaders.add(manager.my_id)
                        continue
                    if spec.name in FANS_OUT:
                        continue
                    refusal = self.fan_out_refusal(key)
                    if refusal is not None:
                        return refusal
                    continue
                shard = manager.check_key(key)
                leaders.add(manager.my_id)
                if manager.is_paused(shard) and "write" in spec.flags:
                    return Paused()
            except Moved as e:
                if replica_reads and spec.name in FOLLOWER_READS and manager.committed_copy(key):
                    copies += 1
                    continue
                leaders.add(e.leader.id)
                moved = moved or e
        if moved is not None:
            # No one node leads every key: the command runs nowhere, and a
            # -MOVED would send the client to and fro; Redis's -CROSSSLOT.
            return moved if len(leaders) == 1 else CrossSlot()
        if len(indexes) > copies and time.monotonic() >= self.controller.lease_expiry_s:  # (lease_ok, inlined)
            # Every key is led here (or a follower copy's), but this node may have been replaced.
            return TryAgain("this node has lost contact with the cluster controller "
                            "(its leadership may be moving); retry shortly")
        return None

    def fan_out_refusal(self, key: bytes) -> ClusterError | None:
        """Why a command on multi-partition topic ``key`` that reaches every
        partition (XTRIM ...) cannot run here: some
        partitions are led by other nodes (only ``FANS_OUT`` and ``SLOT_LED``
        work across nodes yet); None when this node leads them
        all. ``route`` asks it before the command runs."""
        manager = self.manager
        away = []
        for n in range(self.topics.partitions_of(key)):
            leader = manager.state.leader(manager.shard_of(key, n))
            if leader != manager.my_id:
                away.append(f"{partition_key(key, n).decode('utf-8', 'replace')} on "
                            f"{manager.placement.by_id[leader].address}")
        if not away:
            return None
        return ClusterError(
            f"topic '{key.decode('utf-8', 'replace')}' has partitions led by other "
            f"nodes ({', '.join(away[:4])}{', ...' if len(away) > 4 else ''}): "
            "in a cluster only XADD, XREADGROUP, XLEN, XRANGE, XREVRANGE, XREAD, XINFO GROUPS / CONSUMERS, "
            "TOPIC GROUPS and XGROUP take a topic key; for other commands use partition keys ('<topic>#<n>')")

    def unreplicated(self, topic: bytes) -> dict:
        """The acks=all writes to ``topic`` (led here) that the in-sync
        replicas do not hold yet, as a receipt's ``repl_pending`` lists
        them (``wait_acks``): entries above a partition's high watermark,
        group journal records not applied by every in-sync follower. A
        RENAME waits for them first: once the topic has its new name a
        wait under the old one would end unreplicated (``_written_away``)."""
        manager = self.manager
        pending: dict = {}
        if not manager.acks_all(topic):
            return pending
        for n in range(self.topics.partitions_of(topic)):
            ls = manager.leader_state(topic, n)
            if ls is None:
                continue  # (led elsewhere: ``route`` and ``rename`` refuse)
            stream = self.topics.stream_of(topic, n)
            if stream.log.high_watermark < stream.log.log_end_offset:
                pending[partition_key(topic, n)] = stream
            store = stream.__dict__.get("group_store")
            if store is not None and not ls.groups_replicated(store.journal_position()):
                pending[("groups", topic, n)] = store
        return pending

    def rename(self, client: Any, topic: bytes, dst: bytes) -> None:
        """RENAME of ``topic`` (led here: ``route`` saw to it) to ``dst`` (the
        same slot: ``route`` again), once its writes are replicated
        (``unreplicated``). The high watermarks are saved first, so the
        renamed partitions start where these stand (read from the checkpoint
        when they open again). The followers rename their copies when the
        change reaches them (``TopicRegistry.adopt_topic``, by topic ID);
        on an acks=all topic the client's receipt waits until the
        controller committed it (``wait_acks``), so a leader that dies
        after the reply leaves the new name to the one that takes over.

        Raises ClusterError for a topic of several partitions one of whose
        new keys ``dst#n`` would be in another slot range than
        ``topic#n`` (its data would have to move to other replicas).
        """
        manager = self.manager
        count = self.topics.partitions_of(topic)
        for n in range(1, count):
            if manager.shard_of(topic, n) != manager.shard_of(dst, n):
                raise ClusterError(
                    f"RENAME of topic '{topic.decode('utf-8', 'replace')}' ({count} partitions): "
                    f"'{partition_key(topic, n).decode('utf-8', 'replace')}' and "
                    f"'{partition_key(dst, n).decode('utf-8', 'replace')}' are in different slot ranges; "
                    "in a cluster a topic of several partitions is renamed only when each partition keeps "
                    "its slot range (names with one hash tag do: '{t}a' to '{t}b')")
        acks_all = manager.acks_all(topic)
        manager.save_hw_checkpoints()
        first = len(self._topic_news)
        self.topics.rename(topic, dst)
        if acks_all:
            for record in self._topic_news[first:]:  # (queued by ``broadcast_topic`` just now)
                self.note_pending(client, ("topics", record), record)

    def leads_key(self, key: bytes) -> bool:
        """Whether this node leads the slot of ``key`` (False while it joins
        and holds no slots)."""
        if self.manager.placement.shard_count == 0:
            return False
        try:
            self.manager.check_key(key)
        except Moved:
            return False
        return True

    # -- writes ---------------------------------------------------------------

    def before_append(self, client: Any, pkey: bytes, stream: Any) -> bool:
        """Before an XADD to partition key ``topic#n`` appends. True when its
        reply must wait for the in-sync replicas (acks=all; noted in
        ``client.repl_pending``, ``note_pending``). Raises Moved / Paused /
        NotEnoughReplicas (nothing written).

        The hot path of every replicated XADD: what it needs per partition
        (leader state, acks) is cached until the cluster view, the topics or
        the config change."""
        manager = self.manager
        stamp = (manager.state.version, self.topics.generation, self._config_generation)
        cached = self._writes.get(pkey)
        if cached is None or cached[0] != stamp:
            topic, n = split_partition_key(pkey)
            ls = manager.before_append(topic, n or 0)  # raises when not leader / too few in sync
            cached = (stamp, ls, manager.acks_all(topic), manager.shard_of(topic, n or 0), (topic, n or 0))
            if len(self._writes) >= 65536:
                self._writes.clear()
            self._writes[pkey] = cached
        else:
            ls = cached[1]
            if manager.paused and manager.is_paused(cached[3]):
                raise Paused()
            if cached[2] and len(ls.isr) < ls.min_insync:
                manager.before_append(*split_partition_key(pkey))  # raises with the full message
        writes = client.repl_writes
        if writes is None:
            writes = client.repl_writes = {}
        writes[pkey] = stream
        if cached[2]:
            self.note_pending(client, pkey, stream, cached[4], ls.epoch)
        return cached[2]

    @staticmethod
    def note_pending(client: Any, key: Any, value: Any, partition: tuple[bytes, int] | None = None,
                     epoch: int = -1) -> None:
        """Add an acks=all write to ``client.repl_pending`` (``wait_acks``
        says what ``key`` and ``value`` are), made to ``partition`` led here
        at ``epoch``: the first write's epoch per partition is the one its
        wait holds the partition to (``PendingWrites``)."""
        pending = client.repl_pending
        if pending is None:
            pending = client.repl_pending = PendingWrites()
        pending[key] = value
        if partition is not None:
            pending.epochs.setdefault(partition, epoch)

    def ack_marks(self, pending: dict) -> dict:
        """What an acks=all wait for ``pending`` must see, taken right after
        its writes: each partition's end offset and the leader epoch it was
        written at (``PendingWrites.epochs``; not recorded: the one now, -1:
        not led here). A wait that starts later (a Kafka
        response queued behind others) takes these, not the log as it is
        then: by then this node may have lost the partition, truncated the
        writes away and copied the new leader's log past their end."""
        marks = {}
        written = _written_epochs(pending)
        for pkey, stream in pending.items():
            if type(pkey) is not tuple:
                topic, n = split_partition_key(pkey)
                ls = self.manager.leader_state(topic, n or 0)
                epoch = ls.epoch if ls is not None else -1
                marks[pkey] = (stream.log.log_end_offset, written.get((topic, n or 0), epoch))
        return marks

    async def wait_acks(self, client: Any, pending: dict, marks: dict | None = None) -> None:
        """Wait until every partition in ``pending`` (``partition key ->
        stream`` of the batch's acks=all writes) has its high watermark at its
        end offset as of now (``marks``: as of ``ack_marks`` then), this node
        leading it still at the epoch it was written at, every in-sync
        replica has applied the group journal of each ``("groups", topic,
        n) -> group store`` and the stream state (deletion markers, trims,
        metadata) of each ``("state", topic, n) -> stream`` as of now, this
        node leading each partition at the epoch its writes were made at
        (``PendingWrites.epochs``; a plain dict: as of now), and the
        controller has committed each ``("topics", record) -> record`` (a
        RENAME's topic changes, ``rename``).

        Raises AcksFailed when the ISR fell below min-insync-replicas before
        that happened, or this node stopped leading the partition (or leads
        it at another epoch: the high watermark and the followers' journal
        positions are then of another leader's log and journal, which the
        writes may not be in), or lost contact with the controller before it
        committed a topic record.
        """
        groups = [(key, store, store.journal_position()) for key, store in pending.items()
                  if type(key) is tuple and key[0] == "groups"]
        states = [(key, state_version(stream)) for key, stream in pending.items()
                  if type(key) is tuple and key[0] == "state"]
        records = [record for key, record in pending.items() if type(key) is tuple and key[0] == "topics"]
        if marks is None:
            marks = self.ack_marks(pending)
        targets = [(pkey, stream, *marks[pkey]) for pkey, stream in pending.items() if type(pkey) is not tuple]
        for pkey, stream, end, epoch in targets:
            while not self._written_away(pkey, stream):
                topic, n = split_partition_key(pkey)
                ls = self.manager.leader_state(topic, n or 0)
                if ls is None or ls.epoch != epoch:
                    raise self._moved(pkey)
                if stream.log.high_watermark >= end:
                    break
                refused = self._acks_refused(pkey)
                if refused is not None:
                    raise refused
                # Woken when this partition's high watermark reaches ``end``
                # (not by every advance of every partition: 50 pipelined
                # clients would all wake on each follower fetch), or by the
                # tick, to re-check the ISR and the leadership above.
                event = trio.Event()
                waiters = self._ack_waiters.get(pkey)
                if waiters is None:
                    waiters = self._ack_waiters[pkey] = []
                entry = (end, epoch, event)
                waiters.append(entry)
                try:
                    with trio.move_on_after(TICK_S):
                        await event.wait()
                finally:
                    if not event.is_set():  # the tick (or a cancel) ended the wait
                        left = self._ack_waiters.get(pkey)
                        if left is not None and entry in left:
                            left.remove(entry)
                            if not left:
                                del self._ack_waiters[pkey]

        written = _written_epochs(pending)
        for (_, topic, n), _store, target in groups:
            await self._wait_followers(topic, n, written.get((topic, n)),
                                       lambda ls, target=target: ls.groups_replicated(target))
        for (_, topic, n), version in states:
            await self._wait_followers(topic, n, written.get((topic, n)),
                                       lambda ls, version=version: ls.state_replicated(version))
        if records:
            await self._wait_committed(records)

    def when_acked(self, client: Any, pending: dict, callback: Any) -> None:
        """``wait_acks`` without awaiting: ``callback(None)`` once it would
        return, ``callback(error)`` (an ``AcksFailed``) once it would raise.
        The callback runs on whichever task moves the partition's high
        watermark (``_on_hw_advance``) or on the tick, which re-checks the ISR
        and the leadership as ``wait_acks`` does, and must not block (a
        connection hands its held replies over this way and goes back to
        reading, so a fetch round does not wake every writer)."""
        if any(type(key) is tuple for key in pending):  # group journals, topic records: the awaiting path
            trio.lowlevel.spawn_system_task(self._acked_then, client, pending, callback)
            return
        waiting = []
        written = _written_epochs(pending)
        cached_stream, leader_state = self.topics.cached_stream, self.manager.leader_state
        for pkey, stream in pending.items():  # (per batch: one key split and one leader state lookup)
            end = stream.log.log_end_offset
            topic, n = split_partition_key(pkey)
            if cached_stream(topic, n or 0) is not stream:
                continue  # written away (``_written_away``)
            ls = leader_state(topic, n or 0)
            if ls is not None and written.get((topic, n or 0), ls.epoch) != ls.epoch:
                callback(self._moved(pkey))  # (its high watermark is of another epoch's log)
                return
            if stream.log.high_watermark >= end:
                continue
            refused = self._refusal(pkey, ls)
            if refused is not None:
                callback(refused)
                return
            waiting.append((pkey, end, ls.epoch))
        if not waiting:
            callback(None)
            return
        waiter = _AcksWaiter(callback, len(waiting))
        for pkey, end, epoch in waiting:
            waiters = self._ack_waiters.get(pkey)
            if waiters is None:
                waiters = self._ack_waiters[pkey] = []
            waiters.append((end, epoch, waiter))

    async def _acked_then(self, client: Any, pending: dict, callback: Any) -> None:
        try:
            await self.wait_acks(client, pending)
        except AcksFailed as e:
            callback(e)
        except Exception as e:  # a bug must not leave the writer unanswered forever
            log.exception("waiting for acks=all failed")
            callback(AcksFailed(str(e)))
        else:
            callback(None)

    def _written_away(self, pkey: bytes, stream: Any = None) -> bool:
        """The partition an acks=all write went to is no longer there as it
        was written (its topic deleted or renamed since; ``stream``: the
        one written, else any): nothing of it is left to replicate under
        that name, and the command that removed it came after the write, so
        the write's wait is over (it must not fail: the writer would lose
        its connection for a key that a later command removed)."""
        topic, n = split_partition_key(pkey)
        current = self.topics.cached_stream(topic, n or 0)
        return current is None or (stream is not None and current is not stream)

    def _epoch_led(self, pkey: bytes) -> int:
        """The leader epoch at which this node leads ``pkey``; -1: not led here."""
        topic, n = split_partition_key(pkey)
        ls = self.manager.leader_state(topic, n or 0)
        return ls.epoch if ls is not None else -1

    @staticmethod
    def _moved(pkey: bytes) -> AcksFailed:
        return AcksFailed(f"{pkey!r}: this node no longer leads it as when it was written")

    def _acks_refused(self, pkey: bytes) -> "AcksFailed | None":
        """Why an acks=all write to ``pkey`` can no longer be acknowledged, or None."""
        topic, n = split_partition_key(pkey)
        return self._refusal(pkey, self.manager.leader_state(topic, n or 0))

    @staticmethod
    def _refusal(pkey: bytes, ls: Any) -> "AcksFailed | None":
        """``_acks_refused`` given the partition's leader state here (None: not led here)."""
        if ls is None:
            return AcksFailed(f"{pkey!r}: this node no longer leads it")
        if not ls.accepts_acks_all():
            return AcksFailed(f"{pkey!r}: {len(ls.isr)} in-sync replica(s), "
                              f"min-insync-replicas {ls.min_insync}")
        return None

    def _recheck_ack_waiters(self) -> None:
        """The tick: fail handed-over acks=all waits (``when_acked``) whose
        partition lost its ISR or its leader here, or is led here at another
        epoch than when it was written; awaiting ones re-check themselves."""
        for pkey, waiters in list(self._ack_waiters.items()):
            handed = [(epoch, w) for _, epoch, w in waiters if type(w) is _AcksWaiter and not w.done]
            if not handed:
                continue
            if self._written_away(pkey):
                for _, waiter in handed:
                    waiter.set()  # (this partition's part of its wait is over)
                del self._ack_waiters[pkey]
                continue
            refused = self._acks_refused(pkey)
            current = self._epoch_led(pkey)
            for epoch, waiter in handed:
                if refused is not None:
                    waiter.fail(refused)
                elif epoch != current:
                    waiter.fail(self._moved(pkey))
            keep = [entry for entry in waiters if not (type(entry[2]) is _AcksWaiter and entry[2].done)]
            if keep:
                self._ack_waiters[pkey] = keep
            else:
                del self._ack_waiters[pkey]

    def note_group_write(self, ctx: Any, store: Any) -> None:
        """A command changed a consumer group of a partition led here: the
        followers' held fetches wake to carry the journal's new records; on
        an acks=all topic its reply waits until every in-sync replica has
        applied the group journal this far (``wait_acks``), so an
        acknowledged XACK, XCLAIM or XGROUP survives a leader change as an
        acknowledged XADD does."""
        found = self.manager.partition_at(store.directory)
        ls = self.manager.leader_state(*found) if found is not None else None
        if ls is None:
            return
        if self.host is not None:  # now, not after replica-fetch-wait-max-ms
            self.host.signal_key_modified(groups_changed(*found))
        if self.manager.acks_all(found[0]):
            self.note_pending(ctx, ("groups", *found), store, found, ls.epoch)

    def note_state_write(self, ctx: Any, stream: Any) -> None:
        """A command changed a partition's stream state here (XDEL's and
        XTRIM's deletion markers and log start, XSETID's metadata; the
        followers' held fetches already woke on its key): on an acks=all
        topic its reply waits until every in-sync replica has applied that
        state (``wait_acks``), so an acknowledged XDEL is not undone by a
        leader change."""
        found = self.manager.partition_at(stream.log.directory)
        ls = self.manager.leader_state(*found) if found is not None else None
        if ls is not None and self.manager.acks_all(found[0]):
            self.note_pending(ctx, ("state", *found), stream, found, ls.epoch)

    async def _wait_followers(self, topic: bytes, n: int, epoch: int | None,
                              applied: Callable[[Any], bool]) -> None:
        """Until ``applied(leader state)`` (every in-sync follower has
        applied a group journal or stream state this far), this node leading
        the partition at ``epoch`` (the write's, ``PendingWrites``; None: not
        recorded, any) meanwhile."""
        name = self.manager.canonical_key(topic, n)
        while True:
            if self.topics.cached_stream(topic, n) is None:
                return  # the partition was deleted (or renamed) since: nothing left to replicate
            ls = self.manager.leader_state(topic, n)
            if ls is None:
                raise AcksFailed(f"{name!r}: this node no longer leads it")
            if epoch is not None and ls.epoch != epoch:
                raise AcksFailed(f"{name!r}: this node leads it at epoch {ls.epoch}, not {epoch} as when it was written")
            if applied(ls):
                return
            if not ls.accepts_acks_all():
                raise AcksFailed(f"{name!r}: {len(ls.isr)} in-sync replica(s), min-insync-replicas {ls.min_insync}")
            with trio.move_on_after(TICK_S):
                await self._group_progress.wait()

    async def _wait_committed(self, records: list[bytes]) -> None:
        """Until the controller has committed (and this node applied) every
        topic record of ``records`` (``broadcast_topic``'s, of a RENAME).
        Raises AcksFailed once this node has lost contact with the
        controller (its lease lapsed): the change is proposed again, and
        reaches the others, when it is back."""
        controller = self.controller
        while not all(controller.has_applied(record) for record in records):
            if not controller.lease_ok():
                raise AcksFailed("this node lost contact with the cluster controller before the "
                                 "topic change was committed")
            with trio.move_on_after(TICK_S):
                await controller.applied_event().wait()

    def _on_group_progress(self) -> None:
        event, self._group_progress = self._group_progress, trio.Event()
        event.set()

    def _on_hw_advance(self, topic: bytes, n: int) -> None:
        event, self._hw_changed = self._hw_changed, trio.Event()
        event.set()
        pkey = partition_key(topic, n)
        waiters = self._ack_waiters.get(pkey)
        stream = self.topics.cached_stream(topic, n) if waiters else None
        if stream is not None:
            hw = stream.log.high_watermark
            current = self._epoch_led(pkey)
            keep = []
            for entry in waiters:
                end, epoch, waiter = entry
                if end > hw:
                    if not waiter.is_set():
                        keep.append(entry)
                elif epoch == current or type(waiter) is not _AcksWaiter:
                    waiter.set()  # (an awaiting writer checks the epoch itself)
                else:  # this high watermark is of a log the write may not be in
                    waiter.fail(self._moved(pkey))
            if keep:
                self._ack_waiters[pkey] = keep
            else:
                del self._ack_waiters[pkey]
        host = self.host
        if host is not None:
            for key in {topic, partition_key(topic, n), self.manager.canonical_key(topic, n)}:
                host.signal_key_modified(key)

    def replicas_acknowledging(self, client: Any) -> int:
        """WAIT's count: replicas holding every write of this client so far.
        A write's offset is not kept: the partition's end offset now is at or
        past it, so a replica counted here holds it."""
        writes = client.repl_writes
        if not writes:
            return 0  # no write: nothing to count (Redis also answers 0 before any write)
        best = None
        for pkey, stream in list(writes.items()):
            end = stream.log.log_end_offset
            topic, n = split_partition_key(pkey)
            ls = self.manager.leader_state(topic, n or 0)
            count = ls.replicas_at(end) if ls is not None else 0
            best = count if best is None else min(best, count)
        return best or 0

    async def wait_replicas(self, client: Any, numreplicas: int, timeout_s: float | None) -> int:
        with trio.move_on_after(timeout_s if timeout_s is not None else float("inf")):
            while self.replicas_acknowledging(client) < numreplicas:
                await self._hw_changed.wait()
        return self.replicas_acknowledging(client)

    # -- topic metadata ---------------------------------------------------------

    def topic_names(self) -> list[bytes]:
        """TOPIC LIST in a cluster: every topic of the cluster, sorted, from
        the controller's committed metadata, which every node applies — so
        every node answers alike, also one that leads nothing. For the topics
        whose name's slot this node leads, its own registry counts instead:
        their changes are made here first and committed after (in the
        background), so what a client just created, altered or deleted here
        shows here at once, and elsewhere once committed."""
        led = set(self.topics.keys())  # (those whose name's slot is led here: ``leads_key``)
        return sorted(led | {t for t in self.controller.meta.topics if not self.leads_key(t)})

    def topic_meta(self, topic: bytes) -> TopicMeta | None:
        """``topic``'s partitions and config as the cluster has them (as
        ``topic_names`` decides whose copy counts); None: no such topic."""
        if self.leads_key(topic):
            blob = self.topics.topic_meta_blob(topic)
        else:
            known = self.controller.meta.topics.get(topic)
            blob = known[0] if known is not None else None
        return TopicMeta.from_bytes(blob) if blob is not None else None

    def describe_topic(self, topic: bytes) -> dict[str, Any]:
        """TOPIC DESCRIBE in a cluster, on any node: the partition count and
        config (``topic_meta``), and per partition where it lives by the
        committed metadata (leader, leader epoch, replicas preferred first,
        ISR), the same on every node. The figures only a copy of the log has
        (length, offsets, segments, bytes, last ID, producers, high
        watermark) are this node's copy's, said by ``local-replica``: exact
        on the leader, a fetch round behind at most on a follower, None where
        this node holds no copy. ``groups-here``: whether this node can show
        the topic's groups (TOPIC GROUPS): it leads the topic name's slot, or
        holds the topic of several partitions, whose groups it gathers from
        their leaders (consumer group state is the partition leaders'; a
        follower's copy must not be synced).
        TopicError for an unknown topic."""
        manager = self.manager
        if manager.placement.shard_count == 0:
            raise ClusterDown("this node is joining the cluster and holds no slots yet")
        meta = self.topic_meta(topic)
        if meta is None:
            raise TopicError(UNKNOWN_TOPIC, topic=topic)
        topics = self.topics
        # This node's copy, when it is of the same topic (a follower takes a
        # re-created topic from its leader a fetch round later).
        held = topics.partitions_of(topic) if topics.topic_id(topic) == meta.topic_id else 0
        parts = []
        for n in range(meta.partitions):
            view = manager.committed_view(topic, n)
            if view["local-replica"] != "none" and n < held:
                part = topics.describe_partition(topic, n)
                view["high-watermark"] = topics.stream_of(topic, n).log.high_watermark
            else:
                part = {"partition": n, "key": partition_key(topic, n), **dict.fromkeys(PARTITION_FIGURES)}
                view["local-replica"] = "none"
                view["high-watermark"] = None
            part["replication"] = view
            parts.append(part)
        return {"partitions": parts, "config": topics.topic_config(topic, meta),
                "replication-factor": manager.placement.replication_factor,
                "groups-here": self.leads_key(topic) or held > 1}

    def broadcast_topic(self, topic: bytes) -> None:
        """A topic was created, altered or deleted here: commit the change to
        the metadata log (in the background, retried until committed), so
        every node — also one that is down now — applies it. Followers also
        get it from their leaders' fetch replies."""
        blob = self.topics.topic_meta_blob(topic)
        topic_id = self.topics.topic_id(topic) or self.topics.deleted_ids.pop(topic, "")
        self._topic_news.append(Metadata.topic_record(topic, blob, topic_id, self.manager.my_id))
        self._topic_news_ready.set()
        if self.host is not None:
            # Followers' long-polling fetches wake and discover it now, not
            # after replica-fetch-wait-max-ms: a first acks=all XADD to a new
            # stream waits for them.
            self.host.signal_key_modified(TOPICS_CHANGED)

    def _reconcile_topics(self) -> None:
        """Topics whose name's slot this node leads but whose metadata record
        is missing or different (a change made here whose proposal was lost:
        the node crashed first, or no controller was elected then): propose
        them again. Never a deletion: a topic missing here may be one this
        node has not received yet."""
        controller = self.controller
        if not controller.meta.initialized:
            return
        queued = {json.loads(r)["name"].encode("latin-1") for r in self._topic_news}
        for topic in self.topics.topics():
            if topic in queued or not self.leads_key(topic):
                continue
            known = controller.meta.topics.get(topic)
            mine = (self.topics.topic_meta_blob(topic), self.topics.topic_id(topic) or "")
            if known is None or known[:2] != mine:
                self.broadcast_topic(topic)

    async def _tell_topics(self) -> None:
        while True:
            with trio.move_on_after(2.0):
                await self._topic_news_ready.wait()
            self._topic_news_ready = trio.Event()
            self._reconcile_topics()
            while self._topic_news:
                record = self._topic_news[0]
                try:
                    await self.controller.propose(record)
                    # Proposed is not committed (a controller may lose its
                    # leadership first): wait to see it applied, else again.
                    with trio.move_on_after(5.0):
                        while not self.controller.has_applied(record):
                            await self.controller.applied_event().wait()
                except NotReady as e:
                    log.warning("topic change not committed yet (retrying): %s", e)
                    await trio.sleep(1.0)
                    continue
                if self.controller.has_applied(record):
                    self._topic_news.pop(0)

    # -- moving leadership -------------------------------------------------------

    async def take_shard(self, shard: int, *, force: bool = False) -> None:
        """Make this node the leader of ``shard``: pause the old leader's writes
        for the shard, fetch until this node holds what the old leader has and
        its high watermark covers it, then have the controller commit this node
        as leader at the next epoch (Redis's manual failover, Kafka's
        preferred-leader move: nothing acknowledged, even with acks=1, is
        lost). With ``force``, a leader that cannot be reached is taken over
        with what this node has. Raises FailoverError."""
        m = self.manager
        old = m.state.leader(shard)
        epoch = m.state.epoch(shard)
        if old == m.my_id:
            return
        link = self.link(old, "admin")
        pause = PauseRequest(shard, epoch, PAUSE_MS)
        first, last = m.placement.slot_range(shard)
        ends: PauseResponse | None
        try:
            ends = await link.call(pause)
        except Refused as e:
            raise FailoverError(f"failover refused by node {old}: {e}") from None
        except ConnectionError as e:
            if not force:
                raise FailoverError(f"node {old}, leader of slots {first}-{last}, does not answer ({e}); "
                                    "CLUSTER FAILOVER FORCE takes its shards over with what this node has") from None
            ends = None
        if ends is not None:
            caught_up = False
            with trio.move_on_after(FAILOVER_TIMEOUT_S):
                while True:
                    if m.holds(old, ends.ends):
                        caught_up = True
                        break
                    await trio.sleep(0.02)
                    try:
                        ends = await link.call(pause)
                    except Refused as e:
                        raise FailoverError(f"failover refused by node {old}: {e}") from None
            if not caught_up:
                await self._resume(link, shard, epoch)
                raise FailoverError(f"failover timed out: this node did not catch up with node {old} "
                                    f"within {FAILOVER_TIMEOUT_S:.0f}s; the old leader goes on")
        try:
            await self.controller.elect(shard, epoch, FAILOVER_TIMEOUT_S)
        except (NotReady, RuntimeError) as e:
            if ends is not None:
                await self._resume(link, shard, epoch)
            raise FailoverError(f"failover of slots {first}-{last} not committed: {str(e) or type(e).__name__}") from None

    def move_in_background(self, shard: int) -> None:
        """Take ``shard`` (the controller asks a preferred leader back in sync)."""
        if shard in self._moving or self.controller is None or self.controller._nursery is None:
            return
        self._moving.add(shard)
        self.controller._nursery.start_soon(self._move, shard)

    async def _move(self, shard: int) -> None:
        try:
            await self.take_shard(shard)
        except FailoverError as e:
            log.warning("taking back shard %d: %s", shard, e)
        except ConnectionError as e:
            log.warning("taking back shard %d: %s", shard, e)
        finally:
            self._moving.discard(shard)

    async def _resume(self, link: PeerLink, shard: int, epoch: int) -> None:
        try:
            await link.call(PauseRequest(shard, epoch, 0))
        except (ConnectionError, Refused):
            pass  # the pause ends by itself after PAUSE_MS

    # -- background -----------------------------------------------------------

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        async with trio.open_nursery() as nursery:
            if self.controller is not None:
                nursery.start_soon(self.controller.run)
            nursery.start_soon(self._tick)
            nursery.start_soon(self._tell_topics)
            while True:
                version = self.manager.state.version
                async with trio.open_nursery() as fetchers:
                    for leader in self.manager.leaders_to_follow():
                        fetchers.start_soon(self.manager.run_fetcher, leader, self.link(leader))
                    fetchers.start_soon(self._watch_view, version, fetchers.cancel_scope)
                await trio.sleep(0)

    async def _watch_view(self, version: int, scope: trio.CancelScope) -> None:
        while self.manager.state.version == version:
            await trio.sleep(TICK_S)
        log.info("cluster view changed: restarting fetchers")
        scope.cancel()

    async def _tick(self) -> None:
        while True:
            await trio.sleep(TICK_S)
            try:
                self.manager.tick()
                # Wake acks=all waiters so they re-check the ISR.
                event, self._hw_changed = self._hw_changed, trio.Event()
                event.set()
                self._recheck_ack_waiters()
            except Exception:
                log.exception("replication tick failed")

    def close(self) -> None:
        try:
            self.manager.save_hw_checkpoints()
        except Exception:  # noqa: BLE001
            log.exception("saving high watermark checkpoints failed")


class _AcksWaiter:
    """A batch handed over by ``Replication.when_acked``: in ``_ack_waiters``
    once per partition it waits on, in the place of an awaiting writer's
    ``trio.Event`` (``_on_hw_advance`` calls ``set`` when that partition's
    high watermark reaches the entry's end and drops entries whose
    ``is_set``)."""

    __slots__ = ("callback", "remaining", "done")

    def __init__(self, callback: Any, partitions: int) -> None:
        self.callback = callback
        self.remaining = partitions
        self.done = False

    def set(self) -> None:
        self.remaining -= 1
        if self.remaining == 0 and not self.done:
            self._finish(None)

    def is_set(self) -> bool:
        return self.done

    def fail(self, error: Exception) -> None:
        if not self.done:
            self._finish(error)

    def _finish(self, error: Exception | None) -> None:
        self.done = True
        try:
            self.callback(error)
        except Exception:  # runs inside replication's own paths: never break them
            log.exception("acks=all callback failed")


__all__ = ["build", "Replication", "AcksFailed", "FailoverError", "Host", "NotEnoughReplicas", "TOPICS_CHANGED"]
