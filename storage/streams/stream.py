"""A Redis stream on one partition log.

Owns: what makes a ``PartitionLog`` behave as a Redis stream:

- encoding an entry once, at XADD, in the stored entry format
  (``storage.entry_codec``: stream-v1, the form it is sent in); reads
  return stored bytes;
- ID generation (``*`` and ``<ms>-*``) from the wall clock, never going
  backwards within the partition, and the "equal or smaller" checks on
  explicit IDs (redis ``t_stream.c::streamAppendItem``);
- XDEL (the log's deletion markers), XTRIM / MAXLEN / MINID (moving the log
  start offset; ``~`` at the boundaries of Redis's nodes of
  ``stream-node-max-entries`` entries, ``_trim_nodes``), XSETID;
- the stream metadata Redis exposes and the log does not know, kept in a
  small per-partition file (see ``StreamMeta``).

How Redis's counters map onto the log:

=========================  =================================================
``length``                 ``log.live_count`` (entries neither trimmed nor
                           deleted)
``entries-added``          ``log_end_offset + entries_added_adjust`` (the
                           adjustment is 0 unless XSETID ENTRIESADDED set it)
``last-generated-id``      max(persisted value, ``log.last_id``): XADD needs
                           no metadata write; XSETID and XDEL of the top
                           entry do. After an XSETID below the log's last
                           ID (its entries trimmed or deleted), the XSETID's
                           value until the next append
``max-deleted-entry-id``   persisted; raised by XDEL, set by XSETID (Redis
                           does not raise it on trims, nor do we)
``recorded-first-entry-id`` the first live entry's ID, ``0-0`` when empty
                           (what Redis's ``first_id`` always equals)
``idmp-duration``,         persisted (XCFGSET), else the server's defaults
``idmp-maxsize``           (``idmp_defaults``); with the offset at which
                           XCFGSET last forgot the idempotent ids. The ids
                           themselves are the log's producer-state table
                           (``storage.producers``), written with the entries
=========================  =================================================

Metadata file format: ``stream.meta`` (JSON, written atomically: tmp, fsync,
rename, fsync of the directory)::

    {"version": 1, "last_generated_id": [ms, seq],
     "max_deleted_entry_id": [ms, seq], "entries_added_adjust": n,
     "idmp": [duration_s, maxsize, cleared_at],    (only once XCFGSET set it)
     "set_below_log": [ms, seq]}         (only after an XSETID below the log's last ID)

Known difference from Redis: trimmed and deleted entries keep their IDs in
the log, whose IDs only increase, so after an XSETID below them (accepted
as in Redis) an explicit XADD ID between the new last ID and the highest ID
the log holds is refused with Redis's "equal or smaller" error
(``id_floor``), where Redis accepts it.

Thread contract: as ``PartitionLog``, one thread.

Must not know: sockets, RESP parsing, trio, the server's errors or the
cluster's topics, any client's error texts. Refusals are ``StreamError``
with a code (the constants below).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

from storage.checkpoint import parse_json, read_file, write_atomic
from storage.entry_codec import encode_entry, encode_pair, split_entries
from storage.errors import Refusal
from storage.records import ProducerRecord
from storage.streams.ids import MAX_ID, MIN_ID, UINT64_MAX, StreamId

META_FILE_NAME = "stream.meta"

# XCFGSET's bounds and Redis 8.6's defaults (``stream-idmp-duration``,
# ``stream-idmp-maxsize``).
IDMP_DURATION_MAX_S = 86400
IDMP_MAXSIZE_MAX = 10000
IDMP_DEFAULTS = (100, 100)

# Why an append or XSETID is refused (``StreamError.code``); the texts
# clients see are the front-end's (Redis's t_stream.c ones: server/failures.py).
ID_ZERO = "id-zero"  # an explicit ID of 0-0
ID_TOO_SMALL = "id-too-small"  # an explicit ID not above the stream's last ID
SEQ_EXHAUSTED = "seq-exhausted"  # ``<ms>-*`` after ``<ms>-<max seq>``
ID_EXHAUSTED = "id-exhausted"  # the last ID was max-max
SETID_BELOW_TOP = "setid-below-top"  # XSETID below the top entry's ID
SETID_ENTRIES_ADDED_BELOW_LENGTH = "setid-entries-added-below-length"
SETID_BELOW_MAX_DELETED = "setid-below-max-deleted"  # XSETID below the current max-deleted-entry-id (7.2+)

# Redis's default ``stream-node-max-entries``: the node size of ``~`` trims
# (``Stream._trim_nodes``) when none is given, and when it is 0.
DEFAULT_NODE_ENTRIES = 100


class StreamError(Refusal):
    """A stream operation refused; ``code`` is one of the constants above."""


_new_id = tuple.__new__  # StreamId(ms, seq) without the namedtuple's Python-level __new__


@dataclass
class StreamMeta:
    """What Redis keeps per stream and the log cannot derive."""

    last_generated_id: StreamId = MIN_ID
    max_deleted_entry_id: StreamId = MIN_ID
    entries_added_adjust: int = 0
    # XCFGSET (Redis 8.6): IDMP-DURATION and IDMP-MAXSIZE (None: the server's
    # defaults) and the log offset at which the idempotent ids were last
    # forgotten (records of batches below it do not count).
    idmp_duration_s: int | None = None
    idmp_maxsize: int | None = None
    idmp_cleared_at: int = 0
    # The log's last ID when XSETID set ``last_generated_id`` below it (None
    # otherwise): while the log's last ID is still that one, Redis's
    # last-generated-id is ``last_generated_id`` (``Stream.last_id``).
    set_below_log: StreamId | None = None

    def to_bytes(self) -> bytes:
        obj = {
            "version": 1,
            "last_generated_id": list(self.last_generated_id),
            "max_deleted_entry_id": list(self.max_deleted_entry_id),
            "entries_added_adjust": self.entries_added_adjust,
        }
        if self.idmp_duration_s is not None or self.idmp_maxsize is not None or self.idmp_cleared_at:
            obj["idmp"] = [self.idmp_duration_s, self.idmp_maxsize, self.idmp_cleared_at]
        if self.set_below_log is not None:
            obj["set_below_log"] = list(self.set_below_log)
        return json.dumps(obj, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> StreamMeta:
        """Raises ValueError (or KeyError, TypeError) for a file that does not
        parse or holds a number out of range (IDs are two u64, the
        adjustment a signed 64-bit number): nothing unbounded is used."""
        obj = parse_json(data)
        adjust = obj["entries_added_adjust"]
        if type(adjust) is not int or not -(2**63) <= adjust < 2**63:
            raise ValueError(f"entries_added_adjust {adjust!r} out of range")
        duration, maxsize, cleared_at = obj.get("idmp", (None, None, 0))
        if not (_optional_in(duration, 1, IDMP_DURATION_MAX_S) and _optional_in(maxsize, 1, IDMP_MAXSIZE_MAX)
                and type(cleared_at) is int and 0 <= cleared_at < 2**63):
            raise ValueError(f"idmp {obj.get('idmp')!r} out of range")
        below = obj.get("set_below_log")
        return cls(
            last_generated_id=_stored_id(obj["last_generated_id"]),
            max_deleted_entry_id=_stored_id(obj["max_deleted_entry_id"]),
            entries_added_adjust=adjust,
            idmp_duration_s=duration,
            idmp_maxsize=maxsize,
            idmp_cleared_at=cleared_at,
            set_below_log=None if below is None else _stored_id(below),
        )


def _optional_in(value, lo: int, hi: int) -> bool:
    return value is None or (type(value) is int and lo <= value <= hi)


def _stored_id(value) -> StreamId:
    if not (type(value) is list and len(value) == 2
            and all(type(v) is int and 0 <= v <= UINT64_MAX for v in value)):
        raise ValueError(f"stream ID {value!r} out of range")
    return StreamId(*value)


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(slots=True)
class Entries:
    """Encoded entries ready to follow ``*<count>``: what XRANGE/XREAD send.
    Read with ``view=True`` the chunks may be views of a segment file's
    mapping: send them at once or copy them (a log cut back later must never
    be read through them).

    Never changed once made (``EMPTY`` is shared), but not a frozen
    dataclass: every XREAD makes one, and a frozen one's construction costs
    2.5x (0.32 against 0.13 µs: bench/RESULTS.md "XREAD: the per-call
    Python")."""

    count: int
    chunks: list


EMPTY = Entries(0, [])


class Stream:
    """A Redis stream stored in one ``PartitionLog``.

    Args:
        log: the partition log (``storage.log.PartitionLog`` contract).
        meta_path: where this partition's ``stream.meta`` lives.
        clock_ms: wall clock in ms (tests pass a fake).
    """

    def __init__(
        self,
        log,
        meta_path: Path,
        *,
        clock_ms: Callable[[], int] = wall_clock_ms,
        idmp_defaults: tuple[int, int] = IDMP_DEFAULTS,
    ) -> None:
        self.log = log
        self.meta_path = Path(meta_path)
        self.clock_ms = clock_ms
        self.idmp_defaults = idmp_defaults  # (duration s, maxsize) where XCFGSET set none
        self.meta = StreamMeta()
        stored = read_file(self.meta_path)
        if stored is not None:
            try:
                self.meta = StreamMeta.from_bytes(stored)
            except (ValueError, KeyError, TypeError) as exc:
                # Damaged on disk (it is replaced atomically, so a crash
                # cannot do this). Everything in it is a refinement of what
                # the log knows: rebuild conservatively rather than refuse
                # the stream. IDs stay increasing (the log's last ID);
                # max-deleted-entry-id = last ID makes lag "unknown" rather
                # than wrong; an XSETID ENTRIESADDED adjustment is lost.
                last = StreamId(*log.last_id)
                self.meta = StreamMeta(last_generated_id=last, max_deleted_entry_id=last)
                logging.getLogger("partita.storage").warning(
                    "%s: corrupt stream metadata (%s): rebuilt from the log (last-generated-id %s, "
                    "max-deleted-entry-id %s, entries-added %d)",
                    self.meta_path, exc, last, last, log.log_end_offset)
        self._stored_meta = StreamMeta(**vars(self.meta))
        self.configure_producers()
        # Deferred appends (``add(..., defer=True)``): entries with IDs
        # assigned, not yet in the log; ``commit()`` writes them as one batch.
        self._pending: list[tuple[int, int, bytes]] = []
        self.pending_bytes = 0
        self._pending_last = MIN_ID
        # The epoch new batches carry (replication sets it when this replica
        # leads; 0 on a single node).
        self.leader_epoch = max(0, getattr(log, "latest_epoch", 0))
        self.changes = 0  # metadata writes, deletions and trims since open (replication)
        # Called when an append fails before any append to this stream
        # succeeded (cleared by the first that does): the topic registry
        # removes a topic that the refused XADD itself created, so an error
        # reply leaves no key behind, as in Redis.
        self.on_first_append_refused: Callable[[], None] | None = None

    # ----------------------------------------------------------------- state

    @property
    def length(self) -> int:
        return self.log.live_count

    @property
    def last_id(self) -> StreamId:
        """Redis's ``last-generated-id`` (counting deferred entries)."""
        if self._pending:
            return self._pending_last
        meta = self.meta
        log_last = self.log.last_id
        if meta.set_below_log is not None and meta.set_below_log == tuple(log_last):
            return meta.last_generated_id  # XSETID went below IDs the log still holds
        return max(meta.last_generated_id, StreamId(*log_last))

    @property
    def id_floor(self) -> StreamId:
        """What a new entry's ID must exceed: ``last_id``, or, after an XSETID
        below IDs of entries trimmed or deleted but still in the log (they
        keep their offsets), the log's last ID (IDs increase along a log)."""
        if self._pending:
            return self._pending_last
        return max(self.meta.last_generated_id, StreamId(*self.log.last_id))

    @property
    def pending(self) -> bool:
        """True while deferred entries wait for ``commit()``."""
        return bool(self._pending)

    @property
    def max_deleted_entry_id(self) -> StreamId:
        return self.meta.max_deleted_entry_id

    @property
    def entries_added(self) -> int:
        return self.log.log_end_offset + self.meta.entries_added_adjust

    def committed_counters(self) -> tuple[int, StreamId, int]:
        """``(length, last-generated-id, entries-added)`` of the entries below
        the log's high watermark only (a follower copy's committed view;
        ``length`` and the others count every entry the log holds). The
        stream metadata (XSETID's last ID, deletions) counts as it stands:
        it is not in the log, except that a last-generated-id it holds at or
        past the first entry above the high watermark (written after that
        entry: XDEL, XSETID) gives way to the last committed entry's ID.
        After trims up to the high watermark the last committed ID is gone
        with its entry: 0-0 then, unless the metadata has a smaller one."""
        log = self.log
        hw = log.high_watermark
        if hw >= log.log_end_offset:
            return self.length, self.last_id, self.entries_added
        meta = self.meta
        last = StreamId(*log.entry_id(hw - 1)) if hw > log.log_start_offset else MIN_ID
        if meta.last_generated_id < StreamId(*log.entry_id(hw)):
            last = max(last, meta.last_generated_id)
        return self._live_between(log.log_start_offset, hw), last, hw + meta.entries_added_adjust

    def first_entry_id(self) -> StreamId:
        """Redis's ``recorded-first-entry-id``: the first live ID, or 0-0."""
        found = self._first_entries(1)
        return found[0][1] if found else MIN_ID

    def last_live_id(self) -> StreamId | None:
        """The ID of the newest entry not deleted (Redis ``streamLastValidID``)."""
        log = self.log
        if log.live_count == 0:
            return None
        res = log.read_reverse(log.log_start_offset, log.log_end_offset, max_count=1, with_ids=True)
        if not res.entries:
            return None
        _, ms, seq = res.entries[0]
        return StreamId(ms, seq)

    def _first_entries(self, n: int) -> list[tuple[int, StreamId, bytes]]:
        log = self.log
        if log.live_count == 0:
            return []
        res = log.read(log.log_start_offset, log.log_end_offset, max_count=n, with_ids=True)
        encoded = split_entries(res.chunks)
        return [(off, StreamId(ms, seq), enc) for (off, ms, seq), enc in zip(res.entries, encoded)]

    def first_entry(self) -> bytes | None:
        found = self._first_entries(1)
        return found[0][2] if found else None

    def last_entry(self) -> bytes | None:
        log = self.log
        if log.live_count == 0:
            return None
        res = log.read_reverse(log.log_start_offset, log.log_end_offset, max_count=1)
        return b"".join(bytes(c) for c in res.chunks) if res.count else None

    # ---------------------------------------------------------------- writes

    def next_id(self, ms_given: int | None = None, id_given: StreamId | None = None) -> StreamId:
        """The ID XADD would use (redis ``streamAppendItem``); raises StreamError.

        ``id_given`` is an explicit full ID; ``ms_given`` is the ``<ms>-*`` form;
        neither means ``*``. The ID is Redis's, from ``last_id``; one not above
        ``id_floor`` is refused (``*``: the next ID above it).
        """
        last = self.last_id
        floor = self.id_floor
        if floor == MAX_ID:
            raise StreamError(ID_EXHAUSTED)
        if id_given is not None:
            new = StreamId(*id_given)
            if new == MIN_ID:
                raise StreamError(ID_ZERO)
        elif ms_given is not None:
            if ms_given == last.ms:
                if last.seq == UINT64_MAX:
                    raise StreamError(SEQ_EXHAUSTED)
                new = StreamId(last.ms, last.seq + 1)
            else:
                new = StreamId(ms_given, 0)
        else:
            now_ms = self.clock_ms()
            new = StreamId(now_ms, 0) if now_ms > floor.ms else floor.incr()
        if new <= floor:
            raise StreamError(ID_TOO_SMALL)
        return new

    def add(
        self,
        fields: Sequence[bytes],
        *,
        ms_given: int | None = None,
        id_given: StreamId | None = None,
        defer: bool = False,
        producer: ProducerRecord | None = None,
    ) -> StreamId:
        """XADD one entry; returns its ID. Raises StreamError.

        ``producer``: the record of an idempotent append (XADD IDMP), written
        in the entry's batch (never deferred).

        Without ``defer`` the entry is one log batch, written now (after any
        deferred entries). With ``defer`` the ID is assigned now and the
        entry waits in memory until ``commit()``, which writes every
        deferred entry as ONE batch (one header, CRC and write for a whole
        pipeline). The caller must commit before anything reads this stream
        or its log and before acknowledging the entry, and bounds the
        memory (``pending_bytes``); until then only ``add`` and ``last_id``
        see deferred entries.
        """
        if ms_given is None and id_given is None:
            # ``*``: ``next_id`` inlined (the hot XADD path).
            ms, seq = self.id_floor
            now_ms = self.clock_ms()
            if now_ms > ms:
                new = _new_id(StreamId, (now_ms, 0))
            elif seq != UINT64_MAX:
                new = _new_id(StreamId, (ms, seq + 1))
            elif ms != UINT64_MAX:
                new = _new_id(StreamId, (ms + 1, 0))
            else:
                raise StreamError(ID_EXHAUSTED)
        else:
            new = self.next_id(ms_given, id_given)
        if len(fields) == 2:
            enc = encode_pair(new, fields[0], fields[1])
        else:
            enc = encode_entry(new, fields)
        if defer:
            self._pending.append((new[0], new[1], enc))
            self._pending_last = new
            self.pending_bytes += len(enc) + 20  # with its ID and end table entries
            return new
        if self._pending:
            self.commit()
        self._append([(new[0], new[1], enc)], (producer,) if producer is not None else ())
        return new

    def append_encoded(self, entries: list[tuple[int, int, bytes]], producer: ProducerRecord | None = None) -> None:
        """Entries encoded elsewhere (the Kafka front-end's records), appended
        now as one log batch after any deferred ones: ``(ms, seq, encoding)``
        with increasing IDs above ``id_floor``; ``producer``: the record of
        an idempotent producer's batch, covering them all. Raises StreamError
        (ID_TOO_SMALL) when the first ID is not above ``id_floor``."""
        assert entries
        if self._pending:
            self.commit()
        first = entries[0]
        if (first[0], first[1]) <= self.id_floor:
            raise StreamError(ID_TOO_SMALL)
        self._append(entries, (producer,) if producer is not None else ())

    def _append(self, batch: list[tuple[int, int, bytes]], producers: tuple = ()) -> None:
        """One log batch (``add`` and ``commit``); see ``on_first_append_refused``."""
        try:
            if producers:
                self.log.append(batch, self.leader_epoch, producers)
            else:
                self.log.append(batch, self.leader_epoch)
        except Exception:
            if self.on_first_append_refused is not None:
                self.on_first_append_refused()
            raise
        if self.on_first_append_refused is not None:
            self.on_first_append_refused = None

    def defer_encoded(self, entries: list, last: tuple[int, int], nbytes: int) -> None:
        """Deferred entries made elsewhere (the server's pipelined-XADD path):
        ``entries`` are ``(ms, seq, encoding)`` with increasing IDs above
        ``last_id``, ``last`` the last of them, ``nbytes`` what they count
        against ``pending_bytes``. Then as ``add(..., defer=True)`` each."""
        if not entries:
            return
        first = entries[0]
        if (first[0], first[1]) <= self.id_floor or (last[0], last[1]) != entries[-1][:2]:
            raise StreamError(ID_TOO_SMALL)
        self._pending += entries
        self._pending_last = _new_id(StreamId, (last[0], last[1]))
        self.pending_bytes += nbytes

    def commit(self) -> int:
        """Write the deferred entries as one log batch; returns how many.

        On failure (a ``StorageError``) the deferred entries are dropped, as
        a failed immediate append writes nothing: the caller must then not
        acknowledge them.
        """
        pending = self._pending
        if not pending:
            return 0
        self._pending = []
        self.pending_bytes = 0
        self._append(pending)
        return len(pending)

    def delete(self, ids: Iterable[StreamId]) -> int:
        """XDEL: mark the entries with these IDs deleted; returns how many were live."""
        return len(self.delete_ids(ids))

    def delete_ids(self, ids: Iterable[StreamId], *, trimmed: bool = False) -> set[StreamId]:
        """Mark the entries with these IDs deleted; the IDs of those that
        were live (each once). ``trimmed``: a trim removes them (XTRIM's
        ACKED policy deletes entries between ones it keeps), which, as in
        Redis, leaves ``max-deleted-entry-id`` as it is."""
        log = self.log
        offsets: dict[int, StreamId] = {}
        for stream_id in ids:
            offset = log.find_offset(stream_id[0], stream_id[1], inclusive=True)
            if offset >= log.log_end_offset or offset in offsets:
                continue
            if tuple(log.entry_id(offset)) != tuple(stream_id):
                continue
            if log.entry_at(offset) is None:
                continue  # already deleted
            offsets[offset] = StreamId(*stream_id)
        if not offsets:
            return set()
        last_before = self.last_id
        marked = log.delete_entries(sorted(offsets))
        assert marked == len(offsets), (marked, len(offsets))
        top = max(offsets.values())
        if top > self.meta.max_deleted_entry_id and not trimmed:
            self.meta.max_deleted_entry_id = top
        self.meta.last_generated_id = max(self.meta.last_generated_id, last_before)
        self._save_meta()
        return set(offsets.values())

    def set_id(
        self,
        new_last: StreamId,
        *,
        entries_added: int | None = None,
        max_deleted_entry_id: StreamId | None = None,
    ) -> None:
        """XSETID after argument checks (``max_deleted <= new_last`` checked by
        the caller), with Redis 7.2's checks in its order: not below the
        current max-deleted-entry-id; with live entries, not below the top
        live entry and ENTRIESADDED not below the length. Trimmed entries
        do not count (XSETID on a stream trimmed empty may go below their
        IDs: ``last_id``, ``id_floor``)."""
        meta = self.meta
        if new_last < meta.max_deleted_entry_id:
            raise StreamError(SETID_BELOW_MAX_DELETED)
        if self.length > 0:
            top = self.last_live_id()
            if top is not None and new_last < top:
                raise StreamError(SETID_BELOW_TOP)
            if entries_added is not None and self.length > entries_added:
                raise StreamError(SETID_ENTRIES_ADDED_BELOW_LENGTH)
        log_last = StreamId(*self.log.last_id)
        meta.last_generated_id = new_last
        meta.set_below_log = log_last if new_last < log_last else None
        if entries_added is not None:
            meta.entries_added_adjust = entries_added - self.log.log_end_offset
        if max_deleted_entry_id is not None and max_deleted_entry_id != MIN_ID:
            meta.max_deleted_entry_id = max_deleted_entry_id
        self._save_meta()

    # ------------------------------------------------------------------ trim

    def trim_maxlen(self, maxlen: int, *, approx: bool = False, limit: int = 0,
                    node_entries: int = DEFAULT_NODE_ENTRIES) -> int:
        """Keep ``maxlen`` live entries; returns entries removed. ``approx``
        (``~``): whole nodes of ``node_entries`` only, at most ``limit``
        entries removed when ``limit`` > 0 (see ``_trim_nodes``)."""
        if self.length <= maxlen:
            return 0
        log = self.log
        start, end = log.log_start_offset, log.log_end_offset
        if approx:
            return self._trim_nodes(lambda nb: self._live_between(nb, end) >= maxlen, limit, node_entries)
        if maxlen == 0:
            new_start = end
        elif log.live_count == end - start:
            new_start = end - maxlen
        elif self._deleted_counter() is not None:
            # The largest start that keeps ``maxlen`` live entries: a bisect
            # over offsets on marker counts, no entry bytes read.
            lo, hi = start, end - maxlen
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if self._live_between(mid, end) >= maxlen:
                    lo = mid
                else:
                    hi = mid - 1
            new_start = lo
        else:
            res = log.read_reverse(start, end, max_count=maxlen, with_ids=True)
            new_start = res.entries[-1][0]
        return self._advance_to(new_start)

    def trim_minid(self, minid: StreamId, *, approx: bool = False, limit: int = 0,
                   node_entries: int = DEFAULT_NODE_ENTRIES) -> int:
        """Remove entries with IDs below ``minid`` (``~``: whole nodes only)."""
        log = self.log
        cut = log.find_offset(minid[0], minid[1], inclusive=True)
        if cut <= log.log_start_offset:
            return 0
        if approx:
            return self._trim_nodes(lambda nb: nb <= cut, limit, node_entries)
        return self._advance_to(cut)

    def _trim_nodes(self, removable: Callable[[int], bool], limit: int, node_entries: int) -> int:
        """Redis's node loop in ``streamTrim`` for ``~``, on logical nodes.

        Redis keeps a stream in nodes of at most ``stream-node-max-entries``
        entries, deleted ones included, and an approximate trim removes
        whole nodes from the head while the next one may go (MAXLEN: the
        entries after it are still enough; MINID: its last ID is below the
        threshold) and ``limit`` live entries are not passed. Here node
        ``k`` is the offsets ``[k * node_entries, (k + 1) * node_entries)``:
        offsets count every entry ever appended, deleted ones included, as
        Redis's nodes do, so the boundaries are where Redis's are for a
        stream built under one node size. ``removable(nb)``: may the log
        start move to node boundary ``nb`` (the entries before it gone).
        It and the limit hold up to some boundary and not after it, so the
        furthest boundary allowed is found by bisection (O(log nodes)
        marker counts, no entry read). Whole segments still go only by
        retention or once the log start passes their end
        (``advance_log_start_offset``)."""
        log = self.log
        start, end = log.log_start_offset, log.log_end_offset
        if start >= end:
            return 0
        size = node_entries if node_entries > 0 else DEFAULT_NODE_ENTRIES
        first = (start // size + 1) * size  # the first node boundary after the log start
        count = -(-(end - first) // size) + 1 if first < end else 1  # boundaries up to ``end``, inclusive

        def boundary(i: int) -> int:
            return min(first + i * size, end)

        def allowed(nb: int) -> bool:
            return removable(nb) and (not limit or self._live_between(start, nb) <= limit)

        lo, hi = -1, count - 1  # the furthest allowed boundary's index (-1: none)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if allowed(boundary(mid)):
                lo = mid
            else:
                hi = mid - 1
        if lo < 0:
            return 0
        return self._advance_to(boundary(lo))

    def node_count(self, node_entries: int = DEFAULT_NODE_ENTRIES) -> int:
        """How many logical nodes (``_trim_nodes``) hold a live entry: XINFO
        STREAM's ``radix-tree-keys`` (Redis frees a node whose entries are
        all deleted)."""
        log = self.log
        start, end = log.log_start_offset, log.log_end_offset
        if log.live_count == 0:
            return 0
        size = node_entries if node_entries > 0 else DEFAULT_NODE_ENTRIES
        nodes = (end - 1) // size - start // size + 1
        if log.live_count == end - start:
            return nodes
        deleted: dict[int, int] = {}
        for offset in log.deleted_offsets():
            deleted[offset // size] = deleted.get(offset // size, 0) + 1
        for node, n in deleted.items():
            if n == min((node + 1) * size, end) - max(node * size, start):
                nodes -= 1
        return nodes

    def live_between(self, start: int, end: int) -> int:
        """Live entries (neither trimmed nor deleted) at offsets ``[start, end)``."""
        return self._live_between(max(start, self.log.log_start_offset), end)

    def _live_between(self, start: int, end: int) -> int:
        log = self.log
        if start >= end:
            return 0
        if log.live_count == log.log_end_offset - log.log_start_offset:
            return end - start  # no deletion markers in the log
        counter = self._deleted_counter()
        if counter is not None:
            return (end - start) - counter(start, end)
        return log.read(start, end).count

    def _deleted_counter(self):
        """``count(lo, hi)`` of deletion markers, when the log exposes them."""
        markers = getattr(self.log, "markers", None)
        return getattr(markers, "count_in", None)

    def _advance_to(self, new_start: int) -> int:
        log = self.log
        if new_start <= log.log_start_offset:
            return 0
        last_before = self.last_id
        live_before = log.live_count
        log.advance_log_start_offset(new_start)
        self.changes += 1
        if StreamId(*log.last_id) < last_before and self.meta.last_generated_id < last_before:
            self.meta.last_generated_id = last_before
            self._save_meta()
        return live_before - log.live_count

    # ----------------------------------------------------------------- reads

    def range(self, start: StreamId, end: StreamId, count: int | None = None,
              *, rev: bool = False, view: bool = False, past_hw: bool = False) -> Entries:
        """Entries with ``start <= id <= end``; newest first when ``rev``.
        ``view``: the chunks may be views of the log file's mapping, to be
        used at once; ``past_hw``: up to the log's end (``PartitionLog.read``;
        oldest first only)."""
        assert not (rev and past_hw)
        if start > end or (count is not None and count <= 0):
            return EMPTY
        log = self.log
        start_offset = max(log.find_offset(start[0], start[1], inclusive=True), log.log_start_offset)
        end_offset = log.find_offset(end[0], end[1], inclusive=False)
        if start_offset >= end_offset:
            return EMPTY
        if rev:
            res = log.read_reverse(start_offset, end_offset, max_count=count)
        else:
            res = log.read(start_offset, end_offset, max_count=count, view=view, past_hw=past_hw)
        return Entries(res.count, res.chunks)

    def read_after(self, after: StreamId, count: int | None = None, *, view: bool = False) -> Entries:
        """Entries with IDs greater than ``after`` (XREAD); ``view`` as for ``range``."""
        res = self.log.read_after_id(after[0], after[1], count, view)
        return Entries(res.count, res.chunks) if res.count else EMPTY

    # ------------------------------------------------------------ idempotence

    def idmp_config(self, meta: StreamMeta | None = None) -> tuple[int, int]:
        """``(IDMP-DURATION s, IDMP-MAXSIZE)``: XCFGSET's (in ``meta``, by
        default this stream's), else the defaults."""
        meta = meta or self.meta
        duration, maxsize = self.idmp_defaults
        return (duration if meta.idmp_duration_s is None else meta.idmp_duration_s,
                maxsize if meta.idmp_maxsize is None else meta.idmp_maxsize)

    def configure_producers(self, meta: StreamMeta | None = None) -> None:
        """Give the log's producer-state table the IDMP settings of ``meta``
        (by default this stream's; a follower gives its leader's before it
        appends the batches that came with them). No I/O: the table loads
        when needed."""
        meta = meta or self.meta
        duration, maxsize = self.idmp_config(meta)
        producers = self.log.producers
        producers.configure(maxsize, duration * 1000)
        producers.clear_ids(meta.idmp_cleared_at)

    def set_idmp_config(self, duration_s: int | None, maxsize: int | None) -> bool:
        """XCFGSET: the values not given stay. When either changes, every
        idempotent id recorded so far is forgotten (Redis 8.6); returns
        whether anything changed."""
        old = self.idmp_config()
        new = (old[0] if duration_s is None else duration_s, old[1] if maxsize is None else maxsize)
        if new == old:
            return False
        if self._pending:
            self.commit()
        self.meta.idmp_duration_s, self.meta.idmp_maxsize = new
        self.meta.idmp_cleared_at = self.log.log_end_offset
        self._save_meta()
        self.configure_producers()
        return True

    # ------------------------------------------------------------- metadata

    def _save_meta(self) -> None:
        self.changes += 1
        if self.meta == self._stored_meta:
            return
        write_atomic(self.meta_path, self.meta.to_bytes())
        self._stored_meta = StreamMeta(**vars(self.meta))
