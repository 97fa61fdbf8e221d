"""The cluster metadata the controller quorum replicates, and the controller's
decisions, both free of I/O.

Owns: ``Metadata`` — the state machine every node applies from the committed
Raft log: each shard's replica set, leader, leader epoch, ISR and a version
(Kafka's partition epoch, bumped on every change); each node's registration
(the incarnation it started with) and whether it is fenced (stopped
heartbeating). Records are small JSON objects; a shard record is
*conditional* (it names the shard version it was decided on and is ignored
if another change committed first), so two proposers racing — a leader
shrinking its ISR, the controller electing a new leader — never combine into
a state neither decided. ``ControllerLogic`` — what the elected controller
proposes: registrations, fencing a node that stopped heartbeating (or whose
port refuses the controller's connections: its process is gone), electing
a shard's new leader from its ISR when its leader is fenced or reports a
log of it offline (``unclean-leader-election`` allowing any live replica
when no ISR member lives), removing fenced, restarted or offline nodes
from ISRs, and asking preferred leaders to take their shards back.

Kafka's rules kept here (docs/controller.md):

- an ISR member has every acknowledged entry of the shard; a leader is only
  ever chosen from the ISR (unless unclean election is on);
- a node that restarted (new incarnation) may have lost its unflushed tail,
  so it leaves every ISR it is in (KIP-903) and rejoins when caught up — except
  as the ISR's last member, which stays (there is no better copy);
- a node holding a log of a shard it cannot write (offline after a failed
  fsync, reported in its heartbeat) is treated for that shard as fenced:
  another live ISR member takes the leadership and it leaves the ISR, as a
  Kafka broker's failed log directory (KIP-112);
- leadership moves bump the leader epoch; ISR changes keep it.

Must not know: sockets, trio, Raft's internals (it sees committed records in
order), partition logs.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from cluster.nodes import BUS_PORT_OFFSET


class MetadataError(ValueError):
    """A record or snapshot that does not decode."""


@dataclass
class ShardMeta:
    replicas: list[int]  # preferred leader first
    leader: int
    epoch: int
    isr: list[int]  # sorted
    version: int = 0
    target: list[int] | None = None  # a reassignment in progress: the replicas it ends with

    def as_json(self) -> dict:
        return {"replicas": self.replicas, "leader": self.leader, "epoch": self.epoch,
                "isr": self.isr, "version": self.version, "target": self.target}


@dataclass
class NodeMeta:
    incarnation: str = ""  # "" until the node first registers
    fenced: bool = False
    address: str = ""  # host:port@bus-port of a node that joined the running cluster ("" for the first ones)


@dataclass
class Metadata:
    shards: list[ShardMeta] = field(default_factory=list)
    nodes: dict[int, NodeMeta] = field(default_factory=dict)
    initialized: bool = False
    # topic name -> (topic.meta bytes, topic id, node that made the change)
    topics: dict[bytes, tuple[bytes, str, int]] = field(default_factory=dict)

    # -- records ----------------------------------------------------------

    @staticmethod
    def init_record(shards: list[tuple[list[int], int, int]], nodes: list[int]) -> bytes:
        """The first record: ``(replicas, leader, epoch)`` per shard, every
        replica in sync (what a fresh static placement starts with)."""
        return _dump({"t": "init", "nodes": nodes,
                      "shards": [{"replicas": r, "leader": leader, "epoch": epoch, "isr": sorted(r)}
                                 for r, leader, epoch in shards]})

    @staticmethod
    def join_record(node: int, host: str, port: int, bus_port: int) -> bytes:
        """A node not in the cluster's first node list joins it (as a Raft
        learner, holding no shard until CLUSTER REASSIGN gives it some), at
        client port ``port`` and cluster bus port ``bus_port``."""
        return _dump({"t": "join", "node": node, "host": host, "port": port, "bus": bus_port})

    @staticmethod
    def node_record(node: int, incarnation: str, fenced: bool) -> bytes:
        """Node ``node`` runs as ``incarnation`` (fenced or not). Applying a new
        incarnation over a known one (the node restarted, and may have lost its
        unflushed tail) also takes it out of every ISR where another member
        is left, handing the shards it led to the next live ISR member."""
        return _dump({"t": "node", "node": node, "inc": incarnation, "fenced": fenced})

    @staticmethod
    def shard_record(shard: int, expect: int, leader: int, epoch: int, isr: list[int] | set[int],
                     **moved: Any) -> bytes:
        """Shard ``shard`` becomes (leader, epoch, isr) if its version is still
        ``expect``; ``replicas=`` / ``target=`` change its replica set."""
        return _dump({"t": "shard", "s": shard, "expect": expect, "leader": leader, "epoch": epoch,
                      "isr": sorted(isr), **moved})

    def takeover_record(self, shard: int, node: int) -> bytes:
        """``node`` leads ``shard`` at the next epoch (a coordinated move,
        CLUSTER FAILOVER's and a preferred leader's taking back) and becomes
        its preferred replica, first in the replica set, in the same record:
        as in Redis, a node that took over with CLUSTER FAILOVER stays the
        leader; the controller's preferred-leader rebalance does not hand the
        shard back to the node it replaced. Only a later failover or
        CLUSTER REASSIGN moves it. (For the preferred leader taking its shard
        back, and a reassignment's move to its first target replica, the
        order is already so.) A ``node`` that leads the shard already (the
        controller elected it while its failover was on the way) keeps its
        epoch and only becomes the preferred replica."""
        cur = self.shards[shard]
        replicas = [node] + [r for r in cur.replicas if r != node]
        moved = {"replicas": replicas} if replicas != cur.replicas else {}
        epoch = cur.epoch + (node != cur.leader)
        return self.shard_record(shard, cur.version, node, epoch, set(cur.isr) | {node}, **moved)

    def reassign_record(self, shard: int, target: list[int]) -> bytes:
        """Start moving ``shard`` to the replicas ``target`` (preferred leader
        first): until they are all in sync, the shard has the old and the new
        replicas (the new ones fetch like any follower)."""
        cur = self.shards[shard]
        replicas = list(target) + [r for r in cur.replicas if r not in target]
        return self.shard_record(shard, cur.version, cur.leader, cur.epoch, cur.isr,
                                 replicas=replicas, target=list(target))

    @staticmethod
    def topic_record(topic: bytes, blob: bytes | None, topic_id: str, origin: int) -> bytes:
        """Topic ``topic`` (``topic_id``) now has ``topic.meta`` ``blob``; None:
        it was deleted. ``origin`` is the node that made the change."""
        return _dump({"t": "topic", "name": topic.decode("latin-1"),
                      "blob": None if blob is None else blob.decode("latin-1"), "id": topic_id, "origin": origin,
                      "nonce": os.urandom(8).hex()})

    @staticmethod
    def check_record(data: bytes) -> None:
        """Raise ValueError unless ``data`` is a record this module makes."""
        try:
            rec = json.loads(data)
        except ValueError as e:
            raise ValueError(f"not a metadata record ({e})") from None
        fields = {"init": ("nodes", "shards"), "node": ("node", "inc", "fenced"),
                  "shard": ("s", "expect", "leader", "epoch", "isr"),
                  "topic": ("name", "blob", "id", "origin", "nonce"), "join": ("node", "host", "port")}
        if not isinstance(rec, dict) or rec.get("t") not in fields:
            raise ValueError("not a metadata record (unknown kind)")
        missing = [f for f in fields[rec["t"]] if f not in rec]
        if missing:
            raise ValueError(f"{rec['t']} record without {', '.join(missing)}")

    def apply(self, data: bytes) -> list[tuple[str, Any]]:
        """Apply one committed record; the changes it made: ``("shard", s)`` /
        ``("node", n)`` / ``("init", 0)`` / ``("topic", name)``. A record that
        does not apply (a stale conditional one, or garbage) changes nothing."""
        if not data:
            return []  # a new Raft leader's no-op entry
        try:
            rec = json.loads(data)
            kind = rec["t"]
        except (ValueError, KeyError, TypeError):
            return []
        try:
            if kind == "init":
                return self._apply_init(rec)
            if kind == "node":
                return self._apply_node(rec)
            if kind == "shard":
                return self._apply_shard(rec)
            if kind == "topic":
                return self._apply_topic(rec)
            if kind == "join":
                return self._apply_join(rec)
        except (KeyError, TypeError, ValueError, IndexError):
            return []
        return []

    def _apply_init(self, rec: dict) -> list[tuple[str, int]]:
        if self.initialized:
            return []
        self.shards = [ShardMeta(list(s["replicas"]), int(s["leader"]), int(s["epoch"]), sorted(s["isr"]))
                       for s in rec["shards"]]
        self.nodes = {int(n): NodeMeta() for n in rec["nodes"]}
        self.initialized = True
        return [("init", 0)]

    def _apply_join(self, rec: dict) -> list[tuple[str, Any]]:
        node, host, port = int(rec["node"]), str(rec["host"]), int(rec["port"])
        bus = int(rec.get("bus", 0)) or port + BUS_PORT_OFFSET
        if (node < 1 or not host or not 0 < port < 65536 or not 0 < bus < 65536 or node in self.nodes
                or not self.initialized):
            return []
        self.nodes[node] = NodeMeta(address=f"{host}:{port}@{bus}")
        return [("join", node)]

    def _apply_node(self, rec: dict) -> list[tuple[str, int]]:
        node = int(rec["node"])
        if node not in self.nodes:
            return []
        meta = NodeMeta(str(rec["inc"]), bool(rec["fenced"]), self.nodes[node].address)
        old = self.nodes[node]
        if meta == old:
            return []
        self.nodes[node] = meta
        changes = [("node", node)]
        if old.incarnation and meta.incarnation != old.incarnation:
            changes += self._rejoin(node)
        return changes

    def _rejoin(self, node: int) -> list[tuple[str, int]]:
        changes = []
        for s, cur in enumerate(self.shards):
            if node not in cur.isr:
                continue
            others = [r for r in cur.replicas if r in cur.isr and r != node and self.live(r)]
            isr = [r for r in cur.isr if r != node]
            if cur.leader != node:
                self.shards[s] = ShardMeta(cur.replicas, cur.leader, cur.epoch, isr, cur.version + 1, cur.target)
            elif others:
                self.shards[s] = ShardMeta(cur.replicas, others[0], cur.epoch + 1, isr, cur.version + 1, cur.target)
            else:
                continue  # its last live member: stays (there is no better copy)
            changes.append(("shard", s))
        return changes

    def _apply_shard(self, rec: dict) -> list[tuple[str, int]]:
        s = int(rec["s"])
        if not 0 <= s < len(self.shards):
            return []
        cur = self.shards[s]
        leader, epoch, isr = int(rec["leader"]), int(rec["epoch"]), sorted({int(x) for x in rec["isr"]})
        replicas = [int(r) for r in rec.get("replicas", cur.replicas)]
        target = rec.get("target", cur.target)
        target = None if target is None else [int(r) for r in target]
        if len(set(replicas)) != len(replicas) or any(r not in self.nodes for r in replicas):
            return []
        if target is not None and not set(target) <= set(replicas):
            return []
        if int(rec["expect"]) != cur.version or leader not in replicas or leader not in isr:
            return []
        # A record moves the epoch by one at most, and only with the leader:
        # whatever proposes it, no record can take a shard to an epoch the
        # next controller's election would not reach (issue 28).
        if not set(isr) <= set(replicas) or epoch != cur.epoch + (leader != cur.leader):
            return []
        self.shards[s] = ShardMeta(replicas, leader, epoch, isr, cur.version + 1, target)
        return [("shard", s)]

    def _apply_topic(self, rec: dict) -> list[tuple[str, Any]]:
        name = str(rec["name"]).encode("latin-1")
        blob, topic_id, origin = rec["blob"], str(rec["id"]), int(rec["origin"])
        if blob is None:
            known = self.topics.get(name)
            if known is None or known[1] != topic_id:
                return [("topic", (name, None, topic_id, -1, rec.get("nonce")))]  # seen, nothing to do
            del self.topics[name]
            return [("topic", (name, None, topic_id, origin, rec.get("nonce")))]
        raw = str(blob).encode("latin-1")
        self.topics[name] = (raw, topic_id, origin)
        return [("topic", (name, raw, topic_id, origin, rec.get("nonce")))]

    # -- snapshots ----------------------------------------------------------

    def encode(self) -> bytes:
        return _dump({"v": 1, "initialized": self.initialized,
                      "shards": [s.as_json() for s in self.shards],
                      "nodes": {str(n): [m.incarnation, m.fenced, m.address] for n, m in self.nodes.items()},
                      "topics": [[t.decode("latin-1"), b.decode("latin-1"), i, o]
                                 for t, (b, i, o) in sorted(self.topics.items())]})

    @classmethod
    def decode(cls, data: bytes) -> "Metadata":
        if not data:
            return cls()
        try:
            obj = json.loads(data)
            return cls([ShardMeta(list(s["replicas"]), int(s["leader"]), int(s["epoch"]), list(s["isr"]),
                                  int(s["version"]), s.get("target")) for s in obj["shards"]],
                       {int(n): NodeMeta(str(v[0]), bool(v[1]), str(v[2]) if len(v) > 2 else "")
                        for n, v in obj["nodes"].items()},
                       bool(obj["initialized"]),
                       {str(t).encode("latin-1"): (str(b).encode("latin-1"), str(i), int(o))
                        for t, b, i, o in obj.get("topics", [])})
        except (ValueError, KeyError, TypeError, IndexError) as e:
            raise MetadataError(f"metadata snapshot does not decode: {e}") from None

    def live(self, node: int) -> bool:
        meta = self.nodes.get(node)
        return meta is not None and not meta.fenced


def _dump(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()


@dataclass
class _Heard:
    at_ms: int
    incarnation: str
    offline: frozenset[int] = frozenset()  # shards with a log this node cannot write


class ControllerLogic:
    """The elected controller's decisions. Fed heartbeats (``beat``) and the
    time; ``decide`` returns the records to propose and the preferred-leader
    moves to ask for. Every decision reads only committed metadata plus what
    this controller heard, and is safe to repeat: shard records are
    conditional, node records idempotent."""

    def __init__(self, meta: Metadata, *, session_timeout_ms: int = 3000,
                 unclean: Callable[[], bool] = lambda: False,
                 rebalance_delay_ms: int = 5000, retry_ms: int = 1000) -> None:
        self.meta = meta
        self.session_timeout_ms = session_timeout_ms
        self.unclean = unclean
        self.rebalance_delay_ms = rebalance_delay_ms
        self.retry_ms = retry_ms
        self.heard: dict[int, _Heard] = {}
        self.refused: dict[int, int] = {}  # node -> when a connection to it was last refused
        self.leader_since_ms: int | None = None  # when this node became controller
        self._proposed: dict[Any, tuple[int, bytes]] = {}  # subject -> (at ms, record)
        self._preferred_ok_since: dict[int, int] = {}  # shard -> when its preferred leader became eligible

    # -- inputs ---------------------------------------------------------------

    def beat(self, node: int, incarnation: str, now_ms: int, offline: Iterable[int] = ()) -> None:
        """A heartbeat. ``offline``: the shards where the node holds a log
        it cannot write (offline after a failed fsync, until it restarts):
        it can neither lead them nor follow them, as Kafka's broker with a
        failed log directory (KIP-112)."""
        self.heard[node] = _Heard(now_ms, incarnation, frozenset(offline))

    def connect_refused(self, node: int, now_ms: int) -> bool:
        """This controller's connection to ``node`` was refused: nothing
        listens on its port, so its process is gone (killed, crashed or shut
        down), which no timeout proves (a paused, slow or cut-off node times
        out). Unless heard from after this, it is fenced at once, without
        waiting for its session to expire: a dead node holds no lease to
        serve on. Ignored while not the controller (only its own, current
        observations count), and for a node that never registered (a
        cluster's first start, its nodes coming up one after another, keeps
        the whole session's grace). Whether it counts."""
        meta = self.meta.nodes.get(node)
        if self.leader_since_ms is None or meta is None or not meta.incarnation:
            return False
        self.refused[node] = now_ms
        return True

    def became_leader(self, now_ms: int) -> None:
        """This node was elected controller: nobody has been heard yet; give
        every node a whole session before fencing it (unless a connection to
        it is refused)."""
        self.leader_since_ms = now_ms
        self.heard.clear()
        self.refused.clear()
        self._proposed.clear()
        self._preferred_ok_since.clear()

    def stepped_down(self) -> None:
        self.leader_since_ms = None

    # -- decisions -------------------------------------------------------------

    def alive(self, node: int, now_ms: int) -> bool:
        """Heard within the session timeout (or not yet due: the controller
        is new), and no connection to it refused since it was last heard."""
        heard = self.heard.get(node)
        refused = self.refused.get(node)
        if refused is not None and (heard is None or heard.at_ms < refused):
            return False
        last = heard.at_ms if heard is not None else self.leader_since_ms
        return last is not None and now_ms - last <= self.session_timeout_ms

    def decide(self, now_ms: int) -> tuple[list[bytes], list[tuple[int, int]]]:
        """``(records to propose, [(shard, preferred node)] to move back)``."""
        meta = self.meta
        if self.leader_since_ms is None or not meta.initialized:
            return [], []
        records: list[bytes] = []
        # What the decisions below assume about each node, as of this call.
        fenced = {n for n, m in meta.nodes.items() if m.fenced}
        restarted: set[int] = set()  # re-registering: its record moves its shards (Metadata._rejoin)
        for node, m in meta.nodes.items():
            heard = self.heard.get(node)
            if self.alive(node, now_ms) and heard is not None:
                if m.fenced or m.incarnation != heard.incarnation:
                    if m.incarnation and m.incarnation != heard.incarnation:
                        restarted.add(node)
                    fenced.discard(node)
                    self._propose(records, ("node", node), meta.node_record(node, heard.incarnation, False), now_ms)
            elif not m.fenced and not self.alive(node, now_ms):
                fenced.add(node)
                self._propose(records, ("node", node), meta.node_record(node, m.incarnation, True), now_ms)

        # Shard -> the live nodes reporting a log of it offline: for that
        # shard they count as fenced (the leader hands it over, a follower
        # leaves its ISR), and nothing moves to them.
        offline: dict[int, set[int]] = {}
        for node, heard in self.heard.items():
            if node not in fenced:
                for s in heard.offline:
                    offline.setdefault(s, set()).add(node)
        moves: list[tuple[int, int]] = []
        for s, shard in enumerate(meta.shards):
            if restarted & set(shard.isr):
                continue  # decided again once the registration is applied
            unfit = fenced | offline[s] if s in offline else fenced
            change = self._shard_change(shard, unfit)
            if change is not None:
                leader, epoch, isr = change
                self._propose(records, ("shard", s, shard.version),
                              meta.shard_record(s, shard.version, leader, epoch, isr), now_ms)
                self._preferred_ok_since.pop(s, None)
                continue
            if shard.target is not None:
                self._reassigning(records, moves, s, shard, unfit, now_ms)
                continue
            preferred = shard.replicas[0]
            if (self.rebalance_delay_ms >= 0 and shard.leader != preferred and preferred in shard.isr
                    and preferred not in unfit
                    and preferred not in restarted and shard.leader not in unfit):
                since = self._preferred_ok_since.setdefault(s, now_ms)
                if now_ms - since >= self.rebalance_delay_ms and self._due(("move", s, shard.version), now_ms):
                    self._proposed[("move", s, shard.version)] = (now_ms, b"")
                    moves.append((s, preferred))
            else:
                self._preferred_ok_since.pop(s, None)
        return records, moves

    def _reassigning(self, records: list[bytes], moves: list[tuple[int, int]], s: int, shard: ShardMeta,
                     fenced: set[int], now_ms: int) -> None:
        """A reassignment moves on once every target replica is in sync: the
        leadership first (a coordinated move to the first target replica, if
        the leader is not one of them), then the replica set shrinks to the
        target."""
        target = shard.target or []
        if not set(target) <= set(shard.isr):
            return  # the new replicas are still catching up
        if shard.leader in target:
            record = self.meta.shard_record(s, shard.version, shard.leader, shard.epoch,
                                            set(shard.isr) & set(target), replicas=target, target=None)
            self._propose(records, ("shard", s, shard.version), record, now_ms)
        elif target[0] not in fenced and self._due(("move", s, shard.version), now_ms):
            self._proposed[("move", s, shard.version)] = (now_ms, b"")
            moves.append((s, target[0]))

    def _shard_change(self, shard: ShardMeta, fenced: set[int]) -> tuple[int, int, set[int]] | None:
        """The (leader, epoch, isr) the shard should move to, or None.
        ``fenced``: the nodes that may neither lead the shard nor stay in its
        ISR (fenced, or holding a log of it offline)."""
        isr = set(shard.isr)
        if shard.leader in fenced:
            candidates = [r for r in shard.replicas if r in isr and r not in fenced]
            if candidates:
                new = candidates[0]
                return new, shard.epoch + 1, (isr - fenced) | {new}
            if self.unclean():
                live = [r for r in shard.replicas if r not in fenced]
                if live:  # an unclean election: what only the old ISR had may be lost
                    return live[0], shard.epoch + 1, {live[0]}
            # Leaderless until an ISR member returns (it is elected then).
            return None
        drop = {r for r in isr & fenced if r != shard.leader}
        if drop:
            return shard.leader, shard.epoch, isr - drop
        return None

    def _due(self, subject: Any, now_ms: int) -> bool:
        last = self._proposed.get(subject)
        return last is None or now_ms - last[0] >= self.retry_ms

    def _propose(self, records: list[bytes], subject: Any, record: bytes, now_ms: int) -> None:
        last = self._proposed.get(subject)
        if last is not None and last[1] == record and now_ms - last[0] < self.retry_ms:
            return
        self._proposed[subject] = (now_ms, record)
        records.append(record)
