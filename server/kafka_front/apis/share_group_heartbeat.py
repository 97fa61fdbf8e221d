"""ShareGroupHeartbeat (key 76): a share consumer joins, stays in and leaves its share group (KIP-932).

Version 1 (the member generates its own id). The coordinator of the group
(``group_checks.refusal``: NOT_COORDINATOR elsewhere,
GROUP_AUTHORIZATION_FAILED without the XREAD right) keeps the membership
(``share_groups.ShareGroups``): epoch 0 joins with the subscribed topic
names, -1 leaves, another epoch is a heartbeat (FENCED_MEMBER_EPOCH for a
stale epoch, UNKNOWN_MEMBER_ID for a member it does not know; INVALID_REQUEST
for an empty member id or a first heartbeat without topics). The assignment
(sent when it changes) is every partition of each subscribed topic that
exists and the user may read (XREADGROUP on it), by topic ID; members share
partitions, records go to one member at a time by acquisition (ShareFetch).

Members that stopped heartbeating for ``share_groups.SESSION_TIMEOUT_MS``,
and a member leaving, release what they hold and their consumer is deleted
from the Redis groups, and their share sessions on this node close
(``share_requests.release_member``).
"""

from __future__ import annotations

import trio

from server.kafka import codec
from server.kafka import errors as E
from server.kafka_front import access, share_requests
from server.kafka_front.group_checks import refusal
from server.kafka_front.share_groups import HEARTBEAT_INTERVAL_MS

API_KEY = 76
NAME = "ShareGroupHeartbeat"
VERSIONS = (1, 1)

R = codec.ShareGroupHeartbeatResponse


async def handle(ctx, req):
    body = req.body
    front, session = ctx.front, ctx.session
    if not body.group_id:
        return R(error_code=E.INVALID_REQUEST, error_message="GroupId can't be empty.")
    error = refusal(ctx, body.group_id)
    if error is not None:
        return R(error_code=error)
    now_s = trio.current_time()
    groups = front.share_groups
    share_requests.expire(ctx, now_s)

    def partitions_of(name: str) -> int | None:
        topic = name.encode()
        layout = session.record_topics([topic]).get(topic)
        if layout is None or not access.allowed(ctx, access.SHARE_ACQUIRE, topic):
            return None
        return len(layout.partitions)

    client = ctx.client
    beat, member = groups.heartbeat(
        body.group_id, body.member_id, body.member_epoch, body.subscribed_topic_names, partitions_of, now_s,
        client_id=client.name.decode("utf-8", "replace") if client.name else "",
        client_host=f"/{client.addr.rsplit(':', 1)[0]}" if client.addr else "", rack_id=body.rack_id)
    if beat.error == E.NONE and beat.member_epoch == -1 and member is not None:
        share_requests.release_member(ctx, body.group_id, member)
    response = R(error_code=beat.error, error_message=beat.message, member_epoch=beat.member_epoch,
                 heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS,
                 member_id=body.member_id if beat.error == E.NONE else None)
    if beat.assignment is not None:
        response.assignment = R.Assignment(topic_partitions=[
            R.TopicPartitions(topic_id=front.topic_uuid(session, name.encode()), partitions=list(parts))
            for name, parts in beat.assignment.items()])
    return share_requests.answer_when_written(ctx, response, lambda error: None)  # (releases: best effort)
