"""Consumer group commands: XGROUP, XREADGROUP, XACK, XPENDING, XCLAIM,
XAUTOCLAIM, XINFO GROUPS / CONSUMERS, and the group part of XINFO STREAM FULL.

Owns: argument parsing with Redis 7.0's texts and order of checks
(redis ``t_stream.c``), shaping replies, blocking XREADGROUP, and Partita's
dead-letter extension (``MAXDELIVERIES n DEADLETTER key``, see docs/groups.md).

Group state lives in ``storage.streams.groups.GroupStore`` (one per
partition, reached with ``groups_of(stream)``); every mutation of it is
followed by ``ctx.session.wrote_group(store)`` so replies wait for durability
by the fsync policy (and, on acks=all topics, for the in-sync replicas),
exactly like stream appends. Deliveries read the log and reply
with the stored bytes (``Raw``): entries are never decoded on the read path.

Must not know: sockets, RESP bytes, files. Keys become streams only through
``ctx.server.topics``.

Known differences from Redis 7.0:
- A woken ``XREADGROUP BLOCK`` serves every key that has new entries
  (Redis 7.0 serves only the key that woke it).
- XGROUP DESTROY also invalidates WATCH on the key (the server has one
  signal for "modified" and "wake blocked readers").
- XAUTOCLAIM's "COUNT too high" allocation error is given for COUNT above
  2**36 (Redis: whenever its allocator fails).
"""

from __future__ import annotations

import time
from typing import Any

import trio

import server.commands.streams  # noqa: F401  (declares the XINFO container first)
from server.commands import topic_groups  # multi-partition topic keys (membership)
from server.acl import require_key
from server.args import parse_int
from server.errors import (
    TIMEOUT_NEGATIVE,
    TIMEOUT_NOT_INTEGER,
    CommandError,
    err,
    syntax_error,
)
from server.registry import command, container, nowait_path
from server.reply import NULL_ARRAY, OK, Map, Raw, Simple
from storage.entry_codec import decode_entry
from storage.streams.groups import (
    MAX_ID,
    ZERO_ID,
    ConsumerGroup,
    GroupStore,
    advance_entries_read,
    check_dead_letter,
    group_lag,
    groups_of,
    range_has_tombstones,
)
from storage.streams.ids import (
    StreamIdError, format_id, parse_id, parse_range_end, parse_range_start, parse_strict_id, parse_strict_id_tuples,
)

NO_SUCH_KEY = "no such key"
KEY_MUST_EXIST = (
    "The XGROUP subcommand requires the key to exist. Note that for CREATE you may want "
    "to use the MKSTREAM option to create an empty stream automatically."
)
DOLLAR_IN_XREADGROUP = (
    "The $ ID is meaningless in the context of XREADGROUP: you want to read the history of "
    "this consumer by specifying a proper ID, or use the > ID to get new messages. The $ ID "
    "would just return an empty result set."
)
ENTRIESREAD_NEGATIVE = "value for ENTRIESREAD must be positive or -1"
XAUTOCLAIM_COUNT_MAX = (2**63 - 1) // 16
XAUTOCLAIM_COUNT_ALLOC_MAX = 2**36

# Fields appended to a dead-lettered entry after its own fields.
DL_SOURCE_KEY = b"dl-source-key"
DL_SOURCE_ID = b"dl-source-id"
DL_GROUP = b"dl-group"
DL_CONSUMER = b"dl-consumer"
DL_DELIVERIES = b"dl-deliveries"


def clock_ms() -> int:
    """Wall-clock ms for delivery and seen times (tests may replace it)."""
    return time.time_ns() // 1_000_000


# ---------------------------------------------------------------- helpers


def _c(raw: bytes) -> str:
    """An argument as Redis prints it with ``%s``: a C string."""
    nul = raw.find(b"\x00")
    if nul >= 0:
        raw = raw[:nul]
    return raw.decode("utf-8", "replace")


def _nogroup(key: bytes, group: bytes) -> CommandError:
    return CommandError("NOGROUP", f"No such key '{_c(key)}' or consumer group '{_c(group)}'")


def _nogroup_for_key(key: bytes, group: bytes) -> CommandError:
    return CommandError("NOGROUP", f"No such consumer group '{_c(group)}' for key name '{_c(key)}'")


def _subcommand_syntax_error(argv: list[bytes], container_name: str) -> CommandError:
    sub = argv[1].decode("utf-8", "replace")[:128]
    return err(f"unknown subcommand or wrong number of arguments for '{sub}'. Try {container_name} HELP.")


def _word(raw: bytes) -> bytes:
    return raw.upper()


class _Counters:
    """A stream's counters for the lag rules; the first ID is read lazily."""

    __slots__ = ("_stream", "length", "entries_added", "last_id", "max_deleted_entry_id", "_first")

    def __init__(self, stream) -> None:
        self._stream = stream
        self.length = stream.length
        self.entries_added = stream.entries_added
        self.last_id = tuple(stream.last_id)
        self.max_deleted_entry_id = tuple(stream.max_deleted_entry_id)
        self._first = None

    @property
    def first_id(self):
        if self._first is None:
            self._first = tuple(self._stream.first_entry_id()) if self.length else ZERO_ID
        return self._first


def _entry(stream, sid) -> bytes | memoryview | None:
    """The stored entry with ID ``sid``, or None when deleted, trimmed or absent."""
    log = stream.log
    start, end = log.log_start_offset, log.log_end_offset
    if start >= end:
        return None
    offset = log.find_offset(sid[0], sid[1], inclusive=True)
    if not start <= offset < end or tuple(log.entry_id(offset)) != tuple(sid):
        return None
    return log.entry_at(offset)


def _nil_entry(sid, protocol: int) -> bytes:
    """``[id, nil]`` for a pending entry no longer in the stream, pre-encoded."""
    text = format_id(sid)
    return b"*2\r\n$%d\r\n%s\r\n%s" % (len(text), text, b"_\r\n" if protocol == 3 else b"*-1\r\n")


def _dead_letter(ctx, key: bytes, store: GroupStore, group: ConsumerGroup,
                 moves: list[tuple[tuple[int, int], bytes, int]]) -> None:
    """Append each ``(id, encoded entry, owner)`` to the group's dead-letter
    stream with its origin, then drop the IDs from the PEL.

    The appends are noted for durability before the PEL change, so a crash in
    between can dead-letter an entry twice, never lose it.
    """
    if not moves:
        return
    dl_key = group.dead_letter_key
    dl_stream = ctx.server.topics.get_or_create(dl_key)
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
    ctx.session.wrote_log(dl_stream.log)
    ctx.server.signal_key_modified(dl_key)
    store.dead_letter(group.name, [sid for sid, _, _ in moves])
    ctx.session.wrote_group(store)


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


def _check_dead_letter(key: bytes, md: int, dl: bytes | None) -> None:
    check_dead_letter(md, dl)  # the store's refusals (GroupError), before anything is created
    if dl is not None and dl == key:
        raise err("the DEADLETTER key must differ from the stream key")


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
    On a multi-partition topic key: on every partition (server.commands.topic_groups).
    """
    topics = ctx.server.topics
    if any(_word(a) == b"MKSTREAM" for a in argv[5:]) and topics.create_if_missing(argv[2]):
        ctx.server.signal_key_modified(argv[2])  # a new topic of default-partitions
    if topics.is_multi(argv[2]):
        return topic_groups.xgroup_create(ctx, argv, xgroup_create)
    argc = len(argv)
    key, name = argv[2], argv[3]
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
            value = parse_int(argv[i + 1])
            if value < 0 and value != -1:
                raise err(ENTRIESREAD_NEGATIVE)
            entries_read = None if value == -1 else value
            i += 2
        else:
            parsed = _parse_dead_letter_options(argv, i, md, dl)
            if parsed is None:
                raise _subcommand_syntax_error(argv, "XGROUP")
            md, dl = parsed
            partita_args += 2
            i += 2
    topics = ctx.server.topics
    stream = topics.get(key)
    if stream is None and not mkstream:
        raise err(KEY_MUST_EXIST)
    if argc - partita_args > 8:
        raise _subcommand_syntax_error(argv, "XGROUP")
    if argv[4] == b"$":
        last_id = tuple(stream.last_id) if stream is not None else ZERO_ID
    else:
        last_id = tuple(parse_strict_id(argv[4]))
    md = md or 0
    _check_dead_letter(key, md, dl)
    if stream is None:
        stream = topics.get_or_create(key)
        ctx.session.wrote_log(stream.log)
        ctx.server.signal_key_modified(key)
    store = groups_of(stream)
    if store.group(name) is not None:
        raise CommandError("BUSYGROUP", "Consumer Group name already exists")
    store.create_group(name, last_id, entries_read, max_deliveries=md, dead_letter_key=dl)
    ctx.session.wrote_group(store)
    return OK


def _stream_and_store(ctx, key: bytes):
    stream = ctx.server.topics.get(key)
    if stream is None:
        raise err(KEY_MUST_EXIST)
    return stream, groups_of(stream)


def _existing_group(store: GroupStore, key: bytes, name: bytes) -> ConsumerGroup:
    group = store.group(name)
    if group is None:
        raise _nogroup_for_key(key, name)
    return group


@command(
    "xgroup|setid", arity=-5, flags="write", keys=(2, 2, 1), group="stream", since="5.0.0",
    summary="Set a consumer group to an arbitrary last delivered ID value.",
    syntax="XGROUP SETID key group <id | $> [ENTRIESREAD entries-read]",
    acl_categories=("write", "stream", "slow"),
)
def xgroup_setid(ctx, argv):
    """XGROUP SETID key group <id | $> [ENTRIESREAD entries-read]"""
    if ctx.server.topics.is_multi(argv[2]):
        return topic_groups.xgroup_all_ok(ctx, argv, xgroup_setid)
    key, name = argv[2], argv[3]
    stream, store = _stream_and_store(ctx, key)
    _existing_group(store, key, name)
    if len(argv) not in (5, 7):
        raise _subcommand_syntax_error(argv, "XGROUP")
    entries_read: int | None = None
    if len(argv) == 7:  # Redis parses ENTRIESREAD before the ID
        if _word(argv[5]) != b"ENTRIESREAD":
            raise _subcommand_syntax_error(argv, "XGROUP")
        value = parse_int(argv[6])
        if value < 0 and value != -1:
            raise err(ENTRIESREAD_NEGATIVE)
        entries_read = None if value == -1 else value
    if argv[4] == b"$":
        last_id = tuple(stream.last_id)
    else:
        last_id = tuple(parse_id(argv[4])[0])
    store.set_id(name, last_id, entries_read)
    ctx.session.wrote_group(store)
    return OK


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
    if ctx.server.topics.is_multi(argv[2]):
        return topic_groups.xgroup_any(ctx, argv, xgroup_destroy)
    key, name = argv[2], argv[3]
    _, store = _stream_and_store(ctx, key)
    if not store.destroy_group(name):
        return 0
    ctx.session.wrote_group(store)
    ctx.server.signal_key_modified(key)
    return 1


@command(
    "xgroup|createconsumer", arity=5, flags="write denyoom", keys=(2, 2, 1), group="stream",
    since="6.2.0",
    summary="Create a consumer in a consumer group.",
    syntax="XGROUP CREATECONSUMER key group consumer",
    acl_categories=("write", "stream", "slow"),
)
def xgroup_createconsumer(ctx, argv):
    """XGROUP CREATECONSUMER key group consumer"""
    if ctx.server.topics.is_multi(argv[2]):
        return topic_groups.xgroup_any(ctx, argv, xgroup_createconsumer)
    key, name = argv[2], argv[3]
    _, store = _stream_and_store(ctx, key)
    _existing_group(store, key, name)
    created = store.create_consumer(name, argv[4], clock_ms())
    if created:
        ctx.session.wrote_group(store)
    return 1 if created else 0


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
    if ctx.server.topics.is_multi(argv[2]):
        return topic_groups.xgroup_delconsumer(ctx, argv, xgroup_delconsumer)
    key, name = argv[2], argv[3]
    _, store = _stream_and_store(ctx, key)
    group = _existing_group(store, key, name)
    if argv[4] not in group.consumers:
        return 0
    pending = store.delete_consumer(name, argv[4])
    ctx.session.wrote_group(store)
    return pending


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
    if ctx.server.topics.is_multi(argv[2]):
        return topic_groups.xgroup_all_ok(ctx, argv, xgroup_config)
    key, name = argv[2], argv[3]
    _, store = _stream_and_store(ctx, key)
    group = _existing_group(store, key, name)
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
    if md > 0 and dl is None:
        dl = group.dead_letter_key
        if dl is not None:
            require_key(ctx.client, dl)  # this user's reads will write it
    _check_dead_letter(key, md, dl)
    store.configure_dead_letter(name, md, dl)
    ctx.session.wrote_group(store)
    return OK


# ------------------------------------------------------------ XREADGROUP


def _xreadgroup_keys(argv: list[bytes]) -> list[int]:
    """Key positions: the first half of the arguments after STREAMS (searched from argv[4])."""
    for i in range(4, len(argv)):
        if argv[i].upper() == b"STREAMS":
            rest = len(argv) - i - 1
            return list(range(i + 1, i + 1 + rest // 2))
    return []


class _ReadGroupArgs:
    __slots__ = ("timeout_ms", "count", "noack", "group", "consumer", "keys", "id_args")

    def __init__(self) -> None:
        self.timeout_ms: int | None = None
        self.count = 0
        self.noack = False
        self.group: bytes | None = None
        self.consumer: bytes | None = None
        self.keys: list[bytes] = []
        self.id_args: list[bytes] = []


def _parse_xreadgroup(argv: list[bytes]) -> _ReadGroupArgs:
    args = _ReadGroupArgs()
    argc = len(argv)
    streams_arg = 0
    i = 1
    while i < argc:
        more = argc - i - 1
        word = _word(argv[i])
        if word == b"BLOCK" and more:
            i += 1
            args.timeout_ms = parse_int(argv[i], TIMEOUT_NOT_INTEGER)
            if args.timeout_ms < 0:
                raise err(TIMEOUT_NEGATIVE)
        elif word == b"COUNT" and more:
            i += 1
            args.count = max(parse_int(argv[i]), 0)
        elif word == b"STREAMS" and more:
            streams_arg = i + 1
            if (argc - streams_arg) % 2:
                raise err("Unbalanced XREAD list of streams: for each stream key an ID or '$' must be specified.")  # 7.0's text, XREADGROUP too
            break
        elif word == b"GROUP" and more >= 2:
            args.group, args.consumer = argv[i + 1], argv[i + 2]
            i += 2
        elif word == b"NOACK":
            args.noack = True
        else:
            raise syntax_error()
        i += 1
    if streams_arg == 0:
        raise syntax_error()
    if args.group is None:
        raise err("Missing GROUP option for XREADGROUP")
    half = (argc - streams_arg) // 2
    args.keys = argv[streams_arg:streams_arg + half]
    args.id_args = argv[streams_arg + half:]
    return args


class _Target:
    """One key of an XREADGROUP: its stream, store, group, and where to read."""

    __slots__ = ("key", "stream", "store", "group", "after")

    def __init__(self, key, stream, store, group, after) -> None:
        self.key = key
        self.stream = stream
        self.store = store
        self.group = group
        self.after = after  # None for ">", else the history start (exclusive)


def _serve_new(ctx, target: _Target, consumer: bytes, count: int, noack: bool, now_ms: int):
    """Deliver entries after the group's last_id; a Raw reply or None."""
    stream, group, store = target.stream, target.group, target.store
    if not stream.length:
        return None
    log = stream.log
    if tuple(log.last_id) <= group.last_id:  # cheap: no entry after last_id at all
        return None
    start = max(log.find_offset(group.last_id[0], group.last_id[1], inclusive=False), log.log_start_offset)
    view = ctx.read_view()  # chunks as views of the log's mapping, as XREAD's (sent before any await)
    res = log.read(start, log.log_end_offset, max_count=count or None, with_ids=True, view=view)
    if not res.count:
        return None
    if view:
        ctx.views = True
    ctx.server.topics.note_entries_out(res.count)
    ids = [(ms, seq) for _, ms, seq in res.entries]
    counters = _Counters(stream)
    entries_read = group.entries_read
    if entries_read is not None and not range_has_tombstones(counters, ids[0], None):
        entries_read += len(ids)  # no tombstone after the first: none after any
    else:
        for sid in ids:
            entries_read = advance_entries_read(counters, group, entries_read, sid)
    store.deliver(group.name, consumer, ids, ids[-1], entries_read, now_ms, noack=noack)
    ctx.session.wrote_group(store)
    return Raw(res.count, res.chunks)


def _serve_history(ctx, target: _Target, consumer: bytes, count: int, now_ms: int) -> Raw:
    """The consumer's own pending entries after ``target.after``."""
    stream, group, store = target.stream, target.group, target.store
    c = group.consumer(consumer)
    chunks: list = []
    redelivered: list = []
    dead: list = []
    protocol = ctx.client.protocol
    try:
        start = target.after.incr()
    except OverflowError:
        start = MAX_ID
    if c is not None:
        for sid, pe in c.pending.range(tuple(start), MAX_ID):
            if count and len(chunks) >= count:
                break
            encoded = _entry(stream, sid)
            if encoded is None:
                chunks.append(_nil_entry(sid, protocol))
                continue
            if group.max_deliveries and pe.delivery_count + 1 > group.max_deliveries:
                dead.append((sid, bytes(encoded), consumer))
                continue
            chunks.append(encoded)
            redelivered.append(sid)
    if redelivered:
        store.redeliver(group.name, consumer, redelivered, now_ms)
        ctx.session.wrote_group(store)
    _dead_letter(ctx, target.key, store, group, dead)
    return Raw(len(chunks), chunks)


def _read_reply(ctx, served: list[tuple[bytes, object]]):
    if ctx.client.protocol == 3:
        return Map(served)
    return [[key, value] for key, value in served]


@command(
    "xreadgroup", arity=-7, flags="write blocking movablekeys", keys=(0, 0, 0), group="stream",
    since="5.0.0",
    summary="Return new entries from a stream using a consumer group, or access the history of the pending entries for a given consumer. Can block.",
    syntax="XREADGROUP GROUP group consumer [COUNT count] [BLOCK milliseconds] [NOACK] STREAMS key [key ...] id [id ...]",
    acl_categories=("write", "stream", "slow", "blocking"),
    key_finder=_xreadgroup_keys,
)
async def xreadgroup(ctx, argv):
    """XREADGROUP GROUP group consumer [COUNT count] [BLOCK milliseconds] [NOACK] STREAMS key [key ...] id [id ...]

    ``>`` delivers entries after the group's last-delivered-id (into the
    consumer's PEL unless NOACK); an explicit ID re-reads the consumer's own
    pending entries after it (deleted ones come back as ``[id, nil]``).
    BLOCK waits only when every key asked for ``>`` and none had entries.
    """
    args = _parse_xreadgroup(argv)
    topics = ctx.server.topics
    if any(topics.is_multi(key) for key in args.keys):  # membership: server.commands.topic_groups
        return await topic_groups.xreadgroup(ctx, args)
    targets, reply = _serve_now(ctx, args)
    if reply is not None:
        return reply

    keys = list(args.keys)
    deadline = None if args.timeout_ms == 0 else trio.current_time() + args.timeout_ms / 1000
    token = object()
    queues = [_blocked_queue(t) for t in targets]
    for queue in queues:
        queue.append(token)
    try:
        return await _wait_and_serve(ctx, args, targets, keys, deadline, queues, token)
    finally:
        for t, queue in zip(targets, queues):
            queue.remove(token)
            if not queue:
                _BLOCKED.pop((id(t.stream), t.group.name), None)


@nowait_path("xreadgroup")
def xreadgroup_now(ctx, argv):
    """XREADGROUP that will not wait (no BLOCK, or entries to serve): the
    handler's reply without its coroutine, the connection's await and the
    send before it (a consumer's poll). None when it would block, or for a
    topic of several partitions (membership): the handler then runs, and
    finds nothing done (a call that served nothing changed nothing)."""
    args = _parse_xreadgroup(argv)
    topics = ctx.server.topics
    if any(topics.is_multi(key) for key in args.keys):
        return None
    return _serve_now(ctx, args)[1]


def _serve_now(ctx, args: _ReadGroupArgs) -> tuple[list[_Target], Any]:
    """XREADGROUP's targets and its reply without waiting: what it serves,
    the null array when no key had anything and it may not block, or None
    when it should block (only ``>`` keys, none with new entries, and
    nothing changed)."""
    topics = ctx.server.topics
    targets: list[_Target] = []
    for key, raw in zip(args.keys, args.id_args):
        stream = topics.get(key)
        store = groups_of(stream) if stream is not None else None
        group = store.group(args.group) if store is not None else None
        if group is None:
            raise CommandError(
                "NOGROUP",
                f"No such key '{_c(key)}' or consumer group '{_c(args.group)}' in XREADGROUP with GROUP option",
            )
        if raw == b"$":
            raise err(DOLLAR_IN_XREADGROUP)
        after = None if raw == b">" else parse_strict_id(raw)
        targets.append(_Target(key, stream, store, group, after))

    now_ms = clock_ms()
    served: list[tuple[bytes, object]] = []
    for t in targets:
        # Redis 7.0 looks the consumer up (creating it, refreshing its seen
        # time) only for a key it serves now: history, or new entries.
        if t.after is not None:
            t.store.touch_consumer(t.group.name, args.consumer, now_ms)
            ctx.session.wrote_group(t.store)
            served.append((t.key, _serve_history(ctx, t, args.consumer, args.count, now_ms)))
        else:
            raw = _serve_new(ctx, t, args.consumer, args.count, args.noack, now_ms)
            if raw is not None:
                served.append((t.key, raw))
    if served:
        return targets, _read_reply(ctx, served)
    if args.timeout_ms is None or ctx.client.in_multi or not ctx.may_block:
        return targets, NULL_ARRAY
    return targets, None


# Readers blocked per (stream, group), in arrival order: one signal wakes them
# all at once, and each waits one scheduler pass per reader ahead of it, so
# new entries go to the longest-waiting reader first, as in Redis.
_BLOCKED: dict[tuple[int, bytes], list] = {}


def _blocked_queue(t: _Target) -> list:
    return _BLOCKED.setdefault((id(t.stream), t.group.name), [])


async def _wait_and_serve(ctx, args, targets, keys, deadline, queues, token):
    topics = ctx.server.topics
    while True:
        remaining_s = None
        if deadline is not None:
            remaining_s = deadline - trio.current_time()
            if remaining_s <= 0:
                return NULL_ARRAY
        if not await ctx.server.wait_for_keys(keys, remaining_s):
            return NULL_ARRAY
        ahead = max(queue.index(token) for queue in queues)
        for _ in range(ahead):
            await trio.sleep(0)
        for t in targets:
            if topics.get(t.key) is not t.stream:
                return CommandError("UNBLOCKED", "the stream key no longer exists")
            if t.store.group(args.group) is not t.group:
                return CommandError("NOGROUP", "the consumer group this client was blocked on no longer exists")
        now_ms = clock_ms()
        served = []
        for t in targets:
            raw = _serve_new(ctx, t, args.consumer, args.count, args.noack, now_ms)
            if raw is not None:
                served.append((t.key, raw))
        if served:
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
    stream = ctx.server.topics.get(argv[1])
    if stream is None:
        return 0
    store = groups_of(stream)
    if store.group(argv[2]) is None:
        return 0
    ids = parse_strict_id_tuples(argv[3:])
    acked = store.ack(argv[2], ids)
    if acked:
        ctx.session.wrote_group(store)
    return acked


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
    summary = argc == 3
    if argc != 3 and not 6 <= argc <= 9:
        raise syntax_error()
    min_idle = 0
    consumer_name = None
    if argc >= 6:
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
            consumer_name = argv[start_idx + 3]
    stream = ctx.server.topics.get(argv[1])
    group = groups_of(stream).group(argv[2]) if stream is not None else None
    if group is None:
        raise _nogroup(argv[1], argv[2])
    if summary:
        pel = group.pel
        if not pel:
            return [0, None, None, NULL_ARRAY]
        per_consumer = [[c.name, b"%d" % len(c.pending)] for c in group.sorted_consumers() if c.pending]
        return [len(pel), format_id(pel.first()), format_id(pel.last()), per_consumer]
    if consumer_name is not None:
        c = group.consumer(consumer_name)
        if c is None:
            return []
        pel = c.pending
    else:
        pel = group.pel
    now = clock_ms()
    out = []
    if count <= 0:
        return out
    for sid in pel.ids_from(start, end):
        pe = pel.get(sid)
        idle = now - pe.delivery_time_ms
        if min_idle and idle < min_idle:
            continue
        out.append([format_id(sid), pe.consumer, max(idle, 0), pe.delivery_count])
        if len(out) >= count:
            break
    return out


# ---------------------------------------------------------------- XCLAIM


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
    key, name, consumer = argv[1], argv[2], argv[3]
    stream = ctx.server.topics.get(key)
    group = groups_of(stream).group(name) if stream is not None else None
    if group is None:
        raise _nogroup(key, name)
    store = groups_of(stream)
    min_idle = parse_int(argv[4], "Invalid min-idle-time argument for XCLAIM")
    min_idle = max(min_idle, 0)
    argc = len(argv)
    ids = []
    j = 5
    while j < argc:
        try:
            ids.append(tuple(parse_strict_id(argv[j])))
        except StreamIdError:
            break
        j += 1
    now = clock_ms()
    delivery_time: int | None = None
    retry_count = -1
    force = justid = False
    last_id = ZERO_ID
    while j < argc:
        more = argc - 1 - j
        opt = argv[j]
        word = _word(opt)
        if word == b"FORCE":
            force = True
        elif word == b"JUSTID":
            justid = True
        elif word == b"IDLE" and more:
            j += 1
            delivery_time = now - parse_int(argv[j], "Invalid IDLE option argument for XCLAIM")
        elif word == b"TIME" and more:
            j += 1
            delivery_time = parse_int(argv[j], "Invalid TIME option argument for XCLAIM")
        elif word == b"RETRYCOUNT" and more:
            j += 1
            retry_count = parse_int(argv[j], "Invalid RETRYCOUNT option argument for XCLAIM")
        elif word == b"LASTID" and more:
            j += 1
            last_id = tuple(parse_strict_id(argv[j]))
        else:
            raise err(f"Unrecognized XCLAIM option '{_c(opt)}'")
        j += 1
    if delivery_time is None or delivery_time < 0 or delivery_time > now:
        delivery_time = now
    new_last = last_id if last_id > group.last_id else None

    # Redis handles the IDs one by one (a repeated ID is claimed again), so
    # keep this call's view of each touched entry: [owner, time, count].
    touched: dict = {}
    gone: set = set()  # dropped or dead-lettered during this call
    dropped = []
    dead = []
    replies: list = []
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
        if state is None:
            if not force:
                continue
            state = [None, now, 1]  # created by FORCE: no owner, so no idle check
        elif min_idle and state[0] is not None and now - state[1] < min_idle:
            continue
        if retry_count >= 0:
            new_count = retry_count
        elif not justid:
            new_count = state[2] + 1
        else:
            new_count = state[2]
        if (group.max_deliveries and retry_count < 0 and not justid and state[0] is not None
                and sid not in touched and new_count > group.max_deliveries):
            dead.append((sid, bytes(encoded), state[0]))
            gone.add(sid)
            continue
        touched[sid] = [consumer, delivery_time, new_count]
        replies.append(format_id(sid) if justid else encoded)
    if dropped:
        store.drop_pending(name, dropped)
    _dead_letter(ctx, key, store, group, dead)
    claims = [(sid, t, n) for sid, (_, t, n) in touched.items()]
    if claims:
        store.claim(name, consumer, claims, now, last_id=new_last)
    elif new_last is not None:
        store.set_id(name, new_last, group.entries_read)
    if claims or dropped or new_last is not None:
        ctx.session.wrote_group(store)
    if justid:
        return replies
    return Raw(len(replies), replies)


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
    key, name, consumer = argv[1], argv[2], argv[3]
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
    stream = ctx.server.topics.get(key)
    store = groups_of(stream) if stream is not None else None
    group = store.group(name) if store is not None else None
    if group is None:
        raise _nogroup(key, name)
    if count > XAUTOCLAIM_COUNT_ALLOC_MAX:
        raise err("Insufficient memory, failed allocating transient memory, COUNT too high.")

    now = clock_ms()
    attempts = count * 10
    claims = []
    replies: list = []
    deleted = []
    dead = []
    cursor = ZERO_ID
    ids = group.pel.ids_from(start)
    for sid in ids:
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
        if min_idle and now - pe.delivery_time_ms < min_idle:
            continue
        new_count = pe.delivery_count if justid else pe.delivery_count + 1
        if group.max_deliveries and not justid and new_count > group.max_deliveries:
            dead.append((sid, bytes(encoded), pe.consumer))
            count -= 1
            continue
        claims.append((sid, now, new_count))
        replies.append(format_id(sid) if justid else encoded)
        count -= 1
    if deleted:
        store.drop_pending(name, deleted)
    _dead_letter(ctx, key, store, group, dead)
    if claims:
        store.claim(name, consumer, claims, now)
    if claims or deleted:
        ctx.session.wrote_group(store)
    entries = replies if justid else Raw(len(replies), replies)
    return [format_id(cursor), entries, [format_id(sid) for sid in deleted]]


# ----------------------------------------------------------------- XINFO


def _group_info(counters: _Counters, group: ConsumerGroup) -> Map:
    info = Map()
    info["name"] = group.name
    info["consumers"] = len(group.consumers)
    info["pending"] = len(group.pel)
    info["last-delivered-id"] = format_id(group.last_id)
    info["entries-read"] = group.entries_read
    info["lag"] = group_lag(counters, group)
    _add_dead_letter_info(info, group)
    return info


def _add_dead_letter_info(info: Map, group: ConsumerGroup) -> None:
    if group.max_deliveries:
        info["max-deliveries"] = group.max_deliveries
        info["dead-letter-key"] = group.dead_letter_key
        info["dead-lettered"] = group.dead_lettered_total


@command(
    "xinfo|groups", arity=3, flags="readonly", keys=(2, 2, 1), group="stream", since="5.0.0",
    summary="List the consumer groups of a stream",
    syntax="XINFO GROUPS key",
    acl_categories=("read", "stream", "slow"),
)
def xinfo_groups(ctx, argv):
    """XINFO GROUPS key

    Redis's fields; a group with dead-lettering also reports
    max-deliveries, dead-letter-key and dead-lettered.
    """
    if ctx.server.topics.is_multi(argv[2]):
        return topic_groups.xinfo_groups(ctx, argv[2])
    stream = ctx.server.topics.get(argv[2])
    if stream is None:
        raise err(NO_SUCH_KEY)
    counters = _Counters(stream)
    return [_group_info(counters, g) for g in groups_of(stream).sorted_groups()]


@command(
    "xinfo|consumers", arity=4, flags="readonly", keys=(2, 2, 1), group="stream", since="5.0.0",
    summary="List the consumers in a consumer group",
    syntax="XINFO CONSUMERS key group",
    acl_categories=("read", "stream", "slow"),
)
def xinfo_consumers(ctx, argv):
    """XINFO CONSUMERS key group"""
    key, name = argv[2], argv[3]
    if ctx.server.topics.is_multi(key):
        return topic_groups.xinfo_consumers(ctx, key, name)
    stream = ctx.server.topics.get(key)
    if stream is None:
        raise err(NO_SUCH_KEY)
    group = groups_of(stream).group(name)
    if group is None:
        raise _nogroup_for_key(key, name)
    now = clock_ms()
    out = []
    for c in group.sorted_consumers():
        info = Map()
        info["name"] = c.name
        info["pending"] = len(c.pending)
        info["idle"] = max(now - c.seen_time_ms, 0)
        # Redis 7.2's field: ms since the last read or claim that got entries; -1 never.
        info["inactive"] = max(now - c.active_time_ms, 0) if c.active_time_ms >= 0 else -1
        out.append(info)
    return out


def group_count(stream) -> int:
    """How many consumer groups ``stream`` has (XINFO STREAM's ``groups``)."""
    return len(groups_of(stream).groups)


def groups_full_info(stream, count: int) -> list:
    """The ``groups`` value of ``XINFO STREAM key FULL [COUNT count]``.

    ``count`` limits each PEL listed (0 = no limit), as in Redis.
    """
    counters = _Counters(stream)
    limit = count or None
    out = []
    for g in groups_of(stream).sorted_groups():
        info = Map()
        info["name"] = g.name
        info["last-delivered-id"] = format_id(g.last_id)
        info["entries-read"] = g.entries_read
        info["lag"] = group_lag(counters, g)
        info["pel-count"] = len(g.pel)
        info["pending"] = [
            [format_id(sid), pe.consumer, pe.delivery_time_ms, pe.delivery_count]
            for sid, pe in g.pel.range(count=limit)
        ]
        consumers = []
        for c in g.sorted_consumers():
            ci = Map()
            ci["name"] = c.name
            ci["seen-time"] = c.seen_time_ms
            ci["pel-count"] = len(c.pending)
            ci["pending"] = [
                [format_id(sid), pe.delivery_time_ms, pe.delivery_count]
                for sid, pe in c.pending.range(count=limit)
            ]
            consumers.append(ci)
        info["consumers"] = consumers
        _add_dead_letter_info(info, g)
        out.append(info)
    return out
