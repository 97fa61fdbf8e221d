"""What the Kafka APIs of one connection reach: the server's shared Kafka state and the connection's own.

Owns: ``KafkaFront`` (one per server: the API table served, the listeners'
ports, the endpoints every node is reached on, topic IDs as Kafka UUIDs and
back, the cluster id, the classic groups' coordinator and the share
groups and sessions) and ``KafkaContext`` (one per connection: its broker
session, client record, the listener it came through and the address the
client reached, which Metadata names this node by, its SASL
authenticator), and ``Pending``: a
response that waits for its writes' receipt before the connection sends it.

Topic IDs: the broker names each topic with a random hex ID made at its
creation (the same on every node); Kafka names it with a 16-byte UUID. The
UUID is a hash of the topic's name and ID (BLAKE2b), so every node gives the
same one, a topic deleted and created again gets a new one, and a topic made
before IDs existed (ID "") still has one.

Endpoints: on a single node, this node at the address the client connected
to and the listener's port. In a cluster, every node of ``cluster-nodes``
at its entry's host, on the Kafka port its entry names
(``<id>@<host>:<port>@<bus-port>@<kafka-port>``), else on its client port
plus the distance between this node's client port and this listener's port
(every node keeps the same distance: 9092 beside 6379 on every host, or
7001-7003 with 9001-9003 on one machine). The TLS listener's ports are
always derived so.

Must not know: the wire format of any API (the API modules'), sockets.
"""

from __future__ import annotations

import hashlib
import uuid
from typing import Any, Callable, NamedTuple

from server.kafka.errors import NONE as NO_ERROR
from server.kafka.records import UNCOMPRESSED_MAX_BYTES_DEFAULT
from server.kafka_front.consumer_groups import ConsumerCoordinator
from server.kafka_front.groups import Coordinator
from server.kafka_front.offsets import OffsetStore, offsets_key
from server.kafka_front.share_groups import ShareGroups, ShareSessions

ZERO_UUID = uuid.UUID(int=0)


class Endpoint(NamedTuple):
    node_id: int
    host: str
    port: int


class Pending:
    """A response whose writes wait for their receipt (fsync, acks=all):
    the connection settles ``receipt`` (at most ``timeout_ms`` for the
    replicas), then sends ``finish(error)``'s body (``error``: the failure,
    or None); ``close_on_error``: no response at all (acks=0), and a
    failure closes the connection, as Kafka does. ``marks``: what the wait
    for the in-sync replicas must see, taken as the handler returns (the
    wait starts once the responses before it are sent: ``Replication.ack_marks``)."""

    __slots__ = ("receipt", "timeout_ms", "finish", "silent", "marks")

    def __init__(self, receipt: Any, timeout_ms: int, finish: Callable[[BaseException | None], Any],
                 silent: bool = False) -> None:
        self.receipt = receipt
        self.timeout_ms = timeout_ms
        self.finish = finish
        self.silent = silent
        self.marks: dict | None = None


class KafkaFront:
    """One per server: every Kafka connection's shared state (module docstring)."""

    def __init__(self, server: Any, served: dict[int, tuple[int, int]], port: int, tls_port: int) -> None:
        self.server = server
        self.served = served
        self.ports = {False: port, True: tls_port}
        self.records_max_bytes = UNCOMPRESSED_MAX_BYTES_DEFAULT  # a produced batch inflates to at most this
        self._ids_generation = -1
        self._uuids: dict[bytes, uuid.UUID] = {}
        self._names: dict[uuid.UUID, bytes] = {}
        directory = getattr(getattr(server, "config", None), "dir", None)
        self.groups = Coordinator(OffsetStore(server, directory) if directory else None)
        # KIP-848 groups; the classic coordinator asks it about a group id's type
        self.consumer_groups = self.groups.consumer = ConsumerCoordinator(getattr(server, "config", None))
        self.share_groups = ShareGroups()  # KIP-932: membership here, records in Redis groups
        self.share_sessions = ShareSessions()
        if server is not None:
            server.kafka_groups = self.groups  # TOPIC GROUPS shows them beside Redis groups

    @property
    def config(self) -> Any:
        return self.server.config

    # -- topic IDs ------------------------------------------------------------------

    @staticmethod
    def uuid_of(name: bytes, topic_id: str) -> uuid.UUID:
        digest = hashlib.blake2b(name + b"\0" + topic_id.encode(), digest_size=16).digest()
        found = uuid.UUID(bytes=digest)
        return found if found.int > 1 else uuid.UUID(int=2)  # 0 and 1 are reserved by Kafka

    def _refresh_ids(self, session: Any) -> None:
        generation = session.topics_generation()
        if generation == self._ids_generation:
            return
        self._uuids = {name: self.uuid_of(name, layout.topic_id)
                       for name, layout in session.record_topics().items() if layout is not None}
        self._names = {u: name for name, u in self._uuids.items()}
        self._ids_generation = generation

    def topic_uuid(self, session: Any, name: bytes) -> uuid.UUID:
        self._refresh_ids(session)
        return self._uuids.get(name, ZERO_UUID)

    def topic_name(self, session: Any, topic_uuid: uuid.UUID) -> bytes | None:
        self._refresh_ids(session)
        return self._names.get(topic_uuid)

    # -- nodes ------------------------------------------------------------------------

    def cluster_id(self) -> str:
        return "partita"

    def endpoints(self, ctx: "KafkaContext") -> list[Endpoint]:
        """Every node as a client of ``ctx``'s listener reaches it (module docstring)."""
        session = ctx.session
        port = self.ports[ctx.tls]
        nodes = session.record_nodes()
        if not nodes:
            return [Endpoint(session.node_id(), ctx.local_host, port)]
        me = session.node_id()
        mine = next((n for n in nodes if n.id == me), None)
        distance = port - (mine.port if mine is not None else self.config.port)
        return [Endpoint(n.id, n.host, n.kafka_port if n.kafka_port and not ctx.tls else n.port + distance)
                for n in nodes]

    def endpoint_of(self, ctx: "KafkaContext", node_id: int) -> Endpoint | None:
        return next((e for e in self.endpoints(ctx) if e.node_id == node_id), None)

    def coordinator_of(self, ctx: "KafkaContext", group_id: str) -> Endpoint | None:
        """The node coordinating ``group_id``: the leader of its offsets stream's hash slot, the
        group id's own (for an id without a ``{...}`` hash tag), None: no leader now."""
        node = ctx.session.key_leader(offsets_key(group_id))
        return self.endpoint_of(ctx, node) if node >= 0 else None

    def coordinates(self, ctx: "KafkaContext", group_id: str) -> bool:
        """Whether this node coordinates ``group_id`` (else the APIs answer NOT_COORDINATOR)."""
        return ctx.session.key_leader(offsets_key(group_id)) == ctx.session.node_id()


class KafkaContext:
    """One Kafka connection's handle for its API handlers."""

    __slots__ = ("front", "server", "session", "client", "tls", "local_host", "sasl")

    def __init__(self, front: KafkaFront, session: Any, client: Any, tls: bool, local_host: str) -> None:
        self.front = front
        self.server = front.server
        self.session = session
        self.client = client
        self.tls = tls
        self.local_host = local_host
        self.sasl: Any = None  # the connection's ``sasl.Authenticator``

    @property
    def config(self) -> Any:
        return self.server.config


__all__ = ["KafkaFront", "KafkaContext", "Pending", "Endpoint", "ZERO_UUID", "NO_ERROR"]
