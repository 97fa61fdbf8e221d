"""What the cluster fault tests share: the ledger of acknowledged writes, an
acks=all producer thread, and the check of one key on its final leader."""

from __future__ import annotations

import os
import random
import threading
import time
from dataclasses import dataclass, field

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.clusterkit import Cluster, leased


@dataclass
class Ledger:
    keys: list[bytes]
    acked: dict[bytes, list[bytes]] = field(default_factory=dict)
    failed_writes: int = 0
    faults: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.acked = {k: [] for k in self.keys}

    def count(self, fault: str) -> None:
        self.faults[fault] = self.faults.get(fault, 0) + 1

    def fault_summary(self) -> str:
        return ", ".join(f"{v} {k}" for k, v in sorted(self.faults.items()))


def no_retry_client(node, **kwargs) -> redis.Redis:
    """A client that never resends a command by itself (redis-py retries on
    connection errors by default): a command whose reply was lost must count
    as unknown, not as the error a silent second attempt got."""
    return node.client(retry=Retry(NoBackoff(), 0), **kwargs)


def produce(cluster: Cluster, key: bytes, ledger: Ledger, stop: threading.Event) -> None:
    """One producer: XADD to the key's leader; on any error, find the leader
    again and go on. Only replies count as acknowledged."""
    client = None
    i = 0
    while not stop.is_set():
        try:
            if client is None:
                client = no_retry_client(cluster.leader_of(key), socket_timeout=5)
            ledger.acked[key].append(client.xadd(key, {"n": str(i)}))
        except (redis.RedisError, OSError, StopIteration, AssertionError):
            ledger.failed_writes += 1
            client = None
            time.sleep(0.05)
        i += 1


def check_key(cluster: Cluster, key: bytes, acked: list[bytes]) -> list[bytes]:
    """Every acknowledged entry of ``key`` on its final leader once and in
    acknowledgement order, and every replica's log byte-identical; returns
    the IDs stored."""
    cluster.wait_converged(key.decode(), timeout_s=30)
    # The last fault may have restarted the controller's leader: a lease
    # lapsing meanwhile refuses the read with -TRYAGAIN, retried.
    stored = [entry_id for entry_id, _ in leased(lambda: cluster.leader_of(key).client().xrange(key))]
    assert len(stored) == len(set(stored)), f"{key!r}: duplicate IDs"
    position = {entry_id: i for i, entry_id in enumerate(stored)}
    missing = [a for a in acked if a not in position]
    assert not missing, f"{key!r}: {len(missing)} acknowledged entries lost, first {missing[:3]}"
    order = [position[a] for a in acked]
    assert order == sorted(order), f"{key!r}: acknowledged entries out of order"
    logs = {cluster.log_bytes(n, key.decode()) for n in cluster.nodes}
    assert len(logs) == 1, f"{key!r}: replicas differ"
    return stored


def fault_seed() -> int:
    """``PARTITA_FAULT_SEED`` or a random one, printed so a failure can be replayed."""
    seed = int(os.environ.get("PARTITA_FAULT_SEED", "0")) or random.randrange(1 << 30)
    print(f"seed {seed} (PARTITA_FAULT_SEED={seed} reproduces the fault schedule)")
    return seed


def soak_seconds() -> float:
    return float(os.environ.get("PARTITA_SOAK_SECONDS", "300"))
