"""Kafka groups' committed offsets, durable on this node: Partita's ``__consumer_offsets``.

Owns: ``OffsetStore``, the committed offset (and leader epoch, metadata,
commit time) of every (group, topic, partition) this node coordinates, kept
in a journal in the data directory (``<dir>/kafka-offsets.jsonl``), one JSON
object a line:

- ``{"g": group, "t": topic, "p": partition, "o": offset, "e": epoch, "m": metadata, "ts": ms}``: a commit;
- ``{"g": group, "t": topic, "p": partition, "o": null}``: OffsetDelete of it;
- ``{"g": group, "del": true}``: DeleteGroups of the group.

A commit's lines are appended and fsynced (off the event loop) before
OffsetCommit answers: a committed offset survives kill -9. Loading replays
the journal (a torn last line, from a crash mid-write, is ignored) and, like
Kafka's log cleaner compacting ``__consumer_offsets``, the journal is
rewritten with only the live offsets (a temporary file renamed over it)
once it holds more than twice as many lines as live offsets (and at least
``COMPACT_MIN_LINES``).

Must not know: the group protocol (``groups``), the wire format.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import NamedTuple

import trio

log = logging.getLogger("partita.kafka")

FILE_NAME = "kafka-offsets.jsonl"
COMPACT_MIN_LINES = 10000


class Committed(NamedTuple):
    offset: int
    leader_epoch: int
    metadata: str
    commit_ms: int


class OffsetStore:
    """The committed offsets (module docstring); ``load`` before use."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.path = Path(directory) / FILE_NAME
        self.offsets: dict[str, dict[tuple[str, int], Committed]] = {}
        self._lines = 0
        self._loaded = False
        self._lock = trio.Lock()

    # -- reading --------------------------------------------------------------------

    def load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        for line in data.splitlines():
            try:
                self._apply(json.loads(line))
            except (ValueError, KeyError, TypeError):
                log.warning("%s: skipping an unreadable line (a write cut short by a crash)", self.path)
                continue
            self._lines += 1
        if self._lines > COMPACT_MIN_LINES and self._lines > 2 * self._live():
            self._compact()

    def _apply(self, rec: dict) -> None:
        group = rec["g"]
        if rec.get("del"):
            self.offsets.pop(group, None)
            return
        key = (rec["t"], int(rec["p"]))
        if rec["o"] is None:
            mine = self.offsets.get(group)
            if mine is not None:
                mine.pop(key, None)
                if not mine:
                    del self.offsets[group]
            return
        self.offsets.setdefault(group, {})[key] = Committed(int(rec["o"]), int(rec.get("e", -1)),
                                                           rec.get("m") or "", int(rec.get("ts", 0)))

    def _live(self) -> int:
        return sum(len(v) for v in self.offsets.values())

    def has_group(self, group: str) -> bool:
        self.load()
        return group in self.offsets

    def group_ids(self) -> list[str]:
        self.load()
        return list(self.offsets)

    def of_group(self, group: str) -> dict[tuple[str, int], Committed]:
        self.load()
        return dict(self.offsets.get(group, {}))

    def get(self, group: str, topic: str, partition: int) -> Committed | None:
        self.load()
        return self.offsets.get(group, {}).get((topic, partition))

    # -- writing ------------------------------------------------------------------------

    async def commit(self, group: str, offsets: list[tuple[str, int, int, int, str]]) -> None:
        """Make ``(topic, partition, offset, leader epoch, metadata)`` durable for ``group``."""
        now_ms = int(time.time() * 1000)
        await self._write([{"g": group, "t": t, "p": p, "o": o, "e": e, "m": m, "ts": now_ms}
                           for t, p, o, e, m in offsets])

    async def delete_offsets(self, group: str, partitions: list[tuple[str, int]]) -> None:
        await self._write([{"g": group, "t": t, "p": p, "o": None} for t, p in partitions])

    async def delete_group(self, group: str) -> None:
        await self._write([{"g": group, "del": True}])

    async def _write(self, records: list[dict]) -> None:
        self.load()
        if not records:
            return
        data = b"".join(json.dumps(r, separators=(",", ":")).encode() + b"\n" for r in records)
        async with self._lock:
            await trio.to_thread.run_sync(self._append, data)
            for r in records:
                self._apply(r)
            self._lines += len(records)
            if self._lines > COMPACT_MIN_LINES and self._lines > 2 * self._live():
                await trio.to_thread.run_sync(self._compact)

    def _append(self, data: bytes) -> None:
        new = not self.path.exists()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        if new:
            _fsync_dir(self.path.parent)

    def _compact(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        lines = [json.dumps({"g": g, "t": t, "p": p, "o": c.offset, "e": c.leader_epoch, "m": c.metadata,
                             "ts": c.commit_ms}, separators=(",", ":"))
                 for g, parts in self.offsets.items() for (t, p), c in parts.items()]
        with open(tmp, "wb") as f:
            f.write("".join(line + "\n" for line in lines).encode())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        _fsync_dir(self.path.parent)
        self._lines = len(lines)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
