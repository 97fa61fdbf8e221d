"""Fetch (key 1): record batches of the stored entries from an offset, with the long poll.

Versions 4-18 (v13+ names topics by ID). Each partition is read from its
fetch offset up to the high watermark (``Session.read_records``), the
entries converted to record batches (``mapping.batches_of``), within
``partition_max_bytes`` per partition and ``max_bytes`` for the response
(the first batch found is returned even when larger, as Kafka does since
KIP-74; the server caps ``max_bytes`` at ``FETCH_MAX_BYTES``). When fewer
than ``min_bytes`` are found and no partition failed, the request waits up
to ``max_wait_ms`` for appends to its partitions (the broker's key events:
a produce, an XADD, a follower's fetch moving the high watermark) and reads
again.

Per partition: high watermark, last stable offset (the high watermark: no
transactions), log start offset; UNKNOWN_TOPIC_OR_PARTITION /
UNKNOWN_TOPIC_ID, NOT_LEADER_OR_FOLLOWER (not led here: consumers read from
leaders only; v12+ names the leader), OFFSET_OUT_OF_RANGE (below the log
start or past the log end), TOPIC_AUTHORIZATION_FAILED (the user may not
read it: ``access``).

Fetch sessions (KIP-227) are not kept: a request for a new session (id 0,
epoch 0) or a sessionless one (epoch -1) is answered in full with session
id 0, "no session", and the client goes on sending full requests; an
incremental request names a session that does not exist:
FETCH_SESSION_ID_NOT_FOUND (INVALID_FETCH_SESSION_EPOCH for id 0 with an
epoch above 0), as a broker whose session cache is full answers.
"""

from __future__ import annotations

import trio

from server.kafka import codec
from server.kafka import errors as E
from server.kafka_front import access, mapping
from server.kafka_front.errors import refused

API_KEY = 1
NAME = "Fetch"
VERSIONS = (4, 18)

R = codec.FetchResponse
FETCH_MAX_BYTES = 55 * 1024 * 1024  # Kafka's broker-side fetch.max.bytes


async def handle(ctx, req):
    body, version = req.body, req.api_version
    session = ctx.session
    if version >= 7:
        if body.session_id != 0:
            return R(error_code=E.FETCH_SESSION_ID_NOT_FOUND)
        if body.session_epoch > 0:
            return R(error_code=E.INVALID_FETCH_SESSION_EPOCH)
    wanted = []  # (topic request, name or None)
    for topic in body.topics:
        name = ctx.front.topic_name(session, topic.topic_id) if version >= 13 else topic.topic.encode()
        wanted.append((topic, name))
    max_bytes = min(body.max_bytes if version >= 3 else FETCH_MAX_BYTES, FETCH_MAX_BYTES)
    deadline = trio.current_time() + max(0, body.max_wait_ms) / 1000
    partitions = [(name, p.partition) for topic, name in wanted if name is not None for p in topic.partitions]
    while True:
        response, found_bytes, failed = _read(ctx, wanted, max_bytes, version)
        left_s = deadline - trio.current_time()
        if found_bytes >= max(1, body.min_bytes) or failed or left_s <= 0 or not partitions:
            return response
        if not await session.wait_for_records(partitions, left_s):
            return _read(ctx, wanted, max_bytes, version)[0]


def _read(ctx, wanted: list, max_bytes: int, version: int) -> tuple:
    """One pass over the request's partitions: the response, the record
    bytes it holds, and whether a partition failed."""
    session = ctx.session
    left = max_bytes
    found = 0
    failed = False
    hints: set[int] = set()
    topics = []
    for topic, name in wanted:
        parts = []
        for p in topic.partitions:
            out = R.PartitionData(partition_index=p.partition, high_watermark=-1, last_stable_offset=-1,
                                  log_start_offset=-1, records=b"")
            parts.append(out)
            if name is None:
                out.error_code = E.UNKNOWN_TOPIC_ID
                failed = True
                continue
            try:
                access.require(ctx, access.READ, name, p.partition)
                if left > 0:
                    read = session.read_records(name, p.partition, p.fetch_offset, min(p.partition_max_bytes, left))
                    hw, start = read.high_watermark, read.log_start_offset
                    # (converted now: the chunks may be views of the log's mapping)
                    data = mapping.batches_of(read.chunks, read.entries) if read.entries else b""
                else:  # the response is full: this partition's offsets only
                    offsets = session.record_offsets(name, p.partition)
                    hw, start, data = offsets.high_watermark, offsets.log_start_offset, b""
            except Exception as exc:  # noqa: BLE001 - every refusal is the partition's error
                out.error_code, _ = refused(exc)
                failed = True
                if out.error_code == E.NOT_LEADER_OR_FOLLOWER and version >= 12:
                    leader = leader_of(session, name, p.partition)
                    if leader is not None:
                        out.current_leader = R.LeaderIdAndEpoch(leader_id=leader.leader,
                                                                leader_epoch=leader.leader_epoch)
                        hints.add(leader.leader)
                continue
            out.high_watermark = out.last_stable_offset = hw
            out.log_start_offset = start
            out.records = data
            found += len(data)
            left -= len(data)
        topics.append(R.FetchableTopicResponse(topic=topic.topic, topic_id=topic.topic_id, partitions=parts))
    response = R(responses=topics, session_id=0, node_endpoints=[
        R.NodeEndpoint(node_id=e.node_id, host=e.host, port=e.port)
        for e in ctx.front.endpoints(ctx) if e.node_id in hints] if version >= 16 else [])
    return response, found, failed


def leader_of(session, name: bytes, partition: int):
    """The partition's leader and leader epoch (``PartitionLayout``) as the
    cluster metadata has them, for a NOT_LEADER_OR_FOLLOWER answer (KIP-951);
    None when the partition does not exist."""
    layout = session.record_topics([name]).get(name)
    if layout is None or not 0 <= partition < len(layout.partitions):
        return None
    return layout.partitions[partition]
