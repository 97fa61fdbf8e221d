"""The timer task of a group coordinator: it fires the coordinator's deadlines, woken early when they change.

Owns: ``DeadlineTimer``, a base class. ``run`` (one task per coordinator)
sleeps until ``_next_deadline()`` or until ``_kick()`` says the deadlines
changed, then calls ``expire(now)``. Time: ``trio.current_time()`` (the
autojump clock in tests).

Must not know: what the deadlines are (sessions, rebalances, revocations).
"""

from __future__ import annotations

import trio


class DeadlineTimer:
    def __init__(self) -> None:
        self._wake = trio.Event()

    async def run(self) -> None:
        """Fire the deadlines, forever."""
        while True:
            with trio.move_on_at(self._next_deadline()):
                await self._wake.wait()
            self._wake = trio.Event()
            self.expire(trio.current_time())

    def _kick(self) -> None:
        """The deadlines changed: ``run`` looks at them again."""
        self._wake.set()

    def _next_deadline(self) -> float:
        raise NotImplementedError

    def expire(self, now_s: float) -> None:
        raise NotImplementedError
