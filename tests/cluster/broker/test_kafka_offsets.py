"""Kafka groups' committed offsets kept in the broker's streams (server/kafka_front/offsets.py over a
real broker): replayed by a store that never saw them (a new coordinator), a snapshot and a trim
every so many entries, deletions, and the journal of older versions read for an upgrade."""

from __future__ import annotations

import json
import types

from server.kafka_front.offsets import OffsetStore, offsets_key
from storage import group_offsets


def _offsets(store: OffsetStore, group: str) -> dict:
    return {k: c.offset for k, c in store.of_group(group).items()}


def test_offsets_replay_on_another_store_and_the_stream_stays_short(make_broker, tmp_path, monkeypatch):
    monkeypatch.setattr(group_offsets, "COMPACT_MIN_ENTRIES", 10)
    server = types.SimpleNamespace(broker=make_broker())
    store = OffsetStore(server, tmp_path)
    session = server.broker.session()
    for i in range(35):
        store.commit(session, "g", [("t", 0, i, 0, ""), ("t", 1, 100 + i, 0, "m")])
    assert _offsets(store, "g") == {("t", 0): 34, ("t", 1): 134}
    assert session.length(offsets_key("g")) < 25  # two snapshots and the commits after the older one
    again = OffsetStore(server, tmp_path)  # a coordinator that never saw the commits: the stream's replay
    assert _offsets(again, "g") == {("t", 0): 34, ("t", 1): 134}
    assert again.get("g", "t", 1).metadata == "m"
    store.delete_offsets(session, "g", [("t", 1)])
    assert _offsets(again, "g") == {("t", 0): 34}  # a store catches up with entries written since
    store.delete_group(session, "g")
    assert again.group_ids() == [] and not again.has_group("g")
    store.commit(session, "g", [("t", 2, 7, -1, "")])  # the group again, after its deletion
    assert _offsets(OffsetStore(server, tmp_path), "g") == {("t", 2): 7}


def test_the_old_journal_is_read_and_a_groups_first_write_carries_it_over(make_broker, tmp_path):
    lines = [{"g": "old", "t": "t", "p": 0, "o": 5, "e": 0, "m": "", "ts": 1},
             {"g": "old", "t": "t", "p": 1, "o": 6, "e": 0, "m": "", "ts": 1}]
    (tmp_path / group_offsets.FILE_NAME).write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in lines))
    server = types.SimpleNamespace(broker=make_broker())
    store = OffsetStore(server, tmp_path)
    assert store.group_ids() == ["old"] and _offsets(store, "old") == {("t", 0): 5, ("t", 1): 6}
    store.commit(server.broker.session(), "old", [("t", 1, 9, 0, "")])
    elsewhere = OffsetStore(server, tmp_path / "no-journal")  # the stream alone holds them now
    assert _offsets(elsewhere, "old") == {("t", 0): 5, ("t", 1): 9}
