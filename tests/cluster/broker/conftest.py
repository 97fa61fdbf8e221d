"""Shared fixtures of the broker's tests: a broker on a real topic registry."""

from __future__ import annotations

import types

import pytest

from cluster.broker import Broker
from cluster.topics import TopicRegistry


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
