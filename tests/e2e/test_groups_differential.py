"""Consumer groups, differential: the same commands to Partita and to a real
redis-server 7.0, replies compared byte for byte in RESP2 and RESP3 (idle
times compared within a tolerance). Every XGROUP / XREADGROUP / XACK /
XPENDING / XCLAIM / XAUTOCLAIM / XINFO option and error path is exercised.
"""

from __future__ import annotations

import time

import pytest

from tests.e2e.groups_support import Pair, Resp, parse

pytestmark = pytest.mark.redis


@pytest.fixture(params=[2, 3], ids=["resp2", "resp3"])
def pair(request, partita_shared, redis_server):
    p = Pair(partita_shared.port, redis_server.port, request.param)
    yield p
    p.close()


def test_xgroup_create_setid_destroy_and_errors(pair):
    pair.script("""
        XADD s 1-0 a 1
        XADD s 2-0 b 2
        XADD s 3-0 c 3
        XGROUP CREATE s g $
        XGROUP CREATE s g2 0
        XGROUP CREATE s g3 1-0 ENTRIESREAD 1
        XGROUP CREATE s g $
        XGROUP CREATE nokey g $
        XGROUP CREATE nokey g bad
        XGROUP CREATE nokey g bad MKSTREAM
        XGROUP CREATE s g4 bad
        XGROUP CREATE s g4 -
        XGROUP CREATE s g5 0 ENTRIESREAD -2
        XGROUP CREATE s g5 3-0 ENTRIESREAD 3
        XGROUP CREATE s g6 0 ENTRIESREAD x
        XGROUP CREATE s g7 0 FOO
        XGROUP create s g7 0 FOO
        XGROUP CREATE s g8 0 MKSTREAM MKSTREAM
        XGROUP CREATE s g9 0 MKSTREAM MKSTREAM MKSTREAM MKSTREAM
        XGROUP CREATE s g9 0 ENTRIESREAD 3 ENTRIESREAD
        XGROUP CREATE s
        XGROUP CREATE made g $ MKSTREAM ENTRIESREAD 0
        XINFO GROUPS made
        EXISTS made
        XINFO GROUPS s
        XGROUP SETID s g2 1-0 ENTRIESREAD 1
        XGROUP SETID s nog 1-0
        XGROUP SETID s nog bad
        XGROUP SETID nokey g 1-0
        XGROUP SETID s g2 bad
        XGROUP SETID s g2 bad ENTRIESREAD x
        XGROUP SETID s g2 1-0 ENTRIESREAD x
        XGROUP SETID s g2 1-0 FOO 1
        XGROUP SETID s g2 1-0 ENTRIESREAD -3
        XGROUP SETID s g2 1-0 1 2 3
        XGROUP SETID s g2 1-0 ENTRIESREAD
        XGROUP SETID s g2 $
        XINFO GROUPS s
        XGROUP SETID s g2 -
        XINFO GROUPS s
        XGROUP SETID s g2 +
        XINFO GROUPS s
        XGROUP SETID s g2 5
        XGROUP SETID s g2 $ ENTRIESREAD 3
        XINFO GROUPS s
        XGROUP DESTROY s g3
        XGROUP DESTROY s g3
        XGROUP DESTROY nokey g3
        XGROUP DESTROY s g extra
        XINFO GROUPS s
        XGROUP FOO
        XGROUP
        XGROUP HELP extra
    """)


def test_xgroup_help_starts_with_redis_lines(pair):
    mine, theirs = (parse(r) for r in pair.both("XGROUP", "HELP"))
    assert mine[: len(theirs)] == theirs
    assert any(b"MAXDELIVERIES" in line for line in mine[len(theirs):])


def test_xgroup_consumers(pair):
    pair.script("""
        XADD s 1-0 a 1
        XADD s 2-0 b 2
        XGROUP CREATE s g 0
        XGROUP CREATECONSUMER s g alice
        XGROUP CREATECONSUMER s g alice
        XGROUP CREATECONSUMER s nog alice
        XGROUP CREATECONSUMER nokey g alice
        XGROUP CREATECONSUMER s g
        XREADGROUP GROUP g bob STREAMS s >
        XGROUP DELCONSUMER s g bob
        XGROUP DELCONSUMER s g bob
        XGROUP DELCONSUMER s g zz
        XGROUP DELCONSUMER s nog zz
        XPENDING s g
        XINFO GROUPS s
    """)
    pair.similar("XINFO", "CONSUMERS", "s", "g", idle_paths=[("*", b"idle")], partita_only=[(("*",), b"inactive")])


def test_xreadgroup_new_history_and_errors(pair):
    pair.script("""
        XADD s 1-0 a 1
        XADD s 2-0 b 2
        XADD s 3-0 c 3
        XREADGROUP GROUP g c STREAMS s >
        XREADGROUP GROUP g c STREAMS nokey >
        XGROUP CREATE s g 0
        XREADGROUP GROUP g c STREAMS s nokey > >
        XREADGROUP GROUP g c COUNT 2 STREAMS s >
        XREADGROUP GROUP g c STREAMS s 0
        XREADGROUP GROUP g c STREAMS s 1-0
        XREADGROUP GROUP g c STREAMS s 1
        XREADGROUP GROUP g c2 STREAMS s 0
        XREADGROUP GROUP g c STREAMS s $
        XREADGROUP GROUP g c STREAMS s bad
        XREADGROUP GROUP g c STREAMS s -
        XREADGROUP GROUP g c STREAMS s
        XREADGROUP GROUP g c STREAMS s s > >
        XREADGROUP GROUP g c COUNT -1 STREAMS s 0
        XREADGROUP GROUP g c COUNT 0 STREAMS s 0
        XREADGROUP GROUP g c COUNT 1 STREAMS s 0
        XREADGROUP GROUP g c COUNT x STREAMS s 0
        XREADGROUP GROUP g c BLOCK -1 STREAMS s 0
        XREADGROUP GROUP g c BLOCK x STREAMS s 0
        XREADGROUP GROUP g c FOO STREAMS s 0
        XREADGROUP GROUP g STREAMS s 0
        XREADGROUP c STREAMS s 0 0 0
        XREADGROUP COUNT 1 STREAMS s 0 0 0
        XREADGROUP GROUP g c NOACK STREAMS s >
        XDEL s 2-0
        XREADGROUP GROUP g c STREAMS s 0
        XREADGROUP GROUP g c STREAMS s >
        XREADGROUP GROUP g c BLOCK 10 STREAMS s >
        XREADGROUP GROUP g c STREAMS s 99-0
        XINFO GROUPS s
    """)


def test_xreadgroup_largest_id_reads_new_entries_as_redis(pair):
    """Redis parses ``>`` as the largest ID, so ``18446744073709551615-18446744073709551615``
    given to XREADGROUP is ``>``: it delivers new entries (not the consumer's history)."""
    pair.script("""
        XADD s 1-0 a 1
        XGROUP CREATE s g 0
        XREADGROUP GROUP g c STREAMS s 18446744073709551615-18446744073709551615
        XPENDING s g
        XREADGROUP GROUP g c STREAMS s 18446744073709551615-18446744073709551615
        XREADGROUP GROUP g c BLOCK 10 STREAMS s 18446744073709551615-18446744073709551615
        XADD s 2-0 b 2
        XREADGROUP GROUP g d COUNT 5 STREAMS s 18446744073709551615-18446744073709551615
        XINFO GROUPS s
    """)


def test_xreadgroup_several_keys_noack_and_new_consumers(pair):
    pair.script("""
        XADD a 1-0 f 1
        XADD b 1-0 f 1
        XADD b 2-0 f 2
        XGROUP CREATE a g 0
        XGROUP CREATE b g 0
        XREADGROUP GROUP g c COUNT 1 STREAMS a b > >
        XREADGROUP GROUP g c STREAMS a b > >
        XREADGROUP GROUP g c STREAMS a b 0 0
        XREADGROUP GROUP g c STREAMS a b > 0
        XADD a 2-0 f 2
        XREADGROUP GROUP g d NOACK STREAMS a b > >
        XPENDING a g
        XPENDING b g
        XGROUP CREATE a empty $
        XINFO CONSUMERS a empty
    """)


def test_the_same_xreadgroup_again_across_changes_and_refusals(pair):
    # A consumer's poll is one command sent again and again: each time it
    # answers the state of that moment (the group gone, made again, the key
    # gone), and a refused ID or $ is refused every time, not only the first.
    pair.script("""
        XADD s 1-0 f 1
        XADD s 2-0 f 2
        XGROUP CREATE s g 0
        XREADGROUP GROUP g c COUNT 1 STREAMS s >
        XREADGROUP GROUP g c COUNT 1 STREAMS s >
        XREADGROUP GROUP g c COUNT 1 STREAMS s >
        XGROUP DESTROY s g
        XREADGROUP GROUP g c COUNT 1 STREAMS s >
        XGROUP CREATE s g 0
        XREADGROUP GROUP g c COUNT 1 STREAMS s >
        XREADGROUP GROUP g c COUNT 1 STREAMS s $
        XREADGROUP GROUP g c COUNT 1 STREAMS s $
        XREADGROUP GROUP g c COUNT 1 STREAMS s bad-id
        XREADGROUP GROUP g c COUNT 1 STREAMS s bad-id
        XREADGROUP GROUP g c COUNT 1 STREAMS s 0
        XREADGROUP GROUP g c COUNT 1 STREAMS s 0
        DEL s
        XREADGROUP GROUP g c COUNT 1 STREAMS s >
        XREADGROUP GROUP g c COUNT 1 STREAMS s $
    """)


def test_xack_and_xpending(pair):
    pair.script("""
        XADD s 1-0 a 1
        XADD s 2-0 b 2
        XADD s 3-0 c 3
        XADD s 4-0 d 4
        XGROUP CREATE s g 0
        XPENDING s g
        XREADGROUP GROUP g c COUNT 2 STREAMS s >
        XREADGROUP GROUP g d STREAMS s >
        XPENDING s g
        XACK s g 1-0 1-0 9-0
        XACK s g bad
        XACK s nog 1-0
        XACK nokey g 1-0
        XACK nokey g bad
        XPENDING s g
        XPENDING s nog
        XPENDING nokey g
        XPENDING nokey g - + x
        XPENDING s g - + 10 zz
        XPENDING s g - + -1
        XPENDING s g - + 0
        XPENDING s g - +
        XPENDING s g - + x
        XPENDING s g IDLE x - + 10
        XPENDING s g IDLE 10
        XPENDING s g IDLE 10 - +
        XPENDING s g IDLE 1000000 - + 10
        XPENDING s g - (0-0 10
        XPENDING s g (18446744073709551615-18446744073709551615 + 10
        XPENDING s g bad + 10
        XPENDING s g - bad 10
        XPENDING s g a b c d e f g
        XACK s g 2-0 3-0 4-0
        XPENDING s g
    """)
    for argv in (("s", "g", "-", "+", "10"), ("s", "g", "-", "+", "10", "d"),
                 ("s", "g", "-", "+", "10", "d", "extra"), ("s", "g", "IDLE", "0", "2", "+", "1"),
                 ("s", "g", "IDLE", "-5", "-", "+", "10"), ("s", "g", "-", "(3-0", "10"),
                 ("s", "g", "((1", "+", "10")):
        pair.similar("XPENDING", *argv, idle_paths=[("*", 2)])


def test_xack_of_whole_deliveries_parts_duplicates_and_claimed_ids(pair):
    """XACK of exactly what a consumer was given (a delivery taken out
    whole), of part of one, across deliveries and consumers, with
    duplicates, twice, and after a claim or a listing of the consumer's
    PEL; the PEL seen by XPENDING's forms and XINFO after each."""
    lines = ["XADD s %d-0 f %d" % (i, i) for i in range(1, 25)]
    pair.script("\n".join(lines) + """
        XGROUP CREATE s g 0
        XREADGROUP GROUP g a COUNT 3 STREAMS s >
        XREADGROUP GROUP g b COUNT 3 STREAMS s >
        XREADGROUP GROUP g a COUNT 3 STREAMS s >
        XREADGROUP GROUP g c COUNT 3 STREAMS s >
    """)
    pair.similar("XPENDING", "s", "g", "-", "+", "20", "b", idle_paths=[("*", 2)])  # lists b's PEL
    pair.script("""
        XACK s g 4-0 5-0 6-0
        XACK s g 4-0 5-0 6-0
        XPENDING s g
        XACK s g 1-0 2-0
        XPENDING s g
        XACK s g 3-0 7-0
        XCLAIM s g b 0 8-0 JUSTID
        XACK s g 7-0 8-0 9-0
        XPENDING s g
        XACK s g 12-0 10-0 10-0 11-0 11-0
        XPENDING s g
        XREADGROUP GROUP g a COUNT 3 STREAMS s >
        XREADGROUP GROUP g b COUNT 3 STREAMS s >
        XREADGROUP GROUP g d COUNT 3 STREAMS s >
        XREADGROUP GROUP g a COUNT 3 STREAMS s >
        XREADGROUP GROUP g b COUNT 3 STREAMS s 0
        XACK s g 16-0 17-0 18-0
        XACK s g 13-0 14-0 15-0 19-0 20-0 21-0
        XPENDING s g
        XACK s g 22-0 22-0 23-0 24-0
        XPENDING s g
        XACK s g 22-0 23-0 24-0
        XREADGROUP GROUP g a STREAMS s 0
        XINFO GROUPS s
        XADD s 25-0 f 25
        XADD s 26-0 f 26
        XADD s 27-0 f 27
        XREADGROUP GROUP g e COUNT 3 STREAMS s >
        XAUTOCLAIM s g z 0 0 COUNT 1 JUSTID
        XACK s g 25-0 26-0 27-0
        XPENDING s g
        XREADGROUP GROUP g e COUNT 3 STREAMS s >
    """)
    pair.similar("XPENDING", "s", "g", "-", "+", "10", idle_paths=[("*", 2)])
    pair.similar("XINFO", "CONSUMERS", "s", "g", idle_paths=[("*", b"idle")], partita_only=[(("*",), b"inactive")])


def test_xpending_idle_filter_with_generous_margins(pair):
    pair.script("""
        XADD s 1-0 a 1
        XADD s 2-0 b 2
        XADD s 3-0 c 3
        XGROUP CREATE s g 0
        XREADGROUP GROUP g c STREAMS s >
        XCLAIM s g c 0 1-0 3-0 IDLE 600000 JUSTID
    """)
    for argv in (("IDLE", "300000", "-", "+", "10"), ("IDLE", "300000", "-", "+", "1"),
                 ("IDLE", "300000", "-", "+", "10", "c")):
        reply = pair.similar("XPENDING", "s", "g", *argv, idle_paths=[("*", 2)])
        assert all(row[2] >= 600000 for row in reply)


def test_xclaim_options_and_errors(pair):
    pair.script("""
        XADD s 1-0 a 1
        XADD s 2-0 b 2
        XADD s 3-0 c 3
        XADD s 4-0 d 4
        XADD s 5-0 e 5
        XGROUP CREATE s g 0
        XREADGROUP GROUP g c COUNT 4 STREAMS s >
        XCLAIM s g d 0 1-0
        XCLAIM s g d 0 1-0 JUSTID
        XCLAIM s g d 0 1-0 2-0 RETRYCOUNT 5
        XCLAIM s g d 0 9-0
        XCLAIM s g d 0 9-0 FORCE
        XCLAIM s g d 0 4-5 FORCE
        XCLAIM s g f 0 5-0 FORCE
        XCLAIM s g f 0 5-0 5-0 4-0 4-0
        XCLAIM s g zz 100000 1-0
        XDEL s 2-0
        XCLAIM s g e 0 2-0
        XCLAIM s g e 0 3-0 TIME 1000 JUSTID
        XCLAIM s g e 0 3-0 IDLE 5000 JUSTID LASTID 50-0
        XINFO GROUPS s
        XCLAIM s g e 0 3-0 LASTID 10-0 JUSTID
        XINFO GROUPS s
        XCLAIM s g e 0 3-0 IDLE x
        XCLAIM s g e 0 3-0 TIME x
        XCLAIM s g e 0 3-0 RETRYCOUNT x
        XCLAIM s g e 0 3-0 FOO
        XCLAIM s g e 0 3-0 foo
        XCLAIM s g e x 3-0
        XCLAIM s g e -5 3-0
        XCLAIM s g e 0 bad
        XCLAIM s nog e 0 3-0
        XCLAIM nokey g e 0 3-0
        XCLAIM s g e 0 3-0 LASTID bad
        XCLAIM s g e 0 3-0 LASTID
        XCLAIM s g e 0 3-0 RETRYCOUNT -1
        XCLAIM s g e 0 3-0 IDLE -1
        XCLAIM s g e 0 3-0 TIME -1
        XCLAIM s g e 100000 3-0
        XCLAIM s g e 0 3-0 bad
        XCLAIM s g e 0 3-0 IDLE
        XCLAIM s g e 0 3-0 IDLE 1 TIME 2
        XCLAIM s g e 0 3-0 JUSTID RETRYCOUNT 9
        XPENDING s g
    """)
    pair.similar("XPENDING", "s", "g", "-", "+", "10", idle_paths=[("*", 2)])
    pair.similar("XINFO", "CONSUMERS", "s", "g", idle_paths=[("*", b"idle")], partita_only=[(("*",), b"inactive")])


def test_xclaim_time_0_is_idle_since_the_epoch(pair):
    """``XCLAIM ... TIME 0`` sets the delivery time to the epoch: XPENDING
    shows it idle since then, as any owned entry (not -1, which is for an
    entry XNACK released)."""
    pair.script("""
        XADD s 1-0 a 1
        XGROUP CREATE s g 0
        XREADGROUP GROUP g c STREAMS s >
        XCLAIM s g d 0 1-0 TIME 0 JUSTID
    """)
    pair.similar("XPENDING", "s", "g", "-", "+", "10", idle_paths=[("*", 2)])
    pair.similar("XPENDING", "s", "g", "-", "+", "10", "d", idle_paths=[("*", 2)])


def test_xautoclaim_cursor_count_and_deleted_ids(pair):
    lines = ["XADD s %d-0 f %d" % (i, i) for i in range(1, 11)]
    pair.script("\n".join(lines) + """
        XGROUP CREATE s g 0
        XREADGROUP GROUP g c STREAMS s >
        XAUTOCLAIM s g y 0 0 COUNT 3
        XAUTOCLAIM s g y 0 4-0 COUNT 3 JUSTID
        XAUTOCLAIM s g y 0 (7-0 COUNT 2
        XDEL s 2-0 3-0 9-0
        XAUTOCLAIM s g z 0 0 COUNT 2
        XAUTOCLAIM s g z 0 0 COUNT 2
        XAUTOCLAIM s g z 0 0
        XPENDING s g
        XAUTOCLAIM s g y 100000 0
        XAUTOCLAIM s g y 0 -
        XAUTOCLAIM s g y 0 + COUNT 1
        XAUTOCLAIM s nog c 0 0
        XAUTOCLAIM nokey g c 0 0
        XAUTOCLAIM nokey g c x 0
        XAUTOCLAIM s g c x 0
        XAUTOCLAIM s g c 0 bad
        XAUTOCLAIM s g c 0 0 COUNT 0
        XAUTOCLAIM s g c 0 0 COUNT x
        XAUTOCLAIM s g c 0 0 COUNT -1
        XAUTOCLAIM s g c 0 0 COUNT 100000000000000000
        XAUTOCLAIM s g c 0 0 FOO
        XAUTOCLAIM s g c 0 0 COUNT
        XAUTOCLAIM s g c 0 (0
        XAUTOCLAIM s g c 0 (18446744073709551615-18446744073709551615
    """)


def test_xautoclaim_scans_at_most_ten_times_count(pair):
    lines = ["XADD s %d-0 f %d" % (i, i) for i in range(1, 31)]
    pair.script("\n".join(lines) + """
        XGROUP CREATE s g 0
        XREADGROUP GROUP g c STREAMS s >
        XCLAIM s g c 0 25-0 IDLE 900000 JUSTID
        XAUTOCLAIM s g y 300000 0 COUNT 1
        XAUTOCLAIM s g y 300000 0 COUNT 3
    """)


def test_xinfo_groups_consumers_and_lag_rules(pair):
    pair.script("""
        XGROUP CREATE s g $ MKSTREAM
        XINFO GROUPS s
        XADD s 1-0 a 1
        XADD s 2-0 b 2
        XADD s 3-0 c 3
        XADD s 4-0 d 4
        XGROUP CREATE s early 0
        XGROUP CREATE s mid 2-0
        XGROUP CREATE s top $
        XINFO GROUPS s
        XREADGROUP GROUP early c COUNT 1 STREAMS s >
        XINFO GROUPS s
        XDEL s 3-0
        XINFO GROUPS s
        XREADGROUP GROUP early c COUNT 1 STREAMS s >
        XINFO GROUPS s
        XREADGROUP GROUP early c STREAMS s >
        XINFO GROUPS s
        XDEL s 1-0
        XINFO GROUPS s
        XTRIM s MAXLEN 0
        XINFO GROUPS s
        XADD s 5-0 e 5
        XREADGROUP GROUP mid c STREAMS s >
        XINFO GROUPS s
        XINFO GROUPS nokey
        XINFO GROUPS s extra
        XINFO CONSUMERS nokey g
        XINFO CONSUMERS s nog
        XINFO CONSUMERS s g extra
        XINFO STREAM s FULL COUNT 1
    """.replace("XINFO STREAM s FULL COUNT 1", "XLEN s"))


def test_xinfo_stream_reports_groups(pair):
    pair.script("""
        XADD s 1-0 a 1
        XADD s 2-0 b 2
        XADD s 3-0 c 3
        XGROUP CREATE s g 0
        XGROUP CREATE s h $
        XREADGROUP GROUP g c STREAMS s >
        XREADGROUP GROUP g d STREAMS s 0
    """)
    mine, theirs = (parse(r) for r in pair.both("XINFO", "STREAM", "s"))
    as_dict = (lambda v: v if isinstance(v, dict) else dict(zip(v[::2], v[1::2])))
    assert as_dict(mine)[b"groups"] == as_dict(theirs)[b"groups"] == 2
    for argv in (("XINFO", "STREAM", "s", "FULL"), ("XINFO", "STREAM", "s", "FULL", "COUNT", "1"),
                 ("XINFO", "STREAM", "s", "FULL", "COUNT", "0")):
        mine, theirs = (as_dict(parse(r)) for r in pair.both(*argv))
        assert _strip_times(mine[b"groups"]) == _strip_times(theirs[b"groups"])


def _strip_times(groups):
    """Delivery and seen times (absolute ms) differ between the servers."""
    out = []
    for g in groups:
        g = g if isinstance(g, dict) else dict(zip(g[::2], g[1::2]))
        g = dict(g)
        g.pop(b"nacked-count", None)  # Redis 8.8+ (test_xnack.py)
        g[b"pending"] = [[row[0], row[1], row[3]] for row in g[b"pending"]]
        consumers = []
        for c in g[b"consumers"]:
            c = dict(c if isinstance(c, dict) else zip(c[::2], c[1::2]))
            c.pop(b"seen-time")
            c.pop(b"active-time", None)  # Redis 7.2+ (test_streams_redis8_core.py)
            c[b"pending"] = [[row[0], row[2]] for row in c[b"pending"]]
            consumers.append(c)
        g[b"consumers"] = consumers
        out.append(g)
    return out


def test_blocked_xreadgroup_wakes_and_times_out(pair):
    """Woken by XADD, timed out, not blocking in MULTI. (A key or group that
    goes away: Redis 7.2+'s NOGROUP, in test_streams_redis8_core.py.)"""
    for label, server in (("partita", pair.partita), ("redis", pair.redis)):
        port = server.sock.getpeername()[1]
        admin = server
        admin.call("XGROUP", "CREATE", "s", "g", "$", "MKSTREAM")
        reader = Resp(port, pair.protocol)
        try:
            # Woken by XADD, with COUNT.
            reader.send("XREADGROUP", "GROUP", "g", "c", "COUNT", "1", "BLOCK", "5000", "STREAMS", "s", ">")
            time.sleep(0.1)
            admin.call("XADD", "s", "1-0", "a", "1")
            woke = reader.read()
            # A timeout is a null reply; SETID does not wake.
            reader.send("XREADGROUP", "GROUP", "g", "c", "BLOCK", "200", "STREAMS", "s", ">")
            time.sleep(0.05)
            admin.call("XGROUP", "SETID", "s", "g", "0")
            timed_out = reader.read()
            # BLOCK inside MULTI does not block.
            admin.call("MULTI")
            admin.call("XREADGROUP", "GROUP", "g", "c", "BLOCK", "0", "STREAMS", "s", ">")
            in_multi = admin.call("EXEC")
        finally:
            reader.close()
        results = (woke, timed_out, in_multi)
        if label == "partita":
            ours = results
        else:
            assert ours == results


def test_two_blocked_readers_share_one_entry(pair):
    outcomes = []
    for server in (pair.partita, pair.redis):
        port = server.sock.getpeername()[1]
        server.call("XGROUP", "CREATE", "s", "g", "$", "MKSTREAM")
        r1, r2 = Resp(port, pair.protocol), Resp(port, pair.protocol)
        try:
            r1.send("XREADGROUP", "GROUP", "g", "c1", "BLOCK", "400", "STREAMS", "s", ">")
            time.sleep(0.05)  # c1 blocks first: it is served first
            r2.send("XREADGROUP", "GROUP", "g", "c2", "BLOCK", "400", "STREAMS", "s", ">")
            time.sleep(0.1)
            server.call("XADD", "s", "1-0", "a", "1")
            outcomes.append(sorted([r1.read(), r2.read()]))
        finally:
            r1.close()
            r2.close()
        server.call("XPENDING", "s", "g")
    assert outcomes[0] == outcomes[1]
    pair.same("XPENDING", "s", "g")


def test_xinfo_consumers_inactive_as_redis_7_2(partita_shared):
    """``inactive`` (Redis 7.2): -1 before a consumer got anything, then ms since its last read or claim."""
    c = Resp(partita_shared.port, 3)
    try:
        c.call("DEL", "inact")
        c.call("XADD", "inact", "1-0", "f", "v")
        c.call("XGROUP", "CREATE", "inact", "g", "0")
        c.call("XGROUP", "CREATECONSUMER", "inact", "g", "idler")
        [idler] = c.value("XINFO", "CONSUMERS", "inact", "g")
        assert idler[b"inactive"] == -1
        c.call("XREADGROUP", "GROUP", "g", "reader", "STREAMS", "inact", ">")
        rows = {row[b"name"]: row for row in c.value("XINFO", "CONSUMERS", "inact", "g")}
        assert 0 <= rows[b"reader"][b"inactive"] < 5000
        assert rows[b"idler"][b"inactive"] == -1
        # A read that gets nothing does not make the consumer active: inactive keeps counting.
        time.sleep(0.05)
        c.call("XREADGROUP", "GROUP", "g", "reader", "STREAMS", "inact", ">")
        rows = {row[b"name"]: row for row in c.value("XINFO", "CONSUMERS", "inact", "g")}
        assert rows[b"reader"][b"inactive"] >= 50
    finally:
        c.call("DEL", "inact")
        c.close()
