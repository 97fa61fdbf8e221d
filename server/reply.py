"""Reply values and the one RESP2/RESP3 encoder.

Owns: the Python values a command handler may return, and turning them into
bytes for a connection's protocol version. Every RESP2/RESP3 difference lives
in ``encode`` and nowhere else (redis ``networking.c::addReplyMapLen``,
``addReplyNull``).

Must not know: sockets, commands, storage (but for ``Entries``, the one
storage type that is a reply value).

Reply values:

=====================  ==========================  ============================
value                  RESP2                       RESP3
=====================  ==========================  ============================
``bytes``/``bytearray`` bulk string ``$3\\r\\nabc``  same
``str``                bulk string (UTF-8)         same
``Simple("OK")``       ``+OK``                     same
``OK``                 ``+OK``                     same
``int``                ``:1``                      same
``bool``               ``:1`` / ``:0``             ``#t`` / ``#f``
``float``              bulk string                 double ``,1.5``
``None``               null bulk ``$-1``           null ``_``
``NULL_ARRAY``         null array ``*-1``          null ``_``
``list``/``tuple``     array                       array
``Map`` / ``dict``     flat array of k, v          map ``%``
``Set``                array                       set ``~``
``Verbatim(text)``     bulk string                 verbatim ``=txt:``
``Push(items)``        array                       push ``>``
``Raw(count, chunks)`` ``*count`` + chunks          same
``Entries``            ``*count`` + chunks          same
``CommandError``       ``-CODE msg``               same
=====================  ==========================  ============================

``Raw`` carries bytes that are already RESP. ``Entries``
(``storage.streams.Entries``, what the broker's reads return) carries
stream entries as stored on disk (``*2 id *2n field value ...``, the same in
RESP2 and RESP3), sent without decoding them; its chunks may be views of a
segment file's mapping, to be sent at once or copied before the connection
waits for anything (a log may be cut back meanwhile). ``encode_into`` says
when a reply held any: the connection owns them from there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from server.errors import CommandError
from storage.streams.stream import Entries


class Simple(str):
    """A simple string reply: ``+text``. Must not contain CR or LF."""

    __slots__ = ()


OK = Simple("OK")
QUEUED = Simple("QUEUED")
PONG = Simple("PONG")


class _NullArray:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NULL_ARRAY"


NULL_ARRAY = _NullArray()


class Map(dict):
    """A map reply: RESP3 ``%``; RESP2 a flat array of keys and values."""

    __slots__ = ()


class Set(list):
    """A set reply: RESP3 ``~``; RESP2 an array."""

    __slots__ = ()


class Push(list):
    """An out-of-band push: RESP3 ``>``; RESP2 an array."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Verbatim:
    """A verbatim string (INFO, CLIENT LIST ...): RESP3 ``=txt:``; RESP2 bulk."""

    text: str
    format: str = "txt"


@dataclass(frozen=True, slots=True)
class Raw:
    """An array of ``count`` elements whose RESP bytes are already encoded.

    ``chunks`` concatenated are exactly ``count`` encoded elements.
    """

    count: int
    chunks: tuple[bytes | memoryview, ...] | list[bytes | memoryview]


def encode(value: Any, protocol: int = 2) -> bytes:
    """Encode one reply value for RESP ``protocol`` (2 or 3)."""
    out: list[bytes] = []
    encode_into(out, value, protocol)
    return b"".join(out)


def encode_into(out: list, value: Any, protocol: int) -> bool:
    """Append the encoding of ``value`` to ``out`` (a list of byte chunks).
    True when it appended the chunks of ``Entries`` (possibly views of log
    mappings: send ``out`` at once, or copy them before waiting)."""
    append = out.append
    t = type(value)
    if t is bytes or t is bytearray or t is memoryview:
        append(b"$%d\r\n" % len(value))
        append(value)
        append(b"\r\n")
    elif t is Simple:
        append(b"+" + value.encode() + b"\r\n")
    elif t is int:
        append(b":%d\r\n" % value)
    elif t is str:
        data = value.encode()
        append(b"$%d\r\n%s\r\n" % (len(data), data))
    elif value is None:
        append(b"_\r\n" if protocol == 3 else b"$-1\r\n")
    elif t is list or t is tuple:
        append(b"*%d\r\n" % len(value))
        mapped = False
        for item in value:
            if encode_into(out, item, protocol):
                mapped = True
        return mapped
    elif t is Entries:
        append(b"*%d\r\n" % value.count)
        out.extend(value.chunks)
        return value.count > 0
    elif t is Raw:
        append(b"*%d\r\n" % value.count)
        out.extend(value.chunks)
    elif t is Map or t is dict:
        append((b"%%%d\r\n" if protocol == 3 else b"*%d\r\n") % (len(value) * (1 if protocol == 3 else 2)))
        mapped = False
        for k, v in value.items():
            encode_into(out, k, protocol)
            if encode_into(out, v, protocol):
                mapped = True
        return mapped
    elif t is bool:
        if protocol == 3:
            append(b"#t\r\n" if value else b"#f\r\n")
        else:
            append(b":1\r\n" if value else b":0\r\n")
    elif isinstance(value, CommandError):
        append(b"-" + _one_line(value.line).encode() + b"\r\n")
    elif t is Set:
        append((b"~%d\r\n" if protocol == 3 else b"*%d\r\n") % len(value))
        for item in value:
            encode_into(out, item, protocol)
    elif t is Push:
        append((b">%d\r\n" if protocol == 3 else b"*%d\r\n") % len(value))
        for item in value:
            encode_into(out, item, protocol)
    elif value is NULL_ARRAY:
        append(b"_\r\n" if protocol == 3 else b"*-1\r\n")
    elif t is float:
        text = _format_double(value).encode()
        if protocol == 3:
            append(b"," + text + b"\r\n")
        else:
            append(b"$%d\r\n%s\r\n" % (len(text), text))
    elif t is Verbatim:
        data = value.text.encode()
        if protocol == 3:
            body = value.format.encode() + b":" + data
            append(b"=%d\r\n%s\r\n" % (len(body), body))
        else:
            append(b"$%d\r\n%s\r\n" % (len(data), data))
    elif isinstance(value, int):  # int subclasses (IntEnum ...)
        append(b":%d\r\n" % int(value))
    elif isinstance(value, str):
        encode_into(out, str(value), protocol)
    else:
        raise TypeError(f"cannot encode reply value of type {t.__name__}")
    return False


def _one_line(text: str) -> str:
    # Redis replaces newlines in error strings so the reply stays one line.
    return text.replace("\r", " ").replace("\n", " ")


def _format_double(value: float) -> str:
    if value != value:
        return "nan"
    if value in (float("inf"), float("-inf")):
        return "inf" if value > 0 else "-inf"
    if value == int(value) and abs(value) < 1e17:
        return str(int(value))
    return repr(value)


def help_reply(command: str, lines: list[str]) -> list[Simple]:
    """A ``<COMMAND> HELP`` reply as Redis's ``addReplyHelp`` makes it: the
    title line, ``lines``, then HELP's own two."""
    return [Simple(line) for line in [f"{command} <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                                      *lines, "HELP", "    Prints this help."]]


def flatten_pairs(pairs: Iterable[tuple[Any, Any]]) -> Map:
    """A ``Map`` from key/value pairs, keeping their order."""
    return Map(pairs)
