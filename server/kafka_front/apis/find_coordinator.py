"""FindCoordinator (key 10): which node coordinates a group.

Versions 0-6 (v4+: several keys in one request, KIP-699). A group (key type
0) is coordinated by the node leading the hash slot of its id (on a single
node: this node; ``KafkaFront.coordinator_of``), so every node gives the
same answer from the committed cluster metadata; a slot with no leader now
is COORDINATOR_NOT_AVAILABLE (the client retries). A user that may not run
XREAD is answered GROUP_AUTHORIZATION_FAILED.

Transactions are not served: key type 1 (a transactional id) is answered
TRANSACTIONAL_ID_AUTHORIZATION_FAILED, as InitProducerId answers a
transactional id (fatal for the client, which would otherwise retry
forever); key type 2 (share groups, KIP-932) INVALID_REQUEST.
"""

from __future__ import annotations

from server.kafka import codec
from server.kafka import errors as E
from server.kafka_front import access

API_KEY = 10
NAME = "FindCoordinator"
VERSIONS = (0, 6)

R = codec.FindCoordinatorResponse

GROUP = 0
TRANSACTION = 1

_MESSAGES = {
    E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: "Transactions are not served by Partita",
    E.INVALID_REQUEST: "Only consumer groups (key type 0) have a coordinator here",
    E.GROUP_AUTHORIZATION_FAILED: "Not authorized to access group",
    E.COORDINATOR_NOT_AVAILABLE: "The coordinator is not available",
}


def _find(ctx, key: str, key_type: int):
    """``(error, endpoint or None)``."""
    if key_type == TRANSACTION:
        return E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, None
    if key_type != GROUP:
        return E.INVALID_REQUEST, None
    if not access.group_allowed(ctx, access.GROUP_READ):
        return E.GROUP_AUTHORIZATION_FAILED, None
    endpoint = ctx.front.coordinator_of(ctx, key)
    return (E.NONE, endpoint) if endpoint is not None else (E.COORDINATOR_NOT_AVAILABLE, None)


async def handle(ctx, req):
    body = req.body
    if req.api_version < 4:
        error, endpoint = _find(ctx, body.key, body.key_type if req.api_version >= 1 else GROUP)
        if endpoint is None:
            return R(error_code=error, error_message=_MESSAGES.get(error), node_id=-1, host="", port=-1)
        return R(error_code=E.NONE, node_id=endpoint.node_id, host=endpoint.host, port=endpoint.port)
    out = []
    for key in body.coordinator_keys:
        error, endpoint = _find(ctx, key, body.key_type)
        if endpoint is None:
            out.append(R.Coordinator(key=key, node_id=-1, host="", port=-1, error_code=error,
                                     error_message=_MESSAGES.get(error)))
        else:
            out.append(R.Coordinator(key=key, node_id=endpoint.node_id, host=endpoint.host, port=endpoint.port,
                                     error_code=E.NONE))
    return R(coordinators=out)
