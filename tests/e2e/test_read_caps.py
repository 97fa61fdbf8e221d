"""XREAD / XREADGROUP MAXCOUNT and MAXSIZE (Redis 8.10) through a real
``partita``: caps on the whole reply over the keys in the order given
(COUNT stays per key); once spent, the keys after are not served; MAXSIZE
is a soft byte cap: the first entry is served whatever its size.

Specified from the XREAD / XREADGROUP pages (redis.io) and the option's
description in Redis's change (redis/redis#15282, as the client libraries
document it: "once reached, remaining streams are skipped", "a single
oversized first entry is still returned", "an empty reply stays empty").
The exact texts of two refusals (MAXCOUNT below COUNT; a non-integer
MAXSIZE) are not in the pages: Partita's are stated in docs/streams.md."""

from __future__ import annotations

import redis

from tests.e2e.groups_support import Resp, parse, while_blocked


def _fill(r: Resp, keys: list[str], n: int = 3, value: str = "v") -> None:
    for key in keys:
        for ms in range(1, n + 1):
            r.call("XADD", key, f"{ms}-0", "f", value)


def _served(reply: bytes) -> list[tuple[bytes, list[bytes]]]:
    value = parse(reply)
    if value is None:
        return []
    if isinstance(value, dict):
        value = list(value.items())
    return [(key, [e[0] for e in entries]) for key, entries in value]


def test_xread_maxcount_caps_the_reply_over_the_keys_in_order(partita_shared):
    r = Resp(partita_shared.port)
    keys = ["mc{t}1", "mc{t}2", "mc{t}3"]
    _fill(r, keys)
    assert _served(r.call("XREAD", "COUNT", "2", "STREAMS", *keys, "0", "0", "0")) == [
        (b"mc{t}1", [b"1-0", b"2-0"]), (b"mc{t}2", [b"1-0", b"2-0"]), (b"mc{t}3", [b"1-0", b"2-0"])]
    assert r.call("XREAD", "COUNT", "2", "MAXCOUNT", "3", "STREAMS", *keys, "0", "0", "0") == (
        b"*2\r\n"
        b"*2\r\n$6\r\nmc{t}1\r\n*2\r\n*2\r\n$3\r\n1-0\r\n*2\r\n$1\r\nf\r\n$1\r\nv\r\n"
        b"*2\r\n$3\r\n2-0\r\n*2\r\n$1\r\nf\r\n$1\r\nv\r\n"
        b"*2\r\n$6\r\nmc{t}2\r\n*1\r\n*2\r\n$3\r\n1-0\r\n*2\r\n$1\r\nf\r\n$1\r\nv\r\n")
    assert _served(r.call("XREAD", "MAXCOUNT", "4", "STREAMS", *keys, "0", "1-0", "3-0")) == [
        (b"mc{t}1", [b"1-0", b"2-0", b"3-0"]), (b"mc{t}2", [b"2-0"])]
    r3 = Resp(partita_shared.port, protocol=3)
    assert _served(r3.call("XREAD", "MAXCOUNT", "1", "STREAMS", *keys, "0", "0", "0")) == [(b"mc{t}1", [b"1-0"])]
    # Nothing to serve: the usual null reply.
    assert r.call("XREAD", "MAXCOUNT", "1", "STREAMS", *keys, "3-0", "3-0", "3-0") == b"*-1\r\n"


def test_xread_maxsize_is_a_soft_byte_cap(partita_shared):
    r = Resp(partita_shared.port)
    keys = ["ms{t}1", "ms{t}2"]
    _fill(r, keys, n=5, value="x" * 100)
    # One byte: the first entry still comes (progress), nothing after it.
    assert _served(r.call("XREAD", "MAXSIZE", "1", "STREAMS", *keys, "0", "0")) == [(b"ms{t}1", [b"1-0"])]
    # About three entries' worth: fewer than all, at least one, in key order.
    some = _served(r.call("XREAD", "MAXSIZE", "400", "STREAMS", *keys, "0", "0"))
    assert some[0][0] == b"ms{t}1" and 1 <= sum(len(ids) for _, ids in some) < 10
    assert _served(r.call("XREAD", "MAXSIZE", "100000", "STREAMS", *keys, "0", "0")) == [
        (b"ms{t}1", [b"%d-0" % i for i in range(1, 6)]), (b"ms{t}2", [b"%d-0" % i for i in range(1, 6)])]
    # With MAXCOUNT: whichever cap comes first.
    assert _served(r.call("XREAD", "MAXSIZE", "100000", "MAXCOUNT", "6", "STREAMS", *keys, "0", "0")) == [
        (b"ms{t}1", [b"%d-0" % i for i in range(1, 6)]), (b"ms{t}2", [b"1-0"])]


def test_maxcount_and_maxsize_refusals(partita_shared):
    r = Resp(partita_shared.port)
    for command in (("XREAD",), ("XREADGROUP", "GROUP", "g", "c")):
        for value in ("0", "-1", "abc"):
            assert r.call(*command, "MAXCOUNT", value, "STREAMS", "s", ">" if len(command) > 1 else "0") == \
                b"-ERR MAXCOUNT must be a positive integer\r\n", (command, value)
            assert r.call(*command, "MAXSIZE", value, "STREAMS", "s", ">" if len(command) > 1 else "0") == \
                b"-ERR MAXSIZE must be a positive integer\r\n", (command, value)
        assert r.call(*command, "COUNT", "5", "MAXCOUNT", "2", "STREAMS", "s", ">" if len(command) > 1 else "0") == \
            b"-ERR MAXCOUNT must be greater than or equal to COUNT\r\n"


def test_xreadgroup_maxcount_delivers_only_what_it_serves(partita_shared):
    r = Resp(partita_shared.port)
    keys = ["gc{t}1", "gc{t}2"]
    _fill(r, keys)
    for key in keys:
        r.call("XGROUP", "CREATE", key, "g", "0")
    assert _served(r.call("XREADGROUP", "GROUP", "g", "c", "MAXCOUNT", "4", "STREAMS", *keys, ">", ">")) == [
        (b"gc{t}1", [b"1-0", b"2-0", b"3-0"]), (b"gc{t}2", [b"1-0"])]
    # The rest is still new for the group, and only what was served is pending.
    assert parse(r.call("XPENDING", "gc{t}2", "g"))[0] == 1
    assert _served(r.call("XREADGROUP", "GROUP", "g", "c", "MAXSIZE", "1", "STREAMS", *keys, ">", ">")) == [
        (b"gc{t}2", [b"2-0"])]
    # A history read is capped the same way.
    assert _served(r.call("XREADGROUP", "GROUP", "g", "c", "MAXCOUNT", "2", "STREAMS", *keys, "0", "0")) == [
        (b"gc{t}1", [b"1-0", b"2-0"])]
    # With CLAIM: the claimed entries count against the cap first.
    r.call("XCLAIM", "gc{t}1", "g", "c", "0", "1-0", "IDLE", "5000", "JUSTID")
    assert _served(r.call("XREADGROUP", "GROUP", "g", "c2", "MAXCOUNT", "2", "CLAIM", "1000",
                          "STREAMS", *keys, ">", ">")) == [(b"gc{t}1", [b"1-0"]), (b"gc{t}2", [b"3-0"])]


def test_a_woken_read_is_capped_too(partita_shared):
    r = Resp(partita_shared.port)

    def add_both() -> None:
        r.call("MULTI")
        for key in ("woken{t}1", "woken{t}2"):
            for ms in (1, 2):
                r.call("XADD", key, f"{ms}-0", "f", "v")
        r.call("EXEC")

    reply = while_blocked(partita_shared.port, ("XREAD", "BLOCK", "20000", "MAXCOUNT", "2",
                                                "STREAMS", "woken{t}1", "woken{t}2", "$", "$"), add_both)
    assert _served(reply) == [(b"woken{t}1", [b"1-0", b"2-0"])]


def test_maxcount_over_a_topic_key_goes_partition_by_partition(partita_shared):
    r = Resp(partita_shared.port)
    assert r.call("TOPIC", "CREATE", "capped-topic", "PARTITIONS", "3") == b"+OK\r\n"
    for n in range(3):
        for ms in (1, 2):
            r.call("XADD", f"capped-topic#{n}", f"{ms}-{n}", "f", "v")
    assert _served(r.call("XREAD", "MAXCOUNT", "3", "STREAMS", "capped-topic", "0")) == [
        (b"capped-topic#0", [b"1-0", b"2-0"]), (b"capped-topic#1", [b"1-1"])]


def test_redis_py_8_max_count_and_max_size(partita_shared):
    client = redis.Redis(port=partita_shared.port)
    for key in ("py-cap{t}1", "py-cap{t}2"):
        for i in range(3):
            client.xadd(key, {"n": i})
    streams = {"py-cap{t}1": "0", "py-cap{t}2": "0"}
    reply = client.xread(streams, count=2, max_count=3)
    assert [(key, len(entries)) for key, entries in reply] == [(b"py-cap{t}1", 2), (b"py-cap{t}2", 1)]
    assert [(key, len(entries)) for key, entries in client.xread(streams, max_size=1)] == [(b"py-cap{t}1", 1)]
    client.xgroup_create("py-cap{t}1", "g", 0)
    client.xgroup_create("py-cap{t}2", "g", 0)
    reply = client.xreadgroup("g", "c", {"py-cap{t}1": ">", "py-cap{t}2": ">"}, max_count=4)
    assert [(key, len(entries)) for key, entries in reply] == [(b"py-cap{t}1", 3), (b"py-cap{t}2", 1)]
