"""The producer partitioner: Kafka's murmur2 for keyed entries, round-robin otherwise."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings, strategies as st

from cluster.partitioner import Partitioner, field_value, murmur2, partition_for_key


def test_murmur2_matches_kafka():
    # Kafka's UtilsTest.testMurmur2 vectors.
    cases = {
        b"21": -973932308,
        b"foobar": -790332482,
        b"a-little-bit-long-string": -985981536,
        b"a-little-bit-longer-string": -1486304829,
        b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
        b"abc": 479470107,
    }
    for data, expected in cases.items():
        assert murmur2(data) == expected, data


def test_partition_for_key_is_kafkas_to_positive_mod():
    for key in (b"21", b"foobar", b"abc", b""):
        assert partition_for_key(key, 7) == (murmur2(key) & 0x7FFFFFFF) % 7


def test_field_value_looks_at_field_names_only():
    assert field_value([b"user", b"alice", b"n", b"1"], b"user") == b"alice"
    assert field_value([b"n", b"user", b"user", b"bob"], b"user") == b"bob"
    assert field_value([b"n", b"1"], b"user") is None


def test_round_robin_spreads_evenly():
    p = Partitioner()
    counts = Counter(p.choose(b"t", 6, [b"n", b"%d" % i], None) for i in range(600))
    assert counts == {n: 100 for n in range(6)}
    # Per topic: another topic starts at 0.
    assert p.choose(b"other", 6, [b"n", b"1"], None) == 0


def test_round_robin_when_the_key_field_is_missing():
    p = Partitioner()
    got = [p.choose(b"t", 3, [b"n", b"1"], b"user") for _ in range(6)]
    assert got == [0, 1, 2, 0, 1, 2]


@settings(max_examples=50, deadline=None)
@given(st.binary(max_size=40), st.integers(min_value=1, max_value=64))
def test_keyed_choice_is_stable(key, partitions):
    p, q = Partitioner(), Partitioner()
    a = p.choose(b"t", partitions, [b"k", key], b"k")
    assert 0 <= a < partitions
    assert a == q.choose(b"t", partitions, [b"x", b"y", b"k", key], b"k") == partition_for_key(key, partitions)


def test_keyed_entries_spread_by_key():
    counts = Counter(partition_for_key(b"user-%d" % i, 4) for i in range(4000))
    assert set(counts) == {0, 1, 2, 3}
    assert all(800 < c < 1200 for c in counts.values()), counts


def test_peek_and_advance_share_the_round_robin_counter():
    p = Partitioner()
    assert [p.peek(b"t", 3) for _ in range(3)] == [0, 0, 0]  # peeking does not move it
    p.advance(b"t")
    assert p.peek(b"t", 3) == 1
    assert p.choose(b"t", 3, [b"n", b"1"], None) == 1  # choose takes the peeked one, then moves on
    assert p.peek(b"t", 3) == 2
    p.advance(b"t")
    assert p.peek(b"t", 3) == 0 and p.peek(b"other", 3) == 0
