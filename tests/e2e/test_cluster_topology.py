"""What a cluster tells stock Redis Cluster clients about itself (issue 30).

A Partita node leads some slot ranges and follows others at once, which
Redis's one-role-per-node topology cannot say. CLUSTER SLOTS once listed
every node as a replica of every other node's ranges (replication factor >=
2); clients that key nodes by address (coredis, redis-py) then saw one
primary and sent fan-out commands (FLUSHALL, SCAN, KEYS) to one node in
three. SHARDS and NODES show each node once, as the master of the ranges it
leads; CLUSTER SLOTS lists the followers as replicas (for replica reads,
tests/e2e/test_follower_reads.py) but mentions every leading node first and
last as a master, which is the role redis-py (first mention) and coredis
(last mention) keep; these tests check the replies and both clients.
"""

from __future__ import annotations

import subprocess

import anyio
import coredis
import pytest
import redis
from redis.cluster import ClusterNode, RedisCluster

from tests.clusterkit import Cluster, leased
from tests.e2e.streams_support import Error, RespClient, parse

KEYS = [f"topo-{i}".encode() for i in range(60)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("topology"))  # 3 nodes, replication factor 3
    c.wait_leading()
    yield c
    c.stop()
    assert not c.unexpected_log_lines(), c.unexpected_log_lines()[:5]


@pytest.fixture
def keys(cluster):
    """Streams whose slots every node leads some of, written on their leaders."""
    for key in KEYS:
        leased(lambda: cluster.leader_of(key).client().xadd(key, {"f": "v"}))
    assert {cluster.leader_of(key).port for key in KEYS} == set(cluster.ports)
    return set(KEYS)


def _raw(port: int, *argv: bytes):
    """A reply as RESP2 gives it (redis-py reshapes CLUSTER SHARDS)."""
    with RespClient(port) as c:
        return parse(c.call(*argv))


def _leader_ranges(cluster) -> dict[int, list[tuple[int, int]]]:
    """Port -> the slot ranges it leads, from INFO replication's shard table."""
    out: dict[int, list[tuple[int, int]]] = {}
    info = cluster.nodes[0].client().info("replication")
    for name, value in info.items():
        if name.startswith("shard") and isinstance(value, dict):
            first, last = (int(x) for x in str(value["slots"]).split("-"))
            out.setdefault(cluster.nodes[int(value["leader"]) - 1].port, []).append((first, last))
    return out


def _merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Slot ranges, adjacent ones joined, in slot order."""
    out: list[list[int]] = []
    for first, last in sorted(ranges):
        if out and out[-1][1] + 1 == first:
            out[-1][1] = last
        else:
            out.append([first, last])
    return [(first, last) for first, last in out]


def test_cluster_slots_lists_followers_as_replicas_and_every_node_as_a_master_first_and_last(cluster):
    expected = _leader_ranges(cluster)
    assert sorted(expected) == sorted(cluster.ports)
    for node in cluster.nodes:
        client = node.client()
        slots = client.execute_command("CLUSTER", "SLOTS")
        by_port: dict[int, list[tuple[int, int]]] = {}
        roles: list[tuple[int, str]] = []  # each node's mentions, in order
        for entry in slots:
            first, last, master, *replicas = entry
            assert not replicas or sorted(r[1] for r in replicas) == sorted(
                p for p in cluster.ports if p != master[1]), entry  # followers are replicas (factor 3)
            by_port.setdefault(master[1], []).append((first, last))
            roles += [(master[1], "master")] + [(r[1], "replica") for r in replicas]
        assert {port: _merged(ranges) for port, ranges in by_port.items()} == \
            {port: _merged(ranges) for port, ranges in expected.items()}
        for port in cluster.ports:  # redis-py keeps a node's first role, coredis its last
            mentions = [role for p, role in roles if p == port]
            assert mentions[0] == mentions[-1] == "master" and "replica" in mentions, (port, mentions)

        seen: dict[int, list[tuple[int, int]]] = {}
        for shard in _raw(node.port, b"CLUSTER", b"SHARDS"):
            shard = dict(zip(shard[0::2], shard[1::2]))
            (described,) = shard[b"nodes"]  # one node per shard: its master
            described = dict(zip(described[0::2], described[1::2]))
            assert described[b"role"] == b"master"
            ranges = shard[b"slots"]
            seen[described[b"port"]] = sorted(zip(ranges[0::2], ranges[1::2]))
        assert seen == {port: sorted(r) for port, r in expected.items()}

        lines = client.execute_command("CLUSTER", "NODES").decode().splitlines()
        assert len(lines) == 3
        for line in lines:
            fields = line.split(" ")
            port = int(fields[1].split("@")[0].split(":")[1])
            assert "master" in fields[2].split(",") and fields[3] == "-", line
            ranges = [tuple(int(x) for x in r.split("-")) for r in fields[8:]]
            assert ranges == sorted(expected[port]), line


def test_redis_py_cluster_sees_every_node_as_a_primary_and_fans_out(cluster, keys):
    rc = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", cluster.ports[1])], socket_timeout=10)
    try:
        assert sorted(n.port for n in rc.get_primaries()) == sorted(cluster.ports)
        assert rc.get_replicas() == []
        assert set(rc.keys(target_nodes=RedisCluster.PRIMARIES)) >= keys
        assert set(rc.scan_iter(match="topo-*")) == keys
        for key in keys:
            assert rc.xlen(key) == 1
        written = [f"py-{i}" for i in range(30)]
        for key in written:  # routed to each key's leader
            rc.xadd(key, {"f": key})
        assert [rc.xrange(key)[0][1] for key in written] == [{b"f": key.encode()} for key in written]
        rc.xadd("{py}a", {"f": "v"})
        assert rc.rename("{py}a", "{py}b") is True and rc.xlen("{py}b") == 1 and rc.exists("{py}a") == 0
        assert rc.flushall() == {f"127.0.0.1:{port}": True for port in cluster.ports}  # one FLUSHALL per node
        for node in cluster.nodes:
            assert node.client().dbsize() == 0
    finally:
        rc.close()


def test_coredis_cluster_sees_every_node_as_a_primary_and_fans_out(cluster, keys):
    written = [f"core-{i}".encode() for i in range(30)]

    async def run() -> None:
        client = coredis.RedisCluster("127.0.0.1", cluster.ports[2], decode_responses=False)
        async with client:
            assert sorted(p.connection_pool.location.port for p in client.primaries) == sorted(cluster.ports)
            assert list(client.replicas) == []
            for key in written:  # routed to each key's leader (else -MOVED, which coredis follows)
                await client.xadd(key, {"f": key})
            found = set()
            async for key in client.scan_iter(match="topo-*"):
                found.add(key)
            assert found == keys
            assert await client.keys("core-*") == set(written)
            for key in written:
                assert [dict(e.field_values) for e in await client.xrange(key)] == [{b"f": key}]
            for key in sorted(keys)[:10]:
                assert await client.xlen(key) == 1

    anyio.run(run, backend="asyncio")
    for node in cluster.nodes:  # each key written on its leader: KEYS of a node lists what it leads
        assert set(node.client().keys("core-*")) == {k for k in written if cluster.leader_of(k) is node}

    async def rename_and_flush() -> None:
        client = coredis.RedisCluster("127.0.0.1", cluster.ports[0], decode_responses=False)
        async with client:
            await client.xadd("{core}a", {"f": "v"})
            assert await client.rename("{core}a", "{core}b") is True
            assert await client.xlen("{core}b") == 1 and await client.exists(["{core}a"]) == 0
            assert await client.flushall() is True

    anyio.run(rename_and_flush, backend="asyncio")
    for node in cluster.nodes:
        assert node.client().dbsize() == 0


def test_a_follower_redirects_what_a_client_sends_it(cluster):
    """Followers are not announced, and still redirect a client that sends
    them a key (a client with an old picture): -MOVED to the leader."""
    key = KEYS[0]
    leader = cluster.leader_of(key)
    for node in cluster.followers_of(key):
        with pytest.raises(redis.exceptions.MovedError):
            node.client().xlen(key)
    assert leader.client().xlen(key) >= 0


def test_keys_no_one_node_leads_get_crossslot_not_a_moved_loop(cluster, keys):
    """A multi-key command whose keys are led by different nodes cannot run
    anywhere: -CROSSSLOT, as Redis answers keys of several slots, not a
    -MOVED to one key's leader that then sends the client back for the other
    (``redis-cli -c`` followed that forever). Keys of several slots that one
    node leads still run there (docs/replication.md)."""
    by_leader: dict[int, list[bytes]] = {}
    for key in KEYS:
        by_leader.setdefault(cluster.leader_of(key).port, []).append(key)
    (port_a, (a, a2, *_)), (_, (b, *_)) = list(by_leader.items())[:2]
    crossslot = Error("CROSSSLOT Keys in request don't hash to the same slot")
    for node in cluster.nodes:
        assert _raw(node.port, b"XREAD", b"STREAMS", a, b, b"0", b"0") == crossslot
        assert _raw(node.port, b"XREADGROUP", b"GROUP", b"g", b"c", b"STREAMS", a, b, b">", b">") == crossslot
        assert _raw(node.port, b"XREAD", b"STREAMS", b, a, b"0", b"0") == crossslot
    out = subprocess.run(["redis-cli", "-c", "-p", str(cluster.ports[0]), "XREAD", "STREAMS", a, b, "0", "0"],
                         capture_output=True, timeout=20, check=True).stdout
    assert out.strip() == b"CROSSSLOT Keys in request don't hash to the same slot"
    both = _raw(port_a, b"XREAD", b"STREAMS", a, a2, b"0", b"0")
    assert [stream[0] for stream in both] == [a, a2]


def test_countkeysinslot_and_getkeysinslot_list_the_keys_a_node_leads(cluster, keys):
    """CLUSTER COUNTKEYSINSLOT / GETKEYSINSLOT as Redis (its errors word for
    word): the keys of a slot on the node leading it, none elsewhere."""
    for key in KEYS[:6]:
        slot = _raw(cluster.ports[0], b"CLUSTER", b"KEYSLOT", key)
        leader = cluster.leader_of(key)
        in_slot = [k for k in KEYS if _raw(leader.port, b"CLUSTER", b"KEYSLOT", k) == slot]
        assert _raw(leader.port, b"CLUSTER", b"COUNTKEYSINSLOT", b"%d" % slot) == len(in_slot)
        assert sorted(_raw(leader.port, b"CLUSTER", b"GETKEYSINSLOT", b"%d" % slot, b"100")) == sorted(in_slot)
        assert _raw(leader.port, b"CLUSTER", b"GETKEYSINSLOT", b"%d" % slot, b"0") == []
        for node in cluster.followers_of(key):
            assert _raw(node.port, b"CLUSTER", b"COUNTKEYSINSLOT", b"%d" % slot) == 0
    port = cluster.ports[0]
    for argv, error in [
        ((b"COUNTKEYSINSLOT", b"-1"), "ERR Invalid slot"),
        ((b"COUNTKEYSINSLOT", b"16384"), "ERR Invalid slot"),
        ((b"COUNTKEYSINSLOT", b"abc"), "ERR value is not an integer or out of range"),
        ((b"COUNTKEYSINSLOT",), "ERR wrong number of arguments for 'cluster|countkeysinslot' command"),
        ((b"GETKEYSINSLOT", b"1", b"-1"), "ERR Invalid slot or number of keys"),
        ((b"GETKEYSINSLOT", b"16384", b"1"), "ERR Invalid slot or number of keys"),
        ((b"GETKEYSINSLOT", b"1", b"abc"), "ERR value is not an integer or out of range"),
        ((b"GETKEYSINSLOT", b"1"), "ERR wrong number of arguments for 'cluster|getkeysinslot' command"),
    ]:
        assert _raw(port, b"CLUSTER", *argv) == Error(error), argv
