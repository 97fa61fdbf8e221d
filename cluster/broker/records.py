"""Records by partition and offset: what a Kafka-style front-end asks of the broker.

Owns, as ``Session`` methods (``RecordOps`` is one of its bases): the
operations a front-end that names data by topic, partition number and
offset needs beside the Redis ones (the Kafka front-end, server/kafka_front/):

- the layout of topics (``record_topics``: each topic's ID and partitions,
  and each partition's leader, leader epoch, replicas and in-sync replicas
  from the committed cluster metadata), the nodes (``record_nodes``) and the
  controller (``controller_id``);
- ``append_records``: a run of entries appended to one partition as ONE log
  batch (more only past ``RECORD_BATCH_MAX_BYTES``): IDs assigned as ``XADD
  *`` does (the wall clock's ms, or the ms of the highest ID the log holds
  with the next sequence numbers), the entries encoded once by the
  front-end with those IDs (its ``make_entries``, as ``append_run``'s
  scanner), leadership and the ISR checked in a cluster, the topic's
  ``max-entry-bytes``, the write noted for the receipt (fsync; acks=all for
  the topic's ``acks all`` or when the front-end asks for it,
  ``acks_all``), readers woken; an idempotent producer's batch
  (``producer``) deduplicated by the partition's producer state, the one
  XADD IDMP uses (cluster/broker/producers.py);
- ``read_records``: the entries of a partition from an offset up to its
  high watermark, within a byte budget, with each entry's offset and ID
  (``wait_for_records``: the long poll, woken by the appends' key events);
- offsets: ``record_offsets`` (log start, high watermark, the last entry)
  and ``offset_at_time`` (the first entry whose ID's ms is at or after a
  time: the ID index is the time index);
- ``check_new_topic``, ``check_topic_growth``, ``check_topic_config``:
  what ``create_topic``, ``alter_topic_partitions``, ``alter_topic_config``
  would refuse, changing nothing (a front-end's validate-only request).

A partition is ``(topic, n)``; its Redis key is ``topic#n`` (and ``topic``
for a one-partition topic). Nothing here auto-creates: a missing topic is
``TopicError`` UNKNOWN_TOPIC, a partition past the count
PARTITION_OUT_OF_RANGE; in a cluster a partition led elsewhere is ``Moved``
(the leader in it), a node that lost its controller lease ``TryAgain``.

Must not know: sockets, the Kafka wire format (record batches, error codes,
API versions), reply shapes, error texts.
"""

from __future__ import annotations

import time
from typing import Any, Callable, NamedTuple, Sequence

from cluster.broker.producers import ProducerBatch
from cluster.errors import NotEnoughReplicas, TryAgain
from cluster.topics import (
    BAD_PARTITION_COUNT,
    MAX_PARTITIONS,
    PARTITION_OUT_OF_RANGE,
    PARTITIONS_ONLY_GROW,
    REPLICATION_FACTOR_FIXED,
    TOPIC_EXISTS,
    TOPIC_NAME_EMPTY,
    TOPIC_NAME_HAS_HASH,
    UNKNOWN_TOPIC,
    TopicError,
    TopicRegistry,
    partition_key,
)
from storage.streams.ids import UINT64_MAX

# A produced run is split into log batches of about this many bytes: a read
# of a few entries preads its whole batch (storage.segment), and a batch must
# stay under the log's max_batch_bytes.
RECORD_BATCH_MAX_BYTES = 1024 * 1024


class PartitionLayout(NamedTuple):
    """Where one partition lives: node ids (``leader`` -1 when unknown)."""

    leader: int
    leader_epoch: int
    replicas: list[int]
    isr: list[int]


class TopicLayout(NamedTuple):
    topic_id: str  # the registry's random topic ID ("" for topics older than IDs)
    partitions: list[PartitionLayout]


class Appended(NamedTuple):
    """Where ``append_records`` put a run: the first entry's offset, the
    ms of its ID (the append time), and the partition's log start offset;
    ``duplicate``: the run was a retry of an idempotent producer's batch,
    nothing was written, and the offset and time are the original's."""

    base_offset: int
    timestamp_ms: int
    log_start_offset: int
    duplicate: bool = False


class PartitionRead(NamedTuple):
    """What ``read_records`` found: ``entries`` are ``(offset, ms, seq)`` of
    each live entry in order, ``chunks`` their stored bytes back to back
    (stream-v1, possibly views of the log's mapping: convert them before
    awaiting anything)."""

    high_watermark: int
    log_start_offset: int
    entries: list
    chunks: list


class PartitionOffsets(NamedTuple):
    log_start_offset: int
    high_watermark: int
    last_offset: int  # the newest live entry below the high watermark (-1: none)
    last_ms: int  # its ID's ms (-1: none)


class RecordOps:
    """The partition-and-offset operations of a ``Session`` (module
    docstring): its ``broker``, ``commit_deferred``, ``wrote_log``,
    ``repl_pending`` and ``_before_replicated_append`` are Session's."""

    __slots__ = ()

    broker: Any  # (Session's)

    # -- layout --------------------------------------------------------------

    def record_topics(self, names: Sequence[bytes] | None = None) -> dict[bytes, TopicLayout | None]:
        """Each named topic's layout (None: no such topic); every topic's
        when ``names`` is None. Leaders, epochs and ISRs are the committed
        cluster metadata's (on a single node: this node, epoch 0)."""
        self.commit_deferred()
        topics = self.broker.topics
        wanted = topics.topics() if names is None else names
        replication = self.broker.replication
        out: dict[bytes, TopicLayout | None] = {}
        for topic in wanted:
            count = topics.partitions_of(topic) if b"#" not in topic else 0
            if not count:
                out[topic] = None
                continue
            if replication is None:
                me = self.node_id()
                parts = [PartitionLayout(me, 0, [me], [me])] * count
            else:
                manager = replication.manager
                state = manager.state
                parts = []
                for n in range(count):
                    shard = manager.shard_of(topic, n)
                    replicas = list(manager.placement.replicas(shard))
                    isr = sorted(state.isr[shard]) if state.controlled else replicas
                    parts.append(PartitionLayout(state.leader(shard), state.epoch(shard), replicas, isr))
            out[topic] = TopicLayout(topics.topic_id(topic) or "", parts)
        return out

    def topics_generation(self) -> int:
        """Changes whenever a topic is created, altered or deleted (caches of
        ``record_topics`` compare it)."""
        return self.broker.topics.generation

    def node_id(self) -> int:
        """This node's id (0 on a single node)."""
        replication = self.broker.replication
        return replication.manager.my_id if replication is not None else int(
            getattr(self.broker.config, "node_id", 0) or 0)

    def key_leader(self, key: bytes) -> int:
        """The node leading the hash slot of ``key`` (this node on a single node; -1: none): where
        a Kafka group named ``key`` is coordinated."""
        replication = self.broker.replication
        if replication is None:
            return self.node_id()
        manager = replication.manager
        _, shard = manager.key_shard(key)
        leader = manager.state.leader(shard)
        return leader if leader is not None else -1

    def record_nodes(self) -> list[Any]:
        """Every node of the cluster (``cluster.nodes.Node``), [] on a single node."""
        replication = self.broker.replication
        return list(replication.manager.placement.nodes) if replication is not None else []

    def controller_id(self) -> int:
        """The node the controller quorum elected, else this node."""
        replication = self.broker.replication
        raft = getattr(getattr(replication, "controller", None), "raft", None)
        leader = getattr(raft, "leader_id", None)
        return leader if leader is not None else self.node_id()

    # -- where a partition is ------------------------------------------------------

    def _led_stream(self, topic: bytes, n: int) -> Any:
        """The stream of partition ``n`` of ``topic``, which this node must lead."""
        topics = self.broker.topics
        count = topics.partitions_of(topic) if b"#" not in topic else 0
        if not count:
            raise TopicError(UNKNOWN_TOPIC, topic=topic)
        if not 0 <= n < count:
            raise TopicError(PARTITION_OUT_OF_RANGE, partition=n, topic=topic, partitions=count)
        replication = self.broker.replication
        if replication is not None:
            manager = replication.manager
            manager.check_key(manager.canonical_key(topic, n))  # Moved: another node leads it
            controller = replication.controller
            if controller is not None and time.monotonic() >= controller.lease_expiry_s:
                raise TryAgain("this node has lost contact with the cluster controller "
                               "(its leadership may be moving); retry shortly")
        return topics.stream_of(topic, n)

    # -- writes ----------------------------------------------------------------------

    def append_records(self, topic: bytes, n: int, count: int, largest_bytes: int,
                       make_entries: Callable[[int, int], tuple[list, int]], acks_all: bool = False,
                       producer: ProducerBatch | None = None) -> Appended:
        """Append ``count`` entries to partition ``n`` of ``topic``, in order,
        as one log batch per ``RECORD_BATCH_MAX_BYTES``. The front-end
        encodes them once, with the IDs it is given, as ``append_run``'s
        scanner does: ``make_entries(ms, seq)`` returns ``(entries,
        total_bytes)``, the ``count`` stored entries ``(ms, seq + i,
        encoding)`` (``storage.entry_codec.with_body``) and their bytes.
        ``largest_bytes``: the field and value bytes of the largest entry
        (checked against ``max-entry-bytes`` first). ``acks_all``: the
        receipt waits for the in-sync replicas (and min-insync-replicas must
        be in sync) even on an ``acks 1`` topic.

        ``producer``: the entries are an idempotent producer's batch. A retry
        of one of its last batches writes nothing and answers the original's
        offset and time (``duplicate``), once what the original waits for
        holds (the receipt notes the log as an append's does); a new one is
        ONE log batch whatever its size, carrying its producer record
        (cluster/broker/producers.py).

        Raises TopicError, EntryTooLargeError, Moved / TryAgain / Paused,
        NotEnoughReplicas, ProducerRefused, BatchTooLargeError (an
        idempotent batch over the log's batch limit; nothing written), StorageError
        (the append of a log batch failed: nothing of it was written, the
        batches before it were)."""
        from cluster.broker.session import EntryTooLargeError

        assert count > 0
        self.commit_deferred()
        broker = self.broker
        topics = broker.topics
        stream = self._led_stream(topic, n)
        limit = topics.max_entry_bytes(topic)
        if largest_bytes > limit:
            raise EntryTooLargeError(largest_bytes, limit)
        pkey = partition_key(topic, n)
        replication = broker.replication
        if replication is not None:
            self._before_replicated_append(pkey, stream)
            if acks_all and replication.manager.is_replicated():
                ls = replication.manager.leader_state(topic, n)  # checked for every batch, as Kafka does
                if not ls.accepts_acks_all():
                    raise NotEnoughReplicas(len(ls.isr), replication.manager.canonical_key(topic, n),
                                            ls.min_insync)
                replication.note_pending(self, pkey, stream, (topic, n), ls.epoch)
        log = stream.log
        record = None
        if producer is not None:
            record, original = self._sequence_check(stream, pkey, producer, count)
            if original is not None:
                self.wrote_log(log)  # the answer waits for what the original's waits for
                return Appended(original.offset, original.first_id[0], log.log_start_offset, True)
        base = log.log_end_offset
        last_ms, last_seq = stream.id_floor
        now_ms = stream.clock_ms()
        if now_ms > last_ms:
            ms, seq = now_ms, 0
        elif last_seq <= UINT64_MAX - count:
            ms, seq = last_ms, last_seq + 1
        else:
            ms, seq = last_ms + 1, 0
        entries, total_bytes = make_entries(ms, seq)
        assert len(entries) == count and (entries[0][0], entries[0][1]) == (ms, seq)
        if record is not None:
            stream.append_encoded(entries, record)
            self.wrote_log(log)
            topics.stats.idempotent_appends += 1
        else:
            batches = max(1, min(count, -(-total_bytes // RECORD_BATCH_MAX_BYTES)))
            step = -(-count // batches)
            for start in range(0, count, step):
                stream.append_encoded(entries[start:start + step])
                self.wrote_log(log)
        signal = broker.keys.signal
        signal(pkey)
        signal(topic)
        topics.note_entries_in(count)
        return Appended(base, ms, log.log_start_offset)

    # -- reads -----------------------------------------------------------------------

    def read_records(self, topic: bytes, n: int, offset: int, max_bytes: int) -> PartitionRead:
        """Live entries of partition ``n`` of ``topic`` from ``offset`` up to
        the high watermark, about ``max_bytes`` of stored bytes (at least one
        entry when any is there). An offset between the high watermark and
        the log end gives none. Raises OffsetOutOfRangeError for an offset
        below the log start or past the log end, and ``_led_stream``'s
        refusals."""
        self.commit_deferred()
        stream = self._led_stream(topic, n)
        log = stream.log
        hw = log.high_watermark
        if offset >= hw and offset <= log.log_end_offset:
            return PartitionRead(hw, log.log_start_offset, [], [])
        res = log.read(offset, max_bytes=max(1, max_bytes), with_ids=True, view=True)
        if res.count:
            self.broker.topics.note_entries_out(res.count)
        return PartitionRead(hw, log.log_start_offset, res.entries, res.chunks)

    async def wait_for_records(self, partitions: Sequence[tuple[bytes, int]], timeout_s: float) -> bool:
        """Wait until one of ``partitions`` (``(topic, n)``) takes an append
        or its high watermark moves; False on timeout, or at once when
        ``max-blocked-clients`` readers already wait."""
        from cluster.broker.keys import TooManyBlockedError

        self.commit_deferred()
        keys = [partition_key(topic, n) for topic, n in partitions]
        try:
            return await self.broker.keys.wait_for_keys(keys, timeout_s)
        except TooManyBlockedError:
            return False

    def record_offsets(self, topic: bytes, n: int) -> PartitionOffsets:
        """The partition's log start, high watermark and newest live entry."""
        self.commit_deferred()
        log = self._led_stream(topic, n).log
        hw = log.high_watermark
        last_offset = last_ms = -1
        if hw > log.log_start_offset and log.live_count:
            res = log.read_reverse(log.log_start_offset, hw, max_count=1, with_ids=True)
            if res.entries:
                last_offset, last_ms, _ = res.entries[0]
        return PartitionOffsets(log.log_start_offset, hw, last_offset, last_ms)

    def offset_at_time(self, topic: bytes, n: int, ms: int) -> tuple[int, int] | None:
        """``(offset, its ID's ms)`` of the first live entry below the high
        watermark whose ID's ms is ``ms`` or later (the ID index is the time
        index: IDs grow with the append time); None when there is none."""
        self.commit_deferred()
        log = self._led_stream(topic, n).log
        start = max(log.find_offset(max(ms, 0), 0, inclusive=True), log.log_start_offset)
        if start >= log.high_watermark:
            return None
        res = log.read(start, max_count=1, with_ids=True)
        if not res.entries:
            return None
        offset, entry_ms, _ = res.entries[0]
        return offset, entry_ms

    # -- topic administration ----------------------------------------------------

    def check_new_topic(self, topic: bytes, partitions: int | None,
                        pairs: Sequence[tuple[bytes, bytes]] = (), replication_factors: Sequence[int] = ()) -> None:
        """Raise what ``create_topic`` would refuse (TopicError), create nothing."""
        self.commit_deferred()
        topics = self.broker.topics
        if b"#" in topic:
            raise TopicError(TOPIC_NAME_HAS_HASH, topic=topic)
        if not topic:
            raise TopicError(TOPIC_NAME_EMPTY)
        if topics.exists(topic):
            raise TopicError(TOPIC_EXISTS, topic=topic)
        replication = self.broker.replication
        actual = replication.manager.placement.replication_factor if replication is not None else 1
        for wanted in replication_factors:
            if wanted != actual:
                raise TopicError(REPLICATION_FACTOR_FIXED, wanted=wanted, actual=actual,
                                 cluster=replication is not None)
        if partitions is not None and not 1 <= partitions <= MAX_PARTITIONS:
            raise TopicError(BAD_PARTITION_COUNT, partitions=partitions, maximum=MAX_PARTITIONS)
        TopicRegistry.parse_alter_config(pairs)

    def check_topic_config(self, pairs: Sequence[tuple[bytes, bytes]]) -> None:
        """Raise what ``alter_topic_config`` would refuse of ``pairs`` (TopicError)."""
        TopicRegistry.parse_alter_config(pairs)

    def check_topic_growth(self, topic: bytes, partitions: int) -> None:
        """Raise what ``alter_topic_partitions`` would refuse (TopicError), change nothing."""
        self.commit_deferred()
        current = self.broker.topics.partitions_of(topic) if b"#" not in topic else 0
        if not current:
            raise TopicError(UNKNOWN_TOPIC, topic=topic)
        if not 1 <= partitions <= MAX_PARTITIONS:
            raise TopicError(BAD_PARTITION_COUNT, partitions=partitions, maximum=MAX_PARTITIONS)
        if partitions < current:
            raise TopicError(PARTITIONS_ONLY_GROW, topic=topic, partitions=current)

    def default_partitions(self) -> int:
        """How many partitions a topic created without a count gets."""
        return int(getattr(self.broker.config, "default_partitions", 1) or 1)

    def replication_factor(self) -> int:
        replication = self.broker.replication
        return replication.manager.placement.replication_factor if replication is not None else 1


__all__ = ["RecordOps", "PartitionLayout", "TopicLayout", "Appended", "PartitionRead", "PartitionOffsets",
           "RECORD_BATCH_MAX_BYTES"]
