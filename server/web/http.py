"""The HTTP listener: ``http-port`` on the ``bind`` addresses, read-only.

Owns: binding the HTTP sockets (before the data directory, as every port),
the accept loop (at most ``CONNECTIONS_MAX`` connections; more are closed at
once), one task per connection speaking HTTP/1.1 through h11 (the sans-IO
parser: this module only moves bytes between the socket and
``h11.Connection``), keep-alive with an idle timeout, the routes and their
methods (GET and HEAD only: nothing here changes the server), and who may
read (HTTP Basic auth against the server's ACL users).

Who may read: with no password on the ``default`` user (no ``requirepass``)
a request without credentials reads as ``default``; otherwise it must carry
``Authorization: Basic`` with a user's name and password (an empty name is
``default``, as ``AUTH <password>``), else 401. The user must be allowed
every command of the ``@read`` ACL category (``READ_CATEGORY``), else 403;
and it sees only the topics its key patterns match (docs/metrics.md).

Must not know: RESP, Prometheus names, what the console draws (``metrics``
and ``console`` beside this module render them).
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import logging
import socket
from typing import Any, Callable

import h11
import trio

from server.acl import category_members
from server.errors import CommandError
from server.listener import bind_sockets
from server.web import console, metrics

log = logging.getLogger("partita.http")

CONNECTIONS_MAX = 64  # HTTP connections at once; one more is closed at once
IDLE_TIMEOUT_S = 30.0  # a connection that takes longer for a whole request (or waits idle) is closed
REQUEST_BYTES_MAX = 16 * 1024  # request line and headers; a GET carries no more
BODY_BYTES_MAX = 16 * 1024  # a request body (read and dropped)
RECV_BYTES = 16 * 1024
READ_CATEGORY = "read"  # an ACL user allowed every command of @read may read metrics and the console
SERVER_HEADER = b"partita"

# Every response: no framing by other sites, no content sniffing, scripts and
# styles from the page's own origin only (the console has no inline script).
_COMMON_HEADERS = [
    (b"Server", SERVER_HEADER),
    (b"X-Content-Type-Options", b"nosniff"),
    (b"X-Frame-Options", b"DENY"),
    (b"Content-Security-Policy", b"default-src 'self'; img-src 'self' data:; frame-ancestors 'none'"),
]


class Response:
    """A whole response: status, content type, body, extra headers."""

    __slots__ = ("status", "content_type", "body", "headers")

    def __init__(self, status: int, content_type: bytes, body: bytes,
                 headers: list[tuple[bytes, bytes]] | None = None) -> None:
        self.status = status
        self.content_type = content_type
        self.body = body
        self.headers = headers or []


def _text(status: int, message: str, headers: list[tuple[bytes, bytes]] | None = None) -> Response:
    return Response(status, b"text/plain; charset=utf-8", (message + "\n").encode(), headers)


UNAUTHORIZED = functools.partial(
    _text, 401, "Authentication required: HTTP Basic auth with a Partita user's name and password.",
    [(b"WWW-Authenticate", b'Basic realm="partita", charset="UTF-8"')])


def bind(config: Any) -> list[socket.socket]:
    """Listening sockets for ``http-port`` on ``bind``; none when it is 0.
    ``server.listener.BindError`` when the port is taken."""
    if not config.http_port:
        return []
    return bind_sockets(config.bind, config.http_port, "http-port")


# -- who may read --------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _read_commands() -> frozenset[str]:
    return category_members(READ_CATEGORY)


def authorize(acl: Any, authorization: bytes | None) -> tuple[Any, Response | None]:
    """``(user, None)`` for a request that may read, else ``(None, 401 or
    403)``. ``authorization``: the request's ``Authorization`` header."""
    if authorization is None:
        if not acl.default_authenticated():
            return None, UNAUTHORIZED()
        user = acl.default
    else:
        scheme, _, encoded = authorization.partition(b" ")
        if scheme.lower() != b"basic":
            return None, UNAUTHORIZED()
        try:
            name, sep, password = base64.b64decode(encoded.strip(), validate=True).partition(b":")
        except (binascii.Error, ValueError):
            return None, UNAUTHORIZED()
        if not sep:
            return None, UNAUTHORIZED()
        try:
            user = acl.authenticate(name or b"default", password)
        except CommandError:
            return None, UNAUTHORIZED()
    if not _read_commands() <= user.allowed:
        return None, _text(403, f"User '{user.name}' may not read metrics: its ACL rules must allow "
                                f"every command of @{READ_CATEGORY}.")
    return user, None


def _topic_filter(user: Any) -> Callable[[bytes], bool] | None:
    return None if user.allkeys else user.may_access_key


# -- routes --------------------------------------------------------------------


def respond(state: Any, method: bytes, target: bytes, headers: dict[bytes, bytes]) -> Response:
    """The response to one request (routes, methods, auth)."""
    path = target.split(b"?", 1)[0]
    static = console.ASSETS.get(path)
    if path not in (b"/metrics", b"/api/status") and static is None:
        return _text(404, "Not found. Try / (the console) or /metrics (Prometheus).")
    if method not in (b"GET", b"HEAD"):
        return _text(405, "Read-only: GET and HEAD only.", [(b"Allow", b"GET, HEAD")])
    user, refused = authorize(state.acl, headers.get(b"authorization"))
    if refused is not None:
        return refused
    if path == b"/metrics":
        body, content_type = metrics.exposition(state, headers.get(b"accept", b""), _topic_filter(user))
        return Response(200, content_type.encode(), body, [(b"Cache-Control", b"no-store")])
    if path == b"/api/status":
        body = json.dumps(console.status(state, _topic_filter(user)), separators=(",", ":")).encode()
        return Response(200, b"application/json", body, [(b"Cache-Control", b"no-store")])
    content_type, body = static
    return Response(200, content_type, body, [(b"Cache-Control", b"no-cache")])


# -- connections ---------------------------------------------------------------


async def serve(state: Any, sock: socket.socket) -> None:
    """Accept HTTP clients on ``sock`` until cancelled, each in a task of its
    own (cancelled with this one: shutdown stops HTTP at once)."""
    listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
    active = [0]
    async with trio.open_nursery() as nursery:
        while True:
            try:
                stream = await listener.accept()
            except OSError as e:  # descriptors exhausted: wait, then go on
                log.warning("HTTP accept failed: %s", e.strerror or e)
                await trio.sleep(0.1)
                continue
            if active[0] >= CONNECTIONS_MAX:
                await stream.aclose()
                continue
            active[0] += 1
            nursery.start_soon(_connection, state, stream, active)


async def _connection(state: Any, stream: trio.SocketStream, active: list[int]) -> None:
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=REQUEST_BYTES_MAX)
    try:
        while True:
            with trio.move_on_after(IDLE_TIMEOUT_S):
                request = await _receive_request(conn, stream)
                if request is None:  # closed, or a request we must refuse and close after
                    return
                response = respond(state, request.method, request.target, dict(request.headers))
                await _send(conn, stream, response, head=request.method == b"HEAD")
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return  # h11 says the connection cannot be kept alive
                conn.start_next_cycle()
                continue
            return  # idle or too slow
    except h11.RemoteProtocolError as e:
        await _send_last(conn, stream, _text(e.error_status_hint, f"Bad request: {e}"))
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    except Exception:  # a bug answering one request must not stop the server
        log.exception("HTTP request failed")
        await _send_last(conn, stream, _text(500, "Internal error (see the server's log)."))
    finally:
        active[0] -= 1
        with trio.CancelScope(shield=True):
            await stream.aclose()


async def _next_event(conn: h11.Connection, stream: trio.SocketStream) -> Any:
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        try:
            data = await stream.receive_some(RECV_BYTES)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            data = b""
        conn.receive_data(data)


async def _receive_request(conn: h11.Connection, stream: trio.SocketStream) -> h11.Request | None:
    """The next whole request (its body read and dropped), or None when the
    client closed the connection or sent a body too large."""
    event = await _next_event(conn, stream)
    if isinstance(event, h11.ConnectionClosed):
        return None
    assert isinstance(event, h11.Request), event
    body_bytes = 0
    while True:
        part = await _next_event(conn, stream)
        if isinstance(part, h11.EndOfMessage):
            return event
        if isinstance(part, h11.ConnectionClosed):
            return None
        body_bytes += len(part.data)
        if body_bytes > BODY_BYTES_MAX:
            await _send(conn, stream, _text(413, "Request body too large."), head=False)
            return None


async def _send_last(conn: h11.Connection, stream: trio.SocketStream, response: Response) -> None:
    """An error response before closing, if no response was begun and the
    client still listens."""
    if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
        try:
            await _send(conn, stream, response, head=False)
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.LocalProtocolError):
            pass


async def _send(conn: h11.Connection, stream: trio.SocketStream, response: Response, *, head: bool) -> None:
    headers = _COMMON_HEADERS + [(b"Content-Type", response.content_type),
                                 (b"Content-Length", b"%d" % len(response.body))] + response.headers
    out = conn.send(h11.Response(status_code=response.status, headers=headers))
    if not head and response.body:
        out += conn.send(h11.Data(data=response.body))
    out += conn.send(h11.EndOfMessage())
    await stream.send_all(out)
