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
from server.durability import Durability
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


class RecordingSocket(socket.socket):
    """A socket that records every ``send`` (to check one send per batch)."""

    def __init__(self, sends, **kwargs):
        super().__init__(**kwargs)
        self.sends = sends

    def send(self, data, *args):
        n = super().send(data, *args)
        self.sends.append(bytes(data[:n]))
        return n

    def sendmsg(self, buffers, *args):
        n = super().sendmsg(buffers, *args)
        self.sends.append(b"".join(buffers)[:n])
        return n


class Harness:
    """A server state, dispatcher and durability (rounds run inline) with no
    listener: ``connect`` serves one end of a socketpair with a real
    ``Connection``. ``peers``: the client ends as stdlib sockets, for what
    must happen without a scheduler pass between (bytes and EOF in one
    arrival)."""

    def __init__(self, fsync="everysec", commands=None, **config_values):
        """``commands``: a test's own commands (``command(..., table=...)``)
        added to the dispatcher's table."""
        config = Config()
        config.fsync = fsync
        for k, v in config_values.items():
            setattr(config, k, v)
        self.state = ServerState(config)
        self.state.durability = Durability(run_in_thread=run_inline)
        table = client_table()
        table.commands.update(commands or {})
        self.dispatcher = Dispatcher(self.state, table)
        self.sends: list[bytes] = []
        self.peers: list[socket.socket] = []

    def connect(self, nursery):
        ours, theirs = socket.socketpair()
        ours = RecordingSocket(self.sends, fileno=ours.detach())
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
