"""How one node reaches another: the ``PeerLink`` protocol, the links a node
keeps per peer and purpose, and an in-memory implementation for tests.

Owns:

- ``PeerLink``: ``await link.call(request)`` returns the typed response
  (``cluster.peer.messages``), raises ``Refused`` when the peer answered
  with an error (its text, to relay), and ``Unreachable`` when the link
  failed, with ``sent``: False when the request never left this node (so the
  peer cannot have run it), True when it may have, and ``refused``: True
  when the connection was refused (nothing listens on the peer's port: its
  process is gone), not merely unanswered. A link retries an
  idempotent request once on a fresh connection; it never retries one that
  is not (``AppendRequest``). ``reply_timeout_s`` bounds each call.
  Kafka's ``LeaderEndPoint`` plays this part for its fetcher threads
  (``RemoteLeaderEndPoint`` over the network, ``LocalLeaderEndPoint`` in
  process); here one protocol serves fetchers, the controller, failovers
  and forwarded writes.
- ``Links``: one link per ``(node, purpose)`` (a purpose is a connection of
  its own: ``fetch``, ``raft``, ``beat``, ``forward0`` ...), made on first
  use by the factory the composition root injects.
- ``MemoryNetwork`` / ``MemoryLink``: nodes in one ``trio.run``, each answered
  by its ``PeerService`` directly (a refusal becomes ``Refused`` as it would
  on the bus); a link can be taken down (``up``).

Must not know: encodings and sockets (``server/peer_resp.py`` implements
``PeerLink`` over RESP).
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

import trio

from cluster.errors import ClusterError, Refused
from cluster.peer.messages import Request, Response

__all__ = ["PeerLink", "Links", "MemoryLink", "MemoryNetwork", "Refused", "Unreachable"]


class Unreachable(ConnectionError):
    """The link failed: ``sent`` says whether the request may have reached the
    peer (True) or certainly did not (False); ``refused`` whether the peer's
    host refused the connection (ECONNREFUSED: nothing listens on the port,
    so the peer's process is not running; a paused, slow or cut-off peer
    times out or drops the connection instead). ``str(e)`` says why."""

    def __init__(self, message: str, *, sent: bool = False, refused: bool = False) -> None:
        super().__init__(message)
        self.sent = sent
        self.refused = refused


class PeerLink(Protocol):
    reply_timeout_s: float

    async def call(self, request: Request) -> Response:
        """Send ``request``; its response. Raises ``Refused`` (the peer's
        error) or ``Unreachable``."""


class Links:
    """This node's links to its peers, one per ``(node, purpose)``."""

    def __init__(self, factory: Callable[[int], PeerLink]) -> None:
        self.factory = factory
        self._links: dict[tuple[int, str], PeerLink] = {}

    def get(self, node: int, purpose: str, *, reply_timeout_s: float | None = None) -> PeerLink:
        key = (node, purpose)
        link = self._links.get(key)
        if link is None:
            link = self._links[key] = self.factory(node)
            if reply_timeout_s is not None:
                link.reply_timeout_s = reply_timeout_s
        return link


class MemoryLink:
    """A link to a ``PeerService`` in the same process. Each call yields once
    (as a network round trip would), then the service answers."""

    def __init__(self, service: Any) -> None:
        self.service = service
        self.up = True
        self.reply_timeout_s = 30.0
        self.calls: list[Request] = []

    async def call(self, request: Request) -> Response:
        self.calls.append(request)
        await trio.sleep(0)
        if not self.up:
            raise Unreachable("link down", sent=False)
        try:
            with trio.fail_after(self.reply_timeout_s):
                return await self.service.serve(request)
        except trio.TooSlowError:
            raise Unreachable(f"no reply within {self.reply_timeout_s:g} s", sent=True) from None
        except ClusterError as e:
            raise Refused(str(e)) from None


class MemoryNetwork:
    """Services by node id; ``factory`` makes ``MemoryLink``s for ``Links``."""

    def __init__(self) -> None:
        self.services: dict[int, Any] = {}
        self.links: list[MemoryLink] = []
        self.down: set[int] = set()

    def add(self, node: int, service: Any) -> None:
        self.services[node] = service

    def factory(self, node: int) -> MemoryLink:
        link = MemoryLink(self.services[node])
        link.up = node not in self.down
        self.links.append(link)
        return link

    def set_up(self, node: int, up: bool) -> None:
        """Take every link to ``node`` down (or up again), those made later too."""
        (self.down.discard if up else self.down.add)(node)
        for link in self.links:
            if link.service is self.services[node]:
                link.up = up
