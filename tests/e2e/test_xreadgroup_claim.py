"""XREADGROUP ... CLAIM min-idle-time (Redis 8.4) through a real ``partita``.

Specified from the XREADGROUP page (redis.io/commands/xreadgroup: "The
CLAIM option", "Reply extension for claimed entries", "Ordering
guarantees") and Redis's own tests of it (stream-cgroups.tcl): a ``>`` key
first takes the group's entries pending at least min-idle-time, longest
idle first, then new ones, COUNT over both; every entry of such a reply is
``[id, fields, ms idle, times delivered before]`` (new ones ``0, 0``).
Delivery times are set with ``XCLAIM ... IDLE`` / ``TIME``, never by
sleeping."""

from __future__ import annotations

import threading

import redis

from tests.e2e.groups_support import Resp, parse, while_blocked


def _claimed(entry_id: bytes, value: bytes, idle: bytes, deliveries: int) -> bytes:
    return (b"*4\r\n$%d\r\n%s\r\n*2\r\n$1\r\nf\r\n$%d\r\n%s\r\n:%s\r\n:%d\r\n"
            % (len(entry_id), entry_id, len(value), value, idle, deliveries))


def _setup(r: Resp, key: str, n: int = 2, read: int = 1) -> None:
    for ms in range(1, n + 1):
        r.call("XADD", key, f"{ms}-0", "f", f"v{ms}")
    r.call("XGROUP", "CREATE", key, "g", "0")
    if read:
        r.call("XREADGROUP", "GROUP", "g", "c1", "COUNT", str(read), "STREAMS", key, ">")


def _idle(r: Resp, key: str, entry_id: str, idle_ms: int) -> None:
    """Make ``entry_id`` pending for ``idle_ms`` (XCLAIM IDLE, JUSTID: the count stays)."""
    r.call("XCLAIM", key, "g", "c1", "0", entry_id, "IDLE", str(idle_ms), "JUSTID")


def _first_idle(reply: bytes) -> bytes:
    """The ms idle of a claim reply's first entry, as sent."""
    return reply.split(b":", 1)[1].split(b"\r\n", 1)[0]


def _entries(reply: bytes) -> list:
    value = parse(reply)
    if isinstance(value, dict):
        return [[k, v] for k, v in value.items()][0][1]
    return value[0][1]


def test_claimed_entries_come_first_with_their_idle_time_and_deliveries(partita_shared):
    r = Resp(partita_shared.port)
    _setup(r, "shape")
    _idle(r, "shape", "1-0", 5000)
    reply = r.call("XREADGROUP", "GROUP", "g", "c2", "CLAIM", "1000", "STREAMS", "shape", ">")
    idle = _first_idle(reply)
    assert 5000 <= int(idle) < 65000
    assert reply == (b"*1\r\n*2\r\n$5\r\nshape\r\n*2\r\n" + _claimed(b"1-0", b"v1", idle, 1)
                     + _claimed(b"2-0", b"v2", b"0", 0))
    # Claimed: owned by c2 now, delivered twice; the new one once.
    assert [row[1:2] + row[3:] for row in parse(r.call("XPENDING", "shape", "g", "-", "+", "10"))] == \
        [[b"c2", 2], [b"c2", 1]]
    # RESP3: a map, the same entries.
    r3 = Resp(partita_shared.port, protocol=3)
    r3.call("XADD", "shape", "3-0", "f", "v3")
    assert r3.call("XREADGROUP", "GROUP", "g", "c3", "CLAIM", "100000", "STREAMS", "shape", ">") == \
        b"%1\r\n$5\r\nshape\r\n*1\r\n" + _claimed(b"3-0", b"v3", b"0", 0)
    # Nothing idle enough and nothing new: a null reply, as without CLAIM.
    assert r.call("XREADGROUP", "GROUP", "g", "c3", "CLAIM", "100000", "STREAMS", "shape", ">") == b"*-1\r\n"
    assert r3.call("XREADGROUP", "GROUP", "g", "c3", "CLAIM", "100000", "STREAMS", "shape", ">") == b"_\r\n"


def test_claim_takes_the_longest_idle_first_and_count_covers_both_kinds(partita_shared):
    r = Resp(partita_shared.port)
    _setup(r, "order", n=6, read=4)
    for entry_id, idle in (("1-0", 20000), ("2-0", 50000), ("3-0", 30000), ("4-0", 1000)):
        _idle(r, "order", entry_id, idle)
    entries = _entries(r.call("XREADGROUP", "GROUP", "g", "c2", "COUNT", "4", "CLAIM", "10000",
                              "STREAMS", "order", ">"))
    assert [e[0] for e in entries] == [b"2-0", b"3-0", b"1-0", b"5-0"]  # 4-0 is not idle enough
    assert [e[3] for e in entries] == [1, 1, 1, 0]
    assert entries[0][2] >= 50000 and entries[1][2] >= 30000 and entries[3][2] == 0


def test_noack_applies_to_new_entries_only(partita_shared):
    r = Resp(partita_shared.port)
    _setup(r, "noack")
    _idle(r, "noack", "1-0", 5000)
    entries = _entries(r.call("XREADGROUP", "GROUP", "g", "c1", "NOACK", "CLAIM", "50", "STREAMS", "noack", ">"))
    assert [e[0] for e in entries] == [b"1-0", b"2-0"]
    assert [row[0] for row in parse(r.call("XPENDING", "noack", "g", "-", "+", "10"))] == [b"1-0"]


def test_claim_is_ignored_for_a_history_read(partita_shared):
    r = Resp(partita_shared.port)
    _setup(r, "history", n=2, read=2)
    assert r.call("XREADGROUP", "GROUP", "g", "c1", "CLAIM", "0", "STREAMS", "history", "0") == (
        b"*1\r\n*2\r\n$7\r\nhistory\r\n*2\r\n*2\r\n$3\r\n1-0\r\n*2\r\n$1\r\nf\r\n$2\r\nv1\r\n"
        b"*2\r\n$3\r\n2-0\r\n*2\r\n$1\r\nf\r\n$2\r\nv2\r\n")


def test_claim_over_several_streams_serves_each_key(partita_shared):
    r = Resp(partita_shared.port)
    for key in ("multi1", "multi2"):
        _setup(r, key)
        _idle(r, key, "1-0", 5000)
    value = parse(r.call("XREADGROUP", "GROUP", "g", "c1", "CLAIM", "100", "STREAMS", "multi1", "multi2", ">", ">"))
    assert [row[0] for row in value] == [b"multi1", b"multi2"]
    for _, entries in value:
        assert [(e[0], e[3]) for e in entries] == [(b"1-0", 1), (b"2-0", 0)]


def test_entries_gone_from_the_stream_are_dropped_not_claimed(partita_shared):
    r = Resp(partita_shared.port)
    _setup(r, "gone", n=3, read=3)
    assert r.call("XTRIM", "gone", "MAXLEN", "0") == b":3\r\n"
    assert r.call("XREADGROUP", "GROUP", "g", "c2", "CLAIM", "0", "STREAMS", "gone", ">") == b"*-1\r\n"
    assert r.call("XPENDING", "gone", "g") == b"*4\r\n:0\r\n$-1\r\n$-1\r\n*-1\r\n"


def test_claim_zero_is_accepted_and_takes_every_pending_entry(partita_shared):
    # Redis 8 (stream-cgroups.tcl "XREADGROUP CLAIM with min-idle-time equal
    # to zero"): 0 is a valid min-idle-time although the error for a negative
    # one says "must be a positive integer".
    r = Resp(partita_shared.port)
    _setup(r, "zero")
    _idle(r, "zero", "1-0", 0)
    reply = r.call("XREADGROUP", "GROUP", "g", "c1", "CLAIM", "0", "STREAMS", "zero", ">")
    idle = _first_idle(reply)
    assert int(idle) >= 0
    assert reply == (b"*1\r\n*2\r\n$4\r\nzero\r\n*2\r\n" + _claimed(b"1-0", b"v1", idle, 1)
                     + _claimed(b"2-0", b"v2", b"0", 0))


def test_claim_refuses_what_redis_refuses(partita_shared):
    r = Resp(partita_shared.port)
    _setup(r, "bad")
    not_integer = b"-ERR min-idle-time is not an integer\r\n"
    negative = b"-ERR min-idle-time must be a positive integer\r\n"
    for value in ("test", "5.5", "+10", "-0", "10e", "10/2"):
        assert r.call("XREADGROUP", "GROUP", "g", "c1", "CLAIM", value, "STREAMS", "bad", ">") == not_integer, value
    for value in ("-10", "-42"):
        assert r.call("XREADGROUP", "GROUP", "g", "c1", "CLAIM", value, "STREAMS", "bad", ">") == negative
    cases = [
        (("XREADGROUP", "GROUP", "g", "c1", "CLAIM", "10", "CLAIM", "COUNT", "1", "STREAMS", "bad", ">"), not_integer),
        (("XREADGROUP", "CLAIM", "GROUP", "g", "c1", "COUNT", "1", "STREAMS", "bad", ">"), not_integer),
        (("XREADGROUP", "GROUP", "g", "c1", "CLAIM", "STREAMS", "bad", ">"), not_integer),
        (("XREADGROUP", "GROUP", "g", "CLAIM", "50", "c1", "STREAMS", "bad", ">"), b"-ERR syntax error\r\n"),
        (("XREADGROUP", "GROUP", "g", "c1", "STREAMS", "bad", "CLAIM", "50", ">"),
         b"-NOGROUP No such key 'CLAIM' or consumer group 'g' in XREADGROUP with GROUP option\r\n"),
        (("XREADGROUP", "GROUP", "g", "c1", "STREAMS", "bad", ">", "CLAIM", "50"),
         b"-ERR Invalid stream ID specified as stream command argument\r\n"),
        (("XREADGROUP", "GROUP", "nogroup", "c1", "CLAIM", "50", "STREAMS", "bad", ">"),
         b"-NOGROUP No such key 'bad' or consumer group 'nogroup' in XREADGROUP with GROUP option\r\n"),
        (("XREAD", "COUNT", "2", "CLAIM", "10", "STREAMS", "bad", "0-0"),
         b"-ERR The CLAIM option is only supported by XREADGROUP. You called XREAD instead.\r\n"),
    ]
    for argv, reply in cases:
        assert r.call(*argv) == reply, argv
    # The last CLAIM given counts, and CLAIM may come before GROUP.
    _idle(r, "bad", "1-0", 5000)
    entries = _entries(r.call("XREADGROUP", "CLAIM", "100000", "GROUP", "g", "c1", "COUNT", "1", "CLAIM", "50",
                              "STREAMS", "bad", ">"))
    assert [(e[0], e[3]) for e in entries] == [(b"1-0", 1)]


def test_xread_refuses_the_group_options_with_redis_texts(partita_shared):
    """Redis 7.0's texts for NOACK and GROUP in XREAD (Partita answered
    "syntax error" before)."""
    r = Resp(partita_shared.port)
    assert r.call("XREAD", "NOACK", "STREAMS", "s", "0") == \
        b"-ERR The NOACK option is only supported by XREADGROUP. You called XREAD instead.\r\n"
    assert r.call("XREAD", "GROUP", "g", "c", "STREAMS", "s", "0") == \
        b"-ERR The GROUP option is only supported by XREADGROUP. You called XREAD instead.\r\n"


def test_a_blocked_claim_read_wakes_when_an_entry_becomes_idle_enough(partita_shared):
    r = Resp(partita_shared.port)
    _setup(r, "waits", n=1)
    got: list = []

    def read() -> None:
        reader = Resp(partita_shared.port)
        got.append(reader.call("XREADGROUP", "GROUP", "g", "c2", "BLOCK", "20000", "CLAIM", "300",
                               "STREAMS", "waits", ">"))

    thread = threading.Thread(target=read)
    thread.start()
    thread.join(15)
    assert not thread.is_alive()
    assert [(e[0], e[3]) for e in _entries(got[0])] == [(b"1-0", 1)]
    assert _entries(got[0])[0][2] >= 300


def test_a_blocked_claim_read_wakes_on_a_new_entry_before_min_idle(partita_shared):
    r = Resp(partita_shared.port)
    _setup(r, "newcomer", n=1)
    reply = while_blocked(partita_shared.port, ("XREADGROUP", "GROUP", "g", "c2", "BLOCK", "20000",
                                                "CLAIM", "100000", "STREAMS", "newcomer", ">"),
                          lambda: r.call("XADD", "newcomer", "2-0", "f", "v2"))
    assert [(e[0], e[2], e[3]) for e in _entries(reply)] == [(b"2-0", 0, 0)]


def test_claim_on_a_topic_key_takes_the_readers_partitions_idle_entries(partita_shared):
    """On a multi-partition topic key a member claims the idle entries of
    the partitions assigned to it, replied under the partition keys."""
    r = Resp(partita_shared.port)
    assert r.call("TOPIC", "CREATE", "claimed-topic", "PARTITIONS", "2") == b"+OK\r\n"
    r.call("XADD", "claimed-topic#0", "1-0", "f", "v1")
    r.call("XADD", "claimed-topic#1", "2-0", "f", "v2")
    r.call("XGROUP", "CREATE", "claimed-topic", "g", "0")
    first = parse(r.call("XREADGROUP", "GROUP", "g", "solo", "STREAMS", "claimed-topic", ">"))
    assert sorted(row[0] for row in first) == [b"claimed-topic#0", b"claimed-topic#1"]
    value = parse(r.call("XREADGROUP", "GROUP", "g", "solo", "CLAIM", "0", "STREAMS", "claimed-topic", ">"))
    assert sorted((row[0], [(e[0], e[3]) for e in row[1]]) for row in value) == [
        (b"claimed-topic#0", [(b"1-0", 1)]), (b"claimed-topic#1", [(b"2-0", 1)])]


def test_redis_py_8_xreadgroup_claim(partita_shared):
    client = redis.Redis(port=partita_shared.port)
    first = client.xadd("py-claim", {"k1": "v1"})
    client.xgroup_create("py-claim", "g", 0)
    client.xreadgroup("g", "c1", {"py-claim": ">"})
    client.xclaim("py-claim", "g", "c1", 0, [first], idle=5000, justid=True)
    second = client.xadd("py-claim", {"k2": "v2"})
    reply = client.xreadgroup("g", "c2", {"py-claim": ">"}, claim_min_idle_time=1000)
    entries = reply[0][1]
    assert entries[0][:2] == (first, {b"k1": b"v1"}) and entries[0][2] >= 5000 and entries[0][3] == 1
    assert entries[1] == (second, {b"k2": b"v2"}, 0, 0)
    pending = client.xpending_range("py-claim", "g", "-", "+", 10)
    assert [(p["consumer"], p["times_delivered"]) for p in pending] == [(b"c2", 2), (b"c2", 1)]
