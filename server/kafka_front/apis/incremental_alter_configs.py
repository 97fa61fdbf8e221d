"""IncrementalAlterConfigs (key 44): TOPIC ALTER ... CONFIG for the configs named, and only them.

Versions 0-1. What Kafka 4's ``kafka-configs.sh --alter`` and librdkafka's
``incremental_alter_configs`` send. Each config has an operation: SET (0)
gives it the value, DELETE (1) drops the topic's override (the server's
default applies again; a fixed config or a name Partita does not know: no
change), APPEND (2) / SUBTRACT (3) add values to or take them from a LIST
config (``cleanup.policy`` is the one here; any other name is
INVALID_CONFIG "Can't APPEND to key retention.ms because its type is not
LIST.", as Kafka's controller answers). The other configs keep their
overrides, unlike AlterConfigs' replace-all. Names and values by
``topic_configs`` (INVALID_CONFIG for others); ``validate_only`` checks and
changes nothing.

Refused before anything else, as Kafka's ``ConfigAdminManager.preprocess``
and controller do (INVALID_REQUEST): a resource named twice (each
occurrence), a config named twice, a null value but for DELETE, an unknown
operation; then the resource's name (``alter_configs.bad_name``: '' is
INVALID_REQUEST, a name Kafka refuses INVALID_TOPIC_EXCEPTION). Broker
resources are INVALID_REQUEST (server settings change with CONFIG SET); an
unknown topic is UNKNOWN_TOPIC_OR_PARTITION, one the user may not TOPIC
ALTER TOPIC_AUTHORIZATION_FAILED (``access``).
"""

from __future__ import annotations

from server.kafka import codec
from server.kafka_front import topic_configs as tc
from server.kafka_front.apis.alter_configs import alter_each

API_KEY = 44
NAME = "IncrementalAlterConfigs"
VERSIONS = (0, 1)

R = codec.IncrementalAlterConfigsResponse
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
_OPERATIONS = {SET: "SET", DELETE: "DELETE", APPEND: "APPEND", SUBTRACT: "SUBTRACT"}


def _unknown_operation(res) -> str | None:
    for c in res.configs:
        if c.config_operation not in _OPERATIONS:
            return f"Unknown operations type {c.config_operation}"
    return None


def _kafka_pairs(res) -> list[tuple[str, str]]:
    """The (Kafka name, value) each config is SET to; a DELETE of an override is
    (name, None). Raises ConfigRefused for APPEND / SUBTRACT to anything but a LIST."""
    out = []
    for c in res.configs:
        known = tc.BY_KAFKA.get(c.name)
        if c.config_operation == SET:
            out.append((c.name, c.value))
        elif c.config_operation == DELETE:
            if known is not None and known.partita is not None:
                out.append((c.name, None))
        elif known is None or known.type != tc.TYPE_LIST:
            raise tc.ConfigRefused(f"Can't {_OPERATIONS[c.config_operation]} to key {c.name} "
                                   "because its type is not LIST.")
        else:  # a fixed LIST (cleanup.policy): its one value, with the values given added or taken
            values = known.fixed.split(",")
            for v in c.value.split(","):
                if c.config_operation == APPEND and v not in values:
                    values.append(v)
                elif c.config_operation == SUBTRACT and v in values:
                    values.remove(v)
            out.append((c.name, ",".join(values)))
    return out


def _changed(res) -> list[tuple[bytes, bytes]]:
    """Partita's pairs for the configs named: the values SET, ``default`` for a DELETE."""
    kafka_pairs = _kafka_pairs(res)
    pairs = tc.partita_pairs([(k, v) for k, v in kafka_pairs if v is not None])
    return pairs + [(tc.BY_KAFKA[k].partita.encode(), b"default") for k, v in kafka_pairs if v is None]


async def handle(ctx, req):
    return R(responses=alter_each(ctx, req.body, R, _changed, may_be_null=lambda c: c.config_operation == DELETE,
                                  refusal=_unknown_operation))
