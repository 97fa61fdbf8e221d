"""The benchmark harness stops every server it started, even one that never
became ready (a server left running would skew every later measurement)."""

from __future__ import annotations

import pytest

from bench.procs import ServerProcess


def test_a_server_that_never_answers_ping_is_stopped(monkeypatch):
    server = ServerProcess("partita", [])

    def never_ready(timeout_s):
        raise RuntimeError("partita did not answer PING")

    monkeypatch.setattr(server, "wait_ready", never_ready)
    with pytest.raises(RuntimeError):
        with server:
            pass
    assert server.proc is not None and server.proc.poll() is not None
    assert not server.data_dir.exists()
