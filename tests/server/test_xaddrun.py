"""The pipelined XADD path in C (``server/_xaddrun.c``) against a Python reference.

``scan`` must take exactly the commands the reference takes, give them the
IDs Redis's ``*`` gives, and store each entry exactly as
the entry codec's ``encode_entry`` would (``storage.entry_codec``: stream-v1,
the format the batch header names); everything else is left to
the general path. Hypothesis generates pipelines that mix the form it takes
with forms it must leave: other keys and commands, non-canonical lengths,
wrong arities, cut-off commands, oversized entries, the end of the ID space.
"""

from __future__ import annotations

import re
import tempfile

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from server.registry import client_table
from server.resp import encode_command
from storage.entry_codec import encode_entry
from tests.server.support import TopicsHarness, batch_counts, read_replies, xadd_request

U64 = 2**64 - 1

def test_the_extension_is_built_and_registered():
    """Every install with a C compiler builds it (pyproject ext-modules); a
    build that silently fell back to the general path must fail CI."""
    from server import _xaddrun as module
    from server.commands import streams

    assert streams._xaddrun is module
    assert client_table().runs["xadd"] is streams.xadd_run


def _module():
    from server import _xaddrun

    return _xaddrun


# -- the reference ---------------------------------------------------------

_LEN = re.compile(rb"(0|[1-9][0-9]{0,11})\r\n")


def _bulk(data: bytes, pos: int):
    """A canonical ``$<n>\\r\\n<n bytes>\\r\\n`` at pos: (value, end) or None."""
    if data[pos:pos + 1] != b"$":
        return None
    m = _LEN.match(data, pos + 1)
    if m is None:
        return None
    n = int(m.group(1))
    start = m.end()
    if len(data) < start + n + 2 or data[start + n:start + n + 2] != b"\r\n":
        return None
    return data[start:start + n], start + n + 2


def _command(data: bytes, pos: int, head_only: bool = False):
    """A complete canonical ``XADD key * f v ...`` at pos: (key, fields, end)
    or None; ``head_only``: only its first three arguments need be there."""
    if data[pos:pos + 1] != b"*":
        return None
    m = _LEN.match(data, pos + 1)
    if m is None:
        return None
    n = int(m.group(1))
    if n < 5 or n % 2 == 0 or n > 1_000_000:
        return None
    p = m.end()
    args = []
    for _ in range(n):
        got = _bulk(data, p)
        if got is None:
            return None
        args.append(got[0])
        p = got[1]
        if len(args) == 1 and args[0].lower() != b"xadd":
            return None
        if len(args) == 3:
            if args[2] != b"*":
                return None
            if head_only:
                return args[1], None, p
    return args[1], args[3:], p


def reference_head_key(data: bytes, pos: int):
    got = _command(data, pos, head_only=True)
    return None if got is None else got[0]


def reference_scan(data, pos, key, last_ms, last_seq, now_ms, max_entry_bytes, budget):
    entries, replies, used = [], b"", 0
    while pos < len(data) and used < budget:
        got = _command(data, pos)
        if got is None or got[0] != key:
            break
        _, fields, end = got
        if sum(map(len, fields)) > max_entry_bytes:
            break
        if now_ms > last_ms:
            ms, seq = now_ms, 0
        elif last_seq != U64:
            ms, seq = last_ms, last_seq + 1
        elif last_ms != U64:
            ms, seq = last_ms + 1, 0
        else:
            break
        enc = encode_entry((ms, seq), fields)
        entries.append((ms, seq, enc))
        reply_id = b"%d-%d" % (ms, seq)
        replies += b"$%d\r\n%s\r\n" % (len(reply_id), reply_id)
        used += len(enc) + 20
        last_ms, last_seq = ms, seq
        pos = end
    return pos, entries, replies, last_ms, last_seq, used


# -- generated pipelines -----------------------------------------------------

_values = st.binary(max_size=40)
_fields = st.lists(st.tuples(_values, _values), min_size=1, max_size=3).map(
    lambda pairs: [x for pair in pairs for x in pair])


@st.composite
def _piece(draw):
    kind = draw(st.sampled_from(["xadd", "xadd", "xadd", "other-key", "other-cmd", "explicit-id",
                                 "odd-arity", "noncanonical", "case", "big"]))
    fields = draw(_fields)
    if kind == "xadd":
        return encode_command([b"XADD", b"s", b"*", *fields])
    if kind == "case":
        return encode_command([draw(st.sampled_from([b"xadd", b"xAdD", b"XADd"])), b"s", b"*", *fields])
    if kind == "other-key":
        return encode_command([b"XADD", draw(st.sampled_from([b"t", b"ss", b""])), b"*", *fields])
    if kind == "other-cmd":
        return encode_command([draw(st.sampled_from([b"PING", b"XLEN", b"XADDX", b"XAD"])), b"s"])
    if kind == "explicit-id":
        return encode_command([b"XADD", b"s", draw(st.sampled_from([b"1-1", b"**", b"*x", b"MAXLEN"])), *fields])
    if kind == "odd-arity":
        return encode_command([b"XADD", b"s", b"*", *fields, b"dangling"])
    if kind == "big":
        return encode_command([b"XADD", b"s", b"*", b"f", b"x" * draw(st.integers(90, 110))])
    # non-canonical: a leading zero or a sign in one length
    raw = encode_command([b"XADD", b"s", b"*", *fields])
    spot = draw(st.sampled_from([b"*", b"$4", b"$1\r\ns", b"$1\r\n*"]))
    at = raw.find(spot)
    return raw[:at + 1] + draw(st.sampled_from([b"0", b"+"])) + raw[at + 1:]


@st.composite
def _pipeline(draw):
    data = b"".join(draw(st.lists(_piece(), min_size=1, max_size=8)))
    cut = draw(st.one_of(st.none(), st.integers(1, len(data))))
    return data if cut is None else data[:cut]


_ids = st.one_of(
    st.tuples(st.integers(0, 2**48), st.integers(0, 5)),
    st.tuples(st.sampled_from([U64 - 1, U64]), st.sampled_from([U64 - 2, U64 - 1, U64])),
)


@settings(max_examples=400, deadline=None)
@given(data=_pipeline(), pos_frac=st.floats(0, 1), last=_ids, now_delta=st.integers(-3, 3),
       max_entry=st.integers(0, 200), budget=st.integers(1, 800))
def test_scan_takes_exactly_what_the_reference_takes(data, pos_frac, last, now_delta, max_entry, budget):
    m = _module()
    # Start at a command boundary when the fraction lands on one, else anywhere.
    starts = [i for i in range(len(data)) if data[i:i + 1] == b"*"] or [0]
    pos = starts[int(pos_frac * (len(starts) - 1))]
    now = min(max(last[0] + now_delta, 0), U64)
    assert m.head_key(data, pos) == reference_head_key(data, pos)
    key = b"s"
    got = m.scan(data, pos, key, last[0], last[1], now, max_entry, budget)
    assert got == reference_scan(data, pos, key, last[0], last[1], now, max_entry, budget)


def test_scan_of_a_plain_run():
    m = _module()
    data = (encode_command([b"XADD", b"s", b"*", b"f", b"1"])
            + encode_command([b"xadd", b"s", b"*", b"a", b"", b"b", b"x" * 300])
            + encode_command([b"XADD", b"s", b"*", b"f", b"3"])
            + encode_command([b"XLEN", b"s"]))
    end, entries, replies, last_ms, last_seq, used = m.scan(data, 0, b"s", 7, 3, 7, 1000, 10**6)
    assert data[end:] == encode_command([b"XLEN", b"s"])
    assert [(ms, seq) for ms, seq, _ in entries] == [(7, 4), (7, 5), (7, 6)]
    assert entries[1][2] == encode_entry((7, 5), [b"a", b"", b"b", b"x" * 300])
    assert replies == b"$3\r\n7-4\r\n$3\r\n7-5\r\n$3\r\n7-6\r\n"
    assert (last_ms, last_seq) == (7, 6)
    assert used == sum(len(e[2]) + 20 for e in entries)
    # A later clock starts a new millisecond; the end of a millisecond's
    # sequences moves to the next; the end of the ID space takes nothing.
    assert m.scan(data, 0, b"s", 7, 3, 9, 1000, 10**6)[1][0][:2] == (9, 0)
    assert m.scan(data, 0, b"s", 7, U64, 7, 1000, 10**6)[1][0][:2] == (8, 0)
    assert m.scan(data, 0, b"s", U64, U64, 7, 1000, 10**6)[:2] == (0, [])


def test_scan_stops_at_the_budget_and_the_entry_size_limit():
    m = _module()
    one = encode_command([b"XADD", b"s", b"*", b"f", b"v" * 50])
    data = one * 10
    end, entries, *_ = m.scan(data, 0, b"s", 1, 0, 1, 1000, 1)  # the first entry crosses the budget
    assert end == len(one) and len(entries) == 1
    end, entries, *_ = m.scan(data, 0, b"s", 1, 0, 1, 51, 10**6)  # "f" + 50 bytes
    assert end == len(data) and len(entries) == 10
    assert m.scan(data, 0, b"s", 1, 0, 1, 50, 10**6)[:2] == (0, [])


def test_bad_arguments_raise_instead_of_reading_out_of_bounds():
    m = _module()
    data = encode_command([b"XADD", b"s", b"*", b"f", b"v"])
    with pytest.raises(ValueError):
        m.scan(data, len(data) + 1, b"s", 0, 0, 0, 10, 10)
    with pytest.raises(ValueError):
        m.head_key(data, -1)
    with pytest.raises(TypeError):
        m.scan(data, 0, "s", 0, 0, 0, 10, 10)
    assert m.head_key(data, len(data)) is None


# -- the whole path: a server with runs against one without -----------------

_ID_REPLY = re.compile(rb"\$\d+\r\n\d+-\d+\r\n")


async def _serve_pipeline(root, pipeline: bytes, runs: bool) -> tuple[bytes, list]:
    """Raw reply bytes (IDs masked) of ``pipeline`` on a fresh in-process
    server, then the fields of every entry of ``s`` and ``t``."""
    with tempfile.TemporaryDirectory(dir=root) as path:
        h = TopicsHarness(path)
        if not runs:
            del h.dispatcher.table.runs["xadd"]
        async with trio.open_nursery() as nursery:
            sock, _ = h.connect(nursery)
            # Create both keys, then write through both once more: a
            # topic's creation forgets which keys were written through,
            # and only those are taken as runs.
            setup = encode_command([b"XADD", b"s", b"*", b"init", b"1"]) + encode_command(
                [b"XADD", b"t", b"*", b"init", b"1"])
            for _ in range(2):
                await sock.send(setup)
                got = b""
                while got.count(b"\r\n") < 4:
                    got += await sock.recv(65536)
            sentinel = encode_command([b"ECHO", b"end-of-pipeline"])
            await sock.send(pipeline + sentinel)
            raw = b""
            with trio.fail_after(10):
                while not raw.endswith(b"$15\r\nend-of-pipeline\r\n"):
                    chunk = await sock.recv(65536)
                    if not chunk:
                        break  # a protocol error closed the connection
                    raw += chunk
            other, _ = h.connect(nursery)
            await other.send(encode_command([b"XRANGE", b"s", b"-", b"+"])
                             + encode_command([b"XRANGE", b"t", b"-", b"+"]))
            ranges = await read_replies(other, 2)
            nursery.cancel_scope.cancel()
        taken = h.state.stats.xadd_run_commands
        h.state.topics.close()
    fields = [[entry[1] for entry in r] for r in ranges]
    return _ID_REPLY.sub(b"<id>", raw), fields, taken


@settings(max_examples=60, deadline=None)
@given(pieces=st.lists(_piece(), min_size=1, max_size=10))
def test_a_server_with_runs_answers_and_stores_exactly_as_one_without(tmp_path_factory, pieces):
    root = tmp_path_factory.getbasetemp()
    pipeline = b"".join(pieces)
    *with_runs, taken = trio.run(_serve_pipeline, root, pipeline, True)
    *without, none_taken = trio.run(_serve_pipeline, root, pipeline, False)
    assert with_runs == without
    assert none_taken == 0
    first = _command(pipeline, 0)
    if first is not None and first[0] in (b"s", b"t"):
        assert taken >= 1  # the run path really ran


# -- a topic of several partitions: the sticky partitioner --------------------

async def test_a_run_to_a_topic_key_goes_to_one_partition_and_the_next_run_to_the_next(tmp_path):
    """Kafka's sticky partitioner for keyless records: the XADDs of a topic
    of several partitions taken as one run (one read, one key) all go to the
    partition the round-robin counter points at, as one log batch, and the
    counter moves on by one; XADDs sent one at a time are runs of one, so
    they still go round-robin entry by entry. A topic with a
    ``partition-key-field`` is hashed per entry, pipelined or not."""
    from cluster.partitioner import partition_for_key

    h = TopicsHarness(tmp_path)
    async with trio.open_nursery() as nursery:
        sock, _ = h.connect(nursery)
        await sock.send(encode_command([b"TOPIC", b"CREATE", b"t", b"PARTITIONS", b"3"])
                        + encode_command([b"TOPIC", b"CREATE", b"k", b"PARTITIONS", b"4",
                                          b"CONFIG", b"partition-key-field", b"user"]))
        assert await read_replies(sock, 2) == [b"OK", b"OK"]
        sent = []
        for i, n in enumerate([5, 4, 1, 3, 1, 1, 1]):
            values = [b"%d-%d" % (i, j) for j in range(n)]
            await sock.send(b"".join(xadd_request(b"t", v) for v in values))
            ids = await read_replies(sock, n)
            assert all(_ID_REPLY.fullmatch(b"$%d\r\n%s\r\n" % (len(x), x)) for x in ids)
            sent.append(values)
        taken = h.state.stats.xadd_run_commands
        users = [b"user-%d" % i for i in range(12)]
        await sock.send(b"".join(encode_command([b"XADD", b"k", b"*", b"user", u]) for u in users))
        await read_replies(sock, len(users))
        await sock.send(b"".join(encode_command([b"XRANGE", b"t#%d" % n, b"-", b"+"]) for n in range(3))
                        + b"".join(encode_command([b"XRANGE", b"k#%d" % n, b"-", b"+"]) for n in range(4)))
        ranges = await read_replies(sock, 7)
        nursery.cancel_scope.cancel()
    got = [[entry[1][1] for entry in r] for r in ranges]
    # Runs 0..6 went to partitions 0, 1, 2, 0, 1, 2, 0, each in its order.
    assert got[0] == sent[0] + sent[3] + sent[6]
    assert got[1] == sent[1] + sent[4]
    assert got[2] == sent[2] + sent[5]
    assert taken == 16  # every one of them through the run path
    topics = h.state.topics
    assert batch_counts(topics.get(b"t#0").log) == [5, 3, 1]  # one log batch per run
    assert batch_counts(topics.get(b"t#1").log) == [4, 1]
    for n in range(4):
        assert got[3 + n] == [u for u in users if partition_for_key(u, 4) == n]
    assert h.state.stats.xadd_run_commands == taken  # the keyed pipeline took the general path
    topics.close()


async def test_a_refused_run_to_a_topic_key_does_not_move_the_counter(tmp_path):
    """An XADD the run path leaves (an entry over the topic's max-entry-bytes)
    gets the general path's error, writes nothing and leaves the round-robin
    counter where it was."""
    h = TopicsHarness(tmp_path)
    async with trio.open_nursery() as nursery:
        sock, _ = h.connect(nursery)
        await sock.send(encode_command([b"TOPIC", b"CREATE", b"t", b"PARTITIONS", b"2",
                                        b"CONFIG", b"max-entry-bytes", b"100"]))
        assert await read_replies(sock, 1) == [b"OK"]
        await sock.send(xadd_request(b"t", b"x" * 200) + xadd_request(b"t", b"a"))
        refused, first = await read_replies(sock, 2)
        assert isinstance(refused, Exception) and "max-entry-bytes (100)" in str(refused)
        await sock.send(xadd_request(b"t", b"b"))
        await read_replies(sock, 1)
        await sock.send(encode_command([b"XRANGE", b"t#0", b"-", b"+"]) + encode_command([b"XRANGE", b"t#1", b"-", b"+"]))
        ranges = await read_replies(sock, 2)
        nursery.cancel_scope.cancel()
    # The refused XADD skipped nothing: "a" is the first entry of t#0, "b" of t#1.
    assert [[entry[1][1] for entry in r] for r in ranges] == [[b"a"], [b"b"]]
    h.state.topics.close()
