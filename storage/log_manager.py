"""The data directory: which topics and partitions exist and where their files are.

Owns: the directory layout and the topic-name encoding

    <data_dir>/topics/t.<escaped key>/          a topic (short keys)
    <data_dir>/topics/h.<sha256 hex>/           a topic whose escaped key is long;
                                                 its key is in ``topic.key``
    <data_dir>/topics/<topic dir>/topic.meta    opaque blob of the cluster layer
    <data_dir>/topics/<topic dir>/partition-<n>/  one PartitionLog each
    <data_dir>/trash/                           topics being deleted (emptied at start)
    <data_dir>/rename.intent                    a topic rename in progress (finished at start)
    <data_dir>/producer-ids                     Kafka producer ids reserved (storage.producers)

Escaping keeps ``[a-z0-9_-]`` and writes every other byte as ``%XX``
(upper-case hex), so names are reversible, binary-safe and never collide on
case-insensitive file systems.

Partitions open lazily (``partition()``), and all of them share one bounded
``FileCache``, so a data dir with thousands of partitions opens in time
proportional to the number of topics listed, not the number of segments, and
holds at most ``max_open_files`` descriptors.

A topic is renamed (``rename_topic``) by renaming its directory, after
writing the intent (old name, new name, the new ``topic.meta``) to
``rename.intent`` (tmp + fsync + rename). The steps after it (the
destination's old directory to ``trash/``, the directory rename, the new
``topic.key`` and ``topic.meta``, each made durable by an fsync of its
directory, then the intent removed) are the ones start-up repeats when it
finds the intent (``_finish_rename``), each doing nothing when already
done: a crash at any point leaves the topic under its old name (before the
intent is on disk) or under its new one, never both or neither.

Thread contract: main thread only (flush tickets of the logs excepted).

Must not know: streams, groups, RESP, trio.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

from storage.checkpoint import fsync_dir, parse_json, read_file, write_atomic
from storage.errors import StorageError, raise_storage_error
from storage.handles import FileCache
from storage.log import LogConfig, PartitionLog, wall_clock_ms
from storage.salvage import keep_aside

TOPICS_DIR = "topics"
TRASH_DIR = "trash"
PRODUCER_IDS_FILE = "producer-ids"
META_FILE = "topic.meta"
KEY_FILE = "topic.key"
PARTITION_PREFIX = "partition-"
RENAME_INTENT = "rename.intent"
MAX_ESCAPED_NAME = 200
_SAFE = frozenset(b"abcdefghijklmnopqrstuvwxyz0123456789_-")
# Called with each step's name as ``rename_topic`` (or start-up finishing
# one) reaches it: "begin" (the logs are closed, nothing renamed yet),
# "intent" (the intent is on disk), "aside" (the old destination is in
# trash/), "moved" (the directory has its new name), "named" (its
# topic.key and topic.meta are written), "done" (the intent is removed).
# Only tests set it (tests/crashing_rename.py stops the process there, as a
# crash would).
rename_step_hook: Callable[[str], None] | None = None


def _step(name: str) -> None:
    if rename_step_hook is not None:
        rename_step_hook(name)


def encode_topic(topic: bytes) -> str:
    """Directory name for ``topic`` (``t.<escaped>`` or ``h.<sha256>``)."""
    escaped = "".join(chr(b) if b in _SAFE else f"%{b:02X}" for b in topic)
    if len(escaped) <= MAX_ESCAPED_NAME:
        return "t." + escaped
    return "h." + hashlib.sha256(topic).hexdigest()


def decode_topic(name: str) -> bytes | None:
    """The key of a ``t.`` directory name; None for other names, and for
    names ``encode_topic`` never makes (a bad escape, an unescaped byte)."""
    if not name.startswith("t."):
        return None
    s = name[2:]
    out = bytearray()
    i = 0
    try:
        while i < len(s):
            if s[i] == "%":
                out.append(int(s[i + 1: i + 3], 16))
                i += 3
            else:
                out.append(ord(s[i]))
                i += 1
    except ValueError:  # not hex, or a character above 255
        return None
    key = bytes(out)
    return key if encode_topic(key) == name else None


class LogManager:
    """See the module docstring and docs/storage-api.md."""

    def __init__(self, data_dir: Path, *, default_config: LogConfig | None = None,
                 logger: logging.Logger | None = None,
                 clock_ms: Callable[[], int] = wall_clock_ms,
                 max_open_files: int = 1000) -> None:
        self.data_dir = Path(data_dir)
        self.default_config = default_config or LogConfig()
        self.logger = logger or logging.getLogger("partita.storage")
        self.clock_ms = clock_ms
        self.cache = FileCache(max_open_files)
        self._logs: dict[tuple[bytes, int], PartitionLog] = {}
        self._topics_dir = self.data_dir / TOPICS_DIR
        trash = self.data_dir / TRASH_DIR
        try:
            self._topics_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise_storage_error(f"prepare {self.data_dir}", exc)
        self._finish_rename()
        try:
            if trash.exists():
                shutil.rmtree(trash)
        except OSError as exc:
            raise_storage_error(f"prepare {self.data_dir}", exc)

    # -- topics --------------------------------------------------------------

    @property
    def producer_ids_path(self) -> Path:
        """Where the Kafka producer ids this node reserved are recorded."""
        return self.data_dir / PRODUCER_IDS_FILE

    def topic_dir(self, topic: bytes) -> Path:
        return self._topics_dir / encode_topic(topic)

    def topics(self) -> list[bytes]:
        """Topic keys found on disk, sorted. An entry of ``topics/`` that is
        not a topic directory (a file, a name no key is written as, an
        ``h.`` directory without its ``topic.key``) is left as it is and
        skipped, with a WARNING naming it."""
        out = []
        try:
            names = os.listdir(self._topics_dir)
        except OSError as exc:
            raise_storage_error(f"list {self._topics_dir}", exc)
        for name in names:
            path = self._topics_dir / name
            key = decode_topic(name)
            why = None if key is not None else "not a topic directory name"
            if name.startswith("h."):
                key = read_file(path / KEY_FILE) if path.is_dir() else None
                why = ("no readable topic.key" if key is None
                       else None if encode_topic(key) == name else "topic.key does not match the name")
            if why is None and not path.is_dir():
                why = "not a directory"
            if why is not None:
                self.logger.warning("%s: %s: skipped", path, why)
                continue
            out.append(key)
        return sorted(out)

    def _ensure_topic_dir(self, topic: bytes) -> Path:
        d = self.topic_dir(topic)
        if not d.is_dir():
            try:
                d.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise_storage_error(f"create {d}", exc)
            if d.name.startswith("h."):
                write_atomic(d / KEY_FILE, topic)
            fsync_dir(self._topics_dir)
        return d

    def read_topic_meta(self, topic: bytes) -> bytes | None:
        return read_file(self.topic_dir(topic) / META_FILE)

    def write_topic_meta(self, topic: bytes, blob: bytes) -> None:
        write_atomic(self._ensure_topic_dir(topic) / META_FILE, blob)

    def partitions_on_disk(self, topic: bytes) -> list[int]:
        """Partition numbers that have a directory (opened or not). Another
        ``partition-*`` entry (a file, ``partition-x``, ``partition-07``)
        is left as it is and skipped, with a WARNING naming it."""
        d = self.topic_dir(topic)
        try:
            names = os.listdir(d)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise_storage_error(f"list {d}", exc)
        out = []
        for name in names:
            if not name.startswith(PARTITION_PREFIX):
                continue
            digits = name[len(PARTITION_PREFIX):]
            if not (digits.isascii() and digits.isdigit() and str(int(digits)) == digits):
                why = "not a partition directory name"
            elif not (d / name).is_dir():
                why = "not a directory"
            else:
                out.append(int(digits))
                continue
            self.logger.warning("%s: %s: skipped", d / name, why)
        return sorted(out)

    # -- partitions ----------------------------------------------------------

    def partition(self, topic: bytes, n: int, config: LogConfig | None = None) -> PartitionLog:
        """The log of ``topic#n``: cached, opened (and recovered) on first use,
        created if missing."""
        key = (topic, n)
        log = self._logs.get(key)
        if log is None:
            d = self._ensure_topic_dir(topic) / f"{PARTITION_PREFIX}{n}"
            log = PartitionLog.open(d, config or self.default_config, logger=self.logger,
                                    clock_ms=self.clock_ms, file_cache=self.cache)
            self._logs[key] = log
        return log

    def open_partitions(self) -> list[PartitionLog]:
        return list(self._logs.values())

    def delete_topic(self, topic: bytes) -> None:
        """Close the topic's logs and remove its files (a crash halfway leaves
        it in ``trash/``, emptied at the next start)."""
        for key in [k for k in self._logs if k[0] == topic]:
            self._logs.pop(key).abandon()
        d = self.topic_dir(topic)
        if not d.exists():
            return
        trash = self.data_dir / TRASH_DIR
        try:
            trash.mkdir(exist_ok=True)
            target = trash / uuid.uuid4().hex
            os.rename(d, target)
        except OSError as exc:
            raise_storage_error(f"delete topic dir {d}", exc)
        fsync_dir(self._topics_dir)
        self.cache.close_under(str(d))
        try:
            shutil.rmtree(target)
        except OSError as exc:
            raise_storage_error(f"remove {target}", exc)

    def rename_topic(self, src: bytes, dst: bytes, meta: bytes) -> None:
        """Give topic ``src`` (its partitions and everything in their
        directories: segments, stream metadata, consumer groups) the name
        ``dst``, whose ``topic.meta`` becomes ``meta``; a topic ``dst``
        there was is deleted. Atomic across crashes (the module docstring).
        Open logs of ``src`` are closed (flushed) and those of ``dst``
        dropped first; the caller closes what it holds in them (group
        stores) and opens the partitions again under the new name.

        Raises:
            StorageError: a disk error; up to the intent's fsync nothing
            changed, after it the next start finishes the rename.
        """
        assert src != dst and self.topic_dir(src).is_dir()
        for key in [k for k in self._logs if k[0] in (src, dst)]:
            log = self._logs.pop(key)
            if key[0] == src:
                log.close()
            else:
                log.abandon()
        self.cache.close_under(str(self.topic_dir(src)))
        self.cache.close_under(str(self.topic_dir(dst)))
        _step("begin")
        intent = {"from": src.hex(), "to": dst.hex(), "meta": meta.hex()}
        write_atomic(self.data_dir / RENAME_INTENT, json.dumps(intent).encode())
        _step("intent")
        self._rename_steps(src, dst, meta)

    def _rename_steps(self, src: bytes, dst: bytes, meta: bytes) -> None:
        """The steps after the intent, each skipped when done already."""
        old, new = self.topic_dir(src), self.topic_dir(dst)
        aside = None
        try:
            if old.is_dir():
                if new.exists():
                    (self.data_dir / TRASH_DIR).mkdir(exist_ok=True)
                    aside = self.data_dir / TRASH_DIR / uuid.uuid4().hex
                    os.rename(new, aside)
                    fsync_dir(self._topics_dir)
                    _step("aside")
                os.rename(old, new)
                fsync_dir(self._topics_dir)
                _step("moved")
            key_file = new / KEY_FILE
            if new.name.startswith("h."):
                write_atomic(key_file, dst)
            elif key_file.exists():  # (the old name's: a long name renamed to a short one)
                key_file.unlink()
                fsync_dir(new)
            write_atomic(new / META_FILE, meta)
            _step("named")
            (self.data_dir / RENAME_INTENT).unlink()
            fsync_dir(self.data_dir)
            _step("done")
        except OSError as exc:
            raise_storage_error(f"rename topic dir {old} to {new}", exc)
        if aside is not None:
            shutil.rmtree(aside, ignore_errors=True)  # (else emptied at the next start)

    def _finish_rename(self) -> None:
        """At start: finish a rename a crash interrupted after its intent
        was written (``rename_topic``)."""
        path = self.data_dir / RENAME_INTENT
        blob = read_file(path)
        if blob is None:
            return
        try:
            intent = parse_json(blob)
            src, dst, meta = (bytes.fromhex(intent[k]) for k in ("from", "to", "meta"))
        except (ValueError, KeyError, TypeError) as exc:
            aside = keep_aside(path)
            path.unlink()
            self.logger.warning("%s is unreadable (%s): no topic renamed (the file is kept as %s)",
                                path, exc, aside)
            return
        if not (self.topic_dir(src).is_dir() or self.topic_dir(dst).is_dir()):
            self.logger.warning("%s: neither topic '%s' nor '%s' exists: nothing to rename", path,
                                src.decode("utf-8", "replace"), dst.decode("utf-8", "replace"))
            path.unlink()
            fsync_dir(self.data_dir)
            return
        self.logger.warning("finishing the rename of topic '%s' to '%s' a stop interrupted",
                            src.decode("utf-8", "replace"), dst.decode("utf-8", "replace"))
        self._rename_steps(src, dst, meta)

    def close(self) -> None:
        """Flush and close every open log (clean-shutdown checkpoints). A log
        that fails to close does not keep the others open: the first error is
        raised once every log was tried."""
        first: StorageError | None = None
        for log in self._logs.values():
            try:
                log.close()
            except StorageError as exc:
                first = first or exc
        self._logs.clear()
        self.cache.close_all()
        if first is not None:
            raise first
