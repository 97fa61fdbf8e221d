"""A connection closed in the reactor's step that took its XADD loses no entry.

End to end on a real ``partita`` process. A parked client's lone XADD is
appended in the reactor's step and answered at the step's end, with every
other connection's of that step (``Connection._take_at_step_end`` ->
``_hand_taken``; docs/architecture.md step 1). A CLIENT KILL from another
connection of the same step closes it in between: its task closes,
committing the entry, and its reply is lost with the client (as for any
killed client, nothing more is sent). A SHUTDOWN in the same step ends the
server after that step. Either way, every XADD any client got a reply for is
in the stream after the server restarts from the same ``--dir``, and the
server exits cleanly.

Same step, without timing: the server is stopped (SIGSTOP) while the clients
send, so that it finds every request at once when it continues, in the order
sent (the epoll set reports sockets in the order their input came).
"""

from __future__ import annotations

import os
import signal
from contextlib import contextmanager

import hiredis
import pytest

from tests.conftest import PartitaProcess, RawConn, read_until_closed, resp_command, wait_for


def _park(clock: RawConn) -> None:
    """Once every other client has its last reply: their connections' tasks
    are parked, so what they send next is run in the reactor's step. After a
    reply a connection's task tries one more receive, one scheduler pass
    later, and parks when it finds nothing; the clients send nothing
    meanwhile, and these round trips on another connection take that pass
    (three: each ends a pass of the server's loop, or finds nothing else to
    run, where the others are parked already)."""
    for _ in range(3):
        assert clock.request(b"PING\r\n") == b"+PONG\r\n"


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


@contextmanager
def _paused(server: PartitaProcess):
    """The server stopped: what clients send meanwhile waits in its sockets,
    and it finds all of it in one look at its epoll set when it continues."""
    pid = server.proc.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        assert wait_for(lambda: _state(pid) in ("T", "t"))
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def _xadd(value: bytes) -> bytes:
    return resp_command(b"XADD", b"s", b"*", b"f", value)


def _entries(server: PartitaProcess) -> dict[bytes, bytes]:
    """Field value -> entry ID of every entry of ``s``."""
    with RawConn(server.port) as conn:
        reader = hiredis.Reader()
        reader.feed(conn.request(resp_command(b"XRANGE", b"s", b"-", b"+")))
        return {fields[1]: entry_id for entry_id, fields in reader.gets()}


def _exited_cleanly(server: PartitaProcess) -> None:
    """The server, told to SHUTDOWN, exits with 0 after closing its logs."""
    assert server.proc.wait(timeout=30) == 0
    log = server.log()
    assert "Partita is now ready to exit" in log and "Traceback" not in log, log


def _shutdown_cleanly(server: PartitaProcess) -> None:
    with RawConn(server.port) as admin:
        admin.sock.sendall(resp_command(b"SHUTDOWN"))
        assert read_until_closed(admin.sock) == b""
    _exited_cleanly(server)


@pytest.mark.parametrize("fsync", ["everysec", "always"])
def test_a_client_killed_in_the_step_that_took_its_xadd_has_it_written_and_none_acknowledged_is_lost(
        partita_factory, fsync):
    server = partita_factory(["--appendfsync", fsync])
    acknowledged: dict[bytes, bytes] = {}  # value -> the ID its reply gave
    killed: list[bytes] = []
    clock = RawConn(server.port)
    for n in range(10):
        writers = [RawConn(server.port) for _ in range(3)]
        victim, killer = RawConn(server.port), RawConn(server.port)
        victim_id = victim.request(b"CLIENT ID\r\n").strip(b":\r\n")
        for conn in writers + [killer]:
            assert conn.request(b"PING\r\n") == b"+PONG\r\n"
        _park(clock)
        with _paused(server):
            # The victim's XADD is taken first (its end of the step comes
            # first too), then CLIENT KILL closes it, before the step's end
            # answers the XADDs taken in it.
            victim.sock.sendall(_xadd(b"killed-%d" % n))
            writers[0].sock.sendall(_xadd(b"w0-%d" % n))
            writers[1].sock.sendall(_xadd(b"w1-%d" % n))
            killer.sock.sendall(resp_command(b"CLIENT", b"KILL", b"ID", victim_id))
            writers[2].sock.sendall(_xadd(b"w2-%d" % n))
        assert killer.request(b"") == b":1\r\n"
        assert read_until_closed(victim.sock) == b""  # killed: no reply, as in Redis
        killed.append(b"killed-%d" % n)
        for w, writer in enumerate(writers):
            reply = writer.request(b"")
            assert reply.startswith(b"$"), reply
            acknowledged[b"w%d-%d" % (w, n)] = reply.split(b"\r\n")[1]
        for conn in writers + [victim, killer]:
            conn.close()
    clock.close()
    # The killed clients' entries are written too (committed as the
    # connection closed), by the time any client reads.
    entries = _entries(server)
    assert all(value in entries for value in killed), sorted(set(killed) - set(entries))
    _shutdown_cleanly(server)
    server.start()
    entries = _entries(server)
    assert {value: entries.get(value) for value in acknowledged} == acknowledged
    assert all(value in entries for value in killed)
    assert len(entries) == len(acknowledged) + len(killed)


@pytest.mark.parametrize("fsync", ["everysec", "always"])
def test_a_shutdown_in_the_step_of_other_clients_xadds_loses_no_acknowledged_entry(partita_factory, fsync):
    server = partita_factory(["--appendfsync", fsync])
    acknowledged: dict[bytes, bytes] = {}
    for n in range(3):
        writers = [RawConn(server.port) for _ in range(4)]
        admin = RawConn(server.port)
        for conn in writers + [admin]:
            assert conn.request(b"PING\r\n") == b"+PONG\r\n"
        with RawConn(server.port) as clock:
            _park(clock)
        with _paused(server):
            for w, writer in enumerate(writers):
                writer.sock.sendall(_xadd(b"w%d-%d" % (w, n)))
                if w == 1:
                    admin.sock.sendall(resp_command(b"SHUTDOWN"))
        assert read_until_closed(admin.sock) == b""
        for w, writer in enumerate(writers):
            data = read_until_closed(writer.sock)
            if data:  # answered before the server closed it: acknowledged
                assert data.startswith(b"$") and data.count(b"\r\n") == 2, data
                acknowledged[b"w%d-%d" % (w, n)] = data.split(b"\r\n")[1]
            writer.close()
        admin.close()
        _exited_cleanly(server)
        server.start()
        entries = _entries(server)
        assert {value: entries.get(value) for value in acknowledged} == acknowledged
    # The XADDs of SHUTDOWN's step are answered at its end, before the
    # server closes its clients.
    assert len(acknowledged) == 3 * 4
    _shutdown_cleanly(server)
