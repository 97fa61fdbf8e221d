"""Kafka share groups (KIP-932) with librdkafka's ShareConsumer against a real ``partita``
(docs/kafka.md, "Share groups"): a share group is the Redis consumer group of the same name on
each partition, so share consumers get each record once while they acknowledge it, a released
or lock-expired record comes back with its delivery count + 1 (archived past the delivery
limit; REJECT dead-letters it), and an XREADGROUP consumer of the group and a share consumer
together consume every entry exactly once."""

from __future__ import annotations

import time
import uuid

import pytest

confluent_kafka = pytest.importorskip("confluent_kafka")
if not hasattr(confluent_kafka, "ShareConsumer"):
    pytest.skip("this confluent-kafka has no ShareConsumer (KIP-932)", allow_module_level=True)

ACCEPT = confluent_kafka.AcknowledgeType.ACCEPT
RELEASE = confluent_kafka.AcknowledgeType.RELEASE
LOCK_MS = 1000  # share-record-lock-duration-ms for the lock test (Kafka's minimum)


def fresh(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:10]


def make_topic(server, partitions: int) -> str:
    topic = fresh("t")
    server.client().execute_command("TOPIC", "CREATE", topic, "PARTITIONS", partitions)
    return topic


def share_consumer(server, group: str, topic: str, explicit: bool = False, **extra):
    conf = {"bootstrap.servers": server.bootstrap, "group.id": group, "fetch.wait.max.ms": 100, **extra}
    if explicit:
        conf["share.acknowledgement.mode"] = "explicit"
    c = confluent_kafka.ShareConsumer(conf)
    c.subscribe([topic])
    return c


def partition_keys(topic: str, partitions: int) -> list[str]:
    return [topic] if partitions == 1 else [f"{topic}#{n}" for n in range(partitions)]


def wait_for_group(server, consumers, topic: str, partitions: int, group: str, timeout_s: float = 30.0) -> None:
    """Poll the consumers until the share group's Redis group exists on every partition (made at
    the end of the log by the first ShareFetch: records produced before it are not the group's)."""
    r = server.client()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for c in consumers:
            assert not list(c.poll(0.1)), "a record before anything was produced"
        if all(any(g["name"] == group.encode() for g in r.xinfo_groups(k))
               for k in partition_keys(topic, partitions)):
            return
    raise AssertionError("the share group's Redis groups were not made")


def produce(server, topic: str, count: int, partitions: int) -> set[bytes]:
    p = confluent_kafka.Producer({"bootstrap.servers": server.bootstrap})
    values = {b"v%d" % i for i in range(count)}
    for i, v in enumerate(sorted(values)):
        p.produce(topic, value=v, partition=i % partitions)
    assert p.flush(30) == 0
    return values


def wait_acknowledged(server, consumers, keys: list[str], group: str, timeout_s: float = 30.0) -> None:
    """Poll the consumers (implicit mode: a poll sends the last one's acknowledgements) until
    nothing is pending in the group; no record may come."""
    r = server.client()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for c in consumers:
            assert records(c, 0.1) == []
        if sum(r.xpending(k, group)["pending"] for k in keys) == 0:
            return
    raise AssertionError("records stayed pending")


def records(consumer, timeout_s: float = 0.2) -> list:
    got = []
    for m in consumer.poll(timeout_s):
        assert m.error() is None, m.error()
        got.append(m)
    return got


def test_two_share_consumers_get_disjoint_records_each_once(kafka_shared):
    topic, group = make_topic(kafka_shared, 3), fresh("g")
    # (at most 5 records a ShareFetch: neither member's waiting fetch takes them all)
    members = [share_consumer(kafka_shared, group, topic, **{"max.poll.records": 5}) for _ in range(2)]
    try:
        wait_for_group(kafka_shared, members, topic, 3, group)
        values = produce(kafka_shared, topic, 60, 3)
        seen: list[list[bytes]] = [[], []]
        deadline = time.monotonic() + 60
        while sum(map(len, seen)) < len(values) and time.monotonic() < deadline:
            for i, c in enumerate(members):  # implicit mode: the next poll accepts these
                seen[i] += [m.value() for m in records(c)]
        wait_acknowledged(kafka_shared, members, partition_keys(topic, 3), group)  # nothing more comes
        assert sorted(seen[0] + seen[1]) == sorted(values)  # every record, each once
        assert seen[0] and seen[1]  # both members took part
    finally:
        for c in members:
            c.close()


def test_a_released_record_is_redelivered_with_its_delivery_count_plus_one(kafka_shared):
    topic, group = make_topic(kafka_shared, 1), fresh("g")
    c = share_consumer(kafka_shared, group, topic, explicit=True)
    try:
        wait_for_group(kafka_shared, [c], topic, 1, group)
        produce(kafka_shared, topic, 1, 1)
        deadline = time.monotonic() + 30
        got = []
        while not got and time.monotonic() < deadline:
            got = records(c)
        (m,) = got
        assert m.delivery_count() == 1
        c.acknowledge(m, RELEASE)
        assert all(e is None for e in c.commit_sync(10).values())
        again = []
        while not again and time.monotonic() < deadline:
            again = records(c)
        (m2,) = again
        assert (m2.offset(), m2.value(), m2.delivery_count()) == (m.offset(), m.value(), 2)
        c.acknowledge(m2, ACCEPT)
        assert all(e is None for e in c.commit_sync(10).values())
        assert kafka_shared.client().xpending(topic, group)["pending"] == 0
    finally:
        c.close()


def test_a_record_released_five_times_is_archived_and_one_rejected_is_dead_lettered(kafka_shared):
    """share-delivery-count-limit (5): the 6th acquisition archives the record instead (acknowledged);
    REJECT moves a record to the group's dead-letter stream (XGROUP CONFIG ... DEADLETTER)."""
    topic, group = make_topic(kafka_shared, 1), fresh("g")
    c = share_consumer(kafka_shared, group, topic, explicit=True)
    r = kafka_shared.client()
    try:
        wait_for_group(kafka_shared, [c], topic, 1, group)
        produce(kafka_shared, topic, 1, 1)
        deadline = time.monotonic() + 60
        counts = []
        while len(counts) < 5 and time.monotonic() < deadline:
            for m in records(c):
                counts.append(m.delivery_count())
                c.acknowledge(m, RELEASE)
                assert all(e is None for e in c.commit_sync(10).values())
        assert counts == [1, 2, 3, 4, 5]
        assert records(c, 1.0) == [] and r.xpending(topic, group)["pending"] == 0  # archived
        r.execute_command("XGROUP", "CONFIG", topic, group, "MAXDELIVERIES", 10, "DEADLETTER", topic + "-dl")
        produce(kafka_shared, topic, 1, 1)
        got = []
        while not got and time.monotonic() < deadline:
            got = records(c)
        c.acknowledge(got[0], confluent_kafka.AcknowledgeType.REJECT)
        assert all(e is None for e in c.commit_sync(10).values())
        (dead,) = r.xrange(topic + "-dl")
        assert dead[1][b"value"] == got[0].value() and dead[1][b"dl-group"] == group.encode()
        assert r.xpending(topic, group)["pending"] == 0
    finally:
        c.close()


def test_a_record_whose_lock_expired_goes_to_another_member_with_count_plus_one(kafka_partita):
    server = kafka_partita(["--share-record-lock-duration-ms", str(LOCK_MS)])
    topic, group = make_topic(server, 1), fresh("g")
    holder = share_consumer(server, group, topic, explicit=True)
    other = share_consumer(server, group, topic, explicit=True)
    try:
        wait_for_group(server, [holder], topic, 1, group)
        produce(server, topic, 1, 1)
        deadline = time.monotonic() + 30
        got = []
        while not got and time.monotonic() < deadline:
            got = records(holder)
        (m,) = got  # held, never acknowledged: its lock expires after LOCK_MS
        r = server.client()
        (pending,) = r.xpending_range(topic, group, "-", "+", 10)  # XPENDING names the member
        assert [x["name"] for x in r.xinfo_consumers(topic, group) if x["pending"]] == [pending["consumer"]]
        again = []
        while not again and time.monotonic() < deadline:
            again = records(other)
        (m2,) = again
        assert (m2.offset(), m2.delivery_count()) == (m.offset(), 2)
        other.acknowledge(m2, ACCEPT)
        assert all(e is None for e in other.commit_sync(10).values())
        assert r.xpending(topic, group)["pending"] == 0
    finally:
        holder.close()
        other.close()


def test_an_xreadgroup_consumer_and_a_share_consumer_share_one_group(kafka_shared):
    topic, group = make_topic(kafka_shared, 1), fresh("g")
    c = share_consumer(kafka_shared, group, topic)
    r = kafka_shared.client()
    try:
        wait_for_group(kafka_shared, [c], topic, 1, group)
        values = [b"v%d" % i for i in range(40)]
        tx = r.pipeline(transaction=True)  # the worker's first read before the member's (waiting) fetch
        for v in values:
            tx.xadd(topic, {"value": v})
        tx.xreadgroup(group, "worker", {topic: ">"}, count=5)
        first = tx.execute()[-1]
        by_redis: list[bytes] = []
        by_kafka: list[bytes] = []
        deadline = time.monotonic() + 60
        while len(by_redis) + len(by_kafka) < len(values) and time.monotonic() < deadline:
            reply = first or r.xreadgroup(group, "worker", {topic: ">"}, count=3)
            first = None
            for _, entries in reply:
                for sid, fields in entries:
                    by_redis.append(fields[b"value"])
                    assert r.xack(topic, group, sid) == 1
            got = records(c, 0.1)
            by_kafka += [m.value() for m in got]
            if got:  # while it holds records, the member is a consumer of the Redis group
                consumers = {x["name"]: x["pending"] for x in r.xinfo_consumers(topic, group)}
                assert consumers.pop(b"worker") == 0
                (held,) = consumers.values()  # the Kafka member, by its member id
                assert held >= len(got)
                assert r.xinfo_groups(topic)[0]["consumers"] == 2
        wait_acknowledged(kafka_shared, [c], [topic], group)
        assert r.xreadgroup(group, "worker", {topic: ">"}) == []
        assert sorted(by_redis + by_kafka) == sorted(values)  # every entry exactly once
        assert by_redis and by_kafka
    finally:
        c.close()


def test_the_share_apis_on_the_wire(kafka_shared):
    """Raw requests: a heartbeat's assignment by topic ID, the share session's epochs, records
    acquired with their delivery count, acknowledgements of records not held refused
    (INVALID_RECORD_STATE) and applying nothing, ShareAcknowledge, ShareGroupDescribe, and a
    closed session releasing what its member held."""
    from server.kafka import codec as C
    from server.kafka import errors as E
    from tests.conftest import KafkaRaw

    topic, group = make_topic(kafka_shared, 1), fresh("g")
    r = kafka_shared.client()
    F, A = C.ShareFetchRequest, C.ShareAcknowledgeRequest

    def fetch(epoch, acks=(), max_records=10, partitions=True):
        parts = [F.FetchPartition(partition_index=0, acknowledgement_batches=[
            F.AcknowledgementBatch(first_offset=a, last_offset=b, acknowledge_types=[t]) for a, b, t in acks])]
        return raw.call(F(group_id=group, member_id="m1", share_session_epoch=epoch, max_wait_ms=0, min_bytes=1,
                          max_records=max_records, batch_size=max_records,
                          topics=[F.FetchTopic(topic_id=topic_id, partitions=parts)] if partitions else []), 1)

    with KafkaRaw(kafka_shared.kafka_port) as raw:
        H = C.ShareGroupHeartbeatRequest
        assert raw.call(H(group_id=group, member_id="", member_epoch=0, subscribed_topic_names=[topic]),
                        1).error_code == E.INVALID_REQUEST
        joined = raw.call(H(group_id=group, member_id="m1", member_epoch=0, subscribed_topic_names=[topic]), 1)
        assert (joined.error_code, joined.member_id) == (E.NONE, "m1") and joined.member_epoch > 0
        (assigned,) = joined.assignment.topic_partitions
        topic_id = assigned.topic_id
        assert assigned.partitions == [0]
        again = raw.call(H(group_id=group, member_id="m1", member_epoch=joined.member_epoch), 1)
        assert (again.error_code, again.member_epoch, again.assignment) == (E.NONE, joined.member_epoch, None)

        assert fetch(3).error_code == E.SHARE_SESSION_NOT_FOUND
        opened = fetch(0)  # the group is made at the end of the log
        assert opened.error_code == E.NONE and opened.acquisition_lock_timeout_ms == 30000
        r.xadd(topic, {"value": "a"})
        r.xadd(topic, {"value": "b"})
        got = fetch(1, partitions=False)  # the session's partition, without naming it again
        (part,) = got.responses[0].partitions
        assert [(a.first_offset, a.last_offset, a.delivery_count) for a in part.acquired_records] == [(0, 1, 1)]
        assert part.records
        assert fetch(5).error_code == E.INVALID_SHARE_SESSION_EPOCH
        refused = fetch(2, acks=[(0, 2, 1)], max_records=0)  # offset 2 was never acquired
        assert refused.responses[0].partitions[0].acknowledge_error_code == E.INVALID_RECORD_STATE
        assert r.xpending(topic, group)["pending"] == 2  # nothing applied
        acked = raw.call(A(group_id=group, member_id="m1", share_session_epoch=3, topics=[A.AcknowledgeTopic(
            topic_id=topic_id, partitions=[A.AcknowledgePartition(partition_index=0, acknowledgement_batches=[
                A.AcknowledgementBatch(first_offset=0, last_offset=0, acknowledge_types=[1])])])]), 1)
        assert acked.responses[0].partitions[0].error_code == E.NONE
        assert r.xpending(topic, group)["pending"] == 1
        assert raw.call(A(group_id=group, member_id="m1", share_session_epoch=0), 1).error_code == \
            E.INVALID_SHARE_SESSION_EPOCH

        D = C.ShareGroupDescribeRequest
        described = raw.call(D(group_ids=[group, "nobody"]), 1).groups
        assert [(g.group_state, g.error_code) for g in described] == [("Stable", E.NONE), ("Dead", E.GROUP_ID_NOT_FOUND)]
        assert [(m.member_id, m.subscribed_topic_names) for m in described[0].members] == [("m1", [topic])]
        listed = raw.call(C.ListGroupsRequest(types_filter=["share"]), 5).groups
        assert [(g.group_id, g.group_type, g.protocol_type, g.group_state) for g in listed] == \
            [(group, "share", "share", "Stable")]

        closed = fetch(-1, partitions=False)  # closing the session releases offset 1
        assert closed.error_code == E.NONE
        (pending,) = r.xpending_range(topic, group, "-", "+", 10)
        assert (pending["consumer"], pending["times_delivered"]) == (b"", 1)
        left = raw.call(H(group_id=group, member_id="m1", member_epoch=-1), 1)
        assert (left.error_code, left.member_epoch) == (E.NONE, -1)
        assert r.xinfo_consumers(topic, group) == []  # the member left: its consumer is deleted
