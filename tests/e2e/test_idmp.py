"""XADD IDMP / IDMPAUTO, XCFGSET and XINFO STREAM's idempotence fields (Redis
8.6) through a real ``partita``: the replies as specified by the commands'
pages and by redis's own tests/unit/type/stream.tcl (no Redis 8 binary
exists here), RESP2 and RESP3, redis-py 8's own methods, and deduplication
across restarts (kill -9 under ``fsync always``; a clean stop under
``everysec``). The failover case is tests/e2e/test_replication.py's."""

from __future__ import annotations

import re

import pytest
import redis

from tests.e2e.streams_support import RespClient, info_pairs

ID_REPLY = re.compile(rb"^\$\d+\r\n\d+-\d+\r\n$")
IDEMPOTENCE_FIELDS = [b"idmp-duration", b"idmp-maxsize", b"pids-tracked", b"iids-tracked", b"iids-added",
                      b"iids-duplicates"]


@pytest.fixture(params=[2, 3], ids=["resp2", "resp3"])
def conn(request, partita_server):
    with RespClient(partita_server.port, protocol=request.param) as client:
        client.protocol = request.param
        yield client


def test_a_retry_answers_the_original_id(conn):
    first = conn.call("XADD", "s", "IDMP", "p1", "payment-abc", "*", "amount", "100", "currency", "USD")
    assert ID_REPLY.match(first)
    assert conn.call("XADD", "s", "IDMP", "p1", "payment-abc", "*", "amount", "200", "currency", "EUR") == first
    assert conn.call("XLEN", "s") == b":1\r\n"
    entry_id = first.split(b"\r\n")[1]
    assert conn.call("XRANGE", "s", "-", "+") == (
        b"*1\r\n*2\r\n$%d\r\n%s\r\n*4\r\n$6\r\namount\r\n$3\r\n100\r\n$8\r\ncurrency\r\n$3\r\nUSD\r\n"
        % (len(entry_id), entry_id))
    # Another producer, the same idempotent id: another entry. IDMPAUTO: the pairs, in any order.
    assert conn.call("XADD", "s", "IDMP", "p2", "payment-abc", "*", "a", "1") != first
    auto = conn.call("XADD", "s", "IDMPAUTO", "p1", "*", "f1", "a", "f2", "b")
    assert conn.call("XADD", "s", "IDMPAUTO", "p1", "*", "f2", "b", "f1", "a") == auto
    assert conn.call("XADD", "s", "IDMPAUTO", "p1", "*", "f2", "b", "f1", "x") != auto
    assert conn.call("XLEN", "s") == b":4\r\n"


def test_options_in_any_order_with_trims_and_nomkstream(conn):
    nil = b"$-1\r\n" if conn.protocol == 2 else b"_\r\n"
    assert conn.call("XADD", "s", "NOMKSTREAM", "IDMP", "p1", "req-1", "*", "f", "v") == nil
    assert conn.call("EXISTS", "s") == b":0\r\n"
    one = conn.call("XADD", "s", "IDMP", "p1", "req-1", "MAXLEN", "~", "100", "*", "f", "v")
    two = conn.call("XADD", "s", "MAXLEN", "~", "100", "IDMP", "p1", "req-2", "*", "f", "v")
    assert conn.call("xadd", "s", "nomkstream", "idmp", "p1", "req-2", "maxlen", "0", "*", "f", "v") == two
    assert conn.call("XADD", "s", "IDMPAUTO", "p1", "MINID", "~", "1000000000-0", "*", "f", "v") not in (one, two)
    assert conn.call("XLEN", "s") == b":3\r\n"  # the duplicate's MAXLEN 0 trimmed nothing


@pytest.mark.parametrize("argv, error", [
    (["XADD", "s", "IDMP", "p1", "*", "f", "v"], b"-ERR Invalid stream ID specified as stream command argument\r\n"),
    (["XADD", "s", "IDMP", "p1", "iid1", "1-1", "f", "v"], b"-ERR IDMP/IDMPAUTO can be used only with auto-generated IDs\r\n"),
    (["XADD", "s", "IDMPAUTO", "p1", "5-*", "f", "v"], b"-ERR IDMP/IDMPAUTO can be used only with auto-generated IDs\r\n"),
    (["XADD", "s", "IDMP", "p1", "iid1", "IDMP", "p2", "iid2", "*", "f", "v"], b"-ERR IDMP/IDMPAUTO specified multiple times\r\n"),
    (["XADD", "s", "IDMPAUTO", "p1", "IDMP", "p2", "iid2", "*", "f", "v"], b"-ERR IDMP/IDMPAUTO specified multiple times\r\n"),
    (["XADD", "s", "IDMP", "p1", "iid1", "IDMPAUTO", "p2", "*", "f", "v"], b"-ERR IDMP/IDMPAUTO specified multiple times\r\n"),
    (["XADD", "s", "IDMPAUTO", "p1", "IDMPAUTO", "p2", "*", "f", "v"], b"-ERR IDMP/IDMPAUTO specified multiple times\r\n"),
    (["XADD", "s", "IDMP", "", "iid1", "*", "f", "v"], b"-ERR IDMP requires a non-empty producer ID\r\n"),
    (["XADD", "s", "IDMP", "p1", "", "*", "f", "v"], b"-ERR IDMP requires a non-empty idempotent ID\r\n"),
    (["XADD", "s", "IDMPAUTO", "", "*", "f", "v"], b"-ERR IDMPAUTO requires a non-empty producer ID\r\n"),
    (["XCFGSET", "s"], b"-ERR At least one parameter must be specified\r\n"),
    (["XCFGSET", "s", "IDMP-DURATION"], b"-ERR syntax error\r\n"),
    (["XCFGSET", "s", "IDMP-MAXSIZE"], b"-ERR syntax error\r\n"),
    (["XCFGSET", "s", "INVALID"], b"-ERR syntax error\r\n"),
    (["XCFGSET", "s", "IDMP-DURATION", "3.14"], b"-ERR value is not an integer or out of range\r\n"),
    (["XCFGSET", "s", "IDMP-DURATION", "000000000"], b"-ERR value is not an integer or out of range\r\n"),
    (["XCFGSET", "s", "IDMP-DURATION", "INVALID", "IDMP-MAXSIZE"], b"-ERR value is not an integer or out of range\r\n"),
    (["XCFGSET", "s", "IDMP-MAXSIZE", "120-5"], b"-ERR value is not an integer or out of range\r\n"),
    (["XCFGSET", "s", "IDMP-DURATION", "0"], b"-ERR IDMP-DURATION must be between 1 and 86400 seconds\r\n"),
    (["XCFGSET", "s", "IDMP-DURATION", "86401"], b"-ERR IDMP-DURATION must be between 1 and 86400 seconds\r\n"),
    (["XCFGSET", "s", "IDMP-MAXSIZE", "-50"], b"-ERR IDMP-MAXSIZE must be between 1 and 10000 entries\r\n"),
    (["XCFGSET", "s", "IDMP-MAXSIZE", "10001"], b"-ERR IDMP-MAXSIZE must be between 1 and 10000 entries\r\n"),
    (["XCFGSET", "nokey", "IDMP-DURATION", "5"], b"-ERR no such key\r\n"),
    (["XCFGSET"], b"-ERR wrong number of arguments for 'xcfgset' command\r\n"),
])
def test_errors_word_for_word(conn, argv, error):
    conn.call("XADD", "s", "IDMP", "p1", "req-1", "*", "field", "value")
    assert conn.call(*argv) == error
    assert conn.call("XLEN", "s") == b":1\r\n"  # nothing written


def test_xcfgset_sets_and_forgets_only_on_a_change(conn):
    first = conn.call("XADD", "s", "IDMP", "p1", "req-1", "*", "f", "v")
    assert conn.call("XCFGSET", "s", "IDMP-DURATION", "100", "IDMP-MAXSIZE", "100") == b"+OK\r\n"
    assert conn.call("XADD", "s", "IDMP", "p1", "req-1", "*", "f", "v") == first  # the defaults: kept
    assert conn.call("xcfgset", "s", "idmp-maxsize", "5000") == b"+OK\r\n"
    again = conn.call("XADD", "s", "IDMP", "p1", "req-1", "*", "f", "v")
    assert again != first  # forgotten
    fields = dict(info_pairs(conn.call("XINFO", "STREAM", "s")))
    assert (fields[b"idmp-duration"], fields[b"idmp-maxsize"]) == (100, 5000)
    assert (fields[b"pids-tracked"], fields[b"iids-tracked"], fields[b"iids-added"], fields[b"iids-duplicates"]) \
        == (1, 1, 2, 1)


def test_xinfo_stream_shows_the_idempotence_fields_in_redis_86s_order(conn):
    conn.call("XADD", "s", "*", "f", "v")
    summary = [k for k, _ in info_pairs(conn.call("XINFO", "STREAM", "s"))]
    redis86 = [b"length", b"radix-tree-keys", b"radix-tree-nodes", b"last-generated-id", b"max-deleted-entry-id",
               b"entries-added", b"recorded-first-entry-id", *IDEMPOTENCE_FIELDS, b"groups", b"first-entry",
               b"last-entry"]
    assert summary[:len(redis86)] == redis86
    full = [k for k, _ in info_pairs(conn.call("XINFO", "STREAM", "s", "FULL"))]
    assert full[:15] == redis86[:13] + [b"entries", b"groups"]
    values = dict(info_pairs(conn.call("XINFO", "STREAM", "s")))
    assert [values[k] for k in IDEMPOTENCE_FIELDS] == [100, 100, 0, 0, 0, 0]


def test_a_transaction_deduplicates_within_itself(partita_server):
    with RespClient(partita_server.port) as conn:
        conn.call("MULTI")
        for iid in ("req-1", "req-2", "req-1", "req-3"):
            assert conn.call("XADD", "s", "IDMP", "p1", iid, "*", "f", "v") == b"+QUEUED\r\n"
        replies = conn.call("EXEC").split(b"\r\n")
        ids = replies[2::2][:4]
        assert ids[0] == ids[2] and len(set(ids)) == 3
        assert conn.call("XLEN", "s") == b":3\r\n"


def test_a_pipeline_mixing_plain_and_idempotent_xadds(partita_server):
    """Runs of plain XADDs are taken by the C scanner and deferred; an IDMP
    XADD between them goes the general way, after them, in order."""
    with RespClient(partita_server.port) as conn:
        words = [["XADD", "s", "*", "f", "plain"], ["XADD", "s", "IDMP", "p", "i", "*", "f", "first"],
                 ["XADD", "s", "*", "f", "plain"], ["XADD", "s", "IDMP", "p", "i", "*", "f", "retry"],
                 ["XADD", "s", "IDMPAUTO", "q", "*", "f", "plain"]] * 2
        for argv in words:
            conn.send(*argv)
        replies = [conn.read_reply() for _ in words]
        assert all(ID_REPLY.match(r) for r in replies)
        assert len(set(replies)) == 6  # 4 plain, 1 IDMP, 1 IDMPAUTO
        assert replies[1] == replies[3] == replies[6] == replies[8]
        assert replies[4] == replies[9]
        assert conn.call("XLEN", "s") == b":6\r\n"
        ids = [r.split(b"\r\n")[1] for r in replies]
        assert conn.call("XRANGE", "s", "-", "+").count(b"\r\n$5\r\nfirst\r\n") == 1
        assert sorted(set(ids), key=lambda i: tuple(map(int, i.split(b"-")))) == list(dict.fromkeys(ids))


def test_redis_py_methods(partita_server):
    r = partita_server.client(decode_responses=True)
    first = r.xadd("orders", {"item": "book"}, idmp=("checkout-1", b"order-42"))
    assert r.xadd("orders", {"item": "pen"}, idmp=("checkout-1", b"order-42")) == first
    auto = r.xadd("orders", {"item": "mug", "qty": "2"}, idmpauto="checkout-2")
    assert r.xadd("orders", {"qty": "2", "item": "mug"}, idmpauto="checkout-2") == auto
    assert r.xlen("orders") == 2
    assert r.xcfgset("orders", idmp_duration=300, idmp_maxsize=50) in (True, "OK")
    info = r.xinfo_stream("orders")
    assert (info["idmp-duration"], info["idmp-maxsize"], info["pids-tracked"], info["iids-added"],
            info["iids-duplicates"]) == (300, 50, 0, 2, 2)
    with pytest.raises(redis.ResponseError, match="IDMP/IDMPAUTO can be used only with auto-generated IDs"):
        r.execute_command("XADD", "orders", "IDMP", "p", "i", "5-5", "f", "v")
    r3 = partita_server.client(decode_responses=True, protocol=3)
    assert r3.xinfo_stream("orders")["iids-added"] == 2


def test_config_defaults_and_counters(partita_server):
    r = partita_server.client()
    assert r.config_get("stream-idmp-*") == {"stream-idmp-duration": "100", "stream-idmp-maxsize": "100"}
    with pytest.raises(redis.ResponseError, match="must be between 1 and 86400"):
        r.config_set("stream-idmp-duration", 0)
    r.config_set("stream-idmp-maxsize", 2)
    for iid in (b"a", b"b", b"c", b"a"):
        r.xadd("s", {"f": "v"}, idmp=("p", iid))
    assert r.xinfo_stream("s")["idmp-maxsize"] == 2
    assert r.xlen("s") == 4  # "a" was evicted by "c"
    r.xadd("s", {"f": "v"}, idmp=("p", b"c"))
    topics = r.info("topics")
    assert (topics["idempotent_appends_total"], topics["idempotent_duplicates_total"]) == (4, 1)
    described = r.execute_command("TOPIC", "DESCRIBE", "s")  # RESP2 maps: redis-py makes them dicts
    assert described[b"partition-info"][0][b"producers"] == 1


def test_dedup_survives_kill9_under_fsync_always(partita_factory):
    server = partita_factory(["--fsync", "always"])
    r = server.client()
    first = r.xadd("s", {"f": "v"}, idmp=("p", b"i"))
    auto = r.xadd("s", {"f": "w"}, idmpauto="q")
    server.restart(kill9=True)
    r = server.client()
    assert r.xadd("s", {"f": "x"}, idmp=("p", b"i")) == first
    assert r.xadd("s", {"f": "w"}, idmpauto="q") == auto
    assert r.xlen("s") == 2
    info = r.xinfo_stream("s")
    assert (info["pids-tracked"], info["iids-tracked"], info["iids-added"]) == (2, 2, 2)


def test_dedup_and_xcfgset_survive_a_clean_restart_under_everysec(partita_factory):
    server = partita_factory(["--fsync", "everysec"])
    r = server.client()
    r.xadd("s", {"f": "v"}, idmp=("p", b"old"))
    r.xcfgset("s", idmp_duration=60, idmp_maxsize=10)
    first = r.xadd("s", {"f": "v"}, idmp=("p", b"i"))
    r.xadd("s", {"f": "v"}, idmp=("p", b"i"))
    assert server.terminate() == 0
    server.start()
    r = server.client()
    assert r.xadd("s", {"f": "x"}, idmp=("p", b"i")) == first
    assert r.xadd("s", {"f": "x"}, idmp=("p", b"old")) != first  # forgotten by XCFGSET before the restart
    info = r.xinfo_stream("s")
    assert (info["idmp-duration"], info["idmp-maxsize"], info["iids-added"], info["iids-duplicates"]) == (60, 10, 3, 2)


def test_with_the_reference_policies_in_any_order(conn):
    """Redis's "XADD IDMP with KEEPREF option" / "argument order variations"."""
    first = conn.call("XADD", "s", "IDMP", "p1", "req-1", "KEEPREF", "MAXLEN", "~", "1000", "LIMIT", "10", "*",
                      "field1", "value1", "field2", "value2")
    assert conn.call("XADD", "s", "KEEPREF", "IDMP", "p1", "req-1", "*", "field3", "value3") == first
    auto = conn.call("XADD", "s", "IDMPAUTO", "p1", "DELREF", "*", "f", "v")
    assert conn.call("XADD", "s", "ACKED", "IDMPAUTO", "p1", "*", "f", "v") == auto
    assert conn.call("XLEN", "s") == b":2\r\n"
