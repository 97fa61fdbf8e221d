"""The forwarded XADD without sockets: ``XADD <topic>`` on a node that leads
the topic key's slot, where the broker (``Session.append``) picks the
partition and appends it here or forwards it through
``cluster/runtime/forwarding.py``: the choice, the relayed reply, the retry
on -MOVED and the unreachable-leader texts, against fake peer links, with
the replies a client gets (the cluster run is tests/e2e/test_forwarding.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import trio

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
            route=lambda spec, argv, replica_reads=False: None,  # every key's slot is led here
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
    assert link.reply_timeout_s == 5.0  # forward-timeout-ms
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


class PausedLink:
    """A leader stopped (SIGSTOP) while holding the forward: it answers
    nothing until ``answer_after_s``, then (a failover moved its shard
    meanwhile) ``MOVED`` to node 3. Honours ``reply_timeout_s`` as the
    RESP link does."""

    def __init__(self, answer_after_s: float) -> None:
        self.answer_after_s = answer_after_s
        self.calls: list[AppendRequest] = []
        self.reply_timeout_s = 30.0

    async def call(self, request: AppendRequest):
        self.calls.append(request)
        try:
            with trio.fail_after(self.reply_timeout_s):
                await trio.sleep(self.answer_after_s)
        except trio.TooSlowError:
            raise Unreachable(f"link to 127.0.0.1:7002: no reply within {self.reply_timeout_s:g} s",
                              sent=True) from None
        raise Refused("MOVED 5 127.0.0.1:7003")


async def test_a_forward_to_a_paused_leader_ends_at_its_deadline_and_is_never_sent_again(node, autojump_clock):
    """Issue 31: a forward waited for a paused leader up to twice
    replica-lag-time-max-ms + 2 s (62 s by default); when the leader came
    back with MOVED, the entry went to the new leader long after the client
    had given up, behind its later acknowledged writes. The forward ends at
    forward-timeout-ms (5 s by default) with -TRYAGAIN, and a MOVED the
    paused leader would send later never makes it send the entry again."""
    paused, new_leader = PausedLink(answer_after_s=20.0), FakeLink([b"9-0"])
    state, dispatcher, ctx = node({0: 2}, {2: paused, 3: new_leader})
    state.config.replica_lag_time_max_ms = 30000
    started = trio.current_time()
    reply = await _xadd(dispatcher, ctx)
    assert trio.current_time() - started == pytest.approx(5.0)
    assert encode(reply, 2) == (b"-TRYAGAIN partition t#0 leader node 2 unreachable: no reply within "
                                b"forward-timeout-ms (5000 ms); it may or may not have been written\r\n")
    await trio.sleep(120)  # long past the paused leader's MOVED
    assert len(paused.calls) == 1 and new_leader.calls == []


async def test_a_forward_resent_after_moved_keeps_the_clients_idempotence_key(node, autojump_clock):
    """The resend to the node a MOVED names is the client's request as it
    was, IDMP / IDMPAUTO included: the new leader drops it if it is a
    retry of what it already has."""
    for options in ([b"IDMP", b"svc-1", b"req-7"], [b"IDMPAUTO", b"svc-1"]):
        two, three = FakeLink([Refused("MOVED 5 127.0.0.1:7003")]), FakeLink([b"9-0"])
        _, dispatcher, ctx = node({n: 2 for n in range(6)}, {2: two, 3: three})
        assert await _xadd(dispatcher, ctx, [b"XADD", b"t", *options, b"*", b"f", b"v"]) == b"9-0"
        assert three.calls == two.calls
        assert three.calls[0].options == (*options, b"*")
