"""The topic registry: the ONE place where a key becomes topic + partition.

Owns: which topics exist, how many partitions each has, each topic's
configuration (overrides of the server-wide defaults, persisted in its
metadata blob through ``LogManager.write_topic_meta``), the ``Stream`` of
each opened partition, the producer partitioner's choice for ``XADD
<topic>``, background retention over every partition, the per-topic fsync
policy the durability layer asks for, and topic traffic counters.

Key grammar: ``<topic>`` names a whole topic; ``<topic>#<n>`` (n decimal, no
leading zeros) names partition n. ``#<digits>`` at the end of a key is
reserved for this and parsed only in ``split_partition_key``.

A 1-partition topic is a Redis stream: ``<topic>`` and ``<topic>#0`` are the
same stream. For a topic with more partitions ``get(<topic>)`` refuses (with
a message naming the partition keys); the commands that have a topic-wide
meaning ask ``is_multi`` / ``expand`` / ``append_target`` instead (see
docs/topics.md).

Topic metadata blob (JSON)::

    {"version": 1, "partitions": n, "config": {"retention-ms": 60000, ...}}

``config`` holds only the names set by TOPIC CREATE/ALTER; every other name
follows the server's config (CONFIG SET of a default reaches every topic
that does not override it at the next maintenance pass).

Must not know: sockets, RESP, the server's errors and replies, any client's
error texts. Refusals are ``TopicError`` with a code (the constants below)
and the data a message needs as fields; the server renders them
(server/failures.py). A ``topic.meta`` that cannot be read stops the start
with ``TopicMetaError`` (a message for the operator's log).
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Sequence

from cluster.partitioner import Partitioner
from storage.checkpoint import parse_json
from storage.errors import Refusal, StorageError
from storage.log import PartitionLog
from storage.salvage import keep_aside
from storage.streams.stream import IDMP_DEFAULTS, META_FILE_NAME, Stream

if TYPE_CHECKING:
    from storage.log import LogConfig
    from storage.log_manager import LogManager

log = logging.getLogger("partita.topics")

_PARTITION_SUFFIX = re.compile(rb"#([0-9]+)\Z")
_SPLIT_CACHE_MAX = 65536

META_VERSION = 1
MAX_PARTITIONS = 1024
SEGMENT_BYTES_MAX = 2**31  # segment positions are u32 (storage.log.LogConfig)
I64 = 2**63 - 1
FSYNC_POLICIES = ("always", "everysec", "no")


class PartitionCountError(ValueError):
    """A ``topic.meta`` names a partition count TOPIC CREATE never writes;
    ``meta`` is the rest of it, read."""

    def __init__(self, meta: "TopicMeta") -> None:
        super().__init__(f"partition count {meta.partitions!r} is not between 1 and {MAX_PARTITIONS}")
        self.claimed = meta.partitions
        self.meta = meta


# Why a key cannot be resolved or a topic changed (``TopicError.code``), with
# the fields each carries (keys and names as given: bytes or str).
BAD_PARTITION_KEY = "bad-partition-key"  # key: a malformed '#<digits>' suffix
PARTITION_OUT_OF_RANGE = "partition-out-of-range"  # partition, topic, partitions
NEW_TOPIC_PARTITION_OUT_OF_RANGE = "new-topic-partition-out-of-range"  # partition, partitions
NEEDS_PARTITION_KEY = "needs-partition-key"  # topic, partitions: a command of one partition on a topic key
TOPIC_NAME_HAS_HASH = "topic-name-has-hash"  # topic
TOPIC_NAME_EMPTY = "topic-name-empty"
TOPIC_EXISTS = "topic-exists"  # topic
UNKNOWN_TOPIC = "unknown-topic"  # topic
PARTITIONS_ONLY_GROW = "partitions-only-grow"  # topic, partitions (the current count)
BAD_PARTITION_COUNT = "bad-partition-count"  # partitions, maximum
UNKNOWN_CONFIG = "unknown-config"  # name, known (every config name)
CONFIG_NOT_ONE_OF = "config-not-one-of"  # value, name, choices
CONFIG_NOT_A_SIZE = "config-not-a-size"  # value, name
CONFIG_NOT_AN_INTEGER = "config-not-an-integer"  # value, name
CONFIG_OUT_OF_RANGE = "config-out-of-range"  # value, name, minimum, maximum
CONFIG_REPEATED = "config-repeated"  # name: one config name given twice in a command
RENAME_PARTITION = "rename-partition"  # key, topic, partitions: RENAME of one partition of a topic of several
RENAME_TO_PARTITION = "rename-to-partition"  # key: RENAME to a name ending with '#<n>' (a partition's)
TOPIC_NEEDS_TOPIC = "needs-topic"  # command, key: TOPIC DESCRIBE / ALTER / GROUPS of a partition key
TOPIC_DELETE_NEEDS_TOPIC = "delete-needs-topic"  # key: TOPIC DELETE of a partition key
REPLICATION_FACTOR_FIXED = "replication-factor-fixed"  # wanted, actual, cluster (bool): not the one every partition has


class TopicError(Refusal):
    """A key cannot be resolved or a topic changed; ``code`` is one of the
    constants above."""


class TopicMetaError(Exception):
    """A topic's ``topic.meta`` cannot be read: the server refuses to start
    (the message names the file, for the operator)."""


def _text(key: bytes) -> str:
    return key.decode("utf-8", "replace")


# The streams Partita keeps for itself: a Kafka group's committed offsets
# (``__kafka_offsets{<group>}``, server/kafka_front/offsets.py) and a topic
# group's membership in a cluster (``__topic_members{<topic>}<group hex>``,
# cluster/broker/topic_groups.py). Not listed as topics (TOPIC LIST without
# a pattern naming them, Kafka Metadata) and not writable by Kafka clients.
OFFSETS_PREFIX = b"__kafka_offsets{"
MEMBERS_PREFIX = b"__topic_members{"


def is_internal(name: bytes) -> bool:
    """Whether ``name`` is one of Partita's own streams (above)."""
    return name.startswith((OFFSETS_PREFIX, MEMBERS_PREFIX))


def split_partition_key(key: bytes) -> tuple[bytes, int | None]:
    """``b"orders#3"`` -> ``(b"orders", 3)``; ``b"orders"`` -> ``(b"orders", None)``.

    Raises:
        TopicError: the reserved suffix is malformed (leading zeros, empty topic).
    """
    match = _PARTITION_SUFFIX.search(key)
    if match is None:
        return key, None
    digits = match.group(1)
    topic = key[: match.start()]
    if (len(digits) > 1 and digits[:1] == b"0") or len(digits) > 9 or not topic:
        raise TopicError(BAD_PARTITION_KEY, key=key)
    return topic, int(digits)


def partition_key(topic: bytes, partition: int) -> bytes:
    return b"%s#%d" % (topic, partition)


# ------------------------------------------------------------ topic config

_SIZE_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1024, "m": 1000**2, "mb": 1024**2,
               "g": 1000**3, "gb": 1024**3}
_SIZE_RE = re.compile(r"^(-?\d+)([a-z]*)$")


@dataclass(frozen=True)
class TopicOption:
    """One per-topic config name; its server-wide default has the same name."""

    name: str
    kind: str  # int | size | enum | string
    default: Any  # used when the server config has no such name
    minimum: int | None = None
    maximum: int | None = None
    choices: tuple[str, ...] = ()
    doc: str = ""

    @property
    def attr(self) -> str:
        return self.name.replace("-", "_")

    def parse(self, raw: bytes | str) -> Any:
        """The value of ``raw``, or TopicError naming the option."""
        text = raw.decode("utf-8", "replace") if isinstance(raw, (bytes, bytearray)) else str(raw)
        if self.kind == "string":
            return text
        if self.kind == "enum":
            if text.lower() not in self.choices:
                raise TopicError(CONFIG_NOT_ONE_OF, value=text, name=self.name, choices=self.choices)
            return text.lower()
        m = _SIZE_RE.match(text.lower())  # (no blanks around it, as Redis's CONFIG SET)
        units = _SIZE_UNITS if self.kind == "size" else {"": 1}
        if not m or m.group(2) not in units:
            raise TopicError(CONFIG_NOT_A_SIZE if self.kind == "size" else CONFIG_NOT_AN_INTEGER,
                             value=text, name=self.name)
        value = int(m.group(1)) * units[m.group(2)]
        if (self.minimum is not None and value < self.minimum) or (
                self.maximum is not None and value > self.maximum):
            raise TopicError(CONFIG_OUT_OF_RANGE, value=text, name=self.name,
                             minimum=self.minimum, maximum=self.maximum)
        return value


TOPIC_OPTIONS: tuple[TopicOption, ...] = (
    TopicOption("retention-ms", "int", -1, -1, I64,
                doc="delete whole segments whose newest entry is older than this (-1: keep)"),
    TopicOption("retention-bytes", "size", -1, -1, I64,
                doc="delete the oldest segments while a partition stays above this size (-1: no limit)"),
    TopicOption("segment-bytes", "size", 128 * 1024**2, 1024, SEGMENT_BYTES_MAX,
                doc="roll a partition's active segment at this size"),
    TopicOption("segment-ms", "int", 7 * 24 * 3600 * 1000, 1, I64,
                doc="roll a partition's active segment at this age"),
    TopicOption("fsync", "enum", "everysec", choices=FSYNC_POLICIES,
                doc="when an XADD to this topic is durable before its reply"),
    TopicOption("partition-key-field", "string", "",
                doc="XADD <topic> hashes this field's value to pick the partition (empty: round-robin)"),
    TopicOption("max-entry-bytes", "size", 1024**2, 1, I64,
                doc="largest entry (field and value bytes) XADD accepts"),
    TopicOption("acks", "enum", "all", choices=("all", "1"),
                doc="replicated topics: XADD replies once the in-sync replicas have the entry (all) "
                    "or after the leader's own write (1)"),
    TopicOption("min-insync-replicas", "int", 1, 1, 1000,
                doc="acks=all XADDs are refused, and the high watermark waits, while fewer replicas are in sync"),
)
TOPIC_OPTIONS_BY_NAME = {o.name: o for o in TOPIC_OPTIONS}
_KNOWN_CONFIG = tuple(o.name for o in TOPIC_OPTIONS)  # what an unknown-config refusal lists


# Under fsync always a partition's active segment keeps this many zero bytes
# written ahead of its end, so a group commit's fdatasync commits no size
# change to the file system's journal (storage.segment, bench/RESULTS.md).
PREALLOCATE_BYTES_ALWAYS = 1024 * 1024


def log_config_from(config: Any, overrides: dict[str, Any] | None = None) -> LogConfig:
    """The storage settings from the server config plus a topic's overrides."""
    from storage.log import LogConfig

    overrides = overrides or {}
    names = ("segment_bytes", "segment_ms", "retention_ms", "retention_bytes",
             "index_interval_bytes", "max_batch_bytes")
    values = {n: getattr(config, n) for n in names if getattr(config, n, None) is not None}
    for name in ("segment-bytes", "segment-ms", "retention-ms", "retention-bytes"):
        if name in overrides:
            values[name.replace("-", "_")] = overrides[name]
    if "segment_bytes" in values:
        values["segment_bytes"] = min(int(values["segment_bytes"]), SEGMENT_BYTES_MAX)
    if overrides.get("fsync", getattr(config, "fsync", None)) == "always":
        values["preallocate_bytes"] = PREALLOCATE_BYTES_ALWAYS
    return LogConfig(**values)


@dataclass
class TopicMeta:
    partitions: int
    config: dict[str, Any]
    # Random at creation (Kafka's topic ID): replicas of a deleted and
    # re-created topic tell the two apart. "" for topics older than it.
    topic_id: str = ""

    def to_bytes(self) -> bytes:
        obj = {"version": META_VERSION, "partitions": self.partitions, "config": self.config}
        if self.topic_id:
            obj["id"] = self.topic_id
        return json.dumps(obj, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, blob: bytes | None) -> TopicMeta:
        """A ``topic.meta`` (from disk, or a peer's). ValueError: garbage,
        anything but a JSON object with a config object (PartitionCountError
        for a partition count out of range)."""
        if not blob:
            return cls(1, {})
        obj = parse_json(blob)
        if not isinstance(obj, dict) or not isinstance(obj.get("config"), (dict, type(None))):
            raise ValueError("not a topic's metadata: a JSON object with a config object")
        topic_id = obj.get("id", "")
        if type(topic_id) is not str:
            raise ValueError(f"not a topic's metadata: a topic id of {json.dumps(topic_id)}")
        config = {k: v for k, v in (obj.get("config") or {}).items() if k in TOPIC_OPTIONS_BY_NAME}
        meta = cls(obj.get("partitions", 1), config, topic_id)
        if type(meta.partitions) is not int or not 1 <= meta.partitions <= MAX_PARTITIONS:
            raise PartitionCountError(meta)
        return meta


def _refuse_repeated_names(pairs: Sequence[tuple[bytes, bytes]]) -> None:
    seen: set[str] = set()
    for raw_name, _ in pairs:
        name = raw_name.decode("utf-8", "replace").lower()
        if name in seen:
            raise TopicError(CONFIG_REPEATED, name=name)
        seen.add(name)


def _drop_refused_values(meta: TopicMeta, topic: bytes, source: Any) -> None:
    """Drop from ``meta``'s config (read from ``source``: a file on disk,
    a peer's) each value TOPIC ALTER would refuse, with a warning: the
    server's value applies instead of one that would fail where it is used."""
    for name, value in list(meta.config.items()):
        try:
            fits = TOPIC_OPTIONS_BY_NAME[name].parse(str(value)) == value
        except TopicError:
            fits = False
        if not fits:
            log.warning("%s: topic '%s' has %s %s, a value TOPIC ALTER refuses: ignored, the "
                        "server's value applies", source, _text(topic), name, json.dumps(value))
            del meta.config[name]


@dataclass(frozen=True)
class RetentionAction:
    """One segment deleted by retention (for the log and INFO)."""

    topic: bytes
    partition: int
    base_offset: int
    end_offset: int
    size_bytes: int


class TopicStats:
    """Totals and per-second rates of entries written and read (INFO topics)."""

    def __init__(self) -> None:
        self.entries_in = 0
        self.entries_out = 0
        self.retention_segments_deleted = 0
        self.retention_bytes_deleted = 0
        self.idempotent_appends = 0  # appends of an idempotent producer (XADD IDMP, Kafka)
        self.idempotent_duplicates = 0  # their retries answered from the producer state, nothing written
        self.in_per_sec = 0.0
        self.out_per_sec = 0.0
        self._last: tuple[float, int, int] | None = None

    def sample(self, now_s: float) -> None:
        """Called about once a second: the rates since the previous sample."""
        if self._last is not None:
            t0, in0, out0 = self._last
            dt = now_s - t0
            if dt > 0:
                self.in_per_sec = (self.entries_in - in0) / dt
                self.out_per_sec = (self.entries_out - out0) / dt
        self._last = (now_s, self.entries_in, self.entries_out)


class TopicRegistry:
    """Topics in one data directory; streams opened lazily and cached.

    Thread contract: the server's main (trio) thread only.
    """

    def __init__(self, log_manager: LogManager, config: Any = None) -> None:
        self.log_manager = log_manager
        self.config = config
        self._meta: dict[bytes, TopicMeta] = {}
        self._streams: dict[tuple[bytes, int], Stream] = {}
        self.partitioner = Partitioner()
        self.stats = TopicStats()
        self._fsync_by_dir: dict[str, str] = {}  # topic dir -> fsync override
        self.coordinators: dict[tuple[bytes, bytes], Any] = {}  # (topic, group) -> membership
        # Hot-path caches (XADD, XREAD): key -> split result, and key -> append
        # target for keys that do not go through the partitioner. The second
        # is cleared by every create / delete / alter.
        self._split_cache: dict[bytes, tuple[bytes, int | None]] = {}
        self._append_cache: dict[bytes, tuple[Stream, bytes, list[bytes]]] = {}
        self.generation = 0  # bumped by every create / delete / alter (replication rescans)
        # Called with the topic after a local create / delete / alter (not
        # after ``adopt_topic``): replication tells the other nodes.
        self.on_change: Any = None
        self.deleted_ids: dict[bytes, str] = {}
        self.key_filter: Any = None  # cluster: which topic names this node answers for
        self._adopting = False
        # Topics an XADD created whose partitions have not yet taken an
        # append: a refused one removes the topic again (``_drop_if_unwritten``).
        self._unwritten: set[bytes] = set()
        for topic in log_manager.topics():
            meta = self._load_meta(topic)
            if meta is not None:
                self._meta[topic] = meta
                self._remember_fsync(topic)

    def _load_meta(self, topic: bytes) -> TopicMeta | None:
        """A topic's metadata at start-up, checked against the partitions on
        disk and the limits TOPIC CREATE keeps.

        A missing ``topic.meta`` (lost before its directory's fsync) is rebuilt
        from the partition directories, so no partition's entries are hidden;
        so is a partition count outside 1..MAX_PARTITIONS (trusted, it made
        the first access create millions of directories), the damaged file
        kept aside. A config value TOPIC ALTER would refuse is dropped (the
        server's default applies). An unreadable one stops the start with the
        file named, since guessing its config could misroute or lose data.
        """
        lm = self.log_manager
        path = lm.topic_dir(topic) / "topic.meta"
        on_disk = []
        for n in lm.partitions_on_disk(topic):
            if n < MAX_PARTITIONS:
                on_disk.append(n)
            else:
                log.warning("%s: partition %d is beyond the limit of %d partitions: skipped",
                            path.parent / f"partition-{n}", n, MAX_PARTITIONS)
        blob = lm.read_topic_meta(topic)
        if blob is None and not on_disk:
            # Killed while creating it: the directory exists, nothing was
            # written in it (``topic.meta`` comes first and is renamed into
            # place). The creating XADD was never acknowledged.
            log.warning("%s is missing and no partition exists: removing the half-created topic '%s'",
                        path, _text(topic))
            lm.delete_topic(topic)
            return None
        if blob is None:
            meta = TopicMeta(max(on_disk) + 1 if on_disk else 1, {})
            log.warning("%s is missing: topic '%s' reopened with the %d partition(s) found on disk "
                        "and the server's default config", path, _text(topic), meta.partitions)
            lm.write_topic_meta(topic, meta.to_bytes())
            return meta
        try:
            meta = TopicMeta.from_bytes(blob)
        except PartitionCountError as exc:
            meta = exc.meta
            meta.partitions = max(on_disk) + 1 if on_disk else 1
            aside = keep_aside(path)
            lm.write_topic_meta(topic, meta.to_bytes())
            log.warning("%s: topic '%s' claims %s partitions, not a count between 1 and the limit of %d; "
                        "repaired to the %d partition(s) found on disk (the file as it was is kept as %s)",
                        path, _text(topic), json.dumps(exc.claimed), MAX_PARTITIONS, meta.partitions, aside)
        except (ValueError, TypeError, AttributeError) as exc:
            raise TopicMetaError(f"unreadable topic metadata {path}: {exc}; refusing to start "
                             f"(partitions on disk: {on_disk}); restore or remove the file") from None
        _drop_refused_values(meta, topic, path)
        if on_disk and max(on_disk) >= meta.partitions:
            log.warning("%s says %d partition(s) but partition %d exists on disk: using %d",
                        path, meta.partitions, max(on_disk), max(on_disk) + 1)
            meta.partitions = max(on_disk) + 1
        return meta

    @classmethod
    def open(cls, data_dir: Path, config: Any = None, clock_ms: Any = None) -> TopicRegistry:
        """``clock_ms``: the partition logs' clock (batch times, retention,
        idempotent ids' expiry); the wall clock by default (tests pass a fake)."""
        from storage.log_manager import LogManager

        data_dir = Path(data_dir)
        data_dir.mkdir(parents=True, exist_ok=True)
        extra = {} if clock_ms is None else {"clock_ms": clock_ms}
        started = time.monotonic()
        manager = LogManager(data_dir, default_config=log_config_from(config),
                             max_open_files=getattr(config, "max_open_files", 1000), **extra)
        registry = cls(manager, config)
        log.info("Loaded %d topic(s), %d partition(s) in %.3fs; each partition's log opens on first use "
                 "(and then checks what was written after its last flush)", len(registry._meta),
                 sum(meta.partitions for meta in registry._meta.values()), time.monotonic() - started)
        return registry

    def close(self) -> None:
        for stream in self._streams.values():
            store = stream.__dict__.get("group_store")
            if store is not None:
                store.close()
        self._streams.clear()
        self.log_manager.close()

    # ---------------------------------------------------------------- config

    def config_value(self, topic: bytes, name: str) -> Any:
        """The effective value of topic config ``name``: override, else server default."""
        return self._effective(self._meta.get(topic), name)

    def _effective(self, meta: TopicMeta | None, name: str) -> Any:
        if meta is not None and name in meta.config:
            return meta.config[name]
        option = TOPIC_OPTIONS_BY_NAME[name]
        value = getattr(self.config, option.attr, None)
        return option.default if value is None else value

    def topic_config(self, topic: bytes, meta: TopicMeta | None = None) -> dict[str, tuple[Any, bool]]:
        """name -> (effective value, overridden by the topic?) for every topic
        option; ``meta``: the topic's metadata as given (in a cluster: the
        controller's committed copy) rather than this node's."""
        meta = meta or self._meta[topic]
        return {o.name: (self._effective(meta, o.name), o.name in meta.config) for o in TOPIC_OPTIONS}

    def log_config_for(self, topic: bytes) -> LogConfig:
        return log_config_from(self.config, self._meta[topic].config)

    @staticmethod
    def parse_config(pairs: Sequence[tuple[bytes, bytes]]) -> dict[str, Any]:
        """Validate ``[(name, value) ...]``; raises TopicError on a bad name
        or value, or a name given twice (as CONFIG SET refuses a duplicate
        parameter: which one would win is anyone's guess)."""
        out: dict[str, Any] = {}
        _refuse_repeated_names(pairs)
        for raw_name, raw_value in pairs:
            name = raw_name.decode("utf-8", "replace").lower()
            option = TOPIC_OPTIONS_BY_NAME.get(name)
            if option is None:
                raise TopicError(UNKNOWN_CONFIG, name=raw_name, known=_KNOWN_CONFIG)
            out[name] = option.parse(raw_value)
        return out

    @staticmethod
    def parse_alter_config(pairs: Sequence[tuple[bytes, bytes]]) -> tuple[dict[str, Any], set[str]]:
        """TOPIC CREATE's and ALTER's ``... CONFIG [(name, value) ...]``: the
        values to set, and the names whose value ``default`` sets no
        override (drops it in ALTER).
        TopicError as ``parse_config``'s."""
        _refuse_repeated_names(pairs)
        resets = {p[0].decode("utf-8", "replace").lower() for p in pairs if p[1].lower() == b"default"}
        parsed = TopicRegistry.parse_config([p for p in pairs if p[1].lower() != b"default"])
        for name in resets:
            if name not in TOPIC_OPTIONS_BY_NAME:
                raise TopicError(UNKNOWN_CONFIG, name=name, known=_KNOWN_CONFIG)
        return parsed, resets

    def _remember_fsync(self, topic: bytes) -> None:
        d = str(self.log_manager.topic_dir(topic))
        policy = self._meta[topic].config.get("fsync")
        if policy:
            self._fsync_by_dir[d] = policy
        else:
            self._fsync_by_dir.pop(d, None)

    def fsync_policy_of(self, obj: Any) -> str | None:
        """The fsync override of the topic a partition log or group store belongs to.

        Both live in ``<topic dir>/partition-<n>/``; None when the topic
        follows the server's ``fsync`` (the common case costs one dict check).
        """
        if not self._fsync_by_dir:
            return None
        directory = getattr(obj, "directory", None)
        if directory is None:
            return None
        return self._fsync_by_dir.get(os.path.dirname(str(directory)))

    def refresh_log_configs(self) -> None:
        """Give every open partition log its topic's current settings (after a
        CONFIG SET of a default or TOPIC ALTER ... CONFIG)."""
        cache: dict[bytes, LogConfig] = {}
        for (topic, n), stream in self._streams.items():
            cfg = cache.get(topic)
            if cfg is None:
                cfg = cache[topic] = self.log_config_for(topic)
            if stream.log.config != cfg:
                stream.log.config = cfg

    def max_entry_bytes(self, topic: bytes) -> int:
        meta = self._meta.get(topic)
        value = meta.config.get("max-entry-bytes") if meta is not None else None
        if value is None:
            value = getattr(self.config, "max_entry_bytes", None)
        return int(value) if value is not None else TOPIC_OPTIONS_BY_NAME["max-entry-bytes"].default

    def _split(self, key: bytes) -> tuple[bytes, int | None]:
        found = self._split_cache.get(key)
        if found is None:
            found = split_partition_key(key)  # raises for malformed suffixes: never cached
            if len(self._split_cache) >= _SPLIT_CACHE_MAX:
                self._split_cache.clear()
            self._split_cache[key] = found
        return found

    # ---------------------------------------------------------------- lookup

    def _partitions_for_new_topic(self) -> int:
        value = getattr(self.config, "default_partitions", 1)
        return int(value) if value else 1

    def _resolve(self, key: bytes) -> tuple[bytes, int | None]:
        topic, partition = self._split(key)
        meta = self._meta.get(topic)
        if meta is not None and partition is not None and partition >= meta.partitions:
            raise TopicError(PARTITION_OUT_OF_RANGE, partition=partition, topic=topic,
                             partitions=meta.partitions)
        return topic, partition

    def _stream_for(self, topic: bytes, partition: int | None) -> Stream:
        count = self._meta[topic].partitions
        if partition is None:
            if count != 1:
                raise TopicError(NEEDS_PARTITION_KEY, topic=topic, partitions=count)
            partition = 0
        cached = self._streams.get((topic, partition))
        if cached is not None:
            return cached
        cfg = self.log_config_for(topic)
        plog = self.log_manager.partition(topic, partition, cfg)
        if plog.config != cfg:
            plog.config = cfg
        config = self.config
        stream = Stream(plog, partition_dir(plog) / META_FILE_NAME,
                        idmp_defaults=(getattr(config, "stream_idmp_duration", None) or IDMP_DEFAULTS[0],
                                       getattr(config, "stream_idmp_maxsize", None) or IDMP_DEFAULTS[1]))
        if topic in self._unwritten:
            stream.on_first_append_refused = lambda: self._drop_if_unwritten(topic)
        self._streams[(topic, partition)] = stream
        return stream

    def get(self, key: bytes) -> Stream | None:
        """The stream a key names, or None when its topic does not exist.

        Raises TopicError for the key of a topic with several partitions.
        """
        topic, partition = self._resolve(key)
        if topic not in self._meta:
            return None
        return self._stream_for(topic, partition)

    def _create(self, topic: bytes, partitions: int, config: dict[str, Any], topic_id: str | None = None) -> None:
        """``topic_id`` None: a new topic, a new random ID; a string (maybe ""):
        a copy of another node's topic, under its ID exactly."""
        meta = TopicMeta(partitions, dict(config), os.urandom(8).hex() if topic_id is None else topic_id)
        self.log_manager.write_topic_meta(topic, meta.to_bytes())
        self._meta[topic] = meta
        self._append_cache.clear()
        self._remember_fsync(topic)
        self._changed(topic)

    # ------------------------------------------------- replication support

    def _changed(self, topic: bytes) -> None:
        self.generation += 1
        if self.on_change is not None and not self._adopting:
            self.on_change(topic)

    def topic_meta_blob(self, topic: bytes) -> bytes | None:
        meta = self._meta.get(topic)
        return meta.to_bytes() if meta is not None else None

    def topic_id(self, topic: bytes) -> str | None:
        meta = self._meta.get(topic)
        return meta.topic_id if meta is not None else None

    def adopt_topic(self, topic: bytes, blob: bytes) -> None:
        """Make this node's copy of ``topic`` match a leader's ``topic.meta``:
        create it, or replace a different topic of the same name (another
        topic ID: it was deleted and re-created), or take its partition count
        and config."""
        self._adopting = True
        try:
            self._adopt(topic, blob)
        finally:
            self._adopting = False

    def adopt_deletion(self, topic: bytes, topic_id: str) -> None:
        """The topic was deleted on the node that owns it (same topic ID only)."""
        if topic in self._meta and self._meta[topic].topic_id == topic_id:
            self._adopting = True
            try:
                self.delete(topic)
            finally:
                self._adopting = False

    def _adopt(self, topic: bytes, blob: bytes) -> None:
        theirs = TopicMeta.from_bytes(blob)
        _drop_refused_values(theirs, topic, "the leader's topic.meta")
        mine = self._meta.get(topic)
        if mine is not None and mine.topic_id != theirs.topic_id:
            self.delete(topic)
            mine = None
        if mine is None:
            renamed = next((name for name, meta in self._meta.items()
                            if theirs.topic_id and meta.topic_id == theirs.topic_id), None)
            if renamed is not None:
                # Renamed on its leader (RENAME): this copy moves with it
                # (then takes the config below, as an update would).
                log.info("topic '%s' was renamed '%s' on its leader: renaming this copy",
                         _text(renamed), _text(topic))
                self._rename(renamed, topic, self._meta[renamed])
                mine = self._meta[topic]
            else:
                self._create(topic, theirs.partitions, theirs.config, theirs.topic_id)
                return
        if mine.partitions != theirs.partitions or mine.config != theirs.config:
            grew = theirs.partitions > mine.partitions
            mine.config = dict(theirs.config)
            if grew:
                self.alter_partitions(topic, theirs.partitions)
            else:
                self.log_manager.write_topic_meta(topic, mine.to_bytes())
            self._append_cache.clear()
            self._remember_fsync(topic)
            self.refresh_log_configs()
            self._changed(topic)

    def partitions_of(self, topic: bytes) -> int:
        meta = self._meta.get(topic)
        return meta.partitions if meta is not None else 0

    def stream_of(self, topic: bytes, partition: int) -> Stream:
        """Partition ``partition`` of an existing topic (replication's way in)."""
        return self._stream_for(topic, partition)

    def cached_stream(self, topic: bytes, partition: int) -> Stream | None:
        return self._streams.get((topic, partition))

    def open_streams_of(self, key: bytes) -> list[Stream] | None:
        """The partitions of the key's topic (all for ``<topic>``) that are
        open, opening none (MEMORY USAGE: what is in memory); None when
        the topic does not exist."""
        topic, partition = self._resolve(key)
        meta = self._meta.get(topic)
        if meta is None:
            return None
        numbers = range(meta.partitions) if partition is None else (partition,)
        return [s for s in (self._streams.get((topic, n)) for n in numbers) if s is not None]

    def offline_partitions(self) -> list[tuple[bytes, int]]:
        """The open partitions whose logs are offline for writes (a failed
        fsync; until they are reopened, i.e. the process restarts)."""
        if not PartitionLog.taken_offline:
            return []
        return [key for key, stream in self._streams.items() if stream.log.sync_failure is not None]

    def get_or_create(self, key: bytes) -> Stream:
        """The stream a key names, creating its topic (XADD without NOMKSTREAM)."""
        topic, partition = self._resolve(key)
        if topic not in self._meta:
            count = self._partitions_for_new_topic()
            if partition is not None and partition >= count:
                raise TopicError(NEW_TOPIC_PARTITION_OUT_OF_RANGE, partition=partition, partitions=count)
            self._create(topic, count, {})
        return self._stream_for(topic, partition)

    def append_target(self, key: bytes, fields: Sequence[bytes], *, create: bool = True
                      ) -> tuple[Stream, bytes] | None:
        """Where ``XADD key ... fields`` writes: ``(stream, partition key)``.

        ``<topic>#<n>`` is partition n; ``<topic>`` of a multi-partition topic
        goes through the partitioner. A missing topic is created with
        ``default-partitions`` partitions when ``create``, else None.
        """
        cached = self._append_cache.get(key)
        if cached is not None:
            return cached[0], cached[1]
        topic, partition = self._resolve(key)
        meta = self._meta.get(topic)
        if meta is None:
            if not create:
                return None
            count = self._partitions_for_new_topic()
            if partition is not None and partition >= count:
                raise TopicError(NEW_TOPIC_PARTITION_OUT_OF_RANGE, partition=partition, partitions=count)
            self._create(topic, count, {})
            self._unwritten.add(topic)
            meta = self._meta[topic]
        if partition is None:
            if meta.partitions == 1:
                partition = 0
            else:
                partition = self.choose_partition(topic, fields)
                return self._stream_to_write(topic, partition), partition_key(topic, partition)
        stream, pkey = self._stream_to_write(topic, partition), partition_key(topic, partition)
        if len(self._append_cache) >= _SPLIT_CACHE_MAX:
            self._append_cache.clear()
        self._append_cache[key] = (stream, pkey, self._siblings(key, pkey))
        return stream, pkey

    def choose_partition(self, topic: bytes, fields: Sequence[bytes], sticky: bytes | None = None) -> int:
        """The partition of existing multi-partition ``topic`` an entry of
        ``fields`` goes to (``cluster.partitioner``; ``sticky``: an
        idempotent producer's id)."""
        field = self.config_value(topic, "partition-key-field")
        return self.partitioner.choose(topic, self._meta[topic].partitions, fields,
                                       field.encode() if field else None, sticky)

    def _stream_to_write(self, topic: bytes, partition: int) -> Stream:
        """``_stream_for`` for an XADD: a partition of a topic the XADD just
        created that fails to open leaves no topic behind."""
        try:
            return self._stream_for(topic, partition)
        except Exception:
            self._drop_if_unwritten(topic)
            raise

    def _drop_if_unwritten(self, topic: bytes) -> None:
        """An XADD that created ``topic`` was refused (a partition did not
        open, or its append failed): delete the topic if nothing was written
        to it meanwhile, so the refused write leaves no key, now or after a
        restart. Once any partition took an append the topic stays."""
        if topic not in self._unwritten:
            return
        streams = [s for (t, _n), s in self._streams.items() if t == topic]
        if any(s.pending for s in streams):
            return  # another partition's entries wait for their commit: decided by it
        if any(s.on_first_append_refused is None or s.log.log_end_offset
               or s.__dict__.get("group_store") is not None for s in streams):
            self._unwritten.discard(topic)
            for s in streams:
                s.on_first_append_refused = None
            return
        try:
            self.delete(topic)
        except StorageError as exc:
            log.warning("topic '%s', created by an XADD that was refused, could not be removed "
                        "again: %s", _text(topic), exc)

    def known_target(self, key: bytes) -> tuple[Stream, bytes, list[bytes]] | None:
        """``(stream, partition key, sibling keys)`` for a key that names one
        existing partition and was written through before (no creation, no
        partitioner); None otherwise."""
        return self._append_cache.get(key)

    def run_target(self, key: bytes) -> tuple[Stream, bytes, list[bytes]] | None:
        """Where a pipelined run of keyless ``XADD <topic> * ...`` goes (the
        sticky partitioner): for the bare key of an existing topic of several
        partitions without a ``partition-key-field``, ``(stream, partition
        key, sibling keys)`` of the partition the round-robin counter points
        at. The counter stays; ``took_run`` moves it on once the run is
        taken. None for anything else (the general path then picks per
        entry, or gives the errors)."""
        try:
            topic, partition = self._split(key)
        except TopicError:
            return None
        meta = self._meta.get(topic)
        if partition is not None or meta is None or meta.partitions < 2 \
                or self.config_value(topic, "partition-key-field"):
            return None
        n = self.partitioner.peek(topic, meta.partitions)
        pkey = partition_key(topic, n)
        return self._stream_for(topic, n), pkey, self._siblings(key, pkey)

    def took_run(self, key: bytes) -> None:
        """A run ``run_target`` pointed at was written: the next goes on."""
        self.partitioner.advance(self.topic_of(key))

    def read_target(self, key: bytes) -> Stream | None:
        """The stream of a key that names one existing partition (a bare
        key of a one-partition topic, or a partition key); None for anything
        else (no such topic, several partitions, a malformed key): the
        caller then takes its general path, which gives the errors."""
        cached = self._append_cache.get(key)
        if cached is not None:
            return cached[0]
        try:
            if self.is_multi(key):
                return None
            return self.get(key)
        except TopicError:
            return None

    def sibling_keys(self, key: bytes, written_key: bytes) -> list[bytes]:
        """Keys other than ``key`` whose readers must wake after an append to
        partition ``written_key`` through ``key``: the partition key and the
        topic key."""
        cached = self._append_cache.get(key)
        if cached is not None and cached[1] == written_key:
            return cached[2]
        return self._siblings(key, written_key)

    @staticmethod
    def _siblings(key: bytes, written_key: bytes) -> list[bytes]:
        topic = written_key[: written_key.rindex(b"#")]
        return [k for k in (written_key, topic) if k != key]

    def exists(self, key: bytes) -> bool:
        try:
            topic, _ = self._resolve(key)
        except TopicError:
            return False
        return topic in self._meta

    def is_multi(self, key: bytes) -> bool:
        """True for the bare key of an existing topic with more than one partition."""
        try:
            topic, partition = self._split(key)
        except TopicError:
            return False
        meta = self._meta.get(topic)
        return partition is None and meta is not None and meta.partitions > 1

    def expand(self, key: bytes) -> list[bytes]:
        """The partition keys of a multi-partition topic key; ``[key]`` otherwise."""
        if not self.is_multi(key):
            return [key]
        return [partition_key(key, n) for n in range(self._meta[key].partitions)]

    def streams_of(self, key: bytes) -> list[Stream]:
        """Every partition's stream of the key's topic (all of them for ``<topic>``)."""
        topic, partition = self._resolve(key)
        if topic not in self._meta:
            return []
        if partition is not None:
            return [self._stream_for(topic, partition)]
        return [self._stream_for(topic, n) for n in range(self._meta[topic].partitions)]

    def partition_count(self, key: bytes) -> int:
        topic, _ = self._resolve(key)
        meta = self._meta.get(topic)
        return meta.partitions if meta else 0

    def topic_of(self, key: bytes) -> bytes:
        return self._split(key)[0]

    # ---------------------------------------------------------- TOPIC admin

    def topics(self) -> list[bytes]:
        return sorted(self._meta)

    def create_topic(self, topic: bytes, partitions: int, pairs: Sequence[tuple[bytes, bytes]] = ()) -> None:
        """TOPIC CREATE. Raises TopicError (exists, bad name, bad count or config)."""
        if b"#" in topic:
            raise TopicError(TOPIC_NAME_HAS_HASH, topic=topic)
        if not topic:
            raise TopicError(TOPIC_NAME_EMPTY)
        if topic in self._meta:
            raise TopicError(TOPIC_EXISTS, topic=topic)
        _check_partitions(partitions)
        config, _ = self.parse_alter_config(pairs)  # (``default``: no override, as in ALTER)
        self._create(topic, partitions, config)

    def _need(self, topic: bytes) -> TopicMeta:
        meta = self._meta.get(topic)
        if meta is None:
            raise TopicError(UNKNOWN_TOPIC, topic=topic)
        return meta

    def alter_partitions(self, topic: bytes, partitions: int) -> list[int]:
        """TOPIC ALTER name PARTITIONS n: only grows. Returns the new partition numbers.

        Groups of the topic are created on the new partitions reading from
        their start (the new partitions are empty), so no entry is skipped.
        """
        meta = self._need(topic)
        _check_partitions(partitions)
        if partitions < meta.partitions:
            raise TopicError(PARTITIONS_ONLY_GROW, topic=topic, partitions=meta.partitions)
        old = meta.partitions
        if partitions == old:
            return []
        group_names: set[bytes] = set()
        from storage.streams.groups import groups_of

        for n in range(old):
            group_names.update(groups_of(self._stream_for(topic, n)).groups)
        meta.partitions = partitions
        self._append_cache.clear()
        self.log_manager.write_topic_meta(topic, meta.to_bytes())
        for n in range(old, partitions):
            stream = self._stream_for(topic, n)
            if group_names:
                store = groups_of(stream)
                for name in sorted(group_names):
                    if store.group(name) is None:
                        store.create_group(name, (0, 0), 0)
                store.flush()
        for membership in self.memberships_of(topic):
            membership.set_partition_count(partitions)
        self._changed(topic)
        return list(range(old, partitions))

    def alter_config(self, topic: bytes, pairs: Sequence[tuple[bytes, bytes]]) -> dict[str, Any]:
        """TOPIC ALTER name CONFIG k v ...: validate all, then apply all.

        A value of ``default`` removes the override (the server's default
        applies again). Returns the overrides now in force.
        """
        meta = self._need(topic)
        parsed, resets = self.parse_alter_config(pairs)
        config = dict(meta.config)
        for name in resets:
            config.pop(name, None)
        config.update(parsed)
        meta.config = config
        self.log_manager.write_topic_meta(topic, meta.to_bytes())
        self._remember_fsync(topic)
        cfg = self.log_config_for(topic)
        for (t, _n), stream in self._streams.items():
            if t == topic:
                stream.log.config = cfg
        self._changed(topic)
        return dict(config)

    def describe(self, topic: bytes) -> dict[str, Any]:
        """Partitions (offsets, sizes, entries) and the effective config."""
        meta = self._need(topic)
        return {"partitions": [self.describe_partition(topic, n) for n in range(meta.partitions)],
                "config": self.topic_config(topic)}

    def describe_partition(self, topic: bytes, n: int) -> dict[str, Any]:
        """This node's copy of partition ``n`` of ``topic`` (which exists):
        key, length, offsets, segments, bytes, last ID, idempotent producers."""
        stream = self._stream_for(topic, n)
        plog = stream.log
        return {
            "partition": n,
            "key": partition_key(topic, n),
            "length": stream.length,
            "log-start-offset": plog.log_start_offset,
            "log-end-offset": plog.log_end_offset,
            "segments": plog.segment_count,
            "bytes": plog.size_bytes,
            "last-generated-id": stream.last_id,
            "producers": plog.producers.producer_count(),
        }

    # ------------------------------------------------------------ membership

    def memberships_of(self, topic: bytes) -> list[Any]:
        return [m for (t, _g), m in self.coordinators.items() if t == topic]

    def membership(self, topic: bytes, group: bytes):
        """The membership of ``group`` on multi-partition ``topic`` (created on
        first use: soft state, see ``cluster.membership``)."""
        from cluster.membership import TopicGroupMembership
        from storage.streams.groups import groups_of

        timeout_ms = int(getattr(self.config, "group_session_timeout_ms", 10000) or 10000)
        m = self.coordinators.get((topic, group))
        if m is None:
            m = TopicGroupMembership(
                topic, group, self._meta[topic].partitions, timeout_ms,
                lambda p: groups_of(self._stream_for(topic, p)))
            self.coordinators[(topic, group)] = m
        else:
            m.set_session_timeout(timeout_ms)
        return m

    def drop_membership(self, topic: bytes, group: bytes) -> None:
        self.coordinators.pop((topic, group), None)

    def create_if_missing(self, key: bytes) -> bool:
        """Create the topic a bare key names when ``default-partitions`` > 1
        (XGROUP CREATE ... MKSTREAM then works on every partition); True if
        created. With 1 partition the caller creates the stream as Redis does."""
        topic, partition = self._resolve(key)
        if topic in self._meta or partition is not None or self._partitions_for_new_topic() == 1:
            return False
        self._create(topic, self._partitions_for_new_topic(), {})
        return True

    # ------------------------------------------------------------- keyspace

    def keys(self) -> Iterator[bytes]:
        """Topic names (the keys a Redis client sees), in no particular order;
        in a cluster only those whose name's slot this node leads
        (``key_filter``), as a Redis Cluster node lists only its own keys."""
        if self.key_filter is not None:
            return iter([k for k in self._meta if self.key_filter(k)])
        return iter(list(self._meta))

    def key_count(self) -> int:
        if self.key_filter is not None:
            return sum(1 for k in self._meta if self.key_filter(k))
        return len(self._meta)

    def delete(self, key: bytes) -> bool:
        """Delete a whole topic and its files. A partition key deletes its
        topic; one beyond the topic's partitions names no key (EXISTS 0):
        False, nothing deleted."""
        try:
            topic, _ = self._resolve(key)
        except TopicError:
            return False
        if topic not in self._meta:
            return False
        for cache_key in [k for k in self._streams if k[0] == topic]:
            store = self._streams.pop(cache_key).__dict__.get("group_store")
            if store is not None:  # closed: a flush round that still holds it skips it
                store.abandon()
        for ck in [k for k in self.coordinators if k[0] == topic]:
            del self.coordinators[ck]
        self._fsync_by_dir.pop(str(self.log_manager.topic_dir(topic)), None)
        self.deleted_ids[topic] = self._meta[topic].topic_id  # replication tells the other nodes
        del self._meta[topic]
        self._unwritten.discard(topic)
        self._append_cache.clear()
        self.partitioner.forget(topic)
        self.log_manager.delete_topic(topic)
        self._changed(topic)
        return True

    def flush_all(self) -> int:
        """Delete every topic; returns how many there were."""
        topics = list(self._meta)
        for topic in topics:
            self.delete(topic)
        return len(topics)

    def rename_target(self, src: bytes, dst: bytes) -> tuple[bytes, bytes]:
        """``(topic, new name)`` for RENAME ``src`` ``dst`` of an existing
        key: a whole topic (``t#0`` of a one-partition topic is ``t``) to a
        name that is not a partition's. Raises TopicError (RENAME_PARTITION,
        RENAME_TO_PARTITION, BAD_PARTITION_KEY)."""
        topic, partition = self._resolve(src)
        partitions = self._meta[topic].partitions
        if partition is not None and partitions > 1:
            raise TopicError(RENAME_PARTITION, key=src, topic=topic, partitions=partitions)
        if split_partition_key(dst)[1] is not None:
            raise TopicError(RENAME_TO_PARTITION, key=dst)
        return topic, dst

    def rename(self, topic: bytes, dst: bytes) -> None:
        """RENAME: existing ``topic`` (a name ``rename_target`` gave), its
        partitions, groups and config, becomes ``dst``; a topic ``dst``
        there was is deleted. Atomic on disk (``LogManager.rename_topic``).
        The topic keeps its topic ID: a follower that holds it under the
        old name renames its copy when it learns the new one
        (``adopt_topic``). Membership (soft state) starts anew."""
        assert topic in self._meta and topic != dst and split_partition_key(dst)[1] is None
        self._rename(topic, dst, self._meta[topic])

    def _rename(self, topic: bytes, dst: bytes, meta: TopicMeta) -> None:
        """``rename``, also of a follower's copy (``_adopt``). Replication
        tells the other nodes (``_changed``) in this order: the old ``dst``
        is gone, ``dst`` is this topic (its ID: a copy of it is renamed),
        ``topic`` is gone (a copy still there is deleted)."""
        replaced = self._meta.get(dst)
        for (t, n) in [k for k in self._streams if k[0] in (topic, dst)]:
            store = self._streams.pop((t, n)).__dict__.get("group_store")
            if store is not None:
                if t == topic:
                    store.close()  # journal flushed: the files move with the directory
                else:
                    store.abandon()  # (deleted: a flush round that still holds it skips it)
        for ck in [k for k in self.coordinators if k[0] in (topic, dst)]:
            del self.coordinators[ck]
        for name in (topic, dst):
            self._fsync_by_dir.pop(str(self.log_manager.topic_dir(name)), None)
            self._unwritten.discard(name)
            self.partitioner.forget(name)
        self._append_cache.clear()
        self.log_manager.rename_topic(topic, dst, meta.to_bytes())
        del self._meta[topic]
        if replaced is not None:
            del self._meta[dst]
            self.deleted_ids[dst] = replaced.topic_id
            self._changed(dst)  # (the old dst's deletion)
        self._meta[dst] = meta
        self._remember_fsync(dst)
        self._changed(dst)
        self.deleted_ids[topic] = meta.topic_id
        self._changed(topic)

    # ------------------------------------------------------------ retention

    def apply_retention(self, now_ms: int) -> list[RetentionAction]:
        """One retention pass over every partition of every topic with a limit.

        Time-rolls idle active segments (``segment-ms``) so old data becomes
        deletable, then deletes whole old segments by ``retention-ms`` /
        ``retention-bytes``. Each deleted segment is logged and returned.
        Partitions of topics without a retention limit are not opened.
        """
        actions: list[RetentionAction] = []
        for topic, n in self.retention_targets():
            actions.extend(self.retain_partition(topic, n, now_ms))
        return actions

    def retention_targets(self) -> list[tuple[bytes, int]]:
        """``(topic, partition)`` of every partition whose topic has a retention
        limit (the server's task calls ``retain_partition`` for each, yielding
        to other tasks in between)."""
        self.refresh_log_configs()
        out = []
        for topic, meta in self._meta.items():
            cfg = self.log_config_for(topic)
            if cfg.retention_ms >= 0 or cfg.retention_bytes >= 0:
                out.extend((topic, n) for n in range(meta.partitions))
        return out

    def retain_partition(self, topic: bytes, n: int, now_ms: int) -> list[RetentionAction]:
        """Retention on one partition (a no-op if the topic or partition is gone)."""
        meta = self._meta.get(topic)
        if meta is None or n >= meta.partitions:
            return []
        stream = self._stream_for(topic, n)
        plog = stream.log
        if plog.config.retention_ms >= 0:
            plog.maybe_roll(now_ms)
        before = plog.segments()
        removed = plog.apply_retention(now_ms)  # the log keeps its last ID: XADD stays monotonic
        if not removed:
            return []
        after = {s.base_offset for s in plog.segments()}
        out = []
        for seg in before:
            if seg.base_offset in after:
                continue
            action = RetentionAction(topic, n, seg.base_offset, seg.end_offset, seg.size_bytes)
            out.append(action)
            self.stats.retention_segments_deleted += 1
            self.stats.retention_bytes_deleted += seg.size_bytes
            log.info("Retention: deleted segment %020d of %s#%d (offsets %d..%d, %d bytes); "
                     "log start offset now %d", seg.base_offset, _text(topic), n,
                     seg.base_offset, seg.end_offset - 1, seg.size_bytes, plog.log_start_offset)
        return out

    # --------------------------------------------------------------- stats

    def note_entries_in(self, n: int) -> None:
        self.stats.entries_in += n

    def note_entries_out(self, n: int) -> None:
        self.stats.entries_out += n

    def bytes_on_disk(self) -> int:
        """Bytes of every partition's segments (open logs counted in memory,
        the others from the file sizes)."""
        total = 0
        for topic, meta in self._meta.items():
            for n in range(meta.partitions):
                stream = self._streams.get((topic, n))
                if stream is not None:
                    total += stream.log.size_bytes
                    continue
                d = self.log_manager.topic_dir(topic) / f"partition-{n}"
                try:
                    with os.scandir(d) as it:
                        total += sum(e.stat().st_size for e in it if e.name.endswith(".log"))
                except OSError:
                    pass
        return total

    def partition_total(self) -> int:
        return sum(m.partitions for m in self._meta.values())


def _check_partitions(partitions: int) -> None:
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise TopicError(BAD_PARTITION_COUNT, partitions=partitions, maximum=MAX_PARTITIONS)


def partition_dir(log: Any) -> Path:
    """The directory of a partition log (where its stream metadata file lives)."""
    for name in ("directory", "dir", "path"):
        value = getattr(log, name, None)
        if value is not None:
            return Path(value)
    raise AttributeError("PartitionLog exposes no directory")
