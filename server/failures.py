"""What the lower layers raise under a command becomes a clear error reply.

The dispatcher calls ``reply_for(exc)`` for any exception a handler lets
escape (a try costs nothing on the success path, so handlers carry no
wrappers): the stream and topic layers' refusals, which already carry
Redis's text, become ``-ERR <text>``; disk failures become the replies below;
anything else is a bug and the dispatcher logs it as one.

The cluster's refusals (cluster/errors.py) carry a code and an explanation;
here they become Redis's texts: ``-MOVED <slot> <host>:<port>`` (Redis
Cluster's redirect), ``-<CODE> <message>`` for the others, and a peer's
error relayed (a forwarded XADD's) exactly as the peer sent it
(``RelayedError``).

Owns: ``DISK_ERRORS`` (what the storage layer raises when the disk fails or
a file is damaged: ``StorageError`` from the funnel, a bare ``OSError``,
``GroupStateError``) and ``misconf(exc)``, the reply for each:

- a write failed (``WRITE_FAILED``; disk full: ENOSPC): Redis answers writes
  it cannot persist with ``-MISCONF Errors writing to the AOF file:
  <strerror>``; Partita says ``-MISCONF Errors writing to the partition log:
  <strerror>``. The write is not acknowledged and changed nothing.
- a damaged log batch found by a read (``CORRUPT``): ``-ERR corrupt
  partition log, not served: <file>: corrupt batch at position N: <why>``.
- stored data that cannot be read (``READ_FAILED``: a segment file deleted
  or unreadable, EIO): ``-ERR error reading the partition log: <operation>
  <file> failed: <errno name> (<strerror>)``, never the text of a refused
  write: nothing was written, and writes may well still work.
- damaged consumer-group files: ``-ERR consumer group state unreadable,
  refusing to guess: <file>: <why>``.

The connection stays open, other keys keep working, and the next command
tries the disk again. No traceback is logged: the storage funnel already
logged one line per disk error, and a damaged batch gets one WARNING here (docs/guarantees.md).

Must not know: which command failed or how files are laid out.
"""

from __future__ import annotations

import errno
import logging
import os

from cluster.errors import ClusterError, Moved, Refused
from cluster.topics import TopicError
from server.errors import CommandError
from storage.errors import CORRUPT, READ_FAILED, WRITE_FAILED, StorageError
from storage.streams.groups import GroupStateError
from storage.streams.ids import StreamIdError
from storage.streams.stream import StreamError

DISK_ERRORS = (StorageError, OSError, GroupStateError)
REFUSALS = (StreamIdError, StreamError, TopicError)  # ``message`` is Redis's (or Partita's) text
log = logging.getLogger("partita.storage")


def misconf(exc: BaseException) -> CommandError:
    if isinstance(exc, GroupStateError):
        return CommandError("ERR", f"consumer group state unreadable, refusing to guess: {exc}")
    kind = exc.code if isinstance(exc, StorageError) else (WRITE_FAILED if exc.errno else CORRUPT)
    if kind == CORRUPT:
        log.warning("refused to serve a damaged batch: %s", exc)
        return CommandError("ERR", f"corrupt partition log, not served: {exc}")
    if kind == READ_FAILED:
        return CommandError("ERR", f"error reading the partition log: {exc}")
    return CommandError("MISCONF", f"Errors writing to the partition log: {os.strerror(exc.errno or errno.EIO)}")


class RelayedError(CommandError):
    """A peer's error reply, relayed with its exact text."""

    def __init__(self, text: str) -> None:
        code, _, message = text.partition(" ")
        super().__init__(code, message)
        self.text = text

    @property
    def line(self) -> str:
        return self.text


def reply_for(exc: BaseException) -> CommandError | None:
    """The reply for a lower layer's exception, or None if it is a bug."""
    if isinstance(exc, REFUSALS):
        return CommandError("ERR", exc.message)
    if isinstance(exc, ClusterError):
        if isinstance(exc, Moved):  # Redis Cluster's redirect (docs/replication.md)
            return CommandError("MOVED", f"{exc.slot} {exc.leader.address}")
        if isinstance(exc, Refused):
            return RelayedError(exc.text)
        return CommandError(exc.code, exc.message)
    if isinstance(exc, DISK_ERRORS):
        return misconf(exc)
    return None
