"""TOPIC commands: Partita's topic administration.

Owns: ``TOPIC CREATE | DESCRIBE | LIST | ALTER | DELETE | GROUPS | HELP``:
argument parsing, one call of the client's broker session (``ctx.session``:
cluster.broker.reads) and the reply shapes. What stream commands do with a
topic key of several partitions (XLEN's sum, XRANGE's merge, XREAD's
fan-out) is the broker's, and so are group commands on topic keys
(membership: ``server.commands.groups``; TOPIC GROUPS and TOPIC DESCRIBE's
groups are shaped by ``server.group_replies``).

Must not know: sockets, RESP bytes, files, partitions and where they live.
"""

from __future__ import annotations

from cluster.topics import TOPIC_OPTIONS, is_internal
from server.acl import key_filter
from server.args import parse_int
from server.errors import err, subcommand_arity, syntax_error
from server.glob import glob_match
from server.group_replies import shaped, topic_groups_reply
from server.kafka_front import view as kafka_view
from server.registry import command, container
from server.reply import OK, Map, Simple


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
    partitions = None
    replication_factors: list[int] = []
    pairs: list[tuple[bytes, bytes]] = []
    i = 3
    while i < len(argv):
        word = argv[i].upper()
        if word == b"PARTITIONS" and i + 1 < len(argv) and partitions is None:
            partitions = parse_int(argv[i + 1])
            i += 2
        elif word == b"REPLICATION-FACTOR" and i + 1 < len(argv) and not replication_factors:
            replication_factors.append(parse_int(argv[i + 1]))
            i += 2
        elif word == b"CONFIG" and not pairs:
            j = i + 1
            while j + 1 < len(argv) and argv[j].upper() not in (b"PARTITIONS", b"REPLICATION-FACTOR"):
                j += 2
            pairs = _config_pairs(argv[i + 1:j])
            i = j
        else:
            raise syntax_error()
    # PARTITIONS: default-partitions if not given; REPLICATION-FACTOR must
    # be the one every partition has (replica sets belong to hash-slot
    # ranges, docs/replication.md).
    ctx.session.create_topic(argv[2], partitions, pairs, replication_factors)
    return OK


@command(
    "topic|delete", arity=3, flags="write", keys=(2, 2, 1), group="stream", since="7.0.0",
    summary="(Partita) Delete a topic with all its partitions and groups.",
    syntax="TOPIC DELETE topic",
    acl_categories=("write", "stream", "slow"),
)
def topic_delete(ctx, argv):
    """TOPIC DELETE topic"""
    ctx.session.delete_topic(argv[2])
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
    they allow (``server.acl.key_filter``), as with KEYS and SCAN. Partita's
    internal streams (a Kafka group's offsets, a topic group's membership:
    ``cluster.topics.is_internal``) are left out unless a pattern other than
    ``*`` names them.
    """
    if len(argv) > 3:
        raise subcommand_arity(argv)
    names = ctx.session.topic_names()
    if len(argv) == 3 and argv[2] != b"*":
        names = [n for n in names if glob_match(argv[2], n)]
    else:
        names = [n for n in names if not is_internal(n)]
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
    word = argv[3].upper()
    if word == b"PARTITIONS":
        if len(argv) != 5:
            raise syntax_error()
        ctx.session.alter_topic_partitions(argv[2], parse_int(argv[4]))
    elif word == b"CONFIG":
        ctx.session.alter_topic_config(argv[2], _config_pairs(argv[4:]))
    else:
        raise syntax_error()
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
    bytes, last-generated-id, producers), ``groups`` (as TOPIC GROUPS).

    In a cluster any node answers for the whole cluster (no -MOVED): per
    partition also where it lives by the controller's committed metadata
    (leader, leader-epoch, replicas, isr: the same on every node), and
    ``local-replica`` (leader / follower / none) says whose figures the
    length, offsets, sizes and ``high-watermark`` are: this node's copy's,
    nil where it holds none (``entries`` and ``bytes`` sum those shown).
    ``groups`` (TOPIC GROUPS's: of a topic of several partitions gathered
    from their leaders) is nil only for a topic of one partition on a node
    that does not lead it, where this node holds no copy of the topic, and
    inside MULTI when it would have to ask other nodes (docs/topics.md).
    """
    topic = argv[2]
    desc = ctx.session.describe_topic(topic)
    info = Map()
    info["name"] = topic
    info["partitions"] = len(desc["partitions"])
    info["entries"] = sum(p["length"] for p in desc["partitions"] if p["length"] is not None)
    info["bytes"] = sum(p["bytes"] for p in desc["partitions"] if p["bytes"] is not None)
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
        last_id = p["last-generated-id"]
        m["last-generated-id"] = last_id.encode() if last_id is not None else None
        m["producers"] = p["producers"]  # idempotent producers (XADD IDMP, Kafka) with live records
        for name, value in p.get("replication", {}).items():  # in a cluster: where it lives (docs/replication.md)
            m[name] = value
        parts.append(m)
    info["partition-info"] = parts
    if "replication-factor" in desc:
        info["replication-factor"] = desc["replication-factor"]
    if not desc.get("groups-here", True):
        info["groups"] = None  # (TOPIC GROUPS on the topic name's slot leader has them)
        return info

    def with_groups(views):
        info["groups"] = topic_groups_reply(views) + kafka_view.topic_groups_reply(
            getattr(ctx.server, "kafka_groups", None), ctx.session, topic, len(desc["partitions"]), None)
        return info

    return shaped(ctx.session.topic_groups(topic), with_groups)


@command(
    "topic|groups", arity=-3, flags="readonly", keys=(2, 2, 1), group="stream", since="7.0.0",
    summary="(Partita) Show the consumer groups of a topic: members, assignment, pending, lag.",
    syntax="TOPIC GROUPS topic [group]",
    acl_categories=("read", "stream", "slow"),
)
def topic_groups(ctx, argv):
    """TOPIC GROUPS topic [group]

    For each Redis group (``type`` redis): ``name``, ``members`` (live
    members: name, partitions owned, idle ms), and per partition: key, owner
    (nil when unassigned or being handed over), pending, last-delivered-id,
    lag. Then each Kafka group of the topic (``type`` kafka, a separate
    namespace: server/kafka_front/view.py): state, protocol, members, and per
    partition: owner, committed-offset, end-offset, lag.
    """
    if len(argv) > 4:
        raise subcommand_arity(argv)
    topic = argv[2]
    ctx.session.require_topic(topic)
    only = argv[3] if len(argv) == 4 else None
    layout = ctx.session.record_topics([topic])[topic]
    partitions = len(layout.partitions) if layout else 0

    def reply(views):
        return topic_groups_reply(views) + kafka_view.topic_groups_reply(
            getattr(ctx.server, "kafka_groups", None), ctx.session, topic, partitions, only)

    return shaped(ctx.session.topic_groups(topic, only), reply)
