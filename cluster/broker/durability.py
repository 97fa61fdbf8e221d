"""When writes reach the disk before their replies go out: the fsync policy.

Owns: group commit for ``fsync always`` (every connection waiting on a write
shares one fsync per dirty log), the once-a-second flusher for ``everysec``,
and doing nothing for ``no``.

Per-topic policy: ``policy_of(log)`` (set by the app to the topic registry's
``fsync_policy_of``) returns a topic's own ``fsync`` for the logs and group
stores of that topic, or None; it wins over the policy the caller passes
(the server-wide ``fsync``).

Must not know: sockets, RESP, commands, how a log lays out its files. It uses
only the flush contract of ``storage.log.PartitionLog`` (docs/storage-api.md):
``ticket = log.begin_flush()`` on the trio thread, the ticket's syncs on
another thread (``ticket.run()``, or ``ticket.sync_targets()`` synced by
``cluster.broker._fsync`` then ``ticket.finish()``), ``log.end_flush(ticket)`` back on
the trio thread.

Group commit: ``note_write`` returns a sequence number; a writer either
awaits ``wait_for_flush(seq)`` or hands a callback to ``when_durable(seq,
callback)`` and carries on (a connection hands over its held replies that
way, so a round does not wake every writer). A round takes every log noted
so far and fsyncs them on a thread of ``cluster.broker._fsync`` that never takes the
GIL, while the loop serves other clients (their writes make the next round).
That thread also sends the replies handed over with ``when_durable(...,
send=...)`` as soon as the syncs succeed; then the loop wakes the waiters
and calls the callbacks whose writes that round covered. N connections
writing at once cost one fsync, not N. ``everysec`` flushes on a worker
thread.

Rounds are chained on the loop without a task switch (``_begin_round``,
``_end_round``): a handed-over write with no round in progress starts one at
once; a round's end is taken by whichever comes first, the next
``when_durable`` or ``poll`` (a connection about to wait for its held
replies) finding the thread done, or a task of this module's own woken by the
thread's eventfd when the loop has nothing else to run; writes noted during
a round start the next one then and there. (The loop sees a file
descriptor only between scheduler passes: a pass of 20 busy connections
is about a millisecond, five times an fsync here, and rounds taken only
there left the disk idle and every writer waiting one or two passes.) A
writer that awaits with no round in progress starts one after one
scheduler pass (the writers made ready with it join).

Under a test's runner (``Durability(run_in_thread=...)``) or without the C
helper the rounds are awaited instead (``_flush_round``).

Descriptors: a flush syncs through the descriptors of the logs' file cache,
pinned by its tickets (``storage.handles``), and every round, of either
policy, goes in chunks of tickets holding at most ``round_fds_max``
descriptors (the app sets a quarter of ``max-open-files``): however many
partitions were written, a round never needs more, and never opens a
descriptor of its own (a consumer group store's ticket pins its journal's
in the same cache, counted in the chunk). A round's replies go out after its last
chunk. A failure stops the round: every ticket begun is ended (releasing
its descriptors), and every log it did not flush stays dirty
(``_keep_dirty``), so nothing written drops out of durability.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import trio

from cluster.histogram import Histogram

try:
    from cluster.broker import _fsync
except ImportError:  # built without a C compiler: the round fsyncs on the loop
    _fsync = None

log = logging.getLogger("partita.durability")
EVERYSEC_INTERVAL_S = 1.0
# Descriptors a chunk of a flush round holds at most, unless told otherwise.
ROUND_FDS_MAX = 256


class DurabilityError(Exception):
    """A flush failed: the writes waiting on it must not be acknowledged."""


def _run_tickets(tickets: list[Any]) -> None:
    """Run every ticket (one log's failed sync must not leave the others
    unsynced), then raise the first failure."""
    first = None
    for ticket in tickets:
        try:
            ticket.run()
        except Exception as e:
            first = first or e
    if first is not None:
        raise first


def _write_ticket_checkpoints(tickets: list[Any]) -> None:
    for ticket in tickets:
        ticket.write_checkpoint()


class Durability:
    """The fsync policy for every log written through ``Context.note_write``.

    ``run_in_thread`` runs the ``everysec`` fsyncs off the trio thread. Tests
    pass an inline runner to stay deterministic under a virtual clock; a
    runner passed in also runs the ``always`` rounds' syncs, in place of
    ``cluster.broker._fsync``'s thread (whose real-time wait a virtual clock would
    jump past).

    ``round_fds_max``: descriptors a chunk of a flush round holds at most
    (the module docstring).
    """

    def __init__(self, run_in_thread=None, round_fds_max: int = ROUND_FDS_MAX) -> None:
        assert round_fds_max >= 1
        self.round_fds_max = round_fds_max
        self._run_in_thread = run_in_thread or trio.to_thread.run_sync
        self._round_runner = run_in_thread
        self._always_dirty: dict[int, Any] = {}  # id(log) -> log
        self._everysec_dirty: dict[int, Any] = {}
        self._noted_seq = 0  # last sequence handed to a writer
        self._flushed_seq = 0  # every write <= this is durable
        self._flushing = False
        self._eager = False
        self._round_done = trio.Event()
        self._failure: BaseException | None = None
        self._failed_seq = 0
        self.fsync_count = 0  # rounds of group commit done (INFO persistence)
        # Flush rounds that succeeded, by policy: how long each took, from its
        # start to the loop taking its end (what its writers waited).
        self.round_durations = {"always": Histogram(), "everysec": Histogram()}
        self.last_flush_error: str | None = None
        self.policy_of: Any = None  # log -> the topic's fsync override, or None
        # [seq, callback, send, sent] of when_durable: send is (fd, payload)
        # for the round's thread to send, sent what it took (None: not sent).
        self._pending: list[list[Any]] = []
        self._releasing = False  # the task running rounds for _pending is alive
        # An eventfd cluster.broker._fsync's thread signals when a round's syncs are done.
        self._wake_fd: int | None = None
        # Whether the rounds run on cluster.broker._fsync's thread, chained on the
        # loop, and send held replies (not under a test's runner).
        self._chained = _fsync is not None and run_in_thread is None
        self._round: _Round | None = None  # the chained round in progress
        self._watching = False  # the task ending chained rounds on the eventfd is alive
        # Tickets of finished rounds whose recovery-point checkpoints a task
        # of this module's own writes on a worker thread (_write_checkpoints).
        self._checkpoints: list[Any] = []
        self._checkpointing = False
        # ``latency(event, ms)``: the front-end's latency monitor while it is
        # on, else None. A round of group commit, from its start to its end
        # (what its writers wait for), is an ``aof-fsync-always`` event,
        # Redis's name for its always-fsync (_round_took).
        self.latency: Any = None

    def note_write(self, log_: Any, policy: str) -> int:
        """Record that ``log_`` was appended to; the seq to wait for, or 0."""
        if self.policy_of is not None:
            policy = self.policy_of(log_) or policy
        if policy == "always":
            self._always_dirty[id(log_)] = log_
            self._noted_seq += 1
            return self._noted_seq
        if policy == "everysec":
            self._everysec_dirty[id(log_)] = log_
        return 0

    async def wait_for_flush(self, seq: int) -> None:
        """Return once every write up to ``seq`` is fsynced.

        Raises DurabilityError when the flush covering it failed.
        """
        while self._flushed_seq < seq:
            if self._failure is not None and seq <= self._failed_seq:
                raise DurabilityError(str(self._failure))
            if self._flushing:
                await self._round_done.wait()
                continue
            await self._flush_round()

    def when_durable(self, seq: int, callback: Any, send: tuple[int, bytes] | None = None) -> None:
        """Call ``callback(None, sent)`` once every write up to ``seq`` is
        fsynced, or ``callback(error, None)`` (a DurabilityError) if the round
        covering it failed — without anyone awaiting: callbacks run wherever
        the round's end is taken (``_end_round``: in a later
        ``when_durable`` or ``poll``, or on this module's task) and must not
        block (a connection hands its held replies over this way, so a round
        needs no task switch per writer).

        ``send``, ``(socket fd, payload)``: bytes to send as soon as the
        round's syncs succeed. The thread of ``cluster.broker._fsync`` that ran them
        sends them itself when the round takes this write (so neither the
        loop's wake-up nor its send delays the reply); ``sent`` is then the
        bytes the socket took (``-errno`` if it failed: the peer is gone),
        and the caller sends the rest. ``sent`` None: nothing was sent.

        Returns a handle for ``withdraw_send``, or None if the callback ran."""
        if self._flushed_seq >= seq:
            callback(None, None)
            return None
        entry = [seq, callback, send if self._chained else None, None]
        self._pending.append(entry)
        if self._chained:
            round_ = self._round
            if round_ is not None and round_.last and seq <= round_.target and entry[2] is not None \
                    and round_.job is not None:
                # Its write is in the round in progress, whose last chunk is
                # syncing (a deferred commit's cohort hands over one by
                # one): its thread sends it too, if it has not finished
                # sending.
                if _fsync.add_send(round_.job, entry[2]):
                    round_.sends.append(entry)
            # Noted before, so a round this ends chains one that covers it
            # and takes its send.
            self.poll()
            if self._round is None and self._flushed_seq < seq:
                self._begin_round()
        elif not self._releasing:
            self._releasing = True
            trio.lowlevel.spawn_system_task(self._release_pending)
        return entry

    def poll(self) -> None:
        """End the chained round in progress if its thread is done (and
        start the next if writes are waiting): cheap, for a connection about
        to wait for its held replies, so the round's end is not left for the
        loop's next look at the eventfd."""
        round_ = self._round
        if round_ is not None and round_.job is not None and _fsync.done(round_.job):
            self._end_chunk()
            self._run_chunks()

    @staticmethod
    def withdraw_send(handle: list | None) -> None:
        """The socket of a ``send`` handed to ``when_durable`` is closing:
        no round may send on its number, which a client accepted next can
        get. The callback still runs, with ``sent`` None. (A round that
        already started sends on a duplicate of the socket it took.)"""
        if handle is not None:
            handle[2] = None

    async def _release_pending(self) -> None:
        try:
            while self._pending:
                error = None
                try:
                    await self.wait_for_flush(min(entry[0] for entry in self._pending))
                except DurabilityError as e:
                    error = e
                pending, self._pending = self._pending, []
                for entry in pending:
                    seq, callback, _, sent = entry
                    if seq <= self._flushed_seq:
                        callback(None, sent)
                    elif error is not None and seq <= self._failed_seq:
                        callback(error, None)
                    else:  # noted after that round began: the next one
                        self._pending.append(entry)
        except Exception as e:  # a bug here must not leave writers unanswered forever
            log.exception("group commit task failed")
            pending, self._pending = self._pending, []
            for entry in pending:
                entry[1](DurabilityError(str(e)), None)
        finally:
            self._releasing = False

    async def _flush_round(self) -> None:
        if self._chained:
            # One scheduler pass first: writers made ready with this one join
            # the round (writes noted during a round chain the next at once,
            # _end_round). wait_for_flush waits for the round to end.
            await trio.lowlevel.cancel_shielded_checkpoint()
            if not self._flushing and self._flushed_seq < self._noted_seq:
                self._begin_round()
            return
        self._flushing = True
        target = self._noted_seq
        try:
            # One scheduler pass first: writers made ready with this one join
            # the round. (Not when writes noted during the last round were
            # waiting for it to end: they start this one at once, and the
            # writers made ready meanwhile go on to the next.)
            if not self._eager:
                await trio.lowlevel.cancel_shielded_checkpoint()
            self._eager = False
            target = self._noted_seq
            queue = list(self._always_dirty.values())
            self._always_dirty.clear()
            started_ns = time.perf_counter_ns()
            with trio.CancelScope(shield=True):  # the round is every writer's, not its caller's
                try:
                    await self._flush_round_logs(queue)
                except Exception:
                    self._keep_dirty(queue)
                    raise
            self._flushed_seq = target
            self.fsync_count += 1
            self._round_took((time.perf_counter_ns() - started_ns) // 1000)
            self._eager = self._noted_seq > target
        except Exception as e:  # storage errors: refuse to acknowledge
            raise self._record_failure(target, e) from e
        finally:
            self._flushing = False
            done, self._round_done = self._round_done, trio.Event()
            done.set()

    def _round_took(self, duration_us: int) -> None:
        """An ``always`` round ended: its duration goes to the histogram and,
        while the latency monitor is on, to it as ``aof-fsync-always``."""
        self.round_durations["always"].observe_us(duration_us)
        if self.latency is not None:
            self.latency("aof-fsync-always", duration_us // 1000)

    async def _flush_round_logs(self, queue: list[Any]) -> None:
        """An awaited round's syncs: on the test's runner, or on the loop
        itself if the C helper was not built (pausing the loop as Redis's
        appendfsync always does)."""
        await flush_logs(queue, self._round_runner or _inline, self.round_fds_max)

    def _record_failure(self, target: int, error: BaseException) -> DurabilityError:
        """A round up to ``target`` failed: no write it covered may be
        acknowledged. Returns the error its writers get."""
        log.error("fsync failed, %d writes not acknowledged: %s", target - self._flushed_seq, error)
        self._failure = error
        self._failed_seq = target
        self.last_flush_error = str(error)
        return DurabilityError(str(error))

    def _keep_dirty(self, logs: list[Any]) -> None:
        """Logs a failed flush left unflushed stay dirty: the once-a-second
        flush tries them again (not the next ``always`` round, which one
        failing log would then fail for every writer), unless closed or
        offline after a failed sync (it refuses every flush until reopened)."""
        for lg in logs:
            if getattr(lg, "sync_failure", None) is None and not getattr(lg, "closed", False):
                self._everysec_dirty[id(lg)] = lg

    def _begin_round(self) -> None:
        """Start a chained round (cluster.broker._fsync's thread) for every write
        noted so far; the loop goes on at once."""
        queue = list(self._always_dirty.values())
        self._always_dirty.clear()
        self._flushing = True
        self._round = _Round(self._noted_seq, queue)
        self._run_chunks()

    def _run_chunks(self) -> None:
        """Start the chained round's next chunk on cluster.broker._fsync's thread
        (the last one takes the held replies the round covers). A chunk with
        nothing to sync, or that could not start, ends here at once; the
        round ends here once no chunk is left, or one failed."""
        round_ = self._round
        while round_.queue and round_.error is None:
            try:
                round_.logs, round_.tickets = [], []
                round_.logs, round_.tickets = _begin_chunk(round_.queue, self.round_fds_max)
                # ~fd: a full fsync (a directory); the rest need only fdatasync.
                fds = [~fd if full else fd for ticket in round_.tickets for fd, full in ticket.sync_targets()]
                if fds:
                    round_.last = not round_.queue and not any(_partial(t) for t in round_.tickets)
                    sends = [e for e in self._pending if e[2] is not None and e[0] <= round_.target] \
                        if round_.last else []
                    if self._wake_fd is None:
                        self._wake_fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
                    round_.job = _fsync.start(fds, self._wake_fd, [e[2] for e in sends])
                    round_.sends = sends
            except Exception as e:
                round_.error = e
            if round_.job is not None:
                if not self._watching:
                    self._watching = True
                    trio.lowlevel.spawn_system_task(self._watch_rounds)
                return
            self._end_chunk()  # nothing to sync, or it could not start
        self._end_round()

    def _end_chunk(self) -> None:
        """The chunk's thread is done (or it never started): finish its
        tickets (or fail them), and end them; a log not wholly flushed goes
        back to the round's queue."""
        round_ = self._round
        job, round_.job = round_.job, None
        tickets = round_.tickets
        try:
            if job is not None:
                try:
                    os.eventfd_read(self._wake_fd)  # saves _watch_rounds a wake-up
                except BlockingIOError:
                    pass
                failed = _fsync.result(job)
                if failed is not None:  # raises
                    _fail_tickets(tickets, _fsync.failures(job), OSError(failed[1], os.strerror(failed[1])))
                for entry, sent in zip(round_.sends, _fsync.sent(job)):
                    entry[2], entry[3] = None, sent
            if round_.error is None:
                self._finish_tickets(tickets)
        except Exception as e:
            round_.error = round_.error or e
        error = _end_tickets(round_.queue, round_.logs, tickets)  # a ticket not finished is discarded
        round_.error = round_.error or error
        round_.logs, round_.tickets, round_.sends = [], [], []

    def _end_round(self) -> None:
        """Every chunk of the chained round ended, or one failed: wake its
        waiters, call back its writers, and start the next round if writes
        were noted meanwhile."""
        round_, self._round = self._round, None
        target = round_.target
        failure = None
        if round_.error is None:
            self._flushed_seq = target
            self.fsync_count += 1
            self._round_took((time.perf_counter_ns() - round_.started_ns) // 1000)
        else:  # storage errors: refuse to acknowledge
            self._keep_dirty(round_.queue)
            failure = self._record_failure(target, round_.error)
        self._flushing = False
        done, self._round_done = self._round_done, trio.Event()
        done.set()
        self._call_back(failure)
        if self._noted_seq > self._flushed_seq and self._noted_seq > target:
            self._begin_round()  # writes noted during this round: the next at once

    def _call_back(self, error: DurabilityError | None) -> None:
        """Call the ``when_durable`` callbacks whose writes are durable now,
        or whose round failed; keep the rest."""
        pending, self._pending = self._pending, []
        keep = []
        for entry in pending:
            seq, callback, _, sent = entry
            try:
                if seq <= self._flushed_seq:
                    callback(None, sent)
                elif error is not None and seq <= self._failed_seq:
                    callback(error, None)
                else:  # noted after that round began: the next one
                    keep.append(entry)
            except Exception:  # one writer's bug must not leave the others unanswered
                log.exception("a group commit callback failed")
        self._pending[:0] = keep  # before any a callback handed over meanwhile

    async def _watch_rounds(self) -> None:
        """End chained rounds the loop did not end sooner (``poll``): the
        thread's eventfd wakes this task when the loop has nothing else to run."""
        try:
            while self._round is not None:
                await trio.lowlevel.wait_readable(self._wake_fd)
                try:
                    os.eventfd_read(self._wake_fd)
                except BlockingIOError:
                    pass
                self.poll()
        except trio.ClosedResourceError:  # close() at shutdown
            pass
        except Exception:  # a bug must not leave writers unanswered forever
            log.exception("group commit task failed")
        finally:
            self._watching = False

    def _finish_tickets(self, tickets: list[Any]) -> None:
        """A round's syncs succeeded: finish its tickets. The
        recovery-point checkpoints (once a second per log, ~0.6 ms of writes
        and fsyncs each) are written on a worker thread after the round: on
        the loop, 64 partitions' made it stall for tens of milliseconds, and
        the round need not wait for them (they only shorten recovery)."""
        for ticket in tickets:
            if ticket.checkpoints:
                ticket.finish(None, defer_checkpoint=True)
                self._checkpoints.append(ticket)
            else:
                ticket.finish(None)
        if self._checkpoints and not self._checkpointing:
            self._checkpointing = True
            trio.lowlevel.spawn_system_task(self._write_checkpoints)

    async def _write_checkpoints(self) -> None:
        try:
            while self._checkpoints:
                tickets, self._checkpoints = self._checkpoints, []
                await self._run_in_thread(_write_ticket_checkpoints, tickets)
        except Exception:  # a bug must not stop later rounds' checkpoints
            log.exception("writing recovery-point checkpoints failed")
            self._checkpoints = []
        finally:
            self._checkpointing = False

    def close(self) -> None:
        """Release the round's wake-up descriptor (server shutdown)."""
        if self._wake_fd is not None and not self._flushing:
            trio.lowlevel.notify_closing(self._wake_fd)  # _watch_rounds may still wait on it
            os.close(self._wake_fd)
            self._wake_fd = None

    async def flush_everysec_now(self) -> None:
        """Flush the logs written under ``everysec`` since the last call."""
        if not self._everysec_dirty:
            return
        # A log a failed sync took offline refuses every flush until it is
        # reopened, and said so when it failed: not again each second. (Under
        # always the round still asks it, so its writers get no reply.)
        queue = [lg for lg in self._everysec_dirty.values() if getattr(lg, "sync_failure", None) is None]
        self._everysec_dirty.clear()
        started_ns = time.perf_counter_ns()
        try:
            with trio.CancelScope(shield=True):
                await flush_logs(queue, self._run_in_thread, self.round_fds_max)
        except Exception as e:
            self._keep_dirty(queue)
            log.error("background fsync failed: %s", e or repr(e))
            self.last_flush_error = str(e)
        else:
            self.round_durations["everysec"].observe_us((time.perf_counter_ns() - started_ns) // 1000)

    async def run_everysec(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Background task: flush ``everysec`` logs once a second, forever."""
        task_status.started()
        while True:
            await trio.sleep(EVERYSEC_INTERVAL_S)
            await self.flush_everysec_now()

    def forget(self, log_: Any) -> None:
        """Drop a log about to be closed or deleted from the dirty sets."""
        self._always_dirty.pop(id(log_), None)
        self._everysec_dirty.pop(id(log_), None)


class _Round:
    """A chained round in progress (``Durability._begin_round``), synced a
    chunk of tickets at a time."""

    __slots__ = ("target", "queue", "logs", "tickets", "last", "sends", "job", "error", "started_ns")

    def __init__(self, target: int, queue: list[Any]) -> None:
        self.started_ns = time.perf_counter_ns()
        self.target = target  # every write noted up to here
        self.queue = queue  # logs left to flush, taken from the end
        self.logs: list[Any] = []  # the chunk in progress
        self.tickets: list[Any] = []
        self.last = False  # the chunk in progress is the round's last: it sends
        self.sends: list[list[Any]] = []  # when_durable entries the thread sends
        self.job: Any = None  # cluster.broker._fsync's job, None until started
        self.error: BaseException | None = None  # a chunk failed, or could not start


def _fail_tickets(tickets: list[Any], failures: list[tuple[int, int]], first: OSError) -> None:
    """A round's syncs failed: tell each ticket whose descriptor failed
    (its log goes offline: the kernel reports a failed writeback once),
    then raise the first failure. The round's other tickets stay
    unfinished: nothing they hold counts as synced (``end_flush`` discards
    them), and they are not offline."""
    errors = dict(failures)
    raised: list[BaseException] = []
    for ticket in tickets:
        codes = [errors[fd] for fd, _ in ticket.sync_targets() if fd in errors]
        if codes:
            try:
                ticket.finish(OSError(codes[0], os.strerror(codes[0])))
            except Exception as exc:  # StorageError, or the group store's OSError
                raised.append(exc)
    raise raised[0] if raised else first


def _partial(ticket: Any) -> bool:
    """Whether the ticket left part of its log for another (storage.log's
    ``FlushTicket.partial``; a ticket without it covers everything)."""
    return getattr(ticket, "partial", False)


def _begin_chunk(queue: list[Any], fds_max: int,
                 refused: list[tuple[Any, Exception]] | None = None) -> tuple[list[Any], list[Any]]:
    """Main thread: flush tickets for the logs at the end of ``queue``
    (taken off it) until they hold ``fds_max`` descriptors (the ticket that
    reaches it is the chunk's last; one at least). Returns (logs, tickets).
    If a ``begin_flush`` raises: with ``refused``, that log and its error
    are added to it and the chunk goes on without it; else the tickets
    begun are ended (releasing their descriptors), every log goes back to
    ``queue`` (the failing one where it is taken last) and the error is
    raised."""
    logs: list[Any] = []
    tickets: list[Any] = []
    held = 0
    while queue and held < fds_max:
        lg = queue.pop()
        if getattr(lg, "closed", False):  # closed since it was written (topic deleted)
            continue
        try:
            ticket = lg.begin_flush()
        except BaseException as e:
            if refused is not None and isinstance(e, Exception):
                refused.append((lg, e))
                continue
            queue.insert(0, lg)
            _end_tickets(queue, logs, tickets)
            raise
        logs.append(lg)
        tickets.append(ticket)
        try:
            held += len(ticket.sync_targets())
        except BaseException:
            _end_tickets(queue, logs, tickets)
            raise
    return logs, tickets


def _end_tickets(queue: list[Any], logs: list[Any], tickets: list[Any]) -> BaseException | None:
    """Main thread: end every ticket (``end_flush`` releases its
    descriptors, and discards it if it did not run or failed); a log not
    wholly flushed (its ticket not finished, or partial) goes back to
    ``queue``. Returns the first error an ``end_flush`` raised."""
    error = None
    for lg, ticket in zip(logs, tickets):
        try:
            lg.end_flush(ticket)
            done = ticket.ok and not _partial(ticket)
        except Exception as e:
            error = error or e
            done = False
        if not done:
            queue.append(lg)
    return error


async def _inline(fn, *args):
    return fn(*args)


async def flush_logs(queue: list[Any], run_in_thread=None, fds_max: int = ROUND_FDS_MAX) -> None:
    """Flush every log of ``queue`` (taken off it as each is done), a chunk
    of tickets at a time holding at most ``fds_max`` descriptors: begun on
    this thread, run by ``run_in_thread`` (a worker thread by default),
    ended here. A log whose flush cannot begin (a group store whose journal
    cannot be rewritten after a failed sync: the disk under its partition
    still fails) does not hold back the others: they are flushed (the
    partition's own log among them, which then finds the failing disk and
    goes offline), it stays in ``queue`` and its error is raised at the end.
    Otherwise stops at the first failure and raises it; the logs not
    flushed are then left in ``queue``."""
    run = run_in_thread or trio.to_thread.run_sync
    refused: list[tuple[Any, Exception]] = []
    try:
        while queue:
            logs, tickets = _begin_chunk(queue, fds_max, refused)
            try:
                if tickets:
                    await run(_run_tickets, tickets)
            finally:
                error = _end_tickets(queue, logs, tickets)
            if error is not None:
                raise error
    finally:
        queue.extend(lg for lg, _ in refused)
    if refused:
        raise refused[0][1]
