"""Shared fixtures: a real ``partita`` process, a real ``redis-server``, raw sockets.

- ``partita_server``: a fresh ``partita`` on a free port in a tmp data dir
  (function scope). ``partita_shared``: one per test module, for tests that do
  not need a clean server. Both yield a ``PartitaProcess``: ``.host``,
  ``.port``, ``.data_dir``, ``.client(**kw)`` (redis-py), ``.restart()``,
  ``.kill9()``, ``.terminate()`` (SIGTERM, returns the exit code), ``.log()``.
- ``redis_server``: ``/usr/bin/redis-server --save '' --appendonly no`` on a
  free port; skipped with a visible reason when the binary is missing.
- ``raw_exchange(port, payload)``: send bytes, read until the server closes
  or goes quiet; ``same_reply(partita, redis, payload)`` compares both.
- ``kafka_partita``: ``kafka_partita(extra_args)`` starts a partita with its
  Kafka port on (``.kafka_port``, ``.bootstrap``); ``kafka_shared``: one per
  module. ``KafkaRaw``: a socket that sends Kafka requests and reads their
  responses with the codec (``server.kafka.framing``).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 20.0
REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


def partita_command() -> list[str]:
    """The installed console script, else ``python -m server`` from the checkout."""
    script = Path(sys.executable).parent / "partita"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "server"]


class PartitaProcess:
    """A ``partita`` process under test. Port 0: the server picks a free port.
    ``launcher``: the command in place of ``partita`` (e.g. the failing
    disk of tests/failing_fsync.py)."""

    def __init__(self, data_dir: Path, extra_args: list[str] | None = None, config_file: Path | None = None,
                 launcher: list[str] | None = None) -> None:
        self.data_dir = data_dir
        self.extra_args = list(extra_args or [])
        self.config_file = config_file
        self.launcher = list(launcher) if launcher else None
        self.host = "127.0.0.1"
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self.log_path = data_dir.parent / f"{data_dir.name}.log"
        self._log_offset = 0

    def start(self) -> "PartitaProcess":
        args = list(self.launcher) if self.launcher else partita_command()
        if self.config_file is not None:
            args.append(str(self.config_file))
        # Re-use the port on restart so clients can reconnect to the same place.
        args += ["--port", str(self.port), "--dir", str(self.data_dir), "--bind", self.host]
        args += self.extra_args
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                                     stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            text = self.log()
            m = re.search(r"port=(\d+)", text)
            if m and "Ready to accept connections" in text:
                self.port = int(m.group(1))
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"partita exited with {self.proc.returncode}:\n{text}")
            time.sleep(0.02)
        self.proc.kill()
        raise RuntimeError(f"partita did not start in {START_TIMEOUT_S}s:\n{self.log()}")

    def log(self) -> str:
        """What this run (since the last start) wrote to stdout/stderr."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_offset)
                return f.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return ""

    def client(self, **kwargs):
        import redis

        kwargs.setdefault("socket_timeout", 10)
        return redis.Redis(host=self.host, port=self.port, **kwargs)

    def terminate(self, sig: int = signal.SIGTERM, timeout_s: float = 15.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout=timeout_s)

    def kill9(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)

    def restart(self, kill9: bool = False) -> "PartitaProcess":
        if kill9:
            self.kill9()
        else:
            self.terminate()
        return self.start()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.terminate(timeout_s=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def partita_server(tmp_path):
    """A fresh partita for this test; ``partita_server.extra_args`` can't change once started."""
    server = PartitaProcess(tmp_path / "data").start()
    yield server
    server.stop()


@pytest.fixture
def partita_factory(tmp_path):
    """Start partitas with custom arguments: ``partita_factory(["--requirepass", "x"])``."""
    started: list[PartitaProcess] = []

    def make(extra_args: list[str] | None = None, config_file: Path | None = None, name: str = "data"):
        server = PartitaProcess(tmp_path / f"{name}{len(started)}", extra_args, config_file).start()
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()


@pytest.fixture(scope="module")
def partita_shared(tmp_path_factory):
    """One partita for a whole test module (tests must not depend on a clean server)."""
    server = PartitaProcess(tmp_path_factory.mktemp("partita") / "data").start()
    yield server
    server.stop()


def with_kafka(server: PartitaProcess, port: int) -> PartitaProcess:
    server.kafka_port = port
    server.bootstrap = f"127.0.0.1:{port}"
    return server


@pytest.fixture
def kafka_partita(partita_factory):
    """Start partitas with a Kafka port: ``kafka_partita(["--fsync", "always"])``."""

    def make(extra_args: list[str] | None = None):
        port = free_port()
        return with_kafka(partita_factory(["--kafka-port", str(port), *(extra_args or [])]), port)

    return make


@pytest.fixture(scope="module")
def kafka_shared(tmp_path_factory):
    """One partita with a Kafka port for a whole test module."""
    port = free_port()
    server = PartitaProcess(tmp_path_factory.mktemp("partita") / "data", ["--kafka-port", str(port)]).start()
    yield with_kafka(server, port)
    server.stop()


class KafkaRaw:
    """A Kafka client socket for raw requests: ``call(body, version)`` sends
    one request and returns the decoded response; ``send`` / ``read_frame``
    for anything else."""

    def __init__(self, port: int, timeout_s: float = 10.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
        self.correlation = 0

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_frame(self) -> bytes | None:
        """The next response frame (without its size), None once the server closed."""
        head = self._read(4)
        if head is None:
            return None
        return self._read(int.from_bytes(head, "big", signed=True))

    def _read(self, n: int) -> bytes | None:
        buf = b""
        while len(buf) < n:
            try:
                data = self.sock.recv(n - len(buf))
            except ConnectionResetError:
                return None
            if not data:
                return None
            buf += data
        return buf

    def call(self, body, version: int):
        from server.kafka import framing

        self.correlation += 1
        self.send(framing.encode_request(body.API_KEY, version, self.correlation, "test", body))
        frame = self.read_frame()
        assert frame is not None, "the server closed the connection"
        correlation, response = framing.decode_response(body.API_KEY, version, frame)
        assert correlation == self.correlation
        return response

    def close(self) -> None:
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run([shutil.which("openssl"), *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    """TLS test certificates made with the ``openssl`` command line, in a directory: ``ca.crt``
    (and key), ``server.crt`` / ``server.key`` for 127.0.0.1, ``client.crt`` / ``client.key``;
    skips the test without ``openssl``."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command line makes the test certificates")
    d = tmp_path_factory.mktemp("certs")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=Partita Test CA",
             "-keyout", "ca.key", "-out", "ca.crt", cwd=d)
    (d / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name, ext in (("server", ["-extfile", "server.ext"]), ("client", [])):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", f"{name}.key",
                 "-out", f"{name}.csr", cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-days", "2", "-out", f"{name}.crt", *ext, cwd=d)
    return d


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the peer sends until it closes (a reset counts as closing)."""
    data = b""
    try:
        while chunk := sock.recv(4096):
            data += chunk
    except ConnectionResetError:
        pass
    return data


class RedisProcess:
    def __init__(self, port: int, proc: subprocess.Popen) -> None:
        self.host = "127.0.0.1"
        self.port = port
        self.proc = proc
        self.aclfile: Path | None = None

    def client(self, **kwargs):
        import redis

        kwargs.setdefault("socket_timeout", 10)
        return redis.Redis(host=self.host, port=self.port, **kwargs)


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    """A real redis-server (the reference for differential tests)."""
    yield from _redis_process(tmp_path_factory, [])


@pytest.fixture(scope="module")
def redis_server_with_password(tmp_path_factory):
    """A real redis-server with ``requirepass pw`` (for NOAUTH differential tests)."""
    yield from _redis_process(tmp_path_factory, ["--requirepass", "pw"])


@pytest.fixture(scope="module")
def redis_server_with_aclfile(tmp_path_factory):
    """A real redis-server reading its users from ``server.aclfile`` (for ACL LOAD
    differential tests); the file holds only the default user at first."""
    aclfile = tmp_path_factory.mktemp("redis-acl") / "users.acl"
    aclfile.write_text("user default on nopass ~* &* +@all\n")
    for server in _redis_process(tmp_path_factory, ["--aclfile", str(aclfile)]):
        server.aclfile = aclfile
        yield server


def _redis_process(tmp_path_factory, extra_args: list[str]):
    if not os.path.exists(REDIS_SERVER):
        pytest.skip(f"redis-server not found at {REDIS_SERVER}: differential checks need it (apt-get install redis-server)")
    workdir = tmp_path_factory.mktemp("redis")
    for _attempt in range(5):
        port = free_port()
        proc = subprocess.Popen(
            [REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(workdir), "--daemonize", "no", "--logfile", str(workdir / "redis.log")] + extra_args,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(64).startswith((b"+PONG", b"-NOAUTH")):
                        break
            except OSError:
                time.sleep(0.05)
        if proc.poll() is None:
            server = RedisProcess(port, proc)
            yield server
            proc.terminate()
            proc.wait(timeout=10)
            return
    pytest.fail("could not start redis-server")


def raw_exchange(port: int, payload: bytes, *, quiet_s: float = 0.3, timeout_s: float = 5.0,
                 host: str = "127.0.0.1") -> tuple[bytes, bool]:
    """Send ``payload``; return (everything read, whether the server closed).

    Reading stops when the server closes the connection, or after ``quiet_s``
    without new bytes once something arrived, or at ``timeout_s``.
    """
    chunks: list[bytes] = []
    closed = False
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        sock.sendall(payload)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            sock.settimeout(quiet_s if chunks else max(0.01, deadline - time.monotonic()))
            try:
                data = sock.recv(65536)
            except socket.timeout:
                break
            except ConnectionResetError:
                closed = True
                break
            if not data:
                closed = True
                break
            chunks.append(data)
    return b"".join(chunks), closed


def same_reply(partita, redis, payload: bytes, **kwargs) -> tuple[bytes, bytes]:
    """Send ``payload`` to both servers; assert identical bytes (and closing)."""
    ours, ours_closed = raw_exchange(partita.port, payload, **kwargs)
    theirs, theirs_closed = raw_exchange(redis.port, payload, **kwargs)
    assert ours == theirs, f"payload {payload!r}:\n partita {ours!r}\n redis   {theirs!r}"
    assert ours_closed == theirs_closed, f"payload {payload!r}: partita closed={ours_closed}, redis closed={theirs_closed}"
    return ours, theirs


def resp_command(*args: bytes) -> bytes:
    """A command in RESP (an array of bulk strings), for ``RawConn.request``."""
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


def wait_for(predicate, timeout_s: float = 10.0, interval_s: float = 0.02) -> bool:
    """Poll ``predicate`` (every ``interval_s``) until it holds or
    ``timeout_s`` passed; its last value. The one polling loop of the tests
    (``tests.clusterkit.eventually`` is built on it)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()


class RawConn:
    """A raw client socket that reads whole replies (hiredis frames them)."""

    def __init__(self, port: int, host: str = "127.0.0.1", timeout_s: float = 5.0) -> None:
        import hiredis

        self.sock = socket.create_connection((host, port), timeout=timeout_s)
        self._reader_cls = hiredis.Reader

    def request(self, payload: bytes, replies: int = 1) -> bytes:
        """Send ``payload``; return the raw bytes of the next ``replies`` replies."""
        self.sock.sendall(payload)
        reader = self._reader_cls()
        raw = bytearray()
        got = 0
        while got < replies:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError(f"closed after {raw!r}")
            raw += data
            reader.feed(data)
            while got < replies and reader.gets() is not False:
                got += 1
        return bytes(raw)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
