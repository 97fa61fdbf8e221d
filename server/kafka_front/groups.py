"""Kafka's classic consumer group protocol: the group coordinator's state machine, on trio.

Owns: ``Coordinator`` (one per server, ``KafkaFront.groups``): every Kafka
group this node coordinates, its members, generations and assignments, and
the timers (session and rebalance timeouts) that drive it, as Kafka's
classic ``GroupCoordinator`` does:

- a group is Empty, PreparingRebalance, CompletingRebalance or Stable
  (Dead once deleted);
- JoinGroup adds or refreshes a member and starts a rebalance; the join
  completes once every known member has rejoined or the rebalance timeout
  (the largest of the members') passed, those that did not being removed;
  then the generation goes up, a protocol every member supports is chosen
  (the members vote with their preference order), the leader (kept if still
  a member) gets every member's metadata and the others none;
- SyncGroup: the leader's assignments are relayed to each member (the
  assignors are the clients': range, roundrobin, cooperative-sticky ...);
- Heartbeat keeps a member alive; a member whose session timeout passes
  without a heartbeat (and that has no JoinGroup or SyncGroup waiting) is
  removed, and the group rebalances;
- LeaveGroup removes members at once and rebalances;
- a group left with no members is forgotten (its committed offsets stay:
  it is then an Empty group of the offset store);
- static membership (``group.instance.id``, KIP-345): a known instance
  joining with no member id gets a new member id, fencing the old one
  (FENCED_INSTANCE_ID); a follower rejoining a Stable group keeps the
  current assignment without a rebalance;
- v4+ joins with no member id are answered MEMBER_ID_REQUIRED with one
  (KIP-394), kept pending for the session timeout.

A group id is of one type while it has members: JoinGroup for a consumer
group of the KIP-848 protocol with members (``consumer_groups``, reached
as ``consumer``) is INCONSISTENT_GROUP_PROTOCOL, as Kafka answers with its
migration between the protocols disabled; the administration below
(``group_ids``, ``state_of``, ``delete``) covers both types.

Committed offsets are ``offsets.OffsetStore``'s (durable); this module
decides who may commit (the generation rules).

Time: ``trio.current_time()`` (the autojump clock in tests); ``run`` is the
one task that fires deadlines.

Must not know: the wire format (the API modules turn requests into calls and
results into responses), sockets, the disk.
"""

from __future__ import annotations

import itertools
import math
import struct
import uuid
from typing import Any

import trio

from server.kafka import errors as E
from server.kafka_front.deadlines import DeadlineTimer

EMPTY = "Empty"
PREPARING = "PreparingRebalance"
COMPLETING = "CompletingRebalance"
STABLE = "Stable"
DEAD = "Dead"

SESSION_TIMEOUT_MIN_MS = 6000  # Kafka's group.min.session.timeout.ms
SESSION_TIMEOUT_MAX_MS = 1800000  # group.max.session.timeout.ms


class GroupError(Exception):
    """A refusal: ``code`` is Kafka's error (``member_id``: the id to send back)."""

    def __init__(self, code: int, member_id: str = "") -> None:
        super().__init__(code)
        self.code = code
        self.member_id = member_id


class JoinResult:
    __slots__ = ("error", "generation", "protocol_type", "protocol", "leader", "member_id", "members")

    def __init__(self, error: int, generation: int = -1, protocol_type: str | None = None,
                 protocol: str | None = None, leader: str = "", member_id: str = "",
                 members: list | None = None) -> None:
        self.error = error
        self.generation = generation
        self.protocol_type = protocol_type
        self.protocol = protocol
        self.leader = leader
        self.member_id = member_id
        self.members = members or []  # (member_id, instance_id, metadata): the leader's only


class Waiter:
    """A JoinGroup or SyncGroup response the coordinator settles later."""

    __slots__ = ("event", "result")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.result: Any = None

    def settle(self, result: Any) -> None:
        if not self.event.is_set():
            self.result = result
            self.event.set()


class Member:
    __slots__ = ("member_id", "instance_id", "client_id", "client_host", "session_timeout_ms",
                 "rebalance_timeout_ms", "protocol_type", "protocols", "assignment", "join", "sync",
                 "seen_s")

    def __init__(self, member_id: str, instance_id: str | None, client_id: str, client_host: str) -> None:
        self.member_id = member_id
        self.instance_id = instance_id
        self.client_id = client_id
        self.client_host = client_host
        self.session_timeout_ms = 0
        self.rebalance_timeout_ms = 0
        self.protocol_type = ""
        self.protocols: list[tuple[str, bytes]] = []
        self.assignment = b""
        self.join: Waiter | None = None
        self.sync: Waiter | None = None
        self.seen_s = trio.current_time()

    def metadata(self, protocol: str) -> bytes:
        return next((m for name, m in self.protocols if name == protocol), b"")

    def expiry_s(self) -> float:
        if self.join is not None or self.sync is not None:
            return math.inf  # a request in flight: the rebalance timeout watches it
        return self.seen_s + self.session_timeout_ms / 1000


class Group:
    def __init__(self, group_id: str) -> None:
        self.group_id = group_id
        self.state = EMPTY
        self.generation = 0
        self.protocol_type: str | None = None
        self.protocol: str | None = None
        self.leader: str | None = None
        self.members: dict[str, Member] = {}
        self.static: dict[str, str] = {}  # instance id -> member id
        self.pending: dict[str, float] = {}  # member ids handed out by MEMBER_ID_REQUIRED -> expiry
        self.rebalance_deadline_s = math.inf

    def candidates(self) -> set[str]:
        names = None
        for m in self.members.values():
            mine = {name for name, _ in m.protocols}
            names = mine if names is None else names & mine
        return names or set()

    def supports(self, protocol_type: str, protocols: list[tuple[str, bytes]]) -> bool:
        if not self.members:
            return bool(protocol_type) and bool(protocols)
        return protocol_type == self.protocol_type and bool({n for n, _ in protocols} & self.candidates())

    def all_joined(self) -> bool:
        return all(m.join is not None for m in self.members.values())

    def subscribed_topics(self) -> set[str] | None:
        """The topics a ``consumer`` group's members subscribe to (None: not known)."""
        if self.protocol_type != "consumer" or not self.protocol:
            return None
        topics: set[str] = set()
        for m in self.members.values():
            topics.update(decode_subscription(m.metadata(self.protocol)))
        return topics


class Coordinator(DeadlineTimer):
    """Every Kafka group this node coordinates (module docstring); ``run``: the task firing the
    session and rebalance deadlines."""

    def __init__(self, store: Any = None) -> None:
        super().__init__()
        self.groups: dict[str, Group] = {}
        self.store = store  # offsets.OffsetStore (None: no committed offsets, in unit tests of membership)
        self.consumer: Any = None  # consumer_groups.ConsumerCoordinator: the KIP-848 groups, a group id's other type
        self._ids = itertools.count(1)

    # -- the deadlines --------------------------------------------------------------

    def _next_deadline(self) -> float:
        out = math.inf
        for g in self.groups.values():
            out = min(out, g.rebalance_deadline_s, *g.pending.values(), *(m.expiry_s() for m in g.members.values()))
        return out

    def expire(self, now_s: float) -> None:
        """Remove members whose session passed, complete rebalances whose timeout passed."""
        for g in list(self.groups.values()):
            for mid, expiry in list(g.pending.items()):
                if expiry <= now_s:
                    del g.pending[mid]
            gone = [m for m in g.members.values() if m.expiry_s() <= now_s]
            for m in gone:
                self._remove(g, m, E.UNKNOWN_MEMBER_ID)
            if gone and g.state in (STABLE, COMPLETING):
                self._prepare(g)
            if g.state == PREPARING and (g.rebalance_deadline_s <= now_s or g.all_joined()):
                self._complete_join(g)
            if g.state == EMPTY and not g.members and not g.pending:
                del self.groups[g.group_id]  # nothing left but its committed offsets (the store's), as Kafka

    # -- JoinGroup -----------------------------------------------------------------

    async def join(self, group_id: str, member_id: str, instance_id: str | None, session_timeout_ms: int,
                   rebalance_timeout_ms: int, protocol_type: str, protocols: list[tuple[str, bytes]],
                   client_id: str, client_host: str, require_known_member_id: bool) -> JoinResult:
        """A JoinGroup: its result once the join completes (or a refusal at once)."""
        if not group_id:
            return JoinResult(E.INVALID_GROUP_ID, member_id=member_id)
        if not SESSION_TIMEOUT_MIN_MS <= session_timeout_ms <= SESSION_TIMEOUT_MAX_MS:
            return JoinResult(E.INVALID_SESSION_TIMEOUT, member_id=member_id)
        if self.is_consumer_group(group_id):  # a group is of one type while it has members
            return JoinResult(E.INCONSISTENT_GROUP_PROTOCOL, member_id=member_id)
        g = self.groups.get(group_id)
        if g is None:
            if member_id:
                return JoinResult(E.UNKNOWN_MEMBER_ID, member_id=member_id)
            g = self.groups[group_id] = Group(group_id)
        if g.state == DEAD:
            return JoinResult(E.COORDINATOR_NOT_AVAILABLE, member_id=member_id)
        if not g.supports(protocol_type, protocols):
            return JoinResult(E.INCONSISTENT_GROUP_PROTOCOL, member_id=member_id)
        try:
            member = self._joining_member(g, member_id, instance_id, client_id, client_host,
                                          require_known_member_id, session_timeout_ms)
        except GroupError as e:
            return JoinResult(e.code, member_id=e.member_id)
        changed = member.protocols != protocols or member.protocol_type != protocol_type
        member.session_timeout_ms = session_timeout_ms
        member.rebalance_timeout_ms = rebalance_timeout_ms if rebalance_timeout_ms > 0 else session_timeout_ms
        member.protocol_type = protocol_type
        member.protocols = list(protocols)
        member.client_id, member.client_host = client_id, client_host
        member.seen_s = trio.current_time()
        if g.state in (STABLE, COMPLETING) and not changed and member.member_id in g.members \
                and member.member_id != g.leader and g.generation > 0 \
                and (g.state == STABLE or (member.sync is None and member_id == member.member_id)):
            # a follower rejoining without change (a static member restarted): the current generation
            return self._current(g, member)
        waiter = Waiter()
        if member.join is not None:
            member.join.settle(JoinResult(E.UNKNOWN_MEMBER_ID, member_id=member.member_id))
        member.join = waiter
        g.members[member.member_id] = member
        if g.leader is None:
            g.leader = member.member_id
        if g.state != PREPARING:
            self._prepare(g)
        elif g.all_joined():
            self._complete_join(g)
        self._kick()
        try:
            await waiter.event.wait()
        finally:
            if member.join is waiter:  # cancelled (the connection closed): the session timeout watches it
                member.join = None
                member.seen_s = trio.current_time()
                self._kick()
        return waiter.result

    def _joining_member(self, g: Group, member_id: str, instance_id: str | None, client_id: str,
                        client_host: str, require_known_member_id: bool, session_timeout_ms: int) -> Member:
        if member_id:
            member = g.members.get(member_id)
            if member is None:
                if member_id in g.pending:
                    del g.pending[member_id]
                    return Member(member_id, instance_id, client_id, client_host)
                if instance_id is not None and instance_id in g.static:
                    raise GroupError(E.FENCED_INSTANCE_ID, member_id)
                raise GroupError(E.UNKNOWN_MEMBER_ID, member_id)
            if instance_id is not None and g.static.get(instance_id) != member_id:
                raise GroupError(E.FENCED_INSTANCE_ID, member_id)
            return member
        new_id = f"{client_id or 'member'}-{uuid.uuid4()}"
        if instance_id is not None:
            old_id = g.static.get(instance_id)
            g.static[instance_id] = new_id
            old = g.members.pop(old_id, None) if old_id is not None else None
            member = Member(new_id, instance_id, client_id, client_host)
            if old is not None:  # the restarted instance takes the old member's place (KIP-345)
                member.protocols, member.protocol_type = old.protocols, old.protocol_type
                member.session_timeout_ms = old.session_timeout_ms
                member.assignment = old.assignment
                if old.join is not None:
                    old.join.settle(JoinResult(E.FENCED_INSTANCE_ID, member_id=old_id))
                if old.sync is not None:
                    old.sync.settle(E.FENCED_INSTANCE_ID)
                old.join = old.sync = None
                g.members[new_id] = member
                if g.leader == old_id:
                    g.leader = new_id
            return member
        if require_known_member_id:  # KIP-394: the client joins again with this id
            g.pending[new_id] = trio.current_time() + session_timeout_ms / 1000
            self._kick()
            raise GroupError(E.MEMBER_ID_REQUIRED, new_id)
        return Member(new_id, None, client_id, client_host)

    def _current(self, g: Group, member: Member) -> JoinResult:
        return JoinResult(E.NONE, g.generation, g.protocol_type, g.protocol, g.leader or "", member.member_id)

    def _prepare(self, g: Group) -> None:
        """Start a rebalance: members awaiting SyncGroup are told to rejoin."""
        for m in g.members.values():
            if m.sync is not None:
                m.sync.settle(E.REBALANCE_IN_PROGRESS)
                m.sync = None
        g.state = PREPARING
        now = trio.current_time()
        longest_ms = max((m.rebalance_timeout_ms for m in g.members.values()), default=0)
        g.rebalance_deadline_s = now + longest_ms / 1000
        self._kick()

    def _complete_join(self, g: Group) -> None:
        # members that did not rejoin in time are gone (static ones too, as in Kafka)
        for m in [m for m in g.members.values() if m.join is None]:
            self._remove(g, m, E.UNKNOWN_MEMBER_ID)
        g.rebalance_deadline_s = math.inf
        g.generation += 1
        if not g.members:
            g.state, g.protocol, g.protocol_type, g.leader = EMPTY, None, None, None
            return
        g.protocol_type = next(iter(g.members.values())).protocol_type
        g.protocol = self._vote(g)
        if g.leader not in g.members:
            g.leader = next(iter(g.members))
        g.state = COMPLETING
        now = trio.current_time()
        everyone = [(m.member_id, m.instance_id, m.metadata(g.protocol)) for m in g.members.values()]
        for m in g.members.values():
            result = JoinResult(E.NONE, g.generation, g.protocol_type, g.protocol, g.leader, m.member_id,
                                everyone if m.member_id == g.leader else [])
            waiter, m.join = m.join, None
            m.seen_s = now
            assert waiter is not None
            waiter.settle(result)
        self._kick()

    @staticmethod
    def _vote(g: Group) -> str:
        candidates = g.candidates()
        votes: dict[str, int] = {}
        order: list[str] = []
        for m in g.members.values():
            choice = next(name for name, _ in m.protocols if name in candidates)
            votes[choice] = votes.get(choice, 0) + 1
            if choice not in order:
                order.append(choice)
        return max(order, key=lambda name: votes[name])

    def _remove(self, g: Group, m: Member, code: int) -> None:
        g.members.pop(m.member_id, None)
        if m.instance_id is not None and g.static.get(m.instance_id) == m.member_id:
            del g.static[m.instance_id]
        for w in (m.join, m.sync):
            if w is not None:
                w.settle(JoinResult(code, member_id=m.member_id) if w is m.join else code)
        m.join = m.sync = None
        if g.leader == m.member_id:
            g.leader = next(iter(g.members), None)

    # -- SyncGroup, Heartbeat, LeaveGroup ----------------------------------------------------------------

    def _member(self, group_id: str, member_id: str, instance_id: str | None) -> tuple[Group, Member]:
        g = self.groups.get(group_id)
        if g is None:
            raise GroupError(E.UNKNOWN_MEMBER_ID)
        if g.state == DEAD:
            raise GroupError(E.COORDINATOR_NOT_AVAILABLE)
        if instance_id is not None and instance_id in g.static and g.static[instance_id] != member_id:
            raise GroupError(E.FENCED_INSTANCE_ID)
        m = g.members.get(member_id)
        if m is None:
            raise GroupError(E.UNKNOWN_MEMBER_ID)
        return g, m

    async def sync(self, group_id: str, generation: int, member_id: str, instance_id: str | None,
                   protocol_type: str | None, protocol: str | None,
                   assignments: dict[str, bytes]) -> tuple[int, str | None, str | None, bytes]:
        """A SyncGroup: ``(error, protocol type, protocol name, the member's assignment)``."""
        try:
            g, m = self._member(group_id, member_id, instance_id)
        except GroupError as e:
            return e.code, None, None, b""
        if generation != g.generation:
            return E.ILLEGAL_GENERATION, None, None, b""
        if (protocol_type is not None and protocol_type != g.protocol_type) or \
                (protocol is not None and protocol != g.protocol):
            return E.INCONSISTENT_GROUP_PROTOCOL, None, None, b""
        m.seen_s = trio.current_time()
        if g.state == PREPARING:
            return E.REBALANCE_IN_PROGRESS, None, None, b""
        if g.state == STABLE:
            return E.NONE, g.protocol_type, g.protocol, m.assignment
        assert g.state == COMPLETING, g.state
        if member_id == g.leader:
            for other in g.members.values():
                other.assignment = assignments.get(other.member_id, b"")
            g.state = STABLE
            for other in g.members.values():
                if other.sync is not None:
                    other.sync.settle(E.NONE)
                    other.sync = None
                other.seen_s = m.seen_s
            self._kick()
            return E.NONE, g.protocol_type, g.protocol, m.assignment
        waiter = Waiter()
        if m.sync is not None:
            m.sync.settle(E.REBALANCE_IN_PROGRESS)
        m.sync = waiter
        self._kick()
        try:
            await waiter.event.wait()
        finally:
            if m.sync is waiter:
                m.sync = None
                m.seen_s = trio.current_time()
                self._kick()
        if waiter.result != E.NONE:
            return waiter.result, None, None, b""
        return E.NONE, g.protocol_type, g.protocol, m.assignment

    def heartbeat(self, group_id: str, generation: int, member_id: str, instance_id: str | None) -> int:
        try:
            g, m = self._member(group_id, member_id, instance_id)
        except GroupError as e:
            return e.code
        if generation != g.generation:
            return E.ILLEGAL_GENERATION
        m.seen_s = trio.current_time()
        self._kick()
        return E.REBALANCE_IN_PROGRESS if g.state == PREPARING else E.NONE

    def leave(self, group_id: str, members: list[tuple[str, str | None]]) -> tuple[int, list[int]]:
        """LeaveGroup of ``(member id, instance id)`` pairs (an empty member id: by instance id):
        ``(error, each member's error)``."""
        g = self.groups.get(group_id)
        if g is None:
            return E.UNKNOWN_MEMBER_ID, [E.UNKNOWN_MEMBER_ID] * len(members)
        if g.state == DEAD:
            return E.COORDINATOR_NOT_AVAILABLE, []
        codes = []
        left = False
        for member_id, instance_id in members:
            if instance_id is not None:
                known = g.static.get(instance_id)
                if known is None:
                    codes.append(E.UNKNOWN_MEMBER_ID)
                    continue
                if member_id and member_id != known:
                    codes.append(E.FENCED_INSTANCE_ID)
                    continue
                member_id = known
            m = g.members.get(member_id)
            if m is None:
                g.pending.pop(member_id, None)
                codes.append(E.UNKNOWN_MEMBER_ID)
                continue
            self._remove(g, m, E.UNKNOWN_MEMBER_ID)
            left = True
            codes.append(E.NONE)
        if left:
            if g.state in (STABLE, COMPLETING):
                self._prepare(g)
            if g.state == PREPARING and g.all_joined():
                self._complete_join(g)
        self._kick()
        return E.NONE, codes

    # -- offsets: who may commit ---------------------------------------------------------

    def check_commit(self, group_id: str, generation: int, member_id: str, instance_id: str | None,
                     version: int) -> int:
        """Whether this member may commit offsets now with OffsetCommit ``version`` (Kafka's rules
        for a classic group: ``OffsetMetadataManager.validateOffsetCommit``)."""
        g = self.groups.get(group_id)
        if g is None or (g.state == EMPTY and not g.members):
            if generation < 0:
                return E.NONE  # a simple consumer (or an admin) commits for an empty or missing group
            if g is None and not (self.store is not None and self.store.has_group(group_id)):
                return E.GROUP_ID_NOT_FOUND if version >= 9 else E.ILLEGAL_GENERATION
            return E.UNKNOWN_MEMBER_ID
        if g.state == DEAD:
            return E.COORDINATOR_NOT_AVAILABLE
        if instance_id is not None and instance_id in g.static and g.static[instance_id] != member_id:
            return E.FENCED_INSTANCE_ID
        if g.state == COMPLETING:
            return E.REBALANCE_IN_PROGRESS
        m = g.members.get(member_id)
        if m is None:
            return E.UNKNOWN_MEMBER_ID
        if generation != g.generation:
            return E.ILLEGAL_GENERATION
        m.seen_s = trio.current_time()  # a commit is a sign of life, as in Kafka
        return E.NONE

    # -- administration ------------------------------------------------------------------

    def is_consumer_group(self, group_id: str) -> bool:
        """Whether ``group_id`` is a consumer group of the KIP-848 protocol with members now."""
        return self.consumer is not None and self.consumer.has_members(group_id)

    def has_members(self, group_id: str) -> bool:
        """Whether ``group_id`` is a classic group with members (or members joining)."""
        g = self.groups.get(group_id)
        return g is not None and bool(g.members or g.pending)

    def state_of(self, group_id: str) -> str:
        if self.is_consumer_group(group_id):
            return self.consumer.state_of(group_id)
        g = self.groups.get(group_id)
        if g is not None:
            return g.state
        return EMPTY if self.store is not None and self.store.has_group(group_id) else DEAD

    def group_ids(self) -> list[str]:
        known = {gid for gid, g in self.groups.items() if g.state != DEAD}
        if self.consumer is not None:
            known.update(self.consumer.groups)
        if self.store is not None:
            known.update(self.store.group_ids())
        return sorted(known)

    def delete(self, group_id: str) -> int:
        """DeleteGroups of one group: NON_EMPTY_GROUP while it has members."""
        g = self.groups.get(group_id)
        if (g is not None and g.members) or self.is_consumer_group(group_id):
            return E.NON_EMPTY_GROUP
        known = g is not None or (self.store is not None and self.store.has_group(group_id))
        if not known:
            return E.GROUP_ID_NOT_FOUND
        self.groups.pop(group_id, None)
        return E.NONE


# -- the consumer protocol's embedded messages (subscription, assignment) --------------------


def _string(data: bytes, at: int) -> tuple[str, int]:
    (n,) = struct.unpack_from(">h", data, at)
    at += 2
    if n < 0:
        return "", at
    return data[at:at + n].decode("utf-8", "replace"), at + n


def decode_subscription(data: bytes) -> list[str]:
    """The topics of a ConsumerProtocolSubscription (any version; [] if unreadable)."""
    try:
        at = 2
        (count,) = struct.unpack_from(">i", data, at)
        at += 4
        out = []
        for _ in range(max(count, 0)):
            name, at = _string(data, at)
            out.append(name)
        return out
    except (struct.error, IndexError):
        return []


def decode_assignment(data: bytes) -> dict[str, list[int]]:
    """The partitions of a ConsumerProtocolAssignment ({} if unreadable)."""
    try:
        at = 2
        (count,) = struct.unpack_from(">i", data, at)
        at += 4
        out: dict[str, list[int]] = {}
        for _ in range(max(count, 0)):
            name, at = _string(data, at)
            (n,) = struct.unpack_from(">i", data, at)
            at += 4
            out[name] = list(struct.unpack_from(f">{max(n, 0)}i", data, at))
            at += 4 * max(n, 0)
        return out
    except (struct.error, IndexError):
        return {}


def encode_subscription(topics: list[str]) -> bytes:
    """A ConsumerProtocolSubscription v0 of ``topics`` (no user data)."""
    out = bytearray(struct.pack(">hi", 0, len(topics)))
    for t in topics:
        b = t.encode("utf-8", "surrogateescape")
        out += struct.pack(">h", len(b)) + b
    out += struct.pack(">i", -1)
    return bytes(out)


def encode_assignment(assigned: dict[str, set[int]] | dict[str, list[int]]) -> bytes:
    """A ConsumerProtocolAssignment v0 of ``assigned`` (no user data)."""
    out = bytearray(struct.pack(">hi", 0, len(assigned)))
    for t, ps in sorted(assigned.items()):
        b = t.encode("utf-8", "surrogateescape")
        out += struct.pack(f">h{len(b)}si{len(ps)}i", len(b), b, len(ps), *sorted(ps))
    out += struct.pack(">i", -1)
    return bytes(out)
