"""Cluster mode: ``XADD <topic>`` forwarded to the leader of the partition it picks.

A bare topic key of a multi-partition topic (``XADD orders * f v``, where
``orders`` has several partitions) is routed by its own slot: clients land
on the node leading ``slot("orders")`` (``-MOVED`` sends them there, as for
any key). That node picks the partition with the producer partitioner, as a
single node does (``cluster.partitioner``: the topic's
``partition-key-field`` hashed as Kafka does, else round-robin, here entry
by entry: a single node's sticky runs (``xadd_run``) are not taken in a
cluster). When it
leads the chosen partition ``orders#n`` it appends here; otherwise it
forwards ``XADD orders#n <the client's other arguments unchanged>`` to that
partition's leader over an internal link and relays the leader's reply
byte for byte (the new ID, or the leader's error: ``-NOTENOUGHREPLICAS``,
``-TRYAGAIN``, a syntax error ...). The leader acknowledges under its own
``acks``; this node adds nothing. It is the one write that takes an extra
hop; ``orders#n`` keys avoid it.

- The round-robin counter is per node (each node forwarding for a topic
  keeps its own); keyed choices (``partition-key-field``) are the same on
  every node.
- A leader that answers ``-MOVED`` (its leadership just moved) is asked
  once more at the node it names (or this node appends, if it names this
  node); a second ``-MOVED`` becomes ``-TRYAGAIN ... leadership of
  <key> is moving``: the client did not send ``orders#n``, so a redirect for
  it must not reach the client.
- A leader that cannot be reached: ``-TRYAGAIN partition orders#n leader
  node N unreachable: <reason>; nothing was written`` when the request never
  left this node (connect or AUTH failed, or the kept link was already
  closed by the peer), and ``...; it may or may not have been written`` when
  the link failed after sending it (no reply within the timeout, connection
  dropped): the leader may have appended it, and a retry may then write it
  twice. The timeout is twice ``replica-lag-time-max-ms`` plus 2 s, the
  longest a healthy acks=all leader holds a reply being about one lag
  period (a stalled follower leaves the ISR after it).
- Pipelining: the XADD handler returns the forward as a coroutine; the
  connection awaits it as it awaits any command that waits (after sending
  the replies before it, and after their fsync and acks=all waits), so a
  client's replies stay in the order of its commands.
- Inside MULTI / EXEC a forward cannot wait: an XADD whose partition is led
  elsewhere is refused there (use partition keys).

Owns: the choice of partition for a bare multi-partition XADD in cluster
mode, the forward, its retry on ``-MOVED``, its error texts, and a pool of
``FORWARD_LINKS`` links per peer (``Replication.link(node, "forward<i>")``,
picked by client id) so clients forwarding to one leader do not all queue
behind one round trip.

Must not know: RESP bytes or sockets (``server/leader_link.py``), how XADD
parses or appends (``server/commands/streams.py``), replication rules
(``cluster/``).
"""

from __future__ import annotations

import time
from typing import Any

from cluster.replica_manager import NotLeaderError
from cluster.topics import partition_key, split_partition_key
from server.errors import CommandError
from server.failures import reply_for
from server.leader_link import LinkError

FORWARD_LINKS = 4
PURPOSE = "forward"


class RelayedError(CommandError):
    """A leader's error reply, relayed with its exact text."""

    def __init__(self, text: str) -> None:
        code, _, message = text.partition(" ")
        super().__init__(code, message)
        self.text = text

    @property
    def line(self) -> str:
        return self.text


def _text(key: bytes) -> str:
    return key.decode("utf-8", "replace")


def route_xadd(ctx: Any, argv: list[bytes], fields: Any) -> bytes | Any:
    """``XADD <topic> ...`` on a multi-partition topic in cluster mode.

    Picks the partition; returns its partition key (``orders#n``) when this
    node leads it (the caller appends there), else the coroutine that
    forwards the command to its leader and returns the leader's reply (the
    connection awaits it). Raises CommandError inside MULTI when the
    partition is led elsewhere.
    """
    server = ctx.server
    topics = server.topics
    manager = server.replication.manager
    topic = argv[1]
    field = topics.config_value(topic, "partition-key-field")
    n = topics.partitioner.choose(topic, topics.partitions_of(topic), fields,
                                  field.encode() if field else None)
    pkey = partition_key(topic, n)
    leader = manager.state.leader(manager.shard_of(topic, n))
    if leader == manager.my_id:
        return pkey
    if not ctx.may_block:
        raise CommandError(
            "ERR", f"XADD to topic '{_text(topic)}' inside a transaction: its partition {_text(pkey)} is "
            f"led by node {leader}, and a transaction cannot forward; use partition keys ('<topic>#<n>')")
    return _forward(ctx, argv, pkey, leader)


def forward_append(session: Any, plan: Any) -> bytes | Any:
    """The broker's hook for an append to a multi-partition topic key
    (``cluster.broker.Session.append``): ``route_xadd`` for the client the
    session acts for."""
    return route_xadd(session.owner, plan.argv, plan.fields)


def _timeout_s(config: Any) -> float:
    return 2 * config.replica_lag_time_max_ms / 1000 + 2.0


def _node_named(manager: Any, moved: str) -> int | None:
    """The node id of ``MOVED <slot> <host>:<port>``'s address, if known."""
    address = moved.rsplit(" ", 1)[-1]
    for node in manager.placement.nodes:
        if node.address == address:
            return node.id
    return None


async def _forward(ctx: Any, argv: list[bytes], pkey: bytes, leader: int) -> Any:
    """Forward ``XADD pkey <argv[2:]>`` to ``leader``; the reply for the client.
    Never raises (but Cancelled): every failure is an error reply."""
    started = time.perf_counter_ns()
    try:
        reply = await _forward_or_raise(ctx, argv, pkey, leader)
    except CommandError as e:
        reply = e
    except Exception as e:  # noqa: BLE001 - a local append's refusal, or a bug
        reply = reply_for(e)
        if reply is None:
            raise
    stats = ctx.server.stats
    entry = stats.commands.get("xadd")
    if entry is not None:  # the dispatcher counted the call already; add the wait
        entry[1] += (time.perf_counter_ns() - started) // 1000
        if isinstance(reply, CommandError):
            entry[3] += 1
    if isinstance(reply, CommandError):
        stats.record_error(reply.code)
    return reply


async def _forward_or_raise(ctx: Any, argv: list[bytes], pkey: bytes, leader: int) -> Any:
    replication = ctx.server.replication
    manager = replication.manager
    forwarded = [argv[0], pkey, *argv[2:]]
    moved, moved_by = "", leader
    for _ in range(2):  # the leader, then once more where a -MOVED points
        if leader == manager.my_id:  # leadership moved here since the choice
            return _append_here(ctx, forwarded)
        link = replication.link(leader, f"{PURPOSE}{ctx.client.id % FORWARD_LINKS}")
        link.reply_timeout_s = _timeout_s(ctx.server.config)
        try:
            reply = await link.call_once(forwarded)
        except LinkError as e:
            outcome = "it may or may not have been written" if e.sent else "nothing was written"
            return CommandError("TRYAGAIN", f"partition {_text(pkey)} leader node {leader} "
                                            f"unreachable: {e}; {outcome}")
        if isinstance(reply, LinkError):  # the leader's error reply
            text = str(reply)
            if not text.startswith("MOVED "):
                return RelayedError(text)
            moved, moved_by = text, leader
            named = _node_named(manager, text)
            if named is None:
                topic, n = split_partition_key(pkey)
                named = manager.state.leader(manager.shard_of(topic, n))
            leader = named
            continue
        return reply  # the new entry's ID (bytes), as the leader sent it
    return CommandError("TRYAGAIN", f"leadership of partition {_text(pkey)} is moving "
                                    f"(node {moved_by} answered {moved}); nothing was written")


def _append_here(ctx: Any, argv: list[bytes]) -> Any:
    """The XADD to partition key ``argv[1]`` run here, as the client's own
    would be (its durability and acks=all waits are the connection's)."""
    from server.registry import COMMANDS  # the handler: no import of server.commands here

    try:
        return COMMANDS["xadd"].handler(ctx, argv)
    except NotLeaderError as e:  # this node's view is behind: the client retries
        return CommandError("TRYAGAIN", f"leadership of partition {_text(argv[1])} is moving "
                                        f"(this node sees node {e.leader.id} leading it); nothing was written")
