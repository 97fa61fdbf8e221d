"""The server's own epoll set of client sockets (``server.reactor``) and what
a plain connection does with it (``Connection._wait_input``,
``_on_ready``, ``_answer_parked``): readiness reported once per arrival,
a consumer's poll answered while the connection's task stays parked, and
everything else handed to the task with nothing lost."""

from __future__ import annotations

import logging
import socket

import hiredis
import pytest
import trio
from trio.testing import wait_all_tasks_blocked

from server.dispatch import Context
from server.reactor import MAX_EVENTS, Reactor
from server.resp import encode_command
from tests.server.support import Harness, TopicsHarness
from tests.server.support import one_reply as _one_reply
from tests.server.support import read_exactly as _read_exactly
from tests.server.support import read_replies as _replies

_PATIENCE_S = 10


# -- the set -------------------------------------------------------------------

def _pair():
    a, b = socket.socketpair()
    a.setblocking(False)
    return a, b


def test_new_input_is_reported_once_per_arrival():
    reactor = Reactor()
    ours, theirs = _pair()
    calls = []
    assert reactor.register(ours.fileno(), lambda _events: calls.append(1))
    assert reactor.dispatch() == 0 and calls == []
    theirs.send(b"a")
    assert reactor.dispatch() == 1 and len(calls) == 1
    # Edge-triggered: unread input is not reported again ...
    assert reactor.dispatch() == 0 and len(calls) == 1
    # ... new input is, read or not.
    theirs.send(b"b")
    assert reactor.dispatch() == 1 and len(calls) == 2
    assert ours.recv(10) == b"ab"
    theirs.close()  # EOF is input too
    assert reactor.dispatch() == 1 and len(calls) == 3
    ours.close()


def test_input_already_there_is_reported_at_registration():
    reactor = Reactor()
    ours, theirs = _pair()
    theirs.send(b"early")
    calls = []
    reactor.register(ours.fileno(), lambda _events: calls.append(1))
    assert reactor.dispatch() == 1 and calls == [1]


def test_unregistered_sockets_are_not_reported_and_a_second_registration_is_refused():
    reactor = Reactor()
    ours, theirs = _pair()
    calls = []
    reactor.register(ours.fileno(), lambda _events: calls.append(1))
    with pytest.raises(ValueError):
        reactor.register(ours.fileno(), lambda _events: None)
    assert reactor.registered == 1
    reactor.unregister(ours.fileno())
    reactor.unregister(ours.fileno())  # twice is harmless
    theirs.send(b"x")
    assert reactor.dispatch() == 0 and calls == [] and reactor.registered == 0
    # A socket that cannot be watched (closed) is refused, not raised.
    fd = ours.fileno()
    ours.close()
    assert reactor.register(fd, lambda _events: None) is False


def test_a_failing_handler_is_logged_and_the_others_still_run(caplog):
    reactor = Reactor()
    (a, a_peer), (b, b_peer) = _pair(), _pair()
    calls = []

    def bad(_events):
        raise RuntimeError("boom")

    reactor.register(a.fileno(), bad)
    reactor.register(b.fileno(), lambda _events: calls.append("b"))
    a_peer.send(b"1")
    b_peer.send(b"1")
    with caplog.at_level(logging.ERROR, logger="partita.reactor"):
        assert reactor.dispatch() == 2
    assert calls == ["b"]
    assert "input handler of fd %d failed" % a.fileno() in caplog.text


async def test_the_task_calls_handlers_as_input_arrives_and_closes_the_set_when_cancelled():
    reactor = Reactor()
    pairs = [_pair() for _ in range(MAX_EVENTS + 3)]  # more than one look at the set takes
    seen = []
    for i, (ours, _) in enumerate(pairs):
        reactor.register(ours.fileno(), lambda _events, i=i: seen.append(i))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reactor.run)
        await wait_all_tasks_blocked()
        for _, theirs in pairs:
            theirs.send(b"x")
        with trio.fail_after(5):
            while len(seen) < len(pairs):
                await trio.sleep(0.001)
        assert sorted(seen) == list(range(len(pairs)))
        nursery.cancel_scope.cancel()
    assert reactor.registered == 0
    reactor.unregister(pairs[0][0].fileno())  # after the set closed: harmless


# -- a plain connection in the set ---------------------------------------------

class _Served:
    """A TopicsHarness (or Harness) whose connection is in a running Reactor,
    counting the polls answered while parked and its task's returns from
    the input wait."""

    def __init__(self, harness):
        self.h = harness
        self.reactor = harness.state.reactor = Reactor()
        self.inline = 0
        self.wakes = 0

    def connect(self, nursery):
        nursery.start_soon(self.reactor.run)
        sock, conn = self.h.connect(nursery)
        answer, wait = conn._answer_parked, conn._wait_input

        def counted_answer():
            done = answer()
            self.inline += done
            return done

        async def counted_wait(sock_=None):
            await wait(sock_)
            self.wakes += 1

        conn._answer_parked = counted_answer
        conn._wait_input = counted_wait
        return sock, conn


def _fill(h, key=b"s", n=30, value=b"v"):
    ctx = Context(h.state, h.state.new_client("t:1", "t:0", -1), h.dispatcher)
    for i in range(1, n + 1):
        h.dispatcher.call(ctx, [b"XADD", key, b"%d-0" % i, b"f", value])
    ctx.appends.commit()
    return ctx


async def _reply(sock, reader) -> bytes:
    with trio.fail_after(_PATIENCE_S):  # a reply that never comes fails, not hangs
        return await _one_reply(sock, reader)


async def read_exactly(sock, n):
    with trio.fail_after(_PATIENCE_S):
        return await _read_exactly(sock, n)


async def _park(sock, conn) -> None:
    """One request answered by the task, then until its task is parked for input."""
    await sock.send(b"PING\r\n")
    assert await read_exactly(sock, 7) == b"+PONG\r\n"
    await wait_all_tasks_blocked()
    assert conn._input.task is not None


def _poll(count=b"10", key=b"s", after=b"0-0"):
    return encode_command([b"XREAD", b"COUNT", count, b"STREAMS", key, after])


async def _general_reply(h, request) -> bytes:
    """``request``'s reply from the parser and the general dispatch."""
    from server.reply import encode

    ctx = Context(h.state, h.state.new_client("t:2", "t:0", -1), h.dispatcher)
    reader = hiredis.Reader()
    reader.feed(request)
    argv = reader.gets()
    reply = h.dispatcher.call(ctx, argv)
    if hasattr(reply, "__await__"):
        reply = await reply
    return encode(reply, 2)


async def test_polls_are_answered_while_the_task_stays_parked(tmp_path):
    h = TopicsHarness(tmp_path)
    _fill(h)
    served = _Served(h)
    reader = hiredis.Reader()
    async with trio.open_nursery() as nursery:
        sock, conn = served.connect(nursery)
        await _park(sock, conn)
        polls = [_poll(count, after=after) for count, after in
                 [(b"10", b"0-0"), (b"3", b"4-0"), (b"1", b"30-0"), (b"1000", b"0")]]
        expected = [await _general_reply(h, poll) for poll in polls]  # 4 XREAD calls counted
        stats = h.state.stats
        bytes_in, bytes_out = stats.total_net_input_bytes, stats.total_net_output_bytes
        wakes = served.wakes
        for poll, reply in zip(polls, expected):
            await sock.send(poll)
            assert await _reply(sock, reader) == reply
            await wait_all_tasks_blocked()
        assert served.inline == 4
        assert served.wakes == wakes  # the task never ran for them
        # Counted as the dispatcher counts XREAD; the bytes in and out too.
        assert stats.total_net_input_bytes - bytes_in == sum(map(len, polls))
        assert stats.total_net_output_bytes - bytes_out == sum(map(len, expected))
        await sock.send(encode_command([b"INFO", b"commandstats"]))
        assert b"cmdstat_xread:calls=8," in await _reply(sock, reader)
        nursery.cancel_scope.cancel()
    h.state.topics.close()


async def test_other_input_while_parked_is_handed_to_the_task_unread_once(tmp_path):
    h = TopicsHarness(tmp_path)
    _fill(h)
    served = _Served(h)
    async with trio.open_nursery() as nursery:
        sock, conn = served.connect(nursery)
        recvs = []
        real_recv = conn.sock.recv

        def counting_recv(n, *args):
            data = real_recv(n, *args)  # BlockingIOError passes through, not counted
            recvs.append(data)
            return data

        conn.sock.recv = counting_recv
        await _park(sock, conn)
        recvs.clear()
        wakes = served.wakes
        # Not a lone poll: two pipelined, a poll of a BLOCK form, a plain command.
        for request, expected in [
            (_poll() + _poll(b"1"), await _general_reply(h, _poll()) + await _general_reply(h, _poll(b"1"))),
            (encode_command([b"XREAD", b"BLOCK", b"1", b"STREAMS", b"s", b"0"]), None),
            (encode_command([b"ECHO", b"hi"]), b"$2\r\nhi\r\n"),
        ]:
            await sock.send(request)
            if expected is None:
                assert await _reply(sock, hiredis.Reader())
            else:
                assert await read_exactly(sock, len(expected)) == expected
            await wait_all_tasks_blocked()
        assert served.inline == 0
        assert served.wakes == wakes + 3  # woken once for each
        # Each request was received once, whole (by _answer_parked), and
        # the task did not receive it again.
        assert recvs == [_poll() + _poll(b"1"), encode_command([b"XREAD", b"BLOCK", b"1", b"STREAMS", b"s", b"0"]),
                         encode_command([b"ECHO", b"hi"])]
        nursery.cancel_scope.cancel()
    h.state.topics.close()


async def test_a_reply_the_socket_does_not_take_is_finished_by_the_task(tmp_path):
    h = TopicsHarness(tmp_path)
    _fill(h, n=300, value=b"x" * 2000)
    served = _Served(h)
    async with trio.open_nursery() as nursery:
        sock, conn = served.connect(nursery)
        conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        await _park(sock, conn)
        await sock.send(_poll(b"300"))
        await wait_all_tasks_blocked()  # answered in part, the rest left to the task
        assert served.inline == 0
        expected = await _general_reply(h, _poll(b"300"))
        assert len(expected) > 600_000
        assert await read_exactly(sock, len(expected)) == expected
        await sock.send(b"PING\r\n")
        assert await read_exactly(sock, 7) == b"+PONG\r\n"
        nursery.cancel_scope.cancel()
    h.state.topics.close()


async def test_a_client_that_leaves_while_parked_is_closed_and_unregistered():
    h = Harness()
    served = _Served(h)
    async with trio.open_nursery() as nursery:
        sock, conn = served.connect(nursery)
        await _park(sock, conn)
        assert served.reactor.registered == 1 and len(h.state.clients) == 1
        sock.close()
        with trio.fail_after(5):
            while h.state.clients:
                await trio.sleep(0.001)
        assert served.reactor.registered == 0
        nursery.cancel_scope.cancel()


async def test_with_an_idle_timeout_polls_wake_the_task(tmp_path, autojump_clock):
    h = TopicsHarness(tmp_path, timeout=30)
    _fill(h)
    served = _Served(h)
    reader = hiredis.Reader()
    async with trio.open_nursery() as nursery:
        sock, conn = served.connect(nursery)
        await sock.send(_poll())
        assert await _reply(sock, reader) == await _general_reply(h, _poll())
        await trio.sleep(29)
        await sock.send(_poll())
        assert await _reply(sock, reader) == await _general_reply(h, _poll())
        assert served.inline == 0
        # The timeout runs from the last poll, which the task itself served.
        with trio.fail_after(100):  # virtual seconds
            assert await _read_exactly(sock, 100) == b""
        assert trio.current_time() >= 59
        nursery.cancel_scope.cancel()
    h.state.topics.close()


async def test_shutdown_closes_a_parked_connection(tmp_path):
    h = Harness()
    served = _Served(h)
    async with trio.open_nursery() as nursery:
        sock, conn = served.connect(nursery)
        await _park(sock, conn)
        conn.stop()
        assert await read_exactly(sock, 1) == b""
        assert conn._input.task is None
        nursery.cancel_scope.cancel()


async def test_a_fault_while_answering_a_parked_connection_closes_it(tmp_path, caplog):
    h = TopicsHarness(tmp_path)
    _fill(h)
    served = _Served(h)

    def broken(ctx, data, out):
        raise RuntimeError("boom")

    async with trio.open_nursery() as nursery:
        sock, conn = served.connect(nursery)
        await _park(sock, conn)
        h.dispatcher.read_poll = broken
        with caplog.at_level(logging.ERROR, logger="partita.connection"):
            await sock.send(_poll())
            assert await read_exactly(sock, 1) == b""  # closed, not left waiting
        assert "connection %d failed" % conn.client.id in caplog.text
        assert served.reactor.registered == 0
        nursery.cancel_scope.cancel()
    h.state.topics.close()


# -- fsync always: a held connection's next XADDs taken in the reactor's step --

def _always(tmp_path, **config_values):
    """fsync always with the group commit's rounds on server._fsync's
    thread, which sends the held replies itself (as the server runs it)."""
    from server.durability import Durability

    h = TopicsHarness(tmp_path, fsync="always", **config_values)
    h.state.durability = Durability()
    return h


def _batch(n, start=0, key=b"s"):
    return b"".join(encode_command([b"XADD", key, b"*", b"f", b"v%d" % i]) for i in range(start, start + n))


async def _ids(sock, n):
    with trio.fail_after(_PATIENCE_S):
        replies = await _replies(sock, n)
    assert all(isinstance(r, bytes) and b"-" in r for r in replies), replies
    return replies


async def _until(condition):
    """Wait (on the real clock: the round's thread is real) until ``condition()``."""
    with trio.fail_after(_PATIENCE_S):
        while not condition():
            await trio.sleep(0.001)


class _Releases:
    """Counts a connection task's entries into and returns from its wait
    for held batches (``Connection._release``)."""

    def __init__(self, conn):
        self.entered = self.returned = 0
        release = conn._release

        async def counted(held):
            self.entered += 1
            held = await release(held)
            self.returned += 1
            return held

        conn._release = counted


def _taking(conn):
    """The reactor takes the connection's next batch: owned, its last
    held batch done (the loop ended that round)."""
    return conn._owned and conn.held is not None and conn.held.done


async def _owned_after_a_batch(sock, conn, n=16):
    await sock.send(_batch(n))
    ids = await _ids(sock, n)
    await _until(lambda: _taking(conn))
    return ids


async def test_a_held_connections_next_batches_are_taken_without_its_task(tmp_path):
    h = _always(tmp_path)
    served = _Served(h)
    async with trio.open_nursery() as nursery:
        sock, conn = served.connect(nursery)
        releases = _Releases(conn)
        ids = await _owned_after_a_batch(sock, conn)
        entered, returned, wakes = releases.entered, releases.returned, served.wakes
        assert entered == returned + 1  # the task waits for its held batch, and stays
        rounds = h.state.durability.fsync_count
        for i in range(1, 6):
            await sock.send(_batch(16, start=16 * i))
            ids += await _ids(sock, 16)
            await _until(lambda: _taking(conn))
        # Five batches appended, made durable and answered, the task never ran.
        assert (releases.entered, releases.returned, served.wakes) == (entered, returned, wakes)
        assert h.state.durability.fsync_count > rounds
        assert ids == sorted(ids, key=lambda i: tuple(map(int, i.split(b"-")))) and len(set(ids)) == 96
        log = h.state.topics.get(b"s").log
        await _until(lambda: log.recovery_point == log.log_end_offset == 96)  # the loop ends the last round
        reader = hiredis.Reader()
        reader.feed(await _general_reply(h, encode_command([b"XRANGE", b"s", b"-", b"+"])))
        entries = reader.gets()
        assert [e[0] for e in entries] == ids and [e[1] for e in entries] == [[b"f", b"v%d" % i] for i in range(96)]
        stats = h.state.stats
        assert stats.commands["xadd"][0] == 96  # counted as the task counts them
        # A request of another kind goes to the task, which answers it.
        await sock.send(encode_command([b"PING"]))
        assert await read_exactly(sock, 7) == b"+PONG\r\n"
        assert releases.returned == returned + 1 and not conn._owned
        nursery.cancel_scope.cancel()
    h.state.topics.close()


async def test_input_after_runs_taken_goes_to_the_task_after_their_replies(tmp_path):
    h = _always(tmp_path)
    served = _Served(h)
    async with trio.open_nursery() as nursery:
        sock, conn = served.connect(nursery)
        await _owned_after_a_batch(sock, conn, n=2)
        # Three XADDs the reactor takes, then what it does not: the replies
        # stay in order and XLEN sees the three.
        await sock.send(_batch(3, start=2) + encode_command([b"XLEN", b"s"]) + encode_command([b"PING"]))
        with trio.fail_after(_PATIENCE_S):
            replies = await _replies(sock, 5)
        assert all(b"-" in r for r in replies[:3]) and replies[3:] == [5, b"PONG"]
        # And back to the reactor for the next pure batch.
        await sock.send(_batch(4, start=5))
        await _ids(sock, 4)
        await _until(lambda: _taking(conn))
        assert h.state.topics.get(b"s").log.log_end_offset == 9
        nursery.cancel_scope.cancel()
    h.state.topics.close()


async def test_a_failed_commit_of_taken_runs_answers_the_error(tmp_path):
    import errno

    from storage.errors import StorageError

    h = _always(tmp_path)
    served = _Served(h)
    async with trio.open_nursery() as nursery:
        sock, conn = served.connect(nursery)
        releases = _Releases(conn)
        await _owned_after_a_batch(sock, conn, n=1)
        stream = h.state.topics.get(b"s")
        real_append = stream.log.append

        def failing_append(entries, *a, **kw):
            raise StorageError("append: No space left on device", errno=errno.ENOSPC)

        stream.log.append = failing_append
        # Twice: handed over with a sequence already durable (the usual
        # case), then with none at all (``_hand_taken`` leaves them to the
        # task), as on a server whose first commit fails.
        for forget_seq in (False, True):
            returned = releases.returned
            if forget_seq:
                h.dispatcher.appends.flush_seq = 0
            await sock.send(_batch(3, start=1))
            with trio.fail_after(_PATIENCE_S):
                replies = await _replies(sock, 3)
            for reply in replies:
                assert isinstance(reply, Exception) and str(reply).startswith("MISCONF Errors writing"), replies
            await _until(lambda: releases.returned == returned + 1)  # the task goes on (nothing to wait for)
            await _until(lambda: conn._input.task is not None)
            # Back to the reactor after the next good batch.
            stream.log.append = real_append
            await sock.send(_batch(1, start=4))
            await _ids(sock, 1)
            await _until(lambda: _taking(conn))
            stream.log.append = failing_append
        stream.log.append = real_append
        await sock.send(encode_command([b"XLEN", b"s"]))
        with trio.fail_after(_PATIENCE_S):
            assert await _replies(sock, 1) == [3]  # nothing of the failed runs
        nursery.cancel_scope.cancel()
    h.state.topics.close()


async def test_a_client_that_leaves_or_is_killed_while_taken_is_closed(tmp_path):
    h = _always(tmp_path)
    served = _Served(h)
    async with trio.open_nursery() as nursery:
        sock, conn = served.connect(nursery)
        await _owned_after_a_batch(sock, conn)
        sock.close()
        await _until(lambda: served.reactor.registered == 0 and not h.state.clients)
        sock, conn = h.connect(nursery)
        await _owned_after_a_batch(sock, conn)
        conn.kill()  # CLIENT KILL
        with trio.fail_after(_PATIENCE_S):
            assert await _read_exactly(sock, 1) == b""
        nursery.cancel_scope.cancel()
    h.state.topics.close()


async def test_with_an_idle_timeout_the_task_takes_its_batches(tmp_path):
    h = _always(tmp_path, timeout=30)
    served = _Served(h)
    async with trio.open_nursery() as nursery:
        sock, conn = served.connect(nursery)
        wakes = served.wakes
        for i in range(3):
            await sock.send(_batch(4, start=4 * i))
            await _ids(sock, 4)
            await _until(lambda: conn._input.task is not None)  # back to its own input wait
            assert not conn._owned
        assert served.wakes >= wakes + 2  # woken for each next batch
        nursery.cancel_scope.cancel()
    h.state.topics.close()


async def test_a_fault_while_handing_taken_runs_over_closes_the_connection(tmp_path, caplog):
    h = _always(tmp_path)
    served = _Served(h)
    async with trio.open_nursery() as nursery:
        sock, conn = served.connect(nursery)
        await _owned_after_a_batch(sock, conn, n=2)

        def broken(out, send):
            raise RuntimeError("boom")

        conn._hold = broken
        with caplog.at_level(logging.ERROR, logger="partita.connection"):
            await sock.send(_batch(2, start=2))
            with trio.fail_after(_PATIENCE_S):
                assert await _read_exactly(sock, 1) == b""  # closed, not left waiting
        assert "connection %d failed" % conn.client.id in caplog.text
        await _until(lambda: served.reactor.registered == 0)
        nursery.cancel_scope.cancel()
    h.state.topics.close()
