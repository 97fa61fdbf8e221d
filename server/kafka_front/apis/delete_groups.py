"""DeleteGroups (key 42): forget groups with no members, and their committed offsets.

Versions 0-2. Per group: NOT_COORDINATOR, GROUP_AUTHORIZATION_FAILED (no
XGROUP DESTROY right), NON_EMPTY_GROUP (it has members), GROUP_ID_NOT_FOUND,
COORDINATOR_NOT_AVAILABLE (the journal could not be written).
"""

from __future__ import annotations

from server.kafka import codec
from server.kafka import errors as E
from server.kafka_front import access
from server.kafka_front.group_checks import refusal
from storage.errors import StorageError

API_KEY = 42
NAME = "DeleteGroups"
VERSIONS = (0, 2)

R = codec.DeleteGroupsResponse


async def handle(ctx, req):
    coordinator = ctx.front.groups
    out = []
    for gid in req.body.groups_names:
        error = refusal(ctx, gid, access.GROUP_DELETE)
        if error is None:
            error = coordinator.delete(gid)
        if error == E.NONE and coordinator.store is not None:
            try:
                await coordinator.store.delete_group(gid)
            except StorageError:
                error = E.COORDINATOR_NOT_AVAILABLE
        out.append(R.DeletableGroupResult(group_id=gid, error_code=error))
    return R(results=out)
