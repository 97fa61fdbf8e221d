"""What a node answers its peers: a typed request in, the typed response out.

Owns: serving each request of cluster/peer/messages.py on this node: a
follower's fetch (a long poll: held until there is news or ``max_wait_ms``
passed, woken by the host's key signals), the end of a leader epoch, a
manual failover's pause, the controller quorum's Raft messages, heartbeats,
proposals, joins and leadership moves, a forwarded append (handed to the
``appender`` the front-end injects: the XADD is the front-end's command),
and a partition's share of a topic-wide read (``ReadRequest``, answered from
its committed entries: cluster/runtime/fanout.py).
A request that names what does not exist (an unknown node or shard, a
record that does not parse) raises ``BadRequest``; other refusals raise
the ``cluster.errors`` error a client of the front-end would get.

Must not know: encodings and sockets. ``server/bus.py`` decodes RESP into
these requests and encodes what ``serve`` returns; ``MemoryLink`` calls
``serve`` directly.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable

import trio

from cluster.controller.metadata import Metadata
from cluster.errors import BadRequest, ClusterError, NotController, TryAgain
from cluster.runtime.controller_driver import NotReady
from cluster.runtime.fanout import read_part
from cluster.peer.messages import (Ack, AppendRequest, AppendResponse, BeatRequest, BeatResponse, EpochRequest,
                                   FetchRequest, FetchResponse, GroupRequest, JoinRequest, MoveRequest,
                                   PauseRequest, PauseResponse, ProposeRequest, RaftRequest, READ_AFTER, ReadRequest,
                                   ReadResponse, Request, Response)
from cluster.topics import partition_key

TOPICS_CHANGED = b"\x00partita:topics"  # signalled when a topic is created, altered or deleted here
_GROUPS_CHANGED = b"\x00partita:groups:"  # + a partition key: its group journal grew here
FETCH_WAIT_MAX_MS = 60000
READ_WAIT_MAX_MS = 30000  # a blocked read across nodes asks again after this
# The longest pause of a shard's writes a peer may ask for (a manual
# failover asks for cluster/runtime/replication.py's PAUSE_MS, 15 s): a
# REPLPAUSE asking for more is refused, not a way to stop a shard's writes
# for days.
PAUSE_MAX_MS = 60000

# What a request that does not make sense raises inside the layers it reaches.
_MALFORMED = (ValueError, IndexError, KeyError, TypeError)


def groups_changed(topic: bytes, n: int) -> bytes:
    """The internal key signalled when partition ``n`` of ``topic``'s group
    journal grows on its leader: a follower's held fetch wakes to carry the
    new records (an acks=all group write's reply waits for them). Not the
    stream's own key: its blocked readers and WATCHers do not hear group
    writes (a client that used this name would only see spurious wake-ups)."""
    return _GROUPS_CHANGED + partition_key(topic, n)


def check_leads(manager: Any, parts: Any) -> None:
    """``TryAgain`` unless this node leads the partition of each of
    ``parts`` (each with ``topic`` and ``n``): its leadership moved, the
    asking node's view is behind."""
    for part in parts:
        if manager.leader_state(part.topic, part.n) is None:
            raise TryAgain(f"node {manager.my_id} does not lead partition "
                           f"{partition_key(part.topic, part.n).decode('utf-8', 'replace')} "
                           "(its leadership is moving); retry shortly")


class PeerService:
    """This node's answers to its peers. ``manager`` (the ``ReplicaManager``)
    serves fetches and epochs; ``replication`` (cluster/runtime/replication.py,
    None in tests of fetching alone) brings the controller, the key waits of
    its host and leadership moves; ``appender`` runs a forwarded XADD."""

    def __init__(self, manager: Any, *, replication: Any = None) -> None:
        self.manager = manager
        self.replication = replication
        self.appender: Callable[[AppendRequest], Awaitable[AppendResponse]] | None = None

    async def serve(self, request: Request) -> Response:
        """The response to ``request``; raises a ``ClusterError``."""
        kind = type(request)
        if kind is FetchRequest:
            return await self.fetch(request)
        if kind is JoinRequest:
            return await self.join(request)
        if kind is ReadRequest:
            return await self.read(request)
        if kind is AppendRequest:
            if self.appender is None:
                raise ClusterError("this node takes no forwarded writes")
            return await self.appender(request)
        if kind is GroupRequest:  # (on the bus it is the client command XGROUP, run by the front-end)
            raise ClusterError("this node takes no forwarded group changes")
        return self.serve_now(request)

    def serve_now(self, request: Request) -> Response:
        """The response to a request that never waits (not a fetch, join, read or append)."""
        kind = type(request)
        try:
            if kind is EpochRequest:
                return self.manager.end_offsets_for_epochs(request)
            if kind is RaftRequest:
                self._controller().deliver(request.messages)
                return Ack()
            if kind is BeatRequest:
                return self.beat(request)
            if kind is ProposeRequest:
                return self.propose(request)
            if kind is PauseRequest:
                return self.pause(request)
            if kind is MoveRequest:
                return self.move(request)
        except ClusterError:
            raise
        except _MALFORMED as e:
            raise BadRequest(str(e)) from None
        raise BadRequest(f"{kind.__name__} is answered by serve()")

    # -- replication ------------------------------------------------------------

    async def fetch(self, request: FetchRequest) -> FetchResponse:
        """A follower's fetch, held until it carries news (new batches, state,
        a high watermark move, topics) or ``max_wait_ms`` passed."""
        deadline = trio.current_time() + min(request.max_wait_ms, FETCH_WAIT_MAX_MS) / 1000
        keys = [TOPICS_CHANGED]  # a new topic: discovered at once
        for part in request.partitions:
            pkey = partition_key(part.topic, part.n)
            keys += [part.topic, pkey, _GROUPS_CHANGED + pkey]
        while True:
            try:
                response, news = self.manager.serve_fetch(request)
            except _MALFORMED as e:
                raise BadRequest(str(e)) from None
            remaining = deadline - trio.current_time()
            if news or remaining <= 0:
                return response
            await self._wait_for_keys(keys, remaining)

    async def _wait_for_keys(self, keys: list[bytes], timeout_s: float) -> None:
        host = self.replication.host if self.replication is not None else None
        if host is None:  # no front-end signals writes (tests): ask again after the wait
            await trio.sleep(timeout_s)
        else:
            await host.wait_for_keys(keys, timeout_s, internal=True)

    async def read(self, request: ReadRequest) -> ReadResponse:
        """Partitions of a topic-wide read another node fans out (or this
        one, for a blocked read): each read here from its committed entries
        (``read_now``). With ``max_wait_ms``, held until one of them has
        entries (its high watermark passed them: the host signals its keys)
        or the time is up (at most ``READ_WAIT_MAX_MS``)."""
        if request.max_wait_ms <= 0:
            return self.read_now(request)
        if any(part.op != READ_AFTER for part in request.parts):
            raise BadRequest("only reads after an ID wait")
        deadline = trio.current_time() + min(request.max_wait_ms, READ_WAIT_MAX_MS) / 1000
        keys = list({key for part in request.parts for key in (part.topic, partition_key(part.topic, part.n))})
        while True:
            response = self.read_now(request)
            remaining = deadline - trio.current_time()
            if remaining <= 0 or any(found.ids for found in response.parts):
                return response
            await self._wait_for_keys(keys, remaining)

    def read_now(self, request: ReadRequest) -> ReadResponse:
        """``read`` at once. ``TryAgain`` when this node does not lead one
        of the partitions (its leadership moved: the asking node's view is
        behind)."""
        manager = self.manager
        check_leads(manager, request.parts)
        topics = manager.registry
        return ReadResponse(tuple(read_part(topics.stream_of(p.topic, p.n), p) for p in request.parts))

    def pause(self, request: PauseRequest) -> PauseResponse:
        """A manual failover: refuse writes to the shard for ``ms`` and say
        where its partitions end."""
        m = self.manager
        if not 0 <= request.ms <= PAUSE_MAX_MS:
            raise BadRequest(f"expected a pause of 0 to {PAUSE_MAX_MS} ms")
        if not 0 <= request.shard < m.placement.shard_count or m.state.leader(request.shard) != m.my_id:
            raise ClusterError("this node does not lead that shard")
        if m.state.epoch(request.shard) != request.epoch:
            raise ClusterError("stale epoch")
        m.pause(request.shard, request.ms)
        return PauseResponse(m.shard_ends(request.shard))

    def move(self, request: MoveRequest) -> Ack:
        """The controller asks this node to take a shard back (the move runs in the background)."""
        m = self.manager
        if not 0 <= request.shard < m.placement.shard_count or m.my_id not in m.placement.replicas(request.shard):
            raise ClusterError("this node holds no replica of that shard")
        self._replication().move_in_background(request.shard)
        return Ack()

    # -- the controller quorum --------------------------------------------------------

    def beat(self, request: BeatRequest) -> BeatResponse:
        controller = self._controller()
        if request.node not in controller.placement.by_id:
            raise BadRequest(f"unknown node {request.node}")
        if any(not 0 <= s < controller.placement.shard_count for s in request.offline):
            raise BadRequest(f"unknown shard in {','.join(map(str, request.offline))!r}")
        committed = controller.beat(request.node, request.incarnation, request.offline)
        if committed is None:
            raise NotController()
        return BeatResponse(committed)

    def propose(self, request: ProposeRequest) -> Ack:
        controller = self._controller()
        Metadata.check_record(request.record)  # ValueError: malformed
        if not controller.propose_local(request.record):
            raise NotController()
        return Ack()

    async def join(self, request: JoinRequest) -> Ack:
        node = request.node
        if node < 1 or not request.host or not 0 < request.port < 65536 or not 0 < request.bus_port < 65536:
            raise BadRequest("expected a node id >= 1, a host, a port and a bus port")
        try:
            await self._controller().admit(node, request.host, request.port, request.bus_port)
        except (NotReady, ValueError) as e:
            raise ClusterError(f"join of node {node} not committed: {e}") from None
        return Ack()

    def _replication(self) -> Any:
        if self.replication is None:
            raise ClusterError("This instance has cluster support disabled")
        return self.replication

    def _controller(self) -> Any:
        controller = self._replication().controller
        if controller is None:
            raise ClusterError("this node runs no controller")
        return controller
