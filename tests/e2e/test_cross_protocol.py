"""Cross-protocol scripting: an HTTP request sent to the server runs nothing.

A web page can make a browser POST to ``http://127.0.0.1:6379/``; the request
line and headers are not commands, but a server that answers each bad line
with an error and goes on would run the body. Partita does what redis-server
does (``processCommand`` / ``securityWarningCommand``): a command named
``POST`` or ``Host:``, inline or multibulk, closes the connection at once,
sends nothing, runs nothing after it, and logs a warning at most once a
minute. The real redis-server is the reference for what the client sees.
"""

from __future__ import annotations

import re

import pytest

from tests.conftest import RawConn, raw_exchange

ATTACK_LOG = ("Possible SECURITY ATTACK detected. It looks like somebody is sending POST or Host: commands to "
              "Redis. This is likely due to an attacker attempting to use Cross Protocol Scripting to compromise "
              "your Redis instance. Connection aborted.")

BODY = b"XADD pwned * a b\r\nTOPIC DELETE t\r\n"


def http_post(body: bytes) -> bytes:
    return (b"POST / HTTP/1.1\r\nHost: 127.0.0.1:6379\r\nContent-Type: text/plain\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body) + body)


HTTP_POST = http_post(BODY)
# The forms the server takes from the received bytes before parsing them
# (a run of XADD key * ..., a lone XREAD poll): never reached after a POST.
MULTIBULK_BODY = (b"*5\r\n$4\r\nXADD\r\n$5\r\npwned\r\n$1\r\n*\r\n$1\r\na\r\n$1\r\nb\r\n"
                  b"*6\r\n$5\r\nXREAD\r\n$5\r\nCOUNT\r\n$1\r\n1\r\n$7\r\nSTREAMS\r\n$5\r\npwned\r\n$1\r\n0\r\n")


def _attack_count(log: str) -> int:
    return len(re.findall(re.escape(ATTACK_LOG), log))


def test_http_post_runs_nothing_closes_and_logs_once(partita_server):
    with RawConn(partita_server.port) as conn:
        assert conn.request(b"TOPIC CREATE t\r\n") == b"+OK\r\n"
    for _ in range(2):
        reply, closed = raw_exchange(partita_server.port, HTTP_POST)
        assert (reply, closed) == (b"", True)
    with RawConn(partita_server.port) as conn:
        assert conn.request(b"EXISTS pwned\r\nEXISTS t\r\n", replies=2) == b":0\r\n:1\r\n"
    # Rate-limited as Redis's: the second attempt, within a minute, is not logged again.
    assert _attack_count(partita_server.log()) == 1


@pytest.mark.parametrize(
    "payload",
    [
        HTTP_POST,
        http_post(MULTIBULK_BODY),
        b"post / HTTP/1.1\r\nXADD pwned * a b\r\n",
        b"HOST: x\r\nXADD pwned * a b\r\n",
        # multibulk, after a command that ran: its reply is not sent either
        b"XADD first * a b\r\n*2\r\n$5\r\nHost:\r\n$1\r\nx\r\nXADD pwned * a b\r\n",
        # inside MULTI: checked before anything is queued
        b"MULTI\r\nPOST /\r\nXADD pwned * a b\r\nEXEC\r\n",
        # before AUTH too (Redis checks it before anything else)
        b"AUTH nobody wrong\r\nPOST / HTTP/1.0\r\n",
    ],
    ids=["http-post", "http-post-multibulk-body", "inline-lowercase", "inline-host", "multibulk-after-a-command", "in-multi", "before-auth"],
)
def test_post_and_host_close_as_redis_does(partita_server, redis_server, payload):
    ours = raw_exchange(partita_server.port, payload)
    theirs = raw_exchange(redis_server.port, payload)
    assert ours == theirs == (b"", True)
    for server in (partita_server, redis_server):
        with RawConn(server.port) as conn:
            assert conn.request(b"EXISTS pwned\r\n") == b":0\r\n"


def test_a_post_after_a_split_receive_still_runs_nothing(partita_server):
    """The POST line arrives alone (the body in a later segment): the body is never read."""
    import socket

    with socket.create_connection(("127.0.0.1", partita_server.port), timeout=5) as sock:
        sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\n")
        assert sock.recv(100) == b""  # closed, nothing sent
        try:
            sock.sendall(b"\r\n" + MULTIBULK_BODY)
        except OSError:
            pass
    with RawConn(partita_server.port) as conn:
        assert conn.request(b"EXISTS pwned\r\n") == b":0\r\n"
