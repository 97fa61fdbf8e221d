"""XACKDEL (Redis 8.2) through a real ``partita``: acknowledge in one group,
then delete by the reference policy (KEEPREF, DELREF, ACKED). No Redis 8
binary exists here: the replies are specified from the command's page
(redis.io/commands/xackdel) and Redis's own tests of it
(tests/unit/type/stream-cgroups.tcl), exact in RESP2 and RESP3, and run
through redis-py 8's ``xackdel``."""

from __future__ import annotations

import pytest
import redis

from tests.e2e.groups_support import Resp, topic_with_one_pending

NO_PENDING = b"*4\r\n:0\r\n$-1\r\n$-1\r\n*-1\r\n"
PENDING_OF_CONSUMER2 = b"*4\r\n:2\r\n$3\r\n1-0\r\n$3\r\n2-0\r\n*1\r\n*2\r\n$9\r\nconsumer2\r\n$1\r\n2\r\n"


def _two_groups_read_both(r: Resp, key: str) -> None:
    r.call("XADD", key, "1-0", "f", "v")
    r.call("XADD", key, "2-0", "f", "v")
    r.call("XGROUP", "CREATE", key, "group1", "0")
    r.call("XGROUP", "CREATE", key, "group2", "0")
    r.call("XREADGROUP", "GROUP", "group1", "consumer1", "STREAMS", key, ">")
    r.call("XREADGROUP", "GROUP", "group2", "consumer2", "STREAMS", key, ">")


def test_xackdel_of_a_missing_key_or_group_is_minus_one_per_id(partita_shared):
    r = Resp(partita_shared.port)
    assert r.call("XACKDEL", "nokey", "g", "IDS", "2", "1-1", "2-2") == b"*2\r\n:-1\r\n:-1\r\n"
    r.call("XADD", "nogroup", "1-0", "f", "v")
    assert r.call("XACKDEL", "nogroup", "g", "IDS", "2", "1-1", "2-2") == b"*2\r\n:-1\r\n:-1\r\n"


def test_xackdel_refuses_what_redis_refuses(partita_shared):
    r = Resp(partita_shared.port)
    r.call("XADD", "v", "1-0", "f", "v")
    r.call("XGROUP", "CREATE", "v", "g", "0")
    arity = b"-ERR wrong number of arguments for 'xackdel' command\r\n"
    positive = b"-ERR Number of IDs must be a positive integer\r\n"
    cases = [
        (("XACKDEL",), arity),
        (("XACKDEL", "v"), arity),
        (("XACKDEL", "v", "g"), arity),
        (("XACKDEL", "v", "g", "IDS", "1"), arity),
        (("XACKDEL", "v", "g", "IDS", "abc", "1-1"), positive),
        (("XACKDEL", "v", "g", "IDS", "0", "1-1"), positive),
        (("XACKDEL", "v", "g", "IDS", "-5", "1-1"), positive),
        (("XACKDEL", "v", "g", "IDS", "3", "1-1", "2-2"),
         b"-ERR The `numids` parameter must match the number of arguments\r\n"),
        (("XACKDEL", "v", "g", "IDS", "1", "1-1", "2-2"), b"-ERR syntax error\r\n"),
        (("XACKDEL", "v", "g", "KEEPREF", "DELREF", "IDS", "1", "1-1"), b"-ERR syntax error\r\n"),
        (("XACKDEL", "v", "g", "KEEPREF", "ACKED", "IDS", "1", "1-1"), b"-ERR syntax error\r\n"),
        (("XACKDEL", "v", "g", "DELREF", "ACKED", "IDS", "1", "1-1"), b"-ERR syntax error\r\n"),
        (("XACKDEL", "v", "g", "IDS", "1", "bad"),
         b"-ERR Invalid stream ID specified as stream command argument\r\n"),
    ]
    for argv, reply in cases:
        assert r.call(*argv) == reply, argv
    assert r.call("XLEN", "v") == b":1\r\n"


@pytest.mark.parametrize("policy, first, length, then, second", [
    # DELREF: acknowledged, deleted, and gone from group2's PEL as well.
    ("DELREF", b"*2\r\n:1\r\n:1\r\n", b":0\r\n", NO_PENDING, b"*2\r\n:-1\r\n:-1\r\n"),
    # ACKED: group2 still has them pending: acknowledged in group1, kept (2);
    # once group2 acknowledges them too, deleted.
    ("ACKED", b"*2\r\n:2\r\n:2\r\n", b":2\r\n", PENDING_OF_CONSUMER2, b"*2\r\n:1\r\n:1\r\n"),
    # KEEPREF: deleted, group2's references stay; acknowledging them later
    # answers 1 (the entries are gone already).
    ("KEEPREF", b"*2\r\n:1\r\n:1\r\n", b":0\r\n", PENDING_OF_CONSUMER2, b"*2\r\n:1\r\n:1\r\n"),
])
def test_xackdel_by_policy(partita_shared, policy, first, length, then, second):
    r = Resp(partita_shared.port)
    key = f"policy-{policy}"
    _two_groups_read_both(r, key)
    assert r.call("XACKDEL", key, "group1", policy, "IDS", "2", "1-0", "2-0") == first
    assert r.call("XLEN", key) == length
    assert r.call("XPENDING", key, "group1") == NO_PENDING
    assert r.call("XPENDING", key, "group2") == then
    assert r.call("XACKDEL", key, "group2", policy, "IDS", "2", "1-0", "2-0") == second
    assert r.call("XLEN", key) == b":0\r\n"
    assert r.call("XPENDING", key, "group2") == NO_PENDING


def test_xackdel_answers_per_id_in_order_and_a_repeat_is_no_longer_pending(partita_shared):
    r = Resp(partita_shared.port, protocol=3)
    for ms in (1, 2, 3):
        r.call("XADD", "order", f"{ms}-0", "f", "v")
    r.call("XGROUP", "CREATE", "order", "g", "0")
    r.call("XREADGROUP", "GROUP", "g", "c", "COUNT", "2", "STREAMS", "order", ">")
    # 3-0 is in the stream but was never delivered: not pending, -1, untouched.
    assert r.call("XACKDEL", "order", "g", "IDS", "4", "2-0", "3-0", "2-0", "1-0") == \
        b"*4\r\n:1\r\n:-1\r\n:-1\r\n:1\r\n"
    assert r.call("XLEN", "order") == b":1\r\n"
    ids = [f"{i}-1" for i in range(50)]  # many IDs, none pending
    assert r.call("XACKDEL", "order", "g", "IDS", "50", *ids) == b"*50\r\n" + b":-1\r\n" * 50


def test_xackdel_of_a_topic_key_needs_a_partition_key(partita_shared):
    r = Resp(partita_shared.port)
    topic_with_one_pending(r, "ackdel-topic", "g", 1)
    assert r.call("XACKDEL", "ackdel-topic", "g", "IDS", "1", "1-0").startswith(
        b"-ERR 'ackdel-topic' is a topic of 2 partitions: this command needs a partition key")
    assert r.call("XACKDEL", "ackdel-topic#1", "g", "IDS", "1", "1-0") == b"*1\r\n:1\r\n"


def test_redis_py_8_xackdel(partita_shared):
    client = redis.Redis(port=partita_shared.port)
    first = client.xadd("py-ackdel", {"n": 1})
    second = client.xadd("py-ackdel", {"n": 2})
    client.xgroup_create("py-ackdel", "a", "0")
    client.xgroup_create("py-ackdel", "b", "0")
    client.xreadgroup("a", "c", {"py-ackdel": ">"})
    client.xreadgroup("b", "c", {"py-ackdel": ">"})
    assert client.xackdel("py-ackdel", "a", first, second, ref_policy="ACKED") == [2, 2]
    assert client.xackdel("py-ackdel", "b", first, ref_policy="ACKED") == [1]
    assert client.xackdel("py-ackdel", "b", second, ref_policy="DELREF") == [1]
    assert client.xlen("py-ackdel") == 0
    assert client.xackdel("py-ackdel", "b", second) == [-1]
