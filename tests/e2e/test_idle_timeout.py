"""The idle ``timeout`` on a real ``partita`` process: what Redis does.

Redis closes a client idle for longer than ``timeout`` seconds, checked
against the value in force now (its clientsCron), so a ``CONFIG SET
timeout`` reaches every connected client, idle ones included; clients that
wait for something (BLOCK, MONITOR) are not closed. Checked against
redis-server 7.0: a client idle when ``CONFIG SET timeout 1`` is made is
closed ~1.5 s later; one whose timeout was set back to 0 is not.
"""

from __future__ import annotations

import pytest

from server.kafka import codec
from tests.conftest import KafkaRaw, RawConn, read_until_closed, resp_command, wait_for


def _parked(port: int) -> RawConn:
    """A client that was answered and sends nothing more (its connection
    waits for input)."""
    conn = RawConn(port, timeout_s=10)
    assert conn.request(b"PING\r\n") == b"+PONG\r\n"
    return conn


def _config_set_timeout(admin: RawConn, seconds: int) -> None:
    assert admin.request(resp_command(b"CONFIG", b"SET", b"timeout", b"%d" % seconds)) == b"+OK\r\n"


def _idle_s(admin: RawConn, conn: RawConn) -> int:
    """``conn``'s idle seconds as CLIENT LIST reports them (``admin`` asks)."""
    port = conn.sock.getsockname()[1]
    for line in admin.request(resp_command(b"CLIENT", b"LIST")).split(b"\n"):
        if b":%d " % port in line:
            return int(line.split(b" idle=")[1].split(b" ")[0])
    raise AssertionError(f"client on port {port} not listed")


def test_a_timeout_set_while_a_client_is_idle_closes_it(partita_factory):
    server = partita_factory()  # timeout 0: the client waits for input without a timer
    with RawConn(server.port) as admin, _parked(server.port) as idle:
        assert wait_for(lambda: _idle_s(admin, idle) >= 1)  # its connection waits for input
        _config_set_timeout(admin, 1)
        assert read_until_closed(idle.sock) == b""  # (a socket timeout of 10 s fails it)


def test_a_timeout_lowered_while_a_client_is_idle_closes_it(partita_factory):
    server = partita_factory(["--timeout", "100"])
    with RawConn(server.port) as admin, _parked(server.port) as idle:
        assert wait_for(lambda: _idle_s(admin, idle) >= 1)  # its connection waits for input
        _config_set_timeout(admin, 1)
        assert read_until_closed(idle.sock) == b""


def test_a_timeout_turned_off_while_a_client_is_idle_keeps_it(partita_factory):
    server = partita_factory(["--timeout", "2"])
    with RawConn(server.port) as admin, _parked(server.port) as idle:
        assert wait_for(lambda: _idle_s(admin, idle) >= 1)  # its connection waits for input
        _config_set_timeout(admin, 0)
        # Idle past the old timeout, as the server counts it (CLIENT LIST):
        # the behaviour is about time, so real time passes here.
        assert wait_for(lambda: _idle_s(admin, idle) >= 3, timeout_s=10)
        assert idle.request(b"PING\r\n") == b"+PONG\r\n"


@pytest.mark.parametrize("fsync, request_, reply_start", [
    ("everysec", b"PING\r\n", b"+PONG"),
    # The last replies were handed to the group commit: their connection waits
    # for them, then for input, and is idle once they are out.
    ("always", resp_command(b"XADD", b"s", b"*", b"f", b"v"), b"$"),
])
def test_a_timeout_closes_a_client_idle_after_its_replies(partita_factory, fsync, request_, reply_start):
    server = partita_factory(["--timeout", "1", "--appendfsync", fsync])
    with RawConn(server.port, timeout_s=10) as conn:
        assert conn.request(request_).startswith(reply_start)
        assert read_until_closed(conn.sock) == b""


def test_a_timeout_spares_blocked_and_monitor_clients(partita_factory):
    server = partita_factory()
    with RawConn(server.port, timeout_s=10) as blocked, RawConn(server.port, timeout_s=10) as monitor:
        blocked.sock.sendall(resp_command(b"XREAD", b"BLOCK", b"0", b"STREAMS", b"s", b"$"))
        assert monitor.request(b"MONITOR\r\n") == b"+OK\r\n"
        with RawConn(server.port) as admin:
            assert wait_for(lambda: b"blocked_clients:1" in admin.request(resp_command(b"INFO", b"clients")))
            with _parked(server.port) as idle:  # idle for less time than the two others
                assert wait_for(lambda: _idle_s(admin, idle) >= 1)  # its connection waits for input
                _config_set_timeout(admin, 1)
                assert read_until_closed(idle.sock) == b""
            admin.sock.close()
        with RawConn(server.port) as writer:
            _config_set_timeout(writer, 0)
            assert writer.request(resp_command(b"XADD", b"s", b"1-0", b"f", b"v")) == b"$3\r\n1-0\r\n"
        assert blocked.request(b"") == b"*1\r\n*2\r\n$1\r\ns\r\n*1\r\n*2\r\n$3\r\n1-0\r\n*2\r\n$1\r\nf\r\n$1\r\nv\r\n"
        lines = b""
        while b'"XADD" "s" "1-0"' not in lines:  # (a socket timeout of 10 s fails it)
            chunk = monitor.sock.recv(65536)
            assert chunk, "the monitor was closed"
            lines += chunk


def test_a_timeout_set_while_a_kafka_client_is_idle_closes_it(kafka_partita):
    """The Kafka port's clients are the server's clients too (CLIENT LIST,
    maxclients): the timeout in force reaches them as it reaches RESP ones."""
    server = kafka_partita()
    with RawConn(server.port) as admin, KafkaRaw(server.kafka_port) as kafka:
        assert kafka.call(codec.ApiVersionsRequest(), 3).error_code == 0

        def kafka_idle_s() -> int:
            line = next(line for line in admin.request(resp_command(b"CLIENT", b"LIST")).split(b"\n")
                        if b"lib-name=kafka" in line)
            return int(line.split(b" idle=")[1].split(b" ")[0])

        assert wait_for(lambda: kafka_idle_s() >= 1)  # its connection waits for the next request
        _config_set_timeout(admin, 1)
        assert kafka.read_frame() is None  # closed (a socket timeout of 10 s fails it)
