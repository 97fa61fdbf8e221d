"""The group coordinator: membership and partition assignment of one consumer
group on one multi-partition topic.

Owns: who the live members are, which member each partition is assigned to,
and the incremental (cooperative sticky) rebalance that keeps the assignment
balanced while moving as few partitions as possible.

Model (Kafka's consumer group protocol, collapsed into one process):

- A member joins by reading (``heartbeat``) and is dead once it has not read
  for ``session_timeout_ms``. A read in progress (a blocked XREADGROUP,
  ``begin_read`` .. ``end_read``) keeps it alive. ``leave`` removes it at once
  (XGROUP DELCONSUMER).
- ``target[p]``: the member partition ``p`` is assigned to. A rebalance
  (member joined, left or died; partitions added) gives each of ``m`` members
  ``n // m`` or ``n // m + 1`` partitions: a member keeps what it has up to
  its quota (the members holding the most keep the larger quotas), and only
  the excess and orphaned partitions move, lowest-loaded member first.
- ``owner[p]``: the member currently holding ``p``. It equals ``target[p]``
  except while ``p`` is being revoked from a live member: then neither the old
  nor the new member reads new entries from ``p`` (so no entry is delivered
  to two live owners of a partition at once) while both keep reading their
  other partitions. The revocation completes (``release``) when the old
  owner has nothing pending on ``p`` (the caller checks the group state), or
  by force after ``session_timeout_ms``. A partition whose owner is dead, gone,
  or unknown (after a restart) passes to its target at once.
- Every change of owner is a ``Handover``; the caller drains them
  (``take_handovers``) and moves the partition's pending entries to the new
  owner (see ``cluster.membership``).
- ``restore`` takes the members and assignment an earlier coordinator had
  (a cluster's coordinator failover: cluster/broker/topic_groups.py keeps
  them), the members alive from then.

Must not know: streams, group state, files, sockets, trio. Time is passed in
(``now_ms``), so tests drive it with a fake clock.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Member:
    name: bytes
    joined_ms: int
    last_seen_ms: int
    reads_in_progress: int = 0


@dataclass(frozen=True)
class Handover:
    """Partition ``partition`` now belongs to ``owner`` (before: ``previous``,
    None when it had no owner, e.g. after a restart)."""

    partition: int
    previous: bytes | None
    owner: bytes


class GroupCoordinator:
    """Membership and assignment of one group on one topic. See the module docstring."""

    def __init__(self, partitions: int, session_timeout_ms: int) -> None:
        assert partitions >= 1 and session_timeout_ms >= 1
        self.partitions = partitions
        self.session_timeout_ms = session_timeout_ms
        self.members: dict[bytes, Member] = {}
        self.target: list[bytes | None] = [None] * partitions
        self.owner: list[bytes | None] = [None] * partitions
        self.revoking_since_ms: dict[int, int] = {}
        self.generation = 0  # rebalances so far
        self._handovers: list[Handover] = []
        self._expired: list[tuple[bytes, int]] = []  # (member, how long it had been silent, ms)

    # ------------------------------------------------------------ membership

    def heartbeat(self, member: bytes, now_ms: int) -> bool:
        """``member`` reads now: it joins if new. Expires dead members first.

        Returns True when the assignment changed.
        """
        changed = self.expire(now_ms)
        m = self.members.get(member)
        if m is None:
            self.members[member] = Member(member, now_ms, now_ms)
            self._rebalance(now_ms)
            return True
        m.last_seen_ms = max(m.last_seen_ms, now_ms)
        return changed

    def seen(self, member: bytes, now_ms: int) -> None:
        """``member`` reads its pending entries (a history read) now: alive,
        if it is a member (such a read never joins)."""
        m = self.members.get(member)
        if m is not None:
            m.last_seen_ms = max(m.last_seen_ms, now_ms)

    def begin_read(self, member: bytes, now_ms: int) -> None:
        """A (blocking) read by ``member`` starts: alive until ``end_read``."""
        self.heartbeat(member, now_ms)
        self.members[member].reads_in_progress += 1

    def end_read(self, member: bytes, now_ms: int) -> None:
        m = self.members.get(member)
        if m is not None:
            m.reads_in_progress = max(0, m.reads_in_progress - 1)
            m.last_seen_ms = max(m.last_seen_ms, now_ms)

    def leave(self, member: bytes, now_ms: int) -> bool:
        """``member`` leaves now (its partitions move at once). False if unknown."""
        if self.members.pop(member, None) is None:
            return False
        self._rebalance(now_ms)
        return True

    def is_alive(self, member: bytes, now_ms: int) -> bool:
        """``member`` is a member that ``expire`` at ``now_ms`` would keep (a
        view's answer, which expires nobody)."""
        m = self.members.get(member)
        return m is not None and (m.reads_in_progress > 0 or now_ms - m.last_seen_ms < self.session_timeout_ms)

    def expire(self, now_ms: int) -> bool:
        """Remove members silent for ``session_timeout_ms``; force revocations
        older than that. Returns True when the assignment changed."""
        dead = [name for name, m in self.members.items()
                if m.reads_in_progress == 0 and now_ms - m.last_seen_ms >= self.session_timeout_ms]
        for name in dead:
            self._expired.append((name, now_ms - self.members.pop(name).last_seen_ms))
        if dead:
            self._rebalance(now_ms)
        forced = [p for p, since in self.revoking_since_ms.items()
                  if now_ms - since >= self.session_timeout_ms]
        for p in forced:
            self._complete(p)
        return bool(dead or forced)

    def set_partition_count(self, partitions: int, now_ms: int) -> None:
        """The topic grew (partitions never shrink)."""
        assert partitions >= self.partitions
        extra = partitions - self.partitions
        if not extra:
            return
        self.target.extend([None] * extra)
        self.owner.extend([None] * extra)
        self.partitions = partitions
        self._rebalance(now_ms)

    def restore(self, members: list[bytes], owner: list[bytes | None], target: list[bytes | None],
                now_ms: int) -> bool:
        """Take the membership an earlier coordinator had (``members``, each
        partition's ``owner`` and ``target``), the members alive from
        ``now_ms``; partitions whose owner is not their target are revoking
        from now. False (nothing changed) when it does not fit: another
        partition count, or not an assignment of these members."""
        n = self.partitions
        names = set(members)
        if (self.members or len(owner) != n or len(target) != n
                or any(t is not None and t not in names for t in target)
                or any(o is not None and o not in names for o in owner)
                or (names and any(t is None for t in target))):
            return False
        counts = [target.count(name) for name in names]
        if counts and max(counts) - min(counts) > 1:
            return False
        self.members = {name: Member(name, now_ms, now_ms) for name in members}
        self.target = list(target)
        self.owner = list(owner)
        self.revoking_since_ms = {p: now_ms for p in range(n)
                                  if owner[p] is not None and target[p] is not None and owner[p] != target[p]}
        self.generation += 1
        self._check()
        return True

    # ------------------------------------------------------------ assignment

    def assigned(self, member: bytes) -> list[int]:
        """Partitions ``member`` may read new entries from now."""
        return [p for p in range(self.partitions)
                if self.owner[p] == member and self.target[p] == member]

    def revoking(self) -> list[tuple[int, bytes, bytes | None]]:
        """``(partition, current owner, target)`` of partitions being revoked."""
        return [(p, self.owner[p], self.target[p]) for p in sorted(self.revoking_since_ms)]

    def release(self, partition: int) -> None:
        """The old owner of a revoking partition has nothing pending on it:
        the partition goes to its target now."""
        if partition in self.revoking_since_ms:
            self._complete(partition)

    def take_handovers(self) -> list[Handover]:
        out, self._handovers = self._handovers, []
        return out

    def take_expired(self) -> list[tuple[bytes, int]]:
        """The members expired since the last call, each with how long it
        had been silent (ms)."""
        out, self._expired = self._expired, []
        return out

    def member_count(self, now_ms: int) -> int:
        """The live members at ``now_ms`` (``is_alive``)."""
        return sum(1 for name in self.members if self.is_alive(name, now_ms))

    # ------------------------------------------------------------- internals

    def _complete(self, p: int) -> None:
        self.revoking_since_ms.pop(p, None)
        previous, new = self.owner[p], self.target[p]
        self.owner[p] = new
        if new is not None and new != previous:
            self._handovers.append(Handover(p, previous, new))

    def _rebalance(self, now_ms: int) -> None:
        self.generation += 1
        n = self.partitions
        live = sorted(self.members)
        if not live:
            self.target = [None] * n
        else:
            self.target = _sticky_assignment(self.target, live, n)
        for p in range(n):
            owner, target = self.owner[p], self.target[p]
            if owner == target:
                self.revoking_since_ms.pop(p, None)
            elif owner is None or owner not in self.members or target is None:
                # Nobody live holds it (or nobody is left to take it): move at once.
                self.revoking_since_ms.pop(p, None)
                self._complete(p)
            else:
                self.revoking_since_ms.setdefault(p, now_ms)
        self._check()

    def _check(self) -> None:
        counts: dict[bytes, int] = {}
        for t in self.target:
            if t is not None:
                assert t in self.members
                counts[t] = counts.get(t, 0) + 1
        if self.members:
            assert all(t is not None for t in self.target)
            values = [counts.get(name, 0) for name in self.members]
            assert max(values) - min(values) <= 1, values


def _sticky_assignment(previous: list[bytes | None], live: list[bytes], n: int) -> list[bytes | None]:
    """A balanced assignment of ``n`` partitions to ``live`` that keeps as many
    of ``previous`` as possible."""
    m = len(live)
    quota, extra = divmod(n, m)
    current: dict[bytes, list[int]] = {name: [] for name in live}
    free: list[int] = []
    for p, name in enumerate(previous):
        if name in current:
            current[name].append(p)
        else:
            free.append(p)
    # Members already holding the most keep the larger quotas (ties by name).
    order = sorted(live, key=lambda name: (-len(current[name]), name))
    capacity = {name: quota + (1 if i < extra else 0) for i, name in enumerate(order)}
    target: list[bytes | None] = [None] * n
    counts: dict[bytes, int] = {}
    for name in live:
        keep = current[name][: capacity[name]]
        free.extend(current[name][capacity[name]:])
        for p in keep:
            target[p] = name
        counts[name] = len(keep)
    for p in sorted(free):
        name = min((x for x in live if counts[x] < capacity[x]), key=lambda x: (counts[x], x))
        target[p] = name
        counts[name] += 1
    return target
