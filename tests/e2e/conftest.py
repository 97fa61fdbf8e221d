"""Fixtures the end-to-end stream tests share."""

from __future__ import annotations

import pytest

from tests.e2e.streams_support import RespClient, port_of


@pytest.fixture
def shared_clients(partita_shared):
    """``connect(protocol=2)`` -> a new ``RespClient`` of the module's shared
    partita, emptied first (FLUSHALL); every client is closed after the test."""
    opened = []

    def connect(protocol: int = 2) -> RespClient:
        c = RespClient(port_of(partita_shared), protocol)
        opened.append(c)
        return c

    connect(2).call("FLUSHALL")
    yield connect
    for c in opened:
        c.close()


def spread_topic(cluster, topic: bytes, partitions: int, feed=()) -> None:
    """``topic`` of ``partitions`` partitions created on ``cluster``'s
    leader of its slot, checked to be led by several nodes, and each entry
    of ``feed`` (``(partition key, ID, fields)``) added on its partition's
    leader (acks=all: committed once answered, retried while a leader is
    not ready)."""
    from tests.clusterkit import eventually

    assert cluster.leader_of(topic).client().execute_command("TOPIC", "CREATE", topic, "PARTITIONS",
                                                             partitions) == b"OK"
    leaders = {cluster.leader_of(b"%s#%d" % (topic, n)).port for n in range(partitions)}
    assert len(leaders) > 1, "the test needs partitions led by several nodes"
    for key, entry_id, fields in feed:
        leader = cluster.leader_of(key)
        assert eventually(lambda: leader.client().xadd(key, fields, id=entry_id), what=f"XADD {key!r}") == entry_id


def same_on_every_node(single, nodes, commands, protocol: int, normalised=lambda reply: reply) -> list[bytes]:
    """Each of ``commands`` (argument tuples) sent, after ``HELLO
    protocol``, to the ``single`` partita and to each of ``nodes`` (a
    cluster's): every node's raw reply, ``normalised``, must be the single
    node's (normalised alike). Returns the single node's replies."""
    from tests.conftest import RawConn, resp_command

    hello = resp_command(b"HELLO", b"%d" % protocol)
    with RawConn(single.port) as conn:
        conn.request(hello)
        expected = [normalised(conn.request(resp_command(*command))) for command in commands]
    for node in nodes:
        with RawConn(node.port) as conn:
            conn.request(hello)
            for command, want in zip(commands, expected):
                assert normalised(conn.request(resp_command(*command))) == want, (node.port, command)
    return expected
