"""One client connection: the only place that reads and writes a client socket.

Owns: the receive → parse → dispatch → encode → send loop on a raw
non-blocking socket, pipelining (every complete command of one receive runs
in order; their replies leave in one ``send``), holding a batch's replies
until its writes are durable (``server.durability``), sending what is ready
before awaiting a blocking command, protocol errors (reply, then close), and
closing the client on QUIT / CLIENT KILL / SHUTDOWN.

Must not know: what any command means (``server.dispatch``), RESP reply
encoding rules (``server.reply``), request framing (``server.resp``), TLS
(``server.tls``).

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

import logging
import socket
from time import time as _now
from typing import Any

import trio
from trio.lowlevel import (Abort, cancel_shielded_checkpoint, checkpoint, current_task, reschedule,
                           wait_readable, wait_task_rescheduled, wait_writable)

from server import outbuf
from server.dispatch import COROUTINE, NO_REPLY, Context, Dispatcher
from server.durability import DurabilityError
from server.reactor import SHUT
from server.replication import AcksFailed
from server.errors import ProtocolError
from server.reply import encode, encode_into
from server.resp import QueryBufferLimitError, RequestParser

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
        self.idle = True  # waiting for a request or in a blocking command
        self.stopping = False
        self.parser: RequestParser | None = None
        self.held: _Held | None = None  # replies waiting for a group commit (``_hold``)
        # Plain sockets in the server's epoll set (server.reactor): the set
        # watching this socket, whether input may be waiting (its reports are
        # edge-triggered), whether the set reported the peer's EOF (then
        # input stays "waiting" until a receive returns it: a receive that
        # took the last bytes stopped short of it), the task parked for input
        # (``_wait_input``), the one watching for the EOF during a BLOCK
        # (``_wait_peer_closed``), and what ``_on_ready`` leaves that task:
        # bytes it received but did not answer, or the rest of a reply the
        # socket did not take.
        self._reactor: Any = None
        self._fd = -1
        self.readable = True
        self._shut = False
        self._input = _Waiter()
        self._gone = _Waiter()
        self._round = _Waiter()  # the task waiting for a held batch's round (``_release``)
        self._handoff: bytes | None = None
        self._unsent: bytes | memoryview | None = None
        self._polls = False  # whether ``_answer_parked`` may answer polls (set by ``_serve``)
        # While its task waits for a held batch whose replies are out, the
        # reactor takes the next batch's XADD runs (``_take_runs``): whether
        # it does now, the replies of runs taken in this step of the reactor
        # (``_hand_taken``), and those of runs taken before input the task
        # goes on with.
        self._owned = False
        self._taking = False  # ``_take_runs`` is ending the round of the held batch
        self._taken: list | None = None
        self._pre_out: list | None = None
        client._kill = self.kill

    def kill(self) -> None:
        """CLIENT KILL: close at the next wait, even one for a slow reader."""
        self.stopping = True
        self.cancel_scope.cancel()

    def stop(self) -> None:
        """Shutdown: close now if idle, else after the batch in flight is answered."""
        self.stopping = True
        held = self.held
        if self.idle or (held is not None and held.done and not held.sending):
            self.cancel_scope.cancel()  # nothing in flight, or its replies are out

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
            # Entries deferred by a batch cut short are written (their
            # replies are lost, as for a client that disconnects).
            self.ctx.session.commit_deferred()
            self.ctx.deferred_marks.clear()
            held = self.held
            if held is not None and not held.done:
                # The socket closes below and its number is free for the
                # next client: no round may send these replies on it.
                server.durability.withdraw_send(held.handle)
            server.remove_client(self.client)
            await self._close_transport()

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
        until input (or EOF) is there, ``recv(n)`` takes it (b"" at EOF,
        BlockingIOError if there was none after all), ``send(data)`` sends
        what it can without waiting and returns the byte count."""
        sock = self.sock
        return (wait_readable if self._reactor is None else self._wait_input), sock.recv, sock.send

    async def _wait_input(self, _sock: Any = None) -> None:
        """The plain loop's wait for input when the socket is in the
        server's epoll set: none if it may have input already (one scheduler
        pass first, so a busy client does not starve the others), else park
        until ``_on_ready`` wakes the task."""
        if self.readable:
            await checkpoint()
            return
        await self._input.wait()

    def _on_ready(self, events: int) -> None:
        """The reactor's report of new input (or EOF: ``events & SHUT``). A
        task parked for input while nothing is in flight gets a consumer's
        poll answered here, without running (``_answer_parked``); one
        waiting for a held batch that is out gets its next batch of XADDs
        taken here while the reactor owns it (``_take_runs``); anything else
        wakes it. From an EOF on, every receive may clear ``readable`` only
        by returning b"", in whatever state the report found
        the connection; a BLOCK watching for it ends (``_wait_peer_closed``)."""
        self.readable = True
        if events & SHUT:
            self._shut = True
            self._gone.wake()
        if self._owned:
            inline, waiter = self._take_runs, self._round
        elif self._input.task is not None:
            inline, waiter = self._answer_parked, self._input
        else:
            return
        try:
            if inline():
                return
        except Exception:  # a bug here must not strand the client: close it
            log.exception("connection %d failed", self.client.id)
            self.stopping = True
        self._owned = False
        waiter.wake()

    def _answer_parked(self) -> bool:
        """For ``_on_ready``, the parked task's loop step for one request in
        the poll form (``Dispatcher.read_poll``), taken here: receive, answer,
        send; True when done with nothing left for the task (it stays
        parked). False with the received bytes in ``_handoff`` (not a lone
        poll, EOF, an error) or the reply's rest in ``_unsent``: the task
        then runs its usual step with them."""
        if self.stopping or self.parser is None or not self._polls or self.server.config.timeout:
            return False  # (an idle timeout is the task's to restart)
        sock = self.sock
        data = self._receive()
        if data is None:
            return True
        if data[1:2] != b"6" or not self.parser.at_boundary():
            self._handoff = data
            return False
        ctx = self.ctx
        out: list = []
        if not self.dispatcher.read_poll(ctx, data, out):
            self._handoff = data
            return False
        stats = self.server.stats
        stats.total_net_input_bytes += len(data)
        self.client.last_interaction = _now()
        views, ctx.views = ctx.views, False
        try:
            rest = _send_now(sock.sendmsg, sock.send, out, views, stats)
        except OSError:
            self._handoff = b""
            return False
        if rest is None:
            # (A receive that filled its buffer may have left input behind,
            # and no new report will come for it: the task goes on then.)
            return not self.readable
        self._unsent = rest
        return False

    def _receive(self) -> bytes | None:
        """The receive of ``_on_ready``'s paths: the bytes (b"" at EOF or
        on an error, which the task closes for as for its own receive), or
        None if there were none after all. Clears ``readable`` when it
        drained the socket."""
        try:
            data = self.sock.recv(RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            self.readable = False
            return None
        except OSError:
            return b""
        if len(data) < RECV_BYTES:
            self.readable = self._shut
        return data

    def _may_own(self) -> bool:
        """Whether the reactor may take this connection's XADD runs while
        its task waits for a held batch (``_Held.release``)."""
        return (self._reactor is not None and not self.stopping and self.parser is not None
                and not self.server.config.timeout  # (an idle timeout is the task's to restart)
                and self._handoff is None and self._unsent is None and self._taken is None)

    def _own_if_quiet(self, held: "_Held") -> bool:
        """Once ``held`` is done: whether the reactor owns the connection
        now (``_owned``, set here either way), taking its next batch
        (``_take_runs``) while the task stays parked in ``_release``. It
        does when the round's thread sent the replies (``early``: the loop
        did not, so the client may answer any moment) and nothing came since
        (or the reactor's step is receiving it: ``_taking``). Whoever ended
        the round asks: ``_Held.release`` for a parked task, the task itself
        after its own ``Durability.poll``."""
        owned = self._owned = (held.early and not held.sending and (self._taking or not self.readable)
                               and self.held is held and self._may_own())
        return owned

    def _take_runs(self) -> bool:
        """For ``_on_ready`` while the reactor owns the connection: its
        task waits for a held batch whose replies are out, and the next
        batch is taken here, if it is runs of ``XADD key * field value ...``
        (``Dispatcher.xadd_run``): appended (deferred, as by the task) and,
        at the end of the reactor's step, handed to the group commit with
        every other connection's of that step (``_hand_taken``), the task
        staying parked. True when done with nothing left for the task.
        False when the task must go on: with the bytes received in
        ``_handoff`` (and the replies of runs taken before them in
        ``_pre_out``), or with nothing received (its held batch is not
        out yet, EOF, an error)."""
        held = self.held
        if held is not None and not held.done:
            # Its client has the replies (the round's thread sent them) but
            # the loop has not ended the round yet: end it now if it is over.
            self._taking = True
            try:
                self.server.durability.poll()
            finally:
                self._taking = False
        if held is None or not held.done or held.sending or held.failed or not self._may_own():
            return False
        data = self._receive()
        if data is None:
            return True
        if not data or data[0] != 42 or not self.parser.at_boundary():
            self._handoff = data
            return False
        out: list = []
        pos = _take_xadd_runs(self.dispatcher.xadd_run, self.ctx, data, out)
        if pos:
            self.server.stats.total_net_input_bytes += pos
            self.client.last_interaction = _now()
        if pos < len(data):
            self._handoff = data[pos:] if pos else data
            self._pre_out = out
            return False
        self._taken = out
        self._reactor.after_step(self._hand_taken)
        return True

    def _hand_taken(self) -> None:
        """The end of the reactor's step after ``_take_runs``: commit (the
        first connection of the step commits every one's entries, one log
        batch per stream), then hand the replies over as the task's
        ``_hold`` does; if their writes wait for nothing (a topic of another
        fsync policy, a failed commit) the task sends them."""
        out, self._taken = self._taken, None
        if out is None or self._reactor is None:
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
        payload = _JOIN(out)
        self.server.stats.total_net_output_bytes += len(payload)
        self._unsent = payload
        self._owned = False
        self._round.wake()

    def _gathering_send(self) -> Any:
        """``sendmsg``-like ``send(buffers)`` without waiting, or None (TLS)."""
        return self.sock.sendmsg

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
            while not self._shut:
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

    # -- the command loop (both transports) --------------------------------

    async def _serve(self) -> None:
        sock = self.sock
        client = self.client
        ctx = self.ctx
        stats = self.server.stats
        config = self.server.config
        call = self.dispatcher.call
        parser = self.parser = RequestParser(
            config.proto_max_bulk_len,
            config.client_query_buffer_limit,
            authenticated=lambda: client.authenticated,
        )
        get_command = parser.get_command
        wait, recv, send = self._transport()
        gather = self._gathering_send()
        hold_send = send if gather is not None else None  # plain sockets hand held replies over (_hold)
        session = ctx.session
        appends = self.server.broker.appends
        marks = ctx.deferred_marks
        table = self.dispatcher.table
        xadd_run = self.dispatcher.xadd_run if "xadd" in table.runs else None
        poll = self.dispatcher.read_poll if "xread" in table.polls else None
        self._polls = poll is not None
        # The next request's early try (_SPECULATE_MAX_MISSES), plain sockets only.
        speculate = False
        misses = skips = 0
        while True:
            held = self.held
            data = None
            if held is None:
                if self.stopping:
                    return
                self.idle = True
                if speculate:
                    speculate = False
                    await cancel_shielded_checkpoint()  # the other connections' turn first
                    if self.stopping:
                        return
                    try:
                        data = recv(RECV_BYTES)
                        misses = 0
                    except (BlockingIOError, InterruptedError):
                        self.readable = False
                        misses = min(misses + 1, _SPECULATE_MAX_MISSES)
                        skips = (1 << misses) - 1
                    except OSError:
                        return
                    else:
                        if len(data) < RECV_BYTES:
                            self.readable = self._shut
            if data is None:
                if held is not None:
                    # Replies handed to the group commit (``_hold``): wait for
                    # them to be out, not for input (a client sends its next
                    # batch once it has them, and what comes first waits
                    # anyway), then, if the round's thread sent them before
                    # the loop learnt of it, read at once: the next batch is
                    # mostly there, with no wait on the socket.
                    if not held.done:
                        # Its round may be over already: end it now, not at
                        # the loop's next look at the eventfd.
                        self.server.durability.poll()
                    if not held.done or held.sending or held.failed or self._own_if_quiet(held):
                        # (While it waits, the reactor may take its next
                        # batches: ``_owned``, ``self.held`` replaced.)
                        held = await self._release(held)
                    self.held = None
                    if self.stopping:
                        return
                    if self._unsent is not None:  # the rest of a batch the reactor took
                        rest, self._unsent = self._unsent, None
                        await self._send_rest(rest)
                        continue
                    if self._handoff is not None:  # input the reactor received and left
                        data, self._handoff = self._handoff, None
                    elif not held.early:
                        continue  # sent by the loop just now: no batch yet, wait for it
                else:
                    idle_timeout_s = config.timeout
                    if idle_timeout_s:  # (``_answer_parked`` leaves such waits alone)
                        with trio.move_on_after(idle_timeout_s) as idle_scope:
                            await wait(sock)
                        if idle_scope.cancelled_caught:
                            log.info("closing idle client %d (timeout %ds)", client.id, idle_timeout_s)
                            return
                    else:
                        await wait(sock)
                    if self.stopping:
                        return
                    if self._unsent is not None:  # the rest of a reply answered while parked
                        rest, self._unsent = self._unsent, None
                        self.idle = False
                        await self._send_rest(rest)
                        continue
                    data, self._handoff = self._handoff, None  # bytes received while parked
                if data is None:
                    try:
                        data = recv(RECV_BYTES)
                    except (BlockingIOError, InterruptedError):
                        self.readable = False
                        if held is not None:
                            # Its client has the replies and sent nothing yet:
                            # as if the round had ended while the task waited,
                            # the reactor takes the next batch (the next pass
                            # waits in ``_release``), whoever ended the round.
                            self.held = held
                            if not self._own_if_quiet(held):
                                self.held = None
                        continue
                    except OSError:
                        return
                    if len(data) < RECV_BYTES:
                        self.readable = self._shut
            if not data:
                return
            self.idle = False
            stats.total_net_input_bytes += len(data)
            out: list = []
            if self._pre_out is not None:  # replies of runs the reactor took before ``data``
                out, self._pre_out = self._pre_out, None
            if data[1:2] == b"6" and poll is not None and parser.at_boundary() and poll(ctx, data, out):
                pass  # a consumer's poll (one XREAD), answered from the bytes (``Dispatcher.read_poll``)
            else:
                if data[0] == 42 and xadd_run is not None and parser.at_boundary():
                    # Runs of `XADD key * f v ...` are taken from the bytes as
                    # they are; the rest is parsed.
                    pos = _take_xadd_runs(xadd_run, ctx, data, out)
                    if pos:
                        data = data[pos:]
                parser.feed(data)
                check_at = SIZE_CHECK_CHUNKS
                while True:
                    try:
                        argv = get_command()
                    except QueryBufferLimitError:
                        log.warning("closing client %d that reached max query buffer length", client.id)
                        await self._flush(out)
                        return
                    except ProtocolError as e:
                        log.info("protocol error from client %d: %s", client.id, e.message)
                        out.append(e.reply_line())
                        await self._flush(out)
                        return
                    if argv is None:
                        break
                    reply = call(ctx, argv)
                    if type(reply) is COROUTINE:
                        await self._flush(out)
                        out = []
                        check_at = SIZE_CHECK_CHUNKS
                        self.idle = True
                        try:
                            if _may_wait(argv):
                                reply = await self._await_watching_peer(reply)
                                if reply is _PEER_GONE:
                                    log.debug("client %d closed the connection while blocked", client.id)
                                    return
                            else:
                                reply = await reply
                        finally:
                            self.idle = False
                    if reply is not NO_REPLY:
                        if session.deferred is not None:  # an XADD whose entry awaits a commit
                            marks.append((len(out), session.deferred, 0))
                            session.deferred = None
                        # Read per reply: HELLO may switch protocol mid-batch.
                        if encode_into(out, reply, client.protocol):
                            ctx.views = True  # entries as views of log mappings: sent at once or copied
                    if client.close_after_reply or self.stopping:
                        if not client.kill_requested:  # killed by its own command (POST): nothing is sent
                            await self._flush(out)
                        return
                    # limits hook (server/outbuf.py): a reply read from a log is few
                    # chunks but can be megabytes; weigh such replies as they come.
                    if len(out) >= check_at or (reply.__class__ in outbuf.WEIGHED
                                                and outbuf.weigh(self, out) >= SEND_AT_BYTES):
                        # Checked every 4096 chunks, not per reply: a long
                        # pipeline must not cost quadratic time here.
                        if sum(map(len, out)) >= SEND_AT_BYTES:
                            await self._flush(out)
                            out = []
                            check_at = SIZE_CHECK_CHUNKS
                        else:
                            check_at = len(out) + SIZE_CHECK_CHUNKS
            client.last_interaction = _now()
            if marks:
                if appends.streams and marks[-1][1][1] == appends.round:
                    # Let the other connections of this scheduler tick run
                    # their batches first: one log write for all of them.
                    if ctx.views:
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
                    self._hold(out, hold_send, receipt)
            elif out:
                # Hot path: one send of the whole batch, no extra awaits.
                views, ctx.views = ctx.views, False
                try:
                    rest = _send_now(gather, send, out, views, stats)
                except OSError:
                    return
                if skips:
                    skips -= 1
                elif gather is not None:  # a plain socket (TLS reads through its stream)
                    speculate = True
                if rest is not None:
                    await self._send_rest(rest)

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
        acks=all, on every in-sync replica (``Replication.when_acked``); and
        go back to reading: no task switch per writer and round."""
        ctx = self.ctx
        ctx.views = False  # the join below copies them
        seq, pending = receipt.flush_seq, receipt.repl_pending
        payload = _JOIN(out)
        self.server.stats.total_net_output_bytes += len(payload)
        self.idle = False  # a shutdown waits for these replies
        held = self.held = _Held(self, payload, send, (1 if seq else 0) + (1 if pending else 0))
        if pending:
            self.server.replication.when_acked(ctx.session, pending, held.release)
        if seq:
            # Without acks=all to wait for, the round's own thread may send them.
            send = None if pending else (self.sock.fileno(), payload)
            held.handle = self.server.durability.when_durable(seq, held.release, send)

    async def _release(self, held: "_Held") -> "_Held":
        """After ``_hold``, before the next batch: wait until the round is
        done and its replies are out (``_Held``); close if it failed. While
        the reactor owns the connection (``_take_runs``) it hands later
        batches over meanwhile: the latest one is waited for and returned."""
        while True:
            held = self.held or held
            if held.done and not held.sending and not self._owned:
                break
            # Woken by ``_Held``, ``_on_ready`` or ``_hand_taken``, each of
            # which ends the reactor's ownership first if the task is to go on.
            await self._round.wait()
        self._owned = False
        if held.failed:
            # Never acknowledge a write that is not on disk or on the replicas.
            self.stopping = True
            raise _CloseNow()
        return held

    async def _flush(self, out: list, receipt: Any = None) -> None:
        """Settle this batch's receipt (``_settle``, unless given), wait for
        it (its writes durable, and replicated for acks=all), then send its
        replies."""
        ctx = self.ctx
        if ctx.views:
            _own(out, ctx)
        if receipt is None:
            receipt = self._settle(out)
        seq = receipt.flush_seq if receipt is not None else 0
        pending = receipt.repl_pending if receipt is not None else None
        if seq:
            try:
                await self.server.durability.wait_for_flush(seq)
            except DurabilityError:
                # Never acknowledge a write that is not on disk: drop the
                # replies and close; the client sees a connection error.
                self.stopping = True
                raise _CloseNow() from None
        if pending:
            try:
                await self.server.replication.wait_acks(ctx.session, pending)
            except AcksFailed as e:
                # Appended here but not on enough replicas: as for a failed
                # fsync, no reply acknowledges it; the client sees the close.
                log.warning("closing client %d: acks=all write not acknowledged: %s", self.client.id, e)
                self.stopping = True
                raise _CloseNow() from None
        if not out:
            return
        data = b"".join(out) if len(out) != 1 else out[0]
        self.server.stats.total_net_output_bytes += len(data)
        await self._send_rest(data)


def _send_now(gather: Any, send: Any, out: list, views: bool, stats: Any) -> bytes | memoryview | None:
    """Send a batch's replies ``out`` without waiting: one gathering send
    when they hold views of log files' mappings (``views``; no copy), else
    one send of them joined. What the socket did not take, as bytes that
    outlive the mappings (None when it took everything); an OSError other
    than "would block" passes. ``gather`` is None for TLS."""
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


def _own(out: list, ctx: Context) -> None:
    """Replace views of log mappings in ``out`` by copies, before an await:
    a log file may be truncated meanwhile (``ReadAccumulator.view``)."""
    ctx.views = False
    for i, chunk in enumerate(out):
        if chunk.__class__ is memoryview:
            out[i] = bytes(chunk)


class _Held:
    """A batch's replies handed over by ``Connection._hold``.

    ``release`` runs wherever the last wait ended (the group commit's
    round, or the task that moved the high watermark) and sends, unless the
    round's thread already did (``early``); a failed wait closes the
    connection (``kill``), and what the socket did not take is sent by a
    task of its own, under the output buffer limits. The connection waits
    for ``done`` and ``sending`` rather than for input, then reads at once
    if ``early`` (its client has had the replies a while), else waits for
    input."""

    __slots__ = ("conn", "payload", "send", "waits", "done", "failed", "sending", "handle", "early")

    def __init__(self, conn: Connection, payload: bytes, send: Any, waits: int) -> None:
        self.conn = conn
        self.payload = payload
        self.send = send
        self.waits = waits  # fsync and/or acks=all, each calls release once
        self.done = False
        self.failed = False
        self.sending = False  # a task is sending what the socket did not take
        self.handle: list | None = None  # the group commit's (Durability.withdraw_send)
        self.early = False  # the round's thread sent them, before the loop released them

    def release(self, error: Exception | None, sent: int | None = None) -> None:
        """One wait is over: once all are, send without waiting. ``sent``:
        bytes of the payload the group commit's thread already sent
        (``Durability.when_durable``; negative: the peer is gone)."""
        if self.done:
            return  # an earlier wait failed
        conn = self.conn
        if error is not None:
            # Never acknowledge a write that is not on disk or not on the
            # in-sync replicas: drop the replies and close.
            log.warning("closing client %d: write not acknowledged: %s", conn.client.id, error)
            self.failed = True
            self.payload = b""
            conn.kill()
        else:
            self.waits -= 1
            if self.waits:
                return
            payload, self.payload = self.payload, b""
            self.early = sent is not None
            if sent is not None:
                if sent < 0:  # the peer is gone; the connection sees it at its next read
                    sent = len(payload)
            else:
                try:
                    sent = self.send(payload)
                except (BlockingIOError, InterruptedError):
                    sent = 0
                except OSError:  # the peer is gone; the connection sees it at its next read
                    sent = len(payload)
            if sent != len(payload):
                self.sending = True
                trio.lowlevel.spawn_system_task(self._send_rest, memoryview(payload)[sent:])
            elif conn.stopping:
                conn.cancel_scope.cancel()  # shutting down: its last replies are out
        self.done = True
        if conn._round.task is not None and conn._own_if_quiet(self):
            # Its client has the replies and sent nothing yet: the reactor
            # takes its next batch (``Connection._take_runs``), no task switch.
            return
        conn._owned = False
        conn._round.wake()

    async def _send_rest(self, rest: memoryview) -> None:
        conn = self.conn
        try:
            await conn._send_rest(rest)
        except Exception:  # closed meanwhile (notify_closing) or gone: nothing to deliver to
            pass
        finally:
            self.sending = False
            if conn.stopping:
                conn.cancel_scope.cancel()
            conn._round.wake()


class _Waiter:
    """One task parked until ``wake``: trio's ``wait_task_rescheduled``
    directly, without an ``Event``'s parking lot per wait. ``task`` is the
    parked task, None while it runs; a cancelled wait unparks it."""

    __slots__ = ("task",)

    def __init__(self) -> None:
        self.task: Any = None

    async def wait(self) -> None:
        self.task = current_task()
        await wait_task_rescheduled(self._abort)

    def _abort(self, _raise_cancel: Any) -> Abort:
        self.task = None
        return Abort.SUCCEEDED

    def wake(self) -> None:
        task = self.task
        if task is not None:
            self.task = None
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
