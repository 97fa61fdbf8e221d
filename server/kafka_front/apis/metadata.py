"""Metadata (key 3): the brokers, the cluster, and each topic's partitions with their leaders.

Versions 0-13. Brokers: every node's Kafka listener of the kind the client
came through (``KafkaFront.endpoints``). Each partition: its leader and
leader epoch, replicas and in-sync replicas from the committed cluster
metadata (on a single node: this node, epoch 0). A missing topic is created
with ``default-partitions`` when ``auto-create-topics`` is yes and the
request allows it (v4+; before v4 requests always do), as Kafka's
``auto.create.topics.enable``; else UNKNOWN_TOPIC_OR_PARTITION. A missing
topic under a name Kafka refuses (``topic_name_error``: '.', '..', more
than 249 characters, any but ASCII letters, digits, '.', '_', '-') is
INVALID_TOPIC_EXCEPTION, auto-create or not, as Kafka answers; so is one
auto-creation would make next to a topic it collides with
(``topic_collision``: '.' against '_'). Topics are
named, or (v10+) identified by their topic IDs (UNKNOWN_TOPIC_ID).
Partita's internal streams (a group's offsets ``__kafka_offsets{<group>}``,
a topic group's membership: ``cluster.topics.is_internal``) are not listed, and named they are INVALID_TOPIC_EXCEPTION. A user sees the topics it may do anything on (``access``:
its ACL rules); asked for by name, another is TOPIC_AUTHORIZATION_FAILED,
and so is a missing one that would be auto-created for a user who may not
TOPIC CREATE it, as Kafka answers. Authorized operations, when asked for
(v8+), are the user's on each topic (every one for an unrestricted user).
"""

from __future__ import annotations

import re

from cluster.topics import TopicError, is_internal
from server.kafka import codec
from server.kafka import errors as E
from server.kafka_front import access
from server.kafka_front.errors import code_for, handled

API_KEY = 3
NAME = "Metadata"
VERSIONS = (0, 13)

R = codec.MetadataResponse
# Kafka's AclOperation codes the cluster allows (ALTER, DESCRIBE, CLUSTER_ACTION,
# DESCRIBE_CONFIGS, ALTER_CONFIGS, CREATE, IDEMPOTENT_WRITE ...); a topic's: ``access``.
CLUSTER_OPERATIONS = sum(1 << op for op in (5, 7, 8, 9, 10, 11, 12))
MAX_TOPIC_NAME_BYTES = 249  # Kafka's limit
_LEGAL_TOPIC_NAME = re.compile(rb"[a-zA-Z0-9._-]+")


def topic_name_error(name: bytes) -> str | None:
    """Why Kafka could not have a topic of this name, in ``Topic.validate``'s words, or None. A
    topic is created from the Kafka port only under such a name; one made through Redis keeps any
    name."""
    shown = name.decode("utf-8", "replace")
    if not name:
        why = "the empty string is not allowed"
    elif name in (b".", b".."):
        why = f"'{shown}' is not allowed"
    elif len(name) > MAX_TOPIC_NAME_BYTES:
        why = f"the length of '{shown}' is longer than the max allowed length {MAX_TOPIC_NAME_BYTES}"
    elif not _LEGAL_TOPIC_NAME.fullmatch(name):
        why = f"'{shown}' contains one or more characters other than ASCII alphanumerics, '.', '_' and '-'"
    else:
        return None
    return "Topic name is invalid: " + why


def missing_topic_name_error(session, name: bytes) -> str | None:
    """``topic_name_error`` for a name no topic has: what a Kafka broker answers (INVALID_TOPIC_EXCEPTION)
    before looking a topic up, where it validates the name first (DescribeConfigs, AlterConfigs).
    None for an existing topic, whatever its name."""
    why = topic_name_error(name)
    if why is None:
        return None
    try:
        session.require_topic(name)
    except TopicError:
        return why
    return None


def topic_collision(session, name: bytes) -> str | None:
    """Why Kafka would not create ``name`` next to an existing topic that differs from it only in
    '.' against '_' (one character in Kafka's metric names), or None (no such topic, or ``name``
    itself exists)."""
    if b"." not in name and b"_" not in name:
        return None
    unified = name.replace(b".", b"_")
    existing = session.topic_names()
    if name in existing:
        return None
    for other in existing:
        if other.replace(b".", b"_") == unified:
            return f"Topic '{name.decode()}' collides with existing topic: {other.decode('utf-8', 'replace')}"
    return None


def topic_entry(ctx, name: bytes, layout, with_operations: bool):
    """One topic of a Metadata response (``layout`` from ``record_topics``)."""
    parts = [R.MetadataResponsePartition(
        error_code=E.NONE if p.leader >= 0 else E.LEADER_NOT_AVAILABLE, partition_index=n,
        leader_id=p.leader, leader_epoch=p.leader_epoch, replica_nodes=p.replicas, isr_nodes=p.isr)
        for n, p in enumerate(layout.partitions)]
    return R.MetadataResponseTopic(
        name=name.decode("utf-8", "replace"), topic_id=ctx.front.uuid_of(name, layout.topic_id),
        partitions=parts,
        topic_authorized_operations=access.operation_bits(ctx, name, len(parts)) if with_operations else -2147483648)


async def handle(ctx, req):
    body, version = req.body, req.api_version
    session = ctx.session
    operations = version >= 8 and body.include_topic_authorized_operations
    topics = []
    if body.topics is None or (version == 0 and not body.topics):  # v0: an empty list means all
        for name, layout in session.record_topics().items():
            if not is_internal(name) and access.may_describe(ctx, name, len(layout.partitions)):
                topics.append(topic_entry(ctx, name, layout, operations))
    else:
        auto = ctx.config.auto_create_topics and (version < 4 or body.allow_auto_topic_creation)
        for wanted in body.topics:
            if wanted.name is None:  # v12+: by topic ID only
                name = ctx.front.topic_name(session, wanted.topic_id)
                if name is None:
                    topics.append(R.MetadataResponseTopic(error_code=E.UNKNOWN_TOPIC_ID, name=None,
                                                          topic_id=wanted.topic_id))
                    continue
            else:
                name = wanted.name.encode()
            topics.append(_named(ctx, name, auto, operations))
    endpoints = ctx.front.endpoints(ctx)
    return R(brokers=[R.MetadataResponseBroker(node_id=e.node_id, host=e.host, port=e.port) for e in endpoints],
             cluster_id=ctx.front.cluster_id(), controller_id=session.controller_id(), topics=topics,
             cluster_authorized_operations=(CLUSTER_OPERATIONS if 8 <= version <= 10
                                            and body.include_cluster_authorized_operations else -2147483648))


def _named(ctx, name: bytes, auto: bool, operations: bool):
    session = ctx.session
    shown = name.decode("utf-8", "replace")
    layout = None if is_internal(name) else session.record_topics([name])[name]
    if layout is None and (is_internal(name) or topic_name_error(name)):
        return R.MetadataResponseTopic(error_code=E.INVALID_TOPIC_EXCEPTION, name=shown)
    if not access.may_describe(ctx, name, len(layout.partitions) if layout is not None else 0) or (
            layout is None and auto and not access.allowed(ctx, access.CREATE, name)):
        return R.MetadataResponseTopic(error_code=E.TOPIC_AUTHORIZATION_FAILED, name=shown)
    if layout is None and auto:
        if topic_collision(session, name) is not None:
            return R.MetadataResponseTopic(error_code=E.INVALID_TOPIC_EXCEPTION, name=shown)
        try:
            session.create_topic(name)
        except Exception as exc:  # noqa: BLE001 - refused (another node made it meanwhile...)
            if not handled(exc):
                raise
            if code_for(exc) != E.TOPIC_ALREADY_EXISTS:
                return R.MetadataResponseTopic(error_code=code_for(exc), name=shown)
        layout = session.record_topics([name])[name]
    if layout is None:
        return R.MetadataResponseTopic(error_code=E.UNKNOWN_TOPIC_OR_PARTITION, name=shown)
    return topic_entry(ctx, name, layout, operations)
