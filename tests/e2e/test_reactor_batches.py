"""Batches of a parked client, run in the reactor's step, behave as the task's.

End to end on a real ``partita`` process. A client that waits for each reply
before its next request finds its connection's task parked, and what it
sends next is run in the reactor's step with the task's own executor
(``Connection._serve_parked``, docs/architecture.md step 1); replies that
wait for a commit are answered at the end of the reactor's step; whatever
cannot finish there (a command that waits, MONITOR, a close, a reply the
socket does not take whole) goes on in the task, in order. Each test sends such a batch after a reply (``_parked``) and
checks what any client can see: the replies and their order, what other
clients see (MONITOR, CLIENT KILL, INFO), the close.
"""

from __future__ import annotations

import socket

import pytest

from tests.conftest import RawConn, read_until_closed, resp_command, wait_for


def _parked(port: int) -> RawConn:
    """A client whose connection answered a request and waits for the next."""
    conn = RawConn(port)
    assert conn.request(b"PING\r\n") == b"+PONG\r\n"
    return conn


def _info_field(conn: RawConn, section: bytes, name: bytes) -> bytes:
    for line in conn.request(resp_command(b"INFO", section)).split(b"\r\n"):
        if line.startswith(name + b":"):
            return line.split(b":", 1)[1]
    raise AssertionError(f"no {name!r} in INFO {section!r}")


@pytest.fixture
def port(partita_shared):
    with RawConn(partita_shared.port) as admin:
        assert admin.request(b"FLUSHALL\r\n") == b"+OK\r\n"
    return partita_shared.port


def test_a_pipeline_of_commands_and_a_block_keeps_its_order(port):
    """The commands before a BLOCK are answered before it waits, the ones
    after it once it is answered, in order; its XADD is written first."""
    with _parked(port) as a, RawConn(port) as b:
        a.sock.sendall(resp_command(b"ECHO", b"one") + resp_command(b"XADD", b"s", b"1-0", b"f", b"v")
                       + resp_command(b"XREAD", b"BLOCK", b"10000", b"STREAMS", b"other", b"$")
                       + resp_command(b"ECHO", b"two") + resp_command(b"XLEN", b"s"))
        assert wait_for(lambda: _info_field(b, b"clients", b"blocked_clients") == b"1")
        # What came before the BLOCK is out and written already.
        assert b.request(resp_command(b"XLEN", b"s")) == b":1\r\n"
        assert b.request(resp_command(b"XADD", b"other", b"5-0", b"k", b"x")) == b"$3\r\n5-0\r\n"
        expected = (b"$3\r\none\r\n" b"$3\r\n1-0\r\n"
                    b"*1\r\n*2\r\n$5\r\nother\r\n*1\r\n*2\r\n$3\r\n5-0\r\n*2\r\n$1\r\nk\r\n$1\r\nx\r\n"
                    b"$3\r\ntwo\r\n" b":1\r\n")
        got = b""
        while len(got) < len(expected):
            got += a.sock.recv(65536)
        assert got == expected
        assert a.request(b"PING\r\n") == b"+PONG\r\n"


def test_a_block_that_times_out_after_commands_then_the_rest(port):
    with _parked(port) as a:
        replies = a.request(resp_command(b"ECHO", b"a")
                            + resp_command(b"XREAD", b"BLOCK", b"50", b"STREAMS", b"none", b"$")
                            + resp_command(b"ECHO", b"b"), replies=3)
        assert replies == b"$1\r\na\r\n*-1\r\n$1\r\nb\r\n"


def test_the_eof_right_after_a_batch_closes_after_its_replies(port):
    for i in range(20):  # the EOF in the batch's arrival, or in one of its own
        with _parked(port) as a:
            a.sock.sendall(resp_command(b"XADD", b"s", b"*", b"f", b"%d" % i) + resp_command(b"ECHO", b"last"))
            a.sock.shutdown(socket.SHUT_WR)
            data = read_until_closed(a.sock)
            assert data.endswith(b"$4\r\nlast\r\n") and data.count(b"\r\n") == 4, data
    with RawConn(port) as b:
        assert b.request(resp_command(b"XLEN", b"s")) == b":20\r\n"


def test_a_reply_bigger_than_the_socket_takes_is_sent_whole_then_the_rest(port):
    with RawConn(port) as filler:
        values = b"".join(resp_command(b"XADD", b"big", b"*", b"f", b"x" * 2000) for _ in range(300))
        filler.request(values, replies=300)
        expected = filler.request(resp_command(b"XRANGE", b"big", b"-", b"+"))
    assert len(expected) > 600_000
    a = RawConn(port)
    a.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    with a:
        assert a.request(b"PING\r\n") == b"+PONG\r\n"
        got = a.request(resp_command(b"XRANGE", b"big", b"-", b"+") + resp_command(b"ECHO", b"after"), replies=2)
        assert got == expected + b"$5\r\nafter\r\n"


def test_multi_exec_in_one_batch(port):
    with _parked(port) as a:
        got = a.request(resp_command(b"MULTI") + resp_command(b"XADD", b"s", b"1-0", b"f", b"v")
                        + resp_command(b"XREAD", b"BLOCK", b"0", b"STREAMS", b"none", b"$")
                        + resp_command(b"XLEN", b"s") + resp_command(b"EXEC") + resp_command(b"ECHO", b"z"),
                        replies=6)
        assert got == (b"+OK\r\n+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n"
                       b"*3\r\n$3\r\n1-0\r\n*-1\r\n:1\r\n" b"$1\r\nz\r\n")


def test_client_kill_of_a_parked_client_and_in_a_batch(port):
    with _parked(port) as a, _parked(port) as b, _parked(port) as c:
        a_id = a.request(b"CLIENT ID\r\n").strip(b":\r\n")
        assert b.request(resp_command(b"CLIENT", b"KILL", b"ID", a_id) + b"PING\r\n", replies=2) == b":1\r\n+PONG\r\n"
        assert read_until_closed(a.sock) == b""
        # Its own ID in a batch: skipped (SKIPME yes, as Redis), the batch goes on.
        c_id = c.request(b"CLIENT ID\r\n").strip(b":\r\n")
        assert c.request(resp_command(b"CLIENT", b"KILL", b"ID", c_id) + b"PING\r\n", replies=2) == b":0\r\n+PONG\r\n"
        # SKIPME no: it closes after the reply, and runs nothing after it.
        c.sock.sendall(resp_command(b"CLIENT", b"KILL", b"ID", c_id, b"SKIPME", b"no") + b"PING\r\n")
        assert b"PONG" not in read_until_closed(c.sock)


def test_monitor_sees_the_commands_of_a_parked_client(port):
    with RawConn(port) as m, _parked(port) as a:
        assert m.request(b"MONITOR\r\n") == b"+OK\r\n"
        assert a.request(resp_command(b"ECHO", b"seen") + resp_command(b"XLEN", b"s"), replies=2) == (
            b"$4\r\nseen\r\n:0\r\n")
        lines = b""
        while b'"XLEN" "s"' not in lines:
            lines += m.sock.recv(65536)
        assert b'"ECHO" "seen"' in lines
        assert lines.index(b'"ECHO" "seen"') < lines.index(b'"XLEN" "s"')


def test_info_counts_the_commands_and_bytes_of_a_parked_client(port):
    with RawConn(port) as info, _parked(port) as a:
        assert info.request(resp_command(b"CONFIG", b"RESETSTAT")) == b"+OK\r\n"
        before = int(_info_field(info, b"stats", b"total_commands_processed"))
        bytes_before = int(_info_field(info, b"stats", b"total_net_input_bytes"))
        batch = resp_command(b"ECHO", b"x") * 3 + resp_command(b"XLEN", b"s")
        assert a.request(batch, replies=4) == b"$1\r\nx\r\n" * 3 + b":0\r\n"
        after = int(_info_field(info, b"stats", b"total_commands_processed"))
        assert after - before == 4 + 2  # (and the two INFOs before)
        assert int(_info_field(info, b"stats", b"total_net_input_bytes")) - bytes_before >= len(batch)
        assert b"cmdstat_echo:calls=3," in info.request(resp_command(b"INFO", b"commandstats"))


def test_an_idle_timeout_still_closes_a_client_after_its_batches(partita_factory):
    server = partita_factory(["--timeout", "1"])
    with _parked(server.port) as a:
        assert a.request(resp_command(b"ECHO", b"a") + resp_command(b"ECHO", b"b"), replies=2) == (
            b"$1\r\na\r\n$1\r\nb\r\n")
        a.sock.settimeout(10)
        assert read_until_closed(a.sock) == b""


def test_a_protocol_error_after_commands_answers_them_then_closes(port):
    with _parked(port) as a:
        a.sock.sendall(resp_command(b"ECHO", b"a") + b"*1\r\n$x\r\n" + resp_command(b"ECHO", b"never"))
        assert read_until_closed(a.sock) == b"$1\r\na\r\n-ERR Protocol error: invalid bulk length\r\n"


def test_a_lone_xadd_is_answered_before_what_its_client_sends_next(port):
    """A lone XADD is committed and answered at the end of the reactor's
    step; a read the client sends before that reply comes runs after it and
    sees the entry."""
    with _parked(port) as a:
        for i in range(1, 51):
            a.sock.sendall(resp_command(b"XADD", b"s", b"*", b"f", b"%d" % i))
            a.sock.sendall(resp_command(b"XLEN", b"s"))
            got = a.request(b"", replies=2)
            assert got.count(b"\r\n") == 3 and got.endswith(b":%d\r\n" % i), got


def test_a_client_that_closes_right_after_its_xadd_has_it_written(port):
    for i in range(20):
        with _parked(port) as a:
            assert a.request(b"PING\r\n") == b"+PONG\r\n"  # (answered in the reactor's step, as what follows)
            a.sock.sendall(resp_command(b"XADD", b"s", b"*", b"f", b"%d" % i))
        # (closed without reading the reply)
    with RawConn(port) as b:
        # Each connection closed (its entry committed, as a closing one's are).
        assert wait_for(lambda: _info_field(b, b"clients", b"connected_clients") == b"1")
        assert b.request(resp_command(b"XLEN", b"s")) == b":20\r\n"
