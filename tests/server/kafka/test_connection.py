"""The Kafka connection loop (server/kafka_front/connection.py) over a socketpair, in one trio run:
responses in request order, a produce's response only once its fsync is done (and a later
request's response not before it), a handler's bug closing the connection and nothing else."""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
import uuid

import trio
import trio.testing

from cluster.broker import XAddPlan
from server.kafka import codec, framing, records
from server.kafka import errors as E
from server.kafka_front import apis
from server.kafka_front.apis import SERVED
from server.kafka_front.connection import KafkaConnection
from server.kafka_front.context import KafkaFront
from tests.server.support import RoundGate, TopicsHarness

C = codec


def serve(h: TopicsHarness, nursery) -> trio.SocketStream:
    front = KafkaFront(h.state, dict(SERVED), 9092, 0)
    ours, theirs = socket.socketpair()
    client = h.state.new_client("test:1", "test:0", ours.fileno())
    nursery.start_soon(KafkaConnection(front, ours, client).run)
    return trio.SocketStream(trio.socket.from_stdlib_socket(theirs))


async def read_frame(stream) -> bytes | None:
    buf = b""
    while len(buf) < 4 or len(buf) < 4 + struct.unpack(">i", buf[:4])[0]:
        data = await stream.receive_some(1 << 20)
        if not data:
            return None
        buf += data
    size = struct.unpack(">i", buf[:4])[0]
    assert len(buf) == 4 + size, "one frame at a time here"
    return buf[4:]


def produce_request(correlation: int, topic: str) -> bytes:
    batch = records.encode_batch(records.make_batch([(b"k", b"v", [])], base_offset=0, timestamps_ms=[0]))
    P = C.ProduceRequest
    body = P(acks=1, timeout_ms=5000, topic_data=[P.TopicProduceData(name=topic, partition_data=[
        P.PartitionProduceData(index=0, records=batch)])])
    return framing.encode_request(0, 9, correlation, "t", body)


async def test_a_produce_is_answered_after_its_fsync_and_nothing_overtakes_it(tmp_path, autojump_clock):
    gate = RoundGate()
    h = TopicsHarness(tmp_path, fsync="always", rounds=gate)
    h.state.broker.session().create_topic(b"t")
    async with trio.open_nursery() as nursery:
        stream = serve(h, nursery)
        await stream.send_all(produce_request(1, "t") + framing.encode_request(18, 3, 2, "t", C.ApiVersionsRequest()))
        await trio.testing.wait_all_tasks_blocked()
        assert h.state.broker.session().length(b"t") == 1  # written, its fsync round held
        with trio.move_on_after(0.5) as waited:
            await stream.receive_some(1)
        assert waited.cancelled_caught  # neither response left: the produce waits, ApiVersions after it
        gate.open()
        correlation, resp = framing.decode_response(0, 9, await read_frame(stream))
        assert (correlation, resp.responses[0].partition_responses[0].error_code) == (1, E.NONE)
        correlation, resp = framing.decode_response(18, 3, await read_frame(stream))
        assert correlation == 2 and resp.error_code == E.NONE
        await stream.aclose()


async def test_pipelined_requests_are_answered_in_order(tmp_path):
    h = TopicsHarness(tmp_path)
    h.state.broker.session().create_topic(b"t")
    M = C.MetadataRequest
    requests = []
    for i in range(1, 31):
        if i % 3 == 0:
            requests.append(produce_request(i, "t"))
        elif i % 3 == 1:
            requests.append(framing.encode_request(3, 12, i, "t", M(topics=[M.MetadataRequestTopic(name="t")])))
        else:
            requests.append(framing.encode_request(18, 3, i, "t", C.ApiVersionsRequest()))
    async with trio.open_nursery() as nursery:
        stream = serve(h, nursery)
        await stream.send_all(b"".join(requests))
        got = []
        buf = b""
        while len(got) < 30:
            buf += await stream.receive_some(1 << 20)
            while len(buf) >= 4 and len(buf) >= 4 + struct.unpack(">i", buf[:4])[0]:
                size = struct.unpack(">i", buf[:4])[0]
                got.append(struct.unpack(">i", buf[4:8])[0])
                buf = buf[4 + size:]
        assert got == list(range(1, 31))
        await stream.aclose()


async def test_a_handler_that_fails_closes_its_connection_only(tmp_path, monkeypatch, caplog):
    h = TopicsHarness(tmp_path)

    async def broken(ctx, req):
        raise RuntimeError("a bug")

    monkeypatch.setitem(apis.HANDLERS, 60, broken)
    async with trio.open_nursery() as nursery:
        stream = serve(h, nursery)
        with caplog.at_level(logging.ERROR, "partita.kafka"):
            await stream.send_all(framing.encode_request(60, 0, 1, "t", C.DescribeClusterRequest()))
            assert await read_frame(stream) is None  # closed, no response
        assert "DescribeCluster v0 failed" in caplog.text and "a bug" in caplog.text
        # the server goes on: another connection is served
        other = serve(h, nursery)
        await other.send_all(framing.encode_request(18, 3, 7, "t", C.ApiVersionsRequest()))
        assert framing.decode_response(18, 3, await read_frame(other))[0] == 7
        await other.aclose()
    assert not h.state.clients  # both clients were removed


# -- SASL and ACLs (server/kafka_front/sasl.py, access.py) ----------------------------------


class Peer:
    """The client end: requests out, responses decoded in order (several may arrive at once)."""

    def __init__(self, stream) -> None:
        self.stream = stream
        self.buf = b""
        self.correlation = 0

    async def frame(self) -> bytes | None:
        while len(self.buf) < 4 or len(self.buf) < 4 + struct.unpack(">i", self.buf[:4])[0]:
            try:
                data = await self.stream.receive_some(1 << 20)
            except trio.BrokenResourceError:  # (reset: closed before all we sent was read)
                data = b""
            if not data:
                return None
            self.buf += data
        size = struct.unpack(">i", self.buf[:4])[0]
        frame, self.buf = self.buf[4:4 + size], self.buf[4 + size:]
        return frame

    def request(self, body, version: int) -> bytes:
        self.correlation += 1
        return framing.encode_request(body.API_KEY, version, self.correlation, "t", body)

    async def response(self, body, version: int, correlation: int | None = None):
        frame = await self.frame()
        assert frame is not None, "closed"
        got, resp = framing.decode_response(body.API_KEY, version, frame)
        assert got == (correlation or self.correlation)
        return resp

    async def call(self, body, version: int):
        await self.stream.send_all(self.request(body, version))
        return await self.response(body, version)

    async def login(self, user: bytes, password: bytes, mechanism: str = "PLAIN") -> None:
        hs = await self.call(C.SaslHandshakeRequest(mechanism=mechanism), 1)
        assert (hs.error_code, hs.mechanisms) == (E.NONE, ["PLAIN", "SCRAM-SHA-256"])
        assert (await self.call(C.SaslAuthenticateRequest(auth_bytes=b"\0" + user + b"\0" + password), 2)
                ).error_code == E.NONE


def metadata(*names: str):
    M = C.MetadataRequest
    return M(topics=None if not names else [M.MetadataRequestTopic(name=n) for n in names])


async def test_with_a_password_nothing_but_apiversions_and_sasl_is_served_before_authentication(tmp_path, caplog):
    h = TopicsHarness(tmp_path, requirepass="pw")
    async with trio.open_nursery() as nursery:
        peer = Peer(serve(h, nursery))
        with caplog.at_level(logging.INFO, "partita.kafka"):
            versions = await peer.call(C.ApiVersionsRequest(), 3)
            assert {(k.api_key, k.min_version, k.max_version) for k in versions.api_keys} >= {(17, 0, 1), (36, 0, 2)}
            await peer.stream.send_all(peer.request(metadata(), 12))
            assert await peer.frame() is None  # closed, no response: as a Kafka SASL listener
        assert "Unexpected Kafka request of type METADATA during SASL handshake." in caplog.text
        peer = Peer(serve(h, nursery))
        await peer.login(b"default", b"pw")
        assert (await peer.call(metadata(), 12)).brokers[0].port == 9092
        assert [c.user for c in h.state.clients.values()] == ["default"]
        await peer.stream.aclose()


async def test_a_failed_authentication_is_answered_then_the_connection_closes(tmp_path):
    h = TopicsHarness(tmp_path, requirepass="pw")
    async with trio.open_nursery() as nursery:
        peer = Peer(serve(h, nursery))
        assert (await peer.call(C.SaslHandshakeRequest(mechanism="PLAIN"), 1)).error_code == E.NONE
        # pipelined after it: never answered
        await peer.stream.send_all(peer.request(C.SaslAuthenticateRequest(auth_bytes=b"\0default\0nope"), 1)
                                   + peer.request(C.ApiVersionsRequest(), 3))
        resp = await peer.response(C.SaslAuthenticateRequest(), 1, correlation=2)
        assert (resp.error_code, resp.error_message) == (
            E.SASL_AUTHENTICATION_FAILED, "Authentication failed: Invalid username or password")
        assert await peer.frame() is None
        peer = Peer(serve(h, nursery))
        assert (await peer.call(C.SaslHandshakeRequest(mechanism="OAUTHBEARER"), 0)).error_code == \
            E.UNSUPPORTED_SASL_MECHANISM
        assert await peer.frame() is None
    assert not h.state.clients


async def test_a_v0_handshake_runs_scram_with_bare_tokens(tmp_path):
    import scramp

    h = TopicsHarness(tmp_path, requirepass="pw")
    async with trio.open_nursery() as nursery:
        peer = Peer(serve(h, nursery))
        assert (await peer.call(C.SaslHandshakeRequest(mechanism="SCRAM-SHA-256"), 0)).error_code == E.NONE
        client = scramp.ScramClient(["SCRAM-SHA-256"], "default", "pw")
        for token in (client.get_client_first, client.get_client_final):
            data = token().encode()
            await peer.stream.send_all(len(data).to_bytes(4, "big") + data)
            reply = (await peer.frame()).decode()
            (client.set_server_first if token == client.get_client_first else client.set_server_final)(reply)
        assert (await peer.call(metadata(), 12)).cluster_id == "partita"
        await peer.stream.aclose()


async def test_frames_are_small_until_authenticated_and_a_large_request_right_after_is_served(tmp_path, caplog):
    """Kafka's sasl.server.max.receive.size (512 KiB) before authentication; a large Produce
    sent in the same packet as the SaslAuthenticate that succeeds is read with the normal limit."""
    h = TopicsHarness(tmp_path, requirepass="pw")
    h.state.broker.session().create_topic(b"t")
    big = b"v" * (600 * 1024)
    batch = records.encode_batch(records.make_batch([(None, big, [])], base_offset=0, timestamps_ms=[0]))
    P = C.ProduceRequest
    produce = P(acks=1, timeout_ms=5000, topic_data=[P.TopicProduceData(
        name="t", partition_data=[P.PartitionProduceData(index=0, records=batch)])])
    async with trio.open_nursery() as nursery:
        peer = Peer(serve(h, nursery))
        with caplog.at_level(logging.INFO, "partita.kafka"):
            with contextlib.suppress(trio.BrokenResourceError):  # (closed before it took all of it)
                await peer.stream.send_all(peer.request(produce, 9))
            assert await peer.frame() is None
        assert "larger than 524288" in caplog.text
        peer = Peer(serve(h, nursery))
        await peer.stream.send_all(
            peer.request(C.SaslHandshakeRequest(mechanism="PLAIN"), 1)
            + peer.request(C.SaslAuthenticateRequest(auth_bytes=b"\0default\0pw"), 2) + peer.request(produce, 9))
        assert (await peer.response(C.SaslHandshakeRequest(), 1, correlation=1)).error_code == E.NONE
        assert (await peer.response(C.SaslAuthenticateRequest(), 2, correlation=2)).error_code == E.NONE
        resp = await peer.response(produce, 9, correlation=3)
        assert resp.responses[0].partition_responses[0].error_code == E.NONE
        assert h.state.broker.session().length(b"t") == 1
        await peer.stream.aclose()


async def test_a_users_acl_rules_govern_its_kafka_requests(tmp_path):
    """Key patterns and commands: XADD for Produce, XREAD for Fetch / ListOffsets, TOPIC
    CREATE / DELETE / ALTER / DESCRIBE for the admin APIs, CONFIG GET for the broker's configs;
    Metadata shows what the user may act on."""
    h = TopicsHarness(tmp_path, requirepass="pw")
    session = h.state.broker.session()
    for name in (b"mine", b"theirs", b"in"):
        session.create_topic(name)
    session.create_topic(b"parts", 2)
    h.state.acl.setuser("app", ["on", ">pw", "~mine*", "~in", "~parts#1", "-@all", "+xadd", "+xread",
                                "+topic|describe", "+topic|create"])
    h.state.acl.setuser("admin", ["on", ">pw", "~*", "-@all", "+@write", "-topic|delete"])
    batch = records.encode_batch(records.make_batch([(b"k", b"v", [])], base_offset=0, timestamps_ms=[0]))
    P, F, L = C.ProduceRequest, C.FetchRequest, C.ListOffsetsRequest

    def produce(topic, index=0):
        return P(acks=1, timeout_ms=5000, topic_data=[P.TopicProduceData(
            name=topic, partition_data=[P.PartitionProduceData(index=index, records=batch)])])

    async with trio.open_nursery() as nursery:
        app = Peer(serve(h, nursery))
        await app.login(b"app", b"pw")
        for topic, index, code in (("mine", 0, E.NONE), ("theirs", 0, E.TOPIC_AUTHORIZATION_FAILED),
                                   ("parts", 1, E.NONE), ("parts", 0, E.TOPIC_AUTHORIZATION_FAILED)):
            part = (await app.call(produce(topic, index), 9)).responses[0].partition_responses[0]
            assert part.error_code == code, (topic, index)
        assert part.error_message == ("Not authorized to access topics: [parts] "
                                      "(user 'app' may not run XADD on parts or parts#0)")
        fetch = await app.call(F(max_wait_ms=0, min_bytes=1, session_epoch=-1, topics=[
            F.FetchTopic(topic=t, partitions=[F.FetchPartition(partition=0, partition_max_bytes=1 << 20)])
            for t in ("mine", "theirs")]), 12)
        assert [t.partitions[0].error_code for t in fetch.responses] == [E.NONE, E.TOPIC_AUTHORIZATION_FAILED]
        offsets = await app.call(L(replica_id=-1, topics=[L.ListOffsetsTopic(
            name="theirs", partitions=[L.ListOffsetsPartition(partition_index=0, timestamp=-1)])]), 7)
        assert offsets.topics[0].partitions[0].error_code == E.TOPIC_AUTHORIZATION_FAILED
        listed = await app.call(C.MetadataRequest(topics=None, include_topic_authorized_operations=True), 12)
        shown = {t.name: t.topic_authorized_operations for t in listed.topics}
        assert set(shown) == {"mine", "in", "parts"}  # a partition key is enough to see the topic
        assert shown["mine"] == sum(1 << op for op in (3, 4, 5, 8, 10))  # READ WRITE CREATE DESCRIBE DESCRIBE_CONFIGS
        assert shown["parts"] == sum(1 << op for op in (3, 4, 8))
        named = await app.call(metadata("theirs", "mine-new", "other-new"), 12)
        assert [(t.name, t.error_code) for t in named.topics] == [
            ("theirs", E.TOPIC_AUTHORIZATION_FAILED), ("mine-new", E.NONE),  # auto-created: it may TOPIC CREATE it
            ("other-new", E.TOPIC_AUTHORIZATION_FAILED)]
        assert session.record_topics([b"other-new"])[b"other-new"] is None
        CT, DT = C.CreateTopicsRequest, C.DeleteTopicsRequest
        created = await app.call(CT(topics=[CT.CreatableTopic(name=n, num_partitions=1, replication_factor=-1)
                                            for n in ("mine2", "theirs2")]), 7)
        assert [t.error_code for t in created.topics] == [E.NONE, E.TOPIC_AUTHORIZATION_FAILED]
        deleted = await app.call(DT(topic_names=["mine2"]), 5)
        assert deleted.responses[0].error_code == E.TOPIC_AUTHORIZATION_FAILED  # no TOPIC DELETE
        CP = C.CreatePartitionsRequest
        grown = await app.call(CP(topics=[CP.CreatePartitionsTopic(name="mine", count=3, assignments=None)]), 3)
        assert grown.results[0].error_code == E.TOPIC_AUTHORIZATION_FAILED  # no TOPIC ALTER
        DC = C.DescribeConfigsRequest
        described = await app.call(DC(resources=[DC.DescribeConfigsResource(resource_type=2, resource_name=n)
                                                  for n in ("mine", "theirs")]
                                       + [DC.DescribeConfigsResource(resource_type=4, resource_name="")]), 4)
        assert [r.error_code for r in described.results] == [
            E.NONE, E.TOPIC_AUTHORIZATION_FAILED, E.CLUSTER_AUTHORIZATION_FAILED]

        admin = Peer(serve(h, nursery))
        await admin.login(b"admin", b"pw")
        AC = C.AlterConfigsRequest
        altered = await admin.call(AC(resources=[AC.AlterConfigsResource(resource_type=2, resource_name="theirs")]), 2)
        assert altered.responses[0].error_code == E.NONE  # TOPIC ALTER is @write
        assert (await admin.call(DT(topic_names=["theirs"]), 5)).responses[0].error_code == \
            E.TOPIC_AUTHORIZATION_FAILED  # -topic|delete
        # a change to the user reaches its connection at once
        h.state.acl.setuser("admin", ["+topic|delete"])
        h.state.acl.refresh_clients(list(h.state.clients.values()))
        assert (await admin.call(DT(topic_names=["theirs"]), 5)).responses[0].error_code == E.NONE
        await app.stream.aclose()
        await admin.stream.aclose()


async def test_init_producer_id_needs_the_right_to_write(tmp_path):
    """Kafka asks for IDEMPOTENT_WRITE on the cluster (or WRITE on some topic): here XADD."""
    h = TopicsHarness(tmp_path, requirepass="pw")
    h.state.acl.setuser("reader", ["on", ">pw", "~*", "-@all", "+@read"])
    h.state.acl.setuser("writer", ["on", ">pw", "~w*", "-@all", "+xadd"])
    async with trio.open_nursery() as nursery:
        for user, code in ((b"reader", E.CLUSTER_AUTHORIZATION_FAILED), (b"writer", E.NONE)):
            peer = Peer(serve(h, nursery))
            await peer.login(user, b"pw")
            resp = await peer.call(C.InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=-1), 4)
            assert resp.error_code == code, user
            await peer.stream.aclose()


async def test_group_operations_need_the_rights_of_the_redis_group_commands(tmp_path):
    """XREAD for the group protocol and offsets (and on each topic committed), XINFO
    GROUPS to list or describe groups, XGROUP DESTROY to delete them (docs/kafka.md)."""
    h = TopicsHarness(tmp_path, requirepass="pw")
    session = h.state.broker.session()
    for name in (b"mine", b"theirs"):
        session.create_topic(name)
    h.state.acl.setuser("member", ["on", ">pw", "~mine", "-@all", "+@read"])
    h.state.acl.setuser("writer", ["on", ">pw", "~*", "-@all", "+xadd"])
    OC = C.OffsetCommitRequest

    def commit(*topics):
        return OC(group_id="g", generation_id_or_member_epoch=-1, member_id="", topics=[
            OC.OffsetCommitRequestTopic(name=t, partitions=[OC.OffsetCommitRequestPartition(
                partition_index=0, committed_offset=1, committed_metadata="")]) for t in topics])

    async with trio.open_nursery() as nursery:
        reader = Peer(serve(h, nursery))
        await reader.login(b"writer", b"pw")  # a producer only
        assert (await reader.call(C.FindCoordinatorRequest(key="g"), 3)).error_code == E.GROUP_AUTHORIZATION_FAILED
        joined = await reader.call(C.JoinGroupRequest(
            group_id="g", session_timeout_ms=10000, rebalance_timeout_ms=10000, member_id="", protocol_type="consumer",
            protocols=[C.JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"")]), 5)
        assert joined.error_code == E.GROUP_AUTHORIZATION_FAILED
        fetched = await reader.call(C.OffsetFetchRequest(group_id="g", topics=None), 7)
        assert fetched.error_code == E.GROUP_AUTHORIZATION_FAILED
        beat = await reader.call(C.ConsumerGroupHeartbeatRequest(  # KIP-848: XREAD too
            group_id="k", member_id="m", member_epoch=0, rebalance_timeout_ms=1000, subscribed_topic_names=["mine"]), 1)
        assert beat.error_code == E.GROUP_AUTHORIZATION_FAILED
        described = await reader.call(C.ConsumerGroupDescribeRequest(group_ids=["k"]), 1)
        assert described.groups[0].error_code == E.GROUP_AUTHORIZATION_FAILED  # XINFO GROUPS

        member = Peer(serve(h, nursery))
        await member.login(b"member", b"pw")
        assert (await member.call(C.FindCoordinatorRequest(key="g"), 3)).error_code == E.NONE
        committed = await member.call(commit("mine", "theirs"), 8)
        assert [t.partitions[0].error_code for t in committed.topics] == [E.NONE, E.TOPIC_AUTHORIZATION_FAILED]
        fetched = await member.call(C.OffsetFetchRequest(group_id="g", topics=None), 7)
        assert [(t.name, t.partitions[0].committed_offset) for t in fetched.topics] == [("mine", 1)]
        assert [g.group_id for g in (await member.call(C.ListGroupsRequest(), 4)).groups] == ["g"]  # XINFO: @read
        deleted = await member.call(C.DeleteGroupsRequest(groups_names=["g"]), 2)
        assert deleted.results[0].error_code == E.GROUP_AUTHORIZATION_FAILED  # no XGROUP DESTROY
        await reader.stream.aclose()
        await member.stream.aclose()


async def test_share_groups_need_the_rights_of_xreadgroup_and_xack(tmp_path):
    """A share consumer changes the Redis group its share group is: XREAD for the group requests,
    XREADGROUP on a topic to be assigned it and acquire its records, XACK to acknowledge them
    (docs/kafka.md, "Share groups")."""
    h = TopicsHarness(tmp_path, requirepass="pw")
    h.state.broker.session().create_topic(b"jobs")
    h.state.acl.setuser("reader", ["on", ">pw", "~jobs", "-@all", "+@read"])  # no XREADGROUP, no XACK
    h.state.acl.setuser("worker", ["on", ">pw", "~jobs", "-@all", "+@read", "+xreadgroup"])  # no XACK
    h.state.acl.setuser("writer", ["on", ">pw", "~*", "-@all", "+xadd"])
    H, F = C.ShareGroupHeartbeatRequest, C.ShareFetchRequest

    def join(member):
        return H(group_id="g", member_id=member, member_epoch=0, subscribed_topic_names=["jobs"])

    def fetch(member, topic_id, epoch=0, acks=()):
        return F(group_id="g", member_id=member, share_session_epoch=epoch, max_records=10, topics=[
            F.FetchTopic(topic_id=topic_id, partitions=[F.FetchPartition(partition_index=0, acknowledgement_batches=[
                F.AcknowledgementBatch(first_offset=o, last_offset=o, acknowledge_types=[1]) for o in acks])])])

    async with trio.open_nursery() as nursery:
        writer = Peer(serve(h, nursery))
        await writer.login(b"writer", b"pw")
        assert (await writer.call(join("w"), 1)).error_code == E.GROUP_AUTHORIZATION_FAILED
        assert (await writer.call(fetch("w", uuid.uuid4()), 1)).error_code == E.GROUP_AUTHORIZATION_FAILED

        reader = Peer(serve(h, nursery))
        await reader.login(b"reader", b"pw")
        topic_id = (await reader.call(metadata("jobs"), 12)).topics[0].topic_id
        joined = await reader.call(join("r"), 1)
        assert joined.error_code == E.NONE and joined.assignment.topic_partitions == []  # not assigned jobs
        refused = await reader.call(fetch("r", topic_id), 1)
        assert refused.responses[0].partitions[0].error_code == E.TOPIC_AUTHORIZATION_FAILED

        worker = Peer(serve(h, nursery))
        await worker.login(b"worker", b"pw")
        assert [t.partitions for t in (await worker.call(join("k"), 1)).assignment.topic_partitions] == [[0]]
        assert (await worker.call(fetch("k", topic_id), 1)).responses[0].partitions[0].error_code == E.NONE
        h.state.broker.session().append(XAddPlan(b"jobs", [b"value", b"a"]))
        got = await worker.call(fetch("k", topic_id, epoch=1), 1)
        assert [a.first_offset for a in got.responses[0].partitions[0].acquired_records] == [0]
        acked = await worker.call(fetch("k", topic_id, epoch=2, acks=[0]), 1)
        assert acked.responses[0].partitions[0].acknowledge_error_code == E.TOPIC_AUTHORIZATION_FAILED
        for peer in (writer, reader, worker):
            await peer.stream.aclose()
