"""XREAD's no-wait path (``streams.xread_now``) answers exactly as its handler."""

from __future__ import annotations

import pytest

from server.dispatch import Context
from server.registry import DECLARED
from server.reply import encode, encode_into
from tests.server.support import TopicsHarness
from tests.server.support import answered as _run  # (test_xreadgroup_now imports it from here)


def loop_harness(path, entries: int):
    """An in-process server and a client context as on a connection's loop
    (replies may be views), with entries ``1-0`` .. ``<entries>-0`` in ``s``."""
    h = TopicsHarness(path)
    client = h.state.new_client("t:1", "t:0", -1)
    ctx = Context(h.state, client, h.dispatcher)
    ctx.session.may_defer = True
    for i in range(1, entries + 1):
        _run(h.dispatcher.call(ctx, [b"XADD", b"s", b"%d-0" % i, b"f", b"v%d" % i]))
    ctx.session.commit_deferred()
    return h, ctx


@pytest.fixture
def served(tmp_path):
    h, ctx = loop_harness(tmp_path, 39)
    _run(h.dispatcher.call(ctx, [b"XDEL", b"s", b"5-0"]))
    _run(h.dispatcher.call(ctx, [b"TOPIC", b"CREATE", b"t", b"PARTITIONS", b"2"]))
    yield h, ctx
    h.state.topics.close()


FORMS = [
    [b"XREAD", b"COUNT", b"10", b"STREAMS", b"s", b"0"],
    [b"XREAD", b"count", b"3", b"streams", b"s", b"4-0"],
    [b"XREAD", b"COUNT", b"0", b"STREAMS", b"s", b"0-0"],
    [b"XREAD", b"COUNT", b"-2", b"STREAMS", b"s", b"30"],
    [b"XREAD", b"COUNT", b"1", b"STREAMS", b"s", b"39-0"],
    [b"XREAD", b"COUNT", b"1", b"STREAMS", b"s", b"18446744073709551615-18446744073709551615"],
    [b"XREAD", b"COUNT", b"1", b"STREAMS", b"s", b"$"],
    [b"XREAD", b"COUNT", b"1", b"STREAMS", b"s", b"+"],
    [b"XREAD", b"COUNT", b"1", b"STREAMS", b"s", b">"],
    [b"XREAD", b"COUNT", b"x", b"STREAMS", b"s", b"0"],
    [b"XREAD", b"COUNT", b"1", b"STREAMS", b"s", b"bad-id"],
    [b"XREAD", b"COUNT", b"1", b"STREAMS", b"missing", b"0"],
    [b"XREAD", b"COUNT", b"1", b"STREAMS", b"t", b"0"],
    [b"XREAD", b"COUNT", b"1", b"STREAMS", b"t#1", b"0"],
    [b"XREAD", b"BLOCK", b"1", b"STREAMS", b"s", b"0"],
]


@pytest.mark.parametrize("protocol", [2, 3])
@pytest.mark.parametrize("argv", FORMS, ids=[b" ".join(f[1:]).decode() for f in FORMS])
def test_the_nowait_path_answers_as_the_handler(served, argv, protocol):
    h, ctx = served
    ctx.client.protocol = protocol
    spec = DECLARED["xread"]
    fast = encode(_run(h.dispatcher.call(ctx, list(argv))), protocol)
    ctx.views = False
    general = encode(_run(h.dispatcher._call_async(spec, ctx, list(argv))), protocol)
    assert fast == general


def test_the_nowait_path_takes_the_poll_of_one_partition(served):
    h, ctx = served
    reply = DECLARED["xread"].now(ctx, [b"XREAD", b"COUNT", b"2", b"STREAMS", b"s", b"0"])
    assert reply is not None
    # The broker's Entries (read through the log file's mapping), which the
    # encoder reports to the connection: it sends them at once or copies them.
    assert encode_into([], reply, 2)
    for declined in ([b"XREAD", b"STREAMS", b"s", b"0"],
                     [b"XREAD", b"COUNT", b"2", b"STREAMS", b"s", b"$"],
                     [b"XREAD", b"COUNT", b"2", b"STREAMS", b"missing", b"0"]):
        assert DECLARED["xread"].now(ctx, declined) is None
