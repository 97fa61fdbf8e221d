"""ListOffsets (key 2): an offset by time, or the earliest and latest ones.

Versions 1-11. A partition's answer by ``timestamp``:

- -2 (earliest) and -4 (earliest local: every segment is local): the log
  start offset;
- -1 (latest): the high watermark (on a single node the log end);
- -3 (max timestamp, v7+): the newest entry, with its ID's milliseconds
  (IDs grow with the append time, so it is the one of the largest timestamp);
- -5 (latest tiered) and -6 (earliest pending upload): nothing is tiered,
  offset -1;
- a time in ms: the first entry whose ID's ms is at or after it, through the
  ID index (the time index of a stream: ``Session.offset_at_time``), and
  that ms; none: offset -1, timestamp -1, as Kafka answers.

The timestamp of the earliest and latest answers is -1. Errors:
UNKNOWN_TOPIC_OR_PARTITION, NOT_LEADER_OR_FOLLOWER (offsets are the
leader's), TOPIC_AUTHORIZATION_FAILED (the user may not read it:
``access``), INVALID_REQUEST (each request for a partition named twice, as
Kafka's ``duplicatePartitions``).
"""

from __future__ import annotations

from collections import Counter

from server.kafka import codec
from server.kafka import errors as E
from server.kafka_front import access
from server.kafka_front.errors import refused

API_KEY = 2
NAME = "ListOffsets"
VERSIONS = (1, 11)

R = codec.ListOffsetsResponse

LATEST = -1
EARLIEST = -2
MAX_TIMESTAMP = -3
EARLIEST_LOCAL = -4
LATEST_TIERED = -5
EARLIEST_PENDING_UPLOAD = -6


async def handle(ctx, req):
    session = ctx.session
    topics = []
    asked = Counter((t.name, p.partition_index) for t in req.body.topics for p in t.partitions)
    for topic in req.body.topics:
        name = topic.name.encode()
        parts = []
        for p in topic.partitions:
            out = R.ListOffsetsPartitionResponse(partition_index=p.partition_index)
            parts.append(out)
            try:
                access.require(ctx, access.READ, name, p.partition_index)
                if asked[topic.name, p.partition_index] > 1:
                    out.error_code = E.INVALID_REQUEST
                    continue
                out.offset, out.timestamp = _offset(session, name, p.partition_index, p.timestamp)
            except Exception as exc:  # noqa: BLE001 - every refusal is the partition's error
                out.error_code, _ = refused(exc)
                continue
            if out.offset >= 0:
                layout = session.record_topics([name])[name]
                out.leader_epoch = layout.partitions[p.partition_index].leader_epoch if layout else -1
        topics.append(R.ListOffsetsTopicResponse(name=topic.name, partitions=parts))
    return R(topics=topics)


def _offset(session, name: bytes, n: int, timestamp: int) -> tuple[int, int]:
    if timestamp in (EARLIEST, EARLIEST_LOCAL):
        return session.record_offsets(name, n).log_start_offset, -1
    if timestamp == LATEST:
        return session.record_offsets(name, n).high_watermark, -1
    if timestamp == MAX_TIMESTAMP:
        offsets = session.record_offsets(name, n)
        return offsets.last_offset, offsets.last_ms
    if timestamp < 0:  # LATEST_TIERED, EARLIEST_PENDING_UPLOAD: nothing is tiered
        session.record_offsets(name, n)  # (the partition's refusals)
        return -1, -1
    found = session.offset_at_time(name, n, timestamp)
    return found if found is not None else (-1, -1)
