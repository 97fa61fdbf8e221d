"""Kafka groups' committed offsets as entries of a stream: Partita's ``__consumer_offsets``.

Owns: the entries one group's offsets stream holds (``commit_fields``,
``delete_fields``, ``drop_fields``, ``snapshot_fields``) and their replay
(``GroupOffsets``): the committed offset (leader epoch, metadata, commit
time) of each (topic, partition) of the group, the latest entry winning.
Each entry has two fields, the kind and a JSON payload:

- ``commit`` ``[[topic, partition, offset, epoch, metadata, ms], ...]``: offsets committed;
- ``delete`` ``[[topic, partition], ...]``: offsets deleted (OffsetDelete);
- ``drop`` ``[]``: the group deleted (DeleteGroups): every offset gone;
- ``snapshot`` (a commit's payload): every live offset, replacing what came
  before it, so the stream may be trimmed up to it (``compaction_due``):
  Partita's log does not compact, so the group's stream is rewritten as one
  entry once it grew ``COMPACT_MIN_ENTRIES`` entries past its last snapshot.

An entry that cannot be read (written there by hand) is skipped with a
warning, as Kafka skips an unknown record in ``__consumer_offsets``.

Also ``read_journal``: the offsets of the journal ``<dir>/kafka-offsets.jsonl``
older versions kept (one JSON object a line: a commit ``{"g", "t", "p", "o",
"e", "m", "ts"}``, a deletion ``"o": null``, a deleted group ``"del": true``),
read once so that an upgraded node still has them; nothing writes it now.

Must not know: the group protocol, the wire format, the broker, trio.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, NamedTuple, Sequence

from storage.checkpoint import parse_json
from storage.errors import raise_storage_error

log = logging.getLogger("partita.storage")

FILE_NAME = "kafka-offsets.jsonl"  # the journal of older versions
COMPACT_MIN_ENTRIES = 1000

COMMIT = b"commit"
DELETE = b"delete"
DROP = b"drop"
SNAPSHOT = b"snapshot"


class Committed(NamedTuple):
    offset: int
    leader_epoch: int
    metadata: str
    commit_ms: int


Offsets = dict[tuple[str, int], Committed]


def _dump(payload: Any) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()


def commit_fields(offsets: Sequence[tuple[str, int, int, int, str]], now_ms: int) -> list[bytes]:
    """The entry committing ``(topic, partition, offset, leader epoch, metadata)``s."""
    return [COMMIT, _dump([[t, p, o, e, m, now_ms] for t, p, o, e, m in offsets])]


def delete_fields(partitions: Sequence[tuple[str, int]]) -> list[bytes]:
    return [DELETE, _dump([[t, p] for t, p in partitions])]


def drop_fields() -> list[bytes]:
    return [DROP, b"[]"]


def snapshot_fields(offsets: Offsets) -> list[bytes]:
    """The entry holding every live offset of ``offsets`` (what a replay of the stream up to it gives)."""
    return [SNAPSHOT, _dump([[t, p, c.offset, c.leader_epoch, c.metadata, c.commit_ms]
                             for (t, p), c in sorted(offsets.items())])]


class GroupOffsets:
    """One group's offsets, replayed from its stream's entries (module docstring).

    ``applied``: the ID of the last entry applied (None: none yet);
    ``snapshot_id``: the ID of the last snapshot entry; ``since_snapshot``:
    entries applied after it (all of them, without one)."""

    def __init__(self, name: str = "") -> None:
        self.name = name  # for the warnings
        self.offsets: Offsets = {}
        self.applied: Any = None
        self.snapshot_id: Any = None
        self.since_snapshot = 0

    def apply(self, entry_id: Any, fields: Sequence[bytes]) -> None:
        """Apply the entry ``entry_id`` with ``fields`` (in stream order)."""
        self.applied = entry_id
        try:
            kind, payload = fields
            rows = parse_json(payload)
            if type(rows) is not list or any(type(row) is not list for row in rows):
                raise ValueError("not a list of rows")  # (a string or object would unpack by character or key)
            if kind in (COMMIT, SNAPSHOT):
                parsed = {(str(t), int(p)): Committed(int(o), int(e), str(m), int(ms)) for t, p, o, e, m, ms in rows}
            elif kind == DELETE:
                gone = [(str(t), int(p)) for t, p in rows]
            elif kind != DROP:
                raise ValueError(f"unknown kind {kind!r}")
        except (ValueError, TypeError) as exc:
            log.warning("Kafka group '%s': skipping an unreadable offsets entry %s (%s)", self.name, entry_id, exc)
            self.since_snapshot += 1
            return
        if kind == SNAPSHOT:
            self.offsets = parsed
            self.snapshot_id = entry_id
            self.since_snapshot = 0
            return
        self.since_snapshot += 1
        if kind == COMMIT:
            self.offsets.update(parsed)
        elif kind == DELETE:
            for key in gone:
                self.offsets.pop(key, None)
        else:
            self.offsets.clear()

    def compaction_due(self, min_entries: int | None = None) -> bool:
        """Whether to write a snapshot (and trim the stream up to the previous one)."""
        return self.since_snapshot > (COMPACT_MIN_ENTRIES if min_entries is None else min_entries)


def read_journal(directory: str | os.PathLike) -> dict[str, Offsets]:
    """The offsets of an older version's journal in ``directory`` ({} without one); a torn
    line (a write cut short by a crash) is skipped with a warning."""
    path = Path(directory) / FILE_NAME
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise_storage_error(f"read {path}", exc)
    out: dict[str, Offsets] = {}
    for line in data.splitlines():
        try:
            rec = parse_json(line)
            group = rec["g"]
            if rec.get("del"):
                out.pop(group, None)
                continue
            key = (rec["t"], int(rec["p"]))
            if rec["o"] is None:
                out.get(group, {}).pop(key, None)
                continue
            out.setdefault(group, {})[key] = Committed(int(rec["o"]), int(rec.get("e", -1)), rec.get("m") or "",
                                                       int(rec.get("ts", 0)))
        except (ValueError, KeyError, TypeError):
            log.warning("%s: skipping an unreadable line (a write cut short by a crash)", path)
    return {g: parts for g, parts in out.items() if parts}
