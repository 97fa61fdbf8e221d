"""A client that leaves is freed, whatever state its connection is in.

End to end on a real ``partita`` process: clients connect, leave (close, or
shut their write side) in each state a connection can be in, and INFO
``connected_clients`` must come back to what it was, as redis-server frees
them: idle, parked mid-command, held for a group commit and taken by the
reactor (``fsync always``), blocked in XREAD / XREADGROUP BLOCK. A client
that leaves with its EOF in the same arrival as its last bytes is the case
an edge-triggered readiness set can miss (server/reactor.py); each scenario
runs many times so that such arrivals happen.

A client that only shuts its write side after complete commands gets their
replies, then the server closes (redis-server does the same).
"""

from __future__ import annotations

import socket
import time

import pytest

from tests.conftest import RawConn, raw_exchange

FREED_WITHIN_S = 10.0  # bound of the polls below; a leak never gets there
HALF_XADD = b"*3\r\n$4\r\nXADD\r\n"


class _Monitor:
    """One client, connected before the others, that reads INFO fields."""

    def __init__(self, port: int, password: str | None = None) -> None:
        self.conn = _connect(port)
        if password is not None:
            assert self.conn.request(b"AUTH %s\r\n" % password.encode()) == b"+OK\r\n"

    def field(self, section: bytes, name: bytes) -> int:
        text = self.conn.request(b"INFO %s\r\n" % section)
        for line in text.split(b"\r\n"):
            if line.startswith(name + b":"):
                return int(line.split(b":")[1])
        raise AssertionError(f"INFO {section!r} has no {name!r}")

    def clients(self) -> int:
        return self.field(b"clients", b"connected_clients")

    def blocked(self) -> int:
        return self.field(b"clients", b"blocked_clients")

    def wait_for(self, read, expected: int, what: str) -> None:
        """Poll ``read()`` until it is ``expected`` (bounded: a leak never gets there)."""
        deadline = time.monotonic() + FREED_WITHIN_S
        seen = read()
        while seen != expected:
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: {seen}, not {expected}, after {FREED_WITHIN_S}s")
            time.sleep(0.02)
            seen = read()

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def monitor():
    """``monitor(server, password=None)``: a ``_Monitor`` of that server."""
    made: list[_Monitor] = []

    def make(server, password: str | None = None) -> _Monitor:
        made.append(_Monitor(server.port, password))
        return made[-1]

    yield make
    for m in made:
        m.close()


def _connect(port: int) -> RawConn:
    return RawConn(port, timeout_s=FREED_WITHIN_S)


def _read_to_eof(sock: socket.socket) -> bytes:
    """Everything until the server closes (a timeout fails: it never did)."""
    chunks = []
    while True:
        data = sock.recv(65536)
        if not data:
            return b"".join(chunks)
        chunks.append(data)


def _xadd(key: bytes, n: int = 1) -> bytes:
    return b"".join(b"*5\r\n$4\r\nXADD\r\n$%d\r\n%s\r\n$1\r\n*\r\n$1\r\nf\r\n$1\r\nv\r\n" % (len(key), key)
                    for _ in range(n))


# -- finding: 300 half commands, then close ------------------------------------

@pytest.mark.parametrize("password", [None, "pw"], ids=["open", "requirepass"])
def test_clients_that_leave_mid_command_are_freed(partita_factory, monitor, password):
    args = ["--maxclients", "100"] + ([] if password is None else ["--requirepass", password])
    server = partita_factory(args)
    watch = monitor(server, password)
    baseline = watch.clients()
    # Without a password the half command is an XADD's; with one, an AUTH's
    # (the client never authenticates).
    half = HALF_XADD if password is None else b"*2\r\n$4\r\nAUTH\r\n"
    for _ in range(300):
        with _connect(server.port) as c:
            c.sock.sendall(half)
    watch.wait_for(watch.clients, baseline, "connected_clients")
    # Nothing counts against maxclients: a new client is served.
    auth = b"" if password is None else b"AUTH %s\r\n" % password.encode()
    reply, _ = raw_exchange(server.port, auth + b"PING\r\n")
    assert reply.endswith(b"+PONG\r\n")


# -- each state of a connection --------------------------------------------------

def test_clients_that_leave_idle_or_after_replies_are_freed(partita_server, monitor):
    watch = monitor(partita_server)
    baseline = watch.clients()
    for i in range(100):
        with _connect(partita_server.port) as c:
            if i % 2:
                # A reply, then a command's first half in the same arrival as the EOF.
                assert c.request(b"PING\r\n") == b"+PONG\r\n"
                c.sock.sendall(b"*2\r\n$4\r\nECHO\r\n")
    watch.wait_for(watch.clients, baseline, "connected_clients")


@pytest.mark.parametrize("leave", ["with-the-batch", "after-the-replies"])
def test_clients_that_leave_under_fsync_always_are_freed(partita_factory, monitor, leave):
    """``with-the-batch``: XADDs and EOF in one arrival, held for the group
    commit. ``after-the-replies``: the held batch is out and the reactor
    takes the connection's next XADD batch, which comes with the EOF."""
    server = partita_factory(["--appendfsync", "always"])
    watch = monitor(server)
    baseline = watch.clients()
    for i in range(60):
        with _connect(server.port) as c:
            key = b"k%d" % (i % 3)
            if leave == "after-the-replies":
                c.request(_xadd(key, 4), replies=4)
            # XADDs (and, every other time, a half command), EOF.
            c.sock.sendall(_xadd(key, 2) + (HALF_XADD if i % 2 else b""))
    watch.wait_for(watch.clients, baseline, "connected_clients")


@pytest.mark.parametrize("command", [
    b"XREAD BLOCK 0 STREAMS s $\r\n",
    b"XREADGROUP GROUP g c BLOCK 0 STREAMS s >\r\n",
], ids=["xread", "xreadgroup"])
@pytest.mark.parametrize("then", ["close", "send-then-close", "shutdown-write"])
def test_blocked_clients_that_leave_are_freed(partita_server, monitor, command, then):
    """Redis frees a blocked client whose connection drops, even one that
    sent more commands while blocked (they wait behind the blocking one),
    and one that only shut its write side."""
    watch = monitor(partita_server)
    assert watch.conn.request(b"XGROUP CREATE s g $ MKSTREAM\r\n") == b"+OK\r\n"
    baseline = watch.clients()
    for _ in range(5):
        with _connect(partita_server.port) as c:
            c.sock.sendall(command)
            watch.wait_for(watch.blocked, 1, "blocked_clients")
            if then == "send-then-close":
                c.sock.sendall(b"PING\r\n")
            if then == "shutdown-write":
                c.sock.shutdown(socket.SHUT_WR)
            else:
                c.close()
            watch.wait_for(watch.clients, baseline, "connected_clients")
            assert watch.blocked() == 0


# -- half-close: the replies of complete commands are not lost --------------------

HALF_CLOSED_REQUEST = b"PING\r\nECHO hi\r\n*2\r\n$4\r\nECHO"
HALF_CLOSED_REPLY = b"+PONG\r\n$2\r\nhi\r\n"


def _half_close(port: int, payload: bytes) -> bytes:
    with _connect(port) as c:
        c.sock.sendall(payload)
        c.sock.shutdown(socket.SHUT_WR)
        return _read_to_eof(c.sock)


@pytest.mark.redis
def test_a_half_closed_client_gets_its_replies_then_is_closed_like_redis(partita_server, redis_server, monitor):
    assert _half_close(redis_server.port, HALF_CLOSED_REQUEST) == HALF_CLOSED_REPLY
    watch = monitor(partita_server)
    baseline = watch.clients()
    for _ in range(50):
        assert _half_close(partita_server.port, HALF_CLOSED_REQUEST) == HALF_CLOSED_REPLY
    watch.wait_for(watch.clients, baseline, "connected_clients")


def test_a_half_closed_client_gets_its_held_replies_under_fsync_always(partita_factory, monitor):
    server = partita_factory(["--appendfsync", "always"])
    watch = monitor(server)
    baseline = watch.clients()
    for i in range(30):
        with _connect(server.port) as c:
            if i % 2:  # the next batch is taken by the reactor
                c.request(_xadd(b"s", 2), replies=2)
            c.sock.sendall(_xadd(b"s", 3))
            c.sock.shutdown(socket.SHUT_WR)
            replies = _read_to_eof(c.sock)
        assert replies.count(b"-") == 3 and replies.startswith(b"$"), replies
    watch.wait_for(watch.clients, baseline, "connected_clients")
    assert watch.conn.request(b"XLEN s\r\n") == b":%d\r\n" % (15 * 2 + 30 * 3)
