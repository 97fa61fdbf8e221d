"""The cluster runtime (cluster/runtime/) of three nodes in one trio.run,
joined by in-memory peer links (cluster.peer.link.MemoryNetwork) under the
autojump clock: no sockets, no RESP. The controller quorum elects a leader
over the links, an acks=all write waits for the followers' fetches, WAIT
counts them, a forwarded append reaches the partition's leader and a
refusal comes back as the leader's text, a topic read fans out to the
partitions' leaders, a forced failover the controller's own election
overtakes, a node that cannot apply a committed metadata record stops (the
cluster run over the real bus is tests/e2e/)."""

from __future__ import annotations

import types

import pytest
import trio

from cluster.errors import Moved, Refused, TryAgain
from cluster.nodes import key_slot
from cluster.peer.link import MemoryNetwork, Unreachable
from cluster.peer.messages import (READ_AFTER, READ_LENGTH, READ_RANGE, AppendRequest, AppendResponse,
                                   PauseRequest, ReadPart, ReadRequest)
from cluster.controller.metadata import Metadata
from cluster.runtime import replication
from cluster.runtime.controller_driver import ControllerHalted
from cluster.runtime.fanout import merge_by_id
from cluster.topics import TopicRegistry
from storage.entry_codec import decode_entry
from storage.streams.groups import groups_of
from storage.streams import StreamId

NODES = "1@127.0.0.1:7001,2@127.0.0.1:7002,3@127.0.0.1:7003"


def _config(directory, node_id: int) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        cluster_nodes=NODES, node_id=node_id, replication_factor=3, dir=str(directory), cluster_join=False,
        replica_lag_time_max_ms=10000, replica_fetch_wait_max_ms=200, replica_fetch_max_bytes=1 << 20,
        forward_timeout_ms=5000, controller_nodes="", controller_session_timeout_ms=3000, unclean_leader_election=False,
        controller_fast_fencing=True,
        leader_rebalance_delay_ms=-1, controller_snapshot_records=1000, fsync="no", on_change=lambda fn: None,
        # the topics' defaults
        segment_bytes=1 << 20, stream_node_max_entries=100, acks="all", min_insync_replicas=2)


@pytest.fixture
async def cluster(tmp_path):
    """Three nodes' ``Replication``s running, each node's service on the
    network; ``stopped``: the nodes whose controller halted (their run ended
    with ``ControllerHalted``, as their process would)."""
    network = MemoryNetwork()
    nodes, registries = [], []
    links_from: dict[int, list] = {1: [], 2: [], 3: []}  # the links each node made, to cut it off
    cut_off: set[int] = set()  # nodes whose links, also those made later, are down

    def links_of(me: int):
        def make(node):
            link = network.factory(node.id)
            link.up = link.up and me not in cut_off
            links_from[me].append(link)
            return link
        return make

    def set_isolated(node_id: int, isolated: bool) -> None:
        network.set_up(node_id, not isolated)
        (cut_off.add if isolated else cut_off.discard)(node_id)
        for link in links_from[node_id]:
            link.up = not isolated

    def kill(node_id: int, dead) -> None:
        """``node_id``'s process is gone: ``dead`` (a service) answers the
        calls to it, and it sends nothing."""
        for link in network.links:
            if link.service is network.services[node_id]:
                link.service = dead
        network.services[node_id] = dead
        cut_off.add(node_id)
        for link in links_from[node_id]:
            link.up = False

    for node_id in (1, 2, 3):
        config = _config(tmp_path / f"n{node_id}", node_id)
        registry = TopicRegistry.open(tmp_path / f"n{node_id}", config)
        registries.append(registry)
        repl = replication.build(config, registry, links_of(node_id))
        network.add(node_id, repl.service)
        nodes.append(repl)
    stopped: dict[int, BaseExceptionGroup] = {}  # node -> why it stopped (a process would exit)

    async def run(repl) -> None:
        try:
            await repl.run()
        except* ControllerHalted as group:
            stopped[repl.manager.my_id] = group

    async with trio.open_nursery() as nursery:
        for repl in nodes:
            nursery.start_soon(run, repl)
        with trio.fail_after(30):
            while not all(r.controller.meta.initialized and r.controller.lease_ok() for r in nodes):
                await trio.sleep(0.1)
        yield types.SimpleNamespace(nodes=nodes, network=network, set_isolated=set_isolated, kill=kill,
                                    links_from=links_from, stopped=stopped)
        nursery.cancel_scope.cancel()
    for repl, registry in zip(nodes, registries):
        repl.close()
        registry.close()


class _Gone:
    """The service of a node whose process is gone: every connection to it
    is refused. ``pause_refused``, when given, is awaited before a
    ``PauseRequest`` is (a failover's first call, to the old leader)."""

    def __init__(self, pause_refused=None) -> None:
        self.pause_refused = pause_refused

    async def serve(self, request):
        if isinstance(request, PauseRequest) and self.pause_refused is not None:
            await self.pause_refused()
        raise Unreachable("connection refused", refused=True)


def _key_led_by(repl, node_id: int) -> bytes:
    m = repl.manager
    return next(key for key in (b"k%d" % i for i in range(10000))
                if m.state.leader(m.placement.shard_of_slot(key_slot(key))) == node_id)


async def test_an_acks_all_write_waits_for_the_followers_over_memory_links(cluster, autojump_clock):
    leader = cluster.nodes[0]
    key = _key_led_by(leader, 1)
    client = types.SimpleNamespace(repl_writes=None, repl_pending=None)
    stream, pkey = leader.topics.append_target(key, [b"f", b"v"])
    assert leader.before_append(client, pkey, stream)  # acks=all: the reply waits
    stream.add([b"f", b"v"])
    with trio.fail_after(10):
        await leader.wait_acks(client, {pkey: stream})
    assert stream.log.high_watermark == 1
    assert leader.replicas_acknowledging(client) == 2
    for follower in cluster.nodes[1:]:
        copy = follower.topics.get(key)
        assert copy is not None and copy.log.log_end_offset == 1


async def _awaiting(node, client, pending) -> None:
    await node.wait_acks(client, pending)


async def _handed_over(node, client, pending) -> None:
    """``when_acked``, the way a connection hands its held replies over."""
    done = trio.Event()
    outcome = []
    node.when_acked(client, pending, lambda error: (outcome.append(error), done.set()))
    await done.wait()
    if outcome[0] is not None:
        raise outcome[0]


@pytest.mark.parametrize("wait_for_acks", [_awaiting, _handed_over], ids=["wait_acks", "when_acked"])
async def test_an_acks_all_wait_fails_when_leadership_moved_even_once_the_high_watermark_passes_it(
        cluster, wait_for_acks):
    """A leader cut off from its peers appends a write and waits for its
    followers; meanwhile another node is elected and writes further. Healed,
    the old leader truncates its write away and, as a follower, copies the new
    leader's log past where its write ended: its high watermark passes the
    write's end offset, but the write is not there. A wait for it must fail
    (the client retries, as after any leader change), not acknowledge it:
    the one started with the write (it may see the high watermark pass
    before the tick tells it the leadership moved), and one started only now
    (a Kafka response queued behind others), with the marks taken at the
    write (``ack_marks``) or without."""
    old = cluster.nodes[0]
    key = _key_led_by(old, 1)
    client = types.SimpleNamespace(repl_writes=None, repl_pending=None)

    def write(node, value: bytes):
        stream, pkey = node.topics.append_target(key, [b"f", value])
        assert node.before_append(client, pkey, stream)
        stream.add([b"f", value])
        return {pkey: stream}

    with trio.fail_after(10):
        await old.wait_acks(client, write(old, b"everywhere"))
    cluster.set_isolated(1, True)
    pending = write(old, b"on the old leader only")
    marks = old.ack_marks(pending)
    ((pkey, stream),) = pending.items()
    end = stream.log.log_end_offset
    outcome = []

    async def wait() -> None:
        try:
            await wait_for_acks(old, client, pending)
        except replication.AcksFailed as e:
            outcome.append(e)
        else:
            outcome.append("acknowledged")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait)
        m = cluster.nodes[1].manager
        shard = m.placement.shard_of_slot(key_slot(key))
        with trio.fail_after(30):
            while m.state.leader(shard) == 1:
                await trio.sleep(0.1)
        new = cluster.nodes[m.state.leader(shard) - 1]
        with trio.fail_after(30):
            for i in range(5):
                while True:
                    try:
                        written = write(new, b"new %d" % i)
                        break
                    except Exception:  # noqa: BLE001 - too few in sync until the controller drops node 1
                        await trio.sleep(0.1)
                await new.wait_acks(client, written)
        cluster.set_isolated(1, False)
        with trio.fail_after(30):
            while not outcome or stream.log.high_watermark < end:
                await trio.sleep(0.1)
    assert isinstance(outcome[0], replication.AcksFailed), outcome
    for late in (marks, None):
        with pytest.raises(replication.AcksFailed), trio.fail_after(10):
            await old.wait_acks(client, pending, late)


async def test_a_forwarded_append_reaches_the_leader_and_a_refusal_keeps_its_text(cluster, autojump_clock):
    one, two = cluster.nodes[0], cluster.nodes[1]
    appended = []

    async def append(request: AppendRequest) -> AppendResponse:
        appended.append(request)
        return AppendResponse(b"7-1")

    two.service.appender = append
    request = AppendRequest(b"t#1", (b"*",), (b"f", b"v"))
    assert (await one.forwarder.forward(request, 2, client_id=5)).id == b"7-1"
    assert appended == [request]
    with pytest.raises(Refused) as refused:  # node 2 leads shard 1, not shard 0
        await one.link(2, "admin").call(PauseRequest(0, 1, 100))
    assert refused.value.text == "ERR this node does not lead that shard"
    cluster.network.set_up(2, False)
    with pytest.raises(Unreachable) as down:
        await one.link(2, "admin").call(PauseRequest(1, 1, 100))
    assert not down.value.sent


async def test_a_topic_read_fans_out_to_the_partitions_leaders_committed_entries_only(cluster, autojump_clock):
    """Each node reads a topic led by all three (cluster/runtime/fanout.py):
    every partition's share from its leader, merged by ID; an entry above a
    leader's high watermark (a follower cut off, still in the ISR) is not
    read, nor counted; a node asked for a partition it does not lead says
    so (TRYAGAIN), as the asking node does of a leader it cannot reach."""
    nodes = cluster.nodes
    by_id = {r.manager.my_id: r for r in nodes}

    def leader_of(n: int):
        m = nodes[0].manager
        return by_id[m.state.leader(m.shard_of(b"t", n))]

    leader_of(0).topics.create_topic(b"t", 6)
    with trio.fail_after(30):
        while not all(r.topics.partitions_of(b"t") == 6 for r in nodes):
            await trio.sleep(0.1)
    assert len({leader_of(n).manager.my_id for n in range(6)}) > 1
    for n in range(6):
        leader = leader_of(n)
        client = types.SimpleNamespace(repl_writes=None, repl_pending=None)
        pkey = b"t#%d" % n
        stream = leader.topics.stream_of(b"t", n)
        leader.before_append(client, pkey, stream)
        stream.add([b"n", b"%d" % n], id_given=StreamId(10 + n % 3, 0))
        with trio.fail_after(10):
            await leader.wait_acks(client, {pkey: stream})
    everything = ReadPart(b"", 0, READ_RANGE, (0, 0), (99, 0))
    for node in nodes:
        merged = merge_by_id(await node.fanout.read(b"t", everything, client_id=1), None, False)
        assert [decode_entry(e)[1][1] for e in merged.chunks] == [b"0", b"3", b"1", b"4", b"2", b"5"]
        assert sum(p.length for p in await node.fanout.read(b"t", ReadPart(b"", 0, READ_LENGTH))) == 6
    # Partition k's leader appends while a follower is cut off: above its high watermark.
    k = next(n for n in range(6) if leader_of(n) is not nodes[0])
    leader = leader_of(k)
    cut = next(r for r in nodes if r is not nodes[0] and r is not leader)
    fetches = [link for link in cluster.links_from[cut.manager.my_id] if link.service is leader.service]
    for link in fetches:  # it cannot fetch; it still answers
        link.up = False
    stream = leader.topics.stream_of(b"t", k)
    stream.add([b"n", b"late"], id_given=StreamId(50, 0))
    assert stream.length == 2 and stream.log.high_watermark == 1
    assert sum(p.length for p in await nodes[0].fanout.read(b"t", ReadPart(b"", 0, READ_LENGTH))) == 6
    found = await nodes[0].fanout.read(b"t", ReadPart(b"", 0, READ_AFTER, (10, 0)))
    assert [len(p.ids) for p in found] == [0, 1, 1, 0, 1, 1]
    for link in fetches:
        link.up = True
    with pytest.raises(Refused) as refused:
        await nodes[0].link(leader.manager.my_id, "read0").call(
            ReadRequest((ReadPart(b"t", next(n for n in range(6) if leader_of(n) is not leader), READ_LENGTH),)))
    assert refused.value.code == "TRYAGAIN" and "does not lead partition t#" in refused.value.text
    cluster.network.set_up(leader.manager.my_id, False)  # a leader that cannot be reached
    with pytest.raises(TryAgain, match=f"leader node {leader.manager.my_id} unreachable: link down"):
        await nodes[0].fanout.read(b"t", ReadPart(b"", 0, READ_LENGTH))
    with pytest.raises(TryAgain, match="unreachable"):
        await nodes[0].fanout.wait_for_entries(b"t", [(99, 0)] * 6, 1.0)


@pytest.mark.parametrize("wait_for_acks", [_awaiting, _handed_over], ids=["wait_acks", "when_acked"])
async def test_an_acks_all_wait_fails_when_the_partition_is_led_here_at_another_epoch_than_its_writes(
        cluster, autojump_clock, wait_for_acks):
    """A command writes (an entry, a group change) at leader epoch E, then
    awaits other nodes; meanwhile this node loses the partition and leads it
    again at E+1 (simulated: every node's view of the shard moves on), with its
    log's high watermark and the followers' journals past the writes' marks.
    Its wait starts only now, after the command: it must fail (the writes may
    have been truncated away in between), not compare the new epoch's log
    and journal with marks taken now, nor the marks' epoch taken now
    (``ack_marks``)."""
    leader = cluster.nodes[0]
    key = _key_led_by(leader, 1)
    client = types.SimpleNamespace(repl_writes=None, repl_pending=None)
    stream, pkey = leader.topics.append_target(key, [b"f", b"v"])
    assert leader.before_append(client, pkey, stream)
    stream.add([b"f", b"v"])
    store = groups_of(stream)
    store.create_group(b"g", (0, 0), 0)
    leader.note_group_write(client, store)
    pending = client.repl_pending
    assert ("groups", *leader.manager.partition_at(store.directory)) in pending
    shard = leader.manager.shard_of(*leader.manager.partition_at(store.directory))
    written_at = leader.manager.state.shards[shard][1]
    for node in cluster.nodes:  # led here again, at the next epoch (as after a failover and back)
        node.manager.state.shards[shard] = (1, written_at + 1)
        node.manager.state.version += 1
    with trio.fail_after(10):
        await leader.wait_acks(client, dict(pending))  # (as of now: replicated at the new epoch)
    assert [mark[1] for mark in leader.ack_marks(pending).values()] == [written_at]
    with pytest.raises(replication.AcksFailed), trio.fail_after(10):
        await wait_for_acks(leader, client, pending)
    del pending[pkey]  # the group write alone
    with pytest.raises(replication.AcksFailed), trio.fail_after(10):
        await wait_for_acks(leader, client, pending)


async def test_an_acks_all_deletion_waits_until_every_in_sync_replica_has_applied_it(cluster, autojump_clock):
    """XDEL's deletion markers (as XTRIM's log start and XSETID's metadata)
    are the stream's state, not log batches: an acks=all reply waits until
    every in-sync follower has applied them, as for a group write, so a
    failover right after an acknowledged XDEL does not bring the entry back."""
    leader = cluster.nodes[0]
    key = _key_led_by(leader, 1)
    client = types.SimpleNamespace(repl_writes=None, repl_pending=None)
    stream, pkey = leader.topics.append_target(key, [b"f", b"v"])
    assert leader.before_append(client, pkey, stream)
    entry_id = stream.add([b"f", b"v"])
    with trio.fail_after(10):
        await leader.wait_acks(client, {pkey: stream})
    assert [f.topics.get(key).length for f in cluster.nodes[1:]] == [1, 1]
    assert stream.delete([entry_id]) == 1
    leader.note_state_write(client, stream)
    with trio.fail_after(10):
        await leader.wait_acks(client, client.repl_pending or {})
    assert [f.topics.get(key).length for f in cluster.nodes[1:]] == [0, 0]


def _spec(name: str, flags: str, key_at: int = 1) -> types.SimpleNamespace:
    """What ``Replication.route`` reads of a command's declaration."""
    return types.SimpleNamespace(name=name, flags=frozenset(flags.split()), key_indexes=lambda argv: [key_at])


async def test_a_readonly_connections_stream_reads_of_a_followed_key_run_here_and_the_rest_is_moved(
        cluster, autojump_clock):
    """READONLY (``replica_reads``): the stream reads of a key this node
    follows pass ``route`` (served from its copy) once the copy applied a
    fetch reply of its leader; writes and group commands, and every read
    without READONLY, are Moved to the leader."""
    leader, follower = cluster.nodes[0], cluster.nodes[1]
    key = _key_led_by(leader, 1)
    xrange = (_spec("xrange", "readonly"), [b"XRANGE", key, b"-", b"+"])
    assert isinstance(follower.route(*xrange, True), Moved)  # no copy of the key here yet
    client = types.SimpleNamespace(repl_writes=None, repl_pending=None)
    stream, pkey = leader.topics.append_target(key, [b"f", b"v"])
    leader.before_append(client, pkey, stream)
    stream.add([b"f", b"v"])
    with trio.fail_after(10):
        await leader.wait_acks(client, {pkey: stream})  # (every follower fetched it: acks=all)
    reads = [(_spec("xrange", "readonly"), [b"XRANGE", key, b"-", b"+"]),
             (_spec("xrevrange", "readonly"), [b"XREVRANGE", key, b"+", b"-"]),
             (_spec("xlen", "readonly fast"), [b"XLEN", key]),
             (_spec("xread", "readonly blocking movablekeys", 2), [b"XREAD", b"STREAMS", key, b"0"]),
             (_spec("xinfo|stream", "readonly", 2), [b"XINFO", b"STREAM", key])]
    others = [(_spec("xadd", "write denyoom fast"), [b"XADD", key, b"*", b"f", b"v"]),
              (_spec("xreadgroup", "write blocking movablekeys", 4), [b"XREADGROUP", b"GROUP", b"g", b"c", key]),
              (_spec("xpending", "readonly"), [b"XPENDING", key, b"g"]),
              (_spec("xinfo|groups", "readonly", 2), [b"XINFO", b"GROUPS", key]),
              (_spec("xgroup|create", "write denyoom", 2), [b"XGROUP", b"CREATE", key, b"g", b"0"])]
    for spec, argv in reads:
        assert isinstance(follower.route(spec, argv), Moved), spec.name
        assert follower.route(spec, argv, True) is None, spec.name
        assert leader.route(spec, argv, True) is None and leader.route(spec, argv) is None
    for spec, argv in others:
        moved = follower.route(spec, argv, True)
        assert isinstance(moved, Moved) and moved.leader.id == 1, spec.name
        assert leader.route(spec, argv, True) is None


async def test_a_forced_failover_answers_ok_when_the_controller_made_the_asking_node_leader_meanwhile(
        cluster, autojump_clock):
    """CLUSTER FAILOVER FORCE on a follower right after its leader's process
    died: before its pause request to the old leader is refused, the
    controller fences the dead node (its connections are refused) and
    elects this very node. The user asked for this node to lead the shard,
    and it does: the failover answers OK (not 'not committed: leadership
    moved meanwhile'), and, as any manual failover, makes it the shard's
    preferred replica. (The dead node does not lead the controller: a
    controller elected anew would fence it only once its session timed out,
    on the monotonic clock, which the test's clock does not move.)"""
    dead = next(r.manager.my_id for r in cluster.nodes if not r.controller.is_leader)
    key = _key_led_by(cluster.nodes[0], dead)
    m = cluster.nodes[0].manager
    shard = m.placement.shard_of_slot(key_slot(key))
    asker = next(r for r in m.placement.replicas(shard) if r != dead)  # the one the controller elects first
    node = cluster.nodes[asker - 1]

    async def elected_meanwhile() -> None:
        while node.manager.state.leader(shard) != asker:
            await trio.sleep(0.01)

    cluster.kill(dead, _Gone(pause_refused=elected_meanwhile))
    with trio.fail_after(30):
        await node.take_shard(shard, force=True)
    sm = node.controller.meta.shards[shard]
    assert (sm.leader, sm.replicas[0]) == (asker, asker), sm
    assert node.manager.state.leader(shard) == asker


async def test_a_node_that_cannot_apply_a_committed_metadata_record_stops_instead_of_skipping_it(
        cluster, autojump_clock, caplog):
    """A committed metadata record whose apply raises on one node (a bug, a
    record it cannot take): going on would leave that node's metadata
    different from everyone else's (the record skipped, the next ones
    applied on top) while it serves on it. It stops instead, saying so, as
    when it cannot write its controller state: its lease ends at once (no
    write is acknowledged on what it believes), it applies nothing after
    the record, its run ends (the process exits with code 1) and the others,
    which applied it, go on."""
    controller = next(r.controller for r in cluster.nodes if r.controller.is_leader)
    victim = next(r.controller for r in cluster.nodes if not r.controller.is_leader)
    apply = victim.meta.apply

    def poisoned(data: bytes):
        if b"poison" in data:
            raise RuntimeError("cannot apply this one")
        return apply(data)

    victim.meta.apply = poisoned
    await controller.propose(Metadata.topic_record(b"poison", None, "", -1))
    poison_index = controller.raft.last_index
    with trio.fail_after(30):
        while victim.my_id not in cluster.stopped:
            await trio.sleep(0.1)
    assert not victim.lease_ok()
    assert f"record {poison_index} could not be applied" in victim.halted
    assert any(r.levelname == "CRITICAL" and f"record {poison_index} could not be applied" in r.getMessage()
               for r in caplog.records)
    await controller.propose(Metadata.topic_record(b"after", None, "", -1))
    with trio.fail_after(30):
        while not all(r.controller.applied > poison_index for r in cluster.nodes if r.controller is not victim):
            await trio.sleep(0.1)
    assert victim.applied < poison_index
