"""Consumer groups of a multi-partition topic on a 3-node cluster (issue 31):
XREADGROUP on the topic key runs on its group's coordinator, the leader of
the topic key's slot (other nodes answer ``-MOVED`` to it), which holds the
membership and has each partition led elsewhere served by its leader over
the cluster bus (cluster/broker/topic_groups.py). Two members of a group
get disjoint entries covering the topic, acknowledge them with XACK on the
partition keys, and when one stops reading past the session timeout its
partitions and pending entries pass to the other (delivered first, delivery
count +1). A lone member's replies are compared byte for byte with a single
node's, where they are deterministic (MAXCOUNT / MAXSIZE too). XGROUP on
the topic key runs on the coordinator too: DESTROY and CREATE reset the
membership and delete its stream, CREATECONSUMER / DELCONSUMER / CONFIG
answer as one node (DELCONSUMER hands the member's partitions over first);
RENAME and TOPIC DELETE take the members streams along. When the
coordinator is killed, the slot's next leader goes on with the membership
it kept."""

from __future__ import annotations

import signal
import subprocess
import time
import threading

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.clusterkit import Cluster, eventually, leased, running
from tests.conftest import PartitaProcess, RawConn, wait_for

PARTITIONS = 6
TOPIC = b"events"
SESSION_TIMEOUT_MS = 3000


def _pkey(n: int, topic: bytes = TOPIC) -> bytes:
    return b"%s#%d" % (topic, n)


def _feed(base: int, topic: bytes = TOPIC) -> list[tuple[bytes, bytes, dict]]:
    """``(partition key, ID, fields)``: 4 entries on every partition."""
    return [(_pkey(n, topic), b"%d-%d" % (base + i, n), {"n": n, "i": i})
            for n in range(PARTITIONS) for i in range(4)]


def _create(cluster: Cluster, topic: bytes) -> None:
    """``topic`` of ``PARTITIONS`` partitions, created on its slot's leader."""
    owner = cluster.leader_of(topic)
    assert owner.client().execute_command("TOPIC", "CREATE", topic, "PARTITIONS", PARTITIONS) == b"OK"
    leaders = {cluster.leader_of(topic if n == 0 else _pkey(n, topic)).port for n in range(PARTITIONS)}
    assert len(leaders) > 1, "the test needs partitions led by several nodes"
    for n in range(1, PARTITIONS):
        leader = cluster.leader_of(_pkey(n, topic))
        eventually(lambda: leader.client().exists(_pkey(n, topic)), what=f"{_pkey(n, topic)!r} on its leader")


def _command(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


def _cluster_client(cluster: Cluster):
    from redis.cluster import ClusterNode, RedisCluster

    return RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", cluster.ports[0])], socket_timeout=15)


def _add(rc, feed) -> None:
    for key, entry_id, fields in feed:  # each on its partition's leader (acks=all: committed)
        assert eventually(lambda: rc.xadd(key, fields, id=entry_id), what=f"XADD {key!r}") == entry_id


def _entries(reply) -> set[tuple[bytes, bytes]]:
    """``(partition key, ID)`` of every entry of an XREADGROUP reply (redis-py's RESP2 shape)."""
    return {(key, entry_id) for key, entries in (reply or []) for entry_id, _ in entries}


def _cli(port: int, *args: str, cluster_mode: bool = False) -> str:
    return subprocess.run(["redis-cli", *(["-c"] if cluster_mode else []), "-p", str(port), *args],
                          capture_output=True, text=True, timeout=30, check=True).stdout


def _members_streams(cluster: Cluster, topic: bytes) -> list:
    return cluster.nodes[0].client().execute_command("TOPIC", "LIST", b"__topic_members{%s}*" % topic)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    for c in running(tmp_path_factory.mktemp("groups"), extra=["--group-session-timeout-ms",
                                                               str(SESSION_TIMEOUT_MS)]):
        _create(c, TOPIC)
        rc = _cluster_client(c)
        try:
            _add(rc, _feed(1000))
        finally:
            rc.close()
        yield c


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    server = PartitaProcess(tmp_path_factory.mktemp("single") / "data").start()
    client = server.client()
    assert client.execute_command("TOPIC", "CREATE", TOPIC, "PARTITIONS", PARTITIONS) == b"OK"
    for key, entry_id, fields in _feed(1000):
        assert client.xadd(key, fields, id=entry_id) == entry_id
    yield server
    server.stop()


SOLO_READS = [  # one member alone: every partition is its own, in partition order
    (b"XREADGROUP", b"GROUP", b"solo", b"c", b"COUNT", b"2", b"STREAMS", TOPIC, b">"),
    (b"XREADGROUP", b"GROUP", b"solo", b"c", b"STREAMS", TOPIC, b">"),
    (b"XREADGROUP", b"GROUP", b"solo", b"c", b"STREAMS", TOPIC, b">"),  # nothing new: nil
    (b"XREADGROUP", b"GROUP", b"solo", b"c", b"COUNT", b"1", b"STREAMS", TOPIC, b"0"),  # its history
    (b"XREADGROUP", b"GROUP", b"solo", b"c", b"STREAMS", TOPIC, b"1002-0"),
    (b"XREADGROUP", b"GROUP", b"solo", b"other", b"STREAMS", TOPIC, b"0"),  # no history: the topic key, empty
    (b"XREADGROUP", b"GROUP", b"solo", b"c", b"BLOCK", b"50", b"STREAMS", TOPIC, b">"),  # times out: nil
    (b"XREADGROUP", b"GROUP", b"nope", b"c", b"STREAMS", TOPIC, b">"),  # NOGROUP
]


@pytest.mark.parametrize("protocol", [2, 3])
def test_a_lone_member_reads_as_on_one_node(single, cluster, protocol):
    """A member alone in its group owns every partition: the coordinator's
    replies (its partitions and those its peers serve, merged) are a
    single node's, byte for byte, ``>`` and history alike."""
    group = b"solo%d" % protocol
    hello = _command(b"HELLO", b"%d" % protocol)
    reads = [tuple(group if a == b"solo" else a for a in read) for read in SOLO_READS]
    coordinator = cluster.leader_of(TOPIC)
    with RawConn(single.port) as one, RawConn(coordinator.port) as conn:
        for c in (one, conn):
            c.request(hello)
            assert c.request(_command(b"XGROUP", b"CREATE", TOPIC, group, b"0")) == b"+OK\r\n"
        for read in reads:
            assert conn.request(_command(*read)) == one.request(_command(*read)), read


CAPPED_READS = [  # MAXCOUNT / MAXSIZE count over the partitions in order, here or on their leaders
    (b"XREADGROUP", b"GROUP", b"cap", b"c", b"COUNT", b"2", b"MAXCOUNT", b"5", b"STREAMS", TOPIC, b">"),
    (b"XREADGROUP", b"GROUP", b"cap", b"c", b"MAXSIZE", b"150", b"STREAMS", TOPIC, b">"),
    (b"XREADGROUP", b"GROUP", b"cap", b"c", b"MAXCOUNT", b"7", b"STREAMS", TOPIC, b"0"),
    (b"XREADGROUP", b"GROUP", b"cap", b"c", b"MAXSIZE", b"100", b"STREAMS", TOPIC, b"1002-0"),
    (b"XREADGROUP", b"GROUP", b"cap", b"c", b"MAXCOUNT", b"9", b"MAXSIZE", b"400", b"STREAMS", TOPIC, b">"),
    (b"XREADGROUP", b"GROUP", b"cap", b"c", b"MAXCOUNT", b"100", b"STREAMS", TOPIC, b">"),
]


def test_maxcount_and_maxsize_reach_across_nodes_as_on_one_node(single, cluster):
    coordinator = cluster.leader_of(TOPIC)
    with RawConn(single.port) as one, RawConn(coordinator.port) as conn:
        for c in (one, conn):
            assert c.request(_command(b"XGROUP", b"CREATE", TOPIC, b"cap", b"0")) == b"+OK\r\n"
        for read in CAPPED_READS:
            assert conn.request(_command(*read)) == one.request(_command(*read)), read


def test_other_nodes_send_the_reader_to_the_coordinator(cluster):
    coordinator = cluster.leader_of(TOPIC)
    other = next(node for node in cluster.nodes if node is not coordinator)
    with RawConn(other.port) as conn:
        reply = conn.request(_command(b"XREADGROUP", b"GROUP", b"g", b"c", b"STREAMS", TOPIC, b">"))
    assert reply.startswith(b"-MOVED ") and reply.endswith(b" 127.0.0.1:%d\r\n" % coordinator.port), reply
    assert coordinator.client().xgroup_create(TOPIC, "g", id="0") is True
    with pytest.raises(redis.ResponseError, match="a transaction cannot read from other nodes"):
        pipe = coordinator.client().pipeline(transaction=True)
        pipe.xreadgroup("g", "c", {TOPIC: ">"})
        pipe.execute()


def test_two_members_share_the_topic_then_one_takes_over_the_silent_one(cluster):
    """Two members of a group get disjoint entries that cover the topic,
    each from its own partitions; XACK on the partition keys acknowledges
    them; when one stops reading past the session timeout, the other gets
    its partitions and, first, the entries it left pending (delivery count
    2)."""
    topic = b"shared"
    _create(cluster, topic)
    rc = _cluster_client(cluster)
    try:
        assert rc.xgroup_create(topic, "pair", id="$") is True
        got: dict[str, set] = {"a": set(), "b": set()}
        keys: dict[str, set] = {"a": set(), "b": set()}
        twice: list = []

        def read(member: str) -> None:
            found = _entries(rc.xreadgroup("pair", member, {topic: ">"}, count=100))
            twice.extend(found & (got["a"] | got["b"]))  # (never: asserted below)
            got[member] |= found
            keys[member] |= {key for key, _ in found}

        read("a")
        read("b")  # joins: a's share of the partitions is revoked (a has nothing pending)
        read("a")
        read("b")
        feed = _feed(2000, topic)
        _add(rc, feed)
        everything = {(key, entry_id) for key, entry_id, _ in feed}
        eventually(lambda: [read("a"), read("b")] and got["a"] | got["b"] == everything,
                   what="both members reading the whole topic")
        assert not twice and got["a"] and got["b"] and not keys["a"] & keys["b"], (twice, keys)
        assert len(keys["a"]) == len(keys["b"]) == PARTITIONS // 2

        # a acknowledges what it got, on each partition's leader.
        for key in keys["a"]:
            ids = [entry_id for k, entry_id in got["a"] if k == key]
            assert rc.xack(key, "pair", *ids) == len(ids)
            assert rc.xpending(key, "pair")["pending"] == 0

        # b goes silent with its entries pending; a reads on and takes them over.
        handed: set = set()

        def a_reads() -> bool:
            handed.update(_entries(rc.xreadgroup("pair", "a", {topic: ">"}, count=100)))
            return handed == got["b"]

        eventually(a_reads, timeout_s=6 * SESSION_TIMEOUT_MS / 1000, what="b's pending entries handed to a")
        for key in keys["b"]:
            pending = rc.xpending_range(key, "pair", min="-", max="+", count=100)
            assert {(p["consumer"], p["times_delivered"]) for p in pending} == {(b"a", 2)}, (key, pending)
        more = _feed(3000, topic)
        _add(rc, more)
        everything = {(key, entry_id) for key, entry_id, _ in more}
        fresh: set = set()
        eventually(lambda: fresh.update(_entries(rc.xreadgroup("pair", "a", {topic: ">"}, count=100)))
                   or fresh == everything, what="a reading every partition")
        # the membership stream is Partita's own: TOPIC LIST shows it only to a pattern naming it
        node = cluster.nodes[0].client()
        assert not [n for n in node.execute_command("TOPIC", "LIST") if n.startswith(b"__")]
        assert node.execute_command("TOPIC", "LIST", "__topic_members{shared}*") == \
            [b"__topic_members{shared}" + b"pair".hex().encode()]
    finally:
        rc.close()


def _blocked_clients(port: int) -> int:
    with RawConn(port) as conn:
        info = conn.request(b"INFO clients\r\n").decode()
    return int(info.split("blocked_clients:")[1].split()[0])


def test_a_blocked_member_wakes_on_an_append_to_a_partition_another_node_leads(cluster):
    topic = b"wakes"
    _create(cluster, topic)
    coordinator = cluster.leader_of(topic)
    client = coordinator.client(socket_timeout=30)
    assert client.xgroup_create(topic, "blocker", id="$") is True
    assert not client.xreadgroup("blocker", "w", {topic: ">"})  # joins: every partition is w's
    n = next(n for n in range(1, PARTITIONS) if cluster.leader_of(_pkey(n, topic)) is not coordinator)
    leader = cluster.leader_of(_pkey(n, topic))
    got: list = []
    reader = threading.Thread(target=lambda: got.append(
        client.xreadgroup("blocker", "w", {topic: ">"}, block=20000)))
    reader.start()
    try:
        assert wait_for(lambda: _blocked_clients(coordinator.port) == 1, 10), "the reader did not block"
        entry_id = leader.client().xadd(_pkey(n, topic), {"woke": n})
    finally:
        reader.join(25)
    assert not reader.is_alive() and got == [[[_pkey(n, topic), [(entry_id, {b"woke": b"%d" % n})]]]], got


def test_redis_cli_c_reads_the_topic_key_through_any_node(single, cluster):
    """redis-cli -c follows the ``-MOVED`` to the coordinator: a lone
    member's reads through each node are the single node's, in turn."""
    create = ("XGROUP", "CREATE", "events", "cli", "0")
    assert _cli(cluster.ports[1], *create, cluster_mode=True) == _cli(single.port, *create)
    read = ("XREADGROUP", "GROUP", "cli", "c", "COUNT", "1", "STREAMS", "events", ">")
    history = ("XREADGROUP", "GROUP", "cli", "c", "STREAMS", "events", "0")
    for args in (read, history):
        for port in cluster.ports:
            want = _cli(single.port, *args)
            assert "events#5" in want
            assert _cli(port, *args, cluster_mode=True) == want, (port, args)


def test_a_group_destroyed_and_created_again_through_any_node_starts_with_no_members(cluster):
    """XGROUP on a topic key is the coordinator's (other nodes answer
    ``-MOVED`` to it, as for XREADGROUP): a group destroyed and created
    again through any node (redis-cli -c) loses its members and their
    members stream, so a new member owns every partition at once."""
    topic = b"again"
    _create(cluster, topic)
    coordinator = cluster.leader_of(topic)
    other = next(node for node in cluster.nodes if node is not coordinator)
    with RawConn(other.port) as conn:
        for args in ((b"CREATE", topic, b"g", b"0"), (b"DESTROY", topic, b"g"),
                     (b"CREATECONSUMER", topic, b"g", b"c"), (b"DELCONSUMER", topic, b"g", b"c")):
            reply = conn.request(_command(b"XGROUP", *args))
            assert reply.startswith(b"-MOVED ") and reply.endswith(b" 127.0.0.1:%d\r\n" % coordinator.port), reply
    client = coordinator.client()
    assert client.xgroup_create(topic, "g", id="0") is True
    client.xreadgroup("g", "a", {topic: ">"})  # a joins: every partition is a's
    assert _members_streams(cluster, topic) == [b"__topic_members{again}" + b"g".hex().encode()]
    assert _cli(other.port, "XGROUP", "DESTROY", "again", "g", cluster_mode=True) == "1\n"
    eventually(lambda: _members_streams(cluster, topic) == [], what="the members stream deleted")
    assert _cli(other.port, "XGROUP", "CREATE", "again", "g", "$", cluster_mode=True) == "OK\n"
    _add(_cluster_client(cluster), _feed(1000, topic))
    got = _entries(client.xreadgroup("g", "b", {topic: ">"}, count=100))
    assert {key for key, _ in got} == {_pkey(n, topic) for n in range(PARTITIONS)}, got


def test_a_deleted_topic_takes_its_members_streams_along(cluster):
    topic = b"gone"
    _create(cluster, topic)
    client = cluster.leader_of(topic).client()
    assert client.xgroup_create(topic, "g", id="$") is True
    client.xreadgroup("g", "a", {topic: ">"})
    assert _members_streams(cluster, topic) == [b"__topic_members{gone}" + b"g".hex().encode()]
    assert client.execute_command("TOPIC", "DELETE", topic) == b"OK"
    eventually(lambda: _members_streams(cluster, topic) == [], what="the members stream deleted")


ADMIN = [  # one consumer's life in a group, XGROUP's replies as one node gives them
    (b"XGROUP", b"CREATE", TOPIC, b"adm", b"0"),
    (b"XGROUP", b"CREATECONSUMER", TOPIC, b"adm", b"c"),  # 1
    (b"XGROUP", b"CREATECONSUMER", TOPIC, b"adm", b"c"),  # 0
    (b"XGROUP", b"CREATECONSUMER", TOPIC, b"nope", b"c"),  # NOGROUP
    (b"XREADGROUP", b"GROUP", b"adm", b"c", b"COUNT", b"1", b"STREAMS", TOPIC, b">"),
    (b"XGROUP", b"CONFIG", TOPIC, b"adm", b"MAXDELIVERIES", b"0"),
    (b"XGROUP", b"DELCONSUMER", TOPIC, b"adm", b"c"),  # its pending entries, summed over the partitions
    (b"XGROUP", b"DELCONSUMER", TOPIC, b"adm", b"c"),  # 0
    (b"XGROUP", b"DELCONSUMER", TOPIC, b"nope", b"c"),  # NOGROUP
    (b"XGROUP", b"DESTROY", TOPIC, b"adm"),
]


def test_createconsumer_delconsumer_and_config_answer_as_on_one_node(single, cluster):
    coordinator = cluster.leader_of(TOPIC)
    with RawConn(single.port) as one, RawConn(coordinator.port) as conn:
        for args in ADMIN:
            assert conn.request(_command(*args)) == one.request(_command(*args)), args


def test_a_deleted_consumers_pending_entries_go_to_the_member_that_takes_its_partitions(cluster):
    """XGROUP DELCONSUMER of a member: its partitions pass to the other
    member, whose next read gets the entries it had pending there first
    (delivery count 2), as on one node."""
    topic = b"leave"
    _create(cluster, topic)
    client = cluster.leader_of(topic).client()
    assert client.xgroup_create(topic, "g", id="$") is True
    for member in ("a", "b", "a", "b"):  # both join; a's extra partitions are revoked and handed to b
        client.xreadgroup("g", member, {topic: ">"})
    _add(_cluster_client(cluster), _feed(1000, topic))
    got = {member: _entries(client.xreadgroup("g", member, {topic: ">"})) for member in ("a", "b")}
    assert len(got["b"]) == 2 * PARTITIONS and not got["a"] & got["b"]
    assert client.xgroup_delconsumer(topic, "g", "b") == len(got["b"])
    handed = _entries(client.xreadgroup("g", "a", {topic: ">"}))
    assert handed == got["b"]
    for key in {key for key, _ in got["b"]}:
        pending = cluster.leader_of(key).client().xpending_range(key, "g", min="-", max="+", count=100)
        assert {(p["consumer"], p["times_delivered"]) for p in pending} == {(b"a", 2)}, (key, pending)


def test_a_renamed_topics_members_keep_their_partitions(cluster):
    """RENAME of a topic (in a cluster: to a name of the same slot, hash
    tags alike) takes its groups' membership along: each member goes on
    with its own partitions under the new name. Another topic of the same
    hash tag with a group of the same name keeps its own membership."""
    a, b, renamed = b"{rn}a", b"{rn}b", b"{rn}c"
    client = cluster.leader_of(a).client()
    for topic in (a, b):
        assert client.execute_command("TOPIC", "CREATE", topic, "PARTITIONS", PARTITIONS) == b"OK"
        assert client.xgroup_create(topic, "g", id="$") is True
    for member in ("x", "y", "x", "y"):  # x's extra partitions are revoked and handed to y
        client.xreadgroup("g", member, {a: ">"})
    client.xreadgroup("g", "z", {b: ">"})  # z alone on b, in the same slot
    for key, entry_id, fields in _feed(1000, a):
        assert client.xadd(key, fields, id=entry_id) == entry_id
    before = {m: {k for k, _ in _entries(client.xreadgroup("g", m, {a: ">"}))} for m in ("x", "y")}
    assert len(before["x"]) == len(before["y"]) == PARTITIONS // 2
    assert client.rename(a, renamed) is True
    for key, entry_id, fields in _feed(2000, renamed):
        assert client.xadd(key, fields, id=entry_id) == entry_id
    after = {m: {k for k, _ in _entries(client.xreadgroup("g", m, {renamed: ">"}))} for m in ("x", "y")}
    assert after == {m: {k.replace(a, renamed) for k in keys} for m, keys in before.items()}, (before, after)


@pytest.fixture
def lone_cluster(tmp_path):
    # A session timeout longer than a failover's refusals (-TRYAGAIN while
    # the controller moves): the members must not expire before they can
    # read again.
    yield from running(tmp_path, extra=["--group-session-timeout-ms", "15000"])


def test_after_the_coordinators_failover_the_member_gets_its_pending_entries_again(lone_cluster):
    """The coordinator is killed (kill -9) and a follower of its slot takes
    over with the membership the old one kept (docs/topics.md "After the
    coordinator's failover"): the lone member's next read gets every entry
    it had pending, first, with delivery count 2; what it acknowledged
    stays acknowledged; nothing is lost."""
    cluster = lone_cluster
    topic = b"fo"
    _create(cluster, topic)
    old = cluster.leader_of(topic)
    client = old.client()
    for key, entry_id, fields in _feed(1000, topic):
        assert eventually(lambda: cluster.leader_of(key).client().xadd(key, fields, id=entry_id)) == entry_id
    assert client.xgroup_create(topic, "g", id="0") is True
    got = _entries(client.xreadgroup("g", "a", {topic: ">"}))
    assert len(got) == 4 * PARTITIONS
    acked = {(key, entry_id) for key, entry_id in got if entry_id.startswith(b"1000-")}
    for key, entry_id in acked:
        assert cluster.leader_of(key).client().xack(key, "g", entry_id) == 1
    old.kill9()
    new = cluster.taken_over(topic, old)  # the controller elects an in-sync follower
    handed: set = set()

    def reads_on() -> bool:
        handed.update(_entries(leased(lambda: new.client().xreadgroup("g", "a", {topic: ">"}))))
        return handed == got - acked

    eventually(reads_on, what="the member's pending entries on the new coordinator")
    for n in range(PARTITIONS):
        key = _pkey(n, topic)
        pending = cluster.leader_of(key).client().xpending_range(key, "g", min="-", max="+", count=100)
        assert {(p["consumer"], p["times_delivered"]) for p in pending} == {(b"a", 2)}, (key, pending)
        assert len(pending) == 3


def test_after_the_coordinators_failover_each_member_keeps_its_partitions(lone_cluster):
    """Two members share a topic; the coordinator is killed (kill -9) and a
    follower of its slot takes over with the membership the old one kept
    in its members stream: each member's next read continues on its own
    partitions, its own pending entries first (delivery count 2), never
    the other's; nothing is lost."""
    cluster = lone_cluster
    topic = b"fo2"
    _create(cluster, topic)
    old = cluster.leader_of(topic)
    client = old.client()
    assert client.xgroup_create(topic, "g", id="$") is True
    for member in ("a", "b", "a", "b"):  # both join; a's extra partitions are revoked and handed to b
        client.xreadgroup("g", member, {topic: ">"})
    for key, entry_id, fields in _feed(1000, topic):
        assert eventually(lambda: cluster.leader_of(key).client().xadd(key, fields, id=entry_id)) == entry_id
    got = {"a": set(), "b": set()}
    for member in ("a", "b"):
        got[member] = _entries(client.xreadgroup("g", member, {topic: ">"}))
    assert len(got["a"]) == len(got["b"]) == 2 * PARTITIONS and not got["a"] & got["b"]
    old.kill9()
    new = cluster.taken_over(topic, old)  # the controller elects an in-sync follower
    again = {"a": set(), "b": set()}

    def reads_on() -> bool:
        for member in ("a", "b"):
            again[member] |= _entries(leased(lambda: new.client().xreadgroup("g", member, {topic: ">"})))
        return again == got

    eventually(reads_on, what="each member's own pending entries on the new coordinator")
    for key, _ in got["b"]:
        pending = cluster.leader_of(key).client().xpending_range(key, "g", min="-", max="+", count=100)
        assert {(p["consumer"], p["times_delivered"]) for p in pending} == {(b"b", 2)}, (key, pending)


@pytest.fixture
def short_session_cluster(tmp_path):
    yield from running(tmp_path, extra=["--group-session-timeout-ms", "2000"])


def test_a_coordinator_that_leads_the_group_again_goes_on_from_its_successor(short_session_cluster):
    """The coordinator's slot moves to a follower by CLUSTER FAILOVER, the
    members go on reading there for longer than the session timeout, and
    the slot moves back: the old coordinator must go on from what its
    successor kept (both members alive, each on its own partitions), not
    from its own membership of before, where both members have been silent
    past their session (a soak saw 350 entries handed from one live member
    to the other this way)."""
    cluster = short_session_cluster
    topic = b"back"
    _create(cluster, topic)
    first = cluster.leader_of(topic)
    assert first.client().xgroup_create(topic, "g", id="$") is True
    for member in ("a", "b", "a", "b"):  # both join; a's extra partitions are revoked and handed to b
        first.client().xreadgroup("g", member, {topic: ">"})
    for key, entry_id, fields in _feed(1000, topic):
        assert eventually(lambda: cluster.leader_of(key).client().xadd(key, fields, id=entry_id)) == entry_id
    got = {member: _entries(first.client().xreadgroup("g", member, {topic: ">"})) for member in ("a", "b")}
    assert len(got["a"]) == len(got["b"]) == 2 * PARTITIONS and not got["a"] & got["b"]

    second = cluster.followers_of(topic)[0]
    assert leased(lambda: second.client().execute_command("CLUSTER", "FAILOVER")) == b"OK"
    assert cluster.leader_of(topic) is second
    since = time.monotonic()
    while time.monotonic() - since < 3.0:  # both alive there, past the session timeout of `first`'s view
        for member in ("a", "b"):  # (each gets its own pending entries again first: the redelivery after a failover)
            read = _entries(leased(lambda: second.client().xreadgroup("g", member, {topic: ">"}, block=100)))  # noqa: B023
            assert read <= got[member], (member, read - got[member])
    assert leased(lambda: first.client().execute_command("CLUSTER", "FAILOVER")) == b"OK"
    assert cluster.leader_of(topic) is first
    for member in ("a", "b"):
        read = _entries(leased(lambda: first.client().xreadgroup("g", member, {topic: ">"})))  # noqa: B023
        assert read <= got[member], (member, read - got[member])
    for member in ("a", "b"):
        for key, _ in got[member]:
            pending = cluster.leader_of(key).client().xpending_range(key, "g", min="-", max="+", count=100)
            assert {p["consumer"] for p in pending} == {member.encode()}, (key, pending)


@pytest.fixture
def rf2_cluster(tmp_path):
    # Two replicas a shard: a node leads one shard and follows one other
    # (CLUSTER FAILOVER takes every shard a node follows).
    yield from running(tmp_path, extra=["--group-session-timeout-ms", "15000", "--replication-factor", "2"])


def test_a_read_whose_coordinator_lost_and_regained_the_slot_meanwhile_is_refused(rf2_cluster):
    """A member's read writes before it awaits the partitions' leaders: the
    membership's entry, the PEL of the partitions served on the coordinator,
    all at the slot's leader epoch then. Its reply waits for the in-sync
    replicas only once the read is done: if the coordinator lost the slot
    meanwhile (those writes possibly truncated away) and leads it again, the
    wait looked at the new epoch's log and acknowledged writes that may be
    gone (a soak: 50 entries went to both members). The read must be
    refused, not answered: with -TRYAGAIN (the member reads again), or, as
    its writes were made at an epoch the slot is no longer led at, by the
    connection closing (an acks=all wait that fails, as for any write whose
    leader changed: the client retries). The client does not retry here, to
    see the first outcome."""
    cluster = rf2_cluster
    info = cluster.nodes[0].client().execute_command("INFO", "replication")
    controller = int(info["controller_leader"])
    ranges = [(*map(int, v["slots"].split("-")), [int(r) for r in str(v["replicas"]).split("/")])
              for k, v in sorted(info.items()) if k.startswith("shard") and k[5:].isdigit()]
    # The slot's shard: its leader coordinates, its follower takes it over; the
    # third node (not the controller) leads a partition and is stopped.
    (first_slot, last_slot, replicas), (stopped_first, stopped_last, _) = next(
        (r, o) for r in ranges for o in ranges if o[2][0] not in r[2] and o[2][0] != controller)
    slot = cluster.nodes[0].client().execute_command  # (CLUSTER KEYSLOT)

    def placed(t: bytes) -> bool:
        return (first_slot <= slot("CLUSTER", "KEYSLOT", t) <= last_slot
                and any(stopped_first <= slot("CLUSTER", "KEYSLOT", _pkey(n, t)) <= stopped_last
                        for n in range(1, PARTITIONS)))

    topic = next(t for t in (b"st%d" % i for i in range(1000)) if placed(t))
    _create(cluster, topic)
    coordinator, successor = (cluster.nodes[r - 1] for r in replicas)
    (stopped,) = (n for n in cluster.nodes if n not in (coordinator, successor))
    assert cluster.leader_of(topic) is coordinator
    for key, entry_id, fields in _feed(1000, topic):
        assert eventually(lambda: cluster.leader_of(key).client().xadd(key, fields, id=entry_id)) == entry_id
    assert coordinator.client().xgroup_create(topic, "g", id="0") is True
    outcome: list = []

    def read() -> None:
        try:
            client = coordinator.client(socket_timeout=60, retry=Retry(NoBackoff(), 0))
            outcome.append(client.xreadgroup("g", "a", {topic: ">"}))
        except (redis.ResponseError, redis.ConnectionError) as e:
            outcome.append(e)

    def take_back() -> None:
        outcome.append(coordinator.client(socket_timeout=60).execute_command("CLUSTER", "FAILOVER"))

    def leads(node) -> bool:
        slot = node.client().execute_command("CLUSTER", "KEYSLOT", topic)
        return any(a <= slot <= b and leader[1] == coordinator.port
                   for a, b, leader, *_ in node.client().execute_command("CLUSTER", "SLOTS"))

    stopped.proc.send_signal(signal.SIGSTOP)
    reader = threading.Thread(target=read)
    taker = threading.Thread(target=take_back)
    try:
        reader.start()
        # The read wrote the membership's first entry and awaits the stopped leader.
        assert wait_for(lambda: _members_streams_on(coordinator, topic), timeout_s=10)
        assert successor.client(socket_timeout=60).execute_command("CLUSTER", "FAILOVER") == b"OK"
        assert wait_for(lambda: not leads(coordinator), timeout_s=10)
        taker.start()  # (it then waits for the stopped node's shard, which it follows too)
        assert wait_for(lambda: leads(coordinator), timeout_s=10)
        assert reader.is_alive(), "the read must still be waiting for the stopped leader"
    finally:
        stopped.proc.send_signal(signal.SIGCONT)
        reader.join(timeout=60)
        taker.join(timeout=60)
    read_outcome = next(o for o in outcome if not isinstance(o, bytes))
    assert isinstance(read_outcome, (redis.exceptions.TryAgainError, redis.ConnectionError)), read_outcome


def _members_streams_on(node, topic: bytes) -> list:
    return node.client().execute_command("TOPIC", "LIST", b"__topic_members{%s}*" % topic)


@pytest.mark.parametrize("args", [
    (b"SETID", b"$"),
    (b"CREATECONSUMER", b"d"),
    (b"DELCONSUMER", b"c"),
    (b"CONFIG", b"MAXDELIVERIES", b"2", b"DEADLETTER", b"dlq"),
])
def test_a_topic_group_missing_on_a_partition_led_elsewhere_changes_nothing(cluster, args):
    """As on one node: the coordinator checks every partition's group
    first, and names the partition key led by another node that lacks it
    (its own partitions were changed meanwhile: a half-applied command)."""
    topic = b"part" + args[0].lower()
    _create(cluster, topic)
    coordinator = cluster.leader_of(topic)
    client = coordinator.client()
    assert client.xgroup_create(topic, "g", id="0") is True
    assert client.xgroup_createconsumer(topic, "g", "c") == 1
    _add(_cluster_client(cluster), _feed(1000, topic))
    away = next(n for n in range(1, PARTITIONS) if cluster.leader_of(_pkey(n, topic)) is not coordinator)
    assert cluster.leader_of(_pkey(away, topic)).client().xgroup_destroy(_pkey(away, topic), "g") == 1
    def groups():  # (partition 0's, on the coordinator, as its leader)
        return eventually(lambda: cluster.leader_of(_pkey(0, topic)).client().xinfo_groups(_pkey(0, topic)),
                          what="partition 0's groups")

    before = groups()
    with pytest.raises(redis.ResponseError) as refused:
        client.execute_command(b"XGROUP", args[0], topic, b"g", *args[1:])
    assert str(refused.value) == f"NOGROUP No such consumer group 'g' for key name '{_pkey(away, topic).decode()}'"
    assert groups() == before
