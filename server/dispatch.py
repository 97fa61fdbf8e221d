"""From a parsed command to a reply value: lookup, checks, MULTI, the call.

Owns: ``Context`` (what a handler gets as ``ctx``), the order of checks and
Redis's texts for them (unknown command, unknown subcommand, wrong arity,
NOAUTH, commands refused inside MULTI), transactions (MULTI / EXEC / DISCARD
/ WATCH / UNWATCH state lives on the ``Client``; EXEC checks each queued
command's ACL again), per-command statistics, and Redis's guard against
cross-protocol scripting (a ``POST`` or ``Host:`` command closes the client).

Observation: the one place a command's duration is measured (the
statistics' ``usec``, INFO commandstats) is also where MONITOR, SLOWLOG and
LATENCY see it (``server.diagnostics.Diagnostics.observe``): one comparison
with ``_observe_us`` per command (a duration nothing reaches while there is
no monitor and the thresholds are off). A blocking command's duration is
the time it ran, not the time it waited (``_timed``), as Redis counts it.
The paths that take commands from the received bytes (``xadd_run``,
``read_poll``) decline while every command must be seen (a monitor
attached, or ``slowlog-log-slower-than 0``); otherwise a run whose commands
took, on average, longer than a threshold is parsed again to be logged.

Must not know: sockets, RESP bytes, storage.

``Dispatcher.call(ctx, argv)`` returns a reply value for every command except
blocking ones outside a transaction: for those it returns a coroutine that
the connection awaits after sending the replies already produced.
"""

from __future__ import annotations

import logging
import time
import types
from typing import Any

from server.acl import denied as acl_denied
from server.acl import denied_at_exec as acl_denied_at_exec
from server.errors import CommandError, wrong_arity
from server.failures import reply_for
from server.diagnostics import NEVER_US
from server.registry import CommandSpec, CommandTable, client_table
from server.reply import NULL_ARRAY, OK, QUEUED, encode_into
from server.resp import commands_in

log = logging.getLogger("partita.dispatch")
COROUTINE = types.CoroutineType
NO_REPLY = object()  # a handler's return value when nothing must be sent (SHUTDOWN)
NOAUTH = CommandError("NOAUTH", "Authentication required.")
_perf_ns = time.perf_counter_ns
_CACHE_MAX = 4096


class Context:
    """What a command handler gets as ``ctx``: one per connection, reused.

    - ``server``: ``server.state.ServerState``.
    - ``client``: ``server.state.Client``.
    - ``session``: this client's ``cluster.broker.Session``. Every read and
      write goes through it, and it collects what the replies wait for
      (durability, acks=all): a handler parses, calls it, shapes the reply.
      ``session.may_defer`` (the connection sets it; False inside EXEC and
      for a bare Context): its appends may be deferred to the tick's commit.
    - ``may_block``: False inside EXEC; a blocking handler must then return
      its timeout reply at once instead of awaiting.
    - ``deferred_marks``: where the replies of deferred appends sit in the
      batch (``(position, token, count)``, kept by the connection): a
      failed commit turns them into the error.
    - ``views``: the connection's mark that the replies in hand hold views
      of log files' mappings: set where replies are encoded, when the
      encoder met ``Entries`` (``reply.encode_into``), and by ``read_poll``;
      the connection sends them at once or copies them before it awaits
      anything. No handler sets it (XREADGROUP's still does, from its
      ``Delivery.views``, until its deliveries are ``Entries`` too).
    """

    __slots__ = ("server", "client", "dispatcher", "session", "deferred_marks", "views")

    def __init__(self, server: Any, client: Any, dispatcher: "Dispatcher | None" = None) -> None:
        self.server = server
        self.client = client
        self.dispatcher = dispatcher
        self.session = server.broker.session(client.id)
        self.deferred_marks: list = []  # (reply position, token, count), kept by the connection
        self.views = False

    @property
    def may_block(self) -> bool:
        return self.session.may_block

    @may_block.setter
    def may_block(self, value: bool) -> None:
        self.session.may_block = value

    def read_view(self) -> bool:
        """Whether XREADGROUP's handler may read views of log mappings
        (``Stream.read_after(view=True)``, then it sets ``views``): only on
        a connection's own loop (``session.may_defer``), outside
        MULTI/EXEC. The broker's reads return ``Entries`` instead, which the
        connection owns wherever it is."""
        session = self.session
        return session.may_defer and session.may_block and not self.client.in_multi


def unknown_command(argv: list[bytes]) -> CommandError:
    """Redis 7.0's text: ``unknown command 'foo', with args beginning with: 'a' 'b' ``."""
    args = ""
    for arg in argv[1:]:
        if len(args) >= 128:
            break
        text = arg.decode("utf-8", "replace")
        args += "'" + text[: 128 - len(args)] + "' "
    name = argv[0].decode("utf-8", "replace")[:128]
    return CommandError("ERR", f"unknown command '{name}', with args beginning with: {args}")


def unknown_subcommand(argv: list[bytes]) -> CommandError:
    sub = argv[1].decode("utf-8", "replace")[:128]
    container = argv[0].decode("utf-8", "replace").upper()
    return CommandError("ERR", f"unknown subcommand '{sub}'. Try {container} HELP.")


# Commands that run at once even inside MULTI (redis server.c::processCommand).
_MULTI_IMMEDIATE = frozenset({"exec", "discard", "multi", "watch", "quit", "reset"})

# Lines of an HTTP request, as commands: a web page that makes a browser POST
# to the server (cross protocol scripting). Redis's processCommand refuses
# them before anything else (networking.c::securityWarningCommand).
_HTTP_NAMES = frozenset({b"post", b"host:"})
# Flags of commands that touch keys: a client in MONITOR mode may not run
# them (Redis treats a monitor as a replica: processCommand).
_KEYSPACE_FLAGS = frozenset({"write", "readonly", "may_replicate"})
REPLICA_KEYSPACE = CommandError("ERR", "Replica can't interact with the keyspace")


@types.coroutine
def _timed(coro: Any, ran_ns: list[int]) -> Any:
    """Await ``coro`` (as ``await coro`` would), adding to ``ran_ns[0]`` the
    time it ran and not the time it waited: a blocking command's duration,
    as Redis counts it (its wait is not execution)."""
    send, throw = coro.send, coro.throw
    value: Any = None
    error: BaseException | None = None
    while True:
        started = _perf_ns()
        try:
            yielded = send(value) if error is None else throw(error)
        except StopIteration as stop:
            ran_ns[0] += _perf_ns() - started
            return stop.value
        ran_ns[0] += _perf_ns() - started
        try:
            value, error = (yield yielded), None
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as e:  # delivered into the command, as ``await`` would
            value, error = None, e

ATTACK_LOG = ("Possible SECURITY ATTACK detected. It looks like somebody is sending POST or Host: commands to "
              "Redis. This is likely due to an attacker attempting to use Cross Protocol Scripting to compromise "
              "your Redis instance. Connection aborted.")
ATTACK_LOG_INTERVAL_S = 60.0


class Dispatcher:
    """Runs commands for the connections of one server."""

    def __init__(self, server: Any, table: CommandTable | None = None, observed: bool = True) -> None:
        """``observed``: MONITOR, SLOWLOG and LATENCY see this port's
        commands (the client port's; not the cluster bus's)."""
        self.server = server
        # The port's table: the client port's (registry.client_table()), or
        # the cluster bus's (server/bus.py); a new one of its own by default.
        self.table = table if table is not None else client_table()
        self.commands = self.table.commands
        self.stats = server.stats
        self._cache: dict[bytes, CommandSpec] = {}
        self._plain: dict[bytes, CommandSpec] = {}  # raw name -> spec without subcommands
        self.broker = server.broker
        # Cluster mode: ``route(spec, argv, replica_reads)`` refuses keys led
        # elsewhere (-MOVED); ``replica_reads``: the client sent READONLY.
        replication = getattr(server, "replication", None)
        self.route = replication.route if replication is not None else None
        self._poll_spec = self.commands.get("xread")
        self._attack_logged_s: float | None = None  # when ATTACK_LOG was last written
        # A command that ran this many µs or more is observed (0: every one).
        self._observe_us = NEVER_US
        self.diagnostics = getattr(server, "diagnostics", None) if observed else None
        if self.diagnostics is not None:
            self.diagnostics.subscribe(self._set_observe_us)

    def _set_observe_us(self, observe_us: int) -> None:
        self._observe_us = observe_us

    def _observe(self, spec: CommandSpec, ctx: Context, argv: list[bytes], usec: int, feed: bool = True) -> None:
        """Show the command to MONITOR, SLOWLOG, LATENCY (``usec`` reached ``_observe_us``)."""
        self.diagnostics.observe(spec, ctx.client, argv, usec, feed)

    def lookup(self, argv: list[bytes]) -> CommandSpec | CommandError:
        """The spec to run, or the error Redis gives before running anything."""
        name = argv[0]
        spec = self._cache.get(name)
        if spec is None:
            try:
                spec = self.commands.get(name.decode("ascii").lower())
            except UnicodeDecodeError:
                spec = None
            if spec is None:
                return unknown_command(argv)
            if len(self._cache) < _CACHE_MAX:
                self._cache[name] = spec
        if spec.subcommands and (len(argv) >= 2 or spec.handler is None):
            if len(argv) < 2:
                return wrong_arity(spec.name)
            try:
                sub = spec.subcommands.get(argv[1].decode("ascii").lower())
            except UnicodeDecodeError:
                sub = None
            if sub is None:
                return unknown_subcommand(argv)
            spec = sub
        arity = spec.arity
        if (len(argv) != arity) if arity >= 0 else (len(argv) < -arity):
            return wrong_arity(spec.name)
        return spec

    def call(self, ctx: Context, argv: list[bytes]) -> Any:
        """Run one command; a reply value, or a coroutine for a blocking one
        (or one that waits for this client's acks=all writes first:
        ``_behind_own_writes``)."""
        if ctx.session.repl_pending is not None:  # (a cluster: acks=all writes not yet acknowledged)
            behind = self._behind_own_writes(ctx, argv)
            if behind is not None:
                return behind
        client = ctx.client
        spec = self._plain.get(argv[0])
        if spec is not None and client.authenticated and not client.in_multi and client.acl is None:
            # Hot path: a known plain command (no subcommands) spelled as
            # seen before, outside MULTI, from an authenticated client.
            arity = spec.arity
            n = len(argv)
            if (n == arity) if arity >= 0 else (n >= -arity):
                if spec.is_async:
                    if spec.now is not None:
                        return self._call_now(spec, ctx, argv)
                    return self._call_async(spec, ctx, argv)
                return self._call_sync(spec, ctx, argv)
        return self._call_checked(ctx, argv)

    def call_as_monitor(self, ctx: Context, argv: list[bytes]) -> Any:
        """A command of a client in MONITOR mode: as ``call``, but one that
        reads or writes keys is refused with Redis's text (to Redis a
        monitor is a replica, which may not touch the keyspace), and, as
        any refused command, fails the transaction it was sent in."""
        client = ctx.client
        spec = self.lookup(argv)
        if (type(spec) is not CommandError and spec.flags & _KEYSPACE_FLAGS and client.authenticated
                and (client.acl is None or acl_denied(ctx, spec, argv) is None)):
            if client.in_multi:
                client.multi_error = True
            self.stats.record_rejected(spec.name)
            self.stats.record_error("ERR")
            return REPLICA_KEYSPACE
        return self.call(ctx, argv)

    def xadd_run(self, ctx: Context, data: bytes, pos: int) -> Any:
        """A run of ``XADD key * field value ...`` commands at ``data[pos:]``,
        taken without parsing them one by one (``server.commands.streams.
        xadd_run``): ``(end, replies, count, token)`` (``token``: the
        deferred append's, ``Session.failure``) or None, in which case the
        commands go through ``call`` as usual.

        Only where ``call`` would take its hot path for every one of them:
        the client authenticated, not in MULTI, no ACL restriction, deferral
        allowed; in a cluster, the run's key must pass ``route`` (led here,
        not paused, lease held), checked once for the run as ``call`` checks
        it per command. Statistics count each command as ``call`` would.
        Declined while every command must be observed one by one
        (``_observe_us`` 0: a monitor, or a slow log of everything).
        """
        run = self.table.runs.get("xadd")
        client = ctx.client
        if (run is None or not client.authenticated or client.in_multi
                or client.acl is not None or not ctx.session.may_defer or not self._observe_us):
            return None
        started = _perf_ns()
        taken = run(ctx, data, pos, self.route)  # (XADD: READONLY changes nothing)
        if taken is None:
            return None
        count = taken[2]
        stats = self.stats
        stats.total_commands_processed += count
        stats.xadd_run_commands += count
        entry = stats.commands.get("xadd")
        if entry is None:
            entry = stats.commands["xadd"] = [0, 0, 0, 0]
        usec = (_perf_ns() - started) // 1000
        entry[0] += count
        entry[1] += usec
        stats.latency["xadd"].observe_us(usec, count)  # the run's mean, once per run
        client.last_command = "xadd"
        if usec >= self._observe_us and usec // count >= self._observe_us:
            # As slow as a threshold per command: each is logged with the
            # run's average (this rare case pays for parsing them again).
            spec = self.commands["xadd"]
            for argv in commands_in(data[pos:taken[0]]):
                self._observe(spec, ctx, argv, usec // count)
        return taken

    def read_poll(self, ctx: Context, data: bytes, out: list) -> bool:
        """Whether ``data`` was exactly one command in a poll form
        (the table's ``polls``: ``XREAD COUNT n STREAMS key id``, a consumer's
        poll) whose encoded reply is now appended to ``out``, answered
        without the parser and the general dispatch. False for any other
        bytes, where ``call`` would not take its hot path (not
        authenticated, in MULTI, ACL-restricted), or when the poll path
        declines: the caller then parses ``data`` and calls as usual, which
        gives every error. What ``call`` does around the command is done
        (the poll path commits deferred appends before it reads and checks
        the cluster's route) and the call is counted.
        """
        client = ctx.client
        poll = self.table.polls.get("xread")
        if (poll is None or not client.authenticated or client.in_multi or client.acl is not None
                or not self._observe_us):
            return False
        spec = self._poll_spec
        started = _perf_ns()
        reply = None
        try:
            if poll(ctx, data, out, self.route) is None:
                return False
            ctx.views = True  # the entries are views of log mappings: send at once, or copy
        except CommandError as e:
            reply = e
        except Exception as e:
            reply = reply_for(e) or self._internal_error(spec, e)
        if reply is not None:
            encode_into(out, reply, client.protocol)
        usec = (_perf_ns() - started) // 1000
        self._count(spec, ctx, usec, reply)
        if usec >= self._observe_us:
            self._observe(spec, ctx, commands_in(data)[0], usec)
        return True

    def _behind_own_writes(self, ctx: Context, argv: list[bytes]) -> Any:
        """A command on a stream this client appended to with acks=all
        earlier in the batch, whose receipt has not settled
        (``Session.awaits_own_writes``): the coroutine that runs it once it
        has, which the connection awaits after the replies before it are
        out (their receipt settled: the appends are on the in-sync replicas
        and below the high watermark). So a read in a pipeline sees the
        client's own writes before it, as on Redis, instead of stopping at
        the high watermark as it stood. None (run it now) for XADD (it
        appends; a trim of its waits for itself), commands without keys,
        and commands queued inside MULTI; EXEC waits for the keys of the
        commands it runs. (Inside the transaction, a read after an append
        of the same transaction still stops at the high watermark.)"""
        spec = self.lookup(argv)
        if type(spec) is CommandError or spec.name == "xadd":
            return None
        client = ctx.client
        if client.in_multi:
            if spec.name != "exec":
                return None
            commands = client.multi_queue
        else:
            commands = ((spec, argv),)
        keys: list[bytes] = []
        for each, each_argv in commands:
            if each.first_key > 0 or each.key_finder is not None:
                try:
                    keys.extend(each_argv[i] for i in each.key_indexes(each_argv))
                except Exception:  # noqa: BLE001 - malformed: the handler answers it
                    continue
        if not keys or not ctx.session.awaits_own_writes(keys):
            return None
        return self._after_receipt(ctx, argv)

    async def _after_receipt(self, ctx: Context, argv: list[bytes]) -> Any:
        reply = self._call_checked(ctx, argv)
        if type(reply) is COROUTINE:
            reply = await reply
        return reply

    async def _awaited(self, spec: CommandSpec, reply: Any) -> Any:
        """A plain handler's reply that the broker must wait for (a trim
        waiting for the replicas): its value, or its failure as an error
        reply (counted, as ``_call_sync`` counts one)."""
        try:
            return await reply
        except CommandError as e:
            failed = e
        except Exception as e:  # noqa: BLE001 - a lower layer's refusal, or a bug
            failed = reply_for(e) or self._internal_error(spec, e)
        entry = self.stats.commands.get(spec.name)
        if entry is not None:
            entry[3] += 1
        self.stats.record_error(failed.code)
        return failed

    def _call_checked(self, ctx: Context, argv: list[bytes]) -> Any:
        client = ctx.client
        spec = self.lookup(argv)
        if type(spec) is CommandError:
            name = argv[0]
            if 4 <= len(name) <= 5 and name.lower() in _HTTP_NAMES:
                return self._cross_protocol_attack(ctx)
            self.stats.record_rejected(None)
            if client.in_multi:
                client.multi_error = True
            self.stats.record_error(spec.code)
            if self.table.on_refused is not None:
                self.table.on_refused(ctx, spec)
            return spec
        if not spec.subcommands and "|" not in spec.name and len(self._plain) < _CACHE_MAX:
            self._plain[argv[0]] = spec
        if not client.authenticated and "no_auth" not in spec.flags:
            if client.in_multi:
                client.multi_error = True
            self.stats.record_rejected(spec.name)
            self.stats.record_error("NOAUTH")
            return NOAUTH
        if client.acl is not None:  # ACL hook: only clients of restricted users (server/acl.py)
            denied = acl_denied(ctx, spec, argv)
            if denied is not None:
                return denied
        if client.in_multi and spec.name not in _MULTI_IMMEDIATE:
            if "no_multi" in spec.flags:
                client.multi_error = True
                self.stats.record_rejected(spec.name)
                return CommandError("ERR", "Command not allowed inside a transaction")
            # A transaction's queue counts against the client's query buffer
            # limit, so MULTI cannot grow memory without bound.
            client.multi_bytes += sum(map(len, argv)) + 16 * len(argv) + 64
            if client.multi_bytes > self.server.config.client_query_buffer_limit:
                client.multi_error = True
                client.multi_queue = []
                return CommandError("ERR", "Transaction too big: client-query-buffer-limit reached")
            client.multi_queue.append((spec, argv))
            return QUEUED
        if spec.is_async:
            if spec.now is not None:  # (its no-wait path, as on the hot path)
                return self._call_now(spec, ctx, argv)
            return self._call_async(spec, ctx, argv)
        return self._call_sync(spec, ctx, argv)

    def _cross_protocol_attack(self, ctx: Context) -> Any:
        """A ``POST`` or ``Host:`` command: the client is an HTTP request
        (a web page's, through a browser). As Redis: close at once, run
        nothing after it, send nothing, not even the replies of the commands
        before it in this batch (``client.kill``), and log it at most once a
        minute."""
        now = time.monotonic()
        if self._attack_logged_s is None or now - self._attack_logged_s > ATTACK_LOG_INTERVAL_S:
            self._attack_logged_s = now
            log.warning(ATTACK_LOG)
        client = ctx.client
        client.close_after_reply = True
        client.kill()
        return NO_REPLY

    def _call_sync(self, spec: CommandSpec, ctx: Context, argv: list[bytes]) -> Any:
        name = spec.name
        ctx.client.last_command = name
        started = _perf_ns()
        try:
            if self.route is not None and (spec.first_key > 0 or spec.key_finder is not None):
                refused = self.route(spec, argv, ctx.client.readonly)
                if refused is not None:
                    raise refused
            reply = spec.handler(ctx, argv)
            if type(reply) is COROUTINE:  # the broker waits (XTRIM for the replicas)
                reply = self._awaited(spec, reply)
        except CommandError as e:
            reply = e
        except Exception as e:  # a lower layer's refusal, or a bug: an error reply either way
            reply = reply_for(e) or self._internal_error(spec, e)
        usec = (_perf_ns() - started) // 1000
        failed = reply.__class__ is CommandError
        self.stats.record_command(name, usec, failed)
        if failed:
            self.stats.record_error(reply.code)
        if usec >= self._observe_us:
            self._observe(spec, ctx, argv, usec)
        return reply

    def _call_now(self, spec: CommandSpec, ctx: Context, argv: list[bytes]) -> Any:
        """A blocking command's ``now`` path (``registry.nowait_path``): its
        reply, or the coroutine of its handler when ``now`` declines."""
        started = _perf_ns()
        try:
            self._check_route(spec, ctx, argv)
            reply = spec.now(ctx, argv)
            if reply is None:
                return self._call_async(spec, ctx, argv)
        except CommandError as e:
            reply = e
        except Exception as e:
            reply = reply_for(e) or self._internal_error(spec, e)
        return self._counted(spec, ctx, argv, (_perf_ns() - started) // 1000, reply)

    async def _call_async(self, spec: CommandSpec, ctx: Context, argv: list[bytes]) -> Any:
        if not self._observe_us:
            self.diagnostics.began(spec, ctx.client, argv)  # monitors see it now, once
        ran_ns = [0]
        ctx.client.blocked = True
        try:
            self._check_route(spec, ctx, argv)
            reply = await _timed(spec.handler(ctx, argv), ran_ns)
        except CommandError as e:
            reply = e
        except Exception as e:
            reply = reply_for(e) or self._internal_error(spec, e)
        finally:
            ctx.client.blocked = False
        return self._counted(spec, ctx, argv, ran_ns[0] // 1000, reply, blocking=True)

    def _check_route(self, spec: CommandSpec, ctx: Context, argv: list[bytes]) -> None:
        """Raise the cluster's refusal of ``argv`` (-MOVED, paused, ...), if any."""
        if self.route is not None and (spec.first_key > 0 or spec.key_finder is not None):
            refused = self.route(spec, argv, ctx.client.readonly)
            if refused is not None:
                raise refused

    def _counted(self, spec: CommandSpec, ctx: Context, argv: list[bytes], usec: int, reply: Any,
                 blocking: bool = False) -> Any:
        """``reply``, once the call of ``usec`` µs is counted in the
        statistics and observed (``blocking``: it ran on the blocking path,
        shown to the monitors when it began, and not in the latency
        histograms, whose readers expect answers given at once)."""
        self._count(spec, ctx, usec, reply, blocking)
        if usec >= self._observe_us:
            self._observe(spec, ctx, argv, usec, not blocking)
        return reply

    def _count(self, spec: CommandSpec, ctx: Context, usec: int, reply: Any, blocking: bool = False) -> None:
        failed = reply.__class__ is CommandError
        if failed:
            self.stats.record_error(reply.code)
        self.stats.record_command(spec.name, usec, failed, not blocking)
        ctx.client.last_command = spec.name

    def failed_append(self, exc: BaseException) -> CommandError:
        """The reply of a deferred XADD whose commit raised ``exc`` (what the
        immediate append would have answered), counted as a failed XADD."""
        error = reply_for(exc)
        if error is None:
            log.error("deferred append failed", exc_info=exc)
            self.stats.unexpected_error_replies += 1
            error = CommandError("ERR", f"internal error in 'xadd': {type(exc).__name__}: {exc}")
        stats = self.stats
        stats.record_error(error.code)
        entry = stats.commands.get("xadd")
        if entry is not None:
            entry[3] += 1
        return error

    def _internal_error(self, spec: CommandSpec, e: Exception) -> CommandError:
        log.exception("command '%s' failed", spec.name)
        self.stats.unexpected_error_replies += 1
        return CommandError("ERR", f"internal error in '{spec.name}': {type(e).__name__}: {e}")

    def _call_nowait(self, spec: CommandSpec, ctx: Context, argv: list[bytes]) -> Any:
        """A blocking handler run inside EXEC: it must not actually wait."""
        coro = self._call_async(spec, ctx, argv)
        try:
            coro.send(None)
        except StopIteration as stop:
            return stop.value
        coro.close()
        return CommandError("ERR", f"'{spec.name}' tried to block inside a transaction")

    # -- transactions ------------------------------------------------------

    def multi(self, ctx: Context) -> Any:
        client = ctx.client
        if client.in_multi:
            return CommandError("ERR", "MULTI calls can not be nested")
        client.in_multi = True
        client.multi_queue = []
        client.multi_bytes = 0
        client.multi_error = False
        return OK

    def discard(self, ctx: Context) -> Any:
        client = ctx.client
        if not client.in_multi:
            return CommandError("ERR", "DISCARD without MULTI")
        self._end_multi(ctx)
        return OK

    def exec(self, ctx: Context) -> Any:
        client = ctx.client
        if not client.in_multi:
            return CommandError("ERR", "EXEC without MULTI")
        if client.multi_error:
            self._end_multi(ctx)
            return CommandError("EXECABORT", "Transaction discarded because of previous errors.")
        # Appends deferred before EXEC are written first: they happened
        # before it, and a WATCHed key they change fails it.
        ctx.session.commit_deferred()
        if client.watch_dirty:
            self._end_multi(ctx)
            return NULL_ARRAY
        queue = client.multi_queue
        replies = []
        # As in Redis, the client stays "in MULTI" while EXEC runs the queue:
        # blocking commands see it (and ``ctx.may_block``) and do not wait.
        ctx.may_block = False
        session = ctx.session
        may_defer, session.may_defer = session.may_defer, False
        try:
            for spec, argv in queue:
                if client.acl is not None:
                    # The user may have changed since the command was queued
                    # (even by an ACL SETUSER earlier in this transaction).
                    refused = acl_denied_at_exec(ctx, spec, argv)
                    if refused is not None:
                        replies.append(refused)
                        continue
                if spec.is_async:
                    replies.append(self._call_nowait(spec, ctx, argv))
                else:
                    replies.append(self._call_sync(spec, ctx, argv))
        finally:
            ctx.may_block = True
            session.may_defer = may_defer
            self._end_multi(ctx)
        return replies

    def _end_multi(self, ctx: Context) -> None:
        client = ctx.client
        client.in_multi = False
        client.multi_queue = []
        client.multi_bytes = 0
        client.multi_error = False
        self.server.unwatch_all(client)
