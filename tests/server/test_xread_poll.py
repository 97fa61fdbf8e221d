"""A consumer's poll taken from the received bytes (``Dispatcher.read_poll``,
``streams.xread_poll``, ``_xaddrun.poll_xread``) answers exactly as the
parser and the general dispatch do."""

from __future__ import annotations

import tempfile

import hiredis
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from server.dispatch import Context
from server.errors import CommandError
from server.registry import client_table
from server.resp import encode_command
from tests.server.support import TopicsHarness, one_reply
from tests.server.test_xaddrun import _LEN, _bulk

U64 = 2**64 - 1


def test_the_poll_path_is_built_and_registered():
    """A build that silently fell back to the parser must fail CI."""
    from server import _xaddrun
    from server.commands import streams

    assert streams._xaddrun is _xaddrun
    assert client_table().polls["xread"] is streams.xread_poll


# -- the request's parse against a reference ---------------------------------

def _digits_u64(raw: bytes):
    if not raw or len(raw) > 20 or not raw.isdigit() or (raw[:1] == b"0" and len(raw) > 1):
        return None
    value = int(raw)
    return value if value <= U64 else None


def reference_poll(data: bytes):
    """What ``poll_xread`` must take: exactly one canonical ``XREAD COUNT n
    STREAMS key id``, n and the ID's parts plain decimals."""
    m = _LEN.match(data, 1)
    if data[:1] != b"*" or m is None or m.group(1) != b"6":
        return None
    pos, args = m.end(), []
    for _ in range(6):
        got = _bulk(data, pos)
        if got is None:
            return None
        args.append(got[0])
        pos = got[1]
    if pos != len(data) or [a.upper() for a in (args[0], args[1], args[3])] != [b"XREAD", b"COUNT", b"STREAMS"]:
        return None
    count = _digits_u64(args[2])
    if count is None or count >= 2**63:
        return None
    ms_raw, dash, seq_raw = args[5].partition(b"-")
    ms = _digits_u64(ms_raw)
    seq = _digits_u64(seq_raw) if dash else 0
    if ms is None or seq is None:
        return None
    return args[4], count, ms, seq


_numbers = st.one_of(st.integers(0, 3000), st.sampled_from([2**63 - 1, 2**63, U64, U64 + 1]))
_id_text = st.one_of(
    st.builds(lambda a, b: b"%d-%d" % (a, b), _numbers, _numbers),
    st.builds(lambda a: b"%d" % a, _numbers),
    st.sampled_from([b"$", b"+", b">", b"-", b"0-", b"-1", b"01-0", b"0-01", b"1-*", b"", b"1-2-3", b"x", b"1\x002"]),
)


@st.composite
def _request(draw):
    words = [draw(st.sampled_from([b"XREAD", b"xread", b"XrEaD", b"XREADX", b"XADD0"])),
             draw(st.sampled_from([b"COUNT", b"count", b"CoUnT", b"BLOCK", b"COUNTS"])),
             draw(st.one_of(st.builds(lambda n: b"%d" % n, _numbers),
                            st.sampled_from([b"-1", b"-0", b"007", b"", b"1x", b"+5"]))),
             draw(st.sampled_from([b"STREAMS", b"streams", b"StReAmS", b"STREAM"])),
             draw(st.sampled_from([b"s", b"", b"a\r\nb", b"$3\r\nkey", b"t#1", b"\x00"])),
             draw(_id_text)]
    data = encode_command(words)
    change = draw(st.sampled_from(["none", "none", "cut", "extra", "arity", "noncanonical"]))
    if change == "cut":
        data = data[:draw(st.integers(0, len(data) - 1))]
    elif change == "extra":
        data += draw(st.sampled_from([b"\r\n", b"*1\r\n$4\r\nPING\r\n", b"x"]))
    elif change == "arity":
        data = encode_command(words + [b"more"])
    elif change == "noncanonical":
        at = data.find(draw(st.sampled_from([b"*6", b"$5", b"$7"])))
        data = data[:at + 1] + b"0" + data[at + 1:]
    return data


@settings(max_examples=600, deadline=None)
@given(data=_request())
def test_the_parse_takes_exactly_what_the_reference_takes(data):
    from server import _xaddrun

    assert _xaddrun.poll_xread(data) == reference_poll(data)


@settings(max_examples=600, deadline=None)
@given(data=_request())
def test_a_parse_taken_gives_the_plan_of_the_python_parser(data):
    """The C parser is another parser of XREAD, not other rules: for every
    input it takes, the handler's parse (``_parse_xread``) of the same
    command gives the same plan (one key, its position, the count, no
    BLOCK, no caps); malformed input it leaves alone (None) whatever the
    Python parser makes of it."""
    from server import _xaddrun
    from server.commands.streams import _parse_xread

    form = _xaddrun.poll_xread(data)
    if form is None:
        return
    reader = hiredis.Reader()
    reader.feed(data)
    argv = reader.gets()
    assert reader.gets() is False  # exactly one command
    plan = _parse_xread(argv)
    key, count, ms, seq = form
    assert list(plan.keys) == [key]
    assert [tuple(after) for after in plan.after] == [(ms, seq)]
    assert (plan.count, plan.block_ms, plan.max_count, plan.max_size) == (count, None, 0, 0)


def test_the_parse_takes_bytes_like_input_only():
    from server import _xaddrun

    data = encode_command([b"XREAD", b"COUNT", b"2", b"STREAMS", b"s", b"1-2"])
    assert _xaddrun.poll_xread(bytearray(data)) == _xaddrun.poll_xread(memoryview(data)) == (b"s", 2, 1, 2)
    with pytest.raises(TypeError):
        _xaddrun.poll_xread(data.decode())
    with pytest.raises(TypeError):
        _xaddrun.poll_xread()
    with pytest.raises(TypeError):
        _xaddrun.poll_xread(data, data)


@settings(max_examples=300, deadline=None)
@given(key=st.binary(max_size=300), count=st.one_of(st.integers(0, 2000), st.just(U64)), protocol=st.sampled_from([2, 3]))
def test_the_head_of_a_found_poll_is_the_encoders(key, count, protocol):
    """``poll_head``: a found poll's reply up to its entries, byte for byte
    what ``encode_into`` writes for XREAD's reply of ``count`` entries."""
    from server import _xaddrun
    from server.reply import Map, encode_into
    from storage.streams.stream import Entries

    entries = Entries(count, [])
    out: list = []
    encode_into(out, Map([(key, entries)]) if protocol == 3 else [[key, entries]], protocol)
    assert _xaddrun.poll_head(protocol, key, count) == b"".join(out)


def test_the_head_declines_other_protocols_and_checks_its_arguments():
    from server import _xaddrun

    assert _xaddrun.poll_head(1, b"k", 1) is None
    assert _xaddrun.poll_head(4, b"k", 1) is None
    with pytest.raises(TypeError):
        _xaddrun.poll_head(2, "k", 1)
    with pytest.raises(TypeError):
        _xaddrun.poll_head(2, b"k")
    with pytest.raises(OverflowError):
        _xaddrun.poll_head(2, b"k", -1)


def test_the_parse_of_a_plain_poll():
    from server import _xaddrun

    data = encode_command([b"XREAD", b"COUNT", b"1000", b"STREAMS", b"s", b"0-0"])
    assert _xaddrun.poll_xread(data) == (b"s", 1000, 0, 0)
    data = encode_command([b"xread", b"count", b"0", b"streams", b"k", b"%d-%d" % (U64, U64)])
    assert _xaddrun.poll_xread(data) == (b"k", 0, U64, U64)
    assert _xaddrun.poll_xread(encode_command([b"XREAD", b"COUNT", b"1", b"STREAMS", b"s", b"7"])) == (b"s", 1, 7, 0)


# -- the whole path: a connection with polls against one without -------------

def _requests():
    forms = [
        [b"XREAD", b"COUNT", b"10", b"STREAMS", b"s", b"0"],
        [b"XREAD", b"count", b"3", b"streams", b"s", b"4-0"],
        [b"XREAD", b"COUNT", b"0", b"STREAMS", b"s", b"0-0"],
        [b"XREAD", b"COUNT", b"2", b"STREAMS", b"s", b"4"],  # 5-0 is deleted
        [b"XREAD", b"COUNT", b"-2", b"STREAMS", b"s", b"30"],
        [b"XREAD", b"COUNT", b"1", b"STREAMS", b"s", b"39-0"],
        [b"XREAD", b"COUNT", b"1", b"STREAMS", b"s", b"%d-%d" % (U64, U64)],
        [b"XREAD", b"COUNT", b"1", b"STREAMS", b"s", b"%d-%d" % (U64 - 1, U64)],
        [b"XREAD", b"COUNT", b"1", b"STREAMS", b"s", b"$"],
        [b"XREAD", b"COUNT", b"1", b"STREAMS", b"s", b">"],
        [b"XREAD", b"COUNT", b"x", b"STREAMS", b"s", b"0"],
        [b"XREAD", b"COUNT", b"1", b"STREAMS", b"s", b"bad-id"],
        [b"XREAD", b"COUNT", b"1", b"STREAMS", b"missing", b"0"],
        [b"XREAD", b"COUNT", b"1", b"STREAMS", b"t", b"0"],
        [b"XREAD", b"COUNT", b"5", b"STREAMS", b"t#1", b"0"],
        [b"XREAD", b"COUNT", b"5", b"STREAMS", b"empty", b"0"],
        [b"XREAD", b"BLOCK", b"1", b"STREAMS", b"s", b"0"],
        [b"XREAD", b"COUNT", b"1000", b"STREAMS", b"big", b"0-0"],
        [b"XREAD", b"COUNT", b"7", b"STREAMS", b"big", b"150-3"],
    ]
    return [encode_command(f) for f in forms]


async def _serve(root, requests: list[bytes], polls: bool, protocol: int):
    """Raw replies of ``requests`` sent one at a time on a fresh in-process
    server, then how many the poll path answered and the XREAD stats."""
    taken = []
    with tempfile.TemporaryDirectory(dir=root) as path:
        h = TopicsHarness(path)
        table_polls = h.dispatcher.table.polls
        if not polls:
            del table_polls["xread"]
        else:
            real = table_polls["xread"]

            def counted(ctx, data, out, route=None):
                done = real(ctx, data, out, route)
                if done:
                    taken.append(data)
                return done

            table_polls["xread"] = counted
        ctx = Context(h.state, h.state.new_client("t:1", "t:0", -1), h.dispatcher)
        for i in range(1, 40):
            h.dispatcher.call(ctx, [b"XADD", b"s", b"%d-0" % i, b"f", b"v%d" % i])
        ctx.session.commit_deferred()
        h.dispatcher.call(ctx, [b"XDEL", b"s", b"5-0"])
        h.dispatcher.call(ctx, [b"TOPIC", b"CREATE", b"t", b"PARTITIONS", b"2"])
        h.dispatcher.call(ctx, [b"XADD", b"t#1", b"1-1", b"a", b"b"])
        h.dispatcher.call(ctx, [b"XADD", b"empty", b"1-1", b"a", b"b"])
        h.dispatcher.call(ctx, [b"XDEL", b"empty", b"1-1"])
        for ms in range(1, 400):  # several batches of several entries
            for seq in range(5):
                h.dispatcher.call(ctx, [b"XADD", b"big", b"%d-%d" % (ms, seq), b"field", b"x" * (ms % 17)])
            if ms % 9 == 0:
                ctx.session.commit_deferred()
        ctx.session.commit_deferred()
        replies = []
        async with trio.open_nursery() as nursery:
            sock, _ = h.connect(nursery)
            reader = hiredis.Reader()
            if protocol == 3:
                await sock.send(encode_command([b"HELLO", b"3"]))
                await one_reply(sock, reader)
            for request in requests:
                await sock.send(request)
                with trio.fail_after(10):
                    replies.append(await one_reply(sock, reader))
            await sock.send(encode_command([b"INFO", b"commandstats"]))
            info = await one_reply(sock, reader)
            nursery.cancel_scope.cancel()
        h.state.topics.close()
    stats = [line for line in info.split(b"\r\n") if line.startswith(b"cmdstat_xread:")]
    stats = [b",".join(p for p in line.split(b",") if not p.startswith(b"usec")) for line in stats]
    return replies, taken, stats


@pytest.mark.parametrize("protocol", [2, 3])
def test_a_connection_answers_polls_exactly_as_the_parser_and_dispatch(tmp_path, protocol):
    requests = _requests()
    with_polls, taken, stats = trio.run(_serve, tmp_path, requests, True, protocol)
    without, none_taken, stats_without = trio.run(_serve, tmp_path, requests, False, protocol)
    assert with_polls == without
    assert stats == stats_without and stats  # counted as the dispatcher counts XREAD
    assert not none_taken
    # The path really ran: every plain poll of an existing partition.
    assert len(taken) == 11, taken
    assert encode_command([b"XREAD", b"COUNT", b"1000", b"STREAMS", b"big", b"0-0"]) in taken


@settings(max_examples=30, deadline=None)
@given(polls=st.lists(st.tuples(st.integers(0, 420), st.integers(0, 6), st.integers(0, 40),
                                st.sampled_from([b"big", b"s"])), min_size=1, max_size=8))
def test_generated_polls_answer_as_the_general_path(tmp_path_factory, polls):
    root = tmp_path_factory.getbasetemp()
    requests = [encode_command([b"XREAD", b"COUNT", b"%d" % n, b"STREAMS", key, b"%d-%d" % (ms, seq)])
                for ms, seq, n, key in polls]
    with_polls, taken, _ = trio.run(_serve, root, requests, True, 2)
    without, _, _ = trio.run(_serve, root, requests, False, 2)
    assert with_polls == without
    assert len(taken) == len(requests)


# -- what the dispatcher does around it ----------------------------------------

def _poll_bytes(key=b"s", after=b"0-0", count=b"10"):
    return encode_command([b"XREAD", b"COUNT", count, b"STREAMS", key, after])


def test_deferred_appends_are_committed_before_the_poll_reads(tmp_path):
    h = TopicsHarness(tmp_path)
    writer = Context(h.state, h.state.new_client("t:1", "t:0", -1), h.dispatcher)
    writer.session.may_defer = True
    reader = Context(h.state, h.state.new_client("t:2", "t:0", -1), h.dispatcher)
    reader.session.may_defer = True
    first = h.dispatcher.call(writer, [b"XADD", b"s", b"*", b"f", b"v"])
    writer.session.commit_deferred()
    second = h.dispatcher.call(writer, [b"XADD", b"s", b"*", b"f", b"v"])
    assert h.state.broker.has_deferred()  # the second entry still waits for its batch
    out: list = []
    assert h.dispatcher.read_poll(reader, _poll_bytes(), out)
    reply = hiredis.Reader()
    reply.feed(b"".join(bytes(c) for c in out))
    assert [entry[0] for entry in reply.gets()[0][1]] == [first, second]
    h.state.topics.close()


def _one_entry(tmp_path):
    """A harness whose stream ``s`` holds one entry, and a connection's context."""
    h = TopicsHarness(tmp_path)
    ctx = Context(h.state, h.state.new_client("t:1", "t:0", -1), h.dispatcher)
    ctx.session.may_defer = True
    h.dispatcher.call(ctx, [b"XADD", b"s", b"1-1", b"f", b"v"])
    return h, ctx


def test_a_refused_route_is_the_reply_and_an_error_in_the_stats(tmp_path):
    h, ctx = _one_entry(tmp_path)
    seen = []

    def route(spec, argv, replica_reads=False):
        seen.append((spec.name, argv))
        return CommandError("MOVED", "0 127.0.0.1:7001")

    h.dispatcher.route = route
    out: list = []
    assert h.dispatcher.read_poll(ctx, _poll_bytes(after=b"5"), out)
    assert b"".join(out) == b"-MOVED 0 127.0.0.1:7001\r\n"
    assert seen == [("xread", [b"XREAD", b"COUNT", b"10", b"STREAMS", b"s", b"5-0"])]
    assert h.state.stats.commands["xread"][3] == 1  # one failed call
    h.state.topics.close()


def test_the_poll_is_left_to_the_general_path_where_call_would_check_more(tmp_path):
    h, ctx = _one_entry(tmp_path)
    client = ctx.client
    for attr, value in (("authenticated", False), ("in_multi", True), ("acl", object())):
        saved = getattr(client, attr)
        setattr(client, attr, value)
        out: list = []
        assert not h.dispatcher.read_poll(ctx, _poll_bytes(), out) and out == []
        setattr(client, attr, saved)
    out = []
    assert h.dispatcher.read_poll(ctx, _poll_bytes(), out)
    h.state.topics.close()
