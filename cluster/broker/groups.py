"""Consumer groups: every group operation of a session (``GroupOps``).

Owns: what XGROUP (CREATE with MKSTREAM / ENTRIESREAD and Partita's
MAXDELIVERIES / DEADLETTER, SETID, DESTROY, CREATECONSUMER, DELCONSUMER,
CONFIG), XREADGROUP, XACK, XNACK, XCLAIM, XAUTOCLAIM, XPENDING and the group
parts of XINFO do to the group state, whoever parsed them (XACKDEL and the
deletions that mind the groups are ``cluster.broker.references``'):

- delivery (``read_group`` / ``read_group_nowait``): new entries after the
  group's last-delivered-id (into the consumer's PEL unless NOACK), with
  CLAIM (Redis 8.4) the group's idle pending entries first, longest idle
  first (``ConsumerGroup.idle_pending``), within MAXCOUNT / MAXSIZE over the
  keys (Redis 8.10, ``cluster.broker.budget``), the
  history of a consumer's own PEL, dead-lettering past MAXDELIVERIES, and on
  a multi-partition topic key the membership: the reader joins (or
  heartbeats), gets the partitions assigned to it, and first the entries
  handed over to it from a dead or departed member (delivery count +1);
  ``cluster.membership`` and ``cluster.coordinator`` decide, this module
  applies (in a cluster, for partitions other nodes lead, through their
  leaders: ``cluster.broker.topic_groups``). A read that finds nothing and
  may wait waits for its keys and serves again, readers of one partition's
  group in arrival order (the longest-waiting one gets new entries first,
  as in Redis);
- the claim / dead-letter policy (XCLAIM, XAUTOCLAIM, history reads, CLAIM);
- XNACK (Redis 8.8): pending entries released, with no owner and delivery
  time 0, so that any claim takes them, and first;
- ``reject``: pending entries given up on (a Kafka share consumer's REJECT):
  dead-lettered, or acknowledged when the group has no dead-letter stream;
- a group command on a topic key: the same command on every partition;
  in a cluster (run by the topic's group coordinator), XGROUP of a topic
  whose partitions other nodes lead sends each such partition's command to
  its leader (``GroupRequest`` through ``Forwarder.forward``, all at once)
  and returns the awaitable of the combined answer (``_each_partition_led``;
  DELCONSUMER's, which moves the member's partitions first:
  ``cluster.broker.topic_groups``);
- a topic's group views (XINFO GROUPS / CONSUMERS, TOPIC GROUPS): the facts
  of each partition's groups (``partition_groups``) and of each group's
  membership (``membership_of``), merged by the one merge (``topic_views``,
  ``topic_group_infos``, ``topic_consumer_infos``), whether one node
  gathered them or, in a cluster, the partitions' leaders and the
  coordinator sent them (``cluster.broker.topic_groups``: then the
  operation returns the awaitable of the merge).

Every group write is noted here (``wrote_group`` / ``wrote_log``, and the
keys it changes are signalled), so a front-end's reply waits for what its
command wrote.

Returns plain values: entries as the storage's stored chunks (a front-end
frames them itself, e.g. the RESP one as ``Raw(count, chunks)``), pending
entries as tuples, infos as the dataclasses below. Refuses with codes
(``GroupOpError`` below, the store's ``GroupError``, ``StreamIdError``).
Where Redis checks an argument only after it found the key and the group, a
front-end passes its refusal of that argument (``late``; per key for
XREADGROUP) and the operation raises it at that point, so the errors come in
Redis's order while the parsing stays in the front-end.

Must not know: sockets, RESP or any protocol's shapes, error texts, how the
arguments were spelled.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Callable, Sequence

import trio

from cluster.broker.budget import ReadBudget
from cluster.errors import ClusterError, Refused
from cluster.peer.messages import GroupInfoResponse, GroupRequest, GroupResponse, Membership, PartGroup
from cluster.topics import TopicError, partition_key, split_partition_key
from storage.entry_codec import decode_entry, split_entries
from storage.errors import Refusal
from storage.streams.groups import (
    GROUP_EXISTS,
    LLONG_MAX,
    MAX_ID,
    ZERO_ID,
    ConsumerGroup,
    GroupError,
    GroupStore,
    check_dead_letter,
    count_after,
    entries_read_after,
    group_lag,
    groups_of,
)
from storage.streams.ids import format_id

StreamIdT = tuple[int, int]

# What a group operation refuses (``GroupOpError.code``, with the fields
# named); the texts clients see are the front-end's (server/failures.py).
KEY_MISSING = "group-key-missing"  # key: XGROUP of a key that does not exist (no MKSTREAM)
NO_SUCH_KEY = "group-info-no-key"  # key: XINFO GROUPS / CONSUMERS of a key that does not exist
NO_KEY_OR_GROUP = "no-key-or-group"  # key, group: XPENDING, XCLAIM, XAUTOCLAIM
NO_GROUP_FOR_KEY = "no-group-for-key"  # key, group: XGROUP, XINFO CONSUMERS, a topic's group views
NO_GROUP_TO_READ = "no-group-to-read"  # key, group: XREADGROUP
DEAD_LETTER_IS_SOURCE = "dead-letter-is-source"  # the dead-letter key is the group's own key

# XNACK's modes (what becomes of a released entry's delivery count).
NACK_SILENT = "SILENT"  # one less (the delivery did not count), never below 0
NACK_FAIL = "FAIL"  # kept
NACK_FATAL = "FATAL"  # LLONG_MAX: never to be tried again
NACK_MODES = (NACK_SILENT, NACK_FAIL, NACK_FATAL)

# Fields appended to a dead-lettered entry after its own fields.
DL_SOURCE_KEY = b"dl-source-key"
DL_SOURCE_ID = b"dl-source-id"
DL_GROUP = b"dl-group"
DL_CONSUMER = b"dl-consumer"
DL_DELIVERIES = b"dl-deliveries"


class GroupOpError(Refusal):
    """A group operation refused; ``code`` is one of the constants above."""


# ------------------------------------------------------------------ values


class GroupRead:
    """One XREADGROUP: ``group``, ``consumer``, and per key of ``keys`` its
    start in ``starts``: None for ``>`` (new entries), a stream ID for the
    consumer's pending entries after it, or an exception: the front-end's
    refusal of that key's ID, raised once the key's group is found (Redis
    checks in that order). ``count`` 0: no limit; ``block_ms`` None: never
    wait (0: wait forever); ``view``: entries read from the log may be views
    of its mapping (``Delivery.views`` then says which). ``claim_ms``
    (Redis 8.4's CLAIM): a ``>`` key first serves the group's pending
    entries idle that long (``Delivery.claims``); ``max_count`` /
    ``max_size`` (Redis 8.10's MAXCOUNT / MAXSIZE, 0: none) cap the whole
    reply over the keys in order (``cluster.broker.budget``)."""

    __slots__ = ("group", "consumer", "keys", "starts", "count", "noack", "block_ms", "view", "claim_ms",
                 "max_count", "max_size")

    def __init__(self, group: bytes, consumer: bytes, keys: Sequence[bytes], starts: Sequence[Any],
                 count: int = 0, noack: bool = False, block_ms: int | None = None, view: bool = False,
                 claim_ms: int | None = None, max_count: int = 0, max_size: int = 0) -> None:
        assert len(keys) == len(starts)
        self.group = group
        self.consumer = consumer
        self.keys = keys
        self.starts = starts
        self.count = count
        self.noack = noack
        self.block_ms = block_ms
        self.view = view
        self.claim_ms = claim_ms
        self.max_count = max_count
        self.max_size = max_size


class Delivery:
    """What one key (a partition key, for a topic) gives a read: ``count``
    entries whose stored chunks, concatenated, are ``chunks``. ``views``:
    some chunks are views of a log's mapping (send them before anything
    awaits, or copy them). ``gone``: some chunks are ``(ms, seq)`` tuples,
    pending entries no longer in the stream (Redis replies ``[id, nil]``).
    ``claims``: for a read with CLAIM, one chunk per entry and, per entry,
    ``(ms idle, times delivered before)`` (-1 idle: released by XNACK; new
    entries ``(0, 0)``), which Redis appends to each entry of such a read."""

    __slots__ = ("key", "count", "chunks", "views", "gone", "claims")

    def __init__(self, key: bytes, count: int, chunks: list, views: bool = False, gone: bool = False,
                 claims: list[tuple[int, int]] | None = None) -> None:
        self.key = key
        self.count = count
        self.chunks = chunks
        self.views = views
        self.gone = gone
        self.claims = claims


@dataclass(slots=True)
class PendingSummary:
    """XPENDING key group: ``count`` pending, the lowest and highest ID
    (None when none), and ``(consumer, pending)`` for consumers with any."""

    count: int
    first: StreamIdT | None
    last: StreamIdT | None
    consumers: list[tuple[bytes, int]]


@dataclass(slots=True)
class GroupInfo:
    """XINFO GROUPS of one partition: one group (``max_deliveries`` 0: no dead-lettering)."""

    name: bytes
    consumers: int
    pending: int
    last_id: StreamIdT
    entries_read: int | None
    lag: int | None
    max_deliveries: int
    dead_letter_key: bytes | None
    dead_lettered: int


@dataclass(slots=True)
class TopicGroupInfo:
    """XINFO GROUPS of a multi-partition topic: one group summed over its partitions."""

    name: bytes
    consumers: int
    pending: int
    lag: int | None
    members: int
    partitions: int


@dataclass(slots=True)
class ConsumerInfo:
    """XINFO CONSUMERS of one partition (``inactive_ms`` -1: never read or claimed anything)."""

    name: bytes
    pending: int
    idle_ms: int
    inactive_ms: int


@dataclass(slots=True)
class TopicConsumerInfo:
    """XINFO CONSUMERS of a topic: a consumer of any partition, summed;
    ``member``: a live member now, owning ``partitions`` (partition keys)."""

    name: bytes
    pending: int
    idle_ms: int
    member: bool
    partitions: list[bytes]


@dataclass(slots=True)
class ConsumerState:
    """A consumer in XINFO STREAM FULL: ``pending`` is ``(id, delivery time ms, count)``."""

    name: bytes
    seen_time_ms: int
    active_time_ms: int  # -1: never read or claimed anything
    pel_count: int
    pending: list[tuple[StreamIdT, int, int]]


@dataclass(slots=True)
class GroupState:
    """A group in XINFO STREAM FULL: ``pending`` is ``(id, consumer, delivery time ms, count)``
    (consumer None, time 0: released by XNACK; ``nacked_count`` of them)."""

    name: bytes
    last_id: StreamIdT
    entries_read: int | None
    lag: int | None
    pel_count: int
    pending: list[tuple[StreamIdT, bytes, int, int]]
    consumers: list[ConsumerState]
    max_deliveries: int
    dead_letter_key: bytes | None
    dead_lettered: int
    nacked_count: int = 0


@dataclass(slots=True)
class MemberView:
    """A live member of a topic's group: the partition keys it owns, ms since it last read."""

    name: bytes
    partitions: list[bytes]
    idle_ms: int


@dataclass(slots=True)
class PartitionGroupView:
    """A topic's group on one partition (``owner`` None: unassigned or being handed over)."""

    partition: int
    key: bytes
    owner: bytes | None
    pending: int
    last_id: StreamIdT
    entries_read: int | None
    lag: int | None


@dataclass(slots=True)
class TopicGroupView:
    """TOPIC GROUPS / TOPIC DESCRIBE: one group of a topic, its members and partitions."""

    name: bytes
    members: list[MemberView]
    partitions: list[PartitionGroupView]


# ----------------------------------------------------------------- helpers


class _Counters:
    """A stream's counters for the lag rules, each read on first use and
    kept (a group read's entries-read usually needs only two of them)."""

    __slots__ = ("_stream", "_length", "_added", "_last", "_deleted", "_first")

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._length = self._added = self._last = self._deleted = self._first = None

    @property
    def length(self) -> int:
        if self._length is None:
            self._length = self._stream.length
        return self._length

    @property
    def entries_added(self) -> int:
        if self._added is None:
            self._added = self._stream.entries_added
        return self._added

    @property
    def last_id(self):
        if self._last is None:
            self._last = tuple(self._stream.last_id)
        return self._last

    @property
    def max_deleted_entry_id(self):
        if self._deleted is None:
            self._deleted = tuple(self._stream.max_deleted_entry_id)
        return self._deleted

    @property
    def first_id(self):
        if self._first is None:
            stream = self._stream
            log = stream.log
            if not self.length:
                self._first = ZERO_ID
            elif log.live_count == log.log_end_offset - log.log_start_offset:  # no deleted entry: no read
                self._first = tuple(log.entry_id(log.log_start_offset))
            else:
                self._first = tuple(stream.first_entry_id())
        return self._first


def partition_groups(stream: Any, now_ms: int, only: bytes | None = None) -> tuple[PartGroup, ...]:
    """The groups of one partition (only ``only`` when given), in name
    order, as a topic's views merge them: each with its consumers' pending
    counts and idle times (by ``now_ms``)."""
    counters = _Counters(stream)
    return tuple(PartGroup(g.name, len(g.pel), tuple(g.last_id), g.entries_read, group_lag(counters, g),
                           tuple((c.name, len(c.pending), max(now_ms - c.seen_time_ms, 0))
                                 for c in g.sorted_consumers()))
                 for g in groups_of(stream).sorted_groups() if only is None or g.name == only)


def membership_of(m: Any, now_ms: int) -> Membership:
    """A topic group's membership ``m`` (``cluster.membership``) as a topic's views merge it."""
    members = tuple((member.name, max(now_ms - member.last_seen_ms, 0), tuple(m.assigned(member.name)))
                    for member in sorted(m.coordinator.members.values(), key=lambda x: x.name))
    return Membership(m.group, members, tuple(m.owner_of(p) for p in range(len(m.coordinator.owner))))


def _named(part: Sequence[PartGroup], name: bytes) -> PartGroup | None:
    return next((g for g in part if g.name == name), None)


def topic_views(topic: bytes, parts: Sequence[Sequence[PartGroup]], memberships: dict[bytes, Membership],
                only: bytes | None) -> list[TopicGroupView]:
    """TOPIC GROUPS of ``topic``: the groups of its partitions (``parts``,
    in partition order: ``partition_groups``) merged with their memberships
    (by group name: ``membership_of``), each group in name order; only
    ``only`` when given (refused when no partition has it). The one merge,
    whoever gathered the facts (one node, or the partitions' leaders)."""
    names = {g.name for part in parts for g in part}
    if only is not None:
        if only not in names:
            raise GroupOpError(NO_GROUP_FOR_KEY, key=topic, group=only)
        names = {only}
    out = []
    for name in sorted(names):
        m = memberships.get(name) if len(parts) > 1 else None
        members = [] if m is None else [MemberView(member, [partition_key(topic, p) for p in owned], idle_ms)
                                        for member, idle_ms, owned in m.members]
        rows = []
        for p, part in enumerate(parts):
            g = _named(part, name)
            if g is not None:
                owner = m.owners[p] if m is not None and p < len(m.owners) else None
                rows.append(PartitionGroupView(p, partition_key(topic, p), owner, g.pending, g.last_id,
                                               g.entries_read, g.lag))
        out.append(TopicGroupView(name, members, rows))
    return out


def topic_group_infos(topic: bytes, parts: Sequence[Sequence[PartGroup]],
                      memberships: dict[bytes, Membership]) -> list[TopicGroupInfo]:
    """XINFO GROUPS of a multi-partition topic (facts as ``topic_views``):
    per group, its consumers (of any partition), pending and lag summed
    (lag None when a partition's is), live members and partitions with it."""
    out = []
    for view in topic_views(topic, parts, memberships, None):
        consumers: set[bytes] = set()
        for part in parts:
            g = _named(part, view.name)
            if g is not None:
                consumers.update(c[0] for c in g.consumers)
        lags = [row.lag for row in view.partitions]
        out.append(TopicGroupInfo(
            view.name, len(consumers), sum(row.pending for row in view.partitions),
            None if any(lag is None for lag in lags) else sum(lags), len(view.members), len(view.partitions)))
    return out


def topic_consumer_infos(topic: bytes, name: bytes, parts: Sequence[Sequence[PartGroup]],
                         membership: Membership | None) -> list[TopicConsumerInfo]:
    """XINFO CONSUMERS of group ``name`` of a multi-partition topic (facts
    as ``topic_views``): every consumer of any partition and every live
    member, in name order, pending summed, idle the least of its partitions'
    and its membership's; refused when partition 0 has no such group."""
    if _named(parts[0], name) is None:
        raise GroupOpError(NO_GROUP_FOR_KEY, key=topic, group=name)
    rows: dict[bytes, list[int]] = {}  # name -> [pending, idle ms]
    for part in parts:
        g = _named(part, name)
        if g is not None:
            for consumer, pending, idle_ms in g.consumers:
                row = rows.setdefault(consumer, [0, idle_ms])
                row[0] += pending
                row[1] = min(row[1], idle_ms)
    owned: dict[bytes, tuple[int, ...]] = {}
    if membership is not None:
        for member, idle_ms, partitions in membership.members:
            row = rows.setdefault(member, [0, idle_ms])
            row[1] = min(row[1], idle_ms)
            owned[member] = partitions
    return [TopicConsumerInfo(consumer, rows[consumer][0], rows[consumer][1], consumer in owned,
                              [partition_key(topic, p) for p in owned.get(consumer, ())])
            for consumer in sorted(rows)]


def _at_most_added(entries_read: int | None, stream: Any) -> int | None:
    """XGROUP CREATE / SETID's ENTRIESREAD, at most the stream's entries-added
    (Redis 8.2.2, redis #14259: a larger one made the lag negative)."""
    if entries_read is not None and entries_read > stream.entries_added:
        return stream.entries_added
    return entries_read


def _entry(stream: Any, sid: StreamIdT) -> bytes | memoryview | None:
    """The stored entry with ID ``sid``, or None when deleted, trimmed or absent."""
    log = stream.log
    start, end = log.log_start_offset, log.log_end_offset
    if start >= end:
        return None
    offset = log.find_offset(sid[0], sid[1], inclusive=True)
    if not start <= offset < end or tuple(log.entry_id(offset)) != tuple(sid):
        return None
    return log.entry_at(offset)


def _is_busy(e: BaseException) -> bool:
    """BUSYGROUP: here, or relayed from a partition's leader."""
    return (isinstance(e, GroupError) and e.code == GROUP_EXISTS) or (isinstance(e, Refused) and e.code == "BUSYGROUP")


def _first_error(replies: list) -> BaseException | None:
    for r in replies:
        if isinstance(r, BaseException):
            return r
    return None


def _topic_of(key: bytes) -> bytes:
    """The topic ``key`` names (itself when its partition suffix is malformed)."""
    try:
        return split_partition_key(key)[0]
    except TopicError:
        return key


def follow_memberships(targets: list, memberships: list, consumer: bytes, now_ms: int) -> list:
    """The memberships of the read's topic ``targets`` after
    ``_check_still_there``: a waiting reader's read (``begin_read``) moved
    from each one left behind (``memberships``, in the same order) to the
    one that replaced it."""
    current = [t.membership for t in targets if t.__class__ is _TopicTarget]
    for old, new in zip(memberships, current):
        if old is not new:
            old.end_read(consumer, now_ms)
            new.begin_read(consumer, now_ms)
    return current


def in_transaction(topic: bytes) -> ClusterError:
    """The refusal of a group change of ``topic`` across nodes inside MULTI / EXEC (it would wait for peers)."""
    return ClusterError(f"topic '{topic.decode('utf-8', 'replace')}' has partitions led by other nodes, and a "
                        "transaction cannot change their groups; use partition keys ('<topic>#<n>') inside MULTI")


def _attempt(op: Callable[[bytes], Any], pkey: bytes, late: BaseException | None) -> Any:
    """``op(pkey)``, or its refusal (``late``: the front-end's parse error)."""
    try:
        return op(pkey)
    except Exception as e:
        if not (isinstance(e, Refusal) or e is late):
            raise
        return e


def _raise_first_error(replies: list) -> None:
    error = _first_error(replies)
    if error is not None:
        raise error


class _Target:
    """One partition key of a read: its stream, group store, group, and
    ``after``: None for ``>``, else the history start (exclusive)."""

    __slots__ = ("key", "stream", "store", "group", "after")

    def __init__(self, key: bytes, stream: Any, store: GroupStore, group: ConsumerGroup, after: Any) -> None:
        self.key = key
        self.stream = stream
        self.store = store
        self.group = group
        self.after = after


class _TopicTarget:
    """A multi-partition topic key of a read: the group's membership on it."""

    __slots__ = ("key", "membership", "after")

    def __init__(self, key: bytes, membership: Any, after: Any) -> None:
        self.key = key
        self.membership = membership
        self.after = after


# ------------------------------------------------------------- operations


class GroupOps:
    """The group operations of ``cluster.broker.Session`` (a mixin)."""

    __slots__ = ()

    # The Session provides these (``_led_across``, ``_group_read_across``,
    # ``_locate``, ``_persist_membership``, ``_forget_membership``,
    # ``_check_group_away`` and ``_delete_member_across``:
    # cluster.broker.topic_groups.TopicGroupOps).
    broker: Any
    may_block: bool
    commit_deferred: Callable[[], None]
    wrote_log: Callable[[Any], None]
    wrote_group: Callable[[Any], None]

    # -- lookups -----------------------------------------------------------

    def _store_of(self, key: bytes, refuse: str = KEY_MISSING) -> tuple[Any, GroupStore]:
        stream = self.broker.topics.get(key)
        if stream is None:
            raise GroupOpError(refuse, key=key)
        return stream, groups_of(stream)

    def _group_of(self, key: bytes, name: bytes, missing: str) -> tuple[Any, GroupStore, ConsumerGroup]:
        """The stream, store and group ``name`` of ``key``; refuses ``missing``
        (with key and group) when either does not exist."""
        stream = self.broker.topics.get(key)
        store = groups_of(stream) if stream is not None else None
        group = store.group(name) if store is not None else None
        if group is None:
            raise GroupOpError(missing, key=key, group=name)
        return stream, store, group

    def _partition_group(self, topic: bytes, p: int, name: bytes) -> tuple[Any, GroupStore, ConsumerGroup | None]:
        stream = self.broker.topics.get(partition_key(topic, p))
        store = groups_of(stream)
        return stream, store, store.group(name)

    def _topic_group_missing(self, key: bytes, name: bytes) -> bytes | None:
        """The key to name when topic ``key``'s group ``name`` is missing on
        one of its partitions led here (in a cluster, partition 0's among
        them: it is led with the topic key), else None: the topic key when
        none of them has it, else the first partition key that lacks it (a
        topic's group lives on every partition: one destroyed or never
        created on a partition key is refused by the topic key's commands,
        not half-applied or silently not served; ``XGROUP CREATE`` of the
        topic key makes it whole again)."""
        replication = self.broker.replication
        manager = replication.manager if replication is not None else None
        topics = self.broker.topics
        lacking: list[int] = []
        checked = 0
        for p in range(topics.partition_count(key)):
            if manager is not None and manager.state.leader(manager.shard_of(key, p)) != manager.my_id:
                continue
            checked += 1
            stream = topics.get(partition_key(key, p))
            if stream is None or groups_of(stream).group(name) is None:
                lacking.append(p)
        if not lacking:
            return None
        return key if len(lacking) == checked else partition_key(key, lacking[0])

    def _check_topic_group(self, key: bytes, name: bytes, missing: str = NO_GROUP_FOR_KEY) -> None:
        """Refuse a group command on topic ``key`` whose group is missing on
        a partition (``_topic_group_missing``) before anything changes,
        naming the topic key the client gave, or the partition key that
        lacks it."""
        lacking = self._topic_group_missing(key, name)
        if lacking is not None:
            raise GroupOpError(missing, key=lacking, group=name)

    def _each_partition(self, key: bytes, op: Callable[[bytes], Any], late: BaseException | None) -> list:
        """``op(partition key)`` for every partition of topic ``key``: the
        results, with a partition's refusal in place of its result."""
        return [_attempt(op, pkey, late) for pkey in self.broker.topics.expand(key)]

    def _each_partition_led(self, key: bytes, request_of: Callable[[bytes], GroupRequest],
                            op: Callable[[bytes], Any], late: BaseException | None,
                            check: bytes | None = None) -> Any:
        """``_each_partition`` in a cluster where other nodes lead some
        partitions of topic ``key``: the awaitable of its results, each
        partition led elsewhere sent ``request_of(partition key)`` through
        its leader (``Forwarder.forward``; its refusal, relayed, is the
        result); None when every partition is led here. Refused inside a
        transaction (it would wait for peers), and with ``late`` (the
        front-end's parse error: raised before anything is sent). With
        ``check`` (a group name), first refused if a partition led
        elsewhere lacks that group (``_check_group_away``)."""
        replication = self.broker.replication
        if replication is None or not replication.fanout.led_elsewhere(key):
            return None
        if late is not None:
            raise late
        if not self.may_block:
            raise in_transaction(key)
        return self._each_partition_away(key, request_of, op, check)

    async def _each_partition_away(self, key: bytes, request_of: Callable[[bytes], GroupRequest],
                                   op: Callable[[bytes], Any], check: bytes | None = None) -> list:
        if check is not None:
            await self._check_group_away(key, check)
        replication = self.broker.replication
        manager = replication.manager
        keys = self.broker.topics.expand(key)
        answers: dict[int, Any] = {}

        async def ask(n: int, leader: int) -> None:
            try:
                answers[n] = await replication.forwarder.forward(request_of(keys[n]), leader, self.client_id)
            except ClusterError as e:  # the leader's refusal (Refused), or TryAgain
                answers[n] = e

        async with trio.open_nursery() as nursery:
            for n in range(len(keys)):
                leader = manager.state.leader(manager.shard_of(key, n))
                if leader != manager.my_id:
                    nursery.start_soon(ask, n, leader)
        self.commit_deferred()
        results = []
        for n, pkey in enumerate(keys):
            answer = answers.get(n)
            if answer is None:  # led here (or its leadership moved here meanwhile)
                results.append(_attempt(op, pkey, None))
            else:
                results.append(answer.count if answer.__class__ is GroupResponse else answer)
        return results

    @staticmethod
    async def _finish_after(results: Any, finish: Callable[[list], Any]) -> Any:
        return finish(await results)

    def _each_partition_ok(self, key: bytes, op: Callable[[bytes], Any], late: BaseException | None) -> list:
        """``_each_partition``, raising the first refusal after all ran."""
        results = self._each_partition(key, op, late)
        _raise_first_error(results)
        return results

    # -- XGROUP ------------------------------------------------------------

    def group_create(self, key: bytes, name: bytes, last_id: StreamIdT | None, *, mkstream: bool = False,
                     entries_read: int | None = None, max_deliveries: int = 0,
                     dead_letter_key: bytes | None = None, late: BaseException | None = None) -> Any:
        """XGROUP CREATE: group ``name`` at ``last_id`` (None: ``$``, the
        stream's last ID). ``mkstream`` creates a missing stream (a topic of
        ``default-partitions``). On a multi-partition topic key: on every
        partition that lacks the group (refused BUSYGROUP only if all had it);
        the topic's membership of that group starts anew. In a cluster, when
        other nodes lead partitions of the topic: the awaitable of it, each
        such partition changed by its leader (``_each_partition_led``)."""
        self.commit_deferred()
        topics = self.broker.topics
        if mkstream and topics.create_if_missing(key):
            self.broker.keys.signal(key)  # a new topic of default-partitions
        if topics.is_multi(key):
            def finish(replies: list) -> None:
                errors = [r for r in replies if isinstance(r, BaseException)]
                if errors and len(errors) == len(replies) and all(map(_is_busy, errors)):
                    raise errors[0]
                for e in errors:
                    if not _is_busy(e):
                        raise e
                self._forget_membership(key, name)

            def op(pkey: bytes) -> None:
                self.group_create(pkey, name, last_id, mkstream=mkstream, entries_read=entries_read,
                                  max_deliveries=max_deliveries, dead_letter_key=dead_letter_key, late=late)

            away = self._each_partition_led(key, lambda pkey: GroupRequest(
                "create", pkey, name, last_id, entries_read, max_deliveries, dead_letter_key), op, late)
            if away is not None:
                return self._finish_after(away, finish)
            return finish(self._each_partition(key, op, late))
        stream = topics.get(key)
        if stream is None and not mkstream:
            raise GroupOpError(KEY_MISSING, key=key)
        if late is not None:
            raise late
        if last_id is None:
            last_id = tuple(stream.last_id) if stream is not None else ZERO_ID
        self._check_dead_letter(key, max_deliveries, dead_letter_key)
        if stream is None:
            stream = topics.get_or_create(key)
            self.wrote_log(stream.log)
            self.broker.keys.signal(key)
        store = groups_of(stream)
        store.create_group(name, last_id, _at_most_added(entries_read, stream), max_deliveries=max_deliveries,
                           dead_letter_key=dead_letter_key)
        self.wrote_group(store)

    @staticmethod
    def _check_dead_letter(key: bytes, max_deliveries: int, dead_letter_key: bytes | None) -> None:
        """Refuse the setting before anything changes: the store's refusals,
        and a dead-letter key of the group's own topic (the key itself, its
        topic or partition key: ``s#0`` is ``s``; a topic's partitions share
        the group), whose dead letters would come back to the group."""
        check_dead_letter(max_deliveries, dead_letter_key)
        if dead_letter_key is not None and _topic_of(dead_letter_key) == _topic_of(key):
            raise GroupOpError(DEAD_LETTER_IS_SOURCE, key=key)

    def group_set_id(self, key: bytes, name: bytes, last_id: StreamIdT | None, entries_read: int | None,
                     late: BaseException | None = None) -> Any:
        """XGROUP SETID (``last_id`` None: ``$``); on a topic: every partition
        (in a cluster, by its leader: then the awaitable of it)."""
        self.commit_deferred()
        if self.broker.topics.is_multi(key):
            self._check_topic_group(key, name)

            def op(pkey: bytes) -> None:
                self.group_set_id(pkey, name, last_id, entries_read, late)

            away = self._each_partition_led(
                key, lambda pkey: GroupRequest("setid", pkey, name, last_id, entries_read), op, late, name)
            if away is not None:
                return self._finish_after(away, _raise_first_error)
            self._each_partition_ok(key, op, late)
            return None
        stream, store = self._store_of(key)
        if store.group(name) is None:
            raise GroupOpError(NO_GROUP_FOR_KEY, key=key, group=name)
        if late is not None:
            raise late
        store.set_id(name, tuple(stream.last_id) if last_id is None else tuple(last_id),
                     _at_most_added(entries_read, stream))
        self.wrote_group(store)

    def group_destroy(self, key: bytes, name: bytes) -> Any:
        """XGROUP DESTROY: 1 if the group existed (on any partition of a
        topic), else 0. Readers blocked on it wake (and are refused). In a
        cluster, on a topic whose partitions other nodes lead: the awaitable
        of it, each such partition's group destroyed by its leader."""
        self.commit_deferred()
        topics = self.broker.topics
        if topics.is_multi(key):
            def finish(replies: list) -> int:
                _raise_first_error(replies)
                self._forget_membership(key, name)
                return 1 if any(replies) else 0

            def op(pkey: bytes) -> int:
                return self.group_destroy(pkey, name)

            away = self._each_partition_led(key, lambda pkey: GroupRequest("destroy", pkey, name), op, None)
            if away is not None:
                return self._finish_after(away, finish)
            return finish(self._each_partition(key, op, None))
        _, store = self._store_of(key)
        if not store.destroy_group(name):
            return 0
        self.wrote_group(store)
        self.broker.keys.signal(key)
        return 1

    def group_create_consumer(self, key: bytes, name: bytes, consumer: bytes) -> Any:
        """XGROUP CREATECONSUMER: 1 if created (on any partition), else 0 (in
        a cluster, on a topic whose partitions other nodes lead: the
        awaitable of it, each such partition's consumer created by its
        leader)."""
        self.commit_deferred()
        if self.broker.topics.is_multi(key):
            self._check_topic_group(key, name)

            def finish(replies: list) -> int:
                _raise_first_error(replies)
                return 1 if any(replies) else 0

            def op(pkey: bytes) -> int:
                return self.group_create_consumer(pkey, name, consumer)

            away = self._each_partition_led(
                key, lambda pkey: GroupRequest("createconsumer", pkey, name, consumer=consumer), op, None, name)
            if away is not None:
                return self._finish_after(away, finish)
            return finish(self._each_partition(key, op, None))
        _, store = self._store_of(key)
        if store.group(name) is None:
            raise GroupOpError(NO_GROUP_FOR_KEY, key=key, group=name)
        created = store.create_consumer(name, consumer, self.broker.clock_ms())
        if created:
            self.wrote_group(store)
        return 1 if created else 0

    def group_delete_consumer(self, key: bytes, name: bytes, consumer: bytes) -> Any:
        """XGROUP DELCONSUMER: how many entries the consumer had pending
        (they leave the PEL). On a topic the member leaves first: its
        partitions and their pending entries go to the remaining members;
        the count is what it had pending before. In a cluster, on a topic
        whose partitions other nodes lead: the awaitable of it
        (``_delete_member_across``)."""
        self.commit_deferred()
        topics = self.broker.topics
        if topics.is_multi(key):
            self._check_topic_group(key, name)
            away = self._delete_member_across(key, name, consumer)
            if away is not None:
                return away
            pending = 0
            for p in range(topics.partition_count(key)):
                group = self._partition_group(key, p, name)[2]
                c = group.consumer(consumer) if group is not None else None
                pending += len(c.pending) if c is not None else 0
            m = topics.coordinators.get((key, name))
            if m is not None:
                for store in m.leave(consumer, self.broker.clock_ms()):
                    self.wrote_group(store)
                self.broker.keys.signal(key)
            self._each_partition_ok(key, lambda pkey: self.group_delete_consumer(pkey, name, consumer), None)
            return pending
        _, store = self._store_of(key)
        group = store.group(name)
        if group is None:
            raise GroupOpError(NO_GROUP_FOR_KEY, key=key, group=name)
        if consumer not in group.consumers:
            return 0
        pending = store.delete_consumer(name, consumer)
        self.wrote_group(store)
        return pending

    def group_configure(self, key: bytes, name: bytes, max_deliveries: int, dead_letter_key: bytes | None, *,
                        late: BaseException | None = None,
                        check_key: Callable[[bytes], None] | None = None) -> Any:
        """XGROUP CONFIG: set (``max_deliveries`` > 0) or clear (0) the
        group's dead-letter setting. ``dead_letter_key`` None with
        ``max_deliveries`` > 0 keeps the group's key, which ``check_key``
        (the front-end's permission check: raises if this client may not
        write it) sees first. On a topic: every partition (in a cluster, by
        its leader: then the awaitable of it)."""
        self.commit_deferred()
        if self.broker.topics.is_multi(key):
            self._check_topic_group(key, name)

            def op(pkey: bytes) -> None:
                self.group_configure(pkey, name, max_deliveries, dead_letter_key, late=late, check_key=check_key)

            away = self._each_partition_led(key, lambda pkey: GroupRequest(
                "config", pkey, name, max_deliveries=max_deliveries, dead_letter_key=dead_letter_key), op, late,
                name)
            if away is not None:
                return self._finish_after(away, _raise_first_error)
            self._each_partition_ok(key, op, late)
            return None
        _, store = self._store_of(key)
        group = store.group(name)
        if group is None:
            raise GroupOpError(NO_GROUP_FOR_KEY, key=key, group=name)
        if late is not None:
            raise late
        if max_deliveries > 0 and dead_letter_key is None:
            dead_letter_key = group.dead_letter_key
            if dead_letter_key is not None and check_key is not None:
                check_key(dead_letter_key)  # this client's reads will write it
        self._check_dead_letter(key, max_deliveries, dead_letter_key)
        store.configure_dead_letter(name, max_deliveries, dead_letter_key)
        self.wrote_group(store)

    # -- XREADGROUP --------------------------------------------------------

    def read_group_nowait(self, read: GroupRead) -> list[Delivery] | None:
        """XREADGROUP without waiting: what it serves (history reads always
        give their key, if empty), ``[]`` when nothing and it may not wait
        (no BLOCK, or the session may not block), None when it should wait
        (every key asked for ``>``, none had entries) or names a topic with
        partitions other nodes lead (left to ``read_group``); a second try
        then finds the state as this one left it (a topic's member joined
        or seen, which the second try's heartbeat repeats at no change)."""
        self.commit_deferred()
        targets = self._read_targets(read)
        if self._led_across(targets):
            return None
        served = self._serve(targets, read, self.broker.clock_ms())
        if served or read.block_ms is None or not self.may_block:
            return served
        return None

    async def read_group(self, read: GroupRead) -> list[Delivery]:
        """XREADGROUP: ``read_group_nowait``, then, when it should wait, wait
        for entries on the keys (and rebalances of a topic's group) until
        ``read.block_ms`` passes (``[]``). Raises ``GroupOpError``
        (``NO_GROUP_TO_READ``) when a key or the group goes away meanwhile
        (``_check_still_there``), ``TooManyBlockedError`` when too many
        readers wait."""
        self.commit_deferred()
        targets = self._read_targets(read)
        if self._led_across(targets):  # a topic's partitions led by other nodes (cluster/broker/topic_groups.py)
            return await self._group_read_across(targets, read)
        served = self._serve(targets, read, self.broker.clock_ms())
        if served or read.block_ms is None or not self.may_block:
            return served
        return await self._wait_and_serve(targets, read)

    def _read_targets(self, read: GroupRead) -> list:
        """Each key's target, with Redis's checks in its order: per key, the
        group, then the key's ID (the front-end's refusal, if any)."""
        topics = self.broker.topics
        targets: list = []
        name = read.group
        for key, start in zip(read.keys, read.starts):
            if topics.is_multi(key):
                self._check_topic_group(key, name, NO_GROUP_TO_READ)
                if isinstance(start, BaseException):
                    raise start
                targets.append(_TopicTarget(key, self._locate(topics.membership(key, name)), start))
            else:
                stream, store, group = self._group_of(key, name, NO_GROUP_TO_READ)
                if isinstance(start, BaseException):
                    raise start
                targets.append(_Target(key, stream, store, group, start))
        return targets

    def _serve(self, targets: list, read: GroupRead, now_ms: int, budget: ReadBudget | None = None) -> list[Delivery]:
        """The read's ``targets`` served in order within ``budget`` (None: the
        read's own MAXCOUNT / MAXSIZE)."""
        served: list[Delivery] = []
        consumer = read.consumer
        if budget is None:
            budget = ReadBudget(read.max_count, read.max_size)
        for t in targets:
            if budget.spent:
                break  # MAXCOUNT / MAXSIZE reached: the keys after are not served
            if t.__class__ is _TopicTarget:
                if t.after is None:
                    self._serve_topic_new(t, read, now_ms, served, budget)
                else:
                    self._serve_topic_history(t, read, now_ms, served, budget)
            elif t.after is not None:
                # A history read: the consumer is looked up (created) and seen.
                t.store.touch_consumer(t.group.name, consumer, now_ms)
                self.wrote_group(t.store)
                served.append(self._serve_history(t, consumer, read.count, now_ms, budget))
            else:
                delivery = self._serve_fresh(t, read, now_ms, budget)
                if delivery is not None:
                    served.append(delivery)
                elif t.store.see_consumer(t.group.name, consumer, now_ms):
                    # Redis 7.2+: every attempt creates the consumer and sets its seen time.
                    self.wrote_group(t.store)
        return served

    def _serve_fresh(self, t: _Target, read: GroupRead, now_ms: int, budget: ReadBudget,
                     head: Delivery | None = None) -> Delivery | None:
        """``>`` on one partition: with CLAIM the idle pending entries first,
        then new ones, COUNT over both; ``head``: what a topic's partition
        served before them (entries handed over to the reader)."""
        count = read.count
        if read.claim_ms is None:
            handed = head.count if head is not None else 0
            new = None
            if not count or count > handed:
                new = self._serve_new(t, read.consumer, count - handed if count else 0, read.noack, now_ms,
                                      read.view, budget)
            if head is None:
                return new
            if new is not None:
                # new.count, not its chunks: a log read returns a run of
                # contiguous entries as ONE chunk.
                head.chunks.extend(new.chunks)
                head.count += new.count
                head.views = new.views
            return head if head.count else None
        out = head if head is not None else Delivery(t.key, 0, [], claims=[])
        if not count or out.count < count:
            self._serve_claimed(t, read.consumer, count - out.count if count else 0, read.claim_ms, now_ms,
                                budget, out)
        if not count or out.count < count:
            new = self._serve_new(t, read.consumer, count - out.count if count else 0, read.noack, now_ms,
                                  False, budget)
            if new is not None:
                parts = split_entries(new.chunks)
                out.chunks.extend(parts)
                out.claims.extend([(0, 0)] * len(parts))  # new entries: never delivered
                out.count += len(parts)
        return out if out.count else None

    def _serve_new(self, t: _Target, consumer: bytes, count: int, noack: bool, now_ms: int,
                   view: bool, budget: ReadBudget) -> Delivery | None:
        """Deliver entries after the group's last_id (None: none)."""
        stream, group, store = t.stream, t.group, t.store
        log = stream.log
        live = log.live_count  # the stream's length
        if not live:
            return None
        first, end = log.log_start_offset, log.log_end_offset
        deleted = end - first - live  # entries deleted inside the log (none: the usual)
        last_id = group.last_id
        if tuple(log.last_id) <= last_id:  # cheap: no entry after last_id at all
            return None
        count = budget.count_for(count)
        if count < 0:
            return None
        after = log.find_offset(last_id[0], last_id[1], inclusive=False)
        res = log.read(max(after, first), end, max_count=count or None, with_ids=True, view=view, id_pairs=True)
        if not res.count:
            return None
        n, chunks = res.count, res.chunks
        if budget.sized:
            chunks = split_entries(chunks)
            n = budget.take(t.key, [len(c) for c in chunks])
            if not n:
                return None
            chunks = chunks[:n]
            view = False
        else:
            budget.took(t.key, n)
        self.broker.topics.note_entries_out(n)
        ids = res.entries if n == res.count else res.entries[:n]  # (ms, seq) each
        # Is last_id below the first entry? Without deleted entries that is at the log start:
        behind = None if deleted else after <= first
        entries_read = entries_read_after(_Counters(stream), last_id, group.entries_read, ids, behind)
        store.deliver(group.name, consumer, ids, ids[-1], entries_read, now_ms, noack=noack)
        self.wrote_group(store)
        return Delivery(t.key, n, chunks, view)

    def _serve_claimed(self, t: _Target, consumer: bytes, count: int, min_idle_ms: int, now_ms: int,
                       budget: ReadBudget, out: Delivery) -> None:
        """XREADGROUP CLAIM (Redis 8.4): pending entries of the group idle at
        least ``min_idle_ms``, longest idle first (released ones first), go
        to ``consumer`` (delivery count + 1, delivery time now; NOACK does
        not apply to them), appended to ``out`` with ``(idle ms, deliveries
        before)`` each (idle -1 for a released one, as XPENDING shows it).
        Pending entries no longer in the stream leave the PEL (as XAUTOCLAIM
        drops them); past MAXDELIVERIES they are dead-lettered."""
        stream, group, store = t.stream, t.group, t.store
        limit = budget.count_for(count)
        if limit < 0 or not group.pel:
            return
        claims: list = []
        gone: list = []
        dead: list = []
        picked: list = []  # (id, stored entry, idle, deliveries before)
        with group.idle_pending(now_ms, min_idle_ms) as idle:
            for sid, pe in idle:
                if limit and len(picked) >= limit:
                    break
                encoded = _entry(stream, sid)
                if encoded is None:
                    gone.append(sid)
                    continue
                if group.max_deliveries and pe.delivery_count + 1 > group.max_deliveries:
                    dead.append((sid, bytes(encoded), pe.consumer or b""))
                    continue
                if budget.sized and not budget.take(t.key, [len(encoded)]):
                    break
                picked.append((sid, bytes(encoded), pe.idle_ms(now_ms), pe.delivery_count))
        if not budget.sized:
            budget.took(t.key, len(picked))
        if gone:
            store.drop_pending(group.name, gone)
        self._dead_letter(t.key, store, group, dead)
        for sid, encoded, idle_ms, deliveries in picked:
            claims.append((sid, now_ms, count_after(deliveries)))
            out.chunks.append(encoded)
            out.claims.append((idle_ms, deliveries))
        out.count += len(picked)
        if claims:
            store.claim(group.name, consumer, claims, now_ms)
            self.broker.topics.note_entries_out(len(claims))
        if claims or gone:
            self.wrote_group(store)

    def _serve_history(self, t: _Target, consumer: bytes, count: int, now_ms: int,
                       budget: ReadBudget) -> Delivery:
        """The consumer's own pending entries after ``t.after``; one whose
        delivery would pass the group's MAXDELIVERIES is dead-lettered."""
        stream, group, store = t.stream, t.group, t.store
        c = group.consumer(consumer)
        chunks: list = []
        redelivered: list = []
        dead: list = []
        gone = False
        try:
            start = t.after.incr()
        except OverflowError:
            start = MAX_ID
        count = budget.count_for(count)
        if c is not None and count >= 0:
            for sid, pe in c.pending.range(tuple(start), MAX_ID):
                if count and len(chunks) >= count:
                    break
                encoded = _entry(stream, sid)
                if encoded is None:
                    if budget.sized and not budget.take(t.key, [len(format_id(sid)) + 16]):
                        break
                    chunks.append(tuple(sid))
                    gone = True
                    continue
                if group.max_deliveries and pe.delivery_count + 1 > group.max_deliveries:
                    dead.append((sid, bytes(encoded), consumer))
                    continue
                if budget.sized and not budget.take(t.key, [len(encoded)]):
                    break
                chunks.append(encoded)
                redelivered.append(sid)
        if not budget.sized:
            budget.took(t.key, len(chunks))
        if redelivered:
            store.redeliver(group.name, consumer, redelivered, now_ms)
            self.wrote_group(store)
        self._dead_letter(t.key, store, group, dead)
        return Delivery(t.key, len(chunks), chunks, False, gone)

    def _serve_topic_new(self, t: _TopicTarget, read: GroupRead, now_ms: int, served: list,
                         budget: ReadBudget) -> None:
        m = t.membership
        stores = m.heartbeat(read.consumer, now_ms)
        for store in stores:
            self.wrote_group(store)
        if stores:
            self.broker.keys.signal(m.topic)  # other blocked members re-check
        if self.broker.replication is not None:
            self._persist_membership(m)  # (cluster/broker/topic_groups.py: for the next coordinator)
        for p in m.assigned(read.consumer):
            if budget.spent:
                break
            delivery = self._serve_partition(m, p, read, now_ms, budget)
            if delivery is not None:
                served.append(delivery)

    def _serve_partition(self, m: Any, p: int, read: GroupRead, now_ms: int,
                         budget: ReadBudget) -> Delivery | None:
        """A member's partition: entries handed over to it first (delivery
        count +1), then (CLAIM) idle pending ones, then new ones."""
        stream, store, group = self._partition_group(m.topic, p, m.group)
        if group is None:
            return None
        limit = budget.count_for(read.count)
        ids = m.take_redeliveries(p, read.consumer, limit) if limit >= 0 else []
        return self._serve_owned(partition_key(m.topic, p), stream, store, group, read, ids, now_ms, budget)

    def _serve_owned(self, pkey: bytes, stream: Any, store: GroupStore, group: ConsumerGroup, read: GroupRead,
                     ids: list, now_ms: int, budget: ReadBudget) -> Delivery | None:
        """A member's read of partition ``pkey``: ``ids`` (handed over to it,
        still pending for it) first, delivery count +1, then ``_serve_fresh``."""
        consumer = read.consumer
        head = Delivery(pkey, 0, [], claims=[] if read.claim_ms is not None else None)
        if ids:
            live, gone, before = [], [], []
            for sid in ids:
                encoded = _entry(stream, sid)
                if encoded is None:
                    gone.append(sid)
                    continue
                live.append(sid)
                head.chunks.append(encoded)
                pe = group.pel.get(sid)
                before.append((pe.idle_ms(now_ms), pe.delivery_count) if pe else (-1, 0))
            if budget.sized:
                budget.take(pkey, [0] * len(live))  # handed over whole: they are this member's already
            else:
                budget.took(pkey, len(live))
            if gone:
                store.drop_pending(group.name, gone)
            if live:
                store.redeliver(group.name, consumer, live, now_ms)
                self.broker.topics.note_entries_out(len(live))
                head.count = len(live)
                if head.claims is not None:
                    head.claims.extend(before)
            self.wrote_group(store)
        return self._serve_fresh(_Target(pkey, stream, store, group, None), read, now_ms, budget, head)

    def _serve_topic_history(self, t: _TopicTarget, read: GroupRead, now_ms: int, served: list,
                             budget: ReadBudget) -> None:
        m = t.membership
        m.seen(read.consumer, now_ms)  # a member re-reading its pending entries is alive
        found = False
        for p in range(self.broker.topics.partition_count(m.topic)):
            if budget.spent:
                break
            delivery = self._serve_partition_history(m, p, t.after, read, now_ms, budget)
            if delivery is not None and delivery.count:
                served.append(delivery)
                found = True
        if not found:
            served.append(Delivery(t.key, 0, []))

    def _serve_partition_history(self, m: Any, p: int, after: Any, read: GroupRead, now_ms: int,
                                 budget: ReadBudget) -> Delivery | None:
        """A topic member's history on partition ``p`` (None: the partition's
        group does not know the consumer)."""
        stream, store, group = self._partition_group(m.topic, p, m.group)
        if group is None or group.consumer(read.consumer) is None:
            return None
        target = _Target(partition_key(m.topic, p), stream, store, group, after)
        return self._serve_history(target, read.consumer, read.count, now_ms, budget)

    def _dead_letter(self, key: bytes, store: GroupStore, group: ConsumerGroup,
                     moves: list[tuple[StreamIdT, bytes, bytes]]) -> None:
        """Append each ``(id, stored entry, owner)`` to the group's
        dead-letter stream with its origin, then drop the IDs from the PEL.

        The appends are noted for durability before the PEL change, so a
        crash in between can dead-letter an entry twice, never lose it.
        """
        if not moves:
            return
        dl_key = group.dead_letter_key
        dl_stream = self.broker.topics.get_or_create(dl_key)
        for sid, encoded, owner in moves:
            pe = group.pel.get(sid)
            _, fields = decode_entry(encoded)
            fields = list(fields) + [
                DL_SOURCE_KEY, key,
                DL_SOURCE_ID, format_id(sid),
                DL_GROUP, group.name,
                DL_CONSUMER, owner,
                DL_DELIVERIES, b"%d" % (pe.delivery_count if pe is not None else 0),
            ]
            dl_stream.add(fields)
        self.wrote_log(dl_stream.log)
        self.broker.keys.signal(dl_key)
        store.dead_letter(group.name, [sid for sid, _, _ in moves])
        self.wrote_group(store)

    async def _wait_and_serve(self, targets: list, read: GroupRead) -> list[Delivery]:
        """Wait for the read's keys and serve again until something is served
        or ``read.block_ms`` passed. A topic's read wakes at least twice per
        group session timeout, so that dead members expire (the reader counts
        as alive meanwhile); readers of a partition's group are served in
        arrival order: one signal wakes them all, and each waits one
        scheduler pass per reader ahead of it."""
        broker = self.broker
        topics = broker.topics
        clock_ms = broker.clock_ms
        blocked = broker.blocked_readers
        wait_keys: list[bytes] = []
        memberships = []
        queues = []  # (its key in ``blocked``, the queue)
        for t in targets:
            wait_keys.append(t.key)
            if t.__class__ is _TopicTarget:
                wait_keys.extend(topics.expand(t.key))  # XADD signals the partition keys
                memberships.append(t.membership)
            else:
                reader = (id(t.stream), t.group.name)
                queues.append((reader, blocked.setdefault(reader, [])))
        token = object()
        deadline = None if read.block_ms == 0 else trio.current_time() + read.block_ms / 1000
        try:
            for _, queue in queues:
                queue.append(token)
            for m in memberships:
                m.begin_read(read.consumer, clock_ms())
            while True:
                slice_s = None
                if memberships:
                    slice_s = min(m.coordinator.session_timeout_ms for m in memberships) / 2000
                # CLAIM: also wake when a pending entry becomes idle enough.
                claim_s = self._claimable_in_s(targets, read) if read.claim_ms is not None else None
                if claim_s is not None:
                    slice_s = claim_s if slice_s is None else min(slice_s, claim_s)
                if deadline is not None:
                    remaining_s = deadline - trio.current_time()
                    if remaining_s <= 0:
                        return []
                    slice_s = remaining_s if slice_s is None else min(slice_s, remaining_s)
                woken = await broker.keys.wait_for_keys(wait_keys, slice_s)
                if not woken and not memberships and claim_s is None:
                    return []
                if queues:
                    ahead = max(queue.index(token) for _, queue in queues)
                    for _ in range(ahead):
                        await trio.sleep(0)
                self._check_still_there(targets, read.group)
                memberships = follow_memberships(targets, memberships, read.consumer, clock_ms())
                served = self._serve(targets, read, clock_ms())
                if served:
                    return served
        finally:
            for m in memberships:
                m.end_read(read.consumer, clock_ms())
            for reader, queue in queues:
                if token in queue:
                    queue.remove(token)
                if not queue and blocked.get(reader) is queue:
                    del blocked[reader]

    def _claimable_in_s(self, targets: list, read: GroupRead) -> float | None:
        """Seconds until the first pending entry of the read's ``>`` keys is
        idle ``read.claim_ms`` (None: none is pending)."""
        oldest = None
        for t in targets:
            if t.after is not None:
                continue
            if t.__class__ is _TopicTarget:
                m = t.membership
                groups = [self._partition_group(m.topic, p, m.group)[2] for p in m.assigned(read.consumer)]
            else:
                groups = [t.group]
            for group in groups:
                t0 = group.oldest_delivery_ms() if group is not None else None
                if t0 is not None and (oldest is None or t0 < oldest):
                    oldest = t0
        if oldest is None:
            return None
        return max(oldest + read.claim_ms - self.broker.clock_ms(), 1) / 1000

    def _check_still_there(self, targets: list, name: bytes) -> None:
        """A woken reader's keys looked up again, as Redis 7.2+ runs a woken
        XREADGROUP again: a key deleted (DEL, FLUSHALL, RENAME away) or
        whose group was destroyed refuses the read with the command's own
        ``-NOGROUP``; a key now naming another stream that has the group
        (RENAME onto it) is read from that stream; a topic whose group's
        membership was made anew is read as a member of the new one (the
        caller moves its wait there: ``follow_memberships``)."""
        topics = self.broker.topics
        for i, t in enumerate(targets):
            if t.__class__ is _TopicTarget:
                if not topics.is_multi(t.key):
                    raise GroupOpError(NO_GROUP_TO_READ, key=t.key, group=name)
                self._check_topic_group(t.key, name, NO_GROUP_TO_READ)
                if topics.coordinators.get((t.key, name)) is not t.membership:
                    # The group was made anew (XGROUP DESTROY and CREATE in
                    # one transaction, a RENAME onto the key): its members
                    # are the new membership's, and the reader joins it.
                    targets[i] = _TopicTarget(t.key, self._locate(topics.membership(t.key, name)), t.after)
            elif topics.get(t.key) is not t.stream or t.store.group(name) is not t.group:
                stream, store, group = self._group_of(t.key, name, NO_GROUP_TO_READ)
                targets[i] = _Target(t.key, stream, store, group, t.after)

    # -- XACK, XCLAIM, XAUTOCLAIM -------------------------------------------

    def ack(self, key: bytes, name: bytes, ids: Sequence[StreamIdT], late: BaseException | None = None) -> int:
        """XACK: how many of ``ids`` were pending (0 when the key or the group
        does not exist; ``late`` is raised only once both are found)."""
        self.commit_deferred()
        stream = self.broker.topics.get(key)
        if stream is None:
            return 0
        store = groups_of(stream)
        if store.group(name) is None:
            return 0
        if late is not None:
            raise late
        acked = store.ack(name, ids)
        if acked:
            self.wrote_group(store)
        return acked

    def reject(self, key: bytes, name: bytes, ids: Sequence[StreamIdT]) -> int:
        """Pending ``ids`` given up on (a Kafka share consumer's REJECT,
        cluster/broker/shares.py): moved to the group's dead-letter stream
        with their owner, as past MAXDELIVERIES, when the group has one;
        else acknowledged. Returns how many were pending."""
        self.commit_deferred()
        stream, store, group = self._group_of(key, name, NO_KEY_OR_GROUP)
        if not (group.max_deliveries and group.dead_letter_key is not None):
            return self.ack(key, name, ids)
        moves: list = []
        gone: list = []
        for sid in dict.fromkeys(tuple(sid) for sid in ids):
            pe = group.pel.get(sid)
            if pe is None:
                continue
            encoded = _entry(stream, sid)
            if encoded is None:
                gone.append(sid)
            else:
                moves.append((sid, bytes(encoded), pe.consumer or b""))
        if gone:
            store.drop_pending(name, gone)
            self.wrote_group(store)
        self._dead_letter(key, store, group, moves)
        return len(moves) + len(gone)

    def nack(self, key: bytes, name: bytes, mode: str, ids: Sequence[StreamIdT], retry_count: int | None = None,
             force: bool = False) -> int:
        """XNACK (Redis 8.8): release pending ``ids`` back to the group:
        no owner, delivery time 0 (any claim takes them, before other idle
        entries: XREADGROUP CLAIM, XCLAIM, XAUTOCLAIM), the delivery count
        by ``mode`` (``NACK_SILENT`` one less, never below 0;
        ``NACK_FAIL`` kept; ``NACK_FATAL`` ``LLONG_MAX``) or ``retry_count``
        when given. ``force`` makes an ID that is not pending pending (count
        0, or ``retry_count``, or FATAL's) if its entry is in the stream.
        IDs in order, a repeated one released again; returns how many were
        released. Readers blocked on the key with CLAIM wake."""
        self.commit_deferred()
        stream, store, group = self._group_of(key, name, NO_KEY_OR_GROUP)
        counts: dict = {}  # this call's view of each ID's count
        released: list = []
        for sid in ids:
            sid = tuple(sid)
            if sid in counts:
                current = counts[sid]
            else:
                pe = group.pel.get(sid)
                if pe is not None:
                    current = pe.delivery_count
                elif force and _entry(stream, sid) is not None:
                    current = None  # created here
                else:
                    continue
            if retry_count is not None:
                new = retry_count
            elif mode == NACK_FATAL:
                new = LLONG_MAX
            elif current is None:
                new = 0
            elif mode == NACK_SILENT:
                new = max(current - 1, 0)
            else:
                new = current
            counts[sid] = new
            released.append((sid, new))
        if released:
            store.nack(name, released)
            self.wrote_group(store)
            self.broker.keys.signal(key)
        return len(released)

    def claim(self, key: bytes, name: bytes, consumer: bytes, ids: Sequence[StreamIdT], *, min_idle_ms: int = 0,
              idle_ms: int | None = None, time_ms: int | None = None, retry_count: int = -1,
              force: bool = False, justid: bool = False, last_id: StreamIdT = ZERO_ID,
              late: BaseException | None = None) -> list:
        """XCLAIM: the claimed entries' stored chunks (``justid``: their IDs).

        Redis's rules: the IDs one by one (a repeated ID is claimed again);
        an ID whose entry left the stream is dropped from the PEL; FORCE
        creates a pending entry for an ID that has none; the delivery time
        is now, or now - ``idle_ms``, or ``time_ms`` (one of the two, the
        last given; ignored when in the future or negative); the count + 1
        unless ``justid`` or ``retry_count`` (>= 0) says otherwise; LASTID
        moves the group's last-delivered-id forward. With dead-lettering on,
        an entry whose delivery count would pass MAXDELIVERIES goes to the
        dead-letter stream instead of the claimer (not with JUSTID or
        RETRYCOUNT).
        """
        self.commit_deferred()
        stream, store, group = self._group_of(key, name, NO_KEY_OR_GROUP)
        if late is not None:
            raise late
        now = self.broker.clock_ms()
        delivery_time = now - idle_ms if idle_ms is not None else time_ms
        if delivery_time is None or delivery_time < 0 or delivery_time > now:
            delivery_time = now
        new_last = last_id if last_id > group.last_id else None
        # This call's view of each touched entry: [owner, time, count].
        touched: dict = {}
        gone: set = set()  # dropped or dead-lettered during this call
        dropped = []
        dead = []
        out: list = []
        for sid in ids:
            if sid in gone:
                continue
            state = touched.get(sid)
            if state is None:
                pe = group.pel.get(sid)
                if pe is not None:
                    state = [pe.consumer, pe.delivery_time_ms, pe.delivery_count]
            encoded = _entry(stream, sid)
            if encoded is None:
                if state is not None:
                    dropped.append(sid)
                    gone.add(sid)
                    touched.pop(sid, None)
                continue
            forced = state is None
            if forced:
                if not force:
                    continue
                state = [None, now, 1]  # created by FORCE: no owner, so no idle check
            elif min_idle_ms and state[0] is not None and now - state[1] < min_idle_ms:
                continue
            if retry_count >= 0:
                new_count = retry_count
            elif not justid:
                new_count = count_after(state[2])
            else:
                new_count = state[2]
            if (group.max_deliveries and retry_count < 0 and not justid and not forced
                    and sid not in touched and new_count > group.max_deliveries):
                dead.append((sid, bytes(encoded), state[0] or b""))  # (b"": released by XNACK)
                gone.add(sid)
                continue
            touched[sid] = [consumer, delivery_time, new_count]
            out.append(sid if justid else encoded)
        if dropped:
            store.drop_pending(name, dropped)
        self._dead_letter(key, store, group, dead)
        claims = [(sid, t, n) for sid, (_, t, n) in touched.items()]
        if claims:
            store.claim(name, consumer, claims, now, last_id=new_last)
        elif new_last is not None:
            store.set_id(name, new_last, group.entries_read)
        if claims or dropped or new_last is not None:
            self.wrote_group(store)
        return out

    def auto_claim(self, key: bytes, name: bytes, consumer: bytes, min_idle_ms: int, start: StreamIdT,
                   count: int, justid: bool = False, late: BaseException | None = None,
                   ) -> tuple[StreamIdT, list, list[StreamIdT]]:
        """XAUTOCLAIM: scans at most ``count`` * 10 pending entries from
        ``start``; returns the cursor to continue from (``0-0`` at the end),
        the claimed entries' chunks (``justid``: IDs), and the IDs dropped
        because their entries left the stream. Dead-letters as XCLAIM."""
        self.commit_deferred()
        stream, store, group = self._group_of(key, name, NO_KEY_OR_GROUP)
        if late is not None:
            raise late
        now = self.broker.clock_ms()
        attempts = count * 10
        claims = []
        out: list = []
        deleted = []
        dead = []
        cursor = ZERO_ID
        for sid in group.pel.ids_from(start):
            if attempts <= 0 or count <= 0:
                cursor = sid
                break
            attempts -= 1
            pe = group.pel.get(sid)
            encoded = _entry(stream, sid)
            if encoded is None:
                deleted.append(sid)
                count -= 1
                continue
            if min_idle_ms and now - pe.delivery_time_ms < min_idle_ms:
                continue
            new_count = pe.delivery_count if justid else count_after(pe.delivery_count)
            if group.max_deliveries and not justid and new_count > group.max_deliveries:
                dead.append((sid, bytes(encoded), pe.consumer or b""))  # (b"": released by XNACK)
                count -= 1
                continue
            claims.append((sid, now, new_count))
            out.append(sid if justid else encoded)
            count -= 1
        if deleted:
            store.drop_pending(name, deleted)
        self._dead_letter(key, store, group, dead)
        if claims:
            store.claim(name, consumer, claims, now)
        if claims or deleted:
            self.wrote_group(store)
        return cursor, out, deleted

    # -- XPENDING ----------------------------------------------------------

    def pending_summary(self, key: bytes, name: bytes) -> PendingSummary:
        """XPENDING key group."""
        self.commit_deferred()
        _, _, group = self._group_of(key, name, NO_KEY_OR_GROUP)
        pel = group.pel
        if not pel:
            return PendingSummary(0, None, None, [])
        consumers = [(c.name, len(c.pending)) for c in group.sorted_consumers() if c.pending]
        return PendingSummary(len(pel), pel.first(), pel.last(), consumers)

    def pending(self, key: bytes, name: bytes, start: StreamIdT, end: StreamIdT, count: int,
                consumer: bytes | None = None, min_idle_ms: int = 0) -> list[tuple[StreamIdT, bytes | None, int, int]]:
        """XPENDING's extended form: up to ``count`` ``(id, consumer, idle ms,
        delivery count)`` in ``[start, end]`` (of ``consumer`` only, if given),
        idle at least ``min_idle_ms``. An entry released by XNACK has no
        consumer (None) and idle -1."""
        self.commit_deferred()
        _, _, group = self._group_of(key, name, NO_KEY_OR_GROUP)
        if consumer is not None:
            c = group.consumer(consumer)
            if c is None:
                return []
            pel = c.pending
        else:
            pel = group.pel
        out: list = []
        if count <= 0:
            return out
        now = self.broker.clock_ms()
        for sid in pel.ids_from(start, end):
            pe = pel.get(sid)
            idle = now - pe.delivery_time_ms
            if min_idle_ms and idle < min_idle_ms:
                continue
            out.append((sid, pe.consumer, pe.idle_ms(now), pe.delivery_count))
            if len(out) >= count:
                break
        return out

    # -- XINFO -------------------------------------------------------------

    def group_infos(self, key: bytes) -> Any:
        """XINFO GROUPS: each group of the key, in name order (a topic's
        summed: ``topic_group_infos``; in a cluster, with partitions led
        elsewhere, the awaitable of them)."""
        self.commit_deferred()
        if self.broker.topics.is_multi(key):
            return self._with_topic_facts(key, None, lambda parts, members: topic_group_infos(key, parts, members))
        stream, store = self._store_of(key, NO_SUCH_KEY)
        counters = _Counters(stream)
        return [GroupInfo(g.name, len(g.consumers), len(g.pel), g.last_id, g.entries_read,
                          group_lag(counters, g), g.max_deliveries, g.dead_letter_key, g.dead_lettered_total)
                for g in store.sorted_groups()]

    def consumer_infos(self, key: bytes, name: bytes) -> Any:
        """XINFO CONSUMERS: the group's consumers in name order. On a topic:
        every consumer of any partition (pending summed) and every live
        member, with the partitions it owns (``topic_consumer_infos``; in a
        cluster, with partitions led elsewhere, the awaitable of them)."""
        self.commit_deferred()
        topics = self.broker.topics
        if topics.is_multi(key):
            return self._with_topic_facts(
                key, name, lambda parts, members: topic_consumer_infos(key, name, parts, members.get(name)))
        now = self.broker.clock_ms()
        _, store = self._store_of(key, NO_SUCH_KEY)
        group = store.group(name)
        if group is None:
            raise GroupOpError(NO_GROUP_FOR_KEY, key=key, group=name)
        # Redis 7.2's ``inactive``: ms since the last read or claim that got entries; -1 never.
        return [ConsumerInfo(c.name, len(c.pending), max(now - c.seen_time_ms, 0),
                             max(now - c.active_time_ms, 0) if c.active_time_ms >= 0 else -1)
                for c in group.sorted_consumers()]

    def group_count(self, key: bytes) -> int:
        """How many consumer groups the stream ``key`` has (XINFO STREAM's ``groups``)."""
        self.commit_deferred()
        return len(self._store_of(key, NO_SUCH_KEY)[1].groups)

    def groups_full(self, key: bytes, count: int) -> list[GroupState]:
        """The groups of stream ``key`` in full (XINFO STREAM key FULL):
        ``count`` limits each PEL listed (0: no limit), as in Redis."""
        self.commit_deferred()
        stream, store = self._store_of(key, NO_SUCH_KEY)
        counters = _Counters(stream)
        limit = count or None
        out = []
        for g in store.sorted_groups():
            consumers = [ConsumerState(c.name, c.seen_time_ms, c.active_time_ms, len(c.pending),
                                       [(sid, pe.delivery_time_ms, pe.delivery_count)
                                        for sid, pe in c.pending.range(count=limit)])
                         for c in g.sorted_consumers()]
            out.append(GroupState(
                g.name, g.last_id, g.entries_read, group_lag(counters, g), len(g.pel),
                [(sid, pe.consumer, pe.delivery_time_ms, pe.delivery_count) for sid, pe in g.pel.range(count=limit)],
                consumers, g.max_deliveries, g.dead_letter_key, g.dead_lettered_total, g.nacked_count()))
        return out

    def topic_groups(self, topic: bytes, only: bytes | None = None) -> Any:
        """TOPIC GROUPS / TOPIC DESCRIBE's groups: each group of ``topic`` (or
        only ``only``) with its live members, assignment and per-partition
        pending and lag; dead members expire and hand over first
        (``topic_views``; in a cluster, with partitions led elsewhere, the
        awaitable of them)."""
        self.commit_deferred()
        return self._with_topic_facts(topic, only, lambda parts, members: topic_views(topic, parts, members, only))

    def _with_topic_facts(self, topic: bytes, only: bytes | None, merge: Callable[[list, dict], Any]) -> Any:
        """``merge(parts, memberships)`` of ``topic``'s group facts: per
        partition its groups (``partition_groups``; only group ``only`` when
        given), and by group name its membership (``membership_of``). In a
        cluster where other nodes lead some partitions, the facts come from
        each partition's leader and the coordinator (``_group_facts_across``)
        and this returns the awaitable of the merge, refused inside a
        transaction (it would wait for peers)."""
        replication = self.broker.replication
        if replication is not None and replication.fanout.led_elsewhere(topic):
            if not self.may_block:
                raise replication.fanout.in_transaction(topic)
            return self._merge_across(topic, only, merge)
        partitions = self.broker.topics.partition_count(topic)
        facts = self.group_facts(topic, range(partitions), only, partitions > 1)
        return merge(list(facts.parts), {m.name: m for m in facts.members})

    async def _merge_across(self, topic: bytes, only: bytes | None, merge: Callable[[list, dict], Any]) -> Any:
        return merge(*await self._group_facts_across(topic, only))

    def group_facts(self, topic: bytes, partitions: Sequence[int], only: bytes | None,
                    members: bool) -> GroupInfoResponse:
        """The group facts of ``partitions`` of ``topic`` held here (only
        group ``only`` when given) and, with ``members``, the memberships of
        its groups (synced first: dead members expire, their partitions are
        handed over): what this node answers a ``GroupInfoRequest``, and
        what a single node merges."""
        topics = self.broker.topics
        now_ms = self.broker.clock_ms()
        parts = tuple(partition_groups(topics.get(partition_key(topic, p)), now_ms, only) for p in partitions)
        found = []
        if members:
            for (t, name) in sorted(topics.coordinators):
                if t == topic and (only is None or name == only):
                    found.append(membership_of(self._synced_membership(topic, name), now_ms))
        return GroupInfoResponse(parts, tuple(found))

    def _synced_membership(self, topic: bytes, name: bytes) -> Any:
        """The group's membership on ``topic`` if it has one, brought up to
        date (dead members expired, their partitions handed over)."""
        m = self.broker.topics.coordinators.get((topic, name))
        if m is not None:
            self._locate(m)  # (in a cluster: which partitions are led elsewhere)
            for store in m.sync(self.broker.clock_ms()):
                self.wrote_group(store)
        return m
