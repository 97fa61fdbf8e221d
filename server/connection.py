"""One client connection: the only place that reads and writes a client socket.

Owns: the receive → parse → dispatch → encode → send loop on a raw
non-blocking socket, pipelining (every complete command of one receive runs
in order; their replies leave in one ``send``), holding a batch's replies
until its receipt is settled (its writes durable, ``cluster.broker.durability``, and
replicated for acks=all), sending what is ready before awaiting a blocking
command, protocol errors (reply, then close), closing the client on QUIT /
CLIENT KILL / SHUTDOWN, closing idle clients (``timeout``:
``close_idle_clients``), and the connection's state.

Must not know: what any command means (``server.dispatch``), RESP reply
encoding rules (``server.reply``), request framing (``server.resp``), TLS
(``server.tls``).

State: one ``State`` value (docs/architecture.md "The connection's
states"), changed only by the transitions below, each of which says which
states it leaves: the task's own (a batch begins, blocks, is held, is
answered), the reactor's (``_on_ready``: a batch run while the task is
parked, with the task's own executor ``_run_batch``, its replies sent or
held there or at the end of the step, and what it could not finish handed
to the task; a batch of XADD runs taken while it waits for a held one;
input handed to it), a held batch's (``_Held`` calls ``_held_out`` once its
replies are out), and a close's (``kill``, ``stop``). CLOSING absorbs every
transition but the last (CLOSED, in ``run``), so whoever acts on a
connection that is closing does nothing. What arrives is classified by one
pure function (``classify``): the peer's EOF, the rest of a command,
a lone poll, runs of XADDs, commands; each state has its answer to each
kind, EOF included.

Transports: the loop reaches its socket only through ``_transport`` (wait
for input, take it, try a non-blocking send), ``_send_rest`` (what that send
did not take), ``_wait_peer_closed`` (disconnect watch during a BLOCK) and
``_open`` / ``_close_transport``. ``server.tls.TlsConnection`` overrides
those and nothing else, so both ports share one set of command semantics
(deferred XADD batching, output limits, freeing a blocked client that
leaves). The plain methods hand the loop bound socket methods as locals, so
the hot path pays nothing for the indirection.

Why raw sockets: trio's ``SocketStream`` costs about 1.6x more per request
than a non-blocking stdlib socket with ``trio.lowlevel.wait_readable`` before
``recv`` (shared/DESIGN.md "Performance notes"); for unpipelined clients this
loop is the hot path.
"""

from __future__ import annotations

import enum
import logging
import socket
from functools import partial
from time import time as _now
from typing import Any

import trio
from trio.lowlevel import (Abort, cancel_shielded_checkpoint, checkpoint, current_task, reschedule,
                           wait_readable, wait_task_rescheduled, wait_writable)

from server import outbuf
from server.dispatch import COROUTINE, NO_REPLY, Context, Dispatcher
from cluster.broker.durability import DurabilityError
from server.reactor import SHUT
from cluster.runtime.replication import AcksFailed
from server.errors import ProtocolError
from server.reply import encode, encode_into
from server.resp import QueryBufferLimitError, RequestParser

try:  # replies holding log mappings spliced into the socket, not copied (server/_mapsend.c)
    from server import _mapsend
except ImportError:  # pragma: no cover - built by the install; without it sendmsg copies them
    _mapsend = None

log = logging.getLogger("partita.connection")

RECV_BYTES = 64 * 1024
_JOIN = b"".join
# Replies accumulated past this are sent before executing more of the batch,
# so a large pipeline of large replies does not pile up in memory.
SEND_AT_BYTES = 1024 * 1024
SIZE_CHECK_CHUNKS = 4096
# At most this many chunks go to one gathering send (the kernel takes 1024
# buffers per sendmsg); a longer batch is joined.
_GATHER_MAX = 512
_PEER_GONE = object()  # what _await_watching_peer returns when the client left
# After a reply leaves, the next request is tried once after one scheduler
# pass, before registering for readiness (bench/RESULTS.md: 50 unpipelined
# clients find it there ~94% of the time, and skip trio's epoll_ctl and
# wake-up). Each miss doubles the replies that skip the try, up to 2**6 - 1:
# a client slower than the loop (large XREAD replies) costs almost nothing.
_SPECULATE_MAX_MISSES = 6


# -- the connection's states ---------------------------------------------------

class State(enum.Enum):
    """Where a connection is; the table in docs/architecture.md."""

    IDLE = "idle"  # nothing in flight; the task looks for input or is parked for it
    RUNNING = "running"  # the task runs a batch: parse, dispatch, send its replies
    BLOCKED = "blocked"  # the task awaits a blocking command; earlier replies are out
    HELD = "held"  # the batch's replies wait for its receipt (or the socket); the task waits for them
    OWNED = "owned"  # the last replies left from the round's thread: the reactor takes the next XADD runs
    MONITOR = "monitor"  # MONITOR: the task sends every client's command lines and runs its own commands
    CLOSING = "closing"  # nothing more is taken; closes once what is in flight is out
    CLOSED = "closed"

    __hash__ = object.__hash__  # (Enum's hashes the name in Python: members are singletons)


IDLE, RUNNING, BLOCKED, HELD, OWNED, MONITOR, CLOSING, CLOSED = State

# What each state may become (``Connection._to`` asserts it). CLOSING is
# reachable from all of them; from CLOSING only ``run`` moves on, to CLOSED.
_NEXT = {
    IDLE: frozenset({RUNNING, OWNED, CLOSING}),
    RUNNING: frozenset({IDLE, BLOCKED, HELD, MONITOR, CLOSING}),
    BLOCKED: frozenset({RUNNING, CLOSING}),
    HELD: frozenset({IDLE, OWNED, CLOSING}),
    OWNED: frozenset({IDLE, HELD, RUNNING, CLOSING}),
    MONITOR: frozenset({RUNNING, CLOSING}),
    CLOSING: frozenset({CLOSED}),
    CLOSED: frozenset(),
}


# -- what a receive is (sans-IO) ------------------------------------------------

class Receive(enum.Enum):
    """What ``classify`` makes of the bytes one receive returned."""

    EOF = "eof"  # b"": the peer closed or shut its side (or the socket failed)
    PARTIAL = "partial"  # the rest of a command begun in an earlier receive: the parser's
    POLL = "poll"  # may be one consumer's poll, XREAD COUNT n STREAMS key id: Dispatcher.read_poll decides
    RUNS = "runs"  # RESP at a command boundary: runs of XADD key * ... are taken first (Dispatcher.xadd_run)
    COMMANDS = "commands"  # commands at a command boundary for the parser: inline ones (or a declined poll)

    __hash__ = object.__hash__


EOF, PARTIAL, POLL, RUNS, COMMANDS = Receive


def classify(data: bytes, at_boundary: bool) -> Receive:
    """What a receive of ``data`` is, given whether the parser was at a
    command boundary (``RequestParser.at_boundary``): no I/O, no state.
    POLL and RUNS name the fast path to offer the bytes to first; the path
    decides, and whatever it leaves goes to the parser, which gives every
    error. A poll is a whole receive of one six-element array (XREAD
    COUNT n STREAMS key id; an XADD run never has an even count)."""
    if not data:
        return EOF
    if not at_boundary:
        return PARTIAL
    if data[0] != 42:  # not '*'
        return COMMANDS
    if data[1:2] == b"6":
        return POLL
    return RUNS


# -- what running a batch came to --------------------------------------------

class Ran(enum.Enum):
    """What ``Connection._run_batch`` (the one executor of a batch, the
    task's and the reactor's step's) came to. Every outcome but DONE is
    the task's to go on from: the executor never waits."""

    DONE = "done"  # every complete command ran: answer the batch (its receipt, one send)
    AWAITS = "awaits"  # a command returned a coroutine: the replies before it leave, it is awaited, the batch goes on
    FLUSH = "flush"  # the replies passed SEND_AT_BYTES: they leave, the batch goes on
    STOPPED = "stopped"  # a command left RUNNING (MONITOR, closing) or asked to close after its reply (QUIT)
    FAULT = "fault"  # a protocol error: its reply after the replies so far, then close

    __hash__ = object.__hash__


DONE, AWAITS, FLUSH, STOPPED, FAULT = Ran


# The input mark of a plain socket in the reactor's set: whether input may be
# waiting. The set reports arrivals (edge-triggered), so a connection keeps
# this, set by ``_on_ready`` and cleared by a receive that drained the socket;
# once the set said the peer shut its side, the EOF is still to be received
# after any bytes, and the mark is never cleared again (server/reactor.py).
_DRAINED, _READY, _SHUT = 0, 1, 2


def _may_wait(argv: list[bytes]) -> bool:
    """Whether a blocking-flagged command was given a BLOCK option (before
    STREAMS): only then is it worth watching the socket while it runs."""
    for arg in argv[1:]:
        n = len(arg)
        if n == 5 and arg.upper() == b"BLOCK":
            return True
        if n == 7 and arg.upper() == b"STREAMS":
            return False
    return False


class Connection:
    """Serves one accepted socket until the client leaves or is closed."""

    def __init__(self, server: Any, dispatcher: Dispatcher, sock: socket.socket, client: Any) -> None:
        self.server = server
        self.dispatcher = dispatcher
        self.sock = sock
        self.client = client
        self.ctx = Context(server, client, dispatcher)
        self.ctx.session.may_defer = True  # XADDs of one tick share a log batch (cluster.broker.appends)
        self.cancel_scope = trio.CancelScope()
        self.state = IDLE
        self.parser: RequestParser | None = None
        # The last batch whose replies were handed over (``_hold``): in
        # flight in HELD and OWNED (OWNED: or out, or None), out in IDLE
        # until the task goes on.
        self.held: _Held | None = None
        # Plain sockets in the server's epoll set (server.reactor): the set,
        # the input mark (``_DRAINED``...), the task parked for input (IDLE;
        # still so in HELD and OWNED when the reactor's step held the batch)
        # or for its held batch (HELD, OWNED), the watch for the peer's EOF
        # during a BLOCK, and the replies of XADD runs taken in the
        # reactor's current step (OWNED), or of a batch run there (RUNNING),
        # until the step's end (``_hand_taken``).
        self._reactor: Any = None
        self._fd = -1
        self._mark = _READY
        self._parked = _Waiter()
        self._gone = _Waiter()
        self._taken: list | None = None
        # The fast paths of the port's table, set by ``_serve`` (None: not served).
        self._poll: Any = None  # a consumer's poll (Dispatcher.read_poll)
        self._gather: Any = None  # the gathering send (``_gathering_send``), set by ``_serve``
        self._xadd_run: Any = None  # runs of XADDs (Dispatcher.xadd_run)
        self._lines = _Waiter()  # MONITOR: the task waiting for lines (or input)
        client._kill = self.kill
        client._on_monitor = self._begin_monitor

    # -- transitions ------------------------------------------------------------

    def _to(self, new: State) -> bool:
        """Move to ``new`` (a legal successor, asserted); False, staying, if
        the connection is closing already."""
        old = self.state
        if old is CLOSING or old is CLOSED:
            return False
        assert new in _NEXT[old], f"connection {self.client.id}: {old.name} -> {new.name}"
        self.state = new
        return True

    def kill(self) -> None:
        """CLIENT KILL: close at the next wait, even one for a slow reader."""
        self._to(CLOSING)
        self.cancel_scope.cancel()

    def stop(self) -> None:
        """Shutdown: close now if nothing is in flight, else once the batch
        in flight is answered (its replies out: ``_held_out``)."""
        state = self.state
        if self._quiet() or state is BLOCKED or state is MONITOR:
            self.kill()
        else:
            self._to(CLOSING)

    def _quiet(self) -> bool:
        """Nothing in flight and nothing awaited: IDLE, or OWNED with its
        held batch out (the task waits for input either way)."""
        state = self.state
        if state is IDLE:
            return True
        held = self.held
        return state is OWNED and (held is None or held.phase is _OUT)

    def close_if_idle(self, now_s: float, timeout_s: float) -> bool:
        """``close_idle_clients``: close this client if it waits for input
        (``_quiet``) and has been idle for more than ``timeout_s`` at
        ``now_s`` (wall clock, as ``Client.last_interaction``). A client
        that waits for something else is not idle, as in Redis: a BLOCK,
        MONITOR, a batch in flight (its receipt, a slow reader). A cluster
        peer's bus connection is not a client (``Client.peer``)."""
        client = self.client
        if client.peer or not self._quiet() or now_s - client.last_interaction <= timeout_s:
            return False
        log.info("closing idle client %d (timeout %ds)", client.id, timeout_s)
        self.kill()
        return True

    def _held_out(self, held: "_Held") -> None:
        """``held``'s replies are out (``_Held``). HELD / OWNED → OWNED if
        its task is parked and the reactor may take the next batch
        (``_may_own``), else → IDLE, waking the task. Closing: close now."""
        state = self.state
        if state is CLOSING:
            self.cancel_scope.cancel()  # its last replies are out
            return
        if state is CLOSED:
            return
        assert self.held is held and (state is HELD or state is OWNED), state
        if self._parked.task is not None and self._may_own(held):
            self.state = OWNED
            return
        self.state = IDLE
        self._parked.wake()

    def _may_own(self, held: "_Held") -> bool:
        """Whether the reactor may take this connection's next batch while
        its task stays parked (OWNED): the replies of ``held`` left from the
        round's thread (so the client may answer any moment), the client
        has sent nothing since, and the socket is in the reactor's set."""
        return held.early and self._mark == _DRAINED and self._reactor is not None

    def _hand_over(self, data: bytes | None, kind: Receive | None = None, out: list | None = None,
                   rest: Any = None) -> None:
        """IDLE / OWNED → RUNNING, from the reactor's step (``_on_ready``
        calls it in those states only): the parked task goes on with
        ``data`` (bytes received and not run, ``classify``'d as ``kind``,
        after the replies ``out`` of runs taken from before them) or sends
        ``rest`` (replies the reactor's step could not send whole)."""
        assert self._parked.task is not None and (self.state is IDLE or self.state is OWNED), self.state
        self.state = RUNNING
        self._parked.wake((data, kind, out, rest, None))

    def _hand_rest(self, ran: tuple) -> None:
        """From ``_serve_parked``: the batch it ran (``ran``: what
        ``_run_batch`` came to) is the parked task's to go on from, in the
        state the batch left (RUNNING; MONITOR; closing: a killed task was
        cancelled and does not take it). The task runs later: views of log
        mappings in the replies are copied now."""
        _own(ran[2], self.ctx)
        self._parked.wake((None, None, None, None, ran))

    def _close_parked(self) -> None:
        """The reactor's step found the peer's EOF, or failed: → CLOSING; the
        parked task wakes and closes (nothing is in flight)."""
        self._to(CLOSING)
        self._parked.wake()

    async def run(self) -> None:
        server = self.server
        try:
            with self.cancel_scope:
                if await self._open():
                    await self._serve()
        except _CloseNow:
            pass
        except Exception:  # a bug in one connection must not stop the server
            log.exception("connection %d failed", self.client.id)
        finally:
            self._to(CLOSING)
            # Entries deferred by a batch cut short are written (their
            # replies are lost, as for a client that disconnects).
            self.ctx.session.commit_deferred()
            self.ctx.deferred_marks.clear()
            held = self.held
            if held is not None and held.phase is _WAITING:
                # The socket closes below and its number is free for the
                # next client: no round may send these replies on it.
                server.durability.withdraw_send(held.handle)
            server.remove_client(self.client)
            await self._close_transport()
            self.state = CLOSED

    # -- transport: the plain socket (server.tls.TlsConnection overrides) --

    async def _open(self) -> bool:
        """Whatever must happen before the first request; False closes."""
        reactor = getattr(self.server, "reactor", None)
        fd = self.sock.fileno()
        if reactor is not None and reactor.register(fd, self._on_ready):
            self._reactor, self._fd = reactor, fd
        return True

    async def _close_transport(self) -> None:
        """Close the client's socket (runs in ``run``'s ``finally``, cancelled or not)."""
        if self._reactor is not None:
            self._reactor.unregister(self._fd)
            self._reactor = None
        try:
            # A task still sending held replies (``_Held``) is woken, not stranded.
            trio.lowlevel.notify_closing(self.sock)
            self.sock.close()
        except OSError:
            pass

    def _transport(self) -> tuple[Any, Any, Any]:
        """``(wait, recv, send)`` for the loop's locals: ``await wait(sock)``
        until input (or EOF) is there, returning what the reactor's step
        handed over (``_hand_over``) or None; ``recv(n)`` takes it (b"" at
        EOF, BlockingIOError if there was none after all), ``send(data)``
        sends what it can without waiting and returns the byte count."""
        sock = self.sock
        return (wait_readable if self._reactor is None else self._wait_input), sock.recv, sock.send

    def _gathering_send(self) -> Any:
        """``sendmsg``-like ``send(buffers)`` without waiting, or None (TLS):
        a reply holding views of log mappings is spliced into the socket
        without copying them (``server._mapsend``) when it can be."""
        return _splicing_send(self.sock)

    async def _send_rest(self, data: bytes | memoryview) -> None:
        """Send bytes ``send`` did not take, under the output buffer limits."""
        await outbuf.send_all(self, data)  # limits hook: client-output-buffer-limit (server/outbuf.py)

    async def _wait_peer_closed(self) -> bool:
        """True once the peer has closed (or shut its side: Redis frees a
        blocked client then too). Bytes it sends meanwhile stay unread in
        the socket, queued behind the blocked command as Redis queues them.
        In the server's epoll set the set's report of the EOF says so
        (``_on_ready``), past any such bytes; otherwise a look at the
        socket returns False (at once) when bytes come instead, and the EOF
        is noticed when they are read."""
        if self._reactor is not None:
            while self._mark != _SHUT:
                await self._gone.wait()
            return True
        sock = self.sock
        while True:
            await wait_readable(sock)
            try:
                data = sock.recv(1, socket.MSG_PEEK)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                return True
            return not data

    # -- the reactor's side (plain sockets in the server's epoll set) -----------

    async def _wait_input(self, _sock: Any = None) -> Any:
        """IDLE: the plain loop's wait for input when the socket is in the
        server's epoll set: none if it may have input already (one
        scheduler pass first, so a busy client does not starve the others),
        else park until ``_on_ready`` wakes the task. Returns what the
        reactor's step handed over (``_hand_over``), or None."""
        if self._mark != _DRAINED:
            await checkpoint()
            return None
        return await self._parked.wait()

    def _on_ready(self, events: int) -> None:
        """The reactor's report of new input (or EOF: ``events & SHUT``).
        Parked IDLE: the batch is run here, without the task
        (``_serve_parked``); OWNED: the next batch of XADD runs is taken
        here (``_take_runs``); anything else is the task's, which receives
        it when it gets there. From an EOF on, the input mark stays set
        (``_SHUT``): the next receive finds the EOF, in whatever state;
        a BLOCK watching for it ends (``_wait_peer_closed``)."""
        try:
            state = self.state
            if state is OWNED:
                held = self.held
                if held is not None and held.phase is _WAITING:
                    # Its client answered, so it has the replies the round's
                    # thread sent; the loop has not ended that round yet: end
                    # it now, before the input is marked, so that its release
                    # finds the client quiet and leaves the reactor the
                    # connection (``_held_out``).
                    self.server.durability.poll()
                    state = self.state
            if events & SHUT:
                self._mark = _SHUT
                self._gone.wake()
            elif self._mark == _DRAINED:
                self._mark = _READY
            if state is IDLE:
                if self._parked.task is not None:  # (else the task is running: it receives)
                    self._serve_parked()
            elif state is OWNED:
                self._take_runs()
            elif state is MONITOR:
                self._parked.wake()  # (the task waits for input or lines: _wait_monitor)
            # RUNNING, BLOCKED, HELD: the task receives when it gets there;
            # closing: nothing more is taken.
        except Exception:  # a bug here must not strand the client: close it
            log.exception("connection %d failed", self.client.id)
            self._close_parked()

    def _receive(self, wanted: Receive) -> bytes | None:
        """The receive of the reactor's steps, each of which takes one kind
        of input (``wanted``): the bytes if ``classify`` says they are of
        that kind. Otherwise None: there were none after all (the task
        stays parked), or they went to the task (``_hand_over``), or they
        were the peer's EOF or a failed receive (``_close_parked``)."""
        data = self._recv_now(self.sock.recv)
        if data is None:
            return None
        kind = classify(data, self.parser.at_boundary())
        if kind is wanted:
            return data
        if kind is EOF:
            self._close_parked()
        else:
            self._hand_over(data, kind)
        return None

    def _serve_parked(self) -> None:
        """IDLE, the task parked: the task's step for what came, taken in the
        reactor's step: receive, run the batch with the task's executor
        (``_run_batch``), send its replies; the task stays parked. Replies
        that wait for a commit or a receipt (deferred appends, fsync
        always, acks=all) are answered at the end of the step, with every
        other connection's of that step (``_take_at_step_end``). Whatever
        cannot end here is handed to the task, RUNNING (``_hand_rest``): a
        batch the executor stopped (a command to await, replies to send
        before the rest, MONITOR, a close, a protocol error), a reply the
        socket did not take whole. The EOF and errors close it."""
        data = self._recv_now(self.sock.recv)
        if data is None:
            return
        if not data:
            self._close_parked()
            return
        self.state = RUNNING  # (IDLE → RUNNING: _on_ready found it IDLE)
        ctx = self.ctx
        ran = self._run_batch(data, None, [])
        if ran[0] is not DONE:
            self._hand_rest(ran)
            return
        session = ctx.session
        if ctx.deferred_marks or session.flush_seq or session.repl_pending:
            self._take_at_step_end(ran[2])
            return
        self._send_parked(ran[2])

    def _send_parked(self, out: list) -> None:
        """RUNNING / OWNED → IDLE, from the reactor's step, the task parked:
        send ``out`` (replies that wait for nothing); what the socket did
        not take whole goes to the task (``_hand_over``), and so does input
        left behind. A failed send closes."""
        self.state = IDLE
        if out:
            try:
                rest = _send_now(self._gather, self.sock.send, out, self.ctx, self.server.stats)
            except OSError:
                self._close_parked()
                return
            if rest is not None:
                self._hand_over(None, rest=rest)
                return
        if self._mark != _DRAINED:
            # A receive that filled its buffer left input behind, or the EOF
            # came with the batch: no new report will come, the task goes on.
            self._parked.wake()

    def _take_runs(self) -> None:
        """OWNED: its task waits for a held batch whose replies are out, and
        the next batch is taken here if it is runs of ``XADD key * field
        value ...`` (``Dispatcher.xadd_run``): appended (deferred, as by the
        task) and answered at the end of the reactor's step
        (``_take_at_step_end``), the task staying parked. Anything else goes
        to the task: input (after the replies of the runs taken before it),
        the EOF (closes), a held batch not out yet (→ HELD: the task waits
        for it and reads then)."""
        held = self.held
        if held is not None and held.phase is not _OUT:
            self._to(HELD)  # its release finds input waiting and wakes the task
            return
        data = self._receive(RUNS)
        if data is None:
            return
        out: list = []
        pos = _take_xadd_runs(self.dispatcher.xadd_run, self.ctx, data, out)
        if pos:
            self.server.stats.total_net_input_bytes += pos
            self.client.last_interaction = _now()
        if pos < len(data):
            # (None taken: the parser's. Else the task classifies the rest.)
            self._hand_over(data[pos:] if pos else data, None if pos else COMMANDS, out)
            return
        self._take_at_step_end(out)

    def _take_at_step_end(self, out: list) -> None:
        """RUNNING (``_serve_parked``) or OWNED (``_take_runs``), the task
        parked: the batch's replies ``out`` wait for its deferred appends'
        commit or a receipt; they are answered at the end of the reactor's
        step (``_hand_taken``), once every connection of the step has
        appended. Views of log mappings in them are copied now."""
        _own(out, self.ctx)
        self._taken = out
        self._reactor.after_step(self._hand_taken)

    def _hand_taken(self) -> None:
        """The end of the reactor's step after ``_take_at_step_end``: commit
        (the first connection of the step commits every one's entries, one
        log batch per stream; ``_settle``), then hand the replies over as
        the task's ``_hold`` does (RUNNING → HELD; OWNED stays) if they wait
        for a receipt, else send them now (→ IDLE: ``_send_parked``); the
        task stays parked either way. Closing meanwhile (killed by a
        connection of the same step, CLIENT KILL: a SHUTDOWN stops the
        connections after the step): the task closes, committing the
        entries (``run``, if no connection after it in the step did); their
        replies are lost with the client."""
        out, self._taken = self._taken, None
        state = self.state
        if out is None:
            return
        if state is not RUNNING and state is not OWNED:
            self.cancel_scope.cancel()  # (a parked task never sees CLOSING otherwise)
            return
        try:
            receipt = self._settle(out)
            if receipt is not None:
                self._hold(out, self.sock.send, receipt)
                return
        except Exception:  # a bug here must not leave the client waiting: close it
            log.exception("connection %d failed", self.client.id)
            self.kill()
            return
        self._send_parked(out)

    # -- the batch: one executor for the task and the reactor's step --------

    def _run_batch(self, data: bytes | None, kind: Receive | None, out: list,
                   pending: tuple | None = None) -> tuple:
        """RUNNING: run what was received: ``data`` (``classify``'d as
        ``kind``, None: not yet; None: nothing new), offered to the fast
        paths first (a consumer's poll, runs of XADDs), the rest to the
        parser; then every complete command the parser holds, in order,
        their replies appended to ``out`` and their deferred appends marked
        (``ctx.deferred_marks``). ``pending``: the ``(argv, reply)`` of the
        command the task awaited (AWAITS): its reply first, then the rest.
        It never waits, so the task (``_serve``) and the reactor's step
        (``_serve_parked``) run batches with it alike. Returns ``(outcome,
        arg, out)``: ``Ran.DONE``; AWAITS with ``(argv, coroutine)`` (the
        parser keeps what follows); FLUSH; STOPPED; FAULT with the
        ``ProtocolError`` (nothing after it runs)."""
        ctx = self.ctx
        client = self.client
        parser = self.parser
        if data is not None:
            self.server.stats.total_net_input_bytes += len(data)
            if kind is None:
                kind = classify(data, parser.at_boundary())
            if kind is POLL and self._poll is not None and self._poll(ctx, data, out):
                # A consumer's poll (one XREAD), answered from the bytes (``Dispatcher.read_poll``).
                client.last_interaction = _now()
                return DONE, None, out
            if kind is RUNS and self._xadd_run is not None:
                # Runs of `XADD key * f v ...` are taken from the bytes as
                # they are; the rest is parsed.
                pos = _take_xadd_runs(self._xadd_run, ctx, data, out)
                if pos:
                    data = data[pos:]
            parser.feed(data)
        get_command = parser.get_command
        call = self.dispatcher.call
        session = ctx.session
        marks = ctx.deferred_marks
        check_at = SIZE_CHECK_CHUNKS
        argv, reply = pending if pending is not None else (None, None)
        while True:
            if argv is None:
                try:
                    argv = get_command()
                except ProtocolError as e:
                    return FAULT, e, out
                if argv is None:
                    break
                reply = call(ctx, argv)
                if type(reply) is COROUTINE:
                    return AWAITS, (argv, reply), out
            if reply is not NO_REPLY:
                if session.deferred is not None:  # an XADD whose entry awaits a commit
                    marks.append((len(out), session.deferred, 0))
                    session.deferred = None
                # Read per reply: HELLO may switch protocol mid-batch.
                if encode_into(out, reply, client.protocol):
                    ctx.views = True  # entries as views of log mappings: sent at once or copied
            if client.close_after_reply or self.state is not RUNNING:
                return STOPPED, None, out
            # limits hook (server/outbuf.py): a reply read from a log is few
            # chunks but can be megabytes; weigh such replies as they come.
            if len(out) >= check_at or (reply.__class__ in outbuf.WEIGHED
                                        and outbuf.weigh(self, out) >= SEND_AT_BYTES):
                # Checked every 4096 chunks, not per reply: a long
                # pipeline must not cost quadratic time here.
                if sum(map(len, out)) >= SEND_AT_BYTES:
                    return FLUSH, None, out
                check_at = len(out) + SIZE_CHECK_CHUNKS
            argv = None
        client.last_interaction = _now()
        return DONE, None, out

    # -- the command loop (both transports) --------------------------------

    async def _serve(self) -> None:
        sock = self.sock
        client = self.client
        ctx = self.ctx
        stats = self.server.stats
        config = self.server.config
        parser = self.parser = RequestParser(
            config.proto_max_bulk_len,
            config.client_query_buffer_limit,
            authenticated=lambda: client.authenticated,
        )
        get_command = parser.get_command
        wait, recv, send = self._transport()
        gather = self._gather = self._gathering_send()
        hold_send = send if gather is not None else None  # plain sockets hand held replies over (_hold)
        session = ctx.session
        appends = self.server.broker.appends
        marks = ctx.deferred_marks
        table = self.dispatcher.table
        self._xadd_run = self.dispatcher.xadd_run if "xadd" in table.runs else None
        self._poll = self.dispatcher.read_poll if "xread" in table.polls else None
        # The next request's early try (_SPECULATE_MAX_MISSES), plain sockets only.
        speculate = False
        misses = skips = 0
        while True:
            # -- the next input: where it comes from is the state's ----------
            data = kind = out = ran = None
            state = self.state
            if state is RUNNING:
                # The batch is answered, nothing is in flight (hot path).
                self.state = IDLE
                if speculate:
                    speculate = False
                    await cancel_shielded_checkpoint()  # the other connections' turn first
                    if self.state is not IDLE:
                        return  # closing (stop)
                    try:
                        data = recv(RECV_BYTES)
                        misses = 0
                    except (BlockingIOError, InterruptedError):
                        self._mark = _DRAINED
                        misses = min(misses + 1, _SPECULATE_MAX_MISSES)
                        skips = (1 << misses) - 1
                    except OSError:
                        return
                    else:
                        if len(data) < RECV_BYTES and self._mark != _SHUT:
                            self._mark = _DRAINED
            elif state is not IDLE or self.held is not None:
                # A held batch in flight (HELD, OWNED) or just out (IDLE), or closing.
                got = await self._await_held()
                if got is None:
                    got = self._after_held(recv)
                    if got is None:
                        continue  # owned by the reactor now, or nothing received yet
                data, kind, out, rest, ran = got
                if rest is not None:  # replies the reactor's step left to send
                    await self._send_rest(rest)
                    continue
            if data is None and ran is None:
                # IDLE: wait for input (the reactor may hand it over; an
                # idle timeout closes it: close_idle_clients).
                got = await wait(sock)
                if got is not None:  # RUNNING: what the reactor's step received, ran or left
                    self.held = None  # (one the reactor's step held is out: _hand_over)
                    data, kind, out, rest, ran = got
                    if rest is not None:
                        await self._send_rest(rest)
                        continue
                elif self.held is not None:
                    continue  # a batch the reactor's step held (_hand_taken): as after the task's own
                elif self.state is not IDLE:
                    return  # closing (stop, kill; the EOF or an error in the reactor's step)
                else:
                    try:
                        data = recv(RECV_BYTES)
                    except (BlockingIOError, InterruptedError):
                        self._mark = _DRAINED
                        continue
                    except OSError:
                        return
                    if len(data) < RECV_BYTES and self._mark != _SHUT:
                        self._mark = _DRAINED
            if ran is None:
                if not data:
                    return  # EOF (or a failed receive)
                if self.state is IDLE:
                    self.state = RUNNING
                ran = self._run_batch(data, kind, out if out is not None else [])
            # -- what only the task can do: the batch goes on after it --------
            outcome, arg, out = ran
            while outcome is not DONE:
                if outcome is AWAITS:
                    argv, reply = arg
                    await self._flush(out)  # (the replies before it leave first)
                    reply = await self._block(argv, reply)
                    outcome, arg, out = self._run_batch(None, None, [], (argv, reply))
                elif outcome is FLUSH:
                    await self._flush(out)
                    outcome, arg, out = self._run_batch(None, None, [])
                elif outcome is FAULT:
                    await self._protocol_error(arg, out)
                    return
                elif self.state is MONITOR:  # STOPPED by MONITOR
                    if not await self._monitor(out, get_command, wait, recv):
                        return
                    outcome, arg, out = self._run_batch(None, None, [])  # RESET ended it: the batch goes on
                else:  # STOPPED: close after these replies (QUIT, CLIENT KILL, SHUTDOWN, ...)
                    if not client.kill_requested:  # killed by its own command (POST): nothing is sent
                        await self._flush(out)
                    return
            # -- answer it ------------------------------------------------------
            if marks:
                if appends.streams and marks[-1][1][1] == appends.round:
                    # Let the other connections of this scheduler tick run
                    # their batches first: one log write for all of them.
                    if ctx.views:  # (hot path: no call without views; see _own)
                        _own(out, ctx)
                    await cancel_shielded_checkpoint()
                receipt = self._settle(out)
            elif session.flush_seq or session.repl_pending:
                receipt = session.take_receipt()
            else:
                receipt = None
            if receipt is not None:
                if hold_send is None:
                    await self._flush(out, receipt)
                else:
                    self._hold(out, hold_send, receipt)  # → HELD: the next pass waits for it
            elif out:
                # Hot path: one send of the whole batch, no extra awaits.
                try:
                    rest = _send_now(gather, send, out, ctx, stats)
                except OSError:
                    return
                if skips:
                    skips -= 1
                elif gather is not None:  # a plain socket (TLS reads through its stream)
                    speculate = True
                if rest is not None:
                    await self._send_rest(rest)

    # -- MONITOR ---------------------------------------------------------------

    def _begin_monitor(self) -> None:
        """MONITOR ran (``Client.begin_monitor``): RUNNING → MONITOR; the
        loop sees it after the command and serves the monitor (``_monitor``)."""
        self._to(MONITOR)

    async def _monitor(self, out: list, get_command: Any, wait: Any, recv: Any) -> bool:
        """MONITOR: send the batch's replies so far (MONITOR's ``+OK``
        last), then the lines of every client's commands as they come
        (``server.diagnostics.MonitorFeed``), and run this client's own
        commands (``Dispatcher.call_as_monitor``), each reply among the
        lines where Redis puts it: before its command's own line. True once
        RESET ended it (→ RUNNING: the loop goes on with what the parser
        holds); False to close (QUIT, the peer's EOF, a protocol error)."""
        await self._flush(out)
        client = self.client
        ctx = self.ctx
        feed = client.monitor
        feed.on_line = self._lines.wake
        feed.on_overflow = self._monitor_overflow
        call = self.dispatcher.call_as_monitor
        while True:
            while True:  # its own commands: pipelined after MONITOR, or received since
                try:
                    argv = get_command()
                except ProtocolError as e:  # the lines so far, then the error (as the loop's)
                    await self._send_feed(feed)
                    await self._protocol_error(e, [])
                    return False
                if argv is None:
                    break
                at = len(feed.lines)
                reply = call(ctx, argv)
                if type(reply) is COROUTINE:  # (WAIT: the lines made meanwhile come first)
                    reply = await reply
                    at = len(feed.lines)
                if reply is not NO_REPLY:
                    feed.insert_reply(at, encode(reply, client.protocol))
                if client.close_after_reply:
                    await self._send_feed(feed)
                    return False
                if client.monitor is not feed:  # RESET
                    await self._send_feed(feed)
                    self._to(RUNNING)
                    return True
            if feed.lines:
                await self._send_feed(feed)
                continue
            await self._wait_monitor(feed, wait)
            data = self._recv_now(recv)
            if data is None:
                continue  # lines came, or no input after all
            if not data:
                return False  # EOF
            self.server.stats.total_net_input_bytes += len(data)
            client.last_interaction = _now()
            self.parser.feed(data)

    async def _wait_monitor(self, feed: Any, wait: Any) -> None:
        """MONITOR: until input may be there or lines are, whichever first."""
        async with trio.open_nursery() as nursery:
            async def for_input() -> None:
                await wait(self.sock)
                nursery.cancel_scope.cancel()

            async def for_lines() -> None:
                if not feed.lines:
                    await self._lines.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(for_input)
            nursery.start_soon(for_lines)

    async def _send_feed(self, feed: Any) -> None:
        """Send what the monitor's feed holds, and what comes meanwhile."""
        while feed.lines:
            data = feed.take()
            self.server.stats.total_net_output_bytes += len(data)
            await self._send_rest(data)

    def _monitor_overflow(self) -> None:
        """The monitor's lines waiting to be sent passed the hard output
        buffer limit (a client that does not read them): close it."""
        if self.state is not CLOSING and self.state is not CLOSED:
            outbuf.close_over_limits(self)

    async def _await_held(self) -> tuple | None:
        """HELD, OWNED, CLOSING (IDLE: returns None at once): wait for the
        held batch's replies to be out (``_held_out``), not for input (a
        client sends its next batch once it has them, and what comes first
        waits anyway), and, if the reactor owned the connection meanwhile,
        until it hands it back. Returns what it handed over (RUNNING), or
        None (IDLE: the task goes on from the socket). Closing: returns
        never (``_held_out`` cancels once the replies are out), or raises
        _CloseNow with nothing in flight."""
        held = self.held
        if held is not None and held.phase is _WAITING:
            # Its round may be over already: end it now, not at the loop's
            # next look at the eventfd.
            self.server.durability.poll()
        while True:
            state = self.state
            if state is CLOSING:
                held = self.held
                if held is None or held.phase is _OUT or held.phase is _FAILED:
                    raise _CloseNow()
            elif state is not HELD and state is not OWNED:
                return None
            got = await self._parked.wait()
            if got is not None:
                self.held = None  # (the reactor hands input over once its replies are out)
                return got

    def _after_held(self, recv: Any) -> tuple | None:
        """IDLE, the held batch out: if the round's thread sent its replies
        (``early``: before the loop learnt of it), the next batch is mostly
        there already: receive it at once, and if nothing came, → OWNED (the
        reactor takes the next batch: ``_take_runs``; ``_may_own``). Else
        the task waits for input. What to go on with, or None."""
        held, self.held = self.held, None
        if held is None or not held.early:
            return None
        if self._may_own(held):  # (the mark says nothing came since the last receive)
            self._to(OWNED)
            return None
        data = self._recv_now(recv)
        return None if data is None else (data, None, None, None, None)

    def _recv_now(self, recv: Any) -> bytes | None:
        """A receive that does not wait, keeping the input mark (the loop's
        hot path has its own copies): the bytes (b"" at EOF or on an
        error), or None if there were none."""
        try:
            data = recv(RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            self._mark = _DRAINED
            return None
        except OSError:
            return b""
        if len(data) < RECV_BYTES and self._mark != _SHUT:
            self._mark = _DRAINED
        return data

    async def _block(self, argv: list[bytes], reply_coro: Any) -> Any:
        """RUNNING → BLOCKED → RUNNING around a command that may wait (its
        batch's earlier replies are out). A closing connection does not
        start it."""
        if not self._to(BLOCKED):
            reply_coro.close()
            raise _CloseNow()
        if _may_wait(argv):
            reply = await self._await_watching_peer(reply_coro)
            if reply is _PEER_GONE:
                log.debug("client %d closed the connection while blocked", self.client.id)
                raise _CloseNow()
        else:
            reply = await reply_coro
        self._to(RUNNING)
        return reply

    async def _protocol_error(self, e: ProtocolError, out: list) -> None:
        """A request that cannot be parsed: its error after the replies so
        far, then the caller closes (a client over its query buffer limit
        gets no reply, as from Redis)."""
        if isinstance(e, QueryBufferLimitError):
            log.warning("closing client %d that reached max query buffer length", self.client.id)
        else:
            if self.client.peer:  # no peer sends what is not RESP: a stranger on the cluster bus
                log.warning("cluster bus: protocol error from %s: %s (connection closed)", self.client.addr, e.message)
            else:
                log.info("protocol error from client %d: %s", self.client.id, e.message)
            out.append(e.reply_line())
        await self._flush(out)

    async def _await_watching_peer(self, reply_coro: Any) -> Any:
        """Await a command that may block (XREAD/XREADGROUP BLOCK) while
        watching the socket: a peer that closes meanwhile cancels the wait
        (Redis frees a blocked client whose connection drops), so it does not
        linger in ``blocked_clients`` or hold its waiter until a write comes.
        Returns ``_PEER_GONE`` in that case. A command answered without
        waiting is answered even if the peer had shut its side already (as
        Redis runs what it received before it reads the EOF)."""
        result: list = []

        async def run() -> None:
            result.append(await reply_coro)
            nursery.cancel_scope.cancel()

        async def watch() -> None:
            if await self._wait_peer_closed():
                result.append(_PEER_GONE)
                nursery.cancel_scope.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run)
            nursery.start_soon(watch)
        return result[-1] if result[0] is _PEER_GONE else result[0]

    # -- receipts: what a batch's replies wait for ---------------------------

    def _settle(self, out: list) -> Any:
        """Before replies leave: the session's receipt (deferred appends
        committed, ``cluster.broker.Session.take_receipt``); the replies of
        entries whose commit failed become the error. The receipt, or None
        when the replies wait for nothing."""
        ctx = self.ctx
        session = ctx.session
        receipt = session.take_receipt()
        marks = ctx.deferred_marks
        if not marks:
            return receipt
        if self.server.broker.appends.failures:
            protocol = self.client.protocol
            failed_append = self.dispatcher.failed_append
            for pos, token, count in marks:
                exc = session.failure(token)
                if exc is None:
                    continue
                error = failed_append(exc)
                if count:  # a run's ID replies, one chunk (Dispatcher.xadd_run)
                    out[pos] = encode(error, protocol) * count
                    for _ in range(count - 1):
                        failed_append(exc)
                elif pos + 2 < len(out):  # an ID reply: header, ID, CRLF
                    out[pos] = encode(error, protocol)
                    out[pos + 1] = out[pos + 2] = b""
        marks.clear()
        return receipt

    def _hold(self, out: list, send: Any, receipt: Any) -> None:
        """Hand this batch's replies over, to be sent once the ``receipt``
        is settled: its writes durable (``Durability.when_durable``) and, for
        acks=all, on every in-sync replica (``Replication.when_acked``).
        RUNNING → HELD (the reactor's batches stay OWNED; closing stays so):
        the task waits for them, not for input, and no task switches per
        writer and round."""
        ctx = self.ctx
        seq, pending = receipt.flush_seq, receipt.repl_pending
        payload = _joined(out, ctx)
        self.server.stats.total_net_output_bytes += len(payload)
        held = self.held = _Held(self, payload, send, (1 if seq else 0) + (1 if pending else 0))
        if self.state is RUNNING:
            self._to(HELD)
        if pending:
            self.server.replication.when_acked(ctx.session, pending, held.release)
        if seq:
            # Without acks=all to wait for, the round's own thread may send them.
            send = None if pending else (self.sock.fileno(), payload)
            held.handle = self.server.durability.when_durable(seq, held.release, send)

    async def _flush(self, out: list, receipt: Any = None) -> None:
        """Settle this batch's receipt (``_settle``, unless given), wait for
        it (its writes durable, and replicated for acks=all), then send its
        replies. A receipt that fails closes without them: never acknowledge
        a write that is not on disk or not on the replicas."""
        ctx = self.ctx
        _own(out, ctx)
        if receipt is None:
            receipt = self._settle(out)
        seq = receipt.flush_seq if receipt is not None else 0
        pending = receipt.repl_pending if receipt is not None else None
        if seq:
            try:
                await self.server.durability.wait_for_flush(seq)
            except DurabilityError:
                raise _CloseNow() from None  # the client sees a connection error
        if pending:
            try:
                await self.server.replication.wait_acks(ctx.session, pending)
            except AcksFailed as e:
                log.warning("closing client %d: acks=all write not acknowledged: %s", self.client.id, e)
                raise _CloseNow() from None
        if not out:
            return
        data = b"".join(out) if len(out) != 1 else out[0]
        self.server.stats.total_net_output_bytes += len(data)
        await self._send_rest(data)


# -- the idle timeout ------------------------------------------------------------

# How often idle clients are looked for (Redis's clientsCron visits every
# client about once a second too): a client is closed between ``timeout``
# and ``timeout`` + this many seconds after its last request.
IDLE_CHECK_INTERVAL_S = 1.0


async def close_idle_clients(connections: Any, config: Any) -> None:
    """Close the clients idle for more than ``timeout`` seconds (0: never),
    as Redis's clientsCron does: one pass over every connection each
    ``IDLE_CHECK_INTERVAL_S``, against the value in force then, so a
    CONFIG SET of ``timeout`` reaches every client, one waiting for input
    included, and the reactor serves parked clients alike with or without
    a timeout (no timer per wait). ``connections``: the server's set, each
    with ``close_if_idle`` (the Kafka port's too:
    ``server.kafka_front.connection``)."""
    while True:
        await trio.sleep(IDLE_CHECK_INTERVAL_S)
        timeout_s = config.timeout
        if not timeout_s:
            continue
        now_s = _now()
        for conn in list(connections):
            conn.close_if_idle(now_s, timeout_s)


# -- zero-copy replies: a handler sets ``ctx.views`` when replies in the batch
# are views of log files' mappings (``Context.read_view``). Only these three
# functions look at it (and the guard before the deferred commit's yield, which
# spares the hot path a call): the views are sent at once, or copied before
# anything is awaited (a log file may be truncated meanwhile:
# ``ReadAccumulator.view``).

def _splicing_send(sock: socket.socket) -> Any:
    """``sock.sendmsg``, or, with ``server._mapsend`` built, its alternative
    in C (``_mapsend.send``): the same gathering send, in which views of
    log mappings are spliced instead of copied when that pays (a large
    reply that fits its pipe); a small reply is one sendmsg in that call."""
    if _mapsend is None:
        return sock.sendmsg
    return partial(_mapsend.send, sock.fileno())


def _send_now(gather: Any, send: Any, out: list, ctx: Context, stats: Any) -> bytes | memoryview | None:
    """Send a batch's replies ``out`` without waiting: one gathering send
    when they hold views of log files' mappings (no copy), else one send of
    them joined. What the socket did not take, as bytes that outlive the
    mappings (None when it took everything); an OSError other than "would
    block" passes. ``gather`` is None for TLS."""
    views = ctx.views
    if views:
        ctx.views = False
    gathered = views and gather is not None and len(out) <= _GATHER_MAX
    if gathered:
        payload, total = out, sum(map(len, out))
    else:
        payload = _JOIN(out)
        total = len(payload)
    stats.total_net_output_bytes += total
    try:
        sent = gather(payload) if gathered else send(payload)
    except (BlockingIOError, InterruptedError):
        sent = 0
    if sent == total:
        return None
    if gathered:
        payload = _JOIN(out)
    return memoryview(payload)[sent:] if sent else payload


def _own(out: list, ctx: Context) -> None:
    """Replace views of log mappings in ``out`` by copies, before an await."""
    if ctx.views:
        ctx.views = False
        for i, chunk in enumerate(out):
            if chunk.__class__ is memoryview:
                out[i] = bytes(chunk)


def _joined(out: list, ctx: Context) -> bytes:
    """``out`` as one bytes object (copies of any views), to keep."""
    ctx.views = False
    return _JOIN(out)


def _take_xadd_runs(xadd_run: Any, ctx: Context, data: bytes, out: list) -> int:
    """Take the runs of ``XADD key * field value ...`` at the start of
    ``data`` (``Dispatcher.xadd_run``): their replies go to ``out``, marked
    in ``ctx.deferred_marks`` for ``Connection._settle``. How many bytes
    they took (0: none)."""
    marks = ctx.deferred_marks
    pos = 0
    while pos < len(data):
        taken = xadd_run(ctx, data, pos)
        if taken is None:
            break
        pos, replies, count, token = taken
        marks.append((len(out), token, count))
        out.append(replies)
    return pos


# -- a held batch -----------------------------------------------------------------

class _Phase(enum.Enum):
    WAITING = "waiting"  # for its receipt: fsync round and/or acks=all
    SENDING = "sending"  # settled; a task of its own sends what the socket did not take
    OUT = "out"  # all of its replies left
    FAILED = "failed"  # a wait failed: nothing is sent, the connection closes


_WAITING, _SENDING, _OUT, _FAILED = _Phase


class _Held:
    """A batch's replies handed over by ``Connection._hold``.

    ``release`` runs wherever a wait ends (the group commit's round, or the
    task that moved the high watermark). Once every wait is over it sends,
    unless the round's thread already did (``early``: its client may have
    answered already), and tells the connection (``_held_out``); what the
    socket did not take is sent first by a task of its own, under the
    output buffer limits. A failed wait closes the connection (``kill``)
    without a reply."""

    __slots__ = ("conn", "payload", "send", "waits", "phase", "handle", "early")

    def __init__(self, conn: Connection, payload: bytes, send: Any, waits: int) -> None:
        self.conn = conn
        self.payload = payload
        self.send = send
        self.waits = waits  # fsync and/or acks=all, each calls release once
        self.phase = _WAITING
        self.handle: list | None = None  # the group commit's (Durability.withdraw_send)
        self.early = False  # the round's thread sent them, before the loop released them

    def release(self, error: Exception | None, sent: int | None = None) -> None:
        """One wait is over: once all are, send without waiting. ``sent``:
        bytes of the payload the group commit's thread already sent
        (``Durability.when_durable``; negative: the peer is gone)."""
        if self.phase is not _WAITING:
            return  # an earlier wait failed
        conn = self.conn
        if error is not None:
            # Never acknowledge a write that is not on disk or not on the
            # in-sync replicas: drop the replies and close.
            log.warning("closing client %d: write not acknowledged: %s", conn.client.id, error)
            self.phase = _FAILED
            self.payload = b""
            conn.kill()
            return
        self.waits -= 1
        if self.waits:
            return
        payload, self.payload = self.payload, b""
        self.early = sent is not None
        if sent is None:
            try:
                sent = self.send(payload)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:  # the peer is gone; the connection sees it at its next read
                sent = len(payload)
        elif sent < 0:  # the peer is gone; the connection sees it at its next read
            sent = len(payload)
        if sent != len(payload):
            self.phase = _SENDING
            trio.lowlevel.spawn_system_task(self._send_rest, memoryview(payload)[sent:])
            return
        self.phase = _OUT
        conn._held_out(self)

    async def _send_rest(self, rest: memoryview) -> None:
        try:
            await self.conn._send_rest(rest)
        except Exception:  # closed meanwhile (notify_closing) or gone: nothing to deliver to
            pass
        finally:
            self.phase = _OUT
            self.conn._held_out(self)


class _Waiter:
    """One task parked until ``wake``: trio's ``wait_task_rescheduled``
    directly, without an ``Event``'s parking lot per wait. ``task`` is the
    parked task, None while it runs; a cancelled wait unparks it. ``wake``
    may hand the task a value, which ``wait`` returns."""

    __slots__ = ("task", "value")

    def __init__(self) -> None:
        self.task: Any = None
        self.value: Any = None

    async def wait(self) -> Any:
        self.task = current_task()
        await wait_task_rescheduled(self._abort)
        value, self.value = self.value, None
        return value

    def _abort(self, _raise_cancel: Any) -> Abort:
        self.task = None
        return Abort.SUCCEEDED

    def wake(self, value: Any = None) -> None:
        task = self.task
        if task is not None:
            self.task = None
            self.value = value
            reschedule(task)


class _CloseNow(Exception):
    """The peer is gone or a write failed: close without another reply."""


async def send_all(sock: socket.socket, data: bytes) -> None:
    """Send every byte on a non-blocking socket, waiting while the peer is slow."""
    try:
        sent = sock.send(data)
    except (BlockingIOError, InterruptedError):
        sent = 0
    except OSError:
        raise _CloseNow() from None
    if sent == len(data):
        return
    view = memoryview(data)[sent:]
    while view:
        await wait_writable(sock)
        try:
            sent = sock.send(view)
        except (BlockingIOError, InterruptedError):
            continue
        except OSError:
            raise _CloseNow() from None
        view = view[sent:]
