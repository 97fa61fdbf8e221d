"""Cluster and replication commands: CLUSTER ..., WAIT, and the internal
REPLAUTH / REPLFETCH / REPLEPOCH / REPLPAUSE followers and peers use, and
RAFT / CTRLBEAT / CTRLPROPOSE / CTRLMOVE / CTRLJOIN of the controller quorum.

The internal ones are ``peer`` commands: they exist on the cluster bus only
(server/bus.py); the client port answers them as Redis answers any unknown
command. On the bus, with a ``cluster-secret``, a connection runs nothing
before REPLAUTH presented it.

Owns: these handlers' arguments and replies. What they do is
``cluster.replica_manager`` (fetch serving, truncation answers, leadership)
and ``server.replication`` (acks, WAIT, links).

Routing replies follow Redis Cluster: a node id is 40 hex characters (the
configured node id, zero-padded), CLUSTER SLOTS lists each shard's slot
range with its leader first and its followers after, CLUSTER NODES shows a
node as ``master`` of the slots it leads. A Partita node leads some shards
and follows others at once, which Redis's one-role-per-node output cannot
say; INFO replication has the per-partition roles.

Must not know: sockets, storage formats.
"""

from __future__ import annotations

import hmac

import trio

from cluster.controller.metadata import Metadata
from cluster.nodes import SLOTS, key_slot
from server.args import parse_int
from server.errors import CommandError, err, wrong_arity
from server.registry import command, container
from server.controller import NotReady
from server.bus import note_refused
from server.replication import TOPICS_CHANGED, FailoverError
from server.reply import OK, Map, Simple, Verbatim

DISABLED = err("This instance has cluster support disabled")


def _not_controller() -> CommandError:
    return CommandError("NOTCONTROLLER", "this node is not the elected controller")


def _repl(ctx):
    repl = ctx.server.replication
    if repl is None:
        raise DISABLED
    return repl


class _Malformed:
    """``with _Malformed("REPLFETCH"):`` — a peer's request that does not parse
    is refused with a clear error, not reported as an internal error."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, exc, tb) -> bool:
        if kind is not None and issubclass(kind, (ValueError, IndexError, KeyError, TypeError)):
            raise err(f"malformed {self.name} request: {exc}") from None
        return False


def node_name(node_id: int) -> str:
    return f"{node_id:040x}"


container("cluster", group="cluster", since="3.0.0",
          summary="A container for Redis Cluster commands.", acl_categories=("slow",))


@command("cluster|myid", arity=2, flags="stale", group="cluster", since="3.0.0",
         acl_categories=("slow",), summary="Returns the ID of a node.", syntax="CLUSTER MYID")
def cluster_myid(ctx, argv):
    """CLUSTER MYID"""
    return node_name(_repl(ctx).manager.my_id)


@command("cluster|keyslot", arity=3, flags="stale", group="cluster", since="3.0.0",
         acl_categories=("slow",), summary="Returns the hash slot for a key.", syntax="CLUSTER KEYSLOT key")
def cluster_keyslot(ctx, argv):
    """CLUSTER KEYSLOT key"""
    _repl(ctx)
    return key_slot(argv[2])


def _node_entry(node) -> list:
    return [node.host, node.port, node_name(node.id)]


def _shard_table(m) -> list[tuple[int, int, list]]:
    """Each shard's ``(first slot, last slot, nodes)``, its leader first."""
    table = []
    for s in range(m.placement.shard_count):
        leader = m.state.leader(s)
        ids = [leader] + [r for r in m.placement.replicas(s) if r != leader]
        table.append((*m.placement.slot_range(s), [m.placement.by_id[i] for i in ids]))
    return table


def _current_epoch(m) -> int:
    return max(m.state.epoch(s) for s in range(m.placement.shard_count))


@command("cluster|slots", arity=2, flags="stale", group="cluster", since="3.0.0",
         acl_categories=("slow",), summary="Returns the mapping of cluster slots to nodes.",
         syntax="CLUSTER SLOTS")
def cluster_slots(ctx, argv):
    """CLUSTER SLOTS"""
    return [[first, last] + [_node_entry(node) for node in nodes]
            for first, last, nodes in _shard_table(_repl(ctx).manager)]


@command("cluster|shards", arity=2, flags="stale", group="cluster", since="7.0.0",
         acl_categories=("slow",), summary="Returns the mapping of cluster slots to shards.",
         syntax="CLUSTER SHARDS")
def cluster_shards(ctx, argv):
    """CLUSTER SHARDS"""
    out = []
    for first, last, nodes in _shard_table(_repl(ctx).manager):
        fenced = _repl(ctx).manager.state.fenced
        described = [Map([(b"id", node_name(node.id)), (b"port", node.port), (b"ip", node.host),
                          (b"endpoint", node.host), (b"role", "master" if i == 0 else "replica"),
                          (b"replication-offset", 0), (b"health", "fail" if node.id in fenced else "online")])
                     for i, node in enumerate(nodes)]
        out.append(Map([(b"slots", [first, last]), (b"nodes", described)]))
    return out


@command("cluster|nodes", arity=2, flags="stale", group="cluster", since="3.0.0",
         acl_categories=("slow",), summary="Returns the cluster configuration for a node.",
         syntax="CLUSTER NODES")
def cluster_nodes(ctx, argv):
    """CLUSTER NODES"""
    m = _repl(ctx).manager
    table = _shard_table(m)
    epoch = _current_epoch(m)
    lines = []
    for node in m.placement.nodes:
        flags = ("myself," if node.id == m.my_id else "") + "master" + (",fail" if node.id in m.state.fenced else "")
        slots = [f"{first}-{last}" for first, last, nodes in table if nodes[0] is node]
        lines.append(f"{node_name(node.id)} {node.entry} {flags} - 0 0 {epoch} connected"
                     + (" " + " ".join(slots) if slots else ""))
    return Verbatim("\n".join(lines) + "\n")


@command("cluster|info", arity=2, flags="stale", group="cluster", since="3.0.0",
         acl_categories=("slow",), summary="Returns information about the state of a node.",
         syntax="CLUSTER INFO")
def cluster_info(ctx, argv):
    """CLUSTER INFO"""
    m = _repl(ctx).manager
    epoch = _current_epoch(m)
    failed = sum(last - first + 1 for first, last, nodes in _shard_table(m) if nodes[0].id in m.state.fenced)
    lines = [f"cluster_state:{'fail' if failed else 'ok'}", f"cluster_slots_assigned:{SLOTS}",
             f"cluster_slots_ok:{SLOTS - failed}", "cluster_slots_pfail:0", f"cluster_slots_fail:{failed}",
             f"cluster_known_nodes:{len(m.placement.nodes)}", f"cluster_size:{m.placement.shard_count}",
             f"cluster_current_epoch:{epoch}", f"cluster_my_epoch:{epoch}"]
    return Verbatim("\r\n".join(lines) + "\r\n")


@command("cluster|help", arity=2, flags="loading stale", group="cluster", since="5.0.0",
         acl_categories=("slow",), summary="Returns helpful text about the different subcommands.",
         syntax="CLUSTER HELP")
def cluster_help(ctx, argv):
    """CLUSTER HELP"""
    return [Simple(line) for line in (
        "CLUSTER <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
        "FAILOVER [FORCE|TAKEOVER]", "    Make this replica the leader of the shard it follows (manual failover).",
        "REASSIGN <slot> <node-id> [<node-id> ...]",
        "    Move the slot range holding <slot> to these replicas, the first its preferred leader.",
        "INFO", "    Return information about the cluster.",
        "KEYSLOT <key>", "    Return the hash slot for <key>.",
        "MYID", "    Return the node id.",
        "NODES", "    Return cluster configuration seen by node.",
        "SHARDS", "    Return information about slot range mappings and the nodes associated with them.",
        "SLOTS", "    Return information about slots range mappings.",
        "HELP", "    Print this help.")]


@command("cluster|failover", arity=-2, flags="admin stale no_async_loading", group="cluster", since="3.0.0",
         acl_categories=("admin", "slow", "dangerous"),
         summary="Forces a replica to perform a manual failover of its master.",
         syntax="CLUSTER FAILOVER [FORCE | TAKEOVER]", waits=True)
async def cluster_failover(ctx, argv):
    """CLUSTER FAILOVER [FORCE | TAKEOVER]

    On a follower: take over every shard this node follows (see
    ``Replication.take_shard``; the controller commits the change). A shard whose leader answers always moves the
    coordinated way, waiting until this node holds everything the leader
    has. FORCE / TAKEOVER only change what happens to a shard whose leader
    does not answer (it died): this node takes it over with what it has —
    every acks=all entry if it was in the ISR, otherwise possibly less (an
    unclean election, as Redis's FORCE on a replica that lagged).
    """
    repl = _repl(ctx)
    mode = argv[2].upper() if len(argv) > 2 else b""
    if len(argv) > 3 or mode not in (b"", b"FORCE", b"TAKEOVER"):
        raise err("syntax error")
    m = repl.manager
    shards = [s for s in m.placement.shards_of(m.my_id) if m.state.leader(s) != m.my_id]
    if not shards:
        raise err("You should send CLUSTER FAILOVER to a replica")
    for shard in shards:
        try:
            await repl.take_shard(shard, force=bool(mode))
        except FailoverError as e:
            raise err(str(e)) from None
    return OK


@command("cluster|reassign", arity=-4, flags="admin stale no_async_loading", group="cluster", since="7.0.0",
         acl_categories=("admin", "slow", "dangerous"),
         summary="Moves the slot range holding a slot to other replicas (Partita).",
         syntax="CLUSTER REASSIGN slot node-id [node-id ...]", waits=True)
async def cluster_reassign(ctx, argv):
    """CLUSTER REASSIGN slot node-id [node-id ...]

    Partita: give the slot range (shard) holding ``slot`` the replicas
    ``node-id ...``, the first its preferred leader. The new replicas fetch
    the shard's partitions like any follower; once all are in sync the
    leadership moves to the first (a coordinated failover, nothing lost)
    and the replicas left out stop holding it. Replies once the move is
    committed; INFO replication shows it (``target=``) until done.
    """
    repl = _repl(ctx)
    m = repl.manager
    slot = parse_int(argv[2])
    if not 0 <= slot < SLOTS:
        raise err("Invalid or out of range slot")
    target: list[int] = []
    for raw in argv[3:]:
        node = parse_int(raw)
        if node not in m.placement.by_id:
            raise err(f"unknown node id {node} (cluster-nodes has "
                      f"{', '.join(str(n.id) for n in m.placement.nodes)})")
        if node in target:
            raise err(f"node id {node} given twice")
        target.append(node)
    shard = m.placement.shard_of_slot(slot)
    try:
        await repl.controller.reassign(shard, target)
    except (NotReady, ValueError) as e:
        first, last = m.placement.slot_range(shard)
        raise err(f"slots {first}-{last}: {e}") from None
    return OK


@command("replauth", arity=2, flags="admin stale fast no_auth", group="cluster", since="7.0.0",
         acl_categories=("admin", "fast", "dangerous"),
         summary="Internal: a peer presents the cluster secret before any other command on the bus.",
         syntax="REPLAUTH secret", peer=True)
def replauth(ctx, argv):
    """REPLAUTH secret

    The cluster bus's authentication: with ``cluster-secret`` set, a bus
    connection runs nothing else until it presented the secret (compared in
    constant time). A wrong one is refused and logged (without what was
    sent, rate-limited: server/bus.py)."""
    secret = ctx.server.config.cluster_secret
    if not secret:
        raise err("REPLAUTH called without a cluster-secret configured on this node. "
                  "Are you sure the configuration is the same on every node?")
    if not hmac.compare_digest(argv[1], secret.encode()):
        note_refused(ctx.client.addr)
        raise CommandError("NOPERM", "invalid cluster secret")
    ctx.client.authenticated = True
    return OK


@command("replpause", arity=4, flags="admin stale", group="cluster", since="7.0.0",
         acl_categories=("admin", "slow", "dangerous"),
         summary="Internal: a manual failover pauses writes to a shard and asks for its end offsets.",
         syntax="REPLPAUSE shard epoch milliseconds", peer=True)
def replpause(ctx, argv):
    """REPLPAUSE shard epoch milliseconds"""
    m = _repl(ctx).manager
    shard, epoch, ms = parse_int(argv[1]), parse_int(argv[2]), parse_int(argv[3])
    if not 0 <= shard < m.placement.shard_count or m.state.leader(shard) != m.my_id:
        raise err("this node does not lead that shard")
    if m.state.epoch(shard) != epoch:
        raise err("stale epoch")
    m.pause(shard, ms)
    return m.shard_ends(shard)


@command("replfetch", arity=-6, flags="admin stale", group="cluster", since="7.0.0",
         acl_categories=("admin", "slow", "dangerous"),
         summary="Internal: a follower fetches stored batches from this leader (long poll).",
         syntax="REPLFETCH replica view max-wait-ms max-bytes topics-token "
                "[topic partition topic-id offset epoch state-version group-position ...]", waits=True, peer=True)
async def replfetch(ctx, argv):
    """REPLFETCH replica view max-wait-ms max-bytes topics-token [topic partition topic-id offset epoch state groups ...]"""
    repl = _repl(ctx)
    m = repl.manager
    wait_s = min(parse_int(argv[3]), 60000) / 1000
    deadline = trio.current_time() + wait_s
    body = argv[6:]
    keys = [TOPICS_CHANGED]  # a new topic: discovered at once
    for i in range(0, len(body) - 6, 7):
        topic, n = body[i], body[i + 1]
        keys += [topic, topic + b"#" + n]
    while True:
        with _Malformed("REPLFETCH"):
            reply, news = m.serve_fetch(argv[1:])
        remaining = deadline - trio.current_time()
        if news or remaining <= 0 or not ctx.may_block:
            return reply
        await ctx.server.wait_for_keys(keys, remaining, internal=True)


@command("replepoch", arity=-4, flags="admin stale", group="cluster", since="7.0.0",
         acl_categories=("admin", "slow", "dangerous"),
         summary="Internal: the end offset of a leader epoch per partition (KIP-101).",
         syntax="REPLEPOCH topic partition epoch [topic partition epoch ...]", peer=True)
def replepoch(ctx, argv):
    """REPLEPOCH topic partition epoch [topic partition epoch ...]"""
    manager = _repl(ctx).manager
    with _Malformed("REPLEPOCH"):
        return manager.end_offsets_for_epochs(argv[1:])


@command("wait", arity=3, flags="noscript", group="generic", since="3.0.0",
         acl_categories=("slow", "connection"),
         summary="Blocks until the asynchronous replication of all preceding write commands "
                 "sent by the connection is completed.",
         syntax="WAIT numreplicas timeout", waits=True)
async def wait(ctx, argv):
    """WAIT numreplicas timeout

    The replicas that hold every entry this client wrote (per partition, the
    fewest over the partitions it wrote); ``timeout`` 0 waits forever, as in
    Redis. On a single node there are no replicas: 0 at once.
    """
    numreplicas = parse_int(argv[1])
    timeout_ms = parse_int(argv[2])
    if timeout_ms < 0:
        raise CommandError("ERR", "timeout is negative")
    repl = ctx.server.replication
    if repl is None:
        return 0
    if not ctx.may_block:
        return repl.replicas_acknowledging(ctx.session)
    return await repl.wait_replicas(ctx.session, numreplicas, timeout_ms / 1000 if timeout_ms else None)


def _controller(ctx):
    return _repl(ctx).controller


@command("raft", arity=-2, flags="admin stale fast", group="cluster", since="7.0.0",
         acl_categories=("admin", "fast", "dangerous"),
         summary="Internal: Raft messages of the controller quorum from a peer.",
         syntax="RAFT message [message ...]", peer=True)
def raft(ctx, argv):
    """RAFT message [message ...]"""
    controller = _controller(ctx)
    with _Malformed("RAFT"):
        controller.deliver(argv[1:])
    return OK


@command("ctrlbeat", arity=-3, flags="admin stale fast", group="cluster", since="7.0.0",
         acl_categories=("admin", "fast", "dangerous"),
         summary="Internal: a node's heartbeat to the elected controller.",
         syntax="CTRLBEAT node incarnation [offline-shard[,offline-shard...]]", peer=True)
def ctrlbeat(ctx, argv):
    """CTRLBEAT node incarnation [offline-shards]: the last argument lists
    the shards the node holds a log of that a failed fsync took offline.
    The reply is the controller's commit index: the node counts the beat
    for its lease once it has applied the metadata that far (so a node
    back from a restart never serves a shard it lost meanwhile)."""
    if len(argv) > 4:
        raise wrong_arity("ctrlbeat")
    controller = _controller(ctx)
    with _Malformed("CTRLBEAT"):
        node = int(argv[1])
        if node not in controller.placement.by_id:
            raise ValueError(f"unknown node {node}")
        offline = [int(s) for s in argv[3].split(b",")] if len(argv) == 4 else []
        if any(not 0 <= s < controller.placement.shard_count for s in offline):
            raise ValueError(f"unknown shard in {argv[3]!r}")
        committed = controller.beat(node, argv[2].decode(), offline)
    if committed is None:
        raise _not_controller()
    return committed


@command("ctrlpropose", arity=2, flags="admin stale fast", group="cluster", since="7.0.0",
         acl_categories=("admin", "fast", "dangerous"),
         summary="Internal: a metadata change for the elected controller to commit.",
         syntax="CTRLPROPOSE record", peer=True)
def ctrlpropose(ctx, argv):
    """CTRLPROPOSE record"""
    controller = _controller(ctx)
    with _Malformed("CTRLPROPOSE"):
        Metadata.check_record(argv[1])
    if not controller.propose_local(argv[1]):
        raise _not_controller()
    return OK


@command("ctrljoin", arity=5, flags="admin stale", group="cluster", since="7.0.0",
         acl_categories=("admin", "slow", "dangerous"),
         summary="Internal: a node started with cluster-join asks to be taken into the cluster.",
         syntax="CTRLJOIN node host port bus-port", waits=True, peer=True)
async def ctrljoin(ctx, argv):
    """CTRLJOIN node host port bus-port"""
    controller = _controller(ctx)
    with _Malformed("CTRLJOIN"):
        node, host, port, bus_port = int(argv[1]), argv[2].decode(), int(argv[3]), int(argv[4])
        if node < 1 or not host or not 0 < port < 65536 or not 0 < bus_port < 65536:
            raise ValueError("expected a node id >= 1, a host, a port and a bus port")
    try:
        await controller.admit(node, host, port, bus_port)
    except (NotReady, ValueError) as e:
        raise err(f"join of node {node} not committed: {e}") from None
    return OK


@command("ctrlmove", arity=2, flags="admin stale fast", group="cluster", since="7.0.0",
         acl_categories=("admin", "fast", "dangerous"),
         summary="Internal: the controller asks this node to take back a shard it prefers to lead.",
         syntax="CTRLMOVE shard", peer=True)
def ctrlmove(ctx, argv):
    """CTRLMOVE shard (answered at once; the move runs in the background)"""
    repl = _repl(ctx)
    shard = parse_int(argv[1])
    m = repl.manager
    if not 0 <= shard < m.placement.shard_count or m.my_id not in m.placement.replicas(shard):
        raise err("this node holds no replica of that shard")
    repl.move_in_background(shard)
    return OK
