"""A topic's consumer groups described on any node of a 3-node cluster as on
one node (issue 31): XINFO GROUPS, XINFO CONSUMERS, TOPIC GROUPS and TOPIC
DESCRIBE's ``groups`` on a topic key whose partitions several nodes lead
gather each partition's groups from its leader and the memberships from the
group's coordinator (``GROUPINFO`` on the cluster bus,
cluster/broker/topic_groups.py) and merge them with the single node's code.
A single partita and the cluster are fed the same entries (explicit IDs),
get the same groups, reads (a member on the topic key, a consumer on a
partition key) and acknowledgements, and every node's reply is compared
byte for byte with the single node's, RESP2 and RESP3. Only the ``idle``
values (ms since a consumer or member was last seen: when each server saw
it) are set to 0 before comparing. XINFO STREAM on the topic key is refused
on every node as on one node (it needs a partition key)."""

from __future__ import annotations

import re

import pytest

from tests.clusterkit import running
from tests.conftest import PartitaProcess, RawConn, resp_command
from tests.e2e.conftest import same_on_every_node, spread_topic

PARTITIONS = 6
TOPIC = b"infos"
SESSION_TIMEOUT_MS = 600000  # members stay alive for the whole module: both sides see the same ones


def _pkey(n: int) -> bytes:
    return b"%s#%d" % (TOPIC, n)


def _feed() -> list[tuple[bytes, bytes, dict]]:
    """``(partition key, ID, fields)``: 5 entries on partitions 0 .. 4, partition 5 empty."""
    return [(_pkey(n), b"%d-%d" % (1000 + i, n), {"n": n, "i": i}) for n in range(PARTITIONS - 1) for i in range(5)]


# What both sides do after the feed, in order: (command, the key whose
# leader runs it in the cluster: the topic key's is the groups' coordinator).
SETUP = [
    ((b"XGROUP", b"CREATE", TOPIC, b"g", b"0"), TOPIC),
    ((b"XGROUP", b"CREATE", TOPIC, b"h", b"$"), TOPIC),
    ((b"XGROUP", b"CREATE", TOPIC, b"late", b"1002", b"ENTRIESREAD", b"2"), TOPIC),
    ((b"XREADGROUP", b"GROUP", b"g", b"alice", b"COUNT", b"2", b"STREAMS", TOPIC, b">"), TOPIC),
    ((b"XREADGROUP", b"GROUP", b"g", b"carol", b"COUNT", b"3", b"STREAMS", _pkey(3), b"0"), _pkey(3)),
    ((b"XACK", _pkey(1), b"g", b"1000-1"), _pkey(1)),
    ((b"XREADGROUP", b"GROUP", b"h", b"bob", b"STREAMS", TOPIC, b">"), TOPIC),
    ((b"XGROUP", b"CREATECONSUMER", _pkey(4), b"late", b"dave"), _pkey(4)),
]

DESCRIBES = [
    (b"XINFO", b"GROUPS", TOPIC),
    (b"XINFO", b"CONSUMERS", TOPIC, b"g"),
    (b"XINFO", b"CONSUMERS", TOPIC, b"h"),
    (b"XINFO", b"CONSUMERS", TOPIC, b"late"),
    (b"XINFO", b"CONSUMERS", TOPIC, b"nope"),  # NOGROUP
    (b"TOPIC", b"GROUPS", TOPIC),
    (b"TOPIC", b"GROUPS", TOPIC, b"g"),
    (b"TOPIC", b"GROUPS", TOPIC, b"nope"),  # NOGROUP
    (b"XINFO", b"STREAM", TOPIC),  # a partition key needed, on one node too
    (b"XINFO", b"STREAM", TOPIC, b"FULL"),
]

_IDLE = re.compile(rb"(\$4\r\nidle\r\n):\d+\r\n")


def _idle_zeroed(reply: bytes) -> bytes:
    """``reply`` with every ``idle`` field's value 0 (a map's key is a bulk
    string in RESP2 and RESP3 alike, its value an integer)."""
    return _IDLE.sub(rb"\1:0\r\n", reply)


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    server = PartitaProcess(tmp_path_factory.mktemp("single") / "data",
                            ["--group-session-timeout-ms", str(SESSION_TIMEOUT_MS)]).start()
    client = server.client()
    assert client.execute_command("TOPIC", "CREATE", TOPIC, "PARTITIONS", PARTITIONS) == b"OK"
    for key, entry_id, fields in _feed():
        assert client.xadd(key, fields, id=entry_id) == entry_id
    with RawConn(server.port) as conn:
        for command, _ in SETUP:
            assert not conn.request(resp_command(*command)).startswith(b"-"), command
    yield server
    server.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    for c in running(tmp_path_factory.mktemp("infos"), extra=["--group-session-timeout-ms",
                                                              str(SESSION_TIMEOUT_MS)]):
        spread_topic(c, TOPIC, PARTITIONS, _feed())
        assert len({c.leader_of(_pkey(n)).port for n in range(PARTITIONS)}) == 3, "every node leads partitions"
        for command, where in SETUP:
            with RawConn(c.leader_of(where).port) as conn:
                reply = conn.request(resp_command(*command))
            assert not reply.startswith(b"-"), (command, reply)
        yield c


@pytest.mark.parametrize("protocol", [2, 3])
def test_a_topics_groups_are_described_on_every_node_as_on_one_node(single, cluster, protocol):
    expected = same_on_every_node(single, cluster.nodes, DESCRIBES, protocol, _idle_zeroed)
    assert b"alice" in expected[1] and b"carol" in expected[1] and b"dave" in expected[3]
    assert expected[4].startswith(b"-NOGROUP") and expected[8].startswith(b"-ERR 'infos' is a topic of 6")


def _described_groups(port: int) -> bytes:
    """TOPIC DESCRIBE's ``groups`` value, as raw RESP2 (the fields before it
    hold each node's own figures)."""
    with RawConn(port) as conn:
        reply = conn.request(resp_command(b"TOPIC", b"DESCRIBE", TOPIC))
    at = reply.index(b"$6\r\ngroups\r\n")
    return _idle_zeroed(reply[at:])


def test_topic_describe_shows_the_groups_on_every_node(single, cluster):
    want = _described_groups(single.port)
    assert b"alice" in want and b"bob" in want
    for node in cluster.nodes:
        assert _described_groups(node.port) == want, node.port


def test_inside_multi_the_groups_are_not_asked_of_other_nodes(cluster):
    """A transaction cannot wait for other nodes: XINFO GROUPS on the topic
    key is refused with the reason, TOPIC DESCRIBE answers with ``groups``
    nil."""
    pipe = cluster.nodes[0].client().pipeline(transaction=True)
    pipe.execute_command("XINFO", "GROUPS", TOPIC)
    pipe.execute_command("TOPIC", "DESCRIBE", TOPIC)
    refused, described = pipe.execute(raise_on_error=False)
    assert "a transaction cannot read from other nodes" in str(refused)
    assert described[b"groups"] is None and len(described[b"partition-info"]) == PARTITIONS
