"""DeleteGroups (key 42): forget groups with no members, and their committed offsets.

Versions 0-2. Per group: NOT_COORDINATOR, GROUP_AUTHORIZATION_FAILED (no
XGROUP DESTROY right), NON_EMPTY_GROUP (it has members), GROUP_ID_NOT_FOUND,
COORDINATOR_NOT_AVAILABLE (the deletion could not be written to its offsets
stream, or was not acknowledged).
"""

from __future__ import annotations

from server.kafka import codec
from server.kafka import errors as E
from server.kafka_front import access
from server.kafka_front.group_checks import answer_when_written, refusal, write_error

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
                coordinator.store.delete_group(ctx.session, gid)
            except Exception as exc:  # noqa: BLE001 - every refusal of the append is the group's error
                error = write_error(exc)
        out.append(R.DeletableGroupResult(group_id=gid, error_code=error))
    response = R(results=out)

    def fail(error: int) -> None:
        for r in out:
            if r.error_code == E.NONE:
                r.error_code = error

    return answer_when_written(ctx, response, fail, "deletion", ",".join(req.body.groups_names))
