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

In a cluster the membership lives on the group's coordinator (the leader
of the topic key's slot) and some partitions are led by other nodes
(``away``): the effects on those partitions' group state are their
leaders' (cluster/broker/topic_groups.py). For such a partition a handover
is noted (``take_over``: the new owner's next read asks the leader to take
every pending entry over, ``hand_over`` there) and the revocation check uses
the old owner's pending count as its leader last told it
(``remote_pending``). The redelivery queue stays here for every partition.
The coordinator keeps a ``snapshot`` where the next one finds it, which
``restore`` takes over after a failover; a node that led the group before
``forget``s what it knew first (it is older than the snapshot).

Must not know: sockets, RESP, trio, the stream's entries.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from cluster.coordinator import GroupCoordinator, Handover

StreamIdT = tuple[int, int]

log = logging.getLogger("partita.groups")


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def _text(name: bytes) -> str:
    return name.decode("utf-8", "replace")


def hand_over(store, group_name: bytes, owner: bytes, now_ms: int) -> tuple[list[StreamIdT], bool]:
    """Every entry pending on a partition's group made ``owner``'s (a claim
    in the group journal, delivery count unchanged): the IDs to deliver it
    first (all of them, oldest first), and whether the store was written."""
    group = store.group(group_name)
    if group is None:
        return [], False
    pending = group.pel.items()
    moves = [(sid, now_ms, pe.delivery_count) for sid, pe in pending if pe.consumer != owner]
    if moves:
        store.claim(group_name, owner, moves, now_ms)
    return [sid for sid, _ in pending], bool(moves)


def take_queued(queue: list[StreamIdT], consumer, count: int) -> tuple[list[StreamIdT], int]:
    """Up to ``count`` (0: all) IDs of ``queue`` still pending for
    ``consumer`` (a group's consumer, or None), oldest first, and how many of
    the queue's IDs were gone through to find them."""
    if consumer is None:
        return [], len(queue)
    out: list[StreamIdT] = []
    i = 0
    while i < len(queue) and (not count or len(out) < count):
        sid = queue[i]
        i += 1
        if sid in consumer.pending:
            out.append(sid)
    return out, i


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
        # In a cluster (see the module docstring): which partitions other
        # nodes lead (set by the coordinator before each use), the handovers
        # of those not applied by their leader yet (partition -> new owner),
        # and the revoked owner's pending count there as last asked.
        self.away: Callable[[int], bool] | None = None
        self.take_over: dict[int, bytes] = {}
        self.remote_pending: dict[int, int] = {}
        self.reading: dict[int, int] = {}  # partition -> reads of it its leader has not answered yet
        # The membership as last kept where a next coordinator finds it
        # (``snapshot``; cluster/broker/topic_groups.py), and the leader
        # epoch of the topic key's slot at which this one took over the
        # earlier coordinator's (None: not yet).
        self.persisted: tuple | None = None
        self.persisted_id: tuple[int, int] | None = None
        self.led_epoch: int | None = None

    # ----------------------------------------------------------- membership

    def sync(self, now_ms: int) -> list:
        """Expire dead members, release revocations whose old owner has nothing
        pending, apply handovers. Returns the group stores written to (the
        caller makes them durable by its fsync policy)."""
        c = self.coordinator
        c.expire(now_ms)
        for name, silent_ms in c.take_expired():
            log.info("group '%s' on topic '%s': member '%s' expired (silent for %d ms, session timeout %d ms)",
                     _text(self.group), _text(self.topic), _text(name), silent_ms, c.session_timeout_ms)
        for p, old, _new in c.revoking():
            if self._away(p):
                if self.remote_pending.get(p) == 0 and not self.reading.get(p):
                    c.release(p)
                continue
            group = self._group(p)
            consumer = group.consumer(old) if group is not None else None
            if consumer is None or not consumer.pending:
                c.release(p)
        stores = self._apply_handovers(now_ms)
        for p in [p for p in self.take_over if not self._away(p)]:  # its leadership moved here
            owner = self.take_over.pop(p)
            if self.owner_of(p) == owner:
                store = self._hand_over(Handover(p, None, owner), now_ms)
                if store is not None:
                    stores.append(store)
        return stores

    def heartbeat(self, member: bytes, now_ms: int) -> list:
        """``member`` reads with ``>`` now (joins if new); returns stores written."""
        self.coordinator.heartbeat(member, now_ms)
        return self.sync(now_ms)

    def seen(self, member: bytes, now_ms: int) -> None:
        """``member`` reads its history now: alive, not joined if new."""
        self.coordinator.seen(member, now_ms)

    def begin_read(self, member: bytes, now_ms: int) -> None:
        self.coordinator.begin_read(member, now_ms)

    def end_read(self, member: bytes, now_ms: int) -> None:
        self.coordinator.end_read(member, now_ms)

    def leave(self, member: bytes, now_ms: int) -> list:
        """XGROUP DELCONSUMER: ``member`` leaves; its partitions (and what it has
        pending on them) go to the remaining members now."""
        self.coordinator.leave(member, now_ms)
        return self.sync(now_ms)

    def snapshot(self) -> tuple:
        """``(members, owner per partition, target per partition)``: what a
        next coordinator needs to go on (``restore``)."""
        c = self.coordinator
        return tuple(sorted(c.members)), tuple(c.owner), tuple(c.target)

    def restore(self, members: list[bytes], owner: list[bytes | None], target: list[bytes | None],
                now_ms: int) -> bool:
        """An earlier coordinator's ``snapshot`` taken over (a failover): the
        members alive from now, each owning what it owned. The redelivery
        queue was soft state: every owned partition is handed to its owner
        again (its pending entries there delivered to it first, delivery
        count +1, those of a departed member with them)."""
        if not self.coordinator.restore(members, owner, target, now_ms):
            return False
        log.info("group '%s' on topic '%s': membership restored from the coordinator before (members %s)",
                 _text(self.group), _text(self.topic), ", ".join(map(_text, members)) or "none")
        for p, name in enumerate(owner):
            if name is not None and name == target[p]:
                self.take_over[p] = name
        return True

    def forget(self) -> None:
        """Another coordinator led the group since this one last did (the
        slot's leadership left this node and came back): what this one knew
        (members and when each last read, owners, targets, the redelivery
        queue) is older than what the other kept, and is dropped for
        ``restore`` of that. Reads on their way here (``reading``) stay."""
        c = self.coordinator
        self.coordinator = GroupCoordinator(c.partitions, c.session_timeout_ms)
        self._redeliver.clear()
        self.take_over.clear()
        self.remote_pending.clear()
        self.persisted = self.persisted_id = None

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

    def member_count(self, now_ms: int) -> int:
        return self.coordinator.member_count(now_ms)

    # ---------------------------------------------------------- redelivery

    def take_redeliveries(self, partition: int, member: bytes, count: int) -> list[StreamIdT]:
        """Up to ``count`` (0: all) queued IDs of ``partition`` still pending for
        ``member``, removed from the queue, oldest first."""
        queue = self._redeliver.get(partition)
        if not queue:
            return []
        group = self._group(partition)
        out, gone_through = take_queued(queue, group.consumer(member) if group is not None else None, count)
        del queue[:gone_through]
        if not queue:
            self._redeliver.pop(partition, None)
        return out

    def queued(self, partition: int) -> int:
        return len(self._redeliver.get(partition, ()))

    def take_queue(self, partition: int) -> list[StreamIdT]:
        """The whole redelivery queue of ``partition`` (led elsewhere: its
        leader filters it), removed; ``requeue`` puts back what is left."""
        return self._redeliver.pop(partition, [])

    def requeue(self, partition: int, ids: list[StreamIdT]) -> None:
        if ids:
            self._redeliver[partition] = list(ids)
        else:
            self._redeliver.pop(partition, None)

    # ------------------------------------------------------------ internals

    def _group(self, partition: int):
        return self.store_of(partition).group(self.group)

    def _away(self, partition: int) -> bool:
        return self.away is not None and self.away(partition)

    def _apply_handovers(self, now_ms: int) -> list:
        stores = []
        for h in self.coordinator.take_handovers():
            store = self._hand_over(h, now_ms)
            if store is not None:
                stores.append(store)
        return stores

    def _hand_over(self, h: Handover, now_ms: int):
        self.handovers_total += 1
        self._redeliver.pop(h.partition, None)
        self.remote_pending.pop(h.partition, None)
        if self._away(h.partition):
            self.take_over[h.partition] = h.owner  # applied by its leader on the owner's next read
            return None
        self.take_over.pop(h.partition, None)
        store = self.store_of(h.partition)
        queue, wrote = hand_over(store, self.group, h.owner, now_ms)
        if queue:
            self._redeliver[h.partition] = queue
        return store if wrote else None
