"""RENAME and RENAMENX of streams (Partita topics) through a real ``partita``
process (issue 30): Redis's replies, consumer groups moving with the stream,
blocked readers of both keys woken as Redis 7.2+ wakes them, multi-partition
topics renamed whole, the rename surviving a restart and, killed at every
step of the rename on disk (tests/crashing_rename.py), a restart finding the
topic under exactly one of its names.

Replies Redis 7.0 shares with Redis 8 are compared with redis-server in
tests/e2e/test_keyspace_differential.py; the wake-ups are Redis 7.2+'s (its
tests "RENAME can unblock XREADGROUP with data" / "with -NOGROUP"), written
here as specifications.
"""

from __future__ import annotations

import sys

import pytest

from tests.conftest import REPO, PartitaProcess, wait_for
from tests.e2e.streams_support import Error, RespClient, blocked_clients, encode, parse

PROTOCOLS = pytest.mark.parametrize("protocol", [2, 3], ids=["resp2", "resp3"])
STEPS = ["begin", "intent", "aside", "moved", "named", "done"]


def _nogroup(key: str, group: str = "g") -> Error:
    return Error(f"NOGROUP No such key '{key}' or consumer group '{group}' in XREADGROUP with GROUP option")


@pytest.fixture
def client(shared_clients):
    return shared_clients


def _block(server, reader: RespClient, *argv) -> None:
    before = blocked_clients(server.port)
    reader.send(*argv)
    assert wait_for(lambda: blocked_clients(server.port) == before + 1)


# ----------------------------------------------------------- the replies


def test_rename_moves_the_stream_its_groups_and_pending_entries(client):
    c = client(2)
    c.call("XADD", "a", "1-1", "f", "v1")
    c.call("XADD", "a", "2-1", "f", "v2")
    c.call("XGROUP", "CREATE", "a", "g", "0")
    c.call("XREADGROUP", "GROUP", "g", "alice", "COUNT", "1", "STREAMS", "a", ">")
    c.call("XADD", "b", "9-1", "old", "b")  # replaced
    assert c.call("RENAME", "a", "b") == b"+OK\r\n"
    assert parse(c.call("EXISTS", "a", "b")) == 1
    assert parse(c.call("XRANGE", "b", "-", "+")) == [[b"1-1", [b"f", b"v1"]], [b"2-1", [b"f", b"v2"]]]
    assert parse(c.call("XPENDING", "b", "g")) == [1, b"1-1", b"1-1", [[b"alice", b"1"]]]
    assert parse(c.call("XREADGROUP", "GROUP", "g", "bob", "STREAMS", "b", ">")) == [
        [b"b", [[b"2-1", [b"f", b"v2"]]]]]
    assert len(parse(c.call("XINFO", "GROUPS", "b"))) == 1
    # Writes go on under the new name, after the last ID.
    assert parse(c.call("XADD", "b", "2-1", "f", "v")) == Error(
        "ERR The ID specified in XADD is equal or smaller than the target stream top item")
    assert parse(c.call("XADD", "b", "3-1", "f", "v3")) == b"3-1"
    assert parse(c.call("RENAMENX", "b", "c")) == 1
    c.call("XADD", "d", "1-1", "f", "v")
    assert parse(c.call("RENAMENX", "c", "d")) == 0  # d exists: nothing done
    assert parse(c.call("XLEN", "c")) == 3 and parse(c.call("XLEN", "d")) == 1
    assert parse(c.call("KEYS", "*")) == [b"c", b"d"]


def test_rename_of_a_topic_of_several_partitions_moves_every_partition(client):
    c = client(2)
    assert c.call("TOPIC", "CREATE", "t", "PARTITIONS", "3", "CONFIG", "retention-ms", "600000") == b"+OK\r\n"
    for n in range(3):
        c.call("XADD", f"t#{n}", f"{n + 1}-1", "p", str(n))
    c.call("XGROUP", "CREATE", "t#1", "g", "0")
    assert c.call("RENAME", "t", "u") == b"+OK\r\n"
    assert parse(c.call("EXISTS", "t", "t#1")) == 0
    assert parse(c.call("XLEN", "u")) == 3
    assert [parse(c.call("XRANGE", f"u#{n}", "-", "+")) for n in range(3)] == [
        [[b"%d-1" % (n + 1), [b"p", b"%d" % n]]] for n in range(3)]
    assert parse(c.call("XREADGROUP", "GROUP", "g", "c", "STREAMS", "u#1", ">")) == [
        [b"u#1", [[b"2-1", [b"p", b"1"]]]]]
    described = parse(c.call("TOPIC", "DESCRIBE", "u"))
    assert described[described.index(b"partitions") + 1] == 3
    # A partition alone, or to a partition's name: refused, nothing renamed.
    assert parse(c.call("RENAME", "u#1", "x")) == Error(
        "ERR 'u#1' is a partition of topic 'u' (3 partitions): RENAME moves whole topics (rename 'u')")
    assert parse(c.call("RENAME", "u", "x#1")) == Error(
        "ERR 'x#1' ends with '#<n>', which names a partition: a topic cannot be renamed to it")
    assert parse(c.call("KEYS", "*")) == [b"u"]
    # A one-partition topic's partition key is the stream itself.
    c.call("XADD", "one", "1-1", "f", "v")
    assert c.call("RENAME", "one#0", "two") == b"+OK\r\n"
    assert parse(c.call("XLEN", "two")) == 1 and parse(c.call("RENAME", "two#0", "two")) == b"OK"
    assert parse(c.call("RENAMENX", "two#0", "two")) == 0


# ------------------------------------------------------ blocked readers


@PROTOCOLS
def test_a_reader_blocked_on_the_source_gets_nogroup(partita_shared, client, protocol):
    admin, reader = client(2), client(protocol)
    admin.call("XGROUP", "CREATE", "src", "g", "$", "MKSTREAM")
    _block(partita_shared, reader, "XREADGROUP", "GROUP", "g", "c", "BLOCK", "0", "STREAMS", "src", ">")
    assert admin.call("RENAME", "src", "dst") == b"+OK\r\n"
    assert reader.read_reply() == encode(_nogroup("src"), protocol)


@PROTOCOLS
def test_a_group_reader_blocked_on_the_destination_reads_the_renamed_stream(partita_shared, client, protocol):
    """Redis's "RENAME can unblock XREADGROUP with data": the renamed stream
    has the group, with its own last-delivered-id."""
    admin, reader = client(2), client(protocol)
    admin.call("XGROUP", "CREATE", "dst", "g", "$", "MKSTREAM")
    _block(partita_shared, reader, "XREADGROUP", "GROUP", "g", "c", "BLOCK", "0", "STREAMS", "dst", ">")
    admin.call("XGROUP", "CREATE", "src", "g", "$", "MKSTREAM")
    admin.call("XADD", "src", "100-0", "f1", "v1")
    assert admin.call("RENAME", "src", "dst") == b"+OK\r\n"
    assert parse(reader.read_reply()) in ([[b"dst", [[b"100-0", [b"f1", b"v1"]]]]],
                                          [(b"dst", [[b"100-0", [b"f1", b"v1"]]])])


@PROTOCOLS
def test_a_group_reader_blocked_on_the_destination_without_the_group_gets_nogroup(partita_shared, client,
                                                                                   protocol):
    """Redis's "RENAME can unblock XREADGROUP with -NOGROUP"."""
    admin, reader = client(2), client(protocol)
    admin.call("XGROUP", "CREATE", "dst", "g", "$", "MKSTREAM")
    _block(partita_shared, reader, "XREADGROUP", "GROUP", "g", "c", "BLOCK", "0", "STREAMS", "dst", ">")
    admin.call("XADD", "src", "100-0", "f1", "v1")
    assert admin.call("RENAME", "src", "dst") == b"+OK\r\n"
    assert reader.read_reply() == encode(_nogroup("dst"), protocol)


def test_xread_blocked_on_the_destination_sees_the_entries_and_on_the_source_blocks_on(partita_shared, client):
    admin, on_dst, on_src = client(2), client(2), client(2)
    admin.call("XADD", "src", "100-0", "f", "v")
    _block(partita_shared, on_dst, "XREAD", "BLOCK", "0", "STREAMS", "dst", "$")
    _block(partita_shared, on_src, "XREAD", "BLOCK", "0", "STREAMS", "src", "$")
    assert admin.call("RENAME", "src", "dst") == b"+OK\r\n"
    assert parse(on_dst.read_reply()) == [[b"dst", [[b"100-0", [b"f", b"v"]]]]]
    # The source's reader waits on (Redis: a key gone does not end an XREAD)
    # and reads what a new stream of that name gets.
    assert blocked_clients(partita_shared.port) == 1
    admin.call("XADD", "src", "200-0", "f", "again")
    assert parse(on_src.read_reply()) == [[b"src", [[b"200-0", [b"f", b"again"]]]]]


# ------------------------------------------------------------ durability


def _state(port: int) -> dict:
    with RespClient(port) as c:
        keys = parse(c.call("KEYS", "*"))
        return {k: (parse(c.call("XRANGE", k, "-", "+")), parse(c.call("XPENDING", k, "g")))
                for k in keys if not k.startswith(b"other")}


def _fill(port: int) -> None:
    with RespClient(port) as c:
        for i in range(1, 4):
            c.call("XADD", "a", f"{i}-0", "i", str(i))
        c.call("XGROUP", "CREATE", "a", "g", "0")
        c.call("XREADGROUP", "GROUP", "g", "alice", "COUNT", "2", "STREAMS", "a", ">")
        c.call("XADD", "b", "7-0", "old", "b")
        c.call("XGROUP", "CREATE", "b", "g", "$")
        c.call("XADD", "other", "1-0", "f", "v")


def test_a_rename_survives_a_kill_9(partita_server):
    _fill(partita_server.port)
    before = _state(partita_server.port)
    with RespClient(partita_server.port) as c:
        assert c.call("RENAME", "a", "b") == b"+OK\r\n"
    partita_server.restart(kill9=True)
    assert _state(partita_server.port) == {b"b": before[b"a"]}


@pytest.mark.parametrize("step", STEPS)
def test_a_kill_at_any_step_of_a_rename_leaves_one_name(tmp_path, step):
    """The process kills itself with SIGKILL when the rename reaches
    ``step``; after a restart the topic is under its old name (the intent
    never reached the disk: ``begin``) or its new one, whole, with its
    group, and the destination it replaced is gone."""
    server = PartitaProcess(tmp_path / "data", launcher=[sys.executable, str(REPO / "tests" / "crashing_rename.py")])
    server.start()
    try:
        _fill(server.port)
        before = _state(server.port)
        (tmp_path / "data.crash-rename").write_text(step)
        with RespClient(server.port) as c:
            c.send("RENAME", "a", "b")
            with pytest.raises((ConnectionError, OSError)):
                c.read_reply()  # killed before its reply
        assert server.proc.wait(timeout=10) == -9
        (tmp_path / "data.crash-rename").unlink()
        server.start()
        after = _state(server.port)
        assert after == (before if step == "begin" else {b"b": before[b"a"]})
        with RespClient(server.port) as c:  # and it goes on: a write, and the rename again
            assert parse(c.call("XADD", "b", "*", "f", "v")) != b""
            if step == "begin":
                assert c.call("RENAME", "a", "b") == b"+OK\r\n"
                assert parse(c.call("XLEN", "b")) == 3
    finally:
        server.stop()
