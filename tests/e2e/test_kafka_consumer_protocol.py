"""Kafka's consumer group protocol (KIP-848) with librdkafka's ``group.protocol=consumer`` against a
real ``partita`` (docs/kafka.md, "The consumer group protocol"): two then three members share a
6-partition topic disjointly with each server-side assignor, a member closed cleanly and one killed
(its session timeout) have their partitions moved, every record is consumed at least once, offsets
committed at the member epoch let a new consumer resume, TOPIC GROUPS shows the group with its lag;
on the wire: ApiVersions, the request checks, STALE_MEMBER_EPOCH, a group id of one type,
ConsumerGroupDescribe and ListGroups' type filter; a regex subscription with the AdminClient's view;
a static member returning to its partitions."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid

import pytest

from tests.conftest import KafkaRaw, PartitaProcess, free_port, with_kafka
from tests.e2e.groups_support import KAFKA_MEMBER_SCRIPT, kafka_settle, kafka_topic

confluent_kafka = pytest.importorskip("confluent_kafka")

from server.kafka import codec  # noqa: E402
from server.kafka import errors as E  # noqa: E402
from server.kafka_front.groups import decode_assignment, decode_subscription  # noqa: E402

PARTITIONS = 6
SESSION_MS = 6000  # the broker's kafka-consumer-session-timeout-ms here
HB = codec.ConsumerGroupHeartbeatRequest


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    port = free_port()
    proc = PartitaProcess(tmp_path_factory.mktemp("partita") / "data",
                          ["--kafka-port", str(port), "--kafka-consumer-session-timeout-ms", str(SESSION_MS),
                           "--kafka-consumer-heartbeat-interval-ms", "500"]).start()
    yield with_kafka(proc, port)
    proc.stop()


def fresh(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:10]


def make_topic(server, records_each: int = 0, topic: str | None = None) -> str:
    return kafka_topic(server.bootstrap, topic or fresh("t"), PARTITIONS, records_each)


def consumer(server, group: str, **extra):
    return confluent_kafka.Consumer({"bootstrap.servers": server.bootstrap, "group.id": group,
                                     "group.protocol": "consumer", "auto.offset.reset": "earliest", **extra})


class Seen:
    """Every record the consumers polled, as (partition, offset)."""

    def __init__(self) -> None:
        self.records: set[tuple[int, int]] = set()

    def add(self, m) -> None:
        self.records.add((m.partition(), m.offset()))

    def poll(self, c, timeout_s: float = 0.05) -> None:
        m = c.poll(timeout_s)
        if m is not None and not m.error():
            self.add(m)


def settle(consumers, want_sizes, seen: Seen, timeout_s: float = 60.0) -> list[list[int]]:
    return kafka_settle(consumers, want_sizes, PARTITIONS, timeout_s, seen.add)


@pytest.mark.parametrize("assignor", ["uniform", "range"])
def test_two_then_three_members_share_the_partitions_and_a_clean_close_moves_them(server, assignor):
    topic = make_topic(server, records_each=20)
    group = fresh("g")
    seen = Seen()
    members = [consumer(server, group, **{"group.remote.assignor": assignor}) for _ in range(3)]
    try:
        for c in members[:2]:
            c.subscribe([topic])
        settle(members[:2], [3, 3], seen)
        members[2].subscribe([topic])
        after = settle(members, [2, 2, 2], seen)
        if assignor == "range":
            assert sorted(after) == [[0, 1], [2, 3], [4, 5]]
        members[2].close()  # leaves with epoch -1: the two others take its partitions at once
        settle(members[:2], [3, 3], seen, timeout_s=SESSION_MS / 1000 - 1)
        deadline = time.monotonic() + 60
        while len(seen.records) < 20 * PARTITIONS and time.monotonic() < deadline:
            for c in members[:2]:
                seen.poll(c)
        assert seen.records == {(p, o) for p in range(PARTITIONS) for o in range(20)}  # each at least once
    finally:
        for c in members:
            c.close()


def test_a_member_killed_loses_its_partitions_after_the_session_timeout(server):
    topic = make_topic(server)
    group = fresh("g")
    seen = Seen()
    proc = subprocess.Popen([sys.executable, "-c", KAFKA_MEMBER_SCRIPT, server.bootstrap, group, topic,
                             '{"group.protocol": "consumer"}'], stdout=subprocess.PIPE, text=True)
    survivor = consumer(server, group)
    try:
        survivor.subscribe([topic])
        deadline = time.monotonic() + 60
        while len(survivor.assignment()) != PARTITIONS // 2:  # the other half is the subprocess's
            assert time.monotonic() < deadline, "the subprocess never joined"
            survivor.poll(0.05)
        proc.kill()  # kill -9: no leaving heartbeat
        proc.wait()
        killed_at = time.monotonic()
        settle([survivor], [PARTITIONS], seen, timeout_s=SESSION_MS / 1000 * 3)
        assert time.monotonic() - killed_at >= SESSION_MS / 1000 - 1  # the session timeout, not a leave
    finally:
        survivor.close()
        if proc.poll() is None:
            proc.kill()


def as_map(value) -> dict:
    return value if isinstance(value, dict) else dict(zip(value[::2], value[1::2]))


def test_commits_at_the_member_epoch_let_a_new_consumer_resume_and_topic_groups_shows_the_lag(server):
    topic = make_topic(server, records_each=10)
    group = fresh("g")
    seen = Seen()
    members = [consumer(server, group, **{"enable.auto.commit": False}) for _ in range(2)]
    try:
        for c in members:
            c.subscribe([topic])
        settle(members, [3, 3], seen)
        deadline = time.monotonic() + 60
        while len(seen.records) < 10 * PARTITIONS and time.monotonic() < deadline:
            for c in members:
                seen.poll(c)
        assert len(seen.records) == 10 * PARTITIONS
        for c in members:  # processed the first 4 records of each of its partitions
            c.commit(offsets=[confluent_kafka.TopicPartition(topic, tp.partition, 4) for tp in c.assignment()],
                     asynchronous=False)
        views = [as_map(v) for v in server.client().execute_command("TOPIC", "GROUPS", topic)]
        [view] = [v for v in views if v[b"name"] == group.encode()]
        assert (view[b"type"], view[b"protocol"], view[b"state"]) == (b"kafka", b"consumer", b"Stable")
        assert len(view[b"members"]) == 2
        rows = [as_map(p) for p in view[b"partitions"]]
        assert [(p[b"committed-offset"], p[b"lag"]) for p in rows] == [(4, 6)] * PARTITIONS
        assert all(p[b"owner"] is not None for p in rows)
    finally:
        for c in members:
            c.close()
    again = consumer(server, group, **{"enable.auto.commit": False})
    try:
        again.subscribe([topic])
        first: dict[int, int] = {}
        deadline = time.monotonic() + 60
        while len(first) < PARTITIONS and time.monotonic() < deadline:
            m = again.poll(0.1)
            if m is not None and not m.error():
                first.setdefault(m.partition(), m.offset())
        assert first == {p: 4 for p in range(PARTITIONS)}
    finally:
        again.close()


def join(raw, group: str, member_id: str, topic: str, version: int = 1):
    return raw.call(HB(group_id=group, member_id=member_id, member_epoch=0, rebalance_timeout_ms=30000,
                       subscribed_topic_names=[topic], topic_partitions=[]), version)


def test_the_wire_apis_versions_checks_epochs_and_one_type_per_group(server):
    topic = make_topic(server)
    group = fresh("g")
    with KafkaRaw(server.kafka_port) as raw:
        versions = {k.api_key: (k.min_version, k.max_version)
                    for k in raw.call(codec.ApiVersionsRequest(), 3).api_keys}
        assert versions[68] == (0, 1) and versions[69] == (0, 1)
        r = raw.call(HB(group_id=group, member_id="", member_epoch=0, rebalance_timeout_ms=30000,
                        subscribed_topic_names=[topic]), 1)
        assert (r.error_code, r.error_message) == (E.INVALID_REQUEST, "MemberId can't be empty.")
        r = raw.call(HB(group_id=group, member_id="m1", member_epoch=0, subscribed_topic_names=[topic]), 1)
        assert r.error_code == E.INVALID_REQUEST
        r = join(raw, group, "m1", topic)
        assert (r.error_code, r.member_id, r.member_epoch) == (E.NONE, "m1", 1)
        assert r.heartbeat_interval_ms == 500
        assert sorted(r.assignment.topic_partitions[0].partitions) == list(range(PARTITIONS))
        r = raw.call(HB(group_id=group, member_id="m1", member_epoch=5), 1)
        assert r.error_code == E.FENCED_MEMBER_EPOCH
        # OffsetCommit v9: the member epoch must be the current one
        commit = codec.OffsetCommitRequest(group_id=group, generation_id_or_member_epoch=0, member_id="m1", topics=[
            codec.OffsetCommitRequest.OffsetCommitRequestTopic(name=topic, partitions=[
                codec.OffsetCommitRequest.OffsetCommitRequestPartition(partition_index=0, committed_offset=1)])])
        assert raw.call(commit, 9).topics[0].partitions[0].error_code == E.STALE_MEMBER_EPOCH
        commit.generation_id_or_member_epoch = 1
        assert raw.call(commit, 9).topics[0].partitions[0].error_code == E.NONE
        # one type per group id while it has members
        r = raw.call(codec.JoinGroupRequest(group_id=group, session_timeout_ms=6000, rebalance_timeout_ms=1000,
                                            member_id="", protocol_type="consumer",
                                            protocols=[codec.JoinGroupRequest.JoinGroupRequestProtocol(
                                                name="range", metadata=b"")]), 5)
        assert r.error_code == E.INCONSISTENT_GROUP_PROTOCOL
        listed = raw.call(codec.ListGroupsRequest(types_filter=["consumer"]), 5)
        assert [(g.group_id, g.group_type, g.protocol_type) for g in listed.groups if g.group_id == group] == \
            [(group, "consumer", "consumer")]
        d = raw.call(codec.ConsumerGroupDescribeRequest(group_ids=[group, "nope"]), 1).groups
        assert (d[0].error_code, d[0].group_state, d[0].group_epoch, d[0].assignor_name) == (E.NONE, "Stable", 1,
                                                                                            "uniform")
        assert [m.member_id for m in d[0].members] == ["m1"]
        assert d[0].members[0].assignment.topic_partitions[0].topic_name == topic
        assert d[1].error_code == E.GROUP_ID_NOT_FOUND
        [classic_view] = raw.call(codec.DescribeGroupsRequest(groups=[group]), 5).groups  # for classic-only tools
        assert (classic_view.group_state, classic_view.protocol_type, classic_view.protocol_data) == \
            ("Stable", "consumer", "uniform")
        assert decode_assignment(classic_view.members[0].member_assignment) == {topic: list(range(PARTITIONS))}
        assert decode_subscription(classic_view.members[0].member_metadata) == [topic]
        r = raw.call(HB(group_id=group, member_id="m1", member_epoch=-1), 1)
        assert (r.error_code, r.member_epoch) == (E.NONE, -1)
        classic = fresh("c")
        r = raw.call(codec.JoinGroupRequest(group_id=classic, session_timeout_ms=6000, rebalance_timeout_ms=1000,
                                            member_id="", protocol_type="consumer",
                                            protocols=[codec.JoinGroupRequest.JoinGroupRequestProtocol(
                                                name="range", metadata=b"")]), 5)
        assert r.error_code == E.MEMBER_ID_REQUIRED  # a classic member is on its way
        r = join(raw, classic, "m2", topic)
        assert (r.error_code, r.error_message) == (E.GROUP_ID_NOT_FOUND, f"Group {classic} is not a consumer group.")


def test_a_regex_subscription_and_the_admin_clients_view(server):
    from confluent_kafka.admin import AdminClient

    prefix = fresh("r")
    topics = [make_topic(server, topic=prefix + suffix) for suffix in ("a", "b")]
    group = fresh("g")
    seen = Seen()
    c = consumer(server, group, **{"client.id": "regex-member"})
    try:
        c.subscribe([f"^{prefix}.*"])  # librdkafka sends it as SubscribedTopicRegex (v1)
        deadline = time.monotonic() + 60
        while sorted((tp.topic, tp.partition) for tp in c.assignment()) != \
                [(t, p) for t in topics for p in range(PARTITIONS)]:
            assert time.monotonic() < deadline, c.assignment()
            seen.poll(c)
        admin = AdminClient({"bootstrap.servers": server.bootstrap})
        described = admin.describe_consumer_groups([group])[group].result(30)  # ConsumerGroupDescribe
        [member] = described.members
        assert member.client_id == "regex-member"
        assert sorted((tp.topic, tp.partition) for tp in member.assignment.topic_partitions) == \
            [(t, p) for t in topics for p in range(PARTITIONS)]
        assert str(described.state).endswith("STABLE")
        listed = admin.list_consumer_groups().result(30)
        [mine] = [g for g in listed.valid if g.group_id == group]
        assert str(mine.type).endswith("CONSUMER")
    finally:
        c.close()


def test_a_static_member_closing_and_returning_keeps_its_partitions(server):
    topic = make_topic(server)
    group = fresh("g")
    seen = Seen()
    revoked: list[int] = []
    stays = consumer(server, group, **{"group.instance.id": "a"})
    stays.subscribe([topic], on_revoke=lambda c, parts: revoked.extend(tp.partition for tp in parts))
    settle([stays], [PARTITIONS], seen)
    leaves = consumer(server, group, **{"group.instance.id": "b"})
    leaves.subscribe([topic])
    before = settle([stays, leaves], [3, 3], seen)
    try:
        leaves.close()  # a static member leaves with epoch -2: its partitions wait for it
        revoked.clear()
        again = consumer(server, group, **{"group.instance.id": "b"})
        again.subscribe([topic])
        after = settle([stays, again], [3, 3], seen, timeout_s=SESSION_MS / 1000 - 1)
        assert after == before and revoked == []  # the other member kept its partitions throughout
        again.close()
    finally:
        stays.close()
