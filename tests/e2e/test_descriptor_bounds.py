"""Open descriptors stay bounded by configuration, whatever the number of
partitions written (docs/guarantees.md "Open file descriptors").

A real ``partita`` runs under a low ``RLIMIT_NOFILE`` (``prlimit``) with
``max-open-files`` and ``maxclients`` that fit under it, and is written to
on more partitions than it may keep files open for: every write succeeds,
the descriptor count (``/proc/<pid>/fd``) stays within ``max-open-files`` +
``maxclients`` + the reserve during the load and after it, new clients are
served, and SIGTERM ends it cleanly. Under each fsync policy: ``always``
(group commit on the C thread), ``everysec`` (the background flusher) and
``no`` (only the clean shutdown flushes).
"""

from __future__ import annotations

import os
import shutil
import threading

import pytest

from server.app import RESERVED_FDS
from storage.checkpoint import read_rows
from tests.conftest import PartitaProcess, RawConn, partita_command, wait_for

NOFILE = 256
PARTITIONS = 512  # each holds a log, two index files and a directory to sync: far more than NOFILE
MAX_OPEN_FILES = 96
MAXCLIENTS = 16
BOUND = MAX_OPEN_FILES + MAXCLIENTS + RESERVED_FDS
WRITES = 2000

pytestmark = pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs prlimit (util-linux)")


def _cmd(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


def _start(tmp_path, nofile: int, extra_args: list[str]) -> PartitaProcess:
    launcher = ["prlimit", f"--nofile={nofile}:{nofile}", *partita_command()]
    return PartitaProcess(tmp_path / "data", extra_args, launcher=launcher).start()


def _open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


class _FdSampler:
    """The highest descriptor count of a process, sampled on a thread
    until stopped."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.most = _open_fds(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.002):
            self.most = max(self.most, _open_fds(self.pid))

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(5)
        return self.most


def _checkpointed_entries(data_dir) -> int:
    """Entries below the recovery points persisted in the partitions'
    ``recovery-point.checkpoint`` files."""
    total = 0
    for path in data_dir.glob("topics/*/*/recovery-point.checkpoint"):
        try:
            total += read_rows(path, 1)[0][0]
        except (OSError, IndexError, ValueError):
            pass  # being replaced: the next poll reads it
    return total


@pytest.mark.parametrize("policy", ["always", "everysec", "no"])
def test_writes_to_more_partitions_than_descriptors_stay_within_the_bound(tmp_path, policy):
    server = _start(tmp_path, NOFILE, ["--max-open-files", str(MAX_OPEN_FILES), "--maxclients", str(MAXCLIENTS),
                                       "--fsync", policy])
    try:
        pid = server.proc.pid
        assert "RLIMIT_NOFILE" not in server.log()  # the configuration fits: no warning
        with RawConn(server.port, timeout_s=30) as conn:
            created = conn.request(_cmd(b"TOPIC", b"CREATE", b"wide", b"PARTITIONS", b"%d" % PARTITIONS,
                                        b"CONFIG", b"partition-key-field", b"u"))
            assert created == b"+OK\r\n"
            sampler = _FdSampler(pid)
            try:
                payload = b"".join(_cmd(b"XADD", b"wide", b"*", b"u", b"user-%d" % i, b"f", b"v")
                                   for i in range(WRITES))
                replies = conn.request(payload, replies=WRITES).split(b"\r\n")
            finally:
                most = sampler.stop()
        errors = [line for line in replies if line.startswith(b"-")]
        assert errors == [], f"{len(errors)} writes failed, the first: {errors[0]!r}"
        assert most <= BOUND, f"{most} descriptors open during the load (bound {BOUND})"
        if policy == "everysec":
            # Idle once the background flush took every entry (each of its
            # flushes checkpoints the recovery points it reached). Under
            # always every entry was synced before its reply.
            assert wait_for(lambda: _checkpointed_entries(server.data_dir) == WRITES, timeout_s=20), \
                f"only {_checkpointed_entries(server.data_dir)} of {WRITES} entries flushed:\n{server.log()[-2000:]}"
        idle = _open_fds(pid)
        assert idle <= BOUND, f"{idle} descriptors open while idle (bound {BOUND})"
        for _ in range(MAXCLIENTS // 2):  # new clients are served
            with RawConn(server.port, timeout_s=10) as client:
                assert client.request(_cmd(b"PING")) == b"+PONG\r\n"
        log = server.log()
        assert "pausing accepts" not in log and "Too many open files" not in log, log[-2000:]
        assert server.terminate() == 0
        log = server.log()
        assert "Traceback" not in log and "Too many open files" not in log, log[-3000:]
        assert _checkpointed_entries(server.data_dir) == WRITES  # the clean shutdown flushed everything
    finally:
        server.stop()


def test_a_limit_too_low_for_the_configuration_is_logged_once_at_start(tmp_path):
    """``max-open-files`` + ``maxclients`` + the reserve above RLIMIT_NOFILE:
    one warning at start-up that names the numbers and what to change."""
    server = _start(tmp_path, NOFILE, ["--max-open-files", "1000", "--maxclients", "100"])
    try:
        warnings = [line for line in server.log().splitlines() if "RLIMIT_NOFILE" in line]
        assert len(warnings) == 1, server.log()
        needed = 1000 + 100 + RESERVED_FDS
        assert f"RLIMIT_NOFILE) is {NOFILE}" in warnings[0] and str(needed) in warnings[0], warnings[0]
        assert "max-open-files" in warnings[0] and "maxclients" in warnings[0]
        assert server.terminate() == 0
    finally:
        server.stop()
