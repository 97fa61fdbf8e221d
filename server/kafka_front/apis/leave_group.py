"""LeaveGroup (key 13): members leave at once; the group rebalances.

Versions 0-5 (v3+: several members, by member id or by
``group.instance.id``, each with its own error). Errors: NOT_COORDINATOR,
GROUP_AUTHORIZATION_FAILED, UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID.
"""

from __future__ import annotations

from server.kafka import codec
from server.kafka import errors as E
from server.kafka_front.group_checks import refusal

API_KEY = 13
NAME = "LeaveGroup"
VERSIONS = (0, 5)

R = codec.LeaveGroupResponse


async def handle(ctx, req):
    body = req.body
    v3 = req.api_version >= 3
    leaving = [(m.member_id, m.group_instance_id) for m in body.members] if v3 else [(body.member_id, None)]
    error = refusal(ctx, body.group_id)
    if error is not None:
        return R(error_code=error)
    error, codes = ctx.front.groups.leave(body.group_id, leaving)
    if not v3:
        return R(error_code=error if error != E.NONE else codes[0])
    return R(error_code=error, members=[R.MemberResponse(member_id=m, group_instance_id=i, error_code=c)
                                        for (m, i), c in zip(leaving, codes)])
