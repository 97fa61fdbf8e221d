"""The request parser (server.resp) and the reply encoder (server.reply), without sockets."""

from __future__ import annotations

import hiredis
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from server.errors import CommandError, ProtocolError
from server.reply import NULL_ARRAY, OK, Map, Push, Raw, Set, Simple, Verbatim, encode
from server.resp import QueryBufferLimitError, RequestParser, encode_command, split_args

argvs = st.lists(st.binary(max_size=40), min_size=1, max_size=6)


def parse_all(*chunks: bytes, parser: RequestParser | None = None) -> list:
    parser = parser or RequestParser()
    out = []
    for chunk in chunks:
        parser.feed(chunk)
        while (argv := parser.get_command()) is not None:
            out.append(argv)
    return out


def parse_error(*chunks: bytes, parser: RequestParser | None = None) -> tuple[list, str]:
    parser = parser or RequestParser()
    out = []
    with pytest.raises(ProtocolError) as info:
        for chunk in chunks:
            parser.feed(chunk)
            while (argv := parser.get_command()) is not None:
                out.append(argv)
    return out, info.value.message


# -- multibulk ------------------------------------------------------------------


def test_pipelined_commands_come_out_in_order():
    data = encode_command([b"PING"]) + encode_command([b"ECHO", b"hi"]) + encode_command([b"XLEN", b"s"])
    assert parse_all(data) == [[b"PING"], [b"ECHO", b"hi"], [b"XLEN", b"s"]]


def test_need_more_data_is_a_normal_return():
    parser = RequestParser()
    parser.feed(b"*2\r\n$4\r\nECHO\r\n$5\r\nhel")
    assert parser.get_command() is None
    parser.feed(b"lo\r\n")
    assert parser.get_command() == [b"ECHO", b"hello"]
    assert parser.get_command() is None


def test_empty_multibulk_is_skipped_as_redis_does():
    assert parse_all(b"*0\r\n*-1\r\n" + encode_command([b"PING"])) == [[b"PING"]]


@settings(max_examples=60, deadline=None)
@given(st.lists(argvs, min_size=1, max_size=5), st.data())
def test_round_trip_with_every_split(commands, data):
    stream = b"".join(encode_command(a) for a in commands)
    cut = data.draw(st.integers(min_value=0, max_value=len(stream)))
    assert parse_all(stream[:cut], stream[cut:]) == commands


@settings(max_examples=20, deadline=None)
@given(st.lists(argvs, min_size=1, max_size=3))
def test_round_trip_one_byte_at_a_time(commands):
    stream = b"".join(encode_command(a) for a in commands)
    assert parse_all(*(stream[i : i + 1] for i in range(len(stream)))) == commands


def test_every_byte_boundary_of_a_mixed_pipeline():
    stream = (
        encode_command([b"SET", b"k", b"v\r\n"])
        + b"PING\r\n"
        + encode_command([b"ECHO", b""])
        + b'ECHO "a b"\n'
        + encode_command([b"X" * 300])
    )
    expected = [[b"SET", b"k", b"v\r\n"], [b"PING"], [b"ECHO", b""], [b"ECHO", b"a b"], [b"X" * 300]]
    for cut in range(len(stream) + 1):
        assert parse_all(stream[:cut], stream[cut:]) == expected, cut
    for a in range(0, len(stream), 7):
        for b in range(a, len(stream), 11):
            assert parse_all(stream[:a], stream[a:b], stream[b:]) == expected


# -- protocol errors: Redis's texts -----------------------------------------------


@pytest.mark.parametrize(
    "payload, message",
    [
        (b"*abc\r\n", "invalid multibulk length"),
        (b"*2147483648\r\n", "invalid multibulk length"),
        (b"*1\r\n$abc\r\n", "invalid bulk length"),
        (b"*1\r\n$-1\r\n", "invalid bulk length"),
        (b"*1\r\n$4294967296\r\n", "invalid bulk length"),
        (b"*1\r\nx\r\n", "expected '$', got 'x'"),
        (b"*2\r\n$1\r\na\r\n:5\r\n", "expected '$', got ':'"),
        (b"*1\r\n*1\r\n$1\r\na\r\n", "expected '$', got '*'"),
        # Elements hiredis would take as bytes: the exact parser refuses them,
        # after a long run of plain ones too (an XACK of many IDs).
        (b"*2\r\n$1\r\na\r\n+5\r\n", "expected '$', got '+'"),
        (b"*2\r\n$1\r\na\r\n(5\r\n", "expected '$', got '('"),
        (b"*2\r\n$1\r\na\r\n=5\r\n", "expected '$', got '='"),
        (b"*101\r\n" + b"$3\r\n1-1\r\n" * 100 + b"+5\r\n", "expected '$', got '+'"),
        (b'SET "a b\r\n', "unbalanced quotes in request"),
        (b"SET 'a\r\n", "unbalanced quotes in request"),
        (b'SET "a"b\r\n', "unbalanced quotes in request"),
    ],
)
def test_protocol_errors_have_redis_texts(payload, message):
    _, got = parse_error(payload)
    assert got == message


def test_declared_huge_bulk_is_refused_at_its_header():
    # No body follows: the error must come from the header alone.
    _, message = parse_error(b"*1\r\n$4294967296\r\n")
    assert message == "invalid bulk length"


def test_bulk_limit_follows_proto_max_bulk_len():
    parser = RequestParser(max_bulk_bytes=1024 * 1024)
    _, message = parse_error(b"*1\r\n$1048577\r\n", parser=parser)
    assert message == "invalid bulk length"
    assert parse_all(encode_command([b"x" * 1000]), parser=RequestParser(max_bulk_bytes=1024 * 1024))


def test_commands_before_garbage_are_returned_first():
    out, message = parse_error(encode_command([b"PING"]) + b"*1\r\nx\r\n")
    assert out == [[b"PING"]]
    assert message == "expected '$', got 'x'"


def test_too_big_inline_request():
    _, message = parse_error(b"A" * (64 * 1024 + 1))
    assert message == "too big inline request"


def test_too_big_count_strings():
    _, message = parse_error(b"*" + b"1" * (64 * 1024 + 1))
    assert message == "too big mbulk count string"
    _, message = parse_error(b"*1\r\n$" + b"1" * (64 * 1024 + 1))
    assert message == "too big bulk count string"


def test_query_buffer_limit():
    parser = RequestParser(query_buffer_limit_bytes=1024 * 1024)
    with pytest.raises(QueryBufferLimitError):
        parse_all(b"*2\r\n$1000000\r\n", b"x" * 1000000, b"\r\n$100000\r\n", parser=parser)
    parser = RequestParser(query_buffer_limit_bytes=1024 * 1024)
    chunk = b"$1\r\na\r\n" * 1000
    with pytest.raises(QueryBufferLimitError):
        parse_all(b"*1000000\r\n", *[chunk] * 200, parser=parser)


def test_unauthenticated_limits():
    parser = RequestParser(authenticated=lambda: False)
    _, message = parse_error(b"*11\r\n", parser=parser)
    assert message == "unauthenticated multibulk length"
    parser = RequestParser(authenticated=lambda: False)
    _, message = parse_error(b"*2\r\n$4\r\nAUTH\r\n$16385\r\n", parser=parser)
    assert message == "unauthenticated bulk length"
    parser = RequestParser(authenticated=lambda: False)
    _, message = parse_error(encode_command([b"AUTH", b"x" * 16385]), parser=parser)  # whole, in one receive
    assert message == "unauthenticated bulk length"
    parser = RequestParser(authenticated=lambda: True)
    assert parse_all(encode_command([b"a"] * 11), parser=parser) == [[b"a"] * 11]
    assert parse_all(encode_command([b"a", b"x" * 16385]), parser=RequestParser(authenticated=lambda: True))


def test_pending_bytes_stay_small_for_a_streamed_big_value():
    parser = RequestParser()
    parser.feed(b"*2\r\n$3\r\nSET\r\n$300000\r\n")
    assert parser.get_command() is None
    for _ in range(30):
        parser.feed(b"x" * 10000)
        assert parser.get_command() is None
    parser.feed(b"\r\n")
    assert parser.get_command() == [b"SET", b"x" * 300000]


# -- inline commands (sdssplitargs) ------------------------------------------------


@pytest.mark.parametrize(
    "line, argv",
    [
        (b"PING", [b"PING"]),
        (b"  set  a   b  ", [b"set", b"a", b"b"]),
        (b'set "a b" c', [b"set", b"a b", b"c"]),
        (b'echo "\\x41\\n\\t\\"q"', [b"echo", b'A\n\t"q']),
        (b"echo 'it\\'s'", [b"echo", b"it's"]),
        (b"echo 'a\\nb'", [b"echo", b"a\\nb"]),
        (b'echo a"b c"d', None),
        (b'echo ""', [b"echo", b""]),
        (b"", []),
    ],
)
def test_split_args(line, argv):
    assert split_args(line) == argv


def test_inline_lines_end_with_lf_or_crlf_and_blank_lines_are_skipped():
    assert parse_all(b"PING\nPING\r\n\r\nECHO x\r\n") == [[b"PING"], [b"PING"], [b"ECHO", b"x"]]


# -- reply encoding: RESP2 and RESP3 ----------------------------------------------


@pytest.mark.parametrize(
    "value, resp2, resp3",
    [
        (OK, b"+OK\r\n", b"+OK\r\n"),
        (b"ab", b"$2\r\nab\r\n", b"$2\r\nab\r\n"),
        (7, b":7\r\n", b":7\r\n"),
        (None, b"$-1\r\n", b"_\r\n"),
        (NULL_ARRAY, b"*-1\r\n", b"_\r\n"),
        (True, b":1\r\n", b"#t\r\n"),
        (1.5, b"$3\r\n1.5\r\n", b",1.5\r\n"),
        (Map([(b"a", 1)]), b"*2\r\n$1\r\na\r\n:1\r\n", b"%1\r\n$1\r\na\r\n:1\r\n"),
        (Set([b"a"]), b"*1\r\n$1\r\na\r\n", b"~1\r\n$1\r\na\r\n"),
        (Push([b"a"]), b"*1\r\n$1\r\na\r\n", b">1\r\n$1\r\na\r\n"),
        (Verbatim("hi"), b"$2\r\nhi\r\n", b"=6\r\ntxt:hi\r\n"),
        (CommandError("ERR", "bad\nthing"), b"-ERR bad thing\r\n", b"-ERR bad thing\r\n"),
        (Raw(1, [b"$1\r\nx\r\n"]), b"*1\r\n$1\r\nx\r\n", b"*1\r\n$1\r\nx\r\n"),
    ],
)
def test_encode_resp2_and_resp3(value, resp2, resp3):
    assert encode(value, 2) == resp2
    assert encode(value, 3) == resp3


replies = st.recursive(
    st.one_of(st.binary(max_size=20), st.integers(-(2**63), 2**63 - 1), st.none(),
              st.text(alphabet="abcXYZ ", max_size=10).map(Simple)),
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.binary(max_size=5), children, max_size=3).map(Map),
    ),
    max_leaves=12,
)


def _plain(value):
    if isinstance(value, Map):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, Simple):
        return value.encode()
    return value


def _flat(value):
    if isinstance(value, Map):
        out = []
        for k, v in value.items():
            out += [k, _flat(v)]
        return out
    if isinstance(value, list):
        return [_flat(v) for v in value]
    if isinstance(value, Simple):
        return value.encode()
    return value


@settings(max_examples=80, deadline=None)
@given(replies)
def test_encoded_replies_decode_back_with_hiredis(value):
    r3 = hiredis.Reader()
    r3.feed(encode(value, 3))
    assert r3.gets() == _plain(value)
    r2 = hiredis.Reader()
    r2.feed(encode(value, 2))
    assert r2.gets() == _flat(value)


def test_huge_declared_array_is_not_preallocated():
    import tracemalloc

    tracemalloc.start()
    try:
        parser = RequestParser()
        parser.feed(b"*2147483647\r\n$1\r\na\r\n")
        assert parser.get_command() is None
        current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000


def test_big_array_count_still_parses():
    argv = [b"x"] * 100001
    assert parse_all(encode_command(argv)) == [argv]


@settings(max_examples=40, deadline=None)
@given(st.lists(argvs, min_size=50, max_size=120), st.lists(st.integers(1, 700), min_size=1, max_size=40), st.booleans())
def test_long_pipelines_in_random_receives(commands, sizes, with_inline):
    """Exercises the hand-back from the exact parser to hiredis mid-stream."""
    parts = []
    for i, argv in enumerate(commands):
        if with_inline and i % 7 == 3 and all(a.isalnum() for a in argv):
            parts.append(b" ".join(argv) + b"\r\n")
        else:
            parts.append(encode_command(argv))
    stream = b"".join(parts)
    chunks, pos, i = [], 0, 0
    while pos < len(stream):
        size = sizes[i % len(sizes)]
        chunks.append(stream[pos : pos + size])
        pos += size
        i += 1
    # Only alphanumeric (hence non-empty) words go inline, so every command comes back.
    assert parse_all(*chunks) == commands
