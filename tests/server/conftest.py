"""Fixtures of the server's unit tests (helpers: tests/server/support.py)."""

from __future__ import annotations

import pytest

from server.registry import COMMANDS, command
from tests.server.support import FakeLog, IoWakes


@pytest.fixture
def test_commands():
    """TEST-WRITE name (notes a write on a fake log), TEST-BLOCK key (waits for key)."""
    events: list = []
    logs: dict = {}

    @command("test-write", arity=2, flags="write", group="test", since="0", summary="", syntax="TEST-WRITE name")
    def test_write(ctx, argv):
        name = argv[1].decode()
        log = logs.setdefault(name, FakeLog(name, events))
        ctx.session.wrote_log(log)
        ctx.server.signal_key_modified(argv[1])
        events.append(("write", name))
        return b"w:" + argv[1]

    @command("test-block", arity=2, flags="blocking", group="test", since="0", summary="", syntax="TEST-BLOCK key")
    async def test_block(ctx, argv):
        if not ctx.may_block:
            return None
        woke = await ctx.server.wait_for_keys([argv[1]], None)
        return b"woke:" + argv[1] if woke else None

    yield events, logs
    del COMMANDS["test-write"]
    del COMMANDS["test-block"]


@pytest.fixture
async def io_wakes():
    """The readiness waits of connection tasks that ended (``IoWakes``)."""
    import trio

    instrument = IoWakes()
    trio.lowlevel.add_instrument(instrument)
    try:
        yield instrument
    finally:
        trio.lowlevel.remove_instrument(instrument)
