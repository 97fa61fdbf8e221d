"""A session: one client's handle on the broker, and what its replies wait for.

Owns: every operation a front-end asks of the broker on behalf of one client
(one ``Session`` per connection), and the receipt those operations collect:
the fsync-always group-commit sequence the writes need (``flush_seq``) and,
in a cluster, the acks=all writes whose replies wait for the in-sync replicas
(``repl_pending``: partition key -> stream, ``("groups", topic, n)`` ->
group store, or ``("topics", record)`` -> a RENAME's topic record that the
controller must commit). A front-end never notes a write itself: it calls
an operation, shapes the reply, and before it sends the replies produced so
far takes the receipt (``take_receipt``) and waits for it
(``Durability.when_durable`` / ``wait_for_flush``, ``Replication.when_acked``
/ ``wait_acks``). Once it is
settled every write it covers is durable by its topic's fsync policy and, on
acks=all topics, on the in-sync replicas.

Also: the client's replicated writes so far (``repl_writes``, for WAIT), and
whether its appends may be deferred (``may_defer``: a front-end's own loop,
outside a transaction) with the token of the last deferred one
(``deferred``: ``(stream, round)``, for the front-end to learn whether its
commit failed, ``failure(token)``).

Must not know: sockets, protocols, reply shapes, error texts.
"""

from __future__ import annotations

from typing import Any, Sequence

from cluster.broker.groups import GroupOps
from cluster.broker.memory import MemoryOps
from cluster.broker.producers import ProducerOps
from cluster.broker.reads import ReadOps
from cluster.broker.records import RecordOps
from cluster.broker.references import KEEPREF, REF_POLICIES, ReferenceOps
from cluster.broker.shares import ShareOps
from cluster.broker.topic_groups import TopicGroupOps
from cluster.errors import Moved, TryAgain
from cluster.peer.messages import AppendRequest
from cluster.replica_manager import NotEnoughReplicasError, NotLeaderError
from cluster.runtime.replication import AcksFailed
from cluster.topics import TopicError, partition_key, split_partition_key
from storage.errors import BeyondHighWatermarkError
from storage.streams.ids import StreamId

# An entry with more field/value bytes than this is appended at once, and a
# stream's deferred entries are committed once they reach it: memory stays
# bounded, and so does a log batch (a read of a few entries preads whole
# batches; 32 KiB costs little, 1000 entries of 150 B would cost 150 KiB).
DEFER_MAX_BYTES = 32 * 1024

# A trim waiting for the replicas (``Session._trim_or_wait``) tries again
# after each wait; appends that keep overtaking it end it after this many.
TRIM_WAITS_MAX = 20


def _topic_and_partition(key: bytes) -> tuple[bytes, int]:
    topic, n = split_partition_key(key)
    return topic, n or 0


class EntryTooLargeError(Exception):
    """An entry over its topic's ``max-entry-bytes``; nothing was written."""

    def __init__(self, entry_bytes: int, max_entry_bytes: int) -> None:
        super().__init__(f"entry of {entry_bytes} bytes over max-entry-bytes {max_entry_bytes}")
        self.entry_bytes = entry_bytes
        self.max_entry_bytes = max_entry_bytes


class Trim:
    """A trim of a stream (XADD's MAXLEN/MINID, XTRIM): ``strategy`` is
    ``"MAXLEN"`` (keep ``maxlen`` entries) or ``"MINID"`` (drop entries below
    ``minid``); ``approx`` trims whole nodes of ``node_entries`` entries only
    (Redis's ``stream-node-max-entries`` when the command ran), at most
    ``limit`` entries (0: no limit). ``policy``: what becomes of the consumer
    groups' references to the entries it removes (Redis 8.2's ``KEEPREF``,
    ``DELREF``, ``ACKED``: ``cluster.broker.references``)."""

    __slots__ = ("strategy", "approx", "maxlen", "minid", "limit", "node_entries", "policy")

    def __init__(self, strategy: str, approx: bool = False, maxlen: int = 0,
                 minid: tuple[int, int] = (0, 0), limit: int = 0, node_entries: int = 100,
                 policy: str = KEEPREF) -> None:
        assert strategy in ("MAXLEN", "MINID") and policy in REF_POLICIES
        self.strategy = strategy
        self.approx = approx
        self.maxlen = maxlen
        self.minid = minid
        self.limit = limit
        self.node_entries = node_entries
        self.policy = policy

    def apply(self, stream: Any) -> int:
        if self.strategy == "MAXLEN":
            return stream.trim_maxlen(self.maxlen, approx=self.approx, limit=self.limit,
                                      node_entries=self.node_entries)
        return stream.trim_minid(StreamId(*self.minid), approx=self.approx, limit=self.limit,
                                 node_entries=self.node_entries)


class XAddPlan:
    """One XADD, whoever parsed it: the entry ``fields`` (field, value, ...)
    for ``key``; the ID as given (``id_ms``/``id_seq`` both None: ``*``;
    ``id_seq`` None: ``<ms>-*``), ``nomkstream``, and a trim to apply after
    the append. ``entry_bytes``: the fields' total length, if the parser
    has it. ``options``: the words between the key and the fields as the
    client gave them, for a cluster node that forwards the append to the
    partition's leader (which parses them again). ``idmp``: IDMP / IDMPAUTO
    (``cluster.broker.producers.Idempotence``; only with ``*``)."""

    __slots__ = ("key", "fields", "id_ms", "id_seq", "nomkstream", "trim", "entry_bytes", "options", "idmp")

    def __init__(self, key: bytes, fields: Sequence[bytes], id_ms: int | None = None,
                 id_seq: int | None = None, nomkstream: bool = False, trim: Trim | None = None,
                 entry_bytes: int = -1, options: tuple[bytes, ...] = (b"*",), idmp: Any = None) -> None:
        self.key = key
        self.fields = fields
        self.id_ms = id_ms
        self.id_seq = id_seq
        self.nomkstream = nomkstream
        self.trim = trim
        self.entry_bytes = entry_bytes
        self.options = options
        self.idmp = idmp


class Receipt:
    """What the replies of a batch wait for (see the module docstring)."""

    __slots__ = ("flush_seq", "repl_pending")

    def __init__(self, flush_seq: int, repl_pending: dict | None) -> None:
        self.flush_seq = flush_seq
        self.repl_pending = repl_pending


class Session(GroupOps, TopicGroupOps, ReadOps, ReferenceOps, ProducerOps, RecordOps, MemoryOps, ShareOps):
    """One client's handle on a ``Broker`` (``Broker.session()``)."""

    __slots__ = ("broker", "client_id", "flush_seq", "repl_pending", "repl_writes", "may_defer", "may_block",
                 "deferred", "_deferred_any")

    def __init__(self, broker: Any, client_id: int = 0) -> None:
        self.broker = broker
        self.client_id = client_id
        self.flush_seq = 0  # group-commit sequence the replies so far wait for
        self.repl_pending: dict | None = None  # acks=all writes the replies so far wait for
        self.repl_writes: dict | None = None  # every replicated write of this client (WAIT)
        self.may_defer = False
        self.may_block = True  # False inside a transaction: nothing may wait (a forwarded append)
        self.deferred: tuple[Any, int] | None = None  # the last append's token, if deferred
        self._deferred_any = False  # a deferred append since the last take_receipt

    # -- receipts ------------------------------------------------------------

    def take_receipt(self) -> Receipt | None:
        """Commit deferred appends, then what the replies produced since the
        last call wait for (None: nothing), and start anew."""
        appends = self.broker.appends
        if appends.streams:
            appends.commit()
        if self._deferred_any:
            self._deferred_any = False
            if appends.flush_seq > self.flush_seq:
                self.flush_seq = appends.flush_seq  # fsync always: the commit's round
        seq, pending = self.flush_seq, self.repl_pending
        if not seq and not pending:
            return None
        self.flush_seq = 0
        self.repl_pending = None
        return Receipt(seq, pending)

    def awaits_own_writes(self, keys: Sequence[bytes]) -> bool:
        """Whether an acks=all append of this session that its receipt does
        not cover yet (taken and settled) went to the topic of one of
        ``keys``: a command on them must run after that receipt settles to
        read what the client wrote (reads stop at the high watermark, which
        such an append has not passed). Group journal writes do not count:
        group state is read from memory, as written."""
        pending = self.repl_pending
        if not pending:
            return False
        topics = self.broker.topics
        written = {topics.topic_of(pkey) for pkey in pending if pkey.__class__ is bytes}
        for key in keys:
            try:
                if topics.topic_of(key) in written:
                    return True
            except TopicError:
                continue  # a malformed partition key: its command refuses it
        return False

    def failure(self, token: tuple[Any, int]) -> BaseException | None:
        """Why a deferred append (its ``deferred`` token) was not written, or
        None once it was; ask after ``take_receipt``."""
        stream, round_ = token
        return self.broker.appends.failure(round_, stream)

    def wrote_log(self, log: Any) -> None:
        """A broker operation appended to (or changed) ``log``."""
        durability = self.broker.durability
        if durability is not None:
            seq = durability.note_write(log, self.broker.config.fsync)
            if seq > self.flush_seq:
                self.flush_seq = seq

    def wrote_group(self, store: Any) -> None:
        """A broker operation changed a consumer group store: durable as a log
        write, and on acks=all topics replicated before the reply."""
        self.wrote_log(store)
        replication = self.broker.replication
        if replication is not None:
            replication.note_group_write(self, store)

    def commit_deferred(self) -> None:
        """Reads and immediate writes see every deferred append before them."""
        appends = self.broker.appends
        if appends.streams:
            appends.commit()

    # -- stream writes -----------------------------------------------------

    def append(self, plan: XAddPlan) -> Any:
        """THE append: route, partitioner, leader and in-sync checks, limits,
        ID, deferral or an immediate log batch, trim, wake-ups, receipt.

        Returns the new entry's ``StreamId``; None when ``nomkstream`` and the
        key does not exist; in a cluster, for a topic key whose chosen
        partition another node leads, the awaitable of the forwarded append
        (the leader's reply). Raises EntryTooLargeError, the stream's and the
        topic registry's refusals, NotLeaderError / NotEnoughReplicasError;
        nothing is written then. ``self.deferred`` is the token of a deferred
        append, else None.
        """
        broker = self.broker
        topics = broker.topics
        key = plan.key
        fields = plan.fields
        entry_bytes = plan.entry_bytes
        if entry_bytes < 0:
            entry_bytes = len(fields[0]) + len(fields[1]) if len(fields) == 2 else sum(map(len, fields))
        max_entry_bytes = topics.max_entry_bytes(topics.topic_of(key))
        if entry_bytes > max_entry_bytes:
            raise EntryTooLargeError(entry_bytes, max_entry_bytes)
        deferrable = (self.may_defer and plan.id_ms is None and plan.trim is None and plan.idmp is None
                      and entry_bytes < DEFER_MAX_BYTES)
        self.deferred = None
        if not deferrable:
            self.commit_deferred()
        replication = broker.replication
        target_key = key
        if replication is not None and topics.is_multi(key):
            # The topic key's slot is led here: pick the partition, and send
            # the append to its leader when that is another node.
            forwarder = replication.forwarder
            idmp = plan.idmp
            target_key, leader = forwarder.choose(key, fields, idmp.producer_id if idmp is not None else None)
            if leader != forwarder.my_id:
                if not self.may_block:
                    raise forwarder.in_transaction(key, target_key, leader)
                return self._forward(plan, target_key, leader)
        elif not deferrable and plan.idmp is not None and topics.is_multi(key):
            target_key = self._idempotent_target(key, plan.idmp, fields)
        return self._append_to(plan, target_key, fields, deferrable)

    def _append_to(self, plan: XAddPlan, target_key: bytes, fields: Sequence[bytes],
                   deferrable: bool) -> StreamId | None:
        broker = self.broker
        topics = broker.topics
        replication = broker.replication
        key = plan.key
        target = topics.append_target(target_key, fields, create=not plan.nomkstream)
        if target is None:
            return None
        stream, pkey = target
        if replication is not None:
            self._before_replicated_append(pkey, stream)
        siblings = topics.sibling_keys(key, pkey)  # readers of the topic and partition keys wake
        if deferrable:
            new_id = stream.add(fields, defer=True)
            appends = broker.appends
            appends.defer(stream, key, siblings)  # the commit notes the write and wakes readers
            self._deferred_any = True
            if stream.pending_bytes >= DEFER_MAX_BYTES:  # bounded memory: write now
                done = appends.round
                appends.commit()
                error = appends.failure(done, stream)
                if error is not None:
                    raise error
            else:
                self.deferred = (stream, appends.round)
            return new_id
        if plan.idmp is not None:
            new_id, duplicate = self._append_idempotent(stream, plan)
            if duplicate:
                self.wrote_log(stream.log)  # the reply waits for the original's durability
                return new_id
        elif plan.id_ms is None:
            new_id = stream.add(fields)
        elif plan.id_seq is None:
            new_id = stream.add(fields, ms_given=plan.id_ms)
        else:
            new_id = stream.add(fields, id_given=StreamId(plan.id_ms, plan.id_seq))
        trimmed = self._trim_or_wait(key, pkey, stream, plan.trim) if plan.trim is not None else 0
        self.wrote_log(stream.log)
        signal = broker.keys.signal
        signal(key)
        for other in siblings:
            signal(other)
        topics.note_entries_in(1)
        if trimmed.__class__ is not int:  # the trim waits for the replicas: so does the reply
            return self._then(trimmed, new_id)
        return new_id

    async def _forward(self, plan: XAddPlan, pkey: bytes, leader: int) -> bytes | StreamId:
        """``plan`` for partition ``pkey``, sent to its ``leader``: the new ID
        as the leader sent it, or (leadership moved here meanwhile) the ID
        of the append made here. Raises the leader's refusal (``Refused``,
        relayed as it is) or ``TryAgain``."""
        forwarder = self.broker.replication.forwarder
        request = AppendRequest(pkey, tuple(plan.options), tuple(plan.fields))
        response = await forwarder.forward(request, leader, self.client_id)
        if response is not None:
            return response.id
        try:
            new_id = self._append_to(plan, pkey, plan.fields, False)
        except Moved as e:  # this node's view is behind: the client retries
            raise forwarder.moving_here(pkey, e) from None
        return new_id if new_id.__class__ is StreamId else await new_id

    def append_run(self, key: bytes, scan: Any) -> tuple | None:
        """Many ``XADD key * field value ...`` of one key at once, parsed by a
        front-end's fast scanner (the RESP front-end's C one): the same
        rules as ``append``'s deferred form, checked once for the run.

        ``scan(last_ms, last_seq, clock_ms, max_entry_bytes, budget_bytes)``
        takes as many entries as fit the limits and returns ``(end, entries,
        replies, last_ms, last_seq, used_bytes)``: ``entries`` the
        ``(ms, seq, encoding)`` of each, IDs assigned after the given last
        one as ``*`` does. Returns ``(scan's end, scan's replies, count,
        token)``, or None when nothing was taken (the caller then runs the
        commands one by one, which gives every error): the key must name a
        partition written through before (no creation), or, on a single
        node, be the bare key of a topic of several partitions without a
        ``partition-key-field`` (the sticky partitioner sends the whole run
        to one partition); in a cluster this node must accept the append
        (leader, enough in-sync replicas for acks=all).
        """
        broker = self.broker
        if not self.may_defer:
            return None
        topics = broker.topics
        replication = broker.replication
        target = topics.known_target(key)
        sticky = target is None
        if sticky:
            if replication is not None:
                return None  # in a cluster each entry is routed on its own
            target = topics.run_target(key)
            if target is None:
                return None
        stream, pkey, siblings = target
        budget = DEFER_MAX_BYTES - stream.pending_bytes
        if budget <= 0:
            return None
        max_entry_bytes = min(topics.max_entry_bytes(topics.topic_of(key)), DEFER_MAX_BYTES - 1)
        last_ms, last_seq = stream.id_floor
        end, entries, replies, last_ms, last_seq, used = scan(
            last_ms, last_seq, stream.clock_ms(), max_entry_bytes, budget)
        if not entries:
            return None
        if replication is not None:
            try:
                self._before_replicated_append(pkey, stream)
            except (NotLeaderError, NotEnoughReplicasError):
                return None  # nothing deferred: each command gets the general path's error
        stream.defer_encoded(entries, (last_ms, last_seq), used)
        if sticky:
            topics.took_run(key)
        appends = broker.appends
        appends.defer(stream, key, siblings)
        self._deferred_any = True
        token = (stream, appends.round)
        if stream.pending_bytes >= DEFER_MAX_BYTES:  # bounded memory: write now
            appends.commit()
        return end, replies, len(entries), token

    def _before_replicated_append(self, pkey: bytes, stream: Any) -> None:
        """In a cluster, before appending to partition ``pkey``: this node
        must lead it, and an acks=all topic needs min-insync-replicas in
        sync (raises NotLeaderError / NotEnoughReplicasError, nothing
        written); an acks=all append's reply then waits for the in-sync
        replicas (the receipt's ``repl_pending``)."""
        self.broker.replication.before_append(self, pkey, stream)  # (notes it in ``repl_pending``)

    def trim(self, key: bytes, trim: Trim) -> Any:
        """XTRIM: entries removed (0 when the key does not exist), with the
        trim's reference policy (``apply_trim``); in a cluster, when the
        trim must wait for the replicas (``_trim_or_wait``), the awaitable
        of that number."""
        self.commit_deferred()
        stream = self.broker.topics.get(key)
        if stream is None:
            return 0
        removed = self._trim_or_wait(key, partition_key(*_topic_and_partition(key)), stream, trim)
        if removed.__class__ is int and removed:
            self.wrote_stream(key, stream)
        return removed

    # -- a trim never passes the high watermark ------------------------------

    def _trim_or_wait(self, key: bytes, pkey: bytes, stream: Any, trim: Trim) -> Any:
        """``apply_trim`` now: the entries removed. On a replicated
        partition the log start may not pass the high watermark (entries
        the in-sync replicas may not hold yet: storage refuses, nothing
        changed), so a trim that would (exact ones after writes not yet
        acknowledged, ``MAXLEN 0`` of an XADD's own entry) returns the
        awaitable that waits until the high watermark reaches the end,
        trims and notes the write. Raises TryAgain when the session may not
        wait (inside a transaction)."""
        try:
            return self.apply_trim(key, stream, trim)
        except BeyondHighWatermarkError:
            replication = self.broker.replication
            if replication is None:
                raise  # (a single node's high watermark is its end: never)
            if not self.may_block:
                raise TryAgain(f"the trim of {key.decode('utf-8', 'replace')} would remove entries the "
                               "in-sync replicas do not have yet; outside a transaction it waits for them") from None
            return self._trim_when_replicated(key, pkey, stream, trim)

    async def _trim_when_replicated(self, key: bytes, pkey: bytes, stream: Any, trim: Trim) -> int:
        replication = self.broker.replication
        for _ in range(TRIM_WAITS_MAX):
            try:
                await replication.wait_acks(self, {pkey: stream})
            except AcksFailed as e:
                raise TryAgain(f"the trim of {key.decode('utf-8', 'replace')} waits for in-sync replicas "
                               f"that cannot acknowledge it now ({e}); nothing was trimmed") from None
            if self.broker.topics.cached_stream(*_topic_and_partition(pkey)) is not stream:
                return 0  # deleted (or renamed) meanwhile
            try:
                removed = self.apply_trim(key, stream, trim)
            except BeyondHighWatermarkError:
                continue  # appends came meanwhile: wait for them too
            if removed:
                self.wrote_stream(key, stream)
            return removed
        raise TryAgain(f"the trim of {key.decode('utf-8', 'replace')} is overtaken by appends the in-sync "
                       "replicas have not acknowledged yet; nothing was trimmed")

    @staticmethod
    async def _then(waiting: Any, value: Any) -> Any:
        """``value`` once ``waiting`` (the awaitable of a trim) is done."""
        await waiting
        return value

    def delete(self, key: bytes, ids: list) -> int:
        """XDEL: entries deleted (deletion markers; log bytes are never
        rewritten in place)."""
        self.commit_deferred()
        stream = self.broker.topics.get(key)
        if stream is None:
            return 0
        deleted = stream.delete(ids)
        if deleted:
            self.wrote_stream(key, stream)
        return deleted

    def set_id(self, key: bytes, last_id: StreamId, entries_added: int | None,
               max_deleted_entry_id: StreamId | None) -> bool:
        """XSETID; False when the key does not exist."""
        self.commit_deferred()
        stream = self.broker.topics.get(key)
        if stream is None:
            return False
        stream.set_id(last_id, entries_added=entries_added, max_deleted_entry_id=max_deleted_entry_id)
        self.wrote_stream(key, stream)
        return True

    # -- reads -------------------------------------------------------------

    def exists(self, key: bytes) -> bool:
        """Whether ``key`` names an existing stream (a partition, or a topic)."""
        self.commit_deferred()
        return self.broker.topics.get(key) is not None

    def wrote_stream(self, key: bytes, stream: Any) -> None:
        """A broker operation changed ``stream``'s state (deletion markers, a
        trim, its metadata) through ``key``: durable as a log write, readers
        and the followers' held fetches woken, and on an acks=all topic
        replicated to every in-sync replica before the reply (as a group
        write is)."""
        self.wrote_log(stream.log)
        self.broker.keys.signal(key)
        replication = self.broker.replication
        if replication is not None:
            replication.note_state_write(self, stream)
