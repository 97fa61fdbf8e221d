"""SyncGroup (key 14): the leader's assignments, relayed to each member.

Versions 0-5. ``groups.Coordinator.sync``: the leader's request completes the
rebalance (the group is then Stable) and every member's waiting SyncGroup
gets its assignment; a follower's waits for the leader's. The assignment
bytes are the client's assignor's (range, roundrobin, cooperative-sticky
...): the broker only relays them.

Errors: NOT_COORDINATOR, GROUP_AUTHORIZATION_FAILED, UNKNOWN_MEMBER_ID,
ILLEGAL_GENERATION, REBALANCE_IN_PROGRESS (a new rebalance started: join
again), INCONSISTENT_GROUP_PROTOCOL (v5's protocol type or name not the
group's), FENCED_INSTANCE_ID.
"""

from __future__ import annotations

from server.kafka import codec
from server.kafka_front.group_checks import refusal

API_KEY = 14
NAME = "SyncGroup"
VERSIONS = (0, 5)

R = codec.SyncGroupResponse


async def handle(ctx, req):
    body = req.body
    error = refusal(ctx, body.group_id)
    if error is not None:
        return R(error_code=error, assignment=b"")
    error, protocol_type, protocol, assignment = await ctx.front.groups.sync(
        body.group_id, body.generation_id, body.member_id, body.group_instance_id,
        body.protocol_type, body.protocol_name, {a.member_id: a.assignment for a in body.assignments})
    return R(error_code=error, protocol_type=protocol_type, protocol_name=protocol, assignment=assignment)
