"""DeleteTopics (key 20): TOPIC DELETE for Kafka clients.

Versions 1-6 (v6 names topics by name or by ID). The topic goes with its
partitions and consumer groups, as TOPIC DELETE / DEL do. Errors:
UNKNOWN_TOPIC_OR_PARTITION, UNKNOWN_TOPIC_ID, TOPIC_AUTHORIZATION_FAILED
(the user may not run TOPIC DELETE on it: ``access``), INVALID_TOPIC_EXCEPTION
(a group's internal offsets stream, ``__kafka_offsets{<group>}``),
INVALID_REQUEST (a topic named, or identified, twice: not deleted, as Kafka's
controller answers).
"""

from __future__ import annotations

from server.kafka import codec
from server.kafka import errors as E
from server.kafka_front import access
from server.kafka_front.context import ZERO_UUID
from server.kafka_front.errors import DUPLICATE_TOPIC, refused, split_repeated
from server.kafka_front.offsets import is_offsets_key

API_KEY = 20
NAME = "DeleteTopics"
VERSIONS = (1, 6)

R = codec.DeleteTopicsResponse


async def handle(ctx, req):
    body, version = req.body, req.api_version
    session = ctx.session
    if version >= 6:
        wanted = [(t.name, t.topic_id) for t in body.topics]
    else:
        wanted = [(name, ZERO_UUID) for name in body.topic_names]
    results = []
    wanted, repeated = split_repeated(wanted, lambda w: w[0] if w[0] is not None else w[1])
    for name, topic_id in wanted:
        out = R.DeletableTopicResult(name=name, topic_id=topic_id)
        results.append(out)
        if name is None:
            found = ctx.front.topic_name(session, topic_id)
            if found is None:
                out.error_code = E.UNKNOWN_TOPIC_ID
                continue
            out.name = found.decode("utf-8", "replace")
            key = found
        else:
            key = name.encode()
        if version >= 6 and out.topic_id == ZERO_UUID:
            out.topic_id = ctx.front.topic_uuid(session, key)
        if is_offsets_key(key):  # a group's committed offsets: DeleteGroups removes them
            out.error_code = E.INVALID_TOPIC_EXCEPTION
            continue
        try:
            access.require(ctx, access.DELETE, key)
            session.delete_topic(key)
        except Exception as exc:  # noqa: BLE001 - every refusal is the topic's error
            out.error_code, message = refused(exc)
            if version >= 5:
                out.error_message = message
    for key in repeated:  # a name, or (v6+) a topic ID
        by_name = isinstance(key, str)
        results.append(R.DeletableTopicResult(
            name=key if by_name else None, topic_id=ZERO_UUID if by_name else key, error_code=E.INVALID_REQUEST,
            error_message=(DUPLICATE_TOPIC if by_name else "Duplicate topic id.") if version >= 5 else None))
    return R(responses=results)
