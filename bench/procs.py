"""Start, measure and stop the servers a benchmark compares.

Owns: one ``ServerProcess`` per server under test (Partita or redis-server)
on a free port with a fresh data directory; its CPU time and RSS read from
/proc, so a client-bound run still shows what the server spent; stopping
exactly the processes it started, and only those.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def partita_command() -> list[str]:
    exe = Path(sys.executable).with_name("partita")
    if exe.exists():
        return [str(exe)]
    return [sys.executable, "-m", "server"]


@dataclass
class ServerProcess:
    """A server started by a benchmark. ``kind`` is ``partita`` or ``redis``."""

    kind: str
    extra_args: list[str] = field(default_factory=list)
    port: int = 0
    data_dir: Path | None = None
    proc: subprocess.Popen | None = None
    keep_dir: bool = False

    def start(self, timeout_s: float = 30.0) -> "ServerProcess":
        if not self.port:
            self.port = free_port()
        if self.data_dir is None:
            self.data_dir = Path(tempfile.mkdtemp(prefix=f"bench-{self.kind}-"))
        if self.kind == "redis":
            cmd = [
                shutil.which("redis-server") or "/usr/bin/redis-server",
                "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", str(self.data_dir), "--save", "",
                "--daemonize", "no", "--logfile", str(self.data_dir / "redis.log"),
                *self.extra_args,
            ]
            log = subprocess.DEVNULL
        else:
            cmd = [
                *partita_command(), "--port", str(self.port), "--dir", str(self.data_dir / "data"),
                "--logfile", str(self.data_dir / "partita.log"), *self.extra_args,
            ]
            log = subprocess.DEVNULL
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        self.wait_ready(timeout_s)
        return self

    def wait_ready(self, timeout_s: float) -> float:
        """Poll PING until it answers; returns seconds waited."""
        start = time.monotonic()
        deadline = start + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.kind} exited with {self.proc.returncode} at start")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(64).startswith(b"+PONG"):
                        return time.monotonic() - start
            except OSError:
                pass
            time.sleep(0.01)
        raise RuntimeError(f"{self.kind} did not answer PING within {timeout_s}s")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def cpu_seconds(self) -> float:
        """User + system CPU time of the server process so far."""
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        # fields[0] is state (field 3); utime is field 14, stime field 15.
        return (int(fields[11]) + int(fields[12])) / CLK_TCK

    def rss_bytes(self) -> int:
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0

    def disk_bytes(self) -> int:
        assert self.data_dir is not None
        total = 0
        for root, _dirs, files in os.walk(self.data_dir):
            for name in files:
                try:
                    total += os.path.getsize(os.path.join(root, name))
                except OSError:
                    pass
        return total

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self, timeout_s: float = 20.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def restart(self, timeout_s: float = 120.0) -> float:
        """Start again on the same port and data; seconds until PING answers."""
        self.proc = None
        started = time.monotonic()
        self.start(timeout_s)
        return time.monotonic() - started

    def cleanup(self) -> None:
        self.stop()
        if self.data_dir is not None and not self.keep_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> "ServerProcess":
        try:
            return self.start()
        except BaseException:
            self.cleanup()  # a server that never answered is still stopped
            raise

    def __exit__(self, *exc: object) -> None:
        self.cleanup()
