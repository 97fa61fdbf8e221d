"""Keyspace commands, differential against redis-server 7.0 (every key is a stream).

KEYS and SCAN order is not Redis's (Partita sorts KEYS; SCAN walks a hash
order), so those replies are compared as sets; everything else byte for byte.
"""

from __future__ import annotations

import shlex

import pytest

from server.commands.keyspace import glob_match
from tests.e2e.streams_support import RespClient, parse, port_of

pytestmark = pytest.mark.redis

KEYS = [b"hello", b"hallo", b"hxllo", b"heeeello", b"h*llo", b"a[b", b"x\\y", b"", b"-", b"]", b"\xe9t\xe9", b"A"]

PATTERNS = [
    b"*", b"h?llo", b"h*llo", b"h[ae]llo", b"h[^e]llo", b"h[a-b]llo", b"h[b-a]llo", b"h\\*llo",
    b"a[b", b"a\\[b", b"a[\\[]b", b"[", b"[a", b"*[", b"x\\\\y", b"x\\y", b"", b"**", b"h*l*o", b"*o",
    b"[]]", b"[!a]*", b"[\\]]", b"?", b"\\", b"*\\", b"[a-", b"[-]", b"[^]", b"[\xe0-\xff]*",
    b"[\x00-\xe0]*", b"[a-Z]", b"*e*l*", b"h[a-z]l*", b"a", b"[aA]",
]


@pytest.fixture(params=[2, 3], ids=["resp2", "resp3"])
def clients(request, partita_server, redis_server):
    p = RespClient(port_of(partita_server), request.param)
    r = RespClient(port_of(redis_server), request.param)
    for c in (p, r):
        c.call("FLUSHALL")
    yield p, r
    p.close()
    r.close()


def _same(p, r, *argv):
    mine, theirs = p.call(*argv), r.call(*argv)
    assert mine == theirs, f"{argv!r}\n partita: {mine!r}\n redis:   {theirs!r}"
    return mine


def _script(p, r, text):
    for line in text.strip().splitlines():
        if line.strip():
            _same(p, r, *[a.encode("latin-1") for a in shlex.split(line)])


def test_keys_glob_patterns_match_redis(clients):
    p, r = clients
    for n, key in enumerate(KEYS):
        _same(p, r, b"XADD", key, b"1-1", b"f", b"%d" % n)
    for pattern in PATTERNS:
        mine, theirs = parse(p.call(b"KEYS", pattern)), parse(r.call(b"KEYS", pattern))
        assert sorted(mine) == sorted(theirs), pattern
        assert mine == sorted(mine)


def test_glob_matcher_agrees_with_redis_on_tricky_pairs(redis_server):
    # stringmatchlen through KEYS on a real redis, one key at a time.
    strings = [b"", b"a", b"ab", b"a*", b"[", b"]", b"\\", b"-", b"b", b"\xff", b"aXbYc", b"abc"]
    patterns = PATTERNS + [b"a*c", b"*b*", b"[\\", b"[a\\", b"a\\", b"[]a]", b"[a-]", b"[\\-]"]
    with RespClient(port_of(redis_server)) as r:
        r.call("FLUSHALL")
        for s in strings:
            r.call(b"SET", b"k:" + s, b"1")
        for pattern in patterns:
            theirs = {k[2:] for k in parse(r.call(b"KEYS", b"k:" + pattern))}
            mine = {s for s in strings if glob_match(b"k:" + pattern, b"k:" + s)}
            assert mine == theirs, pattern
        r.call("FLUSHALL")


def test_exists_type_del_unlink_dbsize(clients):
    p, r = clients
    _script(p, r, r"""
        xadd a 1-1 f v
        xadd b 1-1 f v
        xadd c 1-1 f v
        exists a a nokey b
        exists nokey
        exists
        type a
        type nokey
        type
        dbsize
        dbsize extra
        del a nokey a
        del
        dbsize
        unlink b c nokey
        unlink
        exists a b c
        dbsize
        xadd a 1-1 f v
        xrange a - +
    """)


def test_deleting_a_stream_removes_its_files(partita_server):
    with RespClient(port_of(partita_server)) as c:
        c.call("XADD", "doomed", "1-1", "f", "v")
        topics_dir = partita_server.data_dir
        before = [p for p in topics_dir.rglob("*") if p.is_file()]
        assert any(p.suffix == ".log" for p in before)
        assert c.call("DEL", "doomed") == b":1\r\n"
        after = [p for p in topics_dir.rglob("*") if p.is_file() and p.suffix == ".log"]
        assert after == []


def test_flushall_flushdb_and_rename(clients):
    p, r = clients
    _script(p, r, r"""
        xadd a 1-1 f v
        xadd b 1-1 f v
        rename nokey x
        renamenx nokey x
        rename a a
        renamenx a a
        rename
        renamenx a
        flushall foo
        flushall sync extra
        flushdb foo
        flushall async
        dbsize
        xadd a 1-1 f v
        flushdb sync
        dbsize
        xadd a 1-1 f v
        flushall
        exists a
    """)


def test_rename_of_streams_matches_redis(clients):
    """The stream, its groups, consumers and pending entries take the new
    name; the destination is replaced (RENAME) or kept (RENAMENX)."""
    p, r = clients
    _script(p, r, r"""
        xadd a 1-1 f v1
        xadd a 2-1 f v2
        xgroup create a g 0
        xreadgroup group g alice count 1 streams a >
        xadd b 9-1 old b
        xgroup create b other $
        rename a b
        exists a b
        xrange b - +
        xpending b g
        xreadgroup group g bob streams b >
        xreadgroup group other bob streams b >
        xadd b 2-1 f v
        xadd b 3-1 f v3
        xlen b
        renamenx b c
        renamenx b c
        xadd d 1-1 f v
        renamenx c d
        rename c c
        renamenx c c
        xrange c - +
        xrange d - +
        rename c d
        xrange d - +
        type c
        type d
        dbsize
    """)


def test_scan_errors_match_redis(clients):
    p, r = clients
    _script(p, r, r"""
        scan x
        scan 0 count 0
        scan 0 count -1
        scan 0 count x
        scan 0 match
        scan 0 type
        scan 0 foo 1
        scan 18446744073709551616
        scan " 0"
        scan 1.5
        scan
    """)


def test_scan_visits_every_key_once_with_match_and_type(clients):
    p, r = clients
    keys = [b"key:%d" % i for i in range(57)] + [b"other:%d" % i for i in range(13)]
    for k in keys:
        p.call(b"XADD", k, b"1-1", b"f", b"v")
    for count in (1, 7, 100):
        seen = []
        cursor = b"0"
        for _ in range(1000):
            cursor, batch = parse(p.call(b"SCAN", cursor, b"COUNT", b"%d" % count))
            seen += batch
            if cursor == b"0":
                break
        assert sorted(seen) == sorted(keys), count
    cursor, found = b"0", []
    while True:
        cursor, batch = parse(p.call(b"SCAN", cursor, b"MATCH", b"other:*", b"COUNT", b"5", b"TYPE", b"stream"))
        found += batch
        if cursor == b"0":
            break
    assert sorted(found) == sorted(k for k in keys if k.startswith(b"other:"))
    assert parse(p.call(b"SCAN", b"0", b"TYPE", b"string", b"COUNT", b"1000")) == [b"0", []]


def test_scan_is_stable_while_keys_change(partita_server):
    """Keys present for the whole iteration come back exactly once."""
    with RespClient(port_of(partita_server)) as c:
        stable = [b"s:%d" % i for i in range(40)]
        for k in stable:
            c.call(b"XADD", k, b"1-1", b"f", b"v")
        seen = []
        cursor = b"0"
        step = 0
        while True:
            cursor, batch = parse(c.call(b"SCAN", cursor, b"COUNT", b"3"))
            seen += batch
            step += 1
            c.call(b"XADD", b"new:%d" % step, b"1-1", b"f", b"v")
            if step % 2:
                c.call(b"DEL", b"new:%d" % (step - 1))
            if cursor == b"0":
                break
        got = [k for k in seen if k.startswith(b"s:")]
        assert sorted(got) == sorted(stable)
