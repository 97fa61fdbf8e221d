"""Cluster and replication commands of the client port: CLUSTER ..., READONLY,
READWRITE and WAIT.

The internal commands peers send each other (REPLFETCH, RAFT, CTRLBEAT ...)
are the cluster bus's (server/bus.py).

Owns: these handlers' arguments and replies. What they do is
``cluster.replica_manager`` (the shard table, leadership) and
``cluster.runtime`` (failover, reassignment, WAIT).

Routing replies follow Redis Cluster: a node id is 40 hex characters (the
configured node id, zero-padded). A Partita node leads some slot ranges and
follows others at once, which Redis's one-role-per-node topology cannot
say; so SHARDS and NODES show every node once, as the master of the ranges
it leads (none: a master without slots), and CLUSTER SLOTS lists each range
with its leader first and its followers as replicas (a follower serves
client reads only after READONLY, of its committed entries; without it they
get -MOVED), so that clients that read from replicas (redis-py's
``load_balancing_strategy``) spread reads over them. Clients key nodes by
address and give a node the role of its first mention in CLUSTER SLOTS
(redis-py) or its last (coredis); a node listed as a replica first or last
would be left out of their fan-outs (FLUSHALL, SCAN, KEYS). So the reply
opens with one slot of each leading node's first range, that node alone,
and ends with that range's last slot, alone too; the rest of the range (and
every other range) comes in between with its replicas (``_slot_entries``).
INFO replication has the replica sets and per-partition roles.

Must not know: sockets, storage formats.
"""

from __future__ import annotations

from cluster.nodes import SLOTS, key_slot
from cluster.runtime.controller_driver import NotReady
from cluster.runtime.replication import FailoverError
from server.acl import visible_keys
from server.args import parse_int
from server.errors import CommandError, err
from server.registry import command, container
from server.reply import OK, Map, Simple, Verbatim

DISABLED = err("This instance has cluster support disabled")


def _repl(ctx):
    repl = ctx.server.replication
    if repl is None:
        raise DISABLED
    return repl


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


def _keys_in_slot(ctx, argv, message: str) -> list[bytes]:
    """CLUSTER COUNTKEYSINSLOT / GETKEYSINSLOT: the keys KEYS lists here
    whose slot (CLUSTER KEYSLOT) is ``argv[2]``, none where the slot is led
    elsewhere (Redis: the keys a node holds); ``message`` for a slot out of
    range or a negative count (``argv[3]``)."""
    _repl(ctx)
    slot = parse_int(argv[2])
    count = parse_int(argv[3]) if len(argv) > 3 else 0
    if not 0 <= slot < SLOTS or count < 0:
        raise err(message)
    return [key for key in visible_keys(ctx.client, ctx.session.key_names()) if key_slot(key) == slot]


@command("cluster|countkeysinslot", arity=3, flags="stale", group="cluster", since="3.0.0",
         acl_categories=("slow",), summary="Return the number of local keys in the specified hash slot.",
         syntax="CLUSTER COUNTKEYSINSLOT slot")
def cluster_countkeysinslot(ctx, argv):
    """CLUSTER COUNTKEYSINSLOT slot"""
    return len(_keys_in_slot(ctx, argv, "Invalid slot"))


@command("cluster|getkeysinslot", arity=4, flags="stale", group="cluster", since="3.0.0",
         acl_categories=("slow",), summary="Return local key names in the specified hash slot.",
         syntax="CLUSTER GETKEYSINSLOT slot count")
def cluster_getkeysinslot(ctx, argv):
    """CLUSTER GETKEYSINSLOT slot count"""
    return _keys_in_slot(ctx, argv, "Invalid slot or number of keys")[:parse_int(argv[3])]


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


def _led_ranges(m) -> list[tuple[object, list[tuple[int, int]]]]:
    """Every node, in id order, with the slot ranges it leads (in slot order)."""
    led: dict[int, list[tuple[int, int]]] = {node.id: [] for node in m.placement.nodes}
    for first, last, nodes in _shard_table(m):
        led[nodes[0].id].append((first, last))
    return [(node, led[node.id]) for node in m.placement.nodes]


def _current_epoch(m) -> int:
    return max(m.state.epoch(s) for s in range(m.placement.shard_count))


@command("cluster|slots", arity=2, flags="stale", group="cluster", since="3.0.0",
         acl_categories=("slow",), summary="Returns the mapping of cluster slots to nodes.",
         syntax="CLUSTER SLOTS")
def cluster_slots(ctx, argv):
    """CLUSTER SLOTS

    Each slot range with its leader, then its followers as replicas; the
    first and last slot of each leader's first range with the leader alone,
    at the ends of the reply (see the module docstring)."""
    return _slot_entries(_shard_table(_repl(ctx).manager))


def _slot_entries(table: list[tuple[int, int, list]]) -> list[list]:
    """CLUSTER SLOTS of the shard ``table``: every leading node's first
    mention and last mention are as a master (the module docstring)."""
    head: list[list] = []
    middle: list[list] = []
    tail: list[list] = []
    ends: set[int] = set()  # leaders whose first range gave the ends
    for first, last, nodes in table:
        leader = nodes[0]
        entries = [_node_entry(node) for node in nodes]
        if leader.id not in ends:
            ends.add(leader.id)
            head.append([first, first, entries[0]])
            if last > first:
                tail.append([last, last, entries[0]])
            first, last = first + 1, last - 1
        if first <= last:
            middle.append([first, last, *entries])
    return head + middle + tail


@command("cluster|shards", arity=2, flags="stale", group="cluster", since="7.0.0",
         acl_categories=("slow",), summary="Returns the mapping of cluster slots to shards.",
         syntax="CLUSTER SHARDS")
def cluster_shards(ctx, argv):
    """CLUSTER SHARDS

    One shard per node: the slot ranges it leads and itself as their
    master (see the module docstring)."""
    m = _repl(ctx).manager
    fenced = m.state.fenced
    out = []
    for node, ranges in _led_ranges(m):
        described = Map([(b"id", node_name(node.id)), (b"port", node.port), (b"ip", node.host),
                         (b"endpoint", node.host), (b"role", "master"), (b"replication-offset", 0),
                         (b"health", "fail" if node.id in fenced else "online")])
        out.append(Map([(b"slots", [slot for pair in ranges for slot in pair]), (b"nodes", [described])]))
    return out


@command("cluster|nodes", arity=2, flags="stale", group="cluster", since="3.0.0",
         acl_categories=("slow",), summary="Returns the cluster configuration for a node.",
         syntax="CLUSTER NODES")
def cluster_nodes(ctx, argv):
    """CLUSTER NODES

    A node the controller fenced (it stopped heartbeating) is ``fail`` and
    its link ``disconnected``, as Redis shows a master it lost."""
    m = _repl(ctx).manager
    epoch = _current_epoch(m)
    lines = []
    for node, ranges in _led_ranges(m):
        failed = node.id in m.state.fenced
        flags = ("myself," if node.id == m.my_id else "") + "master" + (",fail" if failed else "")
        slots = [f"{first}-{last}" for first, last in ranges]
        lines.append(f"{node_name(node.id)} {node.entry} {flags} - 0 0 {epoch} "
                     f"{'disconnected' if failed else 'connected'}" + (" " + " ".join(slots) if slots else ""))
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
        "COUNTKEYSINSLOT <slot>", "    Return the number of keys in <slot>.",
        "GETKEYSINSLOT <slot> <count>", "    Return key names stored by current node in a slot.",
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


@command("readonly", arity=1, flags="fast loading stale", group="cluster", since="3.0.0",
         acl_categories=("@fast", "@connection"),
         summary="Enables read queries for a connection to a cluster replica node",
         syntax="READONLY")
def readonly(ctx, argv):
    """READONLY

    From now on this connection's stream reads (XRANGE, XREVRANGE, XLEN,
    XREAD, XINFO STREAM: ``FOLLOWER_READS``) of a partition this node holds
    a follower copy of are served here, from the copy's committed entries
    (below the high watermark it learnt from its leader); writes and group
    commands still get ``-MOVED`` (``Replication.route``). As Redis Cluster's
    READONLY, it changes nothing for keys whose slots this node leads or
    does not replicate. On a single node: Redis's cluster-disabled error."""
    return _replica_reads(ctx, True)


@command("readwrite", arity=1, flags="fast loading stale", group="cluster", since="3.0.0",
         acl_categories=("@fast", "@connection"),
         summary="Disables read queries for a connection to a cluster replica node",
         syntax="READWRITE")
def readwrite(ctx, argv):
    """READWRITE

    Ends READONLY: every read of a partition led elsewhere gets ``-MOVED``
    again (RESET does the same)."""
    return _replica_reads(ctx, False)


def _replica_reads(ctx, on: bool):
    """READONLY / READWRITE: the client's mode, in a cluster only."""
    _repl(ctx)
    ctx.client.readonly = on
    return OK


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
