"""CreateTopics (key 19): TOPIC CREATE for Kafka clients.

Versions 2-7. ``num_partitions`` -1 takes ``default-partitions``;
``replication_factor`` -1 takes the cluster's, any other value must be it
(INVALID_REPLICATION_FACTOR: replica sets belong to hash-slot ranges,
docs/replication.md); manual ``assignments`` are refused
(INVALID_REPLICA_ASSIGNMENT); configs by their Kafka names
(``topic_configs``: INVALID_CONFIG for others). ``validate_only`` checks
everything and creates nothing. Errors: TOPIC_ALREADY_EXISTS,
INVALID_REQUEST (a topic named twice: none of its entries is created, as
Kafka's controller answers),
INVALID_TOPIC_EXCEPTION (a name Kafka refuses: ``metadata.topic_name_error``,
or one colliding with an existing topic's: ``metadata.topic_collision``),
INVALID_PARTITIONS (more than 1024; a count or replication factor of 0 or
below -1 is refused in Kafka's words, INVALID_PARTITIONS /
INVALID_REPLICATION_FACTOR, before the configs are read),
TOPIC_AUTHORIZATION_FAILED (the user may not run
TOPIC CREATE on it: ``access``). From v5 the answer carries the partition count,
replication factor and the topic's configs. In a cluster the topic is
created on the node that receives the request and reaches every node
through the controller's metadata log, as a TOPIC CREATE does.
"""

from __future__ import annotations

from server.kafka import codec
from server.kafka import errors as E
from server.kafka_front import access, topic_configs
from server.kafka_front.apis.describe_configs import topic_entries
from server.kafka_front.apis.metadata import topic_collision, topic_name_error
from server.kafka_front.errors import DUPLICATE_TOPIC, refused, split_repeated

API_KEY = 19
NAME = "CreateTopics"
VERSIONS = (2, 7)

R = codec.CreateTopicsResponse


def _non_positive(topic) -> tuple[int, str] | None:
    """How Kafka's ``ReplicationControlManager`` refuses a replication factor or partition count
    that is neither positive nor -1 (the default), before anything else of the topic's, or None."""
    if topic.replication_factor == 0 or topic.replication_factor < -1:
        return E.INVALID_REPLICATION_FACTOR, "Replication factor must be larger than 0, or -1 to use the default value."
    if topic.num_partitions == 0 or topic.num_partitions < -1:
        return E.INVALID_PARTITIONS, "Number of partitions was set to an invalid non-positive value."
    return None


async def handle(ctx, req):
    body, version = req.body, req.api_version
    session = ctx.session
    results = []
    once, repeated = split_repeated(body.topics, lambda t: t.name)
    for topic in once:
        out = R.CreatableTopicResult(name=topic.name, error_message=None, configs=None)
        results.append(out)
        name = topic.name.encode()
        if (why := topic_name_error(name) or topic_collision(session, name)) is not None:
            out.error_code, out.error_message = E.INVALID_TOPIC_EXCEPTION, why
            continue
        if topic.assignments:
            out.error_code = E.INVALID_REPLICA_ASSIGNMENT
            out.error_message = "replicas are placed by hash slot; manual assignments are not possible"
            continue
        partitions = None if topic.num_partitions == -1 else topic.num_partitions
        factors = [] if topic.replication_factor == -1 else [topic.replication_factor]
        try:
            access.require(ctx, access.CREATE, name)
            if (refusal := _non_positive(topic)) is not None:
                out.error_code, out.error_message = refusal
                continue
            pairs = topic_configs.partita_pairs([(c.name, c.value) for c in topic.configs])
            # A config key named twice: the last value wins, as in Kafka's
            # ReplicationControlManager (TOPIC CREATE refuses it).
            pairs = [p for p in dict(pairs).items() if p[1] != b"default"]
            session.check_new_topic(name, partitions, pairs, factors)
            if not body.validate_only:
                session.create_topic(name, partitions, pairs, factors)
        except topic_configs.ConfigRefused as e:
            out.error_code, out.error_message = E.INVALID_CONFIG, str(e)
            continue
        except Exception as exc:  # noqa: BLE001 - every refusal is the topic's error
            out.error_code, out.error_message = refused(exc)
            continue
        if version >= 5:
            out.num_partitions = partitions if partitions is not None else session.default_partitions()
            out.replication_factor = session.replication_factor()
            if not body.validate_only:
                out.topic_id = ctx.front.topic_uuid(session, name)
                out.configs = [R.CreatableTopicConfigs(name=e.name, value=e.value, read_only=e.read_only,
                                                       config_source=e.config_source, is_sensitive=False)
                               for e in topic_entries(ctx, name, None, 4, False, False)]
    results += [R.CreatableTopicResult(name=n, error_code=E.INVALID_REQUEST, error_message=DUPLICATE_TOPIC,
                                       configs=None) for n in repeated]
    return R(topics=results)
