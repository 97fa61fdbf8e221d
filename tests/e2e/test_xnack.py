"""XNACK (Redis 8.8) through a real ``partita``: pending entries released back
to the group (no owner, claimable at once and first), the delivery count by
mode (SILENT one less, FAIL kept, FATAL LLONG_MAX) or RETRYCOUNT, FORCE.

Specified from the command's page (redis.io/commands/xnack) and Redis's own
tests of it (stream-cgroups.tcl, "XNACK ..."): exact replies and error
texts, RESP2 and RESP3, and redis-py 8's ``xnack``."""

from __future__ import annotations

import redis

from tests.e2e.groups_support import Resp, parse, topic_with_one_pending, while_blocked

LLONG_MAX = 2**63 - 1


def _setup(r: Resp, key: str, n: int = 3, consumer: str = "c1") -> None:
    for ms in range(1, n + 1):
        r.call("XADD", key, f"{ms}-0", "f", f"v{ms}")
    r.call("XGROUP", "CREATE", key, "grp", "0")
    r.call("XREADGROUP", "GROUP", "grp", consumer, "STREAMS", key, ">")


def _released(entry_id: bytes, count: int) -> bytes:
    """An XPENDING row of a released entry: no consumer, idle -1."""
    return b"*4\r\n$%d\r\n%s\r\n$0\r\n\r\n:-1\r\n:%d\r\n" % (len(entry_id), entry_id, count)


def _rows(r: Resp, key: str, *consumer: str) -> list:
    return parse(r.call("XPENDING", key, "grp", "-", "+", "100", *consumer))


def test_xnack_refuses_what_redis_refuses(partita_shared):
    r = Resp(partita_shared.port)
    arity = b"-ERR wrong number of arguments for 'xnack' command\r\n"
    for argv in (("XNACK",), ("XNACK", "key"), ("XNACK", "key", "group"), ("XNACK", "key", "group", "SILENT"),
                 ("XNACK", "key", "group", "SILENT", "IDS"), ("XNACK", "key", "group", "SILENT", "IDS", "1"),
                 ("XNACK", "k", "grp", "FAIL", "RETRYCOUNT")):
        assert r.call(*argv) == arity, argv
    assert r.call("XNACK", "nosuchkey", "grp", "SILENT", "IDS", "1", "1-0") == \
        b"-NOGROUP No such key 'nosuchkey' or consumer group 'grp'\r\n"
    _setup(r, "bad", n=2)
    assert r.call("XNACK", "bad", "nogroup", "SILENT", "IDS", "1", "1-0") == \
        b"-NOGROUP No such key 'bad' or consumer group 'nogroup'\r\n"
    cases = {
        ("FAIL", "BADOPT", "IDS", "1", "1-0"): b"-ERR Unrecognized XNACK option 'BADOPT'\r\n",
        ("FAIL", "IDS", "1", "1-0", "BADOPT"): b"-ERR Unrecognized XNACK option 'BADOPT'\r\n",
        ("SILENT", "FORCE", "BADOPT", "IDS", "1", "1-0"): b"-ERR Unrecognized XNACK option 'BADOPT'\r\n",
        ("FAIL", "RETRYCOUNT", "5", "BADOPT", "IDS", "1", "1-0"): b"-ERR Unrecognized XNACK option 'BADOPT'\r\n",
        ("FAIL", "FORCE", "IDS", "1", "1-0", "BADOPT", "RETRYCOUNT", "5"):
            b"-ERR Unrecognized XNACK option 'BADOPT'\r\n",
        ("BADMODE", "IDS", "1", "1-0"): b"-ERR mode must be SILENT, FAIL, or FATAL\r\n",
        ("FAIL", "FATAL", "IDS", "1", "1-0"): b"-ERR Unrecognized XNACK option 'FATAL'\r\n",
        ("SILENT", "FAIL", "IDS", "1", "1-0"): b"-ERR Unrecognized XNACK option 'FAIL'\r\n",
        ("SILENT", "NOTIDS", "1", "1-0"): b"-ERR Unrecognized XNACK option 'NOTIDS'\r\n",
        ("SILENT", "FORCE", "RETRYCOUNT", "5"): b"-ERR syntax error, expected IDS keyword\r\n",
        ("SILENT", "IDS", "abc", "1-0"): b"-ERR numids must be a positive integer\r\n",
        ("SILENT", "IDS", "0", "1-0"): b"-ERR numids must be a positive integer\r\n",
        ("SILENT", "IDS", "-1", "1-0"): b"-ERR numids must be a positive integer\r\n",
        ("SILENT", "IDS", "2", "1-0"): b"-ERR number of IDs doesn't match numids\r\n",
        ("FAIL", "IDS", "1", "not-a-valid-id"): b"-ERR Invalid stream ID specified as stream command argument\r\n",
        ("FAIL", "IDS", "1", "1-0", "RETRYCOUNT", "abc"): b"-ERR value is not an integer or out of range\r\n",
        ("FAIL", "IDS", "1", "1-0", "RETRYCOUNT", "-1"): b"-ERR Invalid RETRYCOUNT value, must be >= 0\r\n",
        ("FAIL", "IDS", "1", "1-0", "RETRYCOUNT", "99999999999999999999"):
            b"-ERR value is not an integer or out of range\r\n",
        ("FAIL", "IDS", "1", "1-0", "RETRYCOUNT"): b"-ERR Unrecognized XNACK option 'RETRYCOUNT'\r\n",
        ("FAIL", "IDS", "1", "1-0", "2-0"): b"-ERR Unrecognized XNACK option '2-0'\r\n",
    }
    for args, reply in cases.items():
        assert r.call("XNACK", "bad", "grp", *args) == reply, args
    assert [row[1] for row in _rows(r, "bad")] == [b"c1", b"c1"]  # no refusal released anything


def test_each_mode_sets_the_delivery_count_and_releases_the_owner(partita_shared):
    r = Resp(partita_shared.port)
    _setup(r, "modes", n=1)
    assert r.call("XNACK", "modes", "grp", "SILENT", "IDS", "1", "1-0") == b":1\r\n"
    assert r.call("XPENDING", "modes", "grp", "-", "+", "10") == b"*1\r\n" + _released(b"1-0", 0)
    r.call("XCLAIM", "modes", "grp", "c2", "0", "1-0", "RETRYCOUNT", "0")
    assert r.call("XNACK", "modes", "grp", "SILENT", "IDS", "1", "1-0") == b":1\r\n"  # never below 0
    assert r.call("XPENDING", "modes", "grp", "-", "+", "10") == b"*1\r\n" + _released(b"1-0", 0)
    for _ in range(3):
        r.call("XCLAIM", "modes", "grp", "c1", "0", "1-0")
    assert r.call("XNACK", "modes", "grp", "FAIL", "IDS", "1", "1-0") == b":1\r\n"
    assert r.call("XPENDING", "modes", "grp", "-", "+", "10") == b"*1\r\n" + _released(b"1-0", 3)
    assert r.call("XNACK", "modes", "grp", "SILENT", "IDS", "1", "1-0") == b":1\r\n"  # released again: 3 - 1
    assert r.call("XNACK", "modes", "grp", "FATAL", "IDS", "1", "1-0") == b":1\r\n"
    assert r.call("XPENDING", "modes", "grp", "-", "+", "10") == b"*1\r\n" + _released(b"1-0", LLONG_MAX)
    assert r.call("XNACK", "modes", "grp", "FATAL", "IDS", "1", "1-0", "RETRYCOUNT", "42") == b":1\r\n"
    assert _rows(r, "modes") == [[b"1-0", b"", -1, 42]]
    # The summary counts it; no consumer lists it.
    assert r.call("XPENDING", "modes", "grp") == b"*4\r\n:1\r\n$3\r\n1-0\r\n$3\r\n1-0\r\n*0\r\n"
    r3 = Resp(partita_shared.port, protocol=3)
    assert r3.call("XNACK", "modes", "grp", "FAIL", "IDS", "1", "1-0") == b":1\r\n"
    assert r3.call("XPENDING", "modes", "grp", "-", "+", "10") == b"*1\r\n" + _released(b"1-0", 42)


def test_xnack_counts_what_it_released_and_skips_what_is_not_pending(partita_shared):
    r = Resp(partita_shared.port)
    _setup(r, "counts")
    assert r.call("XNACK", "counts", "grp", "FAIL", "IDS", "1", "9-9") == b":0\r\n"
    assert r.call("XNACK", "counts", "grp", "SILENT", "IDS", "3", "1-0", "2-0", "3-0") == b":3\r\n"
    assert _rows(r, "counts") == [[b"1-0", b"", -1, 0], [b"2-0", b"", -1, 0], [b"3-0", b"", -1, 0]]
    r.call("XCLAIM", "counts", "grp", "c1", "0", "1-0", "2-0", "3-0")
    assert r.call("XNACK", "counts", "grp", "FAIL", "IDS", "5", "1-0", "9-9", "2-0", "8-8", "3-0") == b":3\r\n"
    r.call("XCLAIM", "counts", "grp", "c1", "0", "1-0")
    assert r.call("XNACK", "counts", "grp", "FAIL", "IDS", "2", "1-0", "1-0") == b":2\r\n"  # each counts
    assert _rows(r, "counts")[0] == [b"1-0", b"", -1, 2]
    assert r.call("XACK", "counts", "grp", "1-0", "2-0", "3-0") == b":3\r\n"
    assert r.call("XNACK", "counts", "grp", "FAIL", "IDS", "1", "1-0") == b":0\r\n"


def test_released_entries_leave_their_consumer_which_stays(partita_shared):
    r = Resp(partita_shared.port)
    for ms in (1, 2, 3):
        r.call("XADD", "owners", f"{ms}-0", "f", "v")
    r.call("XGROUP", "CREATE", "owners", "grp", "0")
    r.call("XREADGROUP", "GROUP", "grp", "c1", "COUNT", "2", "STREAMS", "owners", ">")
    r.call("XREADGROUP", "GROUP", "grp", "c2", "COUNT", "1", "STREAMS", "owners", ">")
    assert r.call("XNACK", "owners", "grp", "FAIL", "IDS", "1", "3-0") == b":1\r\n"
    assert r.call("XNACK", "owners", "grp", "FAIL", "IDS", "1", "1-0") == b":1\r\n"
    assert [row[0] for row in _rows(r, "owners", "c1")] == [b"2-0"]
    assert _rows(r, "owners", "c2") == []
    consumers = [dict(zip(c[::2], c[1::2])) for c in parse(r.call("XINFO", "CONSUMERS", "owners", "grp"))]
    assert [(c[b"name"], c[b"pending"]) for c in consumers] == [(b"c1", 1), (b"c2", 0)]
    # A history read serves the consumer's own entries only.
    assert [e[0] for e in parse(r.call("XREADGROUP", "GROUP", "grp", "c1", "STREAMS", "owners", "0"))[0][1]] == [b"2-0"]
    # XINFO STREAM FULL: no consumer, delivery time 0.
    (group,) = dict(zip(*[iter(parse(r.call("XINFO", "STREAM", "owners", "FULL")))] * 2))[b"groups"]
    group = dict(zip(group[::2], group[1::2]))
    assert [row for row in group[b"pending"] if row[1] == b""] == [[b"1-0", b"", 0, 1], [b"3-0", b"", 0, 1]]
    # Redis 8.8's nacked-count (released entries), after pel-count: where
    # redis.io's pages do not place it (docs/groups.md).
    assert list(group)[4:7] == [b"pel-count", b"nacked-count", b"pending"]
    assert (group[b"pel-count"], group[b"nacked-count"]) == (3, 2)
    # DELCONSUMER counts and drops the owned ones; released entries stay in the group.
    assert r.call("XGROUP", "DELCONSUMER", "owners", "grp", "c1") == b":1\r\n"
    assert [row[0] for row in _rows(r, "owners")] == [b"1-0", b"3-0"]


def test_force_makes_an_entry_of_the_stream_pending_released(partita_shared):
    r = Resp(partita_shared.port)
    for ms in (1, 2, 3):
        r.call("XADD", "force", f"{ms}-0", "f", "v")
    r.call("XGROUP", "CREATE", "force", "grp", "0")
    assert r.call("XNACK", "force", "grp", "FAIL", "IDS", "1", "1-0", "FORCE") == b":1\r\n"
    assert _rows(r, "force") == [[b"1-0", b"", -1, 0]]
    assert r.call("XNACK", "force", "grp", "FAIL", "IDS", "1", "9-9", "FORCE") == b":0\r\n"  # not in the stream
    assert r.call("XNACK", "force", "grp", "FATAL", "FORCE", "IDS", "1", "2-0", "RETRYCOUNT", "77") == b":1\r\n"
    assert r.call("XNACK", "force", "grp", "SILENT", "RETRYCOUNT", "5", "IDS", "1", "3-0", "FORCE") == b":1\r\n"
    assert _rows(r, "force") == [[b"1-0", b"", -1, 0], [b"2-0", b"", -1, 77], [b"3-0", b"", -1, 5]]
    claimed = parse(r.call("XCLAIM", "force", "grp", "c1", "0", "1-0"))
    assert [e[0] for e in claimed] == [b"1-0"]


def test_released_entries_are_claimed_first_in_the_order_released(partita_shared):
    r = Resp(partita_shared.port)
    _setup(r, "zone", n=4)
    assert r.call("XNACK", "zone", "grp", "FAIL", "IDS", "3", "3-0", "1-0", "2-0") == b":3\r\n"
    assert r.call("XNACK", "zone", "grp", "FAIL", "IDS", "1", "3-0") == b":1\r\n"  # to the tail again
    order = []
    for _ in range(4):
        reply = parse(r.call("XREADGROUP", "GROUP", "grp", "c2", "COUNT", "1", "CLAIM", "100000",
                             "STREAMS", "zone", ">"))
        order.append((reply[0][1][0][0], reply[0][1][0][2])) if reply else order.append(None)
    assert order == [(b"1-0", -1), (b"2-0", -1), (b"3-0", -1), None]  # 4-0: owned, not idle enough
    # XCLAIM and XAUTOCLAIM take them whatever their min-idle-time.
    assert r.call("XNACK", "zone", "grp", "FAIL", "IDS", "2", "4-0", "1-0") == b":2\r\n"
    assert [e[0] for e in parse(r.call("XCLAIM", "zone", "grp", "c3", "99999", "4-0"))] == [b"4-0"]
    assert [e[0] for e in parse(r.call("XAUTOCLAIM", "zone", "grp", "c3", "99999", "0-0"))[1]] == [b"1-0"]


def test_xnack_wakes_a_blocked_claim_read(partita_shared):
    r = Resp(partita_shared.port)
    _setup(r, "wake", n=2)
    reply = while_blocked(partita_shared.port, ("XREADGROUP", "GROUP", "grp", "c2", "BLOCK", "20000",
                                                "CLAIM", "1000000", "STREAMS", "wake", ">"),
                          lambda: r.call("XNACK", "wake", "grp", "FAIL", "IDS", "2", "1-0", "2-0"))
    assert [e[0] for e in parse(reply)[0][1]] == [b"1-0", b"2-0"]
    assert [row[1] for row in _rows(r, "wake")] == [b"c2", b"c2"]


def test_xnack_of_a_topic_key_needs_a_partition_key(partita_shared):
    r = Resp(partita_shared.port)
    topic_with_one_pending(r, "nack-topic", "grp", 0)
    assert r.call("XNACK", "nack-topic", "grp", "FAIL", "IDS", "1", "1-0").startswith(
        b"-ERR 'nack-topic' is a topic of 2 partitions: this command needs a partition key")
    assert r.call("XNACK", "nack-topic#0", "grp", "FAIL", "IDS", "1", "1-0") == b":1\r\n"


def test_xclaim_retrycount_beyond_32_bits_is_kept(partita_shared):
    """A delivery count is a u64 (FATAL's LLONG_MAX, or XCLAIM RETRYCOUNT's):
    Partita's group journal held 32 bits and answered an internal error."""
    r = Resp(partita_shared.port)
    _setup(r, "wide", n=1)
    assert r.call("XCLAIM", "wide", "grp", "c1", "0", "1-0", "RETRYCOUNT", "99999999999", "JUSTID") == \
        b"*1\r\n$3\r\n1-0\r\n"
    assert _rows(r, "wide")[0][3] == 99999999999


def test_redis_py_8_xnack(partita_shared):
    client = redis.Redis(port=partita_shared.port)
    ids = [client.xadd("py-nack", {"n": i}) for i in range(3)]
    client.xgroup_create("py-nack", "g", 0)
    client.xreadgroup("g", "c", {"py-nack": ">"})
    assert client.xnack("py-nack", "g", "FAIL", ids[0], ids[1]) == 2
    assert client.xnack("py-nack", "g", "SILENT", ids[2], retrycount=7) == 1
    pending = client.xpending_range("py-nack", "g", "-", "+", 10)
    assert [(p["consumer"], p["time_since_delivered"], p["times_delivered"]) for p in pending] == [
        (b"", -1, 1), (b"", -1, 1), (b"", -1, 7)]
    client.xack("py-nack", "g", ids[0])
    assert client.xnack("py-nack", "g", "FATAL", ids[0], force=True) == 1
    assert client.xpending_range("py-nack", "g", "-", "+", 1)[0]["times_delivered"] == LLONG_MAX
