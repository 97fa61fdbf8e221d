"""OffsetCommit (key 8): a group's consumed positions, made durable.

Versions 2-10 (v10: topics by topic ID). Who may commit is
``groups.Coordinator.check_commit`` (Kafka's rules for a classic group: a
member of the current generation; generation -1 for an Empty or missing
group, as a simple consumer or an admin tool commits; a generation for a
missing group GROUP_ID_NOT_FOUND from v9, ILLEGAL_GENERATION before), or for a
consumer group (KIP-848) ``consumer_groups.ConsumerCoordinator.check_commit``
(v9+, a member at its current member epoch, else STALE_MEMBER_EPOCH;
UNSUPPORTED_VERSION before v9; epoch -1 only once the group is empty); the offsets are
``offsets.OffsetStore``'s: appended to the group's internal stream, and
answered once fsynced and held by the in-sync replicas (docs/kafka.md,
"Committed offsets"). The retention time (v2-4) is ignored: offsets live
until the group is deleted (DeleteGroups, OffsetDelete).

Per partition: NOT_COORDINATOR, GROUP_AUTHORIZATION_FAILED (no XREAD
right), TOPIC_AUTHORIZATION_FAILED (may not read the topic),
UNKNOWN_TOPIC_OR_PARTITION (UNKNOWN_TOPIC_ID by ID),
OFFSET_METADATA_TOO_LARGE (over 4096 bytes), UNKNOWN_MEMBER_ID,
ILLEGAL_GENERATION, REBALANCE_IN_PROGRESS, FENCED_INSTANCE_ID, STALE_MEMBER_EPOCH,
COORDINATOR_NOT_AVAILABLE (the append was refused or not acknowledged),
REQUEST_TIMED_OUT (the replicas took over 5 s; the commit may be kept).
"""

from __future__ import annotations

import logging

from server.kafka import codec
from server.kafka import errors as E
from server.kafka_front import access
from server.kafka_front.group_checks import answer_when_written, refusal, write_error

log = logging.getLogger("partita.kafka")

API_KEY = 8
NAME = "OffsetCommit"
VERSIONS = (2, 10)

R = codec.OffsetCommitResponse

METADATA_MAX_BYTES = 4096  # Kafka's offset.metadata.max.bytes


def access_error(ctx, name: bytes | None, n: int) -> int:
    """Whether a group's offsets of partition ``n`` of topic ``name`` (None: an unknown topic ID)
    may be named, existing or not."""
    if name is None:
        return E.UNKNOWN_TOPIC_ID
    if not access.allowed(ctx, access.READ, name, n):
        return E.TOPIC_AUTHORIZATION_FAILED
    return E.NONE


def partition_error(ctx, name: bytes | None, n: int) -> int:
    """Whether a group may name partition ``n`` of topic ``name``: ``access_error``, and it exists."""
    error = access_error(ctx, name, n)
    if error != E.NONE:
        return error
    layout = ctx.session.record_topics([name])[name]
    if layout is None or not 0 <= n < len(layout.partitions):
        return E.UNKNOWN_TOPIC_OR_PARTITION
    return E.NONE


async def handle(ctx, req):
    body = req.body
    by_id = req.api_version >= 10
    group_error = refusal(ctx, body.group_id)
    if group_error is None and ctx.front.groups.store is None:  # no data directory to keep them in
        group_error = E.COORDINATOR_NOT_AVAILABLE
    if group_error is None and ctx.front.groups.is_consumer_group(body.group_id):
        group_error = ctx.front.consumer_groups.check_commit(body.group_id, body.member_id,
                                                             body.generation_id_or_member_epoch, req.api_version)
    elif group_error is None:
        group_error = ctx.front.groups.check_commit(body.group_id, body.generation_id_or_member_epoch,
                                                    body.member_id, body.group_instance_id, req.api_version)
    topics, todo = [], []
    for topic in body.topics:
        name = ctx.front.topic_name(ctx.session, topic.topic_id) if by_id else topic.name.encode()
        parts = []
        for p in topic.partitions:
            error = group_error if group_error != E.NONE else partition_error(ctx, name, p.partition_index)
            if error == E.NONE and p.committed_metadata is not None \
                    and len(p.committed_metadata.encode()) > METADATA_MAX_BYTES:
                error = E.OFFSET_METADATA_TOO_LARGE
            if error == E.NONE:
                todo.append((name.decode("utf-8", "surrogateescape"), p.partition_index, p.committed_offset,
                             p.committed_leader_epoch, p.committed_metadata or ""))
            parts.append(R.OffsetCommitResponsePartition(partition_index=p.partition_index, error_code=error))
        topics.append(R.OffsetCommitResponseTopic(name=topic.name, topic_id=topic.topic_id, partitions=parts))
    response = R(topics=topics)
    if not todo:
        return response

    def fail(error: int) -> None:
        for t in topics:
            for p in t.partitions:
                if p.error_code == E.NONE:
                    p.error_code = error

    try:
        ctx.front.groups.store.commit(ctx.session, body.group_id, todo)
    except Exception as exc:  # noqa: BLE001 - every refusal of the append is the commit's error
        log.error("Kafka group '%s': committing offsets failed: %s", body.group_id, exc)
        fail(write_error(exc))
        return response
    return answer_when_written(ctx, response, fail, "committed offsets", body.group_id)
