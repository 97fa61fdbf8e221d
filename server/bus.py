"""The cluster bus: the port cluster nodes talk to each other on.

Owns: which port that is (``cluster-port``, else this node's ``cluster-nodes``
entry: ``<id>@<host>:<port>@<bus-port>``, or ``port + 10000`` as Redis
Cluster's bus), binding it on the ``bind`` addresses, the bus's command table
(the internal ``peer`` commands of server/commands/cluster.py, plus XADD for
a forwarded write and PING / QUIT), its connections' clients (not in CLIENT
LIST, not counted against ``maxclients``) and their authentication: with
``cluster-secret`` set a bus connection runs nothing before ``REPLAUTH
<secret>``; without one the bus is unauthenticated, which the start-up log
says. A wrong secret is logged with the peer's address, never what it sent.

Every internal command (fetches, the controller's Raft messages, heartbeats,
proposals, forwarded writes, failover pauses) goes over the bus; the client
port does not know them (Redis's unknown-command error, absent from
COMMAND), as Redis Cluster and Kafka keep their inter-node traffic off the
client listener.

Must not know: what the internal commands do (server/commands/cluster.py),
RESP bytes (server/connection.py serves a bus connection as any other).
"""

from __future__ import annotations

import itertools
import logging
import socket
import time
from typing import Any

from cluster.nodes import bus_port_of, parse_cluster_nodes
from server.listener import bind_sockets
from server.registry import COMMANDS, PEER_COMMANDS, CommandSpec
from server.state import Client

log = logging.getLogger("partita.bus")

# Client commands a peer also sends on the bus: a forwarded XADD
# (server/forwarding.py), and PING / QUIT for tools checking the port.
SHARED = ("xadd", "ping", "quit")
REFUSED_LOG_S = 10.0  # wrong secrets are logged at most this often

_ids = itertools.count(1)
_refused_logged = [-REFUSED_LOG_S]


def port(config: Any) -> int:
    """This node's cluster bus port (ClusterConfigError when the config has none)."""
    return bus_port_of(parse_cluster_nodes(config.cluster_nodes), config.node_id, config.cluster_port)


def bind(config: Any) -> list[socket.socket]:
    """The bus's listening sockets on the ``bind`` addresses; none on a single node."""
    if not config.cluster_nodes:
        return []
    return bind_sockets(config.bind, port(config))


def commands() -> dict[str, CommandSpec]:
    """The bus's command table."""
    table = dict(PEER_COMMANDS)
    table.update((name, COMMANDS[name]) for name in SHARED)
    return table


def new_client(config: Any, addr: str, laddr: str, fd: int) -> Client:
    """A bus connection's client: authenticated at once without a secret,
    after REPLAUTH with one. Peers are not users: no ACL applies."""
    client = Client(next(_ids), addr, laddr, fd)
    client.authenticated = not config.cluster_secret
    return client


def note_refused(addr: str) -> None:
    """A bus connection presented a wrong cluster secret (logged rate-limited,
    with the address only)."""
    now = time.monotonic()
    if now - _refused_logged[0] >= REFUSED_LOG_S:
        _refused_logged[0] = now
        log.warning("cluster bus: %s presented a wrong cluster-secret (REPLAUTH refused)", addr)


def warn_if_unauthenticated(config: Any, sockets: list[socket.socket], logger: logging.Logger) -> None:
    """The start-up warning for a bus anyone who reaches it may use."""
    if sockets and not config.cluster_secret:
        addrs = ", ".join(sorted({s.getsockname()[0] for s in sockets}))
        logger.warning("# WARNING: the cluster bus (port %d on %s) is unauthenticated: anyone who can connect "
                       "to it can fetch data and take part in the controller quorum. Set the same "
                       "cluster-secret on every node, or keep the bus on a trusted network.",
                       sockets[0].getsockname()[1], addrs)
