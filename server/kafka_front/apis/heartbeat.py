"""Heartbeat (key 12): a member is alive.

Versions 0-4. ``groups.Coordinator.heartbeat``: the member's session timeout
starts again; REBALANCE_IN_PROGRESS tells it to join again. Errors:
NOT_COORDINATOR, GROUP_AUTHORIZATION_FAILED, UNKNOWN_MEMBER_ID,
ILLEGAL_GENERATION, FENCED_INSTANCE_ID, COORDINATOR_NOT_AVAILABLE.
"""

from __future__ import annotations

from server.kafka import codec
from server.kafka_front.group_checks import refusal

API_KEY = 12
NAME = "Heartbeat"
VERSIONS = (0, 4)

R = codec.HeartbeatResponse


async def handle(ctx, req):
    body = req.body
    error = refusal(ctx, body.group_id)
    if error is None:
        error = ctx.front.groups.heartbeat(body.group_id, body.generation_id, body.member_id,
                                           body.group_instance_id)
    return R(error_code=error)
