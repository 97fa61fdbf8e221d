"""Kafka's topic config names and Partita's topic config (docs/kafka.md, "Topic configs").

Owns the mapping both ways:

=========================  =========================  =====================================
Kafka name                 Partita topic config       note
=========================  =========================  =====================================
``retention.ms``           ``retention-ms``           -1: keep
``retention.bytes``        ``retention-bytes``        per partition, -1: no limit
``segment.bytes``          ``segment-bytes``
``segment.ms``             ``segment-ms``
``max.message.bytes``      ``max-entry-bytes``        per record (its entry's field and value
                                                      bytes), where Kafka limits a batch
``min.insync.replicas``    ``min-insync-replicas``
``fsync``, ``acks``,       the same                   Partita's own, under their own names
``partition-key-field``
``cleanup.policy``         (fixed) ``delete``         compaction does not exist: refused
``message.timestamp.type`` (fixed) ``LogAppendTime``  a record's time is its entry ID's ms
``compression.type``       (fixed) ``uncompressed``   entries are stored uncompressed
=========================  =========================  =====================================

A fixed name may be set to its one value (CreateTopics configs often carry
them) and to nothing else (INVALID_CONFIG). Any other name is INVALID_CONFIG.

Must not know: the wire format, sockets.
"""

from __future__ import annotations

from typing import NamedTuple

from cluster.topics import TOPIC_OPTIONS

# Kafka's ConfigType numbers (DescribeConfigs v3+) and ConfigSource numbers.
TYPE_STRING, TYPE_INT, TYPE_LONG, TYPE_LIST = 2, 3, 5, 7
SOURCE_DYNAMIC_TOPIC, SOURCE_STATIC_BROKER, SOURCE_DEFAULT = 1, 4, 5


class KafkaConfig(NamedTuple):
    kafka: str
    partita: str | None  # None: fixed
    type: int
    fixed: str | None = None
    doc: str = ""


_DOCS = {o.name: o.doc for o in TOPIC_OPTIONS}
MAPPED = (
    KafkaConfig("retention.ms", "retention-ms", TYPE_LONG),
    KafkaConfig("retention.bytes", "retention-bytes", TYPE_LONG),
    KafkaConfig("segment.bytes", "segment-bytes", TYPE_INT),
    KafkaConfig("segment.ms", "segment-ms", TYPE_LONG),
    KafkaConfig("max.message.bytes", "max-entry-bytes", TYPE_INT),
    KafkaConfig("min.insync.replicas", "min-insync-replicas", TYPE_INT),
)
_MAPPED_PARTITA = {c.partita for c in MAPPED}
OWN = tuple(KafkaConfig(o.name, o.name, TYPE_STRING) for o in TOPIC_OPTIONS if o.name not in _MAPPED_PARTITA)
FIXED = (
    KafkaConfig("cleanup.policy", None, TYPE_LIST, "delete", "compaction does not exist in Partita"),
    KafkaConfig("message.timestamp.type", None, TYPE_STRING, "LogAppendTime",
                "a record's timestamp is its entry ID's milliseconds"),
    KafkaConfig("compression.type", None, TYPE_STRING, "uncompressed", "entries are stored uncompressed"),
)
ALL = MAPPED + OWN + FIXED
BY_KAFKA = {c.kafka: c for c in ALL}
BY_PARTITA = {c.partita: c for c in MAPPED + OWN}


class ConfigRefused(ValueError):
    """A config name or value Kafka's INVALID_CONFIG answers; the message says why."""


def partita_pairs(configs: list[tuple[str, str | None]]) -> list[tuple[bytes, bytes]]:
    """Partita's ``(name, value)`` pairs for Kafka ``(name, value)`` configs. Raises
    ConfigRefused (a null value too, as Kafka's ``ReplicationControlManager`` does)."""
    nulls = [name for name, value in configs if value is None]
    if nulls:
        raise ConfigRefused("Null value not supported for topic configs: " + ",".join(nulls))
    pairs = []
    for name, value in configs:
        known = BY_KAFKA.get(name)
        if known is None:
            raise ConfigRefused(f"unknown topic config '{name}' (known: {', '.join(c.kafka for c in ALL)})")
        if known.partita is None:
            if value != known.fixed:
                raise ConfigRefused(f"{name} can only be '{known.fixed}' ({known.doc})")
            continue
        pairs.append((known.partita.encode(), value.strip().encode()))  # (Kafka's ConfigDef trims values)
    return pairs


def text(value) -> str:
    return str(value)


def doc(config: KafkaConfig) -> str:
    if config.partita is None:
        return config.doc
    return f"Partita's {config.partita}: {_DOCS.get(config.partita, '')}"
