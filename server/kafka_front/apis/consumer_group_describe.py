"""ConsumerGroupDescribe (key 69): a consumer group's (KIP-848) epochs, assignor and members.

Versions 0-1 (v1: each member's type, always 1, the consumer protocol).
Per member: its epoch, subscription, current assignment and target
assignment (``consumer_groups``). Per group: NOT_COORDINATOR,
GROUP_AUTHORIZATION_FAILED (no XINFO GROUPS right), INVALID_GROUP_ID (an
empty id), GROUP_ID_NOT_FOUND (no consumer group of that id with members:
a classic group, or one known only by its committed offsets).
"""

from __future__ import annotations

from server.kafka import codec
from server.kafka import errors as E
from server.kafka_front import access
from server.kafka_front.group_checks import refusal

API_KEY = 69
NAME = "ConsumerGroupDescribe"
VERSIONS = (0, 1)

R = codec.ConsumerGroupDescribeResponse
CONSUMER_MEMBER = 1  # KIP-1099's member type: a member of the consumer protocol


def _assignment(ctx, assigned) -> R.Assignment:
    return R.Assignment(topic_partitions=[
        R.TopicPartitions(topic_id=ctx.front.topic_uuid(ctx.session, t.encode("utf-8", "surrogateescape")),
                          topic_name=t, partitions=sorted(ps))
        for t, ps in sorted(assigned.items())])


def _described(ctx, gid: str):
    if not gid:
        return R.DescribedGroup(error_code=E.INVALID_GROUP_ID, error_message="GroupId can't be empty.", group_id=gid)
    error = refusal(ctx, gid, access.GROUP_DESCRIBE)
    if error is not None:
        return R.DescribedGroup(error_code=error, group_id=gid)
    g = ctx.front.consumer_groups.groups.get(gid)
    if g is None:
        why = "is not a consumer group" if ctx.front.groups.has_members(gid) else "not found"
        return R.DescribedGroup(error_code=E.GROUP_ID_NOT_FOUND, error_message=f"Group {gid} {why}.", group_id=gid)
    members = [R.Member(member_id=m.member_id, instance_id=m.instance_id, rack_id=m.rack_id, member_epoch=m.epoch,
                        client_id=m.client_id, client_host=m.client_host, subscribed_topic_names=list(m.names),
                        subscribed_topic_regex=m.regex, assignment=_assignment(ctx, m.assigned),
                        target_assignment=_assignment(ctx, g.target.get(m.member_id, {})),
                        member_type=CONSUMER_MEMBER)
               for m in g.members.values()]
    return R.DescribedGroup(error_code=E.NONE, group_id=gid, group_state=g.state, group_epoch=g.epoch,
                            assignment_epoch=g.assignment_epoch, assignor_name=g.assignor, members=members)


async def handle(ctx, req):
    return R(groups=[_described(ctx, gid) for gid in req.body.group_ids])
