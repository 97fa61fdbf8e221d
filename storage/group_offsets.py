"""Kafka groups' committed offsets on this node's disk: Partita's ``__consumer_offsets``, as a journal.

Owns: ``OffsetJournal``, the committed offset (leader epoch, metadata,
commit time) of every (group, topic, partition), kept in
``<dir>/kafka-offsets.jsonl``, one JSON object a line:

- ``{"g": group, "t": topic, "p": partition, "o": offset, "e": epoch, "m": metadata, "ts": ms}``: a commit;
- ``{"g": group, "t": topic, "p": partition, "o": null}``: the offset deleted (OffsetDelete);
- ``{"g": group, "del": true}``: the group deleted (DeleteGroups).

``write`` appends records and fsyncs before returning (the file's directory
too when it creates the file): a committed offset survives kill -9;
``apply`` then changes ``offsets``.
Opening replays the journal (a torn last line, from a crash mid-write, is
skipped with a warning) and, like Kafka's log cleaner compacting
``__consumer_offsets``, the journal is rewritten with only the live
offsets (``checkpoint.write_atomic``) once it holds more than twice as many
lines as live offsets (and at least ``COMPACT_MIN_LINES``).

Synchronous (the front-end runs ``write`` and ``compact`` off its event loop, one at a time).

Must not know: the group protocol, the wire format, trio.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import NamedTuple

from storage.checkpoint import fsync_dir, write_all, write_atomic
from storage.errors import raise_storage_error

log = logging.getLogger("partita.storage")

FILE_NAME = "kafka-offsets.jsonl"
COMPACT_MIN_LINES = 10000


class Committed(NamedTuple):
    offset: int
    leader_epoch: int
    metadata: str
    commit_ms: int


class OffsetJournal:
    """The committed offsets and their journal (module docstring)."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.path = Path(directory) / FILE_NAME
        self.offsets: dict[str, dict[tuple[str, int], Committed]] = {}
        self._lines = 0
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise_storage_error(f"read {self.path}", exc)
        for line in data.splitlines():
            try:
                self._apply(json.loads(line))
            except (ValueError, KeyError, TypeError):
                log.warning("%s: skipping an unreadable line (a write cut short by a crash)", self.path)
                continue
            self._lines += 1
        if self.compaction_due():
            self.compact()

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

    def write(self, records: list[dict]) -> None:
        """Make ``records`` (the shapes above) durable; ``apply`` them next. Touches no state but
        the file: a thread may run it while readers look at ``offsets``."""
        data = b"".join(json.dumps(r, separators=(",", ":")).encode() + b"\n" for r in records)
        new = not self.path.exists()
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                write_all(fd, data)
            finally:
                os.close(fd)
        except OSError as exc:
            raise_storage_error(f"append to {self.path}", exc)
        if new:
            fsync_dir(self.path.parent)

    def apply(self, records: list[dict]) -> None:
        """Apply records ``write`` made durable."""
        for r in records:
            self._apply(r)
        self._lines += len(records)

    def compaction_due(self) -> bool:
        live = sum(len(v) for v in self.offsets.values())
        return self._lines > COMPACT_MIN_LINES and self._lines > 2 * live

    def compact(self) -> None:
        """Rewrite the journal with the live offsets only (reads ``offsets``: no writer meanwhile)."""
        lines = [json.dumps({"g": g, "t": t, "p": p, "o": c.offset, "e": c.leader_epoch, "m": c.metadata,
                             "ts": c.commit_ms}, separators=(",", ":"))
                 for g, parts in self.offsets.items() for (t, p), c in parts.items()]
        write_atomic(self.path, "".join(line + "\n" for line in lines).encode())
        self._lines = len(lines)
