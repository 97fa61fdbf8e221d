"""What the cluster refuses, as errors with codes.

Owns: the refusals the cluster layer raises under a command or a peer's
request: a key led elsewhere (``Moved``), a write that cannot be
acknowledged (``NotEnoughReplicas``), a state to retry later (``TryAgain``,
``Paused``), no slots yet (``ClusterDown``), this node not being the
controller (``NotController``), the controller halted (``Halted``), a peer's
request that does not parse (``BadRequest``), keys of one command in
several hash slots (``CrossSlot``), and a peer's own error reply
relayed unchanged (``Refused``). Each has a ``code`` (Redis's error code,
which a Kafka front-end maps to its own) and a ``message``: the explanation
after the code. ``Moved`` and ``NotEnoughReplicas`` keep their parts
(slot and leader; replica counts) so a front-end can say them its own way.

Must not know: how a front-end renders them. ``server/failures.py`` turns
each into Redis's reply text (``-<code> <message>``, ``-MOVED <slot>
<host>:<port>``); tests check those texts word for word.
"""

from __future__ import annotations

from typing import Any


class ClusterError(Exception):
    """A refusal: ``code`` and ``message`` (``str(e)`` is both, as Redis's error line)."""

    code = "ERR"

    def __init__(self, message: str, code: str | None = None) -> None:
        if code is not None:
            self.code = code
        self.message = message
        super().__init__(f"{self.code} {message}" if message else self.code)


class TryAgain(ClusterError):
    """Nothing was done; the same request may succeed shortly."""

    code = "TRYAGAIN"


class Paused(TryAgain):
    """A manual failover is moving the shard: its writes wait (``ReplicaManager.pause``)."""

    def __init__(self) -> None:
        super().__init__("a manual failover is moving this partition's leadership; retry shortly")


class ClusterDown(ClusterError):
    code = "CLUSTERDOWN"


class NotController(ClusterError):
    code = "NOTCONTROLLER"

    def __init__(self) -> None:
        super().__init__("this node is not the elected controller")


class Halted(ClusterError):
    """This node could not write its controller state (or apply a committed
    metadata record) and is stopping."""

    code = "MISCONF"

    def __init__(self, why: str) -> None:
        super().__init__(f"this node is stopping: {why}")


class BadRequest(ClusterError):
    """A peer's request that does not parse or names what does not exist;
    a front-end says which request (``malformed <name> request: <why>``)."""


class Moved(ClusterError):
    """This node does not lead the key's shard; ``leader`` (a ``cluster.nodes.Node``)
    does, and ``slot`` is the key's hash slot (Redis Cluster's redirect)."""

    code = "MOVED"

    def __init__(self, slot: int, leader: Any) -> None:
        super().__init__(f"{slot} {leader.address}")
        self.slot = slot
        self.leader = leader


class CrossSlot(ClusterError):
    """A command whose keys must share a hash slot names keys of several
    (Redis Cluster's -CROSSSLOT); nothing was done."""

    code = "CROSSSLOT"

    def __init__(self) -> None:
        super().__init__("the keys of the request are in different hash slots")


class NotEnoughReplicas(ClusterError):
    """An acks=all write refused before anything was written: ``in_sync``
    replicas of partition ``key`` are in sync, fewer than ``min_insync``."""

    code = "NOTENOUGHREPLICAS"

    def __init__(self, in_sync: int, key: bytes, min_insync: int) -> None:
        super().__init__(f"{in_sync} in-sync replica(s) of {key.decode('utf-8', 'replace')}, "
                         f"min-insync-replicas is {min_insync}; nothing was written")
        self.in_sync = in_sync
        self.key = key
        self.min_insync = min_insync


class Refused(ClusterError):
    """A peer answered with an error: ``text`` is its whole error line,
    relayed byte for byte (``code`` is its first word)."""

    def __init__(self, text: str) -> None:
        code, _, message = text.partition(" ")
        super().__init__(message, code or "ERR")
        self.text = text

    def __str__(self) -> str:
        return self.text
