"""OffsetDelete (key 47): forget some committed offsets of a group.

Version 0. A partition of a topic the group's members subscribe to is
answered GROUP_SUBSCRIBED_TO_TOPIC (a consumer group: its members'
subscriptions; a KIP-848 group: the topics they match); a non-empty group of another protocol type
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
from server.kafka_front.group_checks import answer_when_written, refusal, write_error

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
    if coordinator.is_consumer_group(body.group_id):  # KIP-848: the topics its members' subscriptions match
        subscribed = set(ctx.front.consumer_groups.groups[body.group_id].partitions)
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
        coordinator.store.delete_offsets(ctx.session, body.group_id, todo)
    except Exception as exc:  # noqa: BLE001 - every refusal of the append is the request's error
        return R(error_code=write_error(exc))
    response = R(error_code=E.NONE, topics=topics)

    def fail(error: int) -> None:
        response.error_code = error
        response.topics = []

    return answer_when_written(ctx, response, fail, "offset deletion", body.group_id)
