"""The forwarded XADD without sockets: ``XADD <topic>`` on a node that leads
the topic key's slot, where the broker (``Session.append``) picks the
partition and appends it here or forwards it through
``cluster/runtime/forwarding.py``: the choice, the relayed reply, the retry
on -MOVED and the unreachable-leader texts, against fake peer links, with
the replies a client gets (the cluster run is tests/e2e/test_forwarding.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import server.commands  # noqa: F401  (registers XADD)
from cluster.broker import XAddPlan
from cluster.errors import ClusterError, Refused
from cluster.peer.link import Unreachable
from cluster.peer.messages import AppendRequest, AppendResponse
from cluster.runtime.forwarding import Forwarder
from cluster.topics import TopicRegistry
from server.config import Config
from server.dispatch import Context, Dispatcher
from server.reply import encode
from server.state import ServerState

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


@pytest.fixture
def node(tmp_path):
    """``make(leaders, links)``: a node's state, dispatcher and client
    context for topic ``t`` of 6 partitions, partition n led by
    ``leaders[n]`` (this node is ME), other nodes reached through
    ``links``."""
    registries = []

    def make(leaders: dict[int, int], links: dict[int, FakeLink]):
        config = Config()
        config.replica_lag_time_max_ms = 1000
        topics = TopicRegistry.open(tmp_path / f"node{len(registries)}", config)
        registries.append(topics)
        topics.create_topic(b"t", 6)
        nodes = [SimpleNamespace(id=i, address=f"127.0.0.1:700{i}") for i in (1, 2, 3)]
        manager = SimpleNamespace(
            my_id=ME,
            shard_of=lambda topic, n: n,
            state=SimpleNamespace(leader=lambda shard: leaders[shard]),
            placement=SimpleNamespace(nodes=nodes),
        )
        replication = SimpleNamespace(
            manager=manager, topics=topics, config=config, link=lambda node, purpose: links[node],
            route=lambda spec, argv: None,  # every key's slot is led here
            before_append=lambda session, pkey, stream: False,  # acks=1
        )
        replication.forwarder = Forwarder(replication)
        state = ServerState(config, topics)
        state.replication = replication
        dispatcher = Dispatcher(state)
        return state, dispatcher, Context(state, state.new_client(), dispatcher)

    yield make
    for topics in registries:
        topics.close()


ARGV = [b"XADD", b"t", b"MAXLEN", b"10", b"*", b"f", b"v"]


async def _xadd(dispatcher, ctx, argv=ARGV):
    """The reply a client gets: the handler's, or its forward's once awaited."""
    reply = dispatcher.call(ctx, list(argv))
    if not isinstance(reply, (bytes, Exception)) and reply is not None:
        reply = await reply
    return reply


async def test_a_partition_led_here_is_appended_here_and_others_are_forwarded_unchanged(node):
    link = FakeLink([b"7-1"])
    state, dispatcher, ctx = node({0: ME, 1: 2}, {2: link})
    first = await _xadd(dispatcher, ctx)  # round-robin: partition 0, then 1
    assert state.topics.get(b"t#0").length == 1 and first.endswith(b"-0")
    assert await _xadd(dispatcher, ctx) == b"7-1"
    assert link.calls == [AppendRequest(b"t#1", (b"MAXLEN", b"10", b"*"), (b"f", b"v"))]
    assert link.reply_timeout_s == 2 * 1.0 + 2.0
    assert state.topics.get(b"t#1").length == 0


async def test_inside_a_transaction_a_forward_is_refused(node):
    state, dispatcher, ctx = node({0: 2}, {})
    ctx.may_block = False
    with pytest.raises(ClusterError, match="cannot forward"):
        ctx.session.append(XAddPlan(b"t", [b"f", b"v"]))


async def test_the_leaders_error_is_relayed_with_its_exact_text(node):
    for text in ("NOTENOUGHREPLICAS 1 in-sync replica(s) of t#0, min-insync-replicas is 2; nothing was written",
                 "ERR The ID specified in XADD is equal or smaller than the target stream top item",
                 "ODDCODE"):
        state, dispatcher, ctx = node({0: 2}, {2: FakeLink([Refused(text)])})
        reply = await _xadd(dispatcher, ctx)
        assert encode(reply, 2) == b"-" + text.encode() + b"\r\n"
        assert encode(reply, 3) == b"-" + text.encode() + b"\r\n"
        assert state.stats.errors == {text.split(" ")[0]: 1}
        assert state.stats.commands["xadd"][3] == 1


async def test_moved_is_followed_once_then_becomes_tryagain(node):
    two, three = FakeLink([Refused("MOVED 5 127.0.0.1:7003")]), FakeLink([b"9-0"])
    _, dispatcher, ctx = node({0: 2}, {2: two, 3: three})
    assert await _xadd(dispatcher, ctx) == b"9-0"
    assert three.calls == two.calls

    two = FakeLink([Refused("MOVED 5 127.0.0.1:7003")])
    three = FakeLink([Refused("MOVED 5 127.0.0.1:7002")])
    _, dispatcher, ctx = node({0: 2}, {2: two, 3: three})
    reply = await _xadd(dispatcher, ctx)
    assert reply.code == "TRYAGAIN"
    assert reply.message == ("leadership of partition t#0 is moving (node 3 answered MOVED 5 127.0.0.1:7002); "
                             "nothing was written")


async def test_moved_to_this_node_appends_here(node):
    state, dispatcher, ctx = node({0: 2}, {2: FakeLink([Refused("MOVED 5 127.0.0.1:7001")])})
    reply = await _xadd(dispatcher, ctx)
    assert reply.endswith(b"-0")
    assert state.topics.get(b"t#0").length == 1  # appended here, with the client's MAXLEN


async def test_an_unreachable_leader_says_whether_the_entry_may_have_been_written(node):
    _, dispatcher, ctx = node({0: 2}, {2: FakeLink([("raise", False)])})
    reply = await _xadd(dispatcher, ctx)
    assert encode(reply, 2) == (b"-TRYAGAIN partition t#0 leader node 2 unreachable: "
                                b"link to 127.0.0.1:7002: boom; nothing was written\r\n")
    state, dispatcher, ctx = node({0: 2}, {2: FakeLink([("raise", True)])})
    reply = await _xadd(dispatcher, ctx)
    assert encode(reply, 2) == (b"-TRYAGAIN partition t#0 leader node 2 unreachable: "
                                b"link to 127.0.0.1:7002: boom; it may or may not have been written\r\n")
    assert state.stats.commands["xadd"][3] == 1
