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

import fnmatch
import os
import re
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
_SIZE_RE = re.compile(r"^(-?\d+)([a-z]*)$")


def parse_size(text: str) -> int:
    """Redis's ``memtoull``: ``4k`` = 4000, ``4kb`` = 4096, ``1gb`` = 2**30."""
    m = _SIZE_RE.match(text.strip().lower())
    if not m or m.group(2) not in _UNITS:
        raise ConfigError("argument must be a memory value")
    return int(m.group(1)) * _UNITS[m.group(2)]


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


def format_output_buffer_limits(value: dict[str, tuple[int, int, int]]) -> str:
    return " ".join(f"{cls} {h} {s} {sec}" for cls in OUTPUT_BUFFER_CLASSES for h, s, sec in [value[cls]])


@dataclass(frozen=True)
class Option:
    name: str  # Redis spelling
    kind: str  # int | size | string | enum | bool | path
    default: Any
    mutable: bool = True
    doc: str = ""
    minimum: int | None = None
    maximum: int | None = None
    choices: tuple[str, ...] = ()
    protected: bool = False  # Redis's "can't set protected config" (dir)

    @property
    def attr(self) -> str:
        return self.name.replace("-", "_")

    def parse(self, text: str) -> Any:
        """A value from its text form, or ConfigError with Redis's reason."""
        if self.kind == "int":
            try:
                if not re.fullmatch(r"-?\d+", text):
                    raise ValueError
                value = int(text)
            except ValueError:
                raise ConfigError("argument couldn't be parsed into an integer") from None
            self._check_range(value)
            return value
        if self.kind == "size":
            value = parse_size(text)
            self._check_range(value)
            return value
        if self.kind == "bool":
            low = text.lower()
            if low not in ("yes", "no"):
                raise ConfigError("argument must be 'yes' or 'no'")
            return low == "yes"
        if self.kind == "obuf":
            return parse_output_buffer_limits(text)
        if self.kind == "enum":
            low = text.lower()
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

OPTIONS: tuple[Option, ...] = (
    Option("port", "int", 6379, mutable=False, doc="TCP port to listen on (0: pick a free one)",
           minimum=0, maximum=65535),
    Option("bind", "string", "127.0.0.1", mutable=False, doc="addresses to listen on, space separated"),
    Option("dir", "path", "./partita-data", mutable=False, protected=True,
           doc="data directory: one sub-directory per topic"),
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
    Option("client-output-buffer-limit", "obuf", DEFAULT_OUTPUT_BUFFER_LIMITS,
           doc="reply bytes a client may leave unread: `<class> <hard> <soft> <soft-seconds>`"),
    Option("max-blocked-clients", "int", 0, minimum=0, maximum=U32,
           doc="clients waiting in XREAD/XREADGROUP BLOCK at most (0: only maxclients bounds them)"),
    Option("aclfile", "string", "", mutable=False,
           doc="ACL users file for ACL SAVE / ACL LOAD; empty: users live in memory only"),
    Option("tls-port", "int", 0, mutable=False, minimum=0, maximum=65535,
           doc="TLS port on the `bind` addresses (0: no TLS listener)"),
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
           doc="close idle clients after this many seconds (0: never)"),
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
    # The controller quorum (docs/controller.md).
    Option("cluster-join", "bool", False, mutable=False,
           doc="this node joins a running cluster (its cluster-nodes also lists the running nodes; "
               "controller-nodes must name their voters)"),
    Option("controller-nodes", "string", "", mutable=False,
           doc="node ids voting in the controller quorum, comma separated (empty: every node)"),
    Option("controller-session-timeout-ms", "int", 3000, minimum=1000, maximum=I64,
           doc="a node the controller has not heard from this long is fenced and loses its leaderships"),
    Option("controller-snapshot-records", "int", 1000, minimum=2, maximum=I64,
           doc="the controller snapshots its metadata and compacts its log every this many records"),
    Option("unclean-leader-election", "bool", False,
           doc="when no in-sync replica of a shard lives, elect any live replica (may lose acknowledged entries)"),
    Option("leader-rebalance-delay-ms", "int", 5000, minimum=-1, maximum=I64,
           doc="a preferred leader back in sync this long takes its shard back (-1: never)"),
    # Accepted for Redis compatibility; they do not change Partita's storage.
    Option("stream-node-max-entries", "int", 100, minimum=0, maximum=I64,
           doc="accepted for Redis compatibility; no effect on Partita storage"),
    Option("stream-node-max-bytes", "size", 4096, minimum=0, maximum=I64,
           doc="accepted for Redis compatibility; no effect on Partita storage"),
    Option("appendonly", "bool", True, mutable=False,
           doc="always yes: every write goes to a partition log"),
    Option("save", "string", "", doc="accepted for Redis compatibility; Partita has no snapshots"),
    Option("databases", "int", 1, mutable=False, minimum=1, maximum=1, doc="only db 0 exists"),
    Option("daemonize", "bool", False, mutable=False, doc="accepted; Partita stays in the foreground"),
    Option("maxmemory", "size", 0, minimum=0, maximum=I64,
           doc="accepted for Redis compatibility; data lives on disk"),
)

OPTIONS_BY_NAME: dict[str, Option] = {o.name: o for o in OPTIONS}
_ALIASES = {"fsync": "appendfsync", "appendfsync": "fsync"}


class Config:
    """Current values, as attributes with Python names (``config.fsync``)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path  # the config file, for CONFIG REWRITE
        self._hooks: list[Callable[[str, Any], None]] = []
        for option in OPTIONS:
            setattr(self, option.attr, option.default)

    # -- building ----------------------------------------------------------

    @classmethod
    def load(cls, path: Path | None, overrides: list[tuple[str, str]] = ()) -> "Config":
        """Read ``path`` (if any), then apply ``--name value`` overrides.

        Raises ConfigError with a message naming the file and line.
        """
        config = cls(path)
        if path is not None:
            try:
                text = path.read_text(encoding="utf-8", errors="surrogateescape")
            except OSError as e:
                raise ConfigError(f"Fatal error, can't open config file '{path}': {e.strerror}") from None
            for lineno, name, value, line in iter_config_lines(text, str(path)):
                config._set_from_text(name, value, where=f"{path}, line {lineno}", line=line)
        for name, value in overrides:
            config._set_from_text(name, value, where=f"command line option --{name}", line=f"{name} {value}")
        config.dir = str(Path(config.dir))
        return config

    def _set_from_text(self, name: str, value: str, *, where: str, line: str) -> None:
        option = OPTIONS_BY_NAME.get(name.lower())
        if option is None:
            raise ConfigError(_fatal(where, line, "Bad directive or wrong number of arguments"))
        try:
            parsed = option.parse(value)
        except ConfigError as e:
            raise ConfigError(_fatal(where, line, e.message)) from None
        self._assign(option, parsed)

    def _assign(self, option: Option, value: Any) -> None:
        if option.kind == "obuf":  # as Redis: only the classes given change
            value = {**getattr(self, option.attr), **value}
        setattr(self, option.attr, value)
        alias = _ALIASES.get(option.name)
        if alias:
            setattr(self, OPTIONS_BY_NAME[alias].attr, value)

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
            if option.name in written or option.name in _ALIASES and _ALIASES[option.name] in written:
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
    """Yield ``(lineno, name, value, line)`` for each directive in a config text.

    Raises ConfigError naming the line for lines that are not ``name value``.
    """
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        args = split_args(line.encode("utf-8", "surrogateescape"))
        where = f"{source}, line {lineno}"
        if args is None:
            raise ConfigError(_fatal(where, line, "Unbalanced quotes in configuration line"))
        if len(args) != 2:
            raise ConfigError(_fatal(where, line, "Bad directive or wrong number of arguments"))
        name, value = (a.decode("utf-8", "surrogateescape") for a in args)
        yield lineno, name, value, line


def _fatal(where: str, line: str, reason: str) -> str:
    return f"*** FATAL CONFIG FILE ERROR ***\nReading the configuration: {where}\n>>> '{line}'\n{reason}"


def parse_command_line(argv: list[str]) -> tuple[Path | None, list[tuple[str, str]]]:
    """``[path] [--name value ...]`` -> (path, overrides).

    As redis-server, ``--save ''`` passes an empty value. Raises ConfigError.
    """
    path: Path | None = None
    overrides: list[tuple[str, str]] = []
    i = 0
    if argv and not argv[0].startswith("--"):
        path = Path(argv[0])
        i = 1
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--") or len(arg) == 2:
            raise ConfigError(
                f"*** FATAL CONFIG ERROR ***\nUnexpected command line argument '{arg}'\n"
                "Usage: partita [/path/to/partita.conf] [--name value ...]"
            )
        name = arg[2:]
        if "=" in name:
            name, value = name.split("=", 1)
        else:
            if i + 1 >= len(argv):
                raise ConfigError(f"*** FATAL CONFIG ERROR ***\nMissing value for command line option '{arg}'")
            value = argv[i + 1]
            i += 1
        overrides.append((name, value))
        i += 1
    return path, overrides
