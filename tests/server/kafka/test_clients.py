"""Real Kafka clients against the codec over loopback (the ``fake_kafka_broker`` fixture):
their requests decode, the record batches they produce decode with every codec, and they read
the responses and the record batch the codec writes."""

from __future__ import annotations

import asyncio
import shutil
import subprocess

import pytest

from server.kafka import records

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
VALUE = b"a compressible value " * 4  # so that every client does compress it


def produced_batches(broker) -> list[records.RecordBatch]:
    out = []
    for req in broker.produce_requests():
        for topic in req.body.topic_data:
            for part in topic.partition_data:
                out += records.read_batches(part.records)
    return out


def produced_records(broker) -> list[tuple]:
    return [(r.key, r.value, r.headers) for b in produced_batches(broker) for r in b.records]


def expected_records(n: int) -> list[tuple]:
    return [(b"k%d" % i, VALUE, [(b"trace", b"%d" % i)]) for i in range(n)]


@pytest.mark.parametrize("compression", CODECS)
def test_librdkafka_produce(fake_kafka_broker, compression):
    confluent_kafka = pytest.importorskip("confluent_kafka")
    idempotent = compression == "zstd"
    producer = confluent_kafka.Producer({
        "bootstrap.servers": fake_kafka_broker.bootstrap, "compression.type": compression,
        "enable.idempotence": idempotent, "linger.ms": 50})
    for i in range(16):
        producer.produce("orders", key=b"k%d" % i, value=VALUE, headers=[("trace", b"%d" % i)])
    assert producer.flush(20) == 0  # every record acknowledged by the codec's Produce response
    assert produced_records(fake_kafka_broker) == expected_records(16)
    batches = produced_batches(fake_kafka_broker)
    assert {b.compression for b in batches} == {CODECS.index(compression)}
    if idempotent:
        assert {(b.producer_id, b.producer_epoch) for b in batches} == {(4242, 3)}
        assert batches[0].base_sequence == 0
    versions = fake_kafka_broker.versions_used()
    assert versions[18] == {3} and max(versions[0]) >= 7, versions  # ApiVersions v3; Produce v7+
    assert fake_kafka_broker.violations == []


def test_librdkafka_consumes_the_batch_the_codec_writes(fake_kafka_broker):
    confluent_kafka = pytest.importorskip("confluent_kafka")
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": fake_kafka_broker.bootstrap, "group.id": "g", "enable.auto.commit": False,
        "fetch.wait.max.ms": 50})
    consumer.assign([confluent_kafka.TopicPartition("orders", 0, 0)])
    got = []
    try:
        for _ in range(100):
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            got.append((msg.offset(), msg.key(), msg.value(), msg.headers(), msg.timestamp()[1]))
            if len(got) == 3:
                break
    finally:
        consumer.close()
    assert got == [(i, b"key-%d" % i, b"value-%d" % i, [("h", b"%d" % i)], 1_700_000_000_000 + i)
                   for i in range(3)]
    assert max(fake_kafka_broker.versions_used()[1]) >= 13  # Fetch by topic id


def test_kafka_python_negotiates_produces_and_consumes(fake_kafka_broker):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    producer = KafkaProducer(bootstrap_servers=fake_kafka_broker.bootstrap, compression_type="lz4")
    for i in range(16):
        producer.send("orders", key=b"k%d" % i, value=VALUE, headers=[("trace", b"%d" % i)])
    producer.flush(20)
    producer.close(5)
    assert produced_records(fake_kafka_broker) == expected_records(16)
    # kafka-python opens with ApiVersions v4; the v0 UNSUPPORTED_VERSION answer brings it to v3
    assert fake_kafka_broker.answers >= 1 and fake_kafka_broker.versions_used()[18] == {3}

    consumer = KafkaConsumer(bootstrap_servers=fake_kafka_broker.bootstrap, enable_auto_commit=False,
                             consumer_timeout_ms=10_000)
    tp = TopicPartition("orders", 0)
    consumer.assign([tp])
    consumer.seek(tp, 0)
    got = []
    for msg in consumer:
        got.append((msg.offset, msg.key, msg.value, msg.headers))
        if len(got) == 3:
            break
    consumer.close()
    assert got == [(i, b"key-%d" % i, b"value-%d" % i, [("h", b"%d" % i)]) for i in range(3)]
    assert fake_kafka_broker.violations == []


def test_aiokafka_produces_and_consumes(fake_kafka_broker):
    aiokafka = pytest.importorskip("aiokafka")

    async def run():
        producer = aiokafka.AIOKafkaProducer(bootstrap_servers=fake_kafka_broker.bootstrap, compression_type="gzip")
        await producer.start()
        try:
            for i in range(3):
                await producer.send_and_wait("orders", VALUE, key=b"k%d" % i, headers=[("trace", b"%d" % i)])
        finally:
            await producer.stop()
        consumer = aiokafka.AIOKafkaConsumer(bootstrap_servers=fake_kafka_broker.bootstrap, enable_auto_commit=False)
        await consumer.start()
        try:
            tp = aiokafka.TopicPartition("orders", 0)
            consumer.assign([tp])
            consumer.seek(tp, 0)
            got = []
            while len(got) < 3:
                msg = await asyncio.wait_for(consumer.getone(), 10)
                got.append((msg.offset, msg.key, msg.value))
            return got
        finally:
            await consumer.stop()

    got = asyncio.run(run())
    assert produced_records(fake_kafka_broker) == expected_records(3)
    assert got == [(i, b"key-%d" % i, b"value-%d" % i) for i in range(3)]
    assert fake_kafka_broker.violations == []


def test_kcat_produces_and_consumes(fake_kafka_broker):
    if shutil.which("kcat") is None:
        pytest.skip("kcat is not installed (.ci/run installs it)")
    base = ["kcat", "-b", fake_kafka_broker.bootstrap, "-t", "orders"]
    done = subprocess.run(base + ["-P", "-K", ":", "-z", "gzip", "-H", "trace=1"],
                          input=b"k0:" + VALUE + b"\nk1:" + VALUE + b"\n", capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert [(k, v) for k, v, _ in produced_records(fake_kafka_broker)] == [(b"k0", VALUE), (b"k1", VALUE)]
    done = subprocess.run(base + ["-C", "-p", "0", "-o", "0", "-c", "3", "-f", "%o %k %s %h\n"],
                          capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == b"".join(b"%d key-%d value-%d h=%d\n" % (i, i, i, i) for i in range(3))
