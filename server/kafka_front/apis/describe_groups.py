"""DescribeGroups (key 15): each group's state, protocol and members.

Versions 0-6. Members carry their metadata and assignment once the group is
Stable (as Kafka: none while it rebalances). A consumer group (KIP-848) is
shown too, where Kafka 4 answers GROUP_ID_NOT_FOUND, so that classic-only
tools see it: protocol type ``consumer``, protocol its assignor, each
member's subscription and current assignment in the classic encodings. A group this node does not
know: state Dead (v6+: GROUP_ID_NOT_FOUND). Errors per group:
NOT_COORDINATOR, GROUP_AUTHORIZATION_FAILED (no XINFO GROUPS right).
"""

from __future__ import annotations

from server.kafka import codec
from server.kafka import errors as E
from server.kafka_front import access
from server.kafka_front.groups import DEAD, STABLE, encode_assignment, encode_subscription
from server.kafka_front.group_checks import refusal

API_KEY = 15
NAME = "DescribeGroups"
VERSIONS = (0, 6)

R = codec.DescribeGroupsResponse


async def handle(ctx, req):
    coordinator = ctx.front.groups
    out = []
    for gid in req.body.groups:
        error = refusal(ctx, gid, access.GROUP_DESCRIBE)
        if error is not None:
            out.append(R.DescribedGroup(error_code=error, group_id=gid, group_state=DEAD, protocol_type="",
                                        protocol_data=""))
            continue
        state = coordinator.state_of(gid)
        if state == DEAD and req.api_version >= 6:
            out.append(R.DescribedGroup(error_code=E.GROUP_ID_NOT_FOUND, error_message=f"Group {gid} not found.",
                                        group_id=gid, group_state=DEAD, protocol_type="", protocol_data=""))
            continue
        if coordinator.is_consumer_group(gid):
            out.append(_consumer_group(ctx, gid))
            continue
        g = coordinator.groups.get(gid)
        members = []
        if g is not None:
            full = g.state == STABLE
            members = [R.DescribedGroupMember(
                member_id=m.member_id, group_instance_id=m.instance_id, client_id=m.client_id,
                client_host=m.client_host, member_metadata=m.metadata(g.protocol or "") if full else b"",
                member_assignment=m.assignment if full else b"") for m in g.members.values()]
        out.append(R.DescribedGroup(error_code=E.NONE, group_id=gid, group_state=state,
                                    protocol_type=(g.protocol_type or "") if g else "",
                                    protocol_data=(g.protocol or "") if g else "", members=members))
    return R(groups=out)


def _consumer_group(ctx, gid: str):
    g = ctx.front.consumer_groups.groups[gid]
    members = [R.DescribedGroupMember(
        member_id=m.member_id, group_instance_id=m.instance_id, client_id=m.client_id, client_host=m.client_host,
        member_metadata=encode_subscription(m.names), member_assignment=encode_assignment(m.assigned))
        for m in g.members.values()]
    return R.DescribedGroup(error_code=E.NONE, group_id=gid, group_state=g.state, protocol_type="consumer",
                            protocol_data=g.assignor, members=members)
