"""Idempotent appends: one deduplication for Redis 8.6's IDMP and Kafka's idempotent producer.

Owns: the decision whether an append is new, a retry of one recorded for its
producer, or refused, and the session operations built on it (``ProducerOps``,
one of ``Session``'s bases):

- XADD ``IDMP producer-id idempotent-id`` / ``IDMPAUTO producer-id``: an
  ``XAddPlan`` with ``idmp`` set reaches ``Session.append``'s non-deferred
  path, which calls ``_append_idempotent``: a pair recorded for the
  partition and still live (IDMP-DURATION, IDMP-MAXSIZE) answers the
  original entry's ID and writes nothing; otherwise the entry is appended
  with its producer record in the same log batch (docs/storage-format.md,
  "Producer records"). A duplicate's reply waits for what the original's
  waits for (the receipt notes the log), so a retry never acknowledges an
  entry before it is durable.
- Kafka's idempotent producer: ``RecordOps.append_records`` (the Kafka
  front-end's one append, cluster/broker/records.py) given a
  ``ProducerBatch`` (producer id, epoch, base sequence) asks
  ``_sequence_check`` for Kafka's verdict (``ProducerStateManager`` /
  ``ProducerAppendInfo``): a batch whose epoch and sequence range match one
  of the producer's last 5 batches is a duplicate (its original offsets are
  answered, nothing is written, the answer waits for the original's
  durability); a lower epoch is fenced; a new epoch must start at sequence
  0; in the same epoch the sequence must follow the last batch's (wrapping
  at 2^31); a producer the partition does not know (never seen, or expired)
  may start anywhere. Refusals raise ``ProducerRefused`` (OUT_OF_ORDER:
  Kafka's OUT_OF_ORDER_SEQUENCE_NUMBER; FENCED: INVALID_PRODUCER_EPOCH). An
  accepted batch is appended as ONE log batch carrying its producer record.
- the producer ids InitProducerId hands out (``new_producer_id``,
  ``ProducerIds``): never the same twice in a cluster, across restarts
  (see ``ProducerIds``).
- XCFGSET (``configure_idempotence``) and XINFO STREAM's idempotence fields
  (``idempotence_of``).

The table itself (producer -> epoch and a window of where its recent appends
went) is the partition log's (``storage.producers``), rebuilt from the log's
batches on recovery and by every follower, so a new leader after a failover
deduplicates a retry of an append it copied.

Must not know: sockets, RESP or Kafka bytes, error texts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, NamedTuple, Sequence

from cluster.topics import partition_key
from storage.producers import (
    idmp_auto_token,
    idmp_producer,
    idmp_token,
    read_reserved_producer_ids,
    reserve_producer_ids,
    sequence_producer,
    sequence_token,
    token_sequence,
)
from storage.records import KIND_IDEMPOTENT_ID, KIND_SEQUENCE, ProducerRecord
from storage.streams.ids import StreamId

# Kafka's verdicts on an idempotent producer's batch (``check_sequence``).
ACCEPTED = "accepted"
DUPLICATE = "duplicate"
OUT_OF_ORDER = "out-of-order"  # Kafka's OUT_OF_ORDER_SEQUENCE_NUMBER
FENCED = "fenced"  # Kafka's INVALID_PRODUCER_EPOCH

_SEQ_MAX = 2**31 - 1

# Producer ids: ``node << PRODUCER_ID_NODE_SHIFT | n`` (``ProducerIds``).
PRODUCER_ID_NODE_SHIFT = 43  # n: 2^43 ms is 278 years of the clock floor
PRODUCER_ID_NODE_MASK = (1 << 20) - 1  # node ids below 2^20 never share a producer id
PRODUCER_ID_BLOCK = 1000  # ids reserved on disk at a time
PRODUCER_ID_CLOCK_ORIGIN_MS = 1_704_067_200_000  # 2024-01-01T00:00:00Z


class Idempotence:
    """XADD's IDMP (``idempotent_id`` given) or IDMPAUTO (None: the entry's
    field/value pairs name it) for ``producer_id``."""

    __slots__ = ("producer_id", "idempotent_id")

    def __init__(self, producer_id: bytes, idempotent_id: bytes | None = None) -> None:
        assert producer_id and idempotent_id != b""
        self.producer_id = producer_id
        self.idempotent_id = idempotent_id


class ProducerBatch(NamedTuple):
    """A Kafka idempotent producer's batch: from ``producer_id`` at
    ``epoch``, its first record with sequence ``base_sequence``."""

    producer_id: int
    epoch: int
    base_sequence: int


class ProducerRefused(Exception):
    """An idempotent producer's batch refused (nothing written): ``outcome``
    is OUT_OF_ORDER or FENCED; the text says what the partition expected."""

    def __init__(self, outcome: str, batch: ProducerBatch, pkey: bytes, known: Any) -> None:
        where = pkey.decode("utf-8", "replace")
        if outcome == FENCED:
            text = (f"producer {batch.producer_id} at epoch {batch.epoch} is fenced on partition {where}: "
                    f"its epoch is {known.epoch}")
        else:
            text = (f"out of order sequence number {batch.base_sequence} for producer {batch.producer_id} at "
                    f"epoch {batch.epoch} on partition {where}: {expected_sequence(known, batch.epoch)} expected")
        super().__init__(text)
        self.outcome = outcome


@dataclass(frozen=True, slots=True)
class IdempotenceInfo:
    """XINFO STREAM's idempotence fields (Redis 8.6)."""

    duration_s: int
    maxsize: int
    pids_tracked: int
    iids_tracked: int
    iids_added: int
    iids_duplicates: int


def next_sequence(last: int) -> int:
    """The sequence after ``last`` (Kafka wraps from 2^31 - 1 to 0)."""
    return 0 if last == _SEQ_MAX else last + 1


def last_sequence(base: int, count: int) -> int:
    """The sequence of the last of ``count`` records from ``base``."""
    return (base + count - 1) % (_SEQ_MAX + 1)


def expected_sequence(producer: Any, epoch: int) -> int:
    """The sequence ``producer`` (known to the table) must send next at ``epoch``."""
    newest = producer.last() if epoch == producer.epoch else None
    if newest is None:
        return 0
    token, appended = newest
    return next_sequence(last_sequence(token_sequence(token), appended.count))


def check_sequence(producer: Any, epoch: int, base_sequence: int, count: int) -> tuple[str, Any]:
    """Kafka's verdict on a batch of ``count`` records from ``base_sequence``
    at ``epoch`` for ``producer`` (the table's ``Producer``, None if
    unknown): ``(outcome, the original's Appended for a DUPLICATE)``."""
    if producer is None:
        return ACCEPTED, None
    if epoch < producer.epoch:
        return FENCED, None
    if epoch == producer.epoch:
        found = producer.window.get(sequence_token(base_sequence))
        if found is not None and found.count == count:
            return DUPLICATE, found
        if producer.window and base_sequence != expected_sequence(producer, epoch):
            return OUT_OF_ORDER, None
        return ACCEPTED, None
    # A new epoch starts at sequence 0.
    return (ACCEPTED, None) if base_sequence == 0 else (OUT_OF_ORDER, None)


class ProducerIds:
    """The Kafka producer ids this node hands out (InitProducerId).

    An id is ``node << 43 | n``: ``node`` this node's id (its low 20 bits),
    so two nodes never hand out the same id without asking each other (no
    controller round per InitProducerId); ``n`` increases, and is never
    below the ms since 2024 on the clock. Before handing out an ``n`` the
    node records on disk (``reserve_producer_ids``, 1000 at a time) that ids
    up to there may be in use, so a restart continues above every id handed
    out before, kill -9 included. The clock floor covers the rest: a node
    whose data directory was lost starts above the ids it handed out
    before, unless it handed out more than one id a millisecond for its
    whole life, or its clock went back.

    Why it matters: a partition deduplicates by producer id; an id handed
    out twice would make a new producer's first batches look like retries
    of an old one's, and drop them.
    """

    def __init__(self, path: Path, node_id: int, clock_ms: Callable[[], int]) -> None:
        self.path = path
        self.node = node_id & PRODUCER_ID_NODE_MASK
        self.clock_ms = clock_ms
        self._next = -1  # -1: the file not read yet
        self._reserved = 0

    def next(self) -> int:
        """A producer id never handed out before (raises StorageError when
        the reservation cannot be recorded: then none is handed out)."""
        if self._next < 0:
            self._next = self._reserved = read_reserved_producer_ids(self.path)
        n = max(self._next, self.clock_ms() - PRODUCER_ID_CLOCK_ORIGIN_MS)
        if n >= self._reserved:
            end = n + PRODUCER_ID_BLOCK
            assert end < 1 << PRODUCER_ID_NODE_SHIFT, "producer ids exhausted"
            reserve_producer_ids(self.path, end)
            self._reserved = end
        self._next = n + 1
        return self.node << PRODUCER_ID_NODE_SHIFT | n


class ProducerOps:
    """The idempotent appends of a ``Session`` (see the module docstring):
    its ``broker``, ``commit_deferred``, ``wrote_log``, ``node_id`` and the
    replication checks are Session's."""

    __slots__ = ()

    broker: Any  # (Session's)

    def _idempotent_target(self, key: bytes, idmp: Idempotence, fields: Sequence[bytes]) -> bytes:
        """The partition key an IDMP XADD on multi-partition topic ``key``
        goes to on a single node: by ``partition-key-field`` when the entry
        has it, else by the producer-id (a retry reaches the partition that
        recorded it; round-robin would not)."""
        return partition_key(key, self.broker.topics.choose_partition(key, fields, idmp.producer_id))

    def _producer_state(self, stream: Any) -> Any:
        """``stream``'s producer-state table, with the stream's IDMP settings
        (the server's defaults as they are now where XCFGSET set none)."""
        config = self.broker.config
        stream.idmp_defaults = (getattr(config, "stream_idmp_duration", 100),
                                getattr(config, "stream_idmp_maxsize", 100))
        stream.configure_producers()
        return stream.log.producers

    def _append_idempotent(self, stream: Any, plan: Any) -> tuple[StreamId, bool]:
        """XADD IDMP / IDMPAUTO on ``stream`` (``Session._append_to``'s
        non-deferred path; deferred appends committed): ``(ID, duplicate)``,
        the original's ID for a duplicate (nothing written), else the new
        entry's, appended with its producer record."""
        idmp = plan.idmp
        producer = idmp_producer(idmp.producer_id)
        iid = idmp.idempotent_id
        token = idmp_token(iid) if iid is not None else idmp_auto_token(plan.fields)
        state = self._producer_state(stream)
        found = state.find_id(producer, token)
        if found is not None:
            state.note_duplicate()
            self.broker.topics.stats.idempotent_duplicates += 1
            return StreamId(*found.first_id), True
        new_id = stream.add(plan.fields, producer=ProducerRecord(KIND_IDEMPOTENT_ID, 0, 0, 1, producer, token))
        self.broker.topics.stats.idempotent_appends += 1
        return new_id, False

    def _sequence_check(self, stream: Any, pkey: bytes, batch: ProducerBatch,
                        count: int) -> tuple[ProducerRecord | None, Any]:
        """Kafka's verdict on ``batch`` (``count`` records) for partition
        ``pkey`` (its ``stream``): ``(the producer record to append it with,
        None)`` when it is new; ``(None, where the original went: the
        table's Appended)`` when it is a retry of one of the producer's last
        batches. Raises ProducerRefused (nothing may be written)."""
        assert batch.producer_id >= 0 and batch.epoch >= 0 and 0 <= batch.base_sequence <= _SEQ_MAX
        producer = sequence_producer(batch.producer_id)
        known = self._producer_state(stream).sequence_producer(producer)
        outcome, found = check_sequence(known, batch.epoch, batch.base_sequence, count)
        if outcome == DUPLICATE:
            self.broker.topics.stats.idempotent_duplicates += 1
            return None, found
        if outcome != ACCEPTED:
            raise ProducerRefused(outcome, batch, pkey, known)
        return ProducerRecord(KIND_SEQUENCE, batch.epoch, 0, count, producer,
                              sequence_token(batch.base_sequence)), None

    def new_producer_id(self) -> int:
        """InitProducerId: a producer id no producer had (``ProducerIds``)."""
        broker = self.broker
        ids = broker.producer_ids
        if ids is None:
            ids = broker.producer_ids = ProducerIds(broker.topics.log_manager.producer_ids_path,
                                                    self.node_id(), broker.clock_ms)
        return ids.next()

    def configure_idempotence(self, key: bytes, duration_s: int | None, maxsize: int | None) -> bool:
        """XCFGSET: IDMP-DURATION and / or IDMP-MAXSIZE of ``key`` (of every
        partition of a topic key); a changed value forgets the recorded
        idempotent ids (Redis 8.6). False when the key does not exist."""
        self.commit_deferred()
        topics = self.broker.topics
        if not topics.exists(key):
            return False
        streams = [s for _k, s in self._partitions(key)] if topics.is_multi(key) else [topics.get(key)]
        for stream in streams:
            self._producer_state(stream)
            stream.set_idmp_config(duration_s, maxsize)
        return True

    def idempotence_of(self, stream: Any) -> IdempotenceInfo:
        """XINFO STREAM's idempotence fields of one partition."""
        state = self._producer_state(stream)
        duration, maxsize = stream.idmp_config()
        pids, iids = state.id_counts()
        return IdempotenceInfo(duration, maxsize, pids, iids, state.ids_added, state.ids_duplicates)
