"""Stream ID parsing and formatting, with Redis's edge cases (checked against redis-server 7.0)."""

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage.streams.ids import (
    INVALID_END,
    INVALID_ID,
    INVALID_START,
    MAX_ID,
    MIN_ID,
    UINT64_MAX,
    StreamId,
    StreamIdError,
    _parse_id_general,
    parse_id,
    parse_range_end,
    parse_range_start,
    parse_strict_id,
    parse_strict_id_tuples,
    parse_u64,
)


def test_format_and_order():
    assert StreamId(5, 3).encode() == b"5-3"
    assert str(StreamId(0, 0)) == "0-0"
    assert StreamId(1, 9) < StreamId(2, 0) < StreamId(2, 1)
    assert StreamId(5, 3) == (5, 3)


def test_incr_decr_carry_and_overflow():
    assert StreamId(1, UINT64_MAX).incr() == StreamId(2, 0)
    assert StreamId(2, 0).decr() == StreamId(1, UINT64_MAX)
    with pytest.raises(OverflowError):
        MAX_ID.incr()
    with pytest.raises(OverflowError):
        MIN_ID.decr()


@pytest.mark.parametrize(
    "raw, expected",
    [
        (b"5", 5), (b"0", 0), (b"00", 0), (b"+2", 2), (b" 2", 2), (b"\t7", 7),
        (b"18446744073709551615", UINT64_MAX), (b"-0", 0), (b"-01", UINT64_MAX),
    ],
)
def test_u64_accepts_what_string2ull_accepts(raw, expected):
    assert parse_u64(raw) == expected


@pytest.mark.parametrize("raw", [b"", b"-1", b"2 ", b"0x2", b"18446744073709551616", b"+", b"- 1", b"1.5"])
def test_u64_rejects(raw):
    assert parse_u64(raw) is None


def test_parse_forms():
    assert parse_id(b"-") == (MIN_ID, True)
    assert parse_id(b"+") == (MAX_ID, True)
    assert parse_id(b"7") == (StreamId(7, 0), True)
    assert parse_id(b"7", missing_seq=UINT64_MAX) == (StreamId(7, UINT64_MAX), True)
    assert parse_id(b"7-3") == (StreamId(7, 3), True)
    assert parse_id(b"1--0") == (StreamId(1, 0), True)
    assert parse_id(b"7-*", allow_seq_star=True) == (StreamId(7, 0), False)
    assert parse_id(b"2-1\x00zz") == (StreamId(2, 1), True)  # a C string stops at NUL


@pytest.mark.parametrize("raw", [b"", b"1-", b"-1", b"a", b"1-a", b"1-2-3", b"7-*", b"1--1", b"x" * 128, b"(1"])
def test_parse_invalid(raw):
    with pytest.raises(StreamIdError) as info:
        parse_id(raw)
    assert info.value.code == INVALID_ID


@pytest.mark.parametrize("raw", [b"-", b"+"])
def test_strict_forbids_specials(raw):
    with pytest.raises(StreamIdError):
        parse_strict_id(raw)


def test_range_bounds():
    assert parse_range_start(b"5") == StreamId(5, 0)
    assert parse_range_end(b"5") == StreamId(5, UINT64_MAX)
    assert parse_range_start(b"(5-1") == StreamId(5, 2)
    assert parse_range_end(b"(5-1") == StreamId(5, 0)
    assert parse_range_end(b"(5") == StreamId(5, UINT64_MAX - 1)
    assert parse_range_start(b"(5") == StreamId(5, 1)
    with pytest.raises(StreamIdError) as info:
        parse_range_start(b"(18446744073709551615-18446744073709551615")
    assert info.value.code == INVALID_START
    with pytest.raises(StreamIdError) as info:
        parse_range_end(b"(0-0")
    assert info.value.code == INVALID_END
    for raw in (b"(-", b"(+", b"("):
        with pytest.raises(StreamIdError) as info:
            parse_range_start(raw)
        assert info.value.code == INVALID_ID


_ID_BYTES = st.lists(st.sampled_from([b"0", b"1", b"7", b"9", b"-", b"+", b"*", b" ", b"\x00", b"a", b"\xd9\xa3",
                                      b"18446744073709551615", b"18446744073709551616", b"00"]),
                     max_size=8).map(b"".join)


@settings(max_examples=2000, deadline=None)
@given(raw=st.one_of(_ID_BYTES, st.binary(max_size=24), st.from_regex(rb"\A[0-9]{1,22}-[0-9]{1,22}\Z")),
       strict=st.booleans(), star=st.booleans())
def test_the_digits_dash_digits_shortcut_answers_as_the_general_parse(raw, strict, star):
    """``parse_id`` takes ``<digits>-<digits>`` without the string2ull
    emulation; every input gets what the general path gives (value or
    error), overflow, leading zeros, NULs and non-ASCII digits included."""
    def outcome(parse):
        try:
            return parse()
        except StreamIdError as e:
            return e.code

    general = outcome(lambda: _parse_id_general(raw, 0, strict, star))
    assert outcome(lambda: parse_id(raw, strict=strict, allow_seq_star=star)) == general
    if strict and not star:  # XACK's bulk parse: plain tuples, or the same error
        bulk = outcome(lambda: parse_strict_id_tuples([b"1-1", raw]))
        assert bulk == (general if isinstance(general, str) else [(1, 1), tuple(general[0])])


def test_xacks_id_parser_is_built_and_used():
    """Every install with a C compiler builds it (pyproject ext-modules); a
    build that silently fell back to the Python parse must fail CI."""
    from storage.streams import _ids, ids

    assert ids._ids is _ids
    assert _ids.plain_ids([b"1-2", b"0018446744073709551615-0"]) == [(1, 2), (2**64 - 1, 0)]
    assert _ids.plain_ids([b"1-2", b"18446744073709551616-0"]) is None


@settings(max_examples=1000, deadline=None)
@given(raws=st.lists(st.one_of(_ID_BYTES, st.from_regex(rb"\A[0-9]{1,22}-[0-9]{1,22}\Z"),
                               st.from_regex(rb"\A[0-9]{1,3}(-[0-9]{0,3}){0,3}\Z")), max_size=6))
def test_xacks_bulk_parse_answers_as_each_id_parsed_alone(raws):
    """XACK's IDs are parsed in one C call when every one is
    ``<digits>-<digits>``; any list (IDs with no dash or two, empty sides,
    overflow, other bytes) gets what parsing each alone gives."""
    def outcome(parse):
        try:
            return parse()
        except StreamIdError as e:
            return e.code

    each = outcome(lambda: [tuple(parse_id(raw, strict=True)[0]) for raw in raws])
    assert outcome(lambda: parse_strict_id_tuples(raws)) == each


_U64 = st.one_of(st.integers(0, 3), st.just(2**64 - 1))


@settings(max_examples=500, deadline=None)
@given(sids=st.lists(st.tuples(_U64, _U64), max_size=6), pending=st.sets(st.tuples(_U64, _U64), max_size=6))
def test_the_group_journals_id_helpers_answer_as_their_python_forms(sids, pending):
    """``pack_ids``: a journal record's ID list (u32 count, u64 ms and seq
    each); ``pending_ids``: the pending IDs of a strictly ascending list in
    order, None for any other list (its caller dedupes in Python)."""
    from storage.streams import _ids

    assert _ids.pack_ids(sids) == struct.pack(f"<I{2 * len(sids)}Q", len(sids), *[n for sid in sids for n in sid])
    pel = dict.fromkeys(pending, 0)
    ascending = all(a < b for a, b in zip(sids, sids[1:]))
    assert _ids.pending_ids(sids, pel) == ([sid for sid in sids if sid in pel] if ascending else None)


def test_the_group_journals_id_packer_refuses_what_is_not_an_id():
    from storage.streams import _ids

    for bad, error in (([(2**64, 0)], OverflowError), ([(-1, 0)], OverflowError), ([(1,)], TypeError),
                       ([(1, "2")], TypeError), ([5], TypeError)):
        with pytest.raises(error):
            _ids.pack_ids(bad)
    assert _ids.pending_ids([(1, 2), [1, 3]], {}) is None  # not all tuples: the Python path
