"""What a group coordinator's decisions do to the group state of a topic.

Owns: ``TopicGroupMembership``: one consumer group on one multi-partition
topic: its ``GroupCoordinator`` (soft state: rebuilt as members read again
after a restart), and the effect of every handover on the moved partition's
durable group state (``storage.streams.groups.GroupStore``):

- every entry pending on the partition becomes pending for the new owner
  (a ``claim`` in the group journal, delivery count unchanged, so it
  survives a crash like any XCLAIM), and
- those entries are queued to be delivered to the new owner first on its
  next ``>`` read of that partition, delivery count +1 (``take_redeliveries``
  + the caller's ``GroupStore.redeliver``). The queue is soft state; after a
  restart every partition's first owner is a handover from "nobody", which
  queues all of the partition's pending entries again.

A revoking partition is released to its new owner once the old owner has
nothing pending on it (checked on every ``sync``).

Must not know: sockets, RESP, trio, the stream's entries.
"""

from __future__ import annotations

import time
from typing import Callable

from cluster.coordinator import GroupCoordinator, Handover

StreamIdT = tuple[int, int]


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class TopicGroupMembership:
    """Membership of group ``group`` on ``topic``. ``store_of(p)`` gives the
    ``GroupStore`` of partition ``p``."""

    def __init__(self, topic: bytes, group: bytes, partitions: int, session_timeout_ms: int,
                 store_of: Callable[[int], object]) -> None:
        self.topic = topic
        self.group = group
        self.coordinator = GroupCoordinator(partitions, session_timeout_ms)
        self.store_of = store_of
        self._redeliver: dict[int, list[StreamIdT]] = {}
        self.handovers_total = 0

    # ----------------------------------------------------------- membership

    def sync(self, now_ms: int) -> list:
        """Expire dead members, release revocations whose old owner has nothing
        pending, apply handovers. Returns the group stores written to (the
        caller makes them durable by its fsync policy)."""
        c = self.coordinator
        c.expire(now_ms)
        for p, old, _new in c.revoking():
            group = self._group(p)
            consumer = group.consumer(old) if group is not None else None
            if consumer is None or not consumer.pending:
                c.release(p)
        return self._apply_handovers(now_ms)

    def heartbeat(self, member: bytes, now_ms: int) -> list:
        """``member`` reads with ``>`` now (joins if new); returns stores written."""
        self.coordinator.heartbeat(member, now_ms)
        return self.sync(now_ms)

    def begin_read(self, member: bytes, now_ms: int) -> None:
        self.coordinator.begin_read(member, now_ms)

    def end_read(self, member: bytes, now_ms: int) -> None:
        self.coordinator.end_read(member, now_ms)

    def leave(self, member: bytes, now_ms: int) -> list:
        """XGROUP DELCONSUMER: ``member`` leaves; its partitions (and what it has
        pending on them) go to the remaining members now."""
        self.coordinator.leave(member, now_ms)
        return self.sync(now_ms)

    def set_partition_count(self, partitions: int, now_ms: int | None = None) -> None:
        self.coordinator.set_partition_count(partitions, wall_clock_ms() if now_ms is None else now_ms)

    def set_session_timeout(self, session_timeout_ms: int) -> None:
        self.coordinator.session_timeout_ms = max(1, int(session_timeout_ms))

    def assigned(self, member: bytes) -> list[int]:
        return self.coordinator.assigned(member)

    def owner_of(self, partition: int) -> bytes | None:
        """The member reading ``partition`` now (None while unowned or revoking)."""
        c = self.coordinator
        owner = c.owner[partition]
        return owner if owner is not None and owner == c.target[partition] else None

    def member_count(self) -> int:
        return self.coordinator.member_count()

    # ---------------------------------------------------------- redelivery

    def take_redeliveries(self, partition: int, member: bytes, count: int) -> list[StreamIdT]:
        """Up to ``count`` (0: all) queued IDs of ``partition`` still pending for
        ``member``, removed from the queue, oldest first."""
        queue = self._redeliver.get(partition)
        if not queue:
            return []
        group = self._group(partition)
        consumer = group.consumer(member) if group is not None else None
        if consumer is None:
            self._redeliver.pop(partition, None)
            return []
        out: list[StreamIdT] = []
        i = 0
        while i < len(queue) and (not count or len(out) < count):
            sid = queue[i]
            i += 1
            if sid in consumer.pending:
                out.append(sid)
        del queue[:i]
        if not queue:
            self._redeliver.pop(partition, None)
        return out

    def queued(self, partition: int) -> int:
        return len(self._redeliver.get(partition, ()))

    # ------------------------------------------------------------ internals

    def _group(self, partition: int):
        return self.store_of(partition).group(self.group)

    def _apply_handovers(self, now_ms: int) -> list:
        stores = []
        for h in self.coordinator.take_handovers():
            store = self._hand_over(h, now_ms)
            if store is not None:
                stores.append(store)
        return stores

    def _hand_over(self, h: Handover, now_ms: int):
        self.handovers_total += 1
        store = self.store_of(h.partition)
        group = store.group(self.group)
        if group is None:
            self._redeliver.pop(h.partition, None)
            return None
        pending = group.pel.items()
        moves = [(sid, now_ms, pe.delivery_count) for sid, pe in pending if pe.consumer != h.owner]
        if moves:
            store.claim(self.group, h.owner, moves, now_ms)
        self._redeliver[h.partition] = [sid for sid, _ in pending]
        return store if moves else None
