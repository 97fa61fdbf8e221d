"""The static cluster: who the nodes are, which node leads which hash slots.

Owns: parsing ``--cluster-nodes 1@127.0.0.1:7001,2@...``; Redis Cluster's
key → slot function (CRC16/XMODEM of the key or of its ``{hash tag}``,
modulo 16384); the deterministic placement every node computes alike with no
coordination (slots cut into one equal range per node, range ``i`` is
*shard* ``i``, its replicas are nodes ``i, i+1, ... i+rf-1`` in node-id
order, the first of them its preferred leader); and ``ClusterState``: each
shard's current leader and leader epoch, persisted in the data directory so
a restarted node remembers a manual failover.

Leadership is an input here, never decided: the state changes only when told
— by the controller's committed metadata (``adopt``, cluster/controller/), or
by a peer that reports a newer epoch (``merge``), which it can only know
from that metadata.

Must not know: sockets, trio, RESP, partitions' logs.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from storage.checkpoint import read_file, write_atomic
from storage.errors import StorageError

SLOTS = 16384
STATE_FILE = "cluster.state"

log = logging.getLogger("partita.cluster")


class ClusterConfigError(ValueError):
    """``cluster-nodes`` / ``node-id`` do not describe a usable cluster."""


@dataclass(frozen=True)
class Node:
    id: int
    host: str
    port: int

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def parse_cluster_nodes(text: str) -> list[Node]:
    """``"1@127.0.0.1:7001,2@127.0.0.1:7002"`` → nodes sorted by id."""
    nodes: dict[int, Node] = {}
    for item in text.replace(" ", ",").split(","):
        item = item.strip()
        if not item:
            continue
        ident, at, address = item.partition("@")
        host, colon, port = address.rpartition(":")
        if not at or not colon or not host:
            raise ClusterConfigError(f"cluster-nodes entry '{item}' is not <node-id>@<host>:<port>")
        try:
            node_id, port_n = int(ident), int(port)
        except ValueError:
            raise ClusterConfigError(f"cluster-nodes entry '{item}' is not <node-id>@<host>:<port>") from None
        if node_id < 1 or not 0 < port_n < 65536:
            raise ClusterConfigError(f"cluster-nodes entry '{item}': node ids start at 1, ports are 1-65535")
        if node_id in nodes:
            raise ClusterConfigError(f"cluster-nodes names node {node_id} twice")
        nodes[node_id] = Node(node_id, host, port_n)
    return [nodes[k] for k in sorted(nodes)]


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
        # From the controller's committed metadata (cluster/controller): each
        # shard's ISR, and the nodes fenced for not heartbeating.
        self.isr: list[set[int]] = [set(placement.replicas(s)) for s in range(placement.shard_count)]
        self.fenced: set[int] = set()
        self.controlled = False  # True once a controller's metadata drives this state
        if self.path is not None:
            self._load()

    def _load(self) -> None:
        data = read_file(self.path)
        if data is None or self.placement.shard_count == 0:
            return  # (a joining node: its shards come from the controller's metadata)
        try:
            obj = json.loads(data)
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
            # (and every peer's newer epochs) corrects. Raising here would
            # leave a committed record half applied.
            log.warning("%s: cluster state not saved: %s", self.path, e)

    def leader(self, shard: int) -> int:
        return self.shards[shard][0]

    def epoch(self, shard: int) -> int:
        return self.shards[shard][1]

    def set_leader(self, shard: int, leader: int, epoch: int) -> bool:
        """Adopt ``leader`` at ``epoch`` when newer than what is known; True if adopted."""
        if not 0 <= shard < len(self.shards) or leader not in self.placement.replicas(shard):
            return False
        if epoch <= self.shards[shard][1]:
            return False
        self._move(shard, leader, epoch)
        return True

    def _move(self, shard: int, leader: int, epoch: int) -> None:
        self.shards[shard] = (leader, epoch)
        self.version += 1
        self._save()
        log.info("shard %d (slots %d-%d): leader is now node %d at epoch %d",
                 shard, *self.placement.slot_range(shard), leader, epoch)

    def resize(self, shards: list[tuple[int, int]], isrs: list[set[int]]) -> None:
        """A joining node takes the cluster's shards from the metadata."""
        self.shards = list(shards)
        self.isr = [set(i) for i in isrs]
        self.version += 1
        self._save()

    def adopt(self, shard: int, leader: int, epoch: int, isr: set[int]) -> bool:
        """The controller's committed (leader, epoch, ISR) of ``shard``. Never
        goes back to an older epoch (a peer's newer view may have arrived
        first); True if the leader or epoch changed."""
        if not 0 <= shard < len(self.shards) or leader not in self.placement.replicas(shard):
            return False
        cur_leader, cur_epoch = self.shards[shard]
        if epoch < cur_epoch:
            return False
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

    def merge(self, blob: bytes) -> bool:
        """Adopt every newer shard in a peer's ``encode()``; True if anything changed."""
        changed = False
        try:
            items = [tuple(int(x) for x in part.split(b":")) for part in blob.split(b",") if part]
        except ValueError:
            return False
        if len(items) != len(self.shards):
            return False
        for s, (leader, epoch) in enumerate(items):
            changed |= self.set_leader(s, leader, epoch)
        return changed
