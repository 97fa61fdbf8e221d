"""Redis stream IDs: ``<ms>-<seq>``, two unsigned 64-bit integers.

Owns: the ``StreamId`` value, its text form, increment/decrement, and every
way a command argument names an ID, refused where Redis refuses it
(redis ``t_stream.c::streamGenericParseIDOrReply``,
``streamParseIntervalIDOrReply``, ``streamIncrID``/``streamDecrID``):

=============  =========================================================
``-`` / ``+``  smallest / largest ID (``0-0`` / ``max-max``), not in strict
               forms (XADD, XDEL, XSETID, MINID, XREAD)
``123``        ms only: ``123-0`` as a start, ``123-<max>`` as an end
``123-*``      XADD only: ms given, sequence generated
``(id``        exclusive range bound (strictly parsed, then incremented /
               decremented; overflow is ``INVALID_START`` / ``INVALID_END``)
=============  =========================================================

``$``, ``+`` and ``>`` in XREAD/XREADGROUP name positions in a stream, not
IDs; the command layer resolves them.

Numbers are parsed as Redis's ``string2ull`` does: a canonical integer, or
failing that C ``strtoull`` rules (leading white space, ``+``, leading zeros;
a ``-`` before a non-canonical number wraps modulo 2**64, as in C). The
argument is treated as a C string: at most 127 bytes, cut at the first NUL.

Must not know: sockets, RESP, the server's error types, any client's
error texts. Errors are ``StreamIdError`` with a code (``INVALID_ID``,
``INVALID_START``, ``INVALID_END``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from storage.errors import Refusal

try:  # XACK's IDs parsed in C (storage/streams/_ids.c); optional, as the other extensions
    from storage.streams import _ids
except ImportError:  # pragma: no cover - a build without a C compiler
    _ids = None

UINT64_MAX = 2**64 - 1

# Why an argument is not an ID (``StreamIdError.code``); Redis's texts for
# them are the server's (server/failures.py).
INVALID_ID = "invalid-id"  # not an ID in the form the argument allows
INVALID_START = "invalid-start-id"  # ``(max-max`` as a range start: nothing above it
INVALID_END = "invalid-end-id"  # ``(0-0`` as a range end: nothing below it


class StreamIdError(Refusal, ValueError):
    """An argument is not an acceptable stream ID; ``code`` says why."""

    def __init__(self, code: str = INVALID_ID) -> None:
        super().__init__(code)


class StreamId(NamedTuple):
    """A stream entry ID. A plain ``(ms, seq)`` tuple, as the log API uses."""

    ms: int
    seq: int

    def __str__(self) -> str:
        return f"{self.ms}-{self.seq}"

    def encode(self) -> bytes:
        """The ID as Redis writes it: ``b"<ms>-<seq>"``."""
        return b"%d-%d" % (self.ms, self.seq)

    def incr(self) -> StreamId:
        """The next ID; raises ``OverflowError`` after ``max-max``."""
        if self.seq == UINT64_MAX:
            if self.ms == UINT64_MAX:
                raise OverflowError("no stream ID after max-max")
            return StreamId(self.ms + 1, 0)
        return StreamId(self.ms, self.seq + 1)

    def decr(self) -> StreamId:
        """The previous ID; raises ``OverflowError`` before ``0-0``."""
        if self.seq == 0:
            if self.ms == 0:
                raise OverflowError("no stream ID before 0-0")
            return StreamId(self.ms - 1, UINT64_MAX)
        return StreamId(self.ms, self.seq - 1)


MIN_ID = StreamId(0, 0)
MAX_ID = StreamId(UINT64_MAX, UINT64_MAX)

_C_SPACE = b" \t\n\v\f\r"


def _string2ll_canonical(raw: bytes) -> int | None:
    """Redis ``string2ll``: canonical signed int64 text, else None."""
    if not raw or len(raw) > 20:
        return None
    body = raw[1:] if raw[:1] == b"-" else raw
    if not body.isdigit() or (body[0] == 48 and len(raw) != 1):
        return None
    value = int(raw)
    if not -(2**63) <= value < 2**63:
        return None
    return value


def parse_u64(raw: bytes) -> int | None:
    """Redis ``string2ull`` on a C string; None when it fails."""
    canonical = _string2ll_canonical(raw)
    if canonical is not None:
        return canonical if canonical >= 0 else None
    # strtoull(s, &end, 10) must consume the whole (non-empty) string.
    text = raw.lstrip(_C_SPACE)
    negative = False
    if text[:1] in (b"+", b"-"):
        negative = text[:1] == b"-"
        text = text[1:]
    if not raw or not text or not text.isdigit():
        return None
    value = int(text)
    if value > UINT64_MAX:
        return None  # ERANGE
    return (-value) % 2**64 if negative else value


def _c_string(raw: bytes) -> bytes:
    if len(raw) > 127:
        raise StreamIdError()
    nul = raw.find(b"\0")
    return raw if nul < 0 else raw[:nul]


def parse_id(
    raw: bytes,
    *,
    missing_seq: int = 0,
    strict: bool = False,
    allow_seq_star: bool = False,
) -> tuple[StreamId, bool]:
    """Parse ``raw`` as a stream ID.

    Args:
        missing_seq: sequence for the ms-only form (0 for starts, max for ends).
        strict: reject the special ``-`` and ``+`` forms.
        allow_seq_star: accept ``<ms>-*`` (XADD).

    Returns:
        ``(id, seq_given)``; ``seq_given`` is False only for ``<ms>-*``
        (then the ID's seq is 0).

    Raises:
        StreamIdError: ``INVALID_ID``.
    """
    plain = _plain_id(raw)
    if plain is not None:
        return StreamId(*plain), True
    return _parse_id_general(raw, missing_seq, strict, allow_seq_star)


def _plain_id(raw: bytes) -> tuple[int, int] | None:
    """The common form, ``<digits>-<digits>``, without the string2ull
    emulation: for ASCII digits alone its answer is the number when that
    fits in 64 bits. None for anything else (overflow included): the general
    path answers."""
    ms_part, _, seq_part = raw.partition(b"-")
    if seq_part.isdigit() and ms_part.isdigit() and len(raw) <= 127:
        ms = int(ms_part)
        seq = int(seq_part)
        if ms <= UINT64_MAX and seq <= UINT64_MAX:
            return ms, seq
    return None


def _parse_id_general(raw: bytes, missing_seq: int, strict: bool, allow_seq_star: bool) -> tuple[StreamId, bool]:
    buf = _c_string(raw)
    if buf == b"-":
        if strict:
            raise StreamIdError()
        return MIN_ID, True
    if buf == b"+":
        if strict:
            raise StreamIdError()
        return MAX_ID, True
    ms_part, dash, seq_part = buf.partition(b"-")
    ms = parse_u64(ms_part)
    if ms is None:
        raise StreamIdError()
    if not dash:
        return StreamId(ms, missing_seq), True
    if allow_seq_star and seq_part == b"*":
        return StreamId(ms, 0), False
    seq = parse_u64(seq_part)
    if seq is None:
        raise StreamIdError()
    return StreamId(ms, seq), True


def parse_strict_id(raw: bytes) -> StreamId:
    """An ID where ``-`` and ``+`` are not allowed (XDEL, XSETID, MINID, XREAD)."""
    return parse_id(raw, strict=True)[0]


def parse_strict_id_tuples(raws: Iterable[bytes]) -> list[tuple[int, int]]:
    """``[tuple(parse_strict_id(raw)) for raw in raws]`` (XACK's hundred
    IDs): when every one is ``<digits>-<digits>`` (``_plain_id``'s form) all
    are parsed in one C call (``storage/streams/_ids.c``); else each goes
    through ``_plain_id`` or the general path, without ``parse_id``'s
    wrapping or a ``StreamId`` per ID."""
    raws = raws if isinstance(raws, list) else list(raws)
    if _ids is not None:
        plain = _ids.plain_ids(raws)
        if plain is not None:
            return plain
    return [plain if (plain := _plain_id(raw)) is not None else tuple(_parse_id_general(raw, 0, True, False)[0])
            for raw in raws]


def parse_range_start(raw: bytes) -> StreamId:
    """The inclusive lower bound of XRANGE/XREVRANGE: ``-``, ``id``, ``ms``, ``(id``."""
    if len(raw) > 1 and raw[:1] == b"(":
        bound = parse_id(raw[1:], strict=True)[0]
        try:
            return bound.incr()
        except OverflowError:
            raise StreamIdError(INVALID_START) from None
    return parse_id(raw)[0]


def parse_range_end(raw: bytes) -> StreamId:
    """The inclusive upper bound of XRANGE/XREVRANGE: ``+``, ``id``, ``ms``, ``(id``."""
    if len(raw) > 1 and raw[:1] == b"(":
        bound = parse_id(raw[1:], missing_seq=UINT64_MAX, strict=True)[0]
        try:
            return bound.decr()
        except OverflowError:
            raise StreamIdError(INVALID_END) from None
    return parse_id(raw, missing_seq=UINT64_MAX)[0]


def format_id(stream_id: tuple[int, int]) -> bytes:
    """``b"<ms>-<seq>"`` for any ``(ms, seq)`` tuple."""
    return b"%d-%d" % (stream_id[0], stream_id[1])
