"""Fixtures of the server's unit tests (helpers: tests/server/support.py)."""

from __future__ import annotations

import pytest

from server.registry import command
from tests.server.support import FakeLog, IoWakes


class TestCommands:
    """The ``test_commands`` fixture: ``events, logs = test_commands``, and
    ``commands`` for ``Harness(commands=...)``."""

    def __init__(self) -> None:
        self.events: list = []
        self.logs: dict = {}
        self.commands: dict = {}

    def __iter__(self):
        return iter((self.events, self.logs))


@pytest.fixture
def test_commands():
    """TEST-WRITE name (notes a write on a fake log), TEST-BLOCK key (waits
    for key), for a Harness made with ``commands=test_commands.commands``."""
    made = TestCommands()
    events, logs, table = made.events, made.logs, made.commands

    @command("test-write", arity=2, flags="write", group="test", since="0", summary="", syntax="TEST-WRITE name",
             table=table)
    def test_write(ctx, argv):
        name = argv[1].decode()
        log = logs.setdefault(name, FakeLog(name, events))
        ctx.session.wrote_log(log)
        ctx.server.signal_key_modified(argv[1])
        events.append(("write", name))
        return b"w:" + argv[1]

    @command("test-block", arity=2, flags="blocking", group="test", since="0", summary="", syntax="TEST-BLOCK key",
             table=table)
    async def test_block(ctx, argv):
        if not ctx.may_block:
            return None
        woke = await ctx.server.wait_for_keys([argv[1]], None)
        return b"woke:" + argv[1] if woke else None

    return made


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
