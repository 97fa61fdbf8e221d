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
a state neither decided. A record applies whole or not at all: it is
checked against the state before anything changes, so one that does not
apply (malformed, stale) changes nothing, on every node alike, and an
exception while applying one is a bug, not a rejection. ``ControllerLogic``
— what the elected controller proposes: registrations, fencing a node that
stopped heartbeating (or whose port refuses the controller's connections:
its process is gone), electing a shard's new leader from its ISR when its
leader is fenced or reports a log of it offline (``unclean-leader-election``
allowing any live replica when no ISR member lives), removing fenced,
restarted or offline nodes from ISRs, and asking preferred leaders to take
their shards back.

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

from cluster.nodes import Node, parse_address
from storage.checkpoint import parse_json


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
        client port ``port`` and cluster bus port ``bus_port`` (0: port +
        10000). ValueError: an address the nodes could not read back."""
        _join_address(node, host, port, bus_port)
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
        """Raise ValueError (``MetadataError``) unless ``data`` has the shape
        of a record this module makes: a kind and its fields."""
        _decode_record(data)

    def apply(self, data: bytes) -> list[tuple[str, Any]]:
        """Apply one committed record; the changes it made: ``("shard", s)`` /
        ``("node", n)`` / ``("init", 0)`` / ``("join", n)`` / ``("topic", ...)``.

        All or nothing: the record is read and checked against the metadata
        first (``_decide``, which changes nothing), then what it changes is
        written at once (``_write``). A record that does not apply changes
        nothing — garbage or a field of the wrong type (``MetadataError``),
        or one the state turns down (a stale conditional shard record, a
        second ``init``, a join of a known node) — and that is decided by the
        record and the metadata alone, so every node turns it down alike.
        Any other exception is a bug and propagates: the driver halts the
        node rather than serve on metadata that may not be the others'."""
        if not data:
            return []  # a new Raft leader's no-op entry
        try:
            update = self._decide(_decode_record(data))
        except MetadataError:
            return []
        return self._write(update)

    def _decide(self, rec: dict) -> _Update:
        """What ``rec`` changes (nothing if the state turns it down); reads
        the metadata, never writes it. MetadataError: a malformed record."""
        kind = rec["t"]
        if kind == "init":
            return self._decide_init(rec)
        if kind == "join":
            return self._decide_join(rec)
        if kind == "node":
            return self._decide_node(rec)
        if kind == "shard":
            return self._decide_shard(rec)
        assert kind == "topic", kind  # _decode_record knows no other kind
        return self._decide_topic(rec)

    def _write(self, update: _Update) -> list[tuple[str, Any]]:
        """Write a decided update: assignments only, nothing left to check."""
        if update.init is not None:
            self.shards, self.nodes = update.init
            self.initialized = True
        for s, shard in update.shards.items():
            self.shards[s] = shard
        self.nodes.update(update.nodes)
        for name, topic in update.topics.items():
            if topic is None:
                del self.topics[name]
            else:
                self.topics[name] = topic
        return update.changes

    def _decide_init(self, rec: dict) -> _Update:
        shards = [_shard_from_json(s) for s in _field(rec, "shards", list)]
        nodes = {n: NodeMeta() for n in _ids(rec, "nodes")}
        if self.initialized:
            return _Update()
        return _Update([("init", 0)], init=(shards, nodes))

    def _decide_join(self, rec: dict) -> _Update:
        node = _field(rec, "node", int)
        address = _join_address(node, _field(rec, "host", str), _field(rec, "port", int),
                                _field(rec, "bus", int, 0))
        if node in self.nodes or not self.initialized:
            return _Update()
        return _Update([("join", node)], nodes={node: NodeMeta(address=address)})

    def _decide_node(self, rec: dict) -> _Update:
        node = _field(rec, "node", int)
        incarnation, fenced = _field(rec, "inc", str), _field(rec, "fenced", bool)
        old = self.nodes.get(node)
        if old is None:
            return _Update()
        meta = NodeMeta(incarnation, fenced, old.address)
        if meta == old:
            return _Update()
        update = _Update([("node", node)], nodes={node: meta})
        if old.incarnation and meta.incarnation != old.incarnation:
            update.shards = self._rejoined(node)
            update.changes += [("shard", s) for s in update.shards]
        return update

    def _rejoined(self, node: int) -> dict[int, ShardMeta]:
        """The shards ``node`` restarting changes: shard -> its new state."""
        shards = {}
        for s, cur in enumerate(self.shards):
            if node not in cur.isr:
                continue
            others = [r for r in cur.replicas if r in cur.isr and r != node and self.live(r)]
            isr = [r for r in cur.isr if r != node]
            if cur.leader != node:
                shards[s] = ShardMeta(cur.replicas, cur.leader, cur.epoch, isr, cur.version + 1, cur.target)
            elif others:
                shards[s] = ShardMeta(cur.replicas, others[0], cur.epoch + 1, isr, cur.version + 1, cur.target)
            # else its last live member: stays (there is no better copy)
        return shards

    def _decide_shard(self, rec: dict) -> _Update:
        s, expect = _field(rec, "s", int), _field(rec, "expect", int)
        leader, epoch, isr = _field(rec, "leader", int), _field(rec, "epoch", int), sorted(set(_ids(rec, "isr")))
        if not 0 <= s < len(self.shards):
            return _Update()
        cur = self.shards[s]
        replicas = _ids(rec, "replicas", cur.replicas)
        target = _ids(rec, "target", cur.target, nullable=True)
        if len(set(replicas)) != len(replicas) or any(r not in self.nodes for r in replicas):
            return _Update()
        if target is not None and not set(target) <= set(replicas):
            return _Update()
        if expect != cur.version or leader not in replicas or leader not in isr:
            return _Update()
        # A record moves the epoch by one at most, and only with the leader:
        # whatever proposes it, no record can take a shard to an epoch the
        # next controller's election would not reach (issue 28).
        if not set(isr) <= set(replicas) or epoch != cur.epoch + (leader != cur.leader):
            return _Update()
        return _Update([("shard", s)], shards={s: ShardMeta(replicas, leader, epoch, isr, cur.version + 1, target)})

    def _decide_topic(self, rec: dict) -> _Update:
        name = _latin1(_field(rec, "name", str))
        blob = _field(rec, "blob", str, nullable=True)
        topic_id, origin, nonce = _field(rec, "id", str), _field(rec, "origin", int), _field(rec, "nonce", str)
        if blob is None:
            known = self.topics.get(name)
            if known is None or known[1] != topic_id:
                return _Update([("topic", (name, None, topic_id, -1, nonce))])  # seen, nothing to do
            return _Update([("topic", (name, None, topic_id, origin, nonce))], topics={name: None})
        raw = _latin1(blob)
        return _Update([("topic", (name, raw, topic_id, origin, nonce))], topics={name: (raw, topic_id, origin)})

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
            obj = parse_json(data)
            return cls([_shard_from_json(s) for s in _field(obj, "shards", list)],
                       {_node_key(n): _node_from_json(v) for n, v in _field(obj, "nodes", dict).items()},
                       _field(obj, "initialized", bool),
                       dict(_topic_from_json(t) for t in _field(obj, "topics", list, [])))
        except ValueError as e:  # (MetadataError is one)
            raise MetadataError(f"metadata snapshot does not decode: {e}") from None

    def live(self, node: int) -> bool:
        meta = self.nodes.get(node)
        return meta is not None and not meta.fenced


def _dump(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()


@dataclass
class _Update:
    """What one record changes, decided before anything is written."""
    changes: list[tuple[str, Any]] = field(default_factory=list)  # what ``apply`` returns
    init: tuple[list[ShardMeta], dict[int, NodeMeta]] | None = None  # the first record: shards and nodes
    shards: dict[int, ShardMeta] = field(default_factory=dict)  # shard -> its new state
    nodes: dict[int, NodeMeta] = field(default_factory=dict)  # node -> its new state
    topics: dict[bytes, tuple[bytes, str, int] | None] = field(default_factory=dict)  # None: deleted


# Each record kind and the fields it cannot be without.
_RECORD_FIELDS = {"init": ("nodes", "shards"), "node": ("node", "inc", "fenced"),
                  "shard": ("s", "expect", "leader", "epoch", "isr"),
                  "topic": ("name", "blob", "id", "origin", "nonce"), "join": ("node", "host", "port")}


def _decode_record(data: bytes) -> dict:
    try:
        rec = parse_json(data)
    except ValueError as e:  # (nested too deep too: parse_json)
        raise MetadataError(f"not a metadata record ({e})") from None
    if not isinstance(rec, dict) or not isinstance(rec.get("t"), str) or rec["t"] not in _RECORD_FIELDS:
        raise MetadataError("not a metadata record (unknown kind)")
    missing = [f for f in _RECORD_FIELDS[rec["t"]] if f not in rec]
    if missing:
        raise MetadataError(f"{rec['t']} record without {', '.join(missing)}")
    return rec


_REQUIRED: Any = object()


def _field(obj: Any, key: str, kind: type, default: Any = _REQUIRED, *, nullable: bool = False) -> Any:
    """``obj[key]`` (``default`` when missing), which must be a ``kind`` as
    JSON decodes it (``true`` is no integer, ``2.0`` no node), or None if
    ``nullable``. Nothing is coerced: a value of another type is not one this
    module wrote (MetadataError)."""
    value = obj.get(key, default) if isinstance(obj, dict) else _REQUIRED
    if value is _REQUIRED:
        raise MetadataError(f"no {key!r} in {obj!r}")
    return _typed(value, kind, repr(key), nullable=nullable)


def _typed(value: Any, kind: type, what: str, *, nullable: bool = False) -> Any:
    """``value`` (``what``, for the error), which must be a ``kind`` as
    ``_field`` says."""
    if type(value) is not kind and not (nullable and value is None):
        raise MetadataError(f"{what}: {value!r} is not a {kind.__name__}")
    return value


def _ids(obj: Any, key: str, default: Any = _REQUIRED, *, nullable: bool = False) -> Any:
    """A list of node ids (``_field``), copied."""
    value = _field(obj, key, list, default, nullable=nullable)
    if value is None:
        return None
    if any(type(n) is not int for n in value):
        raise MetadataError(f"{key!r}: {value!r} is not a list of node ids")
    return list(value)


def _latin1(text: str) -> bytes:
    try:
        return text.encode("latin-1")
    except UnicodeEncodeError:
        raise MetadataError(f"{text!r} is not bytes (latin-1)") from None


def _shard_from_json(obj: Any) -> ShardMeta:
    """A shard as a snapshot or an ``init`` record has it (the latter's
    shards are at version 0, without a reassignment target)."""
    return ShardMeta(_ids(obj, "replicas"), _field(obj, "leader", int), _field(obj, "epoch", int),
                     sorted(_ids(obj, "isr")), _field(obj, "version", int, 0),
                     _ids(obj, "target", None, nullable=True))


def _node_key(key: str) -> int:
    """A node id as a snapshot's ``nodes`` object has it: the decimal the
    encoder wrote (``str(n)``), not any text ``int`` reads."""
    node = int(key) if key.isdecimal() and key.isascii() else None
    if node is None or str(node) != key:
        raise MetadataError(f"node {key!r} is not a node id")
    return node


def _node_from_json(value: Any) -> NodeMeta:
    """A node as a snapshot has it: ``[incarnation, fenced, address]``
    (the address missing from snapshots older than it)."""
    fields = _typed(value, list, "node")
    if len(fields) not in (2, 3):
        raise MetadataError(f"node: {value!r} is not [incarnation, fenced, address]")
    return NodeMeta(_typed(fields[0], str, "incarnation"), _typed(fields[1], bool, "fenced"),
                    _typed(fields[2], str, "address") if len(fields) > 2 else "")


def _topic_from_json(value: Any) -> tuple[bytes, tuple[bytes, str, int]]:
    """A topic as a snapshot has it: ``[name, blob, topic id, origin]``."""
    fields = _typed(value, list, "topic")
    if len(fields) != 4:
        raise MetadataError(f"topic: {value!r} is not [name, blob, id, origin]")
    name, blob, topic_id, origin = fields
    return (_latin1(_typed(name, str, "topic name")),
            (_latin1(_typed(blob, str, "topic blob")), _typed(topic_id, str, "topic id"),
             _typed(origin, int, "topic origin")))


def _join_address(node: int, host: str, port: int, bus_port: int) -> str:
    """The address a ``join`` record gives node ``node``: ``host:port@bus``
    (bus 0: port + 10000), which every node reads back with
    ``parse_address`` when it applies the record (MetadataError unless it
    reads back as this node)."""
    joined = Node(node, host, port, bus_port)
    try:
        back = parse_address(node, joined.entry)
    except ValueError:
        back = None
    if node < 1 or back != joined:
        raise MetadataError(f"node {node} cannot join at {joined.entry!r}")
    return joined.entry


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
        restarted: set[int] = set()  # re-registering: its record moves its shards (Metadata._rejoined)
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
