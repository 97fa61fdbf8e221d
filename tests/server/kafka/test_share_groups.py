"""Share group membership and share sessions (``server.kafka_front.share_groups``): joins,
heartbeats, epochs, the simple assignment, leaving, session expiry on a given clock, and the
share session epochs."""

from __future__ import annotations

from server.kafka import errors as E
from server.kafka_front.share_groups import SESSION_TIMEOUT_MS, ShareGroups, ShareSessions

TOPICS = {"orders": 3, "audit": 1}


def beat(groups, member, epoch, topics=None, now_s=0.0, group="g"):
    return groups.heartbeat(group, member, epoch, topics, TOPICS.get, now_s)[0]


def test_every_member_is_assigned_every_partition_of_its_topics():
    groups = ShareGroups()
    a = beat(groups, "a", 0, ["orders", "missing"])
    assert a.error == E.NONE and a.assignment == {"orders": (0, 1, 2)} and a.member_epoch > 0
    b = beat(groups, "b", 0, ["orders", "audit"])
    assert b.assignment == {"orders": (0, 1, 2), "audit": (0,)}  # partitions are shared
    again = beat(groups, "a", a.member_epoch)
    assert again == (E.NONE, a.member_epoch, None, None)  # unchanged: no assignment sent


def test_a_new_subscription_or_partition_sends_a_new_assignment_with_a_new_epoch():
    groups = ShareGroups()
    a = beat(groups, "a", 0, ["orders"])
    changed = beat(groups, "a", a.member_epoch, ["orders", "audit"])
    assert changed.member_epoch > a.member_epoch and changed.assignment == {"orders": (0, 1, 2), "audit": (0,)}
    TOPICS["orders"] = 4
    try:
        grown = beat(groups, "a", changed.member_epoch)
    finally:
        TOPICS["orders"] = 3
    assert grown.assignment["orders"] == (0, 1, 2, 3) and grown.member_epoch > changed.member_epoch


def test_refusals():
    groups = ShareGroups()
    assert beat(groups, "", 0, ["orders"]).error == E.INVALID_REQUEST
    assert beat(groups, "a", 0).error == E.INVALID_REQUEST  # no subscription on joining
    assert beat(groups, "a", -2, ["orders"]).error == E.INVALID_REQUEST
    assert beat(groups, "a", 3).error == E.UNKNOWN_MEMBER_ID
    a = beat(groups, "a", 0, ["orders"])
    assert beat(groups, "a", a.member_epoch + 5).error == E.FENCED_MEMBER_EPOCH
    assert beat(groups, "a", 0).assignment == {"orders": (0, 1, 2)}  # joining again: the whole assignment


def test_leaving_and_expiring_members():
    groups = ShareGroups()
    beat(groups, "a", 0, ["orders"], now_s=0.0)
    b = beat(groups, "b", 0, ["orders"], now_s=10.0)
    left, member = groups.heartbeat("g", "b", -1, None, TOPICS.get, 11.0)
    assert left.member_epoch == -1 and member.assigned == {"orders": (0, 1, 2)}
    assert beat(groups, "b", b.member_epoch).error == E.UNKNOWN_MEMBER_ID
    assert groups.expire(SESSION_TIMEOUT_MS / 1000 - 0.5) == []
    gone = groups.expire(SESSION_TIMEOUT_MS / 1000)
    assert [(g, m.member_id) for g, m in gone] == [("g", "a")]
    assert groups.groups == {}  # no members: forgotten


def test_share_session_epochs():
    sessions = ShareSessions(max_sessions=1)
    assert sessions.begin("g", "a", 1)[0] == E.SHARE_SESSION_NOT_FOUND
    error, session = sessions.begin("g", "a", 0)
    assert error == E.NONE and session.epoch == 1
    assert sessions.begin("g", "b", 0)[0] == E.SHARE_SESSION_LIMIT_REACHED
    assert sessions.begin("g", "a", 2)[0] == E.INVALID_SHARE_SESSION_EPOCH
    assert sessions.begin("g", "a", 1) == (E.NONE, session) and session.epoch == 2
    assert sessions.begin("g", "a", -1) == (E.NONE, session)  # closing: the caller closes it
    assert sessions.close("g", "a") is session and len(sessions) == 0
