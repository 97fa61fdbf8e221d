"""DescribeCluster (key 60): the brokers, the cluster id and the controller.

Versions 0-2. Brokers as Metadata names them (every node's Kafka listener
of the kind the client came through; none is fenced in the answer).
Asking for the controllers (endpoint type 2) is answered
UNSUPPORTED_ENDPOINT_TYPE: the controller quorum has no Kafka listener, as
a Kafka broker answers.
"""

from __future__ import annotations

from server.kafka import codec
from server.kafka import errors as E
from server.kafka_front.apis.metadata import CLUSTER_OPERATIONS

API_KEY = 60
NAME = "DescribeCluster"
VERSIONS = (0, 2)

R = codec.DescribeClusterResponse
BROKERS = 1


async def handle(ctx, req):
    body, version = req.body, req.api_version
    endpoint_type = body.endpoint_type if version >= 1 else BROKERS
    if endpoint_type != BROKERS:
        return R(error_code=E.UNSUPPORTED_ENDPOINT_TYPE, error_message="only brokers have endpoints here",
                 endpoint_type=endpoint_type, cluster_id=ctx.front.cluster_id())
    return R(cluster_id=ctx.front.cluster_id(), controller_id=ctx.session.controller_id(),
             endpoint_type=endpoint_type,
             brokers=[R.DescribeClusterBroker(broker_id=e.node_id, host=e.host, port=e.port)
                      for e in ctx.front.endpoints(ctx)],
             cluster_authorized_operations=(CLUSTER_OPERATIONS if body.include_cluster_authorized_operations
                                            else -2147483648))
