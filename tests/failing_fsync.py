"""Runs ``partita`` (the same arguments) with a disk that can fail on
demand: once the file ``<dir>.fail-fsync`` exists beside the data directory
``--dir <dir>``, every ``fdatasync`` or ``fsync`` of a file whose path
contains the text it holds fails with EIO, as a failing disk's writeback
does. The syncs of ``fsync everysec`` (a worker thread's ``os.fdatasync``)
and of the controller's Raft store (``os.fsync``) see it; the C thread of
``fsync always`` does not.

Only for tests (tests/e2e/test_controller.py): ``python tests/failing_fsync.py
--port ... --dir ...``."""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

_real_fdatasync = os.fdatasync
_real_fsync = os.fsync


def _trigger() -> Path:
    argv = sys.argv[1:]
    data_dir = Path(argv[argv.index("--dir") + 1]).resolve()
    return data_dir.with_name(data_dir.name + ".fail-fsync")


TRIGGER = _trigger()


def _failing(real):
    def sync(fd: int) -> None:
        try:
            fragment = TRIGGER.read_text().strip()
        except FileNotFoundError:
            fragment = ""
        if fragment and fragment in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real(fd)

    return sync


os.fdatasync = _failing(_real_fdatasync)
os.fsync = _failing(_real_fsync)

if __name__ == "__main__":
    from server.__main__ import main

    sys.exit(main(sys.argv[1:]))
