"""Kafka groups' committed offsets for the front-end: one replicated stream per group.

Owns: ``OffsetStore``. The offsets group G commits are entries of the
internal stream ``__kafka_offsets{G}`` (``offsets_key``; the entries are
``storage.group_offsets``'s), appended through the broker's append path
like any XADD: its hash tag puts it in G's slot, so the node leading that
slot (G's coordinator, ``KafkaFront.coordinator_of``) leads the stream, and
the slot's followers copy it. A write returns once appended; the response
waits for the session's receipt (``group_checks.answer_when_written``):
fsynced, the stream's topic being ``fsync always``, and held by the
in-sync replicas, its ``acks`` being ``all``. The node that becomes G's
coordinator after a failover replays the stream it followed.

Reads replay lazily: each group's ``GroupOffsets`` is brought up to the
stream's end on every look, from the entry after the last one applied (from
the start when that entry is gone: the stream trimmed past it or truncated
under it, or the topic made anew; after a trim the start is a snapshot).
The end is the log's, past the high watermark, as Kafka's coordinator
loads ``__consumer_offsets``: a new leader's high watermark waits for its
followers (or for the old leader to leave the in-sync replicas), while
every entry it holds was acknowledged or will be. Every
``COMPACT_MIN_ENTRIES`` entries a write appends a snapshot of the group's
live offsets and trims the stream up to the previous snapshot (written,
and acknowledged, by an earlier write).

Upgrade: the journal of older versions (``<dir>/kafka-offsets.jsonl``) is
read on first use; a group with offsets there and no stream yet is
answered from it, and its first write starts the stream with a snapshot of
them. docs/kafka.md "Committed offsets".

Must not know: the group protocol (``groups``), the wire format, the entry format.
"""

from __future__ import annotations

import os
import time
from typing import Any

from cluster.broker import Trim, XAddPlan
from cluster.topics import OFFSETS_PREFIX
from storage import group_offsets as F
from storage.entry_codec import decode_entry, split_entries
from storage.group_offsets import Committed
from storage.streams.ids import MAX_ID, MIN_ID, StreamId

__all__ = ["OffsetStore", "Committed", "offsets_key", "is_offsets_key"]

PREFIX = OFFSETS_PREFIX
# The internal topic's settings: every commit fsynced and on the in-sync replicas before
# its answer, nothing removed but by the store's own trims, room for a large snapshot.
TOPIC_CONFIG = ((b"fsync", b"always"), (b"acks", b"all"), (b"retention-ms", b"-1"),
                (b"retention-bytes", b"-1"), (b"max-entry-bytes", b"16777216"))


def offsets_key(group: str) -> bytes:
    """The stream of ``group``'s committed offsets (its coordinator is the leader of this key's slot)."""
    return PREFIX + group.encode("utf-8", "surrogateescape") + b"}"


def is_offsets_key(key: bytes) -> bool:
    return key.startswith(PREFIX) and key.endswith(b"}")


class OffsetStore:
    """The committed offsets of the groups this node coordinates (module docstring)."""

    def __init__(self, server: Any, directory: str | os.PathLike | None) -> None:
        self.server = server
        self.directory = directory
        self._session: Any = None
        self._legacy: dict[str, F.Offsets] | None = None
        self._groups: dict[str, tuple[str, F.GroupOffsets]] = {}  # group -> (topic id, replay)

    @property
    def session(self) -> Any:
        """The store's own broker session, for its reads."""
        if self._session is None:
            self._session = self.server.broker.session()
        return self._session

    @property
    def legacy(self) -> dict[str, F.Offsets]:
        if self._legacy is None:
            self._legacy = F.read_journal(self.directory) if self.directory else {}
        return self._legacy

    # -- reading --------------------------------------------------------------------

    def _replay(self, group: str) -> F.GroupOffsets | None:
        """``group``'s offsets as its stream holds them now (None: no stream)."""
        session = self.session
        key = offsets_key(group)
        layout = session.record_topics([key]).get(key)
        if layout is None:
            self._groups.pop(group, None)
            return None
        known = self._groups.get(group)
        state = known[1] if known is not None and known[0] == layout.topic_id else None
        if state is not None and state.applied is not None:
            last = session.range(key, state.applied, state.applied, 1, past_hw=True)
            if last is None or not last.count:
                state = None  # trimmed past, truncated, or deleted: from the start
        if state is None:
            state = F.GroupOffsets(group)
            self._groups[group] = (layout.topic_id, state)
        start = MIN_ID if state.applied is None else state.applied.incr()
        found = session.range(key, start, MAX_ID, past_hw=True)
        if found is not None and found.count:
            for encoded in split_entries(found.chunks):
                entry_id, fields = decode_entry(encoded)
                state.apply(StreamId(*entry_id), fields)
        return state

    def _offsets(self, group: str) -> F.Offsets:
        state = self._replay(group)
        return state.offsets if state is not None else self.legacy.get(group, {})

    def has_group(self, group: str) -> bool:
        return bool(self._offsets(group))

    def group_ids(self) -> list[str]:
        """Groups with offsets whose stream this node leads (and those of the old journal)."""
        session = self.session
        names = {key[len(PREFIX):-1].decode("utf-8", "surrogateescape")
                 for key in session.key_names() if is_offsets_key(key)}
        names.update(g for g in self.legacy if session.key_leader(offsets_key(g)) == session.node_id())
        return [g for g in names if self.has_group(g)]

    def of_group(self, group: str) -> dict[tuple[str, int], Committed]:
        return dict(self._offsets(group))

    def get(self, group: str, topic: str, partition: int) -> Committed | None:
        return self._offsets(group).get((topic, partition))

    # -- writing: appended when they return; the request's receipt says when durable -------------

    def commit(self, session: Any, group: str, offsets: list[tuple[str, int, int, int, str]]) -> None:
        """Append ``(topic, partition, offset, leader epoch, metadata)`` of ``group`` with ``session``."""
        self._write(session, group, F.commit_fields(offsets, int(time.time() * 1000)))

    def delete_offsets(self, session: Any, group: str, partitions: list[tuple[str, int]]) -> None:
        if partitions:
            self._write(session, group, F.delete_fields(partitions))

    def delete_group(self, session: Any, group: str) -> None:
        if self.has_group(group):
            self._write(session, group, F.drop_fields())

    def _write(self, session: Any, group: str, fields: list[bytes]) -> None:
        """Append ``fields`` to ``group``'s stream (made with the internal topic's settings, from the
        old journal's offsets if it has some); then a snapshot and a trim when due. Raises the
        broker's refusal (``write_error``), nothing written."""
        key = offsets_key(group)
        state = self._replay(group)
        if state is None:
            session.create_topic(key, 1, TOPIC_CONFIG)
            old = self.legacy.get(group)
            if old:
                session.append(XAddPlan(key, F.snapshot_fields(old)))
        session.append(XAddPlan(key, fields))
        state = self._replay(group)
        assert state is not None
        if state.compaction_due():
            if state.snapshot_id is not None:  # acknowledged with an earlier write: below the high watermark
                removed = session.trim(key, Trim("MINID", minid=state.snapshot_id))
                if removed.__class__ is not int:  # (it would wait for the replicas: next time)
                    removed.close()
            session.append(XAddPlan(key, F.snapshot_fields(state.offsets)))
