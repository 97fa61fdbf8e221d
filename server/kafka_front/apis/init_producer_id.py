"""InitProducerId (key 22): a producer id for an idempotent producer.

Versions 0-6. Without a transactional id (an idempotent producer) every
request gets a new producer id at epoch 0 (``Session.new_producer_id``: never
handed out before, in the whole cluster, across restarts), whatever
producer id and epoch it names (v3+), as a Kafka broker answers it: Kafka's
transaction coordinator hands a non-transactional producer a new id every
time. Any node answers; the partitions deduplicate the producer's batches
by that id (Produce; cluster/broker/producers.py).

A user that may not run XADD is answered CLUSTER_AUTHORIZATION_FAILED
(``access``: Kafka asks for IDEMPOTENT_WRITE on the cluster, or WRITE on
some topic; Produce then checks each partition's key).

Transactions are not served: a request with a transactional id is answered
TRANSACTIONAL_ID_AUTHORIZATION_FAILED, the error Kafka gives a producer not
allowed to use its transactional id (fatal for the client), as
FindCoordinator answers a transactional id's coordinator.
"""

from __future__ import annotations

from server.kafka import codec
from server.kafka import errors as E
from server.kafka_front import access
from server.kafka_front.errors import refused

API_KEY = 22
NAME = "InitProducerId"
VERSIONS = (0, 6)

R = codec.InitProducerIdResponse


async def handle(ctx, req):
    body = req.body
    if body.transactional_id is not None:
        return R(error_code=E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    try:
        access.require_cluster(ctx, access.WRITE.command)
        producer_id = ctx.session.new_producer_id()
    except Exception as exc:  # noqa: BLE001 - a refusal (the disk) is the answer's error
        return R(error_code=refused(exc)[0])
    return R(producer_id=producer_id, producer_epoch=0)
