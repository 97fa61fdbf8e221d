"""Share groups (KIP-932) on the Kafka port: membership and share sessions.

Owns:

- ``ShareGroups``: the share groups this node coordinates (one per server,
  ``KafkaFront.share_groups``): members, their subscriptions and epochs,
  and the server-side assignment, KIP-932's simple assignor at its
  simplest: every member is assigned every partition of the topics it
  subscribes to (members of a share group share partitions; each record
  goes to one member by acquisition). The group epoch goes up with every
  change of membership or assignment; a member's epoch is the group epoch
  of its last assignment, and a heartbeat with another epoch is
  FENCED_MEMBER_EPOCH (the member joins again). A member that does not
  heartbeat for ``SESSION_TIMEOUT_MS`` (Kafka's
  ``group.share.session.timeout.ms``) is removed when the group is next
  touched (``expire``: the caller releases what it held). A group with no
  members is forgotten (its records stay in the Redis groups).
- ``ShareSessions``: this node's share sessions (KIP-932's share fetch
  sessions: one per group and member): the partitions the member's
  ShareFetch requests cover, and the epoch the next request must carry (0
  opens a session, -1 closes it, any other must be the expected one: else
  INVALID_SHARE_SESSION_EPOCH, or SHARE_SESSION_NOT_FOUND). At most
  ``SESSIONS_MAX`` (SHARE_SESSION_LIMIT_REACHED beyond).

Time is ``now_s`` given by the caller (``trio.current_time()``), so the
unit tests drive it.

Must not know: the wire format, the records (they are Redis consumer
groups' entries: cluster/broker/shares.py), sockets.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

from server.kafka import errors as E

HEARTBEAT_INTERVAL_MS = 5000  # Kafka's group.share.heartbeat.interval.ms
SESSION_TIMEOUT_MS = 45000  # Kafka's group.share.session.timeout.ms
SESSIONS_MAX = 2000  # Kafka's group.share.max.share.sessions
ASSIGNOR = "simple"
EPOCH_MAX = 2**31 - 1

Assignment = dict[str, tuple[int, ...]]  # topic name -> partitions


class Member:
    """One member of a share group."""

    __slots__ = ("member_id", "epoch", "client_id", "client_host", "rack_id", "topics", "assigned", "deadline_s")

    def __init__(self, member_id: str, client_id: str, client_host: str) -> None:
        self.member_id = member_id
        self.epoch = 0
        self.client_id = client_id
        self.client_host = client_host
        self.rack_id: str | None = None
        self.topics: list[str] = []
        self.assigned: Assignment = {}
        self.deadline_s = 0.0


class ShareGroup:
    """A share group: its epoch and members (in joining order)."""

    __slots__ = ("group_id", "epoch", "members")

    def __init__(self, group_id: str) -> None:
        self.group_id = group_id
        self.epoch = 0
        self.members: dict[str, Member] = {}


class Beat(NamedTuple):
    """A heartbeat's answer: ``error`` (``E.NONE``), the member's epoch
    (-1 once it left) and its assignment when it changed (else None)."""

    error: int
    member_epoch: int
    assignment: Assignment | None
    message: str | None = None


def _next_epoch(epoch: int) -> int:
    return epoch + 1 if epoch < EPOCH_MAX else 1


class ShareGroups:
    """The share groups this node coordinates (module docstring)."""

    def __init__(self, session_timeout_ms: int = SESSION_TIMEOUT_MS) -> None:
        self.session_timeout_ms = session_timeout_ms
        self.groups: dict[str, ShareGroup] = {}

    def expire(self, now_s: float) -> list[tuple[str, Member]]:
        """Remove members whose session expired: ``(group id, member)`` each,
        for the caller to release what they held."""
        gone = []
        for group in list(self.groups.values()):
            for member in list(group.members.values()):
                if member.deadline_s <= now_s:
                    gone.append((group.group_id, member))
                    self._remove(group, member.member_id)
        return gone

    def _remove(self, group: ShareGroup, member_id: str) -> Member | None:
        member = group.members.pop(member_id, None)
        if member is not None:
            group.epoch = _next_epoch(group.epoch)
            if not group.members:
                del self.groups[group.group_id]
        return member

    def heartbeat(self, group_id: str, member_id: str, member_epoch: int, topics: Sequence[str] | None,
                  partitions_of: Callable[[str], int | None], now_s: float, *, client_id: str = "",
                  client_host: str = "", rack_id: str | None = None) -> tuple[Beat, Member | None]:
        """One ShareGroupHeartbeat: ``member_epoch`` 0 joins, -1 leaves, else
        the member's current epoch; ``topics``: its subscription (None:
        unchanged); ``partitions_of(topic)``: a topic's partition count
        (None: no such topic, or one the member may not read). Returns the
        answer and the member (the one that left, for epoch -1)."""
        if not member_id:
            return Beat(E.INVALID_REQUEST, 0, None, "MemberId can't be empty."), None
        if member_epoch < -1:
            return Beat(E.INVALID_REQUEST, 0, None, f"MemberEpoch is invalid: {member_epoch}."), None
        group = self.groups.get(group_id)
        member = group.members.get(member_id) if group is not None else None
        if member_epoch == -1:
            if member is None:
                return Beat(E.UNKNOWN_MEMBER_ID, -1, None), None
            self._remove(group, member_id)
            return Beat(E.NONE, -1, None), member
        if member_epoch == 0:
            if not topics and (member is None or not member.topics):
                return Beat(E.INVALID_REQUEST, 0, None, "SubscribedTopicNames must be set in first request."), None
            if group is None:
                group = self.groups[group_id] = ShareGroup(group_id)
            if member is None:
                member = group.members[member_id] = Member(member_id, client_id, client_host)
                group.epoch = _next_epoch(group.epoch)
            member.epoch = 0  # (re)joining: the whole assignment is sent
            member.assigned = {}
        elif member is None:
            return Beat(E.UNKNOWN_MEMBER_ID, 0, None, f"Member {member_id} is not a member of group {group_id}."), \
                None
        elif member_epoch != member.epoch:
            return Beat(E.FENCED_MEMBER_EPOCH, 0, None,
                        f"The share group member has a member epoch ({member_epoch}) different from the "
                        f"one the coordinator expects ({member.epoch})."), None
        if topics is not None and list(topics) != member.topics:
            member.topics = list(topics)
        if rack_id is not None:
            member.rack_id = rack_id
        member.deadline_s = now_s + self.session_timeout_ms / 1000
        assignment: Assignment = {}
        for name in member.topics:
            count = partitions_of(name)
            if count:
                assignment[name] = tuple(range(count))
        if assignment == member.assigned and member.epoch:
            return Beat(E.NONE, member.epoch, None), member
        group.epoch = _next_epoch(group.epoch)
        member.epoch = group.epoch
        member.assigned = assignment
        return Beat(E.NONE, member.epoch, assignment), member


class ShareSession:
    """One member's share session: its partitions (``(topic id, index)`` in
    the order added) and the epoch its next request must carry."""

    __slots__ = ("partitions", "epoch")

    def __init__(self) -> None:
        self.partitions: dict[tuple, None] = {}
        self.epoch = 1


class ShareSessions:
    """This node's share sessions (module docstring)."""

    def __init__(self, max_sessions: int = SESSIONS_MAX) -> None:
        self.max_sessions = max_sessions
        self._sessions: dict[tuple[str, str], ShareSession] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def begin(self, group_id: str, member_id: str, epoch: int) -> tuple[int, ShareSession | None]:
        """The session a request at ``epoch`` works on: ``(E.NONE, session)``,
        or ``(error, None)``. Epoch 0 opens a new one (replacing the
        member's); -1 is the member's (to close after its
        acknowledgements: ``close``); another must be the expected one,
        after which the next is expected."""
        key = (group_id, member_id)
        session = self._sessions.get(key)
        if epoch == 0:
            if session is None and len(self._sessions) >= self.max_sessions:
                return E.SHARE_SESSION_LIMIT_REACHED, None
            session = self._sessions[key] = ShareSession()
            return E.NONE, session
        if session is None:
            return E.SHARE_SESSION_NOT_FOUND, None
        if epoch == -1:
            return E.NONE, session
        if epoch != session.epoch:
            return E.INVALID_SHARE_SESSION_EPOCH, None
        session.epoch = _next_epoch(epoch)
        return E.NONE, session

    def close(self, group_id: str, member_id: str) -> ShareSession | None:
        return self._sessions.pop((group_id, member_id), None)
