"""Redis stream commands on Partita's partition logs.

Owns: XADD (with Redis 8.6's IDMP / IDMPAUTO), XCFGSET, XRANGE, XREVRANGE,
XLEN, XDEL, XDELEX, XTRIM, XSETID, XREAD and XINFO STREAM / HELP (with Redis
8.2's reference policies on XDELEX, XADD and XTRIM, and 8.10's MAXCOUNT /
MAXSIZE on XREAD): argument parsing with Redis's own error texts (order
of checks as in redis ``t_stream.c``), one call of the client's broker
session (``ctx.session``, cluster.broker: writes, reads, topic fan-out), and
shaping replies. Entries are never decoded: XRANGE/XREAD reply with the
broker's ``Entries`` (the stored bytes, possibly views of the log files,
which the connection owns: server.reply).

Consumer groups (XGROUP, XREADGROUP, XACK, ..., XINFO GROUPS/CONSUMERS)
belong to ``server.commands.groups``; XINFO STREAM's ``groups`` come from the
broker's group operations (``server.group_replies`` shapes them).

Must not know: sockets, RESP bytes, segment files, topics and partitions
(the broker's).

Replies and texts are Redis 8.10's (server.state.REDIS_VERSION). Known
differences (docs/streams.md has them all):
- ``radix-tree-keys`` counts logical nodes of ``stream-node-max-entries``
  entries (``Stream.node_count``); ``radix-tree-nodes`` is keys + 1 (Partita
  has no radix tree).
- In RESP3 an XREAD naming the same key twice replies with one map entry.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from cluster.broker import AFTER_LAST, LAST_ENTRY, Idempotence, ReadPlan, Trim, XAddPlan
from server.args import REF_POLICY_WORDS, parse_ids_block, parse_int, parse_positive
from server.errors import (
    MAXCOUNT_BELOW_COUNT,
    TIMEOUT_NEGATIVE,
    TIMEOUT_NOT_INTEGER,
    CommandError,
    err,
    subcommand_arity,
    syntax_error,
    wrong_arity,
)
from server.failures import reply_for
from server.group_replies import groups_full_reply
from server.registry import DECLARED, command, container, nowait_path, poll_path, run_path
from server.reply import NULL_ARRAY, OK, Map, Simple
from storage.entry_codec import decode_entry
from storage.streams.ids import (
    MIN_ID,
    StreamId,
    format_id,
    parse_id,
    parse_range_end,
    parse_range_start,
    parse_strict_id,
)
from storage.streams.stream import ID_ZERO, IDMP_DURATION_MAX_S, IDMP_MAXSIZE_MAX, StreamError

NO_SUCH_KEY = "no such key"


def _keyword(raw: bytes) -> bytes:
    return raw.upper()


async def _forwarded(ctx, forward):
    """The reply of an XADD the broker forwarded to its partition's leader
    (``Session.append``'s awaitable): the leader's ID, or an error reply
    (the leader's own, byte for byte). Never raises (but Cancelled); the
    wait counts in the XADD's statistics."""
    started = time.perf_counter_ns()
    try:
        reply = await forward
        if reply.__class__ is StreamId:  # leadership moved here meanwhile: appended here
            reply = b"%d-%d" % reply
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
    node_entries: int = 100
    ref_policy: str = "KEEPREF"
    idmp: Idempotence | None = None  # IDMP / IDMPAUTO (Redis 8.6)


_IDMP_TWICE = "IDMP/IDMPAUTO specified multiple times"


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
        elif word in REF_POLICY_WORDS:  # Redis 8.2; the last one given counts
            args.ref_policy = word.decode()
        elif xadd and word == b"IDMPAUTO" and more:
            if args.idmp is not None:
                raise err(_IDMP_TWICE)
            if not argv[i + 1]:
                raise err("IDMPAUTO requires a non-empty producer ID")
            args.idmp = Idempotence(argv[i + 1])
            i += 1
        elif xadd and word == b"IDMP" and more >= 2:
            if args.idmp is not None:
                raise err(_IDMP_TWICE)
            if not argv[i + 1]:
                raise err("IDMP requires a non-empty producer ID")
            if not argv[i + 2]:
                raise err("IDMP requires a non-empty idempotent ID")
            args.idmp = Idempotence(argv[i + 1], argv[i + 2])
            i += 2
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
        args.limit = 100 * _node_max_entries(ctx)  # at most 100 nodes
        if args.limit <= 0:
            args.limit = 10000
        if args.limit > 1000000:
            args.limit = 1000000
    else:
        args.limit = 0
    if args.idmp is not None and args.id_given:
        raise err("IDMP/IDMPAUTO can be used only with auto-generated IDs")
    args.node_entries = _node_max_entries(ctx)
    return args


def _trim_of(args: _AddTrimArgs) -> Trim | None:
    if args.strategy is None:
        return None
    return Trim(args.strategy, args.approx, args.maxlen, tuple(args.minid), args.limit,
                node_entries=args.node_entries, policy=args.ref_policy)


@command(
    "xadd", arity=-5, flags="write denyoom fast", keys=(1, 1, 1), group="stream", since="5.0.0",
    summary="Appends a new message to a stream. Creates the key if it doesn't exist.",
    syntax="XADD key [NOMKSTREAM] [KEEPREF | DELREF | ACKED] [IDMPAUTO producer-id | IDMP producer-id idempotent-id] [<MAXLEN | MINID> [= | ~] threshold [LIMIT count]] <* | id> field value [field value ...]",
    acl_categories=("write", "stream", "fast"),
)
def xadd(ctx, argv):
    """XADD key [NOMKSTREAM] [KEEPREF | DELREF | ACKED] [IDMPAUTO producer-id | IDMP producer-id idempotent-id] [<MAXLEN | MINID> [= | ~] threshold [LIMIT count]] <* | id> field value [field value ...]

    Parsed here into an ``XAddPlan``; ``Session.append`` (cluster.broker)
    does the rest: partition (forwarded to its leader in a cluster), limits,
    ID, deferral or an immediate log batch, trim, wake-ups, and what the
    reply waits for. With IDMP / IDMPAUTO a retry of a recorded append
    answers the original entry's ID and writes nothing
    (cluster/broker/producers.py; docs/streams.md "Idempotent production").
    """
    if argv[2] == b"*" and len(argv) & 1:  # the hot form, no options: no parsing needed
        plan = XAddPlan(argv[1], argv[3:], options=(b"*",))
    else:
        args = _parse_add_or_trim(ctx, argv, xadd=True)
        field_pos = args.id_pos + 1
        nfields = len(argv) - field_pos
        if nfields < 2 or nfields % 2:
            raise wrong_arity("xadd")
        if args.id_given and args.seq_given and args.stream_id == MIN_ID:
            raise StreamError(ID_ZERO)
        id_ms = id_seq = None
        if args.id_given:
            id_ms = args.stream_id.ms
            id_seq = args.stream_id.seq if args.seq_given else None
        plan = XAddPlan(argv[1], argv[field_pos:], id_ms, id_seq, args.no_mkstream, _trim_of(args),
                        options=tuple(argv[2:field_pos]), idmp=args.idmp)
    new_id = ctx.session.append(plan)
    if new_id.__class__ is StreamId:
        return b"%d-%d" % new_id
    if new_id is None:
        return None  # NOMKSTREAM and no such key
    return _forwarded(ctx, new_id)  # forwarded to the partition's leader: the connection awaits it


try:  # the C half of the pipelined XADD path (server/_xaddrun.c); optional
    from server import _xaddrun
except ImportError:  # pragma: no cover - built by every install that has a C compiler
    _xaddrun = None


def xadd_run(ctx, data: bytes, pos: int, route=None):
    """A run of ``XADD key * field value ...`` taken straight from received bytes.

    A second parser for the hot form (``xadd``'s ``XAddPlan``):
    ``_xaddrun.scan`` parses the consecutive commands at ``data[pos:]``
    that are exactly ``XADD <key> * f v ...`` for one key, within the limits
    and after the last ID ``Session.append_run`` gives it, which checks and
    defers them as ``Session.append`` defers one (cluster.broker). Returns
    ``(end, replies, count, token)`` (``replies`` the concatenated ID
    replies; ``token`` the deferred append's, for the connection's failure
    marks) or None when nothing was taken: then ``xadd`` gives the same
    commands their replies, errors included. The caller
    (``Dispatcher.xadd_run``) has checked the client (authenticated, no
    MULTI, no ACL restriction); in a cluster ``route`` (the dispatcher's
    ``-MOVED`` check) must pass for the key.
    """
    key = _xaddrun.head_key(data, pos)
    if key is None:
        return None
    if route is not None and route(_XADD_SPEC, [b"xadd", key]) is not None:
        return None

    def scan(last_ms, last_seq, clock_ms, max_entry_bytes, budget):
        return _xaddrun.scan(data, pos, key, last_ms, last_seq, clock_ms, max_entry_bytes, budget)

    return ctx.session.append_run(key, scan)


_XADD_SPEC = DECLARED["xadd"]
if _xaddrun is not None:
    run_path("xadd", xadd_run)


@command(
    "xtrim", arity=-4, flags="write", keys=(1, 1, 1), group="stream", since="5.0.0",
    summary="Deletes messages from the beginning of a stream.",
    syntax="XTRIM key <MAXLEN | MINID> [= | ~] threshold [LIMIT count] [KEEPREF | DELREF | ACKED]",
    acl_categories=("write", "stream", "slow"),
)
def xtrim(ctx, argv):
    """XTRIM key <MAXLEN | MINID> [= | ~] threshold [LIMIT count] [KEEPREF | DELREF | ACKED]

    ``=`` keeps exactly the right entries (moving the log start offset);
    ``~`` removes whole nodes of ``stream-node-max-entries`` entries only, as
    Redis (and at most LIMIT entries). The reference policy (Redis 8.2;
    XADD's trim takes it too) says what becomes of the groups' references
    to the entries removed (``cluster.broker.references``).
    """
    args = _parse_add_or_trim(ctx, argv, xadd=False)
    return ctx.session.trim(argv[1], _trim_of(args))


@command(
    "xcfgset", arity=-2, flags="write fast", keys=(1, 1, 1), group="stream", since="8.6.0",
    summary="Sets the IDMP configuration parameters for a stream.",
    syntax="XCFGSET key [IDMP-DURATION duration] [IDMP-MAXSIZE maxsize]",
    acl_categories=("write", "stream", "fast"),
)
def xcfgset(ctx, argv):
    """XCFGSET key [IDMP-DURATION duration] [IDMP-MAXSIZE maxsize]

    How long (seconds) and how many (per producer) idempotent ids XADD IDMP
    remembers; a changed value forgets the recorded ones (Redis 8.6). Every
    partition of a topic key.
    """
    if len(argv) == 2:
        raise err("At least one parameter must be specified")
    duration = maxsize = None
    i = 2
    while i < len(argv):
        word = _keyword(argv[i])
        if i + 1 == len(argv) or word not in (b"IDMP-DURATION", b"IDMP-MAXSIZE"):
            raise syntax_error()
        value = parse_int(argv[i + 1])
        if word == b"IDMP-DURATION":
            if not 1 <= value <= IDMP_DURATION_MAX_S:
                raise err(f"IDMP-DURATION must be between 1 and {IDMP_DURATION_MAX_S} seconds")
            duration = value
        else:
            if not 1 <= value <= IDMP_MAXSIZE_MAX:
                raise err(f"IDMP-MAXSIZE must be between 1 and {IDMP_MAXSIZE_MAX} entries")
            maxsize = value
        i += 2
    if not ctx.session.configure_idempotence(argv[1], duration, maxsize):
        raise err(NO_SUCH_KEY)
    return OK


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
    found = ctx.session.range(argv[1], start, end, None if count == -1 else count, rev)
    if found is None:
        return []
    return NULL_ARRAY if count == 0 else found


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
    """XLEN key

    Of a topic key of several partitions: the sum over its partitions.
    """
    return ctx.session.length(argv[1])


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
    if not ctx.session.exists(argv[1]):
        return 0  # Redis looks the key up before it parses the IDs
    ids = [parse_strict_id(raw) for raw in argv[2:]]
    return ctx.session.delete(argv[1], ids)


@command(
    "xdelex", arity=-5, flags="write fast", keys=(1, 1, 1), group="stream", since="8.2.0",
    summary="Deletes one or multiple entries from the stream.",
    syntax="XDELEX key [KEEPREF | DELREF | ACKED] IDS numids id [id ...]",
    acl_categories=("write", "stream", "fast"),
)
def xdelex(ctx, argv):
    """XDELEX key [KEEPREF | DELREF | ACKED] IDS numids id [id ...]

    Per ID: 1 deleted, -1 not in the stream, 2 kept because a group still
    needs it (ACKED). KEEPREF (the default) leaves the groups' references,
    as XDEL does; DELREF removes them; ACKED deletes only what no group
    needs (``cluster.broker.references``).
    """
    policy, raw_ids = parse_ids_block(argv, 2)
    ids = [parse_strict_id(raw) for raw in raw_ids]
    return ctx.session.delete_each(argv[1], ids, policy)


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
    if not ctx.session.set_id(argv[1], new_last, entries_added, max_deleted):
        raise err(NO_SUCH_KEY)
    return OK


# ------------------------------------------------------------------ XREAD


def _xread_keys(argv: list[bytes]) -> list[int]:
    """Key positions of XREAD: the first half of the arguments after STREAMS."""
    for i in range(1, len(argv)):
        if argv[i].upper() == b"STREAMS":
            rest = len(argv) - i - 1
            return list(range(i + 1, i + 1 + rest // 2))
    return []


def _parse_xread(argv: list[bytes]) -> ReadPlan:
    """Redis ``xreadCommand``'s parse, same checks, same order (with Redis
    8.10's MAXCOUNT / MAXSIZE)."""
    timeout_ms = None
    count = 0
    max_count = max_size = 0
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
        elif word == b"MAXCOUNT" and more:
            i += 1
            max_count = parse_positive(argv[i], "MAXCOUNT")
        elif word == b"MAXSIZE" and more:
            i += 1
            max_size = parse_positive(argv[i], "MAXSIZE")
        elif word == b"STREAMS" and more:
            streams_arg = i + 1
            n = argc - streams_arg
            if n % 2:
                raise err("Unbalanced 'xread' list of streams: for each stream key an ID, '+', or '$' must be specified.")
            break
        elif (word == b"GROUP" and more >= 2) or (word == b"CLAIM" and more) or word == b"NOACK":
            raise err(f"The {word.decode()} option is only supported by XREADGROUP. You called XREAD instead.")
        else:
            raise syntax_error()
        i += 1
    if streams_arg == 0:
        raise syntax_error()
    if max_count and count and max_count < count:
        raise err(MAXCOUNT_BELOW_COUNT)
    half = (argc - streams_arg) // 2
    after = [_read_position(raw) for raw in argv[streams_arg + half:]]
    return ReadPlan(argv[streams_arg:streams_arg + half], after, count, timeout_ms,
                    max_count=max_count, max_size=max_size)


def _read_position(raw: bytes):
    if raw == b"$":
        return AFTER_LAST
    if raw == b">":
        raise err("The > ID can be specified only when calling XREADGROUP using the GROUP <group> <consumer> option.")
    if raw == b"+":
        return LAST_ENTRY
    return parse_strict_id(raw)


def _read_reply(ctx, found: list):
    """XREAD's reply for ``found`` ``(key, entries)`` pairs: a map in RESP3."""
    if not found:
        return NULL_ARRAY
    if ctx.client.protocol == 3:
        return Map(found)
    return [[key, entries] for key, entries in found]


@command(
    "xread", arity=-4, flags="readonly blocking movablekeys", keys=(0, 0, 0), group="stream",
    since="5.0.0",
    summary="Return never seen elements in multiple streams, with IDs greater than the ones reported by the caller for each stream. Can block.",
    syntax="XREAD [COUNT count] [MAXCOUNT maxcount] [MAXSIZE maxsize] [BLOCK milliseconds] STREAMS key [key ...] id [id ...]",
    acl_categories=("read", "stream", "slow", "blocking"),
    key_finder=_xread_keys,
)
async def xread(ctx, argv):
    """XREAD [COUNT count] [MAXCOUNT maxcount] [MAXSIZE maxsize] [BLOCK milliseconds] STREAMS key [key ...] id [id ...]

    Parsed here into a ``ReadPlan``; ``Session.read_after`` (cluster.broker)
    reads it, and with BLOCK ``Session.wait_for_entries`` waits until an
    entry arrives on any of its keys (``BLOCK 0``: forever; inside MULTI
    not at all) and reads again; the wait is cancelled with the client's
    task. A topic key of several partitions reads each partition, replied
    under the partition keys. MAXCOUNT / MAXSIZE (Redis 8.10) cap the whole
    reply over the keys in order (a topic's partitions in partition order).
    """
    plan = _parse_xread(argv)
    if plan.block_ms is None:
        found = ctx.session.read_after(plan)
        if found.__class__ is not list:  # a topic read across cluster nodes
            found = await found
        return _read_reply(ctx, found)
    return _read_reply(ctx, await ctx.session.wait_for_entries(plan))


@nowait_path("xread")
def xread_now(ctx, argv):
    """``XREAD COUNT n STREAMS key id`` (no BLOCK) of one existing
    partition: a consumer's poll, parsed here without the handler's
    general steps and read by the same executor (``Session.read_after`` of
    a ``one_partition`` plan) without a coroutine. None for every other
    form, and when the broker declines the key: the handler answers it
    (and gives every error)."""
    if len(argv) != 6 or argv[1].upper() != b"COUNT" or argv[3].upper() != b"STREAMS":
        return None
    raw = argv[5]
    if raw == b"$" or raw == b"+" or raw == b">":
        return None
    count = max(parse_int(argv[2]), 0)
    found = ctx.session.read_after(ReadPlan((argv[4],), (parse_strict_id(raw),), count, None, True))
    return None if found is None else _read_reply(ctx, found)


# The reply of a poll that found nothing, per protocol (a found poll's up to
# its entries: ``_xaddrun.poll_head``); tests check both against encode_into's.
_POLL_NONE = {2: b"*-1\r\n", 3: b"_\r\n"}


def xread_poll(ctx, data: bytes, out: list, route=None):
    """A consumer's poll taken straight from received bytes
    (``Dispatcher.read_poll``): when ``data`` is exactly one ``XREAD COUNT
    n STREAMS key id`` in plain form (``_xaddrun.poll_xread``, the C parser
    of ``xread_now``'s form) and the broker takes its ``one_partition``
    plan (``Session.read_after``: one existing partition), the reply's
    encoding is appended to ``out`` (the header, then the entries as views
    of the log files: the caller sends them at once) and True returned.
    None for anything else: the parser and ``call`` take it (which gives
    every error). In a cluster ``route`` (the dispatcher's ``-MOVED``
    check) may refuse the key: its error is raised, as ``call`` replies it."""
    form = _xaddrun.poll_xread(data)
    if form is None:
        return None
    protocol = ctx.client.protocol
    if protocol not in _POLL_NONE:
        return None
    key, count, ms, seq = form
    if route is not None:
        refused = route(_XREAD_SPEC, [b"XREAD", b"COUNT", b"%d" % count, b"STREAMS", key, b"%d-%d" % (ms, seq)],
                        ctx.client.readonly)
        if refused is not None:
            raise refused
    found = ctx.session.read_after(ReadPlan((key,), ((ms, seq),), count, None, True))
    if found is None:
        return None
    if not found:
        out.append(_POLL_NONE[protocol])
        return True
    entries = found[0][1]
    out.append(_xaddrun.poll_head(protocol, key, entries.count))
    out.extend(entries.chunks)
    return True


_XREAD_SPEC = DECLARED["xread"]
if _xaddrun is not None:
    poll_path("xread", xread_poll)


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

    Redis 8's fields in Redis's order (8.6's idempotence fields after
    ``recorded-first-entry-id``), nothing else (a partition's offsets,
    segments and bytes are TOPIC DESCRIBE's). ``radix-tree-keys`` counts the
    stream's nodes of ``stream-node-max-entries`` entries (those ``~``
    trims remove whole); ``radix-tree-nodes`` estimates the radix tree
    Redis would build over them (one more: exact up to one key).
    """
    key = argv[2]
    if not ctx.session.exists(key):
        raise err(NO_SUCH_KEY)  # Redis looks the key up before it parses the options
    opts = argv[3:]
    full = False
    count = 10
    if opts:
        if len(opts) not in (1, 3) or _keyword(opts[0]) != b"FULL":
            raise subcommand_arity(argv)
        full = True
        if len(opts) == 3:
            if _keyword(opts[1]) != b"COUNT":
                raise subcommand_arity(argv)
            count = parse_int(opts[2])
            if count < 0:
                count = 10
    found = ctx.session.stream_info(key, full, count)
    info = Map()
    info["length"] = found.length
    info["radix-tree-keys"] = found.radix_tree_keys
    info["radix-tree-nodes"] = found.radix_tree_keys + 1
    info["last-generated-id"] = found.last_id.encode()
    info["max-deleted-entry-id"] = found.max_deleted_entry_id.encode()
    info["entries-added"] = found.entries_added
    info["recorded-first-entry-id"] = found.recorded_first_entry_id.encode()
    _idempotence_fields(info, found.idmp)
    if full:
        info["entries"] = found.entries
        info["groups"] = groups_full_reply(ctx.session.groups_full(key, count))
    else:
        info["groups"] = found.groups
        info["first-entry"] = _entry_value(found.first_entry)
        info["last-entry"] = _entry_value(found.last_entry)
    return info


def _idempotence_fields(info: Map, idmp) -> None:
    """XINFO STREAM's (and FULL's) idempotence fields, Redis 8.6's, in its
    order; they follow ``recorded-first-entry-id`` (cluster.broker.producers)."""
    info["idmp-duration"] = idmp.duration_s
    info["idmp-maxsize"] = idmp.maxsize
    info["pids-tracked"] = idmp.pids_tracked
    info["iids-tracked"] = idmp.iids_tracked
    info["iids-added"] = idmp.iids_added
    info["iids-duplicates"] = idmp.iids_duplicates
