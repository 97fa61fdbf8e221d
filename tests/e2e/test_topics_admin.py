"""TOPIC commands, partition keys, the partitioner and topic-key reads, through a real partita."""

from __future__ import annotations

from collections import Counter

import pytest
import redis

from cluster.partitioner import partition_for_key
from tests.conftest import wait_for


def _decode(value):
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if isinstance(value, dict):
        return {_decode(k): _decode(v) for k, v in value.items()}
    return value


def _pairs(flat):
    if isinstance(flat, dict):  # RESP3 clients get maps
        return flat
    return dict(zip(flat[::2], flat[1::2]))


def describe(r, topic):
    info = _pairs(_decode(r.execute_command("TOPIC", "DESCRIBE", topic)))
    info["config"] = _pairs(info["config"])
    info["partition-info"] = [_pairs(p) for p in info["partition-info"]]
    return info


def test_topic_create_describe_list_alter_delete(partita_server):
    r = partita_server.client()
    assert r.execute_command("TOPIC", "CREATE", "orders", "PARTITIONS", "3",
                             "CONFIG", "retention-ms", "60000", "max-entry-bytes", "1kb") == b"OK"
    r.execute_command("TOPIC", "CREATE", "payments")
    r.execute_command("TOPIC", "CREATE", "other", "CONFIG", "fsync", "always", "PARTITIONS", "2")
    assert r.execute_command("TOPIC", "LIST") == [b"orders", b"other", b"payments"]
    assert r.execute_command("TOPIC", "LIST", "o*") == [b"orders", b"other"]
    assert r.execute_command("TOPIC", "LIST", "nomatch*") == []
    info = describe(r, "orders")
    assert info["partitions"] == 3 and info["entries"] == 0
    assert info["config"]["retention-ms"] == 60000 and info["config"]["max-entry-bytes"] == 1024
    assert info["config"]["fsync"] == "everysec"  # the server's default
    assert sorted(info["overrides"]) == ["max-entry-bytes", "retention-ms"]
    assert [p["key"] for p in info["partition-info"]] == ["orders#0", "orders#1", "orders#2"]
    assert describe(r, "other")["config"]["fsync"] == "always"

    r.execute_command("TOPIC", "ALTER", "orders", "PARTITIONS", "5")
    r.execute_command("TOPIC", "ALTER", "orders", "CONFIG", "retention-ms", "default", "segment-bytes", "1mb")
    info = describe(r, "orders")
    assert info["partitions"] == 5 and info["config"]["retention-ms"] == -1
    assert info["config"]["segment-bytes"] == 1024 * 1024
    assert r.type("orders") == b"stream" and r.exists("orders#4") == 1

    assert r.execute_command("TOPIC", "DELETE", "orders") == b"OK"
    assert r.execute_command("TOPIC", "LIST") == [b"other", b"payments"]
    assert r.exists("orders") == 0


@pytest.mark.parametrize("args, message", [
    (["CREATE", "payments"], "topic 'payments' already exists"),
    (["CREATE", "a#b"], "'#' is reserved"),
    (["CREATE", "x", "PARTITIONS", "0"], "between 1 and 1024"),
    (["CREATE", "x", "PARTITIONS", "two"], "value is not an integer"),
    (["CREATE", "x", "CONFIG", "retention-days", "3"], "unknown topic config 'retention-days'"),
    (["CREATE", "x", "CONFIG", "retention-ms", "soon"], "invalid value 'soon' for topic config 'retention-ms'"),
    (["CREATE", "x", "CONFIG", "fsync", "sometimes"], "must be one of always, everysec, no"),
    (["CREATE", "x", "CONFIG", "fsync"], "CONFIG needs name value pairs"),
    (["CREATE", "x", "BOGUS"], "syntax error"),
    (["CREATE", "x", "PARTITIONS", "2", "PARTITIONS", "2"], "syntax error"),
    (["CREATE", "x", "REPLICATION-FACTOR", "1", "REPLICATION-FACTOR", "1"], "syntax error"),  # (once, as PARTITIONS)
    (["DESCRIBE", "missing"], "unknown topic 'missing'"),
    (["DELETE", "missing"], "unknown topic 'missing'"),
    (["ALTER", "missing", "PARTITIONS", "3"], "unknown topic 'missing'"),
    (["ALTER", "payments", "PARTITIONS", "0"], "between 1 and 1024"),
    (["ALTER", "wide", "PARTITIONS", "2"], "can only grow"),
    (["ALTER", "payments", "CONFIG", "segment-bytes", "10"], "segment-bytes"),
    (["ALTER", "payments", "SHRINK", "1"], "syntax error"),
    (["NOPE"], "unknown subcommand 'NOPE'. Try TOPIC HELP."),
    # A config name given twice is refused, as CONFIG SET refuses a duplicate parameter.
    (["CREATE", "x", "CONFIG", "retention-ms", "1", "RETENTION-MS", "2"],
     "topic config 'retention-ms' given more than once"),
    (["ALTER", "wide", "CONFIG", "fsync", "always", "fsync", "default"], "topic config 'fsync' given more than once"),
    # Numbers with blanks around them are refused, as CONFIG SET refuses them.
    (["ALTER", "wide", "CONFIG", "retention-ms", " 5"], "invalid value ' 5' for topic config 'retention-ms'"),
    (["ALTER", "wide", "CONFIG", "segment-bytes", "2048 "], "invalid value '2048 ' for topic config 'segment-bytes'"),
    # A partition key where a topic name is wanted is named as such, not as an unknown topic.
    (["ALTER", "wide#1", "PARTITIONS", "8"], "TOPIC ALTER takes a topic name, not a partition key"),
    (["ALTER", "wide#1", "CONFIG", "fsync", "always"], "TOPIC ALTER takes a topic name, not a partition key"),
    (["GROUPS", "wide#1"], "TOPIC GROUPS takes a topic name, not a partition key"),
    # One argument too many for a subcommand with an optional one: Redis's words (PUBSUB CHANNELS a b, ACL LOG 1 2).
    (["LIST", "a*", "b*"], "unknown subcommand or wrong number of arguments for 'LIST'. Try TOPIC HELP."),
    (["groups", "wide", "g", "x"], "unknown subcommand or wrong number of arguments for 'groups'. Try TOPIC HELP."),
])
def test_topic_errors(partita_server, args, message):
    r = partita_server.client()
    r.execute_command("TOPIC", "CREATE", "payments")
    r.execute_command("TOPIC", "CREATE", "wide", "PARTITIONS", "4")
    before = [describe(r, "payments"), describe(r, "wide")]
    with pytest.raises(redis.ResponseError, match=message.replace("(", r"\(").replace(".", r"\.")):
        r.execute_command("TOPIC", *args)
    assert sorted(r.execute_command("TOPIC", "LIST")) == [b"payments", b"wide"]
    assert [describe(r, "payments"), describe(r, "wide")] == before  # a refused command changes nothing


def test_topic_help_and_command_docs(partita_server):
    r = partita_server.client()
    help_lines = [line.decode() for line in r.execute_command("TOPIC", "HELP")]
    assert help_lines[0].startswith("TOPIC <subcommand>")
    assert any(line.startswith("ALTER <topic> PARTITIONS") for line in help_lines)
    from tests.e2e.groups_support import Resp

    conn = Resp(partita_server.port)
    flat = _decode(conn.value("COMMAND", "DOCS", "topic"))
    conn.close()
    subs = _pairs(_pairs(flat[1])["subcommands"])
    assert {"topic|create", "topic|describe", "topic|list", "topic|alter", "topic|delete",
            "topic|groups", "topic|help"} <= set(subs)


def test_xadd_round_robin_spreads_evenly_and_keeps_order(partita_server):
    r = partita_server.client()
    r.execute_command("TOPIC", "CREATE", "rr", "PARTITIONS", "4")
    ids = [r.xadd("rr", {"n": i}) for i in range(40)]
    assert r.xlen("rr") == 40
    per = [r.xrange(f"rr#{p}") for p in range(4)]
    assert [len(entries) for entries in per] == [10, 10, 10, 10]
    for p, entries in enumerate(per):
        ns = [int(fields[b"n"]) for _, fields in entries]
        assert ns == list(range(p, 40, 4))  # round-robin, and in order within the partition
        assert [eid for eid, _ in entries] == sorted(eid for eid, _ in entries)
        assert r.xlen(f"rr#{p}") == 10
    assert set(ids) == {eid for entries in per for eid, _ in entries}


def test_a_pipeline_of_keyless_xadds_goes_to_one_partition_the_next_to_the_next(partita_server):
    """Kafka's sticky partitioner: a pipelined run lands in one partition
    (one log batch); the round-robin counter moves on once per run."""
    r = partita_server.client()
    r.execute_command("TOPIC", "CREATE", "st", "PARTITIONS", "3")
    sent = []
    for run in range(4):
        pipe = r.pipeline(transaction=False)
        values = [f"{run}-{i}" for i in range(20)]
        for v in values:
            pipe.xadd("st", {"n": v})
        ids = pipe.execute()
        assert len(set(ids)) == 20
        sent.append(values)
    got = [[fields[b"n"].decode() for _, fields in r.xrange(f"st#{p}")] for p in range(3)]
    assert got == [sent[0] + sent[3], sent[1], sent[2]]
    assert r.xlen("st") == 80


def test_xadd_keyed_entries_go_to_the_hashed_partition(partita_server):
    r = partita_server.client()
    r.execute_command("TOPIC", "CREATE", "k", "PARTITIONS", "5", "CONFIG", "partition-key-field", "user")
    users = [f"user-{i}" for i in range(20)]
    for round_ in range(3):
        for u in users:
            r.xadd("k", {"user": u, "round": round_})
    for p in range(5):
        entries = r.xrange(f"k#{p}")
        got = Counter(fields[b"user"].decode() for _, fields in entries)
        expected = {u for u in users if partition_for_key(u.encode(), 5) == p}
        assert set(got) == expected and all(c == 3 for c in got.values())
        # Per key, the rounds arrive in order.
        for u in expected:
            rounds = [int(f[b"round"]) for _, f in entries if f[b"user"] == u.encode()]
            assert rounds == [0, 1, 2]
    # No key field in the entry: round-robin.
    for i in range(10):
        r.xadd("k", {"n": i})
    assert r.xlen("k") == 70


def test_partition_keys_work_with_stream_commands(partita_server):
    r = partita_server.client()
    r.execute_command("TOPIC", "CREATE", "t", "PARTITIONS", "3")
    a = r.xadd("t#1", {"a": 1}, id="5-1")
    r.xadd("t#1", {"a": 2}, id="6-1")
    r.xadd("t#2", {"a": 3}, id="1-1")
    assert a == b"5-1"
    with pytest.raises(redis.ResponseError, match="equal or smaller"):
        r.xadd("t#1", {"a": 0}, id="5-0")
    assert r.xlen("t#1") == 2 and r.xlen("t") == 3
    assert r.xdel("t#1", "6-1") == 1
    assert r.xtrim("t#2", maxlen=0) == 1
    assert r.xlen("t") == 1
    info = r.xinfo_stream("t#1")
    assert info["length"] == 1 and "partitions" not in info  # XINFO is Redis's; TOPIC DESCRIBE has the rest
    with pytest.raises(redis.ResponseError, match="partition 3 out of range"):
        r.xadd("t#3", {"a": 1})
    with pytest.raises(redis.ResponseError, match=r"needs a partition key \('t#0' .. 't#2'\)"):
        r.xdel("t", "5-1")


def test_xrange_on_a_topic_merges_partitions_by_id(partita_server):
    r = partita_server.client()
    r.execute_command("TOPIC", "CREATE", "m", "PARTITIONS", "3")
    expected = []
    for i in range(1, 31):
        sid = f"{i}-0"
        r.xadd(f"m#{i % 3}", {"i": i}, id=sid)
        expected.append(sid.encode())
    assert [eid for eid, _ in r.xrange("m")] == expected
    assert [eid for eid, _ in r.xrange("m", "5", "9")] == expected[4:9]
    assert [eid for eid, _ in r.xrange("m", count=7)] == expected[:7]
    assert [eid for eid, _ in r.xrevrange("m", count=4)] == expected[::-1][:4]
    assert [eid for eid, _ in r.xrevrange("m", "(20-0", "-", count=3)] == [b"19-0", b"18-0", b"17-0"]
    assert r.execute_command("XRANGE", "m", "-", "+", "COUNT", "0") is None


def test_xread_on_a_topic_replies_per_partition(partita_server):
    r = partita_server.client()
    r.execute_command("TOPIC", "CREATE", "x", "PARTITIONS", "3")
    for i in range(6):
        r.xadd("x", {"i": i})
    got = r.xread({"x": "0"})
    assert [key for key, _ in got] == [b"x#0", b"x#1", b"x#2"]
    assert [len(entries) for _, entries in got] == [2, 2, 2]
    got = r.xread({"x": "0"}, count=1)
    assert [int(entries[0][1][b"i"]) for _, entries in got] == [0, 1, 2]
    assert r.xread({"x": "$"}) == []
    # $ means each partition's end; BLOCK wakes for an entry on any partition.
    other = partita_server.client()
    r2 = partita_server.client()
    r2.client_setname("reader")
    import threading

    result = {}

    def reader():
        result["got"] = r2.xread({"x": "$"}, block=5000)

    t = threading.Thread(target=reader)
    t.start()
    assert wait_for(lambda: any(c["name"] == "reader" and "b" in c["flags"] for c in other.client_list()))
    other.xadd("x#2", {"late": 1})
    t.join(10)
    assert [key for key, _ in result["got"]] == [b"x#2"]
    assert result["got"][0][1][0][1] == {b"late": b"1"}


def test_max_entry_bytes_refuses_and_writes_nothing(partita_server):
    r = partita_server.client()
    r.execute_command("TOPIC", "CREATE", "small", "CONFIG", "max-entry-bytes", "100")
    r.xadd("small", {"f": "x" * 90})
    with pytest.raises(redis.ResponseError, match=r"max-entry-bytes \(100\)"):
        r.xadd("small", {"f": "x" * 100})
    assert r.xlen("small") == 1
    # The server default applies to other topics (and to new ones).
    r.config_set("max-entry-bytes", "50")
    with pytest.raises(redis.ResponseError, match=r"max-entry-bytes \(50\)"):
        r.xadd("fresh", {"f": "y" * 60})
    assert r.exists("fresh") == 0


def test_default_partitions_and_restart_keep_topics_and_config(partita_factory):
    server = partita_factory(["--default-partitions", "4"])
    r = server.client()
    for i in range(8):
        r.xadd("auto", {"i": i})
    r.execute_command("TOPIC", "CREATE", "kept", "PARTITIONS", "2", "CONFIG", "retention-bytes", "1mb",
                      "fsync", "always")
    r.xadd("kept#1", {"a": 1}, id="7-7")
    assert [r.xlen(f"auto#{p}") for p in range(4)] == [2, 2, 2, 2]
    server.restart()
    r = server.client()
    assert r.execute_command("TOPIC", "LIST") == [b"auto", b"kept"]
    assert describe(r, "auto")["partitions"] == 4 and r.xlen("auto") == 8
    info = describe(r, "kept")
    assert info["partitions"] == 2 and info["config"]["retention-bytes"] == 1024 * 1024
    assert info["config"]["fsync"] == "always"
    assert r.xrange("kept#1") == [(b"7-7", {b"a": b"1"})]


def test_info_topics_section(partita_server):
    r = partita_server.client()
    r.execute_command("TOPIC", "CREATE", "i", "PARTITIONS", "3")
    for n in range(9):
        r.xadd("i", {"n": n})
    r.xrange("i")
    info = r.info("topics")
    assert info["topics"] == 1 and info["partitions"] == 3
    assert info["entries_in_total"] == 9 and info["entries_out_total"] == 9
    assert info["topics_bytes"] > 0
    assert "entries_in_per_sec" in info and "retention_segments_deleted" in info


def test_topic_fsync_policy_overrides_the_server_default(partita_factory):
    server = partita_factory(["--fsync", "no"])
    r = server.client()
    r.execute_command("TOPIC", "CREATE", "durable", "CONFIG", "fsync", "always")
    r.execute_command("TOPIC", "CREATE", "loose")

    def commits():
        return r.info("persistence")["partita_group_commits"]

    before = commits()
    for i in range(5):
        r.xadd("loose", {"i": i})
    assert commits() == before  # fsync no: never waits for a flush
    for i in range(5):
        r.xadd("durable", {"i": i})
    assert commits() >= before + 5  # each acknowledged XADD waited for its fsync
    r.execute_command("TOPIC", "ALTER", "durable", "CONFIG", "fsync", "default")
    mid = commits()
    r.xadd("durable", {"i": 9})
    assert commits() == mid


def test_del_of_a_partition_key_beyond_the_topics_partitions_deletes_nothing(partita_factory):
    """Such a key does not exist (TYPE none, EXISTS 0), so DEL answers 0 and
    leaves the topic alone, as DEL of a missing key does in Redis; it used to
    answer 1 and delete the whole topic with its groups."""
    server = partita_factory()
    r = server.client()
    r.execute_command("TOPIC", "CREATE", "orders", "PARTITIONS", "3")
    r.xadd("orders#1", {"a": 1})
    r.xgroup_create("orders", "g", "0")
    r.xadd("single", {"a": 1})
    assert r.exists("orders#3", "single#1") == 0
    assert r.delete("orders#3", "orders#30", "single#1") == 0
    assert r.unlink("orders#3") == 0
    server.restart(kill9=True)
    r = server.client()
    assert r.execute_command("TOPIC", "LIST") == [b"orders", b"single"]
    assert describe(r, "orders")["partitions"] == 3 and r.xlen("orders") == 1 and r.xlen("single") == 1
    assert [g["name"] for g in r.xinfo_groups("orders")] == [b"g"]


def test_config_value_default_means_the_servers_default_in_create_as_in_alter(partita_server):
    """``default`` sets no override in TOPIC CREATE as in TOPIC ALTER (and
    Kafka's CreateTopics): it was refused for a number ('must be an
    integer') and taken literally for partition-key-field, making XADDs
    hash a field named 'default'."""
    r = partita_server.client()
    r.execute_command("TOPIC", "CREATE", "a", "CONFIG", "retention-ms", "default", "fsync", "always")
    r.execute_command("TOPIC", "CREATE", "b", "PARTITIONS", "2", "CONFIG", "partition-key-field", "DEFAULT")
    assert describe(r, "a")["overrides"] == ["fsync"] and describe(r, "a")["config"]["retention-ms"] == -1
    assert describe(r, "b")["overrides"] == [] and describe(r, "b")["config"]["partition-key-field"] == ""
