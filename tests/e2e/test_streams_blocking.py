"""XREAD BLOCK end to end: wake-ups, timeouts, many waiters, killed clients.

The same wake-up scenario also runs against redis-server and the reply bytes
are compared. Waits poll with short timeouts (end-to-end tests only).
"""

from __future__ import annotations

import socket
import threading
import time

import pytest

from tests.e2e.streams_support import RespClient, parse, port_of

WAKE_TIMEOUT_S = 5.0


def _blocked_clients(port: int) -> int:
    with RespClient(port) as c:
        text = parse(c.call("INFO", "clients"))
        text = text if isinstance(text, bytes) else bytes(text)
    for line in text.splitlines():
        if line.startswith(b"blocked_clients:"):
            return int(line.split(b":")[1])
    raise AssertionError("INFO clients has no blocked_clients")


def _wait_until(predicate, timeout_s: float = WAKE_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError("condition not reached in time")


def _wake_scenario(port: int, protocol: int) -> bytes:
    with RespClient(port, protocol) as reader, RespClient(port) as writer:
        writer.call("FLUSHALL")
        writer.call("XADD", "s", "1-1", "old", "x")
        reader.send("XREAD", "BLOCK", "0", "STREAMS", "s", "other", "$", "$")
        _wait_until(lambda: _blocked_clients(port) == 1)
        assert writer.call("XADD", "s", "2-1", "new", "y") == b"$3\r\n2-1\r\n"
        reader.sock.settimeout(WAKE_TIMEOUT_S)
        return reader.read_reply()


@pytest.mark.redis
@pytest.mark.parametrize("protocol", [2, 3])
def test_xread_block_is_woken_by_xadd_like_redis(partita_server, redis_server, protocol):
    mine = _wake_scenario(port_of(partita_server), protocol)
    theirs = _wake_scenario(port_of(redis_server), protocol)
    assert mine == theirs
    assert parse(mine) in ([[b"s", [[b"2-1", [b"new", b"y"]]]]], [(b"s", [[b"2-1", [b"new", b"y"]]])])


@pytest.mark.parametrize("protocol", [2, 3])
def test_xread_block_timeout_returns_null(partita_server, protocol):
    with RespClient(port_of(partita_server), protocol) as c:
        started = time.monotonic()
        reply = c.call("XREAD", "BLOCK", "150", "STREAMS", "s", "$")
        elapsed = time.monotonic() - started
    assert reply == (b"*-1\r\n" if protocol == 2 else b"_\r\n")
    assert 0.14 <= elapsed < 3.0


def test_xread_block_count_and_explicit_id(partita_server):
    port = port_of(partita_server)
    with RespClient(port) as reader, RespClient(port) as writer:
        reader.send("XREAD", "COUNT", "1", "BLOCK", "5000", "STREAMS", "s", "0-0")
        _wait_until(lambda: _blocked_clients(port) == 1)
        writer.send("MULTI")
        writer.read_reply()
        for n in (1, 2):
            writer.call("XADD", "s", f"{n}-0", "n", str(n))
        writer.call("EXEC")
        reply = parse(reader.read_reply())
        assert reply == [[b"s", [[b"1-0", [b"n", b"1"]]]]]


def test_many_blocked_clients_on_one_key_all_wake(partita_server):
    port = port_of(partita_server)
    readers = [RespClient(port) for _ in range(25)]
    try:
        for r in readers:
            r.send("XREAD", "BLOCK", "0", "STREAMS", "hot", "$")
        _wait_until(lambda: _blocked_clients(port) == len(readers))
        with RespClient(port) as writer:
            writer.call("XADD", "hot", "7-7", "k", "v")
        for r in readers:
            r.sock.settimeout(WAKE_TIMEOUT_S)
            assert parse(r.read_reply()) == [[b"hot", [[b"7-7", [b"k", b"v"]]]]]
        _wait_until(lambda: _blocked_clients(port) == 0)
    finally:
        for r in readers:
            r.close()


def test_write_to_another_key_does_not_wake(partita_server):
    port = port_of(partita_server)
    with RespClient(port) as reader, RespClient(port) as writer:
        reader.send("XREAD", "BLOCK", "300", "STREAMS", "quiet", "$")
        _wait_until(lambda: _blocked_clients(port) == 1)
        writer.call("XADD", "noisy", "1-1", "k", "v")
        reader.sock.settimeout(WAKE_TIMEOUT_S)
        assert reader.read_reply() == b"*-1\r\n"


def test_xdel_wakes_but_the_reader_keeps_waiting(partita_server):
    port = port_of(partita_server)
    with RespClient(port) as reader, RespClient(port) as writer:
        writer.call("XADD", "s", "1-1", "k", "v")
        reader.send("XREAD", "BLOCK", "0", "STREAMS", "s", "$")
        _wait_until(lambda: _blocked_clients(port) == 1)
        writer.call("XDEL", "s", "1-1")
        time.sleep(0.05)
        assert _blocked_clients(port) == 1
        writer.call("XADD", "s", "2-1", "k", "v")
        reader.sock.settimeout(WAKE_TIMEOUT_S)
        assert parse(reader.read_reply()) == [[b"s", [[b"2-1", [b"k", b"v"]]]]]


def test_a_killed_client_does_not_leak_its_wait(partita_server):
    port = port_of(partita_server)
    victim = RespClient(port)
    victim.send("XREAD", "BLOCK", "0", "STREAMS", "s", "$")
    _wait_until(lambda: _blocked_clients(port) == 1)
    victim.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    victim.close()  # RST, like a killed process
    _wait_until(lambda: _blocked_clients(port) == 0)
    with RespClient(port) as c:
        assert c.call("XADD", "s", "1-1", "k", "v") == b"$3\r\n1-1\r\n"
        assert c.call("PING") == b"+PONG\r\n"


def test_a_closed_group_reader_does_not_leak_its_wait_and_pipelined_commands_still_run(partita_server):
    """A plain close (FIN) during XREADGROUP BLOCK frees the wait too; a client
    that pipelines a command behind its blocked read still gets both replies in order."""
    port = port_of(partita_server)
    with RespClient(port) as c:
        c.call("XGROUP", "CREATE", "gs", "g", "$", "MKSTREAM")
    leaver = RespClient(port)
    leaver.send("XREADGROUP", "GROUP", "g", "c1", "BLOCK", "0", "STREAMS", "gs", ">")
    _wait_until(lambda: _blocked_clients(port) == 1)
    leaver.close()
    _wait_until(lambda: _blocked_clients(port) == 0)
    with RespClient(port) as stayer, RespClient(port) as writer:
        stayer.send("XREAD", "BLOCK", "0", "STREAMS", "gs", "$")
        stayer.send("PING")
        _wait_until(lambda: _blocked_clients(port) == 1)
        writer.call("XADD", "gs", "5-1", "k", "v")
        stayer.sock.settimeout(WAKE_TIMEOUT_S)
        assert parse(stayer.read_reply()) == [[b"gs", [[b"5-1", [b"k", b"v"]]]]]
        assert stayer.read_reply() == b"+PONG\r\n"


def test_block_waits_across_many_writes_from_threads(partita_server):
    """A reader that loops on XREAD BLOCK with the last ID it saw gets every entry once."""
    port = port_of(partita_server)
    total = 200
    got: list[bytes] = []

    def consume():
        with RespClient(port) as c:
            last = b"0-0"
            while len(got) < total:
                reply = parse(c.call("XREAD", "BLOCK", "2000", "COUNT", "50", "STREAMS", "flow", last))
                assert reply is not None, "timed out"
                for stream_id, _ in reply[0][1]:
                    got.append(stream_id)
                    last = stream_id

    thread = threading.Thread(target=consume)
    thread.start()
    with RespClient(port) as w:
        for n in range(1, total + 1):
            w.call("XADD", "flow", f"{n}-0", "n", str(n))
    thread.join(timeout=20)
    assert not thread.is_alive()
    assert got == [b"%d-0" % n for n in range(1, total + 1)]
