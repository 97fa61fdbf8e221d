"""One Kafka client's connection: frames in, responses out, in order.

Owns the loop of one connection (plain or TLS: a ``trio`` stream), apart
from the RESP connection's (server/connection.py), with which it shares
nothing but the client record (``maxclients``, CLIENT LIST / KILL) and the
shutdown protocol (``run`` / ``stop`` / ``kill``):

- a reader task receives bytes, feeds ``server.kafka.framing.RequestReader``
  (frame size limit checked before anything is kept) and handles each
  request in arrival order (``apis.HANDLERS``): a produce's appends happen
  there, in order; a fetch's long poll waits there. Kafka clients pipeline,
  and a Kafka broker answers one request after the other per connection;
  so does this loop, except that a response waiting for its writes' receipt
  (``context.Pending``: fsync, acks=all) does not stop the next request from
  being read and handled meanwhile;
- a responder task sends the responses in request order, settling each
  pending receipt first (the RESP connection's ``_flush``: the durability
  round, then the in-sync replicas), so no response acknowledges a write
  before its topic's guarantees hold. At most ``QUEUE_MAX`` responses, and
  ``QUEUE_MAX_BYTES`` of them (beyond the one being sent), wait for a slow
  client before the reader stops reading: memory stays bounded.

Who the client is: ``sasl.Authenticator`` (``ctx.sasl``) says which
requests a connection that has not authenticated may send (the others
close it, logged), whether the next frame is a bare SASL token (after a v0
SaslHandshake), how large a frame it may send, and when a response (a
failed authentication) is the last.

What a Kafka broker closes the connection for (a frame over the size
limit, an API or version not served, a header or body that does not
decode, trailing bytes) closes it here too, after the responses already
due, with the reason logged (INFO, as Kafka logs it); ApiVersions at an
unknown version is answered by the framing. A handler failing with
something that is not a refusal is a bug: logged with its traceback, the
connection closed; the server goes on.

Must not know: RESP, what an API does.
"""

from __future__ import annotations

import logging
import socket
import time
from typing import Any

import trio

from cluster.broker.durability import DurabilityError
from cluster.runtime.replication import AcksFailed
from server.kafka import framing
from server.kafka_front import apis, sasl
from server.kafka_front.context import KafkaContext, KafkaFront, Pending

log = logging.getLogger("partita.kafka")

RECV_BYTES = 256 * 1024
QUEUE_MAX = 64
QUEUE_MAX_BYTES = 16 * 1024 * 1024
HANDSHAKE_TIMEOUT_S = 10.0


class _Close(Exception):
    """Stop serving this connection (the reason is logged where raised)."""


class KafkaConnection:
    """One Kafka client (module docstring)."""

    def __init__(self, front: KafkaFront, sock: socket.socket, client: Any, tls_context: Any = None) -> None:
        self.front = front
        self.server = front.server
        self.sock = sock
        self.client = client
        self.tls = tls_context is not None
        stream: Any = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
        if tls_context is not None:
            stream = trio.SSLStream(stream, tls_context, server_side=True)
        self.stream = stream
        self.parser = None  # (the RESP connections' CONFIG SET hook looks for a RESP parser)
        self.cancel_scope = trio.CancelScope()
        self._receiving: trio.CancelScope | None = None  # the reader's wait for input, when idle
        self._handling: trio.CancelScope | None = None  # a request's handler (a fetch's long poll)
        self._stopping = False
        session = self.server.broker.session(client.id)
        try:  # the address the client reached: the host Metadata names this node by
            name = sock.getsockname()
        except OSError:
            name = None
        local_host = name[0] if isinstance(name, tuple) else "127.0.0.1"
        self.ctx = KafkaContext(front, session, client, self.tls, local_host)
        self.ctx.sasl = sasl.Authenticator(self.server.acl, client)
        client.lib_name = b"kafka"
        client._kill = self.kill

    # -- lifecycle (the accept loop and the app's shutdown call these) ---------------

    def kill(self) -> None:
        """CLIENT KILL: close now."""
        self.cancel_scope.cancel()

    def stop(self) -> None:
        """Shutdown: read no more requests, end a fetch's long poll; the
        responses due are sent, then it closes."""
        self._stopping = True
        for scope in (self._receiving, self._handling):
            if scope is not None:
                scope.cancel()

    def close_if_idle(self, now_s: float, timeout_s: float) -> bool:
        """The idle ``timeout`` (``server.connection.close_idle_clients``):
        close this connection if it waits for the next request, none being
        handled, and the client sent nothing for more than ``timeout_s``
        at ``now_s`` (wall clock, as ``Client.last_interaction``)."""
        receiving = self._receiving
        if (receiving is None or self._handling is not None or self._stopping
                or now_s - self.client.last_interaction <= timeout_s):
            return False
        log.info("Kafka client %s idle for %ds: closing", self.client.addr, timeout_s)
        receiving.cancel()
        return True

    async def run(self) -> None:
        try:
            with self.cancel_scope:
                if self.tls:
                    with trio.move_on_after(HANDSHAKE_TIMEOUT_S):
                        await self.stream.do_handshake()
                await self._serve()
        except* (trio.BrokenResourceError, trio.ClosedResourceError, OSError, _Close):
            pass  # the client left, or what it sent closes the connection (logged where seen)
        except* Exception as group:  # a bug: this connection closes, the server goes on
            for exc in group.exceptions:
                log.error("Kafka client %s: closing the connection after an unexpected error",
                          self.client.addr, exc_info=exc)
        finally:
            with trio.CancelScope(shield=True):
                with trio.move_on_after(1):
                    try:
                        await self.stream.aclose()
                    except Exception:  # noqa: BLE001 - closing a broken stream
                        pass
            self.server.remove_client(self.client)

    # -- the loop ----------------------------------------------------------------------

    async def _serve(self) -> None:
        config = self.server.config
        max_frame = min(framing.REQUEST_MAX_BYTES_DEFAULT, config.client_query_buffer_limit)
        reader = framing.RequestReader(self.front.served, max_frame_bytes=self.ctx.sasl.frame_limit(max_frame))
        send, receive = trio.open_memory_channel(QUEUE_MAX)
        self._queued_bytes = 0
        self._drained = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._respond, receive)
            async with send:
                try:
                    await self._read(reader, send, max_frame)
                except framing.ProtocolViolation as e:
                    log.info("Kafka client %s: %s: closing the connection", self.client.addr, e.reason)

    async def _read(self, reader: framing.RequestReader, send: Any, max_frame: int) -> None:
        stats = self.server.stats
        auth = self.ctx.sasl
        while not self._stopping:
            with trio.CancelScope() as scope:
                self._receiving = scope  # (cancelled by stop, or by the idle timeout: close_if_idle)
                data = await self.stream.receive_some(RECV_BYTES)
            self._receiving = None
            if scope.cancelled_caught:
                return
            if not data:
                return
            stats.total_net_input_bytes += len(data)
            reader.receive_data(data)
            while (event := self._next_event(reader)) is not None:
                self.client.last_interaction = time.time()
                if isinstance(event, framing.Answer):
                    await self._queue(send, event.data, len(event.data))
                    continue
                if isinstance(event, sasl.RawToken):  # (after a v0 SaslHandshake)
                    data = auth.raw_token(event)
                    await self._queue(send, data, len(data))
                    if await self._sasl_closes(reader, max_frame):
                        return
                    continue
                if (refusal := auth.refusal(event.api_key, apis.NAMES[event.api_key])) is not None:
                    log.info("Kafka client %s: %s: closing the connection", self.client.addr, refusal)
                    return
                with trio.CancelScope() as scope:
                    self._handling = scope
                    result = await self._handle(event)
                self._handling = None
                if scope.cancelled_caught:  # stopped (shutdown): no more requests
                    return
                if isinstance(result, Pending):
                    if result.receipt.repl_pending:  # the writes' end offsets and epochs, before anything else runs
                        result.marks = self.server.replication.ack_marks(result.receipt.repl_pending)
                    await self._queue(send, (event, result), 0)
                elif result is not None:
                    data = framing.encode_response(event.api_key, event.api_version, event.correlation_id, result)
                    await self._queue(send, data, len(data))
                if await self._sasl_closes(reader, max_frame):
                    return

    def _next_event(self, reader: framing.RequestReader) -> Any:
        """The next request (or framing answer), or a bare SASL token after
        a v0 SaslHandshake; None: need more data."""
        if not self.ctx.sasl.raw_tokens:
            return reader.next_event()
        frame = reader.frames.next_frame()
        return None if frame is None else sasl.RawToken(frame)

    async def _sasl_closes(self, reader: framing.RequestReader, max_frame: int) -> bool:
        """After a request: True when its response is the last (a failed
        authentication: the connection closes ``sasl.FAILED_CLOSE_DELAY_S``
        after it, as Kafka's ``failed.authentication.delay.ms``); else the
        frame size limit now in force is set."""
        auth = self.ctx.sasl
        if auth.closing is not None:
            log.info("Kafka client %s: %s: closing the connection", self.client.addr, auth.closing)
            await trio.sleep(sasl.FAILED_CLOSE_DELAY_S)
            return True
        reader.frames.max_frame_bytes = auth.frame_limit(max_frame)
        return False

    async def _handle(self, request: framing.Request) -> Any:
        """The handler's result (a response body, None, or a ``Pending``)."""
        client = self.client
        client.last_command = apis.NAMES[request.api_key].lower()
        if request.client_id and not client.name:
            client.name = request.client_id.encode("utf-8", "replace").replace(b" ", b"_")[:128]
        try:
            return await apis.HANDLERS[request.api_key](self.ctx, request)
        except ConnectionAbortedError as e:  # the API closes the connection (a refused acks=0 produce)
            log.info("Kafka client %s: %s", client.addr, e)
            raise _Close() from None
        except trio.Cancelled:
            raise
        except Exception:
            log.exception("Kafka client %s: %s v%d failed; closing the connection", client.addr,
                          apis.NAMES[request.api_key], request.api_version)
            raise _Close() from None

    async def _queue(self, send: Any, item: Any, nbytes: int) -> None:
        while self._queued_bytes > QUEUE_MAX_BYTES:
            await self._drained.wait()
        self._queued_bytes += nbytes
        await send.send((item, nbytes))

    async def _respond(self, receive: Any) -> None:
        stats = self.server.stats
        async with receive:
            async for item, nbytes in receive:
                if isinstance(item, (bytes, bytearray)):
                    data = item
                else:
                    data = await self._response(*item)
                if data:
                    stats.total_net_output_bytes += len(data)
                    await self.stream.send_all(data)
                self._queued_bytes -= nbytes
                if self._queued_bytes <= QUEUE_MAX_BYTES:
                    self._drained.set()
                    self._drained = trio.Event()

    async def _response(self, request: framing.Request, pending: Pending) -> bytes | None:
        error = await self._settle(pending)
        if pending.silent:
            if error is not None:
                log.info("Kafka client %s: an acks=0 produce was not written durably (%s): closing",
                         self.client.addr, error)
                raise _Close()
            return None
        body = pending.finish(error)
        return framing.encode_response(request.api_key, request.api_version, request.correlation_id, body)

    async def _settle(self, pending: Pending) -> BaseException | None:
        """Wait for the receipt (the RESP connection's ``_flush``): the
        fsync round, then the in-sync replicas within ``timeout_ms``; the
        failure, or None once every write it covers holds."""
        receipt = pending.receipt
        if receipt.flush_seq:
            try:
                await self.server.durability.wait_for_flush(receipt.flush_seq)
            except DurabilityError as e:
                return e
        if receipt.repl_pending:
            with trio.move_on_after(max(0, pending.timeout_ms) / 1000) as scope:
                try:
                    await self.server.replication.wait_acks(self.ctx.session, receipt.repl_pending, pending.marks)
                except AcksFailed as e:
                    return e
            if scope.cancelled_caught:
                return TimeoutError(f"the in-sync replicas did not acknowledge within {pending.timeout_ms} ms")
        return None
