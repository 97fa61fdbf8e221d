"""The Stream model on a partition log: IDs, XDEL, trims, XSETID, metadata durability.

Runs on the real ``storage.log.PartitionLog`` in ``tmp_path`` and on the
in-memory contract stand-in (``fake_log``), so a disagreement between the two
shows up as a failure of exactly one parameter.
"""

from __future__ import annotations

import importlib.util

import pytest

from storage.entry_codec import decode_entry, encode_entry, split_entries
from storage.streams.ids import MAX_ID, MIN_ID, UINT64_MAX, StreamId
from storage.streams.stream import (
    ID_EXHAUSTED,
    ID_TOO_SMALL,
    ID_ZERO,
    SEQ_EXHAUSTED,
    SETID_BELOW_MAX_DELETED,
    SETID_BELOW_TOP,
    SETID_ENTRIES_ADDED_BELOW_LENGTH,
    Stream,
    StreamError,
)
from tests.storage.streams.fake_log import FakeLog

HAVE_REAL_LOG = importlib.util.find_spec("storage.log") is not None


class Clock:
    def __init__(self, now_ms: int = 1000) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


def _open_log(kind, path, segment_entries=1000):
    if kind == "fake":
        path.mkdir(parents=True, exist_ok=True)
        return FakeLog(dir=path, segment_entries=segment_entries)
    from storage.log import LogConfig, PartitionLog

    # ~60 bytes per small entry in a batch: roll roughly every segment_entries entries.
    return PartitionLog.open(path, LogConfig(segment_bytes=max(segment_entries * 60, 256)))


@pytest.fixture(params=["fake", pytest.param("real", marks=pytest.mark.skipif(
    not HAVE_REAL_LOG, reason="storage.log.PartitionLog has not landed yet"))])
def make_stream(request, tmp_path):
    opened = []

    def make(segment_entries=1000, clock=None, reopen_from=None):
        log = reopen_from or _open_log(request.param, tmp_path / "p0", segment_entries)
        stream = Stream(log, tmp_path / "p0" / "stream.meta", clock_ms=clock or Clock())
        opened.append(log)
        return stream

    make.kind = request.param
    make.path = tmp_path / "p0"
    yield make
    for log in opened:
        close = getattr(log, "close", None)
        if close:
            close()


def ids_of(entries) -> list[StreamId]:
    return [decode_entry(e)[0] for e in split_entries(entries.chunks)]


def test_auto_ids_follow_clock_and_never_go_back(make_stream):
    clock = Clock(1000)
    s = make_stream(clock=clock)
    assert s.add([b"a", b"1"]) == StreamId(1000, 0)
    assert s.add([b"a", b"2"]) == StreamId(1000, 1)
    clock.now_ms = 900  # wall clock stepped back
    assert s.add([b"a", b"3"]) == StreamId(1000, 2)
    clock.now_ms = 2000
    assert s.add([b"a", b"4"]) == StreamId(2000, 0)
    assert s.length == 4 and s.entries_added == 4 and s.last_id == StreamId(2000, 0)


def test_explicit_and_partial_ids(make_stream):
    s = make_stream()
    assert s.add([b"a", b"1"], ms_given=0) == StreamId(0, 1)
    assert s.add([b"a", b"1"], id_given=StreamId(5, 5)) == StreamId(5, 5)
    assert s.add([b"a", b"1"], ms_given=5) == StreamId(5, 6)
    assert s.add([b"a", b"1"], ms_given=7) == StreamId(7, 0)
    for kwargs in ({"id_given": StreamId(7, 0)}, {"id_given": StreamId(6, 9)}, {"ms_given": 6}):
        with pytest.raises(StreamError) as info:
            s.add([b"a", b"1"], **kwargs)
        assert info.value.code == ID_TOO_SMALL
    s.add([b"a", b"1"], id_given=StreamId(8, UINT64_MAX))
    with pytest.raises(StreamError) as info:
        s.add([b"a", b"1"], ms_given=8)
    assert info.value.code == SEQ_EXHAUSTED


def test_an_explicit_zero_id_is_refused_as_such(make_stream):
    """0-0 is never an entry ID: the refusal says so (Redis's "must be
    greater than 0-0"), not "equal or smaller", on an empty stream too."""
    s = make_stream()
    with pytest.raises(StreamError) as info:
        s.add([b"a", b"1"], id_given=MIN_ID)
    assert info.value.code == ID_ZERO
    assert s.length == 0


def test_exhausted(make_stream):
    s = make_stream()
    s.add([b"a", b"1"], id_given=MAX_ID)
    with pytest.raises(StreamError) as info:
        s.add([b"a", b"1"])
    assert info.value.code == ID_EXHAUSTED


def test_range_and_read_after(make_stream):
    s = make_stream()
    for i in range(1, 11):
        s.add([b"n", b"%d" % i], id_given=StreamId(i, 0))
    assert ids_of(s.range(StreamId(3, 0), StreamId(5, UINT64_MAX))) == [(3, 0), (4, 0), (5, 0)]
    assert ids_of(s.range(MIN_ID, MAX_ID, 2, rev=True)) == [(10, 0), (9, 0)]
    assert s.range(StreamId(6, 0), StreamId(5, 0)).count == 0
    assert ids_of(s.read_after(StreamId(8, 0))) == [(9, 0), (10, 0)]
    assert ids_of(s.read_after(StreamId(2, 5), 1)) == [(3, 0)]
    assert s.read_after(StreamId(10, 0)).count == 0


def test_xdel_markers_and_metadata(make_stream):
    s = make_stream()
    for i in range(1, 6):
        s.add([b"n", b"%d" % i], id_given=StreamId(i, 0))
    assert s.delete([StreamId(2, 0), StreamId(2, 0), StreamId(9, 9), StreamId(4, 1)]) == 1
    assert s.delete([StreamId(2, 0)]) == 0
    assert s.length == 4 and s.max_deleted_entry_id == (2, 0)
    assert ids_of(s.range(MIN_ID, MAX_ID)) == [(1, 0), (3, 0), (4, 0), (5, 0)]
    assert s.delete([StreamId(1, 0), StreamId(5, 0)]) == 2
    assert s.first_entry_id() == (3, 0)
    assert s.last_id == (5, 0) and s.last_live_id() == (4, 0)
    assert s.max_deleted_entry_id == (5, 0)
    assert s.entries_added == 5
    # Survives a reopen of the stream metadata.
    again = Stream(s.log, s.meta_path)
    assert again.max_deleted_entry_id == (5, 0) and again.last_id == (5, 0)


@pytest.mark.parametrize("content", [b"{garbage", b"[" * 100000])
def test_a_corrupt_stream_meta_is_rebuilt_from_the_log(make_stream, caplog, content):
    """A ``stream.meta`` that does not parse (nested deeper than the parser
    goes, which json raises RecursionError for, included): the stream opens
    with what the log knows, last-generated-id and max-deleted-entry-id its
    last ID, and says so."""
    s = make_stream()
    for i in range(1, 6):
        s.add([b"n", b"%d" % i], id_given=StreamId(i, 0))
    s.delete([StreamId(2, 0)])
    s.set_id(StreamId(9, 0), entries_added=20)
    s.meta_path.write_bytes(content)
    with caplog.at_level("WARNING", logger="partita.storage"):
        again = Stream(s.log, s.meta_path)
    assert "stream.meta: corrupt stream metadata" in caplog.text
    assert (again.last_id, again.max_deleted_entry_id, again.entries_added) == ((5, 0), (5, 0), 5)


def test_delete_everything_then_first_id_is_zero(make_stream):
    s = make_stream()
    s.add([b"a", b"1"], id_given=StreamId(1, 1))
    s.delete([StreamId(1, 1)])
    assert s.length == 0 and s.first_entry_id() == MIN_ID and s.last_id == (1, 1)
    assert s.first_entry() is None and s.last_entry() is None


def test_trim_maxlen_exact_counts_live_entries(make_stream):
    s = make_stream()
    for i in range(1, 11):
        s.add([b"n", b"%d" % i], id_given=StreamId(i, 0))
    s.delete([StreamId(8, 0), StreamId(9, 0)])  # 8 live
    assert s.trim_maxlen(3) == 5
    assert ids_of(s.range(MIN_ID, MAX_ID)) == [(6, 0), (7, 0), (10, 0)]
    assert s.trim_maxlen(3) == 0
    assert s.trim_maxlen(0) == 3
    assert s.length == 0 and s.last_id == (10, 0) and s.entries_added == 10


def test_trim_minid_exact(make_stream):
    s = make_stream()
    for i in range(1, 11):
        s.add([b"n", b"%d" % i], id_given=StreamId(i, 0))
    assert s.trim_minid(StreamId(4, 0)) == 3
    assert s.first_entry_id() == (4, 0)
    assert s.trim_minid(StreamId(2, 0)) == 0
    assert s.max_deleted_entry_id == MIN_ID  # Redis does not count trims as deletions


def test_trim_approx_removes_whole_nodes(make_stream):
    # Nodes of 10 entries from offset 0 (Redis's stream-node-max-entries),
    # whatever the segments: [1..10] [11..20] [21..30] [31..35].
    s = make_stream(segment_entries=7)
    for i in range(1, 36):
        s.add([b"n", b"%d" % i], id_given=StreamId(i, 0))
    assert s.node_count(10) == 4
    assert s.trim_maxlen(12, approx=True, node_entries=10) == 20  # the third node would leave 5
    assert s.first_entry_id() == (21, 0) and s.length == 15
    assert s.trim_maxlen(0, approx=True, limit=9, node_entries=10) == 0  # a node of 10 passes LIMIT 9
    assert s.trim_maxlen(0, approx=True, limit=10, node_entries=10) == 10
    assert s.trim_minid(StreamId(35, 0), approx=True, node_entries=10) == 0  # 35 is in the last node
    assert s.trim_minid(StreamId(1000, 0), approx=True, node_entries=10) == 5
    assert s.length == 0 and s.node_count(10) == 0


def test_trim_approx_nodes_keep_their_place_after_exact_trims_and_deletions(make_stream):
    # As Redis: nodes of 4 ([1..4] [5..8] [9, 10]); an exact trim and an XDEL
    # mark entries inside nodes, which stay where they were and go whole.
    s = make_stream()
    for i in range(1, 11):
        s.add([b"n", b"%d" % i], id_given=StreamId(i, 0))
    assert s.trim_maxlen(9) == 1
    s.delete([StreamId(6, 0)])
    assert s.node_count(4) == 3
    assert s.trim_maxlen(5, approx=True, node_entries=4) == 3  # [2..4] goes; [5, 7, 8] would leave 2
    assert ids_of(s.range(MIN_ID, MAX_ID)) == [(5, 0), (7, 0), (8, 0), (9, 0), (10, 0)]
    assert s.trim_maxlen(2, approx=True, node_entries=4) == 3
    s.delete([StreamId(9, 0)])
    assert s.node_count(4) == 1
    s.delete([StreamId(10, 0)])
    assert s.node_count(4) == 0 and s.length == 0


def test_setid_rules(make_stream):
    s = make_stream()
    for i in range(1, 4):
        s.add([b"n", b"%d" % i], id_given=StreamId(i, 0))
    with pytest.raises(StreamError) as info:
        s.set_id(StreamId(2, 0))
    assert info.value.code == SETID_BELOW_TOP
    with pytest.raises(StreamError) as info:
        s.set_id(StreamId(5, 0), entries_added=2)
    assert info.value.code == SETID_ENTRIES_ADDED_BELOW_LENGTH
    s.set_id(StreamId(5, 0), entries_added=10, max_deleted_entry_id=StreamId(4, 0))
    assert s.last_id == (5, 0) and s.entries_added == 10 and s.max_deleted_entry_id == (4, 0)
    with pytest.raises(StreamError) as info:  # Redis 7.2+: not below the max-deleted-entry-id
        s.set_id(StreamId(3, 5))
    assert info.value.code == SETID_BELOW_MAX_DELETED
    with pytest.raises(StreamError) as info:
        s.add([b"a", b"1"], id_given=StreamId(5, 0))
    assert info.value.code == ID_TOO_SMALL
    assert s.add([b"a", b"1"], ms_given=5) == (5, 1)
    assert s.entries_added == 11
    again = Stream(s.log, s.meta_path)
    assert again.last_id == (5, 1) and again.entries_added == 11 and again.max_deleted_entry_id == (4, 0)


def test_setid_on_a_stream_trimmed_empty_goes_below_the_trimmed_ids(make_stream):
    # Redis checks the entries that exist: XADD MAXLEN 0 leaves none, so any
    # ID not below max-deleted-entry-id is accepted.
    s = make_stream()
    s.add([b"a", b"b"], id_given=StreamId(1000, 0))
    assert s.trim_maxlen(0) == 1
    s.set_id(StreamId(200, 0))
    assert s.last_id == (200, 0) and s.entries_added == 1
    again = Stream(s.log, s.meta_path)  # persisted
    assert again.last_id == (200, 0)
    # The log keeps 1000-0 (trimmed): a new ID must exceed it (Partita's difference).
    with pytest.raises(StreamError) as info:
        s.add([b"a", b"1"], id_given=StreamId(300, 0))
    assert info.value.code == ID_TOO_SMALL
    assert s.add([b"a", b"1"]) > (1000, 0)  # ``*``
    assert s.last_id > (1000, 0)


def test_encoded_entries_after_setid_below_the_trimmed_ids_must_go_above_them(make_stream):
    # ``append_encoded`` (a Kafka producer's batch) takes IDs above
    # ``id_floor``, the highest ID the log holds, not above XSETID's lower
    # last-generated-id (IDs only increase along a log).
    s = make_stream()
    s.add([b"a", b"b"], id_given=StreamId(1000, 0))
    s.trim_maxlen(0)
    s.set_id(StreamId(200, 0))
    assert s.id_floor == (1000, 0)
    with pytest.raises(StreamError) as info:
        s.append_encoded([(300, 0, encode_entry((300, 0), [b"k", b"1"]))])
    assert info.value.code == ID_TOO_SMALL
    s.append_encoded([(1000, 1 + i, encode_entry((1000, 1 + i), [b"k", b"%d" % i])) for i in range(2)])
    assert s.last_id == (1000, 2) and s.length == 2


def test_setid_below_a_deleted_top_entry(make_stream):
    # XDEL raises max-deleted-entry-id, which XSETID may not go below (7.2+);
    # once MAXDELETEDID lowered it, Redis accepts an ID below the deleted
    # top entry, and so does Partita, whose log keeps that entry's ID.
    s = make_stream()
    s.add([b"a", b"1"], id_given=StreamId(1, 0))
    s.add([b"a", b"1"], id_given=StreamId(5, 0))
    s.delete([StreamId(5, 0)])
    with pytest.raises(StreamError) as info:
        s.set_id(StreamId(4, 0))
    assert info.value.code == SETID_BELOW_MAX_DELETED
    s.set_id(StreamId(5, 0), max_deleted_entry_id=StreamId(0, 1))  # lowers max-deleted
    s.set_id(StreamId(4, 0))
    assert s.last_id == (4, 0)
    with pytest.raises(StreamError):
        s.add([b"a", b"1"], id_given=StreamId(4, 5))
    assert s.add([b"a", b"1"], id_given=StreamId(6, 0)) == (6, 0)
    assert s.last_id == (6, 0)


def test_exact_maxlen_after_random_deletions_matches_a_model(make_stream):
    import random

    rng = random.Random(7)
    s = make_stream(segment_entries=16)
    model = []
    for i in range(1, 121):
        s.add([b"n", b"%d" % i], id_given=StreamId(i, 0))
        model.append(StreamId(i, 0))
    for _ in range(8):
        doomed = rng.sample(model, min(15, len(model) // 2))
        assert s.delete(doomed) == len(doomed)
        model = [m for m in model if m not in doomed]
        keep = rng.randrange(0, len(model))
        assert s.trim_maxlen(keep) == len(model) - keep
        model = model[len(model) - keep:]
        assert ids_of(s.range(MIN_ID, MAX_ID)) == model and s.length == len(model)
        for _ in range(30):  # refill
            nxt = StreamId(s.last_id.ms + 1, 0)
            s.add([b"n", b"x"], id_given=nxt)
            model.append(nxt)


def test_deferred_adds_assign_ids_now_and_commit_as_one_batch(make_stream):
    clock = Clock(5000)
    s = make_stream(clock=clock)
    first = s.add([b"f", b"a"])
    deferred = [s.add([b"f", b"%d" % i], defer=True) for i in range(3)]
    assert s.pending and s.pending_bytes > 0
    # IDs keep increasing through deferred entries; the log has not seen them.
    assert deferred == [StreamId(5000, 1), StreamId(5000, 2), StreamId(5000, 3)]
    assert s.last_id == StreamId(5000, 3)
    assert s.log.log_end_offset == 1
    s.commit()
    assert not s.pending and s.pending_bytes == 0
    assert s.log.log_end_offset == 4 and s.length == 4
    assert ids_of(s.range(MIN_ID, MAX_ID)) == [first, *deferred]
    if make_stream.kind == "real":
        # One batch for the three deferred entries: two batch headers in all.
        from storage import records
        seg = s.log.segments()[-1]
        data = open(seg.path, "rb").read()
        h1 = records.unpack_header(data, 0)
        h2 = records.unpack_header(data, h1[records.H_LENGTH])
        assert (h1[records.H_COUNT], h2[records.H_COUNT]) == (1, 3)


def test_entries_encoded_elsewhere_are_deferred_like_adds(make_stream):
    s = make_stream(clock=Clock(6000))
    a = s.add([b"f", b"1"], defer=True)
    made = [(6000, 1, encode_entry((6000, 1), [b"f", b"2"])), (6000, 2, encode_entry((6000, 2), [b"g", b"3"]))]
    before = s.pending_bytes
    s.defer_encoded(made, (6000, 2), 99)
    assert s.last_id == StreamId(6000, 2) and s.pending_bytes == before + 99
    with pytest.raises(StreamError):  # not above the last ID: refused, nothing kept
        s.defer_encoded([(6000, 2, made[1][2])], (6000, 2), 10)
    with pytest.raises(StreamError):  # ``last`` must be the last entry's ID
        s.defer_encoded([(6000, 3, made[1][2])], (6000, 4), 10)
    assert s.add([b"h", b"4"], defer=True) == StreamId(6000, 3)
    s.commit()
    entries = s.range(MIN_ID, MAX_ID)
    assert ids_of(entries) == [a, StreamId(6000, 1), StreamId(6000, 2), StreamId(6000, 3)]
    assert decode_entry(split_entries(entries.chunks)[2]) == (StreamId(6000, 2), [b"g", b"3"])


def test_immediate_add_writes_deferred_entries_first(make_stream):
    s = make_stream(clock=Clock(7000))
    a = s.add([b"f", b"1"], defer=True)
    b = s.add([b"f", b"2", b"g", b"3"])
    assert not s.pending
    assert ids_of(s.range(MIN_ID, MAX_ID)) == [a, b]


@pytest.mark.skipif(not HAVE_REAL_LOG, reason="storage.log.PartitionLog has not landed yet")
def test_committed_counters_count_only_the_entries_below_the_high_watermark(tmp_path):
    """A follower copy's view (XLEN, XINFO STREAM with READONLY): entries it
    holds above the high watermark its leader reported are not counted, as
    its reads do not return them."""
    from storage.log import PartitionLog

    log = PartitionLog.open(tmp_path / "p0", hw_follows_end=False)
    s = Stream(log, tmp_path / "p0" / "stream.meta", clock_ms=Clock())
    for i in range(1, 6):
        s.add([b"f", b"%d" % i], id_given=StreamId(i, 0))
    assert s.committed_counters() == (0, MIN_ID, 0)
    log.set_high_watermark(3)
    assert s.committed_counters() == (3, StreamId(3, 0), 3)
    assert (s.length, s.last_id, s.entries_added) == (5, StreamId(5, 0), 5)  # (the log's own: everything)
    s.delete([StreamId(2, 0)])
    assert s.committed_counters() == (2, StreamId(3, 0), 3)
    log.set_high_watermark(4)
    s.trim_maxlen(1)  # log start 4: every committed entry trimmed
    assert s.committed_counters()[0] == 0
    log.set_high_watermark(5)
    assert s.committed_counters() == (s.length, s.last_id, s.entries_added) == (1, StreamId(5, 0), 5)
    log.close()
