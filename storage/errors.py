"""Storage errors and the one place where ``OSError`` becomes ``StorageError``.

Owns: the error types the storage layer raises, their codes (what failed:
a write, a read, or a check of stored data), ``Refusal`` (the base of every
refusal with a code and no client text, for the layers above too), and
``raise_storage_error``,
the single funnel every disk failure (ENOSPC, EIO, EROFS, ...) goes through
(compare Kafka's ``LocalLog.maybeHandleIOException``). The funnel logs one
line on logger ``partita.storage`` and notifies the listeners registered with
``add_disk_error_listener`` (the log manager uses this to count failures and
the server can mark the data dir offline).

Must not know: sockets, trio, streams, or how errors reach clients.
"""

from __future__ import annotations

import errno as _errno
import logging
import os
from collections.abc import Callable
from typing import NoReturn

_log = logging.getLogger("partita.storage")
_listeners: list[Callable[[str, OSError], None]] = []


# What a ``StorageError`` is about (``StorageError.code``). The reply a
# client gets for each is the server's (server/failures.py), not this layer's.
WRITE_FAILED = "write-failed"  # writing or syncing failed (errno set): the change was not made
READ_FAILED = "read-failed"  # stored data could not be read (errno set): nothing was changed
CORRUPT = "corrupt"  # stored data failed its checks (damaged on disk): not served


class StorageError(Exception):
    """A disk operation failed or found damaged data; the message says which
    and why, ``code`` which kind (``WRITE_FAILED`` by default when ``errno``
    is set, else ``CORRUPT``)."""

    def __init__(self, message: str, errno: int | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.errno = errno
        self.code = code or (WRITE_FAILED if errno else CORRUPT)

    def reading(self) -> "StorageError":
        """This error as met while reading stored data: a failed system call
        (an ``open`` the read needed, say) is a read error, not a refused write."""
        if self.code != WRITE_FAILED:
            return self
        return StorageError(self.message, self.errno, READ_FAILED)


class SyncError(StorageError):
    """An fsync (or fdatasync) failed: the kernel may have dropped the pages
    it could not write and reports that to one sync only, so what the file
    holds on disk is unknown. A partition log takes itself offline for
    writes on one (storage/log.py); elsewhere it is a ``StorageError``."""


class Refusal(Exception):
    """An operation refused for what it asked (an ID not above the stream's
    top, a group that exists, an unknown topic ...), not for a failure:
    nothing was changed.

    ``code`` names the refusal (each raising module defines its codes as
    constants); ``fields`` carry the data a message about it needs (a key,
    a number). No text for clients lives here: each front-end renders the
    codes its own way (the Redis one: server/failures.py).
    """

    def __init__(self, code: str, **fields) -> None:
        super().__init__(code, fields)
        self.code = code
        self.fields = fields

    def __str__(self) -> str:
        if not self.fields:
            return self.code
        return f"{self.code} ({', '.join(f'{k}={v!r}' for k, v in self.fields.items())})"


class OffsetOutOfRangeError(Exception):
    """A read or lookup asked for an offset outside [log_start_offset, log_end_offset]."""


class BeyondHighWatermarkError(OffsetOutOfRangeError):
    """A trim would move the log start past the high watermark (entries the
    in-sync replicas may not hold yet); nothing was changed. The caller may
    try again once the high watermark has moved."""


class BatchTooLargeError(ValueError):
    """An append of one batch over the log's ``max_batch_bytes``: nothing written."""


class InvalidBatchError(ValueError):
    """Bytes given to ``append_raw`` are not well-formed stored batches (bad CRC,
    bad length, wrong base offset, IDs not increasing)."""


def add_disk_error_listener(fn: Callable[[str, OSError], None]) -> None:
    """Call ``fn(what, exc)`` on every disk error that goes through the funnel."""
    _listeners.append(fn)


def remove_disk_error_listener(fn: Callable[[str, OSError], None]) -> None:
    if fn in _listeners:
        _listeners.remove(fn)


def raise_storage_error(what: str, exc: OSError, code: str = WRITE_FAILED, *, sync: bool = False) -> NoReturn:
    """The funnel: turn ``exc`` raised while doing ``what`` into ``StorageError``.

    Args:
        what: the operation and the file, e.g. ``"append to /d/0000.log"``.
        exc: the ``OSError`` the system call raised.
        code: ``READ_FAILED`` for a read of stored data, else ``WRITE_FAILED``.
        sync: the call was an fsync/fdatasync: raise ``SyncError``.

    Raises:
        StorageError: always (``SyncError`` with ``sync``), chained to ``exc``.
    """
    errno = exc.errno
    name = _errno.errorcode.get(errno, "EIO") if errno is not None else "EIO"
    reason = os.strerror(errno) if errno is not None else str(exc)
    message = f"{what} failed: {name} ({reason})"
    _log.error("disk error: %s", message)
    for fn in list(_listeners):
        try:
            fn(what, exc)
        except Exception:  # a broken listener must not hide the disk error
            _log.exception("disk error listener failed")
    raise (SyncError if sync else StorageError)(message, errno, code) from exc


def append_or_undo(fd: int, chunks: list, pos: int, what: str) -> int:
    """Write ``chunks`` back to back at ``pos`` (one ``pwritev``, then any
    rest); if the disk fails part way, truncate the file back to ``pos`` so no
    half record stays behind, and raise through the funnel.

    Returns the bytes written. Raises StorageError.
    """
    total = sum(map(len, chunks))
    try:
        written = os.pwritev(fd, chunks, pos)
        if written < total:
            rest = memoryview(b"".join(chunks))[written:]
            while rest:
                n = os.pwrite(fd, rest, pos + total - len(rest))
                rest = rest[n:]
    except OSError as exc:
        try:
            os.ftruncate(fd, pos)
        except OSError:
            pass
        raise_storage_error(what, exc)
    return total
