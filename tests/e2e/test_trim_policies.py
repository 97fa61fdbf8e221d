"""XTRIM's and XADD's reference policies (Redis 8.2): KEEPREF (the default)
leaves the groups' references to trimmed entries, DELREF removes them,
ACKED trims only what no group still needs. Specified from the XTRIM and
XADD pages (redis.io/commands/xtrim, /xadd) and checked exactly through a
real ``partita`` and redis-py 8's ``xtrim`` / ``xadd``."""

from __future__ import annotations

import redis

from tests.e2e.groups_support import Resp, parse


def _ids(reply: bytes) -> list[bytes]:
    return [entry[0] for entry in parse(reply)]


def _pending_ids(r: Resp, key: str, group: str = "g") -> list[bytes]:
    return [row[0] for row in parse(r.call("XPENDING", key, group, "-", "+", "100"))]


def _five_read_by_g(r: Resp, key: str) -> None:
    for ms in range(1, 6):
        r.call("XADD", key, f"{ms}-0", "f", "v")
    r.call("XGROUP", "CREATE", key, "g", "0")
    r.call("XREADGROUP", "GROUP", "g", "c", "STREAMS", key, ">")


def test_xtrim_keepref_is_the_default_and_leaves_the_references(partita_shared):
    r = Resp(partita_shared.port)
    _five_read_by_g(r, "keep")
    assert r.call("XTRIM", "keep", "MAXLEN", "2") == b":3\r\n"
    assert _pending_ids(r, "keep") == [b"1-0", b"2-0", b"3-0", b"4-0", b"5-0"]
    assert r.call("XTRIM", "keep", "MAXLEN", "1", "KEEPREF") == b":1\r\n"
    assert len(_pending_ids(r, "keep")) == 5


def test_xtrim_delref_removes_the_trimmed_entries_references(partita_shared):
    r = Resp(partita_shared.port)
    _five_read_by_g(r, "del")
    r.call("XGROUP", "CREATE", "del", "other", "0")
    r.call("XREADGROUP", "GROUP", "other", "c", "COUNT", "1", "STREAMS", "del", ">")
    assert r.call("XTRIM", "del", "MAXLEN", "=", "2", "DELREF") == b":3\r\n"
    assert _pending_ids(r, "del") == [b"4-0", b"5-0"]
    assert _pending_ids(r, "del", "other") == []
    assert r.call("XTRIM", "del", "MINID", "5", "LIMIT", "0", "DELREF") == \
        b"-ERR syntax error, LIMIT cannot be used without the special ~ option\r\n"
    assert r.call("XTRIM", "del", "DELREF", "MINID", "5") == b":1\r\n"  # the policy may come first
    assert _pending_ids(r, "del") == [b"5-0"]


def test_xtrim_acked_keeps_what_a_group_needs_and_trims_around_it(partita_shared):
    """ACKED: 3-0 and 5-0 pending; 1-0, 2-0, 4-0 acknowledged. MAXLEN 1
    cannot be met: the three deletable entries go (4-0 from between two
    kept ones), the needed ones stay. A trim's deletions leave
    max-deleted-entry-id alone (Redis's trims never set it)."""
    r = Resp(partita_shared.port)
    _five_read_by_g(r, "ack")
    assert r.call("XACK", "ack", "g", "1-0", "2-0", "4-0") == b":3\r\n"
    assert r.call("XTRIM", "ack", "MAXLEN", "1", "ACKED") == b":3\r\n"
    assert _ids(r.call("XRANGE", "ack", "-", "+")) == [b"3-0", b"5-0"]
    assert r.call("XLEN", "ack") == b":2\r\n"
    info = parse(r.call("XINFO", "STREAM", "ack"))
    fields = dict(zip(info[::2], info[1::2]))
    assert fields[b"max-deleted-entry-id"] == b"0-0"
    assert _pending_ids(r, "ack") == [b"3-0", b"5-0"]
    # Entries a group may still deliver are needed too: "late" is at 4-0, so
    # 5-0 and 6-0 stay whoever has them pending; 3-0, acknowledged, goes.
    r.call("XADD", "ack", "6-0", "f", "v")
    assert r.call("XACK", "ack", "g", "3-0", "5-0") == b":2\r\n"
    r.call("XGROUP", "CREATE", "ack", "late", "4-0")
    assert r.call("XTRIM", "ack", "MINID", "7", "ACKED") == b":1\r\n"
    assert _ids(r.call("XRANGE", "ack", "-", "+")) == [b"5-0", b"6-0"]


def test_xtrim_acked_counts_the_trim_as_exact_as_it_can(partita_shared):
    r = Resp(partita_shared.port)
    _five_read_by_g(r, "exact")
    assert r.call("XACK", "exact", "g", "1-0", "2-0", "3-0", "4-0", "5-0") == b":5\r\n"
    r.call("XADD", "exact", "6-0", "f", "v")  # not read by g: needed
    assert r.call("XTRIM", "exact", "MAXLEN", "3", "ACKED") == b":3\r\n"
    assert _ids(r.call("XRANGE", "exact", "-", "+")) == [b"4-0", b"5-0", b"6-0"]
    assert r.call("XTRIM", "exact", "MAXLEN", "0", "ACKED") == b":2\r\n"
    assert _ids(r.call("XRANGE", "exact", "-", "+")) == [b"6-0"]


def test_xtrim_approximate_acked_stops_at_the_first_needed_entry(partita_shared):
    """``~`` trims whole nodes only, and with ACKED never one holding an
    entry a group needs (Redis stops at the first node it cannot drop)."""
    r = Resp(partita_shared.port)
    _five_read_by_g(r, "approx")
    assert r.call("XTRIM", "approx", "MAXLEN", "~", "0", "ACKED") == b":0\r\n"
    assert r.call("XLEN", "approx") == b":5\r\n"
    assert r.call("XACK", "approx", "g", "1-0", "2-0", "3-0", "4-0", "5-0") == b":5\r\n"
    assert r.call("XTRIM", "approx", "MAXLEN", "~", "0", "ACKED") == b":5\r\n"


def test_approximate_acked_goes_on_past_a_node_it_cannot_drop_whole(partita_shared):
    """Redis 8.6's ``streamTrim``: with ACKED (or DELREF) a ``~`` trim does not
    stop at the first node holding a needed entry, as a KEEPREF one does; it
    deletes the deletable entries of every node the trim reaches, one by one
    (Redis's test "XTRIM with approx and ACKED deletes entries correctly"):
    nodes of 2, 1-0 .. 5-0 read, 1-0, 2-0 and 4-0 acknowledged: 4-0 goes from
    the node [3-0, 4-0] too."""
    r = Resp(partita_shared.port)
    assert r.call("CONFIG", "SET", "stream-node-max-entries", "2") == b"+OK\r\n"
    try:
        _five_read_by_g(r, "past")
        assert r.call("XACK", "past", "g", "1-0", "2-0", "4-0") == b":3\r\n"
        assert r.call("XTRIM", "past", "MINID", "~", "6-0", "ACKED") == b":3\r\n"
        assert _ids(r.call("XRANGE", "past", "-", "+")) == [b"3-0", b"5-0"]
        # Entries a group may still deliver are needed: with 6-0 .. 10-0 never
        # read, MAXLEN ~ 0 deletes 3-0 and 5-0 once acknowledged, and only them.
        for ms in range(6, 11):
            r.call("XADD", "past", f"{ms}-0", "f", "v")
        assert r.call("XACK", "past", "g", "3-0", "5-0") == b":2\r\n"
        assert r.call("XTRIM", "past", "MAXLEN", "~", "0", "ACKED") == b":2\r\n"
        assert _ids(r.call("XRANGE", "past", "-", "+", "COUNT", "1")) == [b"6-0"]
        assert r.call("XADD", "past", "ACKED", "MINID", "~", "11", "11-0", "f", "v") == b"$4\r\n11-0\r\n"
        assert r.call("XLEN", "past") == b":6\r\n"  # 6-0 .. 10-0 still to be delivered
    finally:
        r.call("CONFIG", "SET", "stream-node-max-entries", "100")


def test_approximate_acked_keeps_its_limit(partita_shared):
    """``~`` ACKED deletes at most LIMIT entries, counted by nodes as in
    Redis's ``streamTrim``: it stops before the first node whose live entries
    would take it past the limit (here [3-0, 4-0] after [1-0, 2-0])."""
    r = Resp(partita_shared.port)
    assert r.call("CONFIG", "SET", "stream-node-max-entries", "2") == b"+OK\r\n"
    try:
        _five_read_by_g(r, "limited")
        assert r.call("XACK", "limited", "g", "1-0", "2-0", "4-0", "5-0") == b":4\r\n"
        assert r.call("XTRIM", "limited", "MINID", "~", "6-0", "LIMIT", "3", "ACKED") == b":2\r\n"
        assert _ids(r.call("XRANGE", "limited", "-", "+")) == [b"3-0", b"4-0", b"5-0"]
        assert r.call("XTRIM", "limited", "MINID", "~", "6-0", "LIMIT", "2", "ACKED") == b":2\r\n"
        assert _ids(r.call("XRANGE", "limited", "-", "+")) == [b"3-0"]
    finally:
        r.call("CONFIG", "SET", "stream-node-max-entries", "100")


def test_approximate_delref_trims_entry_by_entry_within_its_limit(partita_shared):
    """Redis 8.6's ``streamTrim`` keeps ``~``'s whole-node trimming for
    KEEPREF only: with DELREF (or ACKED on a stream without groups) every
    entry the trim reaches goes, one by one, and only its LIMIT counts by
    nodes. Nodes of 2, five entries read by g: MAXLEN ~ 2 removes 3 (KEEPREF
    would remove the first node only), MINID ~ 4 removes 1-0 .. 3-0."""
    r = Resp(partita_shared.port)
    assert r.call("CONFIG", "SET", "stream-node-max-entries", "2") == b"+OK\r\n"
    try:
        _five_read_by_g(r, "dm")
        assert r.call("XTRIM", "dm", "MAXLEN", "~", "2", "DELREF") == b":3\r\n"
        assert _pending_ids(r, "dm") == [b"4-0", b"5-0"]
        _five_read_by_g(r, "dmin")
        assert r.call("XTRIM", "dmin", "MINID", "~", "4", "DELREF") == b":3\r\n"
        assert _ids(r.call("XRANGE", "dmin", "-", "+")) == [b"4-0", b"5-0"]
        _five_read_by_g(r, "dlim")
        assert r.call("XTRIM", "dlim", "MAXLEN", "~", "0", "LIMIT", "3", "DELREF") == b":2\r\n"
        assert _pending_ids(r, "dlim") == [b"3-0", b"4-0", b"5-0"]
        for ms in range(1, 6):
            r.call("XADD", "nog", f"{ms}-0", "f", "v")
        assert r.call("XTRIM", "nog", "MAXLEN", "~", "2", "ACKED") == b":3\r\n"
        # KEEPREF's ~ by whole nodes: [3-0 (deleted), 4-0] goes, [5-0] stays.
        assert r.call("XTRIM", "nog", "MAXLEN", "~", "1", "KEEPREF") == b":1\r\n"
    finally:
        r.call("CONFIG", "SET", "stream-node-max-entries", "100")


def test_xtrim_acked_without_groups_is_a_plain_trim(partita_shared):
    r = Resp(partita_shared.port)
    for ms in range(1, 4):
        r.call("XADD", "nogroups", f"{ms}-0", "f", "v")
    assert r.call("XTRIM", "nogroups", "MAXLEN", "1", "ACKED") == b":2\r\n"
    assert r.call("XTRIM", "nogroups", "MAXLEN", "0", "DELREF") == b":1\r\n"


def test_xadd_trims_with_its_reference_policy(partita_shared):
    r = Resp(partita_shared.port)
    _five_read_by_g(r, "add")
    assert r.call("XACK", "add", "g", "1-0", "2-0") == b":2\r\n"
    # The policy anywhere among the options before the ID; the last one given counts.
    assert r.call("XADD", "add", "ACKED", "MAXLEN", "2", "6-0", "f", "v") == b"$3\r\n6-0\r\n"
    assert _ids(r.call("XRANGE", "add", "-", "+")) == [b"3-0", b"4-0", b"5-0", b"6-0"]
    assert r.call("XADD", "add", "MAXLEN", "2", "KEEPREF", "DELREF", "7-0", "f", "v") == b"$3\r\n7-0\r\n"
    assert _ids(r.call("XRANGE", "add", "-", "+")) == [b"6-0", b"7-0"]
    assert _pending_ids(r, "add") == []  # 3-0 .. 5-0's references went with them
    assert r.call("XADD", "add", "NOMKSTREAM", "KEEPREF", "*", "f").startswith(b"-ERR wrong number of arguments")


def test_redis_py_8_trims_with_a_reference_policy(partita_shared):
    client = redis.Redis(port=partita_shared.port)
    ids = [client.xadd("py-trim", {"n": i}) for i in range(4)]
    client.xgroup_create("py-trim", "g", "0")
    client.xreadgroup("g", "c", {"py-trim": ">"})
    assert client.xtrim("py-trim", maxlen=2, approximate=False, ref_policy="ACKED") == 0
    client.xack("py-trim", "g", ids[0])
    assert client.xtrim("py-trim", maxlen=2, approximate=False, ref_policy="ACKED") == 1
    client.xadd("py-trim", {"n": 4}, maxlen=2, approximate=False, ref_policy="DELREF")
    assert client.xlen("py-trim") == 2
    assert [p["message_id"] for p in client.xpending_range("py-trim", "g", "-", "+", 10)] == [ids[3]]
