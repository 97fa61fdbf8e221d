"""The TLS port: ``tls-port`` with ``tls-cert-file`` / ``tls-key-file`` / ``tls-ca-cert-file``.

Owns: the server's ``ssl.SSLContext`` (built and checked before anything
listens, so a bad certificate fails the start), the TLS accept loop, and
``TlsConnection``: one client over ``trio.SSLStream(trio.SocketStream)``
running the plain connection's command loop (``server.connection``): it
subclasses ``Connection`` and overrides only its transport methods (receive
a chunk, send bytes, notice a peer that closes during a BLOCK), so TLS
clients get the same pipelining, deferred XADD batching, durability holds,
output buffer limits and blocked-client disconnect handling. A client that
fails the handshake (plain text on the TLS port, a bad or missing
certificate) is logged and closed; nobody else notices.

Must not know: what commands do, RESP framing or encoding rules, the
command loop's internals (only the transport hooks ``server.connection``
documents).
"""

from __future__ import annotations

import logging
import socket
import ssl
from typing import Any

import trio

from server import outbuf
from server.connection import RECV_BYTES, Connection
from server.dispatch import Dispatcher

log = logging.getLogger("partita.tls")

HANDSHAKE_TIMEOUT_S = 10.0


class TlsConfigError(OSError):
    """A TLS setting that stops the start (message says which; logged without a traceback)."""


def make_server_context(config: Any, port_option: str = "tls-port") -> ssl.SSLContext:
    """The SSL context for ``port_option`` (``tls-port``, ``kafka-tls-port``);
    TlsConfigError naming the bad setting."""
    if not config.tls_cert_file or not config.tls_key_file:
        raise TlsConfigError(f"{port_option} needs tls-cert-file and tls-key-file")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(config.tls_cert_file, config.tls_key_file)
    except (OSError, ssl.SSLError) as e:
        raise TlsConfigError(f"Failed to load certificate: {config.tls_cert_file}: {e}") from None
    mode = config.tls_auth_clients
    if mode != "no":
        if not config.tls_ca_cert_file:
            raise TlsConfigError("tls-auth-clients yes/optional needs tls-ca-cert-file "
                                 "(or set tls-auth-clients no)")
        try:
            context.load_verify_locations(config.tls_ca_cert_file)
        except (OSError, ssl.SSLError) as e:
            raise TlsConfigError(f"Failed to load CA certificate(s) file: {config.tls_ca_cert_file}: {e}") from None
        context.verify_mode = ssl.CERT_REQUIRED if mode == "yes" else ssl.CERT_OPTIONAL
    else:
        context.verify_mode = ssl.CERT_NONE
    return context


class TlsConnection(Connection):
    """One TLS client: the handshake, then the plain connection's command loop
    (``server.connection.Connection``) over ``trio.SSLStream``.

    Overrides only the transport methods. Input goes through a receive
    buffer: ``_fill`` receives a chunk into it (the loop's "wait for input"),
    ``_take`` hands it to the parser. While a BLOCK command waits,
    ``_wait_peer_closed`` receives into the same buffer, so bytes the client
    sends meanwhile are parsed after the command, in order, and an EOF frees
    the blocked client at once.

    Its states are the plain connection's minus the reactor's and the
    group commit's hand-over: no epoll set (never OWNED, no poll answered
    while parked) and no send that cannot wait (never HELD: a batch waits
    for its receipt in ``_flush``).
    """

    def __init__(self, server: Any, dispatcher: Dispatcher, sock: socket.socket, client: Any,
                 context: ssl.SSLContext) -> None:
        super().__init__(server, dispatcher, sock, client)
        self.stream = trio.SSLStream(trio.SocketStream(trio.socket.from_stdlib_socket(sock)), context,
                                     server_side=True)
        self._inbuf = b""  # received and not yet parsed; b"" with _eof set: the peer has closed
        self._eof = False

    async def _open(self) -> bool:
        with trio.move_on_after(HANDSHAKE_TIMEOUT_S) as handshake_scope:
            try:
                await self.stream.do_handshake()
            except (trio.BrokenResourceError, trio.ClosedResourceError) as e:
                log.info("Error accepting a client connection: %s (addr=%s laddr=%s)", e.__cause__ or e,
                         self.client.addr, self.client.laddr)
                return False
        if handshake_scope.cancelled_caught:
            log.info("TLS handshake timed out from %s", self.client.addr)
            return False
        return True

    async def _close_transport(self) -> None:
        with trio.CancelScope(shield=True):
            with trio.move_on_after(1):
                try:
                    await self.stream.aclose()
                except Exception:  # noqa: BLE001 - closing a broken stream
                    pass
        await super()._close_transport()

    def _transport(self) -> tuple[Any, Any, Any]:
        return self._fill, self._take, _send_nothing

    def _gathering_send(self) -> Any:
        return None  # replies go through the SSL stream as joined bytes

    async def _fill(self, _sock: Any = None) -> None:
        """The loop's wait for input: until ``_inbuf`` has bytes or the peer
        has closed (at once if so already). Hands nothing over (None)."""
        if self._inbuf or self._eof:
            return None
        try:
            data = await self.stream.receive_some(RECV_BYTES)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            data = b""
        if data:
            self._inbuf = data
        else:
            self._eof = True
        return None

    def _take(self, _max_bytes: int) -> bytes:
        """What ``_fill`` received (b"" at EOF); the loop's ``recv``."""
        data = self._inbuf
        if not data and not self._eof:
            raise BlockingIOError  # (not reached: the loop takes only after _fill)
        self._inbuf = b""
        return data

    async def _send_rest(self, data: bytes | memoryview) -> None:
        await outbuf.send_all_stream(self, self.stream, data)  # limits hook (server/outbuf.py)

    async def _wait_peer_closed(self) -> bool:
        """True once the peer has closed; False once it sent more bytes
        instead (kept in ``_inbuf``, parsed after the blocked command)."""
        await self._fill()
        return self._eof and not self._inbuf


def _send_nothing(_data: Any) -> int:
    """The loop's non-blocking ``send`` for TLS: a stream cannot send part of
    a batch without waiting, so every batch goes through ``_send_rest``."""
    return 0


def bind(config: Any) -> tuple[list[socket.socket], ssl.SSLContext | None]:
    """The TLS listening sockets on the ``bind`` addresses and the context; none without ``tls-port``."""
    if not config.tls_port:
        return [], None
    from server.listener import bind_sockets

    context = make_server_context(config)
    return bind_sockets(config.bind, config.tls_port, "tls"), context
