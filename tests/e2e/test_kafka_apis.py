"""The Kafka APIs of a real ``partita``: topic administration through Kafka admin clients, Metadata
after TOPIC CREATE, keyed records in the partitions ``partition-key-field key`` picks, ListOffsets
by time, and what each API refuses, in Kafka's error codes (raw requests through the codec)."""

from __future__ import annotations

import dataclasses
import struct
import time
import uuid

import pytest

from server.kafka import codec
from server.kafka import errors as E
from server.kafka import records
from tests.conftest import KafkaRaw, wait_for

C = codec


def fresh_topic() -> str:
    return "t" + uuid.uuid4().hex[:10]


def batch_bytes(pairs, compression=records.COMPRESSION_NONE, **kw) -> bytes:
    batch = records.make_batch([(k, v, []) for k, v in pairs], base_offset=0,
                               timestamps_ms=[int(time.time() * 1000)] * len(pairs), compression=compression, **kw)
    return records.encode_batch(batch)


def produce(raw: KafkaRaw, topic: str, data: bytes, version: int = 9, acks: int = 1, partition: int = 0):
    P = C.ProduceRequest
    body = P(acks=acks, timeout_ms=5000, topic_data=[P.TopicProduceData(name=topic, partition_data=[
        P.PartitionProduceData(index=partition, records=data)])])
    return raw.call(body, version).responses[0].partition_responses[0]


def fetch(raw: KafkaRaw, topic: str, offset: int, version: int = 12, max_wait_ms: int = 0, **kw):
    F = C.FetchRequest
    kw.setdefault("session_epoch", -1)
    body = F(max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=1 << 20, topics=[F.FetchTopic(
        topic=topic, partitions=[F.FetchPartition(partition=0, fetch_offset=offset, partition_max_bytes=1 << 20)])],
        **kw)
    return raw.call(body, version)


def metadata(raw: KafkaRaw, topics, version: int = 12, auto: bool = False):
    M = C.MetadataRequest
    return raw.call(M(topics=None if topics is None else [M.MetadataRequestTopic(name=t) for t in topics],
                      allow_auto_topic_creation=auto), version)


# -- Metadata ----------------------------------------------------------------------------------

def test_metadata_after_topic_create(kafka_shared):
    topic = fresh_topic()
    assert kafka_shared.client().execute_command("TOPIC", "CREATE", topic, "PARTITIONS", "3") in (b"OK", "OK", True)
    with KafkaRaw(kafka_shared.kafka_port) as raw:
        resp = metadata(raw, [topic])
    assert [(b.node_id, b.host, b.port) for b in resp.brokers] == [(0, "127.0.0.1", kafka_shared.kafka_port)]
    assert resp.controller_id == 0 and resp.cluster_id
    (t,) = resp.topics
    assert (t.error_code, t.name, t.is_internal) == (E.NONE, topic, False)
    assert [(p.partition_index, p.leader_id, p.replica_nodes, p.isr_nodes) for p in t.partitions] == [
        (n, 0, [0], [0]) for n in range(3)]
    # every client sees it too
    confluent_kafka = pytest.importorskip("confluent_kafka")
    from confluent_kafka.admin import AdminClient

    listed = AdminClient({"bootstrap.servers": kafka_shared.bootstrap}).list_topics(timeout=10)
    assert sorted(listed.topics[topic].partitions) == [0, 1, 2]
    assert confluent_kafka  # (imported for the skip)


def test_metadata_auto_creates_unless_told_not_to(kafka_partita):
    server = kafka_partita(["--default-partitions", "2"])
    with KafkaRaw(server.kafka_port) as raw:
        resp = metadata(raw, ["made"], auto=True)
        assert resp.topics[0].error_code == E.NONE and len(resp.topics[0].partitions) == 2
        resp = metadata(raw, ["not-made"], auto=False)
        assert resp.topics[0].error_code == E.UNKNOWN_TOPIC_OR_PARTITION
        resp = metadata(raw, ["has#hash"], auto=True)
        assert resp.topics[0].error_code == E.INVALID_TOPIC_EXCEPTION
        server.client().config_set("auto-create-topics", "no")
        resp = metadata(raw, ["nor-this"], auto=True)
        assert resp.topics[0].error_code == E.UNKNOWN_TOPIC_OR_PARTITION
        assert sorted(t.name for t in metadata(raw, None).topics) == ["made"]
        # v0: an empty list means every topic
        assert [t.name for t in metadata(raw, [], version=0).topics] == ["made"]
    assert server.client().exists("made") and not server.client().exists("not-made")


# -- keys and partitions -----------------------------------------------------------------------

def test_keyed_records_land_where_partition_key_field_key_puts_them(kafka_shared):
    """Kafka's partitioner (murmur2, librdkafka's murmur2_random and kafka-python's default) and an
    XADD with a ``key`` field on a topic with ``partition-key-field key`` agree on every key."""
    confluent_kafka = pytest.importorskip("confluent_kafka")
    from kafka import KafkaProducer

    topic = fresh_topic()
    r = kafka_shared.client()
    r.execute_command("TOPIC", "CREATE", topic, "PARTITIONS", "4", "CONFIG", "partition-key-field", "key")
    keys = [b"user-%d" % i for i in range(40)]
    producer = confluent_kafka.Producer({"bootstrap.servers": kafka_shared.bootstrap, "partitioner": "murmur2_random"})
    for k in keys:
        producer.produce(topic, key=k, value=b"librdkafka")
    assert producer.flush(20) == 0
    python_producer = KafkaProducer(bootstrap_servers=kafka_shared.bootstrap, enable_idempotence=False)
    for k in keys:
        python_producer.send(topic, key=k, value=b"kafka-python")
    python_producer.flush(20)
    python_producer.close(5)
    for k in keys:
        r.execute_command("XADD", topic, "*", "key", k, "value", "xadd")
    where: dict[bytes, set] = {}
    for n in range(4):
        for _id, fields in r.xrange(f"{topic}#{n}"):
            where.setdefault(fields[b"key"], set()).add((n, fields[b"value"]))
    for k in keys:
        assert {p for p, _ in where[k]} == {next(iter(where[k]))[0]}, (k, where[k])  # one partition per key
        assert {v for _, v in where[k]} == {b"librdkafka", b"kafka-python", b"xadd"}
    assert len({next(iter(v))[0] for v in where.values()}) == 4  # the keys spread over every partition


# -- topic administration through a Kafka admin client -----------------------------------------------

@pytest.mark.filterwarnings("ignore:alter_configs has been deprecated")  # (the API served: AlterConfigs)
def test_admin_client_creates_alters_describes_and_deletes(kafka_shared):
    pytest.importorskip("confluent_kafka")
    from confluent_kafka.admin import AdminClient, ConfigResource, NewPartitions, NewTopic

    admin = AdminClient({"bootstrap.servers": kafka_shared.bootstrap})
    topic = fresh_topic()
    futures = admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1,
                                            config={"retention.ms": "60000", "max.message.bytes": "4096"})])
    futures[topic].result(10)
    r = kafka_shared.client()
    desc = r.execute_command("TOPIC", "DESCRIBE", topic)
    assert b"retention-ms" in str(desc).encode() or "retention-ms" in str(desc)
    # an existing topic, a bad config, a replication factor that cannot be
    for new, code in [(NewTopic(topic, 1, 1), "TOPIC_ALREADY_EXISTS"),
                      (NewTopic(fresh_topic(), 1, 1, config={"cleanup.policy": "compact"}), "INVALID_CONFIG"),
                      (NewTopic(fresh_topic(), 1, 3), "INVALID_REPLICATION_FACTOR")]:
        with pytest.raises(Exception) as failed:
            admin.create_topics([new])[new.topic].result(10)
        assert failed.value.args[0].name() == code, failed.value
    admin.create_partitions([NewPartitions(topic, 5)])[topic].result(10)
    assert len(admin.list_topics(topic, timeout=10).topics[topic].partitions) == 5
    with pytest.raises(Exception) as failed:
        admin.create_partitions([NewPartitions(topic, 3)])[topic].result(10)
    assert failed.value.args[0].name() == "INVALID_PARTITIONS"

    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    configs = admin.describe_configs([resource])[resource].result(10)
    assert configs["retention.ms"].value == "60000" and not configs["retention.ms"].is_default
    assert configs["max.message.bytes"].value == "4096"
    assert configs["segment.bytes"].is_default and configs["cleanup.policy"].value == "delete"
    assert configs["cleanup.policy"].is_read_only
    # AlterConfigs replaces the whole set: retention.ms goes back to the default
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, set_config={"segment.ms": "3600000"})
    admin.alter_configs([resource])[resource].result(10)
    configs = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic)])
    configs = next(iter(configs.values())).result(10)
    assert configs["segment.ms"].value == "3600000" and configs["retention.ms"].value == "-1"

    admin.delete_topics([topic])[topic].result(10)
    assert not r.exists(topic)
    with pytest.raises(Exception) as failed:
        admin.delete_topics([topic])[topic].result(10)
    assert failed.value.args[0].name() == "UNKNOWN_TOPIC_OR_PART"


def test_incremental_alter_configs_sets_and_deletes_single_configs(kafka_shared):
    """IncrementalAlterConfigs (what Kafka 4's kafka-configs.sh and librdkafka's
    incremental_alter_configs send): SET and DELETE change only the configs named, the others
    keep their overrides; APPEND / SUBTRACT only to a LIST config (cleanup.policy here), and the
    refusals of Kafka's ConfigAdminManager and controller, in its words."""
    pytest.importorskip("confluent_kafka")
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    topic = fresh_topic()
    r = kafka_shared.client()
    r.execute_command("TOPIC", "CREATE", topic, "CONFIG", "retention-ms", "60000", "segment-ms", "7200000")
    admin = AdminClient({"bootstrap.servers": kafka_shared.bootstrap})

    def incremental(*ops):
        resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
            ConfigEntry(name, value, incremental_operation=op) for name, value, op in ops])
        return admin.incremental_alter_configs([resource])[resource].result(10)

    def configs():
        resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
        found = admin.describe_configs([resource])[resource].result(10)
        return {name: (found[name].value, found[name].is_default) for name in ("retention.ms", "segment.ms",
                                                                               "max.message.bytes")}

    incremental(("max.message.bytes", "4096", AlterConfigOpType.SET), ("segment.ms", None, AlterConfigOpType.DELETE),
                ("cleanup.policy", "delete", AlterConfigOpType.APPEND))
    assert configs() == {"retention.ms": ("60000", False), "segment.ms": ("604800000", True),
                         "max.message.bytes": ("4096", False)}
    for op in (AlterConfigOpType.APPEND, AlterConfigOpType.SUBTRACT):
        with pytest.raises(Exception) as failed:
            incremental(("retention.ms", "1", op))
        assert (failed.value.args[0].name(), failed.value.args[0].str()) == (
            "INVALID_CONFIG", f"Can't {op.name} to key retention.ms because its type is not LIST.")
    with pytest.raises(Exception) as failed:
        incremental(("cleanup.policy", "compact", AlterConfigOpType.APPEND))
    assert failed.value.args[0].name() == "INVALID_CONFIG"

    I = C.IncrementalAlterConfigsRequest
    with KafkaRaw(kafka_shared.kafka_port) as raw:
        def alter(*resources, version=1):
            body = I(resources=[I.AlterConfigsResource(resource_type=2, resource_name=name, configs=[
                I.AlterableConfig(name=k, config_operation=op, value=v) for k, op, v in ops])
                for name, ops in resources], validate_only=False)
            return [(x.resource_name, x.error_code, x.error_message) for x in raw.call(body, version).responses]

        assert alter((topic, [("retention.ms", 0, None)])) == [
            (topic, E.INVALID_REQUEST, "Null value not supported for : retention.ms")]
        assert alter((topic, [("retention.ms", 0, "1"), ("retention.ms", 1, None)])) == [
            (topic, E.INVALID_REQUEST, "Error due to duplicate config keys")]
        assert alter((topic, [("retention.ms", 0, "1")]), (topic, []), version=0) == [
            (topic, E.INVALID_REQUEST, "Each resource must appear at most once.")] * 2
        assert alter(("", [("retention.ms", 0, "1")])) == [
            ("", E.INVALID_REQUEST, "Default topic resources are not allowed.")]
        missing = fresh_topic()
        assert alter((missing, [("retention.ms", 0, "1")])) == [(missing, E.UNKNOWN_TOPIC_OR_PARTITION,
                                                                 f"unknown topic '{missing}'")]
    assert configs()["retention.ms"] == ("60000", False)  # nothing refused changed anything


def test_a_topic_has_at_most_1024_partitions(kafka_shared):
    """Partita's limit (docs/topics.md): CreateTopics and CreatePartitions past it are
    INVALID_PARTITIONS with the limit in the message, and nothing is created or grown."""
    CT, CP = C.CreateTopicsRequest, C.CreatePartitionsRequest
    at_limit, past, grown = fresh_topic(), fresh_topic(), fresh_topic()
    kafka_shared.client().execute_command("TOPIC", "CREATE", grown, "PARTITIONS", "2")
    refusal = (E.INVALID_PARTITIONS, "invalid partition count 1025: must be between 1 and 1024")
    with KafkaRaw(kafka_shared.kafka_port) as raw:
        made = raw.call(CT(topics=[CT.CreatableTopic(name=n, num_partitions=c, replication_factor=-1)
                                   for n, c in ((at_limit, 1024), (past, 1025))], timeout_ms=5000), 7).topics
        assert [(t.name, t.error_code, t.error_message) for t in made] == [(at_limit, E.NONE, None), (past, *refusal)]
        (res,) = raw.call(CP(topics=[CP.CreatePartitionsTopic(name=grown, count=1025, assignments=None)],
                             timeout_ms=5000), 3).results
        assert (res.error_code, res.error_message) == refusal
        found = {t.name: (t.error_code, len(t.partitions)) for t in metadata(raw, [at_limit, past, grown]).topics}
    assert found == {at_limit: (E.NONE, 1024), past: (E.UNKNOWN_TOPIC_OR_PARTITION, 0), grown: (E.NONE, 2)}


def test_counts_kafka_refuses_are_refused_in_its_words(kafka_shared):
    """Kafka's ``ReplicationControlManager``: a replication factor or partition count of 0 or below
    -1 in CreateTopics, and a CreatePartitions count that is not an increase, are refused with its
    messages (INVALID_REPLICATION_FACTOR, INVALID_PARTITIONS) and change nothing."""
    CT, CP = C.CreateTopicsRequest, C.CreatePartitionsRequest
    grown = fresh_topic()
    kafka_shared.client().execute_command("TOPIC", "CREATE", grown, "PARTITIONS", "3")
    with KafkaRaw(kafka_shared.kafka_port) as raw:
        def create(partitions, factor):
            name = fresh_topic()
            (res,) = raw.call(CT(topics=[CT.CreatableTopic(name=name, num_partitions=partitions,
                                                           replication_factor=factor)], timeout_ms=5000), 7).topics
            assert metadata(raw, [name]).topics[0].error_code == E.UNKNOWN_TOPIC_OR_PARTITION
            return res.error_code, res.error_message

        def grow(count):
            (res,) = raw.call(CP(topics=[CP.CreatePartitionsTopic(name=grown, count=count, assignments=None)],
                                 timeout_ms=5000), 3).results
            return res.error_code, res.error_message

        bad_factor = (E.INVALID_REPLICATION_FACTOR,
                      "Replication factor must be larger than 0, or -1 to use the default value.")
        bad_count = (E.INVALID_PARTITIONS, "Number of partitions was set to an invalid non-positive value.")
        assert create(1, 0) == create(1, -2) == create(0, 0) == bad_factor
        assert create(0, -1) == create(-2, 1) == bad_count
        assert grow(3) == (E.INVALID_PARTITIONS, "Topic already has 3 partition(s).")
        for fewer in (2, 0):
            assert grow(fewer) == (E.INVALID_PARTITIONS,
                                   f"The topic {grown} currently has 3 partition(s); {fewer} would not be an increase.")
        assert len(metadata(raw, [grown]).topics[0].partitions) == 3


def test_topic_names_kafka_refuses_are_refused_as_kafka_does(kafka_shared):
    """Kafka's ``Topic.validate``: at most 249 characters of ASCII letters, digits, '.', '_' and '-',
    and not '.' or '..' (CreateTopics and a Metadata naming a missing topic, auto-create or not)."""
    pytest.importorskip("confluent_kafka")
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": kafka_shared.bootstrap})
    for name in [".", "..", "a" * 250, "has space", "has/slash", "caf\u00e9"]:
        with pytest.raises(Exception) as failed:
            admin.create_topics([NewTopic(name, 1, 1)])[name].result(10)
        assert failed.value.args[0].name() == "TOPIC_EXCEPTION", (name, failed.value)
        with KafkaRaw(kafka_shared.kafka_port) as raw:
            for auto in (True, False):
                assert metadata(raw, [name], auto=auto).topics[0].error_code == E.INVALID_TOPIC_EXCEPTION, name
    legal = "Ok.name_-" + "9" * 240
    admin.create_topics([NewTopic(legal, 1, 1)])[legal].result(10)
    # a topic made through Redis under a name Kafka could not make is still found
    kafka_shared.client().execute_command("TOPIC", "CREATE", "made by redis")
    with KafkaRaw(kafka_shared.kafka_port) as raw:
        (found,) = metadata(raw, ["made by redis"]).topics
        assert (found.error_code, len(found.partitions)) == (E.NONE, 1)


def test_a_topic_colliding_with_another_in_metric_names_is_refused(kafka_shared):
    """Kafka's ``ReplicationControlManager``: '.' and '_' are one character in metric names, so a new
    topic that differs from an existing one only there is INVALID_TOPIC_EXCEPTION (CreateTopics and
    an auto-creating Metadata); the existing topic itself is still TOPIC_ALREADY_EXISTS."""
    pytest.importorskip("confluent_kafka")
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": kafka_shared.bootstrap})
    base = fresh_topic()
    dotted, underscored = base + ".a_b", base + "_a.b"
    admin.create_topics([NewTopic(dotted, 1, 1)])[dotted].result(10)
    for name, code in [(underscored, "TOPIC_EXCEPTION"), (dotted, "TOPIC_ALREADY_EXISTS")]:
        with pytest.raises(Exception) as failed:
            admin.create_topics([NewTopic(name, 1, 1)])[name].result(10)
        assert failed.value.args[0].name() == code, failed.value
    with KafkaRaw(kafka_shared.kafka_port) as raw:
        made = raw.call(C.CreateTopicsRequest(topics=[C.CreateTopicsRequest.CreatableTopic(
            name=underscored, num_partitions=1, replication_factor=-1)], timeout_ms=5000), 7).topics[0]
        assert (made.error_code, made.error_message) == (
            E.INVALID_TOPIC_EXCEPTION, f"Topic '{underscored}' collides with existing topic: {dotted}")
        assert metadata(raw, [underscored], auto=True).topics[0].error_code == E.INVALID_TOPIC_EXCEPTION
        assert metadata(raw, [underscored], auto=False).topics[0].error_code == E.UNKNOWN_TOPIC_OR_PARTITION
    assert not kafka_shared.client().exists(underscored)


def test_a_topic_named_twice_in_one_admin_request_is_refused_and_left_alone(kafka_shared):
    """Kafka's controller (``ControllerApis``) answers a topic named twice in CreateTopics,
    CreatePartitions or DeleteTopics once, INVALID_REQUEST "Duplicate topic name.", and acts on
    none of its occurrences; the other topics of the request are handled."""
    r = kafka_shared.client()
    twice, other, grown = fresh_topic(), fresh_topic(), fresh_topic()
    CT, CP, DT = C.CreateTopicsRequest, C.CreatePartitionsRequest, C.DeleteTopicsRequest
    with KafkaRaw(kafka_shared.kafka_port) as raw:
        made = raw.call(CT(topics=[CT.CreatableTopic(name=n, num_partitions=1, replication_factor=-1)
                                   for n in (twice, other, twice)], timeout_ms=5000), 7).topics
        assert sorted((t.name, t.error_code, t.error_message) for t in made) == sorted([
            (twice, E.INVALID_REQUEST, "Duplicate topic name."), (other, E.NONE, None)])
        assert not r.exists(twice) and r.exists(other)

        r.execute_command("TOPIC", "CREATE", grown)
        res = raw.call(CP(topics=[CP.CreatePartitionsTopic(name=n, count=c, assignments=None) for n, c in
                                  ((grown, 2), (other, 3), (grown, 4))], timeout_ms=5000), 3).results
        assert sorted((t.name, t.error_code, t.error_message) for t in res) == sorted([
            (grown, E.INVALID_REQUEST, "Duplicate topic name."), (other, E.NONE, None)])
        assert [len(t.partitions) for t in metadata(raw, [grown, other]).topics] == [1, 3]

        gone = raw.call(DT(topic_names=[grown, other, grown], timeout_ms=5000), 5).responses
        assert sorted((t.name, t.error_code, t.error_message) for t in gone) == sorted([
            (grown, E.INVALID_REQUEST, "Duplicate topic name."), (other, E.NONE, None)])
        assert r.exists(grown) and not r.exists(other)


def test_malformed_config_requests_are_refused_as_kafka_refuses_them(kafka_shared):
    """Kafka's ``ConfigAdminManager.preprocess`` refuses a legacy AlterConfigs resource named twice
    (each occurrence), a config key named twice and a null value with INVALID_REQUEST, changing
    nothing; CreateTopics refuses a null config value INVALID_CONFIG (``ReplicationControlManager``)."""
    r = kafka_shared.client()
    topic, other = fresh_topic(), fresh_topic()
    r.execute_command("TOPIC", "CREATE", topic, "CONFIG", "retention-ms", "60000")
    r.execute_command("TOPIC", "CREATE", other)
    A, CT = C.AlterConfigsRequest, C.CreateTopicsRequest

    def alter(raw, *resources):
        body = A(resources=[A.AlterConfigsResource(resource_type=2, resource_name=name, configs=[
            A.AlterableConfig(name=k, value=v) for k, v in configs]) for name, configs in resources],
            validate_only=False)
        return [(x.resource_name, x.error_code, x.error_message) for x in raw.call(body, 2).responses]

    with KafkaRaw(kafka_shared.kafka_port) as raw:
        assert alter(raw, (topic, [("segment.ms", "3600000"), ("segment.ms", "7200000")])) == [
            (topic, E.INVALID_REQUEST, "Error due to duplicate config keys")]
        assert alter(raw, (topic, [("retention.ms", None), ("segment.ms", None)])) == [
            (topic, E.INVALID_REQUEST, "Null value not supported for : retention.ms, segment.ms")]
        twice = "Each resource must appear at most once."
        assert alter(raw, (topic, [("segment.ms", "1")]), (other, []), (topic, [])) == [
            (topic, E.INVALID_REQUEST, twice), (other, E.NONE, None), (topic, E.INVALID_REQUEST, twice)]
        made = raw.call(CT(topics=[CT.CreatableTopic(name=fresh_topic(), num_partitions=1, replication_factor=-1,
                                                     configs=[CT.CreatableTopicConfig(name="retention.ms", value=None)])],
                           timeout_ms=5000), 7).topics[0]
        assert (made.error_code, made.error_message) == (
            E.INVALID_CONFIG, "Null value not supported for topic configs: retention.ms")
        # CreateTopics takes a config key named twice, the last value winning (ReplicationControlManager's map),
        # and values with blanks around them (ConfigDef trims them)
        twice_named = fresh_topic()
        made = raw.call(CT(topics=[CT.CreatableTopic(name=twice_named, num_partitions=1, replication_factor=-1,
                                                     configs=[CT.CreatableTopicConfig(name="retention.ms", value=v)
                                                              for v in ("1000", " 2000 ")])],
                           timeout_ms=5000), 7).topics[0]
        assert made.error_code == E.NONE
        assert b"2000" in str(r.execute_command("TOPIC", "DESCRIBE", twice_named)).encode()
    # nothing changed: the retention set at creation is still there
    assert b"60000" in str(r.execute_command("TOPIC", "DESCRIBE", topic)).encode()


def test_config_requests_for_topic_names_kafka_refuses_are_answered_as_kafka_does(kafka_shared):
    """A Kafka 4 broker runs ``Topic.validate`` on a TOPIC resource's name before looking the topic
    up: DescribeConfigs (``ConfigHelper``) and AlterConfigs (``ControllerConfigurationValidator``,
    which answers the empty name, the "default topic", INVALID_REQUEST first) refuse such a name
    INVALID_TOPIC_EXCEPTION with ``Topic.validate``'s message, as CreateTopics does; a topic made
    through Redis under such a name is still described."""
    invalid = "Topic name is invalid: "
    refusals = {
        "": invalid + "the empty string is not allowed",
        ".": invalid + "'.' is not allowed",
        "..": invalid + "'..' is not allowed",
        "has space": invalid + "'has space' contains one or more characters other than ASCII alphanumerics, "
                               "'.', '_' and '-'",
        "a" * 250: invalid + f"the length of '{'a' * 250}' is longer than the max allowed length 249",
    }
    D, A, CT = C.DescribeConfigsRequest, C.AlterConfigsRequest, C.CreateTopicsRequest
    redis_made = "made by redis " + fresh_topic()
    kafka_shared.client().execute_command("TOPIC", "CREATE", redis_made)
    with KafkaRaw(kafka_shared.kafka_port) as raw:
        def describe(name):
            (res,) = raw.call(D(resources=[D.DescribeConfigsResource(resource_type=2, resource_name=name,
                                                                     configuration_keys=["retention.ms"])]), 4).results
            return res.error_code, res.error_message

        def alter(name):
            (res,) = raw.call(A(resources=[A.AlterConfigsResource(resource_type=2, resource_name=name, configs=[
                A.AlterableConfig(name="retention.ms", value="60000")])], validate_only=True), 2).responses
            return res.error_code, res.error_message

        def create(name):
            (res,) = raw.call(CT(topics=[CT.CreatableTopic(name=name, num_partitions=1, replication_factor=-1)],
                                 timeout_ms=5000), 7).topics
            return res.error_code, res.error_message

        for name, message in refusals.items():
            assert describe(name) == (E.INVALID_TOPIC_EXCEPTION, message), name
            assert create(name) == (E.INVALID_TOPIC_EXCEPTION, message), name
            expected = (E.INVALID_REQUEST, "Default topic resources are not allowed.") if name == "" else (
                E.INVALID_TOPIC_EXCEPTION, message)
            assert alter(name) == expected, name
        assert describe(fresh_topic())[0] == E.UNKNOWN_TOPIC_OR_PARTITION
        assert describe(redis_made) == (E.NONE, None)
        assert alter(redis_made) == (E.NONE, None)


def test_describe_cluster_and_broker_configs(kafka_shared):
    with KafkaRaw(kafka_shared.kafka_port) as raw:
        resp = raw.call(C.DescribeClusterRequest(), 1)
        assert resp.error_code == E.NONE
        assert [(b.broker_id, b.port) for b in resp.brokers] == [(0, kafka_shared.kafka_port)]
        assert raw.call(C.DescribeClusterRequest(endpoint_type=2), 1).error_code == E.UNSUPPORTED_ENDPOINT_TYPE
        D = C.DescribeConfigsRequest
        resp = raw.call(D(resources=[D.DescribeConfigsResource(resource_type=4, resource_name="0",
                                                               configuration_keys=None)]), 4)
        found = {c.name: c.value for c in resp.results[0].configs}
        assert found["num.partitions"] == "1" and found["auto.create.topics.enable"] == "yes"
        # another broker's id, or no id at all: Kafka's ConfigHelper refuses it INVALID_REQUEST
        resp = raw.call(D(resources=[D.DescribeConfigsResource(resource_type=4, resource_name=name,
                                                               configuration_keys=None) for name in ("7", "b0")]), 4)
        assert [(r.error_code, r.error_message) for r in resp.results] == [
            (E.INVALID_REQUEST, "Unexpected broker id, expected 0 or empty string, but received 7"),
            (E.INVALID_REQUEST, "Broker id must be an integer, but it is: b0")]


# -- ListOffsets --------------------------------------------------------------------------------

def test_list_offsets_by_time_is_the_id_index(kafka_shared):
    topic = fresh_topic()
    r = kafka_shared.client()
    ids = [r.execute_command("XADD", topic, f"{ms}-0", "value", "x") for ms in (1000, 2000, 2000 + 1, 5000)]
    assert ids[0] in (b"1000-0", "1000-0")
    L = C.ListOffsetsRequest
    with KafkaRaw(kafka_shared.kafka_port) as raw:
        def offset_at(ts, version=7):
            body = L(replica_id=-1, topics=[L.ListOffsetsTopic(name=topic, partitions=[
                L.ListOffsetsPartition(partition_index=0, timestamp=ts)])])
            p = raw.call(body, version).topics[0].partitions[0]
            return p.error_code, p.offset, p.timestamp

        assert offset_at(-2) == (E.NONE, 0, -1)
        assert offset_at(-1) == (E.NONE, 4, -1)
        assert offset_at(-3) == (E.NONE, 3, 5000)
        assert offset_at(0) == (E.NONE, 0, 1000)
        assert offset_at(1500) == (E.NONE, 1, 2000)
        assert offset_at(2001) == (E.NONE, 2, 2001)
        assert offset_at(9999) == (E.NONE, -1, -1)
    pytest.importorskip("confluent_kafka")
    import confluent_kafka

    consumer = confluent_kafka.Consumer({"bootstrap.servers": kafka_shared.bootstrap, "group.id": "g",
                                         "enable.auto.commit": False})
    (found,) = consumer.offsets_for_times([confluent_kafka.TopicPartition(topic, 0, 1999)], timeout=10)
    assert found.offset == 1
    assert consumer.get_watermark_offsets(confluent_kafka.TopicPartition(topic, 0), timeout=10) == (0, 4)
    consumer.close()


# -- what each API refuses ------------------------------------------------------------------------

def test_list_offsets_refuses_a_partition_asked_for_twice(kafka_shared):
    """Kafka's ``ListOffsetsRequest.duplicatePartitions``: each request for a partition named twice
    (in one topic entry or two) is INVALID_REQUEST, the others are answered."""
    topic = fresh_topic()
    kafka_shared.client().execute_command("TOPIC", "CREATE", topic, "PARTITIONS", "2")
    L = C.ListOffsetsRequest

    def entry(*partitions):
        return L.ListOffsetsTopic(name=topic, partitions=[
            L.ListOffsetsPartition(partition_index=n, timestamp=-1) for n in partitions])

    with KafkaRaw(kafka_shared.kafka_port) as raw:
        for topics in ([entry(0, 1, 0)], [entry(0), entry(1, 0)]):
            resp = raw.call(L(replica_id=-1, topics=topics), 7)
            assert sorted((p.partition_index, p.error_code, p.offset) for t in resp.topics for p in t.partitions) == [
                (0, E.INVALID_REQUEST, -1), (0, E.INVALID_REQUEST, -1), (1, E.NONE, 0)]


def test_produce_refusals_are_kafka_error_codes(kafka_partita):
    server = kafka_partita(["--max-entry-bytes", "100"])
    r = server.client()
    r.execute_command("TOPIC", "CREATE", "t")
    with KafkaRaw(server.kafka_port) as raw:
        good = batch_bytes([(b"k", b"v")])
        assert produce(raw, "t", good).error_code == E.NONE
        assert produce(raw, "nope", good).error_code == E.UNKNOWN_TOPIC_OR_PARTITION
        assert produce(raw, "t", good, partition=3).error_code == E.UNKNOWN_TOPIC_OR_PARTITION
        bad_crc = bytearray(good)
        bad_crc[-1] ^= 1
        assert produce(raw, "t", bytes(bad_crc)).error_code == E.CORRUPT_MESSAGE
        magic1 = bytearray(good)
        magic1[16] = 1
        assert produce(raw, "t", bytes(magic1)).error_code == E.INVALID_RECORD
        big = produce(raw, "t", batch_bytes([(b"k", b"v" * 200)]))
        assert big.error_code == E.MESSAGE_TOO_LARGE and "max-entry-bytes" in big.error_message
        zstd = batch_bytes([(b"k", b"v")], compression=records.COMPRESSION_ZSTD)
        assert produce(raw, "t", zstd, version=6).error_code == E.UNSUPPORTED_COMPRESSION_TYPE
        assert produce(raw, "t", zstd, version=7).error_code == E.NONE
        tx = records.make_batch([(b"k", b"v", [])], base_offset=0, timestamps_ms=[int(time.time() * 1000)],
                                producer_id=7, producer_epoch=0, base_sequence=0)
        tx = dataclasses.replace(tx, attributes=tx.attributes | records.ATTR_TRANSACTIONAL)
        assert produce(raw, "t", records.encode_batch(tx)).error_code == E.INVALID_TXN_STATE
        assert produce(raw, "t", b"").error_code == E.INVALID_RECORD
        assert produce(raw, "t", good, acks=2).error_code == E.INVALID_REQUIRED_ACKS
        # the connection is still good, and only the good batches were written
        assert produce(raw, "t", good).base_offset == 2
    assert r.xlen("t") == 3


def test_produce_acks_0_sends_nothing_and_closes_when_refused(kafka_shared):
    topic = fresh_topic()
    kafka_shared.client().execute_command("TOPIC", "CREATE", topic)
    P = C.ProduceRequest
    with KafkaRaw(kafka_shared.kafka_port) as raw:
        body = P(acks=0, timeout_ms=1000, topic_data=[P.TopicProduceData(name=topic, partition_data=[
            P.PartitionProduceData(index=0, records=batch_bytes([(b"k", b"v")]))])])
        from server.kafka import framing

        raw.send(framing.encode_request(0, 9, 1, "t", body))
        # no response: the next request's response comes first
        assert raw.call(C.ApiVersionsRequest(), 3).error_code == E.NONE
        body.topic_data[0].name = "missing-" + topic
        raw.send(framing.encode_request(0, 9, 2, "t", body))
        assert raw.read_frame() is None  # refused with acks=0: closed, as Kafka does
    assert kafka_shared.client().xlen(topic) == 1


def test_fetch_refusals_and_sessions(kafka_shared):
    topic = fresh_topic()
    kafka_shared.client().execute_command("XADD", topic, "*", "value", "x")
    with KafkaRaw(kafka_shared.kafka_port) as raw:
        p = fetch(raw, topic, 0).responses[0].partitions[0]
        assert (p.error_code, p.high_watermark, p.log_start_offset) == (E.NONE, 1, 0)
        assert [r.value for b in records.read_batches(p.records) for r in b.records] == [b"x"]
        assert fetch(raw, topic, 1).responses[0].partitions[0].records == b""  # at the end: nothing, no error
        assert fetch(raw, topic, 5).responses[0].partitions[0].error_code == E.OFFSET_OUT_OF_RANGE
        assert fetch(raw, "missing", 0).responses[0].partitions[0].error_code == E.UNKNOWN_TOPIC_OR_PARTITION
        assert fetch(raw, topic, 0, session_id=77).error_code == E.FETCH_SESSION_ID_NOT_FOUND
        assert fetch(raw, topic, 0, session_epoch=3).error_code == E.INVALID_FETCH_SESSION_EPOCH
        new = fetch(raw, topic, 0, session_epoch=0)  # asks for a session: none is made
        assert (new.error_code, new.session_id) == (E.NONE, 0)
        # by topic ID (v13+)
        tid = metadata(raw, [topic]).topics[0].topic_id
        F = C.FetchRequest
        body = F(max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, session_epoch=-1, topics=[F.FetchTopic(
            topic_id=tid, partitions=[F.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20)])])
        assert raw.call(body, 16).responses[0].partitions[0].high_watermark == 1
        body.topics[0].topic_id = uuid.uuid4()
        assert raw.call(body, 16).responses[0].partitions[0].error_code == E.UNKNOWN_TOPIC_ID


def test_fetch_long_poll_waits_then_answers_empty(kafka_shared):
    topic = fresh_topic()
    kafka_shared.client().execute_command("XADD", topic, "*", "value", "x")
    with KafkaRaw(kafka_shared.kafka_port) as raw:
        started = time.monotonic()
        p = fetch(raw, topic, 1, max_wait_ms=300).responses[0].partitions[0]
        assert time.monotonic() - started >= 0.25 and p.records == b"" and p.error_code == E.NONE


# -- bad input ----------------------------------------------------------------------------------

def _closed_with(server, payload: bytes, reason: str) -> None:
    with KafkaRaw(server.kafka_port) as raw:
        raw.send(payload)
        assert raw.read_frame() is None
    assert wait_for(lambda: reason in server.log(), 5), server.log()[-2000:]
    assert server.client().ping()  # the server goes on


def test_bad_input_closes_the_connection_with_kafkas_reason(kafka_shared):
    from server.kafka import framing

    _closed_with(kafka_shared, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "Invalid receive (size = 1195725856 larger than")
    _closed_with(kafka_shared, (2**31 - 1).to_bytes(4, "big") + b"x" * 100, "size = 2147483647 larger than")
    _closed_with(kafka_shared, (-5).to_bytes(4, "big", signed=True), "Invalid receive (size = -5)")
    unknown = framing.encode_request(18, 3, 1, "t", C.ApiVersionsRequest())
    unknown = unknown[:4] + (999).to_bytes(2, "big") + unknown[6:]
    _closed_with(kafka_shared, unknown, "api key 999 with version 3 which is not enabled")
    heartbeat = unknown[:4] + (68).to_bytes(2, "big") + unknown[6:]  # ConsumerGroupHeartbeat: v0-1 only
    _closed_with(kafka_shared, heartbeat, "api key 68 with version 3 which is not enabled")
    garbage_body = framing.encode_request(3, 12, 1, "t", C.MetadataRequest(topics=None))[:-1] + b"\xff\xff\xff"
    _closed_with(kafka_shared, garbage_body[:0] + len(garbage_body[4:]).to_bytes(4, "big") + garbage_body[4:],
                 "Error getting request for apiKey: 3")
    # ApiVersions at an unknown version is answered (v0, UNSUPPORTED_VERSION), and the connection stays
    with KafkaRaw(kafka_shared.kafka_port) as raw:
        header = struct.pack(">hhih", 18, 9, 5, 1) + b"t" + b"\x00"  # v9: a version it does not know
        raw.send(struct.pack(">i", len(header) + 3) + header + b"\x01\x01\x00")
        correlation, resp = framing.decode_response(18, 0, raw.read_frame())
        assert (correlation, resp.error_code) == (5, E.UNSUPPORTED_VERSION)
        assert raw.call(C.ApiVersionsRequest(), 3).error_code == E.NONE


def test_api_versions_advertise_exactly_what_is_served(kafka_shared):
    with KafkaRaw(kafka_shared.kafka_port) as raw:
        resp = raw.call(C.ApiVersionsRequest(client_software_name="t", client_software_version="1"), 3)
    assert {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys} == {
        0: (3, 13), 1: (4, 18), 2: (1, 11), 3: (0, 13), 8: (2, 10), 9: (1, 10), 10: (0, 6), 11: (0, 9),
        12: (0, 4), 13: (0, 5), 14: (0, 5), 15: (0, 6), 16: (0, 5), 17: (0, 1), 18: (0, 3), 19: (2, 7), 20: (1, 6),
        22: (0, 6), 32: (1, 4), 33: (0, 2), 36: (0, 2), 37: (0, 3), 42: (0, 2), 44: (0, 1), 47: (0, 0), 60: (0, 2),
        68: (0, 1), 69: (0, 1), 76: (1, 1), 77: (1, 1), 78: (1, 1), 79: (1, 1)}


def test_maxclients_counts_kafka_clients(kafka_partita):
    server = kafka_partita(["--maxclients", "1"])
    with KafkaRaw(server.kafka_port) as first:
        assert first.call(C.ApiVersionsRequest(), 3).error_code == E.NONE
        with KafkaRaw(server.kafka_port) as second:
            second.send(b"\x00")
            assert second.read_frame() is None  # closed without a word
        assert first.call(C.ApiVersionsRequest(), 3).error_code == E.NONE


def _peak_rss_bytes(server) -> int:
    with open(f"/proc/{server.proc.pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_a_client_that_does_not_read_its_responses_costs_bounded_memory(kafka_partita):
    """Pipelined fetches of 1 MiB each, never read: the server stops reading once 16 MiB of
    responses wait (QUEUE_MAX_BYTES), and the client's sends block; memory stays bounded."""
    import select
    import socket

    from server.kafka import framing

    server = kafka_partita()
    r = server.client()
    for _ in range(300):
        r.execute_command("XADD", "big", "*", "value", "x" * 4096)
    base = _peak_rss_bytes(server)
    F = C.FetchRequest
    body = F(max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, session_epoch=-1, topics=[F.FetchTopic(
        topic="big", partitions=[F.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20)])])
    request = framing.encode_request(1, 12, 1, "t", body)
    sock = socket.create_connection(("127.0.0.1", server.kafka_port))
    sock.setblocking(False)
    pending = request * 1000
    sent_requests = 0
    while True:  # until the server stops reading: our sends block
        if not select.select([], [sock], [], 3)[1]:
            break
        try:
            n = sock.send(pending)
        except BlockingIOError:
            continue
        sent_requests += n // len(request)
        pending = pending[n % len(request):] + request * (n // len(request))
        assert sent_requests < 100_000, "the server never stopped reading"
    assert _peak_rss_bytes(server) - base < 100 * 1024 * 1024, (sent_requests, _peak_rss_bytes(server) - base)
    sock.close()
    assert r.ping()
