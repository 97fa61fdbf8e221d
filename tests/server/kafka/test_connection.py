"""The Kafka connection loop (server/kafka_front/connection.py) over a socketpair, in one trio run:
responses in request order, a produce's response only once its fsync is done (and a later
request's response not before it), a handler's bug closing the connection and nothing else."""

from __future__ import annotations

import logging
import socket
import struct

import trio
import trio.testing

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
