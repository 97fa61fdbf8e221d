"""Every command that looks at a stream sees the XADDs deferred before it.

A deferred XADD (cluster/broker/appends.py) is in the log only once the
tick's batch is committed. The dispatcher no longer commits before each
command: each broker operation that reads (cluster/broker/reads.py) commits
first, and so do EXEC (a WATCHed key the appends change fails it) and INFO
(its counters). Here each command runs right after another client's
deferred XADD, as in one scheduler tick.
"""

from __future__ import annotations

import pytest

from server.dispatch import Context
from server.reply import NULL_ARRAY, encode
from tests.server.support import TopicsHarness, answered


@pytest.fixture
def clients(tmp_path):
    """A harness with ``s`` (one entry, committed) and ``t`` (2 partitions,
    one entry in t#1), each with group ``g`` at 0, a writer whose XADDs are
    deferred, and a reader."""
    h = TopicsHarness(tmp_path)
    writer = Context(h.state, h.state.new_client("t:1", "t:0", -1), h.dispatcher)
    writer.session.may_defer = True
    reader = Context(h.state, h.state.new_client("t:2", "t:0", -1), h.dispatcher)
    reader.session.may_defer = True

    def call(ctx, *argv):
        return answered(h.dispatcher.call(ctx, list(argv)))

    call(writer, b"XADD", b"s", b"1-1", b"f", b"v")
    call(writer, b"TOPIC", b"CREATE", b"t", b"PARTITIONS", b"2")
    call(writer, b"XADD", b"t#1", b"1-1", b"f", b"v")
    call(writer, b"XGROUP", b"CREATE", b"s", b"g", b"0")
    call(writer, b"XGROUP", b"CREATE", b"t", b"g", b"0")
    yield h, writer, reader, call
    h.state.topics.close()


def _defer(h, writer, call, key=b"s"):
    """Another client's ``XADD key * ...``, deferred: its ID and token."""
    new_id = call(writer, b"XADD", key, b"*", b"f", b"late")
    token = writer.session.deferred
    assert token is not None and h.state.broker.has_deferred()
    writer.session.deferred = None
    return new_id, token


READS = [
    ([b"XLEN", b"s"], lambda r, new_id: r == 2),
    ([b"XLEN", b"t"], lambda r, new_id: r == 2),
    ([b"XRANGE", b"s", b"-", b"+"], lambda r, new_id: new_id in encode(r)),
    ([b"XREVRANGE", b"t", b"+", b"-"], lambda r, new_id: new_id in encode(r)),
    ([b"XREAD", b"STREAMS", b"s", b"1-1"], lambda r, new_id: new_id in encode(r)),
    ([b"XREAD", b"COUNT", b"5", b"STREAMS", b"t", b"0"], lambda r, new_id: new_id in encode(r)),
    ([b"XREAD", b"COUNT", b"5", b"STREAMS", b"s", b"1-1"], lambda r, new_id: new_id in encode(r)),
    ([b"XINFO", b"STREAM", b"s"], lambda r, new_id: r["length"] == 2),
    ([b"TOPIC", b"DESCRIBE", b"t"], lambda r, new_id: r["entries"] == 2),
    ([b"INFO", b"topics"], lambda r, new_id: b"entries_in_total:3" in encode(r)),
    ([b"XREADGROUP", b"GROUP", b"g", b"c", b"STREAMS", b"s", b">"], lambda r, new_id: new_id in encode(r)),
    ([b"XREADGROUP", b"GROUP", b"g", b"c", b"COUNT", b"5", b"STREAMS", b"t", b">"],
     lambda r, new_id: new_id in encode(r)),
    ([b"XINFO", b"GROUPS", b"s"], lambda r, new_id: r[0]["lag"] == 2),
]


@pytest.mark.parametrize("argv, saw", READS, ids=[b" ".join(a).decode() for a, _ in READS])
def test_a_read_sees_the_appends_deferred_before_it(clients, argv, saw):
    h, writer, reader, call = clients
    new_id, _ = _defer(h, writer, call, b"t#0" if b"t" in argv else b"s")
    assert saw(call(reader, *argv), new_id)


def test_a_watched_key_changed_by_an_append_deferred_before_exec_fails_it(clients):
    h, writer, reader, call = clients
    call(reader, b"WATCH", b"s")
    call(reader, b"MULTI")
    call(reader, b"XLEN", b"s")
    _defer(h, writer, call)
    assert call(reader, b"EXEC") is NULL_ARRAY
    call(reader, b"MULTI")
    call(reader, b"XLEN", b"s")
    assert call(reader, b"EXEC") == [2]


@pytest.mark.parametrize("argv", [[b"DEL", b"s"], [b"FLUSHALL"], [b"TOPIC", b"DELETE", b"s"]])
def test_an_append_deferred_before_a_delete_is_written_before_it(clients, argv):
    h, writer, reader, call = clients
    _, token = _defer(h, writer, call)
    call(reader, *argv)
    assert call(reader, b"XLEN", b"s") == 0 and call(reader, b"EXISTS", b"s") == 0
    assert writer.session.failure(token) is None  # written (then deleted), not lost to a closed log
