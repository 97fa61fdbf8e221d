"""What the Redis 8 group commands change survives a restart: XACKDEL and
XDELEX's reference policies, XTRIM ACKED's deletions between kept entries,
XNACK's released entries and their claim order, CLAIM's hand-overs.
``fsync always`` with kill -9 (every reply was durable), and ``everysec``
with a clean stop (the stop flushes)."""

from __future__ import annotations

import pytest

from tests.e2e.groups_support import Resp, parse


def _state(r: Resp) -> dict:
    """Everything the commands below changed, as replies."""
    out = {}
    for key in ("orders", "jobs"):
        out[key] = (r.call("XRANGE", key, "-", "+"), r.call("XLEN", key),
                    {g: [(sid, owner, idle == -1, n) for sid, owner, idle, n  # (idle -1: released)
                         in parse(r.call("XPENDING", key, g, "-", "+", "100"))] for g in ("billing", "audit")})
    info = parse(r.call("XINFO", "STREAM", "orders"))
    fields = dict(zip(info[::2], info[1::2]))
    out["info"] = [fields[name] for name in (b"length", b"last-generated-id", b"max-deleted-entry-id",
                                             b"entries-added", b"recorded-first-entry-id")]
    return out


def _claim_order(r: Resp) -> list[bytes]:
    """Who CLAIM takes first on "jobs" (released entries in release order)."""
    order = []
    while True:
        reply = parse(r.call("XREADGROUP", "GROUP", "billing", "later", "COUNT", "1", "CLAIM", "100000",
                             "STREAMS", "jobs", ">"))
        if not reply or not reply[0][1] or reply[0][1][0][3] == 0:
            return order
        order.append(reply[0][1][0][0])


@pytest.mark.parametrize("policy", ["always", "everysec"])
def test_reference_policies_and_released_entries_survive_a_restart(partita_factory, policy):
    server = partita_factory(["--fsync", policy])
    r = Resp(server.port)
    for key in ("orders", "jobs"):
        for ms in range(1, 9):
            r.call("XADD", key, f"{ms}-0", "f", f"v{ms}")
        r.call("XGROUP", "CREATE", key, "billing", "0")
        r.call("XGROUP", "CREATE", key, "audit", "0")
        r.call("XREADGROUP", "GROUP", "billing", "b1", "STREAMS", key, ">")
        r.call("XREADGROUP", "GROUP", "audit", "a1", "COUNT", "6", "STREAMS", key, ">")
    # orders: every reference policy.
    assert r.call("XACKDEL", "orders", "billing", "ACKED", "IDS", "2", "1-0", "7-0") == b"*2\r\n:2\r\n:2\r\n"
    assert r.call("XACKDEL", "orders", "audit", "ACKED", "IDS", "1", "1-0") == b"*1\r\n:1\r\n"
    assert r.call("XDELEX", "orders", "DELREF", "IDS", "2", "2-0", "8-0") == b"*2\r\n:1\r\n:1\r\n"
    assert r.call("XACK", "orders", "billing", "3-0", "5-0") == b":2\r\n"
    assert r.call("XACK", "orders", "audit", "3-0", "5-0") == b":2\r\n"
    assert r.call("XTRIM", "orders", "MAXLEN", "1", "ACKED") == b":2\r\n"  # 3-0 and 5-0: 4-0 between them stays
    # jobs: released entries, in an order, and a claim.
    assert r.call("XNACK", "jobs", "billing", "FAIL", "IDS", "3", "6-0", "2-0", "4-0") == b":3\r\n"
    assert r.call("XNACK", "jobs", "billing", "FATAL", "IDS", "1", "2-0") == b":1\r\n"
    r.call("XCLAIM", "jobs", "billing", "b2", "0", "1-0", "IDLE", "1000")
    before = _state(r)
    if policy == "always":
        server.kill9()
    else:
        assert server.terminate() == 0
    server.start()
    r = Resp(server.port)
    assert _state(r) == before
    assert _claim_order(r) == [b"6-0", b"4-0", b"2-0"]
