"""What ShareFetch and ShareAcknowledge share: the share session step, acknowledgements, partition errors, the answer.

Owns, for the two APIs (``apis/share_fetch.py``, ``apis/share_acknowledge.py``):

- ``begin``: the request's top-level checks (group and member ids, the
  group right) and its share session (``ShareSessions.begin``);
- ``acknowledge``: one partition's acknowledgement batches applied
  (``Session.share_acknowledge``, after the XACK right on the partition),
  answered as an error code and message: INVALID_RECORD_STATE for an offset
  the member does not hold, INVALID_REQUEST for a malformed batch, a
  refusal's code (UNKNOWN_TOPIC_ID, TOPIC_AUTHORIZATION_FAILED,
  NOT_LEADER_OR_FOLLOWER with the leader named, ...);
- ``close``: the session closed (epoch -1) and the records the member still
  holds on its partitions released, as Kafka releases a closed session's;
- ``release_member`` / ``expire``: a member that left or whose session
  expired: its session closed, its records released, its consumer deleted;
- ``answer_when_written``: the response once the group writes the request
  made (acquisitions and acknowledgements are the Redis group's journal
  records) are durable and replicated, as XREADGROUP's and XACK's replies
  wait; if they cannot be, the request's error is KAFKA_STORAGE_ERROR (or
  REQUEST_TIMED_OUT) and no records are returned.

Must not know: the wire format of anything but the acknowledgement batches
and leader fields both APIs have; membership (``share_groups``).
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from cluster.broker.durability import DurabilityError
from cluster.broker.shares import NOT_ACQUIRED, ShareStateError
from server.kafka import errors as E
from server.kafka_front import access
from server.kafka_front.apis.fetch import leader_of
from server.kafka_front.context import Pending
from server.kafka_front.errors import refused

log = logging.getLogger("partita.kafka")

WRITE_TIMEOUT_MS = 5000  # how long an answer waits for the in-sync replicas


def begin(ctx: Any, body: Any) -> tuple[int, str | None, Any]:
    """``(error, message, share session)`` of a ShareFetch / ShareAcknowledge."""
    if not body.group_id:
        return E.INVALID_REQUEST, "GroupId can't be empty.", None
    if not body.member_id:
        return E.INVALID_REQUEST, "MemberId can't be empty.", None
    if not access.group_allowed(ctx, access.GROUP_READ):
        return E.GROUP_AUTHORIZATION_FAILED, None, None
    error, session = ctx.front.share_sessions.begin(body.group_id, body.member_id, body.share_session_epoch)
    return error, None, session


def acknowledge(ctx: Any, group_id: str, member_id: str, name: bytes | None, partition: int,
                batches: list) -> tuple[int, str | None]:
    """Apply one partition's acknowledgement batches: ``(error code, message)``."""
    if name is None:
        return E.UNKNOWN_TOPIC_ID, None
    try:
        access.require(ctx, access.SHARE_ACKNOWLEDGE, name, partition)
        ctx.session.share_acknowledge(group_id.encode(), member_id.encode(), name, partition,
                                      [(b.first_offset, b.last_offset, b.acknowledge_types) for b in batches])
    except ShareStateError as e:
        if e.code == NOT_ACQUIRED:
            return E.INVALID_RECORD_STATE, (f"The record at offset {e.fields['offset']} is not acquired by "
                                            f"member {member_id}")
        return E.INVALID_REQUEST, f"Invalid acknowledgement batch {e.fields}"
    except Exception as exc:  # noqa: BLE001 - every refusal is the partition's error
        return refused(exc)
    return E.NONE, None


def leader_hint(ctx: Any, out: Any, name: bytes | None, partition: int, hints: set[int]) -> None:
    """Name the leader in a NOT_LEADER_OR_FOLLOWER partition answer (``out.current_leader``)."""
    if out.error_code != E.NOT_LEADER_OR_FOLLOWER or name is None:
        return
    leader = leader_of(ctx.session, name, partition)
    if leader is not None:
        out.current_leader.leader_id = leader.leader
        out.current_leader.leader_epoch = leader.leader_epoch
        hints.add(leader.leader)


def node_endpoints(ctx: Any, cls: Any, hints: set[int]) -> list:
    return [cls(node_id=e.node_id, host=e.host, port=e.port) for e in ctx.front.endpoints(ctx) if e.node_id in hints]


def close(ctx: Any, group_id: str, member_id: str) -> None:
    """Close the member's share session; what it still holds on the
    session's partitions is released."""
    session = ctx.front.share_sessions.close(group_id, member_id)
    if session is None:
        return
    partitions = []
    for topic_id, n in session.partitions:
        name = ctx.front.topic_name(ctx.session, topic_id)
        if name is not None:
            partitions.append((name, n))
    ctx.session.share_release(group_id.encode(), member_id.encode(), partitions, delete=False)


def release_member(ctx: Any, group_id: str, member: Any) -> None:
    """A member left its share group (or its session expired): its share
    session here closes, what it holds on its assigned partitions is
    released and its consumer deleted from the Redis groups."""
    ctx.front.share_sessions.close(group_id, member.member_id)
    partitions = [(name.encode(), n) for name, parts in member.assigned.items() for n in parts]
    ctx.session.share_release(group_id.encode(), member.member_id.encode(), partitions)


def expire(ctx: Any, now_s: float) -> None:
    """Members whose session expired leave (``release_member``)."""
    for group_id, member in ctx.front.share_groups.expire(now_s):
        release_member(ctx, group_id, member)


def answer_when_written(ctx: Any, response: Any, fail: Callable[[int], None]) -> Any:
    """``response``, once the request's group writes hold (module docstring)."""
    receipt = ctx.session.take_receipt()
    if receipt is None:
        return response

    def finish(error: BaseException | None) -> Any:
        if error is not None:
            log.error("Kafka share group request: group writes not acknowledged: %s", error)
            fail(E.REQUEST_TIMED_OUT if isinstance(error, TimeoutError) else
                 E.KAFKA_STORAGE_ERROR if isinstance(error, (DurabilityError, OSError)) else
                 E.NOT_LEADER_OR_FOLLOWER)
        return response

    return Pending(receipt, WRITE_TIMEOUT_MS, finish)
