"""ShareAcknowledge (key 79): a share consumer's acknowledgements without a fetch (KIP-932).

Version 1: what a share consumer's ``commit_sync`` / ``commit_async`` sends.
In the member's share session (epoch 0 is INVALID_SHARE_SESSION_EPOCH: a
session is opened by ShareFetch; -1 closes it after the acknowledgements,
releasing what the member still holds on its partitions), each partition's
batches are applied as ShareFetch applies them (``share_requests.acknowledge``:
ACCEPT = XACK, RELEASE = XNACK, REJECT = dead-letter or XACK;
INVALID_RECORD_STATE for records the member does not hold, UNKNOWN_TOPIC_ID,
TOPIC_AUTHORIZATION_FAILED, NOT_LEADER_OR_FOLLOWER with the leader named).
The response waits for the group writes to be durable.
"""

from __future__ import annotations

from server.kafka import codec
from server.kafka import errors as E
from server.kafka_front import share_requests

API_KEY = 79
NAME = "ShareAcknowledge"
VERSIONS = (1, 1)

R = codec.ShareAcknowledgeResponse


async def handle(ctx, req):
    body = req.body
    front, session = ctx.front, ctx.session
    if body.share_session_epoch == 0:
        return R(error_code=E.INVALID_SHARE_SESSION_EPOCH,
                 error_message="A ShareAcknowledge request cannot open a share session (epoch 0)")
    error, message, _ = share_requests.begin(ctx, body)
    if error != E.NONE:
        return R(error_code=error, error_message=message)
    hints: set[int] = set()
    topics = []
    for topic in body.topics:
        name = front.topic_name(session, topic.topic_id)
        parts = []
        for p in topic.partitions:
            out = R.PartitionData(partition_index=p.partition_index)
            out.error_code, out.error_message = share_requests.acknowledge(
                ctx, body.group_id, body.member_id, name, p.partition_index, p.acknowledgement_batches)
            share_requests.leader_hint(ctx, out, name, p.partition_index, hints)
            parts.append(out)
        topics.append(R.ShareAcknowledgeTopicResponse(topic_id=topic.topic_id, partitions=parts))
    if body.share_session_epoch == -1:
        share_requests.close(ctx, body.group_id, body.member_id)
    response = R(responses=topics, node_endpoints=share_requests.node_endpoints(ctx, R.NodeEndpoint, hints))

    def fail(code: int) -> None:
        response.error_code = code

    return share_requests.answer_when_written(ctx, response, fail)
