"""ShareFetch (key 78): a share consumer acknowledges records and acquires new ones (KIP-932).

Version 1. The share group ``g`` is the Redis consumer group ``g`` of each
partition (docs/kafka.md, "Share groups"; cluster/broker/shares.py):

- the share session (``share_requests.begin``): epoch 0 opens one with the
  request's partitions (acknowledgements then: INVALID_REQUEST), a later
  request adds its partitions and drops ``forgotten_topics_data``, -1
  applies the acknowledgements, releases what the member still holds on
  the session's partitions and closes it (nothing acquired);
  SHARE_SESSION_NOT_FOUND, INVALID_SHARE_SESSION_EPOCH,
  SHARE_SESSION_LIMIT_REACHED as Kafka;
- each partition's acknowledgement batches first (ACCEPT = XACK, RELEASE =
  XNACK, REJECT = dead-letter or XACK), answered in its
  ``acknowledge_error_code``;
- then, when ``max_records`` > 0, records acquired over the session's
  partitions for consumer ``<member id>`` (``Session.share_acquire``: the
  XREADGROUP ... CLAIM <lock ms> read), at most ``max_records`` and about
  ``max_bytes``, waiting up to ``max_wait_ms`` for some (an append, a
  release, a lock expiring); each partition's record batches are those
  Fetch sends (``mapping.batches_of``), and its ``acquired_records`` the
  runs of consecutive offsets with one delivery count.
  ``acquisition_lock_timeout_ms`` is ``share-record-lock-duration-ms``.

Per partition: UNKNOWN_TOPIC_ID, TOPIC_AUTHORIZATION_FAILED (XREADGROUP /
XACK rights on the partition), NOT_LEADER_OR_FOLLOWER (with the leader
named, and its endpoint), INVALID_RECORD_STATE (acknowledgements of records
the member does not hold). The response waits for the group writes it
made to be durable (``share_requests.answer_when_written``).

The member is not checked against the group's membership (a ShareFetch may
reach a partition's leader that does not coordinate the group, as in
Kafka, where the share session is the broker's).
"""

from __future__ import annotations

from server.kafka import codec
from server.kafka import errors as E
from server.kafka_front import access, mapping, share_requests
from server.kafka_front.errors import refused

API_KEY = 78
NAME = "ShareFetch"
VERSIONS = (1, 1)

R = codec.ShareFetchResponse


async def handle(ctx, req):
    body = req.body
    front, session = ctx.front, ctx.session
    config = ctx.config
    lock_ms = config.share_record_lock_duration_ms
    error, message, share = share_requests.begin(ctx, body)
    if error == E.NONE and body.share_session_epoch == 0 and any(
            p.acknowledgement_batches for t in body.topics for p in t.partitions):
        error, message = E.INVALID_REQUEST, "Acknowledge data present in the initial ShareFetch request"
        front.share_sessions.close(body.group_id, body.member_id)
    if error != E.NONE:
        return R(error_code=error, error_message=message, acquisition_lock_timeout_ms=lock_ms)
    group, member = body.group_id, body.member_id
    closing = body.share_session_epoch == -1
    answers: dict[tuple, R.PartitionData] = {}  # (topic id, n) -> its answer, in order
    names: dict = {}
    hints: set[int] = set()
    for topic in body.topics:
        name = names[topic.topic_id] = front.topic_name(session, topic.topic_id)
        for p in topic.partitions:
            where = (topic.topic_id, p.partition_index)
            if not closing:
                share.partitions[where] = None
            out = answers[where] = R.PartitionData(partition_index=p.partition_index)
            if p.acknowledgement_batches:
                out.acknowledge_error_code, out.acknowledge_error_message = share_requests.acknowledge(
                    ctx, group, member, name, p.partition_index, p.acknowledgement_batches)
    for topic in body.forgotten_topics_data:
        for n in topic.partitions:
            share.partitions.pop((topic.topic_id, n), None)
    if closing:
        share_requests.close(ctx, group, member)
    elif body.max_records > 0:
        await _acquire(ctx, body, share, answers, names, lock_ms)
    for (topic_id, n), out in answers.items():
        share_requests.leader_hint(ctx, out, names.get(topic_id), n, hints)
    by_topic: dict = {}
    for (topic_id, _), out in answers.items():
        by_topic.setdefault(topic_id, []).append(out)
    response = R(acquisition_lock_timeout_ms=lock_ms,
                 responses=[R.ShareFetchableTopicResponse(topic_id=t, partitions=parts)
                            for t, parts in by_topic.items()],
                 node_endpoints=share_requests.node_endpoints(ctx, R.NodeEndpoint, hints))

    def fail(code: int) -> None:
        response.error_code = code
        response.responses = []

    return share_requests.answer_when_written(ctx, response, fail)


async def _acquire(ctx, body, share, answers: dict, names: dict, lock_ms: int) -> None:
    """Acquire records over the session's partitions into ``answers``."""
    front, session = ctx.front, ctx.session
    wanted = []  # (where, name)
    for where in share.partitions:
        topic_id, n = where
        name = names[topic_id] if topic_id in names else front.topic_name(session, topic_id)
        names[topic_id] = name
        if name is None:
            _answer(answers, where).error_code = E.UNKNOWN_TOPIC_ID
            continue
        try:
            access.require(ctx, access.SHARE_ACQUIRE, name, n)
        except Exception as exc:  # noqa: BLE001 - a refusal is the partition's error
            out = _answer(answers, where)
            out.error_code, out.error_message = refused(exc)
            continue
        wanted.append((where, name))
    if not wanted:
        return
    config = ctx.config
    acquired = await session.share_acquire(
        body.group_id.encode(), body.member_id.encode(), [(name, where[1]) for where, name in wanted],
        max_records=body.max_records, max_bytes=body.max_bytes, lock_ms=lock_ms,
        delivery_limit=config.share_delivery_count_limit, wait_ms=max(0, body.max_wait_ms))
    for where, name in wanted:
        got = acquired.get((name, where[1]))
        if got is None:
            continue
        if isinstance(got, BaseException):
            out = _answer(answers, where)
            out.error_code, out.error_message = refused(got)
            continue
        if not got.entries:
            continue
        out = _answer(answers, where)
        out.records = mapping.batches_of(got.chunks, got.entries)
        out.acquired_records = _runs(got.entries, got.delivery_counts)


def _answer(answers: dict, where: tuple):
    out = answers.get(where)
    if out is None:
        out = answers[where] = R.PartitionData(partition_index=where[1])
    return out


def _runs(entries: list, counts: list) -> list:
    """``AcquiredRecords``: runs of consecutive offsets with one delivery count."""
    out: list = []
    for (offset, _, _), count in zip(entries, counts):
        count = min(count, 0x7FFF)  # an int16 on the wire (an XNACK FATAL count saturates)
        last = out[-1] if out else None
        if last is not None and last.last_offset + 1 == offset and last.delivery_count == count:
            last.last_offset = offset
        else:
            out.append(R.AcquiredRecords(first_offset=offset, last_offset=offset, delivery_count=count))
    return out
