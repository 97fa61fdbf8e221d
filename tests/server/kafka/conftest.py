"""Fixtures of the Kafka codec tests: a throwaway Kafka broker on 127.0.0.1 that real clients
(librdkafka through confluent-kafka and kcat, kafka-python, aiokafka) talk to.

It is the codec and framing and nothing else: each connection is a thread that feeds
``framing.RequestReader``, records every request, and answers the few APIs a client needs to
produce and to fetch from a fixed batch (ApiVersions, Metadata, InitProducerId, Produce, Fetch,
ListOffsets, FindCoordinator). Anything else closes the connection, as the reader says.
"""

from __future__ import annotations

import socket
import threading
import uuid

import pytest

from server.kafka import codec, framing

C = codec


class FakeKafkaBroker:
    """One node (id 1) leading partition 0 of every topic it is asked about."""

    def __init__(self, fetch_batch: bytes, fetch_last_offset: int):
        self.fetch_batch = fetch_batch  # served to a Fetch at offset 0, to every client
        self.high_watermark = fetch_last_offset + 1
        self.requests: list[framing.Request] = []  # every request decoded, in arrival order
        self.answers = 0  # ApiVersions asked at versions it does not know
        self.violations: list[str] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._topic_ids: dict[str, uuid.UUID] = {}
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.port = self._listener.getsockname()[1]
        self.bootstrap = f"127.0.0.1:{self.port}"

    def start(self) -> None:
        self._spawn(self._accept_loop)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5)
        self._listener.close()

    def produce_requests(self) -> list[framing.Request]:
        return [r for r in self.requests if r.api_key == 0]

    def versions_used(self) -> dict[int, set[int]]:
        out: dict[int, set[int]] = {}
        for r in self.requests:
            out.setdefault(r.api_key, set()).add(r.api_version)
        return out

    # -- I/O ----------------------------------------------------------------

    def _spawn(self, target, *args) -> None:
        t = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(t)
        t.start()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                sock, _ = self._listener.accept()
            except TimeoutError:
                continue
            self._spawn(self._serve, sock)

    def _serve(self, sock: socket.socket) -> None:
        reader = framing.RequestReader()
        sock.settimeout(0.1)
        with sock:
            while not self._stop.is_set():
                try:
                    data = sock.recv(65536)
                except TimeoutError:
                    continue
                except OSError:
                    return
                if not data:
                    return
                try:
                    reader.receive_data(data)
                    while (ev := reader.next_event()) is not None:
                        if isinstance(ev, framing.Answer):
                            self.answers += 1
                            sock.sendall(ev.data)
                            continue
                        body = self._answer(ev)
                        self.requests.append(ev)
                        if body is None:
                            continue
                        sock.sendall(framing.encode_response(ev.api_key, ev.api_version, ev.correlation_id, body))
                except framing.ProtocolViolation as e:
                    self.violations.append(e.reason)
                    return
                except OSError:  # the client went away mid-answer
                    return

    # -- the APIs -----------------------------------------------------------

    def _topic_id(self, name: str) -> uuid.UUID:
        return self._topic_ids.setdefault(name, uuid.uuid4())

    def _answer(self, req: framing.Request):
        handler = getattr(self, f"_api_{req.api_key}", None)
        if handler is None:
            raise framing.ProtocolViolation(f"the fake broker does not answer api key {req.api_key}")
        return handler(req.body, req.api_version)

    def _api_18(self, body, version):  # ApiVersions
        R = C.ApiVersionsResponse
        return R(api_keys=[R.ApiVersion(api_key=k, min_version=lo, max_version=hi)
                           for k, (lo, hi) in sorted(framing.declared_versions().items())])

    def _api_3(self, body, version):  # Metadata
        R = C.MetadataResponse
        names = [t.name for t in body.topics or []]
        return R(brokers=[R.MetadataResponseBroker(node_id=1, host="127.0.0.1", port=self.port)],
                 cluster_id="fake", controller_id=1,
                 topics=[R.MetadataResponseTopic(
                     name=n, topic_id=self._topic_id(n),
                     partitions=[R.MetadataResponsePartition(partition_index=0, leader_id=1, leader_epoch=0,
                                                             replica_nodes=[1], isr_nodes=[1])])
                         for n in names])

    def _api_22(self, body, version):  # InitProducerId
        return C.InitProducerIdResponse(producer_id=4242, producer_epoch=3)

    def _api_10(self, body, version):  # FindCoordinator
        R = C.FindCoordinatorResponse
        if version >= 4:
            return R(coordinators=[R.Coordinator(key=k, node_id=1, host="127.0.0.1", port=self.port)
                                   for k in body.coordinator_keys])
        return R(node_id=1, host="127.0.0.1", port=self.port)

    def _api_0(self, body, version):  # Produce
        if body.acks == 0:
            return None
        R = C.ProduceResponse
        return R(responses=[R.TopicProduceResponse(
            name=t.name, topic_id=t.topic_id,
            partition_responses=[R.PartitionProduceResponse(index=p.index, base_offset=0)
                                 for p in t.partition_data]) for t in body.topic_data])

    def _api_2(self, body, version):  # ListOffsets: -2 earliest -> 0, anything else -> the end
        R = C.ListOffsetsResponse
        return R(topics=[R.ListOffsetsTopicResponse(name=t.name, partitions=[
            R.ListOffsetsPartitionResponse(partition_index=p.partition_index, timestamp=-1,
                                           offset=0 if p.timestamp == -2 else self.high_watermark)
            for p in t.partitions]) for t in body.topics])

    def _api_1(self, body, version):  # Fetch: the batch at offset 0, else nothing (after a short wait)
        R = C.FetchResponse
        topics = []
        empty = True
        for t in body.topics:
            parts = []
            for p in t.partitions:
                recs = self.fetch_batch if p.fetch_offset == 0 else b""
                empty = empty and not recs
                parts.append(R.PartitionData(partition_index=p.partition, high_watermark=self.high_watermark,
                                             last_stable_offset=self.high_watermark, log_start_offset=0,
                                             records=recs))
            topics.append(R.FetchableTopicResponse(topic=t.topic, topic_id=t.topic_id, partitions=parts))
        if empty:
            self._stop.wait(min(body.max_wait_ms, 100) / 1000)  # a long poll, bounded
        return R(responses=topics)


@pytest.fixture
def fake_kafka_broker():
    from server.kafka import records

    batch = records.make_batch(
        [(b"key-%d" % i, b"value-%d" % i, [(b"h", b"%d" % i)]) for i in range(3)],
        base_offset=0, timestamps_ms=[1_700_000_000_000 + i for i in range(3)],
        compression=records.COMPRESSION_ZSTD)
    broker = FakeKafkaBroker(records.encode_batch(batch), fetch_last_offset=2)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()
