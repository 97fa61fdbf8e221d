"""Producer records in batches and the producer-state table of a partition log."""

from __future__ import annotations

import logging
import os

import pytest
from crc32c import crc32c

from storage import records
from storage.errors import InvalidBatchError
from storage.log import LogConfig, PartitionLog
from storage.producers import (
    SEQUENCE_WINDOW,
    SNAPSHOT_EVERY_RECORDS,
    Appended,
    idmp_auto_token,
    idmp_producer,
    idmp_token,
    sequence_producer,
    sequence_token,
)
from storage.records import KIND_IDEMPOTENT_ID, KIND_SEQUENCE, ProducerRecord
from tests.storage.helpers import enc, entries, read_all

SMALL = LogConfig(segment_bytes=4096, index_interval_bytes=256)


class Clock:
    def __init__(self, now_ms: int = 1_000_000) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


def open_log(path, clock=None, config=SMALL, **kw) -> PartitionLog:
    return PartitionLog.open(path, config, clock_ms=clock or Clock(), **kw)


def idmp(pid: bytes, iid: bytes, index: int = 0) -> ProducerRecord:
    return ProducerRecord(KIND_IDEMPOTENT_ID, 0, index, 1, idmp_producer(pid), idmp_token(iid))


def seq(pid: int, epoch: int, base: int, count: int, index: int = 0) -> ProducerRecord:
    return ProducerRecord(KIND_SEQUENCE, epoch, index, count, sequence_producer(pid), sequence_token(base))


def add_idmp(log: PartitionLog, pid: bytes, iid: bytes, payload: bytes = b"v") -> int:
    ms = log.last_id[0] + 1
    return log.append([(ms, 0, enc(ms, 0, payload))], producers=[idmp(pid, iid)])


def snapshot_files(path) -> list[str]:
    return sorted(n for n in os.listdir(path) if n.endswith(".producers"))


def state_of(log: PartitionLog) -> dict:
    """The table as plain values (what a replica must match)."""
    state = log.producers
    return state.table() | {"added": state.ids_added, "cleared": state.ids_cleared_at}


# -- the batch format ------------------------------------------------------------


def test_a_batch_carries_its_producer_records_after_the_entries():
    recs = [idmp(b"p1", b"a", 0), seq(7, 2, 100, 2, 1)]
    ents = entries(10, 3)
    head, body = records.encode_batch(5, ents, 1, 99, producers=recs)
    batch = head + body
    h = records.unpack_header(batch)
    assert h[records.H_PRODUCERS] == 2
    assert records.check_batch(batch, 0, len(batch), 5, 1 << 20) is None
    assert records.check_tables(batch, 0) is None
    assert records.producer_records(batch) == recs
    assert records.entries_of(batch, 0) == ents  # the entries end where the trailer starts
    assert len(batch) == records.HEADER_BYTES + 20 * 3 + sum(len(e[2]) for e in ents) + 44 * 2


def test_a_batch_without_producer_records_is_byte_for_byte_what_it_was():
    """Byte 29..31 were reserved zeros: a plain batch still has them."""
    for ents in (entries(1, 1), entries(1, 3)):
        head, body = records.encode_batch(0, ents, 0, 5)
        assert body[29 - 16:32 - 16] == b"\0\0\0"


def test_check_tables_refuses_an_unknown_kind_and_records_outside_the_entries():
    def forged(rec: ProducerRecord) -> bytes:
        head, body = records.encode_batch(0, entries(1, 2), 0, 5, producers=[idmp(b"p", b"i")])
        body = body[:-44] + records.PRODUCER_RECORD.pack(*rec)
        return head[:12] + crc32c(body).to_bytes(4, "little") + body

    assert "unknown producer record kind 9" in records.check_tables(forged(idmp(b"p", b"i")._replace(kind=9)), 0)
    assert "outside" in records.check_tables(forged(idmp(b"p", b"i", index=2)), 0)


def test_records_within_keeps_the_records_of_the_kept_entries():
    recs = [idmp(b"p", b"a", 0), seq(1, 0, 0, 2, 1), idmp(b"p", b"b", 3)]
    assert records.records_within(recs, 0, 2) == [recs[0]]
    assert records.records_within(recs, 1, 4) == [recs[1]._replace(index=0), recs[2]._replace(index=2)]


def test_idmpauto_tokens_ignore_the_order_of_the_pairs():
    assert idmp_auto_token([b"a", b"1", b"b", b"2"]) == idmp_auto_token([b"b", b"2", b"a", b"1"])
    assert idmp_auto_token([b"a", b"1"]) != idmp_auto_token([b"a", b"2"])
    assert idmp_auto_token([b"ab", b"c"]) != idmp_auto_token([b"a", b"bc"])
    assert len(idmp_token(b"x" * 65536)) == len(idmp_producer(b"")) == 16


# -- the table ------------------------------------------------------------------


def test_an_idempotent_append_is_found_with_its_entry_id(tmp_path):
    log = open_log(tmp_path / "p")
    add_idmp(log, b"p1", b"a")
    add_idmp(log, b"p2", b"a")
    found = log.producers.find_id(idmp_producer(b"p1"), idmp_token(b"a"), 1_000_000)
    assert found == Appended(0, 1, (1, 0), 1_000_000)
    assert log.producers.find_id(idmp_producer(b"p2"), idmp_token(b"a"), 1_000_000).offset == 1
    assert log.producers.find_id(idmp_producer(b"p1"), idmp_token(b"b"), 1_000_000) is None
    assert log.producers.id_counts(1_000_000) == (2, 2)
    assert log.producers.ids_added == 2
    assert [e[0] for e in read_all(log)] == [0, 1]  # entries read as ever
    log.close()


def test_a_log_without_idempotent_appends_writes_no_snapshot(tmp_path):
    log = open_log(tmp_path / "p")
    log.append(entries(1, 50))
    log.roll()
    log.close()
    assert snapshot_files(tmp_path / "p") == []
    log = open_log(tmp_path / "p")
    assert log.producers.id_counts(0) == (0, 0)
    log.close()


def test_the_first_idempotent_append_writes_the_first_snapshot_below_it(tmp_path):
    log = open_log(tmp_path / "p")
    log.append(entries(1, 5))
    add_idmp(log, b"p", b"a")
    assert snapshot_files(tmp_path / "p") == ["00000000000000000005.producers"]
    log.abandon()


def test_the_table_survives_a_crash_and_a_clean_restart(tmp_path):
    clock = Clock()
    log = open_log(tmp_path / "p", clock)
    log.append(entries(1, 3))
    for i in range(5):
        add_idmp(log, b"p", b"id%d" % i)
    log.append(entries(100, 2))
    before = state_of(log)
    log.flush()
    log.abandon()  # kill -9: no snapshot at close
    log = open_log(tmp_path / "p", clock)
    assert state_of(log) == before
    log.close()
    log = open_log(tmp_path / "p", clock)
    assert snapshot_files(tmp_path / "p")[-1] == "%020d.producers" % log.log_end_offset
    assert state_of(log) == before
    log.close()


def test_snapshots_at_rolls_bound_the_replay_and_old_ones_are_pruned(tmp_path):
    log = open_log(tmp_path / "p", config=LogConfig(segment_bytes=600, index_interval_bytes=128))
    for i in range(40):
        add_idmp(log, b"p", b"id%d" % i, b"x" * 100)
    files = snapshot_files(tmp_path / "p")
    assert files[0] == "00000000000000000000.producers"  # the oldest stays: it marks the history
    assert len(files) == 3
    bases = [s.base_offset for s in log.segments()]
    assert int(files[-1][:20]) == bases[-1]
    log.close()


def test_a_snapshot_every_so_many_records(tmp_path, monkeypatch):
    import storage.producers as producers
    monkeypatch.setattr(producers, "SNAPSHOT_EVERY_RECORDS", 4)
    assert SNAPSHOT_EVERY_RECORDS > 4
    log = open_log(tmp_path / "p", config=LogConfig())
    for i in range(9):
        add_idmp(log, b"p", b"id%d" % i)
    assert [int(f[:20]) for f in snapshot_files(tmp_path / "p")] == [0, 4, 8]
    log.close()


def test_a_snapshot_above_the_log_end_is_deleted_at_open(tmp_path):
    log = open_log(tmp_path / "p")
    add_idmp(log, b"p", b"a")
    log.close()
    stray = tmp_path / "p" / ("%020d.producers" % 50)
    (tmp_path / "p" / ("%020d.producers" % 1)).rename(stray)
    log = open_log(tmp_path / "p")
    assert not stray.exists()
    assert log.producers.find_id(idmp_producer(b"p"), idmp_token(b"a"), 1_000_000) is not None  # replayed from 0
    log.close()


def test_a_corrupt_snapshot_is_skipped_for_an_older_one(tmp_path, caplog):
    log = open_log(tmp_path / "p")
    add_idmp(log, b"p", b"a")
    add_idmp(log, b"p", b"b")
    log.close()
    newest = tmp_path / "p" / snapshot_files(tmp_path / "p")[-1]
    newest.write_bytes(newest.read_bytes()[:-1] + b"\0")
    with caplog.at_level(logging.WARNING, logger="partita.storage"):
        log = open_log(tmp_path / "p")
        assert log.producers.id_counts(1_000_000) == (1, 2)
    assert "ignoring producer snapshot" in caplog.text
    log.close()


def test_a_follower_copying_batches_builds_the_same_table(tmp_path):
    leader = open_log(tmp_path / "leader")
    follower = open_log(tmp_path / "follower")
    leader.append(entries(1, 2))
    add_idmp(leader, b"p", b"a")
    ms = leader.last_id[0] + 1
    leader.append([(ms + i, 0, enc(ms + i, 0)) for i in range(3)], producers=[seq(9, 0, 0, 3)])
    data, _ = leader.read_batches(0, 1 << 20)
    follower.append_raw(data)
    assert state_of(follower) == state_of(leader)
    assert snapshot_files(tmp_path / "follower") == ["00000000000000000000.producers"]
    leader.close()
    follower.abandon()
    follower = open_log(tmp_path / "follower")
    assert state_of(follower) == state_of(open_log(tmp_path / "leader"))
    follower.close()


def test_a_fetch_from_inside_a_batch_keeps_the_records_of_the_suffix(tmp_path):
    leader = open_log(tmp_path / "leader")
    ms = 1
    leader.append([(ms + i, 0, enc(ms + i, 0)) for i in range(4)],
                  producers=[idmp(b"p", b"first", 0), idmp(b"p", b"third", 2)])
    data, _ = leader.read_batches(1, 1 << 20)
    assert records.producer_records(data) == [idmp(b"p", b"third", 1)]


def test_truncate_reloads_the_table_from_below_the_cut(tmp_path):
    log = open_log(tmp_path / "p", config=LogConfig(segment_bytes=600, index_interval_bytes=128))
    for i in range(20):
        add_idmp(log, b"p", b"id%d" % i, b"x" * 100)
    log.truncate_to(7)
    found = [i for i in range(20)
             if log.producers.find_id(idmp_producer(b"p"), idmp_token(b"id%d" % i), 1_000_000)]
    assert found == list(range(7))
    assert all(int(f[:20]) <= 7 for f in snapshot_files(tmp_path / "p"))
    add_idmp(log, b"p", b"id19")
    log.close()
    log = open_log(tmp_path / "p")
    assert log.producers.find_id(idmp_producer(b"p"), idmp_token(b"id19"), 1_000_000).offset == 7
    assert log.producers.find_id(idmp_producer(b"p"), idmp_token(b"id10"), 1_000_000) is None
    log.close()


def test_truncate_inside_a_batch_keeps_the_records_of_the_prefix(tmp_path):
    log = open_log(tmp_path / "p")
    log.append([(1 + i, 0, enc(1 + i, 0)) for i in range(4)],
               producers=[idmp(b"p", b"a", 0), idmp(b"p", b"c", 2)])
    log.truncate_to(2)
    assert log.producers.find_id(idmp_producer(b"p"), idmp_token(b"a"), 1_000_000) is not None
    assert log.producers.find_id(idmp_producer(b"p"), idmp_token(b"c"), 1_000_000) is None
    log.close()
    log = open_log(tmp_path / "p")
    assert log.producers.id_counts(1_000_000) == (1, 1)
    log.close()


def test_an_emptied_log_has_no_producers(tmp_path):
    log = open_log(tmp_path / "p")
    add_idmp(log, b"p", b"a")
    log.restart_at(10)
    assert snapshot_files(tmp_path / "p") == []
    assert log.producers.id_counts(1_000_000) == (0, 0)
    log.close()


def test_the_window_keeps_the_newest_records_and_expires_old_ones(tmp_path):
    clock = Clock()
    log = open_log(tmp_path / "p", clock)
    log.producers.configure(3, 10_000)
    for i in range(5):
        add_idmp(log, b"p", b"id%d" % i)
    pid = idmp_producer(b"p")
    assert [i for i in range(5) if log.producers.find_id(pid, idmp_token(b"id%d" % i), clock())] == [2, 3, 4]
    clock.now_ms += 9_999
    assert log.producers.find_id(pid, idmp_token(b"id4"), clock()) is not None
    clock.now_ms += 1
    assert log.producers.find_id(pid, idmp_token(b"id4"), clock()) is None
    assert log.producers.id_counts(clock()) == (0, 0)
    assert log.producers.ids_added == 5
    log.close()


def test_clear_ids_forgets_the_records_below_its_offset_on_every_replica(tmp_path):
    leader = open_log(tmp_path / "leader")
    add_idmp(leader, b"p", b"a")
    add_idmp(leader, b"p", b"b")
    leader.producers.clear_ids(leader.log_end_offset)
    add_idmp(leader, b"p", b"c")
    pid = idmp_producer(b"p")
    assert [i for i in b"abc" if leader.producers.find_id(pid, idmp_token(bytes([i])), 1_000_000)] == [ord("c")]
    # A follower told of the forgetting before it copied the batches below it.
    follower = open_log(tmp_path / "follower")
    follower.producers.clear_ids(2)
    follower.append_raw(leader.read_batches(0, 1 << 20)[0])
    assert state_of(follower) == state_of(leader)
    leader.close()
    leader = open_log(tmp_path / "leader")
    assert leader.producers.id_counts(1_000_000) == (1, 1)
    assert leader.producers.ids_added == 3
    leader.close()
    follower.close()


def test_a_sequence_producer_keeps_its_last_batches_of_its_epoch(tmp_path):
    log = open_log(tmp_path / "p")
    ms = 1
    for n in range(7):
        log.append([(ms, 0, enc(ms, 0)), (ms + 1, 0, enc(ms + 1, 0))], producers=[seq(42, 0, 2 * n, 2)])
        ms += 2
    p = log.producers.sequence_producer(sequence_producer(42))
    assert len(p.window) == SEQUENCE_WINDOW
    assert p.last()[1].offset == 12
    log.append([(ms, 0, enc(ms, 0))], producers=[seq(42, 1, 0, 1)])
    p = log.producers.sequence_producer(sequence_producer(42))
    assert (p.epoch, len(p.window)) == (1, 1)
    log.close()


def test_a_follower_refuses_a_batch_with_an_unknown_producer_kind(tmp_path):
    head, body = records.encode_batch(0, entries(1, 1), 0, 5, producers=[idmp(b"p", b"i")])
    body = body[:-44] + records.PRODUCER_RECORD.pack(*idmp(b"p", b"i")._replace(kind=3))
    batch = head[:12] + crc32c(body).to_bytes(4, "little") + body
    log = open_log(tmp_path / "p")
    with pytest.raises(InvalidBatchError, match="unknown producer record kind 3"):
        log.append_raw(batch)
    assert log.log_end_offset == 0
    log.close()
