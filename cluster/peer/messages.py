"""Every request one cluster node sends another, and its response, declared once.

Owns: the message types as frozen dataclasses and which response answers
which request (``RESPONSE_OF``). A request is idempotent unless it says so
(``idempotent = False``: a forwarded append must never be sent twice).

| request | response | what for |
| --- | --- | --- |
| ``FetchRequest`` (``FetchPartition`` each) | ``FetchResponse`` (``FetchedPartition``, ``Discovered``) | a follower's long-polling fetch |
| ``EpochRequest`` (``EpochPartition`` each) | ``EpochResponse`` (``EpochEnd`` each) | the end of a leader epoch (KIP-101 truncation) |
| ``PauseRequest`` | ``PauseResponse`` (``PartitionEnd`` each) | a manual failover pauses a shard's writes |
| ``RaftRequest`` | ``Ack`` | the controller quorum's Raft messages |
| ``BeatRequest`` | ``BeatResponse`` | a node's heartbeat to the elected controller |
| ``ProposeRequest`` | ``Ack`` | a metadata record for the controller to commit |
| ``JoinRequest`` | ``Ack`` | a node asks to be taken into the cluster |
| ``MoveRequest`` | ``Ack`` | the controller asks a preferred leader to take its shard back |
| ``AppendRequest`` | ``AppendResponse`` | an XADD forwarded to the partition's leader |
| ``ReadRequest`` (``ReadPart`` each) | ``ReadResponse`` (``PartRead`` each) | a topic-wide read fanned out to the partitions' leaders |
| ``GroupRequest`` | ``GroupResponse`` | XGROUP of a topic key, for one partition's leader |
| ``GroupReadRequest`` (``GroupPart`` each) | ``GroupReadResponse`` (``GroupPartRead`` each) | a member's XREADGROUP of a topic key: its partitions led elsewhere, from the group's coordinator |
| ``GroupInfoRequest`` | ``GroupInfoResponse`` (``PartGroup`` per group and partition, ``Membership`` per group) | XINFO GROUPS / CONSUMERS, TOPIC GROUPS of a topic key: its partitions' groups from their leaders, the memberships from the coordinator |

A refusal is not a response: the answering side raises a
``cluster.errors.ClusterError`` and the asking side gets
``cluster.errors.Refused`` with the error's text.

Must not know: encodings (``server/peer_resp.py`` is the RESP one), sockets.
"""

from __future__ import annotations

from dataclasses import dataclass

from cluster.controller.raft import Message


@dataclass(frozen=True, slots=True)
class Ack:
    """A request done (``+OK`` on the RESP bus)."""


# -- fetch -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FetchPartition:
    """Where a follower stands in one partition it fetches."""

    topic: bytes
    n: int
    topic_id: str
    offset: int  # the follower's log end offset: the next offset it wants (and its ack)
    last_epoch: int  # the epoch of its last batch (-1: none), checked by the leader (KIP-595)
    state_token: bytes  # the leader's stream state version it applied last
    group_token: bytes  # its position in the leader's group journal
    # Its copy's high watermark and log start as a reply of this leader set
    # them (-1: none applied yet). With them the leader leaves out of its
    # response a partition the reply would not change (``FetchResponse``).
    high_watermark: int = -1
    log_start: int = -1


@dataclass(frozen=True, slots=True)
class FetchRequest:
    replica: int  # the asking follower's node id
    view: bytes  # its ClusterState, compared and logged, never adopted
    max_wait_ms: int  # the long poll's bound
    max_bytes: int
    topics_token: bytes  # the leader's topics token it last saw (b"": list them)
    partitions: tuple[FetchPartition, ...] = ()


@dataclass(frozen=True, slots=True)
class Discovered:
    """A partition the leader leads for the asking follower, with its ``topic.meta``."""

    topic: bytes
    n: int
    meta: bytes


@dataclass(frozen=True, slots=True)
class FetchedPartition:
    """One partition of a fetch response. ``error`` is "" or one of
    ``cluster.replication``'s codes; with ``OUT_OF_RANGE`` the leader's
    ``log_start`` / ``log_end`` are set, with ``TOPIC_ID_MISMATCH`` its
    ``topic_meta``; the other fields are set when there is no error."""

    topic: bytes
    n: int
    error: str = ""
    high_watermark: int = 0
    log_start: int = 0
    log_end: int = 0
    batches: bytes = b""
    state_token: bytes = b""
    state: bytes | None = None  # the stream state blob, when it changed since state_token
    group_token: bytes = b""
    group_snapshot: bytes | None = None
    group_records: bytes = b""
    topic_meta: bytes | None = None


@dataclass(frozen=True, slots=True)
class FetchResponse:
    """``partitions``: the asked partitions with something for the follower
    (an error, batches, state or group changes, another high watermark or
    log start than its request shows); one left out is unchanged, the
    follower keeps it as it is (Kafka's incremental fetch, KIP-227, without
    the session: the request still names every partition, so the leader
    learns every offset, the ack, each round)."""

    view: bytes  # the leader's ClusterState
    topics_token: bytes
    discovered: tuple[Discovered, ...] | None  # None: the topics did not change since the follower's token
    partitions: tuple[FetchedPartition, ...] = ()


# -- truncation ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EpochPartition:
    topic: bytes
    n: int
    epoch: int  # the follower's latest epoch in that partition


@dataclass(frozen=True, slots=True)
class EpochRequest:
    partitions: tuple[EpochPartition, ...]


@dataclass(frozen=True, slots=True)
class EpochEnd:
    """The leader's answer for one partition: its largest epoch up to the
    asked one and that epoch's end offset, or an ``error`` code."""

    epoch: int = -1
    end_offset: int = -1
    error: str = ""


@dataclass(frozen=True, slots=True)
class EpochResponse:
    ends: tuple[EpochEnd, ...]


# -- manual failover -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PauseRequest:
    shard: int
    epoch: int  # the shard's epoch as the asking follower sees it
    ms: int  # how long to refuse writes (0: resume)


@dataclass(frozen=True, slots=True)
class PartitionEnd:
    """What a follower must hold of one partition before it takes over."""

    topic: bytes
    n: int
    end_offset: int
    high_watermark: int
    state_token: bytes
    group_token: bytes


@dataclass(frozen=True, slots=True)
class PauseResponse:
    ends: tuple[PartitionEnd, ...]


# -- the controller quorum -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RaftRequest:
    messages: tuple[Message, ...]


@dataclass(frozen=True, slots=True)
class BeatRequest:
    node: int
    incarnation: str
    offline: tuple[int, ...] = ()  # shards it holds a log of that a failed fsync took offline


@dataclass(frozen=True, slots=True)
class BeatResponse:
    commit_index: int  # the node's lease counts the beat once it applied this far


@dataclass(frozen=True, slots=True)
class ProposeRequest:
    record: bytes  # a cluster.controller.metadata record


@dataclass(frozen=True, slots=True)
class JoinRequest:
    node: int
    host: str
    port: int
    bus_port: int


@dataclass(frozen=True, slots=True)
class MoveRequest:
    shard: int


# -- forwarded writes ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AppendRequest:
    """``XADD key <options> <fields>`` for the partition's leader: ``options``
    are the client's, as given, up to and including the ID (``*``)."""

    idempotent = False  # never sent twice: a retry could store the entry twice

    key: bytes  # the partition key (``topic#n``)
    options: tuple[bytes, ...]
    fields: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class AppendResponse:
    id: bytes  # the new entry's ID, as the leader formatted it


@dataclass(frozen=True, slots=True)
class GroupRequest:
    """``XGROUP <op>`` of a topic key, for one partition's leader (``op``:
    ``create``, ``setid``, ``destroy``, ``createconsumer``, ``delconsumer``
    or ``config``): ``last_id`` None is ``$`` (the partition's last ID
    there), ``entries_read`` None is not given, ``max_deliveries`` 0 is no
    dead-lettering, ``consumer`` is CREATECONSUMER's / DELCONSUMER's."""

    idempotent = False  # never sent twice: a retried CREATE would answer BUSYGROUP

    op: str
    key: bytes  # the partition key (``topic#n``)
    group: bytes
    last_id: tuple[int, int] | None = None
    entries_read: int | None = None
    max_deliveries: int = 0
    dead_letter_key: bytes | None = None
    consumer: bytes = b""


@dataclass(frozen=True, slots=True)
class GroupResponse:
    count: int | None = None  # DESTROY's, CREATECONSUMER's or DELCONSUMER's integer answer; None: OK


# -- a member's group reads, from the group's coordinator ---------------------------------

# What a ``GroupPart`` asks of one partition (cluster/broker/topic_groups.py).
GROUP_READ_NEW = "new"  # ``>``: handed-over entries first, then (CLAIM) idle pending ones, then new ones
GROUP_READ_HISTORY = "history"  # the consumer's own pending entries after ``after``
GROUP_PENDING = "pending"  # only how many entries the consumer has pending there
GROUP_HAND_OVER = "handover"  # every entry pending there made the consumer's (``hand_over``), nothing read


@dataclass(frozen=True, slots=True)
class GroupPart:
    """One partition's share of a member's XREADGROUP on a topic key, for
    the partition's leader: ``op`` (``GROUP_*`` above) for ``consumer`` of
    ``group``. For ``GROUP_READ_NEW``: first the IDs of ``redeliver`` still
    pending for the consumer (handed over to it; with ``take_over``, every
    entry pending on the partition is made the consumer's first and they are
    the IDs), delivery count +1, then with ``claim_ms`` >= 0 the group's idle
    pending entries, then new ones (unless ``noack``, into the PEL); ``count``
    (0: no limit) over all of them. For ``GROUP_READ_HISTORY``: the
    consumer's pending entries after ``after``, at most ``count``. Either
    within what is left of the read's MAXCOUNT / MAXSIZE (``max_count``,
    ``max_size``: 0 none; ``served``: entries the read served before)."""

    topic: bytes
    n: int
    group: bytes
    consumer: bytes
    op: str
    count: int = 0
    noack: bool = False
    claim_ms: int = -1  # -1: no CLAIM
    after: tuple[int, int] = (0, 0)
    take_over: bool = False
    redeliver: tuple[tuple[int, int], ...] = ()
    max_count: int = 0
    max_size: int = 0
    served: int = 0


@dataclass(frozen=True, slots=True)
class GroupReadRequest:
    """Partitions the coordinator of a topic's group asks their leader to
    serve a member's read from (each leader writes the PEL changes to its
    group journal, replicated as any group write, before it answers)."""

    idempotent = False  # never sent twice: a second delivery would count twice

    parts: tuple[GroupPart, ...]


@dataclass(frozen=True, slots=True)
class GroupPartRead:
    """One partition's answer: ``count`` entries whose stored chunks,
    concatenated, are ``chunks`` (a ``(ms, seq)`` chunk: a pending entry no
    longer in the stream); ``claims``: per entry ``(ms idle, deliveries
    before)`` for a read with CLAIM (else None); ``queue``: handed-over IDs
    still to deliver first on the next read; ``pending``: how many entries
    the consumer has pending there now; ``position``: the group's
    last-delivered-id there; ``size``: the bytes of MAXSIZE it took."""

    count: int = 0
    chunks: tuple = ()
    claims: tuple[tuple[int, int], ...] | None = None
    queue: tuple[tuple[int, int], ...] = ()
    pending: int = 0
    position: tuple[int, int] = (0, 0)
    size: int = 0


@dataclass(frozen=True, slots=True)
class GroupReadResponse:
    parts: tuple[GroupPartRead, ...]  # in the request's order


# -- a topic's group views, from the partitions' leaders and the coordinator ------------


@dataclass(frozen=True, slots=True)
class PartGroup:
    """One group on one partition, as a topic's group views merge it
    (cluster/broker/groups.py: XINFO GROUPS / CONSUMERS, TOPIC GROUPS):
    its PEL's size, last-delivered-id, entries-read and lag (None: unknown),
    and per consumer, in name order, ``(name, pending, idle ms)`` (ms since
    it was last seen, by the answering node's clock)."""

    name: bytes
    pending: int
    last_id: tuple[int, int]
    entries_read: int | None
    lag: int | None
    consumers: tuple[tuple[bytes, int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class Membership:
    """A topic group's membership on its coordinator, synced (dead members
    expired): per live member, in name order, ``(name, idle ms, partitions
    it is assigned)``, and per partition its owner (None: unassigned or
    being handed over)."""

    name: bytes
    members: tuple[tuple[bytes, int, tuple[int, ...]], ...]
    owners: tuple[bytes | None, ...]


@dataclass(frozen=True, slots=True)
class GroupInfoRequest:
    """The groups of ``partitions`` of ``topic`` (only group ``only`` when
    given), for their leader; with ``members`` (for the coordinator, the
    leader of the topic key's slot) the memberships of the topic's groups
    too (synced first: dead members expire)."""

    topic: bytes
    partitions: tuple[int, ...]
    only: bytes | None = None
    members: bool = False


@dataclass(frozen=True, slots=True)
class GroupInfoResponse:
    parts: tuple[tuple[PartGroup, ...], ...]  # per asked partition, its groups in name order
    members: tuple[Membership, ...] = ()


# -- topic-wide reads fanned out ---------------------------------------------------------

# What a ``ReadPart`` asks of one partition (cluster/runtime/fanout.py).
READ_LENGTH = "len"  # its committed live entries
READ_RANGE = "range"  # entries with start <= ID <= end, oldest first
READ_REVRANGE = "revrange"  # the same, newest first
READ_AFTER = "after"  # entries with IDs above start
READ_AFTER_LAST = "after-last"  # entries after the partition's last ID now (XREAD's ``$``): its ``position``


@dataclass(frozen=True, slots=True)
class ReadPart:
    """One partition's share of a topic-wide read: ``op`` (``READ_*``),
    the IDs it needs (``start``, ``end``), at most ``count`` entries (0: no
    limit)."""

    topic: bytes
    n: int
    op: str
    start: tuple[int, int] = (0, 0)
    end: tuple[int, int] = (0, 0)
    count: int = 0


@dataclass(frozen=True, slots=True)
class ReadRequest:
    """Partitions this node asks their leader to read, committed entries
    only (below each partition's high watermark). With ``max_wait_ms`` a
    long poll: answered once a partition has entries (``READ_AFTER`` only),
    or when the time is up."""

    parts: tuple[ReadPart, ...]
    max_wait_ms: int = 0


@dataclass(frozen=True, slots=True)
class PartRead:
    """One partition's answer: ``length`` (``READ_LENGTH``), or the
    entries found, each as its ID and its stored encoding; ``position``:
    the ID a ``READ_AFTER`` / ``READ_AFTER_LAST`` read after."""

    length: int = 0
    ids: tuple[tuple[int, int], ...] = ()
    entries: tuple[bytes, ...] = ()
    position: tuple[int, int] = (0, 0)


@dataclass(frozen=True, slots=True)
class ReadResponse:
    parts: tuple[PartRead, ...]  # in the request's order


Request = (FetchRequest | EpochRequest | PauseRequest | RaftRequest | BeatRequest | ProposeRequest
           | JoinRequest | MoveRequest | AppendRequest | ReadRequest | GroupRequest | GroupReadRequest
           | GroupInfoRequest)
Response = (FetchResponse | EpochResponse | PauseResponse | BeatResponse | AppendResponse | ReadResponse
            | GroupResponse | GroupReadResponse | GroupInfoResponse | Ack)

RESPONSE_OF: dict[type, type] = {
    FetchRequest: FetchResponse, EpochRequest: EpochResponse, PauseRequest: PauseResponse,
    RaftRequest: Ack, BeatRequest: BeatResponse, ProposeRequest: Ack, JoinRequest: Ack,
    MoveRequest: Ack, AppendRequest: AppendResponse, ReadRequest: ReadResponse, GroupRequest: GroupResponse,
    GroupReadRequest: GroupReadResponse, GroupInfoRequest: GroupInfoResponse,
}
