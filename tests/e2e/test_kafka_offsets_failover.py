"""Kafka committed offsets in a 3-node cluster (replication factor 3, tests/clusterkit.py): a
group's commits are entries of its internal stream ``__kafka_offsets{<group>}``, replicated with
the group's slot, so when the coordinator is killed (kill -9) the node elected in its place
answers FindCoordinator, OffsetFetch gives exactly the committed offsets, and new consumers
(librdkafka, kafka-python) resume from them: nothing skipped (docs/kafka.md, "Committed
offsets"). The internal stream is not a Kafka topic: Metadata does not list it, Produce and
DeleteTopics refuse it, and TOPIC LIST leaves it out unless a pattern names it."""

from __future__ import annotations

import time

import pytest

from server.kafka import codec
from server.kafka import errors as E
from server.kafka import records
from tests.clusterkit import Cluster, eventually, leased, running
from tests.conftest import KafkaRaw

C = codec
MESSAGES = 60
COMMITTED = 25  # the first consumers commit after this many messages


@pytest.fixture
def cluster(tmp_path):
    yield from running(tmp_path, kafka=True)


def _groups_coordinated_apart_from(cluster: Cluster, topic: bytes, count: int) -> list[str]:
    """``count`` group ids of one coordinator, which does not lead ``topic`` (so killing it
    moves the groups alone)."""
    avoid = cluster.leader_of(topic)
    by_node: dict[int, list[str]] = {}
    for i in range(200):
        gid = f"group-{i}"
        node = cluster.leader_of(gid.encode())
        if node is not avoid:
            by_node.setdefault(cluster.nodes.index(node), []).append(gid)
    return next(ids[:count] for ids in by_node.values() if len(ids) >= count)


def _coordinator_id(port: int, group: str) -> int:
    with KafkaRaw(port) as raw:
        found = raw.call(C.FindCoordinatorRequest(key_type=0, coordinator_keys=[group]), 4).coordinators[0]
    return found.node_id if found.error_code == E.NONE else -1


def _fetch_offset(port: int, group: str) -> int:
    with KafkaRaw(port) as raw:
        resp = raw.call(C.OffsetFetchRequest(group_id=group, topics=[
            C.OffsetFetchRequest.OffsetFetchRequestTopic(name="orders", partition_indexes=[0])]), 7)
    assert resp.error_code == E.NONE, resp
    return resp.topics[0].partitions[0].committed_offset


def _commit_raw(raw: KafkaRaw, group: str, offset: int) -> int:
    OC = C.OffsetCommitRequest
    resp = raw.call(OC(group_id=group, generation_id_or_member_epoch=-1, member_id="", topics=[
        OC.OffsetCommitRequestTopic(name="orders", partitions=[OC.OffsetCommitRequestPartition(
            partition_index=0, committed_offset=offset, committed_leader_epoch=-1, committed_metadata="")])]), 8)
    return resp.topics[0].partitions[0].error_code


def _take(poll, group: str, count: int) -> list[bytes]:
    """The values ``poll(room)`` gives until ``count`` came (within 90 s)."""
    got: list[bytes] = []
    deadline = time.monotonic() + 90
    while len(got) < count:
        assert time.monotonic() < deadline, f"{group}: {len(got)} of {count} consumed"
        got.extend(poll(count - len(got)))
    return got


def _confluent_consume(confluent_kafka, cluster: Cluster, group: str, count: int) -> list[bytes]:
    """``count`` messages of a new librdkafka member of ``group``, the last committed (sync)."""
    consumer = confluent_kafka.Consumer({"bootstrap.servers": cluster.bootstrap(), "group.id": group,
                                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                                         "session.timeout.ms": 6000})
    last = []

    def poll(_room: int) -> list[bytes]:
        msg = consumer.poll(0.2)
        if msg is None or msg.error():
            return []
        last[:] = [msg]
        return [msg.value()]

    try:
        consumer.subscribe(["orders"])
        got = _take(poll, group, count)
        consumer.commit(message=last[0], asynchronous=False)
    finally:
        consumer.close()
    return got


def _kafka_python_consume(kafka, cluster: Cluster, group: str, count: int) -> list[bytes]:
    """``count`` messages of a new kafka-python member of ``group``, then a commit (sync)."""
    consumer = kafka.KafkaConsumer(bootstrap_servers=cluster.bootstrap().split(","), group_id=group,
                                   auto_offset_reset="earliest", enable_auto_commit=False,
                                   session_timeout_ms=6000, heartbeat_interval_ms=1000)
    def unrefused(call):  # the killed node is still in Metadata: kafka-python raises, and is asked again
        try:
            return call()
        except kafka.errors.KafkaConnectionError:
            return None

    def poll(room: int) -> list[bytes]:
        found = unrefused(lambda: consumer.poll(timeout_ms=200, max_records=room)) or {}
        return [m.value for msgs in found.values() for m in msgs]

    try:
        # the topic's metadata first: a leader assigning before it has it hands out nothing, rejoins,
        # and kafka-python 3.0.12 then sometimes spins without fetching (seen 2 runs in 12)
        assert eventually(lambda: unrefused(lambda: consumer.partitions_for_topic("orders")),
                          what="kafka-python's metadata")
        consumer.subscribe(["orders"])
        got = _take(poll, group, count)
        consumer.commit()
    finally:
        consumer.close()
    return got


def test_committed_offsets_survive_the_coordinators_kill_and_consumers_resume_from_them(cluster):
    confluent_kafka = pytest.importorskip("confluent_kafka")
    kafka = pytest.importorskip("kafka")
    leased(lambda: cluster.leader_of(b"orders").client().execute_command("TOPIC", "CREATE", "orders"))
    leader = cluster.leader_of(b"orders")
    for i in range(MESSAGES):
        leader.client().xadd("orders", {"value": b"m%03d" % i})
    sent = [b"m%03d" % i for i in range(MESSAGES)]
    librdkafka_group, python_group, raw_group = _groups_coordinated_apart_from(cluster, b"orders", 3)
    coordinator = cluster.leader_of(librdkafka_group.encode())
    old_id = cluster.nodes.index(coordinator) + 1

    assert _confluent_consume(confluent_kafka, cluster, librdkafka_group, COMMITTED) == sent[:COMMITTED]
    assert _kafka_python_consume(kafka, cluster, python_group, COMMITTED) == sent[:COMMITTED]
    with KafkaRaw(coordinator.kafka_port) as raw:  # a commit's latency here: fsync + the replicas' fetch
        assert _commit_raw(raw, raw_group, 1) == E.NONE
        took = []
        for offset in range(2, 12):
            began = time.perf_counter()
            assert _commit_raw(raw, raw_group, offset) == E.NONE
            took.append(time.perf_counter() - began)
    took.sort()
    print(f"OffsetCommit in the cluster: median {took[len(took) // 2] * 1000:.1f} ms, max {took[-1] * 1000:.1f} ms")
    for group in (librdkafka_group, python_group):
        assert _fetch_offset(coordinator.kafka_port, group) == COMMITTED

    coordinator.kill9()
    survivor = next(n for n in cluster.nodes if n is not coordinator)
    new_id = eventually(lambda: _coordinator_id(survivor.kafka_port, librdkafka_group) not in (-1, old_id)
                        and _coordinator_id(survivor.kafka_port, librdkafka_group),
                        timeout_s=60, what="a new coordinator")
    new_port = cluster.kafka_ports[new_id - 1]
    for group in (librdkafka_group, python_group):
        assert eventually(lambda: _fetch_offset(new_port, group) == COMMITTED, timeout_s=30,
                          what=f"{group}'s committed offset on the new coordinator")
    assert _fetch_offset(new_port, raw_group) == 11

    rest = MESSAGES - COMMITTED
    assert _confluent_consume(confluent_kafka, cluster, librdkafka_group, rest) == sent[COMMITTED:]
    assert _kafka_python_consume(kafka, cluster, python_group, rest) == sent[COMMITTED:]
    assert _fetch_offset(new_port, librdkafka_group) == MESSAGES  # and commits go on on the new coordinator


def test_the_internal_offsets_stream_is_not_a_kafka_topic(cluster):
    """Metadata for all topics leaves the groups' offsets streams out, a Produce or DeleteTopics
    of one is refused (only the coordinator writes them), TOPIC LIST shows one only when a
    pattern names it."""
    group = "billing"
    coordinator = cluster.leader_of(group.encode())
    leased(lambda: cluster.leader_of(b"orders").client().execute_command("TOPIC", "CREATE", "orders"))
    with KafkaRaw(coordinator.kafka_port) as raw:
        assert eventually(lambda: _commit_raw(raw, group, 3) == E.NONE, what="a commit")
        names = [t.name for t in raw.call(C.MetadataRequest(topics=None), 12).topics]
        assert "orders" in names and not any(n.startswith("__kafka_offsets") for n in names), names
        batch = records.encode_batch(records.make_batch([(b"k", b"v", [])], base_offset=0, timestamps_ms=[0]))
        P = C.ProduceRequest
        resp = raw.call(P(acks=-1, timeout_ms=5000, topic_data=[P.TopicProduceData(
            name=f"__kafka_offsets{{{group}}}", partition_data=[P.PartitionProduceData(index=0, records=batch)])]), 9)
        assert resp.responses[0].partition_responses[0].error_code == E.INVALID_TOPIC_EXCEPTION
        gone = raw.call(C.DeleteTopicsRequest(topic_names=[f"__kafka_offsets{{{group}}}"], timeout_ms=5000), 4)
        assert gone.responses[0].error_code == E.INVALID_TOPIC_EXCEPTION
        assert _fetch_offset(coordinator.kafka_port, group) == 3
    r = coordinator.client()
    assert b"__kafka_offsets{billing}" not in r.execute_command("TOPIC", "LIST")
    assert r.execute_command("TOPIC", "LIST", "__kafka_offsets*") == [b"__kafka_offsets{billing}"]
