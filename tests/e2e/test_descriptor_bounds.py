"""Open descriptors stay bounded by configuration, whatever the number of
partitions written (docs/guarantees.md "Open file descriptors").

A real ``partita`` runs under a low ``RLIMIT_NOFILE`` (``prlimit``) with
``max-open-files`` and ``maxclients`` that fit under it, and is written to
on more partitions than it may keep files open for: every write succeeds,
the descriptor count (``/proc/<pid>/fd``) stays within ``max-open-files`` +
``maxclients`` + the reserve during the load and after it, new clients are
served, and SIGTERM ends it cleanly. Under each fsync policy: ``always``
(group commit on the C thread), ``everysec`` (the background flusher) and
``no`` (only the clean shutdown flushes). The same with a consumer group on
every partition (each with a group journal to write and sync), whose
pending entries survive the restart.
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
            payload = b"".join(_cmd(b"XADD", b"wide", b"*", b"u", b"user-%d" % i, b"f", b"v")
                               for i in range(WRITES))
            _request_within_bound(conn, pid, payload, WRITES)
        _check_idle_and_stop(server, policy, WRITES)
    finally:
        server.stop()


@pytest.mark.parametrize("policy", ["always", "everysec"])
def test_consumer_groups_on_more_partitions_than_descriptors_stay_within_the_bound(tmp_path, policy):
    """Every partition has a consumer group, so a group journal to append to
    and to sync besides its log: the journals share the bounded file cache
    (docs/guarantees.md), and the groups' pending entries survive a restart."""
    server = _start(tmp_path, NOFILE, ["--max-open-files", str(MAX_OPEN_FILES), "--maxclients", str(MAXCLIENTS),
                                       "--fsync", policy])
    try:
        pid = server.proc.pid
        keys = [b"wide#%d" % n for n in range(PARTITIONS)]
        with RawConn(server.port, timeout_s=60) as conn:
            assert conn.request(_cmd(b"TOPIC", b"CREATE", b"wide", b"PARTITIONS", b"%d" % PARTITIONS)) == b"+OK\r\n"
            # Each step over every partition in turn, so every journal is
            # written again after the others pushed it out of the cache.
            steps = [[_cmd(b"XGROUP", b"CREATE", k, b"g", b"$") for k in keys]]
            steps += [[_cmd(b"XADD", k, b"1-%d" % seq, b"f", b"v") for k in keys] for seq in (1, 2, 3)]
            steps += [
                [_cmd(b"XREADGROUP", b"GROUP", b"g", b"c", b"COUNT", b"2", b"STREAMS", k, b">") for k in keys],
                [_cmd(b"XACK", k, b"g", b"1-1") for k in keys],
                [_cmd(b"XREADGROUP", b"GROUP", b"g", b"c", b"STREAMS", k, b">") for k in keys],
                [_cmd(b"XACK", k, b"g", b"1-3") for k in keys],
            ]
            commands = [c for step in steps for c in step]
            _request_within_bound(conn, pid, b"".join(commands), len(commands))
        _check_idle_and_stop(server, policy, 3 * PARTITIONS)
        server.start()  # the same descriptor limit
        pending = b"*4\r\n:1\r\n$3\r\n1-2\r\n$3\r\n1-2\r\n*1\r\n*2\r\n$1\r\nc\r\n$1\r\n1\r\n"
        with RawConn(server.port, timeout_s=60) as conn:
            replies = conn.request(b"".join(_cmd(b"XPENDING", k, b"g") for k in keys), replies=PARTITIONS)
        assert replies == pending * PARTITIONS, replies[:400]
        assert server.terminate() == 0
    finally:
        server.stop()


def _request_within_bound(conn: RawConn, pid: int, payload: bytes, replies: int) -> None:
    """Send ``payload`` (``replies`` commands): no error reply, and never
    more than ``BOUND`` descriptors open meanwhile."""
    sampler = _FdSampler(pid)
    try:
        lines = conn.request(payload, replies=replies).split(b"\r\n")
    finally:
        most = sampler.stop()
    errors = [line for line in lines if line.startswith(b"-")]
    assert errors == [], f"{len(errors)} commands failed, the first: {errors[0]!r}"
    assert most <= BOUND, f"{most} descriptors open during the load (bound {BOUND})"


def _check_idle_and_stop(server: PartitaProcess, policy: str, entries: int) -> None:
    """After the load: within the bound while idle, new clients served,
    SIGTERM exits 0 with all ``entries`` flushed."""
    if policy == "everysec":
        # Idle once the background flush took every entry (each of its
        # flushes checkpoints the recovery points it reached). Under
        # always every entry was synced before its reply.
        assert wait_for(lambda: _checkpointed_entries(server.data_dir) == entries, timeout_s=20), \
            f"only {_checkpointed_entries(server.data_dir)} of {entries} entries flushed:\n{server.log()[-2000:]}"
    idle = _open_fds(server.proc.pid)
    assert idle <= BOUND, f"{idle} descriptors open while idle (bound {BOUND})"
    for _ in range(MAXCLIENTS // 2):  # new clients are served
        with RawConn(server.port, timeout_s=10) as client:
            assert client.request(_cmd(b"PING")) == b"+PONG\r\n"
    log = server.log()
    assert "pausing accepts" not in log and "Too many open files" not in log, log[-2000:]
    assert server.terminate() == 0
    log = server.log()
    assert "Traceback" not in log and "Too many open files" not in log, log[-3000:]
    assert _checkpointed_entries(server.data_dir) == entries  # the clean shutdown flushed everything


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
