"""Produce (key 0): record batches appended to partitions, answered once their receipt is settled.

Versions 3-13 (magic 2 record batches; v13 names topics by ID). Each
partition's batches are read (CRC, decompression: gzip, snappy, lz4, zstd),
each record becomes an entry body (``mapping``) and the partition's records
are appended in one broker call (``Session.append_records``: one log
batch), with IDs, hence timestamps, assigned at the append
(LogAppendTime: the producer's CreateTime is not kept; the response's
``log_append_time_ms`` says the time used).

acks: 1 answers once the leader's write is durable by the topic's fsync
policy, and on an ``acks all`` topic once the in-sync replicas have it too
(the topic's guarantee is not weakened by a client); -1 always waits for the
in-sync replicas and needs min-insync-replicas of them (NOT_ENOUGH_REPLICAS
before anything is written); 0 sends no response, and a refused partition
closes the connection (so the client learns), as Kafka does. The response
waits for the receipt as an XADD's reply does (``context.Pending``): a
failed fsync answers KAFKA_STORAGE_ERROR, a leadership or ISR lost while
waiting NOT_LEADER_OR_FOLLOWER or NOT_ENOUGH_REPLICAS_AFTER_APPEND, more
than ``timeout_ms`` REQUEST_TIMED_OUT (the records may be in the log then,
as in Kafka: the client retries, at least once).

Refused per partition: an unknown topic or partition
(UNKNOWN_TOPIC_OR_PARTITION), one this node does not lead
(NOT_LEADER_OR_FOLLOWER, with the leader in ``current_leader`` and
``node_endpoints`` from v10), a record over ``max-entry-bytes``
(MESSAGE_TOO_LARGE), a damaged batch (CORRUPT_MESSAGE), magic 0/1 or a
record the mapping cannot keep (INVALID_RECORD), zstd before v7 or an
unknown codec (UNSUPPORTED_COMPRESSION_TYPE), transactional batches
(INVALID_TXN_STATE), an empty records field (INVALID_RECORD), a partition
the user may not write (TOPIC_AUTHORIZATION_FAILED: ``access``), one of
Partita's internal streams (``cluster.topics.is_internal``: a group's
offsets ``__kafka_offsets{<group>}``, a topic group's membership;
INVALID_TOPIC_EXCEPTION, as Kafka refuses appends to ``__consumer_offsets``).

An idempotent producer's batch (a producer id from InitProducerId, its
epoch and base sequence in the batch header) is deduplicated by the
partition's producer state, the one XADD IDMP uses (``append_records``
with a ``ProducerBatch``; cluster/broker/producers.py): a retry of one of
the producer's last 5 batches is answered with the original's base offset
and writes nothing; a sequence that does not follow the producer's last
batch is refused OUT_OF_ORDER_SEQUENCE_NUMBER, an epoch older than the
producer's INVALID_PRODUCER_EPOCH. It must be the only batch of its
partition in the request, as Kafka requires of every Produce v3+ (others
may send several batches: they are appended together), with an epoch and a
sequence (INVALID_RECORD otherwise); it is stored as one log batch, so
one over the log's batch limit (64 MiB stored) is refused
RECORD_LIST_TOO_LARGE.
"""

from __future__ import annotations

from cluster.broker import ProducerBatch
from cluster.broker.durability import DurabilityError
from cluster.topics import is_internal
from server.kafka import codec
from server.kafka import errors as E
from server.kafka import records
from server.kafka.records import CorruptRecordError
from server.kafka_front import access, mapping
from server.kafka_front.context import Pending
from server.kafka_front.errors import refused

API_KEY = 0
NAME = "Produce"
VERSIONS = (3, 13)

R = codec.ProduceResponse
ZSTD_MIN_VERSION = 7  # Kafka refuses zstd batches on older Produce versions (KIP-110)


def _check(batches: list, version: int) -> ProducerBatch | None:
    """Refuse what no partition takes; the idempotent producer's batch, if it is one."""
    if not batches:
        raise CorruptRecordError(E.INVALID_RECORD, "the records field holds no record batch")
    for batch in batches:
        if batch.compression == records.COMPRESSION_ZSTD and version < ZSTD_MIN_VERSION:
            raise CorruptRecordError(E.UNSUPPORTED_COMPRESSION_TYPE,
                                     f"zstd batches need Produce v{ZSTD_MIN_VERSION} or later")
        if batch.is_transactional or batch.is_control:
            raise CorruptRecordError(E.INVALID_TXN_STATE, "transactions are not supported")
    first = batches[0]
    if all(batch.producer_id == records.NO_PRODUCER_ID for batch in batches):
        return None
    if len(batches) > 1:
        raise CorruptRecordError(E.INVALID_RECORD, f"Produce requests with version {version} are only allowed "
                                                   "to contain exactly one record batch per partition")
    if first.producer_id < 0 or first.producer_epoch < 0 or first.base_sequence < 0:
        raise CorruptRecordError(E.INVALID_RECORD, "an idempotent producer's batch needs a producer id, "
                                                   "an epoch and a base sequence")
    return ProducerBatch(first.producer_id, first.producer_epoch, first.base_sequence)


async def handle(ctx, req):
    body, version = req.body, req.api_version
    session = ctx.session
    acks = body.acks
    max_bytes = ctx.front.records_max_bytes
    results = []
    any_refused = False
    hints: set[int] = set()  # leaders named in NOT_LEADER_OR_FOLLOWER answers
    for topic in body.topic_data:
        if version >= 13:
            name = ctx.front.topic_name(session, topic.topic_id)
        else:
            name = topic.name.encode()
        parts = []
        for part in topic.partition_data:
            resp = R.PartitionProduceResponse(index=part.index, base_offset=-1)
            parts.append(resp)
            if acks not in (0, 1, -1):
                resp.error_code = E.INVALID_REQUIRED_ACKS
                continue
            if name is None:
                resp.error_code = E.UNKNOWN_TOPIC_ID
                continue
            if is_internal(name):  # Partita's own streams (a group's committed offsets...): written by it only
                resp.error_code = E.INVALID_TOPIC_EXCEPTION
                continue
            try:
                access.require(ctx, access.WRITE, name, part.index)
                batches = mapping.read(part.records or b"", max_bytes)
                producer = _check(batches, version)
                produced = mapping.Produced(batches)
                done = session.append_records(name, part.index, produced.count, produced.largest,
                                              produced.make_entries, acks_all=acks == -1, producer=producer)
            except Exception as exc:  # noqa: BLE001 - every refusal is the partition's error
                resp.error_code, message = refused(exc)
                if version >= 8:
                    resp.error_message = message
                _leader_hint(ctx, resp, name, part.index, version, hints)
                continue
            resp.base_offset = done.base_offset
            resp.log_append_time_ms = done.timestamp_ms
            resp.log_start_offset = done.log_start_offset
        results.append(R.TopicProduceResponse(name=topic.name, topic_id=topic.topic_id, partition_responses=parts))
        any_refused = any_refused or any(p.error_code for p in parts)
    receipt = session.take_receipt()
    response = R(responses=results, node_endpoints=[
        R.NodeEndpoint(node_id=e.node_id, host=e.host, port=e.port)
        for e in ctx.front.endpoints(ctx) if e.node_id in hints])
    if acks == 0:
        if any_refused:
            raise ConnectionAbortedError("a Produce with acks=0 was refused: closing, as Kafka does")
        if receipt is None:
            return None
        return Pending(receipt, body.timeout_ms, lambda error: None, silent=True)
    if receipt is None:
        return response

    def finish(error: BaseException | None):
        if error is not None:
            for topic in results:
                name = topic.name.encode() if version < 13 else ctx.front.topic_name(session, topic.topic_id)
                for part in topic.partition_responses:
                    if part.error_code == E.NONE:
                        part.error_code = _after_append(ctx, error, name, part.index)
                        part.base_offset = -1
                        if version >= 8:
                            part.error_message = str(error)
        return response

    return Pending(receipt, body.timeout_ms, finish)


def _after_append(ctx, error: BaseException, name: bytes | None, n: int) -> int:
    """The error of a partition whose appended records could not be acknowledged."""
    if isinstance(error, TimeoutError):
        return E.REQUEST_TIMED_OUT
    if isinstance(error, (DurabilityError, OSError)):
        return E.KAFKA_STORAGE_ERROR
    layout = ctx.session.record_topics([name]).get(name) if name is not None else None
    if layout is None or n >= len(layout.partitions) or layout.partitions[n].leader != ctx.session.node_id():
        return E.NOT_LEADER_OR_FOLLOWER
    return E.NOT_ENOUGH_REPLICAS_AFTER_APPEND


def _leader_hint(ctx, resp, name: bytes, n: int, version: int, hints: set[int]) -> None:
    """v10+: NOT_LEADER_OR_FOLLOWER names the leader (KIP-951), saving the client a Metadata round."""
    if resp.error_code != E.NOT_LEADER_OR_FOLLOWER or version < 10:
        return
    layout = ctx.session.record_topics([name]).get(name)
    if layout is None or n >= len(layout.partitions):
        return
    p = layout.partitions[n]
    resp.current_leader = R.LeaderIdAndEpoch(leader_id=p.leader, leader_epoch=p.leader_epoch)
    hints.add(p.leader)
