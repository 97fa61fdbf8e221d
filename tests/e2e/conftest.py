"""Fixtures the end-to-end stream tests share."""

from __future__ import annotations

import pytest

from tests.e2e.streams_support import RespClient, port_of


@pytest.fixture
def shared_clients(partita_shared):
    """``connect(protocol=2)`` -> a new ``RespClient`` of the module's shared
    partita, emptied first (FLUSHALL); every client is closed after the test."""
    opened = []

    def connect(protocol: int = 2) -> RespClient:
        c = RespClient(port_of(partita_shared), protocol)
        opened.append(c)
        return c

    connect(2).call("FLUSHALL")
    yield connect
    for c in opened:
        c.close()
