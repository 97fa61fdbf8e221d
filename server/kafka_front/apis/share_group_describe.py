"""ShareGroupDescribe (key 77): each share group's state, epoch and members with their assignments (KIP-932).

Version 1. A group this node coordinates with members is Stable, its
assignor ``simple``; one it does not know (never joined, or every member
gone: the membership is forgotten, the records stay in the Redis groups)
is answered GROUP_ID_NOT_FOUND with state Dead. Errors per group:
NOT_COORDINATOR, GROUP_AUTHORIZATION_FAILED (no XINFO GROUPS right).
Authorized operations are not computed (the field's "not asked" value).
"""

from __future__ import annotations

import trio

from server.kafka import codec
from server.kafka import errors as E
from server.kafka_front import access, share_requests
from server.kafka_front.group_checks import refusal
from server.kafka_front.share_groups import ASSIGNOR

API_KEY = 77
NAME = "ShareGroupDescribe"
VERSIONS = (1, 1)

R = codec.ShareGroupDescribeResponse


async def handle(ctx, req):
    front, session = ctx.front, ctx.session
    groups = front.share_groups
    share_requests.expire(ctx, trio.current_time())
    out = []
    for gid in req.body.group_ids:
        error = refusal(ctx, gid, access.GROUP_DESCRIBE)
        group = groups.groups.get(gid) if error is None else None
        if error is None and group is None:
            error = E.GROUP_ID_NOT_FOUND
        if error is not None:
            out.append(R.DescribedGroup(error_code=error, group_id=gid, group_state="Dead",
                                        error_message=f"Group {gid} not found." if error == E.GROUP_ID_NOT_FOUND
                                        else None))
            continue
        members = [R.Member(
            member_id=m.member_id, rack_id=m.rack_id, member_epoch=m.epoch, client_id=m.client_id,
            client_host=m.client_host, subscribed_topic_names=list(m.topics),
            assignment=R.Assignment(topic_partitions=[
                R.TopicPartitions(topic_id=front.topic_uuid(session, name.encode()), topic_name=name,
                                  partitions=list(parts))
                for name, parts in m.assigned.items()]))
            for m in group.members.values()]
        out.append(R.DescribedGroup(group_id=gid, group_state="Stable", group_epoch=group.epoch,
                                    assignment_epoch=group.epoch, assignor_name=ASSIGNOR, members=members))
    return share_requests.answer_when_written(ctx, R(groups=out), lambda error: None)  # (expiries' releases)
