"""A disk error under a command becomes Redis's MISCONF reply, not a crash.

Owns: ``DISK_ERRORS`` (what the storage layer raises when the disk fails:
``StorageError`` from the funnel, or a bare ``OSError``) and ``misconf(exc)``,
the reply for it. Redis answers writes it cannot persist with
``-MISCONF Errors writing to the AOF file: <strerror>``; Partita says
``-MISCONF Errors writing to the partition log: <strerror>`` (disk full:
``No space left on device``). The write is not acknowledged, the connection
stays open, reads keep working, and the next write tries the disk again
(docs/guarantees.md).

Must not know: which command failed or how files are laid out.
"""

from __future__ import annotations

import os

from server.errors import CommandError
from storage.errors import StorageError

DISK_ERRORS = (StorageError, OSError)


def misconf(exc: BaseException) -> CommandError:
    code = getattr(exc, "errno", None)
    reason = os.strerror(code) if code else str(exc)
    return CommandError("MISCONF", f"Errors writing to the partition log: {reason}")
