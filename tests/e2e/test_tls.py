"""The TLS port end to end: redis-py over TLS, client certificates, plain text on the TLS port.

Certificates are made per test module with the ``openssl`` command line (the
``certs`` fixture of tests/conftest.py: a CA, a server certificate for
127.0.0.1 signed by it, a client certificate).
"""

from __future__ import annotations

import socket
import ssl
import time
from pathlib import Path

import pytest
import redis

from tests.conftest import PartitaProcess, free_port, read_until_closed, wait_for

def _tls_args(certs: Path, auth_clients: str = "no") -> list[str]:
    return ["--tls-port", str(free_port()), "--tls-cert-file", str(certs / "server.crt"),
            "--tls-key-file", str(certs / "server.key"), "--tls-ca-cert-file", str(certs / "ca.crt"),
            "--tls-auth-clients", auth_clients]


def _tls_port(server: PartitaProcess) -> int:
    return int(server.extra_args[server.extra_args.index("--tls-port") + 1])


def _tls_client(server: PartitaProcess, certs: Path, **kwargs) -> redis.Redis:
    kwargs.setdefault("socket_timeout", 10)
    return redis.Redis(host="127.0.0.1", port=_tls_port(server), ssl=True, ssl_ca_certs=str(certs / "ca.crt"),
                       **kwargs)


def test_redis_py_over_tls_xadd_xread(partita_factory, certs):
    server = partita_factory(_tls_args(certs))
    assert "Listening (TLS) on 127.0.0.1:" in server.log()
    r = _tls_client(server, certs)
    assert r.ping()
    entry_id = r.xadd("orders", {"item": "book"})
    assert r.xread({"orders": "0"}) == [[b"orders", [(entry_id, {b"item": b"book"})]]]
    r3 = _tls_client(server, certs, protocol=3)
    assert r3.xrange("orders") == [(entry_id, {b"item": b"book"})]
    # the plain port serves the same data
    assert server.client().xlen("orders") == 1
    # a blocking read over TLS is woken by a write on the plain port
    r.xread({"orders": "$"}, block=10)
    started = time.monotonic()
    import threading

    got = {}
    r.client_setname("tls-reader")
    t = threading.Thread(target=lambda: got.setdefault("r", r.xread({"orders": "$"}, block=5000)))
    t.start()
    plain = server.client()
    assert wait_for(lambda: any(c["name"] == "tls-reader" and "b" in c["flags"] for c in plain.client_list()))
    plain.xadd("orders", {"item": "pen"})
    t.join(10)
    assert got["r"][0][1][0][1] == {b"item": b"pen"} and time.monotonic() - started < 5
    # big replies cross TLS records intact
    big = r.xadd("big", {"v": "x" * 500_000})
    assert r.xrange("big") == [(big, {b"v": b"x" * 500_000})]


def test_plain_text_on_the_tls_port_fails_cleanly_without_affecting_others(partita_factory, certs):
    server = partita_factory(_tls_args(certs))
    r = _tls_client(server, certs)
    assert r.ping()
    with socket.create_connection(("127.0.0.1", _tls_port(server)), timeout=5) as plain:
        plain.sendall(b"PING\r\n")
        data = read_until_closed(plain)
        assert b"PONG" not in data  # closed without a RESP reply
    assert r.xadd("s", {"a": 1}) and r.ping()
    assert server.client().ping()
    with pytest.raises(redis.ConnectionError):
        # a client that does not trust the certificate fails its handshake only
        redis.Redis(host="127.0.0.1", port=_tls_port(server), ssl=True, socket_timeout=5).ping()
    assert r.ping()
    assert server.proc.poll() is None


def test_tls_auth_clients_yes_requires_a_client_certificate(partita_factory, certs):
    server = partita_factory(_tls_args(certs, "yes"))
    with pytest.raises(redis.ConnectionError):
        _tls_client(server, certs, socket_timeout=5).ping()
    r = _tls_client(server, certs, ssl_certfile=str(certs / "client.crt"), ssl_keyfile=str(certs / "client.key"))
    assert r.ping()


def test_tls_with_acl_user(partita_factory, certs):
    server = partita_factory(_tls_args(certs) + ["--requirepass", "pw"])
    r = _tls_client(server, certs, password="pw")
    r.execute_command("ACL SETUSER", "reader", "on", ">rp", "~*", "-@all", "+@read", "+@connection")
    reader = _tls_client(server, certs, username="reader", password="rp")
    assert reader.xlen("s") == 0
    with pytest.raises(redis.exceptions.NoPermissionError):
        reader.xadd("s", {"a": 1})


def test_tls_port_without_certificate_stops_the_start(tmp_path):
    server = PartitaProcess(tmp_path / "data", ["--tls-port", str(free_port())])
    with pytest.raises(RuntimeError, match="tls-cert-file"):
        server.start()
    assert server.proc.returncode == 1
    assert not (tmp_path / "data").exists()


def test_non_loopback_without_password_logs_a_warning(tmp_path):
    server = PartitaProcess(tmp_path / "data")
    server.host = "0.0.0.0"
    server.start()
    try:
        assert "listening on a non-loopback address without a password" in server.log()
    finally:
        server.stop()
    protected = PartitaProcess(tmp_path / "data2", ["--requirepass", "x"])
    protected.host = "0.0.0.0"
    protected.start()
    try:
        assert "non-loopback" not in protected.log()
    finally:
        protected.stop()


def test_default_bind_is_loopback_and_logs_no_warning(partita_server):
    from server.config import Config

    assert Config().bind == "127.0.0.1"
    assert "non-loopback" not in partita_server.log()
    assert ssl  # (the TLS tests above need the stdlib ssl module)


def _tls_socket(server: PartitaProcess, certs: Path) -> ssl.SSLSocket:
    context = ssl.create_default_context(cafile=str(certs / "ca.crt"))
    raw = socket.create_connection(("127.0.0.1", _tls_port(server)), timeout=10)
    return context.wrap_socket(raw, server_hostname="127.0.0.1")


def _read_replies(sock: ssl.SSLSocket, n: int) -> list:
    import hiredis

    reader = hiredis.Reader(replyError=lambda message: ("error", message))
    replies: list = []
    while len(replies) < n:
        reply = reader.gets()
        if reply is not False:
            replies.append(reply)
            continue
        chunk = sock.recv(65536)
        assert chunk, f"closed after {len(replies)} of {n} replies"
        reader.feed(chunk)
    return replies


def _blocked_clients(server: PartitaProcess) -> int:
    return server.client().info("clients")["blocked_clients"]


def _wait_until(predicate, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError("condition not reached in time")


@pytest.mark.parametrize("close_notify", [False, True], ids=["fin", "close-notify"])
def test_tls_client_disconnecting_during_xread_block_is_freed(partita_factory, certs, close_notify):
    server = partita_factory(_tls_args(certs))
    leaver = _tls_socket(server, certs)
    leaver.sendall(b"XREAD BLOCK 0 STREAMS s $\r\n")
    _wait_until(lambda: _blocked_clients(server) == 1)
    if close_notify:
        leaver = leaver.unwrap()  # TLS close_notify, then the TCP close
    leaver.close()
    _wait_until(lambda: _blocked_clients(server) == 0)
    # A command pipelined behind a blocked read over TLS runs after it, in order.
    with _tls_socket(server, certs) as stayer:
        stayer.sendall(b"XREAD BLOCK 0 STREAMS s $\r\n")
        _wait_until(lambda: _blocked_clients(server) == 1)
        stayer.sendall(b"PING\r\n")
        time.sleep(0.05)
        assert _blocked_clients(server) == 1  # the PING waits behind the read
        server.client().xadd("s", {"k": "v"}, id="5-1")
        assert _read_replies(stayer, 2) == [[[b"s", [[b"5-1", [b"k", b"v"]]]]], b"PONG"]
    assert server.proc.poll() is None


def test_tls_pipelined_xadds_are_answered_in_order(partita_factory, certs):
    from server.resp import encode_command

    server = partita_factory(_tls_args(certs))
    n = 500
    payload = b"".join(encode_command([b"XADD", b"s", b"1-%d" % i, b"f", b"%d" % i]) for i in range(1, n + 1))
    payload += encode_command([b"XADD", b"s", b"1-1", b"f", b"late"])  # an ID too small: an error, in place
    payload += encode_command([b"XLEN", b"s"]) + encode_command([b"XADD", b"s", b"2-1", b"f", b"last"])
    with _tls_socket(server, certs) as s:
        s.sendall(payload)
        replies = _read_replies(s, n + 3)
    assert replies[:n] == [b"1-%d" % i for i in range(1, n + 1)]
    assert replies[n][0] == "error" and "equal or smaller" in replies[n][1]
    assert replies[n + 1:] == [n, b"2-1"]
    entries = server.client().xrange("s")
    assert [e[0] for e in entries] == [b"1-%d" % i for i in range(1, n + 1)] + [b"2-1"]


def test_tls_output_buffer_hard_limit_closes_a_client_that_never_reads(partita_factory, certs):
    server = partita_factory(_tls_args(certs) + ["--client-output-buffer-limit", "normal 256kb 0 0"])
    r = server.client()
    r.xadd("big", {"v": "x" * 1_000_000})
    with _tls_socket(server, certs) as never_reads:
        never_reads.sendall(b"XRANGE big - +\r\n" * 20)
        _wait_until(lambda: "overcoming of output buffer limits" in server.log())
        _wait_until(lambda: len(r.client_list()) == 1)  # only r is left
    assert r.ping()


def test_monitor_over_tls(partita_factory, certs):
    """A monitor on the TLS port waits for its input and for lines at once
    (the wait for input is cancelled whenever lines come) and still reads
    its own commands: each reply before its own line."""
    server = partita_factory(_tls_args(certs))
    plain = server.client()
    plain.ping()  # (its handshake before the monitor)
    r = _tls_client(server, certs)
    with r.monitor() as m:
        for i in range(3):
            plain.xadd("t", {"f": "v"}, id=f"1-{i + 1}")
            assert m.next_command()["command"] == f"XADD t 1-{i + 1} f v"
        m.connection.send_command("PING")
        assert m.connection.read_response() in (b"PONG", "PONG")
        assert m.next_command()["command"] == "PING"
        plain.xlen("t")
        assert m.next_command()["command"] == "XLEN t"
