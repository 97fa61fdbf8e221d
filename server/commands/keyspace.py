"""Keyspace commands: every key is a stream (a Partita topic).

Owns: DEL, UNLINK, EXISTS, TYPE, KEYS, SCAN, DBSIZE, FLUSHALL, FLUSHDB,
RENAME, RENAMENX, and ``glob_match`` (Redis's ``stringmatchlen``, byte for
byte, including its handling of ``\\``, ``[^...]``, ranges written backwards
and an unterminated ``[``).

SCAN cursor: keys are ordered by a 63-bit hash (BLAKE2b) of the key, and the
cursor is 1 + the hash at which the next call resumes (0 = start / done).
So a key present for the whole iteration is returned exactly once (twice
never, unless two keys share a hash and COUNT splits them: keys with equal
hashes are always returned together), whatever is added or deleted between
calls, as Redis promises; the cost is a sort of the key names per call.

Must not know: files, segments. Keys reach storage only through
``ctx.server.topics``.
"""

from __future__ import annotations

import hashlib

from server.acl import key_filter
from server.errors import err, syntax_error
from server.args import parse_int
from server.registry import command
from server.reply import OK, Simple

_HASH_MASK = (1 << 63) - 1


# ------------------------------------------------------------------- glob


def glob_match(pattern: bytes, string: bytes) -> bool:
    """Redis ``stringmatchlen(pattern, string, nocase=0)``."""
    skip = [False]
    return _match(pattern, 0, string, 0, skip)


def _signed(byte: int) -> int:
    # C ``char`` is signed on the platforms Redis is built for: ranges compare that way.
    return byte - 256 if byte > 127 else byte


def _match(p: bytes, pi: int, s: bytes, si: int, skip: list[bool]) -> bool:
    plen, slen = len(p), len(s)
    while pi < plen and si < slen:
        c = p[pi]
        if c == 42:  # '*'
            while pi + 1 < plen and p[pi + 1] == 42:
                pi += 1
            if pi + 1 == plen:
                return True
            while si < slen:
                if _match(p, pi + 1, s, si, skip):
                    return True
                if skip[0]:
                    return False
                si += 1
            skip[0] = True
            return False
        elif c == 63:  # '?'
            si += 1
        elif c == 91:  # '['
            pi += 1
            negate = pi < plen and p[pi] == 94  # '^'
            if negate:
                pi += 1
            matched = False
            ch = s[si]
            while True:
                if pi < plen and p[pi] == 92 and plen - pi >= 2:  # '\\'
                    pi += 1
                    if p[pi] == ch:
                        matched = True
                elif pi < plen and p[pi] == 93:  # ']'
                    break
                elif pi >= plen:
                    pi -= 1
                    break
                elif plen - pi >= 3 and p[pi + 1] == 45:  # 'a-z'
                    start, end = _signed(p[pi]), _signed(p[pi + 2])
                    if start > end:
                        start, end = end, start
                    pi += 2
                    if start <= _signed(ch) <= end:
                        matched = True
                elif p[pi] == ch:
                    matched = True
                pi += 1
            if negate:
                matched = not matched
            if not matched:
                return False
            si += 1
        else:
            if c == 92 and plen - pi >= 2:  # '\\' escapes the next byte
                pi += 1
                c = p[pi]
            if c != s[si]:
                return False
            si += 1
        pi += 1
        if si == slen:
            while pi < plen and p[pi] == 42:
                pi += 1
            break
    return pi == plen and si == slen


# ------------------------------------------------------------ the commands


def _delete(ctx, argv):
    topics = ctx.server.topics
    deleted = 0
    for key in argv[1:]:
        if topics.delete(key):
            deleted += 1
            ctx.server.signal_key_modified(key)
    return deleted


@command(
    "del", arity=-2, flags="write", keys=(1, -1, 1), group="generic", since="1.0.0",
    summary="Deletes one or more keys.", syntax="DEL key [key ...]",
    acl_categories=("keyspace", "write", "slow"),
)
def del_(ctx, argv):
    """DEL key [key ...]

    Deleting a stream deletes its topic: every partition's files.
    """
    return _delete(ctx, argv)


@command(
    "unlink", arity=-2, flags="write fast", keys=(1, -1, 1), group="generic", since="4.0.0",
    summary="Asynchronously deletes one or more keys.", syntax="UNLINK key [key ...]",
    acl_categories=("keyspace", "write", "fast"),
)
def unlink(ctx, argv):
    """UNLINK key [key ...]

    Same as DEL here: the files are removed before the reply.
    """
    return _delete(ctx, argv)


@command(
    "exists", arity=-2, flags="readonly fast", keys=(1, -1, 1), group="generic", since="1.0.0",
    summary="Determines whether one or more keys exist.", syntax="EXISTS key [key ...]",
    acl_categories=("keyspace", "read", "fast"),
)
def exists(ctx, argv):
    """EXISTS key [key ...]

    A key named twice counts twice, as in Redis.
    """
    topics = ctx.server.topics
    return sum(1 for key in argv[1:] if topics.exists(key))


@command(
    "type", arity=2, flags="readonly fast", keys=(1, 1, 1), group="generic", since="1.0.0",
    summary="Determines the type of value stored at a key.", syntax="TYPE key",
    acl_categories=("keyspace", "read", "fast"),
)
def type_(ctx, argv):
    """TYPE key"""
    return Simple("stream" if ctx.server.topics.exists(argv[1]) else "none")


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
    found = [k for k in sorted(ctx.server.topics.keys()) if everything or glob_match(pattern, k)]
    visible = key_filter(ctx.client)
    return found if visible is None else [k for k in found if visible(k)]


def _key_hash(key: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") & _HASH_MASK


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
    if cursor > _HASH_MASK + 1:
        return [b"0", []]
    resume_hash = cursor - 1 if cursor else 0
    ordered = sorted((_key_hash(k), k) for k in ctx.server.topics.keys())
    examined = [(h, k) for h, k in ordered if h >= resume_hash]
    batch = examined[:count]
    # Keys sharing a hash go together, so the cursor never splits them.
    rest = examined[count:]
    while rest and batch and rest[0][0] == batch[-1][0]:
        batch.append(rest.pop(0))
    next_cursor = b"%d" % (rest[0][0] + 1) if rest else b"0"
    visible = key_filter(ctx.client)
    found = []
    for _, key in batch:
        if pattern is not None and not glob_match(pattern, key):
            continue
        if type_name is not None and type_name.lower() != b"stream":
            continue
        if visible is not None and not visible(key):
            continue
        found.append(key)
    return [next_cursor, found]


@command(
    "dbsize", arity=1, flags="readonly fast", keys=(0, 0, 0), group="server", since="1.0.0",
    summary="Returns the number of keys in the database.", syntax="DBSIZE",
    acl_categories=("keyspace", "read", "fast"),
)
def dbsize(ctx, argv):
    """DBSIZE"""
    return ctx.server.topics.key_count()


def _flush(ctx, argv):
    if len(argv) > 2:
        raise syntax_error()
    if len(argv) == 2 and argv[1].upper() not in (b"SYNC", b"ASYNC"):
        raise syntax_error()
    topics = ctx.server.topics
    for key in list(topics.keys()):
        if topics.delete(key):
            ctx.server.signal_key_modified(key)
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
    topics = ctx.server.topics
    src, dst = argv[1], argv[2]
    if not topics.exists(src):
        raise err("no such key")
    if src == dst:
        return 0 if nx else OK
    if nx and topics.exists(dst):
        return 0
    topics.rename(src, dst)  # TopicError (RENAME_UNSUPPORTED): server/failures.py replies
    ctx.server.signal_key_modified(src)
    ctx.server.signal_key_modified(dst)
    return 1 if nx else OK


@command(
    "rename", arity=3, flags="write", keys=(1, 2, 1), group="generic", since="1.0.0",
    summary="Renames a key and overwrites the destination.", syntax="RENAME key newkey",
    acl_categories=("keyspace", "write", "slow"),
)
def rename(ctx, argv):
    """RENAME key newkey

    Not supported yet for existing topics (clear error); Redis's errors for
    a missing source and a same-name rename are kept.
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
