"""``server._mapsend.send``: a reply holding views of mmaps is spliced into
the socket byte for byte as ``sendmsg`` would send it; only mmap pages go by
reference; a socket that takes part of it, or fails, leaves the next call
exact."""

from __future__ import annotations

import mmap
import os
import socket

import pytest

_mapsend = pytest.importorskip("server._mapsend")

MIN_MAPPED = 32 * 1024


def test_the_extension_is_built():
    """A build that silently fell back to sendmsg must fail CI."""
    from server import _mapsend as built

    assert built.send is _mapsend.send


@pytest.fixture
def pair():
    """A TCP loopback pair: (sender, receiver), the sender non-blocking."""
    listener = socket.create_server(("127.0.0.1", 0))
    sender = socket.create_connection(listener.getsockname())
    receiver, _ = listener.accept()
    listener.close()
    sender.setblocking(False)
    yield sender, receiver
    sender.close()
    receiver.close()


@pytest.fixture
def mapping(tmp_path):
    """A read-only mmap of a file of 600 KB of distinct bytes, and the bytes."""
    data = os.urandom(600 * 1024)
    path = tmp_path / "segment"
    path.write_bytes(data)
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    view = memoryview(m)
    yield view, data
    view.release()
    m.close()


def _receive(receiver, n: int) -> bytes:
    got = bytearray()
    receiver.settimeout(10)
    while len(got) < n:
        chunk = receiver.recv(n - len(got))
        assert chunk, "the sender closed early"
        got += chunk
    return bytes(got)


def _reply(view):
    """Pieces as an XREAD reply holds them: headers between mapped slices."""
    return [b"*1\r\n*2\r\n$1\r\ns\r\n*1000\r\n", view[100:30_000], view[30_072:61_000], b"", view[61_000:61_001],
            bytearray(b"between"), view[70_000:150_000], b"\r\n"]


def test_a_reply_is_sent_byte_for_byte(pair, mapping):
    sender, receiver = pair
    view, _ = mapping
    out = _reply(view)
    expected = b"".join(bytes(p) for p in out)
    for _ in range(3):  # the pipe is empty again after each call
        assert _mapsend.send(sender.fileno(), out) == len(expected)
        assert _receive(receiver, len(expected)) == expected


def test_other_memory_is_copied_not_referenced(pair, mapping):
    """Only mmap pages may go by reference: a buffer changed (or freed and
    reused) once the call returned must not change what the peer reads."""
    sender, receiver = pair
    view, _ = mapping
    heap = bytearray(b"h" * 100_000)
    out = [b"head", view[:MIN_MAPPED], memoryview(heap), b"tail"]
    expected = b"".join(bytes(p) for p in out)
    assert _mapsend.send(sender.fileno(), out) == len(expected)
    heap[:] = b"X" * len(heap)  # before the peer reads
    assert _receive(receiver, len(expected)) == expected


@pytest.mark.parametrize("out", [
    lambda view: [b"head", view[:MIN_MAPPED - 1], b"tail"],  # too few mapped bytes: sendmsg's
    lambda view: [b"small", b"replies", memoryview(b"only")],
    lambda view: [view[i * 1000:(i + 1) * 1000] for i in range(65)],  # more pieces than it splices
    lambda view: [view[:], view[:]],  # more than the pipe holds
])
def test_what_it_does_not_splice_it_sends_as_sendmsg(pair, mapping, out):
    """Not spliced, the pieces are one gathering sendmsg in the same call:
    what the socket took counted as sendmsg counts it, the rest the caller's."""
    sender, receiver = pair
    view, _ = mapping
    pieces = out(view)
    sent, got = _send_all(sender, receiver, pieces)
    assert sent > 0 and got == b"".join(bytes(p) for p in pieces)


def test_a_full_socket_raises_would_block_as_sendmsg(pair):
    sender, receiver = pair
    with pytest.raises(BlockingIOError):
        while True:
            sender.send(b"x" * 65536)
    with pytest.raises(BlockingIOError):
        sender.sendmsg([b"y"])
    with pytest.raises(BlockingIOError):
        _mapsend.send(sender.fileno(), [b"y"])


def _send_all(sender, receiver, out) -> tuple[int, bytes]:
    """``send`` of ``out``, then its rest as the connection sends it (plain
    sends) while the peer reads: (what ``send`` took, what the peer got)."""
    expected = b"".join(bytes(p) for p in out)
    sent = _mapsend.send(sender.fileno(), out)
    rest = expected[sent:]
    got = bytearray()
    receiver.settimeout(10)
    while rest:
        try:
            rest = rest[sender.send(rest):]
        except BlockingIOError:
            got += receiver.recv(1 << 20)
    got += _receive(receiver, len(expected) - len(got))
    return sent, bytes(got)


def test_a_socket_that_takes_part_gets_the_rest_in_order(pair, mapping):
    """Sent counts what the socket took (as sendmsg's); the pipe is left
    empty, so the caller's rest and the next reply arrive exact."""
    sender, receiver = pair
    view, data = mapping
    sender.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)
    receiver.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    out = [b"head", view[:250_000], b"tail"]
    sent, got = _send_all(sender, receiver, out)
    assert 0 < sent < 250_008
    assert got == b"head" + data[:250_000] + b"tail"
    sent, got = _send_all(sender, receiver, [b"next", view[300_000:340_000]])
    assert sent > 0 and got == b"next" + data[300_000:340_000]


def test_a_failed_socket_raises_and_leaves_the_pipe_empty(pair, mapping, tmp_path):
    sender, receiver = pair
    view, data = mapping
    receiver.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    receiver.close()  # a reset
    with pytest.raises(OSError):
        for _ in range(100):  # (the reset may take a send to be seen)
            _mapsend.send(sender.fileno(), [b"x", view[:MIN_MAPPED]])
    listener = socket.create_server(("127.0.0.1", 0))
    other = socket.create_connection(listener.getsockname())
    peer, _ = listener.accept()
    listener.close()
    try:
        assert _mapsend.send(other.fileno(), [b"y", view[:MIN_MAPPED]]) == 1 + MIN_MAPPED
        assert _receive(peer, 1 + MIN_MAPPED) == b"y" + data[:MIN_MAPPED]
    finally:
        other.close()
        peer.close()


def test_bad_arguments_raise():
    with pytest.raises(TypeError):
        _mapsend.send(1, (b"x",))
    with pytest.raises(TypeError):
        _mapsend.send(1)
    with pytest.raises(ValueError):
        _mapsend.send(-1, [b"x"])
