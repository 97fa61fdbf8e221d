"""TCP proxies between cluster nodes, so a test can cut a node off the
network without stopping it.

Each ordered pair of nodes (i → j) gets its own proxy port: node i's
``cluster-nodes`` names node j by that port, so every byte node i sends to
node j (and j's replies) crosses that one proxy. ``isolate(k)`` cuts every
proxy into and out of node k — open connections are closed and new ones are
accepted and closed at once — while node k keeps running and clients can
still reach it directly; ``heal(k)`` lets traffic through again.
"""

from __future__ import annotations

import selectors
import socket
import threading


class _Proxy:
    def __init__(self, listen_port: int, target_port: int) -> None:
        self.target_port = target_port
        self.blocked = False
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", listen_port))
        self.listener.listen(64)
        self.listener.setblocking(False)
        self.pairs: dict[socket.socket, socket.socket] = {}


class ProxyMesh:
    """Proxies for every ordered pair of ``real_ports``; ``port(i, j)`` is the
    port node i uses to reach node j (indices into ``real_ports``)."""

    def __init__(self, real_ports: list[int], proxy_ports: dict[tuple[int, int], int]) -> None:
        self._sel = selectors.DefaultSelector()
        self._lock = threading.Lock()
        self._proxies: dict[tuple[int, int], _Proxy] = {}
        for (i, j), port in proxy_ports.items():
            proxy = _Proxy(port, real_ports[j])
            self._proxies[(i, j)] = proxy
            self._sel.register(proxy.listener, selectors.EVENT_READ, ("accept", proxy))
        self._stop = False
        self._wake_r, self._wake_w = socket.socketpair()
        self._sel.register(self._wake_r, selectors.EVENT_READ, ("wake", None))
        self._thread = threading.Thread(target=self._run, name="proxy-mesh", daemon=True)
        self._thread.start()

    def port(self, i: int, j: int) -> int:
        return self._proxies[(i, j)].listener.getsockname()[1]

    # -- faults -------------------------------------------------------------

    def isolate(self, k: int) -> None:
        self._set(k, True)

    def heal(self, k: int) -> None:
        self._set(k, False)

    def _set(self, k: int, blocked: bool) -> None:
        with self._lock:
            for (i, j), proxy in self._proxies.items():
                if k in (i, j):
                    proxy.blocked = blocked
        self._wake_w.send(b"x")

    def close(self) -> None:
        self._stop = True
        self._wake_w.send(b"x")
        self._thread.join(timeout=5)
        for proxy in self._proxies.values():
            for a in list(proxy.pairs):
                a.close()
            proxy.listener.close()
        self._wake_r.close()
        self._wake_w.close()

    # -- the loop -------------------------------------------------------------

    def _drop(self, proxy: _Proxy, a: socket.socket) -> None:
        b = proxy.pairs.pop(a, None)
        for s in (a, b):
            if s is None:
                continue
            proxy.pairs.pop(s, None)
            self._out.pop(s, None)
            try:
                self._sel.unregister(s)
            except (KeyError, ValueError):
                pass
            s.close()

    def _interest(self, proxy: _Proxy, sock: socket.socket) -> None:
        """Always read (the nodes' internal traffic is request/reply, so a
        buffer only grows by what one stopped node was sent); write while
        the socket's own buffer has bytes."""
        if sock not in proxy.pairs:
            return
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if self._out.get(sock) else 0)
        self._sel.modify(sock, events, ("data", proxy))

    def _run(self) -> None:
        self._out: dict[socket.socket, bytes] = {}
        while not self._stop:
            for key, mask in self._sel.select(timeout=0.5):
                kind, proxy = key.data
                if kind == "wake":
                    self._wake_r.recv(4096)
                    with self._lock:
                        for p in self._proxies.values():
                            if p.blocked:
                                for a in list(p.pairs):
                                    if a in p.pairs:
                                        self._drop(p, a)
                elif kind == "accept":
                    try:
                        conn, _ = proxy.listener.accept()
                    except OSError:
                        continue
                    if proxy.blocked:
                        conn.close()
                        continue
                    try:
                        upstream = socket.create_connection(("127.0.0.1", proxy.target_port), timeout=1)
                    except OSError:
                        conn.close()
                        continue
                    for s in (conn, upstream):
                        s.setblocking(False)
                    proxy.pairs[conn] = upstream
                    proxy.pairs[upstream] = conn
                    self._sel.register(conn, selectors.EVENT_READ, ("data", proxy))
                    self._sel.register(upstream, selectors.EVENT_READ, ("data", proxy))
                else:
                    self._pump(proxy, key.fileobj, mask)

    def _pump(self, proxy: _Proxy, sock: socket.socket, mask: int) -> None:
        other = proxy.pairs.get(sock)
        if other is None:
            return
        if proxy.blocked:
            self._drop(proxy, sock)
            return
        if mask & selectors.EVENT_WRITE and self._out.get(sock):
            try:
                sent = sock.send(self._out[sock])
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                self._drop(proxy, sock)
                return
            self._out[sock] = self._out[sock][sent:]
        if mask & selectors.EVENT_READ:
            try:
                data = sock.recv(1 << 16)
            except (BlockingIOError, InterruptedError):
                data = None
            except OSError:
                data = b""
            if data == b"":
                self._drop(proxy, sock)
                return
            if data:
                self._out[other] = self._out.get(other, b"") + data
        self._interest(proxy, sock)
        self._interest(proxy, other)
