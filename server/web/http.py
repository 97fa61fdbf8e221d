"""The HTTP listener: ``http-port`` on the ``bind`` addresses, read-only.

Owns: binding the HTTP sockets (before the data directory, as every port),
the accept loop (at most ``CONNECTIONS_MAX`` connections: one more closes the
idlest, or gets 503 when none is idle), one task per connection speaking
HTTP/1.1 through h11 (the sans-IO parser: this module only moves bytes
between the socket and ``h11.Connection``), keep-alive with an idle timeout,
what h11 leaves to its user (refusing at once what cannot become a request:
no HTTP/1.x request line, another HTTP version, a body too large; 100
Continue; closing after an error without resetting the connection), the
routes and their methods (GET and HEAD only: nothing here changes the
server), and who may read (HTTP Basic auth against the server's ACL users).

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
import re
import socket
import urllib.parse
from http import HTTPStatus
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
LINGER_S = 2.0  # after an error response, how long the client's unread request bytes are dropped before closing
LINGER_BYTES_MAX = 64 * 1024
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


_ABSOLUTE_FORM = re.compile(rb"https?://[^/]*", re.I)


def _path(target: bytes) -> bytes:
    """The path a request target names: the query dropped, an absolute-form
    target (``http://host/metrics``, which RFC 9112 says a server must
    accept) reduced to its path, percent-encoding decoded (``/%6Detrics`` is
    ``/metrics``: routes are exact names, so nothing decoded can reach
    another file)."""
    path = target.split(b"?", 1)[0]
    absolute = _ABSOLUTE_FORM.match(path)
    if absolute:
        path = path[absolute.end():] or b"/"
    return urllib.parse.unquote_to_bytes(path)


def respond(state: Any, method: bytes, target: bytes, headers: dict[bytes, bytes]) -> Response:
    """The response to one request (routes, methods, auth)."""
    path = _path(target)
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


def _reason(status: int) -> bytes:
    return HTTPStatus(status).phrase.encode()


def _headers(response: Response, close: bool) -> list[tuple[bytes, bytes]]:
    headers = _COMMON_HEADERS + [(b"Content-Type", response.content_type),
                                 (b"Content-Length", b"%d" % len(response.body))] + response.headers
    return headers + [(b"Connection", b"close")] if close else headers


# -- connections ---------------------------------------------------------------


class _Refused(Exception):
    """A request answered with an error before it was read whole; the
    connection closes after it."""

    def __init__(self, response: Response) -> None:
        super().__init__(response.status)
        self.response = response


class _Client:
    """One open connection: its cancel scope (closing it closes the
    connection) and since when it waits for a request with nothing of it
    received yet (None while a request is read or answered)."""

    __slots__ = ("scope", "waiting_since")

    def __init__(self) -> None:
        self.scope = trio.CancelScope()
        self.waiting_since: float | None = trio.current_time()


def _evict_idlest(clients: dict[_Client, None]) -> bool:
    """Close the connection that has waited longest for a request (an idle
    keep-alive, or a client that connected and sent nothing), so that idle
    connections cannot keep every new client out. False when all are busy."""
    idle = [client for client in clients if client.waiting_since is not None]
    if not idle:
        return False
    idlest = min(idle, key=lambda client: client.waiting_since)
    del clients[idlest]
    idlest.scope.cancel()
    return True


def _raw_response(response: Response) -> bytes:
    """A response written without h11, for a connection refused before its
    request was read."""
    head = [b"HTTP/1.1 %d %s" % (response.status, _reason(response.status))]
    head += [b"%s: %s" % pair for pair in _headers(response, close=True)]
    return b"\r\n".join(head) + b"\r\n\r\n" + response.body


_BUSY = _raw_response(_text(503, f"Busy: all {CONNECTIONS_MAX} HTTP connections are answering requests; "
                                 f"try again.", [(b"Retry-After", b"1")]))


async def serve(state: Any, sock: socket.socket) -> None:
    """Accept HTTP clients on ``sock`` until cancelled, each in a task of its
    own (cancelled with this one: shutdown stops HTTP at once). At most
    ``CONNECTIONS_MAX`` at once: one more closes the idlest (``_evict_idlest``),
    or when none is idle, is answered 503 (at most as many more at once; past
    that, closed at once)."""
    listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
    clients: dict[_Client, None] = {}
    refusing = [0]
    async with trio.open_nursery() as nursery:
        while True:
            try:
                stream = await listener.accept()
            except OSError as e:  # descriptors exhausted: wait, then go on
                log.warning("HTTP accept failed: %s", e.strerror or e)
                await trio.sleep(0.1)
                continue
            if len(clients) >= CONNECTIONS_MAX and not _evict_idlest(clients):
                if refusing[0] >= CONNECTIONS_MAX:
                    await stream.aclose()
                else:
                    refusing[0] += 1
                    nursery.start_soon(_refuse, stream, refusing)
                continue
            client = _Client()
            clients[client] = None
            nursery.start_soon(_connection, state, stream, client, clients)


async def _refuse(stream: trio.SocketStream, refusing: list[int]) -> None:
    try:
        with trio.move_on_after(LINGER_S):
            await stream.send_all(_BUSY)
            await _drain(stream)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        refusing[0] -= 1
        await stream.aclose()


async def _connection(state: Any, stream: trio.SocketStream, client: _Client,
                      clients: dict[_Client, None]) -> None:
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=REQUEST_BYTES_MAX)
    refusal = None
    try:
        with client.scope:
            while True:
                client.waiting_since = trio.current_time()
                with trio.move_on_after(IDLE_TIMEOUT_S):
                    request = await _receive_request(conn, stream, client)
                    if request is None:  # the client closed the connection
                        return
                    response = respond(state, request.method, request.target, dict(request.headers))
                    await _send(conn, stream, response, head=request.method == b"HEAD")
                    if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                        return  # h11 says the connection cannot be kept alive
                    conn.start_next_cycle()
                    continue
                if client.waiting_since is None:  # too slow sending a request (not merely idle)
                    refusal = _text(408, f"Request timeout: a request must arrive whole within "
                                         f"{IDLE_TIMEOUT_S:g} s.")
                return
    except h11.RemoteProtocolError as e:
        if e.error_status_hint == 431:  # h11 says "Receive buffer too long"
            refusal = _text(431, f"Request line and headers too large: at most {REQUEST_BYTES_MAX} bytes.")
        else:
            refusal = _text(e.error_status_hint, f"Bad request: {e}")
    except _Refused as e:
        refusal = e.response
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    except Exception:  # a bug answering one request must not stop the server
        log.exception("HTTP request failed")
        refusal = _text(500, "Internal error (see the server's log).")
    finally:
        try:
            if refusal is not None:
                await _send_last(conn, stream, refusal)
        finally:
            clients.pop(client, None)  # only now: a connection lingering after an error still counts
            with trio.CancelScope(shield=True):
                await stream.aclose()


async def _next_event(conn: h11.Connection, stream: trio.SocketStream, client: _Client) -> Any:
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        receive = RECV_BYTES
        before_request_line = False
        if conn.their_state is h11.IDLE:  # in the request line and headers: at most REQUEST_BYTES_MAX
            buffered = conn.trailing_data[0]
            if buffered:  # part of a pipelined request: not idle
                client.waiting_since = None
            _check_request_line(buffered)
            receive = max(1, min(RECV_BYTES, REQUEST_BYTES_MAX + 1 - len(buffered)))
            before_request_line = not buffered
        try:
            data = await stream.receive_some(receive)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            data = b""
        if data:
            client.waiting_since = None
            if before_request_line:  # RFC 9112 section 2.2: empty lines before a request line are ignored
                data = data.lstrip(b"\r\n")
                if not data:
                    continue
        conn.receive_data(data)


# A request line: method, target, version (RFC 9112 section 3).
_REQUEST_LINE = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+ [\x21-\x7e\x80-\xff]+ HTTP/[0-9]\.[0-9]")
_NOT_HTTP = _text(400, "Bad request: not an HTTP/1.1 request line. This is Partita's HTTP port (metrics: "
                       "/metrics, console: /); Redis clients connect to `port`, Kafka clients to `kafka-port`.")


def _check_request_line(buffered: bytes) -> None:
    """Refuse at once a first line that is no HTTP/1.x request line (HTTP/0.9,
    a Redis command, a stray protocol) rather than wait for headers that will
    never come."""
    line, newline, _ = buffered.partition(b"\n")
    line = line.rstrip(b"\r")
    if newline and line and not _REQUEST_LINE.fullmatch(line):
        raise _Refused(_NOT_HTTP)


async def _receive_request(conn: h11.Connection, stream: trio.SocketStream,
                           client: _Client) -> h11.Request | None:
    """The next whole request (its body read and dropped), or None when the
    client closed the connection. ``_Refused`` for one answered at once:
    another HTTP version, a body declared or grown too large, a body framed
    two ways (which a proxy in front may have read the other way)."""
    event = await _next_event(conn, stream, client)
    if isinstance(event, h11.ConnectionClosed):
        return None
    assert isinstance(event, h11.Request), event
    client.waiting_since = None
    if event.http_version not in (b"1.0", b"1.1"):
        raise _Refused(_text(505, f"HTTP version not supported: HTTP/{event.http_version.decode()}; "
                                  f"this port speaks HTTP/1.1 (and 1.0)."))
    headers = dict(event.headers)
    length = headers.get(b"content-length")
    if length is not None and b"transfer-encoding" in headers:  # RFC 9112 section 6.3: reject, or close after
        raise _Refused(_text(400, "Bad request: both Content-Length and Transfer-Encoding."))
    if length is not None and int(length) > BODY_BYTES_MAX:  # h11 checked it is digits
        raise _Refused(_BODY_TOO_LARGE)
    if conn.they_are_waiting_for_100_continue:
        await stream.send_all(conn.send(h11.InformationalResponse(status_code=100, headers=[],
                                                                  reason=_reason(100))))
    body_bytes = 0
    while True:
        part = await _next_event(conn, stream, client)
        if isinstance(part, h11.EndOfMessage):
            return event
        if isinstance(part, h11.ConnectionClosed):
            return None
        body_bytes += len(part.data)
        if body_bytes > BODY_BYTES_MAX:
            raise _Refused(_BODY_TOO_LARGE)


_BODY_TOO_LARGE = _text(413, f"Request body too large: at most {BODY_BYTES_MAX} bytes (and GET and HEAD "
                             f"need none).")


async def _send_last(conn: h11.Connection, stream: trio.SocketStream, response: Response) -> None:
    """An error response before closing, if no response was begun and the
    client still listens; then what the client still sends is read and
    dropped for a moment, so that closing does not reset the connection
    before the client has read the error."""
    if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
        return
    with trio.move_on_after(LINGER_S):
        try:
            await _send(conn, stream, response, head=False, close=True)
            await _drain(stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.LocalProtocolError):
            pass


async def _drain(stream: trio.SocketStream) -> None:
    """Say we are done sending, then drop what the client sends until it
    closes too (at most ``LINGER_BYTES_MAX``)."""
    await stream.send_eof()
    dropped = 0
    while dropped < LINGER_BYTES_MAX:
        data = await stream.receive_some(RECV_BYTES)
        if not data:
            return
        dropped += len(data)


async def _send(conn: h11.Connection, stream: trio.SocketStream, response: Response, *, head: bool,
                close: bool = False) -> None:
    out = conn.send(h11.Response(status_code=response.status, headers=_headers(response, close),
                                 reason=_reason(response.status)))
    if not head and response.body:
        out += conn.send(h11.Data(data=response.body))
    out += conn.send(h11.EndOfMessage())
    await stream.send_all(out)
