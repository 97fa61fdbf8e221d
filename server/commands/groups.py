"""Consumer group commands: XGROUP, XREADGROUP (with Redis 8.4's CLAIM and
8.10's MAXCOUNT / MAXSIZE), XACK, XACKDEL (8.2), XNACK (8.8), XPENDING,
XCLAIM, XAUTOCLAIM, XINFO GROUPS / CONSUMERS.

Owns: argument parsing with Redis 8's texts and order of checks
(redis ``t_stream.c``), and shaping replies: each handler parses, makes one
call of the client's broker session (``cluster.broker.groups.GroupOps``),
and shapes what it returns. Where Redis checks an argument only after it
found the key and the group, the handler passes its refusal of that argument
to the call (``late``; per key for XREADGROUP), which raises it at that point.
Delivered entries are the stored chunks the broker returns, framed as
``Raw``: entries are never decoded on the read path.

Must not know: sockets, RESP bytes, files, group state, topics.

Known differences from Redis 8 (docs/groups.md):
- XGROUP DESTROY also invalidates WATCH on the key (the server has one
  signal for "modified" and "wake blocked readers").
- XAUTOCLAIM's "COUNT too high" allocation error is given for COUNT above
  2**36 (Redis: whenever its allocator fails).
"""

from __future__ import annotations

from typing import Any

from cluster.broker.groups import NACK_MODES, GroupRead, TopicConsumerInfo, TopicGroupInfo
from server.acl import require_key
from server.args import parse_ids_block, parse_int, parse_positive
from server.errors import (
    MAXCOUNT_BELOW_COUNT,
    TIMEOUT_NEGATIVE,
    TIMEOUT_NOT_INTEGER,
    CommandError,
    err,
    subcommand_arity,
    syntax_error,
)
from server.group_replies import dead_letter_fields, shaped
from server.kafka_front import view as kafka_view
from server.registry import command, container, nowait_path
from server.reply import NULL_ARRAY, OK, Map, Raw, Simple
from storage.errors import Refusal
from storage.streams.ids import (
    MAX_ID, StreamIdError, format_id, parse_id, parse_range_end, parse_range_start, parse_strict_id,
    parse_strict_id_tuples,
)

DOLLAR_IN_XREADGROUP = (
    "The $ ID is meaningless in the context of XREADGROUP: you want to read the history of "
    "this consumer by specifying a proper ID, or use the > ID to get new messages. The $ ID "
    "would just return an empty result set."
)
ENTRIESREAD_NEGATIVE = "value for ENTRIESREAD must be positive or -1"
XAUTOCLAIM_COUNT_MAX = (2**63 - 1) // 16
XAUTOCLAIM_COUNT_ALLOC_MAX = 2**36


# ---------------------------------------------------------------- helpers


def _c(raw: bytes) -> str:
    """An argument as Redis prints it with ``%s``: a C string."""
    nul = raw.find(b"\x00")
    if nul >= 0:
        raw = raw[:nul]
    return raw.decode("utf-8", "replace")


def _word(raw: bytes) -> bytes:
    return raw.upper()


def _late(parse) -> tuple[Any, BaseException | None]:
    """``(parse(), None)``, or ``(None, refusal)``: a refusal Redis gives only
    after it found the key and the group, for the broker to raise there."""
    try:
        return parse(), None
    except (CommandError, Refusal) as e:
        return None, e


def _nil_entry(sid, protocol: int) -> bytes:
    """``[id, nil]`` for a pending entry no longer in the stream, pre-encoded."""
    text = format_id(sid)
    return b"*2\r\n$%d\r\n%s\r\n%s" % (len(text), text, b"_\r\n" if protocol == 3 else b"*-1\r\n")


# ---------------------------------------------------------------- XGROUP

container(
    "xgroup", group="stream", since="5.0.0",
    summary="A container for consumer groups commands",
    acl_categories=("slow",),
)

_XGROUP_HELP = [
    "XGROUP <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "CREATE <key> <groupname> <id|$> [option]",
    "    Create a new consumer group. Options are:",
    "    * MKSTREAM",
    "      Create the empty stream if it does not exist.",
    "    * ENTRIESREAD entries_read",
    "      Set the group's entries_read counter (internal use).",
    "CREATECONSUMER <key> <groupname> <consumer>",
    "    Create a new consumer in the specified group.",
    "DELCONSUMER <key> <groupname> <consumer>",
    "    Remove the specified consumer.",
    "DESTROY <key> <groupname>",
    "    Remove the specified group.",
    "SETID <key> <groupname> <id|$> [ENTRIESREAD entries_read]",
    "    Set the current group ID and entries_read counter.",
    "HELP",
    "    Prints this help.",
    # Partita's own, after Redis's lines.
    "CREATE ... MAXDELIVERIES <n> DEADLETTER <dlkey>",
    "    (Partita) Move an entry to stream <dlkey> instead of delivering it for the (n+1)th time.",
    "CONFIG <key> <groupname> MAXDELIVERIES <n> [DEADLETTER <dlkey>]",
    "    (Partita) Change the dead-letter setting; MAXDELIVERIES 0 turns it off.",
]

XGROUP_HELP_REDIS_LINES = 17


@command(
    "xgroup|help", arity=2, flags="loading stale", group="stream", since="5.0.0",
    summary="Show helpful text about the different subcommands",
    syntax="XGROUP HELP",
    acl_categories=("stream", "slow"),
)
def xgroup_help(ctx, argv):
    """XGROUP HELP"""
    return [Simple(line) for line in _XGROUP_HELP]


def _parse_dead_letter_options(argv: list[bytes], i: int, md: int | None, dl: bytes | None):
    """One MAXDELIVERIES/DEADLETTER option at ``argv[i]``; None if not one."""
    word = _word(argv[i])
    if word == b"MAXDELIVERIES" and i + 1 < len(argv):
        value = parse_int(argv[i + 1])
        if value < 0:
            raise err("MAXDELIVERIES must be >= 0")
        return value, dl
    if word == b"DEADLETTER" and i + 1 < len(argv):
        return md, argv[i + 1]
    return None


def _dead_letter_keys(first_option: int):
    """``option_keys`` of a command whose options from ``argv[first_option]``
    may name a dead-letter key: the positions of the keys after DEADLETTER,
    walked as the handler walks the options (MKSTREAM alone, the others
    with a value)."""

    def find(argv: list[bytes]) -> list[int]:
        found = []
        i = first_option
        while i < len(argv):
            word = _word(argv[i])
            if word == b"MKSTREAM":
                i += 1
                continue
            if word == b"DEADLETTER" and i + 1 < len(argv):
                found.append(i + 1)
            i += 2
        return found

    return find


def _parse_entries_read(raw: bytes) -> int | None:
    value = parse_int(raw)
    if value < 0 and value != -1:
        raise err(ENTRIESREAD_NEGATIVE)
    return None if value == -1 else value


def _ok(done):
    """OK for a group change made (None), or, for one the broker waits for
    (a topic's partitions changed by their leaders in a cluster), the
    awaitable of OK (the dispatcher awaits it)."""
    if done is None:
        return OK

    async def when_done():
        await done
        return OK

    return when_done()


@command(
    "xgroup|create", arity=-5, flags="write denyoom", keys=(2, 2, 1), group="stream", since="5.0.0",
    summary="Create a consumer group.",
    syntax="XGROUP CREATE key group <id | $> [MKSTREAM] [ENTRIESREAD entries-read] "
           "[MAXDELIVERIES count DEADLETTER dlkey]",
    acl_categories=("write", "stream", "slow"), option_keys=_dead_letter_keys(5),
)
def xgroup_create(ctx, argv):
    """XGROUP CREATE key group <id | $> [MKSTREAM] [ENTRIESREAD entries-read] [MAXDELIVERIES count DEADLETTER dlkey]

    Partita: MAXDELIVERIES/DEADLETTER turn on dead-lettering for the group.
    On a multi-partition topic key: on every partition.
    """
    argc = len(argv)
    mkstream = False
    entries_read: int | None = None
    md: int | None = None
    dl: bytes | None = None
    partita_args = 0
    i = 5
    while i < argc:
        word = _word(argv[i])
        if word == b"MKSTREAM":
            mkstream = True
            i += 1
        elif word == b"ENTRIESREAD" and i + 1 < argc:
            entries_read = _parse_entries_read(argv[i + 1])
            i += 2
        else:
            parsed = _parse_dead_letter_options(argv, i, md, dl)
            if parsed is None:
                raise subcommand_arity(argv)
            md, dl = parsed
            partita_args += 2
            i += 2

    def last_id():  # checked once the key is found (or made)
        if argc - partita_args > 8:
            raise subcommand_arity(argv)
        return None if argv[4] == b"$" else tuple(parse_strict_id(argv[4]))

    start, late = _late(last_id)
    return _ok(ctx.session.group_create(argv[2], argv[3], start, mkstream=mkstream, entries_read=entries_read,
                                        max_deliveries=md or 0, dead_letter_key=dl, late=late))


@command(
    "xgroup|setid", arity=-5, flags="write", keys=(2, 2, 1), group="stream", since="5.0.0",
    summary="Set a consumer group to an arbitrary last delivered ID value.",
    syntax="XGROUP SETID key group <id | $> [ENTRIESREAD entries-read]",
    acl_categories=("write", "stream", "slow"),
)
def xgroup_setid(ctx, argv):
    """XGROUP SETID key group <id | $> [ENTRIESREAD entries-read]"""

    def parse():  # all checked once the key and the group are found
        if len(argv) not in (5, 7):
            raise subcommand_arity(argv)
        entries_read: int | None = None
        if len(argv) == 7:  # Redis parses ENTRIESREAD before the ID
            if _word(argv[5]) != b"ENTRIESREAD":
                raise subcommand_arity(argv)
            entries_read = _parse_entries_read(argv[6])
        last_id = None if argv[4] == b"$" else tuple(parse_id(argv[4])[0])
        return last_id, entries_read

    parsed, late = _late(parse)
    last_id, entries_read = parsed or (None, None)
    return _ok(ctx.session.group_set_id(argv[2], argv[3], last_id, entries_read, late=late))


@command(
    "xgroup|destroy", arity=4, flags="write", keys=(2, 2, 1), group="stream", since="5.0.0",
    summary="Destroy a consumer group.",
    syntax="XGROUP DESTROY key group",
    acl_categories=("write", "stream", "slow"),
)
def xgroup_destroy(ctx, argv):
    """XGROUP DESTROY key group

    Readers blocked on the group wake and get ``-NOGROUP``.
    """
    return ctx.session.group_destroy(argv[2], argv[3])


@command(
    "xgroup|createconsumer", arity=5, flags="write denyoom", keys=(2, 2, 1), group="stream",
    since="6.2.0",
    summary="Create a consumer in a consumer group.",
    syntax="XGROUP CREATECONSUMER key group consumer",
    acl_categories=("write", "stream", "slow"),
)
def xgroup_createconsumer(ctx, argv):
    """XGROUP CREATECONSUMER key group consumer"""
    return ctx.session.group_create_consumer(argv[2], argv[3], argv[4])


@command(
    "xgroup|delconsumer", arity=5, flags="write", keys=(2, 2, 1), group="stream", since="5.0.0",
    summary="Delete a consumer from a consumer group.",
    syntax="XGROUP DELCONSUMER key group consumer",
    acl_categories=("write", "stream", "slow"),
)
def xgroup_delconsumer(ctx, argv):
    """XGROUP DELCONSUMER key group consumer

    Returns how many pending entries the consumer had (they leave the PEL).
    On a topic key the member leaves first: its pending entries go to the new owners.
    """
    return ctx.session.group_delete_consumer(argv[2], argv[3], argv[4])


@command(
    "xgroup|config", arity=-6, flags="write", keys=(2, 2, 1), group="stream", since="7.0.0",
    summary="(Partita) Set or clear a consumer group's dead-letter setting.",
    syntax="XGROUP CONFIG key group MAXDELIVERIES count [DEADLETTER dlkey]",
    acl_categories=("write", "stream", "slow"), option_keys=_dead_letter_keys(4),
)
def xgroup_config(ctx, argv):
    """XGROUP CONFIG key group MAXDELIVERIES count [DEADLETTER dlkey]

    ``MAXDELIVERIES 0`` turns dead-lettering off. Without DEADLETTER the
    group keeps its current dead-letter key, which the caller's ACL key
    patterns must then allow (a named one is checked before the call).
    """

    def parse():  # checked once the key and the group are found
        md: int | None = None
        dl: bytes | None = None
        i = 4
        while i < len(argv):
            parsed = _parse_dead_letter_options(argv, i, md, dl)
            if parsed is None:
                raise syntax_error()
            md, dl = parsed
            i += 2
        if md is None:
            raise syntax_error()
        return md, dl

    parsed, late = _late(parse)
    md, dl = parsed or (0, None)
    client = ctx.client
    return _ok(ctx.session.group_configure(argv[2], argv[3], md, dl, late=late,
                                           check_key=lambda key: require_key(client, key)))  # its reads write it


# ------------------------------------------------------------ XREADGROUP


def _xreadgroup_keys(argv: list[bytes]) -> list[int]:
    """Key positions: the first half of the arguments after STREAMS (searched from argv[4])."""
    for i in range(4, len(argv)):
        if argv[i].upper() == b"STREAMS":
            rest = len(argv) - i - 1
            return list(range(i + 1, i + 1 + rest // 2))
    return []


def _parse_xreadgroup(argv: list[bytes], view: bool) -> GroupRead:
    argc = len(argv)
    block_ms: int | None = None
    count = 0
    max_count = max_size = 0
    claim_ms: int | None = None
    noack = False
    group = consumer = None
    streams_arg = 0
    i = 1
    while i < argc:
        more = argc - i - 1
        word = _word(argv[i])
        if word == b"BLOCK" and more:
            i += 1
            block_ms = parse_int(argv[i], TIMEOUT_NOT_INTEGER)
            if block_ms < 0:
                raise err(TIMEOUT_NEGATIVE)
        elif word == b"COUNT" and more:
            i += 1
            count = max(parse_int(argv[i]), 0)
        elif word == b"MAXCOUNT" and more:  # Redis 8.10
            i += 1
            max_count = parse_positive(argv[i], "MAXCOUNT")
        elif word == b"MAXSIZE" and more:  # Redis 8.10
            i += 1
            max_size = parse_positive(argv[i], "MAXSIZE")
        elif word == b"CLAIM" and more:  # Redis 8.4; the last one given counts
            i += 1
            claim_ms = parse_int(argv[i], "min-idle-time is not an integer")
            if claim_ms < 0:  # Redis 8's text; 0 is valid (claims every pending entry)
                raise err("min-idle-time must be a positive integer")
        elif word == b"STREAMS" and more:
            streams_arg = i + 1
            if (argc - streams_arg) % 2:
                raise err("Unbalanced 'xreadgroup' list of streams: for each stream key an ID or '>' must be specified.")
            break
        elif word == b"GROUP" and more >= 2:
            group, consumer = argv[i + 1], argv[i + 2]
            i += 2
        elif word == b"NOACK":
            noack = True
        else:
            raise syntax_error()
        i += 1
    if streams_arg == 0:
        raise syntax_error()
    if group is None:
        raise err("Missing GROUP option for XREADGROUP")
    if max_count and count and max_count < count:
        raise err(MAXCOUNT_BELOW_COUNT)
    half = (argc - streams_arg) // 2
    starts: list = []
    for raw in argv[streams_arg + half:]:  # each refused only once its key's group is found
        if raw == b">":
            starts.append(None)
        elif raw == b"$":
            starts.append(err(DOLLAR_IN_XREADGROUP))
        else:
            try:
                start = parse_strict_id(raw)
            except StreamIdError as e:
                starts.append(e)
            else:  # Redis's ">" is the largest ID: that ID in digits reads new entries too
                starts.append(None if start == MAX_ID else start)
    return GroupRead(group, consumer, argv[streams_arg:streams_arg + half], starts, count, noack, block_ms, view,
                     claim_ms, max_count, max_size)


# Parsed reads by their arguments: a consumer polls with the same command
# again and again, and a plan is read only (the broker never changes it).
# At most _PLANS_MAX kept, each of at most _PLAN_ARGS_MAX_BYTES of arguments.
_PLANS: dict[tuple, GroupRead] = {}
_PLANS_MAX = 1024
_PLAN_ARGS_MAX_BYTES = 1024


def _xreadgroup_plan(argv: list[bytes], view: bool) -> GroupRead:
    """``_parse_xreadgroup(argv, view)``, parsed once per distinct command.
    A read whose parse refused something (raised, or a key's start to be
    raised later) is parsed every time: each refusal is a new exception;
    so is one of long arguments (what the cache holds stays small)."""
    key = (view, *argv)
    plan = _PLANS.get(key)
    if plan is None:
        plan = _parse_xreadgroup(argv, view)
        if (not any(isinstance(start, BaseException) for start in plan.starts)
                and sum(map(len, argv)) <= _PLAN_ARGS_MAX_BYTES):
            if len(_PLANS) >= _PLANS_MAX:
                _PLANS.clear()
            _PLANS[key] = plan
    return plan


def _claimed_entry(encoded, idle_ms: int, deliveries: int) -> bytes:
    """An entry of a read with CLAIM (Redis 8.4): ``[id, fields, ms idle,
    times delivered before]``, from the stored ``[id, fields]``."""
    data = bytes(encoded)
    assert data.startswith(b"*2\r\n")
    return b"*4\r\n%s:%d\r\n:%d\r\n" % (data[4:], idle_ms, deliveries)


def _read_reply(ctx, served: list) -> Any:
    """The reply to a read that served ``served`` (``Delivery`` per key):
    per key ``[key, entries]``, a map of them in RESP3."""
    if not served:
        return NULL_ARRAY
    protocol = ctx.client.protocol
    pairs = []
    for d in served:
        if d.views:
            ctx.views = True
        chunks = d.chunks
        if d.gone:
            chunks = [_nil_entry(c, protocol) if isinstance(c, tuple) else c for c in chunks]
        if d.claims is not None:
            chunks = [_claimed_entry(c, idle, n) for c, (idle, n) in zip(chunks, d.claims)]
        pairs.append([d.key, Raw(d.count, chunks)])
    return Map(pairs) if protocol == 3 else pairs


@command(
    "xreadgroup", arity=-7, flags="write blocking movablekeys", keys=(0, 0, 0), group="stream",
    since="5.0.0",
    summary="Return new entries from a stream using a consumer group, or access the history of the pending entries for a given consumer. Can block.",
    syntax="XREADGROUP GROUP group consumer [COUNT count] [MAXCOUNT maxcount] [MAXSIZE maxsize] [BLOCK milliseconds] [CLAIM min-idle-time] [NOACK] STREAMS key [key ...] id [id ...]",
    acl_categories=("write", "stream", "slow", "blocking"),
    key_finder=_xreadgroup_keys,
)
async def xreadgroup(ctx, argv):
    """XREADGROUP GROUP group consumer [COUNT count] [MAXCOUNT maxcount] [MAXSIZE maxsize] [BLOCK milliseconds] [CLAIM min-idle-time] [NOACK] STREAMS key [key ...] id [id ...]

    ``>`` delivers entries after the group's last-delivered-id (into the
    consumer's PEL unless NOACK); an explicit ID re-reads the consumer's own
    pending entries after it (deleted ones come back as ``[id, nil]``).
    BLOCK waits only when every key asked for ``>`` and none had entries.
    CLAIM (Redis 8.4): a ``>`` key first takes the group's entries pending
    at least that long, longest idle first, and every entry of the reply
    gets its idle time and earlier deliveries (new ones 0 and 0); a wait
    also ends when a pending entry becomes idle enough. MAXCOUNT / MAXSIZE
    (Redis 8.10) cap the whole reply over the keys in order.
    On a multi-partition topic key the consumer is a member of the group
    and reads its assigned partitions, under their partition keys.
    """
    # No views of the log's mappings here: the reply reaches the connection
    # across awaits (the wait, the peer watch's nursery), and a log cut back
    # meanwhile would leave a view of a truncated mapping (SIGBUS when sent).
    read = _xreadgroup_plan(argv, False)
    return _read_reply(ctx, await ctx.session.read_group(read))


@nowait_path("xreadgroup")
def xreadgroup_now(ctx, argv):
    """XREADGROUP that will not wait (no BLOCK, or entries to serve): the
    handler's reply without its coroutine, the connection's await and the
    send before it (a consumer's poll, a topic member's too). None when it
    would block, or for a topic with partitions other nodes lead: the
    handler then runs, and finds nothing served (a topic's member has
    joined or been seen; the handler's read repeats that at no change)."""
    served = ctx.session.read_group_nowait(_xreadgroup_plan(argv, ctx.read_view()))
    if served is None:
        return None
    return _read_reply(ctx, served)


# ------------------------------------------------------------------ XACK


@command(
    "xack", arity=-4, flags="write fast", keys=(1, 1, 1), group="stream", since="5.0.0",
    summary="Marks a pending message as correctly processed, effectively removing it from the pending entries list of the consumer group. Return value of the command is the number of messages successfully acknowledged, that is, the IDs we were actually able to resolve in the PEL.",
    syntax="XACK key group id [id ...]",
    acl_categories=("write", "stream", "fast"),
)
def xack(ctx, argv):
    """XACK key group id [id ...]"""
    try:
        ids, late = parse_strict_id_tuples(argv[3:]), None
    except StreamIdError as e:  # given once the group is found, as Redis checks
        ids, late = (), e
    return ctx.session.ack(argv[1], argv[2], ids, late)


# --------------------------------------------------------------- XACKDEL


@command(
    "xackdel", arity=-6, flags="write fast", keys=(1, 1, 1), group="stream", since="8.2.0",
    summary="Acknowledges and conditionally deletes one or multiple entries for a stream consumer group.",
    syntax="XACKDEL key group [KEEPREF | DELREF | ACKED] IDS numids id [id ...]",
    acl_categories=("write", "stream", "fast"),
)
def xackdel(ctx, argv):
    """XACKDEL key group [KEEPREF | DELREF | ACKED] IDS numids id [id ...]

    Per ID: -1 not pending in the group (or no such key or group), else
    acknowledged and then deleted by the policy: 1 (deleted, or gone
    already), 2 kept because another group still needs it (ACKED).
    KEEPREF (the default) leaves the other groups' references, DELREF
    removes them (``cluster.broker.references``).
    """
    policy, raw_ids = parse_ids_block(argv, 3)
    ids = [tuple(parse_strict_id(raw)) for raw in raw_ids]
    return ctx.session.ack_delete(argv[1], argv[2], ids, policy)


# ----------------------------------------------------------------- XNACK


def _parse_xnack(argv: list[bytes]) -> tuple[str, list, int | None, bool]:
    """XNACK's mode, IDs, RETRYCOUNT and FORCE, in Redis 8.8's checks: the
    mode first, then the options in any order around the IDS block."""
    mode = argv[3].upper().decode("latin-1")
    if mode not in NACK_MODES:
        raise err("mode must be SILENT, FAIL, or FATAL")
    argc = len(argv)
    retry_count: int | None = None
    force = False
    raw_ids = None
    i = 4
    while i < argc:
        word = _word(argv[i])
        if word == b"IDS" and raw_ids is None and i + 1 < argc:
            numids = parse_int(argv[i + 1], "numids must be a positive integer")
            if numids <= 0:
                raise err("numids must be a positive integer")
            if numids > argc - i - 2:
                raise err("number of IDs doesn't match numids")
            raw_ids = argv[i + 2:i + 2 + numids]
            i += 2 + numids
        elif word == b"RETRYCOUNT" and i + 1 < argc:
            retry_count = parse_int(argv[i + 1])
            if retry_count < 0:
                raise err("Invalid RETRYCOUNT value, must be >= 0")
            i += 2
        elif word == b"FORCE":
            force = True
            i += 1
        else:
            raise err(f"Unrecognized XNACK option '{_c(argv[i])}'")
    if raw_ids is None:
        raise err("syntax error, expected IDS keyword")
    return mode, [tuple(parse_strict_id(raw)) for raw in raw_ids], retry_count, force


@command(
    "xnack", arity=-7, flags="write fast", keys=(1, 1, 1), group="stream", since="8.8.0",
    summary="Releases pending messages back to the group's PEL without acknowledging them, making them available for re-delivery.",
    syntax="XNACK key group <SILENT | FAIL | FATAL> IDS numids id [id ...] [RETRYCOUNT count] [FORCE]",
    acl_categories=("write", "stream", "fast"),
)
def xnack(ctx, argv):
    """XNACK key group <SILENT | FAIL | FATAL> IDS numids id [id ...] [RETRYCOUNT count] [FORCE]

    Releases pending entries: no owner, claimable at once (first) by
    XREADGROUP CLAIM, XCLAIM and XAUTOCLAIM; the delivery count one less
    (SILENT), kept (FAIL), LLONG_MAX (FATAL), or RETRYCOUNT's. FORCE makes
    an ID in the stream but not pending pending so. Replies how many were
    released (IDs not pending are skipped).
    """
    mode, ids, retry_count, force = _parse_xnack(argv)
    return ctx.session.nack(argv[1], argv[2], mode, ids, retry_count, force)


# -------------------------------------------------------------- XPENDING


@command(
    "xpending", arity=-3, flags="readonly", keys=(1, 1, 1), group="stream", since="5.0.0",
    summary="Return information and entries from a stream consumer group pending entries list, that are messages fetched but never acknowledged.",
    syntax="XPENDING key group [[IDLE min-idle-time] start end count [consumer]]",
    acl_categories=("read", "stream", "slow"),
)
def xpending(ctx, argv):
    """XPENDING key group [[IDLE min-idle-time] start end count [consumer]]"""
    argc = len(argv)
    if argc == 3:
        summary = ctx.session.pending_summary(argv[1], argv[2])
        if not summary.count:
            return [0, None, None, NULL_ARRAY]
        return [summary.count, format_id(summary.first), format_id(summary.last),
                [[name, b"%d" % n] for name, n in summary.consumers]]
    if not 6 <= argc <= 9:
        raise syntax_error()
    min_idle = 0
    consumer = None
    start_idx = 3
    if _word(argv[3]) == b"IDLE":
        min_idle = parse_int(argv[4])
        if argc < 8:
            raise syntax_error()
        start_idx += 2
    count = max(parse_int(argv[start_idx + 2]), 0)
    start = tuple(parse_range_start(argv[start_idx]))
    end = tuple(parse_range_end(argv[start_idx + 1]))
    if start_idx + 3 < argc:
        consumer = argv[start_idx + 3]
    rows = ctx.session.pending(argv[1], argv[2], start, end, count, consumer, min_idle)
    # An entry released by XNACK has no owner: Redis 8.8 shows "" (and idle -1).
    return [[format_id(sid), owner if owner is not None else b"", idle_ms, deliveries]
            for sid, owner, idle_ms, deliveries in rows]


# ---------------------------------------------------------------- XCLAIM


def _parse_xclaim(argv: list[bytes]) -> dict:
    """XCLAIM's arguments after the consumer, as ``GroupOps.claim``'s."""
    min_idle = max(parse_int(argv[4], "Invalid min-idle-time argument for XCLAIM"), 0)
    argc = len(argv)
    ids = []
    j = 5
    while j < argc:
        try:
            ids.append(tuple(parse_strict_id(argv[j])))
        except StreamIdError:
            break
        j += 1
    options: dict = {"min_idle_ms": min_idle}
    while j < argc:
        more = argc - 1 - j
        opt = argv[j]
        word = _word(opt)
        if word == b"FORCE":
            options["force"] = True
        elif word == b"JUSTID":
            options["justid"] = True
        elif word == b"IDLE" and more:  # IDLE and TIME: the last one given counts
            j += 1
            options["idle_ms"] = parse_int(argv[j], "Invalid IDLE option argument for XCLAIM")
            options["time_ms"] = None
        elif word == b"TIME" and more:
            j += 1
            options["time_ms"] = parse_int(argv[j], "Invalid TIME option argument for XCLAIM")
            options["idle_ms"] = None
        elif word == b"RETRYCOUNT" and more:
            j += 1
            options["retry_count"] = parse_int(argv[j], "Invalid RETRYCOUNT option argument for XCLAIM")
        elif word == b"LASTID" and more:
            j += 1
            options["last_id"] = tuple(parse_strict_id(argv[j]))
        else:
            raise err(f"Unrecognized XCLAIM option '{_c(opt)}'")
        j += 1
    options["ids"] = ids
    return options


@command(
    "xclaim", arity=-6, flags="write fast", keys=(1, 1, 1), group="stream", since="5.0.0",
    summary="Changes (or acquires) ownership of a message in a consumer group, as if the message was delivered to the specified consumer.",
    syntax="XCLAIM key group consumer min-idle-time id [id ...] [IDLE ms] [TIME unix-time-milliseconds] [RETRYCOUNT count] [FORCE] [JUSTID] [LASTID lastid]",
    acl_categories=("write", "stream", "fast"),
)
def xclaim(ctx, argv):
    """XCLAIM key group consumer min-idle-time id [id ...] [IDLE ms] [TIME unix-time-milliseconds] [RETRYCOUNT count] [FORCE] [JUSTID] [LASTID lastid]

    An ID whose entry left the stream is dropped from the PEL (Redis 7).
    With dead-lettering on, an entry whose delivery count would pass
    MAXDELIVERIES goes to the dead-letter stream instead of the claimer.
    """
    options, late = _late(lambda: _parse_xclaim(argv))  # all checked once the group is found
    options = options or {"ids": ()}
    claimed = ctx.session.claim(argv[1], argv[2], argv[3], late=late, **options)
    if options.get("justid"):
        return [format_id(sid) for sid in claimed]
    return Raw(len(claimed), claimed)


# ------------------------------------------------------------ XAUTOCLAIM


@command(
    "xautoclaim", arity=-6, flags="write fast", keys=(1, 1, 1), group="stream", since="6.2.0",
    summary="Changes (or acquires) ownership of messages in a consumer group, as if the messages were delivered to the specified consumer.",
    syntax="XAUTOCLAIM key group consumer min-idle-time start [COUNT count] [JUSTID]",
    acl_categories=("write", "stream", "fast"),
)
def xautoclaim(ctx, argv):
    """XAUTOCLAIM key group consumer min-idle-time start [COUNT count] [JUSTID]

    Scans at most COUNT * 10 pending entries from ``start``; replies with the
    cursor to continue from (``0-0`` at the end), the claimed entries, and
    the IDs dropped because their entries left the stream.
    """
    min_idle = max(parse_int(argv[4], "Invalid min-idle-time argument for XAUTOCLAIM"), 0)
    start = tuple(parse_range_start(argv[5]))
    count = 100
    justid = False
    argc = len(argv)
    j = 6
    while j < argc:
        more = argc - 1 - j
        word = _word(argv[j])
        if word == b"COUNT" and more:
            try:
                count = parse_int(argv[j + 1])
            except CommandError:
                raise err("COUNT must be > 0") from None
            if not 1 <= count <= XAUTOCLAIM_COUNT_MAX:
                raise err("COUNT must be > 0")
            j += 1
        elif word == b"JUSTID":
            justid = True
        else:
            raise syntax_error()
        j += 1
    late = None  # given once the group is found
    if count > XAUTOCLAIM_COUNT_ALLOC_MAX:
        late = err("Insufficient memory, failed allocating transient memory, COUNT too high.")
    cursor, claimed, deleted = ctx.session.auto_claim(argv[1], argv[2], argv[3], min_idle, start, count, justid,
                                                      late)
    entries = [format_id(sid) for sid in claimed] if justid else Raw(len(claimed), claimed)
    return [format_id(cursor), entries, [format_id(sid) for sid in deleted]]


# ----------------------------------------------------------------- XINFO


@command(
    "xinfo|groups", arity=3, flags="readonly", keys=(2, 2, 1), group="stream", since="5.0.0",
    summary="List the consumer groups of a stream",
    syntax="XINFO GROUPS key",
    acl_categories=("read", "stream", "slow"),
)
def xinfo_groups(ctx, argv):
    """XINFO GROUPS key

    Redis's fields; a group with dead-lettering also reports
    max-deliveries, dead-letter-key and dead-lettered. On a topic key each
    group summed over the partitions, with its members and partitions. Then
    the Kafka groups of the key (``type`` kafka, a separate namespace:
    server/kafka_front/view.py), with their committed offset and lag.
    """
    return shaped(ctx.session.group_infos(argv[2]), lambda infos: _groups_reply(ctx, argv, infos))


def _groups_reply(ctx, argv, infos) -> list:
    out = []
    for g in infos:
        info = Map()
        info["name"] = g.name
        info["consumers"] = g.consumers
        info["pending"] = g.pending
        if isinstance(g, TopicGroupInfo):
            info["lag"] = g.lag
            info["members"] = g.members
            info["partitions"] = g.partitions
        else:
            info["last-delivered-id"] = format_id(g.last_id)
            info["entries-read"] = g.entries_read
            info["lag"] = g.lag
            dead_letter_fields(info, g)
        out.append(info)
    return out + kafka_view.xinfo_groups_reply(getattr(ctx.server, "kafka_groups", None), ctx.session, argv[2])


@command(
    "xinfo|consumers", arity=4, flags="readonly", keys=(2, 2, 1), group="stream", since="5.0.0",
    summary="List the consumers in a consumer group",
    syntax="XINFO CONSUMERS key group",
    acl_categories=("read", "stream", "slow"),
)
def xinfo_consumers(ctx, argv):
    """XINFO CONSUMERS key group

    On a topic key: every consumer of any partition (pending summed), with
    whether it is a live member and the partitions it owns.
    """
    return shaped(ctx.session.consumer_infos(argv[2], argv[3]), _consumers_reply)


def _consumers_reply(infos) -> list:
    out = []
    for c in infos:
        info = Map()
        info["name"] = c.name
        info["pending"] = c.pending
        info["idle"] = c.idle_ms
        if isinstance(c, TopicConsumerInfo):
            info["member"] = 1 if c.member else 0
            info["partitions"] = c.partitions
        else:
            info["inactive"] = c.inactive_ms  # Redis 7.2+
        out.append(info)
    return out
