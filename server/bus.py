"""The cluster bus: the port cluster nodes talk to each other on.

Owns: which port that is (``cluster-port``, else this node's ``cluster-nodes``
entry: ``<id>@<host>:<port>@<bus-port>``, or ``port + 10000`` as Redis
Cluster's bus), binding it on the ``bind`` addresses, the bus's command table
(the internal ``peer`` commands declared below, plus XADD and XGROUP for
forwarded writes and PING / QUIT), its connections' clients (not in CLIENT LIST, not
counted against ``maxclients``, never closed by the idle ``timeout``) and their authentication: with
``cluster-secret`` set a bus connection runs nothing before ``REPLAUTH
<secret>``; without one the bus is unauthenticated, which the start-up log
says. A wrong secret is logged with the peer's address, never what it sent.

Each internal command carries one message of cluster/peer/messages.py: its
handler decodes the arguments (server/peer_resp.py), has the cluster's
``PeerService`` answer the typed request, and encodes the response. A
request that does not decode, or names what does not exist, gets ``-ERR
malformed <NAME> request: <why>``; the service's other refusals become
their Redis texts (server/failures.py). What no peer sends (a malformed
request, a command the bus does not serve or of the wrong arity) is a
stranger's: after its error the connection closes, logged
(``close_stranger``, rate-limited). A forwarded append arrives as the
XADD command itself and runs as any XADD, with the bus connection's
durability and acks=all waits before its reply; a forwarded group change
(a topic's XGROUP, one partition) likewise as
XGROUP. A member's read of partitions this node leads, from the group's
coordinator (``GROUPREAD``), runs in the bus connection's broker session
too, so its reply waits for the durability and acks=all replication of the
PEL changes it made, as a client's XREADGROUP does; so does a topic's
group views' request (``GROUPINFO``: its partitions' groups, and on the
coordinator the memberships, synced first).

Every internal command (fetches, the controller's Raft messages, heartbeats,
proposals, forwarded writes and fanned-out reads, failover pauses) goes over the bus; the client
port does not know them (Redis's unknown-command error, absent from
COMMAND), as Redis Cluster and Kafka keep their inter-node traffic off the
client listener.

Must not know: what the internal commands do (cluster/peer/service.py),
their RESP form (server/peer_resp.py), RESP bytes (server/connection.py
serves a bus connection as any other).
"""

from __future__ import annotations

import hmac
import itertools
import logging
import socket
import time
from typing import Any

from cluster.errors import BadRequest
from cluster.nodes import bus_port_of, parse_cluster_nodes
from server import peer_resp
from server.errors import CommandError, err, wrong_arity
from server.listener import bind_sockets
from server.registry import DECLARED, PEER_DECLARED, CommandTable, command, redact_from
from server.reply import OK
from server.state import Client

log = logging.getLogger("partita.bus")

# Client commands a peer also sends on the bus: a forwarded XADD and XGROUP
# (cluster/runtime/forwarding.py), and PING / QUIT for tools checking the port.
SHARED = ("xadd", "xgroup", "ping", "quit")
REFUSED_LOG_S = 10.0  # wrong secrets are logged at most this often

STRANGER_LOG_S = 10.0  # connections closed for what no peer sends are logged at most this often

_ids = itertools.count(1)
_refused_logged = [-REFUSED_LOG_S]
_stranger_logged = [-STRANGER_LOG_S]


def port(config: Any) -> int:
    """This node's cluster bus port (ClusterConfigError when the config has none)."""
    return bus_port_of(parse_cluster_nodes(config.cluster_nodes), config.node_id, config.cluster_port)


def bind(config: Any) -> list[socket.socket]:
    """The bus's listening sockets on the ``bind`` addresses; none on a single node."""
    if not config.cluster_nodes:
        return []
    return bind_sockets(config.bind, port(config), "cluster-port")


def table() -> CommandTable:
    """A new table of the bus's commands: the peers' own and the few shared
    with the client port (``SHARED``)."""
    commands = dict(PEER_DECLARED)
    commands.update((name, DECLARED[name]) for name in SHARED)
    return CommandTable(commands, on_refused=lambda ctx, error: close_stranger(ctx.client, error.message))


def new_client(config: Any, addr: str, laddr: str, fd: int) -> Client:
    """A bus connection's client: authenticated at once without a secret,
    after REPLAUTH with one. Peers are not users: no ACL applies."""
    client = Client(next(_ids), addr, laddr, fd)
    client.authenticated = not config.cluster_secret
    client.peer = True
    return client


def note_refused(addr: str) -> None:
    """A bus connection presented a wrong cluster secret (logged rate-limited,
    with the address only)."""
    now = time.monotonic()
    if now - _refused_logged[0] >= REFUSED_LOG_S:
        _refused_logged[0] = now
        log.warning("cluster bus: %s presented a wrong cluster-secret (REPLAUTH refused)", addr)


def close_stranger(client: Client, why: str) -> None:
    """A bus connection sent what no peer of this version sends (an unknown
    command, one of the wrong arity, a request that does not decode): after
    the error reply the connection closes, and it is logged (rate-limited,
    with the address and the first 200 characters of why). The node and its
    other connections go on as they were."""
    client.close_after_reply = True
    now = time.monotonic()
    if now - _stranger_logged[0] >= STRANGER_LOG_S:
        _stranger_logged[0] = now
        shown = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in why[:200])
        log.warning("cluster bus: closing the connection from %s, which sent what no peer sends: %s",
                    client.addr, shown)


def warn_if_unauthenticated(config: Any, sockets: list[socket.socket], logger: logging.Logger) -> None:
    """The start-up warning for a bus anyone who reaches it may use."""
    if sockets and not config.cluster_secret:
        addrs = ", ".join(sorted({s.getsockname()[0] for s in sockets}))
        logger.warning("# WARNING: the cluster bus (port %d on %s) is unauthenticated: anyone who can connect "
                       "to it can fetch data and take part in the controller quorum. Set the same "
                       "cluster-secret on every node, or keep the bus on a trusted network.",
                       sockets[0].getsockname()[1], addrs)


# -- the internal commands ----------------------------------------------------------

_MALFORMED = (ValueError, IndexError, KeyError, TypeError)


def _malformed(ctx, name: str, why: str) -> CommandError:
    """``-ERR malformed <NAME> request: <why>``, and the connection closes."""
    error = err(f"malformed {name} request: {why}")
    close_stranger(ctx.client, error.message)
    return error


def _request(ctx, name: str, argv: list[bytes], max_args: int) -> Any:
    if max_args and len(argv) > max_args:
        error = wrong_arity(name.lower())
        close_stranger(ctx.client, error.message)
        raise error
    try:
        return peer_resp.decode_request(argv)
    except _MALFORMED as e:
        raise _malformed(ctx, name, str(e)) from None


def _service(ctx) -> Any:
    replication = ctx.server.replication
    if replication is None:
        raise err("This instance has cluster support disabled")
    return replication.service


def _peer(name: str, syntax: str, *, arity: int, flags: str, summary: str, waits: bool = False,
          max_args: int = 0) -> None:
    """Declare the internal command ``name``: decode, serve, encode."""
    common = dict(arity=arity, flags=flags, group="cluster", since="7.0.0", summary=summary, syntax=syntax,
                  acl_categories=("admin", "fast" if "fast" in flags else "slow", "dangerous"), peer=True)
    if waits:
        async def handler(ctx, argv):
            service = _service(ctx)
            request = _request(ctx, name, argv, max_args)
            try:
                return peer_resp.encode_response(await service.serve(request))
            except BadRequest as e:
                raise _malformed(ctx, name, e.message) from None
    else:
        def handler(ctx, argv):
            service = _service(ctx)
            request = _request(ctx, name, argv, max_args)
            try:
                return peer_resp.encode_response(service.serve_now(request))
            except BadRequest as e:
                raise _malformed(ctx, name, e.message) from None
    handler.__name__ = name.lower()
    handler.__doc__ = syntax
    command(name.lower(), waits=waits, **common)(handler)


_peer("REPLPAUSE", "REPLPAUSE shard epoch milliseconds", arity=4, flags="admin stale",
      summary="Internal: a manual failover pauses writes to a shard and asks for its end offsets.")
_peer("REPLFETCH", "REPLFETCH replica view max-wait-ms max-bytes topics-token "
      "[topic partition topic-id offset epoch state-version group-position ...]", arity=-6, flags="admin stale",
      summary="Internal: a follower fetches stored batches from this leader (long poll).", waits=True)
_peer("REPLEPOCH", "REPLEPOCH topic partition epoch [topic partition epoch ...]", arity=-4, flags="admin stale",
      summary="Internal: the end offset of a leader epoch per partition (KIP-101).")
_peer("REPLREAD", "REPLREAD max-wait-ms topic partition op start-id end-id count "
      "[topic partition op start-id end-id count ...]", arity=-8, flags="admin stale",
      summary="Internal: partitions of a topic-wide read another node fans out, from committed entries "
      "(a long poll with max-wait-ms).", waits=True)
_peer("RAFT", "RAFT message [message ...]", arity=-2, flags="admin stale fast",
      summary="Internal: Raft messages of the controller quorum from a peer.")
# The reply is the controller's commit index: the node counts the beat for
# its lease once it has applied the metadata that far.
_peer("CTRLBEAT", "CTRLBEAT node incarnation [offline-shard[,offline-shard...]]", arity=-3, flags="admin stale fast",
      summary="Internal: a node's heartbeat to the elected controller.", max_args=4)
_peer("CTRLPROPOSE", "CTRLPROPOSE record", arity=2, flags="admin stale fast",
      summary="Internal: a metadata change for the elected controller to commit.")
_peer("CTRLJOIN", "CTRLJOIN node host port bus-port", arity=5, flags="admin stale",
      summary="Internal: a node started with cluster-join asks to be taken into the cluster.", waits=True)
_peer("CTRLMOVE", "CTRLMOVE shard", arity=2, flags="admin stale fast",
      summary="Internal: the controller asks this node to take back a shard it prefers to lead.")


@command("groupread", arity=-12, flags="admin stale", group="cluster", since="7.0.0",
         acl_categories=("admin", "slow", "dangerous"), peer=True,
         summary="Internal: the coordinator of a topic's consumer group has this leader serve a member's read "
         "of its partitions.",
         syntax="GROUPREAD topic partition group consumer op count noack claim-ms after take-over redeliver "
         "[topic partition ... ...]")
def groupread(ctx, argv):
    """GROUPREAD topic partition group consumer op count noack claim-ms after take-over redeliver [...]

    Run by the broker session of the bus connection
    (``TopicGroupOps.serve_group_parts``): the group writes it makes are
    durable and replicated before the reply, as an XREADGROUP's."""
    request = _request(ctx, "GROUPREAD", argv, 0)
    try:
        return peer_resp.encode_response(ctx.session.serve_group_parts(request))
    except BadRequest as e:
        raise _malformed(ctx, "GROUPREAD", e.message) from None


@command("groupinfo", arity=-5, flags="admin stale", group="cluster", since="7.0.0",
         acl_categories=("admin", "slow", "dangerous"), peer=True,
         summary="Internal: a topic's consumer groups on the partitions this node leads (and on the group "
         "coordinator, their memberships), for XINFO GROUPS / CONSUMERS and TOPIC GROUPS on another node.",
         syntax="GROUPINFO topic members only-given only [partition ...]")
def groupinfo(ctx, argv):
    """GROUPINFO topic members only-given only [partition ...]

    Run by the broker session of the bus connection
    (``TopicGroupOps.serve_group_info``): what syncing the memberships
    writes (dead members' partitions handed over) is durable and replicated
    before the reply."""
    request = _request(ctx, "GROUPINFO", argv, 0)
    try:
        return peer_resp.encode_response(ctx.session.serve_group_info(request))
    except BadRequest as e:
        raise _malformed(ctx, "GROUPINFO", e.message) from None


@command("replauth", arity=2, flags="admin stale fast no_auth", group="cluster", since="7.0.0",
         acl_categories=("admin", "fast", "dangerous"),
         summary="Internal: a peer presents the cluster secret before any other command on the bus.",
         syntax="REPLAUTH secret", peer=True, redact=redact_from(1))
def replauth(ctx, argv):
    """REPLAUTH secret

    The cluster bus's authentication: with ``cluster-secret`` set, a bus
    connection runs nothing else until it presented the secret (compared in
    constant time). A wrong one is refused and logged (without what was
    sent, rate-limited)."""
    secret = ctx.server.config.cluster_secret
    if not secret:
        raise err("REPLAUTH called without a cluster-secret configured on this node. "
                  "Are you sure the configuration is the same on every node?")
    if not hmac.compare_digest(argv[1], secret.encode()):
        note_refused(ctx.client.addr)
        raise CommandError("NOPERM", "invalid cluster secret")
    ctx.client.authenticated = True
    return OK
