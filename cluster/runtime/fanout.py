"""Cluster mode: a read of a topic key whose partitions are led by several nodes.

A bare topic key of a multi-partition topic (``XLEN orders``, ``XRANGE
orders - +``, ``XREAD STREAMS orders 0``) reaches every partition. On one
node, and on a node that leads every partition, the broker reads them all
itself (cluster/broker/reads.py). When other nodes lead some of them, the
node the client asked (any node: the topic key's slot leader, where a
cluster client sends it, or another) reads its own partitions and asks each
other leader for its share in one ``ReadRequest`` (``ReadPart`` per
partition: a length, a range with COUNT, or the entries after an ID), all
leaders at once; the broker then merges the answers exactly as it merges
local partitions (``merge_by_id``: by ID, equal IDs in partition order,
COUNT over the merge; lengths summed; XREAD's partitions under their keys).

Consistency: every partition, here or on its leader, answers from its
committed entries only (``read_part``: below its high watermark, which
log reads stop at; the length counts the live entries below it), so the
reply never shows an entry a failover could take back. Each partition is
read at its own moment: the reply is not a snapshot of the topic at one
instant (neither is a single node's across its partitions' appends).

Errors: a leader that cannot be reached gives ``TryAgain partition
orders#n leader node N unreachable: <reason>``; a node asked for a partition
it no longer leads answers ``TryAgain`` (its leadership is moving), relayed
as it is. Inside MULTI / EXEC a read cannot wait for peers: refused
(``in_transaction``).

Owns: which partitions are read where, the ``ReadRequest``s and a pool of
``READ_LINKS`` links per peer (purpose ``read<i>``, picked by client id),
one partition's committed read (``read_part``, also what a leader answers
its peers: cluster/peer/service.py), and the merge by ID.

Must not know: encodings or sockets (the peer link), reply shapes, what a
command's arguments are (the broker's ``ReadOps`` plan the reads).
"""

from __future__ import annotations

import heapq
from typing import Any, Sequence

import trio

from cluster.errors import ClusterError, Refused, TryAgain
from cluster.peer.link import Unreachable
from cluster.peer.messages import (READ_AFTER, READ_LENGTH, READ_REVRANGE, PartRead, ReadPart, ReadRequest,
                                   ReadResponse)
from cluster.topics import partition_key
from storage.entry_codec import split_entries
from storage.streams.stream import EMPTY, Entries

READ_LINKS = 4
PURPOSE = "read"
READ_TIMEOUT_S = 10.0  # a read is answered at once: no reply in this time is a failed link


def _text(key: bytes) -> str:
    return key.decode("utf-8", "replace")


def read_part(stream: Any, part: ReadPart) -> PartRead:
    """``part`` of partition ``stream``, committed entries only: log reads
    stop at the high watermark, and the length counts the live entries
    below it (a leader's own XLEN counts those above it too). The entries
    are copies (``bytes``), safe to keep across awaits."""
    log = stream.log
    if part.op == READ_LENGTH:
        return PartRead(length=stream.live_between(0, log.high_watermark))
    count = part.count or None
    if part.op == READ_AFTER:
        lo = max(log.find_offset(part.start[0], part.start[1], inclusive=False), log.log_start_offset)
        hi = log.log_end_offset
    else:
        if part.start > part.end:
            return PartRead()
        lo = max(log.find_offset(part.start[0], part.start[1], inclusive=True), log.log_start_offset)
        hi = log.find_offset(part.end[0], part.end[1], inclusive=False)
    if lo >= min(hi, log.log_end_offset):
        return PartRead()
    if part.op == READ_REVRANGE:
        res = log.read_reverse(lo, hi, max_count=count, with_ids=True)
    else:
        res = log.read(lo, hi, max_count=count, with_ids=True)
    if not res.count:
        return PartRead()
    return PartRead(0, tuple((ms, seq) for _, ms, seq in res.entries), tuple(split_entries(res.chunks)))


def merge_by_id(reads: Sequence[PartRead], count: int | None, rev: bool) -> Entries:
    """One range of the partitions' ``reads`` (in partition order): merged by
    ID (newest first when ``rev``), equal IDs in partition order, at most
    ``count`` (None: all)."""
    if count == 0:
        return EMPTY
    runs = []
    for n, found in enumerate(reads):
        if found.ids:
            tag = -n if rev else n  # equal IDs in partition order, either way
            runs.append([(stream_id, tag, encoded) for stream_id, encoded in zip(found.ids, found.entries)])
    chunks = []
    for _, _, encoded in heapq.merge(*runs, reverse=rev):
        chunks.append(encoded)
        if count is not None and len(chunks) >= count:
            break
    return Entries(len(chunks), chunks) if chunks else EMPTY


class FanOut:
    """The topic-wide reads of one node (``Replication.fanout``)."""

    def __init__(self, replication: Any) -> None:
        self.replication = replication

    def led_elsewhere(self, topic: bytes) -> bool:
        """Whether another node leads a partition of multi-partition ``topic``."""
        manager = self.replication.manager
        my_id = manager.my_id
        leader = manager.state.leader
        return any(leader(manager.shard_of(topic, n)) != my_id
                   for n in range(self.replication.topics.partitions_of(topic)))

    def in_transaction(self, topic: bytes) -> ClusterError:
        """The refusal of a read across nodes inside MULTI / EXEC (it cannot wait)."""
        return ClusterError(f"topic '{_text(topic)}' has partitions led by other nodes, and a transaction cannot "
                            "read from other nodes; use partition keys ('<topic>#<n>') inside MULTI")

    async def read(self, topic: bytes, part: ReadPart, client_id: int = 0) -> list[PartRead]:
        """``part`` (its ``topic`` and ``n`` unset) of every partition of
        ``topic``, in partition order: the other leaders asked at once, one
        request each, then this node's partitions read here. Raises
        ``TryAgain`` (a leader unreachable, or moving) or ``Refused``."""
        replication = self.replication
        manager = replication.manager
        partitions = replication.topics.partitions_of(topic)
        asked: dict[int, list[ReadPart]] = {}
        for n in range(partitions):
            leader = manager.state.leader(manager.shard_of(topic, n))
            asked.setdefault(leader, []).append(ReadPart(topic, n, part.op, part.start, part.end, part.count))
        here = asked.pop(manager.my_id, [])
        found: dict[int, PartRead] = {}
        failures: list[ClusterError] = []
        async with trio.open_nursery() as nursery:
            for leader, parts in asked.items():
                nursery.start_soon(self._ask, leader, parts, client_id, found, failures)
        if failures:
            raise failures[0]
        topics = replication.topics
        for p in here:
            found[p.n] = read_part(topics.stream_of(topic, p.n), p)
        return [found[n] for n in range(partitions)]

    async def _ask(self, leader: int, parts: list[ReadPart], client_id: int, found: dict,
                   failures: list) -> None:
        link = self.replication.link(leader, f"{PURPOSE}{client_id % READ_LINKS}")
        link.reply_timeout_s = READ_TIMEOUT_S
        try:
            response: ReadResponse = await link.call(ReadRequest(tuple(parts)))
        except Unreachable as e:
            keys = ", ".join(_text(partition_key(p.topic, p.n)) for p in parts)
            failures.append(TryAgain(f"partition {keys} leader node {leader} unreachable: {e}"))
            return
        except Refused as e:  # (the leader's own TryAgain when its leadership moved: relayed)
            failures.append(e)
            return
        for p, answer in zip(parts, response.parts):
            found[p.n] = answer
