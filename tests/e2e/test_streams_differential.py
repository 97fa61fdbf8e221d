"""Stream commands, differential: the same commands to Partita and to a real
redis-server 7.0, replies compared byte for byte (RESP2 and RESP3), for
what Redis 7.0 and Redis 8 (the release Partita matches) answer alike.

Explicit IDs wherever IDs must match; for ``*`` the shapes and ordering are
compared. Where Redis 8 answers otherwise than 7.0 (texts, XSETID's checks,
XREAD ``+``) the replies are specified in test_streams_redis8_core.py.
"""

from __future__ import annotations

import re
import shlex

import pytest

from tests.e2e.streams_support import (
    IDEMPOTENCE_XINFO_FIELDS,
    RespClient,
    info_pairs,
    parse,
    port_of,
    without_idempotence_fields,
)

pytestmark = pytest.mark.redis


class Pair:
    def __init__(self, partita: RespClient, redis: RespClient, protocol: int) -> None:
        self.protocol = protocol
        self.partita = partita
        self.redis = redis

    def both(self, *argv):
        return self.partita.call(*argv), self.redis.call(*argv)

    def same(self, *argv) -> bytes:
        mine, theirs = self.both(*argv)
        assert mine == theirs, f"{argv!r}\n partita: {mine!r}\n redis:   {theirs!r}"
        return mine

    def script(self, text: str) -> None:
        for line in text.strip().splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                self.same(*[a.encode("latin-1") for a in shlex.split(line)])


@pytest.fixture(params=[2, 3], ids=["resp2", "resp3"])
def pair(request, partita_server, redis_server):
    partita = RespClient(port_of(partita_server), request.param)
    redis = RespClient(port_of(redis_server), request.param)
    partita.call("FLUSHALL")
    redis.call("FLUSHALL")
    yield Pair(partita, redis, request.param)
    partita.close()
    redis.close()


def test_xadd_explicit_ids_and_errors(pair):
    pair.script(r"""
        xadd s 1-1 a 1
        xadd s 1-1 a 1
        xadd s 1-0 a 1
        xadd s 0-0 a 1
        xadd s 0-* a 1
        xadd s 1-* b 2
        xadd s 2-* b 2
        xadd s 3 c 3
        xadd s 18446744073709551615-18446744073709551614 z 1
        xadd s 18446744073709551615-* z 1
        xadd s 18446744073709551615-* z 1
        xadd s * z 1
        xadd t 5-18446744073709551615 a 1
        xadd u 0-* a 1
        xadd u1 0-0 a 1
        xadd s 4-1 a
        xadd s 4-1 a 1 b
        xadd s
        xadd s 5
        xadd s foo 1
        xadd s - a 1
        xadd s + a 1
        xadd s 1-2-3 a 1
        xadd s 18446744073709551616-0 a 1
        xadd s -1 a 1
        xadd s " 7-1" a 1
        xadd nokey nomkstream 5-5 a 1
        xadd nokey nomkstream 0-0 a 1
        exists nokey
        xadd t nomkstream 9-9 f v
        xlen s
        xlen t
        xlen nokey
        xlen
        xlen a b
    """)


def test_xadd_trim_options_and_errors(pair):
    pair.script(r"""
        xadd s maxlen 1 limit 5 1-1 a 1
        xadd s limit 5 1-1 a 1
        xadd s limit 0 1-1 a 1
        xadd s maxlen -1 1-1 a 1
        xadd s maxlen ~ 1 limit -1 1-1 a 1
        xadd s maxlen x 1-1 a 1
        xadd s maxlen 1 minid 1 1-1 a 1
        xadd s minid 1 maxlen 1 1-1 a 1
        xadd s minid - 1-1 a 1
        xadd s minid x 1-1 a 1
        xadd s maxlen 3 1-1 a 1
        xadd s maxlen = 3 2-1 a 2
        xadd s MAXLEN 3 3-1 a 3
        xadd s maxlen 3 4-1 a 4
        xadd s maxlen 3 5-1 a 5
        xrange s - +
        xadd s minid 4 6-1 a 6
        xrange s - +
        xadd s minid = 5-1 7-1 a 7
        xrange s - +
        xadd s maxlen ~ 2 8-1 a 8
        xadd s maxlen ~ 0 limit 1 9-1 a 9
        xrange s - +
        xadd s maxlen ~ 0 10-1 a 10
        xlen s
        xadd s nomkstream maxlen 0 11-1 a 11
        xlen s
        xinfo stream s
    """.replace("xinfo stream s", "xlen s"))


def test_xrange_and_xrevrange(pair):
    pair.script(r"""
        xadd s 1-1 a 1
        xadd s 2-1 b 2
        xadd s 2-2 c 3
        xadd s 3-0 d 4
        xadd s 18446744073709551615-0 e 5
        xrange s - +
        xrange s - + count 2
        xrange s - + COUNT 2
        xrange s - + count 0
        xrange s - + count -1
        xrange s - + count 1 count 3
        xrange nokey - + count 0
        xrange nokey - +
        xrange s 2 2
        xrange s 2 (3
        xrange s (2-1 +
        xrange s (2 +
        xrange s - (2
        xrange s (1-1 (3-0
        xrange s ( +
        xrange s (- +
        xrange s - (+
        xrange s - (0-0
        xrange s (18446744073709551615-18446744073709551615 +
        xrange s 18446744073709551615 +
        xrange s 3 2
        xrange s " 2" +
        xrange s +2 +
        xrange s 02 +
        xrange s 1--01 +
        xrange s 1--1 +
        xrange s 2- +
        xrange s "" +
        xrange s x +
        xrange s - + count
        xrange s - + foo 1
        xrange s - + count x
        xrange s - + count 1 extra
        xrange s -
        xrevrange s + -
        xrevrange s + - count 1
        xrevrange s + - count 0
        xrevrange s + - count -3
        xrevrange s (3-0 -
        xrevrange s 2 1
        xrevrange s 3 (2-1
        xrevrange s (0-0 -
        xrevrange s + (18446744073709551615-18446744073709551615
        xrevrange nokey + -
        xrevrange s + - count 2 foo
    """)


def test_binary_safe_fields_and_values(pair):
    key = b"bin\x00\xff key"
    for n, (field, value) in enumerate([(b"f\r\n", b"v\x00\x01"), (b"", b""), (b"\xff" * 1000, b"x" * 70000)]):
        pair.same(b"XADD", key, b"%d-1" % (n + 1), field, value, b"second", b"\r\n")
    pair.same(b"XRANGE", key, b"-", b"+")
    pair.same(b"XREVRANGE", key, b"+", b"-", b"COUNT", b"2")
    pair.same(b"XREAD", b"STREAMS", key, b"0")


def test_xdel(pair):
    pair.script(r"""
        xadd s 1-1 a 1
        xadd s 2-1 a 2
        xadd s 3-1 a 3
        xadd s 4-1 a 4
        xdel s 2-1
        xdel s 2-1
        xdel s 2-1 3-1 3-1 9-9 1
        xdel s foo
        xdel s 4-1 foo
        xdel s -
        xdel s +
        xdel nokey foo
        xdel nokey 1-1
        xdel s
        xlen s
        xrange s - +
        xrevrange s + -
        xdel s 4-1 1-1
        xlen s
        xrange s - +
        exists s
        xadd s 5-0 a 5
        xadd s 4-9 a 5
        xread streams s 0
    """)


def test_xtrim(pair):
    lines = ["xadd s %d-1 n %d" % (i, i) for i in range(1, 21)]
    pair.script("\n".join(lines))
    pair.script(r"""
        xtrim s
        xtrim s maxlen
        xtrim s maxlen ~
        xtrim s limit 5
        xtrim s foo 1
        xtrim s maxlen x
        xtrim s maxlen -1
        xtrim s maxlen 5 limit 5
        xtrim s maxlen ~ 5 limit -1
        xtrim s maxlen 1 minid 1
        xtrim s minid -
        xtrim s nomkstream maxlen 1
        xtrim nokey maxlen 0
        xtrim nokey foo
        xtrim s maxlen 25
        xtrim s maxlen 18
        xtrim s maxlen = 18
        xtrim s MAXLEN = 16
        xlen s
        xrange s - + count 1
        xdel s 6-1 7-1 10-1
        xtrim s maxlen 10
        xrange s - +
        xtrim s minid 15
        xrange s - +
        xtrim s minid = 16-1
        xtrim s minid 1
        xtrim s minid ~ 17
        xtrim s maxlen ~ 3 limit 1000
        xtrim s maxlen ~ 0 limit 1
        xlen s
        xtrim s maxlen ~ 0
        xlen s
        xtrim s maxlen 0
        exists s
        xadd s 21-1 a 1
        xadd s 20-1 a 1
    """)


def _node_size(pair, n: int) -> None:
    pair.same("CONFIG", "SET", "stream-node-max-entries", str(n))


def _radix_tree_keys(reply: bytes) -> int:
    return dict(info_pairs(reply))[b"radix-tree-keys"]


@pytest.mark.parametrize("node", [1, 2, 3, 10])
def test_approx_trims_remove_whole_nodes_as_redis(pair, node):
    """``~`` trims whole nodes of ``stream-node-max-entries`` entries, as Redis
    (7.0 and 8 agree): counts, LIMIT, MINID, nodes holding deleted entries
    and nodes cut into by an exact trim."""
    _node_size(pair, node)
    try:
        pair.script("\n".join("xadd s %d-1 n %d" % (i, i) for i in range(1, 41)))
        for argv in (("XINFO", "STREAM", "s"),):
            mine, theirs = pair.both(*argv)
            assert _radix_tree_keys(mine) == _radix_tree_keys(theirs)
        pair.script(r"""
            xtrim s maxlen ~ 38
            xtrim s maxlen ~ 35
            xlen s
            xtrim s maxlen ~ 30 limit 2
            xtrim s maxlen ~ 30 limit 7
            xlen s
            xdel s 12-1 13-1 21-1
            xtrim s maxlen 27
            xrange s - + count 3
            xtrim s maxlen ~ 20
            xlen s
            xtrim s minid ~ 25-1
            xtrim s minid ~ 30-1 limit 3
            xrange s - + count 2
            xtrim s minid = 31-1
            xtrim s maxlen ~ 6
            xadd s maxlen ~ 2 limit 4 41-1 n 41
            xadd s maxlen ~ 2 42-1 n 42
            xlen s
            xrange s - +
            xtrim s maxlen ~ 0 limit 1
            xtrim s maxlen ~ 0
            xlen s
        """)
        mine, theirs = pair.both("XINFO", "STREAM", "s")
        assert _radix_tree_keys(mine) == _radix_tree_keys(theirs)
        # The case of the issue (predis, redis-rb): nodes of 2, five entries.
        pair.script(r"""
            del t
            xadd t 1-0 a 1
            xadd t 2-0 a 2
            xadd t 3-0 a 3
            xadd t 4-0 a 4
            xadd t 5-0 a 5
            xtrim t maxlen ~ 2
            xlen t
        """)
    finally:
        _node_size(pair, 100)


def test_approx_trim_default_limit_is_100_nodes_up_to_a_million(pair):
    """Without LIMIT, ``~`` removes at most 100 nodes' worth (10000 when the
    node size is 0, at most 1000000), as Redis."""
    for node, count in ((1, 120), (200, 20500)):
        _node_size(pair, node)
        try:
            for client in (pair.partita, pair.redis):
                client.call("DEL", "big")
                for start in range(0, count, 500):
                    args = []
                    for i in range(start + 1, min(start + 500, count) + 1):
                        args.append(("XADD", "big", "%d-1" % i, "n", "x"))
                    for a in args:
                        client.send(*a)
                    for _ in args:
                        client.read_reply()
            pair.same("XTRIM", "big", "MAXLEN", "~", "0")
            pair.same("XLEN", "big")
        finally:
            _node_size(pair, 100)


def test_xsetid(pair):
    pair.script(r"""
        xsetid nokey 1-1
        xadd s 5-5 a 1
        xsetid s 0-5
        xsetid s 5-4
        xsetid s 5-5
        xsetid s -
        xsetid s +
        xsetid s foo
        xsetid s 50 maxdeletedid 60
        xsetid s 50 entriesadded -1
        xsetid s 50 entriesadded 0
        xsetid s 50 entriesadded x
        xsetid s 50 foo
        xsetid s 50 entriesadded
        xsetid s 50 maxdeletedid
        xsetid s 50 maxdeletedid -
        xsetid s 50 entriesadded 20 maxdeletedid 40
        xsetid s
        xadd s 50 a 1
        xadd s 50-* a 1
        xadd s 49-* a 1
        xadd s 51-0 a 1
        xsetid s 51-0 entriesadded 3
        xsetid s 51-0 entriesadded 2
        xsetid s 60-0 ENTRIESADDED 100 MAXDELETEDID 60-0
        xdel s 51-0 50-1 5-5
        xsetid s 70
        xadd s 70-* a 1
        xread streams s 0
        xrange s - +
    """)


def test_xread_without_blocking(pair):
    pair.script(r"""
        xadd s 1-1 a 1
        xadd s 2-1 b 2
        xadd t 3-1 c 3
        xread streams s 0
        xread STREAMS s 1-1
        xread streams s 1
        xread count 1 streams s 0
        xread count 0 streams s 0
        xread count -5 streams s 0
        xread count x streams s 0
        xread streams s $
        xread streams s t 0 0
        xread streams s t 1-1 $
        xread streams s nokey 0 0
        xread streams nokey 0
        xread streams nokey $
        xread streams s 2-1
        xread block -1 streams s 0
        xread block x streams s 0
        xread block 0 streams s 0
        xread block 10 count 1 streams s 0
        xread streams
        xread foo streams s 0
        xread group g c streams s 0
        xread GROUP g streams s 0
        xread group g
        xread noack streams s 0
        xread count 1 NOACK
        xread count 1
        xread block 1
        xread streams s (0
        xread streams s -
        xread streams s >
        xread streams s 18446744073709551615-18446744073709551615
        xread count 1 count 2 streams s 0
        xread block 5 streams nokey $
        xread block 5 streams s $
    """)
    # The same key twice: RESP2 matches; RESP3 replies with a map, where Partita
    # keeps one entry per key (Redis sends the key twice). Documented difference.
    if pair.protocol == 2:
        pair.same("XREAD", "STREAMS", "s", "s", "0", "1-1")


def test_xread_in_multi_does_not_block(pair):
    pair.script(r"""
        multi
        xread block 0 streams s $
        xread block 0 streams s 0
        exec
    """)


def test_xinfo_stream_matches_redis(pair):
    pair.script(r"""
        xinfo stream nokey
        xinfo stream nokey foo
        xadd s 1-1 a 1
        xadd s 2-1 b 2 c 3
        xadd s 3-1 d 4
        xinfo stream s foo
        xinfo stream s full count
        xinfo stream s full foo 1
        xinfo stream s full count x
        xinfo stream s full count 1 extra
        xinfo help
        xinfo HELP
    """)
    script = [
        ("XINFO", "STREAM", "s"),
        ("XINFO", "STREAM", "s", "FULL"),
        ("XINFO", "STREAM", "s", "FULL", "COUNT", "1"),
        ("XINFO", "STREAM", "s", "full", "count", "0"),
        ("XINFO", "STREAM", "s", "FULL", "COUNT", "-1"),
        ("XDEL", "s", "1-1"),
        ("XINFO", "STREAM", "s"),
        ("XDEL", "s", "3-1", "2-1"),
        ("XINFO", "STREAM", "s"),
        ("XINFO", "STREAM", "s", "FULL"),
        ("XSETID", "s", "9-9", "ENTRIESADDED", "42", "MAXDELETEDID", "8-0"),
        ("XINFO", "STREAM", "s"),
        ("XADD", "s", "10-0", "x", "y"),
        ("XINFO", "STREAM", "s"),
        ("XTRIM", "s", "MAXLEN", "0"),
        ("XINFO", "STREAM", "s"),
    ]
    for argv in script:
        mine, theirs = pair.both(*argv)
        if argv[0] != "XINFO":
            assert mine == theirs
            continue
        # Redis 8.6's idempotence fields are there; the 7.0 reference lacks them.
        assert [k for k, _ in info_pairs(mine) if k in IDEMPOTENCE_XINFO_FIELDS] == list(IDEMPOTENCE_XINFO_FIELDS)
        assert without_idempotence_fields(info_pairs(mine)) == info_pairs(theirs), argv


def test_auto_ids_shape_and_order(pair):
    ids = {"partita": [], "redis": []}
    for n in range(30):
        for name, client in (("partita", pair.partita), ("redis", pair.redis)):
            reply = client.call("XADD", "auto", "*" if n % 3 else "NOMKSTREAM", *(["*"] if n % 3 == 0 else []), "n", str(n))
            value = parse(reply)
            if value is None:  # NOMKSTREAM on the first call: both must agree
                ids[name].append(None)
                continue
            assert re.fullmatch(rb"\d+-\d+", value), value
            ms, seq = map(int, value.split(b"-"))
            ids[name].append((ms, seq))
    for name, got in ids.items():
        real = [i for i in got if i is not None]
        assert real == sorted(real) and len(set(real)) == len(real), name
    assert [i is None for i in ids["partita"]] == [i is None for i in ids["redis"]]
    pair.same("XLEN", "auto")
    # Partial IDs on the wall clock's ms: the sequence continues.
    mine = parse(pair.partita.call("XADD", "auto", "%d-*" % ids["partita"][-1][0], "k", "v"))
    assert mine == b"%d-%d" % (ids["partita"][-1][0], ids["partita"][-1][1] + 1)


def test_pipelined_xadds_in_one_send(pair):
    """A pipeline of XADDs arrives in one receive: Partita takes runs of
    ``XADD key * f v`` straight from the bytes (server/_xaddrun.c) and the
    rest command by command; every reply must still be Redis's, the IDs
    aside (both are wall-clock IDs, compared by shape and order)."""
    from server.resp import encode_command

    def cmd(*argv):
        return encode_command([a if isinstance(a, bytes) else a.encode() for a in argv])

    pair.both("XADD", "p", "*", "first", "1")  # the key exists: the rest may run
    pipeline = b"".join([
        cmd("XADD", "p", "*", "f", "v") * 5,
        cmd("xadd", "p", "*", "a", "", "b", "x" * 300),
        cmd("XADD", "p", "*", "f"),
        cmd("XADD", "p", "*", "f", "v", "g"),
        cmd("XADD", "p", "*", "f", "v") * 2,
        cmd("XADD", "p", "NOMKSTREAM", "*", "f", "v"),
        cmd("XADD", "p", "MAXLEN", "20", "*", "f", "v"),
        cmd("XADD", "p", "1-1", "f", "v"),
        cmd("XADD", "p", "*", "f", "v") * 3,
        cmd("XLEN", "p"),
        cmd("XADD", "q", "*", "f", "v") * 2,
        cmd("XADD", "p", "*", "f", "v") * 2,
    ])
    count = 5 + 1 + 1 + 1 + 2 + 1 + 1 + 1 + 3 + 1 + 2 + 2
    masked = {}
    for name, client in (("partita", pair.partita), ("redis", pair.redis)):
        client.sock.sendall(pipeline)
        replies = [client.read_reply() for _ in range(count)]
        ids = [r for r in replies if re.fullmatch(rb"\$\d+\r\n\d+-\d+\r\n", r)]
        assert len(ids) == 17, (name, replies)  # the order is checked on the stream below
        masked[name] = [re.sub(rb"\$\d+\r\n\d+-\d+\r\n", b"<id>", r) for r in replies]
    assert masked["partita"] == masked["redis"]
    info = pair.partita.call("INFO", "partita")
    taken = int(re.search(rb"xadd_pipelined_calls:(\d+)", info).group(1))
    assert taken >= 5  # the first run at least took the fast path
    pair.same("XLEN", "p")
    pair.same("XLEN", "q")
    for name, client in (("partita", pair.partita), ("redis", pair.redis)):
        entries = parse(client.call("XRANGE", "p", "-", "+"))
        got = [tuple(map(int, e[0].split(b"-"))) for e in entries]
        assert got == sorted(got) and len(set(got)) == len(got), name
        assert [e[1] for e in entries][:7] == [[b"first", b"1"]] + [[b"f", b"v"]] * 5 + [
            [b"a", b"", b"b", b"x" * 300]], name


def test_arity_errors(pair):
    pair.script(r"""
        xadd
        xadd s
        xadd s *
        xadd s * f
        xrange
        xrange s
        xrange s -
        xrevrange s +
        xlen
        xdel
        xdel s
        xtrim s
        xtrim s maxlen
        xsetid
        xsetid s
        xread
        xread streams
        xread streams s
        xinfo
        xinfo stream
        xinfo help extra
        xinfo nosuch
    """)
