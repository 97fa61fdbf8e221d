"""The TLS port: ``tls-port`` with ``tls-cert-file`` / ``tls-key-file`` / ``tls-ca-cert-file``.

Owns: the server's ``ssl.SSLContext`` (built and checked before anything
listens, so a bad certificate fails the start), the TLS accept loop, and
``TlsConnection``: one client over ``trio.SSLStream(trio.SocketStream)``
running the same parser (``server.resp``), dispatcher (``server.dispatch``)
and encoder (``server.reply``) as a plain connection. A client that fails
the handshake (plain text on the TLS port, a bad or missing certificate) is
logged and closed; nobody else notices.

Must not know: what commands do, RESP framing or encoding rules.

Why a separate loop: the plain connection (``server.connection``) works on
a raw non-blocking socket for speed; TLS needs trio's stream layer. The loop
here is the plain one without its hot-path tricks: deferred appends are off
(``ctx.may_defer`` False, so XADD appends at once) and every batch is sent
with ``send_all`` after its writes are durable.
"""

from __future__ import annotations

import errno
import logging
import socket
import ssl
from time import time as _now
from typing import Any

import trio

from server.dispatch import COROUTINE, NO_REPLY, Context, Dispatcher
from server.durability import DurabilityError
from server.errors import ProtocolError
from server.reply import encode_into
from server.resp import QueryBufferLimitError, RequestParser

log = logging.getLogger("partita.tls")

RECV_BYTES = 64 * 1024
HANDSHAKE_TIMEOUT_S = 10.0
SEND_AT_BYTES = 1024 * 1024
MAXCLIENTS_ERROR = b"-ERR max number of clients reached\r\n"


class TlsConfigError(OSError):
    """A TLS setting that stops the start (message says which; logged without a traceback)."""


def make_server_context(config: Any) -> ssl.SSLContext:
    """The SSL context for ``tls-port``; TlsConfigError naming the bad setting."""
    if not config.tls_cert_file or not config.tls_key_file:
        raise TlsConfigError("tls-port needs tls-cert-file and tls-key-file")
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


async def accept_loop(server: Any, dispatcher: Dispatcher, sock: socket.socket, context: ssl.SSLContext,
                      nursery: trio.Nursery, connections: set) -> None:
    """Accept TLS clients on ``sock`` (raw, listening, non-blocking) forever."""
    while True:
        await trio.lowlevel.wait_readable(sock)
        for _ in range(64):
            try:
                conn_sock, addr = sock.accept()
            except (BlockingIOError, InterruptedError):
                break
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    log.warning("accept failed: %s; pausing accepts", e.strerror)
                    await trio.sleep(0.1)
                    break
                if e.errno in (errno.ECONNABORTED, errno.EPROTO):
                    continue
                raise
            conn_sock.setblocking(False)
            if len(server.clients) >= server.config.maxclients:
                # Redis answers in the clear before the handshake too.
                server.stats.rejected_connections += 1
                try:
                    conn_sock.send(MAXCLIENTS_ERROR)
                except OSError:
                    pass
                conn_sock.close()
                continue
            conn = TlsConnection(server, dispatcher, conn_sock, context, addr)
            connections.add(conn)
            nursery.start_soon(_run, conn, connections)


async def _run(conn: "TlsConnection", connections: set) -> None:
    try:
        await conn.run()
    finally:
        connections.discard(conn)


def _addr_text(addr: Any) -> str:
    host, port = addr[0], addr[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class TlsConnection:
    """One TLS client: handshake, then receive → parse → dispatch → encode → send."""

    def __init__(self, server: Any, dispatcher: Dispatcher, sock: socket.socket, context: ssl.SSLContext,
                 addr: Any) -> None:
        self.server = server
        self.dispatcher = dispatcher
        self.sock = sock
        try:
            laddr = _addr_text(sock.getsockname())
        except OSError:
            laddr = ""
        self.client = server.new_client(_addr_text(addr), laddr, sock.fileno())
        self.ctx = Context(server, self.client, dispatcher)  # may_defer stays False
        self.stream = trio.SSLStream(trio.SocketStream(trio.socket.from_stdlib_socket(sock)), context,
                                     server_side=True)
        self.cancel_scope = trio.CancelScope()
        self.idle = True
        self.stopping = False
        self.parser: RequestParser | None = None
        self.client._kill = self.kill

    def kill(self) -> None:
        self.stopping = True
        self.cancel_scope.cancel()

    def stop(self) -> None:
        self.stopping = True
        if self.idle:
            self.cancel_scope.cancel()

    async def run(self) -> None:
        handshake_done = False
        try:
            with self.cancel_scope:
                with trio.move_on_after(HANDSHAKE_TIMEOUT_S) as handshake_scope:
                    await self.stream.do_handshake()
                if handshake_scope.cancelled_caught:
                    log.info("TLS handshake timed out from %s", self.client.addr)
                    return
                handshake_done = True
                await self._serve()
        except (trio.BrokenResourceError, trio.ClosedResourceError) as e:
            if not handshake_done:  # after it: the client went away, nothing to report
                log.info("Error accepting a client connection: %s (addr=%s laddr=%s)", e.__cause__ or e,
                         self.client.addr, self.client.laddr)
        except Exception:  # a bug in one connection must not stop the server
            log.exception("TLS connection %d failed", self.client.id)
        finally:
            self.server.remove_client(self.client)
            with trio.CancelScope(shield=True):
                with trio.move_on_after(1):
                    try:
                        await self.stream.aclose()
                    except Exception:  # noqa: BLE001 - closing a broken stream
                        pass
            try:
                self.sock.close()
            except OSError:
                pass

    async def _serve(self) -> None:
        client = self.client
        ctx = self.ctx
        config = self.server.config
        stats = self.server.stats
        call = self.dispatcher.call
        parser = self.parser = RequestParser(config.proto_max_bulk_len, config.client_query_buffer_limit,
                                             authenticated=lambda: client.authenticated)
        while not self.stopping:
            self.idle = True
            if config.timeout:
                with trio.move_on_after(config.timeout) as idle_scope:
                    data = await self.stream.receive_some(RECV_BYTES)
                if idle_scope.cancelled_caught:
                    log.info("closing idle client %d (timeout %ds)", client.id, config.timeout)
                    return
            else:
                data = await self.stream.receive_some(RECV_BYTES)
            if not data:
                return
            self.idle = False
            stats.total_net_input_bytes += len(data)
            parser.feed(data)
            out: list = []
            while True:
                try:
                    argv = parser.get_command()
                except QueryBufferLimitError:
                    log.warning("closing client %d that reached max query buffer length", client.id)
                    await self._flush(out)
                    return
                except ProtocolError as e:
                    log.info("protocol error from client %d: %s", client.id, e.message)
                    out.append(e.reply_line())
                    await self._flush(out)
                    return
                if argv is None:
                    break
                reply = call(ctx, argv)
                if type(reply) is COROUTINE:
                    await self._flush(out)
                    out = []
                    self.idle = True
                    try:
                        reply = await reply
                    finally:
                        self.idle = False
                if reply is not NO_REPLY:
                    encode_into(out, reply, client.protocol)
                if client.close_after_reply or self.stopping:
                    await self._flush(out)
                    return
                if sum(map(len, out)) >= SEND_AT_BYTES:
                    await self._flush(out)
                    out = []
            client.last_interaction = _now()
            await self._flush(out)

    async def _flush(self, out: list) -> None:
        """Wait until this batch's writes are durable, then send its replies."""
        ctx = self.ctx
        if ctx.flush_seq:
            seq = ctx.flush_seq
            ctx.flush_seq = 0
            try:
                await self.server.durability.wait_for_flush(seq)
            except DurabilityError:
                self.stopping = True
                self.cancel_scope.cancel()
                await trio.lowlevel.checkpoint()
        if not out:
            return
        data = b"".join(out)
        self.server.stats.total_net_output_bytes += len(data)
        await self._send_limited(data)

    async def _send_limited(self, data: bytes) -> None:
        """``send_all`` under ``client-output-buffer-limit normal`` (the whole batch is pending)."""
        hard, soft, soft_s = self.server.config.client_output_buffer_limit["normal"]
        limit_s = None
        if hard and len(data) > hard:
            limit_s = 1.0  # more than the hard limit pending: it must drain within a second
        elif soft and len(data) > soft:
            limit_s = float(soft_s)
        if limit_s is None:
            await self.stream.send_all(data)
            return
        with trio.move_on_after(limit_s) as scope:
            await self.stream.send_all(data)
        if scope.cancelled_caught:
            log.warning("Client %s scheduled to be closed ASAP for overcoming of output buffer limits.",
                        self.client.info_line())
            self.kill()
            await trio.lowlevel.checkpoint()


def bind(config: Any) -> tuple[list[socket.socket], ssl.SSLContext | None]:
    """The TLS listening sockets on the ``bind`` addresses and the context; none without ``tls-port``."""
    if not config.tls_port:
        return [], None
    from server.listener import bind_sockets

    context = make_server_context(config)
    return bind_sockets(config.bind, config.tls_port), context
