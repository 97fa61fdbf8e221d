"""Reads and keyspace administration: every non-group operation that looks at streams.

Owns, as ``Session`` methods (``ReadOps`` is one of its bases): stream
lengths, ranges and reads after an ID (``length``, ``range``, ``read_after``:
THE read executor, and ``wait_for_entries``, its blocking form), a stream's
description (``stream_info``), the keyspace (``count_existing``,
``delete_keys``, ``key_names``, ``scan_keys``, ``key_count``, ``flush_all``,
``rename``) and topic administration (``create_topic``, ``describe_topic``,
``topic_names``, ``alter_topic_partitions``, ``alter_topic_config``,
``delete_topic``, ``require_topic``).

A key names a partition (``t#3``, or the bare key of a one-partition topic)
or a whole topic of several partitions; reads take either, and how many
partitions a topic has, the fan-out over them and the merge of their
entries are decided here: a topic's length sums its partitions', a range
merges them by ID (equal IDs in partition order), a read after an ID reads
each partition and answers under the partition's key. In a cluster, when
other nodes lead some of a topic's partitions, the read fans out
(``Replication.fanout``, cluster/runtime/fanout.py: each partition read
from its committed entries where it is led) and the operation returns the
awaitable of its result; the merge is the same (``merge_by_id``). Inside
a transaction (``may_block`` False) such a read is refused.

A partition key read on a node that follows the partition (a READONLY
connection's: ``Replication.route`` let it through) is a follower copy's
read: its log reads stop at the high watermark the leader sent, as every
log read does, and its counters (XLEN, XINFO STREAM, XREAD's ``$``) count
the committed entries only (``_follower_copy``, ``Stream.committed_counters``).

Every operation commits deferred appends first (``commit_deferred``): a read
sees everything acknowledged before it, and nothing that reads a stream
relies on a barrier of its caller's.

Entries come back as ``storage.streams.Entries`` (``count`` encoded entries
in ``chunks``, ready to follow an array header): ``read_after`` and forward
``range`` slice them out of the segment files' mappings, with no copy. A
front-end sends them at once or copies them before it waits for anything (a
log may be cut back meanwhile): front-ends recognise the type (the RESP
encoder does), so no handler marks a reply. ``wait_for_entries``, whose
result reaches its caller across awaits, reads copies.

Must not know: sockets, protocols, reply shapes, error texts.
"""

from __future__ import annotations

import hashlib
from typing import Any, Sequence

import trio

from cluster.broker.budget import ReadBudget
from cluster.errors import TryAgain
from cluster.peer.messages import (READ_AFTER, READ_AFTER_LAST, READ_LENGTH, READ_RANGE, READ_REVRANGE, PartRead,
                                   ReadPart)
from cluster.runtime.fanout import merge_by_id, read_part
from cluster.runtime.replication import AcksFailed
from cluster.topics import (
    REPLICATION_FACTOR_FIXED,
    TOPIC_DELETE_NEEDS_TOPIC,
    TOPIC_NEEDS_TOPIC,
    UNKNOWN_TOPIC,
    TopicError,
    partition_key,
)
from storage.entry_codec import split_entries
from storage.streams.groups import groups_of
from storage.streams.ids import MAX_ID, MIN_ID, StreamId
from storage.streams.stream import EMPTY, Entries

# A read position other than an ID (``ReadPlan.after``).
AFTER_LAST = "$"  # after the stream's last ID when the read starts (XREAD's ``$``)
LAST_ENTRY = "+"  # the stream's last entry (XREAD's ``+``)

HASH_MASK = (1 << 63) - 1  # ``scan_keys``'s order: a 63-bit hash of the key
# A RENAME waiting for the replicas (``ReadOps._rename_when_replicated``)
# checks again after each wait; writes that keep overtaking it end it after
# this many.
RENAME_WAITS_MAX = 20


class ReadPlan:
    """One read after IDs (XREAD), whoever parsed it: ``keys``; for each,
    ``after``: an ID ``(ms, seq)``, ``AFTER_LAST`` or ``LAST_ENTRY``;
    ``count``: at most this many entries per key (0: no limit);
    ``block_ms``: how long ``wait_for_entries`` waits for entries when there
    are none (None: it does not; 0: no limit); ``max_count`` /
    ``max_size``: caps on the whole reply over the keys in order (Redis
    8.10's MAXCOUNT / MAXSIZE: ``cluster.broker.budget``; 0: none).

    ``one_partition``: the plan of a front-end's fast parser (one key): it
    is taken only when its key names one existing partition; for anything
    else ``read_after`` returns None having done nothing, and the front-end
    takes its general path, which gives every error."""

    __slots__ = ("keys", "after", "count", "block_ms", "one_partition", "max_count", "max_size")

    def __init__(self, keys: Sequence[bytes], after: Sequence[Any], count: int = 0,
                 block_ms: int | None = None, one_partition: bool = False, max_count: int = 0,
                 max_size: int = 0) -> None:
        self.keys = keys
        self.after = after
        self.count = count
        self.block_ms = block_ms
        self.one_partition = one_partition
        self.max_count = max_count
        self.max_size = max_size


class StreamInfo:
    """What a stream (one partition) reports about itself (``stream_info``):
    Redis's stream state (``radix_tree_keys``: its logical nodes holding a
    live entry, ``Stream.node_count``). The partition log's own state
    (offsets, segments, bytes) is TOPIC DESCRIBE's (``describe_topic``)."""

    __slots__ = ("length", "radix_tree_keys", "last_id", "max_deleted_entry_id", "entries_added",
                 "recorded_first_entry_id", "groups", "first_entry", "last_entry", "entries",
                 "idmp")  # idmp: cluster.broker.producers.IdempotenceInfo

    def __init__(self, **fields: Any) -> None:
        for name in self.__slots__:
            setattr(self, name, fields.get(name))


def _stream_keys(topics: Any, topic: bytes) -> set[bytes]:
    """Every key a reader may block on for ``topic``: its name and its
    partitions' keys (``t#0`` of a one-partition topic too)."""
    return {topic, *(partition_key(topic, n) for n in range(topics.partitions_of(topic)))}


def _key_hash(key: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") & HASH_MASK


def _position(stream: Any, after: Any, count: int, committed: bool = False) -> tuple[Any, int]:
    """``(read after this ID, at most this many)`` for ``after`` on
    ``stream`` (None: no such stream); ``AFTER_LAST`` and ``LAST_ENTRY``
    resolved now (``committed``: from the committed entries' last ID, a
    follower copy's)."""
    if after is AFTER_LAST or after is LAST_ENTRY:
        if stream is None:
            return MIN_ID, count
        last = stream.committed_counters()[1] if committed else stream.last_id
        if after is LAST_ENTRY:
            top = stream.last_live_id()  # (log reads stop at the high watermark)
            if top is not None:
                return (top.decr() if top != MIN_ID else MIN_ID), 1
        return last, count
    return after, count


class ReadOps:
    """The reads and the keyspace of a ``Session`` (see the module docstring):
    its ``broker``, ``may_block`` and ``commit_deferred`` are Session's."""

    __slots__ = ()

    broker: Any  # (Session's)
    may_block: bool

    # -- partitions -----------------------------------------------------------

    def _partitions(self, key: bytes) -> list[tuple[bytes, Any]]:
        """``(partition key, stream)`` of every partition of multi-partition
        topic ``key``; in a cluster, refused unless this node leads them all."""
        broker = self.broker
        replication = broker.replication
        if replication is not None:
            refusal = replication.fan_out_refusal(key)
            if refusal is not None:
                raise refusal
        topics = broker.topics
        return [(partition_key(key, n), stream) for n, stream in enumerate(topics.streams_of(key))]

    def _across(self, key: bytes) -> Any:
        """In a cluster, the node's ``FanOut`` when other nodes lead some
        partitions of multi-partition topic ``key`` (None: read here).
        Refused inside a transaction (it would wait for peers)."""
        replication = self.broker.replication
        if replication is None:
            return None
        fanout = replication.fanout
        if not fanout.led_elsewhere(key):
            return None
        if not self.may_block:
            raise fanout.in_transaction(key)
        return fanout

    # -- lengths and ranges ---------------------------------------------------

    def length(self, key: bytes) -> Any:
        """XLEN: live entries of a partition; of a topic, the sum over its
        partitions; 0 when the key does not exist. In a cluster, for a topic
        with partitions led elsewhere, the awaitable of the sum of every
        partition's committed entries."""
        self.commit_deferred()
        topics = self.broker.topics
        if topics.is_multi(key):
            fanout = self._across(key)
            if fanout is not None:
                return self._length_across(fanout, key)
            return sum(stream.length for _, stream in self._partitions(key))
        stream = topics.get(key)
        if stream is None:
            return 0
        return stream.committed_counters()[0] if self._follower_copy(key) else stream.length

    def _follower_copy(self, key: bytes) -> bool:
        """Whether ``key`` (one partition) is read from this node's follower
        copy (a READONLY client's read: ``Replication.route``), whose
        counters show its committed entries only, as its log reads do; a
        leader's count the entries above its high watermark too."""
        replication = self.broker.replication
        return replication is not None and not replication.leads_key(key)

    async def _length_across(self, fanout: Any, key: bytes) -> int:
        found = await fanout.read(key, ReadPart(b"", 0, READ_LENGTH), self.client_id)
        return sum(part.length for part in found)

    def range(self, key: bytes, start: StreamId, end: StreamId, count: int | None = None,
              rev: bool = False, past_hw: bool = False) -> Any:
        """XRANGE / XREVRANGE: entries with ``start <= ID <= end``, oldest
        first (newest first when ``rev``), at most ``count`` (None: all);
        None when the key does not exist. A topic's partitions are merged
        by ID, equal IDs in partition order, ``count`` over the merge. In a
        cluster, for a topic with partitions led elsewhere and a range that
        can hold entries, the awaitable of the merge. ``past_hw``: a
        partition's entries up to its log's end, the high watermark's wait
        skipped (a new leader's entries beyond it are committed once it
        moves: a Kafka coordinator loading its group's offsets); oldest
        first, one partition only."""
        self.commit_deferred()
        topics = self.broker.topics
        if past_hw:
            assert not rev and not topics.is_multi(key)
            stream = topics.get(key)
            return None if stream is None else stream.range(start, end, count, past_hw=True)
        if topics.is_multi(key):
            fanout = self._across(key)
            if fanout is not None and start <= end and count != 0:
                return self._range_across(fanout, key, start, end, count, rev)
            if start > end or count == 0:
                return EMPTY
            part = ReadPart(b"", 0, READ_REVRANGE if rev else READ_RANGE, start, end, count or 0)
            found = merge_by_id([read_part(stream, part) for _, stream in self._partitions(key)], count, rev)
        else:
            stream = topics.get(key)
            if stream is None:
                return None
            found = stream.range(start, end, count, rev=rev, view=True)
        if found.count:
            topics.note_entries_out(found.count)
        return found

    async def _range_across(self, fanout: Any, key: bytes, start: StreamId, end: StreamId, count: int | None,
                            rev: bool) -> Entries:
        """Each partition contributes at most ``count`` entries, then the merge."""
        part = ReadPart(b"", 0, READ_REVRANGE if rev else READ_RANGE, start, end, count or 0)
        found = merge_by_id(await fanout.read(key, part, self.client_id), count, rev)
        if found.count:
            self.broker.topics.note_entries_out(found.count)
        return found

    # -- reads after an ID: THE executor ------------------------------------

    def read_after(self, plan: ReadPlan) -> list[tuple[bytes, Entries]] | None:
        """THE read after IDs (XREAD without waiting): for each key of
        ``plan`` with entries after its position, ``(key, entries)``, in the
        plan's order. A topic key of several partitions reads each
        partition from the same position (``AFTER_LAST``: each partition's
        own last ID) and answers under the partition keys; keys with no
        entries (or none at all) are left out. None for a ``one_partition``
        plan whose key is not one existing partition (nothing was done)."""
        self.commit_deferred()
        if plan.one_partition:  # (a consumer's poll: the hot path, inline)
            [key], [after] = plan.keys, plan.after  # (one key, one position: raises otherwise)
            assert not (plan.max_count or plan.max_size)
            topics = self.broker.topics
            stream = topics.read_target(key)
            if stream is None:
                return None
            entries = stream.read_after(after, plan.count or None, view=True)
            if not entries.count:
                return []
            topics.note_entries_out(entries.count)
            return [(key, entries)]
        assert len(plan.keys) == len(plan.after)
        if self._fans_out(plan):
            return self._read_across(plan)
        keys, positions = self._positions(plan)
        return self._read_positions(keys, positions, True, plan)

    def _fans_out(self, plan: ReadPlan) -> bool:
        """Whether a key of ``plan`` is a topic with partitions led elsewhere."""
        topics = self.broker.topics
        return any(topics.is_multi(key) and self._across(key) is not None for key in plan.keys)

    async def _read_across(self, plan: ReadPlan, state: dict | None = None) -> list[tuple[bytes, Entries]]:
        """``read_after`` of a plan with a topic key whose partitions other
        nodes lead: such keys are read from every partition's leader
        (committed entries), the others here, then served in the plan's
        order within its budget, as ``_read_positions`` serves them.

        ``state`` (a blocking read's, kept between its reads): each key's
        positions, resolved by the first read (``$``: each partition's last
        ID then; ``+``: after the last entry) and read after from then on.
        Without it ``$`` finds nothing (it does not wait)."""
        topics = self.broker.topics
        remote: dict[int, list[PartRead]] = {}
        for i, (key, after) in enumerate(zip(plan.keys, plan.after)):
            if not topics.is_multi(key):
                continue
            fanout = self._across(key)
            if fanout is None:
                continue
            starts = state.get(i) if state is not None else None
            if starts is not None:
                parts = fanout.parts(key, ReadPart(b"", 0, READ_AFTER, count=plan.count), starts)
            elif after is AFTER_LAST:
                if state is None:
                    continue  # (``$`` without waiting: nothing after the last ID)
                parts = fanout.parts(key, ReadPart(b"", 0, READ_AFTER_LAST, count=plan.count))
            elif after is LAST_ENTRY:
                parts = fanout.parts(key, ReadPart(b"", 0, READ_REVRANGE, MIN_ID, MAX_ID, 1))
            else:
                parts = fanout.parts(key, ReadPart(b"", 0, READ_AFTER, tuple(after), count=plan.count))
            found_parts = remote[i] = await fanout.read_parts(parts, self.client_id)
            if state is not None and starts is None:
                state[i] = [(found.ids[0] if found.ids else MIN_ID) if after is LAST_ENTRY else found.position
                            for found in found_parts]
        self.commit_deferred()  # (appends while it waited)
        found: list = []
        budget = ReadBudget(plan.max_count, plan.max_size)
        for i, (key, after) in enumerate(zip(plan.keys, plan.after)):
            if i in remote:
                for n, part_read in enumerate(remote[i]):
                    limit = budget.count_for(plan.count)
                    if limit < 0:
                        break
                    taken = part_read.entries[:limit] if limit else part_read.entries
                    self._take_into(found, partition_key(key, n), Entries(len(taken), list(taken)), budget)
            elif not (topics.is_multi(key) and self._across(key) is not None):
                local = state.get(("here", i)) if state is not None else None
                if local is None:
                    local = self._positions(ReadPlan([key], [after], plan.count))
                    if state is not None:
                        state[("here", i)] = local
                for each, (position, count) in zip(*local):
                    stream = topics.get(each)
                    if stream is not None:
                        self._read_into(found, each, stream, position, count, False, budget)
        return found

    async def _wait_across(self, plan: ReadPlan, state: dict, timeout_s: float | None) -> bool:
        """A blocked read across nodes waits for its keys (``state``:
        ``_read_across``'s): an entry on a partition led elsewhere (its
        leader's long poll, ``FanOut.wait_for_entries``), or a signal on a
        key read here (the topic keys too: so the client counts as blocked,
        within ``max-blocked-clients``, as any blocked reader). True when
        something woke it, False at the timeout."""
        woke: list[bool] = []
        failures: list[Exception] = []  # (raised as they are, not in an exception group)
        keys_here = [key for i in range(len(plan.keys)) if ("here", i) in state for key in state[("here", i)][0]]
        keys_here += [key for i, key in enumerate(plan.keys) if i in state]

        async with trio.open_nursery() as nursery:
            async def wake_on(wait: Any, *args: Any) -> None:
                try:
                    if not await wait(*args):
                        return
                    woke.append(True)
                except Exception as e:  # a leader unreachable (TryAgain), too many blocked clients ...
                    failures.append(e)
                nursery.cancel_scope.cancel()

            for i, key in enumerate(plan.keys):
                if i in state:
                    nursery.start_soon(wake_on, self.broker.replication.fanout.wait_for_entries, key, state[i],
                                       timeout_s)
            nursery.start_soon(wake_on, self.broker.keys.wait_for_keys, keys_here, timeout_s)
        if failures:
            raise failures[0]
        return bool(woke)

    async def _wait_for_entries_across(self, plan: ReadPlan, deadline: float | None) -> list:
        """``wait_for_entries`` of a plan with a topic key whose partitions
        other nodes lead (``_read_across``, ``_wait_across``)."""
        if plan.block_ms is None or not self.may_block:
            return await self._read_across(plan)
        state: dict = {}
        found = await self._read_across(plan, state)
        while not found:
            remaining_s = None if deadline is None else deadline - trio.current_time()
            if remaining_s is not None and remaining_s <= 0:
                return []
            if not await self._wait_across(plan, state, remaining_s):
                return []
            found = await self._read_across(plan, state)
        return found

    async def wait_for_entries(self, plan: ReadPlan) -> list[tuple[bytes, Entries]]:
        """``read_after``, and when it finds nothing and the plan says
        ``block_ms``, wait for appends to its keys and read again until
        something is found or the time is up ([]). Positions are resolved
        once, before the first read (``AFTER_LAST``: entries after the last
        ID then). Never waits when the session may not (``may_block``:
        inside a transaction). Raises TooManyBlockedError
        (``max-blocked-clients``); cancellation (the client left) ends the
        wait.

        The entries are copies, never views of log mappings: they reach the
        caller across awaits (this coroutine's, and a front-end's around a
        command that may block), and a log may be cut back meanwhile."""
        self.commit_deferred()
        deadline = None if plan.block_ms == 0 else trio.current_time() + (plan.block_ms or 0) / 1000
        if self._fans_out(plan):
            return await self._wait_for_entries_across(plan, deadline)
        keys, positions = self._positions(plan)
        found = self._read_positions(keys, positions, False, plan)
        if found or plan.block_ms is None or not self.may_block:
            return found
        wait_for_keys = self.broker.keys.wait_for_keys
        while True:
            if deadline is None:
                remaining_s = None
            else:
                remaining_s = deadline - trio.current_time()
                if remaining_s <= 0:
                    return []
            if not await wait_for_keys(keys, remaining_s):
                return []
            # Woken by a commit: what it wrote is in the log (entries
            # deferred since are another tick's, committed by their own).
            found = self._read_positions(keys, positions, False, plan)
            if found:
                return found

    def _positions(self, plan: ReadPlan) -> tuple[list[bytes], list[tuple[Any, int]]]:
        """The plan's keys with topic keys expanded to their partition keys,
        and each one's ``(after ID, count)``."""
        topics = self.broker.topics
        count = plan.count
        keys: list[bytes] = []
        positions: list[tuple[Any, int]] = []
        for key, after in zip(plan.keys, plan.after):
            if topics.is_multi(key):
                for pkey, stream in self._partitions(key):
                    keys.append(pkey)
                    positions.append(_position(stream, after, count))
            else:
                keys.append(key)
                stream = topics.get(key) if after is AFTER_LAST or after is LAST_ENTRY else None
                positions.append(_position(stream, after, count, stream is not None and self._follower_copy(key)))
        return keys, positions

    def _read_positions(self, keys: list[bytes], positions: list[tuple[Any, int]], view: bool,
                        plan: ReadPlan) -> list:
        topics = self.broker.topics
        found: list = []
        budget = ReadBudget(plan.max_count, plan.max_size)
        for key, (after, count) in zip(keys, positions):
            if topics.is_multi(key):  # got more partitions while the reader waited
                for pkey, stream in self._partitions(key):
                    self._read_into(found, pkey, stream, after, count, view, budget)
                continue
            stream = topics.get(key)
            if stream is not None:
                self._read_into(found, key, stream, after, count, view, budget)
        return found

    def _read_into(self, found: list, key: bytes, stream: Any, after: Any, count: int, view: bool,
                   budget: ReadBudget) -> None:
        """Append ``(key, entries after `after`)`` to ``found`` when there are
        any (``view``: as views of the log's mappings), within ``budget``."""
        if not stream.length:
            return
        limit = budget.count_for(count)
        if limit < 0:
            return
        self._take_into(found, key, stream.read_after(after, limit or None, view=view), budget)

    def _take_into(self, found: list, key: bytes, entries: Entries, budget: ReadBudget) -> None:
        """Append ``(key, entries)`` to ``found`` when there are any, as many
        as ``budget`` lets through (its COUNT already applied)."""
        if not entries.count:
            return
        if budget.sized:
            parts = split_entries(entries.chunks)
            taken = budget.take(key, [len(part) for part in parts])
            if not taken:
                return
            entries = Entries(taken, parts[:taken])
        else:
            budget.took(key, entries.count)
        self.broker.topics.note_entries_out(entries.count)
        found.append((key, entries))

    # -- a stream's description ---------------------------------------------

    def stream_info(self, key: bytes, full: bool = False, count: int = 10) -> StreamInfo | None:
        """XINFO STREAM's data for one partition (None: no such key). With
        ``full``, its first ``count`` entries (0: all) instead of the first
        and last; ``groups`` is how many consumer groups it has."""
        self.commit_deferred()
        topics = self.broker.topics
        stream = topics.get(key)
        if stream is None:
            return None
        node_entries = getattr(self.broker.config, "stream_node_max_entries", None)
        if self._follower_copy(key):
            length, last_id, entries_added = stream.committed_counters()
        else:
            length, last_id, entries_added = stream.length, stream.last_id, stream.entries_added
        info = StreamInfo(
            length=length,
            radix_tree_keys=stream.node_count(100 if node_entries is None else int(node_entries)),
            last_id=last_id,
            max_deleted_entry_id=stream.max_deleted_entry_id,
            entries_added=entries_added,
            recorded_first_entry_id=stream.first_entry_id(),
            groups=len(groups_of(stream).groups),
            idmp=self.idempotence_of(stream),
        )
        if full:
            info.entries = stream.range(MIN_ID, MAX_ID, count or None, view=True)
        else:
            info.first_entry = stream.first_entry()
            info.last_entry = stream.last_entry()
        return info

    # -- the keyspace ---------------------------------------------------------

    def count_existing(self, keys: Sequence[bytes]) -> int:
        """EXISTS: how many of ``keys`` name an existing topic or partition
        (a key named twice counts twice)."""
        self.commit_deferred()
        exists = self.broker.topics.exists
        return sum(1 for key in keys if exists(key))

    def delete_keys(self, keys: Sequence[bytes]) -> int:
        """DEL / UNLINK: delete each key's whole topic (a partition key
        deletes its topic) with its files; how many were deleted."""
        self.commit_deferred()
        broker = self.broker
        topics = broker.topics
        deleted = 0
        for key in keys:
            doomed = [(k, None) for _, k in self._members_streams(topics.topic_of(key))] if topics.exists(key) else []
            if topics.delete(key):
                deleted += 1
                broker.keys.signal(key)
                self._rename_memberships(doomed)  # (its groups' members streams: cluster/broker/topic_groups.py)
        return deleted

    def key_names(self) -> list[bytes]:
        """KEYS: every topic name, sorted (in a cluster: those this node leads)."""
        self.commit_deferred()
        return sorted(self.broker.topics.keys())

    def scan_keys(self, cursor: int, count: int) -> tuple[int, list[bytes]]:
        """SCAN's walk: ``(next cursor, keys)``, the next ``count`` keys in
        the order of a 63-bit hash (BLAKE2b) of their names from ``cursor``
        on; the cursor is 1 + the hash the next call resumes at (0: start,
        and done). A key present for the whole walk is returned exactly once,
        whatever is added or deleted between calls (keys with equal hashes
        come together, so a call never splits them)."""
        assert count > 0
        self.commit_deferred()
        if cursor > HASH_MASK + 1:
            return 0, []
        resume_hash = cursor - 1 if cursor else 0
        ordered = sorted((_key_hash(k), k) for k in self.broker.topics.keys())
        examined = [(h, k) for h, k in ordered if h >= resume_hash]
        batch = examined[:count]
        rest = examined[count:]
        while rest and batch and rest[0][0] == batch[-1][0]:
            batch.append(rest.pop(0))
        return (rest[0][0] + 1 if rest else 0), [k for _, k in batch]

    def key_count(self) -> int:
        """DBSIZE: how many topics (in a cluster: those this node leads)."""
        self.commit_deferred()
        return self.broker.topics.key_count()

    def flush_all(self) -> None:
        """FLUSHALL: delete every topic and its files."""
        self.delete_keys(list(self.broker.topics.keys()))

    def rename(self, src: bytes, dst: bytes, nx: bool = False) -> Any:
        """RENAME / RENAMENX: None when ``src`` does not exist; False when
        nothing is to be done (the same stream, or ``nx`` and ``dst``
        exists); True once the whole topic of ``src`` (every partition, its
        groups and config) is ``dst``, a topic ``dst`` there was deleted
        (``TopicRegistry.rename``: atomic on disk). Readers blocked on
        either name, and WATCHers, are woken. Refused: a partition of a
        topic of several, a name ending with ``#<n>`` (TopicError); in a
        cluster, a topic of several partitions whose partitions and the new
        name's would not be led here alike (``Replication.rename``).

        In a cluster, writes to ``src`` that the in-sync replicas do not
        hold yet (acks=all entries, group changes) are replicated first:
        then the awaitable that waits for them and renames (TryAgain when
        the session may not wait, inside a transaction, or the replicas
        cannot acknowledge them; nothing renamed). The receipt of a rename
        waits until the cluster's metadata has it (``Replication.rename``).
        """
        self.commit_deferred()
        target = self._rename_target(src, dst, nx)
        if target.__class__ is not tuple:
            return target
        topic, dst = target
        replication = self.broker.replication
        if replication is not None and replication.unreplicated(topic):
            if not self.may_block:
                raise TryAgain(f"RENAME of '{topic.decode('utf-8', 'replace')}' waits for writes the in-sync "
                               "replicas do not have yet; outside a transaction it waits for them")
            return self._rename_when_replicated(src, dst, nx)
        self._rename_now(topic, dst)
        return True

    def _rename_target(self, src: bytes, dst: bytes, nx: bool) -> Any:
        """``rename``'s answer when nothing is renamed (None, False), else
        ``(topic, new name)``."""
        topics = self.broker.topics
        if not topics.exists(src):
            return None
        if src == dst or (topics.exists(dst) and topics.topic_of(dst) == topics.topic_of(src)):
            return False  # (``t`` and ``t#0`` of a one-partition topic are one stream)
        topic, dst = topics.rename_target(src, dst)
        if nx and topics.exists(dst):
            return False
        return topic, dst

    async def _rename_when_replicated(self, src: bytes, dst: bytes, nx: bool) -> bool | None:
        replication = self.broker.replication
        for _ in range(RENAME_WAITS_MAX):
            self.commit_deferred()  # (other clients' appends meanwhile)
            target = self._rename_target(src, dst, nx)
            if target.__class__ is not tuple:
                return target  # (changed meanwhile)
            topic, dst = target
            pending = replication.unreplicated(topic)
            if not pending:
                self._rename_now(topic, dst)
                return True
            try:
                await replication.wait_acks(self, pending)
            except AcksFailed as e:
                raise TryAgain(f"RENAME of '{topic.decode('utf-8', 'replace')}' waits for in-sync replicas "
                               f"that cannot acknowledge its writes now ({e}); nothing was renamed") from None
        raise TryAgain(f"RENAME of '{src.decode('utf-8', 'replace')}' is overtaken by writes the in-sync "
                       "replicas have not acknowledged yet; nothing was renamed")

    def _rename_now(self, topic: bytes, dst: bytes) -> None:
        broker = self.broker
        topics = broker.topics
        woken = _stream_keys(topics, topic) | _stream_keys(topics, dst)
        memberships = self._memberships_to_rename(topic, dst)  # (cluster/broker/topic_groups.py)
        if broker.replication is not None:
            broker.replication.rename(self, topic, dst)
        else:
            topics.rename(topic, dst)
        self._rename_memberships(memberships)
        woken |= _stream_keys(topics, dst)
        signal = broker.keys.signal
        for key in woken:
            signal(key)

    # -- topic administration -------------------------------------------------

    def create_topic(self, topic: bytes, partitions: int | None = None,
                     pairs: Sequence[tuple[bytes, bytes]] = (), replication_factors: Sequence[int] = ()) -> None:
        """TOPIC CREATE: ``partitions`` (None: ``default-partitions``), config
        overrides ``pairs``. Each of ``replication_factors`` (asked for) must
        be the one every partition has (replica sets belong to hash-slot
        ranges, docs/replication.md), else TopicError
        REPLICATION_FACTOR_FIXED; TopicError for a bad name or config, or an
        existing topic."""
        self.commit_deferred()
        broker = self.broker
        replication = broker.replication
        actual = replication.manager.placement.replication_factor if replication is not None else 1
        for wanted in replication_factors:
            if wanted != actual:
                raise TopicError(REPLICATION_FACTOR_FIXED, wanted=wanted, actual=actual,
                                 cluster=replication is not None)
        if partitions is None:
            partitions = int(getattr(broker.config, "default_partitions", 1) or 1)
        broker.topics.create_topic(topic, partitions, pairs)
        broker.keys.signal(topic)

    def describe_topic(self, topic: bytes) -> dict[str, Any]:
        """TOPIC DESCRIBE's data: ``partitions`` (per partition: partition,
        key, length, log-start-offset, log-end-offset, segments, bytes,
        last-generated-id, producers, and in a cluster ``replication``:
        where it lives, leader, replicas ...), ``config`` (name ->
        (effective value, overridden)) and in a cluster
        ``replication-factor``. In a cluster it covers the whole cluster on
        any node (``Replication.describe_topic``: the committed metadata;
        the figures of a partition this node holds no copy of are None;
        ``groups-here`` False inside a transaction when the groups would be
        asked of other nodes).
        TopicError for a partition key or an unknown topic."""
        self.commit_deferred()
        self._refuse_partition_key(topic, "DESCRIBE")
        replication = self.broker.replication
        if replication is None:
            return self.broker.topics.describe(topic)
        described = replication.describe_topic(topic)
        if described["groups-here"] and not self.may_block and replication.fanout.led_elsewhere(topic):
            described["groups-here"] = False  # (a transaction cannot ask other nodes for them)
        return described

    def topic_names(self) -> list[bytes]:
        """TOPIC LIST: every topic name, sorted; in a cluster every topic of
        the cluster, the same on every node (``Replication.topic_names``)."""
        self.commit_deferred()
        replication = self.broker.replication
        if replication is not None:
            return replication.topic_names()
        return sorted(self.broker.topics.keys())

    def alter_topic_partitions(self, topic: bytes, partitions: int) -> None:
        """TOPIC ALTER ... PARTITIONS: grow the topic (never shrinks)."""
        self.commit_deferred()
        self._refuse_partition_key(topic, "ALTER")
        self.broker.topics.alter_partitions(topic, partitions)
        self.broker.keys.signal(topic)

    def alter_topic_config(self, topic: bytes, pairs: Sequence[tuple[bytes, bytes]]) -> None:
        """TOPIC ALTER ... CONFIG: set (or with ``default``, drop) overrides."""
        self.commit_deferred()
        self._refuse_partition_key(topic, "ALTER")
        self.broker.topics.alter_config(topic, pairs)
        self.broker.keys.signal(topic)

    def delete_topic(self, topic: bytes) -> None:
        """TOPIC DELETE: the topic with its partitions and groups. TopicError
        for a partition key (partitions are not deleted one by one) or an
        unknown topic."""
        self.commit_deferred()
        broker = self.broker
        topics = broker.topics
        if b"#" in topic and topics.topic_of(topic) != topic:
            raise TopicError(TOPIC_DELETE_NEEDS_TOPIC, key=topic)
        keys = topics.expand(topic) if topics.exists(topic) else []
        doomed = [(key, None) for _, key in self._members_streams(topic)]
        if not topics.delete(topic):
            raise TopicError(UNKNOWN_TOPIC, topic=topic)
        self._rename_memberships(doomed)  # (its groups' members streams: cluster/broker/topic_groups.py)
        for key in {topic, *keys}:
            broker.keys.signal(key)

    def require_topic(self, topic: bytes) -> None:
        """That ``topic`` names an existing topic (TOPIC GROUPS), else
        TopicError: TOPIC_NEEDS_TOPIC for a partition key, UNKNOWN_TOPIC."""
        self.commit_deferred()
        self._refuse_partition_key(topic, "GROUPS")
        if not self.broker.topics.exists(topic):
            raise TopicError(UNKNOWN_TOPIC, topic=topic)

    def _refuse_partition_key(self, key: bytes, command: str) -> None:
        """TopicError TOPIC_NEEDS_TOPIC when ``key`` is a partition key
        (``<topic>#<n>``): TOPIC ``command`` takes the topic's name."""
        if b"#" in key and self.broker.topics.topic_of(key) != key:
            raise TopicError(TOPIC_NEEDS_TOPIC, command=command, key=key)
