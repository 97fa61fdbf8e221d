"""What ``partita`` logs when an error ends it (``server.__main__.main``):
a refusal that explains itself in one line, anything else with its
traceback, so that a bug that stops the server can be found."""

from __future__ import annotations

import errno
import logging

import pytest
import trio

from server.__main__ import main


@pytest.fixture(autouse=True)
def _logging_restored():
    """``main`` sets up the server's logger (to stdout); put it back after."""
    logger = logging.getLogger("partita")
    handlers, propagate, level = logger.handlers[:], logger.propagate, logger.level
    yield
    logger.handlers[:], logger.propagate = handlers, propagate
    logger.setLevel(level)


def _fatal_output(monkeypatch, capsys, tmp_path, error: BaseException) -> str:
    def run(*args, **kwargs):
        raise error

    monkeypatch.setattr(trio, "run", run)
    assert main(["--port", "0", "--dir", str(tmp_path / "data")]) == 1
    return capsys.readouterr().out


def test_a_socket_error_that_ends_the_server_is_logged_with_its_traceback(monkeypatch, capsys, tmp_path):
    out = _fatal_output(monkeypatch, capsys, tmp_path, OSError(errno.EBADF, "Bad file descriptor"))
    assert "# Fatal: [Errno 9] Bad file descriptor\nTraceback (most recent call last):" in out


def test_a_path_the_system_refuses_is_one_line(monkeypatch, capsys, tmp_path):
    out = _fatal_output(monkeypatch, capsys, tmp_path, PermissionError(errno.EACCES, "Permission denied", "/srv/data"))
    assert out.endswith("# Fatal: [Errno 13] Permission denied: '/srv/data'\n")
    assert "Traceback" not in out
