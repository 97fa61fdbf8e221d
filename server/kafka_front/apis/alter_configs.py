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
NOT_A_TOPIC = "only topic configs change here (server settings: CONFIG SET)"


def repeated_resources(resources) -> set:
    """The (type, name) of every resource named more than once."""
    counts = Counter((res.resource_type, res.resource_name) for res in resources)
    return {key for key, n in counts.items() if n > 1}


def malformed(res, repeated: set, may_be_null=lambda config: False) -> str | None:
    """Why Kafka's ``ConfigAdminManager.preprocess`` refuses this resource before anything else
    (INVALID_REQUEST), or None. ``may_be_null``: the configs whose value may be null (an
    incremental DELETE's)."""
    if (res.resource_type, res.resource_name) in repeated:
        return "Each resource must appear at most once."
    names = [c.name for c in res.configs]
    if len(set(names)) < len(names):
        return "Error due to duplicate config keys"
    nulls = [c.name for c in res.configs if c.value is None and not may_be_null(c)]
    if nulls:
        return "Null value not supported for : " + ", ".join(nulls)
    return None


def bad_name(session, name: bytes) -> tuple[int, str] | None:
    """How Kafka's ``ControllerConfigurationValidator`` refuses a topic resource's name before its
    configs and before looking the topic up, or None."""
    if not name:
        return E.INVALID_REQUEST, "Default topic resources are not allowed."
    if (why := missing_topic_name_error(session, name)) is not None:
        return E.INVALID_TOPIC_EXCEPTION, why
    return None


def alter_each(ctx, body, response, pairs_of, may_be_null=lambda config: False, refusal=lambda res: None) -> list:
    """Each resource of an AlterConfigs or IncrementalAlterConfigs request ``body`` altered (or, with
    ``validate_only``, checked) in Kafka's order: ``malformed`` and ``refusal(res)``
    (INVALID_REQUEST), the resource type, the user's right, ``bad_name``, the configs
    (``pairs_of(res)``: Partita's (name, value) pairs, raising ConfigRefused), the topic's
    existence. The ``response`` class's results, one per resource."""
    session = ctx.session
    results = []
    repeated = repeated_resources(body.resources)
    for res in body.resources:
        out = response.AlterConfigsResourceResponse(resource_type=res.resource_type,
                                                    resource_name=res.resource_name, error_message=None)
        results.append(out)
        if (why := malformed(res, repeated, may_be_null) or refusal(res)) is not None:
            out.error_code, out.error_message = E.INVALID_REQUEST, why
            continue
        if res.resource_type != TOPIC:
            out.error_code, out.error_message = E.INVALID_REQUEST, NOT_A_TOPIC
            continue
        name = res.resource_name.encode()
        try:
            access.require(ctx, access.ALTER_CONFIGS, name)
            if (why := bad_name(session, name)) is not None:
                out.error_code, out.error_message = why
                continue
            pairs = pairs_of(res)
            session.require_topic(name)
            session.check_topic_config(pairs)
            if not body.validate_only and pairs:
                session.alter_topic_config(name, pairs)
        except tc.ConfigRefused as e:
            out.error_code, out.error_message = E.INVALID_CONFIG, str(e)
        except Exception as exc:  # noqa: BLE001 - every refusal is the resource's error
            out.error_code, out.error_message = refused(exc)
    return results


def _replace_all(res) -> list[tuple[bytes, bytes]]:
    """The configs given, and every other override back to the default."""
    given = tc.partita_pairs([(c.name, c.value) for c in res.configs])
    named = {n for n, _ in given}
    return given + [(c.partita.encode(), b"default") for c in tc.MAPPED + tc.OWN if c.partita.encode() not in named]


async def handle(ctx, req):
    return R(responses=alter_each(ctx, req.body, R, _replace_all))
