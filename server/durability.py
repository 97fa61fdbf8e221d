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
``ticket = log.begin_flush()`` on the trio thread, ``ticket.run()`` on a
worker thread (only fsyncs), ``log.end_flush(ticket)`` back on the trio thread.

Group commit: ``note_write`` returns a sequence number; the connection
awaits ``wait_for_flush(seq)`` before sending that batch's replies. The first
waiter finding no flush in progress becomes the flusher: after one
checkpoint (every connection made ready in the same scheduler pass writes
first) it takes every log noted so far, fsyncs them on the trio thread, and
wakes all waiters whose writes that round covered. N connections writing at
once cost one fsync, not N. ``everysec`` flushes on a worker thread.
"""

from __future__ import annotations

import logging
from typing import Any

import trio

log = logging.getLogger("partita.durability")
EVERYSEC_INTERVAL_S = 1.0


class DurabilityError(Exception):
    """A flush failed: the writes waiting on it must not be acknowledged."""


def _run_tickets(tickets: list[Any]) -> None:
    for ticket in tickets:
        ticket.run()


class Durability:
    """The fsync policy for every log written through ``Context.note_write``.

    ``run_in_thread`` runs the fsyncs off the trio thread (tests pass an
    inline runner to stay deterministic under a virtual clock).
    """

    def __init__(self, run_in_thread=None) -> None:
        self._run_in_thread = run_in_thread or trio.to_thread.run_sync
        self._always_dirty: dict[int, Any] = {}  # id(log) -> log
        self._everysec_dirty: dict[int, Any] = {}
        self._noted_seq = 0  # last sequence handed to a writer
        self._flushed_seq = 0  # every write <= this is durable
        self._flushing = False
        self._round_done = trio.Event()
        self._failure: BaseException | None = None
        self._failed_seq = 0
        self.fsync_count = 0  # rounds of group commit done (INFO persistence)
        self.last_flush_error: str | None = None
        self.policy_of: Any = None  # log -> the topic's fsync override, or None

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

    async def _flush_round(self) -> None:
        self._flushing = True
        target = self._noted_seq
        try:
            # One scheduler pass first: writers made ready with this one join
            # the round. Then fsync on this thread, as Redis's appendfsync
            # always does: on this 2-vCPU machine handing the round to a
            # worker thread cost about 3 us of CPU per XADD (thread wake-ups,
            # GIL hand-overs) and a fifth of the throughput (bench/RESULTS.md).
            # The event loop pauses for the fsync; every writer waits for it
            # anyway, and rounds grow to match.
            await trio.lowlevel.cancel_shielded_checkpoint()
            target = self._noted_seq
            logs = list(self._always_dirty.values())
            self._always_dirty.clear()
            flush_logs_now(logs)
            self._flushed_seq = target
            self.fsync_count += 1
        except Exception as e:  # storage errors: refuse to acknowledge
            log.error("fsync failed, %d writes not acknowledged: %s", target - self._flushed_seq, e)
            self._failure = e
            self._failed_seq = target
            self.last_flush_error = str(e)
            raise DurabilityError(str(e)) from e
        finally:
            self._flushing = False
            done, self._round_done = self._round_done, trio.Event()
            done.set()

    async def flush_everysec_now(self) -> None:
        """Flush the logs written under ``everysec`` since the last call."""
        if not self._everysec_dirty:
            return
        logs = list(self._everysec_dirty.values())
        self._everysec_dirty.clear()
        try:
            with trio.CancelScope(shield=True):
                await flush_logs(logs, self._run_in_thread)
        except Exception as e:
            log.error("background fsync failed: %s", e or repr(e))
            self.last_flush_error = str(e)

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


def _open_logs(logs: list[Any]) -> list[Any]:
    """Logs closed since they were written (their topic was deleted) have
    nothing left to flush."""
    return [lg for lg in logs if not getattr(lg, "closed", False)]


def flush_logs_now(logs: list[Any]) -> None:
    """One group flush on the calling thread."""
    logs = _open_logs(logs)
    tickets = [lg.begin_flush() for lg in logs]
    try:
        _run_tickets(tickets)
    finally:
        for lg, ticket in zip(logs, tickets):
            lg.end_flush(ticket)


async def flush_logs(logs: list[Any], run_in_thread=None) -> None:
    """One group flush: begin on this thread, fsync on a worker, end here."""
    logs = _open_logs(logs)
    if not logs:
        return
    tickets = [lg.begin_flush() for lg in logs]
    await (run_in_thread or trio.to_thread.run_sync)(_run_tickets, tickets)
    for lg, ticket in zip(logs, tickets):
        lg.end_flush(ticket)
