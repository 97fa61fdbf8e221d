"""Consumer groups of one partition: the in-memory model and its durable state.

Owns: ``ConsumerGroup`` (name, ``last_id`` = last-delivered-id, ``entries_read``,
the pending entries list, consumers, the dead-letter setting, the PEL's time
order that XREADGROUP CLAIM takes), ``Consumer``, ``PendingEntry`` (released
by XNACK: no owner, delivery time 0), ``PendingList`` (a PEL ordered by ID), and ``GroupStore``:
every group of one partition, persisted in that partition's directory as a
journal of mutations compacted by snapshots. Also Redis 8's rules for a
group's ``entries_read`` and lag (``t_stream.c::streamEstimateDistanceFromFirstEverEntry``,
``streamReplyWithCGLag``) as pure functions of a stream's counters.

Must not know: sockets, trio, RESP, command syntax, the stream's entries, any
client's error texts. Callers (the XGROUP/XREADGROUP/XACK ... handlers) check
Redis's errors first and then call one mutation per command; a mutation never
fails half-way. What a mutation refuses is a ``GroupError`` with a code (the
constants below); nothing is written then.

Stream IDs are plain ``(ms, seq)`` tuples of unsigned 64-bit ints, as in the
log API. ``entries_read`` is an int, or ``None`` when unknown (Redis's
``SCG_INVALID_ENTRIES_READ``; ``-1`` on disk).

On-disk format (all integers little-endian)
===========================================

Two files in the partition directory, created on the first mutation:

``groups.snapshot``  the whole state at one point, written ``groups.snapshot.tmp``
                     + fsync + rename + directory fsync.
``groups.journal``   mutations since that snapshot, appended with one ``write``
                     each.

Both start with a 24-byte header::

    magic      8 bytes   b"PGSNAP01" / b"PGJRNL01"
    generation u64       snapshot generation (journal: the snapshot it follows)
    reserved   u32       0
    crc        u32       CRC32C of the 20 bytes before it

and continue with records::

    length     u32       payload length
    crc        u32       CRC32C of payload
    payload    op u8, then the op's fields

Fields: ``str`` = u32 length + bytes; ``id`` = u64 ms + u64 seq; ``i64`` for
``entries_read`` (-1 unknown) and times; ``u32`` counts. The ops and their
fields are the ``_OP_*`` constants below (``_encode_*`` functions); delivery
counts are u32 in the older ops and u64 in the ``*64`` ones, written when a
count needs it (they never pass LLONG_MAX: ``count_after``).

A snapshot holds ``CREATE`` (with the dead-letter setting), ``SNAP_CONSUMER``,
``SNAP_PENDING`` and ``SNAP_NACKED`` (released entries, in their claim order)
records and ends with an ``END`` record carrying the
record count; a snapshot without it is corrupt (it was renamed only after
fsync, so that means the disk lost data) and ``open`` raises.

Recovery (``GroupStore.open``): load the snapshot (generation G, or an empty
state with G = 0 when there is none), then replay the journal if its header
says G. A journal of an older generation is what a crash between the snapshot
rename and the journal restart leaves behind: everything in it is already in
the snapshot, so it is replaced.

A damaged journal (``storage.salvage``): a record that is short or fails its
CRC is skipped and the intact records after it are found again and replayed;
so is a record that does not fit the state (applied as far as it fits). From
the first such record on, replay is *lenient* (``_apply(lenient=True)``):
the skipped record's effect is unknown, so a later record naming a group
whose CREATE was lost re-creates it (last-delivered-id 0-0, so entries may
be delivered again but none is skipped; entries-read unknown; no
dead-lettering), and removals keep to IDs that are pending. Then the file is
kept aside (``groups.journal.damaged-<time>``), the state as replayed is
written as the next snapshot with a fresh journal, and one WARNING says
which bytes were skipped and what was re-created. A torn tail (nothing
intact after it: a write cut by a crash) is the same repair, logged as
``torn or corrupt tail: truncated N bytes at byte B after K records``.

Compaction: when the journal grows past ``max(compact_min_bytes,
2 * last snapshot size)`` the store writes a snapshot of generation G + 1,
then a fresh journal of generation G + 1 (tmp + fsync + rename). The state
(and so a snapshot) is bounded by pending entries and consumers, never by the
number of entries ever delivered.

Durability: every mutation reaches the kernel before the call returns
(survives kill -9). ``flush()`` or the group-commit trio ``begin_flush()`` /
``ticket.run()`` / ``end_flush(ticket)`` make it survive power loss, like
``PartitionLog``. After a failed fsync of the journal its pages cannot be
trusted (the kernel may have dropped them and reports that once), but the
state in memory can: the next flush writes it whole as a compaction (a new
snapshot and journal, each fsynced) instead of syncing the journal again.

Descriptors: the journal's is the partition's ``storage.handles.FileCache``
one (``groups_of`` passes the partition log's cache; a store opened alone
has a small cache of its own), taken from the cache at each append, sync or
read (a hit costs a dict lookup: hot journals stay open) and closed by the
cache's LRU like a segment file, so a data dir with groups on any number of
partitions holds at most ``max-open-files`` of them. A flush ticket pins it
from ``begin_flush`` to ``end_flush``: the cache cannot close it, nor its
number name another file, while another thread syncs it. A journal replaced
by a compaction is taken out of the cache first (a pinned descriptor of the
old file is closed at its unpin). Snapshot and journal rewrites open their
temporary file and the directory for a moment, outside the cache.

Concurrency: not thread-safe. Call everything from one thread, except
``GroupFlushTicket.run()``, which only fsyncs the pinned descriptor.
"""

from __future__ import annotations

import bisect
import heapq
import logging
import os
import struct
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import chain, repeat
from pathlib import Path
from typing import Iterable, Iterator, Protocol, Sequence

from crc32c import crc32c

from storage import salvage
from storage.errors import Refusal, raise_storage_error
from storage.handles import FileCache

try:  # a batch's IDs packed and filtered in C (storage/streams/_ids.c); optional, as the other extensions
    from storage.streams import _ids as _c_ids
except ImportError:  # pragma: no cover - the extension is built by the install
    _c_ids = None

StreamIdT = tuple[int, int]

ZERO_ID: StreamIdT = (0, 0)
MAX_ID: StreamIdT = (2**64 - 1, 2**64 - 1)

SNAPSHOT_NAME = "groups.snapshot"
JOURNAL_NAME = "groups.journal"
_TMP_SUFFIX = ".tmp"

_SNAP_MAGIC = b"PGSNAP01"
_JRNL_MAGIC = b"PGJRNL01"
_HEADER = struct.Struct("<8sQII")  # magic, generation, reserved, crc
_HEADER_BYTES = _HEADER.size  # 24
_RECORD_BYTES_MAX = 64 * 1024 * 1024
_SNAP_PENDING_CHUNK = 4096  # pending entries per SNAP_PENDING record

_U8 = struct.Struct("<B")
_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
_ID = struct.Struct("<QQ")
# A deliver record's fixed fields after its names, in one pack: now_ms,
# noack, last_id, entries_read (the same bytes as _I64, _U8, _ID, _er).
_DELIVER_FIXED = struct.Struct("<qBQQq")
_CLAIM = struct.Struct("<QQqI")  # id ms, id seq, delivery_time_ms, delivery_count
_CLAIM64 = struct.Struct("<QQqQ")  # the same with a u64 delivery_count (XNACK FATAL's, and past it)
_NACKED = struct.Struct("<QQQ")  # id ms, id seq, delivery_count (released: no owner, delivery time 0)

# Journal ops.
_OP_CREATE = 1  # group, last_id, entries_read, max_deliveries, dead_letter_key (-1 len = none)
_OP_DESTROY = 2  # group
_OP_SETID = 3  # group, last_id, entries_read
_OP_CREATECONSUMER = 4  # group, consumer, now_ms
_OP_DELCONSUMER = 5  # group, consumer
_OP_TOUCH = 6  # group, consumer, now_ms
_OP_DELIVER = 7  # group, consumer, now_ms, noack u8, last_id, entries_read, n, ids
_DELIVER_OP = bytes((_OP_DELIVER,))
_OP_REDELIVER = 8  # group, consumer, now_ms, n, ids
_OP_ACK = 9  # group, n, ids
_OP_CLAIM = 10  # group, consumer, now_ms, has_last u8, last_id, n, (id, time, count)*
_OP_DROP = 11  # group, n, ids   (entries gone from the stream: XCLAIM/XAUTOCLAIM cleanup)
_OP_DEADLETTER = 12  # group, n, ids
_OP_CONFIG = 13  # group, max_deliveries, dead_letter_key
_OP_NACK = 14  # group, n, (id, count u64)*   (XNACK: released, in this order, to the NACK zone's tail)
_OP_CLAIM64 = 15  # as CLAIM, counts u64 (written only when a count does not fit a u32)
_OP_SNAP_CONSUMER = 20  # group, consumer, seen_time_ms, active_time_ms
_OP_SNAP_PENDING = 21  # group, consumer, n, (id, time, count)*
_OP_SNAP_GROUPSTAT = 22  # group, dead_lettered_total
_OP_SNAP_PENDING64 = 23  # as SNAP_PENDING, counts u64
_OP_SNAP_NACKED = 24  # group, n, (id, count u64)*   (the NACK zone, in its order)
_OP_END = 30  # record count before it
_JOURNAL_OPS = frozenset(range(_OP_CREATE, _OP_CLAIM64 + 1))
_U32_MAX = 0xFFFFFFFF
LLONG_MAX = 2**63 - 1  # XNACK FATAL's delivery count (Redis's LLONG_MAX); counts never pass it


def count_after(deliveries: int) -> int:
    """A delivery count after one more delivery: + 1, saturating at
    ``LLONG_MAX`` (a FATAL entry claimed again stays FATAL, and replies,
    which carry signed 64-bit integers, can show it)."""
    return deliveries + 1 if deliveries < LLONG_MAX else LLONG_MAX


class GroupStateError(Exception):
    """The group state on disk cannot be read (a corrupt snapshot)."""


# What a mutation refuses (``GroupError.code``, with the fields named); the
# texts clients see are the front-end's (server/failures.py).
GROUP_EXISTS = "group-exists"  # group: XGROUP CREATE of a group that exists
NO_GROUP = "no-group"  # group: a mutation of a group that does not exist
NOT_AFTER_LAST_ID = "not-after-last-id"  # group: delivered IDs must follow last-delivered-id
NOT_PENDING = "not-pending"  # group, consumer: redelivered IDs must be the consumer's pending ones
MAX_DELIVERIES_RANGE = "max-deliveries-range"  # max_deliveries: not 0 .. 2**32-1
DEAD_LETTER_NEEDS_KEY = "dead-letter-needs-key"  # max_deliveries > 0 without a dead-letter key
DEAD_LETTER_NEEDS_MAX = "dead-letter-needs-max"  # a dead-letter key with max_deliveries 0
MAX_DELIVERIES_MAX = 0xFFFFFFFF  # a u32 in the journal


class GroupError(Refusal, ValueError):
    """A group mutation refused (a ``ValueError``, as replay treats a record
    that does not fit); ``code`` is one of the constants above."""


def check_dead_letter(max_deliveries: int, dead_letter_key: bytes | None) -> None:
    """Raise ``GroupError`` unless ``max_deliveries`` (0: off) and
    ``dead_letter_key`` make a dead-letter setting the store can keep."""
    if not 0 <= max_deliveries <= MAX_DELIVERIES_MAX:
        raise GroupError(MAX_DELIVERIES_RANGE, max_deliveries=max_deliveries, maximum=MAX_DELIVERIES_MAX)
    if max_deliveries > 0 and dead_letter_key is None:
        raise GroupError(DEAD_LETTER_NEEDS_KEY)
    if max_deliveries == 0 and dead_letter_key is not None:
        raise GroupError(DEAD_LETTER_NEEDS_MAX)


# --------------------------------------------------------------------------
# In-memory model
# --------------------------------------------------------------------------


class PendingEntry:
    """One delivered, not yet acknowledged entry (Redis's ``streamNACK``).

    The same object sits in the group's PEL and in its consumer's PEL, and
    one object stands for every entry of one delivery (``deliver``): it is
    never changed in place (a claim, redelivery or XNACK of an entry puts a
    new one in both PELs), so a delivery of a hundred entries makes one
    object, not a hundred. ``consumer`` None: released by XNACK (Redis 8.8): no owner, so in the
    group's PEL only, with delivery time 0 (idle since forever: any claim
    takes it). ``tick``: when its delivery time last changed, in its group's
    order of such changes (the time order's tie-break, ``ConsumerGroup``;
    the entries of one delivery share it, and their IDs order them).
    """

    __slots__ = ("consumer", "delivery_time_ms", "delivery_count", "tick")

    def __init__(self, consumer: bytes | None, delivery_time_ms: int, delivery_count: int) -> None:
        self.consumer = consumer
        self.delivery_time_ms = delivery_time_ms
        self.delivery_count = delivery_count
        self.tick = 0

    def __repr__(self) -> str:
        return f"PendingEntry({self.consumer!r}, {self.delivery_time_ms}, {self.delivery_count})"

    def idle_ms(self, now_ms: int) -> int:
        """Idle time as XPENDING shows it: -1 when released by XNACK (no
        owner), else ms since delivery (a delivery at time 0, XCLAIM's
        ``TIME 0``, is idle since the epoch, as in Redis)."""
        return -1 if self.consumer is None else max(now_ms - self.delivery_time_ms, 0)


class PendingList:
    """A PEL: stream ID -> ``PendingEntry``, iterated in ID order.

    A dict for lookups plus a sorted list of IDs. Removal is lazy (the ID
    stays in the list until the next compaction of the list), so acking the
    oldest entries is O(1) amortised; appending an ID above every other is
    O(1); inserting in the middle (XCLAIM) is a bisect plus a list insert.

    Besides, whole deliveries kept as runs: a delivery of IDs above every
    other (XREADGROUP ``>``'s) is kept as its list of IDs and its one entry,
    outside the dict and the list, until something needs its IDs one at a
    time (a lookup, a partial ack, a claim, a listing: ``_spread`` puts the
    runs in the dict and the list first). An XACK of exactly a run's IDs (a
    consumer acks what it was given) takes the run out whole (``take_run``):
    nothing hashed or popped per ID, here or at its delivery.
    """

    __slots__ = ("_map", "_ids", "_runs", "_in_runs")

    def __init__(self) -> None:
        self._map: dict[StreamIdT, PendingEntry] = {}
        self._ids: list[StreamIdT] = []  # sorted; may hold IDs no longer in _map
        # first ID -> (the run's IDs, ascending; its entry); in ID order, all
        # above every ID in _ids (live or stale).
        self._runs: dict[StreamIdT, tuple[list[StreamIdT], PendingEntry]] = {}
        self._in_runs = 0  # IDs in _runs

    def __len__(self) -> int:
        return len(self._map) + self._in_runs

    def __contains__(self, sid: StreamIdT) -> bool:
        self._spread()
        return sid in self._map

    def __bool__(self) -> bool:
        return bool(self._map) or bool(self._runs)

    def _spread(self) -> None:
        """Put the runs' IDs in the dict and the list (they are above every
        ID of the list, in order)."""
        if self._runs:
            ids, m = self._ids, self._map
            for run, entry in self._runs.values():
                ids.extend(run)
                m.update(zip(run, repeat(entry)))
            self._runs = {}
            self._in_runs = 0

    def _top(self) -> StreamIdT | None:
        """The highest ID in the runs or the list (which may be stale)."""
        if self._runs:
            return next(reversed(self._runs.values()))[0][-1]
        return self._ids[-1] if self._ids else None

    def mapping(self) -> dict[StreamIdT, PendingEntry]:
        """Every pending ID's entry (read only: change it through the methods)."""
        self._spread()
        return self._map

    def get(self, sid: StreamIdT) -> PendingEntry | None:
        self._spread()
        return self._map.get(sid)

    def add(self, sid: StreamIdT, entry: PendingEntry) -> None:
        """Insert or replace ``sid``."""
        self._spread()
        ids = self._ids
        if sid not in self._map:
            if not ids or sid > ids[-1]:
                ids.append(sid)
            else:
                i = bisect.bisect_left(ids, sid)
                if i == len(ids) or ids[i] != sid:  # else: a stale copy is still there
                    ids.insert(i, sid)
        self._map[sid] = entry

    def add_run(self, sids: Sequence[StreamIdT], entry: PendingEntry) -> None:
        """``add(sid, entry)`` for each of ``sids`` (ascending tuples): one
        delivery. IDs above every other (new entries) are kept as a run."""
        if not sids:
            return
        top = self._top()
        if top is not None and sids[0] <= top:
            for sid in sids:
                self.add(sid, entry)
            return
        self._runs[sids[0]] = (list(sids), entry)
        self._in_runs += len(sids)

    def _run_of(self, sids: Iterable[StreamIdT]) -> tuple[list[StreamIdT], PendingEntry] | None:
        """The run whose IDs are exactly ``sids`` (a list of tuples): one
        dict lookup and one list comparison; None when there is none."""
        if sids.__class__ is list and sids and sids[0].__class__ is tuple:
            run = self._runs.get(sids[0])
            if run is not None and run[0] == sids:
                return run
        return None

    def take_run(self, sids: Sequence[StreamIdT]) -> PendingEntry | None:
        """When ``sids`` are exactly the IDs of a run (a delivery none of
        which was acked, claimed or looked up one at a time since): remove
        them, return their entry; else None, nothing changed."""
        run = self._run_of(sids)
        if run is None:
            return None
        del self._runs[sids[0]]
        self._in_runs -= len(sids)
        return run[1]

    def pending_of(self, sids: Iterable[StreamIdT]) -> list[StreamIdT]:
        """The IDs of ``sids`` that are pending, as tuples, in order, once
        each. A run's IDs exactly: the run's list. An ascending list (an
        XACK of what a consumer was given) has no duplicate: one C pass
        (``_ids.pending_ids``); else C loops."""
        run = self._run_of(sids)
        if run is not None:
            return run[0]
        self._spread()
        if _c_ids is not None and sids.__class__ is list:
            present = _c_ids.pending_ids(sids, self._map)
            if present is not None:
                return present
        return list(filter(self._map.__contains__, dict.fromkeys(map(tuple, sids))))

    def isdisjoint(self, sids: Sequence[StreamIdT]) -> bool:
        """No ID of ``sids`` (ascending) is pending."""
        top = self._top()
        if not sids or top is None or sids[0] > top:
            return True
        self._spread()
        return self._map.keys().isdisjoint(sids)

    def remove(self, sid: StreamIdT) -> PendingEntry | None:
        self._spread()
        entry = self._map.pop(sid, None)
        if entry is not None:
            self._maybe_compact()
        return entry

    def remove_many(self, sids: Iterable[StreamIdT]) -> list[PendingEntry | None]:
        """``[remove(sid) for sid in sids]`` with one compaction (XACK)."""
        self._spread()
        entries = list(map(self._map.pop, sids, repeat(None)))
        self._maybe_compact()
        return entries

    def clear(self) -> set[PendingEntry]:
        """Remove every entry; returns the distinct entry objects removed."""
        entries = set(self._map.values())
        entries.update(entry for _, entry in self._runs.values())
        self._map = {}
        self._ids = []
        self._runs = {}
        self._in_runs = 0
        return entries

    def _maybe_compact(self) -> None:
        ids = self._ids
        live = len(self._map)
        if len(ids) > 64 and len(ids) > 2 * live:
            self._ids = list(filter(self._map.__contains__, ids))
        elif live == 0:
            ids.clear()

    def first(self) -> StreamIdT | None:
        for sid in self.ids_from(ZERO_ID):
            return sid
        return None

    def last(self) -> StreamIdT | None:
        self._spread()
        ids, m = self._ids, self._map
        for i in range(len(ids) - 1, -1, -1):
            if ids[i] in m:
                return ids[i]
        return None

    def ids_from(self, start: StreamIdT, end: StreamIdT = MAX_ID) -> Iterator[StreamIdT]:
        """IDs in ``[start, end]`` in order. Do not mutate while iterating."""
        self._spread()
        ids, m = self._ids, self._map
        i = bisect.bisect_left(ids, start)
        n = len(ids)
        while i < n:
            sid = ids[i]
            if sid > end:
                return
            if sid in m:
                yield sid
            i += 1

    def range(
        self, start: StreamIdT = ZERO_ID, end: StreamIdT = MAX_ID, count: int | None = None
    ) -> list[tuple[StreamIdT, PendingEntry]]:
        """Up to ``count`` ``(id, entry)`` pairs with ``start <= id <= end``."""
        out: list[tuple[StreamIdT, PendingEntry]] = []
        if count is not None and count <= 0:
            return out
        m = self.mapping()
        for sid in self.ids_from(start, end):
            out.append((sid, m[sid]))
            if count is not None and len(out) >= count:
                break
        return out

    def items(self) -> list[tuple[StreamIdT, PendingEntry]]:
        return self.range()


class Consumer:
    """A consumer of a group: its name, when it was last seen, its own PEL."""

    __slots__ = ("name", "seen_time_ms", "active_time_ms", "pending")

    def __init__(self, name: bytes, seen_time_ms: int, active_time_ms: int = -1) -> None:
        self.name = name
        self.seen_time_ms = seen_time_ms  # last interaction (XREADGROUP, XCLAIM, XAUTOCLAIM)
        self.active_time_ms = active_time_ms  # last successful read/claim; -1 never
        self.pending = PendingList()

    def __repr__(self) -> str:
        return f"Consumer({self.name!r}, pending={len(self.pending)})"


class ConsumerGroup:
    """One consumer group of one partition (Redis's ``streamCG``).

    ``max_deliveries`` > 0 with a ``dead_letter_key`` turns on dead-lettering:
    an entry whose delivery count would exceed ``max_deliveries`` leaves the
    PEL and is appended to the dead-letter stream (done by the command layer,
    recorded here with ``GroupStore.dead_letter``).

    The PEL in time order (Redis 8.4's ``pel_time_head`` list: what XREADGROUP
    CLAIM takes first): by delivery time, then by when that time was set
    (``PendingEntry.tick``, given by ``retimed``); released entries (time 0,
    XNACK) come first, in the order they were released. Kept as a heap built
    at the first use (``idle_pending``) and fed by ``retimed`` from then on;
    entries acknowledged or retimed since leave stale items that are skipped.
    """

    __slots__ = (
        "name", "last_id", "entries_read", "pel", "consumers",
        "max_deliveries", "dead_letter_key", "dead_lettered_total", "_ticks", "_by_time",
    )

    def __init__(
        self,
        name: bytes,
        last_id: StreamIdT,
        entries_read: int | None,
        max_deliveries: int = 0,
        dead_letter_key: bytes | None = None,
    ) -> None:
        self.name = name
        self.last_id = last_id
        self.entries_read = entries_read
        self.pel = PendingList()
        self.consumers: dict[bytes, Consumer] = {}
        self.max_deliveries = max_deliveries
        self.dead_letter_key = dead_letter_key
        self.dead_lettered_total = 0
        self._ticks = 0
        self._by_time: list[tuple[int, int, StreamIdT]] | None = None

    def consumer(self, name: bytes) -> Consumer | None:
        return self.consumers.get(name)

    def nacked_count(self) -> int:
        """Pending entries with no owner (released by XNACK): Redis's ``nacked-count``."""
        return sum(1 for pe in self.pel.mapping().values() if pe.consumer is None)

    def retimed(self, sid: StreamIdT, pe: PendingEntry) -> None:
        """``pe`` (pending as ``sid``) is new or got a new delivery time: it
        goes after every entry of the same time in the time order."""
        self._ticks += 1
        pe.tick = self._ticks
        heap = self._by_time
        if heap is not None:
            heapq.heappush(heap, (pe.delivery_time_ms, pe.tick, sid))
            if len(heap) > 2 * len(self.pel) + 64:
                self._by_time = None  # mostly stale: rebuilt at the next use

    def retimed_run(self, sids: Sequence[StreamIdT], pe: PendingEntry) -> None:
        """``retimed`` for the entries ``sids`` (ascending) of one delivery,
        all pending as ``pe``: one tick, the IDs order them within it."""
        self._ticks += 1
        pe.tick = self._ticks
        heap = self._by_time
        if heap is not None:
            t, tick = pe.delivery_time_ms, pe.tick
            for sid in sids:
                heapq.heappush(heap, (t, tick, sid))
            if len(heap) > 2 * len(self.pel) + 64:
                self._by_time = None

    def _time_heap(self) -> list[tuple[int, int, StreamIdT]]:
        heap = self._by_time
        if heap is None:
            heap = [(pe.delivery_time_ms, pe.tick, sid) for sid, pe in self.pel.mapping().items()]
            heapq.heapify(heap)
            self._by_time = heap
        return heap

    def _time_head(self, heap: list) -> tuple[int, int, StreamIdT] | None:
        """The heap's first item that is not stale (stale ones are dropped)."""
        pel = self.pel.mapping()
        while heap:
            item = heap[0]
            pe = pel.get(item[2])
            if pe is not None and pe.tick == item[1]:
                return item
            heapq.heappop(heap)
        return None

    def oldest_delivery_ms(self) -> int | None:
        """The earliest delivery time of a pending entry (0: one was released); None when none is pending."""
        head = self._time_head(self._time_heap())
        return None if head is None else head[0]

    @contextmanager
    def idle_pending(self, now_ms: int, min_idle_ms: int) -> Iterator[Iterator[tuple[StreamIdT, PendingEntry]]]:
        """For a ``with`` block: an iterator of the ``(id, entry)`` pending at
        least ``min_idle_ms`` at ``now_ms``, in the time order (longest idle
        first). Nothing may change the group inside the block (collect, then
        change it)."""
        heap = self._time_heap()
        taken: list = []

        def walk() -> Iterator[tuple[StreamIdT, PendingEntry]]:
            while True:
                head = self._time_head(heap)
                if head is None or now_ms - head[0] < min_idle_ms:
                    return
                taken.append(heapq.heappop(heap))
                yield head[2], self.pel.get(head[2])

        try:
            yield walk()
        finally:
            for item in taken:
                heapq.heappush(heap, item)

    def sorted_consumers(self) -> list[Consumer]:
        """Consumers in Redis's order (the rax: bytewise by name)."""
        return [self.consumers[k] for k in sorted(self.consumers)]

    def __repr__(self) -> str:
        return f"ConsumerGroup({self.name!r}, last_id={self.last_id}, pending={len(self.pel)})"


# --------------------------------------------------------------------------
# Redis 8 entries_read / lag rules (7.4 and 8.0's fixes: redis #13338,
# #13473, #13958)
# --------------------------------------------------------------------------


class StreamCounters(Protocol):
    """What the lag rules need from a stream (Redis's ``stream`` struct fields)."""

    @property
    def length(self) -> int: ...
    @property
    def entries_added(self) -> int: ...
    @property
    def first_id(self) -> StreamIdT: ...  # (0, 0) when empty
    @property
    def last_id(self) -> StreamIdT: ...
    @property
    def max_deleted_entry_id(self) -> StreamIdT: ...


def range_has_tombstones(s: StreamCounters, start: StreamIdT | None, end: StreamIdT | None = None) -> bool:
    """Redis ``streamRangeHasTombstones``: may an XDEL hole lie in ``[start, end]``?
    (Since 7.4 a hole before the first entry counts too: it may still be
    after a group's last-delivered-id.)"""
    mdel = tuple(s.max_deleted_entry_id)
    if not s.length or mdel == ZERO_ID:
        return False
    lo = start if start is not None else ZERO_ID
    hi = end if end is not None else MAX_ID
    return lo <= mdel <= hi


def estimate_entries_read(s: StreamCounters, sid: StreamIdT) -> int | None:
    """Redis ``streamEstimateDistanceFromFirstEverEntry``: ``sid``'s logical read
    counter, or None when it cannot be known."""
    added = s.entries_added
    if not added:
        return 0
    last = tuple(s.last_id)
    if not s.length and sid <= last:
        return added
    if sid == last:
        return added
    if sid > last:
        return None
    first = tuple(s.first_id)
    mdel = tuple(s.max_deleted_entry_id)
    if mdel == ZERO_ID or mdel < first:
        if sid < first:
            return added - s.length
        if sid == first:
            return added - s.length + 1
    return None


def group_lag(s: StreamCounters, group: ConsumerGroup) -> int | None:
    """Redis ``streamReplyWithCGLag``: entries not yet delivered, or None."""
    if not s.entries_added or not s.length:
        return 0  # a new stream, or every entry deleted or trimmed
    first = tuple(s.first_id)
    if group.last_id < first and tuple(s.max_deleted_entry_id) < first:
        return s.length  # the group and every hole are before the first entry
    if group.entries_read is not None and not range_has_tombstones(s, group.last_id, None):
        return s.entries_added - group.entries_read
    entries_read = estimate_entries_read(s, group.last_id)
    if entries_read is None:
        return None
    return s.entries_added - entries_read


def entries_read_after(s: StreamCounters, last_id: StreamIdT, entries_read: int | None,
                       ids: Sequence[StreamIdT], behind_first: bool | None = None) -> int | None:
    """A group's ``entries_read`` after delivering ``ids`` (ascending, all
    after ``last_id``, its last-delivered-id before) with ``>``: Redis
    ``streamReplyWithRange``'s group branch for each. The counter counts on
    while it is valid, the group is not behind the first entry and no hole
    lies after its last-delivered-id; else it is estimated again.
    ``behind_first``: whether ``last_id`` is below the first entry, when the
    caller knows it without reading it (None: from ``s.first_id``); once an
    entry is delivered the group is not behind (a delivered entry is live)."""
    for i, sid in enumerate(ids):
        if entries_read is not None and not range_has_tombstones(s, last_id, None):
            if i or not (last_id < tuple(s.first_id) if behind_first is None else behind_first):
                return entries_read + len(ids) - i  # holds for every later ID too
        if s.entries_added:
            entries_read = estimate_entries_read(s, sid)
        last_id = sid
    return entries_read


# --------------------------------------------------------------------------
# Record encoding
# --------------------------------------------------------------------------


def _s(value: bytes) -> bytes:
    return _U32.pack(len(value)) + value


def _opt_s(value: bytes | None) -> bytes:
    return b"\xff\xff\xff\xff" if value is None else _s(value)


def _er(entries_read: int | None) -> bytes:
    return _I64.pack(-1 if entries_read is None else entries_read)


def _ids(ids: Sequence[StreamIdT]) -> bytes:
    """A record's ID list: a u32 count, then each ID's ms and seq as u64
    (one C call for a delivery's or an XACK's hundred, ``_ids.pack_ids``)."""
    if _c_ids is not None:
        return _c_ids.pack_ids(ids)
    n = len(ids)
    return _U32.pack(n) + struct.pack(f"<{2 * n}Q", *chain.from_iterable(ids))


def _claims(claims: Sequence[tuple[StreamIdT, int, int]], wide: bool = False) -> bytes:
    """``wide``: counts as u64 (the ``*64`` ops), else u32."""
    fmt = _CLAIM64 if wide else _CLAIM
    return _U32.pack(len(claims)) + b"".join(
        [fmt.pack(sid[0], sid[1], t, c) for sid, t, c in claims]
    )


def _wide(counts: Iterable[int]) -> bool:
    return any(c > _U32_MAX for c in counts)


def _nacked(entries: Sequence[tuple[StreamIdT, int]]) -> bytes:
    return _U32.pack(len(entries)) + b"".join([_NACKED.pack(sid[0], sid[1], c) for sid, c in entries])


class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes | memoryview) -> None:
        self.buf = buf
        self.pos = 0

    def _take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.buf):
            raise ValueError("record too short")
        out = bytes(self.buf[self.pos:end])
        self.pos = end
        return out

    def u8(self) -> int:
        return self._take(1)[0]

    def u32(self) -> int:
        return _U32.unpack(self._take(4))[0]

    def i64(self) -> int:
        return _I64.unpack(self._take(8))[0]

    def s(self) -> bytes:
        return self._take(self.u32())

    def opt_s(self) -> bytes | None:
        n = self.u32()
        return None if n == 0xFFFFFFFF else self._take(n)

    def er(self) -> int | None:
        v = self.i64()
        if v < -1:
            raise ValueError("bad entries_read")
        return None if v == -1 else v

    def sid(self) -> StreamIdT:
        return _ID.unpack(self._take(16))

    def ids(self) -> list[StreamIdT]:
        n = self.u32()
        raw = self._take(16 * n)
        return [tuple(x) for x in _ID.iter_unpack(raw)]  # type: ignore[misc]

    def claims(self, wide: bool = False) -> list[tuple[StreamIdT, int, int]]:
        fmt = _CLAIM64 if wide else _CLAIM
        n = self.u32()
        raw = self._take(fmt.size * n)
        return [((ms, seq), t, c) for ms, seq, t, c in fmt.iter_unpack(raw)]

    def nacked(self) -> list[tuple[StreamIdT, int]]:
        n = self.u32()
        raw = self._take(_NACKED.size * n)
        return [((ms, seq), c) for ms, seq, c in _NACKED.iter_unpack(raw)]

    def done(self) -> None:
        if self.pos != len(self.buf):
            raise ValueError("trailing bytes in record")


_frame = salvage.frame


def _header(magic: bytes, generation: int) -> bytes:
    head = struct.pack("<8sQI", magic, generation, 0)
    return head + _U32.pack(crc32c(head))


def _parse_header(data: bytes, magic: bytes) -> int | None:
    """The generation in a valid header, else None."""
    if len(data) < _HEADER_BYTES:
        return None
    got_magic, generation, _reserved, crc = _HEADER.unpack_from(data, 0)
    if got_magic != magic or crc32c(data[: _HEADER_BYTES - 4]) != crc:
        return None
    return generation


def _iter_records(data: bytes, start: int) -> Iterator[tuple[int, int, memoryview | None]]:
    """Yield ``(position, end, payload)``; payload None at the first bad record
    (and nothing after it)."""
    for item in salvage.scan(data, start, max_length=_RECORD_BYTES_MAX, resync=False):
        if isinstance(item, salvage.Damage):
            yield item.start, item.end, None
            return
        yield item


def _is_journal_record(payload: memoryview) -> bool:
    return payload[0] in _JOURNAL_OPS


# --------------------------------------------------------------------------
# The store
# --------------------------------------------------------------------------


class GroupFlushTicket:
    """What ``begin_flush`` hands out: ``run()`` fsyncs, from any thread.

    The same contract as ``storage.log.FlushTicket``: a caller that syncs
    the descriptors itself takes ``sync_targets()`` and then calls
    ``finish(failure)``; ``run()`` is exactly that. Every ticket must reach
    ``GroupStore.end_flush``, run or not (it unpins the descriptor)."""

    __slots__ = ("fd", "position", "generation", "ok", "failed")
    checkpoints = False  # no recovery-point checkpoint to write after the syncs
    partial = False  # covers everything written so far

    def __init__(self, fd: int, position: int, generation: int) -> None:
        self.fd = fd  # the journal's descriptor, pinned in the file cache; -1 when nothing to do
        self.position = position
        self.generation = generation  # of the journal synced (a compaction replaces it)
        self.ok = False
        self.failed = False

    def sync_targets(self) -> list[tuple[int, bool]]:
        """``(fd, full)`` pairs to sync: the journal needs only fdatasync."""
        return [(self.fd, False)] if self.fd >= 0 else []

    def run(self) -> None:
        failure = None
        if self.fd >= 0:
            try:
                os.fdatasync(self.fd)  # journal appends: data and size
            except OSError as exc:
                failure = exc
        self.finish(failure)

    def finish(self, failure: OSError | None) -> None:
        """After the syncs: raises ``failure``; else the ticket counts at ``end_flush``."""
        if failure is not None:
            self.failed = True
            raise failure
        self.ok = True


@dataclass(frozen=True, slots=True)
class GroupStoreStatistics:
    groups: int
    consumers: int
    pending: int
    journal_bytes: int
    snapshot_bytes: int
    generation: int
    compactions: int


class GroupStore:
    """Every consumer group of one partition, durable in ``directory``.

    Read the model through ``groups`` / ``group(name)`` / ``sorted_groups()``;
    change it only through the mutation methods, each of which appends one
    journal record and then applies it. Callers validate first (the group
    exists, the IDs are pending ...): a mutation that finds its preconditions
    broken raises ``KeyError``/``ValueError`` before writing anything.
    """

    def __init__(
        self,
        directory: Path,
        *,
        logger: logging.Logger | None = None,
        compact_min_bytes: int = 4 * 1024 * 1024,
        file_cache: FileCache | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.logger = logger or logging.getLogger("partita.storage.groups")
        self.compact_min_bytes = compact_min_bytes
        self.groups: dict[bytes, ConsumerGroup] = {}
        self._generation = 0
        self._own_cache = file_cache is None
        self._cache = FileCache(4) if file_cache is None else file_cache
        self._journal_path = str(self.directory / JOURNAL_NAME)  # the cache's key
        self._journaling = False  # the journal of this generation exists (created on the first mutation)
        self._journal_bytes = 0  # file size, header included
        self._durable_bytes = 0  # journal bytes known fsynced
        self._sync_failed = False  # a journal fsync failed: the next flush compacts
        self._snapshot_bytes = 0
        self._compactions = 0
        self._closed = False
        self._replaying = False
        self._compact_retry_bytes = 0  # no compaction below this (after a failed one)
        self.changes = 0  # mutations since open (a replication leader resends state when it moves)
        # What a replay past skipped records had to do (for its warning).
        self._replay_recreated: list[bytes] = []
        self._replay_misfits: list[str] = []

    # ----- lifecycle -----

    @classmethod
    def open(
        cls,
        directory: Path,
        *,
        logger: logging.Logger | None = None,
        compact_min_bytes: int = 4 * 1024 * 1024,
        file_cache: FileCache | None = None,
    ) -> "GroupStore":
        """Load the snapshot, replay the journal, truncate a torn tail.
        ``file_cache``: where the journal's descriptor is kept (the
        partition's shared cache); None: a small one of the store's own.

        Raises:
            GroupStateError: the snapshot is corrupt.
        """
        store = cls(directory, logger=logger, compact_min_bytes=compact_min_bytes, file_cache=file_cache)
        store._recover()
        return store

    def _recover(self) -> None:
        snap_path = self.directory / SNAPSHOT_NAME
        jrnl_path = self.directory / JOURNAL_NAME
        for stale in (SNAPSHOT_NAME + _TMP_SUFFIX, JOURNAL_NAME + _TMP_SUFFIX):
            try:
                (self.directory / stale).unlink()
            except FileNotFoundError:
                pass
        self._replaying = True
        try:
            if snap_path.exists():
                self._load_snapshot(snap_path)
            if jrnl_path.exists():
                self._replay_journal(jrnl_path)
        finally:
            self._replaying = False

    def _load_snapshot(self, path: Path) -> None:
        data = path.read_bytes()
        generation = _parse_header(data, _SNAP_MAGIC)
        if generation is None:
            raise GroupStateError(f"{path}: bad snapshot header")
        count = 0
        ended = False
        for _pos, _end, payload in _iter_records(data, _HEADER_BYTES):
            if payload is None or ended:
                raise GroupStateError(f"{path}: corrupt snapshot record after {count} records")
            r = _Reader(payload)
            if r.u8() == _OP_END:
                if r.u32() != count:
                    raise GroupStateError(f"{path}: snapshot record count mismatch")
                ended = True
                continue
            r.pos = 0
            try:
                self._apply(r)
            except (ValueError, KeyError, struct.error) as e:
                raise GroupStateError(f"{path}: bad snapshot record {count}: {e}") from e
            count += 1
        if not ended:
            raise GroupStateError(f"{path}: snapshot has no end record")
        self._generation = generation
        self._snapshot_bytes = len(data)

    def _replay_journal(self, path: Path) -> None:
        data = path.read_bytes()
        generation = _parse_header(data, _JRNL_MAGIC)
        if generation != self._generation:
            # Older generation: a crash after the snapshot rename, before the
            # journal restart; the snapshot already holds all of it.
            if generation is None or generation > self._generation:
                # No valid header (it is created tmp + fsync + rename, so
                # only a damaged disk gets here), or a journal newer than
                # the snapshot (the snapshot it follows is lost): replaying
                # or discarding would both silently lose acknowledged group
                # state. Refuse, loudly (docs/guarantees.md).
                raise GroupStateError(
                    f"{path}: journal header {'invalid' if generation is None else generation} does not "
                    f"follow snapshot generation {self._generation}; group state not loaded"
                )
            self._start_journal()
            return
        skipped: list[str] = []  # what was not replayed, for the warning
        tail: salvage.Damage | None = None
        records = after = 0  # records replayed; of them, after the first problem
        lenient = False
        for item in salvage.scan(data, _HEADER_BYTES, max_length=_RECORD_BYTES_MAX,
                                 plausible=_is_journal_record):
            if isinstance(item, salvage.Damage):
                if item.tail:
                    tail = item
                else:
                    skipped.append(f"{item.start}..{item.end}")
                lenient = True
                continue
            pos, end, payload = item
            try:
                self._apply(_Reader(payload))  # a failure changes nothing
            except (ValueError, KeyError, struct.error, AssertionError) as e:
                lenient = True
                recreated = len(self._replay_recreated)
                try:
                    self._apply(_Reader(payload), lenient=True)
                except (ValueError, KeyError, struct.error, AssertionError) as unreadable:
                    skipped.append(f"{pos}..{end} (intact but unreadable: {unreadable})")
                    continue
                if len(self._replay_recreated) == recreated:  # else the warning names the group
                    self._replay_misfits.append(f"byte {pos}: {e}")
            records += 1
            after += lenient
        if not lenient:
            self._journaling = True  # appends go on from its end (opened at the first)
            self._journal_bytes = self._durable_bytes = len(data)
            return
        self._repair_journal(path, skipped, tail, records, after)

    def _repair_journal(self, path: Path, skipped: list[str], tail: salvage.Damage | None,
                        records: int, after: int) -> None:
        """After a replay that skipped or bent records: keep the file aside,
        write the state as it now is as the next snapshot (with a fresh
        journal), and say what happened, with one WARNING."""
        aside = salvage.keep_aside(path)
        try:
            self.compact()
        except OSError as exc:
            raise_storage_error(f"rewrite the group state of {path} after damage", exc)
        done = f"the file as it was is kept as {aside}; the state is rewritten as snapshot generation {self._generation}"
        if not skipped and not self._replay_misfits and tail is not None:
            # The usual case: a write torn by a crash (power loss).
            self.logger.warning("%s: torn or corrupt tail: truncated %d bytes at byte %d after %d records; %s",
                                path, tail.size, tail.start, records, done)
            return
        parts = [f"damaged record(s) skipped: {'bytes ' + ', '.join(skipped) if skipped else 'none'}"
                 + (f", and a torn or corrupt tail of {tail.size} bytes at byte {tail.start}" if tail else ""),
                 f"{records} record(s) replayed, {after} of them after the first skipped one"]
        for name in self._replay_recreated:
            parts.append(f"group '{name.decode('utf-8', 'replace')}' re-created from the records after the "
                         "damage (a dead-letter setting it had is lost; its last-delivered-id was 0-0 "
                         "until the next delivery record)")
        if self._replay_misfits:
            parts.append(f"{len(self._replay_misfits)} record(s) did not fit the state without the skipped "
                         f"ones and were applied as far as they could be (first at {self._replay_misfits[0]})")
        self.logger.warning("%s: %s; %s", path, "; ".join(parts), done)

    def __del__(self) -> None:
        # A store dropped without close(): free the descriptor of a cache of
        # its own (a shared cache closes it by its LRU, or with the partition).
        if getattr(self, "_own_cache", False):
            self._cache.close_all()

    @property
    def closed(self) -> bool:
        """True after ``close()``, ``abandon()`` or ``delete_files()``."""
        return self._closed

    def close(self) -> None:
        """Flush and close the journal. The store is unusable afterwards.
        On a disk that fails the journal's sync (or, after one failed, the
        state's rewrite) the store is closed without it, as a partition log
        offline after a failed sync is: the failure is logged, and the next
        open recovers what the disk kept."""
        if self._closed:
            return
        if self._journaling:
            try:
                self.flush()
            except OSError as exc:
                if not self._sync_failed:
                    raise
                self.logger.error("%s: the groups' state was not made durable at close (%s); the next "
                                  "open recovers what the disk kept", self.directory, exc)
        self._close_journal()
        self._closed = True

    def _close_journal(self) -> None:
        """Take the journal's descriptor out of the cache (one pinned by a
        ticket is closed at its ``end_flush``)."""
        self._journaling = False
        self._cache.close(self._journal_path)
        if self._own_cache:
            self._cache.close_all()

    def abandon(self) -> None:
        """Close without flushing (the partition is being deleted). A flush
        ticket in flight still reaches ``end_flush``; later ones have
        nothing to sync."""
        self._close_journal()
        self._closed = True

    def delete_files(self) -> None:
        """Close and remove the group files (DEL of the stream)."""
        self.abandon()
        self.groups.clear()
        for name in (SNAPSHOT_NAME, JOURNAL_NAME, SNAPSHOT_NAME + _TMP_SUFFIX, JOURNAL_NAME + _TMP_SUFFIX):
            try:
                (self.directory / name).unlink()
            except FileNotFoundError:
                pass

    # ----- durability -----

    @property
    def needs_flush(self) -> bool:
        return self._sync_failed or self._journal_bytes > self._durable_bytes

    def flush(self) -> None:
        """fsync every mutation so far."""
        if self._sync_failed:
            self._rewrite_after_failed_sync()
        elif self._journaling and self.needs_flush:
            fd = self._cache.get(self._journal_path)
            try:
                os.fdatasync(fd)
            except OSError:
                self._journal_sync_failed()
                raise
            self._durable_bytes = self._journal_bytes

    def begin_flush(self) -> GroupFlushTicket:
        """Main thread: a ticket whose ``run()`` fsyncs what was written so
        far through the journal's descriptor, pinned in the file cache until
        ``end_flush`` (after a failed sync: the compaction, here, and a
        ticket with nothing left to sync; raises if that fails too, or if
        the journal cannot be opened). A closed store's ticket has nothing
        to sync."""
        if self._closed:
            return GroupFlushTicket(-1, self._journal_bytes, self._generation)
        if self._sync_failed:
            self._rewrite_after_failed_sync()
        if not self._journaling or not self.needs_flush:
            return GroupFlushTicket(-1, self._journal_bytes, self._generation)
        return GroupFlushTicket(self._cache.pin(self._journal_path), self._journal_bytes, self._generation)

    def _journal_sync_failed(self) -> None:
        if not self._sync_failed:
            self._sync_failed = True
            self.logger.error("%s: fsync of the group journal failed; the next flush rewrites "
                              "the groups' state as a new snapshot", self.directory)

    def _rewrite_after_failed_sync(self) -> None:
        """Make the state in memory durable in new files (``compact``): the
        journal's pages may be lost. Raises ``OSError`` if the disk still
        fails; the next flush tries again."""
        self.compact()
        self._sync_failed = False

    def end_flush(self, ticket: GroupFlushTicket) -> None:
        """Main thread, after every ticket (run, failed or never run): unpin
        its descriptor; after a successful run, record progress."""
        if ticket.fd >= 0:
            self._cache.unpin(ticket.fd)
            ticket.fd = -1
            # A journal replaced meanwhile (compaction: positions restart)
            # was made durable whole by that compaction; the ticket synced
            # the old file and says nothing about the new one. A failed
            # sync makes nothing durable.
            if ticket.generation != self._generation:
                return
            if ticket.failed:
                self._journal_sync_failed()
            elif ticket.ok:
                assert ticket.position <= self._journal_bytes
                self._durable_bytes = max(self._durable_bytes, ticket.position)

    # ----- queries -----

    def group(self, name: bytes) -> ConsumerGroup | None:
        return self.groups.get(name)

    def sorted_groups(self) -> list[ConsumerGroup]:
        """Groups in Redis's order (bytewise by name)."""
        return [self.groups[k] for k in sorted(self.groups)]

    def statistics(self) -> GroupStoreStatistics:
        return GroupStoreStatistics(
            groups=len(self.groups),
            consumers=sum(len(g.consumers) for g in self.groups.values()),
            pending=sum(len(g.pel) for g in self.groups.values()),
            journal_bytes=self._journal_bytes,
            snapshot_bytes=self._snapshot_bytes,
            generation=self._generation,
            compactions=self._compactions,
        )

    # ----- mutations -----

    def create_group(
        self,
        name: bytes,
        last_id: StreamIdT,
        entries_read: int | None,
        *,
        max_deliveries: int = 0,
        dead_letter_key: bytes | None = None,
    ) -> ConsumerGroup:
        """XGROUP CREATE. Raises GroupError (``GROUP_EXISTS``, or a dead-letter
        setting ``check_dead_letter`` refuses)."""
        if name in self.groups:
            raise GroupError(GROUP_EXISTS, group=name)
        check_dead_letter(max_deliveries, dead_letter_key)
        self._write(
            _U8.pack(_OP_CREATE) + _s(name) + _ID.pack(*last_id) + _er(entries_read)
            + _U32.pack(max_deliveries) + _opt_s(dead_letter_key)
        )
        g = self._apply_create(name, last_id, entries_read, max_deliveries, dead_letter_key)
        self._maybe_compact()
        return g

    def destroy_group(self, name: bytes) -> bool:
        """XGROUP DESTROY. Returns False (and writes nothing) if absent."""
        if name not in self.groups:
            return False
        self._write(_U8.pack(_OP_DESTROY) + _s(name))
        del self.groups[name]
        self._maybe_compact()
        return True

    def set_id(self, name: bytes, last_id: StreamIdT, entries_read: int | None) -> None:
        """XGROUP SETID (and the LASTID-style moves of XCLAIM use ``claim``)."""
        self._need(name)
        self._write(_U8.pack(_OP_SETID) + _s(name) + _ID.pack(*last_id) + _er(entries_read))
        self._apply_setid(name, last_id, entries_read)
        self._maybe_compact()

    def configure_dead_letter(self, name: bytes, max_deliveries: int, dead_letter_key: bytes | None) -> None:
        """Set (max_deliveries > 0 and a key) or clear (0, None) dead-lettering."""
        self._need(name)
        check_dead_letter(max_deliveries, dead_letter_key)
        self._write(_U8.pack(_OP_CONFIG) + _s(name) + _U32.pack(max_deliveries) + _opt_s(dead_letter_key))
        self._apply_config(name, max_deliveries, dead_letter_key)
        self._maybe_compact()

    def create_consumer(self, group: bytes, consumer: bytes, now_ms: int) -> bool:
        """XGROUP CREATECONSUMER. Returns False (writes nothing) if it exists."""
        g = self._need(group)
        if consumer in g.consumers:
            return False
        self._write(_U8.pack(_OP_CREATECONSUMER) + _s(group) + _s(consumer) + _I64.pack(now_ms))
        self._apply_createconsumer(group, consumer, now_ms)
        self._maybe_compact()
        return True

    def delete_consumer(self, group: bytes, consumer: bytes) -> int:
        """XGROUP DELCONSUMER: drops the consumer and its pending entries.

        Returns how many pending entries it had (0, writing nothing, if absent).
        """
        g = self._need(group)
        c = g.consumers.get(consumer)
        if c is None:
            return 0
        self._write(_U8.pack(_OP_DELCONSUMER) + _s(group) + _s(consumer))
        n = self._apply_delconsumer(group, consumer)
        self._maybe_compact()
        return n

    def touch_consumer(self, group: bytes, consumer: bytes, now_ms: int) -> Consumer:
        """Look up ``consumer``, creating it, and set its seen time (XREADGROUP,
        XCLAIM, XAUTOCLAIM all do this before anything else)."""
        g = self._need(group)
        c = g.consumers.get(consumer)
        if c is not None and c.seen_time_ms == now_ms:
            return c
        self._write(_U8.pack(_OP_TOUCH) + _s(group) + _s(consumer) + _I64.pack(now_ms))
        c = self._apply_touch(group, consumer, now_ms)
        self._maybe_compact()
        return c

    def see_consumer(self, group: bytes, consumer: bytes, now_ms: int) -> bool:
        """An XREADGROUP that served ``consumer`` nothing (Redis 7.2+ counts
        the attempt): create the consumer (journalled, returns True) or set
        its seen time in memory only (False). An empty poll changes nothing
        else, and a soft timestamp is not worth a journal write (and an
        fsync) per poll: a snapshot keeps the value, a restart before one
        shows the seen time of the consumer's last journalled change."""
        g = self._need(group)
        c = g.consumers.get(consumer)
        if c is None:
            self.touch_consumer(group, consumer, now_ms)
            return True
        if now_ms > c.seen_time_ms:
            c.seen_time_ms = now_ms
        return False

    def deliver(
        self,
        group: bytes,
        consumer: bytes,
        ids: Sequence[StreamIdT],
        last_id: StreamIdT,
        entries_read: int | None,
        now_ms: int,
        *,
        noack: bool = False,
    ) -> None:
        """XREADGROUP ``>``: ``ids`` (ascending, all > the old last_id) go to
        ``consumer``'s PEL (unless ``noack``), and the group moves to
        ``last_id`` / ``entries_read``. An ID already pending (after SETID
        moved backwards) changes owner with delivery count 1."""
        g = self._need(group)
        if ids and not (ids[0] > g.last_id and last_id >= ids[-1]):
            raise GroupError(NOT_AFTER_LAST_ID, group=group)
        self._write(b"".join((
            _DELIVER_OP, _s(group), _s(consumer),
            _DELIVER_FIXED.pack(now_ms, 1 if noack else 0, last_id[0], last_id[1],
                                -1 if entries_read is None else entries_read),
            _ids(ids),
        )))
        self._apply_deliver(group, consumer, now_ms, noack, last_id, entries_read, ids)
        self._maybe_compact()

    def redeliver(self, group: bytes, consumer: bytes, ids: Sequence[StreamIdT], now_ms: int) -> None:
        """XREADGROUP with an explicit ID: the consumer's own pending ``ids``
        were sent again (delivery count + 1, delivery time now)."""
        g = self._need(group)
        c = g.consumers.get(consumer)
        if c is None or any(sid not in c.pending for sid in ids):
            raise GroupError(NOT_PENDING, group=group, consumer=consumer)
        if not ids:
            return
        self._write(_U8.pack(_OP_REDELIVER) + _s(group) + _s(consumer) + _I64.pack(now_ms) + _ids(ids))
        self._apply_redeliver(group, consumer, now_ms, ids)
        self._maybe_compact()

    def ack(self, group: bytes, ids: Iterable[StreamIdT]) -> int:
        """XACK: remove pending ``ids``; returns how many were pending."""
        return self._remove_op(_OP_ACK, group, ids)

    def drop_pending(self, group: bytes, ids: Iterable[StreamIdT]) -> int:
        """Remove pending ``ids`` whose entries left the stream (XAUTOCLAIM's
        deleted-IDs reply, XCLAIM of a deleted entry)."""
        return self._remove_op(_OP_DROP, group, ids)

    def dead_letter(self, group: bytes, ids: Iterable[StreamIdT]) -> int:
        """Remove pending ``ids`` that the caller has appended to the group's
        dead-letter stream."""
        return self._remove_op(_OP_DEADLETTER, group, ids)

    def claim(
        self,
        group: bytes,
        consumer: bytes,
        claims: Sequence[tuple[StreamIdT, int, int]],
        now_ms: int,
        *,
        last_id: StreamIdT | None = None,
    ) -> None:
        """XCLAIM / XAUTOCLAIM: each ``(id, delivery_time_ms, delivery_count)``
        becomes pending for ``consumer`` with those values (created when FORCE
        claims an ID not yet pending). ``last_id`` (XCLAIM LASTID) moves the
        group's last_id forward if greater. The consumer is created/touched."""
        self._need(group)
        has_last = last_id is not None
        wide = _wide(n for _, _, n in claims)
        self._write(
            _U8.pack(_OP_CLAIM64 if wide else _OP_CLAIM) + _s(group) + _s(consumer) + _I64.pack(now_ms)
            + _U8.pack(1 if has_last else 0) + _ID.pack(*(last_id or ZERO_ID)) + _claims(claims, wide)
        )
        self._apply_claim(group, consumer, now_ms, last_id, claims)
        self._maybe_compact()

    def nack(self, group: bytes, entries: Sequence[tuple[StreamIdT, int]]) -> None:
        """XNACK: each ``(id, delivery_count)``, in order, is released: no
        owner (it leaves its consumer's PEL), delivery time 0, that count,
        at the tail of the group's NACK zone (the head of the time order).
        An ID not pending is made pending so (the caller decided FORCE may);
        an ID may come more than once."""
        self._need(group)
        if not entries:
            return
        assert all(0 <= c < 2**64 for _, c in entries)
        self._write(_U8.pack(_OP_NACK) + _s(group) + _nacked(entries))
        self._apply_nack(group, entries)
        self._maybe_compact()

    # ----- apply (shared by mutations and replay) -----

    def _apply(self, r: _Reader, lenient: bool = False) -> None:
        """Apply one record, or raise (ValueError/KeyError: it does not fit
        the state; nothing changed). ``lenient``: the replay skipped a
        record before this one, so the state may lack what it did; the
        record is applied as far as it fits instead: a group it names is
        re-created (``_replay_group``), a CREATE replaces the group, removals
        and redeliveries keep to the IDs that are pending, a consumer created
        or deleted twice is left as it is. Decoding errors raise either way.
        """
        op = r.u8()
        if op == _OP_CREATE:
            name, last_id, er, md, dl = r.s(), r.sid(), r.er(), r.u32(), r.opt_s()
            r.done()
            if name in self.groups and not lenient:
                raise ValueError("group exists")
            self._apply_create(name, last_id, er, md, dl)
        elif op == _OP_DESTROY:
            name = r.s()
            r.done()
            if name not in self.groups and not lenient:
                raise KeyError(f"no such group {name!r}")
            self.groups.pop(name, None)
        elif op == _OP_SETID:
            name, last_id, er = r.s(), r.sid(), r.er()
            r.done()
            self._replay_group(name, lenient)
            self._apply_setid(name, last_id, er)
        elif op == _OP_CONFIG:
            name, md, dl = r.s(), r.u32(), r.opt_s()
            r.done()
            self._replay_group(name, lenient)
            self._apply_config(name, md, dl)
        elif op == _OP_CREATECONSUMER:
            group, consumer, now = r.s(), r.s(), r.i64()
            r.done()
            if consumer in self._replay_group(group, lenient).consumers:
                if not lenient:
                    raise ValueError("consumer exists")
            else:
                self._apply_createconsumer(group, consumer, now)
        elif op == _OP_DELCONSUMER:
            group, consumer = r.s(), r.s()
            r.done()
            if consumer in self._replay_group(group, lenient).consumers:
                self._apply_delconsumer(group, consumer)
            elif not lenient:
                raise KeyError("no such consumer")
        elif op == _OP_TOUCH:
            group, consumer, now = r.s(), r.s(), r.i64()
            r.done()
            self._replay_group(group, lenient)
            self._apply_touch(group, consumer, now)
        elif op == _OP_DELIVER:
            group, consumer, now, noack = r.s(), r.s(), r.i64(), r.u8()
            last_id, er, ids = r.sid(), r.er(), r.ids()
            r.done()
            self._replay_group(group, lenient)
            self._apply_deliver(group, consumer, now, bool(noack), last_id, er, ids)
        elif op == _OP_REDELIVER:
            group, consumer, now, ids = r.s(), r.s(), r.i64(), r.ids()
            r.done()
            c = self._replay_group(group, lenient).consumers.get(consumer)
            if c is None or any(sid not in c.pending for sid in ids):
                if not lenient:
                    raise ValueError("redelivered ID not pending")
                c = self._apply_touch(group, consumer, now)
                ids = [sid for sid in ids if sid in c.pending]
            self._apply_redeliver(group, consumer, now, ids)
        elif op in (_OP_ACK, _OP_DROP, _OP_DEADLETTER):
            group, ids = r.s(), r.ids()
            r.done()
            pel = self._replay_group(group, lenient).pel
            # Checked whole before anything changes (as a live removal is):
            # a record that cannot apply leaves the state as it was.
            present = pel.pending_of(ids)
            if len(present) != len(ids):
                if not lenient:
                    raise ValueError("removed ID not pending, or named twice")
            self._apply_remove(op, group, present)
        elif op == _OP_CLAIM or op == _OP_CLAIM64:
            group, consumer, now, has_last, last_id, claims = (
                r.s(), r.s(), r.i64(), r.u8(), r.sid(), r.claims(op == _OP_CLAIM64)
            )
            r.done()
            self._replay_group(group, lenient)
            self._apply_claim(group, consumer, now, last_id if has_last else None, claims)
        elif op == _OP_NACK:
            group, entries = r.s(), r.nacked()
            r.done()
            self._replay_group(group, lenient)
            self._apply_nack(group, entries)
        elif op == _OP_SNAP_CONSUMER:
            group, consumer, seen, active = r.s(), r.s(), r.i64(), r.i64()
            r.done()
            g = self._need(group)
            if consumer in g.consumers:
                raise ValueError("consumer exists")
            g.consumers[consumer] = Consumer(consumer, seen, active)
        elif op == _OP_SNAP_PENDING or op == _OP_SNAP_PENDING64:
            group, consumer, claims = r.s(), r.s(), r.claims(op == _OP_SNAP_PENDING64)
            r.done()
            g = self._need(group)
            c = g.consumers[consumer]
            for sid, t, count in claims:
                if sid in g.pel:
                    raise ValueError("pending entry twice in snapshot")
                pe = PendingEntry(consumer, t, count)
                g.pel.add(sid, pe)
                c.pending.add(sid, pe)
                g.retimed(sid, pe)
        elif op == _OP_SNAP_NACKED:
            group, entries = r.s(), r.nacked()
            r.done()
            g = self._need(group)
            for sid, count in entries:
                if sid in g.pel:
                    raise ValueError("pending entry twice in snapshot")
                pe = PendingEntry(None, 0, count)
                g.pel.add(sid, pe)
                g.retimed(sid, pe)
        elif op == _OP_SNAP_GROUPSTAT:
            group, total = r.s(), r.i64()
            r.done()
            self._need(group).dead_lettered_total = total
        else:
            raise ValueError(f"unknown op {op}")

    def _apply_create(self, name, last_id, entries_read, max_deliveries, dead_letter_key) -> ConsumerGroup:
        g = ConsumerGroup(name, tuple(last_id), entries_read, max_deliveries, dead_letter_key)
        self.groups[name] = g
        return g

    def _apply_setid(self, name, last_id, entries_read) -> None:
        g = self.groups[name]
        g.last_id = tuple(last_id)
        g.entries_read = entries_read

    def _apply_config(self, name, max_deliveries, dead_letter_key) -> None:
        g = self.groups[name]
        g.max_deliveries = max_deliveries
        g.dead_letter_key = dead_letter_key

    def _apply_createconsumer(self, group, consumer, now_ms) -> Consumer:
        c = Consumer(consumer, now_ms)
        self.groups[group].consumers[consumer] = c
        return c

    def _apply_delconsumer(self, group, consumer) -> int:
        g = self.groups[group]
        c = g.consumers.pop(consumer)
        n = len(c.pending)
        for sid in c.pending.ids_from(ZERO_ID):
            g.pel.remove(sid)
        return n

    def _apply_touch(self, group, consumer, now_ms) -> Consumer:
        g = self.groups[group]
        c = g.consumers.get(consumer)
        if c is None:
            c = g.consumers[consumer] = Consumer(consumer, now_ms)
        else:
            c.seen_time_ms = now_ms
        return c

    def _apply_deliver(self, group, consumer, now_ms, noack, last_id, entries_read, ids) -> None:
        g = self.groups[group]
        c = self._apply_touch(group, consumer, now_ms)
        if ids:
            c.active_time_ms = now_ms
        if ids and not noack:
            if not g.pel.isdisjoint(ids):
                # Pending already (SETID moved back): reassigned, count 1.
                for sid in ids:
                    old = g.pel.get(sid)
                    prev = g.consumers.get(old.consumer) if old is not None and old.consumer is not None else None
                    if prev is not None:
                        prev.pending.remove(sid)
            pe = PendingEntry(consumer, now_ms, 1)  # one for the whole delivery
            g.pel.add_run(ids, pe)
            c.pending.add_run(ids, pe)
            g.retimed_run(ids, pe)
        g.last_id = tuple(last_id)
        g.entries_read = entries_read

    def _apply_redeliver(self, group, consumer, now_ms, ids) -> None:
        g = self.groups[group]
        c = g.consumers[consumer]
        c.seen_time_ms = now_ms
        c.active_time_ms = now_ms
        for sid in ids:
            pe = PendingEntry(consumer, now_ms, count_after(c.pending.get(sid).delivery_count))
            g.pel.add(sid, pe)
            c.pending.add(sid, pe)
            g.retimed(sid, pe)

    def _remove_op(self, op: int, group: bytes, ids: Iterable[StreamIdT]) -> int:
        g = self._need(group)
        present = g.pel.pending_of(ids)
        if not present:
            return 0
        self._write(_U8.pack(op) + _s(group) + _ids(present))
        self._apply_remove(op, group, present)
        self._maybe_compact()
        return len(present)

    def _apply_remove(self, op, group, ids) -> None:
        """Remove ``ids`` (distinct, each pending: the callers check, a
        replayed record whole before) from the group's PEL and their
        owners'. Removing a whole PEL (a consumer acking all it was
        delivered) empties it without a lookup per ID."""
        g = self.groups[group]
        if len(ids) == len(g.pel):
            owners = {pe.consumer for pe in g.pel.clear()}
            for name in owners:
                c = g.consumers.get(name) if name is not None else None
                if c is not None:
                    c.pending.clear()  # a consumer's PEL is a part of the group's
        elif (pe := g.pel.take_run(ids)) is not None:  # exactly one delivery, whole (an XACK of a batch)
            c = g.consumers.get(pe.consumer) if pe.consumer is not None else None
            if c is not None and c.pending.take_run(ids) is None:
                c.pending.remove_many(ids)
        else:
            removed = g.pel.remove_many(ids)
            distinct = set(removed)  # a delivery's entries share one object
            if None in distinct:
                raise ValueError("removing an ID that is not pending")
            owners = {pe.consumer for pe in distinct}
            if len(owners) == 1:  # one owner (an XACK of a batch)
                name = owners.pop()
                c = g.consumers.get(name) if name is not None else None
                if c is not None:
                    if len(c.pending) == len(ids):
                        c.pending.clear()
                    else:
                        c.pending.remove_many(ids)
            else:
                owned: dict[bytes | None, list[StreamIdT]] = {}
                for sid, pe in zip(ids, removed):
                    owned.setdefault(pe.consumer, []).append(sid)
                for name, sids in owned.items():
                    c = g.consumers.get(name) if name is not None else None
                    if c is not None:
                        c.pending.remove_many(sids)
        if op == _OP_DEADLETTER:
            g.dead_lettered_total += len(ids)

    def _apply_claim(self, group, consumer, now_ms, last_id, claims) -> None:
        g = self.groups[group]
        c = self._apply_touch(group, consumer, now_ms)
        if claims:
            c.active_time_ms = now_ms
        for sid, t, count in claims:
            old = g.pel.get(sid)
            if old is not None and old.consumer != consumer and old.consumer is not None:
                prev = g.consumers.get(old.consumer)
                if prev is not None:
                    prev.pending.remove(sid)
            pe = PendingEntry(consumer, t, count)
            g.pel.add(sid, pe)
            c.pending.add(sid, pe)
            g.retimed(sid, pe)
        if last_id is not None and tuple(last_id) > g.last_id:
            g.last_id = tuple(last_id)

    def _apply_nack(self, group, entries) -> None:
        g = self.groups[group]
        for sid, count in entries:
            old = g.pel.get(sid)
            if old is not None and old.consumer is not None:
                c = g.consumers.get(old.consumer)
                if c is not None:
                    c.pending.remove(sid)
            pe = PendingEntry(None, 0, count)
            g.pel.add(sid, pe)
            g.retimed(sid, pe)

    # ----- helpers -----

    def _replay_group(self, name: bytes, lenient: bool) -> ConsumerGroup:
        """The group a replayed record names. Missing and ``lenient``: its
        CREATE was among the skipped records; the record proves the group
        existed, so it is re-created with what is not known set the safe
        way: last-delivered-id 0-0 (entries may be delivered again, none
        is skipped), entries-read unknown, no dead-lettering."""
        g = self.groups.get(name)
        if g is None:
            if not lenient:
                raise KeyError(f"no such group {name!r}")
            g = self._apply_create(name, ZERO_ID, None, 0, None)
            self._replay_recreated.append(name)
        return g

    def _need(self, name: bytes) -> ConsumerGroup:
        g = self.groups.get(name)
        if g is None:
            raise GroupError(NO_GROUP, group=name)
        return g

    def _write(self, payload: bytes) -> None:
        assert not self._closed, "group store is closed"
        # Disk errors go through the storage funnel (one log line, listeners
        # told) as StorageError; nothing was applied, the caller's mutation
        # is refused whole (written before applied).
        try:
            if not self._journaling:
                self._start_journal()
            record = _frame(payload)
            fd = self._cache.get(self._journal_path)  # open unless the cache has it
            written = os.pwrite(fd, record, self._journal_bytes)
            if written != len(record):  # a short write to a regular file: ENOSPC
                # Cut the partial record so the journal stays replayable.
                os.ftruncate(fd, self._journal_bytes)
                raise OSError(28, "short write to group journal")
        except OSError as exc:
            raise_storage_error(f"write {self.directory / JOURNAL_NAME}", exc)
        self._journal_bytes += written
        self.changes += 1

    def _maybe_compact(self) -> None:
        if self._journal_bytes > max(self.compact_min_bytes, 2 * self._snapshot_bytes, self._compact_retry_bytes):
            try:
                self.compact()
            except OSError as exc:
                # The mutation is already journaled and applied: a failed
                # compaction (disk full) must not make it look refused.
                # Compaction is retried after another compact_min_bytes / 4
                # of journal; the half-written tmp snapshot is removed now
                # so it does not hold the space.
                self._compact_retry_bytes = self._journal_bytes + self.compact_min_bytes // 4
                try:
                    (self.directory / (SNAPSHOT_NAME + _TMP_SUFFIX)).unlink()
                except OSError:
                    pass
                self.logger.warning("%s: group state compaction failed, retried later: %s", self.directory, exc)

    def compact(self) -> None:
        """Write a snapshot of generation G + 1 and restart the journal."""
        generation = self._generation + 1
        tmp = self.directory / (SNAPSHOT_NAME + _TMP_SUFFIX)
        size = _write_file_durably(tmp, self.directory / SNAPSHOT_NAME, self._snapshot_chunks(generation), self.directory)
        self._generation = generation
        self._snapshot_bytes = size
        self._compactions += 1
        self._start_journal()

    def _snapshot_chunks(self, generation: int) -> Iterator[bytes]:
        yield _header(_SNAP_MAGIC, generation)
        count = 0
        for g in self.sorted_groups():
            yield _frame(
                _U8.pack(_OP_CREATE) + _s(g.name) + _ID.pack(*g.last_id) + _er(g.entries_read)
                + _U32.pack(g.max_deliveries) + _opt_s(g.dead_letter_key)
            )
            count += 1
            if g.dead_lettered_total:
                yield _frame(_U8.pack(_OP_SNAP_GROUPSTAT) + _s(g.name) + _I64.pack(g.dead_lettered_total))
                count += 1
            for c in g.sorted_consumers():
                yield _frame(
                    _U8.pack(_OP_SNAP_CONSUMER) + _s(g.name) + _s(c.name)
                    + _I64.pack(c.seen_time_ms) + _I64.pack(c.active_time_ms)
                )
                count += 1
                items = c.pending.items()
                for i in range(0, len(items), _SNAP_PENDING_CHUNK):
                    chunk = [(sid, pe.delivery_time_ms, pe.delivery_count) for sid, pe in items[i:i + _SNAP_PENDING_CHUNK]]
                    wide = _wide(n for _, _, n in chunk)
                    yield _frame(
                        _U8.pack(_OP_SNAP_PENDING64 if wide else _OP_SNAP_PENDING) + _s(g.name) + _s(c.name)
                        + _claims(chunk, wide)
                    )
                    count += 1
            released = sorted((pe.tick, sid, pe.delivery_count) for sid, pe in g.pel.mapping().items()
                              if pe.consumer is None)  # the NACK zone, in its order
            for i in range(0, len(released), _SNAP_PENDING_CHUNK):
                chunk = [(sid, n) for _, sid, n in released[i:i + _SNAP_PENDING_CHUNK]]
                yield _frame(_U8.pack(_OP_SNAP_NACKED) + _s(g.name) + _nacked(chunk))
                count += 1
        yield _frame(_U8.pack(_OP_END) + _U32.pack(count))

    # ----- replication: the journal is fetched like a log -----

    def journal_position(self) -> tuple[int, int]:
        """``(generation, journal end)``: where a follower that has applied
        everything so far stands in this store's journal."""
        return self._generation, self._journal_bytes

    def journal_since(self, generation: int, position: int) -> bytes | None:
        """The journal's records from ``position`` to its end, if
        ``(generation, position)`` is a point of this store's current journal;
        None otherwise (the follower needs ``snapshot_bytes()`` first)."""
        if generation != self._generation or position > self._journal_bytes:
            return None
        if position == self._journal_bytes:
            return b""
        if position < _HEADER_BYTES:
            return None
        try:
            return os.pread(self._cache.get(self._journal_path), self._journal_bytes - position, position)
        except OSError as exc:
            raise_storage_error(f"read {self.directory / JOURNAL_NAME}", exc)

    def apply_journal(self, records: bytes) -> int:
        """Apply a leader's journal records (``journal_since``) here: each is
        written to this store's own journal and applied, as the leader's
        mutation was. Returns how many. Raises GroupStateError on a damaged
        or inapplicable record (the caller then asks for a snapshot)."""
        count = 0
        for pos, _end, payload in _iter_records(records, 0):
            if payload is None:
                raise GroupStateError(f"replicated group journal record at byte {pos} is damaged")
            data = bytes(payload)
            try:
                # This replica's state equals the leader's before the record
                # (same snapshot, same records), so it applies as it did there.
                # If it does not, the caller re-syncs from a snapshot.
                self._apply(_Reader(data))
            except (ValueError, KeyError, struct.error, AssertionError) as e:
                raise GroupStateError(f"replicated group journal record at byte {pos}: {e}") from e
            self._write(data)
            count += 1
        self._maybe_compact()
        return count

    def snapshot_bytes(self) -> bytes:
        """The whole group state as one snapshot file's bytes (what a
        replication leader sends a follower)."""
        return b"".join(self._snapshot_chunks(self._generation + 1))

    def replace(self, snapshot: bytes) -> None:
        """Make the state exactly ``snapshot`` (a leader's ``snapshot_bytes``):
        checked first, then written durably as this store's next snapshot with
        a fresh journal. Raises GroupStateError and changes nothing when the
        bytes are not a valid snapshot."""
        check = GroupStore(self.directory, logger=self.logger, file_cache=self._cache)
        check._replaying = True
        if not snapshot:  # no groups at all
            snapshot = b"".join(check._snapshot_chunks(0))
        tmp = self.directory / (SNAPSHOT_NAME + _TMP_SUFFIX)
        self.directory.mkdir(parents=True, exist_ok=True)
        generation = self._generation + 1
        data = _header(_SNAP_MAGIC, generation) + bytes(snapshot)[_HEADER_BYTES:]
        tmp.write_bytes(data)
        try:
            check._load_snapshot(tmp)
        finally:
            tmp.unlink()
        _write_file_durably(tmp, self.directory / SNAPSHOT_NAME, [data], self.directory)
        self.groups = check.groups
        self._generation = generation
        self._snapshot_bytes = len(data)
        self._start_journal()

    def _start_journal(self) -> None:
        """A fresh journal for the current generation (tmp + fsync + rename).
        The old file's descriptor leaves the cache first: the next append
        opens the new one."""
        self._journaling = False
        self._cache.close(self._journal_path)
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / JOURNAL_NAME
        _write_file_durably(
            self.directory / (JOURNAL_NAME + _TMP_SUFFIX), path,
            [_header(_JRNL_MAGIC, self._generation)], self.directory,
        )
        self._journaling = True
        self._journal_bytes = _HEADER_BYTES
        self._durable_bytes = _HEADER_BYTES


def _write_file_durably(tmp: Path, final: Path, chunks: Iterable[bytes], directory: Path) -> int:
    """Write ``chunks`` to ``tmp``, fsync, rename over ``final``, fsync the dir."""
    size = 0
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        buf: list[bytes] = []
        buffered = 0
        for chunk in chunks:
            buf.append(chunk)
            buffered += len(chunk)
            if buffered >= 1 << 20:
                size += _write_all(fd, b"".join(buf))
                buf.clear()
                buffered = 0
        if buf:
            size += _write_all(fd, b"".join(buf))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, final)
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return size


def _write_all(fd: int, data: bytes) -> int:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]
    return len(data)


def groups_of(stream) -> GroupStore:
    """The ``GroupStore`` of a ``storage.streams.stream.Stream``, opened on first use.

    It lives in the stream's partition directory (beside ``stream.meta``) and
    is cached on the stream object as ``group_store``, so it shares the
    stream's lifetime: when the topic registry drops the stream (DEL), it
    closes the store (``abandon``) and its files go with the partition
    directory. Its journal's descriptor is kept in the partition log's file
    cache (``stream.log.cache``).
    """
    store = stream.__dict__.get("group_store")
    if store is None:
        # The journal's descriptor lives in the partition's file cache, with
        # the log's files: bounded by max-open-files however many partitions
        # have groups. (A stand-in without a log, in tests: a cache of its own.)
        cache = getattr(getattr(stream, "log", None), "cache", None)
        store = GroupStore.open(Path(stream.meta_path).parent, file_cache=cache)
        stream.group_store = store
    return store
