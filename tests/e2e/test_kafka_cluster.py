"""Kafka clients against a 3-node cluster (tests/clusterkit.py, every node with a Kafka port):
Metadata names every node and each partition's leader; a node that does not lead a partition
answers NOT_LEADER_OR_FOLLOWER and clients find the leader through Metadata; acks=-1 with the
leader killed during produce loses nothing acknowledged."""

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
    with KafkaRaw(other.kafka_port) as raw:
        resp = eventually(lambda: raw.call(body, 10), what="a produce answer")
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


def test_acks_all_loses_nothing_acknowledged_when_the_leader_is_killed(cluster):
    """A librdkafka producer with acks=-1 writes while the partition's leader is killed (kill -9):
    every record it had acknowledged is on the new leader."""
    confluent_kafka = pytest.importorskip("confluent_kafka")
    leader = cluster.leader_of(b"orders")
    leased(lambda: leader.client().execute_command("TOPIC", "CREATE", "orders"))
    acked: list[bytes] = []
    failed: list = []

    def delivered(err, msg):
        (failed.append(err) if err else acked.append(msg.value()))

    producer = confluent_kafka.Producer({
        "bootstrap.servers": cluster.bootstrap(), "acks": "all", "linger.ms": 5,
        "message.timeout.ms": 60_000, "retry.backoff.ms": 100, "topic.metadata.refresh.interval.ms": 1000})
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
    stored = set()
    for _id, fields in new_leader.client().xrange("orders"):
        stored.add(fields[b"value"])
    lost = [v for v in acked if v not in stored]
    assert not lost, f"{len(lost)} acknowledged records lost of {len(acked)}: {lost[:5]}"
    assert len(acked) == sent[0]  # with retries, every record sent was acknowledged in the end
