"""XREADGROUP's no-wait path (``groups.xreadgroup_now``) answers and delivers
exactly as its handler, and leaves to the handler what may wait."""

from __future__ import annotations

import pytest

from server.dispatch import COROUTINE
from server.registry import DECLARED
from server.reply import encode
from tests.server.test_xread_now import _run, loop_harness


def _server(path):
    h, ctx = loop_harness(path, 29)
    for argv in ([b"XDEL", b"s", b"5-0"], [b"XGROUP", b"CREATE", b"s", b"g", b"0"],
                 [b"TOPIC", b"CREATE", b"t", b"PARTITIONS", b"2"], [b"XGROUP", b"CREATE", b"t", b"g", b"0"]):
        _run(h.dispatcher.call(ctx, argv))
    return h, ctx


SEQUENCE = [
    b"XREADGROUP GROUP g c1 COUNT 5 STREAMS s >",
    b"XREADGROUP GROUP g c2 COUNT 3 STREAMS s >",
    b"XREADGROUP GROUP g c1 STREAMS s 0",
    b"XREADGROUP GROUP g c1 COUNT 2 STREAMS s 3-0",
    b"XREADGROUP GROUP g c1 COUNT 2 NOACK STREAMS s >",
    b"XREADGROUP GROUP g c3 BLOCK 10 COUNT 2 STREAMS s >",
    b"XREADGROUP GROUP g c3 COUNT 2 STREAMS s 0 s >",
    b"XREADGROUP GROUP nope c STREAMS s >",
    b"XREADGROUP GROUP g c STREAMS s $",
    b"XREADGROUP GROUP g c STREAMS missing >",
    b"XREADGROUP GROUP g c STREAMS s bad-id",
    b"XREADGROUP GROUP g c COUNT x STREAMS s >",
    b"XREADGROUP GROUP g c4 COUNT 100 STREAMS s >",
    b"XREADGROUP GROUP g c4 STREAMS s >",
    b"XACK s g 1-0 2-0 9-0",
    b"XREADGROUP GROUP g c1 STREAMS s 0",
    b"XPENDING s g",
    b"XPENDING s g - + 100",
    b"XINFO GROUPS s",
    # a topic's members: joins, assignment, revocation, history
    b"XREADGROUP GROUP g m1 COUNT 2 STREAMS t >",
    b"XADD t 1-1 f a",
    b"XADD t 1-2 f b",
    b"XADD t 1-3 f c",
    b"XREADGROUP GROUP g m1 COUNT 1 STREAMS t >",
    b"XREADGROUP GROUP g m2 COUNT 2 STREAMS t >",
    b"XREADGROUP GROUP g m1 STREAMS t 0",
    b"XREADGROUP GROUP g m1 COUNT 5 STREAMS s t > >",
    b"XREADGROUP GROUP g m2 COUNT 2 STREAMS t t 0 >",
    b"XREADGROUP GROUP g m2 COUNT 2 STREAMS t bad-id",
    b"XREADGROUP GROUP nope m1 STREAMS t >",
    b"XINFO GROUPS t",
]


@pytest.mark.parametrize("protocol", [2, 3])
def test_the_nowait_path_answers_and_delivers_as_the_handler(tmp_path, protocol):
    fast_h, fast_ctx = _server(tmp_path / "fast")
    slow_h, slow_ctx = _server(tmp_path / "slow")
    spec = DECLARED["xreadgroup"]
    try:
        for line in SEQUENCE:
            argv = line.split()
            fast_ctx.client.protocol = slow_ctx.client.protocol = protocol
            fast = _run(fast_h.dispatcher.call(fast_ctx, list(argv)))
            if argv[0] == b"XREADGROUP":
                slow = _run(slow_h.dispatcher._call_async(spec, slow_ctx, list(argv)))
            else:
                slow = _run(slow_h.dispatcher.call(slow_ctx, list(argv)))
            if argv[:2] == [b"XPENDING", b"s"] and len(argv) > 3:  # [id, consumer, idle ms, count]: not the clock
                fast, slow = ([[e[0], e[1], e[3]] for e in reply] for reply in (fast, slow))
                assert len(fast) == 23
            assert encode(fast, protocol) == encode(slow, protocol), line
        taken = fast_h.state.stats.commands["xreadgroup"][0]
        assert taken == slow_h.state.stats.commands["xreadgroup"][0] == sum(
            1 for line in SEQUENCE if line.startswith(b"XREADGROUP"))
    finally:
        fast_h.state.topics.close()
        slow_h.state.topics.close()


def test_what_may_wait_is_left_to_the_handler(tmp_path):
    h, ctx = _server(tmp_path)
    now = DECLARED["xreadgroup"].now
    try:
        assert now(ctx, b"XREADGROUP GROUP g c COUNT 2 STREAMS s >".split()) is not None
        assert ctx.views  # new entries read through the log file's mapping
        _run(h.dispatcher.call(ctx, b"XREADGROUP GROUP g c STREAMS s >".split()))  # the rest
        assert now(ctx, b"XREADGROUP GROUP g c STREAMS s >".split()) is not None  # nil: no BLOCK
        assert now(ctx, b"XREADGROUP GROUP g c BLOCK 100 STREAMS s >".split()) is None  # would wait
        assert now(ctx, b"XREADGROUP GROUP g c BLOCK 100 STREAMS t >".split()) is None  # nothing: would wait
        _run(h.dispatcher.call(ctx, b"XADD t 1-1 f v".split()))
        assert now(ctx, b"XREADGROUP GROUP g c BLOCK 100 STREAMS t >".split()) is not None  # a member's read
        assert ctx.views
        blocked = h.dispatcher.call(ctx, b"XREADGROUP GROUP g c BLOCK 100 STREAMS s >".split())
        assert type(blocked) is COROUTINE  # the handler waits
        blocked.close()
    finally:
        h.state.topics.close()
