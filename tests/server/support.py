"""What the server's unit tests share: an in-process server without a
listener (``Harness``, ``TopicsHarness``) whose connections serve one end of
a socketpair, fake logs for the group commit, and reading replies.

No test module imports another; they import this (and tests/server/conftest.py
holds the fixtures).
"""

from __future__ import annotations

import os
import socket
import tempfile

import trio

import server.commands  # noqa: F401  (registers the commands)
from server.config import Config
from server.connection import Connection
from server.registry import client_table
from server.dispatch import Dispatcher
from cluster.broker.durability import Durability
from server.resp import encode_command
from server.state import ServerState


class FakeTicket:
    """storage's FlushTicket contract over one real (temporary) file."""

    def __init__(self, log, events):
        self.log = log
        self.events = events
        self.fd = os.dup(log.file.fileno())
        self.ok = False

    checkpoints = False

    def sync_targets(self):
        return [(self.fd, False)]

    def run(self):
        failure = None
        try:
            os.fdatasync(self.fd)
        except OSError as e:
            failure = e
        self.finish(failure)

    def finish(self, failure):
        os.close(self.fd)
        if failure is not None:
            raise OSError(failure.errno, str(failure))
        self.events.append(("fsync", self.log.name))
        self.ok = True


class FakeLog:
    """The flush half of storage's PartitionLog contract."""

    def __init__(self, name, events):
        self.name = name
        self.events = events
        self.flushes = 0
        self.file = tempfile.TemporaryFile()

    def begin_flush(self):
        self.events.append(("begin", self.name))
        return FakeTicket(self, self.events)

    def end_flush(self, ticket):
        assert ticket.log is self
        self.flushes += 1
        self.events.append(("end", self.name))


async def run_inline(fn, *args):
    """Stand-in for trio.to_thread.run_sync: deterministic under autojump_clock."""
    await trio.lowlevel.checkpoint()
    return fn(*args)


class RoundGate:
    """Group-commit rounds that wait for the test: a ``Durability`` runner
    (its public ``run_in_thread``, which runs the rounds' syncs inline)
    whose syncs start only while the gate is open. Made closed; ``close``
    again for the next rounds. ``with gate:`` opens it on the way out: a
    round waits shielded, so a failing test must not leave it waiting."""

    def __init__(self):
        self._open = trio.Event()

    async def __call__(self, fn, *args):
        while not self._open.is_set():
            await self._open.wait()
        return await run_inline(fn, *args)

    def open(self):
        self._open.set()

    def close(self):
        if self._open.is_set():
            self._open = trio.Event()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.open()


class RecordingSocket(socket.socket):
    """A socket that records every ``send`` (to check one send per batch)
    and every receive (``recvs``: the bytes, None for one that found
    nothing); ``on_send(n)``, if given, runs after the n-th send (a client
    that answers before the server looks again)."""

    def __init__(self, sends, recvs=None, on_send=None, **kwargs):
        super().__init__(**kwargs)
        self.sends = sends
        self.recvs = recvs if recvs is not None else []
        self.on_send = on_send

    def send(self, data, *args):
        n = super().send(data, *args)
        self.sends.append(bytes(data[:n]))
        if self.on_send is not None:
            self.on_send(len(self.sends))
        return n

    def sendmsg(self, buffers, *args):
        n = super().sendmsg(buffers, *args)
        self.sends.append(b"".join(buffers)[:n])
        return n

    def recv(self, n, *args):
        try:
            data = super().recv(n, *args)
        except BlockingIOError:
            if not args:
                self.recvs.append(None)
            raise
        if not args:  # (not a MSG_PEEK)
            self.recvs.append(data)
        return data


class IoWakes(trio.abc.Instrument):
    """Counts the readiness waits of connection tasks that ended: the times
    trio's I/O manager woke a task named ``*Connection.run`` (a task woken
    by another task, or that found its input without waiting, is not
    counted)."""

    def __init__(self) -> None:
        self.count = 0
        self._in_io = False

    def before_io_wait(self, timeout) -> None:
        self._in_io = True

    def after_io_wait(self, timeout) -> None:
        self._in_io = False

    def task_scheduled(self, task) -> None:
        if self._in_io and task.name.endswith("Connection.run"):
            self.count += 1


class Harness:
    """A server state, dispatcher and durability (rounds run inline, or
    held by a ``RoundGate`` given as ``rounds``) with no listener:
    ``connect`` serves one end of a socketpair with a real ``Connection``.
    ``peers``: the client ends as stdlib sockets, for what must happen
    without a scheduler pass between (bytes and EOF in one arrival).
    ``sends`` / ``recvs``: what the server's ends sent and received."""

    def __init__(self, fsync="everysec", commands=None, rounds=None, **config_values):
        """``commands``: a test's own commands (``command(..., table=...)``)
        added to the dispatcher's table; ``rounds``: a ``RoundGate``."""
        config = Config()
        config.fsync = fsync
        for k, v in config_values.items():
            setattr(config, k, v)
        self.state = ServerState(config)
        self.state.durability = Durability(run_in_thread=rounds or run_inline)
        table = client_table()
        table.commands.update(commands or {})
        self.dispatcher = Dispatcher(self.state, table)
        self.sends: list[bytes] = []
        self.recvs: list[bytes | None] = []
        self.peers: list[socket.socket] = []

    def connect(self, nursery, on_send=None):
        ours, theirs = socket.socketpair()
        ours = RecordingSocket(self.sends, self.recvs, on_send, fileno=ours.detach())
        ours.setblocking(False)
        client = self.state.new_client("test:1", "test:0", ours.fileno())
        conn = Connection(self.state, self.dispatcher, ours, client)
        nursery.start_soon(conn.run)
        self.peers.append(theirs)
        return trio.socket.from_stdlib_socket(theirs), conn


async def read_exactly(sock, n):
    data = b""
    while len(data) < n:
        chunk = await sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


class TopicsHarness(Harness):
    """A Harness with a real topic registry in ``path``."""

    def __init__(self, path, **config_values):
        from cluster.topics import TopicRegistry

        super().__init__(**config_values)
        self.state.config.dir = str(path)
        self.state.topics = TopicRegistry.open(path, self.state.config)


def answered(reply):
    """The reply of ``Dispatcher.call``, running a command's coroutine to its
    end when it returned one; it must not wait."""
    from server.dispatch import COROUTINE

    if type(reply) is COROUTINE:
        try:
            reply.send(None)
        except StopIteration as done:
            return done.value
        raise AssertionError("the command waited")
    return reply


def full_disk_append(entries, *args, **kwargs):
    """A log's ``append`` on a full disk: put it in place of a stream's
    ``log.append`` for a commit that fails."""
    import errno

    from storage.errors import StorageError

    raise StorageError("append: No space left on device", errno=errno.ENOSPC)


def xadd_request(key=b"s", value=b"v"):
    return encode_command([b"XADD", key, b"*", b"f", value])


def batch_counts(log):
    """Entries per log batch in ``log``'s active segment."""
    from storage import records

    data = open(log.segments()[-1].path, "rb").read()
    counts, pos = [], 0
    while pos < len(data):
        hdr = records.unpack_header(data, pos)
        counts.append(hdr[records.H_COUNT])
        pos += hdr[records.H_LENGTH]
    return counts


async def read_replies(sock, n):
    """The next ``n`` replies on ``sock``, decoded by hiredis."""
    import hiredis

    reader = hiredis.Reader()
    out = []
    while len(out) < n:
        got = reader.gets()
        if got is False:
            reader.feed(await sock.recv(65536))
            continue
        out.append(got)
    return out


async def one_reply(sock, reader) -> bytes:
    """The raw bytes of the next reply on ``sock`` (``reader``: a hiredis
    Reader kept across calls)."""
    raw = b""
    while True:
        chunk = await sock.recv(1 << 20)
        assert chunk, "connection closed"
        raw += chunk
        reader.feed(chunk)
        if reader.gets() is not False:
            return raw


def unread_bytes(sock) -> int:
    """Bytes received on ``sock`` and not read yet (FIONREAD)."""
    import array
    import fcntl
    import termios

    buf = array.array("i", [0])
    fcntl.ioctl(sock.fileno(), termios.FIONREAD, buf)
    return buf[0]


def scribble(log, old: bytes, new: bytes) -> int:
    """Overwrite every ``old`` in ``log``'s active segment file with ``new``
    (same length), in place, as a log cut back and rewritten would change
    the bytes under a mapping; how many it changed."""
    assert len(old) == len(new)
    path = log.segments()[-1].path
    data = open(path, "rb").read()
    fd = os.open(path, os.O_WRONLY)
    try:
        count, pos = 0, data.find(old)
        while pos >= 0:
            os.pwrite(fd, new, pos)
            count += 1
            pos = data.find(old, pos + 1)
    finally:
        os.close(fd)
    return count
