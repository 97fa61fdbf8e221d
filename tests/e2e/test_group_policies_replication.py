"""The Redis 8 group commands in a 3-node cluster (acks=all, the default):
what XACKDEL, XDELEX DELREF, XNACK and XREADGROUP CLAIM change in the
groups is on every in-sync replica when they reply, like XACK's changes, so
a follower that takes over after the leader is killed serves the same
pending entries, released ones in the same claim order; deletion markers
written before a replied group write (XACKDEL's own, or an XTRIM ACKED's
followed by one) are there too."""

from __future__ import annotations

import pytest

import redis

from tests.clusterkit import leased, running
from tests.e2e.groups_support import Resp, parse


@pytest.fixture
def cluster(tmp_path):
    yield from running(tmp_path)


def _call(r: Resp, *argv):
    """The reply parsed; a ``-TRYAGAIN`` (the new leader's lease while the
    controller moves) raised as redis-py's, for ``leased`` to retry."""
    value = parse(r.call(*argv))
    if isinstance(value, Exception) and str(value).startswith("TRYAGAIN"):
        raise redis.exceptions.TryAgainError(str(value))
    return value


def _state(r: Resp, key: str) -> tuple:
    rows = {g: [(sid, owner, idle == -1, n) for sid, owner, idle, n  # (idle -1: released)
                in _call(r, "XPENDING", key, g, "-", "+", "100")] for g in ("billing", "audit")}
    return _call(r, "XRANGE", key, "-", "+"), _call(r, "XLEN", key), rows


def test_acknowledged_group_changes_survive_the_leaders_death(cluster):
    key = "policies"
    old = cluster.leader_of(key.encode())
    client = Resp(old.port)
    for ms in range(1, 11):
        _call(client, "XADD", key, f"{ms}-0", "f", f"v{ms}")
    for group in ("billing", "audit"):
        _call(client, "XGROUP", "CREATE", key, group, "0")
    _call(client, "XREADGROUP", "GROUP", "billing", "b1", "STREAMS", key, ">")
    _call(client, "XREADGROUP", "GROUP", "audit", "a1", "COUNT", "8", "STREAMS", key, ">")
    assert _call(client, "XACKDEL", key, "billing", "ACKED", "IDS", "2", "1-0", "2-0") == [2, 2]
    assert _call(client, "XACKDEL", key, "audit", "ACKED", "IDS", "1", "1-0") == [1]
    assert _call(client, "XDELEX", key, "DELREF", "IDS", "1", "10-0") == [1]
    assert _call(client, "XACK", key, "billing", "3-0", "5-0") == 2
    assert _call(client, "XACK", key, "audit", "3-0", "5-0") == 2
    assert _call(client, "XTRIM", key, "MAXLEN", "1", "ACKED") == 2  # 3-0, 5-0: markers, no group write
    assert _call(client, "XNACK", key, "billing", "FAIL", "IDS", "3", "8-0", "7-0", "6-0") == 3  # a group write
    assert _call(client, "XNACK", key, "audit", "FATAL", "IDS", "1", "4-0") == 1
    claimed = _call(client, "XREADGROUP", "GROUP", "audit", "a2", "COUNT", "1", "CLAIM", "100000", "STREAMS", key, ">")
    assert claimed[0][1][0][0] == b"4-0"
    before = _state(client, key)
    old.kill9()
    new = cluster.taken_over(key.encode(), old)  # the controller elects an in-sync follower
    moved = Resp(new.port)
    assert leased(lambda: _state(moved, key)) == before
    order = []
    for _ in range(3):
        reply = leased(lambda: _call(moved, "XREADGROUP", "GROUP", "billing", "b9", "COUNT", "1",
                                     "CLAIM", "100000", "STREAMS", key, ">"))
        order.append(reply[0][1][0][0])
    assert order == [b"8-0", b"7-0", b"6-0"]
