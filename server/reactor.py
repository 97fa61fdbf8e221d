"""Input readiness of plain client sockets, from an epoll set of the server's own.

Owns: one epoll set in which each plain client socket is registered once,
edge-triggered, for its whole life (``register`` / ``unregister``), and the
task that watches it (``run``): when the set reports sockets with new input,
each one's ``on_ready`` is called right there, in one task step for all of
them, with the events the set reported (``EPOLLRDHUP``: the peer shut its
side). What a connection does then (mark itself readable, answer a poll,
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
"""

from __future__ import annotations

import logging
import select
from typing import Callable

import trio
from trio.lowlevel import wait_readable

log = logging.getLogger("partita.reactor")

_EVENTS = select.EPOLLIN | select.EPOLLRDHUP | select.EPOLLET
# Events that mean no input will follow what the socket holds (EPOLLHUP and
# EPOLLERR are reported whether asked for or not).
SHUT = select.EPOLLRDHUP | select.EPOLLHUP | select.EPOLLERR
# Events taken per look at the set; a full batch yields to the other tasks
# before the next look (a limit on the work of one task step).
MAX_EVENTS = 256


class Reactor:
    """An epoll set of client sockets and the task that serves it."""

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._on_ready: dict[int, Callable[[int], None]] = {}
        self._after: list[Callable[[], None]] = []

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
        """Serve the set until cancelled; closes it then."""
        fd = self._epoll.fileno()
        try:
            while True:
                await wait_readable(fd)
                while self.dispatch() == MAX_EVENTS:
                    await trio.lowlevel.checkpoint()
        finally:
            self._on_ready.clear()
            self._epoll.close()
