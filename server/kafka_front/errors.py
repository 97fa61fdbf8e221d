"""What a broker refusal is called in Kafka: its error code, and a message for the fields that carry one.

Owns: ``code_for(exc)``, the one table from the lower layers' exceptions
(topic refusals, the cluster's, a too large entry, disk failures, records
the codec refuses) to Kafka's error codes, and ``message_for(exc)``, the
explanation Kafka's ``error_message`` fields get (the RESP front-end's text
for the same refusal: one wording for both protocols); ``split_repeated``,
the topics an admin request names twice, which Kafka's controller refuses.

Must not know: which API asked, sockets.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

from cluster import topics
from cluster.broker import FENCED, EntryTooLargeError, ProducerRefused
from cluster.errors import ClusterError, Moved, NotEnoughReplicas, TryAgain
from server.failures import reply_for
from server.kafka import errors as E
from server.kafka.records import CorruptRecordError
from server.kafka_front.access import AuthorizationFailed
from storage.errors import BatchTooLargeError, OffsetOutOfRangeError, Refusal, StorageError

T = TypeVar("T")
DUPLICATE_TOPIC = "Duplicate topic name."  # Kafka's words for a topic named twice


_TOPIC_CODES = {
    topics.UNKNOWN_TOPIC: E.UNKNOWN_TOPIC_OR_PARTITION,
    topics.PARTITION_OUT_OF_RANGE: E.UNKNOWN_TOPIC_OR_PARTITION,
    topics.BAD_PARTITION_KEY: E.INVALID_TOPIC_EXCEPTION,
    topics.TOPIC_NAME_HAS_HASH: E.INVALID_TOPIC_EXCEPTION,
    topics.TOPIC_NAME_EMPTY: E.INVALID_TOPIC_EXCEPTION,
    topics.TOPIC_EXISTS: E.TOPIC_ALREADY_EXISTS,
    topics.PARTITIONS_ONLY_GROW: E.INVALID_PARTITIONS,
    topics.BAD_PARTITION_COUNT: E.INVALID_PARTITIONS,
    topics.UNKNOWN_CONFIG: E.INVALID_CONFIG,
    topics.CONFIG_NOT_ONE_OF: E.INVALID_CONFIG,
    topics.CONFIG_NOT_A_SIZE: E.INVALID_CONFIG,
    topics.CONFIG_NOT_AN_INTEGER: E.INVALID_CONFIG,
    topics.CONFIG_OUT_OF_RANGE: E.INVALID_CONFIG,
    topics.CONFIG_REPEATED: E.INVALID_REQUEST,  # (Kafka: "Error due to duplicate config keys")
    topics.REPLICATION_FACTOR_FIXED: E.INVALID_REPLICATION_FACTOR,
}


def code_for(exc: BaseException) -> int:
    """Kafka's error code for ``exc`` (UNKNOWN_SERVER_ERROR for what is not a refusal)."""
    if isinstance(exc, Refusal):
        return _TOPIC_CODES.get(exc.code, E.UNKNOWN_SERVER_ERROR)
    if isinstance(exc, (CorruptRecordError, AuthorizationFailed)):
        return exc.code
    if isinstance(exc, EntryTooLargeError):
        return E.MESSAGE_TOO_LARGE
    if isinstance(exc, BatchTooLargeError):  # an idempotent batch is one log batch
        return E.RECORD_LIST_TOO_LARGE
    if isinstance(exc, ProducerRefused):
        return E.INVALID_PRODUCER_EPOCH if exc.outcome == FENCED else E.OUT_OF_ORDER_SEQUENCE_NUMBER
    if isinstance(exc, NotEnoughReplicas):
        return E.NOT_ENOUGH_REPLICAS
    if isinstance(exc, (Moved, TryAgain)):  # TryAgain: a failover pauses the partition, or the lease lapsed
        return E.NOT_LEADER_OR_FOLLOWER
    if isinstance(exc, ClusterError):
        return E.UNKNOWN_SERVER_ERROR
    if isinstance(exc, OffsetOutOfRangeError):
        return E.OFFSET_OUT_OF_RANGE
    if isinstance(exc, (StorageError, OSError)):
        return E.KAFKA_STORAGE_ERROR
    return E.UNKNOWN_SERVER_ERROR


def message_for(exc: BaseException) -> str:
    """The explanation of ``exc`` (the RESP front-end's words for the same refusal)."""
    if isinstance(exc, CorruptRecordError):
        return exc.message
    reply = reply_for(exc)
    if reply is not None:
        return reply.message
    return str(exc) or type(exc).__name__


def handled(exc: BaseException) -> bool:
    """Whether ``exc`` is a refusal an API answers with an error code (else a bug, logged)."""
    return code_for(exc) != E.UNKNOWN_SERVER_ERROR or isinstance(exc, ClusterError)


def refused(exc: BaseException) -> tuple[int, str]:
    """``(code, message)`` of a refusal an API answers; what is not one (a
    bug) is raised again, for the connection to log and close."""
    if not handled(exc):
        raise exc
    return code_for(exc), message_for(exc)


def split_repeated(items: Iterable[T], key: Callable[[T], object]) -> tuple[list[T], list]:
    """``(items whose key is named once, keys named more than once)``, both in request order.
    Kafka's controller (``ControllerApis``: CreateTopics, CreatePartitions, DeleteTopics) answers
    each repeated topic once, INVALID_REQUEST with ``DUPLICATE_TOPIC``, and acts on none of its
    occurrences."""
    items = list(items)
    counts: dict = {}
    for item in items:
        counts[key(item)] = counts.get(key(item), 0) + 1
    return [i for i in items if counts[key(i)] == 1], [k for k, n in counts.items() if n > 1]
