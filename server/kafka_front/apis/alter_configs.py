"""AlterConfigs (key 33): TOPIC ALTER ... CONFIG for Kafka clients, with Kafka's replace-all meaning.

Versions 0-2. The configs given become the topic's overrides and every
other override is dropped (the server's default applies again), as Kafka's
(non-incremental) AlterConfigs does; names and values by ``topic_configs``
(INVALID_CONFIG for others). ``validate_only`` checks and changes nothing.
A resource named twice (each occurrence), a config named twice or a null
value is INVALID_REQUEST before anything else, as Kafka's
``ConfigAdminManager.preprocess`` answers.
Broker resources are refused (INVALID_REQUEST: server settings change with
CONFIG SET); an unknown topic is UNKNOWN_TOPIC_OR_PARTITION, one the user may not
TOPIC ALTER TOPIC_AUTHORIZATION_FAILED (``access``). Before its configs are
read or the topic looked up, a resource's name is checked as Kafka's
``ControllerConfigurationValidator`` does: '' (Kafka's default topic) is
INVALID_REQUEST, a missing topic under a name Kafka refuses
INVALID_TOPIC_EXCEPTION (``metadata.missing_topic_name_error``).
"""

from __future__ import annotations

from collections import Counter

from server.kafka import codec
from server.kafka import errors as E
from server.kafka_front import access
from server.kafka_front import topic_configs as tc
from server.kafka_front.apis.metadata import missing_topic_name_error
from server.kafka_front.errors import refused

API_KEY = 33
NAME = "AlterConfigs"
VERSIONS = (0, 2)

R = codec.AlterConfigsResponse
TOPIC = 2


def _malformed(res, repeated: set) -> str | None:
    """Why Kafka's ``ConfigAdminManager.preprocess`` refuses this resource before anything else
    (INVALID_REQUEST), or None."""
    if (res.resource_type, res.resource_name) in repeated:
        return "Each resource must appear at most once."
    names = [c.name for c in res.configs]
    if len(set(names)) < len(names):
        return "Error due to duplicate config keys"
    nulls = [c.name for c in res.configs if c.value is None]
    if nulls:
        return "Null value not supported for : " + ", ".join(nulls)
    return None


def _bad_name(session, name: bytes) -> tuple[int, str] | None:
    """How Kafka's ``ControllerConfigurationValidator`` refuses a topic resource's name before its
    configs and before looking the topic up, or None."""
    if not name:
        return E.INVALID_REQUEST, "Default topic resources are not allowed."
    if (why := missing_topic_name_error(session, name)) is not None:
        return E.INVALID_TOPIC_EXCEPTION, why
    return None


async def handle(ctx, req):
    body = req.body
    session = ctx.session
    results = []
    counts = Counter((res.resource_type, res.resource_name) for res in body.resources)
    repeated = {key for key, n in counts.items() if n > 1}
    for res in body.resources:
        out = R.AlterConfigsResourceResponse(resource_type=res.resource_type, resource_name=res.resource_name,
                                             error_message=None)
        results.append(out)
        if (why := _malformed(res, repeated)) is not None:
            out.error_code, out.error_message = E.INVALID_REQUEST, why
            continue
        if res.resource_type != TOPIC:
            out.error_code = E.INVALID_REQUEST
            out.error_message = "only topic configs change here (server settings: CONFIG SET)"
            continue
        name = res.resource_name.encode()
        try:
            access.require(ctx, access.ALTER_CONFIGS, name)
            if (why := _bad_name(session, name)) is not None:
                out.error_code, out.error_message = why
                continue
            given = tc.partita_pairs([(c.name, c.value) for c in res.configs])
            named = {n for n, _ in given}
            pairs = given + [(c.partita.encode(), b"default") for c in tc.MAPPED + tc.OWN
                             if c.partita.encode() not in named]
            session.require_topic(name)
            session.check_topic_config(pairs)
            if not body.validate_only:
                session.alter_topic_config(name, pairs)
        except tc.ConfigRefused as e:
            out.error_code, out.error_message = E.INVALID_CONFIG, str(e)
        except Exception as exc:  # noqa: BLE001 - every refusal is the resource's error
            out.error_code, out.error_message = refused(exc)
    return R(responses=results)
