"""Idempotent appends in the broker (cluster/broker/producers.py): XADD IDMP /
IDMPAUTO and XCFGSET, and the Kafka idempotent producer's ``produce``, on a
real topic registry with a fake clock."""

from __future__ import annotations

import types

import pytest

from cluster.broker import (
    ACCEPTED,
    DUPLICATE,
    FENCED,
    OUT_OF_ORDER,
    Broker,
    Idempotence,
    Trim,
    XAddPlan,
)
from cluster.topics import TopicRegistry
from storage.entry_codec import decode_entry, split_entries
from storage.streams import StreamId


class Clock:
    def __init__(self, now_ms: int = 1_700_000_000_000) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


class RecordingDurability:
    def __init__(self) -> None:
        self.noted: list = []

    def note_write(self, log, policy: str) -> int:
        self.noted.append(log)
        return len(self.noted) if policy == "always" else 0


def idmp(session, key: bytes, pid: bytes, iid: bytes | None, *fields: bytes, **kw):
    return session.append(XAddPlan(key, list(fields or (b"f", b"v")), idmp=Idempotence(pid, iid), **kw))


def info(session, key: bytes = b"s"):
    return session.stream_info(key).idmp


# -- XADD IDMP / IDMPAUTO -------------------------------------------------------------


def test_a_retry_answers_the_original_id_and_writes_nothing(make_broker):
    session = make_broker(clock_ms=Clock()).session()
    first = idmp(session, b"s", b"p1", b"payment-abc", b"amount", b"100")
    again = idmp(session, b"s", b"p1", b"payment-abc", b"amount", b"200")
    assert again == first
    assert session.length(b"s") == 1
    found = session.range(b"s", StreamId(0, 0), StreamId(2**64 - 1, 2**64 - 1), None, False)
    assert [decode_entry(e) for e in split_entries(found.chunks)] == [(first, [b"amount", b"100"])]
    got = info(session)
    assert (got.pids_tracked, got.iids_tracked, got.iids_added, got.iids_duplicates) == (1, 1, 1, 1)
    assert (got.duration_s, got.maxsize) == (100, 100)


def test_a_duplicate_reply_waits_for_the_originals_durability(make_broker):
    broker = make_broker(clock_ms=Clock(), fsync="always")
    broker.durability = RecordingDurability()
    writer, retrier = broker.session(), broker.session()
    writer.may_defer = retrier.may_defer = True
    idmp(writer, b"s", b"p", b"i")
    assert writer.deferred is None  # never deferred: the record is in the entry's batch
    assert idmp(retrier, b"s", b"p", b"i") is not None
    assert retrier.take_receipt().flush_seq  # the retry's reply waits as the original's does


def test_producers_and_ids_are_separate_and_idmpauto_ignores_the_pairs_order(make_broker):
    session = make_broker(clock_ms=Clock()).session()
    a = idmp(session, b"s", b"p1", b"req")
    b = idmp(session, b"s", b"p2", b"req")
    c = idmp(session, b"s", b"p1", None, b"x", b"1", b"y", b"2")
    assert len({a, b, c}) == 3
    assert idmp(session, b"s", b"p1", None, b"y", b"2", b"x", b"1") == c
    assert idmp(session, b"s", b"p2", None, b"y", b"2", b"x", b"1") != c  # another producer
    assert idmp(session, b"s", b"p1", None, b"x", b"1", b"y", b"3") != c
    assert session.length(b"s") == 5
    assert info(session).pids_tracked == 2


def test_a_duplicate_is_not_trimmed_and_nomkstream_creates_nothing(make_broker):
    session = make_broker(clock_ms=Clock()).session()
    assert idmp(session, b"s", b"p", b"i", nomkstream=True) is None
    assert not session.exists(b"s")
    first = idmp(session, b"s", b"p", b"i")
    idmp(session, b"s", b"p", b"j")
    assert idmp(session, b"s", b"p", b"i", trim=Trim("MAXLEN", maxlen=0)) == first
    assert session.length(b"s") == 2  # a duplicate writes nothing, trims nothing


def test_maxsize_keeps_the_newest_ids_of_each_producer(make_broker):
    session = make_broker(clock_ms=Clock()).session()
    idmp(session, b"s", b"p1", b"init")
    assert session.configure_idempotence(b"s", 60, 3)
    ids = {(pid, i): idmp(session, b"s", pid, b"req-%d" % i) for pid in (b"p1", b"p2") for i in range(1, 5)}
    for pid in (b"p1", b"p2"):
        assert idmp(session, b"s", pid, b"req-1") != ids[(pid, 1)]  # evicted
        assert idmp(session, b"s", pid, b"req-4") == ids[(pid, 4)]
    got = info(session)
    assert (got.pids_tracked, got.iids_tracked, got.maxsize, got.duration_s) == (2, 6, 3, 60)


def test_duration_forgets_ids_once_it_elapsed(make_broker):
    clock = Clock()
    session = make_broker(clock_ms=clock).session()
    idmp(session, b"s", b"p", b"warm-up")
    assert session.configure_idempotence(b"s", 2, None)
    first = idmp(session, b"s", b"p", b"i")
    clock.now_ms += 1_999
    assert idmp(session, b"s", b"p", b"i") == first
    clock.now_ms += 1
    assert idmp(session, b"s", b"p", b"i") != first
    assert info(session).iids_tracked == 1


def test_xcfgset_forgets_the_ids_only_when_a_value_changes(make_broker):
    session = make_broker(clock_ms=Clock(), stream_idmp_duration=100, stream_idmp_maxsize=100).session()
    first = idmp(session, b"s", b"p", b"i")
    assert session.configure_idempotence(b"s", 100, 100)  # the defaults again: nothing forgotten
    assert idmp(session, b"s", b"p", b"i") == first
    assert session.configure_idempotence(b"s", 50, None)
    assert info(session).iids_tracked == 0
    second = idmp(session, b"s", b"p", b"i")
    assert second != first
    assert idmp(session, b"s", b"p", b"i") == second
    got = info(session)
    assert (got.iids_added, got.iids_duplicates, got.duration_s, got.maxsize) == (2, 2, 50, 100)
    assert not session.configure_idempotence(b"missing", 5, None)


def test_the_server_defaults_apply_where_xcfgset_set_nothing(make_broker):
    session = make_broker(clock_ms=Clock(), stream_idmp_duration=7, stream_idmp_maxsize=2).session()
    for i in range(3):
        idmp(session, b"s", b"p", b"%d" % i)
    got = info(session)
    assert (got.duration_s, got.maxsize, got.iids_tracked) == (7, 2, 2)


def test_on_a_topic_key_a_producer_goes_to_one_partition(make_broker):
    session = make_broker(clock_ms=Clock(), default_partitions=4).session()
    session.append(XAddPlan(b"t", [b"f", b"v"]))  # creates the topic
    first = {pid: idmp(session, b"t", pid, b"req") for pid in (b"a", b"b", b"c", b"d", b"e")}
    for pid, entry_id in first.items():
        assert idmp(session, b"t", pid, b"req") == entry_id  # round-robin would have moved it
    assert session.length(b"t") == 6
    assert session.configure_idempotence(b"t", 9, None)
    assert {session.stream_info(b"t#%d" % n).idmp.duration_s for n in range(4)} == {9}


def test_the_ids_survive_a_restart(tmp_path):
    config = types.SimpleNamespace(segment_bytes=1 << 20, stream_node_max_entries=100, fsync="everysec",
                                   max_blocked_clients=0, default_partitions=1, group_session_timeout_ms=10_000)
    registry = TopicRegistry.open(tmp_path / "data", config)
    session = Broker(registry, config).session()
    first = idmp(session, b"s", b"p", b"i")
    session.configure_idempotence(b"s", None, 50)
    second = idmp(session, b"s", b"p", b"i")
    idmp(session, b"s", b"p", b"i")
    registry.close()
    registry = TopicRegistry.open(tmp_path / "data", config)
    session = Broker(registry, config).session()
    assert idmp(session, b"s", b"p", b"i") == second != first
    got = info(session)
    assert (got.maxsize, got.iids_added, got.iids_duplicates) == (50, 2, 2)
    registry.close()


# -- Kafka's idempotent producer -----------------------------------------------------


def batch(n: int, tag: bytes = b"v") -> list[list[bytes]]:
    return [[b"key", b"k%d" % i, b"value", tag] for i in range(n)]


def test_produce_accepts_in_sequence_and_answers_a_retry_with_the_original_offsets(make_broker):
    session = make_broker(clock_ms=Clock()).session()
    session.append(XAddPlan(b"t", [b"f", b"v"]))
    first = session.produce(b"t", batch(3), 7, 0, 0)
    assert (first.outcome, first.base_offset, first.last_offset) == (ACCEPTED, 1, 3)
    second = session.produce(b"t", batch(2), 7, 0, 3)
    assert (second.outcome, second.base_offset, second.last_offset) == (ACCEPTED, 4, 5)
    again = session.produce(b"t", batch(3, b"other"), 7, 0, 0)
    assert again == first.__class__(DUPLICATE, 1, 3, first.first_id, first.timestamp_ms)
    assert session.length(b"t") == 6


def test_produce_after_xsetid_below_trimmed_entries_appends_above_them(make_broker):
    # XSETID may go below entries trimmed away (Redis 7.2); the log still
    # holds their IDs, so a produced batch's IDs must exceed them, as XADD *'s do.
    session = make_broker(clock_ms=Clock()).session()
    future_ms = 10**15  # beyond any wall clock: IDs continue from it
    session.append(XAddPlan(b"t", [b"f", b"v"], id_ms=future_ms, id_seq=0, trim=Trim("MAXLEN", maxlen=0)))
    assert session.set_id(b"t", StreamId(5, 0), None, None)
    produced = session.produce(b"t", batch(2), 7, 0, 0)
    assert (produced.outcome, produced.first_id) == (ACCEPTED, (future_ms, 1))
    assert session.append(XAddPlan(b"t", [b"f", b"v"])) == (future_ms, 3)


def test_produce_refuses_gaps_old_epochs_and_a_new_epoch_not_at_zero(make_broker):
    session = make_broker(clock_ms=Clock()).session()
    session.append(XAddPlan(b"t", [b"f", b"v"]))
    assert session.produce(b"t", batch(2), 1, 3, 10).outcome == ACCEPTED  # an unknown producer starts anywhere
    assert session.produce(b"t", batch(1), 1, 3, 13).outcome == OUT_OF_ORDER  # 12 expected
    assert session.produce(b"t", batch(1), 1, 3, 11).outcome == OUT_OF_ORDER  # inside the last batch
    assert session.produce(b"t", batch(1), 1, 2, 12).outcome == FENCED
    assert session.produce(b"t", batch(1), 1, 4, 5).outcome == OUT_OF_ORDER
    assert session.produce(b"t", batch(1), 1, 4, 0).outcome == ACCEPTED
    assert session.produce(b"t", batch(1), 1, 3, 12).outcome == FENCED  # the old epoch is fenced now
    assert session.produce(b"t", batch(2), 1, 3, 10).outcome == FENCED  # ... and so are its retries
    assert session.length(b"t") == 4


def test_produce_remembers_the_last_five_batches(make_broker):
    session = make_broker(clock_ms=Clock()).session()
    session.append(XAddPlan(b"t", [b"f", b"v"]))
    offsets = [session.produce(b"t", batch(1), 9, 0, n).base_offset for n in range(6)]
    for n in range(1, 6):
        got = session.produce(b"t", batch(1), 9, 0, n)
        assert (got.outcome, got.base_offset) == (DUPLICATE, offsets[n])
    assert session.produce(b"t", batch(1), 9, 0, 0).outcome == OUT_OF_ORDER  # out of the window
    assert session.produce(b"t", batch(1), 9, 0, 6).outcome == ACCEPTED


def test_produce_sequences_wrap(make_broker):
    session = make_broker(clock_ms=Clock()).session()
    session.append(XAddPlan(b"t", [b"f", b"v"]))
    assert session.produce(b"t", batch(2), 5, 0, 2**31 - 2).outcome == ACCEPTED
    assert session.produce(b"t", batch(1), 5, 0, 0).outcome == ACCEPTED


def test_a_produce_duplicate_waits_for_the_originals_durability(make_broker):
    broker = make_broker(clock_ms=Clock(), fsync="always")
    broker.durability = RecordingDurability()
    session = broker.session()
    session.append(XAddPlan(b"t", [b"f", b"v"]))
    session.produce(b"t", batch(1), 5, 0, 0)
    session.take_receipt()
    assert session.produce(b"t", batch(1), 5, 0, 0).outcome == DUPLICATE
    assert session.take_receipt().flush_seq


def test_produce_needs_an_existing_partition(make_broker):
    from cluster.topics import TopicError
    session = make_broker(clock_ms=Clock()).session()
    with pytest.raises(TopicError):
        session.produce(b"missing", batch(1), 5, 0, 0)
