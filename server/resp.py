"""Sans-IO request parser: bytes in, commands (``list[bytes]``) out.

Owns: framing of client requests exactly as Redis's ``networking.c``
(``processMultibulkBuffer`` / ``processInlineBuffer``) does it, Redis's
protocol-error texts, and the size limits that keep memory bounded whatever a
client sends. "Need more data" is the normal ``None`` return of
``get_command``; garbage raises ``ProtocolError`` (reply, then close).

Must not know: sockets, trio, commands, RESP reply encoding (``server.reply``).

Two parsers, one behaviour:

- The fast path is ``hiredis.Reader`` (C). It is used while the stream sits
  at a command boundary and starts with ``*``, which is nearly always: a
  receive holding whole commands is parsed entirely in C.
- The exact path is ``_parse_one`` (Python). It takes over when hiredis
  cannot be trusted to behave like Redis: an inline command, input hiredis
  rejects (to produce Redis's own error text), a reply-type element hiredis
  accepts but Redis does not (``:5``), or a receive that ends inside a
  command. In the last case the Python parser checks every declared length
  as soon as its header line arrives, so ``$4294967296`` is refused before
  anything is buffered for it, and it stays in charge until the stream is
  back at a command boundary, where it hands a long remaining pipeline
  back to hiredis.

hiredis allocates a list as soon as it reads an array header, so a receive
holding ``*`` followed by six digits (a count of 100000 or more, or a bulk
that happens to contain such bytes) goes to the exact parser instead.

hiredis also accepts reply types as elements where Redis wants ``$``, and
three of them come back as plain bytes, indistinguishable from a bulk: a
simple string (``*1\\r\\n+PING\\r\\n``), a big number (``(12``) and a
verbatim string (``=``). A receive with ``+``, ``(`` or ``=`` right after a
CRLF therefore goes to the exact parser too, which refuses them with Redis's
``expected '$', got '+'``. A bulk whose payload starts with one of those
bytes (``XRANGE s - +``) takes the same detour and is parsed the same way,
only in Python.
"""

from __future__ import annotations

import re

import hiredis

from server.errors import ProtocolError

# Redis's limits (server.h): PROTO_INLINE_MAX_SIZE, PROTO_MBULK_BIG_ARG.
INLINE_MAX_BYTES = 64 * 1024
MULTIBULK_MAX_COUNT = 2**31 - 1  # INT_MAX
UNAUTH_MULTIBULK_MAX_COUNT = 10
UNAUTH_BULK_MAX_BYTES = 16384
# Python-side cost charged per parsed argument when enforcing the query
# buffer limit (an argv entry costs memory beyond its bytes).
ARG_OVERHEAD_BYTES = 48
# Exact parser -> hiredis hand-back threshold: below it copying is not worth it.
HANDBACK_MIN_BYTES = 1024

_LIST = list
_JOIN = b"".join
# Input the fast path must not see: a huge array count, or an element typed
# `+`, `(` or `=` (hiredis returns those as bytes; Redis refuses them). Two
# searches, each with a literal start that sre scans for quickly: one
# pattern of both alternatives is tried at every byte (a 2 KB XACK of 100
# IDs: 23 µs against 3.5).
_HUGE_ARRAY = re.compile(rb"\*[0-9]{6}").search
_TYPED_ELEMENT = re.compile(rb"\r\n[+(=]").search


def _needs_exact(data: bytes) -> re.Match | None:
    return _TYPED_ELEMENT(data) or _HUGE_ARRAY(data)


_BYTES = bytes


class QueryBufferLimitError(ProtocolError):
    """A client's pending request outgrew ``client-query-buffer-limit``.

    Redis closes such a client without a reply; the connection does the same.
    """


class RequestParser:
    """Feed bytes with ``feed``; take commands with ``get_command`` until None.

    Args:
        max_bulk_bytes: ``proto-max-bulk-len``; a larger declared bulk is
            "invalid bulk length".
        query_buffer_limit_bytes: ``client-query-buffer-limit``; a pending
            command larger than this raises ``QueryBufferLimitError``.
        authenticated: a callable telling whether the client is
            authenticated; while it says no, Redis's tighter limits for
            unauthenticated clients apply (10 arguments, 16 KiB bulks).
    """

    __slots__ = (
        "max_bulk_bytes",
        "query_buffer_limit_bytes",
        "authenticated",
        "_reader",
        "_chunks",
        "_fed",
        "_suspect",
        "_consumed",
        "_slow",
        "_buf",
        "_pos",
        "_argv",
        "_want",
        "_bulk",
        "_cost",
    )

    def __init__(
        self,
        max_bulk_bytes: int = 512 * 1024 * 1024,
        query_buffer_limit_bytes: int = 1024 * 1024 * 1024,
        authenticated=None,
    ) -> None:
        self.max_bulk_bytes = max_bulk_bytes
        self.query_buffer_limit_bytes = query_buffer_limit_bytes
        self.authenticated = authenticated
        self._reader = hiredis.Reader()
        # Fast path: what hiredis holds since it was last at a command boundary.
        self._chunks: list[bytes] = []
        self._fed = 0  # bytes fed to hiredis since it was last at a command boundary
        self._consumed = 0  # canonical size of the commands it returned since then
        # The bytes fed since then hold '+', '(' or '=': an element hiredis
        # took for a bulk may have been a simple string, a big number or a
        # verbatim string, which Redis refuses ("expected '$'"); each command
        # is then checked against its canonical bytes before it is returned.
        self._suspect = False
        # Exact path state.
        self._slow = False
        self._buf = bytearray()
        self._pos = 0
        self._argv: list[bytes] | None = None  # the multibulk being read
        self._want = 0  # elements still wanted by it
        self._bulk = -1  # declared length of the bulk being read, -1 = header next
        self._cost = 0  # bytes charged to the pending command

    # -- input -------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        """Add received bytes. Never raises; errors surface in get_command."""
        if not data:
            return
        if self._slow:
            self._buf += data
        elif not self._chunks and data[0] != 42:  # not '*' at a boundary: inline
            self._slow = True
            self._buf += data
        elif _needs_exact(data) is not None:
            # hiredis allocates an array as soon as it reads ``*<count>``
            # (PyList_New(count)): a declared count of 100000 or more is
            # left to the exact parser, which allocates per element received;
            # so are elements hiredis would take for bulks (module docstring).
            self._to_slow()
            self._buf += data
        else:
            self._reader.feed(data)
            self._chunks.append(data)
            self._fed += len(data)
            if not self._suspect and (b"+" in data or b"(" in data or b"=" in data):
                self._suspect = True

    def at_boundary(self) -> bool:
        """True when no bytes of an unfinished command are held: what is
        received next starts a command."""
        return not self._slow and not self._chunks

    def pending_bytes(self) -> int:
        """Bytes received and not yet returned as commands (approximate)."""
        if self._slow:
            return len(self._buf) - self._pos + self._cost
        return sum(map(len, self._chunks))

    # -- output ------------------------------------------------------------

    def get_command(self) -> list[bytes] | None:
        """The next complete command, or None when more bytes are needed.

        Empty commands (``*0``, ``*-1``, blank inline lines) are skipped as
        Redis skips them. Raises ``ProtocolError`` with Redis's text.
        """
        if self._slow:
            return self._get_slow()
        gets = self._reader.gets
        while True:
            try:
                argv = gets()
            except hiredis.ProtocolError:
                self._to_slow()
                return self._get_slow()
            if argv is False:
                if self._consumed != self._fed:
                    # The receive ended inside a command (or held a form
                    # hiredis accepts and Redis does not): let the exact
                    # parser check headers and limits from here on.
                    self._to_slow()
                    return self._get_slow()
                self._chunks.clear()
                self._fed = self._consumed = 0
                self._suspect = False
                return None
            if argv.__class__ is not _LIST:
                self._to_slow()  # `*-1` (None) and similar: let Redis's rules decide
                return self._get_slow()
            try:
                # join raises TypeError unless every element is bytes-like
                # (hiredis gives int / list / None / ReplyError for `:`,
                # `*`, `$-1`, `-`): those go to the exact parser's errors.
                size = len(_JOIN(argv))
            except TypeError:
                self._to_slow()
                return self._get_slow()
            n = len(argv)
            start = self._consumed
            if n < 10 and size < 10000:
                # Canonical size: `*n\r\n` + per element `$len\r\n...\r\n`.
                self._consumed += 4 + size + 5 * n + sum(map(_digits_of, map(len, argv)))
            else:
                self._consumed += canonical_size(argv)
            if self._suspect and not self._is_canonical(argv, start):
                self._consumed = start  # the exact parser takes it from its first byte
                self._to_slow()
                return self._get_slow()
            if n:
                if (n > UNAUTH_MULTIBULK_MAX_COUNT or size > UNAUTH_BULK_MAX_BYTES) and (
                    self.authenticated is not None and not self.authenticated()
                ):
                    if n > UNAUTH_MULTIBULK_MAX_COUNT:
                        raise ProtocolError("unauthenticated multibulk length")
                    if max(map(len, argv)) > UNAUTH_BULK_MAX_BYTES:
                        raise ProtocolError("unauthenticated bulk length")
                return argv

    def _is_canonical(self, argv: list[bytes], start: int) -> bool:
        """Whether the bytes hiredis read for ``argv`` (from ``start`` of the
        bytes fed since the last boundary) are its canonical encoding."""
        chunks = self._chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        expected = encode_command(argv)
        return data[start:start + len(expected)] == expected

    def _to_slow(self) -> None:
        """Hand what hiredis holds to the exact parser.

        The commands hiredis already returned are skipped by their canonical
        size (the only encoding Redis accepts), so the exact parser resumes
        where hiredis stood at its last command boundary.
        """
        data = b"".join(self._chunks)
        skip = min(self._consumed, len(data))
        self._reader = hiredis.Reader()
        self._chunks = []
        self._fed = self._consumed = 0
        self._suspect = False
        self._slow = True
        self._buf = bytearray(memoryview(data)[skip:]) + self._buf
        self._pos = 0

    def _get_slow(self) -> list[bytes] | None:
        while True:
            argv = self._parse_one()
            if argv is None:
                if self._argv is None and self._pos >= len(self._buf):
                    # Back at a command boundary with nothing left: return to
                    # the fast path for the next receive.
                    self._buf = bytearray()
                    self._pos = 0
                    self._slow = False
                elif self._pos > 65536 and self._pos * 2 > len(self._buf):
                    del self._buf[: self._pos]
                    self._pos = 0
                return None
            if argv:
                if self._argv is None:
                    rest = len(self._buf) - self._pos
                    if rest == 0:
                        self._buf = bytearray()
                        self._pos = 0
                        self._slow = False
                    elif rest >= HANDBACK_MIN_BYTES and self._buf[self._pos] == 42:
                        self._hand_back()
                return argv

    def _hand_back(self) -> None:
        """At a command boundary with a long pipeline left: back to hiredis.

        A client streaming a big pipeline ends most receives mid-command;
        without this the Python parser would keep the whole stream.
        """
        data = bytes(self._buf[self._pos :])
        if _needs_exact(data) is not None:
            return
        self._buf = bytearray()
        self._pos = 0
        self._slow = False
        self._reader.feed(data)  # the reader is fresh: _to_slow replaced it
        self._chunks = [data]
        self._fed = len(data)
        self._consumed = 0
        self._suspect = b"+" in data or b"(" in data or b"=" in data

    # -- the exact parser --------------------------------------------------

    def _parse_one(self) -> list[bytes] | None:
        """Parse at ``_pos``: a command, ``[]`` for an empty one, None for more data."""
        buf = self._buf
        if self._argv is None:
            if self._pos >= len(buf):
                return None
            if buf[self._pos] != 42:  # '*'
                return self._parse_inline()
            nl = buf.find(b"\r\n", self._pos)
            if nl < 0:
                if len(buf) - self._pos > INLINE_MAX_BYTES:
                    raise ProtocolError("too big mbulk count string")
                return None
            count = _parse_ll(buf, self._pos + 1, nl)
            if count is None or count > MULTIBULK_MAX_COUNT:
                raise ProtocolError("invalid multibulk length")
            if count > UNAUTH_MULTIBULK_MAX_COUNT and self.authenticated is not None:
                if not self.authenticated():
                    raise ProtocolError("unauthenticated multibulk length")
            self._cost = nl + 2 - self._pos
            self._pos = nl + 2
            if count <= 0:
                self._cost = 0
                return []
            self._argv = []
            self._want = count
            self._bulk = -1
        argv = self._argv
        while self._want:
            if self._bulk < 0:
                pos = self._pos
                nl = buf.find(b"\r\n", pos)
                if nl < 0:
                    if len(buf) - pos > INLINE_MAX_BYTES:
                        raise ProtocolError("too big bulk count string")
                    if pos < len(buf) and buf[pos] != 36:
                        raise ProtocolError(f"expected '$', got '{chr(buf[pos])}'")
                    return None
                if buf[pos] != 36:  # '$'
                    raise ProtocolError(f"expected '$', got '{chr(buf[pos])}'")
                size = _parse_ll(buf, pos + 1, nl)
                if size is None or size < 0 or size > self.max_bulk_bytes:
                    raise ProtocolError("invalid bulk length")
                if size > UNAUTH_BULK_MAX_BYTES and self.authenticated is not None:
                    if not self.authenticated():
                        raise ProtocolError("unauthenticated bulk length")
                self._cost += nl + 2 - pos
                if self._cost + size > self.query_buffer_limit_bytes:
                    raise QueryBufferLimitError("query buffer limit reached")
                self._bulk = size
                self._pos = nl + 2
            size = self._bulk
            start = self._pos
            if len(buf) - start < size + 2:
                return None
            argv.append(bytes(buf[start : start + size]))
            self._pos = start + size + 2
            self._bulk = -1
            self._want -= 1
            self._cost += size + 2 + ARG_OVERHEAD_BYTES
            if self._cost > self.query_buffer_limit_bytes:
                raise QueryBufferLimitError("query buffer limit reached")
        self._argv = None
        self._cost = 0
        return argv

    def _parse_inline(self) -> list[bytes] | None:
        buf = self._buf
        pos = self._pos
        nl = buf.find(b"\n", pos)
        if nl < 0:
            if len(buf) - pos > INLINE_MAX_BYTES:
                raise ProtocolError("too big inline request")
            return None
        end = nl - 1 if nl > pos and buf[nl - 1] == 13 else nl
        line = bytes(buf[pos:end])
        self._pos = nl + 1
        argv = split_args(line)
        if argv is None:
            raise ProtocolError("unbalanced quotes in request")
        return argv


_DIGITS = [len(str(n)) for n in range(10000)]
_digits_of = _DIGITS.__getitem__


def canonical_size(argv: list[bytes]) -> int:
    """Bytes of ``argv`` as ``*n`` + ``$len`` bulks: the only form Redis accepts."""
    lens = list(map(len, argv))
    try:
        digits = sum(map(_digits_of, lens))
    except IndexError:
        digits = sum(len(str(n)) for n in lens)
    n = len(argv)
    return 3 + (_DIGITS[n] if n < 10000 else len(str(n))) + sum(lens) + digits + 5 * n


def _parse_ll(buf: bytearray, start: int, end: int) -> int | None:
    """Redis's ``string2ll`` on ``buf[start:end]``: None if not a canonical int64."""
    n = end - start
    if n <= 0 or n > 20:
        return None
    raw = bytes(buf[start:end])
    body = raw[1:] if raw[0] == 45 else raw
    if not body or not body.isdigit() or (len(body) > 1 and body[0] == 48):
        return None
    if raw[0] == 45 and body == b"0":
        return None
    value = int(raw)
    if value < -(2**63) or value > 2**63 - 1:
        return None
    return value


_HEX = b"0123456789abcdefABCDEF"
_ESCAPES = {ord("n"): 10, ord("r"): 13, ord("t"): 9, ord("b"): 8, ord("a"): 7}


def split_args(line: bytes) -> list[bytes] | None:
    """Redis's ``sdssplitargs``: split an inline command line.

    Handles ``"..."`` with ``\\n \\r \\t \\b \\a \\xHH`` escapes and ``'...'``
    with only ``\\'``; a closing quote must be followed by a space or the end.
    Returns None on unbalanced quotes.
    """
    args: list[bytes] = []
    i = 0
    n = len(line)
    while True:
        while i < n and line[i] in b" \n\r\t\v\f":
            i += 1
        if i >= n:
            return args
        current = bytearray()
        in_dq = in_sq = False
        while True:
            if in_dq:
                if i >= n:
                    return None
                c = line[i]
                if (
                    c == 92  # backslash
                    and i + 3 < n
                    and line[i + 1] == 120  # 'x'
                    and line[i + 2] in _HEX
                    and line[i + 3] in _HEX
                ):
                    current.append(int(line[i + 2 : i + 4], 16))
                    i += 3
                elif c == 92 and i + 1 < n:
                    i += 1
                    current.append(_ESCAPES.get(line[i], line[i]))
                elif c == 34:  # closing "
                    if i + 1 < n and line[i + 1] not in b" \n\r\t\v\f":
                        return None
                    i += 1
                    break
                else:
                    current.append(c)
            elif in_sq:
                if i >= n:
                    return None
                c = line[i]
                if c == 92 and i + 1 < n and line[i + 1] == 39:
                    i += 1
                    current.append(39)
                elif c == 39:
                    if i + 1 < n and line[i + 1] not in b" \n\r\t\v\f":
                        return None
                    i += 1
                    break
                else:
                    current.append(c)
            else:
                if i >= n:
                    break
                c = line[i]
                if c in b" \n\r\t\v\f":
                    break
                if c == 34:
                    in_dq = True
                elif c == 39:
                    in_sq = True
                else:
                    current.append(c)
            i += 1
        args.append(bytes(current))


def encode_command(argv: list[bytes]) -> bytes:
    """A command as a client sends it (``*n`` then ``$len`` bulks)."""
    out = [b"*%d\r\n" % len(argv)]
    for arg in argv:
        out.append(b"$%d\r\n%s\r\n" % (len(arg), arg))
    return b"".join(out)


def commands_in(data: bytes) -> list[list[bytes]]:
    """The whole commands in ``data``, bytes a fast path took as valid
    commands (a run of XADDs, a poll): to show them to SLOWLOG or MONITOR
    the rare times it must (``Dispatcher.xadd_run``)."""
    parser = RequestParser()
    parser.feed(data)
    found = []
    while (argv := parser.get_command()) is not None:
        found.append(argv)
    return found
