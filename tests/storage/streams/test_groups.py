"""GroupStore: the consumer-group model, its journal, snapshots and recovery."""

from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from storage.handles import FileCache
from storage.streams.groups import (
    DEAD_LETTER_NEEDS_KEY,
    GROUP_EXISTS,
    JOURNAL_NAME,
    MAX_DELIVERIES_RANGE,
    NO_GROUP,
    NOT_AFTER_LAST_ID,
    NOT_PENDING,
    SNAPSHOT_NAME,
    GroupError,
    GroupStateError,
    GroupStore,
    PendingList,
    PendingEntry,
    entries_read_after,
    estimate_entries_read,
    group_lag,
    range_has_tombstones,
)


def dump(store: GroupStore) -> dict:
    """A canonical picture of the whole state, checking invariants on the way."""
    out = {}
    for g in store.sorted_groups():
        consumers = {}
        union = {}
        for c in g.sorted_consumers():
            pel = []
            for sid, pe in c.pending.items():
                assert pe.consumer == c.name
                assert g.pel.get(sid) is pe
                pel.append((sid, pe.delivery_time_ms, pe.delivery_count))
                union[sid] = pe
            consumers[c.name] = (c.seen_time_ms, c.active_time_ms, pel)
        group_pel = [(sid, pe.consumer, pe.delivery_time_ms, pe.delivery_count) for sid, pe in g.pel.items()]
        released = [(pe.tick, sid) for sid, pe in g.pel.items() if pe.consumer is None]
        assert all(pe.delivery_time_ms == 0 for sid, pe in g.pel.items() if pe.consumer is None)
        assert sorted(union) == [sid for sid, consumer, *_ in group_pel if consumer is not None]
        assert [sid for sid, *_ in group_pel] == sorted(sid for sid, *_ in group_pel)
        out[g.name] = (
            g.last_id, g.entries_read, g.max_deliveries, g.dead_letter_key, g.dead_lettered_total,
            consumers, group_pel, [sid for _, sid in sorted(released)],  # the NACK zone, in its order
        )
    return out


def claim_order(g, now_ms: int = 10**9, min_idle_ms: int = 0) -> list:
    with g.idle_pending(now_ms, min_idle_ms) as idle:
        return [sid for sid, _ in idle]


def reopen(store: GroupStore, **kw) -> GroupStore:
    store.close()
    return GroupStore.open(store.directory, **kw)


def assert_reopens_the_same(store: GroupStore) -> None:
    """Close ``store``, open its directory again: the same state; close that."""
    want = dump(store)
    store = reopen(store)
    assert dump(store) == want
    store.close()


# ---------------------------------------------------------------- PendingList


def test_pending_list_orders_ids_and_reuses_stale_slots():
    pel = PendingList()
    for sid in [(5, 0), (1, 0), (3, 1), (3, 0), (9, 9)]:
        pel.add(sid, PendingEntry(b"c", 0, 1))
    assert [sid for sid, _ in pel.items()] == [(1, 0), (3, 0), (3, 1), (5, 0), (9, 9)]
    assert pel.remove((3, 0)) is not None
    assert pel.remove((3, 0)) is None
    assert (3, 0) not in pel
    pel.add((3, 0), PendingEntry(b"d", 1, 2))  # the stale copy is still in the list
    assert [sid for sid, _ in pel.items()] == [(1, 0), (3, 0), (3, 1), (5, 0), (9, 9)]
    assert pel.get((3, 0)).consumer == b"d"
    assert [sid for sid, _ in pel.range((3, 1), (9, 0))] == [(3, 1), (5, 0)]
    assert [sid for sid, _ in pel.range(count=2)] == [(1, 0), (3, 0)]
    assert pel.range(count=0) == []
    assert pel.first() == (1, 0) and pel.last() == (9, 9)
    assert len(pel) == 5


def test_pending_list_compacts_after_many_removals():
    pel = PendingList()
    for i in range(1000):
        pel.add((i, 0), PendingEntry(b"c", 0, 1))
    for i in range(990):
        pel.remove((i, 0))
    assert len(pel) == 10
    assert len(pel._ids) < 200
    assert pel.first() == (990, 0)
    for i in range(10):
        pel.remove((990 + i, 0))
    assert pel.first() is None and pel.last() is None and not pel


# ---------------------------------------------------------------- store basics


def test_no_files_until_first_mutation(tmp_path):
    store = GroupStore.open(tmp_path)
    assert store.groups == {}
    assert not (tmp_path / JOURNAL_NAME).exists()
    store.flush()
    assert store.begin_flush().fd == -1
    store.close()


def test_create_deliver_ack_survive_reopen(tmp_path):
    store = GroupStore.open(tmp_path)
    store.create_group(b"g", (0, 0), 0)
    with pytest.raises(GroupError) as info:
        store.create_group(b"g", (0, 0), 0)
    assert (info.value.code, info.value.fields) == (GROUP_EXISTS, {"group": b"g"})
    store.deliver(b"g", b"alice", [(1, 0), (2, 0), (3, 0)], (3, 0), 3, now_ms=1000)
    store.deliver(b"g", b"bob", [(4, 0)], (4, 0), 4, now_ms=1100)
    assert store.ack(b"g", [(2, 0), (2, 0), (99, 0)]) == 1
    before = dump(store)
    g = store.group(b"g")
    assert [sid for sid, _ in g.pel.items()] == [(1, 0), (3, 0), (4, 0)]
    assert g.last_id == (4, 0) and g.entries_read == 4
    assert g.consumer(b"alice").active_time_ms == 1000
    store = reopen(store)
    assert dump(store) == before
    store.close()


def test_noack_moves_last_id_without_pending(tmp_path):
    store = GroupStore.open(tmp_path)
    store.create_group(b"g", (0, 0), None)
    store.deliver(b"g", b"c", [(1, 0), (2, 0)], (2, 0), 2, now_ms=5, noack=True)
    g = store.group(b"g")
    assert len(g.pel) == 0 and g.last_id == (2, 0) and b"c" in g.consumers
    store = reopen(store)
    assert store.group(b"g").last_id == (2, 0)
    store.close()


def test_deliver_rejects_ids_at_or_below_last_id(tmp_path):
    store = GroupStore.open(tmp_path)
    store.create_group(b"g", (5, 0), None)
    with pytest.raises(GroupError) as info:
        store.deliver(b"g", b"c", [(5, 0)], (5, 0), None, now_ms=1)
    assert info.value.code == NOT_AFTER_LAST_ID
    with pytest.raises(GroupError) as info:
        store.deliver(b"nope", b"c", [(6, 0)], (6, 0), None, now_ms=1)
    assert (info.value.code, info.value.fields) == (NO_GROUP, {"group": b"nope"})
    store.close()


def test_redeliver_after_setid_back_reassigns_with_count_one(tmp_path):
    store = GroupStore.open(tmp_path)
    store.create_group(b"g", (0, 0), 0)
    store.deliver(b"g", b"a", [(1, 0), (2, 0)], (2, 0), 2, now_ms=10)
    store.redeliver(b"g", b"a", [(1, 0)], now_ms=20)
    assert store.group(b"g").pel.get((1, 0)).delivery_count == 2
    store.set_id(b"g", (0, 0), 0)
    store.deliver(b"g", b"b", [(1, 0)], (1, 0), 1, now_ms=30)
    g = store.group(b"g")
    pe = g.pel.get((1, 0))
    assert (pe.consumer, pe.delivery_time_ms, pe.delivery_count) == (b"b", 30, 1)
    assert (1, 0) not in g.consumer(b"a").pending
    assert (1, 0) in g.consumer(b"b").pending
    before = dump(store)
    store = reopen(store)
    assert dump(store) == before
    store.close()


def test_a_change_to_one_entry_of_a_delivery_leaves_the_others_as_delivered(tmp_path):
    """The entries of one delivery share their pending-entry object; a
    redelivery, claim, XNACK or re-delivery after SETID of one of them
    changes that one only (its delivery time, count, owner and place in the
    time order), live and after a reopen."""
    store = GroupStore.open(tmp_path)
    store.create_group(b"g", (0, 0), 0)
    ids = [(i, 0) for i in range(1, 7)]
    store.deliver(b"g", b"a", ids, ids[-1], 6, now_ms=10)
    store.redeliver(b"g", b"a", [(1, 0)], now_ms=20)
    store.claim(b"g", b"b", [((2, 0), 30, 5)], now_ms=30)
    store.nack(b"g", [((3, 0), 7)])
    store.set_id(b"g", (3, 0), 3)
    store.deliver(b"g", b"c", [(4, 0)], (4, 0), 4, now_ms=40)
    want = {
        (1, 0): (b"a", 20, 2), (2, 0): (b"b", 30, 5), (3, 0): (None, 0, 7), (4, 0): (b"c", 40, 1),
        (5, 0): (b"a", 10, 1), (6, 0): (b"a", 10, 1),
    }
    for _ in range(2):
        g = store.group(b"g")
        assert {sid: (pe.consumer, pe.delivery_time_ms, pe.delivery_count) for sid, pe in g.pel.items()} == want
        assert [sid for sid, _ in g.consumer(b"a").pending.items()] == [(1, 0), (5, 0), (6, 0)]
        assert claim_order(g) == [(3, 0), (5, 0), (6, 0), (1, 0), (2, 0), (4, 0)]
        dump(store)  # the invariants: each consumer's PEL holds the group's objects
        store = reopen(store)
    store.close()


def test_acking_a_whole_pel_empties_it_and_only_it(tmp_path):
    """An XACK of all a consumer's pending entries, then of all the group's
    (two owners, one entry released by XNACK): each PEL left holds what it
    should, live and after a reopen."""
    store = GroupStore.open(tmp_path)
    store.create_group(b"g", (0, 0), 0)
    store.deliver(b"g", b"a", [(1, 0), (2, 0)], (2, 0), 2, now_ms=10)
    store.deliver(b"g", b"b", [(3, 0), (4, 0), (5, 0)], (5, 0), 5, now_ms=20)
    store.nack(b"g", [((5, 0), 1)])
    assert store.ack(b"g", [(2, 0), (1, 0)]) == 2
    g = store.group(b"g")
    assert [sid for sid, _ in g.pel.items()] == [(3, 0), (4, 0), (5, 0)]
    assert len(g.consumer(b"a").pending) == 0 and len(g.consumer(b"b").pending) == 2
    dump(store)
    store.deliver(b"g", b"a", [(6, 0)], (6, 0), 6, now_ms=30)
    assert store.ack(b"g", [(3, 0), (4, 0), (5, 0), (6, 0)]) == 4
    for _ in range(2):
        g = store.group(b"g")
        assert len(g.pel) == 0 and all(len(c.pending) == 0 for c in g.consumers.values())
        assert claim_order(g) == []
        dump(store)
        store = reopen(store)
    store.deliver(b"g", b"a", [(7, 0)], (7, 0), 7, now_ms=40)
    assert claim_order(store.group(b"g")) == [(7, 0)]
    store.close()


def test_redeliver_requires_ids_pending_for_that_consumer(tmp_path):
    store = GroupStore.open(tmp_path)
    store.create_group(b"g", (0, 0), 0)
    store.deliver(b"g", b"a", [(1, 0)], (1, 0), 1, now_ms=10)
    with pytest.raises(GroupError) as info:
        store.redeliver(b"g", b"b", [(1, 0)], now_ms=11)
    assert (info.value.code, info.value.fields) == (NOT_PENDING, {"group": b"g", "consumer": b"b"})
    store.close()


def test_delete_consumer_returns_pending_it_dropped(tmp_path):
    store = GroupStore.open(tmp_path)
    store.create_group(b"g", (0, 0), 0)
    assert store.create_consumer(b"g", b"a", 1) is True
    assert store.create_consumer(b"g", b"a", 2) is False
    store.deliver(b"g", b"a", [(1, 0), (2, 0)], (2, 0), 2, now_ms=3)
    store.deliver(b"g", b"b", [(3, 0)], (3, 0), 3, now_ms=3)
    assert store.delete_consumer(b"g", b"a") == 2
    assert store.delete_consumer(b"g", b"a") == 0
    assert [sid for sid, _ in store.group(b"g").pel.items()] == [(3, 0)]
    store = reopen(store)
    assert list(store.group(b"g").consumers) == [b"b"]
    store.close()


def test_claim_moves_entries_and_force_creates_them(tmp_path):
    store = GroupStore.open(tmp_path)
    store.create_group(b"g", (0, 0), 0)
    store.deliver(b"g", b"a", [(1, 0), (2, 0)], (2, 0), 2, now_ms=3)
    store.claim(b"g", b"b", [((1, 0), 50, 7), ((9, 0), 60, 1)], now_ms=70, last_id=(9, 0))
    g = store.group(b"g")
    assert [sid for sid, _ in g.consumer(b"a").pending.items()] == [(2, 0)]
    assert [sid for sid, _ in g.consumer(b"b").pending.items()] == [(1, 0), (9, 0)]
    assert g.pel.get((1, 0)).delivery_count == 7
    assert g.last_id == (9, 0)
    store.claim(b"g", b"b", [], now_ms=80, last_id=(4, 0))  # LASTID never moves back
    assert g.last_id == (9, 0)
    before = dump(store)
    store = reopen(store)
    assert dump(store) == before
    store.close()


def test_dead_letter_setting_and_removal(tmp_path):
    store = GroupStore.open(tmp_path)
    store.create_group(b"g", (0, 0), 0, max_deliveries=3, dead_letter_key=b"dlq")
    with pytest.raises(GroupError) as info:
        store.configure_dead_letter(b"g", 3, None)
    assert info.value.code == DEAD_LETTER_NEEDS_KEY
    with pytest.raises(GroupError) as info:
        store.configure_dead_letter(b"g", 2**32, b"dlq")
    assert info.value.code == MAX_DELIVERIES_RANGE
    store.deliver(b"g", b"a", [(1, 0), (2, 0)], (2, 0), 2, now_ms=3)
    assert store.dead_letter(b"g", [(1, 0)]) == 1
    store.configure_dead_letter(b"g", 5, b"other")
    before = dump(store)
    store = reopen(store)
    g = store.group(b"g")
    assert (g.max_deliveries, g.dead_letter_key, g.dead_lettered_total) == (5, b"other", 1)
    assert dump(store) == before
    store.configure_dead_letter(b"g", 0, None)
    assert store.group(b"g").dead_letter_key is None
    store.close()


def test_destroy_and_delete_files(tmp_path):
    store = GroupStore.open(tmp_path)
    store.create_group(b"g", (0, 0), 0)
    store.create_group(b"h", (0, 0), 0)
    assert store.destroy_group(b"g") is True
    assert store.destroy_group(b"g") is False
    store = reopen(store)
    assert list(store.groups) == [b"h"]
    store.delete_files()
    assert not (tmp_path / JOURNAL_NAME).exists()
    assert GroupStore.open(tmp_path).groups == {}


def test_touch_updates_seen_time_only(tmp_path):
    store = GroupStore.open(tmp_path)
    store.create_group(b"g", (0, 0), 0)
    c = store.touch_consumer(b"g", b"a", 100)
    assert (c.seen_time_ms, c.active_time_ms) == (100, -1)
    store.touch_consumer(b"g", b"a", 200)
    store = reopen(store)
    c = store.group(b"g").consumer(b"a")
    assert (c.seen_time_ms, c.active_time_ms) == (200, -1)
    store.close()


def test_binary_names_round_trip(tmp_path):
    store = GroupStore.open(tmp_path)
    name = bytes(range(256))
    store.create_group(name, (2**64 - 1, 2**64 - 1), None, max_deliveries=1, dead_letter_key=b"\x00\r\n")
    store.deliver(name, b"", [], (2**64 - 1, 2**64 - 1), None, now_ms=1)
    before = dump(store)
    store = reopen(store)
    assert dump(store) == before
    store.close()


# ---------------------------------------------------------------- durability


def test_flush_ticket_protocol(tmp_path):
    store = GroupStore.open(tmp_path)
    store.create_group(b"g", (0, 0), 0)
    assert store.needs_flush
    ticket = store.begin_flush()
    assert ticket.fd >= 0
    store.deliver(b"g", b"a", [(1, 0)], (1, 0), 1, now_ms=1)  # after the ticket
    ticket.run()
    store.end_flush(ticket)
    assert store.needs_flush  # the deliver is not covered by that ticket
    store.flush()
    assert not store.needs_flush
    assert store.begin_flush().fd == -1
    store.close()


def test_flush_ticket_synced_by_the_caller(tmp_path):
    store = GroupStore.open(tmp_path)
    store.create_group(b"g", (0, 0), 0)
    ticket = store.begin_flush()
    [(fd, full)] = ticket.sync_targets()
    assert fd == ticket.fd and not full
    os.fdatasync(fd)
    ticket.finish(None)
    store.end_flush(ticket)
    assert not store.needs_flush
    assert store.begin_flush().sync_targets() == []
    store.close()


def test_a_failed_flush_ticket_makes_nothing_durable_and_the_next_flush_rewrites_the_state(tmp_path):
    """The journal's pages cannot be trusted after a failed fsync (the kernel
    may have dropped them and reports it once), the state in memory can:
    the next flush writes it as a compaction (new snapshot and journal,
    fsynced), not another fsync of the old journal."""
    store = GroupStore.open(tmp_path)
    store.create_group(b"g", (0, 0), 0)
    ticket = store.begin_flush()
    with pytest.raises(OSError):
        ticket.finish(OSError(5, "Input/output error"))
    store.end_flush(ticket)
    assert store.needs_flush  # the next flush covers it again
    store.deliver(b"g", b"c", [(1, 0)], (1, 0), 1, 1000)  # mutations go on meanwhile
    generation = store.statistics().generation
    ticket = store.begin_flush()  # compacts here: nothing left for the ticket
    assert ticket.sync_targets() == [] and not store.needs_flush
    assert store.statistics().generation == generation + 1
    crashed_now = GroupStore.open(tmp_path)  # what the files hold now
    assert dump(crashed_now) == dump(store) and b"c" in dump(store)[b"g"][5]
    crashed_now.close()
    store.create_group(b"h", (0, 0), 0)
    assert store.begin_flush().sync_targets() != []  # the journal is synced again from here
    assert_reopens_the_same(store)


def test_a_failed_journal_fsync_is_retried_as_a_rewrite_until_it_succeeds(tmp_path, monkeypatch):
    store = GroupStore.open(tmp_path)
    store.create_group(b"g", (0, 0), 0)

    def eio(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", eio)
    monkeypatch.setattr(os, "fsync", eio)
    with pytest.raises(OSError):
        store.flush()
    with pytest.raises(OSError):
        store.flush()  # the rewrite fails too: still owed
    assert store.needs_flush
    monkeypatch.undo()
    store.flush()
    assert not store.needs_flush and store.statistics().compactions == 1
    assert_reopens_the_same(store)


def test_a_store_on_a_disk_that_still_fails_is_closed_without_raising(tmp_path, monkeypatch, caplog):
    """Closing a store whose journal's sync failed, on a disk that fails
    the rewrite too, logs it and closes (as a partition log offline after
    a failed sync is closed): a shutdown goes on to close everything else.
    What was made durable before the failure is what the next open finds."""
    store = GroupStore.open(tmp_path)
    store.create_group(b"g", (0, 0), 0)
    store.flush()

    def eio(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", eio)
    monkeypatch.setattr(os, "fsync", eio)
    store.create_group(b"h", (0, 0), 0)
    with pytest.raises(OSError):
        store.flush()
    with caplog.at_level(logging.ERROR):
        store.close()
    assert store.closed
    assert any("not made durable at close" in r.getMessage() for r in caplog.records)
    monkeypatch.undo()
    reopened = GroupStore.open(tmp_path)
    assert b"g" in dump(reopened)
    reopened.close()


# ---------------------------------------------------------------- descriptors


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _names(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


def _crowd(cache: FileCache, directory: Path, n: int) -> None:
    """Open ``n`` other files through ``cache`` (its LRU closes older ones)."""
    directory.mkdir(exist_ok=True)
    for i in range(n):
        cache.get(str(directory / f"f{i}"), create=True)


def test_journals_of_many_stores_share_the_bounded_file_cache(tmp_path):
    """Stores on a shared cache hold no descriptor of their own: however
    many have groups, the process holds at most the cache's bound; a hot
    journal is appended to without reopening, an evicted one reopens on
    demand and loses nothing."""
    cache = FileCache(8)
    before = _open_fds()
    stores = [GroupStore.open(tmp_path / f"p{i}", file_cache=cache) for i in range(32)]
    for i, store in enumerate(stores):
        store.create_group(b"g", (0, 0), 0)
        store.deliver(b"g", b"c", [(1, i)], (1, i), 1, now_ms=1)
    assert _open_fds() - before <= 8 and len(cache) <= 8
    opens = cache.opens
    for n in range(100):  # the common case: the journal stays open
        stores[-1].deliver(b"g", b"c", [(2, n)], (2, n), 2 + n, now_ms=2)
    assert cache.opens == opens
    for store in stores:
        store.flush()
        assert not store.needs_flush
    assert _open_fds() - before <= 8 and cache.pinned == 0
    for store in stores:
        assert_reopens_the_same(store)
    cache.close_all()
    assert _open_fds() == before


def test_a_flush_syncs_the_journal_whatever_the_cache_did_meanwhile(tmp_path, monkeypatch):
    """A ticket pins the journal's descriptor: evicted before the flush, the
    journal is reopened for it; while the ticket is out, the cache's LRU
    passes it over and its number keeps naming the journal; ``end_flush``
    unpins it."""
    cache = FileCache(4)
    store = GroupStore.open(tmp_path / "p", file_cache=cache, logger=logging.getLogger("t"))
    journal = str(tmp_path / "p" / JOURNAL_NAME)
    store.create_group(b"g", (0, 0), 0)
    _crowd(cache, tmp_path / "other", 4)
    assert cache.peek(journal) is None  # evicted
    ticket = store.begin_flush()
    [(fd, _full)] = ticket.sync_targets()
    assert _names(fd) == journal and cache.pinned == 1
    _crowd(cache, tmp_path / "more", 8)
    store.deliver(b"g", b"c", [(1, 0)], (1, 0), 1, now_ms=1)  # after the ticket: through the pinned one
    assert cache.peek(journal) == fd and _names(fd) == journal
    synced = []
    real_fdatasync = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda n: (synced.append(_names(n)), real_fdatasync(n)))
    ticket.run()
    monkeypatch.undo()
    assert synced == [journal]
    store.end_flush(ticket)
    assert cache.pinned == 0 and store.needs_flush  # the deliver is not covered by that ticket
    store.flush()
    assert not store.needs_flush
    assert_reopens_the_same(store)
    cache.close_all()


def test_a_ticket_out_while_the_journal_is_replaced_counts_for_nothing_in_the_new_one(tmp_path):
    """A compaction replaces the journal while a ticket of the old one is
    out: the ticket's descriptor still names the old file (closed at its
    unpin), and its end says nothing about the new journal, even where
    the new one has grown to the same size."""
    cache = FileCache(4)
    before = _open_fds()
    store = GroupStore.open(tmp_path, file_cache=cache)
    store.create_group(b"g", (0, 0), 0)
    ticket = store.begin_flush()
    [(fd, _full)] = ticket.sync_targets()
    store.compact()
    assert _names(fd).endswith(JOURNAL_NAME + " (deleted)")  # the old file, still open
    store.create_group(b"h", (0, 0), 0)  # the new journal: as long as the old one was
    assert store.statistics().journal_bytes == ticket.position
    ticket.run()
    store.end_flush(ticket)
    assert store.needs_flush  # the new record is not synced
    assert _open_fds() - before == 1 and cache.pinned == 0  # the new journal's only
    store.close()
    cache.close_all()
    assert _open_fds() == before


def test_a_closed_store_has_nothing_to_flush(tmp_path):
    """A store closed while written (its topic deleted, ``abandon``) gives
    a flush round an empty ticket; one it had out still ends cleanly."""
    cache = FileCache(4)
    store = GroupStore.open(tmp_path, file_cache=cache)
    store.create_group(b"g", (0, 0), 0)
    ticket = store.begin_flush()
    store.abandon()
    assert store.closed and cache.peek(str(tmp_path / JOURNAL_NAME)) is None
    ticket.run()
    store.end_flush(ticket)
    assert cache.pinned == 0 and len(cache) == 0
    assert store.begin_flush().sync_targets() == []


def _journal_records(path: Path) -> list[tuple[int, int]]:
    """``(position, end)`` of each record of an undamaged journal."""
    from storage.streams.groups import _HEADER_BYTES, _iter_records

    data = path.read_bytes()
    return [(pos, end) for pos, end, payload in _iter_records(data, _HEADER_BYTES) if payload is not None]


def _journal_record_ends(path: Path) -> list[int]:
    return [end for _pos, end in _journal_records(path)]


def _append_record(path: Path, payload: bytes) -> None:
    from storage.salvage import frame

    with open(path, "ab") as f:
        f.write(frame(payload))


def _damage(path: Path, at: int, xor: int = 0x20) -> bytes:
    data = bytearray(path.read_bytes())
    data[at] ^= xor
    path.write_bytes(bytes(data))
    return bytes(data)


def _asides(directory: Path) -> list[Path]:
    return sorted(directory.glob(JOURNAL_NAME + ".damaged-*"))


@pytest.mark.parametrize("cut", [1, 5, 9, "flip"])
def test_torn_tail_is_truncated_and_logged(tmp_path, caplog, cut):
    store = GroupStore.open(tmp_path)
    store.create_group(b"g", (0, 0), 0)
    store.deliver(b"g", b"a", [(1, 0)], (1, 0), 1, now_ms=1)
    expected = dump(store)
    store.deliver(b"g", b"a", [(2, 0), (3, 0)], (3, 0), 3, now_ms=2)
    store.close()
    path = tmp_path / JOURNAL_NAME
    ends = _journal_record_ends(path)
    data = bytearray(path.read_bytes())
    if cut == "flip":
        data[ends[-2] + 12] ^= 0xFF  # corrupt the last record's payload
    else:
        del data[len(data) - cut:]
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="partita.storage.groups"):
        store = GroupStore.open(tmp_path)
    assert dump(store) == expected
    assert f"torn or corrupt tail: truncated {len(data) - ends[-2]} bytes at byte {ends[-2]} after 2 records" \
        in caplog.text
    assert [p.read_bytes() for p in _asides(tmp_path)] == [bytes(data)]  # kept as it was
    assert store.statistics().generation == 1  # the state rewritten as a snapshot
    # The journal keeps working after the cut.
    store.deliver(b"g", b"a", [(4, 0)], (4, 0), 4, now_ms=3)
    assert_reopens_the_same(store)


def test_garbage_appended_after_valid_records_is_cut(tmp_path, caplog):
    store = GroupStore.open(tmp_path)
    store.create_group(b"g", (0, 0), 0)
    expected = dump(store)
    store.close()
    with open(tmp_path / JOURNAL_NAME, "ab") as f:
        f.write(b"\x00" * 3 + os.urandom(50))
    with caplog.at_level(logging.WARNING, logger="partita.storage.groups"):
        store = GroupStore.open(tmp_path)
    assert dump(store) == expected
    assert "truncated" in caplog.text
    store.close()


def test_a_removal_record_that_does_not_fit_is_applied_as_far_as_it_fits(tmp_path, caplog):
    """An intact record naming an ID that is not pending (or one ID twice)
    removes the IDs that are pending, once each; the state stays consistent:
    the group's PEL and its consumers' agree (``dump`` checks)."""
    from storage.streams import groups as g_mod

    store = GroupStore.open(tmp_path)
    store.create_group(b"g", (0, 0), 0)
    store.deliver(b"g", b"a", [(1, 0), (2, 0), (3, 0)], (3, 0), 3, now_ms=1)
    store.close()
    for bad in ([(1, 0), (9, 0)], [(2, 0), (2, 0)]):
        _append_record(tmp_path / g_mod.JOURNAL_NAME, g_mod._U8.pack(g_mod._OP_ACK) + g_mod._s(b"g") + g_mod._ids(bad))
    with caplog.at_level(logging.WARNING):
        store = GroupStore.open(tmp_path)
    assert [sid for sid, _ in store.group(b"g").pel.items()] == [(3, 0)]
    dump(store)
    assert "2 record(s) did not fit the state without the skipped ones and were applied as far as they " \
        "could be (first at byte" in caplog.text
    assert store.ack(b"g", [(3, 0)]) == 1  # and it goes on from there
    store = reopen(store)
    assert len(store.group(b"g").pel) == 0
    store.close()


def _two_groups(tmp_path) -> tuple[GroupStore, list[tuple[int, int]]]:
    """g: created, 3 entries delivered to a, 1 acked; h: created, 1 delivered to b."""
    store = GroupStore.open(tmp_path)
    store.create_group(b"g", (0, 0), 0, max_deliveries=3, dead_letter_key=b"dl")
    store.create_group(b"h", (0, 0), 0)
    store.deliver(b"g", b"a", [(1, 0), (2, 0), (3, 0)], (3, 0), 3, now_ms=10)
    store.deliver(b"h", b"b", [(1, 0)], (1, 0), 1, now_ms=11)
    store.ack(b"g", [(2, 0)])
    store.close()
    return store, _journal_records(tmp_path / JOURNAL_NAME)


@pytest.mark.parametrize("where", ["payload", "length", "crc"])
def test_a_damaged_first_record_loses_only_what_it_held(tmp_path, caplog, where):
    """The first record is g's CREATE: the records after it are found again
    (by the damaged record's own length, or by searching when the length is
    the damaged byte) and g is re-created from them, with its pending
    entries, consumers and last-delivered-id; only its dead-letter setting,
    held by the lost record alone, is lost."""
    store, records = _two_groups(tmp_path)
    path = tmp_path / JOURNAL_NAME
    pos, end = records[0]
    damaged = _damage(path, {"payload": pos + 8 + 3, "length": pos + 1, "crc": pos + 5}[where])
    with caplog.at_level(logging.WARNING, logger="partita.storage.groups"):
        store = GroupStore.open(tmp_path)
    g = store.group(b"g")
    assert [(sid, pe.consumer, pe.delivery_count) for sid, pe in g.pel.items()] == [
        ((1, 0), b"a", 1), ((3, 0), b"a", 1)]
    assert (g.last_id, g.entries_read, g.max_deliveries, g.dead_letter_key) == ((3, 0), 3, 0, None)
    assert [sid for sid, _ in store.group(b"h").pel.items()] == [(1, 0)]
    assert f"{path}: damaged record(s) skipped: bytes {pos}..{end}; {len(records) - 1} record(s) replayed" in caplog.text
    assert "group 'g' re-created from the records after the damage" in caplog.text
    assert "did not fit" not in caplog.text
    assert [p.read_bytes() for p in _asides(tmp_path)] == [damaged]
    caplog.clear()
    assert_reopens_the_same(store)  # repaired for good, and durable
    assert "skipped" not in caplog.text


def test_a_damaged_record_in_the_middle_costs_that_record_only(tmp_path, caplog):
    """The lost record is the delivery to h: h keeps nothing pending (its
    CREATE is intact, so it is not re-created); everything else is replayed."""
    store, records = _two_groups(tmp_path)
    pos, end = records[3]
    _damage(tmp_path / JOURNAL_NAME, end - 1)
    with caplog.at_level(logging.WARNING, logger="partita.storage.groups"):
        store = GroupStore.open(tmp_path)
    assert len(store.group(b"h").pel) == 0 and store.group(b"h").last_id == (0, 0)
    assert [sid for sid, _ in store.group(b"g").pel.items()] == [(1, 0), (3, 0)]
    assert store.group(b"g").max_deliveries == 3
    assert f"damaged record(s) skipped: bytes {pos}..{end}; 4 record(s) replayed, 1 of them after" in caplog.text
    assert "re-created" not in caplog.text
    store.close()


def test_damage_after_a_snapshot_keeps_the_snapshot_and_the_intact_records(tmp_path, caplog):
    store = GroupStore.open(tmp_path)
    store.create_group(b"g", (0, 0), 0)
    store.deliver(b"g", b"a", [(1, 0), (2, 0)], (2, 0), 2, now_ms=1)
    store.compact()
    store.deliver(b"g", b"a", [(3, 0)], (3, 0), 3, now_ms=2)  # lost below
    store.ack(b"g", [(1, 0)])
    store.deliver(b"g", b"b", [(4, 0)], (4, 0), 4, now_ms=3)
    store.close()
    records = _journal_records(tmp_path / JOURNAL_NAME)
    _damage(tmp_path / JOURNAL_NAME, records[0][0] + 10)
    with caplog.at_level(logging.WARNING, logger="partita.storage.groups"):
        store = GroupStore.open(tmp_path)
    g = store.group(b"g")
    assert [(sid, pe.consumer) for sid, pe in g.pel.items()] == [((2, 0), b"a"), ((4, 0), b"b")]
    assert g.last_id == (4, 0)
    assert store.statistics().generation == 2
    assert_reopens_the_same(store)


def test_records_after_a_lost_destroy_and_a_lost_delivery_still_apply(tmp_path, caplog):
    """A CREATE of a group that (without the lost DESTROY) still exists
    replaces it; an ACK of entries whose delivery was lost removes what is
    pending and nothing else."""
    store = GroupStore.open(tmp_path)
    store.create_group(b"g", (0, 0), 0)
    store.deliver(b"g", b"a", [(1, 0)], (1, 0), 1, now_ms=1)
    store.destroy_group(b"g")  # lost below
    store.create_group(b"g", (5, 0), 5)
    store.deliver(b"g", b"b", [(6, 0), (7, 0)], (7, 0), 7, now_ms=2)  # lost below
    store.ack(b"g", [(6, 0), (7, 0)])
    store.deliver(b"g", b"c", [(8, 0)], (8, 0), 8, now_ms=3)
    store.close()
    records = _journal_records(tmp_path / JOURNAL_NAME)
    _damage(tmp_path / JOURNAL_NAME, records[2][1] - 1)
    _damage(tmp_path / JOURNAL_NAME, records[4][1] - 1)
    with caplog.at_level(logging.WARNING, logger="partita.storage.groups"):
        store = GroupStore.open(tmp_path)
    g = store.group(b"g")
    assert [(sid, pe.consumer) for sid, pe in g.pel.items()] == [((8, 0), b"c")]
    assert sorted(g.consumers) == [b"c"] and g.last_id == (8, 0)
    assert (f"damaged record(s) skipped: bytes {records[2][0]}..{records[2][1]}, "
            f"{records[4][0]}..{records[4][1]}") in caplog.text
    assert "2 record(s) did not fit" in caplog.text
    assert_reopens_the_same(store)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(at=st.integers(min_value=24, max_value=10_000), xor=st.integers(min_value=1, max_value=255))
def test_any_one_damaged_byte_is_repaired_and_reported(tmp_path, at, xor):
    """Whatever byte after the header is damaged, the store opens (never
    raises), keeps the file aside, replays every record but the damaged one
    (or, at the tail, the records before it), and reopens the same."""
    d = Path(tempfile.mkdtemp(dir=tmp_path))
    store, records = _two_groups(d)
    size = (d / JOURNAL_NAME).stat().st_size
    at = at % (size - 24) + 24
    victim = next(k for k, (pos, end) in enumerate(records) if pos <= at < end)
    _damage(d / JOURNAL_NAME, at, xor)
    logger = logging.getLogger("test.groups.damage")
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda rec: seen.append(rec.getMessage())
    logger.addHandler(handler)
    try:
        store = GroupStore.open(d, logger=logger)
    finally:
        logger.removeHandler(handler)
    assert len(seen) == 1 and len(_asides(d)) == 1
    replayed = int(seen[0].split(" record(s) replayed")[0].rsplit(" ", 1)[1]) if "replayed" in seen[0] \
        else int(seen[0].split(" after ")[1].split(" records")[0])
    assert replayed == (len(records) - 1 if victim < len(records) - 1 else victim)
    dump(store)
    assert_reopens_the_same(store)


def test_snapshot_compaction_bounds_journal_and_state(tmp_path):
    store = GroupStore.open(tmp_path, compact_min_bytes=4096)
    store.create_group(b"g", (0, 0), 0)
    for i in range(1, 2001):
        store.deliver(b"g", b"c%d" % (i % 3), [(i, 0)], (i, 0), i, now_ms=i)
        if i > 5:
            assert store.ack(b"g", [(i - 5, 0)]) == 1
    stats = store.statistics()
    assert stats.compactions > 5
    assert stats.journal_bytes <= 2 * 4096 + 200
    assert stats.snapshot_bytes < 2000  # five pending entries, three consumers
    before = dump(store)
    store = reopen(store, compact_min_bytes=4096)
    assert dump(store) == before
    assert store.statistics().generation == stats.generation
    store.close()


def test_crash_between_snapshot_and_journal_restart(tmp_path):
    store = GroupStore.open(tmp_path)
    store.create_group(b"g", (0, 0), 0)
    store.deliver(b"g", b"a", [(1, 0)], (1, 0), 1, now_ms=1)
    store.flush()
    old_journal = (tmp_path / JOURNAL_NAME).read_bytes()
    store.compact()
    expected = dump(store)
    store.close()
    # As if the process died after renaming the snapshot, before the new journal.
    (tmp_path / JOURNAL_NAME).write_bytes(old_journal)
    store = GroupStore.open(tmp_path)
    assert dump(store) == expected  # the old journal is not applied twice
    store.ack(b"g", [(1, 0)])
    store = reopen(store)
    assert len(store.group(b"g").pel) == 0
    store.close()


def test_leftover_tmp_files_are_removed(tmp_path):
    store = GroupStore.open(tmp_path)
    store.create_group(b"g", (0, 0), 0)
    store.close()
    (tmp_path / (SNAPSHOT_NAME + ".tmp")).write_bytes(b"half a snapshot")
    store = GroupStore.open(tmp_path)
    assert list(store.groups) == [b"g"]
    assert not (tmp_path / (SNAPSHOT_NAME + ".tmp")).exists()
    store.close()


def test_corrupt_snapshot_raises(tmp_path):
    store = GroupStore.open(tmp_path)
    store.create_group(b"g", (0, 0), 0)
    store.compact()
    store.close()
    path = tmp_path / SNAPSHOT_NAME
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x55
    path.write_bytes(bytes(data))
    with pytest.raises(GroupStateError):
        GroupStore.open(tmp_path)


# ---------------------------------------------------------------- lag rules


@dataclass
class Counters:
    length: int
    entries_added: int
    first_id: tuple
    last_id: tuple
    max_deleted_entry_id: tuple = (0, 0)


def test_lag_rules_follow_redis():
    from storage.streams.groups import ConsumerGroup

    s = Counters(length=3, entries_added=3, first_id=(1, 0), last_id=(3, 0))
    g = ConsumerGroup(b"g", (1, 0), 1)
    assert group_lag(s, g) == 2
    assert group_lag(Counters(0, 0, (0, 0), (0, 0)), ConsumerGroup(b"g", (0, 0), None)) == 0
    # Unknown entries_read, last_id before the first entry, no tombstones: estimated.
    assert group_lag(s, ConsumerGroup(b"g", (0, 0), None)) == 3
    assert group_lag(s, ConsumerGroup(b"g", (3, 0), None)) == 0
    # In the middle with entries_read unknown: not obtainable.
    assert group_lag(s, ConsumerGroup(b"g", (2, 0), None)) is None
    # A tombstone after last_id makes entries_read untrustworthy.
    holed = Counters(length=2, entries_added=3, first_id=(1, 0), last_id=(3, 0), max_deleted_entry_id=(2, 0))
    assert range_has_tombstones(holed, (1, 0))
    assert not range_has_tombstones(holed, (2, 1))
    assert group_lag(holed, ConsumerGroup(b"g", (1, 0), 1)) is None
    assert group_lag(holed, ConsumerGroup(b"g", (3, 0), 3)) == 0
    assert estimate_entries_read(holed, (1, 0)) is None
    assert estimate_entries_read(s, (1, 0)) == 1
    assert estimate_entries_read(s, (4, 0)) is None
    assert entries_read_after(s, (1, 0), 1, [(2, 0), (3, 0)]) == 3
    assert entries_read_after(holed, (0, 0), 0, [(1, 0)]) is None


def test_lag_rules_of_redis_7_4_and_8():
    from storage.streams.groups import ConsumerGroup

    # Every entry deleted or trimmed: lag 0 (whatever the counter says).
    empty = Counters(length=0, entries_added=5, first_id=(0, 0), last_id=(5, 0), max_deleted_entry_id=(5, 0))
    assert group_lag(empty, ConsumerGroup(b"g", (2, 0), 2)) == 0
    # The group and every hole before the first entry: the lag is the length
    # (redis #13337 case 2, #13473).
    trimmed = Counters(length=2, entries_added=4, first_id=(3, 0), last_id=(4, 0), max_deleted_entry_id=(2, 0))
    assert group_lag(trimmed, ConsumerGroup(b"g", (1, 0), 1)) == 2
    # A hole before the first entry but after the group's last ID counts (#13338).
    assert range_has_tombstones(trimmed, (1, 0))
    # Delivering while behind the first entry estimates the counter again (#13958):
    # XADD 1..5, read 1, XTRIM MAXLEN 1, read 5 -> entries-read 5, lag 0.
    after_trim = Counters(length=1, entries_added=5, first_id=(5, 0), last_id=(5, 0))
    assert entries_read_after(after_trim, (1, 0), 1, [(5, 0)]) == 5
    # The caller may say whether the group is behind (the broker knows it from the read's start).
    assert entries_read_after(after_trim, (1, 0), 1, [(5, 0)], behind_first=True) == 5
    whole = Counters(length=3, entries_added=3, first_id=(1, 0), last_id=(3, 0))
    assert entries_read_after(whole, (1, 0), 1, [(2, 0), (3, 0)], behind_first=False) == 3


# ------------------------------------------------------------------ XNACK


def test_nack_releases_entries_to_the_head_of_the_claim_order_and_survives_reopen(tmp_path):
    """XNACK (Redis 8.8): released entries leave their consumer's PEL, get
    delivery time 0 and the given count, and lead the claim order in the
    order they were released (a second release moves one to the tail);
    journal replay and a snapshot both keep all of it, counts past a u32
    (FATAL's LLONG_MAX) included."""
    store = GroupStore.open(tmp_path)
    store.create_group(b"g", (0, 0), 0)
    store.deliver(b"g", b"a", [(1, 0), (2, 0), (3, 0), (4, 0)], (4, 0), 4, now_ms=1000)
    store.claim(b"g", b"b", [((4, 0), 500, 3)], now_ms=1100)  # idle longest of the owned ones
    store.nack(b"g", [((3, 0), 1), ((1, 0), 2**63 - 1)])
    store.nack(b"g", [((3, 0), 0), ((9, 0), 7)])  # 3-0 again: to the tail; 9-0 made pending (FORCE)
    g = store.group(b"g")
    assert [sid for sid, _ in g.consumer(b"a").pending.items()] == [(2, 0)]
    assert [(sid, pe.consumer, pe.delivery_time_ms, pe.delivery_count) for sid, pe in g.pel.items()] == [
        ((1, 0), None, 0, 2**63 - 1), ((2, 0), b"a", 1000, 1), ((3, 0), None, 0, 0), ((4, 0), b"b", 500, 3),
        ((9, 0), None, 0, 7)]
    assert g.nacked_count() == 3
    assert claim_order(g) == [(1, 0), (3, 0), (9, 0), (4, 0), (2, 0)]
    assert claim_order(g, now_ms=1200, min_idle_ms=300) == [(1, 0), (3, 0), (9, 0), (4, 0)]
    store.claim(b"g", b"c", [((1, 0), 1300, 2**63)], now_ms=1300)  # past LLONG_MAX: a u64 in the journal
    assert claim_order(g) == [(3, 0), (9, 0), (4, 0), (2, 0), (1, 0)]
    want = dump(store)
    store = reopen(store)  # journal replay
    assert dump(store) == want
    assert claim_order(store.group(b"g"))[:2] == [(3, 0), (9, 0)]
    store.compact()
    store = reopen(store)  # from the snapshot
    assert dump(store) == want
    assert claim_order(store.group(b"g"))[:2] == [(3, 0), (9, 0)]
    store.close()


def test_claim_order_skips_entries_acknowledged_or_retimed(tmp_path):
    store = GroupStore.open(tmp_path)
    store.create_group(b"g", (0, 0), 0)
    store.deliver(b"g", b"a", [(1, 0), (2, 0), (3, 0)], (3, 0), 3, now_ms=100)
    g = store.group(b"g")
    assert claim_order(g) == [(1, 0), (2, 0), (3, 0)]  # equal times: in the order they were set
    assert g.oldest_delivery_ms() == 100
    store.ack(b"g", [(1, 0)])
    store.redeliver(b"g", b"a", [(2, 0)], now_ms=200)
    assert claim_order(g) == [(3, 0), (2, 0)]
    assert claim_order(g, now_ms=250, min_idle_ms=100) == [(3, 0)]
    with g.idle_pending(1000, 0) as idle:
        assert next(idle)[0] == (3, 0)  # a walk left early leaves the order as it was
    assert claim_order(g) == [(3, 0), (2, 0)]
    store.ack(b"g", [(2, 0), (3, 0)])
    assert claim_order(g) == [] and g.oldest_delivery_ms() is None
    store.close()


# ---------------------------------------------------------------- property


GROUPS = [b"g1", b"g2"]
CONSUMERS = [b"a", b"b", b"c"]

ops = st.lists(
    st.one_of(
        st.tuples(st.just("create"), st.sampled_from(GROUPS), st.integers(0, 5), st.booleans()),
        st.tuples(st.just("destroy"), st.sampled_from(GROUPS)),
        st.tuples(st.just("setid"), st.sampled_from(GROUPS), st.integers(0, 30)),
        st.tuples(st.just("createconsumer"), st.sampled_from(GROUPS), st.sampled_from(CONSUMERS)),
        st.tuples(st.just("delconsumer"), st.sampled_from(GROUPS), st.sampled_from(CONSUMERS)),
        st.tuples(st.just("touch"), st.sampled_from(GROUPS), st.sampled_from(CONSUMERS)),
        st.tuples(st.just("deliver"), st.sampled_from(GROUPS), st.sampled_from(CONSUMERS),
                  st.integers(0, 4), st.booleans()),
        st.tuples(st.just("redeliver"), st.sampled_from(GROUPS), st.sampled_from(CONSUMERS), st.integers(1, 3)),
        st.tuples(st.just("ack"), st.sampled_from(GROUPS), st.lists(st.integers(0, 30), max_size=4)),
        st.tuples(st.just("acklast"), st.sampled_from(GROUPS), st.integers(1, 5)),
        st.tuples(st.just("listconsumer"), st.sampled_from(GROUPS), st.sampled_from(CONSUMERS)),
        st.tuples(st.just("drop"), st.sampled_from(GROUPS), st.lists(st.integers(0, 30), max_size=3)),
        st.tuples(st.just("deadletter"), st.sampled_from(GROUPS), st.lists(st.integers(0, 30), max_size=3)),
        st.tuples(st.just("claim"), st.sampled_from(GROUPS), st.sampled_from(CONSUMERS),
                  st.lists(st.integers(0, 30), max_size=3), st.integers(0, 9), st.booleans()),
        st.tuples(st.just("config"), st.sampled_from(GROUPS), st.integers(0, 4)),
        st.tuples(st.just("nack"), st.sampled_from(GROUPS), st.lists(st.integers(0, 30), max_size=3),
                  st.sampled_from([0, 1, 5, 2**32, 2**63 - 1]), st.booleans()),
        st.tuples(st.just("reopen"),),
        st.tuples(st.just("compact"),),
    ),
    max_size=60,
)


def _run(store: GroupStore, op: tuple, now: int) -> GroupStore:
    kind = op[0]
    if kind == "reopen":
        return reopen(store, compact_min_bytes=store.compact_min_bytes)
    if kind == "compact":
        store.compact()
        return store
    g = store.group(op[1])
    if kind == "create":
        if g is None:
            md = op[2]
            store.create_group(op[1], (op[2], 0), op[2] if op[3] else None,
                               max_deliveries=md, dead_letter_key=b"dl" if md else None)
        return store
    if g is None:
        return store
    if kind == "destroy":
        store.destroy_group(op[1])
    elif kind == "setid":
        store.set_id(op[1], (op[2], 0), op[2])
    elif kind == "createconsumer":
        store.create_consumer(op[1], op[2], now)
    elif kind == "delconsumer":
        store.delete_consumer(op[1], op[2])
    elif kind == "touch":
        store.touch_consumer(op[1], op[2], now)
    elif kind == "deliver":
        start = g.last_id[0] + 1
        ids = [(start + i, 0) for i in range(op[3])]
        last = ids[-1] if ids else g.last_id
        store.deliver(op[1], op[2], ids, last, None if g.entries_read is None else g.entries_read + len(ids),
                      now, noack=op[4])
    elif kind == "redeliver":
        c = g.consumer(op[2])
        if c is not None:
            store.redeliver(op[1], op[2], [sid for sid, _ in c.pending.range(count=op[3])], now)
    elif kind in ("ack", "drop", "deadletter"):
        fn = {"ack": store.ack, "drop": store.drop_pending, "deadletter": store.dead_letter}[kind]
        fn(op[1], [(i, 0) for i in op[2]])
    elif kind == "acklast":  # the op[2] IDs up to last_id, ascending: often exactly the last delivery
        store.ack(op[1], [(i, 0) for i in range(max(g.last_id[0] - op[2] + 1, 0), g.last_id[0] + 1)])
    elif kind == "listconsumer":  # XPENDING's consumer form: looks at that consumer's PEL only
        c = g.consumer(op[2])
        if c is not None:
            c.pending.range(count=2)
    elif kind == "claim":
        claims = [((i, 0), now - op[4], op[4]) for i in op[3]]
        if not op[5]:  # without FORCE only pending IDs are claimed
            claims = [c for c in claims if c[0] in g.pel]
        store.claim(op[1], op[2], claims, now, last_id=(op[4] * 3, 0) if op[5] else None)
    elif kind == "config":
        store.configure_dead_letter(op[1], op[2], b"dl%d" % op[2] if op[2] else None)
    elif kind == "nack":
        entries = [((i, 0), op[3]) for i in op[2]]
        if not op[4]:  # without FORCE only pending IDs are released
            entries = [e for e in entries if e[0] in g.pel]
        store.nack(op[1], entries)
    return store


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops, st.sampled_from([200, 1 << 20]))
def test_replayed_state_equals_memory_state(op_list, compact_min_bytes):
    with tempfile.TemporaryDirectory() as d:
        store = GroupStore.open(Path(d), compact_min_bytes=compact_min_bytes)
        for now, op in enumerate(op_list, start=1000):
            store = _run(store, op, now)
            dump(store)  # invariants hold after every step
        expected = dump(store)
        store.flush()
        replayed = GroupStore.open(Path(d), compact_min_bytes=compact_min_bytes)
        assert dump(replayed) == expected
        for name in GROUPS:  # the NACK zone leads the claim order, in its order, after a reopen too
            g = replayed.group(name)
            if g is not None:
                assert claim_order(g)[:len(expected[name][-1])] == expected[name][-1]
        replayed.close()
        store.close()


_CREATE_AND_DELIVER = [("create", b"g1", 0, True), ("deliver", b"g1", b"a", 3, False),
                       ("deliver", b"g1", b"b", 2, False), ("deliver", b"g1", b"a", 4, False)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
@example(_CREATE_AND_DELIVER + [("acklast", b"g1", 4), ("ack", b"g1", [3, 4, 5])])  # whole deliveries
@example(_CREATE_AND_DELIVER + [("listconsumer", b"g1", b"a"), ("acklast", b"g1", 4)])  # its consumer's listed
@example(_CREATE_AND_DELIVER + [("acklast", b"g1", 2), ("acklast", b"g1", 5), ("ack", b"g1", [1, 1, 2])])
@example(_CREATE_AND_DELIVER + [("claim", b"g1", b"c", [7], 0, False), ("acklast", b"g1", 4),
                                ("acklast", b"g1", 4), ("reopen",), ("ack", b"g1", [1, 2, 3])])
@example(_CREATE_AND_DELIVER + [("redeliver", b"g1", b"b", 1), ("ack", b"g1", [4, 5]),
                                ("nack", b"g1", [1], 0, False), ("ack", b"g1", [1, 2, 3])])
def test_state_is_the_same_whether_or_not_listed_between_steps(op_list):
    """A PEL keeps whole deliveries as runs until something lists or looks
    up its IDs (``dump`` does): the same operations end in the same state
    when nothing looks in between (runs acked or claimed as runs) as when
    everything is listed after every step."""
    with tempfile.TemporaryDirectory() as d1, tempfile.TemporaryDirectory() as d2:
        quiet = GroupStore.open(Path(d1))
        listed = GroupStore.open(Path(d2))
        for now, op in enumerate(op_list, start=1000):
            quiet = _run(quiet, op, now)
            listed = _run(listed, op, now)
            dump(listed)
        assert dump(quiet) == dump(listed)
        quiet.close()
        listed.close()
