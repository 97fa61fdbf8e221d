"""The connection loop over a socketpair, and durability (group commit) with fake logs.

No real time: trio's autojump clock where time matters; the socketpair is
driven by trio's own I/O waits.
"""

from __future__ import annotations

import os
import socket

import pytest
import trio
import trio.testing

from server.connection import Receive, classify
from cluster.broker.durability import Durability
from server.registry import command
from server.resp import encode_command
from tests.server.support import (FakeLog, Harness, RoundGate, TopicsHarness, batch_counts, full_disk_append,
                                  read_exactly, read_replies, scribble, unread_bytes, xadd_request)


# -- what a receive is (server.connection.classify: pure, no sockets) --------

_POLL = encode_command([b"XREAD", b"COUNT", b"10", b"STREAMS", b"s", b"0-0"])


@pytest.mark.parametrize("data, at_boundary, kind", [
    # The peer's EOF (or a failed receive), wherever the parser is.
    (b"", True, Receive.EOF),
    (b"", False, Receive.EOF),
    # The rest of a command begun in an earlier receive: the parser's,
    # whatever the bytes look like.
    (b"$4\r\nECHO\r\n", False, Receive.PARTIAL),
    (_POLL, False, Receive.PARTIAL),
    (xadd_request() * 2, False, Receive.PARTIAL),
    # One six-element array: maybe a consumer's poll (read_poll decides:
    # two of them, or an XREAD with BLOCK, are declined there).
    (_POLL, True, Receive.POLL),
    (_POLL * 2, True, Receive.POLL),
    (b"*6\r", True, Receive.POLL),
    # Any other RESP array: runs of XADD key * ... are taken from its start
    # (xadd_run decides: a PING is not one), the parser takes the rest.
    (xadd_request() * 3, True, Receive.RUNS),
    (xadd_request() + _POLL, True, Receive.RUNS),
    (encode_command([b"PING"]), True, Receive.RUNS),
    (b"*", True, Receive.RUNS),
    # Inline commands.
    (b"PING\r\n", True, Receive.COMMANDS),
    (b"\r\n", True, Receive.COMMANDS),
])
def test_a_receive_is_classified_from_its_bytes_and_the_parsers_boundary(data, at_boundary, kind):
    assert classify(data, at_boundary) is kind


async def test_pipelined_replies_leave_in_one_send():
    h = Harness()
    async with trio.open_nursery() as nursery:
        sock, conn = h.connect(nursery)
        payload = encode_command([b"PING"]) + encode_command([b"ECHO", b"a"]) + b"PING\r\n"
        await sock.send(payload)
        expected = b"+PONG\r\n$1\r\na\r\n+PONG\r\n"
        assert await read_exactly(sock, len(expected)) == expected
        assert h.sends == [expected]
        nursery.cancel_scope.cancel()


async def test_a_request_already_there_after_a_reply_is_read_without_waiting_for_readiness(io_wakes):
    """After a reply leaves, the loop lets the other connections run once and
    then tries the next request before registering for readiness: a client
    as quick as the loop skips trio's wait (epoll_ctl and wake-up)."""
    h = Harness()

    def next_request(sends):  # the client answers at once, before the loop looks
        if sends == 1:
            h.peers[-1].send(b"ECHO quick\r\n")

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            peer, _ = h.connect(nursery, on_send=next_request)
            await peer.send(b"PING\r\n")
            assert await read_exactly(peer, 18) == b"+PONG\r\n$5\r\nquick\r\n"
            await trio.testing.wait_all_tasks_blocked()
            # One wait for the PING; the ECHO found by the try, which found
            # nothing the next time (the loop waits again).
            assert io_wakes.count == 1
            assert h.recvs == [b"PING\r\n", b"ECHO quick\r\n", None]
            nursery.cancel_scope.cancel()


async def test_a_client_slower_than_the_loop_costs_few_early_tries(io_wakes):
    """Each try that finds nothing doubles the replies that skip it (up to
    63): a client that always answers later than the loop looks costs a
    handful of empty reads over 100 requests, not 100."""
    h = Harness()
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            peer, _ = h.connect(nursery)
            for i in range(100):
                await trio.testing.wait_all_tasks_blocked()  # the loop is waiting again
                await peer.send(b"PING\r\n")
                assert await read_exactly(peer, 7) == b"+PONG\r\n"
            await trio.testing.wait_all_tasks_blocked()
            # tries at replies 1, 3, 7, 15, 31, 63 (then one per 64)
            assert h.recvs.count(None) == 6 and io_wakes.count == 100
            nursery.cancel_scope.cancel()


async def test_protocol_error_replies_then_closes_and_runs_earlier_commands():
    h = Harness()
    async with trio.open_nursery() as nursery:
        sock, conn = h.connect(nursery)
        await sock.send(encode_command([b"PING"]) + b"*1\r\n$4294967296\r\n")
        data = await read_exactly(sock, 10**6)  # until close
        assert data == b"+PONG\r\n-ERR Protocol error: invalid bulk length\r\n"
    assert h.state.clients == {}


async def test_quit_replies_ok_then_closes():
    h = Harness()
    async with trio.open_nursery() as nursery:
        sock, _ = h.connect(nursery)
        await sock.send(b"QUIT\r\nPING\r\n")
        assert await read_exactly(sock, 10**6) == b"+OK\r\n"


async def test_hello_3_switches_encoding_for_the_rest_of_the_batch():
    h = Harness()
    async with trio.open_nursery() as nursery:
        sock, _ = h.connect(nursery)
        await sock.send(b"HELLO 3\r\nCLIENT GETNAME\r\n")
        data = b""
        while not data.endswith(b"_\r\n"):
            data += await sock.recv(65536)
        assert data.startswith(b"%7\r\n") and data.endswith(b"_\r\n")
        nursery.cancel_scope.cancel()


async def test_blocking_command_sends_earlier_replies_first_and_keeps_order(test_commands):
    h = Harness(commands=test_commands.commands)
    async with trio.open_nursery() as nursery:
        reader, _ = h.connect(nursery)
        writer, _ = h.connect(nursery)
        await reader.send(b"PING\r\nTEST-BLOCK k\r\nECHO after\r\n")
        assert await read_exactly(reader, 7) == b"+PONG\r\n"
        await writer.send(b"TEST-WRITE k\r\n")
        assert await read_exactly(writer, 9) == b"$3\r\nw:k\r\n"
        rest = b"$6\r\nwoke:k\r\n$5\r\nafter\r\n"
        assert await read_exactly(reader, len(rest)) == rest
        nursery.cancel_scope.cancel()


async def test_client_disconnect_while_blocked_leaves_no_waiter(test_commands, autojump_clock):
    h = Harness(commands=test_commands.commands)
    async with trio.open_nursery() as nursery:
        sock, _ = h.connect(nursery)
        await sock.send(b"TEST-BLOCK k\r\n")
        await trio.sleep(1)
        assert h.state.blocked_clients == 1
        conn = next(iter(h.state.clients.values()))
        conn.kill()
        await trio.sleep(1)
        assert h.state.blocked_clients == 0 and h.state.clients == {}


async def test_fsync_always_holds_replies_until_the_flush(test_commands):
    events, logs = test_commands
    h = Harness(commands=test_commands.commands, fsync="always")

    async with trio.open_nursery() as nursery:
        sock, _ = h.connect(nursery)
        await sock.send(b"TEST-WRITE a\r\nTEST-WRITE b\r\nPING\r\n")
        expected = b"$3\r\nw:a\r\n$3\r\nw:b\r\n+PONG\r\n"
        assert await read_exactly(sock, len(expected)) == expected
        nursery.cancel_scope.cancel()
    kinds = [e[0] for e in events]
    # Both writes, then one flush round covering both logs, then one send.
    assert kinds[:2] == ["write", "write"]
    assert sorted(kinds[2:]) == ["begin", "begin", "end", "end", "fsync", "fsync"]
    assert len(h.sends) == 1
    assert logs["a"].flushes == 1 and logs["b"].flushes == 1


async def test_fsync_everysec_replies_at_once_and_flushes_in_background(test_commands, autojump_clock):
    events, logs = test_commands
    h = Harness(commands=test_commands.commands, fsync="everysec")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.state.durability.run_everysec)
        sock, _ = h.connect(nursery)
        await sock.send(b"TEST-WRITE a\r\n")
        assert await read_exactly(sock, 9) == b"$3\r\nw:a\r\n"
        assert logs["a"].flushes == 0
        await trio.sleep(1.5)
        assert logs["a"].flushes == 1
        await trio.sleep(2)
        assert logs["a"].flushes == 1  # nothing new written: no flush
        nursery.cancel_scope.cancel()


async def test_fsync_no_never_flushes(test_commands, autojump_clock):
    events, logs = test_commands
    h = Harness(commands=test_commands.commands, fsync="no")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.state.durability.run_everysec)
        sock, _ = h.connect(nursery)
        await sock.send(b"TEST-WRITE a\r\n")
        assert await read_exactly(sock, 9) == b"$3\r\nw:a\r\n"
        await trio.sleep(5)
        assert logs["a"].flushes == 0
        nursery.cancel_scope.cancel()


class UnsyncableLog(FakeLog):
    """A log whose flush fails: its ticket's descriptor is a pipe (EINVAL)."""

    def begin_flush(self):
        ticket = super().begin_flush()
        os.close(ticket.fd)
        ticket.fd, self.pipe_w = os.pipe()
        return ticket


async def _connect_and_write(h, nursery, request=b"TEST-WRITE a\r\n"):
    """Connect, send a write and wait until everything is blocked (the
    reply handed to a gated round)."""
    sock, conn = h.connect(nursery)
    await sock.send(request)
    await trio.testing.wait_all_tasks_blocked()
    return sock, conn


async def test_handed_over_replies_wait_for_the_round_and_keep_their_order(test_commands):
    with RoundGate() as gate, trio.fail_after(10):
        h = Harness(commands=test_commands.commands, fsync="always", rounds=gate)
        async with trio.open_nursery() as nursery:
            sock, conn = await _connect_and_write(h, nursery)
            assert h.sends == []
            # A request that comes in meanwhile is answered after, not before.
            await sock.send(b"PING\r\n")
            await trio.testing.wait_all_tasks_blocked()
            assert h.sends == []
            gate.open()
            assert await read_exactly(sock, 16) == b"$3\r\nw:a\r\n+PONG\r\n"
            nursery.cancel_scope.cancel()
        assert h.sends == [b"$3\r\nw:a\r\n", b"+PONG\r\n"]


async def test_the_rounds_thread_sends_handed_over_replies(test_commands):
    """With ``cluster.broker._fsync``'s thread running the rounds, it sends a held
    batch itself once the sync succeeded: the loop sends nothing, and input
    that came in meanwhile is answered after it."""
    h = Harness(commands=test_commands.commands, fsync="always")
    h.state.durability = Durability()  # the real thread, not the inline runner
    try:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                sock, conn = h.connect(nursery)
                await sock.send(b"TEST-WRITE a\r\nTEST-WRITE b\r\nPING\r\n")
                assert await read_exactly(sock, 25) == b"$3\r\nw:a\r\n$3\r\nw:b\r\n+PONG\r\n"
                assert h.sends == []  # all three left from the thread (one held batch)
                await sock.send(b"TEST-WRITE c\r\nECHO x\r\n")
                assert await read_exactly(sock, 16) == b"$3\r\nw:c\r\n$1\r\nx\r\n"
                assert h.sends == []
                while h.state.durability.fsync_count < 2:  # the loop learns of the round after the peer
                    await trio.sleep(0.01)
                assert h.state.stats.total_net_output_bytes == 41
                nursery.cancel_scope.cancel()
    finally:
        h.state.durability.close()


async def test_held_replies_are_waited_for_not_the_socket(test_commands, io_wakes):
    """While its replies wait for a round, a connection waits for the round,
    not for input (which only comes after them from a client waiting for
    its replies, and would wait for them anyway): no readiness wait per
    batch. Input that came meanwhile is read right after, in order."""
    from cluster.broker import _fsync

    h = Harness(commands=test_commands.commands, fsync="always")
    h.state.durability = Durability()  # the real thread
    try:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                _fsync.hold_worker(True)  # the round starts, its thread waits
                try:
                    sock, conn = h.connect(nursery)
                    await sock.send(b"TEST-WRITE a\r\n")
                    await trio.testing.wait_all_tasks_blocked()
                    await sock.send(b"PING\r\n")
                    await trio.testing.wait_all_tasks_blocked()
                    assert h.sends == [] and io_wakes.count == 1  # the first request's only
                finally:
                    _fsync.hold_worker(False)
                assert await read_exactly(sock, 16) == b"$3\r\nw:a\r\n+PONG\r\n"
                await trio.testing.wait_all_tasks_blocked()
                # The PING was read without a wait, right after the held replies left.
                assert io_wakes.count == 1 and h.recvs[:2] == [b"TEST-WRITE a\r\n", b"PING\r\n"]
                nursery.cancel_scope.cancel()
    finally:
        h.state.durability.close()


async def test_held_replies_the_loop_sent_are_followed_by_a_wait_not_a_read(test_commands, io_wakes):
    """Replies the loop itself sent on release (acks=all, a test's runner)
    have only just left: the connection waits for input instead of trying
    a read that would find nothing."""
    h = Harness(commands=test_commands.commands, fsync="always")  # the inline runner: the loop sends on release
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            sock, conn = h.connect(nursery)
            await sock.send(b"TEST-WRITE a\r\n")
            assert await read_exactly(sock, 9) == b"$3\r\nw:a\r\n"
            await trio.testing.wait_all_tasks_blocked()
            assert h.recvs == [b"TEST-WRITE a\r\n"] and io_wakes.count == 1  # and parked on the socket again
            await sock.send(b"PING\r\n")
            assert await read_exactly(sock, 7) == b"+PONG\r\n"
            assert io_wakes.count == 2
            nursery.cancel_scope.cancel()


async def test_what_the_socket_does_not_take_from_the_thread_the_loop_sends(test_commands):
    h = Harness(commands=test_commands.commands, fsync="always")
    h.state.durability = Durability()
    n = 1000
    expected = b"".join(b"$3\r\nw:a\r\n$%d\r\n%d\r\n" % (len(b"%d" % i), i) for i in range(n))
    try:
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                sock, conn = h.connect(nursery)
                conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
                await sock.send(b"".join(b"TEST-WRITE a\r\nECHO %d\r\n" % i for i in range(n)))
                while h.state.durability.fsync_count < 1:  # the round is over: its thread sent what the socket took
                    await trio.sleep(0.01)
                await trio.testing.wait_all_tasks_blocked()
                assert h.sends == []  # the rest waits for the reader
                assert await read_exactly(sock, len(expected)) == expected
                from_loop = b"".join(h.sends)
                assert 0 < len(from_loop) < len(expected) and expected.endswith(from_loop)
                nursery.cancel_scope.cancel()
    finally:
        h.state.durability.close()


async def test_a_client_that_leaves_while_its_held_replies_are_sent_is_freed(test_commands):
    """The round's thread sent what the socket took; the rest waits for a
    reader that closes instead: the client is freed, and the other
    clients go on."""
    h = Harness(commands=test_commands.commands, fsync="always")
    h.state.durability = Durability()
    try:
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                sock, conn = h.connect(nursery)
                conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
                await sock.send(b"TEST-WRITE a\r\n" * 2000)
                while h.state.durability.fsync_count < 1:  # its thread sent what the socket took
                    await trio.sleep(0.01)
                await trio.testing.wait_all_tasks_blocked()
                assert len(h.state.clients) == 1
                sock.close()
                while h.state.clients:
                    await trio.sleep(0.01)
                other, _ = h.connect(nursery)
                await other.send(b"TEST-WRITE b\r\n")
                assert await read_exactly(other, 9) == b"$3\r\nw:b\r\n"
                nursery.cancel_scope.cancel()
    finally:
        h.state.durability.close()


async def test_a_reply_waiting_for_the_fsync_and_the_replicas_leaves_after_both(test_commands):
    events, logs = test_commands
    acked = []

    class Replicas:  # Replication.when_acked's contract, answered by the test
        def when_acked(self, client, pending, callback):
            acked.append(callback)

    commands: dict = {}

    @command("test-repl", arity=2, flags="write", group="test", since="0", summary="", syntax="TEST-REPL name",
             table=commands)
    def test_repl(ctx, argv):
        ctx.session.wrote_log(logs.setdefault(argv[1].decode(), FakeLog(argv[1].decode(), events)))
        ctx.session.repl_pending = {argv[1]: None}
        return b"r:" + argv[1]

    with RoundGate() as gate, trio.fail_after(10):
        h = Harness(commands=commands, fsync="always", rounds=gate)
        h.state.replication = Replicas()
        async with trio.open_nursery() as nursery:
            sock, _ = await _connect_and_write(h, nursery, b"TEST-REPL a\r\n")
            assert len(acked) == 1 and h.sends == []
            gate.open()  # the fsync round ends; the replicas have not acknowledged
            await trio.testing.wait_all_tasks_blocked()
            assert h.sends == [] and logs["a"].flushes == 1
            acked[0](None)
            assert await read_exactly(sock, 9) == b"$3\r\nr:a\r\n"
            # The other order: replicas first, then the round.
            gate.close()
            await sock.send(b"TEST-REPL b\r\n")
            await trio.testing.wait_all_tasks_blocked()
            acked[1](None)
            await trio.testing.wait_all_tasks_blocked()
            assert h.sends == [b"$3\r\nr:a\r\n"]
            gate.open()
            assert await read_exactly(sock, 9) == b"$3\r\nr:b\r\n"
            nursery.cancel_scope.cancel()


async def test_a_failed_round_closes_handed_over_clients_without_a_reply(test_commands):
    events, logs = test_commands
    logs["bad"] = UnsyncableLog("bad", events)
    h = Harness(commands=test_commands.commands, fsync="always")
    with trio.fail_after(10):  # a reply never sent fails, not hangs
        async with trio.open_nursery() as nursery:
            sock, _ = h.connect(nursery)
            await sock.send(b"TEST-WRITE bad\r\nPING\r\n")
            assert await read_exactly(sock, 100) == b""  # closed, nothing acknowledged
            nursery.cancel_scope.cancel()
        assert h.sends == [] and h.state.clients == {}
        assert "Invalid argument" in h.state.durability.last_flush_error


async def test_handed_over_replies_bigger_than_the_socket_buffer_arrive_whole(test_commands):
    h = Harness(commands=test_commands.commands, fsync="always")
    name = b"n" * 200
    reply = b"$202\r\nw:" + name + b"\r\n"
    with trio.fail_after(10):  # a reply never sent fails, not hangs
        async with trio.open_nursery() as nursery:
            sock, conn = h.connect(nursery)
            conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
            await sock.send(b"TEST-WRITE %s\r\n" % name * 200)
            await trio.testing.wait_all_tasks_blocked()  # the rest waits for the reader
            assert await read_exactly(sock, len(reply) * 200) == reply * 200
            await sock.send(b"PING\r\n")
            assert await read_exactly(sock, 7) == b"+PONG\r\n"
            nursery.cancel_scope.cancel()
        assert len(h.sends) > 2  # the round's send took part; a task sent the rest


async def test_shutdown_sends_handed_over_replies_then_closes(test_commands):
    with RoundGate() as gate, trio.fail_after(10):
        h = Harness(commands=test_commands.commands, fsync="always", rounds=gate)
        async with trio.open_nursery() as nursery:
            sock, conn = await _connect_and_write(h, nursery)
            conn.stop()  # in flight: not closed before its replies
            gate.open()
            assert await read_exactly(sock, 100) == b"$3\r\nw:a\r\n"
            # Replies already out: a shutdown closes at once.
            sock2, conn2 = h.connect(nursery)
            await sock2.send(b"TEST-WRITE b\r\n")
            assert await read_exactly(sock2, 9) == b"$3\r\nw:b\r\n"
            conn2.stop()
            assert await read_exactly(sock2, 100) == b""


async def test_a_shutdown_while_a_batch_waits_closes_it_before_its_blocking_command(test_commands):
    """A shutdown that comes while a batch's first replies wait for their
    round, before a blocking command of the same batch: the replies leave,
    then the client is closed instead of blocking (the server would wait
    for it until shutdown-timeout)."""
    with RoundGate() as gate, trio.fail_after(10):
        h = Harness(commands=test_commands.commands, fsync="always", rounds=gate)
        async with trio.open_nursery() as nursery:
            sock, conn = await _connect_and_write(h, nursery, b"TEST-WRITE a\r\nTEST-BLOCK k\r\n")
            conn.stop()  # in flight: its replies first
            gate.open()
            assert await read_exactly(sock, 100) == b"$3\r\nw:a\r\n"  # then closed
            assert h.state.blocked_clients == 0 and h.state.clients == {}


async def test_a_killed_client_does_not_hold_up_the_round(test_commands):
    with RoundGate() as gate, trio.fail_after(10):
        h = Harness(commands=test_commands.commands, fsync="always", rounds=gate)
        async with trio.open_nursery() as nursery:
            sock1, conn1 = h.connect(nursery)
            sock2, _ = h.connect(nursery)
            await sock1.send(b"TEST-WRITE a\r\n")
            await sock2.send(b"TEST-WRITE b\r\n")
            await trio.testing.wait_all_tasks_blocked()
            conn1.kill()
            await trio.testing.wait_all_tasks_blocked()
            gate.open()
            assert await read_exactly(sock2, 9) == b"$3\r\nw:b\r\n"
            assert await read_exactly(sock1, 100) == b""
            nursery.cancel_scope.cancel()


async def test_a_closed_clients_waiting_reply_never_reaches_the_next_owner_of_its_socket_number(test_commands):
    """A reply waiting for the next round names its socket by number for the
    round's thread. A client closed meanwhile (CLIENT KILL) frees that
    number, and a client accepted next may get it: the round must send the
    old reply to nobody, not to the new client."""
    from cluster.broker import _fsync

    h = Harness(commands=test_commands.commands, fsync="always")
    h.state.durability = Durability()  # the real thread, which sends held replies
    others = []
    try:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                _fsync.hold_worker(True)  # rounds start; their thread waits
                try:
                    sock_b, _ = await _connect_and_write(h, nursery, b"TEST-WRITE b\r\n")  # a round
                    sock_a, conn_a = await _connect_and_write(h, nursery)  # waits for the next round
                    number = conn_a.sock.fileno()
                    conn_a.kill()
                    await trio.testing.wait_all_tasks_blocked()
                    while True:  # take descriptor numbers until the closed socket's is reused
                        c, d = socket.socketpair()
                        others.append((c, d))
                        if number in (c.fileno(), d.fileno()):
                            break
                finally:
                    _fsync.hold_worker(False)
                assert await read_exactly(sock_b, 9) == b"$3\r\nw:b\r\n"
                while h.state.durability.fsync_count < 2:  # the round a's write joined
                    await trio.sleep(0.01)
                assert await read_exactly(sock_a, 100) == b""  # closed before its reply
                for c, d in others:
                    for s in (c, d):
                        s.setblocking(False)
                        with pytest.raises(BlockingIOError):
                            s.recv(100)
                nursery.cancel_scope.cancel()
    finally:
        h.state.durability.close()
        for c, d in others:
            c.close()
            d.close()


async def test_group_commit_shares_fsyncs_between_writers():
    events: list = []
    log = FakeLog("a", events)
    durability = Durability()
    done = []

    async def writer(i):
        seq = durability.note_write(log, "always")
        await durability.wait_for_flush(seq)
        done.append(i)

    async with trio.open_nursery() as nursery:
        for i in range(50):
            nursery.start_soon(writer, i)
    assert sorted(done) == list(range(50))
    assert 1 <= log.flushes <= 2  # not 50


async def test_failed_flush_is_never_acknowledged():
    class BadTicket:
        def run(self):
            raise OSError(5, "EIO")

    class BadLog:
        def begin_flush(self):
            return BadTicket()

        def end_flush(self, ticket):
            raise AssertionError("not reached")

    from cluster.broker.durability import DurabilityError

    durability = Durability()
    seq = durability.note_write(BadLog(), "always")
    with pytest.raises(DurabilityError):
        await durability.wait_for_flush(seq)


async def test_big_pipelined_replies_are_sent_in_pieces():
    h = Harness()
    value = b"v" * 10_000
    n = 300  # ~3 MB of replies from one receive (the requests fit in ~3 MB too)
    request = encode_command([b"ECHO", value]) * n
    reply = b"$10000\r\n" + value + b"\r\n"
    async with trio.open_nursery() as nursery:
        sock, _ = h.connect(nursery)

        async def send_requests():
            view = memoryview(request)
            while view:
                sent = await sock.send(view[:65536])
                view = view[sent:]

        nursery.start_soon(send_requests)
        assert await read_exactly(sock, len(reply) * n) == reply * n
        nursery.cancel_scope.cancel()
    assert max(map(len, h.sends)) < 2 * 1024 * 1024 + 65536


# -- deferred appends: a pipeline of XADDs is one log batch -------------------


async def test_pipelined_xadds_share_one_log_batch_and_are_read_back_in_the_pipeline(tmp_path):
    h = TopicsHarness(tmp_path)
    async with trio.open_nursery() as nursery:
        sock, _ = h.connect(nursery)
        await sock.send(xadd_request() * 3 + encode_command([b"XLEN", b"s"])
                        + xadd_request() + encode_command([b"XRANGE", b"s", b"-", b"+"]))
        r = await read_replies(sock, 6)
        ids = [r[0], r[1], r[2], r[4]]
        assert r[3] == 3  # read-your-writes inside the pipeline
        assert [e[0] for e in r[5]] == ids
        nursery.cancel_scope.cancel()
    # XLEN committed the first three; the batch end the last
    assert batch_counts(h.state.topics.get(b"s").log) == [3, 1]
    h.state.topics.close()


async def test_after_a_failed_fsync_the_partition_refuses_writes_and_the_others_go_on(tmp_path, monkeypatch):
    """A failed fsync closes the writers waiting on it without a reply; the
    partition then answers every write with MISCONF (a later fsync that
    succeeds would not prove its lost pages are on disk), even once the disk
    answers again, and keeps serving reads; other partitions are unaffected."""
    import errno

    import hiredis

    h = TopicsHarness(tmp_path, fsync="always")
    real = os.fdatasync

    def eio(fd):
        raise OSError(errno.EIO, "Input/output error")

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            sock, _ = h.connect(nursery)
            await sock.send(xadd_request())
            [first] = await read_replies(sock, 1)
            assert isinstance(first, bytes)  # a first entry, durable
            monkeypatch.setattr(os, "fdatasync", eio)
            await sock.send(xadd_request())
            assert await read_exactly(sock, 100) == b""  # closed, not acknowledged
            monkeypatch.setattr(os, "fdatasync", real)
            sock, _ = h.connect(nursery)
            await sock.send(xadd_request() + encode_command([b"XLEN", b"s"]) + xadd_request(b"other")
                            + encode_command([b"INFO", b"persistence"]))
            refused, length, other, info = await read_replies(sock, 4)
            assert isinstance(refused, hiredis.ReplyError)
            assert str(refused) == "MISCONF Errors writing to the partition log: Input/output error"
            assert length == 2 and isinstance(other, bytes)  # reads go on; so do other partitions
            assert b"aof_last_write_status:err" in info
            nursery.cancel_scope.cancel()
    h.state.topics.close()


async def test_pipelined_xadds_inside_multi_are_visible_to_later_queued_commands(tmp_path):
    h = TopicsHarness(tmp_path)
    async with trio.open_nursery() as nursery:
        sock, _ = h.connect(nursery)
        await sock.send(encode_command([b"MULTI"]) + xadd_request() * 2 + encode_command([b"XLEN", b"s"])
                        + encode_command([b"EXEC"]))
        r = await read_replies(sock, 5)
        assert r[4][2] == 2
        nursery.cancel_scope.cancel()
    h.state.topics.close()


async def test_a_failed_commit_turns_every_deferred_reply_into_the_error(tmp_path):
    h = TopicsHarness(tmp_path)
    async with trio.open_nursery() as nursery:
        sock, _ = h.connect(nursery)
        await sock.send(xadd_request())
        (first,) = await read_replies(sock, 1)
        stream = h.state.topics.get(b"s")
        real_append = stream.log.append

        stream.log.append = full_disk_append
        await sock.send(encode_command([b"PING"]) + xadd_request() * 2 + encode_command([b"PING"]) + xadd_request())
        r = await read_replies(sock, 5)
        assert r[0] == b"PONG" and r[3] == b"PONG"
        for i in (1, 2, 4):
            assert isinstance(r[i], Exception) and str(r[i]).startswith("MISCONF Errors writing to the partition log"), r
        stream.log.append = real_append
        await sock.send(xadd_request() + encode_command([b"XLEN", b"s"]))
        r = await read_replies(sock, 2)
        assert r[1] == 2 and r[0] > first  # nothing of the failed batch was written
        nursery.cancel_scope.cancel()
    h.state.topics.close()



async def test_deferred_bytes_are_bounded_and_a_large_entry_is_written_at_once(tmp_path, monkeypatch):
    from cluster.broker import session

    monkeypatch.setattr(session, "DEFER_MAX_BYTES", 1000)
    h = TopicsHarness(tmp_path)
    async with trio.open_nursery() as nursery:
        sock, _ = h.connect(nursery)
        await sock.send(xadd_request(value=b"x" * 400) * 3 + xadd_request(value=b"y" * 2000) + xadd_request()
                        + encode_command([b"XLEN", b"s"]))
        r = await read_replies(sock, 6)
        assert r[5] == 5 and len(set(r[:5])) == 5
        nursery.cancel_scope.cancel()
    h.state.topics.close()


# -- runs of `XADD key * f v` taken from the received bytes (server/_xaddrun.c)


class RunsTaken(list):
    """How many XADDs each run the fast path took (``Dispatcher.xadd_run``)
    on the harnesses it ``watch``es."""

    def watch(self, h):
        runs = h.dispatcher.table.runs
        real = runs["xadd"]

        def counting(ctx, data, pos, route=None):
            got = real(ctx, data, pos, route)
            if got is not None:
                self.append(got[2])
            return got

        runs["xadd"] = counting
        return h


@pytest.fixture
def runs_taken():
    return RunsTaken()


async def test_runs_of_xadds_get_the_replies_and_batches_of_the_general_path(tmp_path, runs_taken):
    h = runs_taken.watch(TopicsHarness(tmp_path, max_entry_bytes=100))
    async with trio.open_nursery() as nursery:
        sock, _ = h.connect(nursery)
        # A new key is created by the general path; after that its XADDs run.
        await sock.send(xadd_request())
        (first,) = await read_replies(sock, 1)
        assert runs_taken == []
        await sock.send(xadd_request() * 3 + xadd_request(key=b"t") + xadd_request(value=b"x" * 200) + xadd_request()
                        + encode_command([b"XLEN", b"s"]) + xadd_request(value=b"last")
                        + encode_command([b"xadd", b"s", b"*", b"a", b"1", b"b", b"2"]))
        r = await read_replies(sock, 9)
        # Runs are taken from the start of a receive: XADD t (a new key) ends
        # this one, and the rest of the receive is parsed command by command.
        assert runs_taken == [3]
        ids = [first, *r[:3], r[5], r[7], r[8]]
        assert ids == sorted(ids) and len(set(ids)) == 7
        assert str(r[4]).startswith("ERR Elements are too large to be stored"), r[4]
        assert r[6] == 5  # read-your-writes: the run before it was committed
        await sock.send(encode_command([b"XRANGE", b"s", b"-", b"+"]))
        (entries,) = await read_replies(sock, 1)
        assert [e[0] for e in entries] == ids
        assert entries[-1][1] == [b"a", b"1", b"b", b"2"] and entries[-2][1] == [b"f", b"last"]
        # Runs for two known keys back to back, in one receive.
        await sock.send(xadd_request() * 2 + xadd_request(key=b"t") * 2 + xadd_request())
        r = await read_replies(sock, 5)
        assert runs_taken == [3, 2, 2, 1] and r[4] > r[1]
        # An entry over max-entry-bytes ends a run and gets the general path's error.
        await sock.send(xadd_request() + xadd_request(value=b"x" * 200) + xadd_request())
        r = await read_replies(sock, 3)
        assert runs_taken[4:] == [1] and r[2] > r[0]
        assert str(r[1]).startswith("ERR Elements are too large to be stored"), r[1]
        await sock.send(encode_command([b"INFO", b"commandstats"]))
        (info,) = await read_replies(sock, 1)
        assert b"cmdstat_xadd:calls=17," in info and b"failed_calls=2" in info
        nursery.cancel_scope.cancel()
    # One batch for the first XADD, one for the run committed by the XLEN
    # (the too-large entry wrote nothing), one for the rest of that receive
    # (nothing but a read commits: not a command name spelled as never
    # before either), one for each later receive.
    assert batch_counts(h.state.topics.get(b"s").log) == [1, 4, 2, 3, 2]
    h.state.topics.close()


async def test_a_failed_commit_turns_a_runs_replies_into_the_error(tmp_path, runs_taken):
    h = runs_taken.watch(TopicsHarness(tmp_path))
    async with trio.open_nursery() as nursery:
        sock, _ = h.connect(nursery)
        await sock.send(xadd_request())
        await read_replies(sock, 1)
        stream = h.state.topics.get(b"s")
        real_append = stream.log.append

        stream.log.append = full_disk_append
        await sock.send(xadd_request() * 3 + encode_command([b"PING"]))
        r = await read_replies(sock, 4)
        assert runs_taken == [3] and r[3] == b"PONG"
        for reply in r[:3]:
            assert isinstance(reply, Exception) and str(reply).startswith("MISCONF Errors writing"), r
        stream.log.append = real_append
        await sock.send(xadd_request() * 2 + encode_command([b"XLEN", b"s"]))
        r = await read_replies(sock, 3)
        assert r[2] == 3  # the first entry and these two: nothing of the failed run
        await sock.send(encode_command([b"INFO", b"commandstats"]))
        (info,) = await read_replies(sock, 1)
        assert b"cmdstat_xadd:calls=6," in info and b"failed_calls=3" in info
        nursery.cancel_scope.cancel()
    h.state.topics.close()


async def test_no_run_inside_multi_or_before_auth(tmp_path, runs_taken):
    h = runs_taken.watch(TopicsHarness(tmp_path, requirepass="pw"))
    async with trio.open_nursery() as nursery:
        sock, _ = h.connect(nursery)
        await sock.send(encode_command([b"AUTH", b"pw"]) + xadd_request())
        await read_replies(sock, 2)
        other, _ = h.connect(nursery)
        await other.send(xadd_request() * 2)
        r = await read_replies(other, 2)
        assert all(str(x).startswith("NOAUTH") for x in r), r
        await sock.send(encode_command([b"MULTI"]))
        await read_replies(sock, 1)
        await sock.send(xadd_request() * 2)
        assert await read_replies(sock, 2) == [b"QUEUED", b"QUEUED"]
        await sock.send(encode_command([b"EXEC"]))
        (ids,) = await read_replies(sock, 1)
        assert len(ids) == 2 and runs_taken == []
        await sock.send(xadd_request() * 2 + encode_command([b"XLEN", b"s"]))
        assert (await read_replies(sock, 3))[2] == 5 and runs_taken == [2]
        nursery.cancel_scope.cancel()
    h.state.topics.close()


async def test_a_run_is_bounded_by_the_deferred_bytes(tmp_path, monkeypatch, runs_taken):
    from cluster.broker import session

    monkeypatch.setattr(session, "DEFER_MAX_BYTES", 1000)
    h = runs_taken.watch(TopicsHarness(tmp_path))
    async with trio.open_nursery() as nursery:
        sock, _ = h.connect(nursery)
        await sock.send(xadd_request())
        await read_replies(sock, 1)
        await sock.send(xadd_request(value=b"x" * 300) * 8 + encode_command([b"XLEN", b"s"]))
        r = await read_replies(sock, 9)
        assert r[8] == 9 and len(set(r[:8])) == 8
        nursery.cancel_scope.cancel()
    # ~330 bytes per entry counted: a batch is written once it reaches 1000.
    assert runs_taken == [3, 3, 2]
    assert batch_counts(h.state.topics.get(b"s").log) == [1, 3, 3, 2]
    h.state.topics.close()


async def test_xadds_of_connections_ready_in_the_same_tick_share_one_log_batch(tmp_path):
    from storage import records

    h = TopicsHarness(tmp_path)
    async with trio.open_nursery() as nursery:
        a, _ = h.connect(nursery)
        b, _ = h.connect(nursery)
        await trio.testing.wait_all_tasks_blocked()
        # Both requests are in the sockets before the server runs again.
        raw_a = socket.socket(fileno=os.dup(a.fileno()))
        raw_b = socket.socket(fileno=os.dup(b.fileno()))
        raw_a.sendall(xadd_request(value=b"a"))
        raw_b.sendall(xadd_request(value=b"b"))
        raw_a.close()
        raw_b.close()
        (id_a,) = await read_replies(a, 1)
        (id_b,) = await read_replies(b, 1)
        assert id_a != id_b
        nursery.cancel_scope.cancel()
    log = h.state.topics.get(b"s").log
    data = open(log.segments()[-1].path, "rb").read()
    hdr = records.unpack_header(data, 0)
    assert hdr[records.H_COUNT] == 2 and hdr[records.H_LENGTH] == len(data)
    h.state.topics.close()


async def test_a_log_closed_before_its_flush_is_skipped(tmp_path):
    """A topic deleted between its write and the flush (DEL, or a replica's
    topic deleted by its leader) must not fail the flush of the others."""
    from cluster.broker.durability import flush_logs
    from storage.log import LogConfig, PartitionLog

    gone = PartitionLog.open(tmp_path / "gone", LogConfig())
    kept = PartitionLog.open(tmp_path / "kept", LogConfig())
    for plog in (gone, kept):
        plog.append([(1, 0, b"x")])
    gone.close()
    await flush_logs([gone, kept], run_in_thread=_inline_runner)
    assert kept.recovery_point == 1
    kept.append([(2, 0, b"y")])
    await flush_logs([gone, kept], run_in_thread=_inline_runner)
    assert kept.recovery_point == 2
    kept.close()


async def _inline_runner(fn, *args):
    return fn(*args)


async def _fill(sock, count, value):
    for _ in range(count):
        await sock.send(xadd_request(value=value))
    return await read_replies(sock, count)


async def test_a_read_reply_leaves_from_the_log_files_mapping_and_whole_when_the_socket_is_slow(tmp_path):
    """XREAD/XRANGE on a connection's loop reply with views of the log file's
    mapping (no copy), sent in one gathering send; what a full socket buffer
    does not take is copied and sent later, byte for byte."""
    h = TopicsHarness(tmp_path)
    value = b"x" * 1000
    async with trio.open_nursery() as nursery:
        sock, conn = h.connect(nursery)
        ids = await _fill(sock, 300, value)
        conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        h.sends.clear()
        await sock.send(encode_command([b"XREAD", b"COUNT", b"300", b"STREAMS", b"s", b"0"])
                        + encode_command([b"XRANGE", b"s", b"-", b"+"]))
        read, ranged = await read_replies(sock, 2)
        nursery.cancel_scope.cancel()
    assert [e[0] for e in read[0][1]] == ids == [e[0] for e in ranged]
    assert all(e[1] == [b"f", value] for e in ranged)
    assert len(h.sends[0]) < 300 * 1000  # the socket took part; the rest followed
    seg = h.state.topics.get(b"s").log._segs[-1]
    assert seg._map is not None  # read through the mapping
    h.state.topics.close()


class _ScribbleWhileWaiting(trio.abc.Instrument):
    """Once the connection's task has read its request (its socket holds
    no unread input) and before its reply left (the client has none), at
    the next step of that task: overwrite the entries' values in the log
    file, as a log cut back and rewritten would change them under a
    mapping. Fires once; ``changed`` says how many it overwrote."""

    def __init__(self, conn, peer, log):
        self.conn, self.peer, self.log = conn, peer, log
        self.changed = 0

    def before_task_step(self, task) -> None:
        if (not self.changed and task.name.endswith("Connection.run")
                and unread_bytes(self.conn.sock) == 0 and unread_bytes(self.peer) == 0):
            self.changed = scribble(self.log, b"original", b"scribble")


async def test_views_in_a_batch_are_copied_before_the_connection_waits(tmp_path):
    """A batch whose replies hold views of the log file's mapping and then
    waits (here: for the other connections' XADDs of this tick) copies
    them first: a follower may cut its log back meanwhile, and the reply
    must carry the entries as they were read."""
    h = TopicsHarness(tmp_path)
    async with trio.open_nursery() as nursery:
        sock, conn = h.connect(nursery)
        ids = await _fill(sock, 3, b"original")
        await trio.testing.wait_all_tasks_blocked()
        scribbler = _ScribbleWhileWaiting(conn, sock, h.state.topics.get(b"s").log)
        trio.lowlevel.add_instrument(scribbler)
        try:
            await sock.send(encode_command([b"XREAD", b"COUNT", b"5", b"STREAMS", b"s", b"0"]) + xadd_request())
            read, new_id = await read_replies(sock, 2)
        finally:
            trio.lowlevel.remove_instrument(scribbler)
        nursery.cancel_scope.cancel()
    assert scribbler.changed == 3  # while the batch waited
    assert [e[0] for e in read[0][1]] == ids and new_id > ids[-1]
    assert [e[1] for e in read[0][1]] == [[b"f", b"original"]] * 3
    h.state.topics.close()


async def test_views_are_copied_before_waiting_for_an_fsync(tmp_path):
    """As above, for a batch that waits for its fsync round: the replies
    before a blocking command (flushed before it blocks), and a batch handed
    over to the round."""
    with RoundGate() as gate, trio.fail_after(10):
        h = TopicsHarness(tmp_path, fsync="always", rounds=gate)
        async with trio.open_nursery() as nursery:
            sock, _ = h.connect(nursery)
            gate.open()
            ids = await _fill(sock, 3, b"original")
            log = h.state.topics.get(b"s").log
            read = encode_command([b"XREAD", b"COUNT", b"5", b"STREAMS", b"s", b"0"])
            # XDEL writes at once (no deferred entry); the blocking XREAD
            # after it makes the batch so far wait for the round first.
            for request, replies, deleted in [
                (read + encode_command([b"XDEL", b"s", ids[0]])
                 + encode_command([b"XREAD", b"BLOCK", b"1", b"STREAMS", b"s", b"$"]), 3, ids[0]),
                (read + encode_command([b"XDEL", b"s", ids[1]]), 2, ids[1]),
            ]:
                gate.close()
                await sock.send(request)
                await trio.testing.wait_all_tasks_blocked()  # the replies wait for the round
                assert scribble(log, b"original", b"scribble") == 3
                gate.open()
                got = await read_replies(sock, replies)
                entries = got[0][0][1]
                assert [e[0] for e in entries] == ids[ids.index(deleted):] and got[1] == 1
                assert [e[1] for e in entries] == [[b"f", b"original"]] * len(entries)
                assert scribble(log, b"scribble", b"original") == 3
            nursery.cancel_scope.cancel()
    h.state.topics.close()
