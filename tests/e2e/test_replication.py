"""A 3-node cluster of real ``partita`` processes on loopback: acks, ISR,
-MOVED, WAIT, manual failover, a follower killed and restarted."""

from __future__ import annotations

import re
import signal
import threading
import time

import pytest
import redis

from tests.clusterkit import LAG_MS, Cluster, eventually, leased as _leased, partition_lines as _partition_lines, running
from tests.conftest import RawConn

@pytest.fixture
def cluster(tmp_path):
    yield from running(tmp_path)


def test_writes_to_a_follower_are_moved_to_the_leader(cluster):
    key = b"orders"
    leader = cluster.leader_of(key)
    slot = leader.client().execute_command("CLUSTER", "KEYSLOT", key)
    for follower in cluster.followers_of(key):
        with RawConn(follower.port) as conn:
            assert conn.request(b"XADD orders * a 1\r\n") == b"-MOVED %d 127.0.0.1:%d\r\n" % (slot, leader.port)
            assert conn.request(b"XRANGE orders - +\r\n").startswith(b"-MOVED %d " % slot)
    assert leader.client().xadd(key, {"a": "1"})


def test_redis_cluster_client_finds_every_leader(cluster):
    from redis.cluster import ClusterNode, RedisCluster

    rc = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", cluster.ports[0])], socket_timeout=10)
    keys = [f"stream-{i}" for i in range(30)]
    for k in keys:
        rc.xadd(k, {"v": k})
    for k in keys:
        assert rc.xrange(k)[0][1] == {b"v": k.encode()}
    assert {cluster.leader_of(k.encode()).port for k in keys} == set(cluster.ports)
    rc.close()


def test_info_replication_lists_the_followers_of_what_a_node_leads_as_redis_tools_read_them(cluster):
    key = b"followed"
    leader = cluster.leader_of(key)
    for i in range(5):
        leader.client().xadd(key, {"i": i})  # acks=all: every follower has fetched them
    info = leader.client().info("replication")  # redis-py's own parser of slaveN lines
    assert info["role"] == "master" and info["connected_slaves"] == 2
    followers = sorted((info[f"slave{i}"] for i in range(2)), key=lambda f: f["port"])
    assert [f["port"] for f in followers] == sorted(n.port for n in cluster.followers_of(key))
    for f in followers:
        assert f["ip"] == "127.0.0.1" and f["state"] == "online" and f["offset"] >= 5 and f["lag"] >= 0


def test_acks_all_entries_are_on_every_isr_replica_when_acknowledged(cluster):
    key = b"acked"
    leader = cluster.leader_of(key)
    client = leader.client()
    for round_ in range(10):
        pipe = client.pipeline(transaction=False)
        for i in range(20):
            pipe.xadd(key, {"r": round_, "i": i})
        pipe.execute()
        acked = 20 * (round_ + 1)
        # Acknowledged means on every ISR replica (all three are in sync here).
        for follower in cluster.followers_of(key):
            line = _partition_lines(follower)["acked"]
            assert int(line["end_offset"]) >= acked, (round_, line)
    assert _partition_lines(leader)["acked"]["isr"] == "1/2/3"


@pytest.mark.parametrize("policy", ["everysec", "always"])
def test_a_follower_syncs_what_it_fetched_by_its_fsync_policy(tmp_path, policy):
    """A follower's copy reaches the disk as the leader's does (within a
    second under everysec, a group-commit round under always): its
    recovery point follows, so a restart CRC-checks only what came after
    it, and a power loss takes no more than the policy allows. (The
    checkpoint file is written at most once a second per log, after a
    sync, so it may trail the last entries until the next write; before,
    a follower wrote none at all while running.)"""
    from storage.log_manager import encode_topic

    c = Cluster(tmp_path, extra=["--fsync", policy])
    try:
        key = b"synced"
        client = c.leader_of(key).client()
        pipe = client.pipeline(transaction=False)
        for i in range(300):
            pipe.xadd(key, {"n": i})
        pipe.execute()
        c.wait_converged(key.decode())
        deadline = time.monotonic() + 5
        for node in c.followers_of(key):
            checkpoint = node.data_dir / "topics" / encode_topic(key) / "partition-0" / "recovery-point.checkpoint"
            while not (checkpoint.exists() and 0 < int(checkpoint.read_text().split()[-1]) <= 300):
                assert time.monotonic() < deadline, f"{node.data_dir.name}: recovery point not moved"
                time.sleep(0.05)
    finally:
        c.stop()
    assert not c.unexpected_log_lines(), c.unexpected_log_lines()[:5]


def test_acks_all_with_fsync_always_waits_for_both(tmp_path):
    """A batch handed over for the fsync round and the ISR (two waits on one
    held reply, Connection._hold) is answered once both are done, in order,
    across clients writing at once."""
    c = Cluster(tmp_path, extra=["--fsync", "always"])
    try:
        key = b"both"
        leader = c.leader_of(key)
        errors = []

        def producer(i):
            try:
                client = leader.client()
                for round_ in range(10):
                    pipe = client.pipeline(transaction=False)
                    for j in range(16):
                        pipe.xadd(key, {"p": i, "r": round_, "j": j})
                    ids = [tuple(map(int, i.split(b"-"))) for i in pipe.execute()]
                    assert ids == sorted(ids) and len(set(ids)) == 16
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=producer, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        # Acknowledged means fsynced here and on every ISR replica.
        for follower in c.followers_of(key):
            assert int(_partition_lines(follower)["both"]["end_offset"]) == 640
        info = leader.client().info("all")
        assert info["partita_group_commits"] > 0 and info["partita_fsync_policy"] == "always"
    finally:
        c.stop()
    assert not c.unexpected_log_lines(), c.unexpected_log_lines()[:5]


def test_pipelined_xadd_runs_on_a_leader_are_replicated_and_refused_on_a_follower(cluster):
    """Runs of ``XADD key * f v`` taken from the received bytes
    (server/_xaddrun.c) pass the same routing and acks=all wait as single
    XADDs: on the leader they are on every ISR replica when acknowledged; on
    a follower each one gets the -MOVED the general path gives."""
    key = b"runs"
    leader = cluster.leader_of(key)
    client = leader.client()
    client.xadd(key, {"f": "first"})  # the key exists: later pipelines may run
    one = b"*5\r\n$4\r\nXADD\r\n$4\r\nruns\r\n$1\r\n*\r\n$1\r\nf\r\n$1\r\nv\r\n"
    with RawConn(leader.port) as conn:
        for _ in range(5):
            raw = conn.request(one * 50, replies=50)
            assert re.fullmatch(rb"(\$\d+\r\n\d+-\d+\r\n){50}", raw), raw[:200]
    # Acknowledged means on every ISR replica (acks=all, the default).
    for follower in cluster.followers_of(key):
        assert int(_partition_lines(follower)["runs"]["end_offset"]) >= 251
    info = client.info("partita")
    assert info["xadd_pipelined_calls"] > 0, info
    slot = client.execute_command("CLUSTER", "KEYSLOT", key)
    for follower in cluster.followers_of(key):
        with RawConn(follower.port) as conn:
            raw = conn.request(one * 3, replies=3)
            assert raw == b"-MOVED %d 127.0.0.1:%d\r\n" % (slot, leader.port) * 3
    assert client.xlen(key) == 251


def test_an_acks_all_write_is_never_acknowledged_once_the_isr_falls_below_the_minimum(cluster):
    """Accepted with three replicas in sync, its reply waits for all three;
    one stops fetching and leaves the ISR: the client is closed without a
    reply (Replication.when_acked, failed on the tick)."""
    key = b"shrinks"
    leader = cluster.leader_of(key)
    client = leader.client()
    client.xadd(key, {"a": "0"})
    client.execute_command("TOPIC", "ALTER", key, "CONFIG", "min-insync-replicas", "3")
    stopped = cluster.followers_of(key, but_controller=True)[0]  # (its ISR change needs no election)
    stopped.proc.send_signal(signal.SIGSTOP)
    try:
        with RawConn(leader.port, timeout_s=LAG_MS / 1000 + 10) as conn:
            started = time.monotonic()
            conn.sock.sendall(b"XADD shrinks * a 1\r\n")
            assert conn.sock.recv(100) == b""  # closed, nothing acknowledged
            assert time.monotonic() - started >= LAG_MS / 1000 * 0.9
        assert len(_partition_lines(leader)["shrinks"]["isr"].split("/")) == 2
        with pytest.raises(redis.ResponseError, match="NOTENOUGHREPLICAS"):
            _leased(lambda: client.xadd(key, {"a": "refused"}))
    finally:
        stopped.proc.send_signal(signal.SIGCONT)


def test_stopped_follower_leaves_the_isr_then_catches_up_and_rejoins(cluster):
    key = b"paused"
    leader = cluster.leader_of(key)
    client = leader.client()
    client.xadd(key, {"a": "0"})
    stopped = cluster.followers_of(key, but_controller=True)[0]  # (its ISR change needs no election)
    stopped.proc.send_signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        _leased(lambda: client.xadd(key, {"a": "1"}))  # acks=all waits until the stopped follower leaves the ISR
        assert time.monotonic() - started < LAG_MS / 1000 + 3
        isr = _partition_lines(leader)["paused"]["isr"]
        assert len(isr.split("/")) == 2
        _leased(lambda: client.execute_command("TOPIC", "ALTER", key, "CONFIG", "min-insync-replicas", "3"))
        with pytest.raises(redis.ResponseError, match="NOTENOUGHREPLICAS 2 in-sync replica"):
            _leased(lambda: client.xadd(key, {"a": "refused"}))
        _leased(lambda: client.execute_command("TOPIC", "ALTER", key, "CONFIG", "min-insync-replicas", "2"))
        for i in range(50):
            _leased(lambda: client.xadd(key, {"a": f"more{i}"}))
    finally:
        stopped.proc.send_signal(signal.SIGCONT)
    deadline = time.monotonic() + 10
    while _partition_lines(leader)["paused"]["isr"] != "1/2/3":
        assert time.monotonic() < deadline, _partition_lines(leader)
        time.sleep(0.05)
    cluster.wait_converged("paused")
    assert _leased(lambda: client.xlen(key)) == 52  # the refused entry was never written
    logs = {cluster.log_bytes(n, "paused") for n in cluster.nodes}
    assert len(logs) == 1  # byte-identical on all replicas


def test_wait_counts_replicas_holding_the_clients_writes(cluster):
    key = b"waited"
    leader = cluster.leader_of(key)
    client = leader.client()
    client.execute_command("TOPIC", "CREATE", key, "CONFIG", "acks", "1")
    client.xadd(key, {"a": "1"})
    assert client.execute_command("WAIT", 2, 5000) == 2
    stopped = cluster.followers_of(key, but_controller=True)[0]
    stopped.proc.send_signal(signal.SIGSTOP)
    try:
        client.xadd(key, {"a": "2"})  # acks=1: replies at once
        started = time.monotonic()
        assert client.execute_command("WAIT", 2, 300) == 1
        assert time.monotonic() - started >= 0.25
    finally:
        stopped.proc.send_signal(signal.SIGCONT)
    assert client.execute_command("WAIT", 2, 5000) == 2


def test_manual_failover_loses_no_acknowledged_entry(cluster):
    key = b"moving"
    old = cluster.leader_of(key)
    acked: list[bytes] = []
    stop = threading.Event()
    errors: list[str] = []

    def produce() -> None:
        from redis.cluster import ClusterNode, RedisCluster

        rc = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", p) for p in cluster.ports],
                          socket_timeout=10)
        i = 0
        while not stop.is_set():
            try:
                acked.append(rc.xadd(key, {"i": str(i)}))
            except (redis.RedisError, OSError) as e:  # unacknowledged: may or may not be stored
                errors.append(repr(e))
                time.sleep(0.05)
            i += 1
        rc.close()

    thread = threading.Thread(target=produce)
    thread.start()
    try:
        # Writes acknowledged before the failover and after it (counted, not
        # waited for by time: a loaded machine may acknowledge few in a second).
        eventually(lambda: len(acked) >= 10, what="writes acknowledged before the failover")
        new = cluster.followers_of(key)[0]
        assert new.client().execute_command("CLUSTER", "FAILOVER") == b"OK"
        before = len(acked)
        eventually(lambda: len(acked) >= before + 11, what="writes acknowledged after the failover")
    finally:
        stop.set()
        thread.join(30)
    assert cluster.leader_of(key) is new and new is not old
    assert len(acked) > 20
    cluster.wait_converged("moving")
    stored = [entry_id for entry_id, _ in new.client().xrange(key)]
    assert len(stored) == len(set(stored))
    missing = set(acked) - set(stored)
    assert not missing, (len(missing), errors[:5])
    positions = [stored.index(a) for a in acked]
    assert positions == sorted(positions)  # in the order they were acknowledged
    assert len({cluster.log_bytes(n, "moving") for n in cluster.nodes}) == 1


def test_follower_killed_mid_write_truncates_and_converges(cluster):
    key = b"crashy"
    leader = cluster.leader_of(key)
    client = leader.client()
    # (Not the controller's leader: this is about a follower, and the writes
    # below are not retried while a new controller is elected.)
    victim = cluster.followers_of(key, but_controller=True)[0]
    for i in range(100):
        client.xadd(key, {"i": str(i)})
    victim.kill9()
    for i in range(100, 200):
        client.xadd(key, {"i": str(i)})  # the ISR drops the dead follower, writes go on
    victim.start()
    for i in range(200, 220):
        client.xadd(key, {"i": str(i)})
    cluster.wait_converged("crashy")
    assert client.xlen(key) == 220
    assert len({cluster.log_bytes(n, "crashy") for n in cluster.nodes}) == 1


def test_multi_partition_topic_is_known_by_every_partition_leader(cluster):
    owner = cluster.leader_of(b"events")
    assert owner.client().execute_command("TOPIC", "CREATE", "events", "PARTITIONS", "6") == b"OK"
    from redis.cluster import ClusterNode, RedisCluster

    keys = [f"events#{n}".encode() for n in range(6)]
    rc = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", cluster.ports[0])], socket_timeout=10)
    deadline = time.monotonic() + 10
    for key in keys:  # each partition is written on its own leader (events#0 is placed by "events")
        while True:
            try:
                rc.xadd(key, {"k": key})
                break
            except redis.ResponseError as e:  # the topic has not reached that node yet
                assert time.monotonic() < deadline, e
                time.sleep(0.05)
    assert [len(rc.xrange(key)) for key in keys] == [1] * 6
    rc.close()
    assert len({cluster.leader_of(k).port for k in keys[1:]}) > 1
    assert len(owner.client().xrange("events")) == 6  # read from every partition's leader
    with pytest.raises(redis.ResponseError, match="partitions led by other nodes"):
        owner.client().xtrim("events", maxlen=0)  # (XINFO GROUPS asks the leaders now: XTRIM does not)
    assert owner.client().execute_command("TOPIC", "DELETE", "events") == b"OK"
    deadline = time.monotonic() + 10
    while any(b"events" in n.client().execute_command("TOPIC", "LIST") for n in cluster.nodes):
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_consumer_group_state_survives_a_leader_change(cluster):
    key = b"jobs"
    old = cluster.leader_of(key)
    client = old.client()
    for i in range(30):
        client.xadd(key, {"i": str(i)})
    client.xgroup_create(key, "workers", id="0")
    got = client.xreadgroup("workers", "w1", {key: ">"}, count=20)[0][1]
    client.xack(key, "workers", *[entry_id for entry_id, _ in got[:12]])
    first = client.xrange(key, count=1)[0][0]
    client.xdel(key, first)
    before = (client.xpending(key, "workers"), client.xinfo_groups(key), client.xlen(key))
    new = cluster.followers_of(key)[0]
    deadline = time.monotonic() + 10
    while True:  # group changes reach followers within a fetch round
        assert new.client().execute_command("CLUSTER", "FAILOVER") == b"OK"
        if cluster.leader_of(key) is new:
            break
        assert time.monotonic() < deadline
    moved = new.client()
    after = (moved.xpending(key, "workers"), moved.xinfo_groups(key), moved.xlen(key))
    assert after[0] == before[0] and after[2] == before[2] == 29
    for a, b in zip(after[1], before[1]):
        assert {k: v for k, v in a.items() if k != "lag"} == {k: v for k, v in b.items() if k != "lag"}
    rest = moved.xreadgroup("workers", "w1", {key: ">"}, count=100)[0][1]
    assert len(rest) == 10  # delivery resumes where the old leader stopped


def test_group_writes_wake_the_followers_fetches_instead_of_waiting_out_their_long_poll(tmp_path):
    """An acks=all group write (XGROUP, XREADGROUP, XACK, XCLAIM, XNACK)
    replies once every in-sync follower applied the group journal. The
    followers' held fetches must wake for the journal's new records, as they
    do for an XADD's entries, not carry them after replica-fetch-wait-max-ms:
    each group command in a replicated cluster took that long (500 ms by
    default; redis-py's test_xpending_range_idle saw an entry 1 s idle)."""
    long_poll_s = 30
    c = Cluster(tmp_path, extra=["--replica-fetch-wait-max-ms", str(long_poll_s * 1000)])
    try:
        key = b"jobs"
        client = c.leader_of(key).client(socket_timeout=2 * long_poll_s)
        ids = [client.xadd(key, {"n": i}) for i in range(4)]  # entries wake the fetches: quick
        writes = [
            ("XGROUP CREATE", lambda: client.xgroup_create(key, "g", id="0"), True),
            ("XREADGROUP", lambda: len(client.xreadgroup("g", "c1", {key: ">"}, count=3)[0][1]), 3),
            ("XACK", lambda: client.xack(key, "g", ids[0]), 1),
            ("XCLAIM", lambda: client.xclaim(key, "g", "c2", 0, [ids[1]], justid=True), [ids[1]]),
            ("XNACK", lambda: client.xnack(key, "g", "SILENT", ids[2]), 1),
            ("XGROUP DESTROY", lambda: client.xgroup_destroy(key, "g"), 1),
        ]
        for name, write, expected in writes:
            started = time.monotonic()
            assert write() == expected, name
            took_s = time.monotonic() - started
            assert took_s < long_poll_s / 2, f"{name} took {took_s:.1f}s: it waited out a follower's long poll"
    finally:
        c.stop()
    assert not c.unexpected_log_lines(), c.unexpected_log_lines()[:5]


def test_a_consumer_reads_and_acks_six_partitions_at_the_speed_of_appends(tmp_path):
    """Issue 31: on a 3-node cluster (replication factor 3, acks=all) a
    consumer's XREADGROUP and XACK (and XAUTOCLAIM, XGROUP SETID / DESTROY)
    of every partition of a 6-partition topic answer after the followers' next round trip, not after a long poll:
    with replica-fetch-wait-max-ms at 30 s, a group write that does not wake
    the followers' held fetches blocks its client far past the bound here."""
    long_poll_s = 30
    c = Cluster(tmp_path, extra=["--replica-fetch-wait-max-ms", str(long_poll_s * 1000)])
    try:
        topic, partitions = b"jobs", 6
        owner = c.leader_of(topic)
        assert owner.client().execute_command("TOPIC", "CREATE", topic, "PARTITIONS", partitions) == b"OK"
        keys = [b"%s#%d" % (topic, n) for n in range(partitions)]  # (jobs#0 is placed by jobs)
        leaders = [c.leader_of(key) for key in keys]
        assert len({leader.port for leader in leaders}) == 3, "the test needs partitions on every node"
        bound_s = 5.0  # far below the long poll; far above a loaded machine's round trips
        for key, leader in zip(keys, leaders):
            client = leader.client(socket_timeout=bound_s)
            # The metadata log brings the topic to each leader in the background.
            eventually(lambda k=key, cl=client: cl.exists(k), what=f"{key!r} on its leader")
            entry = client.xadd(key, {"k": key})  # entries wake the fetches: quick
            client.xgroup_create(key, "g", id="0")
            # A bounded wait: a client blocked behind a long poll times out here.
            assert client.xreadgroup("g", "c1", {key: ">"}) == [[key, [(entry, {b"k": key})]]], key
            assert client.xack(key, "g", entry) == 1, key
            assert client.xpending(key, "g")["pending"] == 0, key
            second = client.xadd(key, {"k": key})
            assert client.xreadgroup("g", "c1", {key: ">"})[0][1][0][0] == second, key
            assert client.xautoclaim(key, "g", "c2", 0, justid=True) == [second], key
            assert client.xgroup_setid(key, "g", id="0") is True, key
            assert client.xgroup_destroy(key, "g") == 1, key
    finally:
        c.stop()
    assert not c.unexpected_log_lines(), c.unexpected_log_lines()[:5]


def test_blocked_readers_wake_when_the_high_watermark_passes_the_entry(cluster):
    key = b"watched"
    leader = cluster.leader_of(key)
    leader.client().xadd(key, {"a": "0"})
    got: list = []

    def read() -> None:
        client = leader.client()
        client.client_setname("watcher")
        got.append(client.xread({key: "$"}, block=10000))

    thread = threading.Thread(target=read)
    thread.start()
    # ("$" is the last ID when the read arrives: the XADD must come after it blocked.)
    eventually(lambda: any(c["name"] == "watcher" and "b" in c["flags"] for c in leader.client().client_list()),
               what="the reader blocked")
    leader.client().xadd(key, {"a": "1"})
    thread.join(10)
    assert got and got[0][0][1][0][1] == {b"a": b"1"}


def test_the_whole_cluster_restarts_with_its_data(cluster):
    keys = [f"r{i}".encode() for i in range(6)]
    for key in keys:
        leader = cluster.leader_of(key)
        for i in range(20):
            leader.client().xadd(key, {"i": str(i)})
        leader.client().xgroup_create(key, "g", id="0")
        leader.client().xreadgroup("g", "c", {key: ">"}, count=5)
    for key in keys:
        cluster.wait_converged(key.decode())
    for node in cluster.nodes:
        assert node.terminate() == 0
    for node in cluster.nodes:
        node.start()
    # A controller elected and leases live; every node registered with a new
    # incarnation, which may move leaderships (docs/controller.md): settled.
    cluster.wait_settled()
    for key in keys:
        deadline = time.monotonic() + 20
        while True:
            leader = cluster.leader_of(key)
            try:
                assert leader.client().xlen(key) == 20
                assert len(leader.client().xrange(key)) == 20  # readable at once: the HW was checkpointed
                assert leader.client().xpending(key, "g")["pending"] == 5
                break
            except (redis.exceptions.MovedError, redis.exceptions.TryAgainError):
                assert time.monotonic() < deadline  # leadership still moving
                time.sleep(0.2)


@pytest.fixture
def slow_fencing_cluster(tmp_path):
    # controller-fast-fencing no: a killed leader stays the leader (unreachable)
    # for the session timeout, so the forced failover is what moves its shard;
    # with it, the controller fences the node the moment its port refuses and
    # elects a follower itself, and a FORCE racing that is refused when the
    # controller elected another follower (docs/controller.md "Moving leadership").
    yield from running(tmp_path, extra=["--controller-fast-fencing", "no"])


def test_forced_failover_after_a_leader_dies_and_the_old_leader_rejoins(slow_fencing_cluster):
    cluster = slow_fencing_cluster
    key = b"orphan"
    old = cluster.leader_of(key)
    acked = [old.client().xadd(key, {"i": str(i)}) for i in range(50)]  # acks=all: on every replica
    new = cluster.followers_of(key)[0]
    old.kill9()
    assert new.client().execute_command("CLUSTER", "FAILOVER", "FORCE") == b"OK"
    assert cluster.leader_of(key) is new
    client = new.client()
    # The killed node may have been the controller: while another is elected
    # the new leader's lease can lapse (-TRYAGAIN, nothing written).
    acked += [_leased(lambda i=i: client.xadd(key, {"i": str(i)})) for i in range(50, 80)]
    # Back, it serves nothing (-TRYAGAIN, retried here) until its heartbeat
    # is answered and it has applied the controller's metadata that far:
    # then it knows it lost the shard, and never took a write for it.
    old.start()
    with pytest.raises(redis.exceptions.MovedError, match=f"127.0.0.1:{new.port}"):
        _leased(lambda: old.client().xadd(key, {"i": "stale leader"}))
    cluster.wait_converged("orphan")
    stored = [entry_id for entry_id, _ in client.xrange(key)]
    assert stored == acked
    assert len({cluster.log_bytes(n, "orphan") for n in cluster.nodes}) == 1


def test_each_node_lists_only_the_keys_it_leads(cluster):
    keys = [f"k{i}".encode() for i in range(12)]
    for key in keys:
        cluster.leader_of(key).client().xadd(key, {"a": "1"})
    for key in keys:
        cluster.wait_converged(key.decode())
    listed = [sorted(n.client().keys("*")) for n in cluster.nodes]
    assert sorted(k for ks in listed for k in ks) == sorted(keys)  # each key on exactly one node
    assert sum(n.client().dbsize() for n in cluster.nodes) == len(keys)


def test_topic_replication_factor_and_placement_in_describe(cluster, partita_factory):
    owner = cluster.leader_of(b"rf")
    client = owner.client()
    with pytest.raises(redis.ResponseError, match="REPLICATION-FACTOR 2 not possible: every partition has 3"):
        client.execute_command("TOPIC", "CREATE", "rf", "REPLICATION-FACTOR", "2")
    assert client.execute_command("TOPIC", "CREATE", "rf", "PARTITIONS", "2", "REPLICATION-FACTOR", "3",
                                  "CONFIG", "acks", "1") == b"OK"
    def as_map(reply):
        return reply if isinstance(reply, dict) else dict(zip(reply[::2], reply[1::2]))

    desc = as_map(client.execute_command("TOPIC", "DESCRIBE", "rf"))
    assert desc[b"replication-factor"] == 3
    part0 = as_map(desc[b"partition-info"][0])
    assert part0[b"leader"] == cluster.nodes.index(owner) + 1
    assert sorted(part0[b"replicas"]) == [1, 2, 3] and part0[b"isr"] == [1, 2, 3]
    single = partita_factory().client()
    with pytest.raises(redis.ResponseError, match="REPLICATION-FACTOR 3 not possible: every partition has 1"):
        single.execute_command("TOPIC", "CREATE", "t", "REPLICATION-FACTOR", "3")
    assert single.execute_command("TOPIC", "CREATE", "t", "REPLICATION-FACTOR", "1") == b"OK"


def _as_map(reply):
    return reply if isinstance(reply, dict) else dict(zip(reply[::2], reply[1::2]))


def _placement(described: dict) -> tuple:
    """What TOPIC DESCRIBE takes from the controller's committed metadata:
    the same on every node."""
    parts = [_as_map(p) for p in described[b"partition-info"]]
    return (described[b"partitions"], described[b"config"], described[b"overrides"],
            described[b"replication-factor"],
            [(p[b"partition"], p[b"key"], p[b"leader"], p[b"leader-epoch"], p[b"replicas"], p[b"isr"])
             for p in parts])


def test_topic_list_and_describe_answer_for_the_whole_cluster_on_every_node(tmp_path):
    """TOPIC LIST and TOPIC DESCRIBE come from the controller's metadata, the
    same on every node, also on one that leads nothing; KEYS and DBSIZE stay
    per node (Redis Cluster's meaning). With 2 replicas of each shard on 3
    nodes, each node holds a copy of some partitions only: their lengths
    and offsets are this node's figures, nil where it has no copy."""
    cluster = Cluster(tmp_path, extra=["--replication-factor", "2"])
    try:
        by_leader: dict[int, bytes] = {}
        for i in range(500):  # topic names whose slots three different nodes lead
            name = f"t{i}".encode()
            by_leader.setdefault(cluster.leader_of(name).port, name)
            if len(by_leader) == 3:
                break
        names = sorted(by_leader.values())
        for name in names:
            owner = cluster.leader_of(name).client()
            assert _leased(lambda: owner.execute_command("TOPIC", "CREATE", name, "PARTITIONS", "3",
                                                         "CONFIG", "retention-ms", "600000")) == b"OK"
            owner.xadd(name, {"a": "1"})  # partition 0, placed by the name's own slot
        for node in cluster.nodes:
            eventually(lambda: node.client().execute_command("TOPIC", "LIST") == names, what="every topic listed")
            assert node.client().execute_command("TOPIC", "LIST", "t*") == names
        for name in names:
            replicas = _as_map(_as_map(cluster.leader_of(name).client().execute_command(
                "TOPIC", "DESCRIBE", name))[b"partition-info"][0])[b"replicas"]
            cluster.wait_converged_on([cluster.nodes[r - 1] for r in replicas], name.decode())
            described = [_as_map(n.client().execute_command("TOPIC", "DESCRIBE", name)) for n in cluster.nodes]
            assert len({repr(_placement(d)) for d in described}) == 1, [_placement(d) for d in described]
            leader_id = cluster.nodes.index(cluster.leader_of(name)) + 1
            for node_id, d in enumerate(described, 1):
                first = _as_map(d[b"partition-info"][0])
                assert first[b"leader"] == leader_id and first[b"leader-epoch"] == 1
                if node_id in first[b"replicas"]:
                    assert first[b"local-replica"] == (b"leader" if node_id == leader_id else b"follower")
                    assert first[b"length"] == 1 and first[b"log-end-offset"] == 1
                else:
                    assert first[b"local-replica"] == b"none"
                    assert first[b"length"] is None and first[b"log-end-offset"] is None
        # Node 1 takes over every shard it follows; node 3 then leads none,
        # yet lists and describes every topic. KEYS and DBSIZE: its own keys.
        assert cluster.nodes[0].client(socket_timeout=20).execute_command("CLUSTER", "FAILOVER") == b"OK"
        idle = cluster.nodes[2].client()
        eventually(lambda: idle.execute_command("CLUSTER", "SLOTS") and all(
            leader[1] != cluster.nodes[2].port for _, _, leader, *_ in idle.execute_command("CLUSTER", "SLOTS")),
            what="node 3 leading nothing")
        assert idle.execute_command("TOPIC", "LIST") == names
        assert idle.keys("*") == [] and idle.dbsize() == 0
        assert sorted(k for n in cluster.nodes for k in n.client().keys("*")) == names
        for name in names:
            d = _as_map(idle.execute_command("TOPIC", "DESCRIBE", name))
            assert {_as_map(p)[b"leader"] for p in d[b"partition-info"]} <= {1, 2}
    finally:
        cluster.stop()


def test_a_deleted_and_recreated_stream_replicates_as_a_new_topic(cluster):
    key = b"reborn"
    leader = cluster.leader_of(key)
    client = leader.client()
    client.xadd(key, {"life": "1"})
    cluster.wait_converged("reborn")
    assert client.delete(key) == 1
    client.xadd(key, {"life": "2"})  # acks=all: must not wait on the deleted log
    client.xadd(key, {"life": "2b"})
    cluster.wait_converged("reborn")
    assert [f[b"life"] for _, f in client.xrange(key)] == [b"2", b"2b"]
    assert len({cluster.log_bytes(n, "reborn") for n in cluster.nodes}) == 1
    time.sleep(0.3)  # a tick: no checkpoint may be written into the deleted partition
    for node in cluster.nodes:
        assert "disk error" not in node.log() and "Traceback" not in node.log()


def test_config_set_reaches_the_running_replication(tmp_path):
    slow = Cluster(tmp_path, extra=["--replica-lag-time-max-ms", "4000", "--controller-session-timeout-ms", "20000"])
    try:
        key = b"tuned"
        leader = slow.leader_of(key)
        client = leader.client()
        client.xadd(key, {"a": "0"})
        assert client.config_set("replica-lag-time-max-ms", 100)
        assert client.config_get("replica-lag-time-max-ms") == {"replica-lag-time-max-ms": "100"}
        # Not the controller: the ISR change commits without an election.
        stopped = slow.followers_of(key, but_controller=True)[0]
        stopped.proc.send_signal(signal.SIGSTOP)
        try:
            started = time.monotonic()
            client.xadd(key, {"a": "1"})  # the stopped follower leaves the ISR after 100 ms, not 4 s
            assert time.monotonic() - started < 2.0
        finally:
            stopped.proc.send_signal(signal.SIGCONT)
    finally:
        slow.stop()
