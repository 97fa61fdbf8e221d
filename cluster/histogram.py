"""A latency histogram cheap enough for the request path.

Owns: ``Histogram``, counts of durations (microseconds) per fixed bucket,
their sum, and the cumulative view an exporter needs. An observation is a
bisect and two additions (no lock: the trio thread only); a batch of ``n``
operations timed together is one observation of weight ``n``, so a hot
path pays per batch, never per entry.

Must not know: Prometheus, its text format, metric names (the HTTP front-end,
``server/web/metrics.py``, turns these into Prometheus histograms).
"""

from __future__ import annotations

from bisect import bisect_left

# Upper bounds (inclusive, microseconds) of the buckets: 10 µs to 10 s, about
# 1-2.5-5 per decade, as Prometheus's defaults but from where a command's own
# time starts. One more bucket above the last bound counts the rest (+Inf).
BOUNDS_US: tuple[int, ...] = (
    10, 25, 50, 100, 250, 500,
    1_000, 2_500, 5_000, 10_000, 25_000, 50_000,
    100_000, 250_000, 500_000, 1_000_000, 2_500_000, 10_000_000,
)


class Histogram:
    """Counts per bucket of ``BOUNDS_US`` (``counts[-1]``: above the last
    bound), the observations' count and their sum in microseconds."""

    __slots__ = ("counts", "count", "sum_us")

    def __init__(self) -> None:
        self.counts = [0] * (len(BOUNDS_US) + 1)
        self.count = 0
        self.sum_us = 0

    def observe_us(self, total_us: int, n: int = 1) -> None:
        """``n`` operations that took ``total_us`` together: each counted in
        the bucket of their mean duration (a batch timed as one)."""
        assert n >= 1 and total_us >= 0
        self.counts[bisect_left(BOUNDS_US, total_us // n)] += n
        self.count += n
        self.sum_us += total_us

    def cumulative(self) -> list[tuple[float, int]]:
        """``(upper bound in seconds, observations at or below it)`` per
        bucket, the last bound ``inf`` (Prometheus's ``le`` buckets)."""
        out = []
        running = 0
        for bound, n in zip(BOUNDS_US + (None,), self.counts):
            running += n
            out.append((float("inf") if bound is None else bound / 1e6, running))
        return out
