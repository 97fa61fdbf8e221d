"""Shared fixtures of the broker's tests: a broker on a real topic registry."""

from __future__ import annotations

import types

import pytest

from cluster.broker import Broker
from cluster.topics import TopicRegistry
from storage.entry_codec import encode_body, with_body


class Clock:
    """A broker's clock the test moves (``clock.now_ms += ...``)."""

    def __init__(self, now_ms: int = 1_000_000) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


def maker(values: list[bytes]):
    """A ``make_entries`` for entries of one field ``v`` each, and their count and largest."""
    bodies = [encode_body([b"v", v]) for v in values]

    def make_entries(ms: int, seq: int):
        entries = [(ms, seq + i, with_body((ms, seq + i), b)) for i, b in enumerate(bodies)]
        return entries, sum(len(e) for _, _, e in entries)

    return len(values), max(1 + len(v) for v in values), make_entries


def append(session, topic: bytes, n: int, values: list[bytes], **kw):
    """``Session.append_records`` of entries ``v <value>`` to partition ``n`` of ``topic``."""
    count, largest, make = maker(values)
    return session.append_records(topic, n, count, largest, make, **kw)


@pytest.fixture
def make_broker(tmp_path):
    """``make_broker(clock_ms=None, **config)``: a ``Broker`` over a new
    topic registry in ``tmp_path`` (closed after the test); ``config``
    overrides the few settings the broker and the registry read;
    ``clock_ms`` is the broker's clock and its partition logs'."""
    registries = []

    def make(clock_ms=None, **config_values) -> Broker:
        config = types.SimpleNamespace(segment_bytes=1 << 20, stream_node_max_entries=100, fsync="everysec",
                                       max_blocked_clients=0, default_partitions=1,
                                       group_session_timeout_ms=10_000)
        vars(config).update(config_values)
        registry = TopicRegistry.open(tmp_path / f"data{len(registries)}", config, clock_ms=clock_ms)
        registries.append(registry)
        return Broker(registry, config) if clock_ms is None else Broker(registry, config, clock_ms=clock_ms)

    yield make
    for registry in registries:
        registry.close()
