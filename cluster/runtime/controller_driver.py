"""The controller quorum in a running node: moves Raft messages, applies
the committed metadata, heartbeats, and carries out the controller's
decisions.

Owns: this node's ``Raft`` (cluster/controller/raft.py) and its store in
``<dir>/controller/``; the logical clock (one Raft tick every ``TICK_S``);
one sender task per peer (``RaftRequest`` over a peer link;
lost messages are Raft's to retransmit); applying committed records to
``Metadata`` and from there to ``ClusterState`` (who leads each shard, at
which epoch, with which ISR) and to the leader states' ISRs; this node's
heartbeat to the elected controller (``BeatRequest``); proposals from any
node (``ProposeRequest``: a shard leader's ISR change, a manual failover's
election) forwarded to the elected controller; and, on the elected
controller, running ``ControllerLogic`` each tick and proposing what it
decides (fencing, elections) or asking a preferred leader to take its
shard back (``MoveRequest``, which runs the coordinated failover there).

Must not know: Raft's rules, the metadata's rules (cluster/controller/),
encodings and sockets (the peer links replication holds, cluster/peer/).
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
from pathlib import Path
from typing import Any

import trio

from cluster.controller.metadata import ControllerLogic, Metadata, MetadataError
from cluster.controller.raft import TERM_JUMP_MAX, Message, Raft, Snapshot
from cluster.controller.raft_store import RaftStore
from cluster.errors import Halted, Refused
from cluster.nodes import ClusterConfigError, Node, parse_address
from cluster.peer.link import PeerLink, Unreachable
from cluster.peer.messages import BeatRequest, JoinRequest, MoveRequest, ProposeRequest, RaftRequest
from storage.errors import StorageError

log = logging.getLogger("partita.controller")

TICK_S = 0.1
ELECTION_TICKS = 10  # an election timeout of 1-2 s
HEARTBEAT_TICKS = 2
LEASE_TICKS = 3  # a controller counts voters that answered this recently for its own lease
BEAT_S = 0.25  # this node's heartbeat to the elected controller
LINK_TIMEOUT_S = 1.0
ISR_RETRY_MS = 1000
CATCH_UP_TIMEOUT_S = 3.0  # a restarted node waits this long at most for the metadata before serving


class NotReady(Exception):
    """No controller is elected (yet), or the metadata is not initialised."""


class ControllerHalted(Halted):
    """This node could not write its Raft state (``<dir>/controller/``) or
    apply a committed metadata record: it takes no further part and the
    process stops (``Controller._halt``). A command that reaches the
    controller meanwhile gets ``-MISCONF``."""


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


def controller_voters(config: Any, node_ids: list[int]) -> list[int]:
    raw = (config.controller_nodes or "").replace(" ", "")
    if not raw:
        return sorted(node_ids)
    try:
        voters = sorted({int(x) for x in raw.split(",") if x})
    except ValueError:
        raise ClusterConfigError(f"controller-nodes {config.controller_nodes!r}: "
                                 "expected node ids separated by commas") from None
    unknown = [v for v in voters if v not in node_ids]
    if unknown or not voters:
        raise ClusterConfigError(f"controller-nodes {config.controller_nodes!r}: "
                                 f"{'no node' if not voters else 'node(s) ' + ', '.join(map(str, unknown))} "
                                 f"not in cluster-nodes ({', '.join(map(str, node_ids))})")
    return voters


def check_controller_config(config: Any, node_ids: list[int]) -> list[int]:
    """The controller voters; ClusterConfigError for a controller setup that cannot work."""
    voters = controller_voters(config, node_ids)
    if config.cluster_join and config.node_id in voters:
        raise ClusterConfigError("cluster-join: a node joining a running cluster is not a controller voter; "
                                 "set controller-nodes to the running cluster's voters")
    return voters


class Controller:
    def __init__(self, config: Any, replication: Any) -> None:
        self._replaying = True  # applying what was committed before this start
        self.config = config
        self.repl = replication
        m = replication.manager
        self.manager = m
        self.state = m.state
        self.placement = m.placement
        self.my_id = m.my_id
        node_ids = [n.id for n in self.placement.nodes]
        self.voters = check_controller_config(config, node_ids)
        self.joining = bool(config.cluster_join)
        learners = [n for n in node_ids if n not in self.voters]
        self._outbox: dict[int, list[Message]] = {n: [] for n in node_ids if n != self.my_id}
        self._outbox_ready: dict[int, trio.Event] = {n: trio.Event() for n in self._outbox}
        self._nursery: trio.Nursery | None = None
        self.raft: Raft | None = None
        self.is_leader = False
        self._isr_sent: dict[int, tuple[int, frozenset, int]] = {}  # shard -> (version, isr, at ms)
        self._applied_event = trio.Event()
        self._topic_nonces: dict[Any, None] = {}  # recently applied topic records (ordered set)
        self._lease_from_ms: int | None = None  # see lease_ok
        self.lease_expiry_s = 0.0  # time.monotonic() seconds
        self._first_lease = trio.Event()  # wait_caught_up
        self.counts = {"elections_won": 0, "applied": 0, "proposed": 0}
        self.halted: str | None = None  # why this node stopped (_halt)
        # peers whose port refused this node's last connection (what was logged: fencing, electing)
        self._refusing: dict[int, tuple[bool, bool]] = {}
        self.store = RaftStore(Path(config.dir) / "controller")
        hard_state, snapshot, entries = self.store.load()
        self.meta = Metadata()
        self.applied = 0
        self.applied_term = 0
        self.snapshot_index = 0
        if snapshot is not None:
            self._restore(snapshot)
        self.raft = Raft(self.my_id, self.voters, learners, election_ticks=ELECTION_TICKS,
                         heartbeat_ticks=HEARTBEAT_TICKS, rng=random.Random(),
                         hard_state=hard_state, snapshot=snapshot, entries=list(entries),
                         lost_log_end=self.store.lost_log_end)
        self.logic = ControllerLogic(self.meta, session_timeout_ms=config.controller_session_timeout_ms,
                                     unclean=lambda: bool(config.unclean_leader_election),
                                     rebalance_delay_ms=config.leader_rebalance_delay_ms)
        self.incarnation = os.urandom(8).hex()

        def apply(name: str, value: Any) -> None:  # CONFIG SET reaches the running controller
            if name == "controller-session-timeout-ms":
                self.logic.session_timeout_ms = value
                self._set_lease_expiry()
            elif name == "leader-rebalance-delay-ms":
                self.logic.rebalance_delay_ms = value

        config.on_change(apply)
        self._sync_members()  # nodes that joined, from the snapshot
        self._drain()  # committed records persisted before a restart are applied before serving
        self._replaying = False
        self._rewind_to_metadata()

    # -- state ------------------------------------------------------------------

    def _restore(self, snapshot: Snapshot) -> None:
        try:
            self.meta = Metadata.decode(snapshot.data)
        except MetadataError as e:
            raise ClusterConfigError(f"{self.store.directory}: {e}; remove the directory to rebuild "
                                     "this node's metadata from the other nodes") from None
        if hasattr(self, "logic"):
            self.logic.meta = self.meta
        self.applied = self.snapshot_index = snapshot.index
        self.applied_term = snapshot.term
        self._sync_all()
        # Topic records compacted into the snapshot (this node was behind by
        # more than the leader kept): apply the topics as they stand.
        for name, (blob, topic_id, origin) in sorted(self.meta.topics.items()):
            self._apply_topic(name, blob, topic_id, origin, None)

    def _rewind_to_metadata(self) -> None:
        """After the replay: the shard view is what the committed metadata
        says, also where ``cluster.state`` had a newer epoch the controller
        never committed (leadership comes from the metadata alone)."""
        if not self.state.controlled:
            return
        for s, sm in enumerate(self.meta.shards):
            self.state.adopt(s, sm.leader, sm.epoch, set(sm.isr), rewind=True)

    def _sync_members(self) -> None:
        """Nodes that joined the running cluster (``join`` records): their
        addresses, Raft learner membership, a sender task each."""
        for node, nm in self.meta.nodes.items():
            if nm.address and node != self.my_id:
                if self.placement.add_node(parse_address(node, nm.address)):
                    log.info("node %d (%s) is part of the cluster", node, nm.address)
            if self.raft is not None and node not in self.voters:
                self.raft.add_learner(node)
            if node != self.my_id and node not in self._outbox:
                self._outbox[node] = []
                self._outbox_ready[node] = trio.Event()
                if self._nursery is not None:
                    self._nursery.start_soon(self._sender, node)

    def _sync_all(self) -> None:
        if not self.meta.initialized:
            return
        self._sync_members()
        if self.placement.shard_count == 0 and self.meta.shards:
            # A joining node: the cluster's shards, as the metadata has them.
            self.placement.set_shards([sm.replicas for sm in self.meta.shards])
            self.state.resize([(sm.leader, sm.epoch) for sm in self.meta.shards],
                              [set(sm.isr) for sm in self.meta.shards])
            self.manager.forget_placement()
            log.info("joined a cluster of %d shards", len(self.meta.shards))
        if len(self.meta.shards) != self.placement.shard_count:
            log.error("the controller's metadata has %d shards, cluster-nodes makes %d: "
                      "ignoring it (cluster-nodes must list the same nodes on every node)",
                      len(self.meta.shards), self.placement.shard_count)
            return
        self.state.controlled = True
        for s in range(len(self.meta.shards)):
            self._sync_shard(s)
        self._sync_fenced()

    def _sync_fenced(self) -> None:
        self.state.fenced = {n for n, nm in self.meta.nodes.items() if nm.fenced}

    def _sync_shard(self, s: int) -> None:
        if not self.state.controlled:
            return
        sm = self.meta.shards[s]
        placement = self.placement
        if list(sm.replicas) != placement.replicas(s):
            before = placement.replicas(s)
            if list(sm.replicas) == placement.static_replicas(s):
                placement.assigned.pop(s, None)
            else:
                placement.assigned[s] = list(sm.replicas)
            log.info("shard %d: replicas %s -> %s%s", s, before, sm.replicas,
                     f" (moving to {sm.target})" if sm.target else "")
            self.state.version += 1  # fetchers and leader states follow the new replica set
            if self.my_id in before and self.my_id not in sm.replicas and not self._replaying:
                self._drop_unreplicated_topics(s)
        self.state.adopt(s, sm.leader, sm.epoch, set(sm.isr))
        self.manager.on_isr_committed(s, self.state.isr[s])

    def _drop_unreplicated_topics(self, left: int) -> None:
        """This node left shard ``left``'s replicas (a reassignment finished):
        delete its copies of the topics with a partition there and none in a
        shard it still replicates. The data lives on the new replicas, which
        were all in sync before this node was removed."""
        topics = self.repl.topics
        m = self.manager
        for topic in list(topics.topics()):
            shards = {m.shard_of(topic, n) for n in range(topics.partitions_of(topic))}
            if left in shards and all(self.my_id not in self.placement.replicas(s) for s in shards):
                log.info("topic '%s' is no longer replicated here: deleting this copy", topic.decode("utf-8", "replace"))
                topics.adopt_deletion(topic, topics.topic_id(topic) or "")

    def _effects(self, changes: list[tuple[str, int]]) -> None:
        for kind, what in changes:
            if kind == "init":
                self._sync_all()
            elif kind == "shard":
                self._sync_shard(what)
            elif kind == "node":
                self._sync_fenced()
            elif kind == "topic":
                self._apply_topic(*what)
            elif kind == "join":
                self._sync_members()

    def _apply_topic(self, name: bytes, blob: bytes | None, topic_id: str, origin: int, nonce: Any) -> None:
        """A committed topic change. The node that made it has it already (or
        something newer: skipped); elsewhere a topic is created when missing,
        updated when it has the same topic ID, deleted when the deleted ID is
        the one here. A different ID here is left alone: that copy is newer
        than the record (followers also take topics from their leaders'
        fetch replies), so replaying old records at start-up never undoes
        newer state."""
        self._topic_nonces[nonce] = None
        if len(self._topic_nonces) > 4096:
            del self._topic_nonces[next(iter(self._topic_nonces))]
        if origin in (self.my_id, -1):
            return
        topics = self.repl.topics
        mine = topics.topic_id(name)
        try:
            if blob is None:
                if mine == topic_id:
                    topics.adopt_deletion(name, topic_id)
            elif mine is None or mine == topic_id:
                topics.adopt_topic(name, blob)
            else:
                return
        except (ValueError, OSError, StorageError) as e:
            # Not raised: the records after it must still apply. A follower
            # takes the topic again from its leader's fetch replies.
            log.warning("applying topic '%s' from the metadata log failed: %s", name.decode("utf-8", "replace"), e)
            return
        host = self.repl.host
        if host is not None:
            host.signal_key_modified(name)

    # -- the Raft loop ---------------------------------------------------------

    def _drain(self) -> None:
        """Persist, apply and send everything Raft has ready."""
        if self.halted is not None:
            raise ControllerHalted(self.halted)
        raft = self.raft
        while raft.has_ready():
            rd = raft.ready()
            try:
                self.store.save(rd)
            except (StorageError, OSError) as e:
                self._halt(self._unwritable(e))
            if rd.snapshot is not None and rd.snapshot.index > self.applied:
                self._restore(rd.snapshot)
            for entry in rd.committed:
                if entry.index <= self.applied:
                    continue
                try:
                    self._effects(self.meta.apply(entry.data))
                except Exception as e:  # noqa: BLE001 - a bug: see _halt
                    log.exception("applying the committed metadata record %d failed", entry.index)
                    self._halt(f"the committed metadata record {entry.index} could not be applied "
                               f"({type(e).__name__}: {e})")
                self.applied, self.applied_term = entry.index, entry.term
                self.counts["applied"] += 1
            for msg in rd.messages:
                box = self._outbox.get(msg.dst)
                if box is not None:
                    box.append(msg)
                    self._outbox_ready[msg.dst].set()
            if rd.committed or rd.snapshot is not None:
                event, self._applied_event = self._applied_event, trio.Event()
                event.set()
        if self.applied - self.snapshot_index >= self.config.controller_snapshot_records:
            snap = Snapshot(self.applied, self.applied_term, self.meta.encode())
            raft.compact(snap.index, snap.data)
            try:
                self.store.save_snapshot(snap)
            except (StorageError, OSError) as e:
                self._halt(self._unwritable(e))
            self.snapshot_index = snap.index
        leader = raft.role == "leader"
        if leader != self.is_leader:
            self.is_leader = leader
            if leader:
                self.counts["elections_won"] += 1
                log.info("elected controller (term %d)", raft.term)
                self.logic.became_leader(_now_ms())
            else:
                self.logic.stepped_down()

    def _unwritable(self, error: BaseException) -> str:
        return f"the controller state in {self.store.directory} could not be written ({error})"

    def _halt(self, why: str) -> None:
        """This node cannot keep Raft's rules or its metadata: it stops at
        once, as a Kafka controller does when its metadata log's directory
        fails. No more Raft, heartbeats or leadership (its lease ends now,
        so it refuses writes), and the ticker ends the process (exit code 1)
        within a tick; the controller fences it and its shards move to
        in-sync replicas.

        - Raft's state could not be written: ``Raft.ready`` was this node's
          promise to persist before it sends or applies; going on would let
          it vote or acknowledge entries it does not hold (and its metadata
          would miss what it skipped). Restarted on a sound disk, it
          recovers what it had persisted.
        - A committed record could not be applied (a bug: a malformed or
          stale record is no failure, ``Metadata.apply`` turns it down
          whole, on every node alike): skipping it would leave this
          node's metadata (who leads which shard, ISRs, fencing, topics)
          different from every other node's while it serves on it. The
          record is persisted; a restart applies it again
          (and stops again, with the same message, until the bug is fixed)."""
        self.halted = why
        self.lease_expiry_s = 0.0
        self._lease_from_ms = None
        log.critical("Fatal: %s; this node stops", self.halted)
        raise ControllerHalted(self.halted) from None

    def deliver(self, messages: tuple[Message, ...] | list[Message]) -> None:
        """Raft messages from a peer: step each one addressed to this node.
        Raises ValueError (the bus: a malformed request, its connection
        closed and logged) when one is further ahead of this node's term
        than any peer gets (``TERM_JUMP_MAX``: forged; the core drops it too)."""
        term = self.raft.term
        for msg in messages:
            if msg.term > term + TERM_JUMP_MAX:
                raise ValueError(f"term {msg.term} of node {msg.src}'s {msg.kind} is more than "
                                 f"{TERM_JUMP_MAX} terms ahead of this node's {term}")
        for msg in messages:
            if msg.dst == self.my_id:
                self.raft.step(msg)
        self._drain()

    def _link(self, node_id: int, purpose: str) -> PeerLink:
        return self.repl.links.get(node_id, purpose, reply_timeout_s=LINK_TIMEOUT_S)

    async def _sender(self, peer: int) -> None:
        link = self._link(peer, "raft")
        while True:
            await self._outbox_ready[peer].wait()
            self._outbox_ready[peer] = trio.Event()
            msgs, self._outbox[peer] = self._outbox[peer], []
            if not msgs:
                continue
            try:
                await link.call(RaftRequest(tuple(msgs[-256:])))
            except Unreachable as e:
                self._unreachable(peer, e)
                await trio.sleep(TICK_S)  # lost: Raft sends again
            except (ConnectionError, Refused):
                await trio.sleep(TICK_S)  # lost: Raft sends again
            else:
                self._refusing.pop(peer, None)

    def _unreachable(self, peer: int, error: Unreachable) -> None:
        """A link to ``peer`` failed. Refused (nothing listens on its port:
        its process is gone, which a timeout never shows), the controller
        fences it at once instead of after its session timeout, and a
        follower whose controller it is campaigns at once instead of after
        an election timeout (docs/controller.md, "Fast failover")."""
        if not error.refused or not self.config.controller_fast_fencing:
            return
        fencing = self.logic.connect_refused(peer, _now_ms())
        electing = peer == self.raft.leader_id and not self.is_leader
        if (fencing, electing) != self._refusing.get(peer):  # logged once per peer and cause
            self._refusing[peer] = (fencing, electing)
            if fencing:
                log.info("node %d refuses connections (not running): fencing it now", peer)
            if electing:
                log.info("the controller (node %d) refuses connections (not running): electing another now", peer)
        self.raft.leader_unreachable(peer)

    async def _ticker(self) -> None:
        while True:
            await trio.sleep(TICK_S)
            if self.halted is not None:
                raise ControllerHalted(self.halted)  # ends the server: main() exits 1
            try:
                self.raft.tick()
                self._drain()
                if self.is_leader:
                    now = _now_ms()
                    self.logic.beat(self.my_id, self.incarnation, now, self.manager.offline_shards())
                    heard = self.raft.peers_heard_within(LEASE_TICKS) & set(self.voters)
                    # (and its term's first entry applied: every record
                    # committed before its election is applied here)
                    if len(heard) >= len(self.voters) // 2 + 1 and self.applied_term == self.raft.term:
                        # A majority answered within the last LEASE_TICKS ticks
                        # (heartbeats go out every HEARTBEAT_TICKS).
                        since = now if len(self.voters) == 1 else now - int(LEASE_TICKS * TICK_S * 1000)
                        self._renew_lease(since)
                    records, moves = self.logic.decide(_now_ms())
                    if not self.meta.initialized and self.raft.commit_index >= self.raft.last_index:
                        records.insert(0, self._init_record())
                    for record in records:
                        self.raft.propose(record)
                        self.counts["proposed"] += 1
                    self._drain()
                    for shard, node in moves:
                        assert self._nursery is not None
                        self._nursery.start_soon(self._ask_move, shard, node)
                self._propose_isr_changes()
            except ControllerHalted:
                raise
            except Exception:  # noqa: BLE001 - a bug here must not stop the node
                log.exception("controller tick failed")

    def _init_record(self) -> bytes:
        p = self.placement
        return Metadata.init_record(
            [(p.replicas(s), self.state.leader(s), self.state.epoch(s)) for s in range(p.shard_count)],
            [n.id for n in p.nodes])

    async def _beater(self) -> None:
        while True:
            await trio.sleep(BEAT_S)
            leader = self.raft.leader_id
            if leader is None or leader == self.my_id or self.halted is not None:
                continue
            sent = _now_ms()
            # (offline: shards it holds a log of that a failed fsync took offline)
            beat = BeatRequest(self.my_id, self.incarnation, tuple(self.manager.offline_shards()))
            try:
                reply = await self._link(leader, "beat").call(beat)
            except Unreachable as e:
                self._unreachable(leader, e)
                continue
            except (ConnectionError, Refused):
                continue
            self._refusing.pop(leader, None)
            # The reply is the controller's commit index: the lease counts
            # once this node has applied the metadata that far, so a node
            # back from a restart (or a partition) never serves a shard the
            # controller moved while it was away.
            if self.applied >= reply.commit_index:
                self._renew_lease(sent)

    def lease_ok(self) -> bool:
        """Whether this node may still act as the leader of its shards: it
        heard from the elected controller (a heartbeat answered, or as the
        controller, from a majority of voters) more recently than 80% of the
        session timeout, counted from when the heartbeat was sent. The
        controller fences a node only after a whole session timeout since
        it last received one, so a node cut off stops serving before another
        node can be elected in its place: an isolated leader never serves a
        stale read or takes a write the new leader will not have."""
        return time.monotonic() < self.lease_expiry_s

    def _renew_lease(self, from_ms: int) -> None:
        self._lease_from_ms = max(self._lease_from_ms or from_ms, from_ms)
        self._set_lease_expiry()
        self._first_lease.set()

    async def wait_caught_up(self, timeout_s: float = CATCH_UP_TIMEOUT_S) -> None:
        """At start-up, before clients are served: a node that was part of
        the cluster before (its metadata is initialised from its own log)
        waits until it has the lease, i.e. applied the controller's metadata
        as far as the controller had committed it, so it does not announce
        (CLUSTER SLOTS) or serve a shard it lost while it was down (Kafka's
        broker waits for the metadata log the same way). Bounded: with no
        controller to reach it serves what it has, and keyed commands answer
        ``-TRYAGAIN`` until it catches up. Peers' views are never asked:
        leadership comes from the committed metadata alone."""
        if not self.meta.initialized:
            return  # a cluster's (or a joining node's) first start: nothing to catch up on
        with trio.move_on_after(timeout_s):
            await self._first_lease.wait()
            return
        log.warning("no controller reached within %.0fs: serving before catching up with the cluster metadata "
                    "(commands on keys answer -TRYAGAIN until it does)", timeout_s)

    def _set_lease_expiry(self) -> None:
        # Kept as one number so the check on every command is a clock read
        # and a comparison (Replication.route).
        if self.halted is not None:
            return
        lease = self._lease_from_ms
        self.lease_expiry_s = (lease + self.logic.session_timeout_ms * 0.8) / 1000 if lease is not None else 0.0

    def beat(self, node: int, incarnation: str, offline: tuple[int, ...] | list[int] | None = None) -> int | None:
        """A heartbeat from a node (``offline``: the shards it holds a log
        of that it cannot write): the commit index the node must have
        applied before its lease counts the beat; None when this node is not
        the controller."""
        if not self.is_leader:
            return None
        self.logic.beat(node, incarnation, _now_ms(), offline or ())
        return self.raft.commit_index

    # -- proposals ---------------------------------------------------------------

    def propose_local(self, record: bytes) -> bool:
        """Propose on this node if it is the elected controller."""
        if not self.is_leader or self.raft.propose(record) is None:
            return False
        self.counts["proposed"] += 1
        self._drain()
        return True

    async def propose(self, record: bytes) -> None:
        """Propose ``record`` through the elected controller (here or there).
        NotReady when there is none."""
        if self.propose_local(record):
            return
        leader = self.raft.leader_id
        if leader is None or leader == self.my_id:
            raise NotReady("no controller is elected (a majority of controller-nodes must be up)")
        try:
            await self._link(leader, "propose").call(ProposeRequest(record))
        except ConnectionError as e:
            raise NotReady(f"the controller (node {leader}) does not answer: {e}") from None
        except Refused as e:
            raise NotReady(f"the controller (node {leader}) refused: {e}") from None

    def _propose_isr_changes(self) -> None:
        if not self.meta.initialized:
            return
        now = _now_ms()
        for shard, isr in self.manager.isr_proposals():
            sm = self.meta.shards[shard]
            if sm.leader != self.my_id:
                continue
            key = frozenset(isr)
            sent = self._isr_sent.get(shard)
            if sent is not None and sent[:2] == (sm.version, key) and now - sent[2] < ISR_RETRY_MS:
                continue
            self._isr_sent[shard] = (sm.version, key, now)
            log.info("shard %d: proposing ISR %s (committed %s)", shard, sorted(isr), sm.isr)
            record = Metadata.shard_record(shard, sm.version, sm.leader, sm.epoch, isr)
            if not self.propose_local(record):
                assert self._nursery is not None
                self._nursery.start_soon(self._propose_quietly, record)

    def applied_event(self) -> trio.Event:
        """Set when the next committed records are applied here."""
        return self._applied_event

    def has_applied(self, topic_record: bytes) -> bool:
        """Whether ``topic_record`` was committed and applied here."""
        return json.loads(topic_record)["nonce"] in self._topic_nonces

    async def _propose_quietly(self, record: bytes) -> None:
        try:
            await self.propose(record)
        except NotReady:
            pass  # proposed again after ISR_RETRY_MS

    async def elect(self, shard: int, epoch: int, timeout_s: float) -> None:
        """Make this node the leader of ``shard`` (at ``epoch`` when the
        caller decided to) and its preferred replica through the controller
        and wait until the change is applied here. If the leadership moved
        meanwhile to this very node (the controller elected it: the old
        leader died), what was asked for holds: only the preferred replica
        is committed. Raises NotReady (no controller) or RuntimeError
        (leadership moved to another node)."""
        with trio.move_on_after(timeout_s):
            while not self.meta.initialized:  # a cluster just started: its first controller is being elected
                await self._applied_event.wait()
            # The record is conditional on the shard's version: when another
            # change (an ISR update) commits first, decide again.
            while True:
                sm = self.meta.shards[shard]
                if sm.leader == self.my_id and sm.replicas[0] == self.my_id:
                    return
                if sm.leader != self.my_id and sm.epoch != epoch:
                    raise RuntimeError(f"shard {shard}'s leadership moved meanwhile "
                                       f"(to node {sm.leader} at epoch {sm.epoch})")
                # (and this node becomes the shard's preferred replica: a
                # manual failover sticks, Metadata.takeover_record)
                record = self.meta.takeover_record(shard, self.my_id)
                try:
                    await self.propose(record)
                except NotReady:  # no controller elected yet: wait for one
                    await trio.sleep(TICK_S)
                    continue
                with trio.move_on_after(1.0):
                    while self.meta.shards[shard].version == sm.version:
                        await self._applied_event.wait()
        if not self.meta.initialized:
            raise NotReady("no controller has initialised the cluster metadata yet "
                           "(a majority of controller-nodes must be up)")
        raise NotReady(f"the controller did not commit the change within {timeout_s:.0f}s")

    async def reassign(self, shard: int, target: list[int], timeout_s: float = 10.0) -> None:
        """Start moving ``shard`` to ``target`` (committed when this returns).
        Raises NotReady, or ValueError when a reassignment is already running."""
        with trio.move_on_after(timeout_s):
            while True:
                if not self.meta.initialized:
                    raise NotReady("the controller has not initialised the cluster metadata yet")
                sm = self.meta.shards[shard]
                if sm.target is not None:
                    if sm.target == target:
                        return
                    raise ValueError(f"a reassignment to {'/'.join(map(str, sm.target))} is in progress")
                if list(sm.replicas) == target:
                    return
                await self.propose(self.meta.reassign_record(shard, target))
                with trio.move_on_after(1.0):
                    while self.meta.shards[shard].version == sm.version:
                        await self._applied_event.wait()
        raise NotReady(f"the controller did not commit the reassignment within {timeout_s:.0f}s")

    async def _ask_move(self, shard: int, node: int) -> None:
        """Ask ``node`` (the shard's preferred leader, back in sync) to take it back."""
        log.info("asking node %d to take back shard %d (its preferred leader)", node, shard)
        try:
            if node == self.my_id:
                self.repl.move_in_background(shard)
            else:
                await self._link(node, "move").call(MoveRequest(shard))
        except (ConnectionError, Refused) as e:  # retried by the logic after its delay
            log.warning("moving shard %d back to node %d failed: %s", shard, node, e)

    # -- background -----------------------------------------------------------

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for peer in self._outbox:
                nursery.start_soon(self._sender, peer)
            nursery.start_soon(self._ticker)
            nursery.start_soon(self._beater)
            if self.joining:
                nursery.start_soon(self._join)

    async def _join(self) -> None:
        """Ask the running cluster to take this node in (``JoinRequest``, to
        any node of cluster-nodes), until the metadata applied here has it."""
        me = self.placement.by_id[self.my_id]
        while self.my_id not in self.meta.nodes:
            for node in list(self.placement.nodes):
                if node.id == self.my_id or self.my_id in self.meta.nodes:
                    continue
                try:
                    await self._link(node.id, "join").call(JoinRequest(self.my_id, me.host, me.port, me.bus_port))
                except ConnectionError:
                    continue
                except Refused as e:
                    log.warning("node %d refused this node's join: %s", node.id, e)
                else:
                    break
            await trio.sleep(1.0)
        log.info("this node is part of the cluster (node %d)", self.my_id)

    async def admit(self, node: int, host: str, port: int, bus_port: int) -> None:
        """A node asks to join (``JoinRequest``): commit it through the controller."""
        known = self.meta.nodes.get(node)
        if known is not None:
            if not known.address:
                raise ValueError(f"node {node} is one of the nodes the cluster started with")
            if known.address != Node(node, host, port, bus_port).entry:
                raise ValueError(f"node {node} already joined as {known.address}")
            return
        await self.propose(Metadata.join_record(node, host, port, bus_port))

    def info_lines(self) -> list[str]:
        raft = self.raft
        lines = [f"controller_role:{raft.role}", f"controller_term:{raft.term}",
                 f"controller_leader:{raft.leader_id if raft.leader_id is not None else -1}",
                 f"controller_voters:{','.join(map(str, self.voters))}",
                 f"controller_commit_index:{raft.commit_index}", f"controller_applied:{self.applied}",
                 f"controller_metadata:{'ready' if self.meta.initialized else 'waiting'}",
                 f"controller_lease:{'ok' if self.lease_ok() else 'expired'}",
                 f"controller_fenced:{','.join(str(n) for n in sorted(self.state.fenced)) or '-'}",
                 # the nodes whose registration (incarnation) is committed: fenced at once when their
                 # port refuses the controller (ControllerLogic.connect_refused), the others after their session
                 f"controller_registered:{','.join(str(n) for n, m in sorted(self.meta.nodes.items()) if m.incarnation) or '-'}",
                 # 'restricted': its raft.log lost records (docs/controller.md)
                 f"controller_votes:{'ok' if raft.lost_log_end is None else 'restricted'}"]
        if self.meta.initialized:
            for s, sm in enumerate(self.meta.shards):
                lines.append(f"controller_shard{s}:leader={sm.leader},epoch={sm.epoch},"
                             f"replicas={'/'.join(map(str, sm.replicas))},isr={'/'.join(map(str, sm.isr))},"
                             f"version={sm.version}" + (f",target={'/'.join(map(str, sm.target))}" if sm.target else ""))
        return lines
