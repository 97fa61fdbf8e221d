"""The topic registry: the ONE place where a key becomes topic + partition.

Owns: which topics exist, how many partitions each has, their per-topic
metadata blob (stored through ``LogManager.write_topic_meta``), and the
``Stream`` object of each opened partition.

Key grammar: ``<topic>`` names a whole topic; ``<topic>#<n>`` (n decimal, no
leading zeros) names partition n. ``#<digits>`` at the end of a key is
reserved for this and parsed only in ``split_partition_key``.

For now every topic has exactly one partition, so ``<topic>`` and
``<topic>#0`` are the same stream and behave exactly like a Redis stream.
Multi-partition topics (``default-partitions`` > 1, the partitioner) hook in
at ``_partitions_for_new_topic`` and ``_stream_for``.

Topic metadata blob (JSON): ``{"version": 1, "partitions": n, "config": {...}}``.

Must not know: sockets, RESP, the server's errors and replies. Refusals are
``TopicError`` with a Redis-style message (no ``ERR`` code).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from storage.streams.stream import META_FILE_NAME, Stream

if TYPE_CHECKING:
    from storage.log import LogConfig
    from storage.log_manager import LogManager

_PARTITION_SUFFIX = re.compile(rb"#([0-9]+)\Z")

META_VERSION = 1


class TopicError(Exception):
    """A key cannot be resolved or changed; ``message`` is the client's text."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


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
        raise TopicError(
            f"invalid partition key '{key.decode('utf-8', 'replace')}': "
            "'#<digits>' at the end of a key is reserved for '<topic>#<partition>'"
        )
    return topic, int(digits)


def log_config_from(config: Any) -> LogConfig:
    """The storage defaults from the server config (missing names keep LogConfig's)."""
    from storage.log import LogConfig

    names = ("segment_bytes", "segment_ms", "retention_ms", "retention_bytes",
             "index_interval_bytes", "max_batch_bytes")
    values = {n: getattr(config, n) for n in names if getattr(config, n, None) is not None}
    return LogConfig(**values)


class TopicRegistry:
    """Topics in one data directory; streams opened lazily and cached.

    Thread contract: the server's main (trio) thread only.
    """

    def __init__(self, log_manager: LogManager, config: Any = None) -> None:
        self.log_manager = log_manager
        self.config = config
        self._partitions: dict[bytes, int] = {}
        self._streams: dict[tuple[bytes, int], Stream] = {}
        for topic in log_manager.topics():
            self._partitions[topic] = self._read_partition_count(topic)

    @classmethod
    def open(cls, data_dir: Path, config: Any = None) -> TopicRegistry:
        from storage.log_manager import LogManager

        data_dir = Path(data_dir)
        data_dir.mkdir(parents=True, exist_ok=True)
        manager = LogManager(data_dir, default_config=log_config_from(config))
        return cls(manager, config)

    def close(self) -> None:
        self._streams.clear()
        self.log_manager.close()

    # ---------------------------------------------------------------- lookup

    def _read_partition_count(self, topic: bytes) -> int:
        blob = self.log_manager.read_topic_meta(topic)
        if not blob:
            return 1
        return int(json.loads(blob).get("partitions", 1))

    def _partitions_for_new_topic(self) -> int:
        # Hook for the next issue: int(self.config.default_partitions).
        return 1

    def _resolve(self, key: bytes) -> tuple[bytes, int | None]:
        topic, partition = split_partition_key(key)
        count = self._partitions.get(topic)
        if count is not None and partition is not None and partition >= count:
            raise TopicError(
                f"partition {partition} out of range: topic "
                f"'{topic.decode('utf-8', 'replace')}' has {count} partition(s)"
            )
        return topic, partition

    def _stream_for(self, topic: bytes, partition: int | None) -> Stream:
        count = self._partitions[topic]
        if partition is None:
            if count != 1:
                raise TopicError("multi-partition topics are not supported yet")
            partition = 0
        cached = self._streams.get((topic, partition))
        if cached is not None:
            return cached
        log = self.log_manager.partition(topic, partition)
        stream = Stream(log, partition_dir(log) / META_FILE_NAME,
                        node_max_entries=self._node_max_entries())
        self._streams[(topic, partition)] = stream
        return stream

    def _node_max_entries(self) -> int:
        value = getattr(self.config, "stream_node_max_entries", 100)
        return int(value) if value is not None else 100

    def get(self, key: bytes) -> Stream | None:
        """The stream a key names, or None when its topic does not exist."""
        topic, partition = self._resolve(key)
        if topic not in self._partitions:
            return None
        return self._stream_for(topic, partition)

    def get_or_create(self, key: bytes) -> Stream:
        """The stream a key names, creating its topic (XADD without NOMKSTREAM)."""
        topic, partition = self._resolve(key)
        if topic not in self._partitions:
            count = self._partitions_for_new_topic()
            if partition is not None and partition >= count:
                raise TopicError(
                    f"partition {partition} out of range: a new topic has {count} partition(s)"
                )
            meta = {"version": META_VERSION, "partitions": count, "config": {}}
            self.log_manager.write_topic_meta(topic, json.dumps(meta).encode())
            self._partitions[topic] = count
        return self._stream_for(topic, partition)

    def exists(self, key: bytes) -> bool:
        try:
            topic, _ = self._resolve(key)
        except TopicError:
            return False
        return topic in self._partitions

    def streams_of(self, key: bytes) -> list[Stream]:
        """Every partition's stream of the key's topic (all of them for ``<topic>``)."""
        topic, partition = self._resolve(key)
        if topic not in self._partitions:
            return []
        if partition is not None:
            return [self._stream_for(topic, partition)]
        return [self._stream_for(topic, n) for n in range(self._partitions[topic])]

    def partition_count(self, key: bytes) -> int:
        topic, _ = self._resolve(key)
        return self._partitions.get(topic, 0)

    # ------------------------------------------------------------- keyspace

    def keys(self) -> Iterator[bytes]:
        """Topic names (the keys a Redis client sees), in no particular order."""
        return iter(list(self._partitions))

    def key_count(self) -> int:
        return len(self._partitions)

    def delete(self, key: bytes) -> bool:
        """Delete a whole topic and its files. A partition key deletes its topic."""
        try:
            topic, _ = split_partition_key(key)
        except TopicError:
            return False
        if topic not in self._partitions:
            return False
        for cache_key in [k for k in self._streams if k[0] == topic]:
            del self._streams[cache_key]
        del self._partitions[topic]
        self.log_manager.delete_topic(topic)
        return True

    def flush_all(self) -> int:
        """Delete every topic; returns how many there were."""
        topics = list(self._partitions)
        for topic in topics:
            self.delete(topic)
        return len(topics)

    def rename(self, src: bytes, dst: bytes) -> None:
        """Not supported yet: the storage layer has no atomic topic rename.

        Raises:
            TopicError: always (after the caller checked that ``src`` exists).
        """
        raise TopicError("RENAME is not supported for Partita topics (their logs cannot be moved atomically yet)")


def partition_dir(log: Any) -> Path:
    """The directory of a partition log (where its stream metadata file lives)."""
    for name in ("directory", "dir", "path"):
        value = getattr(log, name, None)
        if value is not None:
            return Path(value)
    raise AttributeError("PartitionLog exposes no directory")
