"""Redis stream commands on Partita's partition logs.

Owns: XADD, XRANGE, XREVRANGE, XLEN, XDEL, XTRIM, XSETID, XREAD and
XINFO STREAM / HELP: argument parsing with Redis's own error texts (order
of checks as in redis ``t_stream.c``), and shaping replies. The read path
never decodes entries: XRANGE/XREAD reply with ``Raw`` over the stored bytes.

Consumer groups (XGROUP, XREADGROUP, XACK, ..., XINFO GROUPS/CONSUMERS)
belong to ``server.commands.groups``, which also supplies XINFO STREAM's ``groups``.

Must not know: sockets, RESP bytes, segment files. Keys become streams only
through ``ctx.server.topics`` (``cluster.topics.TopicRegistry``).

Known differences from Redis 7.0 (see docs and tests):
- ``XREAD ... STREAMS key +`` reads the last entry (Redis 7.4 semantics).
- A woken ``XREAD BLOCK`` re-runs the read and replies with every key that
  has data (Redis 7.2+), not only the key that woke it (7.0).
- ``radix-tree-keys`` / ``radix-tree-nodes`` are estimates (Partita has no
  radix tree); they equal Redis's for streams of up to
  ``stream-node-max-entries`` entries.
- In RESP3 an XREAD naming the same key twice replies with one map entry.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import trio

from cluster.errors import ClusterError, Moved
from cluster.peer.messages import AppendRequest
from server.args import parse_int
from server.errors import (
    TIMEOUT_NEGATIVE,
    TIMEOUT_NOT_INTEGER,
    CommandError,
    err,
    syntax_error,
    wrong_arity,
)
from server.commands.topics import expand_read_args, read_partitions_after, topic_len, topic_range
from server.failures import entry_too_large, reply_for
from server.registry import COMMANDS, POLLS, RUNS, command, container, nowait_path
from server.reply import NULL_ARRAY, OK, Map, Raw, Simple
from storage.entry_codec import decode_entry
from storage.streams.ids import (
    MAX_ID,
    MIN_ID,
    StreamId,
    format_id,
    parse_id,
    parse_range_end,
    parse_range_start,
    parse_strict_id,
)
from storage.streams.stream import ID_ZERO, StreamError

NO_SUCH_KEY = "no such key"


def _keyword(raw: bytes) -> bytes:
    return raw.upper()


def _after_write(ctx, key: bytes, stream) -> None:
    ctx.note_write(stream.log)
    ctx.server.signal_key_modified(key)


def route_xadd(ctx, argv: list[bytes], fields: list[bytes]):
    """``XADD <topic> ...`` on a multi-partition topic in cluster mode
    (cluster/runtime/forwarding.py picks the partition and forwards).

    Returns the partition key (``orders#n``) when this node leads it (the
    caller appends there), else the coroutine that forwards the entry to the
    partition's leader and returns the leader's reply (the connection awaits
    it). Raises inside MULTI when the partition is led elsewhere."""
    forwarder = ctx.server.replication.forwarder
    pkey, leader = forwarder.choose(argv[1], fields)
    if leader == forwarder.my_id:
        return pkey
    if not ctx.may_block:
        raise forwarder.in_transaction(argv[1], pkey, leader)
    return _forwarded(ctx, AppendRequest(pkey, tuple(argv[2:len(argv) - len(fields)]), tuple(fields)), leader)


async def _forwarded(ctx, request: AppendRequest, leader: int):
    """The forward's reply for the client: the leader's ID, or an error
    reply (the leader's own, byte for byte). Never raises (but Cancelled)."""
    started = time.perf_counter_ns()
    try:
        reply = await ctx.server.replication.forwarder.forward(request, leader, ctx.client.id)
        if reply is None:  # leadership moved here since the choice: run it as the client's own XADD
            try:
                reply = COMMANDS["xadd"].handler(ctx, [b"XADD", request.key, *request.options, *request.fields])
            except Moved as e:  # this node's view is behind: the client retries
                raise ctx.server.replication.forwarder.moving_here(request.key, e) from None
    except CommandError as e:
        reply = e
    except Exception as e:  # noqa: BLE001 - a refusal, or a bug
        reply = reply_for(e)
        if reply is None:
            raise
    stats = ctx.server.stats
    entry = stats.commands.get("xadd")
    if entry is not None:  # the dispatcher counted the call already; add the wait
        entry[1] += (time.perf_counter_ns() - started) // 1000
        if isinstance(reply, CommandError):
            entry[3] += 1
    if isinstance(reply, CommandError):
        stats.record_error(reply.code)
    return reply


def _replicated_write(ctx, partition_key: bytes, stream) -> None:
    """Cluster mode, before an XADD appends: this node must lead the
    partition, and an acks=all topic needs min-insync-replicas in sync
    (raises, nothing written). An acks=all batch's replies then wait for the
    in-sync replicas (``Connection._flush``, cluster/runtime/replication.py)."""
    if ctx.server.replication.before_append(ctx.client, partition_key, stream):
        pending = ctx.repl_pending
        if pending is None:
            pending = ctx.repl_pending = {}
        pending[partition_key] = stream


def _node_max_entries(ctx) -> int:
    value = getattr(ctx.server.config, "stream_node_max_entries", 100)
    return 100 if value is None else int(value)


# ------------------------------------------------------------ XADD / XTRIM


@dataclass
class _AddTrimArgs:
    strategy: str | None = None  # "MAXLEN" | "MINID"
    approx: bool = False
    maxlen: int = 0
    minid: StreamId = MIN_ID
    limit: int = 0
    no_mkstream: bool = False
    id_given: bool = False
    seq_given: bool = True
    stream_id: StreamId = MIN_ID
    id_pos: int = 0


def _parse_add_or_trim(ctx, argv: list[bytes], xadd: bool) -> _AddTrimArgs:
    """Redis ``streamParseAddOrTrimArgsOrReply``: same checks, same order."""
    args = _AddTrimArgs()
    limit_given = False
    argc = len(argv)
    i = 2
    while i < argc:
        more = argc - 1 - i
        opt = argv[i]
        word = _keyword(opt)
        if xadd and opt == b"*":
            break
        if (word == b"MAXLEN" or word == b"MINID") and more:
            if args.strategy is not None:
                raise err("syntax error, MAXLEN and MINID options at the same time are not compatible")
            args.approx = False
            nxt = argv[i + 1]
            if more >= 2 and nxt == b"~":
                args.approx = True
                i += 1
            elif more >= 2 and nxt == b"=":
                i += 1
            if word == b"MAXLEN":
                args.maxlen = parse_int(argv[i + 1])
                if args.maxlen < 0:
                    raise err("The MAXLEN argument must be >= 0.")
            else:
                args.minid = parse_strict_id(argv[i + 1])
            i += 1
            args.strategy = word.decode()
        elif word == b"LIMIT" and more:
            args.limit = parse_int(argv[i + 1])
            if args.limit < 0:
                raise err("The LIMIT argument must be >= 0.")
            limit_given = True
            i += 1
        elif xadd and word == b"NOMKSTREAM":
            args.no_mkstream = True
        elif xadd:
            args.stream_id, args.seq_given = parse_id(opt, strict=True, allow_seq_star=True)
            args.id_given = True
            break
        else:
            raise syntax_error()
        i += 1
    args.id_pos = i

    if args.limit and args.strategy is None:
        raise err("syntax error, LIMIT cannot be used without specifying a trimming strategy")
    if not xadd and args.strategy is None:
        raise err("syntax error, XTRIM must be called with a trimming strategy")
    if limit_given:
        if not args.approx:
            raise err("syntax error, LIMIT cannot be used without the special ~ option")
    elif args.approx:
        args.limit = 100 * _node_max_entries(ctx)
        if args.limit <= 0 or args.limit > 10000:
            args.limit = 10000
    else:
        args.limit = 0
    return args


def _trim(stream, args: _AddTrimArgs) -> int:
    if args.strategy == "MAXLEN":
        return stream.trim_maxlen(args.maxlen, approx=args.approx, limit=args.limit)
    if args.strategy == "MINID":
        return stream.trim_minid(args.minid, approx=args.approx, limit=args.limit)
    return 0


@command(
    "xadd", arity=-5, flags="write denyoom fast", keys=(1, 1, 1), group="stream", since="5.0.0",
    summary="Appends a new message to a stream. Creates the key if it doesn't exist.",
    syntax="XADD key [NOMKSTREAM] [<MAXLEN | MINID> [= | ~] threshold [LIMIT count]] <* | id> field value [field value ...]",
    acl_categories=("write", "stream", "fast"),
)
def xadd(ctx, argv):
    """XADD key [NOMKSTREAM] [<MAXLEN | MINID> [= | ~] threshold [LIMIT count]] <* | id> field value [field value ...]

    The whole entry is encoded once and appended as one log batch; the reply
    waits for durability by the fsync policy (``ctx.note_write``).
    """
    if argv[2] == b"*" and len(argv) & 1:
        return _xadd_star(ctx, argv)
    if ctx.appends is not None and ctx.appends.streams:
        ctx.appends.commit()  # this XADD appends now: deferred entries first
    args = _parse_add_or_trim(ctx, argv, xadd=True)
    field_pos = args.id_pos + 1
    nfields = len(argv) - field_pos
    if nfields < 2 or nfields % 2:
        raise wrong_arity("xadd")
    if args.id_given and args.seq_given and args.stream_id == MIN_ID:
        raise StreamError(ID_ZERO)
    key = argv[1]
    topics = ctx.server.topics
    # Per-topic max-entry-bytes (server default for a new topic); nothing is written.
    max_entry_bytes = topics.max_entry_bytes(topics.topic_of(key))
    entry_bytes = sum(len(item) for item in argv[field_pos:])
    if entry_bytes > max_entry_bytes:
        raise entry_too_large(entry_bytes, max_entry_bytes)
    # A multi-partition topic key goes through the partitioner (cluster.topics).
    target_key = key
    if ctx.server.replication is not None and topics.is_multi(key):
        target_key = route_xadd(ctx, argv, argv[field_pos:])  # cluster: cluster/runtime/forwarding.py
        if target_key.__class__ is not bytes:
            return target_key  # forwarded to the partition's leader: the connection awaits it
    target = topics.append_target(target_key, argv[field_pos:], create=not args.no_mkstream)
    if target is None:
        return None
    stream, partition_key = target
    if ctx.server.replication is not None:
        _replicated_write(ctx, partition_key, stream)
    if not args.id_given:
        new_id = stream.add(argv[field_pos:])
    elif args.seq_given:
        new_id = stream.add(argv[field_pos:], id_given=args.stream_id)
    else:
        new_id = stream.add(argv[field_pos:], ms_given=args.stream_id.ms)
    _trim(stream, args)
    _after_write(ctx, key, stream)
    topics.note_entries_in(1)
    # Readers blocked on the topic key or on the partition key both wake.
    for other in topics.sibling_keys(key, partition_key):
        ctx.server.signal_key_modified(other)
    return new_id.encode()


# An entry with more field/value bytes than this is appended at once, and a
# stream's deferred entries are committed once they reach it: memory stays
# bounded, and so does a log batch (a read of a few entries preads whole
# batches; 32 KiB costs little, 1000 entries of 150 B would cost 150 KiB).
DEFER_MAX_BYTES = 32 * 1024


def _xadd_star(ctx, argv):
    """The hot form ``XADD key * field value [field value ...]``: no options.

    Same checks and replies as the general path; the entry is deferred
    (``ctx.defer``) so a pipeline of XADDs becomes one log batch.
    """
    key = argv[1]
    server = ctx.server
    topics = server.topics
    fields = argv[3:]
    max_entry_bytes = topics.max_entry_bytes(topics.topic_of(key))
    entry_bytes = len(fields[0]) + len(fields[1]) if len(fields) == 2 else sum(map(len, fields))
    if entry_bytes > max_entry_bytes:
        raise entry_too_large(entry_bytes, max_entry_bytes)
    if server.replication is not None:
        target_key = key
        if topics.is_multi(key):
            target_key = route_xadd(ctx, argv, fields)  # cluster: cluster/runtime/forwarding.py
            if target_key.__class__ is not bytes:
                return target_key  # forwarded to the partition's leader: the connection awaits it
        stream, partition_key = topics.append_target(target_key, fields)
        _replicated_write(ctx, partition_key, stream)
    else:
        stream, partition_key = topics.append_target(key, fields)
    # Readers blocked on the topic key or on the partition key both wake.
    siblings = topics.sibling_keys(key, partition_key)
    if ctx.may_defer and entry_bytes < DEFER_MAX_BYTES:
        new_id = stream.add(fields, defer=True)
        # The commit (server.appends) notes the write and wakes readers, once
        # per batch. (``ctx.defer`` inlined.)
        appends = ctx.appends
        appends.defer(stream, key, siblings, reply_for)  # what an immediate append failing so would answer
        ctx.defer_mark = stream
        if stream.pending_bytes >= DEFER_MAX_BYTES:  # bounded memory: write now
            ctx.defer_mark = None  # this reply is no longer a deferred one
            done = appends.round
            appends.commit()
            error = appends.failure(done, stream)
            if error is not None:
                raise error
        return b"%d-%d" % new_id
    if ctx.appends is not None and ctx.appends.streams:
        ctx.appends.commit()
    new_id = stream.add(fields)
    ctx.note_write(stream.log)
    signal = server.signal_key_modified
    signal(key)
    topics.note_entries_in(1)
    for other in siblings:
        signal(other)
    return b"%d-%d" % new_id


try:  # the C half of the pipelined XADD path (server/_xaddrun.c); optional
    from server import _xaddrun
except ImportError:  # pragma: no cover - built by every install that has a C compiler
    _xaddrun = None


def xadd_run(ctx, data: bytes, pos: int, route=None):
    """A run of ``XADD key * field value ...`` taken straight from received bytes.

    The pipelined form of ``_xadd_star``: ``_xaddrun.scan`` parses the
    consecutive commands at ``data[pos:]`` that are exactly ``XADD <key> *
    f v ...`` for one key, assigns their IDs and builds their stored
    encodings and ID replies; they are deferred on the stream as
    ``_xadd_star`` defers one. Returns ``(end, replies, count, stream,
    round)`` (``replies`` the concatenated ID replies; ``round`` the commit
    round they belong to, for the connection's failure marks) or None when
    nothing was taken: then the general path gives the same commands their
    replies, errors included.

    Taken only where ``_xadd_star`` would defer without further checks: the
    caller (``Dispatcher.xadd_run``) has checked the client (authenticated,
    no MULTI, no ACL restriction); here the key must already name one
    partition that was written through before (``known_target``: no
    creation), or, on a single node, be the bare key of a topic of several
    partitions without a ``partition-key-field``: the sticky partitioner
    sends the whole run to one partition (``TopicRegistry.run_target``,
    docs/topics.md). Each entry must be within the topic's
    ``max-entry-bytes`` and the deferral bound, and in a cluster ``route``
    (the dispatcher's ``-MOVED`` check) must pass for the key and this node
    must accept the append (``_replicated_write``: leader, enough in-sync
    replicas for acks=all; an acks=all run's replies then wait for them).
    A refusal leaves the commands to the general path and its errors.
    """
    key = _xaddrun.head_key(data, pos)
    if key is None:
        return None
    server = ctx.server
    topics = server.topics
    target = topics.known_target(key)
    sticky = target is None
    if sticky:
        # A topic key of several partitions (single node): the whole run goes
        # to the partition the round-robin counter points at (Kafka's sticky
        # partitioner), which moves on once the run is taken. In a cluster
        # each entry is routed on its own (cluster/runtime/forwarding.py).
        if server.replication is not None:
            return None
        target = topics.run_target(key)
        if target is None:
            return None
    stream, partition_key, siblings = target
    if route is not None and route(_XADD_SPEC, [b"xadd", key]) is not None:
        return None
    budget = DEFER_MAX_BYTES - stream.pending_bytes
    if budget <= 0:
        return None
    max_entry_bytes = min(topics.max_entry_bytes(topics.topic_of(key)), DEFER_MAX_BYTES - 1)
    last_ms, last_seq = stream.last_id
    end, entries, replies, last_ms, last_seq, used = _xaddrun.scan(
        data, pos, key, last_ms, last_seq, stream.clock_ms(), max_entry_bytes, budget)
    if not entries:
        return None
    if server.replication is not None:
        try:
            _replicated_write(ctx, partition_key, stream)
        except ClusterError:
            return None  # nothing deferred: each command gets the general path's error
    stream.defer_encoded(entries, (last_ms, last_seq), used)
    if sticky:
        topics.took_run(key)
    appends = ctx.appends
    appends.defer(stream, key, siblings, reply_for)
    round_ = appends.round
    if stream.pending_bytes >= DEFER_MAX_BYTES:  # bounded memory: write now
        appends.commit()
    return end, replies, len(entries), stream, round_


_XADD_SPEC = COMMANDS["xadd"]
if _xaddrun is not None:
    RUNS["xadd"] = xadd_run


@command(
    "xtrim", arity=-4, flags="write", keys=(1, 1, 1), group="stream", since="5.0.0",
    summary="Deletes messages from the beginning of a stream.",
    syntax="XTRIM key <MAXLEN | MINID> [= | ~] threshold [LIMIT count]",
    acl_categories=("write", "stream", "slow"),
)
def xtrim(ctx, argv):
    """XTRIM key <MAXLEN | MINID> [= | ~] threshold [LIMIT count]

    ``=`` keeps exactly the right entries (moving the log start offset);
    ``~`` trims whole segments only (and at most LIMIT entries).
    """
    args = _parse_add_or_trim(ctx, argv, xadd=False)
    stream = ctx.server.topics.get(argv[1])
    if stream is None:
        return 0
    removed = _trim(stream, args)
    if removed:
        _after_write(ctx, argv[1], stream)
    return removed


# ------------------------------------------------------- XRANGE / XREVRANGE


def _range(ctx, argv, rev: bool):
    start_arg, end_arg = (argv[3], argv[2]) if rev else (argv[2], argv[3])
    start = parse_range_start(start_arg)
    end = parse_range_end(end_arg)
    count = -1
    j = 4
    while j < len(argv):
        if _keyword(argv[j]) == b"COUNT" and len(argv) - j - 1 >= 1:
            count = parse_int(argv[j + 1])
            if count < 0:
                count = 0
            j += 2
        else:
            raise syntax_error()
    topics = ctx.server.topics
    if topics.is_multi(argv[1]):  # partitions merged by ID
        return NULL_ARRAY if count == 0 else topic_range(
            ctx, argv[1], start, end, None if count == -1 else count, rev)
    stream = topics.get(argv[1])
    if stream is None:
        return []
    if count == 0:
        return NULL_ARRAY
    view = not rev and ctx.read_view()  # (reverse reads take no views)
    found = stream.range(start, end, None if count == -1 else count, rev=rev, view=view)
    topics.note_entries_out(found.count)
    if view and found.count:
        ctx.views = True
    return Raw(found.count, found.chunks)


@command(
    "xrange", arity=-4, flags="readonly", keys=(1, 1, 1), group="stream", since="5.0.0",
    summary="Returns the messages from a stream within a range of IDs.",
    syntax="XRANGE key start end [COUNT count]",
    acl_categories=("read", "stream", "slow"),
)
def xrange(ctx, argv):
    """XRANGE key start end [COUNT count]"""
    return _range(ctx, argv, rev=False)


@command(
    "xrevrange", arity=-4, flags="readonly", keys=(1, 1, 1), group="stream", since="5.0.0",
    summary="Returns the messages from a stream within a range of IDs in reverse order.",
    syntax="XREVRANGE key end start [COUNT count]",
    acl_categories=("read", "stream", "slow"),
)
def xrevrange(ctx, argv):
    """XREVRANGE key end start [COUNT count]"""
    return _range(ctx, argv, rev=True)


@command(
    "xlen", arity=2, flags="readonly fast", keys=(1, 1, 1), group="stream", since="5.0.0",
    summary="Return the number of messages in a stream.",
    syntax="XLEN key",
    acl_categories=("read", "stream", "fast"),
)
def xlen(ctx, argv):
    """XLEN key"""
    if ctx.server.topics.is_multi(argv[1]):  # the sum over partitions
        return topic_len(ctx, argv[1])
    stream = ctx.server.topics.get(argv[1])
    return 0 if stream is None else stream.length


# ------------------------------------------------------------ XDEL / XSETID


@command(
    "xdel", arity=-3, flags="write fast", keys=(1, 1, 1), group="stream", since="5.0.0",
    summary="Returns the number of messages after removing them from a stream.",
    syntax="XDEL key id [id ...]",
    acl_categories=("write", "stream", "fast"),
)
def xdel(ctx, argv):
    """XDEL key id [id ...]

    Deletion markers in the log: bytes are never rewritten in place.
    """
    stream = ctx.server.topics.get(argv[1])
    if stream is None:
        return 0
    ids = [parse_strict_id(raw) for raw in argv[2:]]
    deleted = stream.delete(ids)
    if deleted:
        _after_write(ctx, argv[1], stream)
    return deleted


@command(
    "xsetid", arity=-3, flags="write denyoom fast", keys=(1, 1, 1), group="stream", since="5.0.0",
    summary="An internal command for replicating stream values.",
    syntax="XSETID key last-id [ENTRIESADDED entries-added] [MAXDELETEDID max-deleted-id]",
    acl_categories=("write", "stream", "fast"),
)
def xsetid(ctx, argv):
    """XSETID key last-id [ENTRIESADDED entries-added] [MAXDELETEDID max-deleted-id]"""
    new_last = parse_strict_id(argv[2])
    entries_added = None
    max_deleted = None
    i = 3
    while i < len(argv):
        more = len(argv) - 1 - i
        word = _keyword(argv[i])
        if word == b"ENTRIESADDED" and more:
            entries_added = parse_int(argv[i + 1])
            if entries_added < 0:
                raise err("entries_added must be positive")
            i += 2
        elif word == b"MAXDELETEDID" and more:
            max_deleted = parse_strict_id(argv[i + 1])
            if new_last < max_deleted:
                raise err("The ID specified in XSETID is smaller than the provided max_deleted_entry_id")
            i += 2
        else:
            raise syntax_error()
    stream = ctx.server.topics.get(argv[1])
    if stream is None:
        raise err(NO_SUCH_KEY)
    stream.set_id(new_last, entries_added=entries_added, max_deleted_entry_id=max_deleted)
    _after_write(ctx, argv[1], stream)
    return OK


# ------------------------------------------------------------------ XREAD


def _xread_keys(argv: list[bytes]) -> list[int]:
    """Key positions of XREAD: the first half of the arguments after STREAMS."""
    for i in range(1, len(argv)):
        if argv[i].upper() == b"STREAMS":
            rest = len(argv) - i - 1
            return list(range(i + 1, i + 1 + rest // 2))
    return []


@dataclass
class _ReadArgs:
    timeout_ms: int | None
    count: int
    keys: list[bytes]
    id_args: list[bytes]


def _parse_xread(argv: list[bytes]) -> _ReadArgs:
    timeout_ms = None
    count = 0
    streams_arg = 0
    argc = len(argv)
    i = 1
    while i < argc:
        more = argc - i - 1
        word = _keyword(argv[i])
        if word == b"BLOCK" and more:
            i += 1
            timeout_ms = parse_int(argv[i], TIMEOUT_NOT_INTEGER)
            if timeout_ms < 0:
                raise err(TIMEOUT_NEGATIVE)
        elif word == b"COUNT" and more:
            i += 1
            count = max(parse_int(argv[i]), 0)
        elif word == b"STREAMS" and more:
            streams_arg = i + 1
            n = argc - streams_arg
            if n % 2:
                raise err("Unbalanced XREAD list of streams: for each stream key an ID or '$' must be specified.")
            break
        else:
            raise syntax_error()
        i += 1
    if streams_arg == 0:
        raise syntax_error()
    half = (argc - streams_arg) // 2
    return _ReadArgs(timeout_ms, count, argv[streams_arg:streams_arg + half], argv[streams_arg + half:])


def _resolve_read_positions(ctx, args: _ReadArgs) -> list[tuple[StreamId, int]]:
    """For each key: (read entries after this ID, max count). ``$``/``+`` resolved now."""
    topics = ctx.server.topics
    positions = []
    for key, raw in zip(args.keys, args.id_args):
        if raw == b"$":
            stream = topics.get(key)
            positions.append((stream.last_id if stream else MIN_ID, args.count))
        elif raw == b">":
            raise err("The > ID can be specified only when calling XREADGROUP using the GROUP <group> <consumer> option.")
        elif raw == b"+":
            stream = topics.get(key)
            top = stream.last_live_id() if stream else None
            if top is not None:
                positions.append((top.decr() if top != MIN_ID else MIN_ID, 1))
            else:
                positions.append((stream.last_id if stream else MIN_ID, args.count))
        else:
            positions.append((parse_strict_id(raw), args.count))
    return positions


def _serve_reads(ctx, keys: list[bytes], positions: list[tuple[StreamId, int]], view: bool = False):
    """The reply for ``keys`` read after ``positions``, or None if none has
    entries. ``view``: the entries may be views of the log files (the reply
    goes out at once, ``Context.read_view``)."""
    topics = ctx.server.topics
    found = []
    for key, (after, count) in zip(keys, positions):
        if topics.is_multi(key):  # became a multi-partition topic while we blocked
            found.extend(read_partitions_after(ctx, key, after, count))
            continue
        stream = topics.get(key)
        if stream is not None:
            _read_into(ctx, found, key, stream, after, count, view)
    return _read_reply(ctx, found) if found else None


def _read_into(ctx, found: list, key: bytes, stream, after: StreamId, count: int, view: bool) -> None:
    """Append ``(key, entries after `after`)`` to ``found`` when there are any."""
    if not stream.length:
        return
    entries = stream.read_after(after, count or None, view=view)
    if entries.count:
        ctx.server.topics.note_entries_out(entries.count)
        found.append((key, Raw(entries.count, entries.chunks)))
        if view:
            ctx.views = True


def _read_reply(ctx, found: list):
    """XREAD's reply for ``found`` ``(key, entries)`` pairs: a map in RESP3."""
    if ctx.client.protocol == 3:
        return Map(found)
    return [[key, raw] for key, raw in found]


@command(
    "xread", arity=-4, flags="readonly blocking movablekeys", keys=(0, 0, 0), group="stream",
    since="5.0.0",
    summary="Return never seen elements in multiple streams, with IDs greater than the ones reported by the caller for each stream. Can block.",
    syntax="XREAD [COUNT count] [BLOCK milliseconds] STREAMS key [key ...] id [id ...]",
    acl_categories=("read", "stream", "slow", "blocking"),
    key_finder=_xread_keys,
)
async def xread(ctx, argv):
    """XREAD [COUNT count] [BLOCK milliseconds] STREAMS key [key ...] id [id ...]

    Without BLOCK (or inside MULTI) it returns at once. With BLOCK it waits
    until an entry arrives on any of its keys (``BLOCK 0``: forever), then
    reads again; the wait is cancelled with the client's task.
    """
    args = _parse_xread(argv)
    expand_read_args(ctx, args)  # a multi-partition topic key reads every partition
    positions = _resolve_read_positions(ctx, args)
    reply = _serve_reads(ctx, args.keys, positions, args.timeout_ms is None and ctx.read_view())
    if reply is not None:
        return reply
    if args.timeout_ms is None or getattr(ctx.client, "in_multi", False):
        return NULL_ARRAY
    deadline = None if args.timeout_ms == 0 else trio.current_time() + args.timeout_ms / 1000
    while True:
        if deadline is None:
            remaining_s = None
        else:
            remaining_s = deadline - trio.current_time()
            if remaining_s <= 0:
                return NULL_ARRAY
        woke = await ctx.server.wait_for_keys(list(args.keys), remaining_s)
        if not woke:
            return NULL_ARRAY
        reply = _serve_reads(ctx, args.keys, positions)
        if reply is not None:
            return reply


@nowait_path("xread")
def xread_now(ctx, argv):
    """``XREAD COUNT n STREAMS key id`` (no BLOCK) of one existing
    partition (``TopicRegistry.read_target``): a consumer's poll, answered
    without the handler's general steps and, on a connection's own loop,
    from views of the log files (``Context.read_view``). None for every
    other form: the handler answers it (and gives every error)."""
    if len(argv) != 6 or argv[1].upper() != b"COUNT" or argv[3].upper() != b"STREAMS":
        return None
    raw = argv[5]
    if raw == b"$" or raw == b"+" or raw == b">":
        return None
    key = argv[4]
    stream = ctx.server.topics.read_target(key)
    if stream is None:
        return None
    count = max(parse_int(argv[2]), 0)
    after = parse_strict_id(raw)
    found: list = []
    _read_into(ctx, found, key, stream, after, count, ctx.read_view())
    return _read_reply(ctx, found) if found else NULL_ARRAY


# A found poll's reply up to its entries (RESP2: [[key, entries]]; RESP3:
# {key: entries}), and a poll that found nothing; tests check them against
# encode_into's.
_POLL_HEAD = {2: b"*1\r\n*2\r\n$%d\r\n%s\r\n*%d\r\n", 3: b"%%1\r\n$%d\r\n%s\r\n*%d\r\n"}
_POLL_NONE = {2: b"*-1\r\n", 3: b"_\r\n"}


def xread_poll(ctx, data: bytes, out: list, route=None):
    """A consumer's poll taken straight from received bytes
    (``Dispatcher.read_poll``): when ``data`` is exactly one ``XREAD COUNT
    n STREAMS key id`` of one existing partition in plain form
    (``_xaddrun.poll_xread``), its reply's encoding is appended to ``out``
    (the header, then views of the log files: the caller sends them at
    once) and True returned, the reply ``xread_now`` gives, after deferred
    appends are committed. None for anything else: the parser and ``call``
    take it (which gives every error). In a
    cluster ``route`` (the dispatcher's ``-MOVED`` check) may refuse the key:
    its error is raised, as ``call`` replies it."""
    form = _xaddrun.poll_xread(data)
    if form is None:
        return None
    protocol = ctx.client.protocol
    if protocol not in _POLL_HEAD or not ctx.read_view():
        return None
    key, count, ms, seq = form
    if route is not None:
        refused = route(_XREAD_SPEC, [b"XREAD", b"COUNT", b"%d" % count, b"STREAMS", key, b"%d-%d" % (ms, seq)])
        if refused is not None:
            raise refused
    appends = ctx.appends
    if appends.streams:
        appends.commit()  # as Dispatcher.call: nothing but XADD may see a deferred entry
    topics = ctx.server.topics
    stream = topics.read_target(key)
    if stream is None:
        return None
    entries = stream.read_after((ms, seq), count or None, view=True)
    n = entries.count
    if not n:
        out.append(_POLL_NONE[protocol])
        return True
    topics.note_entries_out(n)
    ctx.views = True
    out.append(_POLL_HEAD[protocol] % (len(key), key, n))
    out.extend(entries.chunks)
    return True


_XREAD_SPEC = COMMANDS["xread"]
if _xaddrun is not None:
    POLLS["xread"] = xread_poll


# ------------------------------------------------------------------ XINFO

container(
    "xinfo", group="stream", since="5.0.0",
    summary="A container for stream introspection commands.",
    acl_categories=("stream",),
)

_XINFO_HELP = [
    "XINFO <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "CONSUMERS <key> <groupname>",
    "    Show consumers of <groupname>.",
    "GROUPS <key>",
    "    Show the stream consumer groups.",
    "STREAM <key> [FULL [COUNT <count>]",
    "    Show information about the stream.",
    "HELP",
    "    Prints this help.",
]


@command(
    "xinfo|help", arity=2, flags="loading stale", group="stream", since="5.0.0",
    summary="Returns helpful text about the different subcommands.",
    syntax="XINFO HELP",
    acl_categories=("stream", "slow"),
)
def xinfo_help(ctx, argv):
    """XINFO HELP"""
    return [Simple(line) for line in _XINFO_HELP]


def _subcommand_syntax_error(argv) -> CommandError:
    sub = argv[1].decode("utf-8", "replace")[:128]
    return err(f"unknown subcommand or wrong number of arguments for '{sub}'. Try XINFO HELP.")


def _entry_value(encoded: bytes | None):
    if encoded is None:
        return None
    stream_id, fields = decode_entry(encoded)
    return [format_id(stream_id), fields]


@command(
    "xinfo|stream", arity=-3, flags="readonly", keys=(2, 2, 1), group="stream", since="5.0.0",
    summary="Returns information about a stream.",
    syntax="XINFO STREAM key [FULL [COUNT count]]",
    acl_categories=("read", "stream", "slow"),
)
def xinfo_stream(ctx, argv):
    """XINFO STREAM key [FULL [COUNT count]]

    Redis 7.0's fields in Redis's order, then Partita's own: partitions,
    log-start-offset, log-end-offset, segments, bytes-on-disk.
    """
    stream = ctx.server.topics.get(argv[2])
    if stream is None:
        raise err(NO_SUCH_KEY)
    opts = argv[3:]
    full = False
    count = 10
    if opts:
        if len(opts) not in (1, 3) or _keyword(opts[0]) != b"FULL":
            raise _subcommand_syntax_error(argv)
        full = True
        if len(opts) == 3:
            if _keyword(opts[1]) != b"COUNT":
                raise _subcommand_syntax_error(argv)
            count = parse_int(opts[2])
            if count < 0:
                count = 10
    from server.commands.groups import group_count, groups_full_info  # groups import this module

    length = stream.length
    tree_keys = math.ceil(length / max(stream.node_max_entries, 1))
    info = Map()
    info["length"] = length
    info["radix-tree-keys"] = tree_keys
    info["radix-tree-nodes"] = tree_keys + 1
    info["last-generated-id"] = stream.last_id.encode()
    info["max-deleted-entry-id"] = stream.max_deleted_entry_id.encode()
    info["entries-added"] = stream.entries_added
    info["recorded-first-entry-id"] = stream.first_entry_id().encode()
    if full:
        entries = stream.range(MIN_ID, MAX_ID, count or None)
        info["entries"] = Raw(entries.count, entries.chunks)
        info["groups"] = groups_full_info(stream, count)
    else:
        info["groups"] = group_count(stream)
        info["first-entry"] = _entry_value(stream.first_entry())
        info["last-entry"] = _entry_value(stream.last_entry())
    log = stream.log
    info["partitions"] = ctx.server.topics.partition_count(argv[2])
    info["log-start-offset"] = log.log_start_offset
    info["log-end-offset"] = log.log_end_offset
    info["segments"] = log.segment_count
    info["bytes-on-disk"] = log.size_bytes
    return info
