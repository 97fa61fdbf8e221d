"""Kafka's consumer group protocol (KIP-848): server-side assignment and incremental reconciliation, on trio.

Owns: ``ConsumerCoordinator`` (one per server, ``KafkaFront.consumer_groups``):
every group of type ``consumer`` this node coordinates, its members, epochs
and assignments, and the timer that removes members whose session passed.
Membership lives in memory, as the classic groups' does (a new coordinator
after a failover starts with no members: they find it and join again, with
their committed offsets read from the group's offsets stream).

The protocol, as Kafka's ``GroupMetadataManager`` serves it:

- a member heartbeats (``heartbeat``) with its member epoch: 0 to join, its
  current epoch after, -1 to leave, -2 for a static member leaving for a
  while; with its subscription (topic names, or a regex fully matching topic
  names), its server assignor (``uniform``, the default, or ``range``) and
  the partitions it owns (null: unchanged since the last heartbeat);
- the group epoch goes up when the members or their subscriptions change,
  or a subscribed topic gains partitions; the target assignment is then
  computed at once by the group's assignor (the one most members name) and
  takes the group epoch as its assignment epoch;
- each member reconciles towards its target: partitions it owns that left
  its target are revoked first (its epoch stays, and the heartbeat's
  assignment no longer has them); once a heartbeat shows them released, the
  member takes the target epoch and gets its target minus the partitions
  other members still hold (those come in a later heartbeat, once freed);
- a member epoch from the past is FENCED_MEMBER_EPOCH (except the previous
  epoch with owned partitions within the current assignment: a response
  the member lost); a member not revoking within its rebalance timeout, or
  silent for the session timeout, is removed and its partitions reassigned;
- static members (instance id): a second live member with the same
  instance id is UNRELEASED_INSTANCE_ID; one that left with -2 keeps its
  assignment for the session timeout, and the instance joining again takes
  it over with its epoch.

Offsets: ``check_commit`` and ``check_fetch`` hold OffsetCommit/OffsetFetch
v9+ to the member epoch (STALE_MEMBER_EPOCH). Time: ``trio.current_time()``.

Must not know: the wire format (topic IDs are the API module's: topics are
named here), sockets, the disk, the classic protocol (``groups`` consults
this module to keep the two kinds of groups apart).
"""

from __future__ import annotations

import math
import re
import uuid
from typing import Any, Mapping

import trio

from server.kafka import errors as E
from server.kafka_front.deadlines import DeadlineTimer

EMPTY = "Empty"
ASSIGNING = "Assigning"
RECONCILING = "Reconciling"
STABLE = "Stable"

UNIFORM = "uniform"
RANGE = "range"
ASSIGNORS = (UNIFORM, RANGE)  # the first is the default (group.consumer.assignors)

SESSION_TIMEOUT_MS = 45000
HEARTBEAT_INTERVAL_MS = 5000
LEAVE = -1
LEAVE_STATIC = -2
MAX_MEMBERS = 1000  # an arbitrary limit on a group's members (group.consumer.max.size is unbounded)

Assignment = dict[str, set[int]]  # topic name -> partitions


class HeartbeatError(Exception):
    """A refusal: ``code`` is Kafka's error, ``message`` its explanation."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Heartbeat:
    """What a ConsumerGroupHeartbeat is answered: ``assignment`` None when it did not change."""

    __slots__ = ("member_id", "member_epoch", "assignment")

    def __init__(self, member_id: str, member_epoch: int, assignment: Assignment | None) -> None:
        self.member_id = member_id
        self.member_epoch = member_epoch
        self.assignment = assignment


class Member:
    __slots__ = ("member_id", "instance_id", "rack_id", "client_id", "client_host", "epoch", "previous_epoch",
                 "names", "regex", "assignor", "rebalance_timeout_ms", "seen_s", "assigned", "revoking",
                 "revoke_deadline_s", "left_static")

    def __init__(self, member_id: str, client_id: str, client_host: str) -> None:
        self.member_id = member_id
        self.instance_id: str | None = None
        self.rack_id: str | None = None
        self.client_id = client_id
        self.client_host = client_host
        self.epoch = 0
        self.previous_epoch = 0
        self.names: list[str] = []
        self.regex: str | None = None
        self.assignor: str | None = None
        self.rebalance_timeout_ms = 0
        self.seen_s = trio.current_time()
        self.assigned: Assignment = {}  # the partitions it may consume now
        self.revoking: Assignment = {}  # the partitions it must release (still its own until it does)
        self.revoke_deadline_s = math.inf
        self.left_static = False  # left with epoch -2: kept for the session timeout

    def subscribes(self, topic: str) -> bool:
        return topic in self.names or (self.regex is not None and re.fullmatch(self.regex, topic) is not None)

    def expiry_s(self, session_timeout_ms: int) -> float:
        return min(self.seen_s + session_timeout_ms / 1000, self.revoke_deadline_s)


class Group:
    def __init__(self, group_id: str) -> None:
        self.group_id = group_id
        self.epoch = 0
        self.assignment_epoch = 0
        self.members: dict[str, Member] = {}
        self.static: dict[str, str] = {}  # instance id -> member id
        self.target: dict[str, Assignment] = {}
        self.partitions: dict[str, int] = {}  # subscribed topic -> partition count, as last assigned
        self.assignor = ASSIGNORS[0]

    @property
    def state(self) -> str:
        if not self.members:
            return EMPTY
        if self.assignment_epoch < self.epoch:
            return ASSIGNING
        if any(m.epoch != self.assignment_epoch or m.revoking or m.assigned != self.target.get(mid, {})
               for mid, m in self.members.items()):
            return RECONCILING
        return STABLE

    def owner(self, topic: str, partition: int) -> str | None:
        for m in self.members.values():
            if partition in m.assigned.get(topic, ()) or partition in m.revoking.get(topic, ()):
                return m.member_id
        return None


def _copy(a: Mapping[str, set[int]]) -> Assignment:
    return {t: set(ps) for t, ps in a.items() if ps}


def _within(small: Mapping[str, set[int]], big: Mapping[str, set[int]]) -> bool:
    return all(ps <= big.get(t, set()) for t, ps in small.items())


# -- the assignors ----------------------------------------------------------------------------


def assign_range(members: Mapping[str, Member], partitions: Mapping[str, int]) -> dict[str, Assignment]:
    """Kafka's range assignor: per topic, its subscribers sorted by member id take contiguous ranges,
    the first ``n % m`` one more."""
    out: dict[str, Assignment] = {mid: {} for mid in members}
    for topic in sorted(partitions):
        subs = sorted(mid for mid, m in members.items() if m.subscribes(topic))
        if not subs:
            continue
        n = partitions[topic]
        each, extra = divmod(n, len(subs))
        start = 0
        for i, mid in enumerate(subs):
            size = each + (1 if i < extra else 0)
            if size:
                out[mid][topic] = set(range(start, start + size))
            start += size
    return out


def assign_uniform(members: Mapping[str, Member], partitions: Mapping[str, int],
                   current: Mapping[str, Assignment]) -> dict[str, Assignment]:
    """Kafka's uniform assignor: every subscribed partition to one subscriber, each member's count
    as even as the subscriptions allow, partitions staying where they are when they may (sticky)."""
    eligible = {t: sorted(mid for mid, m in members.items() if m.subscribes(t)) for t in partitions}
    # the topics with the fewest subscribers first, so that the others balance around them
    todo = sorted(((t, p) for t in partitions if eligible[t] for p in range(partitions[t])),
                  key=lambda tp: (len(eligible[tp[0]]), tp))
    quota = {mid: 0 for mid in members}  # the counts a fresh balanced assignment gives
    for t, _ in todo:
        best = min(eligible[t], key=lambda mid: (quota[mid], mid))
        quota[best] += 1
    out: dict[str, Assignment] = {mid: {} for mid in members}
    count = {mid: 0 for mid in members}
    free = []
    for t, p in todo:
        keeper = next((mid for mid in eligible[t] if p in current.get(mid, {}).get(t, ())), None)
        if keeper is not None and count[keeper] < quota[keeper]:
            out[keeper].setdefault(t, set()).add(p)
            count[keeper] += 1
        else:
            free.append((t, p))
    for t, p in free:
        best = min(eligible[t], key=lambda mid: (count[mid] - quota[mid], count[mid], mid))
        out[best].setdefault(t, set()).add(p)
        count[best] += 1
    return out


# -- the coordinator --------------------------------------------------------------------------


class ConsumerCoordinator(DeadlineTimer):
    """Every consumer group this node coordinates (module docstring); ``run``: the task removing
    members whose session or revocation deadline passed."""

    def __init__(self, config: Any = None) -> None:
        super().__init__()
        self.groups: dict[str, Group] = {}
        self.config = config  # kafka-consumer-session-timeout-ms, kafka-consumer-heartbeat-interval-ms

    @property
    def session_timeout_ms(self) -> int:  # Kafka's group.consumer.session.timeout.ms
        return getattr(self.config, "kafka_consumer_session_timeout_ms", SESSION_TIMEOUT_MS)

    @property
    def heartbeat_interval_ms(self) -> int:  # group.consumer.heartbeat.interval.ms
        return getattr(self.config, "kafka_consumer_heartbeat_interval_ms", HEARTBEAT_INTERVAL_MS)

    # -- the deadlines ---------------------------------------------------------------------

    def _next_deadline(self) -> float:
        return min((m.expiry_s(self.session_timeout_ms) for g in self.groups.values() for m in g.members.values()),
                   default=math.inf)

    def expire(self, now_s: float) -> None:
        for g in list(self.groups.values()):
            gone = [m for m in g.members.values() if m.expiry_s(self.session_timeout_ms) <= now_s]
            for m in gone:
                self._remove(g, m)
            if gone:
                self._bump(g, None)

    # -- what other modules ask ------------------------------------------------------------

    def has_members(self, group_id: str) -> bool:
        g = self.groups.get(group_id)
        return g is not None and bool(g.members)

    def state_of(self, group_id: str) -> str | None:
        g = self.groups.get(group_id)
        return g.state if g is not None else None

    # -- ConsumerGroupHeartbeat ------------------------------------------------------------

    def heartbeat(self, group_id: str, member_id: str, member_epoch: int, instance_id: str | None,
                  rack_id: str | None, rebalance_timeout_ms: int, names: list[str] | None, regex: str | None,
                  assignor: str | None, owned: Assignment | None, topics: Mapping[str, int],
                  client_id: str = "", client_host: str = "") -> Heartbeat:
        """One heartbeat (module docstring); ``topics``: every topic's partition count now;
        ``owned`` None: unchanged. Raises ``HeartbeatError``."""
        if assignor is not None and assignor not in ASSIGNORS:
            raise HeartbeatError(E.UNSUPPORTED_ASSIGNOR, f"ServerAssignor {assignor} is not supported. "
                                 f"Supported assignors: {', '.join(ASSIGNORS)}.")
        if regex is not None:
            try:
                re.compile(regex)
            except re.error as exc:
                raise HeartbeatError(E.INVALID_REGULAR_EXPRESSION, f"SubscribedTopicRegex {regex} is not a "
                                     f"valid regular expression: {exc}.") from None
        if member_epoch in (LEAVE, LEAVE_STATIC):
            return self._leave(group_id, member_id, member_epoch, instance_id)
        g = self.groups.get(group_id)
        if g is None:
            if member_epoch != 0:
                raise HeartbeatError(E.GROUP_ID_NOT_FOUND, f"Group {group_id} not found.")
            g = self.groups[group_id] = Group(group_id)
        full = member_epoch == 0 or (rebalance_timeout_ms != -1 and names is not None and owned is not None)
        if member_epoch == 0:
            m = self._joining(g, member_id, instance_id, client_id, client_host)
        else:
            m = g.members.get(member_id)
            if m is None:
                raise HeartbeatError(E.UNKNOWN_MEMBER_ID, f"Member {member_id} is not a member of group {group_id}.")
            if instance_id is not None and g.static.get(instance_id) != member_id:
                raise HeartbeatError(E.FENCED_INSTANCE_ID, f"Instance {instance_id} is not member {member_id}.")
            self._check_epoch(m, member_epoch, owned)
            m.left_static = False
        before = (_copy(m.assigned), m.epoch)
        m.seen_s = trio.current_time()
        changed = False
        if rack_id is not None:
            m.rack_id = rack_id
        if rebalance_timeout_ms != -1:
            m.rebalance_timeout_ms = rebalance_timeout_ms
        if names is not None and sorted(set(names)) != sorted(m.names):
            m.names, changed = sorted(set(names)), True
        if regex is not None and (regex or None) != m.regex:
            m.regex, changed = regex or None, True
        if assignor is not None and assignor != m.assignor:
            m.assignor, changed = assignor, True
        if m.member_id not in g.members:
            if len(g.members) >= MAX_MEMBERS:
                raise HeartbeatError(E.GROUP_MAX_SIZE_REACHED, f"The consumer group has reached its maximum "
                                     f"capacity of {MAX_MEMBERS} members.")
            g.members[m.member_id] = m
            if m.instance_id is not None:
                g.static[m.instance_id] = m.member_id
            changed = True
        self._bump(g, topics, force=changed)
        self._reconcile(g, m, owned)
        self._kick()
        after = (_copy(m.assigned), m.epoch)
        resend = full or after != before or member_epoch != m.epoch  # (a lost response: the epoch behind)
        return Heartbeat(m.member_id, m.epoch, _copy(m.assigned) if resend else None)

    def _joining(self, g: Group, member_id: str, instance_id: str | None, client_id: str,
                 client_host: str) -> Member:
        if not member_id:
            member_id = str(uuid.uuid4())  # v0: the coordinator names the member
        if instance_id is not None:
            old_id = g.static.get(instance_id)
            old = g.members.get(old_id) if old_id is not None else None
            if old is not None and old_id != member_id:
                if not old.left_static:
                    raise HeartbeatError(E.UNRELEASED_INSTANCE_ID, f"Static member {old_id} with instance id "
                                         f"{instance_id} is still in the group: it must leave first.")
                m = Member(member_id, client_id, client_host)  # takes the static member's place and assignment
                for name in ("names", "regex", "assignor", "rebalance_timeout_ms", "assigned", "revoking",
                             "revoke_deadline_s", "epoch", "previous_epoch", "rack_id"):
                    setattr(m, name, getattr(old, name))
                m.instance_id = instance_id
                del g.members[old_id]
                g.members[member_id] = m
                g.static[instance_id] = member_id
                g.target[member_id] = g.target.pop(old_id, {})
                return m
        m = g.members.get(member_id)
        if m is None:
            m = Member(member_id, client_id, client_host)
        else:  # rejoining with epoch 0: it gave up every partition it had
            m.assigned, m.revoking, m.revoke_deadline_s = {}, {}, math.inf
            m.epoch = m.previous_epoch = 0
            m.left_static = False
        m.instance_id = instance_id
        m.client_id, m.client_host = client_id, client_host
        return m

    @staticmethod
    def _check_epoch(m: Member, epoch: int, owned: Assignment | None) -> None:
        if epoch > m.epoch or (epoch < m.epoch and (epoch != m.previous_epoch or owned is None
                                                    or not _within(owned, m.assigned))):
            raise HeartbeatError(E.FENCED_MEMBER_EPOCH, f"The consumer group member has a member epoch "
                                 f"({epoch}) which is not the current one ({m.epoch}).")

    def _leave(self, group_id: str, member_id: str, epoch: int, instance_id: str | None) -> Heartbeat:
        g = self.groups.get(group_id)
        if g is None:
            raise HeartbeatError(E.GROUP_ID_NOT_FOUND, f"Group {group_id} not found.")
        if epoch == LEAVE_STATIC:
            if instance_id is None:
                raise HeartbeatError(E.INVALID_REQUEST, "InstanceId can't be null when MemberEpoch is -2.")
            m = g.members.get(g.static.get(instance_id, ""))
            if m is None:
                raise HeartbeatError(E.UNKNOWN_MEMBER_ID, f"Instance {instance_id} is not a member of group "
                                     f"{group_id}.")
            if m.member_id != member_id:
                raise HeartbeatError(E.FENCED_INSTANCE_ID, f"Instance {instance_id} is not member {member_id}.")
            m.left_static = True  # keeps its partitions until its session passes, or the instance returns
            m.seen_s = trio.current_time()
            self._kick()
            return Heartbeat(member_id, LEAVE_STATIC, None)
        m = g.members.get(member_id)
        if m is None:
            raise HeartbeatError(E.UNKNOWN_MEMBER_ID, f"Member {member_id} is not a member of group {group_id}.")
        self._remove(g, m)
        self._bump(g, None)
        self._kick()
        return Heartbeat(member_id, LEAVE, None)

    def _remove(self, g: Group, m: Member) -> None:
        g.members.pop(m.member_id, None)
        g.target.pop(m.member_id, None)
        if m.instance_id is not None and g.static.get(m.instance_id) == m.member_id:
            del g.static[m.instance_id]
        if not g.members:
            del self.groups[g.group_id]  # its committed offsets stay (the offset store's)

    # -- the group epoch and the target assignment -----------------------------------------

    def _bump(self, g: Group, topics: Mapping[str, int] | None, force: bool = True) -> None:
        """A new group epoch and target assignment if the members, their subscriptions or the
        subscribed topics' partitions changed (``topics`` None: the partitions as last seen)."""
        if g.group_id not in self.groups:
            return
        known = g.partitions if topics is None else topics
        partitions = {t: n for t, n in known.items() if any(m.subscribes(t) for m in g.members.values())}
        votes: dict[str, int] = {}
        for m in g.members.values():
            if m.assignor is not None:
                votes[m.assignor] = votes.get(m.assignor, 0) + 1
        assignor = max(ASSIGNORS, key=lambda a: (votes.get(a, 0), -ASSIGNORS.index(a)))
        if not force and partitions == g.partitions and assignor == g.assignor:
            return
        g.epoch += 1
        g.partitions, g.assignor = partitions, assignor
        if assignor == RANGE:
            g.target = assign_range(g.members, partitions)
        else:
            g.target = assign_uniform(g.members, partitions, g.target)  # sticky to the previous target
        g.assignment_epoch = g.epoch
        # members whose assignment now runs ahead of the target revoke on their next heartbeat

    def _reconcile(self, g: Group, m: Member, owned: Assignment | None) -> None:
        """Move ``m`` towards its target (Kafka's CurrentAssignmentBuilder); ``owned``: what
        this heartbeat says it owns (None: not said)."""
        if m.revoking:
            if owned is None or any(ps & owned.get(t, set()) for t, ps in m.revoking.items()):
                return  # not yet shown to have released them
            m.revoking, m.revoke_deadline_s = {}, math.inf
        target = g.target.get(m.member_id, {})
        if m.epoch == g.assignment_epoch and _within(target, m.assigned) and _within(m.assigned, target):
            return
        keep: Assignment = {}
        revoke: Assignment = {}
        for t, ps in m.assigned.items():
            wanted = target.get(t, set())
            if ps & wanted:
                keep[t] = ps & wanted
            if ps - wanted:
                revoke[t] = ps - wanted
        if revoke:  # first release what moves away: the epoch stays until the member shows it did
            m.assigned, m.revoking = keep, revoke
            m.revoke_deadline_s = trio.current_time() + max(m.rebalance_timeout_ms, 0) / 1000
            return
        for t, ps in target.items():
            for p in ps - keep.get(t, set()):
                if g.owner(t, p) in (None, m.member_id):
                    keep.setdefault(t, set()).add(p)
        m.assigned = keep
        if m.epoch != g.assignment_epoch:
            m.previous_epoch, m.epoch = m.epoch, g.assignment_epoch

    # -- offsets ----------------------------------------------------------------------------

    def check_commit(self, group_id: str, member_id: str, member_epoch: int, api_version: int) -> int:
        """Whether this member may commit now: the member of the current epoch (OffsetCommit v9+)."""
        g = self.groups.get(group_id)
        if g is None or not g.members:
            return E.NONE if member_epoch < 0 else E.UNKNOWN_MEMBER_ID
        m = g.members.get(member_id)
        if m is None:
            return E.UNKNOWN_MEMBER_ID
        if api_version < 9:
            return E.UNSUPPORTED_VERSION
        if member_epoch != m.epoch:
            return E.STALE_MEMBER_EPOCH
        return E.NONE

    def check_fetch(self, group_id: str, member_id: str | None, member_epoch: int) -> int:
        """Whether an OffsetFetch v9+ naming a member may read (no member id: an admin reads)."""
        if member_id is None or (not member_id and member_epoch < 0):
            return E.NONE
        g = self.groups.get(group_id)
        m = g.members.get(member_id) if g is not None else None
        if m is None:
            return E.UNKNOWN_MEMBER_ID
        if member_epoch != m.epoch:
            return E.STALE_MEMBER_EPOCH
        return E.NONE
