"""Listening sockets and the accept loop.

Owns: binding the configured addresses (``bind`` may list several; a ``-``
prefix marks an address that may fail, as in redis.conf), accepting with a
raw non-blocking socket and ``trio.lowlevel.wait_readable``, refusing clients
past ``maxclients`` with Redis's error, and starting one ``Connection`` task
per client in the connections nursery (the client port, the TLS port, the
cluster bus and the Kafka ports alike).

Must not know: RESP, commands, storage.
"""

from __future__ import annotations

import errno
import logging
import socket
from typing import Any, Callable

import trio
from trio.lowlevel import wait_readable

from server.connection import Connection

log = logging.getLogger("partita.listener")

ACCEPT_BATCH_MAX = 64  # accepts per wake-up before yielding to other tasks
BACKLOG = 511
MAXCLIENTS_ERROR = b"-ERR max number of clients reached\r\n"


class BindError(Exception):
    pass


def bind_sockets(bind: str, port: int, what: str = "tcp") -> list[socket.socket]:
    """Bound, listening, non-blocking sockets for ``bind`` (space separated).

    With ``port`` 0 the first socket picks a free port and the others reuse it.
    ``what`` names the listener in BindError's text: Redis's ``tcp`` and
    ``tls`` for ``port`` and ``tls-port``, else the option of the port.
    """
    sockets: list[socket.socket] = []
    addrs = bind.split() or ["127.0.0.1"]
    for raw in addrs:
        optional = raw.startswith("-")
        addr = raw[1:] if optional else raw
        if addr == "*":
            addr = "0.0.0.0"
        elif addr == "::*":
            addr = "::"
        family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind((addr, port))
            sock.listen(BACKLOG)
            sock.setblocking(False)
        except OSError as e:
            sock.close()
            if optional and e.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT, errno.EPROTONOSUPPORT):
                continue
            for s in sockets:
                s.close()
            raise BindError(f"Failed listening on port {port} ({what}), aborting: {addr}: {e.strerror}") from None
        if port == 0:
            port = sock.getsockname()[1]
        sockets.append(sock)
    if not sockets:
        raise BindError(f"Failed listening on port {port} ({what}), aborting: no address in '{bind}'")
    return sockets


def _addr_text(addr: Any) -> str:
    host, port = addr[0], addr[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def accept_loop(server: Any, sock: socket.socket, nursery: trio.Nursery, connections: set,
                      make_connection: Callable[[socket.socket, Any], Connection],
                      new_peer: Callable[[str, str, int], Any] | None = None,
                      refusal: bytes = MAXCLIENTS_ERROR) -> None:
    """Accept clients on ``sock`` forever, each served in ``nursery``.

    ``make_connection(sock, client)`` builds the connection for an accepted
    socket: a plain ``Connection``, or a ``server.tls.TlsConnection`` on the
    TLS port; accepting, the maxclients refusal (in the clear, before any TLS
    handshake, as Redis does) and the client record are the same for both.
    On the cluster bus ``new_peer(addr, laddr, fd)`` makes the client
    instead: peers are not clients (no CLIENT LIST entry, no ``maxclients``).
    ``refusal``: what a client past ``maxclients`` is sent before the close
    (Redis's error; nothing on the Kafka port, whose clients would read it
    as a frame).
    """
    config = server.config
    while True:
        try:
            await wait_readable(sock)
        except trio.ClosedResourceError:  # closed with notify_closing: the end
            return
        if sock.fileno() < 0:
            # The shutdown (``app.serve``) closed it after a client's arrival
            # woke this task, before its cancellation could: nothing to accept.
            return
        for _ in range(ACCEPT_BATCH_MAX):
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
            try:
                conn_sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
            if new_peer is None and len(server.clients) >= config.maxclients:
                server.stats.rejected_connections += 1
                if refusal:
                    try:
                        conn_sock.send(refusal)
                    except OSError:
                        pass
                conn_sock.close()
                continue
            try:
                laddr = _addr_text(conn_sock.getsockname())
            except OSError:
                laddr = ""
            client = (server.new_client if new_peer is None else new_peer)(_addr_text(addr), laddr,
                                                                           conn_sock.fileno())
            conn = make_connection(conn_sock, client)
            connections.add(conn)
            nursery.start_soon(_run_connection, conn, connections)


async def _run_connection(conn: Connection, connections: set) -> None:
    try:
        await conn.run()
    finally:
        connections.discard(conn)
