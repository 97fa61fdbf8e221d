"""The server's own epoll set of client sockets (``server.reactor``) and what
a plain connection does with it (server/connection.py: parked IDLE, OWNED):
readiness reported once per arrival, a consumer's poll answered while the
connection's task stays parked, a held connection's next XADDs taken
without it, and everything else handed to the task with nothing lost.
Observed from outside: replies, closes, INFO figures, the sockets' sends
and receives, and the connection task's steps (a trio Instrument)."""

from __future__ import annotations

import contextlib
import logging
import math
import socket

import hiredis
import pytest
import trio
from trio.testing import wait_all_tasks_blocked

from server.dispatch import Context
from server.reactor import MAX_EVENTS, SHUT, Reactor
from server.resp import encode_command
from tests.server.support import Harness, RoundGate, TopicsHarness, full_disk_append, one_reply, read_replies
from tests.server.support import read_exactly as _read_exactly

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


def test_an_eof_that_comes_with_the_last_bytes_is_reported_with_them():
    """One report for both: a receive of the bytes stops short of the EOF,
    so the report must say the peer has shut its side (``SHUT``)."""
    reactor = Reactor()
    ours, theirs = _pair()
    masks = []
    reactor.register(ours.fileno(), masks.append)
    theirs.send(b"PING\r\n")
    assert reactor.dispatch() == 1 and not masks[-1] & SHUT
    theirs.send(b"*2\r\n$4\r\nECHO\r\n")
    theirs.shutdown(socket.SHUT_WR)
    assert reactor.dispatch() == 1 and masks[-1] & SHUT
    assert ours.recv(100) == b"PING\r\n*2\r\n$4\r\nECHO\r\n"  # all of the bytes, short of the EOF ...
    assert reactor.dispatch() == 0  # ... and no report of it again
    assert ours.recv(100) == b""
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


# -- the loop's idle wait, taken by the reactor's task (IdleWait) ---------------

@contextlib.contextmanager
def _loop_waker(after_s=_PATIENCE_S):
    """A thread that wakes trio's loop (``run_sync_soon``) every second
    from ``after_s`` on, until the block ends: an idle wait that wrongly
    goes on past what the loop has to do ends then, and the test fails on
    its time check instead of hanging."""
    import threading

    token = trio.lowlevel.current_trio_token()
    done = threading.Event()

    def wake():
        if not done.wait(after_s):
            while not done.wait(1):
                token.run_sync_soon(lambda: None)

    thread = threading.Thread(target=wake, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


@contextlib.contextmanager
def _promptly(deadline=True):
    """The block must end well before ``_PATIENCE_S`` (wall clock): a
    wait that is not ended by what should end it is ended by the deadline
    (not with a test's clock, whose time is not the wall's) or the loop's
    waker, whichever it heeds, and fails here."""
    import time

    started = time.monotonic()
    with _loop_waker(), trio.fail_after(_PATIENCE_S if deadline else math.inf):
        yield
    assert time.monotonic() - started < _PATIENCE_S / 2


@pytest.fixture
def sockets():
    """``sockets(n)``: n socket pairs (``_pair``) for the test, all closed
    after it (no descriptors left to later tests that count them)."""
    made = []

    def make(n=1):
        pairs = [_pair() for _ in range(n)]
        made.extend(pairs)
        return pairs

    yield make
    for pair in made:
        for sock in pair:
            sock.close()


@pytest.fixture
def watched(sockets):
    """A Reactor watching one socket whose handler reads what came: the
    reactor, its peer socket."""
    reactor = Reactor()
    [(ours, theirs)] = sockets()
    reactor.register(ours.fileno(), lambda _events: ours.recv(10))
    return reactor, theirs


def _trio_pair(sockets):
    """A pair of the ``sockets`` fixture as trio sockets: (ours, the peer's stdlib socket)."""
    [(ours, theirs)] = sockets()
    return trio.socket.from_stdlib_socket(ours), theirs


async def test_the_task_waits_for_input_itself_while_the_loop_is_idle(sockets):
    """After a step the reactor's task waits for the next input in the
    loop's place (no pass of trio's loop per arrival), and goes on serving
    each arrival until a handler gives the loop something to run."""
    import threading

    reactor = Reactor()
    [(ours, theirs)] = sockets()
    seen, handled, finished = [], threading.Event(), trio.Event()

    def on_ready(_events):
        seen.append(ours.recv(10))
        handled.set()
        if len(seen) == 5:
            finished.set()  # a task to run: the reactor goes back to trio

    def client():  # each byte once the one before was handled
        for i in range(5):
            handled.wait(_PATIENCE_S)
            handled.clear()
            theirs.send(b"%d" % i)

    reactor.register(ours.fileno(), on_ready)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reactor.run)
        await wait_all_tasks_blocked()
        handled.set()
        thread = threading.Thread(target=client)
        thread.start()
        with trio.fail_after(_PATIENCE_S):
            await finished.wait()
        thread.join()
        assert seen == [b"0", b"1", b"2", b"3", b"4"]
        assert reactor.idle_waits == 4  # every arrival after the first, found by its own wait
        nursery.cancel_scope.cancel()


async def test_a_task_a_handler_makes_runnable_runs_before_more_input(sockets):
    reactor = Reactor()
    [(ours, theirs)] = sockets()
    woken = trio.Event()
    reactor.register(ours.fileno(), lambda _events: (ours.recv(10), woken.set()))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reactor.run)
        await wait_all_tasks_blocked()
        with _promptly():
            theirs.send(b"x")
            await woken.wait()
        nursery.cancel_scope.cancel()


async def test_a_task_left_in_the_batch_the_loop_runs_is_not_kept_waiting(watched, sockets):
    """A task woken in the same pass of trio's loop as the reactor's (both
    sockets reported at once) may come after it in the batch: the reactor
    must not wait for input while it is still to run. The loop runs a
    batch in either order, so try many times."""
    reactor, theirs = watched
    other, other_peer = _trio_pair(sockets)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reactor.run)
        for _ in range(20):
            got = trio.Event()

            async def reader():
                await other.recv(10)
                got.set()

            nursery.start_soon(reader)
            await wait_all_tasks_blocked()
            with _promptly():
                other_peer.send(b"o")
                theirs.send(b"x")  # both before the loop looks again
                await got.wait()
        nursery.cancel_scope.cancel()


async def _a_deadline(_sockets):
    await trio.sleep(0.05)


async def _a_threads_wake_up(_sockets):
    import time

    await trio.to_thread.run_sync(time.sleep, 0.05)  # done while the reactor waits


async def _input_on_a_socket_the_loop_watches(sockets):
    import threading

    other, other_peer = _trio_pair(sockets)
    sender = threading.Timer(0.05, other_peer.send, (b"o",))
    sender.start()
    assert await other.recv(10) == b"o"
    sender.join()


@pytest.mark.parametrize("loop_work", [_a_deadline, _a_threads_wake_up, _input_on_a_socket_the_loop_watches])
async def test_what_the_loop_has_to_do_ends_the_idle_wait(loop_work, watched, sockets):
    reactor, theirs = watched
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reactor.run)
        await wait_all_tasks_blocked()
        with _promptly():
            theirs.send(b"x")  # the reactor's step, then its own wait, which this must end:
            await loop_work(sockets)
        assert reactor.idle_waits == 0
        nursery.cancel_scope.cancel()


async def test_with_a_mock_clock_the_task_waits_in_trio(autojump_clock, watched):
    """A test's clock is not the wall clock the idle wait's time-out would
    use: the reactor parks in trio, and the clock still jumps."""
    reactor, theirs = watched
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reactor.run)
        with _promptly(deadline=False):
            theirs.send(b"x")
            await trio.sleep(3600)  # jumps at once
        nursery.cancel_scope.cancel()


# -- a plain connection in the set ---------------------------------------------

class _Steps(trio.abc.Instrument):
    """Counts the steps taken by connection tasks (``Connection.run``): none
    while a request is answered means the reactor answered it in its own
    step, the connection's task staying parked."""

    def __init__(self) -> None:
        self.count = 0

    def before_task_step(self, task) -> None:
        if task.name.endswith("Connection.run"):
            self.count += 1


class _Served:
    """A TopicsHarness (or Harness) whose connection is in a running Reactor;
    ``steps`` counts its task's steps."""

    def __init__(self, harness):
        self.h = harness
        self.reactor = harness.state.reactor = Reactor()
        self.steps = _Steps()

    def connect(self, nursery):
        trio.lowlevel.add_instrument(self.steps)
        nursery.start_soon(self.reactor.run)
        self.nursery = nursery
        return self.h.connect(nursery)

    def leave_with(self, data: bytes) -> None:
        """The client's last bytes and its EOF, in one arrival (no scheduler
        pass between them)."""
        peer = self.h.peers[-1]
        if data:
            peer.send(data)
        peer.shutdown(socket.SHUT_WR)


@contextlib.asynccontextmanager
async def _serving(h):
    """``h``'s connection in a running Reactor, for the body of the block:
    ``(served, client socket, connection)``. Closes ``h``'s topics after."""
    served = _Served(h)
    try:
        async with trio.open_nursery() as nursery:
            sock, conn = served.connect(nursery)
            yield served, sock, conn
            nursery.cancel_scope.cancel()
    finally:
        if isinstance(h, TopicsHarness):
            h.state.topics.close()


def _fill(h, key=b"s", n=30, value=b"v"):
    ctx = Context(h.state, h.state.new_client("t:1", "t:0", -1), h.dispatcher)
    for i in range(1, n + 1):
        h.dispatcher.call(ctx, [b"XADD", key, b"%d-0" % i, b"f", value])
    ctx.session.commit_deferred()
    return ctx


async def _reply(sock, reader) -> bytes:
    with trio.fail_after(_PATIENCE_S):  # a reply that never comes fails, not hangs
        return await one_reply(sock, reader)


async def read_exactly(sock, n):
    with trio.fail_after(_PATIENCE_S):
        return await _read_exactly(sock, n)


async def _closed(sock) -> bytes:
    """Everything the server sends until it closes (bounded: a connection
    that never notices its client left fails here). A close with bytes of
    ours unread resets the connection: closed too."""
    data = b""
    with trio.fail_after(_PATIENCE_S):
        try:
            while chunk := await sock.recv(65536):
                data += chunk
        except ConnectionResetError:
            pass
    return data


def _gone(h, served, conn) -> bool:
    """Whether ``conn``'s client is no longer a client (INFO clients) nor
    watched by the reactor."""
    return conn.client.id not in h.state.clients and served.reactor.registered == 0


async def _park(sock) -> None:
    """One request answered by the task, then until every task is parked."""
    await sock.send(b"PING\r\n")
    assert await read_exactly(sock, 7) == b"+PONG\r\n"
    await wait_all_tasks_blocked()


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


# An idle timeout changes nothing here: idle clients are closed by a sweep
# (close_idle_clients), not by a timer of the task's wait.
@pytest.mark.parametrize("timeout_s", [0, 30])
async def test_polls_are_answered_while_the_task_stays_parked(tmp_path, timeout_s):
    h = TopicsHarness(tmp_path, timeout=timeout_s)
    _fill(h)
    reader = hiredis.Reader()
    async with _serving(h) as (served, sock, conn):
        await _park(sock)
        polls = [_poll(count, after=after) for count, after in
                 [(b"10", b"0-0"), (b"3", b"4-0"), (b"1", b"30-0"), (b"1000", b"0")]]
        expected = [await _general_reply(h, poll) for poll in polls]  # 4 XREAD calls counted
        stats = h.state.stats
        bytes_in, bytes_out = stats.total_net_input_bytes, stats.total_net_output_bytes
        steps = served.steps.count
        for poll, reply in zip(polls, expected):
            await sock.send(poll)
            assert await _reply(sock, reader) == reply
            await wait_all_tasks_blocked()
        assert served.steps.count == steps  # the task never ran for them
        # Counted as the dispatcher counts XREAD; the bytes in and out too.
        assert stats.total_net_input_bytes - bytes_in == sum(map(len, polls))
        assert stats.total_net_output_bytes - bytes_out == sum(map(len, expected))
        await sock.send(encode_command([b"INFO", b"commandstats"]))
        assert b"cmdstat_xread:calls=8," in await _reply(sock, reader)


async def test_batches_of_commands_are_run_while_the_task_stays_parked_and_received_once(tmp_path):
    h = TopicsHarness(tmp_path)
    _fill(h)
    async with _serving(h) as (served, sock, conn):
        await _park(sock)
        h.recvs.clear()
        # Not a lone poll: two pipelined, a plain command, a range.
        xrange = encode_command([b"XRANGE", b"s", b"-", b"+", b"COUNT", b"2"])
        requests = [
            (_poll() + _poll(b"1"), await _general_reply(h, _poll()) + await _general_reply(h, _poll(b"1"))),
            (encode_command([b"ECHO", b"hi"]), b"$2\r\nhi\r\n"),
            (xrange, await _general_reply(h, xrange)),
        ]
        for request, expected in requests:
            steps = served.steps.count
            await sock.send(request)
            assert await read_exactly(sock, len(expected)) == expected
            await wait_all_tasks_blocked()
            assert served.steps.count == steps  # the task never ran for it
        # A command that must wait is the task's: it awaits it, and goes on
        # with the rest of the batch after it.
        steps = served.steps.count
        waits = encode_command([b"XREAD", b"BLOCK", b"1", b"STREAMS", b"s", b"$"])
        await sock.send(encode_command([b"ECHO", b"a"]) + waits + encode_command([b"ECHO", b"b"]))
        assert await read_exactly(sock, 7 + 5 + 7) == b"$1\r\na\r\n*-1\r\n$1\r\nb\r\n"
        await wait_all_tasks_blocked()
        assert served.steps.count > steps
        # Each request was received once, whole (in the reactor's step), and
        # the task did not receive it again.
        received = [data for data in h.recvs if data is not None]
        assert received == [request for request, _ in requests] + [
            encode_command([b"ECHO", b"a"]) + waits + encode_command([b"ECHO", b"b"])]


async def test_a_restricted_users_reads_without_a_wait_are_run_while_the_task_stays_parked(tmp_path):
    h = TopicsHarness(tmp_path)
    _fill(h)
    reader = hiredis.Reader()
    async with _serving(h) as (served, sock, conn):
        await sock.send(encode_command([b"ACL", b"SETUSER", b"u", b"on", b">pw", b"~s", b"+@all"])
                        + encode_command([b"AUTH", b"u", b"pw"]))
        assert await read_exactly(sock, 10) == b"+OK\r\n+OK\r\n"
        await _park(sock)
        read = encode_command([b"XREAD", b"COUNT", b"2", b"STREAMS", b"s", b"0"])
        steps = served.steps.count
        await sock.send(read)
        assert await _reply(sock, reader) == await _general_reply(h, read)
        await wait_all_tasks_blocked()
        assert served.steps.count == steps  # XREAD's no-wait path, as for any client
        await sock.send(encode_command([b"XREAD", b"COUNT", b"2", b"STREAMS", b"other", b"0"]))
        assert (await _reply(sock, reader)).startswith(b"-NOPERM")


async def test_a_reply_the_socket_does_not_take_is_finished_by_the_task(tmp_path):
    h = TopicsHarness(tmp_path)
    _fill(h, n=300, value=b"x" * 2000)
    async with _serving(h) as (served, sock, conn):
        conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        await _park(sock)
        steps = served.steps.count
        await sock.send(_poll(b"300"))
        await wait_all_tasks_blocked()  # answered in part, the rest left to the task
        assert served.steps.count > steps
        expected = await _general_reply(h, _poll(b"300"))
        assert len(expected) > 600_000
        assert await read_exactly(sock, len(expected)) == expected
        await sock.send(b"PING\r\n")
        assert await read_exactly(sock, 7) == b"+PONG\r\n"


async def test_a_client_that_leaves_while_parked_is_closed_and_unregistered():
    h = Harness()
    async with _serving(h) as (served, sock, conn):
        await _park(sock)
        assert served.reactor.registered == 1 and len(h.state.clients) == 1
        sock.close()
        with trio.fail_after(5):
            while h.state.clients:
                await trio.sleep(0.001)
        assert served.reactor.registered == 0


async def test_shutdown_closes_a_parked_connection(tmp_path):
    h = Harness()
    async with _serving(h) as (served, sock, conn):
        await _park(sock)
        conn.stop()
        assert await read_exactly(sock, 1) == b""
        await _until(lambda: served.reactor.registered == 0)


async def test_a_fault_while_answering_a_parked_connection_closes_it(tmp_path, caplog):
    h = TopicsHarness(tmp_path)
    _fill(h)

    def broken(ctx, argv):
        raise RuntimeError("boom")

    async with _serving(h) as (served, sock, conn):
        await _park(sock)
        h.dispatcher.call = broken
        with caplog.at_level(logging.ERROR, logger="partita.connection"):
            await sock.send(encode_command([b"ECHO", b"hi"]))
            assert await read_exactly(sock, 1) == b""  # closed, not left waiting
        assert "connection %d failed" % conn.client.id in caplog.text
        assert served.reactor.registered == 0


# -- fsync always: a held connection's next XADDs taken in the reactor's step --

def _always(tmp_path, **config_values):
    """fsync always with the group commit's rounds on cluster.broker._fsync's
    thread, which sends the held replies itself (as the server runs it)."""
    from cluster.broker.durability import Durability

    h = TopicsHarness(tmp_path, fsync="always", **config_values)
    h.state.durability = Durability()
    return h


def _batch(n, start=0, key=b"s"):
    return b"".join(encode_command([b"XADD", key, b"*", b"f", b"v%d" % i]) for i in range(start, start + n))


async def _ids(sock, n):
    with trio.fail_after(_PATIENCE_S):
        replies = await read_replies(sock, n)
    assert all(isinstance(r, bytes) and b"-" in r for r in replies), replies
    return replies


async def _until(condition):
    """Wait (on the real clock: the round's thread is real) until ``condition()``."""
    with trio.fail_after(_PATIENCE_S):
        while not condition():
            await trio.sleep(0.001)


async def _durable(h, key=b"s"):
    """Until what ``key``'s log holds is durable (the loop has ended the
    round that synced it: its writers' replies are out and their batches
    released), then until every task is parked. A connection whose
    replies the round's thread sent is then the reactor's: its client's
    next batch of XADDs is taken without its task."""
    log = h.state.topics.get(key).log
    await _until(lambda: log.recovery_point == log.log_end_offset)
    await wait_all_tasks_blocked()


async def _batch_answered(h, sock, n, start=0):
    await sock.send(_batch(n, start))
    ids = await _ids(sock, n)
    await _durable(h)
    return ids


@pytest.mark.parametrize("timeout_s", [0, 30])
async def test_a_held_connections_next_batches_are_taken_without_its_task(tmp_path, timeout_s):
    h = _always(tmp_path, timeout=timeout_s)
    async with _serving(h) as (served, sock, conn):
        ids = await _batch_answered(h, sock, 16)
        steps = served.steps.count
        rounds = h.state.durability.fsync_count
        for i in range(1, 6):
            ids += await _batch_answered(h, sock, 16, start=16 * i)
        # Five batches appended, made durable and answered, the task never ran.
        assert served.steps.count == steps
        assert h.state.durability.fsync_count > rounds
        assert ids == sorted(ids, key=lambda i: tuple(map(int, i.split(b"-")))) and len(set(ids)) == 96
        reader = hiredis.Reader()
        reader.feed(await _general_reply(h, encode_command([b"XRANGE", b"s", b"-", b"+"])))
        entries = reader.gets()
        assert [e[0] for e in entries] == ids and [e[1] for e in entries] == [[b"f", b"v%d" % i] for i in range(96)]
        stats = h.state.stats
        assert stats.commands["xadd"][0] == 96  # counted as the task counts them
        # A request of another kind goes to the task, which answers it.
        await sock.send(encode_command([b"PING"]))
        assert await read_exactly(sock, 7) == b"+PONG\r\n"
        assert served.steps.count > steps


async def test_input_after_runs_taken_goes_to_the_task_after_their_replies(tmp_path):
    h = _always(tmp_path)
    async with _serving(h) as (served, sock, conn):
        await _batch_answered(h, sock, 2)
        # Three XADDs the reactor takes, then what it does not: the replies
        # stay in order and XLEN sees the three.
        await sock.send(_batch(3, start=2) + encode_command([b"XLEN", b"s"]) + encode_command([b"PING"]))
        with trio.fail_after(_PATIENCE_S):
            replies = await read_replies(sock, 5)
        assert all(b"-" in r for r in replies[:3]) and replies[3:] == [5, b"PONG"]
        await _durable(h)
        # And back to the reactor for the next pure batch.
        steps = served.steps.count
        await _batch_answered(h, sock, 4, start=5)
        assert served.steps.count == steps
        assert h.state.topics.get(b"s").log.log_end_offset == 9


async def test_a_failed_commit_of_taken_runs_answers_the_error(tmp_path):
    h = _always(tmp_path)
    async with _serving(h) as (served, sock, conn):
        await _batch_answered(h, sock, 1)
        stream = h.state.topics.get(b"s")
        real_append = stream.log.append

        # Twice: handed over with a sequence already durable (the usual
        # case), then with none at all (``_hand_taken`` sends them at
        # once), as on a server whose first commit fails.
        for forget_seq in (False, True):
            stream.log.append = full_disk_append
            if forget_seq:
                h.state.broker.appends.flush_seq = 0
            steps = served.steps.count
            await sock.send(_batch(3, start=1))
            with trio.fail_after(_PATIENCE_S):
                replies = await read_replies(sock, 3)
            for reply in replies:
                assert isinstance(reply, Exception) and str(reply).startswith("MISCONF Errors writing"), replies
            await wait_all_tasks_blocked()
            if forget_seq:  # nothing to wait for: sent in the reactor's step, the task parked
                assert served.steps.count == steps
            else:  # released by the loop, not sent from the round's thread: the task goes on
                assert served.steps.count > steps
            # Back to the reactor after the next good batch.
            stream.log.append = real_append
            await _batch_answered(h, sock, 1, start=4)
        await sock.send(encode_command([b"XLEN", b"s"]))
        with trio.fail_after(_PATIENCE_S):
            assert await read_replies(sock, 1) == [3]  # nothing of the failed runs


# -- a parked client's XADDs: committed and answered at the end of the step ----
# (Run in the reactor's step, their appends deferred: every connection's of
# the step are committed together once the step's handlers have run, and
# their replies sent or held from there; the task stays parked.)

async def test_a_parked_clients_xadds_are_answered_in_order_while_the_task_stays_parked(tmp_path):
    h = TopicsHarness(tmp_path)
    async with _serving(h) as (served, sock, conn):
        await _park(sock)
        steps = served.steps.count
        for i in range(5):  # lone XADDs, as an unpipelined client sends them
            await sock.send(_batch(1, start=i))
            await _ids(sock, 1)
            assert h.state.topics.get(b"s").log.log_end_offset == i + 1  # written before the reply
            await wait_all_tasks_blocked()
        # A read of the same client after its XADD, in the same batch, and
        # one sent before the XADD's reply came.
        await sock.send(_batch(1, start=5) + encode_command([b"XLEN", b"s"]))
        with trio.fail_after(_PATIENCE_S):
            entry_id, length = await read_replies(sock, 2)
        assert b"-" in entry_id and length == 6
        await sock.send(_batch(1, start=6))
        await sock.send(encode_command([b"XRANGE", b"s", b"-", b"+", b"COUNT", b"100"]))
        with trio.fail_after(_PATIENCE_S):
            entry_id, entries = await read_replies(sock, 2)
        assert entries[-1] == [entry_id, [b"f", b"v6"]] and len(entries) == 7
        await wait_all_tasks_blocked()
        assert served.steps.count == steps  # the task never ran for them


async def test_fsync_always_a_parked_clients_xadd_is_answered_after_its_round(tmp_path):
    with RoundGate() as gate:
        h = TopicsHarness(tmp_path, fsync="always", rounds=gate)
        async with _serving(h) as (served, sock, conn):
            await _park(sock)
            steps, sends = served.steps.count, len(h.sends)
            await sock.send(_batch(1))
            await _until(lambda: h.state.topics.get(b"s") is not None)
            await wait_all_tasks_blocked()
            # Committed at the end of the step, its reply held for the
            # round, which waits for the gate: nothing sent, the task parked.
            assert h.state.topics.get(b"s").log.log_end_offset == 1
            assert len(h.sends) == sends and served.steps.count == steps
            gate.open()
            await _ids(sock, 1)
            assert h.state.topics.get(b"s").log.recovery_point == 1


async def test_a_failed_commit_of_a_parked_clients_xadd_answers_the_error(tmp_path):
    h = TopicsHarness(tmp_path)
    async with _serving(h) as (served, sock, conn):
        await _park(sock)
        await sock.send(_batch(1))
        await _ids(sock, 1)
        stream = h.state.topics.get(b"s")
        real_append = stream.log.append

        stream.log.append = full_disk_append
        await wait_all_tasks_blocked()
        steps = served.steps.count
        await sock.send(_batch(1, start=1))
        with trio.fail_after(_PATIENCE_S):
            [reply] = await read_replies(sock, 1)
        assert isinstance(reply, Exception) and str(reply).startswith("MISCONF Errors writing"), reply
        await wait_all_tasks_blocked()
        assert served.steps.count == steps  # answered in the reactor's step
        stream.log.append = real_append
        await sock.send(_batch(1, start=2) + encode_command([b"XLEN", b"s"]))
        with trio.fail_after(_PATIENCE_S):
            assert (await read_replies(sock, 2))[1] == 2  # nothing of the failed one


async def test_a_parked_client_that_leaves_right_after_its_xadd_has_it_written(tmp_path):
    h = TopicsHarness(tmp_path)
    async with _serving(h) as (served, sock, conn):
        await _park(sock)
        served.leave_with(_batch(1))  # its EOF in the same arrival
        replies = hiredis.Reader()
        replies.feed(await _closed(sock))
        assert b"-" in replies.gets() and replies.gets() is False
        await _until(lambda: _gone(h, served, conn))
        sock, conn = h.connect(served.nursery)
        await _park(sock)
        await sock.send(_batch(1, start=1))
        sock.close()  # gone without reading the reply
        await _until(lambda: _gone(h, served, conn))
        assert h.state.topics.get(b"s").log.log_end_offset == 2


async def test_a_client_that_leaves_or_is_killed_while_taken_is_closed(tmp_path):
    h = _always(tmp_path)
    async with _serving(h) as (served, sock, conn):
        await _batch_answered(h, sock, 16)
        sock.close()
        await _until(lambda: served.reactor.registered == 0 and not h.state.clients)
        sock, conn = h.connect(served.nursery)
        await _batch_answered(h, sock, 16)
        conn.kill()  # CLIENT KILL
        assert await _closed(sock) == b""


async def test_a_fault_while_handing_taken_runs_over_closes_the_connection(tmp_path, caplog):
    h = _always(tmp_path)
    async with _serving(h) as (served, sock, conn):
        await _batch_answered(h, sock, 2)

        def broken(seq, callback, send=None):
            raise RuntimeError("boom")

        h.state.durability.when_durable = broken  # (the fault: the hand-over to the round fails)
        with caplog.at_level(logging.ERROR, logger="partita.connection"):
            await sock.send(_batch(2, start=2))
            assert await _closed(sock) == b""  # closed, not left waiting
        assert "connection %d failed" % conn.client.id in caplog.text
        await _until(lambda: served.reactor.registered == 0)


# -- a client that leaves: its EOF in the same arrival as its last bytes --------
# (One report of the set for both; the receive of the bytes stops short of the
# EOF. In every state the connection must still see it and close.)

@pytest.mark.parametrize("state", ["mid-command", "after-a-poll", "held"])
async def test_a_client_that_leaves_while_parked_gets_its_replies_and_is_closed(tmp_path, test_commands, state):
    """Parked for input with half a command; parked after a poll answered in
    the reactor's step; waiting for a held batch's round (fsync always, the
    replies sent by the loop, not the round's thread)."""
    if state == "after-a-poll":
        h = TopicsHarness(tmp_path, commands=test_commands.commands)
        _fill(h)
        last, expected = _poll(), await _general_reply(h, _poll())
    elif state == "held":
        h = Harness(commands=test_commands.commands, fsync="always")
        last, expected = b"TEST-WRITE a\r\n*2\r\n$4\r\nECHO\r\n", b"$3\r\nw:a\r\n"
    else:
        h = Harness(commands=test_commands.commands)
        last, expected = b"*2\r\n$4\r\nECHO\r\n", b""
    async with _serving(h) as (served, sock, conn):
        await _park(sock)
        served.leave_with(last)
        assert await _closed(sock) == expected
        await _until(lambda: _gone(h, served, conn))


async def test_a_client_that_leaves_while_taken_gets_its_replies_and_is_closed(tmp_path):
    h = _always(tmp_path)
    async with _serving(h) as (served, sock, conn):
        await _batch_answered(h, sock, 2)
        served.leave_with(_batch(3, start=2))
        replies = hiredis.Reader()
        replies.feed(await _closed(sock))
        assert [replies.gets() for _ in range(4)][3] is False and h.state.topics.get(b"s").log.log_end_offset == 5
        await _until(lambda: _gone(h, served, conn))


@pytest.mark.parametrize("then", [b"", b"PING\r\n"], ids=["eof", "bytes-then-eof"])
async def test_a_blocked_client_that_leaves_is_freed(tmp_path, then):
    """Bytes sent while blocked wait behind the blocking command, unread;
    the EOF after them still frees the client, as Redis frees it."""
    h = TopicsHarness(tmp_path)
    _fill(h)
    async with _serving(h) as (served, sock, conn):
        await sock.send(encode_command([b"XREAD", b"BLOCK", b"0", b"STREAMS", b"s", b"$"]))
        await _until(lambda: h.state.blocked_clients == 1)
        await wait_all_tasks_blocked()
        if then:
            await sock.send(then)
            await wait_all_tasks_blocked()
        served.leave_with(b"")
        assert await _closed(sock) == b""
        await _until(lambda: _gone(h, served, conn) and h.state.blocked_clients == 0)


async def test_a_blocking_command_answered_at_once_is_answered_after_the_eof(tmp_path):
    h = TopicsHarness(tmp_path)
    _fill(h)
    async with _serving(h) as (served, sock, conn):
        await _park(sock)
        request = encode_command([b"XREAD", b"BLOCK", b"0", b"STREAMS", b"s", b"29-0"])
        served.leave_with(request)
        assert await _closed(sock) == await _general_reply(h, request)
