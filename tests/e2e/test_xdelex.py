"""XDELEX (Redis 8.2), the example of a stream command added end to end on
the broker (docs/architecture.md): its parser and reply here, one session
call (``Session.delete_each``), nothing else; with its reference policies
(KEEPREF, DELREF, ACKED: ``cluster.broker.references``). No Redis 8 binary exists here:
the replies are specified from the command's page (redis.io/commands/xdelex)
and checked exactly, RESP2 and RESP3, through a real ``partita`` and through
redis-py 8's own method."""

from __future__ import annotations

import redis

from tests.conftest import raw_exchange
from tests.e2e.groups_support import Resp


def _send(port: int, *commands: bytes) -> bytes:
    return raw_exchange(port, b"".join(commands))[0]


def _entry(entry_id: bytes) -> bytes:
    """An entry ``f v`` as XRANGE replies it."""
    return b"*2\r\n$%d\r\n%s\r\n*2\r\n$1\r\nf\r\n$1\r\nv\r\n" % (len(entry_id), entry_id)


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


# ------------------------------------------------------------ policies (8.2)


def test_xdelex_delref_removes_the_ids_from_every_groups_pending_list(partita_server):
    """DELREF: the entries leave the stream and every group's PEL; an ID no
    longer in the stream answers -1, and its dangling references go too."""
    r = Resp(partita_server.port)
    for ms in (1, 2, 3):
        r.call("XADD", "s", f"{ms}-0", "f", "v")
    r.call("XGROUP", "CREATE", "s", "g1", "0")
    r.call("XGROUP", "CREATE", "s", "g2", "0")
    r.call("XREADGROUP", "GROUP", "g1", "c1", "STREAMS", "s", ">")
    r.call("XREADGROUP", "GROUP", "g2", "c2", "COUNT", "1", "STREAMS", "s", ">")
    assert r.call("XDEL", "s", "3-0") == b":1\r\n"  # g1 keeps a dangling reference to 3-0
    assert r.call("XDELEX", "s", "DELREF", "IDS", "3", "1-0", "3-0", "9-0") == b"*3\r\n:1\r\n:-1\r\n:-1\r\n"
    assert r.call("XPENDING", "s", "g1") == b"*4\r\n:1\r\n$3\r\n2-0\r\n$3\r\n2-0\r\n*1\r\n*2\r\n$2\r\nc1\r\n$1\r\n1\r\n"
    assert r.call("XPENDING", "s", "g2") == b"*4\r\n:0\r\n$-1\r\n$-1\r\n*-1\r\n"
    assert r.call("XRANGE", "s", "-", "+") == b"*1\r\n" + _entry(b"2-0")
    r3 = Resp(partita_server.port, protocol=3)
    assert r3.call("XDELEX", "s", "IDS", "1", "2-0", "delref") == b"*1\r\n:1\r\n"
    assert r3.call("XPENDING", "s", "g1") == b"*4\r\n:0\r\n_\r\n_\r\n_\r\n"


def test_xdelex_acked_deletes_only_what_no_group_still_needs(partita_server):
    """ACKED (valkey.io's rule, Redis's tests): an entry goes only when no
    group has it pending and none can still deliver it (its ID is not above
    a group's last-delivered-id); else 2 and it stays. Without groups
    nothing needs an entry."""
    r = Resp(partita_server.port)
    for ms in range(1, 6):
        r.call("XADD", "s", f"{ms}-0", "f", "v")
    r.call("XGROUP", "CREATE", "s", "g1", "0")
    r.call("XGROUP", "CREATE", "s", "g2", "3-0")
    r.call("XREADGROUP", "GROUP", "g1", "c", "COUNT", "2", "STREAMS", "s", ">")  # g1: 1-0, 2-0 pending
    # 1-0 pending in g1; 3-0 not yet read by g1 (last-delivered-id 2-0).
    assert r.call("XDELEX", "s", "ACKED", "IDS", "2", "1-0", "3-0") == b"*2\r\n:2\r\n:2\r\n"
    assert r.call("XACK", "s", "g1", "1-0") == b":1\r\n"
    assert r.call("XDELEX", "s", "ACKED", "IDS", "3", "1-0", "2-0", "1-0") == b"*3\r\n:1\r\n:2\r\n:-1\r\n"
    # A group created later can still deliver an entry: nothing below it goes.
    r.call("XGROUP", "CREATE", "s", "late", "0")
    assert r.call("XACK", "s", "g1", "2-0") == b":1\r\n"
    assert r.call("XDELEX", "s", "ACKED", "IDS", "1", "2-0") == b"*1\r\n:2\r\n"
    for group in ("g1", "g2", "late"):
        assert r.call("XGROUP", "DESTROY", "s", group) == b":1\r\n"
    assert r.call("XDELEX", "s", "ACKED", "IDS", "2", "2-0", "5-0") == b"*2\r\n:1\r\n:1\r\n"
    assert r.call("XRANGE", "s", "-", "+") == b"*2\r\n" + _entry(b"3-0") + _entry(b"4-0")
    r3 = Resp(partita_server.port, protocol=3)
    assert r3.call("XDELEX", "s", "ACKED", "IDS", "1", "3-0") == b"*1\r\n:1\r\n"


def test_xdelex_of_a_topic_key_needs_a_partition_key(partita_server):
    r = Resp(partita_server.port)
    assert r.call("TOPIC", "CREATE", "t", "PARTITIONS", "2") == b"+OK\r\n"
    r.call("XADD", "t#1", "1-0", "f", "v")
    assert r.call("XDELEX", "t", "DELREF", "IDS", "1", "1-0").startswith(
        b"-ERR 't' is a topic of 2 partitions: this command needs a partition key")
    assert r.call("XDELEX", "t#1", "DELREF", "IDS", "1", "1-0") == b"*1\r\n:1\r\n"


def test_redis_py_8_xdelex_with_each_policy(partita_server):
    client = redis.Redis(port=partita_server.port)
    ids = [client.xadd("p", {"n": i}) for i in range(4)]
    client.xgroup_create("p", "g", "0")
    client.xreadgroup("g", "c", {"p": ">"}, count=2)
    assert client.xdelex("p", ids[0], ref_policy="ACKED") == [2]  # pending
    assert client.xdelex("p", ids[0], ids[3], ref_policy="DELREF") == [1, 1]
    assert client.xlen("p") == 2
    assert client.xpending("p", "g")["pending"] == 1  # ids[1] only: ids[0]'s reference went with it
    assert client.xdelex("p", ids[2], ref_policy="KEEPREF") == [1]
