"""The forwarded XADD without sockets (cluster/runtime/forwarding.py, driven
by XADD's ``route_xadd``): the partition choice, the relayed reply, the retry
on -MOVED and the unreachable-leader texts, against fake peer links (the
cluster run is tests/e2e/test_forwarding.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import server.commands  # noqa: F401  (registers XADD, which a forward may run here)
from cluster.errors import ClusterError, Refused
from cluster.partitioner import Partitioner
from cluster.peer.link import Unreachable
from cluster.peer.messages import AppendRequest, AppendResponse
from cluster.runtime.forwarding import Forwarder
from server.commands import streams as forwarding
from server.registry import COMMANDS
from server.reply import encode

ME = 1


class FakeLink:
    """Answers each ``call`` with the next scripted reply: an ID, a
    ``Refused`` (the leader's error) raised, or for a ``("raise", sent)``
    item an ``Unreachable``."""

    def __init__(self, replies: list) -> None:
        self.replies = list(replies)
        self.calls: list[AppendRequest] = []
        self.reply_timeout_s = 30.0

    async def call(self, request: AppendRequest):
        self.calls.append(request)
        reply = self.replies.pop(0)
        if isinstance(reply, tuple):
            raise Unreachable("link to 127.0.0.1:7002: boom", sent=reply[1])
        if isinstance(reply, Exception):
            raise reply
        return AppendResponse(reply)


def make(leaders: dict[int, int], links: dict[int, FakeLink], may_block: bool = True):
    """A ctx for topic ``t`` of 6 partitions; partition n is led by ``leaders[n]``."""
    nodes = [SimpleNamespace(id=i, address=f"127.0.0.1:700{i}") for i in (1, 2, 3)]
    manager = SimpleNamespace(
        my_id=ME,
        shard_of=lambda topic, n: n,
        state=SimpleNamespace(leader=lambda shard: leaders[shard]),
        placement=SimpleNamespace(nodes=nodes),
    )
    topics = SimpleNamespace(config_value=lambda topic, name: "", partitions_of=lambda topic: 6,
                             partitioner=Partitioner())
    config = SimpleNamespace(replica_lag_time_max_ms=1000)
    replication = SimpleNamespace(manager=manager, topics=topics, config=config,
                                  link=lambda node, purpose: links[node])
    replication.forwarder = Forwarder(replication)
    stats = SimpleNamespace(commands={"xadd": [1, 0, 0, 0]}, errors={})
    stats.record_error = lambda code: stats.errors.__setitem__(code, stats.errors.get(code, 0) + 1)
    node = SimpleNamespace(topics=topics, replication=replication, stats=stats, config=config)
    return SimpleNamespace(server=node, client=SimpleNamespace(id=5), may_block=may_block)


ARGV = [b"XADD", b"t", b"MAXLEN", b"10", b"*", b"f", b"v"]


async def test_a_partition_led_here_is_appended_here_and_others_are_forwarded_unchanged():
    link = FakeLink([b"7-1"])
    ctx = make({0: ME, 1: 2}, {2: link})
    assert forwarding.route_xadd(ctx, ARGV, ARGV[5:]) == b"t#0"  # round-robin: 0, then 1
    forward = forwarding.route_xadd(ctx, ARGV, ARGV[5:])
    assert await forward == b"7-1"
    assert link.calls == [AppendRequest(b"t#1", (b"MAXLEN", b"10", b"*"), (b"f", b"v"))]
    assert link.reply_timeout_s == 2 * 1.0 + 2.0


async def test_inside_a_transaction_a_forward_is_refused():
    ctx = make({0: 2}, {}, may_block=False)
    with pytest.raises(ClusterError, match="cannot forward"):
        forwarding.route_xadd(ctx, ARGV, ARGV[5:])


async def test_the_leaders_error_is_relayed_with_its_exact_text():
    for text in ("NOTENOUGHREPLICAS 1 in-sync replica(s) of t#0, min-insync-replicas is 2; nothing was written",
                 "ERR The ID specified in XADD is equal or smaller than the target stream top item",
                 "ODDCODE"):
        ctx = make({0: 2}, {2: FakeLink([Refused(text)])})
        reply = await forwarding.route_xadd(ctx, ARGV, ARGV[5:])
        assert encode(reply, 2) == b"-" + text.encode() + b"\r\n"
        assert encode(reply, 3) == b"-" + text.encode() + b"\r\n"
        assert ctx.server.stats.errors == {text.split(" ")[0]: 1}


async def test_moved_is_followed_once_then_becomes_tryagain():
    two, three = FakeLink([Refused("MOVED 5 127.0.0.1:7003")]), FakeLink([b"9-0"])
    ctx = make({0: 2}, {2: two, 3: three})
    assert await forwarding.route_xadd(ctx, ARGV, ARGV[5:]) == b"9-0"
    assert three.calls == two.calls

    two = FakeLink([Refused("MOVED 5 127.0.0.1:7003")])
    three = FakeLink([Refused("MOVED 5 127.0.0.1:7002")])
    ctx = make({0: 2}, {2: two, 3: three})
    reply = await forwarding.route_xadd(ctx, ARGV, ARGV[5:])
    assert reply.code == "TRYAGAIN"
    assert reply.message == ("leadership of partition t#0 is moving (node 3 answered MOVED 5 127.0.0.1:7002); "
                             "nothing was written")


async def test_moved_to_this_node_appends_here(monkeypatch):
    ran = []
    monkeypatch.setattr(COMMANDS["xadd"], "handler", lambda ctx, argv: ran.append(argv) or b"3-3")
    ctx = make({0: 2}, {2: FakeLink([Refused("MOVED 5 127.0.0.1:7001")])})
    assert await forwarding.route_xadd(ctx, ARGV, ARGV[5:]) == b"3-3"
    assert ran == [[b"XADD", b"t#0", b"MAXLEN", b"10", b"*", b"f", b"v"]]


async def test_an_unreachable_leader_says_whether_the_entry_may_have_been_written():
    ctx = make({0: 2}, {2: FakeLink([("raise", False)])})
    reply = await forwarding.route_xadd(ctx, ARGV, ARGV[5:])
    assert encode(reply, 2) == (b"-TRYAGAIN partition t#0 leader node 2 unreachable: "
                                b"link to 127.0.0.1:7002: boom; nothing was written\r\n")
    ctx = make({0: 2}, {2: FakeLink([("raise", True)])})
    reply = await forwarding.route_xadd(ctx, ARGV, ARGV[5:])
    assert encode(reply, 2) == (b"-TRYAGAIN partition t#0 leader node 2 unreachable: "
                                b"link to 127.0.0.1:7002: boom; it may or may not have been written\r\n")
    assert ctx.server.stats.commands["xadd"][3] == 1
