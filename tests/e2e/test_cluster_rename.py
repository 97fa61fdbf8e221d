"""RENAME in a cluster (issue 30), through real ``partita`` processes (3
nodes, replication factor 3):

- Redis Cluster's rules: both keys in one slot, else ``-CROSSSLOT`` (also
  when one node leads both slots); a slot led elsewhere, ``-MOVED``;
- on the slot's leader the rename is applied by every follower (their copy
  moves, entries and groups, no data fetched again), also a follower that
  was down then;
- an acknowledged RENAME survives the leader's death: the follower that
  takes over has the new name, the old one is gone;
- a topic of several partitions is renamed when each partition keeps its
  slot range (hash tags), through redis-py's RedisCluster too.
"""

from __future__ import annotations

import signal

import pytest
import redis
from redis.cluster import ClusterNode, RedisCluster

from tests.clusterkit import eventually, leased, partition_lines, running
from tests.e2e.streams_support import Error, RespClient, parse

CROSSSLOT = Error("CROSSSLOT Keys in request don't hash to the same slot")


@pytest.fixture
def cluster(tmp_path):
    yield from running(tmp_path)


def _call(node, *argv):
    with RespClient(node.port) as c:
        return parse(c.call(*argv))


def _fill(client: redis.Redis, key: str) -> list:
    ids = [client.xadd(key, {"i": str(i)}) for i in range(5)]
    client.xgroup_create(key, "g", id="0")
    client.xreadgroup("g", "alice", {key: ">"}, count=2)
    return ids


def _view(client: redis.Redis, key: str) -> tuple:
    return ([i for i, _ in client.xrange(key)], client.xpending(key, "g")["pending"],
            [g["last-delivered-id"] for g in client.xinfo_groups(key)])


def _holds(node, name: str) -> bool:
    """Whether ``node`` keeps a copy of partition ``name`` (INFO replication)."""
    return name in partition_lines(node)


def test_rename_follows_redis_clusters_slot_rules(cluster):
    leader = cluster.leader_of(b"{t}a")
    # Two keys of different slots, both led by one node: still CROSSSLOT.
    slots = {}
    for i in range(2000):
        key = f"k{i}"
        if cluster.leader_of(key.encode()) is leader:
            slots.setdefault(leader.client().cluster("keyslot", key), key)
        if len(slots) == 2:
            break
    a, b = slots.values()
    leader.client().xadd(a, {"f": "v"})
    assert _call(leader, "RENAME", a, b) == CROSSSLOT
    assert _call(leader, "RENAMENX", a, b) == CROSSSLOT
    assert _call(cluster.followers_of(b"{t}a")[0], "RENAME", "{t}a", "x") == CROSSSLOT  # before MOVED, as Redis
    assert leader.client().exists(a) == 1
    # The same slot led elsewhere: MOVED, as for any key.
    follower = cluster.followers_of(b"{t}a")[0]
    moved = _call(follower, "RENAME", "{t}a", "{t}b")
    slot = leader.client().cluster("keyslot", "{t}a")
    assert moved == Error(f"MOVED {slot} 127.0.0.1:{leader.port}")



def test_a_rename_pipelined_after_the_clients_own_writes(cluster):
    """The rename runs after the client's acks=all XADD before it is
    acknowledged (its own writes, as any command on the key); INFO and the
    reads after it see the new name; inside MULTI too."""
    leader = cluster.leader_of(b"{p}a")
    with RespClient(leader.port) as c:
        for argv in (("XADD", "{p}a", "1-0", "f", "v"), ("RENAME", "{p}a", "{p}b"), ("INFO", "replication"),
                     ("XLEN", "{p}b"), ("EXISTS", "{p}a"), ("MULTI",), ("RENAMENX", "{p}b", "{p}c"),
                     ("XLEN", "{p}c"), ("EXEC",)):
            c.send(*argv)
        replies = [parse(c.read_reply()) for _ in range(9)]
    assert replies[0] == b"1-0" and replies[1] == b"OK" and b"# Replication" in replies[2]
    assert replies[3:] == [1, 0, b"OK", b"QUEUED", b"QUEUED", [1, 1]]


def test_a_rename_on_the_leader_is_applied_by_every_follower(cluster):
    leader = cluster.leader_of(b"{t}a")
    client = leader.client()
    _fill(client, "{t}a")
    client.xadd("{t}b", {"old": "b"})  # replaced by the rename
    before = _view(client, "{t}a")
    cluster.wait_converged("{t}a")
    assert client.rename("{t}a", "{t}b") is True
    assert client.exists("{t}a") == 0 and _view(client, "{t}b") == before
    client.xadd("{t}b", {"after": "rename"})
    cluster.wait_converged("{t}b")
    for node in cluster.nodes:
        eventually(lambda node=node: not _holds(node, "{t}a"), what=f"{{t}}a gone from node {node.port}")
    # Every copy is the leader's, byte for byte.
    assert len({cluster.log_bytes(n, "{t}b") for n in cluster.nodes}) == 1
    assert client.renamenx("{t}b", "{t}a") is True and client.renamenx("{t}a", "{t}a") is False
    cluster.wait_converged("{t}a")
    # A follower down during a rename takes it when it comes back.
    down = cluster.followers_of(b"{t}a", but_controller=True)[0]  # (the rename's record needs a controller)
    down.kill9()
    assert leased(lambda: client.rename("{t}a", "{t}c")) is True
    down.start()
    cluster.wait_ready()
    leased(lambda: client.xadd("{t}c", {"after": "restart"}))
    cluster.wait_converged("{t}c")
    assert not _holds(down, "{t}a")
    assert len({cluster.log_bytes(n, "{t}c") for n in cluster.nodes}) == 1


def test_an_acknowledged_rename_survives_the_leaders_death(cluster):
    old = cluster.leader_of(b"{r}src")
    client = old.client()
    _fill(client, "{r}src")
    before = _view(client, "{r}src")
    assert client.rename("{r}src", "{r}dst") is True
    old.kill9()  # at once: nothing but what the reply promised
    new = cluster.taken_over(b"{r}src", old)  # the controller elects an in-sync follower
    moved = new.client()
    assert leased(lambda: moved.exists("{r}src")) == 0
    assert _view(moved, "{r}dst") == before
    assert moved.xreadgroup("g", "bob", {"{r}dst": ">"})[0][1][0][0] == before[0][2]
    old.start()  # back as a follower: it never brings the old name back
    cluster.wait_ready()
    # (once back in the ISR, the old leader takes its preferred shard back)
    cluster.on_leader(b"{r}dst", lambda c: c.xadd("{r}dst", {"after": "failover"}))
    cluster.wait_converged("{r}dst")
    for node in cluster.nodes:
        assert not _holds(node, "{r}src")


def test_a_rename_waits_for_writes_the_replicas_do_not_have_yet(cluster):
    """Another client's acks=all XADD, waiting for a stopped follower: the
    RENAME runs once the entry is acknowledged (the follower leaves the ISR),
    never before, so no write is acknowledged unreplicated under a name
    that went away (the renamed partition's high watermark is its end)."""
    leader = cluster.leader_of(b"{w}src")
    leader.client().xadd("{w}src", {"i": "0"})
    cluster.wait_converged("{w}src")
    # A follower, not the controller's leader: stopped, that would let the
    # leader's lease lapse while its write and the rename wait (-TRYAGAIN).
    stopped = cluster.followers_of(b"{w}src", but_controller=True)[0]
    (live,) = (n for n in cluster.followers_of(b"{w}src") if n is not stopped)
    stopped.proc.send_signal(signal.SIGSTOP)
    try:
        with RespClient(leader.port) as writer, RespClient(leader.port) as renamer:
            writer.send("XADD", "{w}src", "*", "i", "1")
            eventually(lambda: partition_lines(leader)["{w}src"]["end_offset"] == "2", what="the append")
            renamer.send("RENAME", "{w}src", "{w}dst")
            assert parse(writer.read_reply()).startswith(b"")
            # (The renamed partition's line shows once the leader's tick looked at it.)
            line = eventually(lambda: (lambda lines: lines.get("{w}dst") or lines.get("{w}src"))(
                partition_lines(leader)), what="the partition's line")
            assert line["high_watermark"] == line["end_offset"] == "2", line  # acknowledged: replicated
            assert parse(renamer.read_reply()) == b"OK"
    finally:
        stopped.proc.send_signal(signal.SIGCONT)
    # (Retried all the same: a loaded machine can delay a heartbeat past the lease.)
    assert leased(lambda: leader.client().xlen("{w}dst")) == 2
    assert leased(lambda: live.client().execute_command("CLUSTER", "FAILOVER")) == b"OK"
    assert leased(lambda: live.client().xlen("{w}dst")) == 2


def test_a_topic_of_several_partitions_is_renamed_within_its_hash_tag(cluster):
    leader = cluster.leader_of(b"{m}one")
    client = leader.client()
    assert client.execute_command("TOPIC", "CREATE", "{m}one", "PARTITIONS", "3") == b"OK"
    for n in range(3):
        client.xadd(f"{{m}}one#{n}", {"p": str(n)})
    rc = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", cluster.ports[0])], socket_timeout=10)
    try:
        assert rc.rename("{m}one", "{m}two") is True
        assert rc.xlen("{m}two") == 3 and rc.exists("{m}one") == 0
        assert [rc.xrange(f"{{m}}two#{n}")[0][1] for n in range(3)] == [{b"p": b"%d" % n} for n in range(3)]
    finally:
        rc.close()
    for n in range(3):
        cluster.wait_converged(f"{{m}}two#{n}" if n else "{m}two")
