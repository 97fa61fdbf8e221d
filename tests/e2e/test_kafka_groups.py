"""Kafka consumer groups with real clients against a real ``partita`` (docs/kafka.md, "Consumer
groups"): librdkafka (confluent-kafka) with each assignor, kafka-python and kcat -G share a
6-partition topic's partitions disjointly; a librdkafka and a kafka-python member share one
group and hand over at a leave; a member killed without leaving loses its partitions
after its session timeout; committed offsets survive a restart; TOPIC GROUPS shows the Kafka
groups beside the Redis ones, with lag = end offset - committed offset."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import uuid

import pytest

from tests.clusterkit import eventually
from tests.conftest import KafkaRaw
from tests.e2e.groups_support import KAFKA_MEMBER_SCRIPT, KafkaPythonMember, kafka_settle, kafka_topic

confluent_kafka = pytest.importorskip("confluent_kafka")

PARTITIONS = 6
SESSION_MS = 6000  # Kafka's group.min.session.timeout.ms: the shortest a client may ask


def fresh(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:10]


def make_topic(server, partitions: int = PARTITIONS, records_each: int = 0) -> str:
    return kafka_topic(server.bootstrap, fresh("t"), partitions, records_each)


def consumer(server, group: str, **extra):
    conf = {"bootstrap.servers": server.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
            "session.timeout.ms": SESSION_MS, "heartbeat.interval.ms": 500, **extra}
    return confluent_kafka.Consumer(conf)


def settle(consumers, want_sizes, timeout_s: float = 60.0) -> list[list[int]]:
    return kafka_settle(consumers, want_sizes, PARTITIONS, timeout_s)


@pytest.mark.parametrize("assignor", ["range", "roundrobin", "cooperative-sticky"])
def test_librdkafka_two_then_three_members_share_the_partitions(kafka_shared, assignor):
    topic = make_topic(kafka_shared)
    group = fresh("g")
    members = [consumer(kafka_shared, group, **{"partition.assignment.strategy": assignor}) for _ in range(3)]
    revoked: list[set[int]] = [set() for _ in members]

    def on_revoke(i):
        return lambda c, partitions: revoked[i].update(tp.partition for tp in partitions)

    try:
        for i, c in enumerate(members[:2]):
            c.subscribe([topic], on_revoke=on_revoke(i))
        before = settle(members[:2], [3, 3])
        for r in revoked:
            r.clear()
        members[2].subscribe([topic])
        after = settle(members, [2, 2, 2])
        if assignor == "cooperative-sticky":  # incremental: only the partitions that moved were revoked
            assert [revoked[i] for i in range(2)] == [set(before[i]) - set(after[i]) for i in range(2)]
            assert all(len(revoked[i]) == 1 for i in range(2))
        members[2].close()  # a clean leave: the two others take its partitions at once
        settle(members[:2], [3, 3], timeout_s=SESSION_MS / 1000 - 1)
    finally:
        for c in members:
            c.close()


@pytest.mark.parametrize("count", [2, 3])
def test_kafka_python_members_share_the_partitions(kafka_shared, count):
    pytest.importorskip("kafka")
    topic = make_topic(kafka_shared)
    group = fresh("g")
    members = [KafkaPythonMember(bootstrap_servers=kafka_shared.bootstrap, group_id=group,
                                 session_timeout_ms=SESSION_MS, heartbeat_interval_ms=500,
                                 auto_offset_reset="earliest") for _ in range(count)]
    try:
        for m in members:
            m.start(topic)

        def settled():
            got = [m.assignment() for m in members]
            return sorted(p for g in got for p in g) == list(range(PARTITIONS)) and \
                [len(g) for g in got] == [PARTITIONS // count] * count and got

        eventually(settled, timeout_s=60, what="kafka-python's group sharing the partitions")
    finally:
        for m in members:
            m.close()


def test_members_of_different_client_libraries_share_a_group_and_hand_over(kafka_shared):
    """A librdkafka member and a kafka-python member of one group (both ``range``): the
    partitions split 2 and 2; when the kafka-python member leaves, the librdkafka member takes
    its partitions and resumes after its committed offsets: every record is read, a record read
    twice only as at-least-once allows (none was committed before it was read again)."""
    kafka = pytest.importorskip("kafka")
    from kafka.coordinator.assignors.range import RangePartitionAssignor

    partitions = 4
    topic = kafka_topic(kafka_shared.bootstrap, fresh("t"), partitions, records_each=20)
    group = fresh("g")
    reads: list[tuple[int, int]] = []  # (partition, offset) of every record either member read
    committed: dict[int, int] = {}  # the group's committed offsets, as the members committed them

    ours = consumer(kafka_shared, group, **{"enable.auto.commit": False, "partition.assignment.strategy": "range"})
    theirs = KafkaPythonMember(bootstrap_servers=kafka_shared.bootstrap, group_id=group,
                               session_timeout_ms=SESSION_MS, heartbeat_interval_ms=500,
                               auto_offset_reset="earliest", enable_auto_commit=False,
                               partition_assignment_strategy=[RangePartitionAssignor])

    def poll_ours(timeout_s: float) -> None:
        m = ours.poll(timeout_s)
        if m is not None and not m.error():
            assert committed.get(m.partition(), 0) <= m.offset(), "a committed record was read again"
            reads.append((m.partition(), m.offset()))
            try:
                ours.commit(m, asynchronous=False)
            except confluent_kafka.KafkaException:  # a rebalance began: the record may be read again
                return
            committed[m.partition()] = m.offset() + 1

    def theirs_read(kafka_consumer, got) -> None:  # (on the kafka-python member's thread)
        for tp, records in got.items():
            for r in records:
                assert committed.get(tp.partition, 0) <= r.offset, "a committed record was read again"
                reads.append((tp.partition, r.offset))
        try:
            kafka_consumer.commit()
        except kafka.errors.KafkaError:  # a rebalance began: the records may be read again
            return
        for tp, records in got.items():
            committed[tp.partition] = records[-1].offset + 1

    def everything_read(count: int) -> bool:
        return {(p, o) for p in range(partitions) for o in range(count)} <= set(reads)

    try:
        ours.subscribe([topic])
        theirs.start(topic, theirs_read)
        deadline = time.monotonic() + 60
        while True:
            poll_ours(0.05)
            split = [sorted(tp.partition for tp in ours.assignment()), theirs.assignment()]
            if sorted(split) == [[0, 1], [2, 3]] and everything_read(20):
                break
            assert time.monotonic() < deadline, f"the group did not split and read everything: {split}"
        theirs.close()  # commits nothing more, leaves the group: its partitions move at once
        producer = confluent_kafka.Producer({"bootstrap.servers": kafka_shared.bootstrap})
        for i in range(20 * partitions):
            producer.produce(topic, value=b"after %d" % i, partition=i % partitions)
        assert producer.flush(30) == 0
        deadline = time.monotonic() + SESSION_MS / 1000 * 3
        while not (len(ours.assignment()) == partitions and everything_read(40)):
            assert time.monotonic() < deadline, f"the hand-over did not finish: {ours.assignment()}"
            poll_ours(0.05)
        assert {tp.offset for tp in ours.committed(
            [confluent_kafka.TopicPartition(topic, p) for p in range(partitions)], 30)} == {40}
    finally:
        ours.close()
        theirs.close()


def test_a_member_killed_without_leaving_loses_its_partitions_after_its_session(kafka_shared):
    topic = make_topic(kafka_shared)
    group = fresh("g")
    settings = json.dumps({"session.timeout.ms": SESSION_MS, "heartbeat.interval.ms": 500})
    proc = subprocess.Popen([sys.executable, "-c", KAFKA_MEMBER_SCRIPT, kafka_shared.bootstrap, group, topic, settings],
                            stdout=subprocess.PIPE, text=True)
    survivor = consumer(kafka_shared, group)
    try:
        survivor.subscribe([topic])
        deadline = time.monotonic() + 60
        while len(survivor.assignment()) != PARTITIONS // 2:  # the other half is the subprocess's
            assert time.monotonic() < deadline, "the subprocess never joined"
            survivor.poll(0.05)
        proc.kill()  # kill -9: no LeaveGroup
        proc.wait()
        killed_at = time.monotonic()
        settle([survivor], [PARTITIONS], timeout_s=SESSION_MS / 1000 * 3)
        assert time.monotonic() - killed_at >= SESSION_MS / 1000 - 1  # the session timeout, not a leave
    finally:
        survivor.close()
        if proc.poll() is None:
            proc.kill()


def test_committed_offsets_survive_a_restart_and_a_new_consumer_resumes_after_them(kafka_partita):
    server = kafka_partita()
    topic = make_topic(server, records_each=10)
    group = fresh("g")
    c = consumer(server, group, **{"enable.auto.commit": False})
    c.subscribe([topic])
    seen = 0
    deadline = time.monotonic() + 60
    while seen < 10 * PARTITIONS and time.monotonic() < deadline:
        m = c.poll(0.1)
        if m is not None and not m.error():
            seen += 1
    assert seen == 10 * PARTITIONS
    # processed the first 5 records of each partition: commit their next offsets
    c.commit(offsets=[confluent_kafka.TopicPartition(topic, p, 5) for p in range(PARTITIONS)], asynchronous=False)
    c.close()
    server.restart(kill9=True)
    again = consumer(server, group, **{"enable.auto.commit": False})
    try:
        committed = again.committed([confluent_kafka.TopicPartition(topic, p) for p in range(PARTITIONS)], 30)
        assert [tp.offset for tp in committed] == [5] * PARTITIONS
        again.subscribe([topic])
        first: dict[int, int] = {}
        count = 0
        deadline = time.monotonic() + 60
        while count < 5 * PARTITIONS and time.monotonic() < deadline:
            m = again.poll(0.1)
            if m is not None and not m.error():
                first.setdefault(m.partition(), m.offset())
                count += 1
        assert count == 5 * PARTITIONS and first == {p: 5 for p in range(PARTITIONS)}
        assert again.poll(0.5) is None  # nothing skipped, nothing twice: the log ends at 10
    finally:
        again.close()


def test_topic_groups_shows_kafka_groups_beside_redis_groups_with_lag(kafka_shared):
    topic = make_topic(kafka_shared, records_each=4)
    group = fresh("g")
    c = consumer(kafka_shared, group, **{"enable.auto.commit": False})
    c.commit(offsets=[confluent_kafka.TopicPartition(topic, p, p % 4) for p in range(PARTITIONS)],
             asynchronous=False)
    c.close()
    r = kafka_shared.client()
    r.execute_command("XGROUP", "CREATE", topic, group, "0")  # a Redis group of the same name
    as_maps = [as_map(v) for v in r.execute_command("TOPIC", "GROUPS", topic)]
    assert sorted((m[b"name"].decode(), m[b"type"]) for m in as_maps) == [(group, b"kafka"), (group, b"redis")]
    kafka_view = next(m for m in as_maps if m[b"type"] == b"kafka")
    assert kafka_view[b"state"] == b"Empty"
    rows = [as_map(p) for p in kafka_view[b"partitions"]]
    assert [(p[b"committed-offset"], p[b"end-offset"], p[b"lag"]) for p in rows] == \
        [(p % 4, 4, 4 - p % 4) for p in range(PARTITIONS)]
    # XINFO GROUPS too: the Redis group's row as Redis has it, then the Kafka group's
    redis_row, kafka_row = (as_map(v) for v in r.execute_command("XINFO", "GROUPS", f"{topic}#1"))
    assert (redis_row[b"name"].decode(), b"type" in redis_row) == (group, False)
    assert kafka_row == {b"name": group.encode(), b"type": b"kafka", b"consumers": 0, b"pending": 0,
                         b"committed-offset": 1, b"lag": 3}
    kafka_row = as_map(r.execute_command("XINFO", "GROUPS", topic)[1])  # the topic key: summed
    assert (kafka_row[b"partitions"], kafka_row[b"lag"]) == (PARTITIONS, sum(4 - p % 4 for p in range(PARTITIONS)))


def as_map(value) -> dict:
    return value if isinstance(value, dict) else dict(zip(value[::2], value[1::2]))


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed")
def test_kcat_balanced_consumer_reads_everything_and_commits(kafka_shared):
    topic = make_topic(kafka_shared, records_each=2)
    group = fresh("g")
    out = subprocess.run(["kcat", "-b", kafka_shared.bootstrap, "-G", group, "-X", "auto.offset.reset=earliest",
                          "-X", f"session.timeout.ms={SESSION_MS}", "-c", str(2 * PARTITIONS), "-f", "%p:%o\\n",
                          topic], capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr
    got = sorted(tuple(map(int, line.split(":"))) for line in out.stdout.split())
    assert got == [(p, o) for p in range(PARTITIONS) for o in range(2)]
    with KafkaRaw(kafka_shared.kafka_port) as raw:
        from server.kafka import codec

        listed = raw.call(codec.ListGroupsRequest(), 4)
        assert group in [g.group_id for g in listed.groups]


def test_find_coordinator_refuses_transactions_and_names_this_node_for_groups(kafka_shared):
    from server.kafka import codec
    from server.kafka import errors as E

    with KafkaRaw(kafka_shared.kafka_port) as raw:
        r = raw.call(codec.FindCoordinatorRequest(key="g", key_type=0), 3)
        assert (r.error_code, r.port) == (E.NONE, kafka_shared.kafka_port)
        r = raw.call(codec.FindCoordinatorRequest(key_type=1, coordinator_keys=["tx"]), 4)
        assert r.coordinators[0].error_code == E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        r = raw.call(codec.JoinGroupRequest(group_id="g", session_timeout_ms=SESSION_MS, rebalance_timeout_ms=1000,
                                            member_id="", protocol_type="consumer",
                                            protocols=[codec.JoinGroupRequest.JoinGroupRequestProtocol(
                                                name="range", metadata=b"")]), 5)
        assert r.error_code == E.MEMBER_ID_REQUIRED and r.member_id



def test_commits_outside_a_generation_are_answered_as_kafkas_coordinator_does(kafka_shared):
    """Kafka's ``OffsetMetadataManager.validateOffsetCommit`` for a group with no members: generation
    -1 commits whatever the member id (a missing group becomes a simple one); a generation >= 0 for a
    group that does not exist is GROUP_ID_NOT_FOUND from v9 (ILLEGAL_GENERATION before), and for an
    empty group that exists UNKNOWN_MEMBER_ID (no such member)."""
    from server.kafka import codec
    from server.kafka import errors as E

    topic = make_topic(kafka_shared, partitions=1)
    C = codec.OffsetCommitRequest

    def commit(raw, group, generation, member, version=8):
        body = C(group_id=group, generation_id_or_member_epoch=generation, member_id=member, topics=[
            C.OffsetCommitRequestTopic(name=topic, partitions=[
                C.OffsetCommitRequestPartition(partition_index=0, committed_offset=1)])])
        return raw.call(body, version).topics[0].partitions[0].error_code

    with KafkaRaw(kafka_shared.kafka_port) as raw:
        assert commit(raw, fresh("g"), 3, "gone-member", version=8) == E.ILLEGAL_GENERATION
        assert commit(raw, fresh("g"), 3, "gone-member", version=9) == E.GROUP_ID_NOT_FOUND
        assert commit(raw, fresh("g"), 3, "", version=9) == E.GROUP_ID_NOT_FOUND
        simple = fresh("g")
        assert commit(raw, simple, -1, "gone-member") == E.NONE  # made a simple group
        assert commit(raw, simple, -1, "") == E.NONE
        assert commit(raw, simple, 3, "gone-member") == E.UNKNOWN_MEMBER_ID
        assert commit(raw, simple, 3, "") == E.UNKNOWN_MEMBER_ID


def test_committed_offsets_of_unknown_partitions_are_none_not_errors(kafka_shared):
    """Kafka's coordinator answers OffsetFetch from the committed offsets alone: a partition or topic
    that does not exist has no committed offset (-1), not UNKNOWN_TOPIC_OR_PARTITION."""
    TP = confluent_kafka.TopicPartition
    topic = make_topic(kafka_shared, partitions=1)
    c = consumer(kafka_shared, fresh("g"), **{"enable.auto.commit": False})
    try:
        c.commit(offsets=[TP(topic, 0, 1)], asynchronous=False)
        got = c.committed([TP(topic, 0), TP(topic, 9), TP(fresh("missing"), 0)], timeout=10)
    finally:
        c.close()
    assert [(tp.offset, tp.error) for tp in got] == [(1, None), (-1001, None), (-1001, None)]


def test_admin_client_lists_describes_and_deletes_groups(kafka_shared):
    from confluent_kafka.admin import AdminClient

    topic = make_topic(kafka_shared, records_each=1)
    group = fresh("g")
    admin = AdminClient({"bootstrap.servers": kafka_shared.bootstrap})
    c = consumer(kafka_shared, group, **{"client.id": "describe-me"})
    try:
        c.subscribe([topic])
        settle([c], [PARTITIONS])
        c.commit(offsets=[confluent_kafka.TopicPartition(topic, p, 1) for p in range(PARTITIONS)],
                 asynchronous=False)
        listed = admin.list_consumer_groups().result(30)
        assert group in [g.group_id for g in listed.valid]
        described = admin.describe_consumer_groups([group])[group].result(30)
        assert str(described.state).endswith("STABLE")
        [member] = described.members
        assert member.client_id == "describe-me"
        assert sorted(tp.partition for tp in member.assignment.topic_partitions) == list(range(PARTITIONS))
        with pytest.raises(confluent_kafka.KafkaException, match="NON_EMPTY_GROUP|not empty"):
            admin.delete_consumer_groups([group])[group].result(30)
    finally:
        c.close()  # LeaveGroup: the group is Empty
    offsets = admin.list_consumer_group_offsets(
        [confluent_kafka.ConsumerGroupTopicPartitions(group)])[group].result(30)
    assert sorted((tp.partition, tp.offset) for tp in offsets.topic_partitions) == [(p, 1) for p in range(PARTITIONS)]
    admin.delete_consumer_groups([group])[group].result(30)
    assert group not in [g.group_id for g in admin.list_consumer_groups().result(30).valid]


def test_a_static_member_restarting_gets_its_partitions_back_without_a_rebalance(kafka_shared):
    topic = make_topic(kafka_shared)
    group = fresh("g")
    revoked: list[int] = []
    leader = consumer(kafka_shared, group, **{"group.instance.id": "a"})
    leader.subscribe([topic], on_revoke=lambda c, parts: revoked.extend(tp.partition for tp in parts))
    settle([leader], [PARTITIONS])  # alone first: the leader
    follower = consumer(kafka_shared, group, **{"group.instance.id": "b"})
    follower.subscribe([topic])
    before = settle([leader, follower], [3, 3])
    try:
        follower.close()  # a static member does not leave (KIP-345): its partitions wait for it
        revoked.clear()
        again = consumer(kafka_shared, group, **{"group.instance.id": "b"})
        again.subscribe([topic])
        after = settle([leader, again], [3, 3], timeout_s=SESSION_MS / 1000 - 1)
        assert after == before and revoked == []  # the leader kept its partitions throughout
        again.close()
    finally:
        leader.close()
