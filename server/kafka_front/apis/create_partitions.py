"""CreatePartitions (key 37): TOPIC ALTER ... PARTITIONS for Kafka clients.

Versions 0-3. The topic grows to ``count`` partitions (the new ones
empty, every consumer group of the topic on them from their start);
fewer than it has: INVALID_PARTITIONS, the same count: INVALID_PARTITIONS
(in Kafka's words), more than 1024: INVALID_PARTITIONS; manual ``assignments``: INVALID_REPLICA_ASSIGNMENT;
``validate_only`` checks and changes nothing; a topic the user may not
TOPIC ALTER: TOPIC_AUTHORIZATION_FAILED (``access``), before it is even
looked up; a topic named twice: INVALID_REQUEST, and neither entry acted on
(Kafka's controller). Keys hashed to a partition
(``partition-key-field``, a Kafka client's partitioner) move with the
count, as in Kafka.
"""

from __future__ import annotations

from server.kafka import codec
from server.kafka import errors as E
from server.kafka_front import access
from server.kafka_front.errors import DUPLICATE_TOPIC, refused, split_repeated

API_KEY = 37
NAME = "CreatePartitions"
VERSIONS = (0, 3)

R = codec.CreatePartitionsResponse


async def handle(ctx, req):
    body = req.body
    session = ctx.session
    results = []
    once, repeated = split_repeated(body.topics, lambda t: t.name)
    for topic in once:
        out = R.CreatePartitionsTopicResult(name=topic.name)
        results.append(out)
        name = topic.name.encode()
        if topic.assignments is not None:
            out.error_code = E.INVALID_REPLICA_ASSIGNMENT
            out.error_message = "replicas are placed by hash slot; manual assignments are not possible"
            continue
        try:
            access.require(ctx, access.ALTER, name)
        except access.AuthorizationFailed as exc:
            out.error_code, out.error_message = refused(exc)
            continue
        layout = session.record_topics([name])[name]
        if layout is None:
            out.error_code, out.error_message = E.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic '{topic.name}'"
            continue
        current = len(layout.partitions)
        if topic.count <= current:  # in the words of Kafka's ReplicationControlManager
            out.error_code = E.INVALID_PARTITIONS
            out.error_message = (f"Topic already has {current} partition(s)." if topic.count == current else
                                 f"The topic {topic.name} currently has {current} partition(s); {topic.count} "
                                 "would not be an increase.")
            continue
        try:
            session.check_topic_growth(name, topic.count)
            if not body.validate_only:
                session.alter_topic_partitions(name, topic.count)
        except Exception as exc:  # noqa: BLE001 - every refusal is the topic's error
            out.error_code, out.error_message = refused(exc)
    results += [R.CreatePartitionsTopicResult(name=n, error_code=E.INVALID_REQUEST, error_message=DUPLICATE_TOPIC)
                for n in repeated]
    return R(results=results)
