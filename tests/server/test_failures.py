"""The cluster's errors (cluster/errors.py) as the client port says them:
Redis Cluster's texts, and a peer's error relayed byte for byte."""

from __future__ import annotations

from cluster.errors import ClusterDown, Moved, NotEnoughReplicas, Paused, Refused, TryAgain
from cluster.nodes import Node
from server.failures import reply_for
from server.reply import encode


def _line(exc: Exception) -> bytes:
    reply = reply_for(exc)
    assert reply is not None, exc
    assert encode(reply, 2) == encode(reply, 3)
    return encode(reply, 2)


def test_cluster_refusals_become_redis_texts():
    assert _line(Moved(5798, Node(2, "127.0.0.1", 7002))) == b"-MOVED 5798 127.0.0.1:7002\r\n"
    assert _line(NotEnoughReplicas(1, b"orders#2", 2)) == (
        b"-NOTENOUGHREPLICAS 1 in-sync replica(s) of orders#2, min-insync-replicas is 2; nothing was written\r\n")
    assert _line(Paused()) == b"-TRYAGAIN a manual failover is moving this partition's leadership; retry shortly\r\n"
    assert _line(TryAgain("later")) == b"-TRYAGAIN later\r\n"
    assert _line(ClusterDown("no slots")) == b"-CLUSTERDOWN no slots\r\n"


def test_a_peers_error_is_relayed_as_it_was_sent():
    for text in ("ODDCODE", "ERR The ID specified in XADD is equal or smaller than the target stream top item",
                 "TRYAGAIN  two spaces"):
        assert _line(Refused(text)) == b"-" + text.encode() + b"\r\n"
