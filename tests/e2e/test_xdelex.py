"""XDELEX (Redis 8.2), the example of a stream command added end to end on
the broker (docs/architecture.md): its parser and reply here, one session
call (``Session.delete_each``), nothing else. No Redis 8 binary exists here:
the replies are specified from the command's page (redis.io/commands/xdelex)
and checked exactly, RESP2 and RESP3, through a real ``partita`` and through
redis-py 8's own method."""

from __future__ import annotations

import redis

from tests.conftest import raw_exchange


def _send(port: int, *commands: bytes) -> bytes:
    return raw_exchange(port, b"".join(commands))[0]


def _cmd(*words: bytes) -> bytes:
    return b"*%d\r\n" % len(words) + b"".join(b"$%d\r\n%s\r\n" % (len(w), w) for w in words)


def test_xdelex_deletes_each_id_and_says_which(partita_server):
    port = partita_server.port
    setup = b"".join(_cmd(b"XADD", b"s", b"%d-0" % ms, b"f", b"v") for ms in (1, 2, 3))
    assert _send(port, setup) == b"$3\r\n1-0\r\n$3\r\n2-0\r\n$3\r\n3-0\r\n"
    # One result per ID, in order: 1 deleted, -1 not in the stream (also a
    # repeat of one just deleted); KEEPREF is the default, and the IDS block
    # may come before the policy.
    assert _send(port, _cmd(b"XDELEX", b"s", b"IDS", b"3", b"2-0", b"9-9", b"2-0")) == b"*3\r\n:1\r\n:-1\r\n:-1\r\n"
    assert _send(port, _cmd(b"XDELEX", b"s", b"IDS", b"1", b"1-0", b"keepref")) == b"*1\r\n:1\r\n"
    assert _send(port, _cmd(b"XLEN", b"s")) == b":1\r\n"
    # A key that does not exist: every ID is not in the stream.
    assert _send(port, _cmd(b"XDELEX", b"nokey", b"IDS", b"2", b"1-0", b"2-0")) == b"*2\r\n:-1\r\n:-1\r\n"
    # RESP3: the same array.
    assert _send(port, _cmd(b"HELLO", b"3") + _cmd(b"XDELEX", b"s", b"IDS", b"1", b"3-0")).endswith(b"*1\r\n:1\r\n")


def test_xdelex_refuses_what_redis_refuses(partita_server):
    port = partita_server.port
    _send(port, _cmd(b"XADD", b"s", b"1-0", b"f", b"v"))
    cases = [
        (_cmd(b"XDELEX", b"s", b"IDS", b"0", b"1-0"), b"-ERR Number of IDs must be a positive integer\r\n"),
        (_cmd(b"XDELEX", b"s", b"IDS", b"x", b"1-0"), b"-ERR Number of IDs must be a positive integer\r\n"),
        (_cmd(b"XDELEX", b"s", b"IDS", b"3", b"1-0"), b"-ERR The `numids` parameter must match the number of arguments\r\n"),
        (_cmd(b"XDELEX", b"s", b"KEEPREF", b"1-0", b"2-0"), b"-ERR syntax error\r\n"),
        (_cmd(b"XDELEX", b"s", b"KEEPREF", b"KEEPREF", b"IDS", b"1", b"1-0"), b"-ERR syntax error\r\n"),
        (_cmd(b"XDELEX", b"s", b"IDS", b"1", b"bad"), b"-ERR Invalid stream ID specified as stream command argument\r\n"),
        (_cmd(b"XDELEX", b"s", b"IDS"), b"-ERR wrong number of arguments for 'xdelex' command\r\n"),
    ]
    for request, reply in cases:
        assert _send(port, request) == reply, request
    assert _send(port, _cmd(b"XLEN", b"s")) == b":1\r\n"  # no refusal deleted anything


def test_redis_py_8_xdelex(partita_server):
    client = redis.Redis(port=partita_server.port)
    first = client.xadd("s", {"f": "v"})
    client.xgroup_create("s", "g", "0")
    client.xreadgroup("g", "c", {"s": ">"})
    assert client.xdelex("s", first, "0-1") == [1, -1]
    # KEEPREF: the group still has the entry pending; XCLAIM finds it gone.
    assert client.xpending("s", "g")["pending"] == 1
    assert client.xlen("s") == 0
