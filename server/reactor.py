"""Input readiness of plain client sockets, from an epoll set of the server's own.

Owns: one epoll set in which each plain client socket is registered once,
edge-triggered, for its whole life (``register`` / ``unregister``), and the
task that watches it (``run``): when the set reports sockets with new input,
each one's ``on_ready`` is called right there, in one task step for all of
them, with the events the set reported (``EPOLLRDHUP``: the peer shut its
side). What a connection does then (mark itself readable, run a batch,
wake its task) is ``server.connection``'s.

Must not know: RESP, commands, what a connection is.

End of a step: a handler may ask for a call once every handler of the step
has run (``after_step``): work cheaper done once for all of them (a
connection whose XADDs were taken here commits them with the others').

Why: trio's ``wait_readable`` re-arms a one-shot registration on every wait
(one ``epoll_ctl`` per request) and wakes the waiting task through the
scheduler; a connection whose client answers slower than the loop (a
consumer parsing 1000-entry replies) paid both for every request. Here the
kernel's registration stays, trio watches only this set's descriptor, and a
connection parked idle can be answered without its task running at all
(``Connection._on_ready``; bench/RESULTS.md "XREAD: readiness from the
server's own epoll").

Edge-triggered: the set reports a socket when new input arrives, not while
input is waiting. A connection therefore keeps its own "readable" mark, set
by ``on_ready`` and cleared only when a receive finds the socket drained.
A receive that returns less than it asked for has drained the bytes, but
not the EOF: when the peer's last bytes and its FIN arrive together, one
report covers both, and the receive that takes the bytes stops short of
the EOF. So "drained" needs one more fact: the report's ``EPOLLRDHUP``
(computed when the set reports, so it is there whenever the FIN arrived
before the report, and a FIN after it is a report of its own). A
connection told of it never clears its mark again, and its next receive
finds the EOF whatever state it is in (``Connection._on_ready``).

The loop's idle wait (``IdleWait``): once a step is done and the event loop
has nothing else to do (no task runnable, no deadline due, nothing on its
own descriptors), the reactor's task waits for the next input itself
instead of parking in trio and being woken through trio's loop. One
``poll`` watches both the set and trio's own epoll descriptor, with trio's
next deadline as its time-out; anything for the loop (a task made
runnable by a handler, a deadline, input on a descriptor trio watches: a
listener, the fsync thread's eventfd, a thread's ``run_sync_soon``, a
signal) ends the wait or prevents it, and the task goes back to trio. A
consumer answered in the reactor's step then costs one ``poll`` and one
look at the set per wake-up, not a pass of trio's loop (an ``epoll_wait``,
an ``epoll_ctl`` and ~25 µs of the scheduler's Python: bench/RESULTS.md
"XREAD: the reactor waits in the loop's place"). "Nothing runnable" is
read from the running loop, which trio does not publish: its run queue,
the rest of the batch of tasks it is running (a local of its run loop),
its deadlines, its epoll descriptor. Where they are not there (another
trio version or backend, a test's ``MockClock``, instruments watching the
loop's own wait, a guest run) the task parks in trio as before;
``Reactor.idle_waits`` counts the waits it took itself.
"""

from __future__ import annotations

import logging
import math
import select
import sys
from typing import Any, Callable

import trio
from trio.lowlevel import enable_ki_protection, wait_readable

log = logging.getLogger("partita.reactor")

_EVENTS = select.EPOLLIN | select.EPOLLRDHUP | select.EPOLLET
# Events that mean no input will follow what the socket holds (EPOLLHUP and
# EPOLLERR are reported whether asked for or not).
SHUT = select.EPOLLRDHUP | select.EPOLLHUP | select.EPOLLERR
# Events taken per look at the set; a full batch yields to the other tasks
# before the next look (a limit on the work of one task step).
MAX_EVENTS = 256
# The longest idle wait of the reactor's own (trio's own is a day too).
_MAX_WAIT_S = 86_400.0
# Instrument hooks around the loop's own wait: with one installed, trio waits.
_LOOP_WAIT_HOOKS = frozenset({"before_io_wait", "after_io_wait"})


class IdleWait:
    """The event loop's idle wait, taken by the reactor's task for the set
    ``fd`` (see the module docstring). ``wait()``: True when the set has
    new input and nothing else came; False at once when the loop has
    something to run, else when it gets something (a deadline included)."""

    def __init__(self, fd: int, runner: Any, loop_frame: Any, loop_fd: int) -> None:
        self._fd = fd
        self._runner = runner
        self._loop_frame = loop_frame
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)
        self._poll.register(loop_fd, select.POLLIN)
        self.waits = 0

    @classmethod
    def of_running_loop(cls, fd: int, depth: int = 1) -> "IdleWait | None":
        """The idle wait under the running trio loop, called from the first
        step of the task that will wait (``depth``: how many frames above
        the caller the loop's own frame is); None where the loop's facts
        are not what this reads, or its clock is not the wall clock's."""
        try:
            from trio._core._run import GLOBAL_RUN_CONTEXT, SystemClock

            runner = GLOBAL_RUN_CONTEXT.runner
            frame = sys._getframe(depth + 1)
            if frame.f_code.co_name != "unrolled_run" or "batch" not in frame.f_code.co_varnames:
                return None
            if type(runner.clock) is not SystemClock or runner.is_guest:
                return None
            loop_fd = runner.io_manager._epoll.fileno()
            runner.runq.__len__, runner.deadlines.next_deadline, runner.waiting_for_idle.__len__
            runner.ki_pending, runner.instruments.keys
        except (ImportError, AttributeError, RuntimeError, ValueError, OSError):
            return None
        return cls(fd, runner, frame, loop_fd)

    def _runnable(self, batch: bool) -> bool:
        """Whether the loop has a task to run: one scheduled for its next
        batch, or (``batch``) one left in the batch it is running (this
        task's)."""
        return bool(self._runner.runq or (batch and self._loop_frame.f_locals.get("batch")))

    @enable_ki_protection  # a ^C here is trio's to deliver, as in its own wait
    def wait(self, first: bool = True) -> bool:
        """``first``: the first wait of the task's step. The batch the loop
        is running cannot change until the step ends (nothing else runs),
        so only that wait reads it: the read (``f_locals``, every local of
        the loop's frame copied to a dict) cost ~0.6 µs per wait, once per
        XREAD COUNT 1000 (bench/RESULTS.md "XREAD: the per-call Python")."""
        runner = self._runner
        if (self._runnable(first) or runner.waiting_for_idle or runner.ki_pending
                or not _LOOP_WAIT_HOOKS.isdisjoint(runner.instruments.keys())):
            return False
        timeout_s = runner.clock.deadline_to_sleep_time(runner.deadlines.next_deadline())
        if timeout_s <= 0:
            return False
        ready = self._poll.poll(math.ceil(min(timeout_s, _MAX_WAIT_S) * 1000))
        if len(ready) != 1 or ready[0][0] != self._fd:
            return False  # timed out (a deadline), or the loop's own descriptors have something
        self.waits += 1
        return True


class Reactor:
    """An epoll set of client sockets and the task that serves it."""

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._on_ready: dict[int, Callable[[int], None]] = {}
        self._after: list[Callable[[], None]] = []
        self._idle: IdleWait | None = None

    def register(self, fd: int, on_ready: Callable[[int], None]) -> bool:
        """Call ``on_ready(events)`` (on the loop, from ``run``) each time new
        input or EOF reaches ``fd``; also once at once if input is already
        there. ``events``: the set's event mask (``events & SHUT``: the peer
        has shut its side or the socket failed). False if the socket cannot
        be watched (the caller waits through trio)."""
        if fd in self._on_ready:
            raise ValueError(f"fd {fd} is already registered")
        try:
            self._epoll.register(fd, _EVENTS)
        except (OSError, ValueError):
            return False
        self._on_ready[fd] = on_ready
        return True

    def unregister(self, fd: int) -> None:
        """Stop watching ``fd``; call before closing it (its number is reused)."""
        if self._on_ready.pop(fd, None) is None:
            return
        try:
            self._epoll.unregister(fd)
        except (OSError, ValueError):
            pass  # already closed: the kernel dropped it from the set

    def after_step(self, fn: Callable[[], None]) -> None:
        """From an ``on_ready``: call ``fn()`` once every handler of this
        step has run, in the order asked."""
        self._after.append(fn)

    @property
    def registered(self) -> int:
        return len(self._on_ready)

    @property
    def idle_waits(self) -> int:
        """Input found by the loop's idle wait of the task's own
        (``IdleWait``), not through trio."""
        return self._idle.waits if self._idle is not None else 0

    def dispatch(self) -> int:
        """Call ``on_ready`` for what the set reports now (no waiting), then
        what they asked for with ``after_step``; how many events there were.
        A handler that raises is logged and does not stop the others: one
        connection's fault is its own."""
        events = self._epoll.poll(0, MAX_EVENTS)
        handlers = self._on_ready
        for fd, mask in events:
            on_ready = handlers.get(fd)
            if on_ready is not None:
                try:
                    on_ready(mask)
                except Exception:
                    log.exception("input handler of fd %d failed", fd)
        after = self._after
        if after:
            self._after = []
            for fn in after:
                try:
                    fn()
                except Exception:
                    log.exception("end-of-step handler failed")
        return len(events)

    async def run(self) -> None:
        """Serve the set until cancelled; closes it then. After a step, the
        task waits for the next input itself while the loop has nothing
        else to do (``IdleWait``), else in trio."""
        fd = self._epoll.fileno()
        idle = self._idle = IdleWait.of_running_loop(fd)
        try:
            while True:
                await wait_readable(fd)
                first = True  # (the task's step begins)
                while True:
                    if self.dispatch() == MAX_EVENTS:
                        await trio.lowlevel.checkpoint()
                        first = True
                    elif idle is None or not idle.wait(first):
                        break
                    else:
                        first = False
        finally:
            self._on_ready.clear()
            self._epoll.close()
