"""Large log-read replies through a real ``partita``: an XREAD whose entries
are 32 KB or more of mapped bytes leaves by ``server._mapsend`` (the mapped
chunks spliced into the socket by reference, docs/architecture.md step 7).
What the client reads must be the same bytes the copying path sends:
XREAD's reply is ``*1 *2 <key>`` and then exactly XRANGE's reply for the
same entries, for a reader that takes it a little at a time, for replies
pipelined back to back, and with entries appended while the reply is still
in the socket. (The entries are added as pipelined runs of ``XADD s *``,
so that a reply is a few log batches, as a producer's are: a reply of more
chunks than one gathering send takes is joined and copied instead.)"""

from __future__ import annotations

import socket

import pytest

from tests.e2e.groups_support import Resp

VALUE = "v" * 100


def _read_exactly(sock: socket.socket, n: int, chunk: int = 1024) -> bytes:
    got = bytearray()
    while len(got) < n:
        part = sock.recv(min(chunk, n - len(got)))
        assert part, "the server closed the connection"
        got += part
    return bytes(got)


def _add(r: Resp, n: int, value: str = VALUE, per_write: int = 200) -> None:
    xadd = b"*5\r\n$4\r\nXADD\r\n$1\r\ns\r\n$1\r\n*\r\n$5\r\nfield\r\n$%d\r\n%s\r\n" % (
        len(value), value.encode())
    for done in range(0, n, per_write):
        k = min(per_write, n - done)
        r.sock.sendall(xadd * k)
        got = b""
        while got.count(b"\r\n") < 2 * k:  # k bulk-string IDs
            got += r.sock.recv(65536)


@pytest.fixture
def filled(partita_server):
    r = Resp(partita_server.port)
    _add(r, 3000)
    return partita_server, r


def _xread_bytes(xrange_reply: bytes) -> bytes:
    return b"*1\r\n*2\r\n$1\r\ns\r\n" + xrange_reply


def _id(r: Resp, nth: int) -> bytes:
    """The ID of the stream's ``nth`` entry (1-based)."""
    return r.value("XRANGE", "s", "-", "+", "COUNT", str(nth))[-1][0]


def _xread(after: bytes) -> bytes:
    return b"*6\r\n$5\r\nXREAD\r\n$5\r\nCOUNT\r\n$4\r\n1000\r\n$7\r\nSTREAMS\r\n$1\r\ns\r\n$%d\r\n%s\r\n" % (
        len(after), after)


def test_a_large_xread_reply_is_xranges_bytes_for_a_slow_reader(filled):
    server, r = filled
    whole = r.call("XRANGE", "s", "-", "+", "COUNT", "1000")
    thousandth = _id(r, 1000)
    later = r.call("XRANGE", "s", b"(" + thousandth, "+", "COUNT", "1000")
    expected = _xread_bytes(whole) + _xread_bytes(later)
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        # Two polls pipelined: the second's reply follows the first's whole.
        sock.sendall(_xread(b"0-0") + _xread(thousandth))
        assert _read_exactly(sock, len(expected)) == expected


def test_entries_appended_while_a_spliced_reply_waits_in_the_socket_do_not_change_it(filled):
    server, r = filled
    after = _id(r, 2000)
    expected = _xread_bytes(r.call("XRANGE", "s", b"(" + after, "+", "COUNT", "1000"))
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(_xread(after))  # one poll (answered in the reactor's step)
        head = _read_exactly(sock, 64)
        _add(r, 200, "w" * 100)  # into the same segment, past the bytes in flight
        assert head + _read_exactly(sock, len(expected) - 64) == expected
