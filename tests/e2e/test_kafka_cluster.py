"""Kafka clients against a 3-node cluster (tests/clusterkit.py, every node with a Kafka port):
Metadata names every node and each partition's leader; a node that does not lead a partition
answers NOT_LEADER_OR_FOLLOWER and clients find the leader through Metadata; acks=-1 with the
leader killed during produce loses nothing acknowledged, and an idempotent producer's retries
across the failover duplicate nothing."""

from __future__ import annotations

import threading
import time

import pytest

from server.kafka import codec
from server.kafka import errors as E
from server.kafka import records
from tests.clusterkit import Cluster, eventually, leased, running
from tests.conftest import KafkaRaw

C = codec


@pytest.fixture
def cluster(tmp_path):
    yield from running(tmp_path, kafka=True)


def _slot_leaders(cluster: Cluster) -> dict[bytes, int]:
    return {key: cluster.nodes.index(cluster.leader_of(key)) + 1 for key in (b"orders", b"orders#1", b"orders#2")}


def test_metadata_names_every_node_and_each_partitions_leader(cluster):
    r = cluster.nodes[0].client()
    leased(lambda: cluster.leader_of(b"orders").client().execute_command("TOPIC", "CREATE", "orders",
                                                                          "PARTITIONS", "3"))
    leaders = _slot_leaders(cluster)
    M = C.MetadataRequest
    for node in cluster.nodes:
        with KafkaRaw(node.kafka_port) as raw:
            resp = eventually(lambda: raw.call(M(topics=[M.MetadataRequestTopic(name="orders")]), 12), what="metadata")
            t = resp.topics[0]
            assert t.error_code == E.NONE, t
        assert sorted((b.node_id, b.port) for b in resp.brokers) == [
            (i + 1, p) for i, p in enumerate(cluster.kafka_ports)]
        assert [p.leader_id for p in t.partitions] == [leaders[b"orders"], leaders[b"orders#1"], leaders[b"orders#2"]]
        assert all(sorted(p.replica_nodes) == [1, 2, 3] and sorted(p.isr_nodes) == [1, 2, 3] for p in t.partitions)
    assert r.ping()


def test_a_node_that_does_not_lead_answers_not_leader_and_clients_find_the_leader(cluster):
    confluent_kafka = pytest.importorskip("confluent_kafka")
    leader = cluster.leader_of(b"orders")
    leased(lambda: leader.client().execute_command("TOPIC", "CREATE", "orders"))
    other = next(n for n in cluster.nodes if n is not leader)
    batch = records.encode_batch(records.make_batch([(b"k", b"v", [])], base_offset=0, timestamps_ms=[0]))
    P = C.ProduceRequest
    body = P(acks=-1, timeout_ms=5000, topic_data=[P.TopicProduceData(name="orders", partition_data=[
        P.PartitionProduceData(index=0, records=batch)])])
    def answer():  # once the other node applied the topic's metadata (until then: UNKNOWN_TOPIC_OR_PARTITION)
        resp = raw.call(body, 10)
        return resp if resp.responses[0].partition_responses[0].error_code != E.UNKNOWN_TOPIC_OR_PARTITION else None

    with KafkaRaw(other.kafka_port) as raw:
        resp = eventually(answer, what="the other node's answer naming the topic")
    part = resp.responses[0].partition_responses[0]
    assert part.error_code == E.NOT_LEADER_OR_FOLLOWER
    leader_id = cluster.nodes.index(leader) + 1
    assert part.current_leader.leader_id == leader_id  # KIP-951: the leader, with its endpoint
    assert [(e.node_id, e.port) for e in resp.node_endpoints] == [(leader_id, leader.kafka_port)]
    # a client bootstrapped from the other node only finds the leader through Metadata
    producer = confluent_kafka.Producer({"bootstrap.servers": f"127.0.0.1:{other.kafka_port}", "acks": "all"})
    for i in range(20):
        producer.produce("orders", value=b"m%d" % i)
    assert producer.flush(30) == 0
    assert leader.client().xlen("orders") == 20
    consumer = confluent_kafka.Consumer({"bootstrap.servers": f"127.0.0.1:{other.kafka_port}", "group.id": "g",
                                         "enable.auto.commit": False})
    consumer.assign([confluent_kafka.TopicPartition("orders", 0, 0)])
    got = []
    deadline = time.monotonic() + 30
    while len(got) < 20 and time.monotonic() < deadline:
        msg = consumer.poll(0.2)
        if msg is not None and msg.error() is None:
            got.append(msg.value())
    consumer.close()
    assert got == [b"m%d" % i for i in range(20)]


@pytest.mark.parametrize("idempotence", [False, True])
def test_acks_all_loses_nothing_acknowledged_when_the_leader_is_killed(cluster, idempotence):
    """A librdkafka producer with acks=-1 writes while the partition's leader is killed (kill -9):
    every record it had acknowledged is on the new leader. With ``enable.idempotence`` its retries
    across the failover are stored once, in order: the new leader deduplicates by the producer
    state it replicated."""
    confluent_kafka = pytest.importorskip("confluent_kafka")
    leader = cluster.leader_of(b"orders")
    leased(lambda: leader.client().execute_command("TOPIC", "CREATE", "orders"))
    acked: list[bytes] = []
    failed: list = []

    def delivered(err, msg):
        (failed.append(err) if err else acked.append(msg.value()))

    producer = confluent_kafka.Producer({
        "bootstrap.servers": cluster.bootstrap(), "acks": "all", "linger.ms": 5,
        "message.timeout.ms": 60_000, "retry.backoff.ms": 100, "topic.metadata.refresh.interval.ms": 1000,
        "enable.idempotence": idempotence})
    stop = threading.Event()
    sent = [0]

    def produce():
        i = 0
        while not stop.is_set():
            try:
                producer.produce("orders", value=b"m%06d" % i, on_delivery=delivered)
                i += 1
            except BufferError:
                pass
            producer.poll(0.002)
        sent[0] = i

    thread = threading.Thread(target=produce)
    thread.start()
    try:
        eventually(lambda: len(acked) >= 300, what="acknowledged records before the kill")
        leader.kill9()
        # the producer goes on; once a new leader is elected and known, acknowledgements resume
        before = len(acked)
        eventually(lambda: len(acked) >= before + 300, timeout_s=60, what="acknowledged records after the kill")
    finally:
        stop.set()
        thread.join(30)
    assert producer.flush(60) == 0
    assert not failed, failed[:3]
    new_leader = eventually(lambda: cluster.leader_of(b"orders") is not leader and cluster.leader_of(b"orders"),
                            what="a new leader")
    stored = [fields[b"value"] for _id, fields in new_leader.client().xrange("orders")]
    lost = [v for v in acked if v not in set(stored)]
    assert not lost, f"{len(lost)} acknowledged records lost of {len(acked)}: {lost[:5]}"
    assert len(acked) == sent[0]  # with retries, every record sent was acknowledged in the end
    if idempotence:  # nothing twice, nothing out of order
        assert stored == [b"m%06d" % i for i in range(sent[0])]


def test_an_idempotent_producers_retry_on_the_new_leader_is_dropped(cluster):
    """A batch acknowledged with acks=-1 (so on the in-sync replicas) whose response the producer
    never saw, retried on the leader elected after the old one is killed: answered with the
    original's offset, nothing appended (the follower rebuilt the producer state from the
    replicated batches)."""
    leader = cluster.leader_of(b"orders")
    leased(lambda: leader.client().execute_command("TOPIC", "CREATE", "orders"))

    def batch(values: list[bytes], sequence: int) -> bytes:
        return records.encode_batch(records.make_batch(
            [(None, v, []) for v in values], base_offset=0, timestamps_ms=[0] * len(values),
            producer_id=pid, producer_epoch=0, base_sequence=sequence))

    def produce(raw: KafkaRaw, data: bytes):
        P = C.ProduceRequest
        body = P(acks=-1, timeout_ms=5000, topic_data=[P.TopicProduceData(name="orders", partition_data=[
            P.PartitionProduceData(index=0, records=data)])])
        part = raw.call(body, 9).responses[0].partition_responses[0]
        return part if part.error_code == E.NONE else None

    with KafkaRaw(leader.kafka_port) as raw:
        pid = raw.call(C.InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=-1), 4).producer_id
        assert eventually(lambda: produce(raw, batch([b"a", b"b"], 0)), what="a produce").base_offset == 0
        last = batch([b"c"], 2)
        assert produce(raw, last).base_offset == 2
    leader.kill9()
    new_leader = eventually(lambda: cluster.leader_of(b"orders") is not leader and cluster.leader_of(b"orders"),
                            what="a new leader")
    with KafkaRaw(new_leader.kafka_port) as raw:
        retry = eventually(lambda: produce(raw, last), timeout_s=30, what="the retry answered")
    assert retry.base_offset == 2
    assert [f[b"value"] for _, f in new_leader.client().xrange("orders")] == [b"a", b"b", b"c"]


def test_a_groups_coordinator_is_its_slots_leader_and_a_librdkafka_group_works(cluster):
    """Every node names the leader of the group id's slot in FindCoordinator; the others answer
    group requests NOT_COORDINATOR; a librdkafka group consumer bootstrapped from a non-coordinator
    joins, consumes and commits on the coordinator (docs/kafka.md, "In a cluster")."""
    confluent_kafka = pytest.importorskip("confluent_kafka")
    group = "billing"
    coordinator = cluster.leader_of(group.encode())
    coordinator_id = cluster.nodes.index(coordinator) + 1
    for node in cluster.nodes:
        with KafkaRaw(node.kafka_port) as raw:
            found = raw.call(C.FindCoordinatorRequest(key_type=0, coordinator_keys=[group]), 4).coordinators[0]
            assert (found.error_code, found.node_id, found.port) == (E.NONE, coordinator_id, coordinator.kafka_port)
            beat = raw.call(C.HeartbeatRequest(group_id=group, generation_id=1, member_id="m"), 4)
            assert beat.error_code == (E.UNKNOWN_MEMBER_ID if node is coordinator else E.NOT_COORDINATOR)
    leased(lambda: cluster.leader_of(b"orders").client().execute_command("TOPIC", "CREATE", "orders"))
    leader = cluster.leader_of(b"orders")
    assert leader.client().xadd("orders", {"value": "x"})
    other = next(n for n in cluster.nodes if n is not coordinator)
    consumer = confluent_kafka.Consumer({"bootstrap.servers": f"127.0.0.1:{other.kafka_port}", "group.id": group,
                                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                                         "session.timeout.ms": 6000})
    try:
        consumer.subscribe(["orders"])
        deadline = time.monotonic() + 60
        msg = None
        while msg is None or msg.error():
            assert time.monotonic() < deadline, "nothing consumed in the group"
            msg = consumer.poll(0.1)
        consumer.commit(message=msg, asynchronous=False)
        committed = consumer.committed([confluent_kafka.TopicPartition("orders", 0)], 30)
        assert committed[0].offset == 1
    finally:
        consumer.close()
