"""DescribeConfigs (key 32): a topic's configs by their Kafka names, and the broker's defaults.

Versions 1-4. A TOPIC resource lists every config of ``topic_configs``
(or those ``configuration_keys`` names): the topic's value, its source
(DYNAMIC_TOPIC_CONFIG when the topic overrides it, DEFAULT_CONFIG when the
server's value applies), read-only for the fixed ones, the type (v3+) and
documentation when asked for. A BROKER resource (this node's id, or "" for
the cluster default) lists the server-wide defaults topics inherit under
Kafka's broker names (``BROKER_CONFIGS``), read-only; another broker's id
or a name that is no integer is INVALID_REQUEST with Kafka's message. Any
other resource type: INVALID_REQUEST; an unknown topic UNKNOWN_TOPIC_OR_PARTITION, or
INVALID_TOPIC_EXCEPTION under a name Kafka refuses ('' included:
``metadata.missing_topic_name_error``), as Kafka's ``ConfigHelper`` runs
``Topic.validate`` first. A
topic needs the user's right to TOPIC DESCRIBE it, the broker's configs
its right to CONFIG GET (TOPIC_ / CLUSTER_AUTHORIZATION_FAILED:
``access``).
"""

from __future__ import annotations

import re
from typing import NamedTuple

from server.kafka import codec
from server.kafka import errors as E
from server.kafka_front import access
from server.kafka_front import topic_configs as tc
from server.kafka_front.apis.metadata import missing_topic_name_error
from server.kafka_front.errors import refused

API_KEY = 32
NAME = "DescribeConfigs"
VERSIONS = (1, 4)

R = codec.DescribeConfigsResponse
TOPIC = 2
BROKER = 4
_INT32 = re.compile(r"[+-]?[0-9]+")  # what Java's Integer.parseInt reads

# Kafka broker config name -> (server config name, type): the defaults topics inherit.
BROKER_CONFIGS = {
    "log.retention.ms": ("retention-ms", tc.TYPE_LONG),
    "log.retention.bytes": ("retention-bytes", tc.TYPE_LONG),
    "log.segment.bytes": ("segment-bytes", tc.TYPE_INT),
    "log.roll.ms": ("segment-ms", tc.TYPE_LONG),
    "message.max.bytes": ("max-entry-bytes", tc.TYPE_INT),
    "min.insync.replicas": ("min-insync-replicas", tc.TYPE_INT),
    "num.partitions": ("default-partitions", tc.TYPE_INT),
    "auto.create.topics.enable": ("auto-create-topics", 1),  # BOOLEAN
}


class Entry(NamedTuple):
    name: str
    value: str | None
    read_only: bool
    config_source: int
    type: int
    doc: str


def topic_entries(ctx, name: bytes, keys, version: int, synonyms: bool, docs: bool) -> list[Entry]:
    """A topic's configs by Kafka name (``keys``: only those; None: all)."""
    config = ctx.session.describe_topic(name)["config"]
    out = []
    for c in tc.ALL:
        if keys is not None and c.kafka not in keys:
            continue
        if c.partita is None:
            out.append(Entry(c.kafka, c.fixed, True, tc.SOURCE_DEFAULT, c.type, tc.doc(c)))
            continue
        value, overridden = config[c.partita]
        out.append(Entry(c.kafka, tc.text(value), False, tc.SOURCE_DYNAMIC_TOPIC if overridden else tc.SOURCE_DEFAULT,
                         c.type, tc.doc(c)))
    return out


def _broker_entries(ctx, keys) -> list[Entry]:
    config = ctx.config
    out = []
    for kafka, (name, kind) in BROKER_CONFIGS.items():
        if keys is not None and kafka not in keys:
            continue
        out.append(Entry(kafka, config.text(name), True, tc.SOURCE_STATIC_BROKER, kind, f"Partita's {name}"))
    return out


def _other_broker(name: str, node_id: int) -> str | None:
    """Why Kafka's ``ConfigHelper`` refuses a BROKER resource named ``name`` on broker ``node_id``
    (INVALID_REQUEST), or None for this broker ('' or its id)."""
    if name == "":
        return None
    if not _INT32.fullmatch(name) or not -2**31 <= int(name) < 2**31:
        return f"Broker id must be an integer, but it is: {name}"
    if int(name) != node_id:
        return f"Unexpected broker id, expected {node_id} or empty string, but received {name}"
    return None


async def handle(ctx, req):
    body, version = req.body, req.api_version
    results = []
    for res in body.resources:
        out = R.DescribeConfigsResult(resource_type=res.resource_type, resource_name=res.resource_name,
                                      error_message=None)
        results.append(out)
        keys = None if res.configuration_keys is None else set(res.configuration_keys)
        try:
            if res.resource_type == TOPIC:
                access.require(ctx, access.DESCRIBE_CONFIGS, res.resource_name.encode())
                if (why := missing_topic_name_error(ctx.session, res.resource_name.encode())) is not None:
                    out.error_code, out.error_message = E.INVALID_TOPIC_EXCEPTION, why
                    continue
                entries = topic_entries(ctx, res.resource_name.encode(), keys, version, body.include_synonyms,
                                        version >= 3 and body.include_documentation)
            elif res.resource_type == BROKER:
                if (why := _other_broker(res.resource_name, ctx.session.node_id())) is not None:
                    out.error_code, out.error_message = E.INVALID_REQUEST, why
                    continue
                access.require_cluster(ctx, "config|get")
                entries = _broker_entries(ctx, keys)
            else:
                out.error_code = E.INVALID_REQUEST
                out.error_message = (f"resource type {res.resource_type} '{res.resource_name}' is not described "
                                     "here (topics, and this broker's id)")
                continue
        except Exception as exc:  # noqa: BLE001 - every refusal is the resource's error
            out.error_code, out.error_message = refused(exc)
            continue
        docs = version >= 3 and body.include_documentation
        out.configs = [R.DescribeConfigsResourceResult(
            name=e.name, value=e.value, read_only=e.read_only, config_source=e.config_source,
            is_default=e.config_source == tc.SOURCE_DEFAULT, is_sensitive=False,
            synonyms=[R.DescribeConfigsSynonym(name=e.name, value=e.value, source=e.config_source)]
            if body.include_synonyms else [],
            config_type=e.type, documentation=e.doc if docs else None) for e in entries]
    return R(results=results)
