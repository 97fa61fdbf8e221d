"""Pipelines on a cluster's leader read what the same client wrote before them,
as on Redis (issue 30), through real ``partita`` processes:

- a read after an acks=all XADD of the same connection, in one pipeline,
  answers from after the write (the write's receipt first), never from
  below the high watermark as it stood before the write;
- XTRIM, and XADD's own trim, after writes not yet acknowledged remove what
  Redis removes (the log start never passes the high watermark: the trim
  waits for the replicas, where before it answered an internal error);
- a key written and deleted in one pipeline leaves INFO and the writer's
  receipt alone (before: ``KeyError`` in INFO, and the connection closed).
"""

from __future__ import annotations

import pytest

from tests.clusterkit import Cluster
from tests.e2e.streams_support import RespClient


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("rf3"))  # replication factor 3: acks=all waits for two followers
    yield c
    c.stop()
    assert not c.unexpected_log_lines(), c.unexpected_log_lines()[:5]


@pytest.fixture(scope="module")
def cluster_rf1(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("rf1"), extra=["--replication-factor", "1"])
    yield c
    c.stop()
    assert not c.unexpected_log_lines(), c.unexpected_log_lines()[:5]


def _pipeline(port: int, *commands) -> list[bytes]:
    """Send every command at once (one pipeline), then read each reply's bytes."""
    with RespClient(port) as c:
        for argv in commands:
            c.send(*argv)
        return [c.read_reply() for _ in commands]


def _bulk(text: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(text), text)


def _entry(entry_id: bytes, *fields: bytes) -> bytes:
    return b"*2\r\n" + _bulk(entry_id) + b"*%d\r\n" % len(fields) + b"".join(_bulk(f) for f in fields)


def test_a_read_after_an_acks_all_xadd_in_one_pipeline_sees_it(cluster):
    for i in range(5):
        key = b"own-%d" % i
        port = cluster.leader_of(key).port
        added, ranged, length, read = _pipeline(port, (b"XADD", key, b"*", b"f", b"v"), (b"XRANGE", key, b"-", b"+"),
                                                (b"XLEN", key), (b"XREAD", b"STREAMS", key, b"0"))
        new_id = added.split(b"\r\n")[1]
        assert ranged == b"*1\r\n" + _entry(new_id, b"f", b"v")
        assert length == b":1\r\n"
        assert read == b"*1\r\n*2\r\n" + _bulk(key) + b"*1\r\n" + _entry(new_id, b"f", b"v")


def test_xreadgroup_after_an_xadd_in_one_pipeline_delivers_it(cluster):
    key = b"own-group"
    port = cluster.leader_of(key).port
    replies = _pipeline(port, (b"XGROUP", b"CREATE", key, b"g", b"$", b"MKSTREAM"),
                        (b"XADD", key, b"1-0", b"f", b"v"),
                        (b"XREADGROUP", b"GROUP", b"g", b"c", b"STREAMS", key, b">"))
    assert replies == [b"+OK\r\n", _bulk(b"1-0"),
                       b"*1\r\n*2\r\n" + _bulk(key) + b"*1\r\n" + _entry(b"1-0", b"f", b"v")]


def test_exec_after_an_xadd_in_one_pipeline_reads_it(cluster):
    """EXEC waits for the client's writes before it as a read does. (A read
    after an append inside the same transaction still stops at the high
    watermark: docs/replication.md.)"""
    key = b"own-exec"
    port = cluster.leader_of(key).port
    replies = _pipeline(port, (b"XADD", key, b"1-0", b"f", b"v"), (b"MULTI",), (b"XLEN", key),
                        (b"XRANGE", key, b"-", b"+"), (b"EXEC",))
    assert replies == [_bulk(b"1-0"), b"+OK\r\n", b"+QUEUED\r\n", b"+QUEUED\r\n",
                       b"*2\r\n:1\r\n*1\r\n" + _entry(b"1-0", b"f", b"v")]


def test_xtrim_after_xadds_in_one_pipeline_trims_as_redis(cluster):
    key = b"own-trim"
    port = cluster.leader_of(key).port
    replies = _pipeline(port, (b"XADD", key, b"1-0", b"f", b"v"), (b"XADD", key, b"2-0", b"f", b"v"),
                        (b"XTRIM", key, b"MAXLEN", b"1"), (b"XRANGE", key, b"-", b"+"))
    assert replies == [_bulk(b"1-0"), _bulk(b"2-0"), b":1\r\n", b"*1\r\n" + _entry(b"2-0", b"f", b"v")]


def test_an_xadd_trim_past_the_high_watermark_waits_for_the_replicas(cluster):
    """XADD's own MAXLEN after unacknowledged XADDs (and MAXLEN 0, which
    trims the entry it adds): before, an internal error after the entry was
    appended; now Redis's replies."""
    key = b"own-xadd-trim"
    port = cluster.leader_of(key).port
    replies = _pipeline(port, (b"XADD", key, b"1-0", b"f", b"v"), (b"XADD", key, b"2-0", b"f", b"v"),
                        (b"XADD", key, b"MAXLEN", b"1", b"3-0", b"f", b"v"), (b"XLEN", key),
                        (b"XADD", key, b"MAXLEN", b"0", b"4-0", b"f", b"v"), (b"XLEN", key),
                        (b"XRANGE", key, b"-", b"+"))
    assert replies == [_bulk(b"1-0"), _bulk(b"2-0"), _bulk(b"3-0"), b":1\r\n", _bulk(b"4-0"), b":0\r\n", b"*0\r\n"]


def _xadd_del_info(port: int) -> list[bytes]:
    return _pipeline(port, (b"XADD", b"a", b"*", b"f", b"v"), (b"DEL", b"a"), (b"INFO", b"replication"))


@pytest.mark.parametrize("which", ["cluster", "cluster_rf1"])
def test_a_key_written_and_deleted_in_one_pipeline_leaves_info_alone(which, request):
    c = request.getfixturevalue(which)
    port = c.leader_of(b"a").port
    for _ in range(20):
        added, deleted, info = _xadd_del_info(port)
        assert added.startswith(b"$") and b"-" in added, added
        assert deleted == b":1\r\n"
        assert info.startswith(b"$") and b"# Replication\r\n" in info and b"key=a," not in info, info[:200]
