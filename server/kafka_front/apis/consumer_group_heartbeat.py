"""ConsumerGroupHeartbeat (key 68): a member of a consumer group (KIP-848) joins, heartbeats, leaves.

Versions 0-1 (v1: the topic regex, and the member names itself, KIP-1082;
librdkafka 2.16 sends v1 only). The state machine is
``consumer_groups.ConsumerCoordinator.heartbeat`` (epochs, the server-side
assignors, incremental reconciliation); this module checks the
coordinator, the right and the request as Kafka does, turns topic IDs into
names and back, and answers at once. Topics are every topic but the
groups' offsets streams; a regex must match a whole topic name (Python's
``re``, where Kafka uses RE2/J).

Errors: NOT_COORDINATOR, GROUP_AUTHORIZATION_FAILED (no XREAD right),
INVALID_REQUEST (a field Kafka requires is missing or empty),
GROUP_ID_NOT_FOUND (no such group for a member epoch other than 0, or
the group is a classic group with members), UNKNOWN_MEMBER_ID,
FENCED_MEMBER_EPOCH, FENCED_INSTANCE_ID, UNRELEASED_INSTANCE_ID,
UNSUPPORTED_ASSIGNOR, INVALID_REGULAR_EXPRESSION, GROUP_MAX_SIZE_REACHED.
"""

from __future__ import annotations

from server.kafka import codec
from server.kafka import errors as E
from server.kafka_front.consumer_groups import LEAVE_STATIC, HeartbeatError
from server.kafka_front.group_checks import refusal
from server.kafka_front.offsets import is_offsets_key

API_KEY = 68
NAME = "ConsumerGroupHeartbeat"
VERSIONS = (0, 1)

R = codec.ConsumerGroupHeartbeatResponse


def invalid(body, version: int) -> str | None:
    """Why Kafka refuses this request as INVALID_REQUEST, or None."""
    if not body.group_id:
        return "GroupId can't be empty."
    if body.instance_id == "":
        return "InstanceId can't be empty."
    if body.rack_id == "":
        return "RackId can't be empty."
    if not body.member_id and (version >= 1 or body.member_epoch != 0):
        return "MemberId can't be empty."
    if body.member_epoch == 0:
        if body.rebalance_timeout_ms == -1:
            return "RebalanceTimeoutMs must be provided in first request."
        if body.topic_partitions:
            return "TopicPartitions must be empty when (re-)joining."
        if body.subscribed_topic_names is None and body.subscribed_topic_regex is None:
            return "SubscribedTopicNames or SubscribedTopicRegex must be set in first request."
    elif body.member_epoch == LEAVE_STATIC and body.instance_id is None:
        return "InstanceId can't be null."
    elif body.member_epoch < LEAVE_STATIC:
        return f"MemberEpoch {body.member_epoch} is invalid."
    return None


async def handle(ctx, req):
    body = req.body
    error = refusal(ctx, body.group_id)
    if error is not None:
        return R(error_code=error)
    why = invalid(body, req.api_version)
    if why is not None:
        return R(error_code=E.INVALID_REQUEST, error_message=why)
    if ctx.front.groups.has_members(body.group_id):  # a group is of one type while it has members
        return R(error_code=E.GROUP_ID_NOT_FOUND, error_message=f"Group {body.group_id} is not a consumer group.")
    session = ctx.session
    topics = {name.decode("utf-8", "surrogateescape"): len(layout.partitions)
              for name, layout in session.record_topics().items() if layout is not None and not is_offsets_key(name)}
    owned = None
    if body.topic_partitions is not None:
        owned = {}
        for tp in body.topic_partitions:
            name = ctx.front.topic_name(session, tp.topic_id)
            if name is not None:
                owned.setdefault(name.decode("utf-8", "surrogateescape"), set()).update(tp.partitions)
    host = ctx.client.addr.rsplit(":", 1)[0] if isinstance(ctx.client.addr, str) else ""
    coordinator = ctx.front.consumer_groups
    try:
        beat = coordinator.heartbeat(
            body.group_id, body.member_id, body.member_epoch, body.instance_id, body.rack_id,
            body.rebalance_timeout_ms, body.subscribed_topic_names,
            body.subscribed_topic_regex if req.api_version >= 1 else None, body.server_assignor, owned, topics,
            req.client_id or "", "/" + host)
    except HeartbeatError as e:
        return R(error_code=e.code, error_message=e.message)
    assignment = None
    if beat.assignment is not None:
        assignment = R.Assignment(topic_partitions=[
            R.TopicPartitions(topic_id=ctx.front.topic_uuid(session, t.encode("utf-8", "surrogateescape")),
                              partitions=sorted(ps))
            for t, ps in sorted(beat.assignment.items())])
    return R(error_code=E.NONE, member_id=beat.member_id, member_epoch=beat.member_epoch,
             heartbeat_interval_ms=coordinator.heartbeat_interval_ms, assignment=assignment)
