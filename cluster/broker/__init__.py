"""The broker core: one protocol-neutral layer every front-end calls.

Owns: the composition of what a write or a read needs beyond its partition
log: deferred appends (``appends``), key events and blocked readers
(``keys``; a group's blocked readers in arrival order: ``blocked_readers``),
the clock of group state (``clock_ms``), the fsync policy (``durability``,
set by the composition root), replication in a cluster (``replication``,
likewise), and the sessions
through which front-ends act for their clients (``session()``; every
operation is a ``Session`` method, and collects the receipt its reply waits
for). docs/architecture.md has the API and what a receipt guarantees.

Must not know: sockets, RESP or Kafka bytes, reply shapes, error texts.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from cluster.broker.appends import DeferredAppends
from cluster.broker.keys import KeyEvents, TooManyBlockedError
from cluster.broker.producers import (
    FENCED,
    OUT_OF_ORDER,
    Idempotence,
    IdempotenceInfo,
    ProducerBatch,
    ProducerRefused,
)
from cluster.broker.reads import AFTER_LAST, LAST_ENTRY, ReadPlan, StreamInfo
from cluster.broker.records import RECORD_BATCH_MAX_BYTES
from cluster.broker.session import (
    DEFER_MAX_BYTES,
    EntryTooLargeError,
    Receipt,
    Session,
    Trim,
    XAddPlan,
)

__all__ = [
    "Broker", "Session", "Receipt", "Trim", "XAddPlan", "EntryTooLargeError", "TooManyBlockedError",
    "DEFER_MAX_BYTES", "ReadPlan", "StreamInfo", "AFTER_LAST", "LAST_ENTRY",
    "Idempotence", "IdempotenceInfo", "ProducerBatch", "ProducerRefused", "OUT_OF_ORDER", "FENCED",
    "RECORD_BATCH_MAX_BYTES",
]


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class Broker:
    """One per server process."""

    def __init__(self, topics: Any, config: Any, clock_ms: Callable[[], int] = wall_clock_ms) -> None:
        self.topics = topics
        self.config = config
        self.clock_ms = clock_ms  # wall-clock ms of group deliveries, claims, idle times (tests pass a fake)
        self.keys = KeyEvents(config)
        # Readers blocked on one partition's group, in arrival order: (stream id, group) -> tokens.
        self.blocked_readers: dict[tuple[int, bytes], list] = {}
        self.appends = DeferredAppends(self)
        self.durability: Any = None  # the fsync policy (group commit), set by the composition root
        # In a cluster (cluster.runtime.replication.Replication): routing,
        # leadership and in-sync checks, acks=all waits, forwarding; else None.
        self.replication: Any = None
        # ``latency(event, ms)``: the front-end's latency monitor, set while
        # it is on (None: nothing is timed). The commit of deferred appends
        # reports its log writes as ``aof-write``.
        self.latency: Callable[[str, int], None] | None = None
        # The Kafka producer ids this node hands out (producers.ProducerIds), made at the first InitProducerId.
        self.producer_ids: Any = None

    def session(self, client_id: int = 0) -> Session:
        """A session for one client (``client_id`` spreads its forwarded
        appends over the links to a leader)."""
        return Session(self, client_id)

    def has_deferred(self) -> bool:
        """Whether deferred appends wait for their commit (a front-end yields
        once before it settles, so that other clients' appends of the same
        scheduler tick share the batch)."""
        return bool(self.appends.streams)

    def commit_deferred(self) -> None:
        appends = self.appends
        if appends.streams:
            appends.commit()
