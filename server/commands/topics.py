"""TOPIC commands, and what stream commands do with a multi-partition topic key.

Owns: ``TOPIC CREATE | DESCRIBE | LIST | ALTER | DELETE | GROUPS | HELP``
(argument parsing and reply shapes), and the topic-wide variants of stream
commands that ``server.commands.streams`` hands over when a key names a
topic of several partitions (``ctx.server.topics.is_multi(key)``):

- XLEN: the sum over the partitions;
- XRANGE / XREVRANGE: the partitions merged by ID (ties by partition
  number), COUNT over the merged result;
- XREAD: each partition read from the same ID (``$``: each partition's own
  last ID), replied under its partition key ``<topic>#<n>``.

Group commands on topic keys (membership) are the broker's group operations
(``server.commands.groups`` and, for TOPIC GROUPS, ``server.group_replies``).

Must not know: sockets, RESP bytes, files. Keys reach storage only through
``ctx.server.topics`` (``cluster.topics.TopicRegistry``).
"""

from __future__ import annotations

import heapq

from cluster.topics import TOPIC_OPTIONS
from server.acl import key_filter
from server.args import parse_int
from server.commands.keyspace import glob_match
from server.errors import err, syntax_error
from server.group_replies import topic_groups_reply
from server.registry import command, container
from server.reply import OK, Map, Raw, Simple
from storage.entry_codec import split_entries
from storage.streams.ids import MIN_ID, StreamId

container(
    "topic", group="stream", since="7.0.0",
    summary="(Partita) A container for topic administration commands.",
    acl_categories=("stream",),
)

_HELP = [
    "TOPIC <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "CREATE <topic> [PARTITIONS <n>] [CONFIG <name> <value> ...]",
    "    Create a topic of <n> partitions (default: default-partitions) with config overrides.",
    "DESCRIBE <topic>",
    "    Show partitions (offsets, sizes), the effective config and the consumer groups.",
    "LIST [<pattern>]",
    "    List topics, optionally only those matching a glob-style pattern.",
    "ALTER <topic> PARTITIONS <n>",
    "    Grow the topic to <n> partitions (partitions are never removed).",
    "ALTER <topic> CONFIG <name> <value> [<name> <value> ...]",
    "    Set config overrides; the value 'default' returns to the server's default.",
    "DELETE <topic>",
    "    Delete the topic, its partitions and its groups.",
    "GROUPS <topic> [<group>]",
    "    Show each group's members, partition assignment, pending entries and lag.",
    "HELP",
    "    Prints this help.",
    "Config names: " + ", ".join(o.name for o in TOPIC_OPTIONS) + ".",
]


def _config_pairs(args: list[bytes]) -> list[tuple[bytes, bytes]]:
    if not args or len(args) % 2:
        raise err("CONFIG needs name value pairs")
    return [(args[i], args[i + 1]) for i in range(0, len(args), 2)]


def _format_value(value) -> bytes | int:
    return value if isinstance(value, int) else str(value).encode()


@command(
    "topic|help", arity=2, flags="loading stale", group="stream", since="7.0.0",
    summary="Show helpful text about the different subcommands.",
    syntax="TOPIC HELP",
    acl_categories=("stream", "slow"),
)
def topic_help(ctx, argv):
    """TOPIC HELP"""
    return [Simple(line) for line in _HELP]


@command(
    "topic|create", arity=-3, flags="write denyoom", keys=(2, 2, 1), group="stream", since="7.0.0",
    summary="(Partita) Create a topic with a number of partitions and config overrides.",
    syntax="TOPIC CREATE topic [PARTITIONS partitions] [REPLICATION-FACTOR replicas] [CONFIG name value [name value ...]]",
    acl_categories=("write", "stream", "slow"),
)
def topic_create(ctx, argv):
    """TOPIC CREATE topic [PARTITIONS partitions] [REPLICATION-FACTOR replicas] [CONFIG name value [name value ...]]"""
    topic = argv[2]
    topics = ctx.server.topics
    partitions = None
    pairs: list[tuple[bytes, bytes]] = []
    i = 3
    while i < len(argv):
        word = argv[i].upper()
        if word == b"PARTITIONS" and i + 1 < len(argv) and partitions is None:
            partitions = parse_int(argv[i + 1])
            i += 2
        elif word == b"REPLICATION-FACTOR" and i + 1 < len(argv):
            _check_replication_factor(ctx, parse_int(argv[i + 1]))
            i += 2
        elif word == b"CONFIG" and not pairs:
            j = i + 1
            while j + 1 < len(argv) and argv[j].upper() not in (b"PARTITIONS", b"REPLICATION-FACTOR"):
                j += 2
            pairs = _config_pairs(argv[i + 1:j])
            i = j
        else:
            raise syntax_error()
    if partitions is None:
        partitions = int(getattr(ctx.server.config, "default_partitions", 1) or 1)
    topics.create_topic(topic, partitions, pairs)
    ctx.server.signal_key_modified(topic)
    return OK


def _check_replication_factor(ctx, wanted: int) -> None:
    """REPLICATION-FACTOR is accepted when it is what the cluster gives every
    partition: replica sets belong to hash-slot ranges (docs/replication.md),
    so one topic cannot have more or fewer copies than the others."""
    repl = ctx.server.replication
    actual = repl.manager.placement.replication_factor if repl is not None else 1
    if wanted != actual:
        where = "this cluster's replication-factor" if repl is not None else "a single node"
        raise err(f"REPLICATION-FACTOR {wanted} not possible: every partition has {actual} "
                  f"replica(s) on {where} (set replication-factor on every node)")


@command(
    "topic|delete", arity=3, flags="write", keys=(2, 2, 1), group="stream", since="7.0.0",
    summary="(Partita) Delete a topic with all its partitions and groups.",
    syntax="TOPIC DELETE topic",
    acl_categories=("write", "stream", "slow"),
)
def topic_delete(ctx, argv):
    """TOPIC DELETE topic"""
    topic = argv[2]
    topics = ctx.server.topics
    if b"#" in topic and topics.topic_of(topic) != topic:
        raise err(f"'{topic.decode('utf-8', 'replace')}' is a partition key: partitions cannot be "
                  "deleted one by one, TOPIC DELETE takes the topic name")
    keys = topics.expand(topic) if topics.exists(topic) else []
    if not topics.delete(topic):
        raise err(f"unknown topic '{topic.decode('utf-8', 'replace')}'")
    for key in {topic, *keys}:
        ctx.server.signal_key_modified(key)
    return OK


@command(
    "topic|list", arity=-2, flags="readonly", group="stream", since="7.0.0",
    summary="(Partita) List topics, optionally those matching a pattern.",
    syntax="TOPIC LIST [pattern]",
    acl_categories=("keyspace", "read", "slow", "dangerous"),
)
def topic_list(ctx, argv):
    """TOPIC LIST [pattern]

    KEYS's ACL categories; a user with key patterns sees only the topics
    they allow (``server.acl.key_filter``), as with KEYS and SCAN.
    """
    if len(argv) > 3:
        raise syntax_error()
    names = sorted(ctx.server.topics.keys())
    if len(argv) == 3 and argv[2] != b"*":
        names = [n for n in names if glob_match(argv[2], n)]
    visible = key_filter(ctx.client)
    if visible is not None:
        names = [n for n in names if visible(n)]
    return names


@command(
    "topic|alter", arity=-5, flags="write", keys=(2, 2, 1), group="stream", since="7.0.0",
    summary="(Partita) Grow a topic's partitions or change its config overrides.",
    syntax="TOPIC ALTER topic <PARTITIONS partitions | CONFIG name value [name value ...]>",
    acl_categories=("write", "stream", "slow"),
)
def topic_alter(ctx, argv):
    """TOPIC ALTER topic <PARTITIONS partitions | CONFIG name value [name value ...]>"""
    topic = argv[2]
    topics = ctx.server.topics
    word = argv[3].upper()
    if word == b"PARTITIONS":
        if len(argv) != 5:
            raise syntax_error()
        topics.alter_partitions(topic, parse_int(argv[4]))
    elif word == b"CONFIG":
        topics.alter_config(topic, _config_pairs(argv[4:]))
    else:
        raise syntax_error()
    ctx.server.signal_key_modified(topic)
    return OK


@command(
    "topic|describe", arity=3, flags="readonly", keys=(2, 2, 1), group="stream", since="7.0.0",
    summary="(Partita) Show a topic's partitions, config and consumer groups.",
    syntax="TOPIC DESCRIBE topic",
    acl_categories=("read", "stream", "slow"),
)
def topic_describe(ctx, argv):
    """TOPIC DESCRIBE topic

    ``partitions`` (count), ``entries`` (sum), ``bytes`` (sum), ``config``
    (name -> effective value; ``overrides`` lists the names the topic sets),
    ``partition-info`` (per partition: key, length, offsets, segments,
    bytes, last-generated-id), ``groups`` (as TOPIC GROUPS).
    """
    topic = argv[2]
    topics = ctx.server.topics
    if topics.topic_of(topic) != topic:
        raise err("TOPIC DESCRIBE takes a topic name, not a partition key")
    desc = topics.describe(topic)
    info = Map()
    info["name"] = topic
    info["partitions"] = len(desc["partitions"])
    info["entries"] = sum(p["length"] for p in desc["partitions"])
    info["bytes"] = sum(p["bytes"] for p in desc["partitions"])
    config = Map()
    for name, (value, _) in desc["config"].items():
        config[name] = _format_value(value)
    info["config"] = config
    info["overrides"] = [name for name, (_, over) in desc["config"].items() if over]
    parts = []
    for p in desc["partitions"]:
        m = Map()
        m["partition"] = p["partition"]
        m["key"] = p["key"]
        m["length"] = p["length"]
        m["log-start-offset"] = p["log-start-offset"]
        m["log-end-offset"] = p["log-end-offset"]
        m["segments"] = p["segments"]
        m["bytes"] = p["bytes"]
        m["last-generated-id"] = p["last-generated-id"].encode()
        repl = ctx.server.replication
        if repl is not None:  # where the partition lives (docs/replication.md)
            for name, value in repl.manager.partition_view(topic, p["partition"]).items():
                m[name] = value
        parts.append(m)
    info["partition-info"] = parts
    if ctx.server.replication is not None:
        info["replication-factor"] = ctx.server.replication.manager.placement.replication_factor
    info["groups"] = topic_groups_reply(ctx.session.topic_groups(topic))
    return info


@command(
    "topic|groups", arity=-3, flags="readonly", keys=(2, 2, 1), group="stream", since="7.0.0",
    summary="(Partita) Show the consumer groups of a topic: members, assignment, pending, lag.",
    syntax="TOPIC GROUPS topic [group]",
    acl_categories=("read", "stream", "slow"),
)
def topic_groups(ctx, argv):
    """TOPIC GROUPS topic [group]

    For each group: ``name``, ``members`` (live members: name, partitions
    owned, idle ms), and per partition: key, owner (nil when unassigned or
    being handed over), pending, last-delivered-id, lag.
    """
    if len(argv) > 4:
        raise syntax_error()
    topic = argv[2]
    topics = ctx.server.topics
    if not topics.exists(topic) or topics.topic_of(topic) != topic:
        raise err(f"unknown topic '{topic.decode('utf-8', 'replace')}'")
    return topic_groups_reply(ctx.session.topic_groups(topic, argv[3] if len(argv) == 4 else None))


# ------------------------------------------------- stream commands on topics


def topic_len(ctx, key: bytes) -> int:
    """XLEN of a multi-partition topic: the sum over its partitions."""
    return sum(s.length for s in ctx.server.topics.streams_of(key))


def _entries_with_ids(res, tag: int) -> list[tuple[tuple[int, int], int, bytes]]:
    encoded = split_entries(res.chunks)
    return [((ms, seq), tag, enc) for (_off, ms, seq), enc in zip(res.entries, encoded)]


def topic_range(ctx, key: bytes, start: StreamId, end: StreamId, count: int | None, rev: bool) -> Raw:
    """XRANGE / XREVRANGE of a multi-partition topic: partitions merged by ID.

    Each partition contributes at most ``count`` entries, so the cost is
    ``partitions * count`` reads, then a heap merge; equal IDs (two
    partitions can generate the same ID) come in partition order.
    """
    runs = []
    if start > end:
        return Raw(0, [])
    for n, stream in enumerate(ctx.server.topics.streams_of(key)):
        log = stream.log
        lo = max(log.find_offset(start[0], start[1], inclusive=True), log.log_start_offset)
        hi = log.find_offset(end[0], end[1], inclusive=False)
        if lo >= hi:
            continue
        if rev:
            res = log.read_reverse(lo, hi, max_count=count, with_ids=True)
        else:
            res = log.read(lo, hi, max_count=count, with_ids=True)
        if res.count:
            runs.append(_entries_with_ids(res, -n if rev else n))
    merged = heapq.merge(*runs, reverse=rev)
    chunks = []
    for _sid, _n, enc in merged:
        chunks.append(enc)
        if count is not None and len(chunks) >= count:
            break
    ctx.server.topics.note_entries_out(len(chunks))
    return Raw(len(chunks), chunks)


def expand_read_args(ctx, args) -> None:
    """XREAD: replace each multi-partition topic key by its partition keys,
    each with the topic key's ID (``$`` and ``+`` then resolve per partition)."""
    topics = ctx.server.topics
    if not any(topics.is_multi(k) for k in args.keys):
        return
    keys: list[bytes] = []
    ids: list[bytes] = []
    for key, raw in zip(args.keys, args.id_args):
        for pkey in topics.expand(key):
            keys.append(pkey)
            ids.append(raw)
    args.keys, args.id_args = keys, ids


def read_partitions_after(ctx, key: bytes, after: StreamId, count: int) -> list:
    """XREAD of a topic that got several partitions while the reader blocked."""
    topics = ctx.server.topics
    found = []
    for pkey in topics.expand(key):
        stream = topics.get(pkey)
        if stream is None or stream.length == 0:
            continue
        entries = stream.read_after(after if after is not None else MIN_ID, count or None)
        if entries.count:
            topics.note_entries_out(entries.count)
            found.append((pkey, Raw(entries.count, entries.chunks)))
    return found
