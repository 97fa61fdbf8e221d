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

A blocked read (XREAD BLOCK) that found nothing waits with a long poll on
each leader (``wait_for_entries``: a ``ReadRequest`` with ``max_wait_ms``,
served by this node's own ``PeerService`` for the partitions it leads):
the leader answers once one of its partitions has a committed entry after
the reader's position, and the broker then reads again. Long polls hold a
link for their whole wait, so they take links of their own from a small
pool per peer (``WAIT_LINKS_IDLE_MAX`` kept idle), never the plain reads'.

Errors: a leader that cannot be reached gives ``TryAgain partition
orders#n leader node N unreachable: <reason>``; a node asked for a partition
it no longer leads answers ``TryAgain`` (its leadership is moving), relayed
as it is. Inside MULTI / EXEC a read cannot wait for peers: refused
(``in_transaction``).

The group commands of a topic key work across nodes with the same
machinery beside this module: XGROUP CREATE / SETID / DESTROY sent to each
partition's leader (cluster/broker/groups.py), XREADGROUP through the
group's coordinator (cluster/broker/topic_groups.py), and XINFO GROUPS /
CONSUMERS, TOPIC GROUPS (and TOPIC DESCRIBE's groups) gathered from each
partition's leader and the coordinator (``GroupInfoRequest``, also in
topic_groups.py), merged as one node merges; this module lends them
``unreachable`` (what a failed link becomes) and ``in_transaction``.

Owns: which partitions are read where, the ``ReadRequest``s and a pool of
``READ_LINKS`` links per peer (purpose ``read<i>``, picked by client id),
the blocked reads' long polls and their links,
one partition's committed read (``read_part``, also what a leader answers
its peers: cluster/peer/service.py), the merge by ID, and what a leader
that cannot answer becomes for the client (``unreachable``).

Must not know: encodings or sockets (the peer link), reply shapes, what a
command's arguments are (the broker's ``ReadOps`` plan the reads).
"""

from __future__ import annotations

import heapq
from typing import Any, Collection, Sequence

import trio

from cluster.errors import ClusterError, Refused, TryAgain
from cluster.peer.link import Unreachable
from cluster.peer.messages import (READ_AFTER, READ_AFTER_LAST, READ_LENGTH, READ_REVRANGE, PartRead, ReadPart,
                                   ReadRequest, ReadResponse)
from cluster.topics import partition_key
from storage.entry_codec import split_entries
from storage.streams.stream import EMPTY, Entries

READ_LINKS = 4
PURPOSE = "read"
READ_TIMEOUT_S = 10.0  # a read is answered at once: no reply in this time is a failed link
READ_WAIT_MS = 30000  # a blocked read's long poll asks again after this (cluster.peer.service.READ_WAIT_MAX_MS)
WAIT_LINKS_IDLE_MAX = 8  # links kept per node for blocked reads' long polls


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
    position = (0, 0)
    if part.op == READ_AFTER or part.op == READ_AFTER_LAST:
        position = tuple(stream.last_id) if part.op == READ_AFTER_LAST else part.start
        lo = max(log.find_offset(position[0], position[1], inclusive=False), log.log_start_offset)
        hi = log.log_end_offset
    elif part.start <= part.end:
        lo = max(log.find_offset(part.start[0], part.start[1], inclusive=True), log.log_start_offset)
        hi = log.find_offset(part.end[0], part.end[1], inclusive=False)
    else:
        return PartRead()
    if lo >= min(hi, log.log_end_offset):
        return PartRead(position=position)
    if part.op == READ_REVRANGE:
        res = log.read_reverse(lo, hi, max_count=part.count or None, with_ids=True)
    else:
        res = log.read(lo, hi, max_count=part.count or None, with_ids=True)
    return PartRead(0, tuple((ms, seq) for _, ms, seq in res.entries), tuple(split_entries(res.chunks)), position)


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
        # Links kept for blocked reads' long polls, by node: each poll holds
        # one for its whole wait, so they are taken from here and given back.
        self._idle_waits: dict[int, list[Any]] = {}

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

    def parts(self, topic: bytes, part: ReadPart, starts: Sequence[tuple[int, int]] | None = None) -> list[ReadPart]:
        """``part`` (its ``topic`` and ``n`` unset) for every partition of
        ``topic``; ``starts``: each partition's own ``start`` instead (a
        partition beyond them, added since, starts at 0-0)."""
        def start(n: int) -> tuple[int, int]:
            if starts is None:
                return part.start
            return starts[n] if n < len(starts) else (0, 0)

        return [ReadPart(topic, n, part.op, start(n), part.end, part.count)
                for n in range(self.replication.topics.partitions_of(topic))]

    async def read(self, topic: bytes, part: ReadPart, client_id: int = 0) -> list[PartRead]:
        """``part`` of every partition of ``topic`` (``parts``), in partition order."""
        return await self.read_parts(self.parts(topic, part), client_id)

    def _by_leader(self, parts: list[ReadPart]) -> dict[int, list[ReadPart]]:
        manager = self.replication.manager
        asked: dict[int, list[ReadPart]] = {}
        for p in parts:
            asked.setdefault(manager.state.leader(manager.shard_of(p.topic, p.n)), []).append(p)
        return asked

    async def read_parts(self, parts: list[ReadPart], client_id: int = 0) -> list[PartRead]:
        """Each of ``parts`` (partitions of one topic, in partition order)
        read where it is led: the other leaders asked at once, one request
        each, then this node's partitions read here. Raises ``TryAgain`` (a
        leader unreachable, or moving) or ``Refused``."""
        asked = self._by_leader(parts)
        here = asked.pop(self.replication.manager.my_id, [])
        found: dict[int, PartRead] = {}
        failures: list[ClusterError] = []
        async with trio.open_nursery() as nursery:
            for leader, each in asked.items():
                nursery.start_soon(self._ask, leader, each, client_id, found, failures)
        if failures:
            raise failures[0]
        topics = self.replication.topics
        for p in here:
            found[p.n] = read_part(topics.stream_of(p.topic, p.n), p)
        return [found[p.n] for p in parts]

    async def _ask(self, leader: int, parts: list[ReadPart], client_id: int, found: dict,
                   failures: list) -> None:
        link = self.replication.link(leader, f"{PURPOSE}{client_id % READ_LINKS}")
        link.reply_timeout_s = READ_TIMEOUT_S
        try:
            response: ReadResponse = await link.call(ReadRequest(tuple(parts)))
        except (Unreachable, Refused) as e:
            failures.append(unreachable(leader, _keys(parts), e))
            return
        for p, answer in zip(parts, response.parts):
            found[p.n] = answer

    async def wait_for_entries(self, topic: bytes, starts: Sequence[tuple[int, int]],
                               timeout_s: float | None, only: Collection[int] | None = None) -> bool:
        """Wait until a partition of ``topic`` (of ``only``, if given) has a
        committed entry after its start (``starts``, in partition order): True;
        False when ``timeout_s`` passed first (None: no limit). Each partition's
        leader is asked in a long poll (``ReadRequest.max_wait_ms``; this
        node's own service for the partitions it leads), all at once; the
        first with news ends the others. Raises ``TryAgain`` / ``Refused``
        as ``read_parts``."""
        deadline = None if timeout_s is None else trio.current_time() + timeout_s
        news: list[bool] = []
        failures: list[ClusterError] = []
        async with trio.open_nursery() as nursery:
            parts = self.parts(topic, ReadPart(b"", 0, READ_AFTER, count=1), starts)
            if only is not None:
                parts = [p for p in parts if p.n in only]
            for leader, each in self._by_leader(parts).items():
                nursery.start_soon(self._poll, leader, each, deadline, nursery.cancel_scope, news, failures)
        if failures:
            raise failures[0]
        return bool(news)

    async def _poll(self, leader: int, parts: list[ReadPart], deadline: float | None, scope: trio.CancelScope,
                    news: list, failures: list) -> None:
        replication = self.replication
        while True:
            wait_ms = READ_WAIT_MS if deadline is None else min(
                READ_WAIT_MS, int((deadline - trio.current_time()) * 1000))
            if wait_ms <= 0:
                return
            request = ReadRequest(tuple(parts), wait_ms)
            try:
                if leader == replication.manager.my_id:
                    response = await replication.service.read(request)
                else:
                    response = await self._call_waiting(leader, request, wait_ms)
            except (Unreachable, Refused, TryAgain) as e:
                failures.append(unreachable(leader, _keys(parts), e))
                scope.cancel()
                return
            if any(found.ids for found in response.parts):
                news.append(True)
                scope.cancel()
                return

    async def _call_waiting(self, leader: int, request: ReadRequest, wait_ms: int) -> ReadResponse:
        idle = self._idle_waits.setdefault(leader, [])
        link = idle.pop() if idle else self.replication.links.factory(leader)
        link.reply_timeout_s = wait_ms / 1000 + READ_TIMEOUT_S
        try:
            return await link.call(request)
        finally:  # (a link cancelled mid-call has closed its connection: it opens a new one when used)
            if len(idle) < WAIT_LINKS_IDLE_MAX:
                idle.append(link)
            else:
                closer = getattr(link, "aclose", None)
                if closer is not None:
                    with trio.CancelScope(shield=True):
                        await closer()


def _keys(parts: list[ReadPart]) -> list[bytes]:
    return [partition_key(p.topic, p.n) for p in parts]


def unreachable(leader: int, keys: Sequence[bytes], e: Exception) -> ClusterError:
    """What a client gets when ``leader`` could not answer for the
    partitions ``keys``: ``TryAgain`` for a failed link, the leader's own
    refusal (its TryAgain when its leadership moved) as it is."""
    if isinstance(e, Unreachable):
        return TryAgain(f"partition {', '.join(_text(k) for k in keys)} leader node {leader} unreachable: {e}")
    assert isinstance(e, ClusterError)
    return e
