"""ListGroups (key 16): the groups this node coordinates.

Versions 0-5: the groups with members and those with committed offsets
(Empty), filtered by state (v4+) and type (v5+): ``consumer`` for a group
of the consumer protocol (KIP-848) with members (protocol type
``consumer``, states Assigning, Reconciling, Stable), ``classic`` for the
others (a consumer group left with no members is forgotten but for its
offsets, so it is listed as an Empty classic group), and ``share`` for a
share group (KIP-932) with members (protocol type ``share``, state Stable;
one whose members are all gone is forgotten: its records stay in the Redis
group of its name). A user that may not run XINFO GROUPS sees none (Kafka
lists the groups the user may describe).
"""

from __future__ import annotations

from server.kafka import codec
from server.kafka import errors as E
from server.kafka_front import access

API_KEY = 16
NAME = "ListGroups"
VERSIONS = (0, 5)

R = codec.ListGroupsResponse

CLASSIC = "classic"
CONSUMER = "consumer"
SHARE = "share"


async def handle(ctx, req):
    body = req.body
    if not access.group_allowed(ctx, access.GROUP_DESCRIBE):
        return R(error_code=E.NONE, groups=[])
    groups = ctx.front.groups
    states = {s.lower() for s in body.states_filter} if req.api_version >= 4 else set()
    types = {t.lower() for t in body.types_filter} if req.api_version >= 5 else set()
    listed = []  # (group id, kind, protocol type, state)
    for gid in groups.group_ids():
        kind = CONSUMER if groups.is_consumer_group(gid) else CLASSIC
        known = groups.groups.get(gid)
        protocol_type = CONSUMER if kind == CONSUMER else (known.protocol_type or "") if known else ""
        listed.append((gid, kind, protocol_type, groups.state_of(gid)))
    listed += [(gid, SHARE, SHARE, "Stable") for gid in ctx.front.share_groups.groups]
    return R(error_code=E.NONE, groups=[
        R.ListedGroup(group_id=gid, protocol_type=protocol_type, group_state=state, group_type=kind)
        for gid, kind, protocol_type, state in listed
        if not (states and state.lower() not in states) and not (types and kind not in types)])
