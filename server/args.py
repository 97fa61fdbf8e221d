"""A cursor over a command's arguments (mini-redis ``parse.rs``).

Owns: turning ``argv`` bytes into typed values with Redis's own error texts,
and the rule that a command ends with ``finish()`` (leftover args are a syntax
error).

Must not know: sockets, storage, what any particular command means.
"""

from __future__ import annotations

from cluster.broker.references import KEEPREF, REF_POLICIES
from server.errors import NOT_INTEGER, CommandError, syntax_error

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

# The reference policies of XDELEX / XACKDEL and of XADD / XTRIM's trims
# (Redis 8.2), as their arguments spell them.
REF_POLICY_WORDS = tuple(p.encode() for p in REF_POLICIES)


def parse_int(raw: bytes, message: str = NOT_INTEGER) -> int:
    """Parse a signed 64-bit integer as Redis's ``string2ll`` does.

    No spaces, no ``+``, no leading zeros (other than ``0`` itself), fits in int64.
    """
    n = len(raw)
    if n == 0 or n > 20:
        raise CommandError("ERR", message)
    first = raw[0]
    body = raw[1:] if first == 45 else raw  # '-'
    if not body or not body.isdigit() or (len(body) > 1 and body[0] == 48):
        raise CommandError("ERR", message)
    if first == 45 and body == b"0":
        raise CommandError("ERR", message)
    value = int(raw)
    if value < INT64_MIN or value > INT64_MAX:
        raise CommandError("ERR", message)
    return value


def parse_positive(raw: bytes, name: str) -> int:
    """A value that must be a positive integer (XREAD's MAXCOUNT, MAXSIZE):
    ``<name> must be a positive integer`` otherwise."""
    message = f"{name} must be a positive integer"
    value = parse_int(raw, message)
    if value <= 0:
        raise CommandError("ERR", message)
    return value


def parse_ids_block(argv: list[bytes], start: int) -> tuple[str, list[bytes]]:
    """Redis 8.2's ``[KEEPREF | DELREF | ACKED] IDS numids id [id ...]`` at
    ``argv[start:]`` (XDELEX, XACKDEL: the IDS block and one reference policy
    in either order, each at most once): ``(the policy, KEEPREF when none was
    given; the raw IDs)``."""
    word = None
    raw_ids = None
    i = start
    while i < len(argv):
        upper = argv[i].upper()
        if upper in REF_POLICY_WORDS and word is None:
            word = upper
            i += 1
        elif upper == b"IDS" and raw_ids is None and i + 1 < len(argv):
            numids = parse_int(argv[i + 1], "Number of IDs must be a positive integer")
            if numids <= 0:
                raise CommandError("ERR", "Number of IDs must be a positive integer")
            if numids > len(argv) - i - 2:
                raise CommandError("ERR", "The `numids` parameter must match the number of arguments")
            raw_ids = argv[i + 2:i + 2 + numids]
            i += 2 + numids
        else:
            raise syntax_error()
    if raw_ids is None:
        raise syntax_error()
    return (word.decode() if word is not None else KEEPREF), raw_ids


class ArgCursor:
    """Walks ``argv`` from ``start``; every ``next_*`` consumes one argument."""

    __slots__ = ("argv", "pos")

    def __init__(self, argv: list[bytes], start: int = 1) -> None:
        self.argv = argv
        self.pos = start

    def remaining(self) -> int:
        return len(self.argv) - self.pos

    def has_more(self) -> bool:
        return self.pos < len(self.argv)

    def peek(self) -> bytes | None:
        return self.argv[self.pos] if self.pos < len(self.argv) else None

    def peek_keyword(self) -> str | None:
        """The next argument upper-cased as text, without consuming it."""
        raw = self.peek()
        if raw is None:
            return None
        try:
            return raw.decode("ascii").upper()
        except UnicodeDecodeError:
            return None

    def next_bytes(self) -> bytes:
        if self.pos >= len(self.argv):
            raise syntax_error()
        value = self.argv[self.pos]
        self.pos += 1
        return value

    def next_keyword(self) -> str:
        raw = self.next_bytes()
        return raw.decode("latin-1").upper()

    def next_int(self, message: str = NOT_INTEGER) -> int:
        return parse_int(self.next_bytes(), message)

    def rest(self) -> list[bytes]:
        value = self.argv[self.pos :]
        self.pos = len(self.argv)
        return value

    def finish(self) -> None:
        """Raise a syntax error if any argument is left over."""
        if self.pos < len(self.argv):
            raise syntax_error()
