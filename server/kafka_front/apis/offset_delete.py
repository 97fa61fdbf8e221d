"""OffsetDelete (key 47): forget some committed offsets of a group.

Version 0. A partition of a topic the group's members subscribe to is
answered GROUP_SUBSCRIBED_TO_TOPIC (a consumer group: its members'
subscriptions); a non-empty group of another protocol type
NON_EMPTY_GROUP. Errors: NOT_COORDINATOR, GROUP_AUTHORIZATION_FAILED (no
XGROUP DESTROY right), GROUP_ID_NOT_FOUND, TOPIC_AUTHORIZATION_FAILED,
UNKNOWN_TOPIC_OR_PARTITION.
"""

from __future__ import annotations

from server.kafka import codec
from server.kafka import errors as E
from server.kafka_front import access
from server.kafka_front.apis.offset_commit import partition_error
from server.kafka_front.groups import DEAD
from server.kafka_front.group_checks import refusal
from storage.errors import StorageError

API_KEY = 47
NAME = "OffsetDelete"
VERSIONS = (0, 0)

R = codec.OffsetDeleteResponse


async def handle(ctx, req):
    body = req.body
    coordinator = ctx.front.groups
    error = refusal(ctx, body.group_id, access.GROUP_DELETE)
    if error is None and coordinator.store is None:
        error = E.COORDINATOR_NOT_AVAILABLE
    if error is None and coordinator.state_of(body.group_id) == DEAD:
        error = E.GROUP_ID_NOT_FOUND
    g = coordinator.groups.get(body.group_id)
    subscribed = g.subscribed_topics() if g is not None and g.members else set()
    if error is None and subscribed is None:
        error = E.NON_EMPTY_GROUP
    if error is not None:
        return R(error_code=error)
    topics, todo = [], []
    for t in body.topics:
        parts = []
        for p in t.partitions:
            code = E.GROUP_SUBSCRIBED_TO_TOPIC if t.name in subscribed else \
                partition_error(ctx, t.name.encode(), p.partition_index)
            if code == E.NONE:
                todo.append((t.name, p.partition_index))
            parts.append(R.OffsetDeleteResponsePartition(partition_index=p.partition_index, error_code=code))
        topics.append(R.OffsetDeleteResponseTopic(name=t.name, partitions=parts))
    try:
        await coordinator.store.delete_offsets(body.group_id, todo)
    except StorageError:
        return R(error_code=E.COORDINATOR_NOT_AVAILABLE)
    return R(error_code=E.NONE, topics=topics)
