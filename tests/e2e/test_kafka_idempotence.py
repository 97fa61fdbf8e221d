"""Kafka's idempotent producer against a real ``partita``: InitProducerId, retries stored once,
out-of-order sequences and old epochs refused, the state kept across kill -9, librdkafka with
``enable.idempotence`` whose response is lost (a proxy drops it), librdkafka, kafka-python and
aiokafka with idempotence on, across a kill -9 too (docs/kafka.md, "Idempotent producers"); each
client's transactional producer refused at once. A killed leader in a cluster:
tests/e2e/test_kafka_cluster.py."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import uuid

import pytest

from server.kafka import codec
from server.kafka import errors as E
from server.kafka import records
from tests.clusterkit import eventually
from tests.conftest import KafkaRaw, PartitaProcess, free_port

C = codec


def fresh_topic() -> str:
    return "t" + uuid.uuid4().hex[:10]


def init_producer_id(raw: KafkaRaw, version: int = 4, **kw):
    return raw.call(C.InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=-1, **kw), version)


def idempotent(values: list[bytes], producer_id: int, epoch: int, sequence: int) -> bytes:
    batch = records.make_batch([(None, v, []) for v in values], base_offset=0,
                               timestamps_ms=[int(time.time() * 1000)] * len(values),
                               producer_id=producer_id, producer_epoch=epoch, base_sequence=sequence)
    return records.encode_batch(batch)


def produce(raw: KafkaRaw, topic: str, data: bytes, version: int = 9):
    P = C.ProduceRequest
    body = P(acks=-1, timeout_ms=5000, topic_data=[P.TopicProduceData(name=topic, partition_data=[
        P.PartitionProduceData(index=0, records=data)])])
    return raw.call(body, version).responses[0].partition_responses[0]


def duplicates_answered(server: PartitaProcess) -> int:
    """INFO topics' ``idempotent_duplicates_total``: retries answered from the producer state."""
    return int(server.client().info("topics")["idempotent_duplicates_total"])


# -- the protocol, raw -----------------------------------------------------------------------


def test_a_retried_batch_is_stored_once_and_gaps_and_old_epochs_are_refused(kafka_shared):
    topic = fresh_topic()
    kafka_shared.client().execute_command("TOPIC", "CREATE", topic)
    with KafkaRaw(kafka_shared.kafka_port) as raw:
        got = init_producer_id(raw)
        assert (got.error_code, got.producer_epoch) == (E.NONE, 0) and got.producer_id >= 0
        pid = got.producer_id
        assert init_producer_id(raw).producer_id != pid  # every producer its own id
        first = idempotent([b"a", b"b", b"c"], pid, 0, 0)
        assert (produce(raw, topic, first).error_code, produce(raw, topic, first).base_offset) == (E.NONE, 0)
        assert produce(raw, topic, idempotent([b"d"], pid, 0, 3)).base_offset == 3
    with KafkaRaw(kafka_shared.kafka_port) as raw:  # the retry of a batch whose response was lost
        again = produce(raw, topic, first)
        assert (again.error_code, again.base_offset) == (E.NONE, 0)
        gap = produce(raw, topic, idempotent([b"x"], pid, 0, 7))
        assert gap.error_code == E.OUT_OF_ORDER_SEQUENCE_NUMBER
        assert gap.error_message == (f"out of order sequence number 7 for producer {pid} at epoch 0 on partition "
                                     f"{topic}#0: 4 expected")
        assert produce(raw, topic, idempotent([b"e"], pid, 1, 0)).base_offset == 4  # a new epoch starts at 0
        old = produce(raw, topic, idempotent([b"y"], pid, 0, 4))
        assert old.error_code == E.INVALID_PRODUCER_EPOCH
        two = idempotent([b"z"], pid, 1, 1) + idempotent([b"z"], pid, 1, 2)
        assert produce(raw, topic, two).error_code == E.INVALID_RECORD  # one batch per partition
        assert produce(raw, topic, idempotent([b"z"], pid, -1, 1)).error_code == E.INVALID_RECORD
        transactional = raw.call(C.InitProducerIdRequest(transactional_id="tx", transaction_timeout_ms=1000), 4)
        assert transactional.error_code == E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    stored = [f[b"value"] for _, f in kafka_shared.client().xrange(topic)]
    assert stored == [b"a", b"b", b"c", b"d", b"e"]


def test_the_producer_state_and_ids_survive_kill_9(kafka_partita):
    server = kafka_partita()
    topic = fresh_topic()
    server.client().execute_command("TOPIC", "CREATE", topic)
    with KafkaRaw(server.kafka_port) as raw:
        pid = init_producer_id(raw).producer_id
        produce(raw, topic, idempotent([b"a", b"b"], pid, 0, 0))
        last = idempotent([b"c", b"d", b"e"], pid, 0, 2)
        assert produce(raw, topic, last).base_offset == 2
    server.restart(kill9=True)
    with KafkaRaw(server.kafka_port) as raw:
        retry = produce(raw, topic, last)  # its response was lost in the crash; the producer retries
        assert (retry.error_code, retry.base_offset) == (E.NONE, 2)
        assert produce(raw, topic, idempotent([b"f"], pid, 0, 6)).error_code == E.OUT_OF_ORDER_SEQUENCE_NUMBER
        assert produce(raw, topic, idempotent([b"f"], pid, 0, 5)).base_offset == 5
        assert init_producer_id(raw).producer_id > pid  # never an id handed out before the crash
    assert server.client().xlen(topic) == 6


def test_init_producer_id_is_advertised_and_answers_every_version(kafka_shared):
    with KafkaRaw(kafka_shared.kafka_port) as raw:
        versions = {k.api_key: (k.min_version, k.max_version) for k in raw.call(C.ApiVersionsRequest(), 3).api_keys}
        assert versions[22] == (0, 6)
        ids = []
        for version in range(7):
            got = init_producer_id(raw, version, **({"producer_id": 5, "producer_epoch": 3} if version >= 3 else {}))
            assert (got.error_code, got.producer_epoch) == (E.NONE, 0)  # a new id whatever it names, as Kafka
            ids.append(got.producer_id)
    assert len(set(ids)) == 7


# -- real clients ---------------------------------------------------------------------------------


class LosesFirstProduceResponse:
    """A TCP proxy in front of a Kafka port that forwards everything except
    the response to the first Produce request: instead it closes both sides
    (the client sees the connection die after the server appended)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.dropped = threading.Event()
        self._socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self.listener.close()
        for s in self._socks:
            s.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target_port))
            self._socks += [client, server]
            apis: dict[int, int] = {}  # correlation id -> api key of the client's requests
            threading.Thread(target=self._pipe, args=(client, server, apis, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, apis, False), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, apis: dict, requests: bool) -> None:
        try:
            while True:
                head = _read(src, 4)
                frame = _read(src, int.from_bytes(head, "big"))
                if requests:
                    apis[int.from_bytes(frame[4:8], "big")] = int.from_bytes(frame[0:2], "big")
                elif apis.get(int.from_bytes(frame[0:4], "big")) == 0 and not self.dropped.is_set():
                    self.dropped.set()
                    raise ConnectionError("the response is lost")
                dst.sendall(head + frame)
        except OSError:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def _read(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


@pytest.fixture
def behind_a_lossy_proxy(tmp_path):
    """A one-node cluster whose ``cluster-nodes`` entry names the proxy's
    port as its Kafka port: Metadata sends every Kafka client through it."""
    kafka_port, port, bus_port = free_port(), free_port(), free_port()
    proxy = LosesFirstProduceResponse(kafka_port)
    server = PartitaProcess(tmp_path / "data", [
        "--node-id", "1", "--cluster-nodes", f"1@127.0.0.1:{port}@{bus_port}@{proxy.port}",
        "--kafka-port", str(kafka_port)])
    server.port = port
    server.start()
    eventually(lambda: server.client().info("replication").get("controller_lease") == "ok",
               what="the controller elected")
    yield server, proxy
    server.stop()
    proxy.close()


def test_librdkafka_retries_a_produce_whose_response_was_lost_and_it_is_stored_once(behind_a_lossy_proxy):
    confluent_kafka = pytest.importorskip("confluent_kafka")
    server, proxy = behind_a_lossy_proxy
    topic = fresh_topic()
    server.client().execute_command("TOPIC", "CREATE", topic)
    producer = confluent_kafka.Producer({"bootstrap.servers": f"127.0.0.1:{proxy.port}", "enable.idempotence": True,
                                         "linger.ms": 5, "retry.backoff.ms": 50})
    delivered = []
    for i in range(300):
        producer.produce(topic, value=b"m%03d" % i, on_delivery=lambda err, msg: delivered.append((err, msg.offset())))
        if i % 50 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0
    assert proxy.dropped.is_set()
    assert sorted(delivered) == [(None, i) for i in range(300)]
    assert [f[b"value"] for _, f in server.client().xrange(topic)] == [b"m%03d" % i for i in range(300)]
    assert duplicates_answered(server) >= 1  # the retry was answered, not appended


def test_librdkafka_idempotent_producer_across_a_restart(kafka_partita):
    confluent_kafka = pytest.importorskip("confluent_kafka")
    server = kafka_partita()
    topic = fresh_topic()
    producer = confluent_kafka.Producer({"bootstrap.servers": server.bootstrap, "enable.idempotence": True,
                                         "linger.ms": 5, "retry.backoff.ms": 100, "message.timeout.ms": 60_000})
    for i in range(100):
        producer.produce(topic, value=b"a%03d" % i)
    assert producer.flush(30) == 0
    server.restart(kill9=True)
    for i in range(100):
        producer.produce(topic, value=b"b%03d" % i)
    assert producer.flush(60) == 0
    values = [f[b"value"] for _, f in server.client().xrange(topic)]
    assert values == [b"a%03d" % i for i in range(100)] + [b"b%03d" % i for i in range(100)]


def test_kafka_python_with_idempotence(kafka_shared):
    from kafka import KafkaProducer

    topic = fresh_topic()
    producer = KafkaProducer(bootstrap_servers=kafka_shared.bootstrap, enable_idempotence=True, acks="all")
    futures = [producer.send(topic, value=b"v%d" % i) for i in range(50)]
    producer.flush(20)
    assert [f.get(10).offset for f in futures] == list(range(50))
    producer.close(5)
    assert kafka_shared.client().xlen(topic) == 50


def test_aiokafka_with_idempotence(kafka_shared):
    aiokafka = pytest.importorskip("aiokafka")
    topic = fresh_topic()

    async def run():
        producer = aiokafka.AIOKafkaProducer(bootstrap_servers=kafka_shared.bootstrap, enable_idempotence=True)
        await producer.start()
        try:
            return [(await producer.send_and_wait(topic, b"v%d" % i)).offset for i in range(20)]
        finally:
            await producer.stop()

    assert asyncio.run(run()) == list(range(20))
    assert kafka_shared.client().xlen(topic) == 20


def test_kafka_python_and_aiokafka_idempotent_producers_across_a_restart(kafka_partita):
    """Each keeps its producer id across a kill -9 of the server (the producer state is durable
    with the log): its next batches, at the sequences after the acknowledged ones, are accepted,
    nothing is stored twice and nothing is refused."""
    kafka = pytest.importorskip("kafka")
    aiokafka = pytest.importorskip("aiokafka")
    server = kafka_partita()
    topic = fresh_topic()
    producer = kafka.KafkaProducer(bootstrap_servers=server.bootstrap, enable_idempotence=True, acks="all")
    assert [producer.send(topic, value=b"k%d" % i).get(10).offset for i in range(20)] == list(range(20))
    server.restart(kill9=True)
    assert [producer.send(topic, value=b"l%d" % i).get(30).offset for i in range(20)] == list(range(20, 40))
    producer.close(5)

    async def across_a_restart():
        p = aiokafka.AIOKafkaProducer(bootstrap_servers=server.bootstrap, enable_idempotence=True)
        await p.start()
        try:
            before = [(await p.send_and_wait(topic, b"m%d" % i)).offset for i in range(20)]
            await asyncio.to_thread(server.restart, kill9=True)
            after = [(await p.send_and_wait(topic, b"n%d" % i)).offset for i in range(20)]
            return before, after
        finally:
            await p.stop()

    assert asyncio.run(across_a_restart()) == (list(range(40, 60)), list(range(60, 80)))
    values = [f[b"value"] for _, f in server.client().xrange(topic)]
    assert values == [b"%s%d" % (c, i) for c in (b"k", b"l", b"m", b"n") for i in range(20)]


def test_transactional_producers_of_every_client_are_refused_at_once(kafka_shared):
    """Transactions are not served: a producer with a transactional id gets Kafka's
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED when it starts (FindCoordinator / InitProducerId), a
    fatal error every client reports to its caller, not a retry loop, a hang or a disconnect."""
    confluent_kafka = pytest.importorskip("confluent_kafka")
    kafka = pytest.importorskip("kafka")
    aiokafka = pytest.importorskip("aiokafka")
    import aiokafka.errors

    producer = confluent_kafka.Producer({"bootstrap.servers": kafka_shared.bootstrap,
                                         "transactional.id": fresh_topic()})
    with pytest.raises(confluent_kafka.KafkaException) as refused:
        producer.init_transactions(30)
    assert refused.value.args[0].code() == confluent_kafka.KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert refused.value.args[0].fatal()

    producer = kafka.KafkaProducer(bootstrap_servers=kafka_shared.bootstrap, transactional_id=fresh_topic(),
                                   max_block_ms=30_000)
    try:
        with pytest.raises(kafka.errors.TransactionalIdAuthorizationFailedError):
            producer.init_transactions()
    finally:
        producer.close(5)

    async def start():
        p = aiokafka.AIOKafkaProducer(bootstrap_servers=kafka_shared.bootstrap, transactional_id=fresh_topic())
        try:
            await p.start()
        finally:
            await p.stop()

    with pytest.raises(aiokafka.errors.TransactionalIdAuthorizationFailed):
        asyncio.run(start())
