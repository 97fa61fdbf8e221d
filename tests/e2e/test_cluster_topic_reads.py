"""A multi-partition topic key read on any node of a 3-node cluster answers
as on one node (issue 31): XLEN, XRANGE, XREVRANGE and XREAD on ``events``
fan out to the partitions' leaders over the cluster bus
(cluster/runtime/fanout.py) and merge as a single node merges. A single
partita and the cluster are fed the same entries (explicit IDs, so they
match) and every node's reply is compared byte for byte with the single
node's, through a raw connection, redis-py's RedisCluster and
``redis-cli -c``. XREAD BLOCK on the topic key wakes on an append to a
partition any node leads; XGROUP CREATE / SETID / DESTROY on the topic key
change every partition's group through its leader."""

from __future__ import annotations

import subprocess
import threading

import pytest
import redis

from tests.clusterkit import Cluster, eventually, running
from tests.conftest import PartitaProcess, RawConn, wait_for
from tests.e2e.conftest import same_on_every_node, spread_topic

PARTITIONS = 6
TOPIC = b"events"


def _pkey(n: int) -> bytes:
    return b"%s#%d" % (TOPIC, n)


def _feed() -> list[tuple[bytes, bytes, dict]]:
    """``(partition key, ID, fields)`` for every entry: partitions n and n+3
    share their IDs (equal IDs come in partition order), partition 5 stays
    empty."""
    out = []
    for n in range(PARTITIONS - 1):
        for i in range(8):
            out.append((_pkey(n), b"%d-%d" % (1000 + 4 * i + n % 3, i % 2), {"n": n, "i": i}))
    return out


def _command(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


READS = [
    (b"XLEN", TOPIC),
    (b"XRANGE", TOPIC, b"-", b"+"),
    (b"XRANGE", TOPIC, b"-", b"+", b"COUNT", b"7"),
    (b"XRANGE", TOPIC, b"1005", b"(1017-1"),
    (b"XRANGE", TOPIC, b"1005", b"1000"),
    (b"XRANGE", TOPIC, b"-", b"+", b"COUNT", b"0"),
    (b"XREVRANGE", TOPIC, b"+", b"-"),
    (b"XREVRANGE", TOPIC, b"+", b"-", b"COUNT", b"5"),
    (b"XREVRANGE", TOPIC, b"1020", b"1004-1", b"COUNT", b"9"),
    (b"XREAD", b"STREAMS", TOPIC, b"0"),
    (b"XREAD", b"COUNT", b"2", b"STREAMS", TOPIC, b"1009-0"),
    (b"XREAD", b"STREAMS", TOPIC, b"$"),
    (b"XREAD", b"STREAMS", TOPIC, b"+"),
    (b"XREAD", b"STREAMS", TOPIC, b"9999"),
    (b"XREAD", b"MAXCOUNT", b"10", b"COUNT", b"3", b"STREAMS", TOPIC, b"0"),
    (b"XREAD", b"BLOCK", b"100", b"COUNT", b"1", b"STREAMS", TOPIC, b"1017-1"),
    (b"XREAD", b"BLOCK", b"50", b"STREAMS", TOPIC, b"$"),
    (b"XREAD", b"BLOCK", b"50", b"STREAMS", TOPIC, b"1040"),
]


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    server = PartitaProcess(tmp_path_factory.mktemp("single") / "data").start()
    client = server.client()
    assert client.execute_command("TOPIC", "CREATE", TOPIC, "PARTITIONS", PARTITIONS) == b"OK"
    for key, entry_id, fields in _feed():
        assert client.xadd(key, fields, id=entry_id) == entry_id
    yield server
    server.stop()


def _cluster_client(cluster: Cluster):
    from redis.cluster import ClusterNode, RedisCluster

    return RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", cluster.ports[0])], socket_timeout=10)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    for c in running(tmp_path_factory.mktemp("fanout")):
        spread_topic(c, TOPIC, PARTITIONS, _feed())
        yield c


@pytest.mark.parametrize("protocol", [2, 3])
def test_topic_reads_on_every_node_answer_as_one_node(single, cluster, protocol):
    expected = same_on_every_node(single, cluster.nodes, READS, protocol)
    assert expected[0] == b":40\r\n" and expected[1].startswith(b"*40\r\n")


def test_redis_cluster_client_reads_the_topic_key(single, cluster):
    one = single.client()
    rc = _cluster_client(cluster)
    try:
        assert rc.xlen(TOPIC) == one.xlen(TOPIC) == 40
        assert rc.xrange(TOPIC) == one.xrange(TOPIC)
        assert rc.xrevrange(TOPIC, count=11) == one.xrevrange(TOPIC, count=11)
        assert rc.xread({TOPIC: "1010-0"}, count=3) == one.xread({TOPIC: "1010-0"}, count=3)
        assert rc.xrange(TOPIC, min="1008", max="1012") == one.xrange(TOPIC, min="1008", max="1012")
    finally:
        rc.close()


def test_redis_cli_c_reads_the_topic_key(single, cluster):
    def cli(port: int, *args: str, cluster_mode: bool = False) -> str:
        return subprocess.run(["redis-cli", *(["-c"] if cluster_mode else []), "-p", str(port), *args],
                              capture_output=True, text=True, timeout=30, check=True).stdout

    for args in (("XLEN", "events"), ("XRANGE", "events", "-", "+", "COUNT", "6"),
                 ("XREVRANGE", "events", "+", "-"), ("XREAD", "COUNT", "1", "STREAMS", "events", "0")):
        want = cli(single.port, *args)
        for port in cluster.ports:
            assert cli(port, *args, cluster_mode=True) == want, (port, args)
    for args in (("XGROUP", "CREATE", "events", "cli", "0"), ("XGROUP", "DESTROY", "events", "cli")):
        assert cli(cluster.ports[1], *args, cluster_mode=True) == cli(single.port, *args), args


def _blocked_clients(port: int) -> int:
    with RawConn(port) as conn:
        info = conn.request(b"INFO clients\r\n").decode()
    return int(info.split("blocked_clients:")[1].split()[0])


GROUP_CHANGES = [  # (command, then check every partition's groups)
    (b"XGROUP", b"CREATE", TOPIC, b"g", b"$"),
    (b"XGROUP", b"CREATE", TOPIC, b"h", b"1010", b"ENTRIESREAD", b"3"),
    (b"XGROUP", b"CREATE", TOPIC, b"g", b"0"),  # BUSYGROUP: every partition has it
    (b"XGROUP", b"SETID", TOPIC, b"g", b"1012-0"),
    (b"XGROUP", b"SETID", TOPIC, b"nope", b"0"),  # NOGROUP, of partition 0
    (b"XGROUP", b"DESTROY", TOPIC, b"h"),
    (b"XGROUP", b"DESTROY", TOPIC, b"h"),
    (b"XGROUP", b"CREATE", TOPIC, b"x", b"bad-id"),  # the syntax error, nothing sent
]


def test_xgroup_on_the_topic_key_changes_every_partition_through_its_leader(single, cluster):
    """XGROUP CREATE / SETID / DESTROY on ``events`` on the topic's group
    coordinator (the leader of its slot; other nodes answer ``-MOVED`` to
    it): each partition's group is changed by its leader, with the single
    node's replies; then each partition's XINFO GROUPS (on its leader) is
    the single node's."""
    def groups_of(n: int, port: int) -> bytes:
        with RawConn(port) as conn:
            return conn.request(_command(b"XINFO", b"GROUPS", _pkey(n)))

    leaders = [cluster.leader_of(TOPIC if n == 0 else _pkey(n)).port for n in range(PARTITIONS)]
    coordinator = cluster.leader_of(TOPIC)
    for change in GROUP_CHANGES:
        with RawConn(single.port) as one, RawConn(coordinator.port) as conn:
            assert conn.request(_command(*change)) == one.request(_command(*change)), change
        for n in range(PARTITIONS):
            assert groups_of(n, leaders[n]) == groups_of(n, single.port), (change, n)
    rc = _cluster_client(cluster)
    try:
        assert rc.xgroup_destroy(TOPIC, "g") == single.client().xgroup_destroy(TOPIC, "g") == 1
        assert rc.xgroup_create(TOPIC, "k", id="0") is True
    finally:
        rc.close()
    assert all(groups_of(n, leaders[n]).count(b"k") == 1 for n in range(PARTITIONS))


def test_xread_block_on_the_topic_key_wakes_on_an_append_on_any_node(cluster):
    """A reader blocked on a topic key (``$``) on one node wakes when an
    entry is appended to a partition another node leads, and gets it under
    its partition key."""
    topic = b"wakes"
    owner = cluster.leader_of(topic)
    assert owner.client().execute_command("TOPIC", "CREATE", topic, "PARTITIONS", PARTITIONS) == b"OK"
    reader_node = cluster.nodes[0]
    for n in range(1, PARTITIONS):
        key = b"%s#%d" % (topic, n)
        leader = cluster.leader_of(key)
        eventually(lambda: leader.client().exists(key), what=f"{key!r} on its leader")
        got: list = []
        reader = threading.Thread(target=lambda: got.append(
            reader_node.client(socket_timeout=30).xread({topic: "$"}, block=20000)))
        reader.start()
        try:
            assert wait_for(lambda: _blocked_clients(reader_node.port) == 1, 10), "the reader did not block"
            entry_id = leader.client().xadd(key, {"woke": n})
        finally:
            reader.join(25)
        assert not reader.is_alive() and got == [[[key, [(entry_id, {b"woke": b"%d" % n})]]]], (n, got)


def test_what_does_not_fan_out_yet_is_refused_with_its_reason(cluster):
    node = cluster.leader_of(TOPIC)  # (XGROUP is the coordinator's: -MOVED elsewhere)
    client = node.client()
    with pytest.raises(redis.ResponseError, match="only XADD, XREADGROUP, XLEN, XRANGE, XREVRANGE, XREAD, XINFO "
                       "GROUPS / CONSUMERS, TOPIC GROUPS and XGROUP take a topic key"):
        client.xtrim(TOPIC, maxlen=0)
    pipe = client.pipeline(transaction=True)
    pipe.xlen(TOPIC)
    pipe.xgroup_create(TOPIC, "m", id="0")
    refused = pipe.execute(raise_on_error=False)
    assert "a transaction cannot read from other nodes" in str(refused[0])
    assert "a transaction cannot change their groups" in str(refused[1])
