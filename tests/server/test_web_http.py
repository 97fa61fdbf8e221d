"""Who may read the HTTP port (server/web/http.py ``authorize``), against real
ACL users: no password, ``requirepass``, users with and without @read; and
how long a client may take (``serve`` on a real socket, trio's mock clock)."""

from __future__ import annotations

import base64
import socket

import trio

from server.acl import AclRegistry
from server.web.http import IDLE_TIMEOUT_S, authorize, serve


def _basic(name: str, password: str) -> bytes:
    return b"Basic " + base64.b64encode(f"{name}:{password}".encode())


def test_no_password_reads_as_default():
    user, refused = authorize(AclRegistry(), None)
    assert refused is None and user.name == "default"


def test_requirepass_needs_the_password():
    acl = AclRegistry(requirepass="pw")
    assert authorize(acl, None)[1].status == 401
    assert authorize(acl, _basic("default", "nope"))[1].status == 401
    assert authorize(acl, _basic("default", "pw"))[0].name == "default"
    assert authorize(acl, _basic("", "pw"))[0].name == "default"  # AUTH <password>
    for bad in (b"Basic !!!", b"Basic " + base64.b64encode(b"no-colon"), b"Digest x", b"Basic"):
        user, refused = authorize(acl, bad)
        assert user is None and refused.status == 401, bad
        assert dict(refused.headers)[b"WWW-Authenticate"].startswith(b"Basic realm=")


def test_users_need_every_read_command():
    acl = AclRegistry(requirepass="pw")
    acl.setuser("prom", ["on", ">p", "~orders*", "-@all", "+@read"])
    acl.setuser("writer", ["on", ">w", "~*", "-@all", "+xadd"])
    acl.setuser("almost", ["on", ">a", "~*", "+@read", "-xinfo|groups"])
    acl.setuser("off", ["off", ">o", "~*", "+@all"])
    user, refused = authorize(acl, _basic("prom", "p"))
    assert refused is None and user.may_access_key(b"orders") and not user.may_access_key(b"secrets")
    assert authorize(acl, _basic("writer", "w"))[1].status == 403
    assert authorize(acl, _basic("almost", "a"))[1].status == 403
    assert authorize(acl, _basic("off", "o"))[1].status == 401


# -- slow and idle clients (on trio's mock clock: 30 s pass at once) -----------


async def _serving(nursery) -> int:
    """A port serving HTTP (``serve``) until the nursery is cancelled; no
    request in these tests gets as far as the routes, so no server state."""
    sock = socket.create_server(("127.0.0.1", 0))
    nursery.start_soon(serve, None, sock)
    return sock.getsockname()[1]


async def _until_closed(stream: trio.SocketStream) -> bytes:
    reply = b""
    while chunk := await stream.receive_some(65536):
        reply += chunk
    return reply


async def test_a_client_that_sends_nothing_is_closed_after_the_idle_timeout(autojump_clock):
    async with trio.open_nursery() as nursery:
        stream = await trio.open_tcp_stream("127.0.0.1", await _serving(nursery))
        started = trio.current_time()
        assert await _until_closed(stream) == b""  # nothing was asked: closed without a word
        assert trio.current_time() - started >= IDLE_TIMEOUT_S
        nursery.cancel_scope.cancel()


async def test_a_request_sent_too_slowly_gets_408(autojump_clock):
    async with trio.open_nursery() as nursery:
        stream = await trio.open_tcp_stream("127.0.0.1", await _serving(nursery))
        started = trio.current_time()
        for byte in b"GET /metrics HTTP/1.1\r\n":  # one byte a second
            await stream.send_all(bytes([byte]))
            await trio.sleep(1)
        reply = await _until_closed(stream)
        assert reply.startswith(b"HTTP/1.1 408 ") and b"Connection: close" in reply
        assert trio.current_time() - started >= IDLE_TIMEOUT_S
        nursery.cancel_scope.cancel()
