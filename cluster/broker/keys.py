"""Key events: a write changed a key; readers blocked on it wake.

Owns: the waiters of blocked readers (a Redis XREAD/XREADGROUP BLOCK, a
follower's long-poll fetch, later a Kafka Fetch with max wait) per key, the
``max-blocked-clients`` bound, and the listeners a front-end subscribes to
hear every signal (the RESP front-end's WATCH).

Must not know: who waits or why, protocols, storage.
"""

from __future__ import annotations

from typing import Any, Callable

import trio


class TooManyBlockedError(Exception):
    """``max-blocked-clients`` readers already wait (``limit`` of them)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"max-blocked-clients reached ({limit})")
        self.limit = limit


class KeyEvents:
    """One per broker. ``signal(key)`` is called by the broker after every
    write that changes what a reader of ``key`` would see."""

    def __init__(self, config: Any) -> None:
        self.config = config
        self.blocked_clients = 0
        self._waiters: dict[bytes, set[trio.Event]] = {}
        self._listeners: list[Callable[[bytes | None], None]] = []

    def subscribe(self, listener: Callable[[bytes | None], None]) -> None:
        """``listener(key)`` after each signal; ``listener(None)`` when every
        key changed (FLUSHALL)."""
        self._listeners.append(listener)

    def signal(self, key: bytes) -> None:
        for listener in self._listeners:
            listener(key)
        waiters = self._waiters.get(key)
        if waiters:
            for event in waiters:
                event.set()

    def signal_all(self) -> None:
        """Every key changed: every listener hears it, every blocked reader re-checks."""
        for listener in self._listeners:
            listener(None)
        for waiters in self._waiters.values():
            for event in waiters:
                event.set()

    async def wait_for_keys(self, keys: list[bytes], timeout_s: float | None, *, internal: bool = False) -> bool:
        """Wait until one of ``keys`` is signalled; False on timeout.

        ``timeout_s`` None waits forever. Cancellation (client gone, server
        stopping) propagates; the waiter is removed in every case.
        ``internal`` (a follower's long-poll fetch): not a blocked client, not
        bounded by ``max-blocked-clients``. Raises TooManyBlockedError.
        """
        limit = self.config.max_blocked_clients
        if not internal and limit and self.blocked_clients >= limit:
            raise TooManyBlockedError(limit)
        event = trio.Event()
        waiters = self._waiters
        for key in keys:
            bucket = waiters.get(key)
            if bucket is None:
                bucket = waiters[key] = set()
            bucket.add(event)
        blocked = 0 if internal else 1
        self.blocked_clients += blocked
        try:
            if timeout_s is None:
                await event.wait()
                return True
            with trio.move_on_after(timeout_s):
                await event.wait()
            return event.is_set()
        finally:
            self.blocked_clients -= blocked
            for key in keys:
                bucket = waiters.get(key)
                if bucket is not None:
                    bucket.discard(event)
                    if not bucket:
                        del waiters[key]
