"""The Kafka ports: ``kafka-port`` (plain) and ``kafka-tls-port`` (TLS), on the ``bind`` addresses.

Owns: binding them (before the data directory is touched, as the other
ports), the ``KafkaFront`` the app hands every Kafka connection, the accept
loops (the shared ``server.listener.accept_loop``: ``maxclients`` counts
Kafka clients too; one past it is closed without a word, which a Kafka
client reads as a broker to retry), and what the start-up log says: the
ports, a cluster node whose ``kafka-port`` is not the one its
``cluster-nodes`` entry names (the others tell clients the entry's), and
whether clients must authenticate (SASL: ``sasl``).

Both are off by default (0): two servers on one machine (tests, a
cluster's nodes) would otherwise fight over 9092, and a server opens a
second protocol to the network only when asked. ``--kafka-port 9092``
turns it on; its clients are the RESP port's ACL users (SASL PLAIN and
SCRAM-SHA-256), so it opens no access the RESP port does not.

Must not know: what the APIs do, the frames.
"""

from __future__ import annotations

import functools
import logging
import socket
import ssl
from typing import Any

from server import tls
from server.kafka_front.apis import SERVED
from server.kafka_front.connection import KafkaConnection
from server.kafka_front.context import KafkaFront
from server.kafka_front.sasl import MECHANISMS
from server.listener import accept_loop, bind_sockets

log = logging.getLogger("partita.kafka")


def bind(config: Any) -> tuple[list[socket.socket], list[socket.socket], ssl.SSLContext | None]:
    """``(plain sockets, TLS sockets, TLS context)``; empty when the ports are 0."""
    plain = bind_sockets(config.bind, config.kafka_port, "kafka-port") if config.kafka_port else []
    if not config.kafka_tls_port:
        return plain, [], None
    try:
        context = tls.make_server_context(config, "kafka-tls-port")
        secure = bind_sockets(config.bind, config.kafka_tls_port, "kafka-tls-port")
    except BaseException:
        for sock in plain:
            sock.close()
        raise
    return plain, secure, context


def make_front(state: Any, plain: list[socket.socket], secure: list[socket.socket]) -> KafkaFront:
    port = plain[0].getsockname()[1] if plain else 0
    tls_port = secure[0].getsockname()[1] if secure else 0
    return KafkaFront(state, dict(SERVED), port, tls_port)


def start_accepting(accepts: Any, state: Any, front: KafkaFront, plain: list[socket.socket],
                    secure: list[socket.socket], context: ssl.SSLContext | None,
                    conn_nursery: Any, connections: set) -> None:
    for sock in plain:
        accepts.start_soon(functools.partial(
            accept_loop, state, sock, conn_nursery, connections,
            lambda s, client: KafkaConnection(front, s, client), refusal=b""))
    for sock in secure:
        accepts.start_soon(functools.partial(
            accept_loop, state, sock, conn_nursery, connections,
            lambda s, client: KafkaConnection(front, s, client, context), refusal=b""))


def log_ports(state: Any, front: KafkaFront, plain: list[socket.socket], secure: list[socket.socket],
              text: Any) -> None:
    """The start-up lines (``text(sock)``: how the app writes an address)."""
    config = state.config
    for socks, name in ((plain, "kafka-port"), (secure, "kafka-tls-port")):
        if socks:
            log.info("Kafka protocol listening%s on %s, %s=%d", " (TLS)" if name != "kafka-port" else "",
                     ", ".join(text(s) for s in socks), name, socks[0].getsockname()[1])
    if not plain and not secure:
        return
    if config.cluster_nodes and plain:
        from cluster.nodes import parse_cluster_nodes

        mine = next((n for n in parse_cluster_nodes(config.cluster_nodes) if n.id == config.node_id), None)
        if mine is not None and mine.kafka_port and mine.kafka_port != front.ports[False]:
            log.warning("kafka-port is %d but this node's cluster-nodes entry names Kafka port %d, which "
                        "every node tells Kafka clients: make sure it reaches this node", front.ports[False],
                        mine.kafka_port)
    if not state.acl.default_authenticated():
        log.info("The default user needs a password (requirepass / ACL): Kafka clients must authenticate with "
                 "SASL (%s) as an ACL user", ", ".join(MECHANISMS))
