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
- ``produce``, what a Kafka Produce handler calls per partition: a batch of
  entries from producer id / epoch with a base sequence. Kafka's rules
  (``ProducerStateManager`` / ``ProducerAppendInfo``): a batch whose epoch
  and sequence range match one of the producer's last 5 batches is a
  duplicate (its original offsets are answered, nothing is written); a lower
  epoch is fenced; a new epoch must start at sequence 0; in the same epoch
  the sequence must follow the last batch's (wrapping at 2^31); a producer
  the partition does not know (never seen, or expired) may start anywhere.
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
from typing import Any, Sequence

from cluster.topics import UNKNOWN_TOPIC, TopicError, partition_key
from storage.producers import (
    idmp_auto_token,
    idmp_producer,
    idmp_token,
    sequence_producer,
    sequence_token,
    token_sequence,
)
from storage.records import KIND_IDEMPOTENT_ID, KIND_SEQUENCE, ProducerRecord
from storage.streams.ids import StreamId

# What ``produce`` answers.
ACCEPTED = "accepted"
DUPLICATE = "duplicate"
OUT_OF_ORDER = "out-of-order"  # Kafka's OUT_OF_ORDER_SEQUENCE_NUMBER
FENCED = "fenced"  # Kafka's INVALID_PRODUCER_EPOCH

_SEQ_MAX = 2**31 - 1


class Idempotence:
    """XADD's IDMP (``idempotent_id`` given) or IDMPAUTO (None: the entry's
    field/value pairs name it) for ``producer_id``."""

    __slots__ = ("producer_id", "idempotent_id")

    def __init__(self, producer_id: bytes, idempotent_id: bytes | None = None) -> None:
        assert producer_id and idempotent_id != b""
        self.producer_id = producer_id
        self.idempotent_id = idempotent_id


@dataclass(frozen=True, slots=True)
class Produced:
    """``produce``'s answer: ``outcome``, and for ACCEPTED where the batch
    went (DUPLICATE: where the original went): its first and last offsets,
    the first entry's ID and the append time (Kafka's LogAppendTime)."""

    outcome: str
    base_offset: int = -1
    last_offset: int = -1
    first_id: StreamId | None = None
    timestamp_ms: int = -1


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
        newest = producer.last()
        if newest is not None:
            token, appended = newest
            if base_sequence != next_sequence(last_sequence(token_sequence(token), appended.count)):
                return OUT_OF_ORDER, None
        return ACCEPTED, None
    # A new epoch starts at sequence 0.
    return (ACCEPTED, None) if base_sequence == 0 else (OUT_OF_ORDER, None)


class ProducerOps:
    """The idempotent appends of a ``Session`` (see the module docstring):
    its ``broker``, ``commit_deferred``, ``wrote_log`` and the replication
    checks are Session's."""

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

    def produce(self, key: bytes, entries: Sequence[Sequence[bytes]], producer_id: int, producer_epoch: int,
                base_sequence: int) -> Produced:
        """A Kafka idempotent producer's batch for partition ``key`` (a
        partition key, or the key of a one-partition topic; it must exist):
        ``entries`` (each a field/value list) from ``producer_id`` at
        ``producer_epoch``, the first with sequence ``base_sequence``.
        Appended as one log batch carrying its producer record, or answered
        DUPLICATE / OUT_OF_ORDER / FENCED with nothing written (see the module
        docstring). Raises TopicError for a missing or multi-partition key,
        the stream's refusals, NotLeaderError / NotEnoughReplicasError."""
        assert entries and producer_id >= 0 and producer_epoch >= 0 and 0 <= base_sequence <= _SEQ_MAX
        self.commit_deferred()
        topics = self.broker.topics
        if topics.get(key) is None:  # (a topic key of several partitions: TopicError)
            raise TopicError(UNKNOWN_TOPIC, topic=topics.topic_of(key))
        stream, pkey = topics.append_target(key, entries[0], create=False)
        if self.broker.replication is not None:
            self._before_replicated_append(pkey, stream)
        state = self._producer_state(stream)
        producer = sequence_producer(producer_id)
        outcome, found = check_sequence(state.sequence_producer(producer), producer_epoch, base_sequence,
                                        len(entries))
        if outcome == DUPLICATE:
            self.broker.topics.stats.idempotent_duplicates += 1
            self.wrote_log(stream.log)  # the answer waits for the original's durability
            return Produced(DUPLICATE, found.offset, found.last_offset, StreamId(*found.first_id),
                            found.timestamp_ms)
        if outcome != ACCEPTED:
            return Produced(outcome)
        record = ProducerRecord(KIND_SEQUENCE, producer_epoch, 0, len(entries), producer,
                                sequence_token(base_sequence))
        ids = stream.add_batch(entries, record)
        appended = state.sequence_producer(producer).window[record.token]
        self.wrote_log(stream.log)
        signal = self.broker.keys.signal
        signal(key)
        for other in topics.sibling_keys(key, pkey):
            signal(other)
        topics.note_entries_in(len(entries))
        topics.stats.idempotent_appends += 1
        return Produced(ACCEPTED, appended.offset, appended.last_offset, ids[0], appended.timestamp_ms)

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
