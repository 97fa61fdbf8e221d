"""READONLY on a follower (Redis Cluster's replica reads), on clusters of
three real ``partita`` processes: a READONLY connection reads a partition
this node follows from the follower's committed entries only (below the
high watermark it learnt from its leader); writes and group commands still
get -MOVED to the leader; a node without a copy answers -MOVED as before."""

from __future__ import annotations

import signal
import threading

import pytest
import redis

from tests.clusterkit import Cluster, eventually, leased, partition_lines, running
from tests.conftest import RawConn


@pytest.fixture
def cluster(tmp_path):
    yield from running(tmp_path)


def _readonly(node, **kwargs) -> redis.Redis:
    """A client of ``node`` on one connection that sent READONLY."""
    conn = node.client(single_connection_client=True, **kwargs)
    assert conn.execute_command("READONLY") in (True, b"OK")
    return conn


def _ids(entries) -> list[bytes]:
    return [entry_id for entry_id, _ in entries]


def test_readonly_serves_a_followers_copy_and_moves_writes_and_group_commands(tmp_path):
    """Replication factor 2 of 3 nodes: each key has a leader, a follower and
    a node without a copy."""
    c = Cluster(tmp_path, extra=["--replication-factor", "2"])
    try:
        key = b"fr"
        leader = c.leader_of(key)
        client = leader.client()
        leased(lambda: client.xadd(key, {"a": "1"}, id="1-1"))
        leased(lambda: client.xgroup_create(key, "g", id="0"))
        holders = eventually(lambda: [n for n in c.nodes if n is not leader and "fr" in partition_lines(n)],
                             what="the follower's copy")
        [follower] = holders
        [stranger] = [n for n in c.nodes if n is not leader and n is not follower]
        slot = client.execute_command("CLUSTER", "KEYSLOT", key)
        moved = b"-MOVED %d 127.0.0.1:%d\r\n" % (slot, leader.port)

        for node in (follower, stranger):
            with RawConn(node.port) as conn:
                assert conn.request(b"XRANGE fr - +\r\n") == moved  # without READONLY: the leader's
                assert conn.request(b"READONLY\r\n") == b"+OK\r\n"
                assert b" flags=r " in conn.request(b"CLIENT INFO\r\n")
                if node is stranger:  # no copy here: READONLY changes nothing
                    assert conn.request(b"XRANGE fr - +\r\n") == moved
                    assert conn.request(b"XLEN fr\r\n") == moved
                    continue
                assert eventually(lambda: conn.request(b"XLEN fr\r\n") == b":1\r\n", what="the committed entry")
                assert conn.request(b"XRANGE fr - +\r\n") == b"*1\r\n*2\r\n$3\r\n1-1\r\n*2\r\n$1\r\na\r\n$1\r\n1\r\n"
                for write in (b"XADD fr * a 2\r\n", b"XDEL fr 1-1\r\n", b"XTRIM fr MAXLEN 0\r\n",
                              b"XSETID fr 5-0\r\n", b"XGROUP CREATE fr g2 0\r\n", b"XACK fr g 1-1\r\n",
                              b"XREADGROUP GROUP g c STREAMS fr >\r\n", b"XPENDING fr g\r\n",
                              b"XINFO GROUPS fr\r\n", b"XCLAIM fr g c 0 1-1\r\n", b"DEL fr\r\n"):
                    assert conn.request(write) == moved, write
                assert conn.request(b"READWRITE\r\n") == b"+OK\r\n"
                assert conn.request(b"XRANGE fr - +\r\n") == moved
                assert conn.request(b"READONLY\r\n") == b"+OK\r\n"
                assert conn.request(b"XLEN fr\r\n") == b":1\r\n"
                assert conn.request(b"RESET\r\n") == b"+RESET\r\n"  # RESET: READWRITE again (Redis)
                assert conn.request(b"XLEN fr\r\n") == moved
        assert client.xlen(key) == 1  # nothing written through the follower
        assert client.xpending(key, "g")["pending"] == 0
    finally:
        c.stop()
    assert not c.unexpected_log_lines(), c.unexpected_log_lines()[:5]


def test_an_entry_is_read_on_a_follower_only_once_its_high_watermark_passes_it(cluster):
    """acks=1 and min-insync-replicas 3: with one follower stopped, the
    leader appends, the other follower fetches the entry, and the high
    watermark cannot pass it (the stopped follower does not have it, and
    once out of the ISR the ISR is too small). Every READONLY read of that
    follower leaves it out, a blocked XREAD waits; resumed, the stopped
    follower catches up, the high watermark moves, and the blocked reader
    gets the entry."""
    key = b"held"
    leader = cluster.leader_of(key)
    client = leader.client()
    leased(lambda: client.execute_command("TOPIC", "CREATE", key, "CONFIG", "acks", "1",
                                          "min-insync-replicas", "3"))
    leased(lambda: client.xadd(key, {"n": "1"}, id="1-1"))
    cluster.wait_converged("held")
    reader, stopped = cluster.followers_of(key)
    ro = _readonly(reader)
    first = [(b"1-1", {b"n": b"1"})]
    assert ro.xrange(key) == first
    blocked_reply: list = []
    stopped.proc.send_signal(signal.SIGSTOP)
    try:
        leased(lambda: client.xadd(key, {"n": "2"}, id="2-1"))  # acks=1: replied at once
        eventually(lambda: partition_lines(reader)["held"]["end_offset"] == "2", what="the follower fetching 2-1")
        assert partition_lines(reader)["held"]["high_watermark"] == "1"
        assert leased(lambda: client.xlen(key)) == 2  # (a leader's count includes what is above its high watermark)
        assert ro.xrange(key) == first
        assert ro.xrevrange(key) == first
        assert ro.xrange(key, "2-0", "+") == []
        assert ro.xlen(key) == 1
        assert ro.xread({key: "0-0"}) == [[key, first]]
        assert ro.xread({key: "1-1"}) == []
        assert ro.xread({key: "+"}) == [[key, first]]  # (the last committed entry)
        info = ro.xinfo_stream(key)
        assert (info["length"], info["last-generated-id"], info["entries-added"]) == (1, b"1-1", 1)
        assert info["first-entry"] == info["last-entry"] == first[0]
        full = ro.xinfo_stream(key, full=True)
        assert full["entries"] == dict(first) and full["length"] == 1

        def block() -> None:
            blocked = _readonly(reader, socket_timeout=60)
            blocked.client_setname("blocked")
            blocked_reply.append(blocked.xread({key: "1-1"}, block=0))

        thread = threading.Thread(target=block, daemon=True)
        thread.start()
        eventually(lambda: any(c["name"] == "blocked" and "b" in c["flags"] for c in reader.client().client_list()),
                   what="the reader blocked")
        assert partition_lines(reader)["held"]["high_watermark"] == "1"
        assert not blocked_reply
    finally:
        stopped.proc.send_signal(signal.SIGCONT)
    thread.join(30)
    assert blocked_reply == [[[key, [(b"2-1", {b"n": b"2"})]]]]
    assert int(partition_lines(reader)["held"]["high_watermark"]) == 2
    assert ro.xrange(key) == first + [(b"2-1", {b"n": b"2"})]
    assert ro.xlen(key) == 2


def _calls(node, command: str) -> int:
    """How many times ``node`` ran ``command`` (INFO commandstats)."""
    stats = node.client().info("commandstats").get(f"cmdstat_{command}")
    return int(stats["calls"]) if stats else 0


def test_redis_py_cluster_reading_from_replicas_reads_from_the_followers(cluster):
    """redis-py's replica reads (``load_balancing_strategy``, which replaced
    ``read_from_replicas``) send READONLY on every connection and spread a
    slot's reads over the nodes CLUSTER SLOTS lists for it, the leader and
    its followers (replicas): the followers answer from their committed
    entries, a fetch round behind at most, so each read eventually shows
    what the leader holds; writes and group commands still reach the
    leader."""
    from redis.cluster import ClusterNode, LoadBalancingStrategy, RedisCluster

    cluster.wait_leading()
    rc = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", cluster.ports[0])],
                      load_balancing_strategy=LoadBalancingStrategy.ROUND_ROBIN, socket_timeout=10)
    try:
        assert sorted(n.port for n in rc.get_primaries()) == sorted(cluster.ports)
        keys = [f"replicated-{i}" for i in range(12)]
        before = {node.port: _calls(node, "xadd") for node in cluster.nodes}

        def expected_of(k):
            return cluster.leader_of(k if isinstance(k, bytes) else k.encode()).client().xrange(k)

        for k in keys:
            leased(lambda: rc.xadd(k, {"v": k}, id="1-1"))
            leased(lambda: rc.xadd(k, {"v": "second"}, id="2-1"))
        assert leased(lambda: rc.xgroup_create(keys[0], "g", id="0")) is True
        for k in keys:
            expected = expected_of(k)
            assert _ids(expected) == [b"1-1", b"2-1"]
            for _ in range(3):  # round robin: the leader and both followers
                eventually(lambda: rc.xrange(k) == expected, what=f"XRANGE {k}")
            eventually(lambda: rc.xrevrange(k) == expected[::-1], what=f"XREVRANGE {k}")
            eventually(lambda: rc.xlen(k) == 2, what=f"XLEN {k}")
            eventually(lambda: rc.xread({k: "1-1"}) == [[k.encode(), expected[1:]]], what=f"XREAD {k}")
            assert rc.xinfo_stream(k)["length"] == 2
        assert rc.xreadgroup("g", "c", {keys[0]: ">"})[0][1] == expected_of(keys[0])
        assert rc.xpending(keys[0], "g")["pending"] == 2
        for node in cluster.nodes:  # writes only on the leaders
            led = [k for k in keys if cluster.leader_of(k.encode()) is node]
            assert _calls(node, "xadd") - before[node.port] == 2 * len(led), node.port
        key = keys[0].encode()
        followers = cluster.followers_of(key)
        served = {node.port: _calls(node, "xrange") for node in followers}
        for _ in range(6):  # only this key read now: its followers serve some of it
            eventually(lambda: rc.xrange(key) == expected_of(key), what="XRANGE of the first key")
        assert all(_calls(node, "xrange") > served[node.port] for node in followers), served
        for k in keys:  # every follower's copy holds the same, once committed there
            for follower in cluster.followers_of(k.encode()):
                ro = _readonly(follower)
                assert eventually(lambda: ro.xrange(k) == rc.xrange(k), what=f"{k} on node {follower.port}")
                ro.close()
    finally:
        rc.close()


def test_a_restarted_follower_serves_no_read_before_its_leader_says_what_is_committed(cluster):
    """A follower restarted holding an entry above the high watermark opens
    its log with the high watermark at the log's end: until a fetch reply
    of its leader sets it, a READONLY read gets -MOVED (here the leader is
    stopped, so no fetch can come), never the uncommitted entry."""
    key = b"restarted"
    leader = cluster.leader_of(key)
    client = leader.client()
    leased(lambda: client.execute_command("TOPIC", "CREATE", key, "CONFIG", "acks", "1",
                                          "min-insync-replicas", "3"))
    leased(lambda: client.xadd(key, {"n": "1"}, id="1-1"))
    cluster.wait_converged("restarted")
    reader, stopped = cluster.followers_of(key)
    stopped.proc.send_signal(signal.SIGSTOP)
    try:
        leased(lambda: client.xadd(key, {"n": "2"}, id="2-1"))  # acks=1: held above the high watermark
        eventually(lambda: partition_lines(reader)["restarted"]["end_offset"] == "2", what="the follower's fetch")
        with RawConn(reader.port) as conn:
            assert conn.request(b"READONLY\r\n") == b"+OK\r\n"
            assert conn.request(b"XLEN restarted\r\n") == b":1\r\n"
        reader.stop()
        leader.proc.send_signal(signal.SIGSTOP)
        try:
            reader.start()
            with RawConn(reader.port) as conn:
                assert conn.request(b"READONLY\r\n") == b"+OK\r\n"
                assert conn.request(b"XLEN restarted\r\n").startswith(b"-MOVED ")
                assert conn.request(b"XRANGE restarted - +\r\n").startswith(b"-MOVED ")
        finally:
            leader.proc.send_signal(signal.SIGCONT)
    finally:
        stopped.proc.send_signal(signal.SIGCONT)
    cluster.wait_settled()
    ro = _readonly(reader)
    expected = leased(lambda: cluster.leader_of(key).client().xrange(key))
    assert _ids(expected) == [b"1-1", b"2-1"]
    assert eventually(lambda: ro.xrange(key) == expected, what="the restarted follower's committed view")
