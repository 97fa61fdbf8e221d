"""DeleteTopics (key 20): TOPIC DELETE for Kafka clients.

Versions 1-6 (v6 names topics by name or by ID). The topic goes with its
partitions and consumer groups, as TOPIC DELETE / DEL do. Errors:
UNKNOWN_TOPIC_OR_PARTITION, UNKNOWN_TOPIC_ID, TOPIC_AUTHORIZATION_FAILED
(the user may not run TOPIC DELETE on it: ``access``).
"""

from __future__ import annotations

from server.kafka import codec
from server.kafka import errors as E
from server.kafka_front import access
from server.kafka_front.context import ZERO_UUID
from server.kafka_front.errors import refused

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
        try:
            access.require(ctx, access.DELETE, key)
            session.delete_topic(key)
        except Exception as exc:  # noqa: BLE001 - every refusal is the topic's error
            out.error_code, message = refused(exc)
            if version >= 5:
                out.error_message = message
    return R(responses=results)
