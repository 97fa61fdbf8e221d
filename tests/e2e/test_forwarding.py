"""A 3-node cluster: ``XADD <topic>`` on a multi-partition topic lands on the
node leading ``slot(topic)``, which forwards it to the chosen partition's
leader (cluster/runtime/forwarding.py) and relays the leader's reply."""

from __future__ import annotations

import re
import signal
import time
from contextlib import contextmanager

import pytest
import redis

from cluster.partitioner import partition_for_key
from tests.clusterkit import Cluster, eventually, leased, running
from tests.conftest import RawConn

PARTITIONS = 6
ID = re.compile(rb"^\d+-\d+$")


def _pkey(topic: bytes, n: int) -> bytes:
    return b"%s#%d" % (topic, n)


def _leaders(cluster: Cluster, topic: bytes) -> list:
    """The leader of each partition (partition 0 is placed by the bare name)."""
    return [cluster.leader_of(topic if n == 0 else _pkey(topic, n)) for n in range(PARTITIONS)]


def _create(cluster: Cluster, topic: bytes, *config: str) -> None:
    owner = cluster.leader_of(topic)
    args = ["TOPIC", "CREATE", topic, "PARTITIONS", PARTITIONS]
    if config:
        args += ["CONFIG", *config]
    assert owner.client().execute_command(*args) == b"OK"
    deadline = time.monotonic() + 10
    for n, leader in enumerate(_leaders(cluster, topic)):  # the metadata log reaches them in the background
        while not leader.client().exists(_pkey(topic, n)):
            assert time.monotonic() < deadline, f"the topic did not reach the leader of partition {n}"
            time.sleep(0.05)


def _entries(cluster: Cluster, topic: bytes) -> dict[int, list]:
    """Each partition's entries, read on that partition's leader."""
    return {n: leader.client().xrange(_pkey(topic, n))
            for n, leader in enumerate(_leaders(cluster, topic))}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from running(tmp_path_factory.mktemp("fwd"))


def test_xadd_topic_key_is_forwarded_to_each_partitions_leader(cluster):
    topic = b"orders"
    _create(cluster, topic)
    leaders = _leaders(cluster, topic)
    assert len({leader.port for leader in leaders}) == 3, "the test needs partitions on every node"
    owner = cluster.leader_of(topic)
    client = owner.client()  # a plain client, not a cluster client
    replies = [client.xadd(topic, {"i": i}) for i in range(60)]
    pipe = client.pipeline(transaction=False)
    for i in range(60, 240):
        pipe.xadd(topic, {"i": i})
    replies += pipe.execute()
    assert all(ID.match(r) for r in replies), [r for r in replies if not ID.match(r)][:3]

    entries = _entries(cluster, topic)
    seen: dict[int, tuple[int, bytes]] = {}
    for n, items in entries.items():
        for entry_id, fields in items:
            i = int(fields[b"i"])
            assert i not in seen, f"entry {i} in partitions {seen[i][0]} and {n}"
            seen[i] = (n, entry_id)
    assert sorted(seen) == list(range(240))  # every entry in exactly one partition
    # Each reply is the ID of its own command's entry: replies kept their order.
    assert [seen[i][1] for i in range(240)] == replies
    assert all(len(items) == 40 for items in entries.values())  # round-robin
    assert {leaders[n].port for n, items in entries.items() if items} == set(cluster.ports)
    # Only the leader of slot("orders") takes the topic key; others redirect.
    slot = client.execute_command("CLUSTER", "KEYSLOT", topic)
    other = next(n for n in cluster.nodes if n is not owner)
    with RawConn(other.port) as conn:
        assert conn.request(b"XADD orders * a 1\r\n") == b"-MOVED %d 127.0.0.1:%d\r\n" % (slot, owner.port)


def test_pipelined_forwarded_and_local_xadds_reply_in_order(cluster):
    topic = b"mixed"
    _create(cluster, topic)
    owner = cluster.leader_of(topic)
    leaders = _leaders(cluster, topic)
    local_n = next(n for n in range(1, PARTITIONS) if leaders[n] is owner) if any(
        leaders[n] is owner for n in range(1, PARTITIONS)) else 0
    local_key = next(k for k in (f"plain{i}".encode() for i in range(200)) if cluster.leader_of(k) is owner)
    targets = [topic, local_key, _pkey(topic, local_n)]
    pipe = owner.client().pipeline(transaction=False)
    sent = []
    for i in range(150):
        key = targets[i % 3] if i % 5 else topic
        pipe.xadd(key, {"i": i})
        sent.append(key)
    replies = pipe.execute()
    assert all(ID.match(r) for r in replies)
    by_i = {}
    for items in _entries(cluster, topic).values():
        for entry_id, fields in items:
            by_i[int(fields[b"i"])] = entry_id
    for entry_id, fields in owner.client().xrange(local_key):
        by_i[int(fields[b"i"])] = entry_id
    assert [by_i[i] for i in range(150)] == replies


def test_leader_errors_are_relayed_byte_for_byte(cluster):
    topic = b"strict"
    _create(cluster, topic)
    owner = cluster.leader_of(topic)
    client = owner.client()
    for i in range(PARTITIONS):
        client.xadd(topic, {"i": i})  # every partition has an entry
    smaller = b"-ERR The ID specified in XADD is equal or smaller than the target stream top item\r\n"
    with RawConn(owner.port) as conn:
        cmd = b"XADD strict 1-1 f v\r\n"
        assert conn.request(cmd * PARTITIONS, PARTITIONS) == smaller * PARTITIONS
    # acks=all refused by each partition's leader, with its own text.
    client.execute_command("TOPIC", "ALTER", topic, "CONFIG", "min-insync-replicas", "4")
    try:
        texts = []
        deadline = time.monotonic() + 10
        with RawConn(owner.port) as conn:
            while len(texts) < PARTITIONS:
                reply = conn.request(b"XADD strict * f v\r\n")
                if not reply.startswith(b"-NOTENOUGHREPLICAS"):
                    assert ID.match(reply.split(b"\r\n")[1]), reply  # the change is still on its way
                    assert time.monotonic() < deadline
                    texts.clear()
                    time.sleep(0.05)
                    continue
                texts.append(reply)
        assert sorted(texts) == sorted(
            b"-NOTENOUGHREPLICAS 3 in-sync replica(s) of %s, min-insync-replicas is 4; nothing was written\r\n"
            % (topic if n == 0 else _pkey(topic, n)) for n in range(PARTITIONS))
    finally:
        client.execute_command("TOPIC", "ALTER", topic, "CONFIG", "min-insync-replicas", "1")


def test_keyed_partitioner_and_partition_keys_still_choose_the_partition(cluster):
    topic = b"users"
    _create(cluster, topic, "partition-key-field", "user")
    owner = cluster.leader_of(topic)
    names = [f"user{k}" for k in range(12)]
    pipe = owner.client().pipeline(transaction=False)
    for round_ in range(3):
        for name in names:
            pipe.xadd(topic, {"user": name, "r": round_})
    assert all(ID.match(r) for r in pipe.execute())
    entries = _entries(cluster, topic)
    for n, items in entries.items():
        users = [fields[b"user"].decode() for _, fields in items]
        assert all(partition_for_key(u.encode(), PARTITIONS) == n for u in users), (n, users)
    assert sum(len(items) for items in entries.values()) == 36
    # A partition key is routed by its own slot (-MOVED), never forwarded.
    leaders = _leaders(cluster, topic)
    n = next(n for n in range(1, PARTITIONS) if leaders[n] is not owner)
    with pytest.raises(redis.exceptions.MovedError):
        owner.client().xadd(_pkey(topic, n), {"a": "1"})
    assert ID.match(leaders[n].client().xadd(_pkey(topic, n), {"a": "1"}))


def test_only_xadd_is_forwarded(cluster):
    """Reads of the topic key fan out (tests/e2e/test_cluster_topic_reads.py);
    other commands on it are refused."""
    topic = b"reads"
    _create(cluster, topic)
    owner = cluster.leader_of(topic)
    client = owner.client()
    for i in range(PARTITIONS):
        client.xadd(topic, {"i": i})
    assert client.xlen(topic) == PARTITIONS
    with pytest.raises(redis.ResponseError, match="partitions led by other nodes"):
        client.xtrim(topic, maxlen=0)
    # Inside MULTI a forward cannot wait: refused for partitions led elsewhere.
    pipe = client.pipeline(transaction=True)
    for i in range(PARTITIONS):
        pipe.xadd(topic, {"m": i})
    results = pipe.execute(raise_on_error=False)
    refused = [r for r in results if isinstance(r, redis.ResponseError)]
    assert refused and all("cannot forward" in str(r) for r in refused)
    assert len(refused) < PARTITIONS  # partition 0 is always led here


def test_redis_cluster_client_writes_the_topic_key(cluster):
    from redis.cluster import ClusterNode, RedisCluster

    topic = b"clustered"
    _create(cluster, topic)
    rc = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", cluster.ports[0])], socket_timeout=10)
    try:
        ids = [rc.xadd(topic, {"i": i}) for i in range(30)]
    finally:
        rc.close()
    assert all(ID.match(r) for r in ids)
    entries = _entries(cluster, topic)
    assert sorted(int(f[b"i"]) for items in entries.values() for _, f in items) == list(range(30))


@contextmanager
def _steady_cluster(tmp_path, topic: bytes):
    """``(cluster, the topic key's node, each partition's leader)``: a
    cluster with ``topic`` of PARTITIONS partitions, whose leaderships stay
    where they are (a node back from a pause does not take its shards back)
    and whose forwards end after forward-timeout-ms = 1.5 s; stopped after,
    and no node may have logged a traceback."""
    # (controller-fast-fencing no: a killed leader stays the leader, unreachable,
    # for the session timeout instead of a fraction of a second)
    cluster = Cluster(tmp_path, extra=["--leader-rebalance-delay-ms", "-1", "--forward-timeout-ms", "1500",
                                       "--controller-fast-fencing", "no"])
    try:
        _create(cluster, topic)
        yield cluster, cluster.leader_of(topic), _leaders(cluster, topic)
    finally:
        cluster.stop()
    assert not cluster.unexpected_log_lines(), cluster.unexpected_log_lines()[:5]


def _victim(cluster: Cluster, owner, leaders: list):
    """A node other than the topic key's ``owner`` that leads a partition,
    not the controller's leader when another does: stopped or killed, that
    one would let the owner's lease lapse until another is elected, and the
    owner's XADDs answer its -TRYAGAIN ("lost contact") besides the
    forward's (retried with ``leased`` for when no other node will do)."""
    controller = cluster.controller()
    return min((n for n in cluster.nodes if n is not owner and any(x is n for x in leaders)),
               key=lambda n: n is controller)


def test_unreachable_leader_gives_a_clear_error_and_other_partitions_work(tmp_path):
    topic = b"orders"
    with _steady_cluster(tmp_path, topic) as (cluster, owner, leaders):
        victim = _victim(cluster, owner, leaders)
        victim_id = cluster.nodes.index(victim) + 1
        away = {n for n in range(PARTITIONS) if leaders[n] is victim}
        client = owner.client(socket_timeout=30)
        for i in range(PARTITIONS):
            assert ID.match(client.xadd(topic, {"warm": i}))  # the links to every leader are open

        victim.kill9()
        failed: list[int] = []
        for i in range(2 * PARTITIONS):
            try:
                assert ID.match(leased(lambda: client.xadd(topic, {"i": i})))  # noqa: B023
            except redis.exceptions.TryAgainError as e:  # -TRYAGAIN <the message>
                m = re.fullmatch(rf"partition orders#(\d+) leader node {victim_id} unreachable: "
                                 r"link to 127\.0\.0\.1:\d+: .+; nothing was written", str(e))
                assert m, str(e)
                assert int(m.group(1)) in away
                failed.append(i)
        assert len(failed) == 2 * len(away)  # round-robin: each partition twice
        # Nothing of the refused entries was written: the returning node has none.
        victim.start()
        deadline = time.monotonic() + 15
        while True:
            try:
                stored = [int(f[b"i"]) for items in _entries(cluster, topic).values()
                          for _, f in items if b"i" in f]
                break
            except (redis.RedisError, OSError):
                assert time.monotonic() < deadline
                time.sleep(0.1)
        assert sorted(stored) == sorted(set(range(2 * PARTITIONS)) - set(failed))

        # A leader that stops answering: the forward ends at forward-timeout-ms
        # (not after twice replica-lag-time-max-ms + 2 s: a client may have
        # given up long before), and it may or may not have been written.
        cluster.wait_settled()  # the returned node handed its shards over (it restarted)
        leaders = _leaders(cluster, topic)
        victim = _victim(cluster, owner, leaders)
        victim_id = cluster.nodes.index(victim) + 1
        victim.proc.send_signal(signal.SIGSTOP)
        try:
            started = time.monotonic()
            for i in range(PARTITIONS):
                try:
                    leased(lambda: client.xadd(topic, {"s": i}))  # noqa: B023
                except redis.exceptions.TryAgainError as e:
                    assert re.fullmatch(rf"partition orders#\d+ leader node {victim_id} unreachable: "
                                        r"no reply within forward-timeout-ms \(1500 ms\); "
                                        "it may or may not have been written", str(e)), str(e)
                    break
            else:
                raise AssertionError("no XADD reached the stopped leader")
            assert time.monotonic() - started < 1.5 + 5  # (other partitions' writes included)
        finally:
            victim.proc.send_signal(signal.SIGCONT)


def test_an_idempotent_xadd_on_a_topic_key_is_deduplicated_on_its_producers_partition(cluster):
    """XADD IDMP picks the partition by the producer-id (round-robin would
    send a retry elsewhere), forwarded to its leader like any XADD, which
    drops the retry."""
    topic = b"payments"
    _create(cluster, topic)
    owner = cluster.leader_of(topic).client()
    producers = [f"svc-{i}" for i in range(8)]
    ids = {pid: owner.xadd(topic, {"n": pid}, idmp=(pid, b"req-1")) for pid in producers}
    for pid in producers:
        assert owner.xadd(topic, {"n": "retry"}, idmp=(pid, b"req-1")) == ids[pid]
    entries = _entries(cluster, topic)
    assert sum(len(found) for found in entries.values()) == len(producers)
    placed = {pid: partition_for_key(pid.encode(), PARTITIONS) for pid in producers}
    assert len({_leaders(cluster, topic)[n].port for n in placed.values()}) > 1  # some were forwarded
    for pid, n in placed.items():
        assert ids[pid] in [entry_id for entry_id, _ in entries[n]]


def test_a_forward_to_a_paused_leader_ends_at_its_deadline_and_an_idempotent_retry_lands_once_in_order(tmp_path):
    """Issue 31: a forward to a leader stopped by SIGSTOP ends at
    forward-timeout-ms with -TRYAGAIN; the producer retries the same XADD
    IDMP once the partition has a new leader, then writes on. When the old
    leader wakes, nothing of the timed-out forward is sent again: the
    partition holds each entry once, in the producer's order."""
    topic = b"orders"
    with _steady_cluster(tmp_path, topic) as (cluster, owner, leaders):
        # A producer whose partition (IDMP picks it by producer id) is led by
        # another node, not the controller's leader when another will do
        # (``_victim``: the forward must end at its deadline, not the lease).
        victim = _victim(cluster, owner, leaders)
        pid = next(p for p in (f"svc-{i}" for i in range(100))
                   if leaders[partition_for_key(p.encode(), PARTITIONS)] is victim)
        n = partition_for_key(pid.encode(), PARTITIONS)
        pkey = _pkey(topic, n)
        client = owner.client(socket_timeout=30)
        slot = client.execute_command("CLUSTER", "KEYSLOT", topic if n == 0 else pkey)

        def leader_port() -> int:  # as the forwarding node sees it (the victim cannot answer)
            return next(leader[1] for first, last, leader, *_ in client.execute_command("CLUSTER", "SLOTS")
                        if first <= slot <= last)

        assert ID.match(client.xadd(topic, {"n": 0}, idmp=(pid, b"req-0")))
        victim.proc.send_signal(signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(redis.exceptions.TryAgainError, match=re.escape(
                    "no reply within forward-timeout-ms (1500 ms); it may or may not have been written")):
                client.xadd(topic, {"n": 1}, idmp=(pid, b"req-1"))
            assert time.monotonic() - started < 1.5 + 5
            eventually(lambda: leader_port() != victim.port, what="a new leader of the paused leader's partition")
            # (retried while the leadership settles: IDMP makes every retry safe)
            assert ID.match(eventually(lambda: client.xadd(topic, {"n": 1}, idmp=(pid, b"req-1")),
                                       what="the retry acknowledged"))
            assert ID.match(client.xadd(topic, {"n": 2}, idmp=(pid, b"req-2")))
        finally:
            victim.proc.send_signal(signal.SIGCONT)
        cluster.wait_converged(pkey.decode())
        leader = cluster.node_at(leader_port())
        assert [f[b"n"] for _, f in leader.client().xrange(pkey)] == [b"0", b"1", b"2"]
