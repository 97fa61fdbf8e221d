"""Errors at the edge between command handling and the client.

Owns: the two kinds of failure a client can see.

- ``ProtocolError``: the byte stream itself is garbage. The connection replies
  ``-ERR Protocol error: <msg>`` and then closes (redis ``setProtocolError``).
- ``CommandError``: one command failed. The reply is ``-<CODE> <msg>`` and the
  connection stays open. The message text is Redis's own, word for word, where
  Redis has one for the same mistake.

Must not know: sockets, storage, RESP encoding (the encoder turns a
``CommandError`` into bytes).
"""

from __future__ import annotations


class ProtocolError(Exception):
    """The client sent bytes that are not RESP; reply, then close."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def reply_line(self) -> bytes:
        return b"-ERR Protocol error: " + self.message.encode() + b"\r\n"


class CommandError(Exception):
    """A command failed; ``-CODE message`` goes to the client.

    ``code`` is the Redis error code (``ERR``, ``WRONGTYPE``, ``NOGROUP`` ...);
    ``message`` the rest of the line. ``CommandError("ERR", "syntax error")``
    encodes as ``-ERR syntax error``.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code} {message}")
        self.code = code
        self.message = message

    @property
    def line(self) -> str:
        return f"{self.code} {self.message}"


def err(message: str) -> CommandError:
    """The common ``-ERR <message>`` error."""
    return CommandError("ERR", message)


# Redis's own texts for mistakes many commands share (server.c / t_stream.c).
SYNTAX = "syntax error"
NOT_INTEGER = "value is not an integer or out of range"
INVALID_STREAM_ID = "Invalid stream ID specified as stream command argument"
TIMEOUT_NOT_INTEGER = "timeout is not an integer or out of range"
TIMEOUT_NEGATIVE = "timeout is negative"
# XREAD / XREADGROUP (Redis 8.10: MAXCOUNT is a cap over all keys, COUNT per key).
MAXCOUNT_BELOW_COUNT = "MAXCOUNT must be greater than or equal to COUNT"
WRONGTYPE = "Operation against a key holding the wrong kind of value"


def syntax_error() -> CommandError:
    return CommandError("ERR", SYNTAX)


def subcommand_arity(argv: list[bytes]) -> CommandError:
    """Redis's answer to a container's subcommand with more arguments than it
    takes (``addReplySubcommandSyntaxError``: PUBSUB CHANNELS a b)."""
    sub = argv[1].decode("utf-8", "replace")[:128]
    container = argv[0].decode("utf-8", "replace").upper()
    return CommandError("ERR", f"unknown subcommand or wrong number of arguments for '{sub}'. Try {container} HELP.")


def wrong_arity(name: str) -> CommandError:
    return CommandError("ERR", f"wrong number of arguments for '{name}' command")


BAD_CLIENT_NAME = CommandError("ERR", "Client names cannot contain spaces, newlines or special characters.")
