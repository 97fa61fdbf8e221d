"""JoinGroup (key 11): a member joins a group; answered once the rebalance completes.

Versions 0-9. The coordinator's state machine is ``groups.Coordinator.join``
(generations, the rebalance timeout, static membership, the protocol
vote); this module checks the coordinator and the right, and shapes the
answer: the leader gets every member's metadata for the chosen protocol,
the others none. Rebalance timeout: v1+, else the session timeout. v4+ with
no member id: MEMBER_ID_REQUIRED with the member id to join with
(KIP-394). ``skip_assignment`` (v9) is always false (no server-side
assignor for classic groups). The request waits (the connection handles
nothing else meanwhile, as a Kafka broker's) until the join completes.

Errors: NOT_COORDINATOR, GROUP_AUTHORIZATION_FAILED (no XREAD right),
INVALID_GROUP_ID, INVALID_SESSION_TIMEOUT (outside 6 s - 30 min),
INCONSISTENT_GROUP_PROTOCOL, UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID,
MEMBER_ID_REQUIRED, COORDINATOR_NOT_AVAILABLE.
"""

from __future__ import annotations

from server.kafka import codec
from server.kafka_front.group_checks import refusal

API_KEY = 11
NAME = "JoinGroup"
VERSIONS = (0, 9)

R = codec.JoinGroupResponse


async def handle(ctx, req):
    body = req.body
    error = refusal(ctx, body.group_id)
    if error is not None:
        return R(error_code=error, member_id=body.member_id, protocol_name="", leader="")
    host = ctx.client.addr.rsplit(":", 1)[0] if isinstance(ctx.client.addr, str) else ""
    result = await ctx.front.groups.join(
        body.group_id, body.member_id, body.group_instance_id, body.session_timeout_ms,
        body.rebalance_timeout_ms if req.api_version >= 1 else body.session_timeout_ms,
        body.protocol_type, [(p.name, p.metadata) for p in body.protocols], req.client_id or "",
        "/" + host, req.api_version >= 4)
    return R(error_code=result.error, generation_id=result.generation, protocol_type=result.protocol_type,
             protocol_name=result.protocol if result.protocol is not None or req.api_version >= 7 else "",
             leader=result.leader, member_id=result.member_id,
             members=[R.JoinGroupResponseMember(member_id=m, group_instance_id=i, metadata=md)
                      for m, i, md in result.members])
