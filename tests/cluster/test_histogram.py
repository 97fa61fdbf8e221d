"""The request path's latency histogram: buckets, batches, the cumulative view."""

from __future__ import annotations

from cluster.histogram import BOUNDS_US, Histogram


def test_each_observation_lands_in_the_first_bucket_at_or_above_it():
    h = Histogram()
    h.observe_us(10)  # on a bound: that bound's bucket (Prometheus's le)
    h.observe_us(11)
    h.observe_us(20_000_000)  # above every bound: +Inf only
    cumulative = dict(h.cumulative())
    assert cumulative[10e-6] == 1
    assert cumulative[25e-6] == 2
    assert cumulative[BOUNDS_US[-1] / 1e6] == 2
    assert cumulative[float("inf")] == 3
    assert h.count == 3 and h.sum_us == 10 + 11 + 20_000_000


def test_a_batch_counts_each_operation_at_its_mean():
    h = Histogram()
    h.observe_us(4000, 16)  # 16 XADDs of one pipelined run in 4 ms: 250 µs each
    cumulative = dict(h.cumulative())
    assert cumulative[100e-6] == 0
    assert cumulative[250e-6] == 16
    assert h.count == 16 and h.sum_us == 4000


def test_cumulative_is_monotonic_and_ends_at_the_count():
    h = Histogram()
    for us in (1, 30, 30, 700, 5_000, 99_999, 3_000_000):
        h.observe_us(us)
    counts = [n for _, n in h.cumulative()]
    assert counts == sorted(counts) and counts[-1] == h.count == 7
    assert len(counts) == len(BOUNDS_US) + 1
