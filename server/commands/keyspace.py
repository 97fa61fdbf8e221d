"""Keyspace commands: every key is a stream (a Partita topic).

Owns: DEL, UNLINK, EXISTS, TYPE, KEYS, SCAN, DBSIZE, FLUSHALL, FLUSHDB,
RENAME, RENAMENX: parsing with Redis's texts, one call of the client's
broker session (``ctx.session``: cluster.broker.reads), the reply. Patterns
match as Redis's (``server.glob``); a restricted user sees only the keys
its patterns allow (``server.acl.key_filter``).

SCAN cursor: the broker walks keys in the order of a hash of their names
(``Session.scan_keys``), so a key present for the whole iteration is
returned exactly once, whatever is added or deleted between calls, as Redis
promises.

Must not know: files, segments, topics and partitions.
"""

from __future__ import annotations

from types import CoroutineType

from server.acl import key_filter, visible_keys
from server.args import parse_int
from server.errors import err, syntax_error
from server.glob import glob_match
from server.registry import command
from server.reply import OK, Simple


# ------------------------------------------------------------ the commands


@command(
    "del", arity=-2, flags="write", keys=(1, -1, 1), group="generic", since="1.0.0",
    summary="Deletes one or more keys.", syntax="DEL key [key ...]",
    acl_categories=("keyspace", "write", "slow"),
)
def del_(ctx, argv):
    """DEL key [key ...]

    Deleting a stream deletes its topic: every partition's files.
    """
    return ctx.session.delete_keys(argv[1:])


@command(
    "unlink", arity=-2, flags="write fast", keys=(1, -1, 1), group="generic", since="4.0.0",
    summary="Asynchronously deletes one or more keys.", syntax="UNLINK key [key ...]",
    acl_categories=("keyspace", "write", "fast"),
)
def unlink(ctx, argv):
    """UNLINK key [key ...]

    Same as DEL here: the files are removed before the reply.
    """
    return ctx.session.delete_keys(argv[1:])


@command(
    "exists", arity=-2, flags="readonly fast", keys=(1, -1, 1), group="generic", since="1.0.0",
    summary="Determines whether one or more keys exist.", syntax="EXISTS key [key ...]",
    acl_categories=("keyspace", "read", "fast"),
)
def exists(ctx, argv):
    """EXISTS key [key ...]

    A key named twice counts twice, as in Redis.
    """
    return ctx.session.count_existing(argv[1:])


@command(
    "type", arity=2, flags="readonly fast", keys=(1, 1, 1), group="generic", since="1.0.0",
    summary="Determines the type of value stored at a key.", syntax="TYPE key",
    acl_categories=("keyspace", "read", "fast"),
)
def type_(ctx, argv):
    """TYPE key"""
    return Simple("stream" if ctx.session.count_existing(argv[1:2]) else "none")


@command(
    "keys", arity=2, flags="readonly", keys=(0, 0, 0), group="generic", since="1.0.0",
    summary="Returns all key names that match a pattern.", syntax="KEYS pattern",
    acl_categories=("keyspace", "read", "slow", "dangerous"),
)
def keys(ctx, argv):
    """KEYS pattern

    Partita: a user with key patterns sees only the keys they allow
    (``server.acl.key_filter``; Redis 7.0 lists every key).
    """
    pattern = argv[1]
    everything = pattern == b"*"
    return visible_keys(ctx.client, [k for k in ctx.session.key_names() if everything or glob_match(pattern, k)])


def _parse_cursor(raw: bytes) -> int:
    """Redis ``parseScanCursorOrReply``: C ``strtoul`` without leading space."""
    text = raw
    if not text:
        return 0  # strtoul("") is 0 and consumes everything
    if text[:1] in b" \t\n\v\f\r":
        raise err("invalid cursor")
    negative = text[:1] == b"-"
    if text[:1] in (b"+", b"-"):
        text = text[1:]
    if not text.isdigit():
        raise err("invalid cursor")
    value = int(text)
    if value > 2**64 - 1:
        raise err("invalid cursor")
    return (-value) % 2**64 if negative else value


@command(
    "scan", arity=-2, flags="readonly", keys=(0, 0, 0), group="generic", since="2.8.0",
    summary="Iterates over the key names in the database.",
    syntax="SCAN cursor [MATCH pattern] [COUNT count] [TYPE type]",
    acl_categories=("keyspace", "read", "slow"),
)
def scan(ctx, argv):
    """SCAN cursor [MATCH pattern] [COUNT count] [TYPE type]

    See the module docstring for the cursor. COUNT is how many keys are
    examined per call (10 by default); MATCH and TYPE filter those, and so
    do a restricted user's key patterns (Partita; as KEYS).
    """
    cursor = _parse_cursor(argv[1])
    count = 10
    pattern = None
    type_name = None
    i = 2
    while i < len(argv):
        more = len(argv) - i
        word = argv[i].upper()
        if word == b"COUNT" and more >= 2:
            count = parse_int(argv[i + 1])
            if count < 1:
                raise syntax_error()
            i += 2
        elif word == b"MATCH" and more >= 2:
            pattern = None if argv[i + 1] == b"*" else argv[i + 1]
            i += 2
        elif word == b"TYPE" and more >= 2:
            type_name = argv[i + 1]
            i += 2
        else:
            raise syntax_error()
    next_cursor, batch = ctx.session.scan_keys(cursor, count)
    visible = key_filter(ctx.client)
    found = []
    for key in batch:
        if pattern is not None and not glob_match(pattern, key):
            continue
        if type_name is not None and type_name.lower() != b"stream":
            continue
        if visible is not None and not visible(key):
            continue
        found.append(key)
    return [b"%d" % next_cursor, found]


@command(
    "dbsize", arity=1, flags="readonly fast", keys=(0, 0, 0), group="server", since="1.0.0",
    summary="Returns the number of keys in the database.", syntax="DBSIZE",
    acl_categories=("keyspace", "read", "fast"),
)
def dbsize(ctx, argv):
    """DBSIZE"""
    return ctx.session.key_count()


def _flush(ctx, argv):
    if len(argv) > 2:
        raise syntax_error()
    if len(argv) == 2 and argv[1].upper() not in (b"SYNC", b"ASYNC"):
        raise syntax_error()
    ctx.session.flush_all()
    return OK


@command(
    "flushall", arity=-1, flags="write", keys=(0, 0, 0), group="server", since="1.0.0",
    summary="Removes all keys from all databases.", syntax="FLUSHALL [ASYNC | SYNC]",
    acl_categories=("keyspace", "write", "slow", "dangerous"),
)
def flushall(ctx, argv):
    """FLUSHALL [ASYNC | SYNC]

    Deletes every topic and its files before replying (ASYNC too).
    """
    return _flush(ctx, argv)


@command(
    "flushdb", arity=-1, flags="write", keys=(0, 0, 0), group="server", since="1.0.0",
    summary="Remove all keys from the current database.", syntax="FLUSHDB [ASYNC | SYNC]",
    acl_categories=("keyspace", "write", "slow", "dangerous"),
)
def flushdb(ctx, argv):
    """FLUSHDB [ASYNC | SYNC]

    Partita has one database: same as FLUSHALL.
    """
    return _flush(ctx, argv)


def _rename(ctx, argv, nx: bool):
    renamed = ctx.session.rename(argv[1], argv[2], nx)  # TopicError, ClusterError: failures.py
    if type(renamed) is CoroutineType:  # (a cluster: the rename waits for the replicas first)
        return _rename_reply_when(renamed, nx)
    return _rename_reply(renamed, nx)


def _rename_reply(renamed: bool | None, nx: bool):
    if renamed is None:
        raise err("no such key")
    return int(renamed) if nx else OK


async def _rename_reply_when(renaming, nx: bool):
    return _rename_reply(await renaming, nx)


@command(
    "rename", arity=3, flags="write", keys=(1, 2, 1), group="generic", since="1.0.0",
    summary="Renames a key and overwrites the destination.", syntax="RENAME key newkey",
    acl_categories=("keyspace", "write", "slow"),
)
def rename(ctx, argv):
    """RENAME key newkey

    The whole topic (every partition, its consumer groups and config) takes
    the new name, atomically on disk, replacing a topic of that name
    (``Session.rename``; docs/streams.md "RENAME"). In a cluster both keys
    must be in one slot (-CROSSSLOT).
    """
    return _rename(ctx, argv, nx=False)


@command(
    "renamenx", arity=3, flags="write fast", keys=(1, 2, 1), group="generic", since="1.0.0",
    summary="Renames a key only when the target key name doesn't exist.",
    syntax="RENAMENX key newkey",
    acl_categories=("keyspace", "write", "fast"),
)
def renamenx(ctx, argv):
    """RENAMENX key newkey"""
    return _rename(ctx, argv, nx=True)
