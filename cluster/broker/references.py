"""Deletions and trims that mind the consumer groups' references (Redis 8.2).

Owns, as ``Session`` methods (``ReferenceOps`` is one of its bases): XDELEX
(``delete_each``), XACKDEL (``ack_delete``) and the reference policy of a
trim (``apply_trim``, for XTRIM and XADD's MAXLEN/MINID), each on one
partition:

- ``KEEPREF`` (the default): entries leave the stream; the pending entries
  lists keep their IDs (XDEL's way: a history read answers ``[id, nil]``).
- ``DELREF``: entries leave the stream and every group's PEL; a ``~``
  trim removes every entry it reaches, as an exact one, within its LIMIT
  counted by nodes (Redis 8.6's ``streamTrim`` trims by whole nodes only
  under KEEPREF; ``_exact_within_limit``).
- ``ACKED``: an entry leaves only when no group still needs it: none has
  it pending, and none can still deliver it (its ID is not above any
  group's last-delivered-id). A trim skips the entries it must keep and
  removes the deletable ones after them; ``~`` does too (Redis 8.6 stops
  at the first radix node it cannot drop whole only under KEEPREF), with
  its LIMIT counted by nodes of ``stream-node-max-entries`` entries.

Durability and replication: deletion markers are written first, then the
group journal records (acks, references dropped), each noted for the
session's receipt (``wrote_log`` / ``wrote_group``: an acks=all reply waits
for the in-sync replicas to have applied the group records, and a follower
applies a fetch round's stream state, the markers, before its group
records, so the markers are there too).

A key that names a topic of several partitions is refused, as XDEL and XACK
refuse it (``TopicError``): IDs and groups are per partition, and replies
name the partition keys.

Must not know: sockets, protocols, reply shapes, error texts.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from storage.streams.groups import ZERO_ID, GroupStore, groups_of
from storage.streams.ids import StreamId
from storage.streams.stream import DEFAULT_NODE_ENTRIES

StreamIdT = tuple[int, int]

KEEPREF = "KEEPREF"
DELREF = "DELREF"
ACKED = "ACKED"
REF_POLICIES = (KEEPREF, DELREF, ACKED)

# Per ID of XDELEX / XACKDEL (Redis's reply codes are these numbers).
NOT_FOUND = -1  # XDELEX: not in the stream; XACKDEL: not pending in the group (or no such key / group)
DELETED = 1  # deleted (XACKDEL: acknowledged, and deleted or already gone)
REFERENCED = 2  # ACKED: kept, a group still needs it (XACKDEL: acknowledged all the same)

_WALK_BATCH = 512  # entries read at a time when an ACKED trim looks past the ones it keeps


def _live_offset(stream: Any, sid: StreamIdT) -> int | None:
    """The offset of the live (neither trimmed nor deleted) entry ``sid``, else None."""
    log = stream.log
    start, end = log.log_start_offset, log.log_end_offset
    if start >= end:
        return None
    offset = log.find_offset(sid[0], sid[1], inclusive=True)
    if not start <= offset < end or tuple(log.entry_id(offset)) != tuple(sid) or log.is_deleted(offset):
        return None
    return offset


def _node_size(trim: Any) -> int:
    """Entries (offsets) per node of ``trim``'s ``~`` (Redis's default when unset)."""
    return trim.node_entries if trim.node_entries > 0 else DEFAULT_NODE_ENTRIES


def _exact_within_limit(stream: Any, trim: Any) -> Any:
    """The exact trim Redis 8.6's ``streamTrim`` makes of a ``~`` one whose
    policy is not KEEPREF and which may remove every entry it reaches: it
    goes entry by entry past a node it cannot drop whole, and its LIMIT
    counts by nodes (of ``node_entries`` offsets, as ``Stream``'s ``~``
    trims count them): it stops before the first node whose live entries
    would take it past the limit."""
    exact = trim.__class__(trim.strategy, False, maxlen=trim.maxlen, minid=trim.minid,
                           node_entries=trim.node_entries, policy=trim.policy)
    if not trim.limit:
        return exact
    log = stream.log
    size = _node_size(trim)
    reach, end, removed = log.log_start_offset, log.log_end_offset, 0
    while reach < end:
        node_end = min((reach // size + 1) * size, end)
        live = stream.live_between(reach, node_end)
        if removed + live > trim.limit:
            break
        removed += live
        reach = node_end
    if reach >= end:
        return exact
    # Never past offset ``reach``.
    if trim.strategy == "MAXLEN":
        exact.maxlen = max(trim.maxlen, stream.live_between(reach, end))
    else:
        exact.minid = min(tuple(trim.minid), tuple(log.entry_id(reach)))
    return exact


class _References:
    """What one partition's groups still need, for one operation:
    ``needed(id)`` is true while any group has the ID pending or may still
    deliver it (above the lowest last-delivered-id). ``released`` IDs count
    as acknowledged by the group ``releasing`` (XACKDEL's own acks)."""

    __slots__ = ("groups", "min_last_id", "releasing", "released")

    def __init__(self, store: GroupStore) -> None:
        self.groups = list(store.groups.values())
        self.min_last_id = min((g.last_id for g in self.groups), default=None)
        self.releasing: Any = None
        self.released: set = set()

    def needed(self, sid: StreamIdT) -> bool:
        if self.min_last_id is None:
            return False
        if sid > self.min_last_id:
            return True
        for g in self.groups:
            if sid in g.pel and not (g is self.releasing and sid in self.released):
                return True
        return False

    def first_needed_offset(self, stream: Any) -> int | None:
        """The offset of the first live entry a group needs (None: none)."""
        if self.min_last_id is None:
            return None
        log = stream.log
        found: list[int] = []
        for g in self.groups:
            for sid in g.pel.ids_from(ZERO_ID):
                offset = _live_offset(stream, sid)
                if offset is not None:  # (dangling references of deleted entries need nothing)
                    found.append(offset)
                    break
        last = self.min_last_id
        after = log.read(log.find_offset(last[0], last[1], inclusive=False), log.log_end_offset,
                         max_count=1, with_ids=True)
        if after.count:
            found.append(after.entries[0][0])
        return min(found) if found else None


class ReferenceOps:
    """The reference-minding deletions of ``cluster.broker.Session`` (a mixin)."""

    __slots__ = ()

    # The Session provides these.
    broker: Any
    commit_deferred: Callable[[], None]
    wrote_log: Callable[[Any], None]
    wrote_group: Callable[[Any], None]
    wrote_stream: Callable[[bytes, Any], None]

    # -- XDELEX ------------------------------------------------------------

    def delete_each(self, key: bytes, ids: Sequence[StreamIdT], policy: str = KEEPREF) -> list[int]:
        """XDELEX: per ID in order, ``DELETED``, ``NOT_FOUND`` (not in the
        stream, or named before in ``ids``) or, with ``ACKED``, ``REFERENCED``.
        ``DELREF`` also drops the IDs from every group's PEL, those of
        entries no longer in the stream included."""
        self.commit_deferred()
        stream = self.broker.topics.get(key)
        if stream is None:
            return [NOT_FOUND] * len(ids)
        store = groups_of(stream) if policy != KEEPREF else None
        refs = _References(store) if policy == ACKED else None
        results: list[int] = []
        doomed: list[StreamIdT] = []
        seen: set = set()
        for sid in ids:
            sid = tuple(sid)
            if sid in seen or _live_offset(stream, sid) is None:
                results.append(NOT_FOUND)
                continue
            if refs is not None and refs.needed(sid):
                results.append(REFERENCED)
                continue
            seen.add(sid)
            doomed.append(sid)
            results.append(DELETED)
        self._delete(key, stream, doomed)
        if policy == DELREF:
            self._drop_references(key, store, [tuple(sid) for sid in ids])
        return results

    # -- XACKDEL -----------------------------------------------------------

    def ack_delete(self, key: bytes, name: bytes, ids: Sequence[StreamIdT], policy: str = KEEPREF) -> list[int]:
        """XACKDEL: per ID in order, ``NOT_FOUND`` when group ``name`` does
        not have it pending (or the key or the group does not exist; a
        repeated ID is no longer pending), else it is acknowledged and
        then deleted from the stream by ``policy``: ``DELETED`` (also when
        it was gone already), or with ``ACKED`` ``REFERENCED`` while another
        group still needs it."""
        self.commit_deferred()
        stream = self.broker.topics.get(key)
        if stream is None:
            return [NOT_FOUND] * len(ids)
        store = groups_of(stream)
        group = store.group(name)
        if group is None:
            return [NOT_FOUND] * len(ids)
        refs = _References(store)
        refs.releasing = group
        acked: list[StreamIdT] = []
        results: list[int] = []
        doomed: list[StreamIdT] = []
        for sid in ids:
            sid = tuple(sid)
            if sid not in group.pel or sid in refs.released:
                results.append(NOT_FOUND)
                continue
            refs.released.add(sid)
            acked.append(sid)
            if policy == ACKED and refs.needed(sid):
                results.append(REFERENCED)
                continue
            results.append(DELETED)
            if _live_offset(stream, sid) is not None:
                doomed.append(sid)
        self._delete(key, stream, doomed)  # markers before the group records (module docstring)
        if acked:
            store.ack(name, acked)
            self.wrote_group(store)
        if policy == DELREF:
            self._drop_references(key, store, doomed)
        return results

    # -- trims -------------------------------------------------------------

    def apply_trim(self, key: bytes, stream: Any, trim: Any) -> int:
        """Apply ``trim`` (``cluster.broker.Trim``) to partition ``stream``
        of ``key`` with its reference policy; entries removed. The caller
        notes the log write; group changes are noted here."""
        if trim.policy == KEEPREF:
            return trim.apply(stream)
        store = groups_of(stream)
        if trim.policy == ACKED and store.groups:
            return self._trim_acked(stream, store, trim)
        # DELREF, or ACKED with no group to mind: every entry the trim reaches goes.
        if trim.approx:
            trim = _exact_within_limit(stream, trim)
        if not store.groups:
            return trim.apply(stream)
        return self._trim_dropping_references(key, stream, store, trim)

    def _trim_dropping_references(self, key: bytes, stream: Any, store: GroupStore, trim: Any) -> int:
        """DELREF: the PEL references of the entries the trim removes go
        too (those of entries deleted before are left, as Redis leaves them)."""
        log = stream.log
        start, end = log.log_start_offset, log.log_end_offset
        if start >= end:
            return trim.apply(stream)
        # The entries a trim may remove lie below ``bound`` (an ID, exclusive):
        # MINID's threshold; for MAXLEN the last ``maxlen`` offsets stay.
        if trim.strategy == "MINID":
            bound = tuple(trim.minid)
        elif trim.maxlen and end - trim.maxlen > start:
            bound = tuple(log.entry_id(end - trim.maxlen))
        elif trim.maxlen:
            return 0  # fewer than maxlen offsets: nothing to trim
        else:
            bound = None
        first = tuple(log.entry_id(start))
        candidates: dict[bytes, list[StreamIdT]] = {}
        for g in store.groups.values():
            live = [sid for sid in g.pel.ids_from(first) if (bound is None or sid < bound)
                    and _live_offset(stream, sid) is not None]
            if live:
                candidates[g.name] = live
        removed = trim.apply(stream)
        if not removed or not candidates:
            return removed
        new_start = log.log_start_offset
        kept_from = tuple(log.entry_id(new_start)) if new_start < log.log_end_offset else None
        changed = False
        for name, live in candidates.items():
            gone = [sid for sid in live if kept_from is None or sid < kept_from]
            if gone:
                store.drop_pending(name, gone)
                changed = True
        if changed:
            self.wrote_group(store)
            self.broker.keys.signal(key)
        return removed

    def _trim_acked(self, stream: Any, store: GroupStore, trim: Any) -> int:
        """ACKED: the trim removes only entries no group needs. The ones
        before the first needed entry go as a plain trim (the log start
        moves; ``~``: by whole nodes); the trim then deletes the deletable
        entries after them, oldest first, until its target is met (markers
        that, as a trim's, leave max-deleted-entry-id alone). A ``~`` trim
        does so too, as Redis 8.6's ``streamTrim`` goes on entry by entry
        past a node it cannot drop whole unless the policy is KEEPREF; its
        LIMIT counts by nodes, as there: it stops before the first node
        whose live entries would take it past the limit."""
        refs = _References(store)
        cut = refs.first_needed_offset(stream)
        if cut is None:
            return trim.apply(stream)
        log = stream.log
        # The prefix: the same trim (``~``: by the same nodes), told never to
        # pass ``cut`` (MAXLEN keeps at least the live entries from ``cut``
        # on; MINID stops at its ID).
        prefix = trim.__class__(trim.strategy, trim.approx,
                                maxlen=max(trim.maxlen, stream.live_between(cut, log.log_end_offset)),
                                minid=min(tuple(trim.minid), tuple(log.entry_id(cut))), limit=trim.limit,
                                node_entries=trim.node_entries)
        removed = prefix.apply(stream)
        node_size = _node_size(trim)
        limit = trim.limit if trim.approx else 0
        node = -1  # the node (offsets [node * node_size, (node + 1) * node_size)) the walk is in
        doomed: list[StreamIdT] = []
        # MAXLEN: this many more; MINID: every deletable one below the threshold.
        wanted = stream.length - trim.maxlen if trim.strategy == "MAXLEN" else None
        # Past the lowest last-delivered-id every entry is needed.
        stop = refs.min_last_id if wanted is not None else min(refs.min_last_id, tuple(trim.minid))
        inclusive = wanted is not None or tuple(trim.minid) > refs.min_last_id  # MINID keeps its threshold
        pos, end = log.log_start_offset, log.log_end_offset
        walking = wanted is None or wanted > 0
        while walking and pos < end:
            batch = log.read(pos, end, max_count=_WALK_BATCH, with_ids=True)
            if not batch.count:
                break
            for offset, ms, seq in batch.entries:
                sid = (ms, seq)
                if sid > stop or (sid == stop and not inclusive):
                    walking = False
                    break
                if limit and offset // node_size != node:
                    node = offset // node_size
                    node_live = stream.live_between(offset, min((node + 1) * node_size, end))
                    if removed + len(doomed) + node_live > limit:
                        walking = False
                        break
                if refs.needed(sid):
                    continue
                doomed.append(sid)
                if wanted is not None and len(doomed) == wanted:
                    walking = False
                    break
            pos = batch.next_offset
        if doomed:
            removed += len(stream.delete_ids([StreamId(*sid) for sid in doomed], trimmed=True))
        return removed

    # -- helpers -----------------------------------------------------------

    def _delete(self, key: bytes, stream: Any, ids: list[StreamIdT]) -> None:
        if not ids:
            return
        deleted = stream.delete_ids([StreamId(*sid) for sid in ids])
        assert len(deleted) == len(ids), (deleted, ids)
        self.wrote_stream(key, stream)

    def _drop_references(self, key: bytes, store: GroupStore, ids: list[StreamIdT]) -> None:
        """Remove ``ids`` from every group's PEL (DELREF)."""
        changed = False
        for g in store.sorted_groups():
            present = [sid for sid in dict.fromkeys(ids) if sid in g.pel]
            if present:
                store.drop_pending(g.name, present)
                changed = True
        if changed:
            self.wrote_group(store)
            self.broker.keys.signal(key)
