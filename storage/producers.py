"""The producer-state table of one partition log (Kafka's ``ProducerStateManager``).

Owns: which producers appended to the partition and their recent appends,
the snapshot files that make rebuilding it cheap, and the 16-byte names the
log records them under. A producer is ``(kind, 16 bytes)``:

- kind 1, ``KIND_IDEMPOTENT_ID`` (Redis 8.6's XADD IDMP / IDMPAUTO): the
  producer is the BLAKE2b-128 digest of the producer-id, a record's token
  the digest of the idempotent-id (IDMPAUTO: of the entry's field/value
  pairs, sorted, so their order does not matter). Its window keeps the
  newest ``id_window`` records (IDMP-MAXSIZE), each until ``id_ttl_ms``
  after its append (IDMP-DURATION).
- kind 2, ``KIND_SEQUENCE`` (Kafka's idempotent producer): the producer id
  (i64) padded to 16 bytes, the token the batch's base sequence; the window
  keeps the last ``SEQUENCE_WINDOW`` batches of the producer's current
  epoch; a producer idle for ``SEQUENCE_PRODUCER_EXPIRY_MS`` is forgotten.

Each record says where its entries went: ``Appended(offset, count,
first_id, timestamp_ms)``, the timestamp being the batch's (the leader's
append time, the same on every replica). The table is derived from the
producer records of the log's batches (``storage.records``: the batch
trailer), replayed by the log from a snapshot (``<offset>.producers``, the
table as of that offset, written atomically); docs/storage-format.md
"Producer state" has the file layout and when snapshots are written and
deleted. Deciding what a record means for a new append (a duplicate, an
out-of-order sequence, a fenced epoch) is the broker's
(cluster/broker/producers.py); this module only keeps and finds them.

Also the producer ids a node reserved for Kafka's InitProducerId
(``<data_dir>/producer-ids``: ``read_reserved_producer_ids`` /
``reserve_producer_ids``; which ids the broker makes of them is
cluster/broker/producers.py's).

Loading is lazy: a partition that never had an idempotent append has no
snapshot file and costs nothing; the first call that needs the table loads
the newest snapshot at or below the log end and replays the batches after
it (``replay``, given by the log).

Thread contract: as ``PartitionLog``, one thread.

Must not know: RESP, Kafka bytes, stream semantics, the cluster.
"""

from __future__ import annotations

import hashlib
import logging
import os
import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from crc32c import crc32c

from storage.checkpoint import CorruptCheckpointError, read_file, read_rows, write_atomic, write_rows
from storage.errors import raise_storage_error
from storage.files import base_name
from storage.records import KIND_IDEMPOTENT_ID, KIND_SEQUENCE, ProducerRecord

SNAPSHOT_SUFFIX = ".producers"
SEQUENCE_WINDOW = 5  # Kafka's ProducerStateEntry.NUM_BATCHES_TO_RETAIN
SEQUENCE_PRODUCER_EXPIRY_MS = 24 * 3600 * 1000  # Kafka's producer.id.expiration.ms
SNAPSHOT_EVERY_RECORDS = 10_000
KEEP_NEWEST_SNAPSHOTS = 2  # besides the oldest, which is never deleted (see ``_prune``)
DEFAULT_ID_WINDOW = 100
DEFAULT_ID_TTL_MS = 100_000

_MAGIC = b"PPRODS01"
_HEAD = struct.Struct("<8sQQQQII")  # magic, offset, ids added, ids duplicates, ids cleared at, producers, records
_PRODUCER = struct.Struct("<Bxh16sqI")  # kind, epoch, producer, last append ms, n records
_RECORD = struct.Struct("<16sQI4xQQq")  # token, offset, count, first ms, first seq, append ms
_CRC = struct.Struct("<I")
_SEQ = struct.Struct("<i")
_PID = struct.Struct("<q")
_PAD12 = bytes(12)
_PAD8 = bytes(8)


# -- what clients send -> the 16-byte names the log records --------------------

def _digest(data: bytes, person: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16, person=person).digest()


def idmp_producer(producer_id: bytes) -> bytes:
    """The producer of XADD IDMP / IDMPAUTO ``producer-id``."""
    return _digest(producer_id, b"partita-idmp-pid")


def idmp_token(idempotent_id: bytes) -> bytes:
    """The token of XADD IDMP's ``idempotent-id``."""
    return _digest(idempotent_id, b"partita-idmp-iid")


def idmp_auto_token(fields: Sequence[bytes]) -> bytes:
    """IDMPAUTO's token: a digest of the entry's field/value pairs in any
    order (sorted, each length-prefixed, so no two lists of pairs share one
    encoding)."""
    pairs = sorted((bytes(fields[i]), bytes(fields[i + 1])) for i in range(0, len(fields) - 1, 2))
    h = hashlib.blake2b(digest_size=16, person=b"partita-idmpauto")
    for field, value in pairs:
        h.update(b"%d:%d:" % (len(field), len(value)))
        h.update(field)
        h.update(value)
    return h.digest()


def sequence_producer(producer_id: int) -> bytes:
    """The producer of a Kafka producer id."""
    return _PID.pack(producer_id) + _PAD8


def sequence_token(base_sequence: int) -> bytes:
    """The token of a Kafka batch's base sequence."""
    return _SEQ.pack(base_sequence) + _PAD12


def token_sequence(token: bytes) -> int:
    return _SEQ.unpack_from(token)[0]


# -- the producer ids a node hands out ------------------------------------------

_ID_LIMIT = 2**63 - 1


def read_reserved_producer_ids(path: Path, logger: logging.Logger | None = None) -> int:
    """The end of the producer ids reserved so far at ``path`` (none at or
    above it was handed out); 0 when the file is missing. A damaged file is
    logged and read as 0: the caller must have another floor (the broker's
    is the clock)."""
    try:
        rows = read_rows(path, 1, (_ID_LIMIT,))
    except CorruptCheckpointError as exc:
        (logger or logging.getLogger("partita.storage")).warning(
            "%s: damaged (%s); producer ids continue from the clock", path, exc)
        return 0
    return rows[0][0] if rows else 0


def reserve_producer_ids(path: Path, end: int) -> None:
    """Record durably that producer ids below ``end`` may be handed out
    (before any of them is)."""
    assert 0 <= end <= _ID_LIMIT
    write_rows(path, [(end,)])


# -- the table ---------------------------------------------------------------

class Appended:
    """One record of a producer's window: its entries went to ``offset``
    onwards (``count`` of them), the first with ID ``first_id``, appended
    at ``timestamp_ms``."""

    __slots__ = ("offset", "count", "first_id", "timestamp_ms")

    def __init__(self, offset: int, count: int, first_id: tuple[int, int], timestamp_ms: int) -> None:
        self.offset = offset
        self.count = count
        self.first_id = first_id
        self.timestamp_ms = timestamp_ms

    @property
    def last_offset(self) -> int:
        return self.offset + self.count - 1

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Appended) and (
            self.offset, self.count, self.first_id, self.timestamp_ms) == (
            other.offset, other.count, other.first_id, other.timestamp_ms)

    def __repr__(self) -> str:
        return f"Appended({self.offset}, {self.count}, {self.first_id}, {self.timestamp_ms})"


class Producer:
    """A producer's state: ``epoch`` (kind 2), the time of its last append,
    and its window, token -> ``Appended``, oldest first."""

    __slots__ = ("kind", "key", "epoch", "last_ms", "window")

    def __init__(self, kind: int, key: bytes, epoch: int = 0, last_ms: int = 0) -> None:
        self.kind = kind
        self.key = key
        self.epoch = epoch
        self.last_ms = last_ms
        self.window: dict[bytes, Appended] = {}

    def last(self) -> tuple[bytes, Appended] | None:
        """The newest record (its token and where it went)."""
        if not self.window:
            return None
        token = next(reversed(self.window))
        return token, self.window[token]

    def expire(self, now_ms: int, ttl_ms: int) -> None:
        """Drop the records appended ``ttl_ms`` or longer before ``now_ms``
        (oldest first; appends are in time order, so the scan stops at the
        first live one)."""
        window = self.window
        while window:
            token = next(iter(window))
            if now_ms - window[token].timestamp_ms < ttl_ms:
                return
            del window[token]


# A batch to replay: (base offset, append time, its producer records, the
# first entry ID of each record).
ReplayedBatch = tuple[int, int, Sequence[ProducerRecord], Sequence[tuple[int, int]]]


class ProducerState:
    """The producer-state table of one partition (see the module docstring).

    Args:
        directory: the partition directory (where snapshots live).
        clock_ms: the log's clock (expiry of idempotent ids).
        end_offset: the log end offset, now.
        replay: ``replay(start)`` yields the batches at or after ``start``
            that carry producer records (``ReplayedBatch``), in order.
        snapshots: the offsets of the snapshot files found at open.
    """

    def __init__(self, directory: Path, clock_ms: Callable[[], int], end_offset: Callable[[], int],
                 replay: Callable[[int], Iterator[ReplayedBatch]], snapshots: Iterable[int] = (),
                 logger: logging.Logger | None = None) -> None:
        self.directory = Path(directory)
        self._clock_ms = clock_ms
        self._end_offset = end_offset
        self._replay = replay
        self._snapshots = sorted(snapshots)
        self.logger = logger or logging.getLogger("partita.storage")
        self._loaded = False
        self._producers: dict[tuple[int, bytes], Producer] = {}
        # Set by the stream from its metadata (XCFGSET): the window of a
        # kind-1 producer, how long its records live, and the offset below
        # which kind-1 records are not applied (the last forgetting).
        self.id_window = DEFAULT_ID_WINDOW
        self.id_ttl_ms = DEFAULT_ID_TTL_MS
        self.ids_cleared_at = 0
        self.ids_added = 0  # kind-1 records ever applied (XINFO iids-added)
        self.ids_duplicates = 0  # duplicates answered here (XINFO iids-duplicates)
        self._dirty = False
        self._since_snapshot = 0

    # -- loading ---------------------------------------------------------------

    @property
    def has_history(self) -> bool:
        """Whether a producer record may be in the log (a snapshot exists)."""
        return bool(self._snapshots)

    @property
    def loaded(self) -> bool:
        return self._loaded

    def ensure_loaded(self) -> None:
        if self._loaded:
            return
        self._producers = {}
        if not self._snapshots:
            self._loaded = True
            return  # no snapshot: no batch carries a producer record
        start = None
        for offset in reversed(self._snapshots):
            try:
                self._read_snapshot(offset)
                start = offset
                break
            except ValueError as exc:
                self.logger.warning("%s: ignoring producer snapshot %s (%s); using an older one",
                                    self.directory, self._path(offset).name, exc)
                self._producers = {}
        try:
            for base, ts, recs, first_ids in self._replay(0 if start is None else start):
                self._apply(base, ts, recs, first_ids)
        except BaseException:
            self._producers = {}
            raise
        self._forget_cleared()  # a snapshot older than the last XCFGSET
        self._loaded = True
        self._since_snapshot = 0

    def drop_above(self, offset: int) -> None:
        """Delete the snapshots above ``offset`` (at open: a tail the log lost;
        before ``truncate_to(offset)`` cuts), and forget the table (it is
        reloaded from what is left when next needed)."""
        for off in [o for o in self._snapshots if o > offset]:
            self._delete(off)
        self._loaded = False
        self._producers = {}

    def forget_all(self) -> None:
        """The log was emptied: no snapshot, no producer (the lifetime
        counters stay)."""
        for off in list(self._snapshots):
            self._delete(off)
        self._producers = {}
        self._loaded = True
        self._dirty = False

    # -- appends -------------------------------------------------------------

    def before_records(self, offset: int) -> None:
        """Before a batch with producer records is appended at ``offset``:
        the table is loaded, and a snapshot exists at or below ``offset`` (the
        first one, written now, marks the log as having producer records)."""
        self.ensure_loaded()
        if not self._snapshots:
            self.snapshot(offset)

    def applied(self, base_offset: int, timestamp_ms: int, recs: Sequence[ProducerRecord],
                first_ids: Sequence[tuple[int, int]]) -> None:
        """A batch with producer records was appended at ``base_offset``."""
        assert self._loaded, "before_records first"
        self._apply(base_offset, timestamp_ms, recs, first_ids)

    def _apply(self, base_offset: int, timestamp_ms: int, recs: Sequence[ProducerRecord],
               first_ids: Sequence[tuple[int, int]]) -> None:
        producers = self._producers
        for rec, first_id in zip(recs, first_ids):
            kind = rec.kind
            appended = Appended(base_offset + rec.index, rec.count, first_id, timestamp_ms)
            if kind == KIND_IDEMPOTENT_ID:
                self.ids_added += 1
                if base_offset < self.ids_cleared_at:
                    continue  # forgotten by an XCFGSET after it
            p = producers.get((kind, rec.producer))
            if p is None:
                p = producers[(kind, rec.producer)] = Producer(kind, rec.producer, rec.epoch)
            p.last_ms = max(p.last_ms, timestamp_ms)
            window = p.window
            if kind == KIND_IDEMPOTENT_ID:
                window.pop(rec.token, None)  # an expired id used again: the newest counts
                window[rec.token] = appended
                p.expire(timestamp_ms, self.id_ttl_ms)
                while len(window) > self.id_window:
                    del window[next(iter(window))]
            else:
                if rec.epoch != p.epoch:  # a new epoch starts a new window (Kafka)
                    window.clear()
                    p.epoch = rec.epoch
                window.pop(rec.token, None)
                window[rec.token] = appended
                while len(window) > SEQUENCE_WINDOW:
                    del window[next(iter(window))]
        self._dirty = True
        self._since_snapshot += len(recs)

    def maybe_snapshot(self, offset: int) -> None:
        """After appends up to ``offset``: a snapshot every
        ``SNAPSHOT_EVERY_RECORDS`` records (bounds the replay at start-up)."""
        if self._since_snapshot >= SNAPSHOT_EVERY_RECORDS:
            self.snapshot(offset)

    def on_roll(self, offset: int) -> None:
        """The log rolled at ``offset``: a partition with producer history
        snapshots there (replay at start-up stays within about a segment)."""
        if self._snapshots:
            self.ensure_loaded()
            self.snapshot(offset)

    def on_close(self, offset: int) -> None:
        if self._loaded and self._dirty:
            self.snapshot(offset)

    # -- lookups ---------------------------------------------------------------

    def find_id(self, producer: bytes, token: bytes, now_ms: int | None = None) -> Appended | None:
        """The live record of kind-1 ``producer``'s ``token``, if any, at
        ``now_ms`` (by default the log's clock now)."""
        self.ensure_loaded()
        if now_ms is None:
            now_ms = self._clock_ms()
        p = self._producers.get((KIND_IDEMPOTENT_ID, producer))
        if p is None:
            return None
        p.expire(now_ms, self.id_ttl_ms)
        found = p.window.get(token)
        if not p.window:
            del self._producers[(KIND_IDEMPOTENT_ID, producer)]
        return found

    def sequence_producer(self, producer: bytes) -> Producer | None:
        """Kind-2 ``producer``'s state, if known."""
        self.ensure_loaded()
        return self._producers.get((KIND_SEQUENCE, producer))

    def note_duplicate(self) -> None:
        self.ids_duplicates += 1
        self._dirty = True

    def id_counts(self, now_ms: int | None = None) -> tuple[int, int]:
        """``(producers, ids)`` of kind 1 with live records (XINFO
        pids-tracked, iids-tracked); expired ones are dropped on the way."""
        self.ensure_loaded()
        self._expire(self._clock_ms() if now_ms is None else now_ms)
        pids = iids = 0
        for (kind, _key), p in self._producers.items():
            if kind == KIND_IDEMPOTENT_ID:
                pids += 1
                iids += len(p.window)
        return pids, iids

    def table(self) -> dict[tuple[int, bytes], tuple[int, dict[bytes, Appended]]]:
        """Every producer as ``(kind, producer) -> (epoch, window)`` (copies;
        what replicas compare)."""
        self.ensure_loaded()
        return {key: (p.epoch, dict(p.window)) for key, p in self._producers.items()}

    def producer_count(self, now_ms: int | None = None) -> int:
        """Producers of either kind the table holds."""
        self.ensure_loaded()
        self._expire(self._clock_ms() if now_ms is None else now_ms)
        return len(self._producers)

    def _expire(self, now_ms: int) -> None:
        ttl = self.id_ttl_ms
        gone = []
        for key, p in self._producers.items():
            if p.kind == KIND_IDEMPOTENT_ID:
                p.expire(now_ms, ttl)
                if not p.window:
                    gone.append(key)
            elif now_ms - p.last_ms >= SEQUENCE_PRODUCER_EXPIRY_MS:
                gone.append(key)
        for key in gone:
            del self._producers[key]

    # -- configuration (XCFGSET) -----------------------------------------------

    def configure(self, id_window: int, id_ttl_ms: int) -> None:
        """The kind-1 window and lifetime; a smaller window trims the loaded
        table's windows now."""
        assert id_window > 0 and id_ttl_ms > 0
        shrank = id_window < self.id_window
        self.id_window = id_window
        self.id_ttl_ms = id_ttl_ms
        if shrank and self._loaded:
            for p in self._producers.values():
                if p.kind == KIND_IDEMPOTENT_ID:
                    while len(p.window) > id_window:
                        del p.window[next(iter(p.window))]

    def clear_ids(self, offset: int) -> None:
        """Forget the kind-1 records of batches below ``offset`` (XCFGSET
        forgetting at ``offset``, the log end then), now and whenever such a
        batch is applied later (a follower's)."""
        if offset <= self.ids_cleared_at:
            return
        self.ids_cleared_at = offset
        if self._loaded:  # else loading applies it
            self._forget_cleared()
            self._dirty = True

    def _forget_cleared(self) -> None:
        offset = self.ids_cleared_at
        gone = []
        for key, p in self._producers.items():
            if p.kind != KIND_IDEMPOTENT_ID:
                continue
            for token in [t for t, a in p.window.items() if a.offset < offset]:
                del p.window[token]
            if not p.window:
                gone.append(key)
        for key in gone:
            del self._producers[key]

    # -- snapshots -------------------------------------------------------------

    def _path(self, offset: int) -> Path:
        return self.directory / (base_name(offset) + SNAPSHOT_SUFFIX)

    def snapshot(self, offset: int) -> None:
        """Write the table as of ``offset`` (everything below it applied)."""
        assert self._loaded
        self._expire(self._clock_ms())
        write_atomic(self._path(offset), self.encode(offset))
        if offset not in self._snapshots:
            self._snapshots.append(offset)
            self._snapshots.sort()
        self._dirty = False
        self._since_snapshot = 0
        self._prune()

    def _prune(self) -> None:
        """Keep the oldest snapshot (every producer record lies at or above
        it: its absence means there is none) and the newest few."""
        snaps = self._snapshots
        for off in snaps[1:-KEEP_NEWEST_SNAPSHOTS]:
            self._delete(off)

    def _delete(self, offset: int) -> None:
        try:
            os.unlink(self._path(offset))
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise_storage_error(f"delete {self._path(offset)}", exc)
        self._snapshots.remove(offset)

    def encode(self, offset: int) -> bytes:
        parts = []
        records = 0
        for p in self._producers.values():
            parts.append(_PRODUCER.pack(p.kind, p.epoch, p.key, p.last_ms, len(p.window)))
            for token, a in p.window.items():
                parts.append(_RECORD.pack(token, a.offset, a.count, a.first_id[0], a.first_id[1], a.timestamp_ms))
            records += len(p.window)
        head = _HEAD.pack(_MAGIC, offset, self.ids_added, self.ids_duplicates, self.ids_cleared_at,
                          len(self._producers), records)
        data = b"".join([head, *parts])
        return data + _CRC.pack(crc32c(data))

    def _read_snapshot(self, offset: int) -> None:
        data = read_file(self._path(offset))
        if data is None:
            raise ValueError("missing")
        self.decode(data, offset)

    def decode(self, data: bytes, offset: int) -> None:
        """Load the table from a snapshot's bytes; ValueError when they do
        not hold one taken at ``offset``."""
        if len(data) < _HEAD.size + _CRC.size:
            raise ValueError(f"{len(data)} bytes, too short")
        body, crc = data[:-_CRC.size], _CRC.unpack_from(data, len(data) - _CRC.size)[0]
        if crc32c(body) != crc:
            raise ValueError("CRC mismatch")
        magic, at, added, duplicates, cleared_at, n_producers, n_records = _HEAD.unpack_from(body, 0)
        if magic != _MAGIC or at != offset:
            raise ValueError("not a producer snapshot of this offset")
        if len(body) != _HEAD.size + _PRODUCER.size * n_producers + _RECORD.size * n_records:
            raise ValueError("length does not match its counts")
        producers: dict[tuple[int, bytes], Producer] = {}
        pos = _HEAD.size
        seen = 0
        for _ in range(n_producers):
            kind, epoch, key, last_ms, n = _PRODUCER.unpack_from(body, pos)
            pos += _PRODUCER.size
            if kind not in (KIND_IDEMPOTENT_ID, KIND_SEQUENCE) or (kind, key) in producers:
                raise ValueError(f"bad producer (kind {kind})")
            seen += n
            if seen > n_records:
                raise ValueError("more records than counted")
            p = Producer(kind, key, epoch, last_ms)
            for _ in range(n):
                token, rec_offset, count, ms, seq, ts = _RECORD.unpack_from(body, pos)
                pos += _RECORD.size
                if rec_offset >= offset or count == 0:
                    raise ValueError("a record past the snapshot's offset")
                p.window[token] = Appended(rec_offset, count, (ms, seq), ts)
            producers[(kind, key)] = p
        self._producers = producers
        self.ids_added = added
        self.ids_duplicates = max(self.ids_duplicates, duplicates)
        self.ids_cleared_at = max(self.ids_cleared_at, cleared_at)
