"""Runs ``partita`` (the same arguments) so that a topic rename dies halfway:
once the file ``<dir>.crash-rename`` exists beside the data directory
``--dir <dir>``, the process kills itself with SIGKILL (as ``kill -9``:
nothing flushed, nothing closed) when a rename reaches the step the file
names (``storage.log_manager.rename_step_hook``: begin, intent, aside,
moved, named, done).

Only for tests (tests/e2e/test_rename.py): ``python tests/crashing_rename.py
--port ... --dir ...``."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from storage import log_manager  # noqa: E402


def _trigger() -> Path:
    argv = sys.argv[1:]
    data_dir = Path(argv[argv.index("--dir") + 1]).resolve()
    return data_dir.with_name(data_dir.name + ".crash-rename")


TRIGGER = _trigger()


def _crash_at(step: str) -> None:
    try:
        wanted = TRIGGER.read_text().strip()
    except FileNotFoundError:
        return
    if wanted == step:
        os.kill(os.getpid(), signal.SIGKILL)


log_manager.rename_step_hook = _crash_at

if __name__ == "__main__":
    from server.__main__ import main

    sys.exit(main(sys.argv[1:]))
