"""The static cluster: who the nodes are, which node leads which hash slots.

Owns: parsing ``--cluster-nodes 1@127.0.0.1:7001,2@...`` (each entry
``<id>@<host>:<port>[@<bus-port>[@<kafka-port>]]``: the client port, then the
cluster bus port peers talk on, ``port + 10000`` when not named (or 0), as
Redis Cluster's bus; ``bus_port_of`` gives this node's own; then the port
its Kafka listener is reached on, when named: ``kafka_port``, 0 when not,
and the Kafka front-end derives it), and the settings that need it
(``check_single_node``); Redis Cluster's
key → slot function (CRC16/XMODEM of the key or of its ``{hash tag}``,
modulo 16384); the deterministic placement every node computes alike with no
coordination (slots cut into one equal range per node, range ``i`` is
*shard* ``i``, its replicas are nodes ``i, i+1, ... i+rf-1`` in node-id
order, the first of them its preferred leader); and ``ClusterState``: each
shard's current leader and leader epoch, persisted in the data directory so
a restarted node remembers a manual failover.

Leadership is an input here, never decided: the state changes only by the
controller's committed metadata (``adopt``, cluster/controller/). A peer's
view (what it sends with a fetch) moves nothing: one that disagrees is logged
(``note_peer_view``, rate-limited) and ignored, so no message from anyone can
raise a leader epoch past what the controller committed (issue 28: a forged
view once made a node leader at epoch 999999999 for good).

Must not know: sockets, trio, RESP, partitions' logs.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from storage.checkpoint import parse_json, read_file, write_atomic
from storage.errors import StorageError

SLOTS = 16384
STATE_FILE = "cluster.state"
PEER_VIEW_LOG_S = 30.0

log = logging.getLogger("partita.cluster")


class ClusterConfigError(ValueError):
    """``cluster-nodes`` / ``node-id`` do not describe a usable cluster."""


BUS_PORT_OFFSET = 10000  # a node's cluster bus port when not named: its port + 10000 (Redis Cluster's)
ENTRY_SYNTAX = "<node-id>@<host>:<port>[@<bus-port>[@<kafka-port>]]"


@dataclass(frozen=True)
class Node:
    id: int
    host: str
    port: int  # the client port (what -MOVED and CLUSTER SLOTS name)
    bus_port: int = 0  # the cluster bus port peers talk on (0: port + 10000)
    kafka_port: int = 0  # its Kafka listener's port when the entry names one (0: not named)

    def __post_init__(self) -> None:
        if not self.bus_port:
            object.__setattr__(self, "bus_port", self.port + BUS_PORT_OFFSET)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def entry(self) -> str:
        """``host:port@bus-port``, as CLUSTER NODES and a ``join`` record write it."""
        return f"{self.address}@{self.bus_port}"


def parse_address(node_id: int, text: str) -> Node:
    """``host:port[@bus-port[@kafka-port]]`` → the node (ValueError when malformed)."""
    address, at, ports = text.partition("@")
    host, colon, port = address.rpartition(":")
    bus, at2, kafka = ports.partition("@")
    if not colon or not host or (at and not bus) or (at2 and not kafka):
        raise ValueError(text)
    port_n, bus_n, kafka_n = int(port), int(bus) if at else 0, int(kafka) if at2 else 0
    if not 0 < port_n < 65536 or not 0 <= bus_n < 65536 or not 0 <= kafka_n < 65536:
        raise ValueError(text)
    return Node(node_id, host, port_n, bus_n, kafka_n)


def parse_cluster_nodes(text: str) -> list[Node]:
    """``"1@127.0.0.1:7001,2@127.0.0.1:7002@17002"`` → nodes sorted by id."""
    nodes: dict[int, Node] = {}
    for item in text.replace(" ", ",").split(","):
        item = item.strip()
        if not item:
            continue
        ident, at, rest = item.partition("@")
        try:
            node_id = int(ident)
            node = parse_address(node_id, rest)
        except ValueError:
            raise ClusterConfigError(f"cluster-nodes entry '{item}' is not {ENTRY_SYNTAX} "
                                     "(node ids start at 1, ports are 1-65535)") from None
        if not at or node_id < 1:
            raise ClusterConfigError(f"cluster-nodes entry '{item}': node ids start at 1")
        if node.bus_port > 65535:
            raise ClusterConfigError(f"cluster-nodes entry '{item}': its cluster bus port would be port + "
                                     f"{BUS_PORT_OFFSET} = {node.bus_port}; name one: "
                                     f"{node_id}@{node.address}@<bus-port>")
        if node_id in nodes:
            raise ClusterConfigError(f"cluster-nodes names node {node_id} twice")
        nodes[node_id] = node
    return [nodes[k] for k in sorted(nodes)]


# Settings that mean something only in a cluster: on a single node (no
# cluster-nodes) they are a mistake, most likely a cluster-nodes forgotten.
CLUSTER_ONLY_OPTIONS = ("node-id", "cluster-join", "controller-nodes", "cluster-port")


def check_single_node(config: Any) -> None:
    """ClusterConfigError naming a cluster-only setting given without cluster-nodes."""
    for name in CLUSTER_ONLY_OPTIONS:
        if config.get(name):
            raise ClusterConfigError(f"{name} {config.text(name)} needs cluster-nodes (empty: a single node); "
                                     "name every node there, or drop it")


def bus_port_of(nodes: list[Node], my_id: int, cluster_port: int = 0) -> int:
    """This node's cluster bus port: ``cluster-port`` when set, else the one
    its own ``cluster-nodes`` entry names (or implies: port + 10000). They
    may differ, as for a node its peers reach through a proxy or NAT."""
    if cluster_port:
        return cluster_port
    for node in nodes:
        if node.id == my_id:
            return node.bus_port
    raise ClusterConfigError(f"node-id {my_id} is not one of cluster-nodes "
                             f"({', '.join(str(n.id) for n in nodes)})")


def _crc16_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else (crc << 1)
        table.append(crc & 0xFFFF)
    return table


_CRC16 = _crc16_table()


def crc16(data: bytes) -> int:
    """CRC16/XMODEM, the one Redis Cluster uses (crc16.c)."""
    crc = 0
    for byte in data:
        crc = ((crc << 8) & 0xFFFF) ^ _CRC16[((crc >> 8) ^ byte) & 0xFF]
    return crc


def key_slot(key: bytes) -> int:
    """Redis Cluster's ``keyHashSlot``: the ``{tag}`` when non-empty, else the key."""
    start = key.find(b"{")
    if start >= 0:
        end = key.find(b"}", start + 1)
        if end > start + 1:
            key = key[start + 1:end]
    return crc16(key) % SLOTS


class Placement:
    """Shards, their slot ranges and replica lists, from the node list alone."""

    def __init__(self, nodes: list[Node], my_id: int, replication_factor: int = 0, *, joining: bool = False) -> None:
        if not nodes:
            raise ClusterConfigError("cluster-nodes is empty")
        if my_id not in {n.id for n in nodes}:
            raise ClusterConfigError(f"node-id {my_id} is not one of cluster-nodes "
                                     f"({', '.join(str(n.id) for n in nodes)})")
        n = len(nodes)
        rf = replication_factor or min(3, n)
        if not 1 <= rf <= n:
            raise ClusterConfigError(f"replication-factor {rf} needs at least {rf} nodes; cluster-nodes has {n}")
        self.nodes = list(nodes)
        self.by_id = {node.id: node for node in nodes}
        self.my_id = my_id
        self.replication_factor = rf
        # Replica lists the controller changed (CLUSTER REASSIGN): shard -> node ids.
        self.assigned: dict[int, list[int]] = {}
        # The shards and their first replicas come from the node list a cluster
        # starts with, fixed from then on; a node joining a running cluster
        # has none until the controller's metadata gives them (set_shards).
        n = len(nodes)
        self._static = [] if joining else [[nodes[(s + k) % n].id for k in range(rf)] for s in range(n)]

    @property
    def shard_count(self) -> int:
        return len(self._static)

    def set_shards(self, replicas: list[list[int]]) -> None:
        """A joining node learns the cluster's shards (their replicas) from the metadata."""
        self._static = [list(r) for r in replicas]

    def add_node(self, node: Node) -> bool:
        """A node that joined the running cluster; True if it was new here."""
        if node.id in self.by_id:
            return False
        self.nodes.append(node)
        self.nodes.sort(key=lambda n: n.id)
        self.by_id[node.id] = node
        return True

    def shard_of_slot(self, slot: int) -> int:
        return slot * self.shard_count // SLOTS

    def slot_range(self, shard: int) -> tuple[int, int]:
        """First and last slot of ``shard`` (inclusive, as CLUSTER SLOTS)."""
        n = self.shard_count
        first = -(-shard * SLOTS // n)
        last = -(-(shard + 1) * SLOTS // n) - 1
        return first, last

    def replicas(self, shard: int) -> list[int]:
        """Node ids holding ``shard``'s partitions, preferred leader first."""
        assigned = self.assigned.get(shard)
        return assigned if assigned is not None else self.static_replicas(shard)

    def static_replicas(self, shard: int) -> list[int]:
        """The replicas ``shard`` started with (before any reassignment)."""
        return self._static[shard]

    def preferred_leader(self, shard: int) -> int:
        return self.replicas(shard)[0]

    def shards_of(self, node_id: int) -> list[int]:
        return [s for s in range(self.shard_count) if node_id in self.replicas(s)]


class ClusterState:
    """Each shard's (leader, epoch), durable in ``<dir>/cluster.state``.

    The first start of a cluster has every shard at epoch 1 led by its
    preferred leader; each change must carry a higher epoch.
    """

    def __init__(self, placement: Placement, data_dir: Path | None) -> None:
        self.placement = placement
        self.path = data_dir / STATE_FILE if data_dir is not None else None
        self.shards: list[tuple[int, int]] = [
            (placement.preferred_leader(s), 1) for s in range(placement.shard_count)]
        self.version = 0  # bumped on every leader change (watchers re-read)
        self.leader_changes = 0  # shard leaders (or epochs) this node moved to since it started
        # From the controller's committed metadata (cluster/controller): each
        # shard's ISR, and the nodes fenced for not heartbeating.
        self.isr: list[set[int]] = [set(placement.replicas(s)) for s in range(placement.shard_count)]
        self.fenced: set[int] = set()
        self.controlled = False  # True once a controller's metadata drives this state
        self._view_logged: dict[str, float] = {}  # note_peer_view: source -> when last logged
        if self.path is not None:
            self._load()

    def _load(self) -> None:
        data = read_file(self.path)
        if data is None or self.placement.shard_count == 0:
            return  # (a joining node: its shards come from the controller's metadata)
        try:
            obj = parse_json(data)
            shards = [(int(a), int(b)) for a, b in obj["shards"]]
        except (ValueError, KeyError, TypeError) as e:
            raise ClusterConfigError(f"{self.path}: unreadable cluster state ({e}); "
                                     "remove it to start from the static placement") from None
        if len(shards) != self.placement.shard_count:
            log.warning("%s: written for %d shards, cluster-nodes has %d: starting from the static placement",
                        self.path, len(shards), self.placement.shard_count)
            return
        for s, (leader, epoch) in enumerate(shards):
            if leader in self.placement.replicas(s) and epoch >= 1:
                self.shards[s] = (leader, epoch)

    def _save(self) -> None:
        if self.path is None:
            return
        try:
            write_atomic(self.path, json.dumps({"version": 1, "shards": self.shards}).encode())
        except (StorageError, OSError) as e:
            # The view in memory is right and is what this node acts on; the
            # file only seeds a restart, which the controller's metadata log
            # corrects. Raising here would leave a committed record half
            # applied.
            log.warning("%s: cluster state not saved: %s", self.path, e)

    def leader(self, shard: int) -> int:
        return self.shards[shard][0]

    def epoch(self, shard: int) -> int:
        return self.shards[shard][1]

    def _move(self, shard: int, leader: int, epoch: int) -> None:
        self.shards[shard] = (leader, epoch)
        self.version += 1
        self.leader_changes += 1
        self._save()
        log.info("shard %d (slots %d-%d): leader is now node %d at epoch %d",
                 shard, *self.placement.slot_range(shard), leader, epoch)

    def resize(self, shards: list[tuple[int, int]], isrs: list[set[int]]) -> None:
        """A joining node takes the cluster's shards from the metadata."""
        self.shards = list(shards)
        self.isr = [set(i) for i in isrs]
        self.version += 1
        self._save()

    def adopt(self, shard: int, leader: int, epoch: int, isr: set[int], *, rewind: bool = False) -> bool:
        """The controller's committed (leader, epoch, ISR) of ``shard``; True
        if the leader or epoch changed. Committed records come in order, so
        the epoch only grows; an older one is ignored (replaying the Raft log
        at start-up goes through old records) unless ``rewind``: once the
        replay is done, the metadata is what every record this node applied
        made, and a ``cluster.state`` ahead of it came from elsewhere."""
        if not 0 <= shard < len(self.shards) or leader not in self.placement.replicas(shard):
            return False
        cur_leader, cur_epoch = self.shards[shard]
        if epoch < cur_epoch:
            if not rewind:
                return False
            log.warning("shard %d: this node had node %d leading at epoch %d, which the controller never "
                        "committed (%s): back to node %d at epoch %d", shard, cur_leader, cur_epoch,
                        "cluster.state written by an older version, or damaged", leader, epoch)
            self.isr[shard] = set(isr)
            self._move(shard, leader, epoch)
            return True
        self.isr[shard] = set(isr)
        if (leader, epoch) == (cur_leader, cur_epoch):
            return False
        if epoch == cur_epoch:
            log.warning("shard %d: controller says node %d leads at epoch %d, this node knew node %d",
                        shard, leader, epoch, cur_leader)
        self._move(shard, leader, epoch)
        return True

    def encode(self) -> bytes:
        """The whole view, for peers (``leader:epoch`` per shard, comma separated)."""
        return b",".join(b"%d:%d" % pair for pair in self.shards)

    def note_peer_view(self, blob: bytes, source: str) -> None:
        """A peer's ``encode()`` (sent with every fetch). Never adopted:
        leadership comes from the committed metadata alone. A view naming a
        newer epoch than this node knows, or another leader at the same
        epoch, is logged (once per ``PEER_VIEW_LOG_S`` per source): a peer
        that applied a commit before this node did, or a forgery."""
        if not blob:
            return
        try:
            items = [tuple(int(x) for x in part.split(b":")) for part in blob.split(b",") if part]
            differs = [(s, leader, epoch) for s, (leader, epoch) in enumerate(items)
                       if s < len(self.shards) and (epoch > self.shards[s][1]
                                                    or (epoch == self.shards[s][1] and leader != self.shards[s][0]))]
        except ValueError:
            differs = [(-1, 0, 0)]
        if not differs:
            return
        now = time.monotonic()
        if now - self._view_logged.get(source, -PEER_VIEW_LOG_S) < PEER_VIEW_LOG_S:
            return
        if len(self._view_logged) > 1024:
            self._view_logged.clear()
        self._view_logged[source] = now
        s, leader, epoch = differs[0]
        what = ("an unreadable view" if s < 0 else
                f"node {leader} leading shard {s} at epoch {epoch} (committed here: node {self.shards[s][0]} "
                f"at epoch {self.shards[s][1]})")
        log.warning("ignoring %s's view of the cluster, %s: leadership comes only from the controller's "
                    "committed metadata", source, what[:200])
