"""Cluster mode: ``XADD <topic>`` forwarded to the leader of the partition it picks.

A bare topic key of a multi-partition topic (``XADD orders * f v``, where
``orders`` has several partitions) is routed by its own slot: clients land
on the node leading ``slot("orders")`` (``-MOVED`` sends them there, as for
any key). That node picks the partition with the producer partitioner, as a
single node does (``cluster.partitioner``: the topic's
``partition-key-field`` hashed as Kafka does, else round-robin, here entry
by entry: a single node's sticky runs are not taken in a cluster). When it
leads the chosen partition ``orders#n`` it appends there itself; otherwise
it sends the partition's leader an ``AppendRequest`` (the partition key,
the client's options as given, the fields) over a peer link and the
front-end relays the answer: the new ID, or the leader's error byte for
byte (``Refused``: ``-NOTENOUGHREPLICAS``, ``-TRYAGAIN``, a syntax error
...). The leader acknowledges under its own ``acks``; this node adds
nothing. It is the one write that takes an extra hop; ``orders#n`` keys
avoid it.

- The round-robin counter is per node (each node forwarding for a topic
  keeps its own); keyed choices (``partition-key-field``) are the same on
  every node.
- One deadline per forward: ``forward-timeout-ms`` (5 s by default) from
  the moment the broker hands it over, covering the call, a wait for the
  pooled link, and the resend below. When it runs out the forward is
  cancelled (the link drops its connection, so a late answer is never read
  as another's) and the client gets ``TryAgain partition orders#n leader
  node N unreachable: no reply within forward-timeout-ms (<ms> ms); it may
  or may not have been written``. A Redis server cannot know a client's own
  timeout: this bound is the documented stand-in, to keep below it. A
  forward is thus never sent again once its client has its answer: before
  this deadline a paused leader kept the forward waiting up to twice
  ``replica-lag-time-max-ms`` plus 2 s, and its late ``MOVED`` sent the
  entry to the new leader seconds after the client gave up, behind the
  same producer's later, acknowledged writes.
- A leader that answers ``MOVED`` (its leadership just moved; it refused
  before appending) is asked once more at the node it names (or this node
  appends, if it names this node), within the same deadline; a second
  ``MOVED`` becomes ``TryAgain ... leadership of <key> is moving``: the
  client did not send ``orders#n``, so a redirect for it must not reach the
  client. The resend is the same request: the client's options, with its
  ``IDMP`` / ``IDMPAUTO`` producer and idempotent id when it gave them, so
  the leader deduplicates it as it would the client's own retry.
- A leader that cannot be reached: ``TryAgain partition orders#n leader
  node N unreachable: <reason>; nothing was written`` when the request never
  left this node (``Unreachable.sent`` False: connect or AUTH failed, or the
  kept link was already closed by the peer), and ``...; it may or may not
  have been written`` when the link failed after sending it (connection
  dropped) or the deadline ran out: the leader may have appended it, and a
  retry may then write it twice (not one with ``IDMP``).
- Inside MULTI / EXEC a forward cannot wait: an XADD whose partition is led
  elsewhere is refused there (``in_transaction``; use partition keys).

Owns: the choice of partition for a bare multi-partition XADD in cluster
mode, the forward (of that XADD, and of a topic's XGROUP CREATE / SETID /
DESTROY to each partition's leader: cluster/broker/groups.py), its retry
on ``MOVED``, its errors, and a pool of
``FORWARD_LINKS`` links per peer (purpose ``forward<i>``, picked by client
id) so clients forwarding to one leader do not all queue behind one round
trip.

Must not know: encodings or sockets (the peer link), how XADD parses or
appends (the front-end runs it when the partition is led here), replication
rules (cluster/replication.py).
"""

from __future__ import annotations

from typing import Any

import trio

from cluster.errors import ClusterError, Moved, Refused, TryAgain
from cluster.peer.link import Unreachable
from cluster.peer.messages import AppendRequest, GroupRequest
from cluster.topics import partition_key, split_partition_key

FORWARD_LINKS = 4
PURPOSE = "forward"


def _text(key: bytes) -> str:
    return key.decode("utf-8", "replace")


class Forwarder:
    """The forwarded XADD of one node (``Replication.forwarder``)."""

    def __init__(self, replication: Any) -> None:
        self.replication = replication

    @property
    def my_id(self) -> int:
        return self.replication.manager.my_id

    def choose(self, topic: bytes, fields: Any, sticky: bytes | None = None) -> tuple[bytes, int]:
        """The partition key an entry of ``fields`` goes to, and its leader
        (``sticky``: an idempotent producer's id, ``Partitioner.choose``)."""
        manager = self.replication.manager
        n = self.replication.topics.choose_partition(topic, fields, sticky)
        return partition_key(topic, n), manager.state.leader(manager.shard_of(topic, n))

    def in_transaction(self, topic: bytes, pkey: bytes, leader: int) -> ClusterError:
        """The refusal of a forward inside MULTI / EXEC (it cannot wait)."""
        return ClusterError(f"XADD to topic '{_text(topic)}' inside a transaction: its partition {_text(pkey)} "
                            f"is led by node {leader}, and a transaction cannot forward; use partition keys "
                            "('<topic>#<n>')")

    def moving_here(self, pkey: bytes, moved: Moved) -> TryAgain:
        """The append here refused with ``moved``: this node's view is behind."""
        return TryAgain(f"leadership of partition {_text(pkey)} is moving "
                        f"(this node sees node {moved.leader.id} leading it); nothing was written")

    def _node_named(self, moved: str) -> int | None:
        """The node id of ``MOVED <slot> <host>:<port>``'s address, if known."""
        address = moved.rsplit(" ", 1)[-1]
        for node in self.replication.manager.placement.nodes:
            if node.address == address:
                return node.id
        return None

    async def forward(self, request: AppendRequest | GroupRequest, leader: int, client_id: int) -> Any:
        """Send ``request`` (a write to partition ``request.key``) to
        ``leader``; its response (an ``AppendResponse``: the new entry's ID
        as the leader sent it), or None when the leadership has moved to
        this node (the caller runs it here). Raises ``Refused`` (the
        leader's error, to relay as it is) or ``TryAgain``; both, as the
        response, come within ``forward-timeout-ms``, and nothing is sent
        after."""
        manager = self.replication.manager
        pkey = request.key
        timeout_ms = self.replication.config.forward_timeout_ms  # (CONFIG SET applies to the next)
        moved, moved_by = "", leader
        with trio.move_on_after(timeout_ms / 1000) as deadline:
            for _ in range(2):  # the leader, then once more where a MOVED points
                if leader == manager.my_id:  # leadership moved here since the choice
                    return None
                link = self.replication.link(leader, f"{PURPOSE}{client_id % FORWARD_LINKS}")
                link.reply_timeout_s = timeout_ms / 1000  # (the deadline, started first, ends first)
                try:
                    return await link.call(request)
                except Unreachable as e:
                    outcome = "it may or may not have been written" if e.sent else "nothing was written"
                    raise TryAgain(f"partition {_text(pkey)} leader node {leader} unreachable: {e}; "
                                   f"{outcome}") from None
                except Refused as e:
                    if e.code != "MOVED":
                        raise
                    moved, moved_by = e.text, leader
                    named = self._node_named(e.text)
                    if named is None:
                        topic, n = split_partition_key(pkey)
                        named = manager.state.leader(manager.shard_of(topic, n))
                    leader = named
        if deadline.cancelled_caught:
            raise TryAgain(f"partition {_text(pkey)} leader node {leader} unreachable: no reply within "
                           f"forward-timeout-ms ({timeout_ms} ms); it may or may not have been written")
        raise TryAgain(f"leadership of partition {_text(pkey)} is moving (node {moved_by} answered {moved}); "
                       "nothing was written")
