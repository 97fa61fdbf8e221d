"""The mapping between Kafka records and stream entries (server/kafka_front/mapping.py): both
directions round-trip, the C loops (_kmap) give exactly the Python reference's bytes, and no
input makes them do anything but answer or raise."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from server.kafka import errors as E
from server.kafka import records
from server.kafka.records import CorruptRecordError
from server.kafka_front import mapping
from storage.entry_codec import decode_entry, encode_body, encode_entry, with_body

_kmap = mapping._kmap
needs_c = pytest.mark.skipif(_kmap is None, reason="server/kafka_front/_kmap.c was not built")

small = st.binary(max_size=300)
header_keys = st.one_of(st.sampled_from([b"key", b"value", b"k", b""]), st.binary(max_size=20))
record_st = st.tuples(st.none() | small, st.none() | small,
                      st.lists(st.tuples(header_keys, st.none() | small), max_size=4))


def _kept(record) -> bool:
    """Whether the mapping keeps this record (else it refuses it: INVALID_RECORD)."""
    key, value, headers = record
    return not any((key is None and k == b"key") or (value is None and k == b"value") for k, _ in headers)


def _records_section(recs) -> tuple[bytes, int]:
    batch = records.make_batch([(k, v, h) for k, v, h in recs], base_offset=0, timestamps_ms=[5] * len(recs))
    raw = records.encode_batch(batch)
    return raw[records.HEADER_BYTES:], len(recs)


def test_a_record_is_key_value_then_headers():
    assert mapping.record_body(b"k", b"v", [(b"h", b"1"), (b"n", None)]) == encode_body(
        [b"key", b"k", b"value", b"v", b"h", b"1", b"n", b""])
    assert mapping.record_body(None, None, []) == b"*0\r\n"
    assert mapping.record_body(None, b"v", []) == encode_body([b"value", b"v"])
    with pytest.raises(CorruptRecordError) as refused:
        mapping.record_body(None, b"v", [(b"key", b"x")])
    assert refused.value.code == E.INVALID_RECORD


def test_an_entry_is_its_first_key_and_value_the_rest_headers():
    assert mapping.record_of([b"a", b"1", b"value", b"v", b"key", b"k", b"key", b"2", b"value", b"3"]) == (
        b"k", b"v", [(b"a", b"1"), (b"key", b"2"), (b"value", b"3")])
    assert mapping.record_of([]) == (None, None, [])


@settings(max_examples=300, deadline=None)
@given(st.lists(record_st, min_size=1, max_size=8))
def test_records_round_trip_through_entries(recs):
    """Kafka -> entry -> Kafka gives the very record back (a null header value comes back empty)."""
    recs = [r for r in recs if _kept(r)]
    if not recs:
        return
    data = records.encode_batch(records.make_batch(recs, base_offset=0, timestamps_ms=[1] * len(recs)))
    produced = mapping.Produced(mapping.read(data, 1 << 20))
    assert produced.largest == max(mapping.record_bytes(*r) for r in recs)
    entries, total = produced.make_entries(7, 0)
    stored = [e for _, _, e in entries]
    assert [(ms, seq) for ms, seq, _ in entries] == [(7, n) for n in range(len(recs))]
    assert total == sum(map(len, stored))
    out = mapping.batches_of([b"".join(stored)], [(10 + n, 7, n) for n in range(len(stored))])
    (batch,) = records.read_batches(bytes(out))
    assert batch.is_log_append_time and (batch.base_offset, batch.base_timestamp) == (10, 7)
    assert [(r.key, r.value, [(k, v or b"") for k, v in r.headers]) for r in batch.records] == [
        (k, v, [(hk, hv or b"") for hk, hv in h]) for k, v, h in recs]


@needs_c
@settings(max_examples=300, deadline=None)
@given(st.lists(record_st, min_size=1, max_size=8), st.integers(0, 2**48), st.integers(0, 2**64 - 100))
def test_c_produced_entries_match_the_python_reference(recs, ms, seq):
    section, count = _records_section(recs)
    expected_refused = next((i for i, r in enumerate(recs) if not _kept(r)), -1)
    assert _kmap.produce_entries(section, count)[1:3] == (max(mapping.record_bytes(*r) for r in recs),
                                                          expected_refused)
    entries, largest, refused, total = _kmap.produce_entries(section, count, ms, seq)
    assert refused == expected_refused
    if refused < 0:
        expected = [(ms, seq + i, with_body((ms, seq + i), mapping.record_body(*r))) for i, r in enumerate(recs)]
        assert entries == expected
        assert total == sum(len(e) for _, _, e in expected)
    else:
        assert entries is None


@needs_c
@settings(max_examples=500, deadline=None)
@given(st.lists(record_st, min_size=1, max_size=4), st.data())
def test_c_produce_bodies_refuse_damaged_records_cleanly(recs, data):
    """Truncated, cut or flipped records section: ValueError or an answer, never more."""
    section, count = _records_section(recs)
    cut = data.draw(st.integers(0, len(section)))
    flip = data.draw(st.integers(0, max(0, len(section) - 1)))
    damaged = bytearray(section[:cut])
    if damaged and flip < len(damaged):
        damaged[flip] ^= data.draw(st.integers(1, 255))
    for c in (count, data.draw(st.integers(0, 2**31 - 1))):
        try:
            entries, _, refused, _ = _kmap.produce_entries(bytes(damaged), c, 1, 0)
        except ValueError:
            continue
        assert refused >= 0 or len(entries) == c


@needs_c
@given(st.binary(max_size=200), st.integers(-5, 1000))
def test_c_produce_bodies_of_random_bytes(data, count):
    try:
        _kmap.produce_entries(data, count, 1, 0)
    except ValueError:
        pass


fields_st = st.lists(st.tuples(st.one_of(st.sampled_from([b"key", b"value"]), st.binary(max_size=12)),
                               st.binary(max_size=300)), max_size=5)


@needs_c
@settings(max_examples=300, deadline=None)
@given(st.lists(fields_st, min_size=1, max_size=10), st.data())
def test_c_fetch_batches_match_the_python_reference(entries_fields, data):
    n = len(entries_fields)
    offsets = sorted(data.draw(st.lists(st.integers(0, 10_000), min_size=n, max_size=n, unique=True)))
    ms = sorted(data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)))  # runs of equal ms
    stored = [encode_entry((m, i), [x for pair in f for x in pair]) if f else with_body((m, i), b"*0\r\n")
              for i, (m, f) in enumerate(zip(ms, entries_fields))]
    split = data.draw(st.integers(0, n))  # two chunks, as two stored batches
    chunks = [b"".join(stored[:split]), b"".join(stored[split:])]
    chunks = [c for c in chunks if c]
    ids = [(o, m, i) for i, (o, m) in enumerate(zip(offsets, ms))]
    fast = mapping.batches_of(chunks, ids, 3)
    try:
        mapping._kmap = None
        slow = mapping.batches_of(chunks, ids, 3)
    finally:
        mapping._kmap = _kmap
    assert fast == slow
    got = [(b.base_offset + r.offset_delta, b.base_timestamp, (r.key, r.value, r.headers))
           for b in records.read_batches(bytes(fast)) for r in b.records]
    assert got == [(o, m, mapping.record_of(decode_entry(e)[1])) for (o, m, _), e in zip(ids, stored)]
