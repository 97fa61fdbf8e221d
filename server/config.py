"""Server configuration: names, defaults, parsing, validation, rewrite.

Owns: the table of every config name (Redis's spelling, e.g.
``proto-max-bulk-len``), its type, default, whether CONFIG SET may change it,
the ``partita.conf`` file format (redis.conf style: ``name value`` lines,
``#`` comments, quoted values), ``--name value`` command-line overrides, and
Redis's error texts for bad values. ``Config`` exposes values as attributes
with Python names (``config.proto_max_bulk_len``, ``config.fsync``).

Must not know: sockets, trio, commands, storage. Applying a changed value to
a running server (re-binding, resizing limits) is the caller's job: CONFIG SET
calls ``Config.set_many`` and then the hooks registered with ``on_change``.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
import re
import shlex
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from server.resp import split_args


class ConfigError(Exception):
    """A bad name or value. ``message`` is Redis's reason text."""

    def __init__(self, message: str, name: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.name = name


# -- value types -------------------------------------------------------------

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1024,
    "m": 1000**2,
    "mb": 1024**2,
    "g": 1000**3,
    "gb": 1024**3,
}
_SIZE_RE = re.compile(r"(-?)([0-9]*)([a-zA-Z]*)")
_U64_MAX = 2**64 - 1
# Redis's string2ll: "0" or an optional "-" and digits without a leading zero
# (no blanks, no "+", no "-0", ASCII digits only), within 64 bits.
_INT_RE = re.compile(r"0|-?[1-9][0-9]*")


def _ascii_lower(text: str) -> str:
    """Lower case as C's strcasecmp sees it: ASCII letters only (Python's
    str.lower makes the KELVIN SIGN a 'k')."""
    return text.translate(_ASCII_LOWER)


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def parse_size(text: str, signed: bool = False) -> int:
    """Redis's ``memtoull``: ``4k`` = 4000, ``4kb`` = 4096, ``1gb`` = 2**30,
    the unit in any case; ASCII digits and a unit only (no blank, no sign;
    no digit at all is 0, as for Redis), the digits saturating at 2**64 - 1 as
    ``strtoull`` does and the product wrapping at 2**64. A negative one only when ``signed`` (Partita's
    ``retention-bytes -1``), whose value must have digits: '' would be a retention of 0 bytes, every
    old segment deleted on a typo."""
    m = _SIZE_RE.fullmatch(text)
    if not m or m.group(3).lower() not in _UNITS or (signed and not m.group(2)) \
            or (m.group(1) and not signed):
        raise ConfigError("argument must be a memory value")
    value = min(int(m.group(2) or "0"), _U64_MAX) * _UNITS[m.group(3).lower()] % 2**64  # C's wrap
    return -value if m.group(1) else value


def format_size(value: int) -> str:
    """How CONFIG REWRITE writes a size: the largest exact binary unit."""
    for unit, factor in (("gb", 1024**3), ("mb", 1024**2), ("kb", 1024)):
        if value and value % factor == 0:
            return f"{value // factor}{unit}"
    return str(value)


# client-output-buffer-limit: class -> (hard_bytes, soft_bytes, soft_seconds), as redis.conf.
OUTPUT_BUFFER_CLASSES = ("normal", "slave", "pubsub")
_OBUF_CLASS_NAMES = {"normal": "normal", "slave": "slave", "replica": "slave", "pubsub": "pubsub"}
DEFAULT_OUTPUT_BUFFER_LIMITS = {
    "normal": (0, 0, 0),
    "slave": (256 * 1024**2, 64 * 1024**2, 60),
    "pubsub": (32 * 1024**2, 8 * 1024**2, 60),
}


def parse_output_buffer_limits(text: str) -> dict[str, tuple[int, int, int]]:
    """``normal 1mb 512kb 10 [replica ...] [pubsub ...]`` -> the classes given (Redis's texts)."""
    words = text.split()
    if not words or len(words) % 4 != 0:
        raise ConfigError("Wrong number of arguments in buffer limit configuration.")
    out: dict[str, tuple[int, int, int]] = {}
    for i in range(0, len(words), 4):
        cls = _OBUF_CLASS_NAMES.get(words[i].lower())
        if cls is None:
            raise ConfigError("Invalid client class specified in buffer limit configuration.")
        try:
            hard, soft = parse_size(words[i + 1]), parse_size(words[i + 2])
            if not re.fullmatch(r"\d+", words[i + 3]):
                raise ConfigError("")
            seconds = int(words[i + 3])
        except ConfigError:
            raise ConfigError("Error in hard, soft or soft_seconds setting in buffer limit configuration.") from None
        if hard < 0 or soft < 0:
            raise ConfigError("Error in hard, soft or soft_seconds setting in buffer limit configuration.")
        out[cls] = (hard, soft, seconds)
    return out


def parse_save(text: str) -> str:
    """``<seconds> <changes> ...`` as Redis's ``setConfigSaveOption``
    checks it (seconds >= 1, changes >= 0; empty: none), words joined by
    one space."""
    words = text.split()
    if len(words) % 2 or not all(re.fullmatch(r"-?\d+", w) for w in words) or any(
            int(w) < (1 if i % 2 == 0 else 0) for i, w in enumerate(words)):
        raise ConfigError("Invalid save parameters")
    return " ".join(str(int(w)) for w in words)


def format_output_buffer_limits(value: dict[str, tuple[int, int, int]]) -> str:
    return " ".join(f"{cls} {h} {s} {sec}" for cls in OUTPUT_BUFFER_CLASSES for h, s, sec in [value[cls]])


@dataclass(frozen=True)
class Option:
    name: str  # Redis spelling
    kind: str  # int | size | string | enum | bool | path | obuf | save
    default: Any
    mutable: bool = True
    doc: str = ""
    minimum: int | None = None
    maximum: int | None = None
    choices: tuple[str, ...] = ()
    protected: bool = False  # Redis's "can't set protected config" (dir)
    multi_arg: bool = False  # Redis's MULTI_ARG_CONFIG: `save 900 1` in a file, `--save 900 1`: words joined
    inert: bool = False  # accepted for compatibility with Redis, no value changes anything (named at start)

    @property
    def attr(self) -> str:
        return self.name.replace("-", "_")

    def parse(self, text: str) -> Any:
        """A value from its text form, or ConfigError with Redis's reason."""
        if self.kind == "int":
            if not _INT_RE.fullmatch(text) or not -(2**63) <= int(text) < 2**63:
                raise ConfigError("argument couldn't be parsed into an integer")
            value = int(text)
            self._check_range(value)
            return value
        if self.kind == "size":
            value = parse_size(text, signed=self.minimum is not None and self.minimum < 0)
            self._check_range(value)
            return value
        if self.kind == "bool":
            low = _ascii_lower(text)
            if low not in ("yes", "no"):
                raise ConfigError("argument must be 'yes' or 'no'")
            return low == "yes"
        if self.kind == "obuf":
            return parse_output_buffer_limits(text)
        if self.kind == "save":
            return parse_save(text)
        if self.kind == "enum":
            low = _ascii_lower(text)
            if low not in self.choices:
                raise ConfigError(
                    "argument(s) must be one of the following: " + ", ".join(self.choices)
                )
            return low
        return text

    def _check_range(self, value: int) -> None:
        lo = self.minimum
        hi = self.maximum
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise ConfigError(f"argument must be between {lo} and {hi} inclusive")

    def format(self, value: Any) -> str:
        if self.kind == "bool":
            return "yes" if value else "no"
        if self.kind == "obuf":
            return format_output_buffer_limits(value)
        return str(value)

    def format_for_file(self, value: Any) -> str:
        if self.kind == "size":
            text = format_size(value)
        else:
            text = self.format(value)
        return quote_if_needed(text)


def quote_if_needed(text: str) -> str:
    """``text`` as one word of a config line: quoted when empty or when it
    holds a space, a quote, a backslash or a ``#``."""
    if text == "" or any(c in text for c in " \t\"'\\#"):
        return quote(text)
    return text


def quote(text: str) -> str:
    """Quote a value so ``split_args`` reads it back unchanged."""
    out = ['"']
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 32 or ord(ch) == 127:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


U32 = 2**32 - 1
I64 = 2**63 - 1
COMPATIBLE = "accepted for compatibility with Redis; changes nothing in Partita"

OPTIONS: tuple[Option, ...] = (
    Option("port", "int", 6379, mutable=False, doc="TCP port to listen on (0: pick a free one)",
           minimum=0, maximum=65535),
    Option("bind", "string", "127.0.0.1", mutable=False, multi_arg=True,
           doc="addresses to listen on, space separated"),
    Option("dir", "path", "./partita-data", mutable=False, protected=True,
           doc="data directory: one sub-directory per topic; created at start if missing (not its parent), "
               "locked while a server uses it"),
    Option("fsync", "enum", "everysec", choices=("everysec", "always", "no"),
           doc="when writes reach the disk before the reply: always (group commit), everysec, no"),
    Option("appendfsync", "enum", "everysec", choices=("everysec", "always", "no"),
           doc="Redis's name for fsync; setting either sets both"),
    Option("requirepass", "string", "", doc="password for AUTH; empty: no authentication"),
    Option("maxclients", "int", 10000, minimum=1, maximum=U32, doc="connected clients at most"),
    Option("max-open-files", "int", 1000, mutable=False, minimum=16, maximum=2**31 - 1,
           doc="descriptors of partition files kept open at most (least recently used closed first); "
               "flush rounds sync through them"),
    # Limits and access control (docs/security.md).
    Option("client-output-buffer-limit", "obuf", DEFAULT_OUTPUT_BUFFER_LIMITS, multi_arg=True,
           doc="reply bytes a client may leave unread: `<class> <hard> <soft> <soft-seconds>`"),
    Option("max-blocked-clients", "int", 0, minimum=0, maximum=U32,
           doc="clients waiting in XREAD/XREADGROUP BLOCK at most (0: only maxclients bounds them)"),
    Option("aclfile", "string", "", mutable=False,
           doc="ACL users file, read at start (it must exist: an empty file holds no users), for "
               "ACL SAVE / ACL LOAD; empty: users live in memory only"),
    Option("tls-port", "int", 0, mutable=False, minimum=0, maximum=65535,
           doc="TLS port on the `bind` addresses (0: no TLS listener)"),
    # The HTTP listener: /metrics and the web console (docs/metrics.md).
    Option("http-port", "int", 0, mutable=False, minimum=0, maximum=65535,
           doc="HTTP port on the `bind` addresses for Prometheus metrics and the web console (0: off)"),
    Option("tls-cert-file", "string", "", mutable=False, doc="server certificate (PEM) for the TLS port"),
    Option("tls-key-file", "string", "", mutable=False, doc="private key (PEM) of `tls-cert-file`"),
    Option("tls-ca-cert-file", "string", "", mutable=False,
           doc="CA certificates (PEM) that client certificates must chain to"),
    Option("tls-auth-clients", "enum", "yes", mutable=False, choices=("yes", "no", "optional"),
           doc="client certificates on the TLS port: required, not asked for, or checked if sent"),
    Option("default-partitions", "int", 1, minimum=1, maximum=1024,
           doc="partitions of a topic created by XADD on a missing key"),
    Option("loglevel", "enum", "notice", choices=("debug", "verbose", "notice", "warning"),
           doc="log verbosity"),
    Option("logfile", "string", "", mutable=False, doc="log file; empty: standard output"),
    Option("proto-max-bulk-len", "size", 512 * 1024**2, minimum=1024 * 1024, maximum=I64,
           doc="largest bulk string a client may send"),
    Option("client-query-buffer-limit", "size", 1024**3, minimum=1024 * 1024, maximum=I64,
           doc="largest pending request of one client"),
    Option("timeout", "int", 0, minimum=0, maximum=2**31 - 1,
           doc="close clients idle more than this many seconds (0: never); checked about once a second "
               "against the value in force (a CONFIG SET reaches connected clients)"),
    Option("shutdown-timeout", "int", 10, minimum=0, maximum=2**31 - 1,
           doc="seconds SHUTDOWN / SIGTERM waits for in-flight commands"),
    # Topic defaults (per-topic overrides come with TOPIC CREATE / ALTER).
    Option("segment-bytes", "size", 128 * 1024**2, minimum=1024, maximum=I64,
           doc="roll a partition's segment at this size"),
    Option("segment-ms", "int", 7 * 24 * 3600 * 1000, minimum=1, maximum=I64,
           doc="roll a partition's segment at this age"),
    Option("retention-ms", "int", -1, minimum=-1, maximum=I64,
           doc="delete whole segments older than this (-1: keep)"),
    Option("retention-bytes", "size", -1, minimum=-1, maximum=I64,
           doc="delete old segments beyond this size per partition (-1: no limit)"),
    Option("max-entry-bytes", "size", 1024**2, minimum=1, maximum=I64,
           doc="largest stream entry accepted"),
    Option("group-session-timeout-ms", "int", 10000, minimum=1, maximum=I64,
           doc="a group member that stops reading this long is dead"),
    Option("partition-key-field", "string", "",
           doc="XADD <topic> hashes this field's value to pick a partition (empty: round-robin)"),
    Option("retention-check-interval-ms", "int", 5000, minimum=10, maximum=I64,
           doc="how often background retention runs over every partition"),
    # The Kafka protocol (docs/kafka.md).
    Option("kafka-port", "int", 0, mutable=False, minimum=0, maximum=65535,
           doc="Kafka wire protocol port on the `bind` addresses (0: none; clients authenticate with SASL "
               "as ACL users while the default user needs a password)"),
    Option("kafka-tls-port", "int", 0, mutable=False, minimum=0, maximum=65535,
           doc="Kafka wire protocol over TLS on the `bind` addresses, with the tls-* files (0: none)"),
    Option("kafka-consumer-session-timeout-ms", "int", 45000, minimum=1, maximum=I64,
           doc="a Kafka consumer-protocol member (KIP-848) not heard from this long is removed "
               "(Kafka's group.consumer.session.timeout.ms)"),
    Option("kafka-consumer-heartbeat-interval-ms", "int", 5000, minimum=1, maximum=I64,
           doc="how often Kafka consumer-protocol members heartbeat (group.consumer.heartbeat.interval.ms)"),
    Option("share-record-lock-duration-ms", "int", 30000, minimum=1000, maximum=3600000,
           doc="a Kafka share consumer's records not acknowledged this long are available again "
               "(Kafka's group.share.record.lock.duration.ms; the idle time XREADGROUP CLAIM takes them at)"),
    Option("share-delivery-count-limit", "int", 5, minimum=2, maximum=10,
           doc="a record a Kafka share group acquired this many times is archived, not delivered again "
               "(Kafka's group.share.delivery.count.limit; a group's MAXDELIVERIES wins)"),
    Option("auto-create-topics", "bool", True,
           doc="a Kafka Metadata request naming a missing topic creates it with default-partitions "
               "(Kafka's auto.create.topics.enable)"),
    # Replication (docs/replication.md). No cluster-nodes: a single node.
    Option("node-id", "int", 0, mutable=False, minimum=0, maximum=2**31 - 1,
           doc="this node's id in cluster-nodes (0: not in a cluster)"),
    Option("cluster-nodes", "string", "", mutable=False,
           doc="every node of the cluster: `<id>@<host>:<port>[@<bus-port>],...` "
               "(bus port: port + 10000 when not named; empty: a single node)"),
    Option("cluster-port", "int", 0, mutable=False, minimum=0, maximum=65535,
           doc="the cluster bus port this node listens on for its peers, on the bind addresses "
               "(0: the one its cluster-nodes entry names, else port + 10000)"),
    Option("cluster-secret", "string", "", mutable=False, protected=True,
           doc="shared by every node: a peer presents it (REPLAUTH) before anything else on the cluster bus "
               "(empty: the bus is unauthenticated)"),
    Option("replication-factor", "int", 0, mutable=False, minimum=0, maximum=1000,
           doc="replicas of every partition on distinct nodes (0: min(3, nodes))"),
    Option("acks", "enum", "all", choices=("all", "1"),
           doc="replicated topics: XADD replies after the in-sync replicas (all) or the leader (1) have it"),
    Option("min-insync-replicas", "int", 1, minimum=1, maximum=1000,
           doc="acks=all writes need this many in-sync replicas (leader included)"),
    Option("replica-lag-time-max-ms", "int", 30000, minimum=10, maximum=I64,
           doc="a follower not caught up for this long leaves the ISR"),
    Option("replica-fetch-wait-max-ms", "int", 500, minimum=1, maximum=60000,
           doc="how long a leader holds a follower's fetch when there is nothing new"),
    Option("replica-fetch-max-bytes", "size", 1024**2, minimum=1024, maximum=I64,
           doc="bytes of batches per partition in one fetch response"),
    Option("forward-timeout-ms", "int", 5000, minimum=10, maximum=3600000,
           doc="a topic-key XADD forwarded to its partition's leader gets -TRYAGAIN after this long "
               "without the leader's answer (keep it below the clients' own timeout)"),
    # The controller quorum (docs/controller.md).
    Option("cluster-join", "bool", False, mutable=False,
           doc="this node joins a running cluster (its cluster-nodes also lists the running nodes; "
               "controller-nodes must name their voters)"),
    Option("controller-nodes", "string", "", mutable=False,
           doc="node ids voting in the controller quorum, comma separated (empty: every node)"),
    Option("controller-session-timeout-ms", "int", 3000, minimum=1000, maximum=I64,
           doc="a node the controller has not heard from this long is fenced and loses its leaderships"),
    Option("controller-fast-fencing", "bool", True,
           doc="a node whose cluster bus port refuses connections (its process is gone) is fenced at once, "
               "and a controller that does is replaced at once; no: only the timeouts (for a network whose "
               "firewalls answer for a live node with a TCP reset)"),
    Option("controller-snapshot-records", "int", 1000, minimum=2, maximum=I64,
           doc="the controller snapshots its metadata and compacts its log every this many records"),
    Option("unclean-leader-election", "bool", False,
           doc="when no in-sync replica of a shard lives, elect any live replica (may lose acknowledged entries)"),
    Option("leader-rebalance-delay-ms", "int", 5000, minimum=-1, maximum=I64,
           doc="a preferred leader back in sync this long takes its shard back (-1: never)"),
    # What the server observes of commands (server/diagnostics.py; docs/diagnostics.md).
    Option("slowlog-log-slower-than", "int", 10000, minimum=-1, maximum=I64,
           doc="SLOWLOG logs commands that ran this many microseconds or more (0: every command; -1: none)"),
    Option("slowlog-max-len", "int", 128, minimum=0, maximum=I64, doc="SLOWLOG keeps this many entries at most"),
    Option("latency-monitor-threshold", "int", 0, minimum=0, maximum=I64,
           doc="LATENCY records events of this many milliseconds or more (0: off)"),
    # Redis's names with a meaning of their own here, or none.
    Option("stream-node-max-entries", "int", 100, minimum=0, maximum=I64,
           doc="entries of a stream node, as Redis's: what `~` trims remove whole (0: 100)"),
    Option("stream-node-max-bytes", "size", 4096, minimum=0, maximum=I64, doc=COMPATIBLE, inert=True),
    # Redis 8.6's defaults of XADD IDMP's window, per stream unless XCFGSET sets one (docs/streams.md).
    Option("stream-idmp-duration", "int", 100, minimum=1, maximum=86400,
           doc="seconds an idempotent id of XADD IDMP is remembered (streams XCFGSET did not configure)"),
    Option("stream-idmp-maxsize", "int", 100, minimum=1, maximum=10000,
           doc="idempotent ids of XADD IDMP remembered per producer (streams XCFGSET did not configure)"),
    Option("appendonly", "bool", True, mutable=False, inert=True,
           doc="always yes: every write goes to a partition log"),
    Option("save", "save", "", multi_arg=True, inert=True,
           doc="accepted for compatibility; Partita has no snapshots"),
    Option("databases", "int", 1, mutable=False, minimum=1, maximum=1, doc="only db 0 exists"),
    Option("daemonize", "bool", False, mutable=False, inert=True, doc="accepted; Partita stays in the foreground"),
    Option("maxmemory", "size", 0, minimum=0, maximum=I64, inert=True,
           doc="accepted for compatibility; data lives on disk"),
)

# Every other name of Redis 8's redis.conf (the server's; not the modules'
# search-*, ts-*, bf-*, cf-* of redis-full.conf), accepted for compatibility:
# the config file, CONFIG GET and CONFIG SET take it as Redis does (the
# value's kind checked with Redis's texts, Redis's immutable and protected
# ones refused by CONFIG SET), the value is kept and shown, and nothing in
# Partita changes. One per line: name, kind (bool, int, size, string, or the
# choices a|b|c), Redis's default ("" empty), then ``immutable`` or
# ``protected`` as in Redis, ``<min>..<max>`` Redis's bounds of an int (its
# "argument must be between" text), and ``multi-arg`` for a value of several
# words in a file line (`oom-score-adj-values 0 200 800`), as Redis's
# MULTI_ARG_CONFIG; ``name =other``: Redis's alias of ``other`` (both show
# the value, setting either sets both). The names and defaults
# are Redis 7.0.15's CONFIG GET *, plus those Redis 7.2 to 8.6 added
# (locale-collate ... cluster-slot-stats-enabled) and 8.6's two eviction
# policies; the bounds are those redis-server 7.0.15's CONFIG SET names
# (none for its immutable ones and the later names).
_COMPATIBLE_NAMES = """
acl-pubsub-default allchannels|resetchannels resetchannels
acllog-max-len int 128 0..9223372036854775807
active-defrag-cycle-max int 25 1..99
active-defrag-cycle-min int 1 1..99
active-defrag-ignore-bytes size 104857600 1..9223372036854775807
active-defrag-max-scan-fields int 1000 1..9223372036854775807
active-defrag-threshold-lower int 10 0..1000
active-defrag-threshold-upper int 100 0..1000
active-expire-effort int 1 1..10
activedefrag bool no
activerehashing bool yes
always-show-logo bool no immutable
aof-disable-auto-gc bool no
aof-load-truncated bool yes
aof-rewrite-cpulist string "" immutable
aof-rewrite-incremental-fsync bool yes
aof-timestamp-enabled bool no
aof-use-rdb-preamble bool yes
aof_rewrite_cpulist =aof-rewrite-cpulist
appenddirname string appendonlydir immutable
appendfilename string appendonly.aof immutable
auto-aof-rewrite-min-size size 67108864 0..9223372036854775807
auto-aof-rewrite-percentage int 100 0..2147483647
bgsave-cpulist string "" immutable
bgsave_cpulist =bgsave-cpulist
bind-source-addr string ""
bio-cpulist string "" immutable
bio_cpulist =bio-cpulist
busy-reply-threshold int 5000 0..9223372036854775807
cluster-allow-pubsubshard-when-down bool yes
cluster-allow-reads-when-down bool no
cluster-allow-replica-migration bool yes
cluster-announce-bus-port int 0 0..65535
cluster-announce-hostname string ""
cluster-announce-human-nodename string ""
cluster-announce-ip string ""
cluster-announce-port int 0 0..65535
cluster-announce-tls-port int 0 0..65535
cluster-compatibility-sample-ratio int 0
cluster-config-file string nodes.conf immutable
cluster-enabled bool no immutable
cluster-link-sendbuf-limit size 0 0..18446744073709551615
cluster-migration-barrier int 1 0..2147483647
cluster-node-timeout int 15000 0..9223372036854775807
cluster-preferred-endpoint-type ip|hostname|unknown-endpoint ip
cluster-replica-no-failover bool no
cluster-replica-validity-factor int 10 0..2147483647
cluster-require-full-coverage bool yes
cluster-slave-no-failover =cluster-replica-no-failover
cluster-slave-validity-factor =cluster-replica-validity-factor
cluster-slot-stats-enabled bool no
crash-log-enabled bool yes
crash-memcheck-enabled bool yes
dbfilename string dump.rdb protected
disable-thp bool yes immutable
dynamic-hz bool yes
enable-debug-command no|yes|local no immutable
enable-module-command no|yes|local no immutable
enable-protected-configs no|yes|local no immutable
hash-max-listpack-entries int 512 0..9223372036854775807
hash-max-listpack-value size 64 0..9223372036854775807
hash-max-ziplist-entries =hash-max-listpack-entries
hash-max-ziplist-value =hash-max-listpack-value
hide-user-data-from-log bool no
hll-sparse-max-bytes size 3000 0..9223372036854775807
hz int 10 0..2147483647
ignore-warnings string ""
io-threads int 1 immutable
io-threads-do-reads bool no immutable
jemalloc-bg-thread bool yes
latency-tracking bool yes
latency-tracking-info-percentiles string '50 99 99.9' multi-arg
lazyfree-lazy-eviction bool no
lazyfree-lazy-expire bool no
lazyfree-lazy-server-del bool no
lazyfree-lazy-user-del bool no
lazyfree-lazy-user-flush bool no
lfu-decay-time int 1 0..2147483647
lfu-log-factor int 10 0..2147483647
list-compress-depth int 0 0..2147483647
list-max-listpack-size int -2 -2147483648..2147483647
list-max-ziplist-size =list-max-listpack-size
locale-collate string ""
lua-time-limit =busy-reply-threshold
masterauth string ""
masteruser string ""
max-new-connections-per-cycle int 10
max-new-tls-connections-per-cycle int 1
maxmemory-clients string 0
maxmemory-eviction-tenacity int 10 0..100
maxmemory-policy volatile-lru|volatile-lfu|volatile-random|volatile-ttl|allkeys-lru|allkeys-lfu|allkeys-random|noeviction|volatile-lrm|allkeys-lrm noeviction
maxmemory-samples int 5 1..2147483647
min-replicas-max-lag int 10 0..2147483647
min-replicas-to-write int 0 0..2147483647
min-slaves-max-lag =min-replicas-max-lag
min-slaves-to-write =min-replicas-to-write
no-appendfsync-on-rewrite bool no
notify-keyspace-events string ""
oom-score-adj no|yes|relative|absolute no
oom-score-adj-values string '0 200 800' multi-arg
pidfile string "" immutable
proc-title-template string '{title} {listen-addr} {server-mode}'
propagation-error-behavior ignore|panic|panic-on-replicas ignore
protected-mode bool yes
rdb-del-sync-files bool no
rdb-save-incremental-fsync bool yes
rdbchecksum bool yes immutable
rdbcompression bool yes
repl-backlog-size size 1048576 1..9223372036854775807
repl-backlog-ttl int 3600 0..9223372036854775807
repl-disable-tcp-nodelay bool no
repl-diskless-load disabled|on-empty-db|swapdb disabled
repl-diskless-sync bool yes
repl-diskless-sync-delay int 5 0..2147483647
repl-diskless-sync-max-replicas int 0 0..2147483647
repl-ping-replica-period int 10 1..2147483647
repl-ping-slave-period =repl-ping-replica-period
repl-timeout int 60 1..2147483647
replica-announce-ip string ""
replica-announce-port int 0 0..65535
replica-announced bool yes
replica-full-sync-buffer-limit size 0
replica-ignore-disk-write-errors bool no
replica-ignore-maxmemory bool yes
replica-lazy-flush bool no
replica-priority int 100 0..2147483647
replica-read-only bool yes
replica-serve-stale-data bool yes
replicaof string "" immutable multi-arg
sanitize-dump-payload bool no
server-cpulist string "" immutable
server_cpulist =server-cpulist
set-max-intset-entries int 512 0..9223372036854775807
set-max-listpack-entries int 128
set-max-listpack-value size 64
set-proc-title bool yes immutable
shutdown-on-sigint string default
shutdown-on-sigterm string default
slave-announce-ip =replica-announce-ip
slave-announce-port =replica-announce-port
slave-ignore-maxmemory =replica-ignore-maxmemory
slave-lazy-flush =replica-lazy-flush
slave-priority =replica-priority
slave-read-only =replica-read-only
slave-serve-stale-data =replica-serve-stale-data
slaveof =replicaof
socket-mark-id int 0 immutable
stop-writes-on-bgsave-error bool yes
supervised no|upstart|systemd|auto no immutable
syslog-enabled bool no immutable
syslog-facility string local0 immutable
syslog-ident string redis immutable
tcp-backlog int 511 immutable
tcp-keepalive int 300 0..2147483647
tls-ca-cert-dir string ""
tls-ciphers string ""
tls-ciphersuites string ""
tls-client-cert-file string ""
tls-client-key-file string ""
tls-client-key-file-pass string ""
tls-cluster bool no
tls-dh-params-file string ""
tls-key-file-pass string ""
tls-prefer-server-ciphers bool no
tls-protocols string ""
tls-replication bool no
tls-session-cache-size int 20480 0..2147483647
tls-session-cache-timeout int 300 0..2147483647
tls-session-caching bool yes
tracking-table-max-keys int 1000000 0..9223372036854775807
unixsocket string "" immutable
unixsocketperm string 0 immutable
zset-max-listpack-entries int 128 0..9223372036854775807
zset-max-listpack-value size 64 0..9223372036854775807
zset-max-ziplist-entries =zset-max-listpack-entries
zset-max-ziplist-value =zset-max-listpack-value
"""


def _compatible_options() -> tuple[tuple[Option, ...], dict[str, str]]:
    """``_COMPATIBLE_NAMES`` as options, and its aliases (name -> other)."""
    rows = [shlex.split(line) for line in _COMPATIBLE_NAMES.strip().splitlines()]
    kinds = {row[0]: row for row in rows if not row[1].startswith("=")}
    options = []
    aliases = {}
    for row in rows:
        name = row[0]
        if row[1].startswith("="):
            aliases[name] = row[1][1:]
            row = kinds[row[1][1:]]
        kind, text = row[1], row[2]
        flags = row[3:]
        choices: tuple[str, ...] = ()
        if "|" in kind:
            kind, choices = "enum", tuple(kind.split("|"))
        bounds = [tuple(map(int, flag.split(".."))) for flag in flags if ".." in flag] or [(None, None)]
        option = Option(name, kind, None, mutable="immutable" not in flags, doc=COMPATIBLE, inert=True,
                        choices=choices, protected="protected" in flags, multi_arg="multi-arg" in flags,
                        minimum=bounds[0][0], maximum=bounds[0][1])
        options.append(dataclasses.replace(option, default=option.parse(text)))
    return tuple(options), aliases


_COMPAT_OPTIONS, _COMPAT_ALIASES = _compatible_options()
OPTIONS = OPTIONS + _COMPAT_OPTIONS
OPTIONS_BY_NAME: dict[str, Option] = {o.name: o for o in OPTIONS}
assert len(OPTIONS_BY_NAME) == len(OPTIONS), "a name twice"
# Values never shown by SLOWLOG or MONITOR (CONFIG SET's are redacted there,
# as Redis redacts its SENSITIVE_CONFIG ones, and Partita's cluster-secret).
SENSITIVE = frozenset({"requirepass", "masterauth", "masteruser", "cluster-secret", "tls-key-file-pass",
                       "tls-client-key-file-pass"})
assert SENSITIVE <= OPTIONS_BY_NAME.keys()
# name -> the names a value set under it also sets (Redis's aliases)
_ALIASES = {"fsync": ("appendfsync",), "appendfsync": ("fsync",)}
for _name, _other in _COMPAT_ALIASES.items():
    _ALIASES[_name] = (_other,)
    _ALIASES[_other] = _ALIASES.get(_other, ()) + (_name,)


USAGE = "Usage: partita [/path/to/partita.conf] [--name value ...]"


def help_text() -> str:
    """``partita --help``: every option of the table, its default and its one
    line, then the names accepted only for compatibility with Redis."""
    own = [o for o in OPTIONS if o.doc != COMPATIBLE]
    lines = [USAGE, "",
             "Every option can be given in the file (`name value`) or on the command line",
             "(`--name value`), and read or changed at run time with CONFIG GET / CONFIG SET",
             "unless marked (fixed).", "", "Options (default in brackets):"]
    for option in own:
        default = option.format_for_file(option.default) if option.default is not None else ""
        fixed = " (fixed)" if not option.mutable else ""
        lines.append(f"  --{option.name} [{default}]{fixed}")
        lines.append(f"      {option.doc.replace('`', '')}")
    compatible = sorted(o.name for o in OPTIONS if o.doc == COMPATIBLE)
    lines += ["", f"Also {COMPATIBLE}:",
              *textwrap.wrap(", ".join(compatible), 79, initial_indent="  ", subsequent_indent="  ",
                             break_on_hyphens=False)]
    return "\n".join(lines) + "\n"


class Config:
    """Current values, as attributes with Python names (``config.fsync``)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path  # the config file, for CONFIG REWRITE
        self._hooks: list[Callable[[str, Any], None]] = []
        for option in OPTIONS:
            setattr(self, option.attr, option.default)

    # -- building ----------------------------------------------------------

    @classmethod
    def load(cls, path: Path | None, overrides: list[tuple[str, list[str]]] = ()) -> "Config":
        """Read ``path`` (if any), then apply ``--name value ...`` overrides.

        Raises ConfigError with a message naming the file and line.
        """
        config = cls(path)
        if path is not None:
            try:
                text = path.read_text(encoding="utf-8", errors="surrogateescape")
            except OSError as e:
                raise ConfigError(f"Fatal error, can't open config file '{path}': {e.strerror}") from None
            for lineno, name, values, line in iter_config_lines(text, str(path)):
                config._set_from_text(name, values, where=f"{path}, line {lineno}", line=line)
        for name, values in overrides:
            line = " ".join([name, *map(quote_if_needed, values)])
            config._set_from_text(name, values, where=f"command line option --{name}", line=line)
        config.dir = str(Path(config.dir))
        return config

    def _set_from_text(self, name: str, values: list[str], *, where: str, line: str) -> None:
        """One directive: a name and its value's words (several only for a
        ``multi_arg`` option, joined by spaces; else Redis's texts)."""
        option = OPTIONS_BY_NAME.get(name.lower())
        if option is None:
            raise ConfigError(_fatal(where, line, "Bad directive or wrong number of arguments"))
        if len(values) != 1 and not (option.multi_arg and values):
            raise ConfigError(_fatal(where, line, "wrong number of arguments"))
        try:
            parsed = option.parse(" ".join(values))
        except ConfigError as e:
            raise ConfigError(_fatal(where, line, e.message)) from None
        self._assign(option, parsed)

    def _assign(self, option: Option, value: Any) -> None:
        if option.kind == "obuf":  # as Redis: only the classes given change
            value = {**getattr(self, option.attr), **value}
        setattr(self, option.attr, value)
        for alias in _ALIASES.get(option.name, ()):
            setattr(self, OPTIONS_BY_NAME[alias].attr, value)

    def inert_settings(self) -> list[str]:
        """``name value`` of every ``inert`` option set to other than its
        default (an alias once): what a redis.conf asks of Partita in vain."""
        out: dict[str, str] = {}
        for option in OPTIONS:
            value = getattr(self, option.attr)
            if option.inert and value != option.default and not any(a in out for a in _ALIASES.get(option.name, ())):
                out[option.name] = option.format(value)
        return [f"{name} {text}" for name, text in out.items()]

    # -- CONFIG GET / SET --------------------------------------------------

    def get(self, name: str) -> Any:
        return getattr(self, OPTIONS_BY_NAME[name].attr)

    def text(self, name: str) -> str:
        option = OPTIONS_BY_NAME[name]
        return option.format(getattr(self, option.attr))

    def matching(self, patterns: list[str]) -> dict[str, str]:
        """name -> text for every name matching any glob pattern (CONFIG GET)."""
        out: dict[str, str] = {}
        for pattern in patterns:
            low = pattern.lower()
            if low in OPTIONS_BY_NAME:
                out.setdefault(low, self.text(low))
                continue
            for option in OPTIONS:
                if option.name not in out and fnmatch.fnmatchcase(option.name, low):
                    out[option.name] = self.text(option.name)
        return out

    def set_many(self, pairs: list[tuple[str, str]]) -> list[str]:
        """Validate every pair first, then apply all (CONFIG SET is atomic).

        Raises ConfigError(reason, name) with Redis's reason text; returns the
        names that changed.
        """
        seen: set[str] = set()
        parsed: list[tuple[Option, Any]] = []
        for raw_name, raw_value in pairs:
            name = raw_name.lower()
            option = OPTIONS_BY_NAME.get(name)
            if option is None:
                raise ConfigError("unknown", raw_name)
            if name in seen:
                raise ConfigError("duplicate parameter", raw_name)
            seen.add(name)
            if option.protected:
                raise ConfigError("can't set protected config", raw_name)
            if not option.mutable:
                raise ConfigError("can't set immutable config", raw_name)
            try:
                parsed.append((option, option.parse(raw_value)))
            except ConfigError as e:
                raise ConfigError(e.message, raw_name) from None
        old = {option.name: self.get(option.name) for option, _ in parsed}
        for option, value in parsed:
            self._assign(option, value)
        changed = [o.name for o, v in parsed if old[o.name] != v]
        try:
            for name in changed:
                for hook in self._hooks:
                    hook(name, self.get(name))
        except ConfigError as e:
            for option, _ in parsed:
                self._assign(option, old[option.name])
            raise ConfigError(e.message, e.name or (changed[0] if changed else None)) from None
        return changed

    def on_change(self, hook: Callable[[str, Any], None]) -> None:
        """Call ``hook(name, value)`` after CONFIG SET changes a value.

        A hook may raise ConfigError to refuse; the values are then restored.
        """
        self._hooks.append(hook)

    # -- CONFIG REWRITE ----------------------------------------------------

    def rewrite(self) -> None:
        """Write current values back to the config file, keeping comments.

        Lines naming an option are replaced in place (the first occurrence;
        later duplicates dropped); options differing from their defaults and
        not yet in the file are appended. Written atomically.
        """
        if self.path is None:
            raise ConfigError("The server is running without a config file")
        try:
            old_lines = self.path.read_text(encoding="utf-8", errors="surrogateescape").splitlines()
        except FileNotFoundError:
            old_lines = []
        written: set[str] = set()
        out: list[str] = []
        for line in old_lines:
            args = split_args(line.strip().encode("utf-8", "surrogateescape"))
            name = args[0].decode("utf-8", "replace").lower() if args and not line.lstrip().startswith("#") else None
            option = OPTIONS_BY_NAME.get(name) if name else None
            if option is None:
                out.append(line)
                continue
            if option.name in written:
                continue
            written.add(option.name)
            out.append(f"{option.name} {option.format_for_file(self.get(option.name))}")
        for option in OPTIONS:
            if option.name in written or any(alias in written for alias in _ALIASES.get(option.name, ())):
                continue
            value = self.get(option.name)
            if value != option.default:
                out.append(f"{option.name} {option.format_for_file(value)}")
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            with open(tmp, "w", encoding="utf-8", errors="surrogateescape") as f:
                f.write("\n".join(out) + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except OSError as e:
            raise ConfigError(f"Rewriting config file: {e.strerror}") from None


def iter_config_lines(text: str, source: str):
    """Yield ``(lineno, name, values, line)`` for each directive in a config text.

    Raises ConfigError naming the line for a line that does not split into words.
    """
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        args = split_args(line.encode("utf-8", "surrogateescape"))
        where = f"{source}, line {lineno}"
        if args is None:
            raise ConfigError(_fatal(where, line, "Unbalanced quotes in configuration line"))
        name, *values = (a.decode("utf-8", "surrogateescape") for a in args)
        yield lineno, name, values, line


def _fatal(where: str, line: str, reason: str) -> str:
    return f"*** FATAL CONFIG FILE ERROR ***\nReading the configuration: {where}\n>>> '{line}'\n{reason}"


def parse_command_line(argv: list[str]) -> tuple[Path | None, list[tuple[str, list[str]]]]:
    """``[path] [--name value ...]`` -> (path, [(name, values)]).

    As redis-server: ``--save ''`` passes an empty value, the argument after
    ``--name`` is its value even when it starts with ``--``, and the ones
    after it up to the next ``--`` are more words of the value (``--save 900
    1``; ``Config.load`` refuses them for an option of one word). Raises
    ConfigError.
    """
    path: Path | None = None
    overrides: list[tuple[str, list[str]]] = []
    i = 0
    if argv and not argv[0].startswith("--"):
        path = Path(argv[0])
        i = 1
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--") or len(arg) == 2:
            raise ConfigError(
                f"*** FATAL CONFIG ERROR ***\nUnexpected command line argument '{arg}'\n"
                + USAGE
            )
        name = arg[2:]
        if "=" in name:
            name, value = name.split("=", 1)
            values = [value]
            i += 1
        else:
            if i + 1 >= len(argv):
                raise ConfigError(f"*** FATAL CONFIG ERROR ***\nMissing value for command line option '{arg}'")
            values = [argv[i + 1]]
            i += 2
        while i < len(argv) and not argv[i].startswith("--"):
            values.append(argv[i])
            i += 1
        overrides.append((name, values))
    return path, overrides
