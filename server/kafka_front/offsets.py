"""Kafka groups' committed offsets for the front-end: the journal (``storage.group_offsets``) on trio.

Owns: ``OffsetStore``, which opens the node's ``OffsetJournal`` on first use
(a server with the Kafka port off never touches the file), answers reads
from memory and makes commits and deletions durable off the event loop
(``trio.to_thread``), one at a time (a lock keeps the journal's lines in
the order the requests were answered). docs/kafka.md "Committed offsets".

Must not know: the group protocol (``groups``), the wire format, the file format.
"""

from __future__ import annotations

import os
import time

import trio

from storage.group_offsets import FILE_NAME, Committed, OffsetJournal

__all__ = ["OffsetStore", "Committed", "FILE_NAME"]


class OffsetStore:
    """The committed offsets of the groups this node coordinates."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = directory
        self._journal: OffsetJournal | None = None
        self._lock = trio.Lock()

    @property
    def journal(self) -> OffsetJournal:
        if self._journal is None:
            self._journal = OffsetJournal(self.directory)
        return self._journal

    # -- reading --------------------------------------------------------------------

    def has_group(self, group: str) -> bool:
        return group in self.journal.offsets

    def group_ids(self) -> list[str]:
        return list(self.journal.offsets)

    def of_group(self, group: str) -> dict[tuple[str, int], Committed]:
        return dict(self.journal.offsets.get(group, {}))

    def get(self, group: str, topic: str, partition: int) -> Committed | None:
        return self.journal.offsets.get(group, {}).get((topic, partition))

    # -- writing (durable when they return) ------------------------------------------------

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
        if not records:
            return
        journal = self.journal
        async with self._lock:
            await trio.to_thread.run_sync(journal.write, records)
            journal.apply(records)
            if journal.compaction_due():
                await trio.to_thread.run_sync(journal.compact)
