"""Real Kafka clients against a real ``partita`` with its Kafka port on: each produces and Redis
clients read (XRANGE, XREADGROUP); Redis clients write (XADD) and each Kafka client reads; the
compression codecs; the mapping both ways (docs/kafka.md, "The mapping")."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import uuid

import pytest

from tests.conftest import RawConn, free_port, read_until_closed

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
VALUE = b"a compressible value " * 8


def fresh_topic() -> str:
    return "t" + uuid.uuid4().hex[:10]


def call(server, *args):
    """One command's reply as hiredis parses it (redis-py would make dicts of entries: a
    second field of the same name would vanish)."""
    import hiredis

    payload = b"*%d\r\n" % len(args) + b"".join(
        b"$%d\r\n%s\r\n" % (len(a), a) for a in (x if isinstance(x, bytes) else str(x).encode() for x in args))
    with RawConn(server.port) as conn:
        raw = conn.request(payload)
    reader = hiredis.Reader()
    reader.feed(raw)
    return reader.gets()


def entries(server, topic: str) -> list[tuple[bytes, list[bytes]]]:
    """XRANGE - + as (id, [field, value, ...])."""
    return [(entry_id, fields) for entry_id, fields in call(server, "XRANGE", topic, "-", "+")]


def kafka_fields(i: int) -> list[bytes]:
    return [b"key", b"k%d" % i, b"value", VALUE, b"trace", b"%d" % i]


# -- produce with each client, read with Redis -----------------------------------------------


@pytest.mark.parametrize("compression", CODECS)
def test_librdkafka_produces_with_every_codec_and_redis_reads(kafka_shared, compression):
    confluent_kafka = pytest.importorskip("confluent_kafka")
    topic = fresh_topic()
    producer = confluent_kafka.Producer({"bootstrap.servers": kafka_shared.bootstrap,
                                         "compression.type": compression, "linger.ms": 20})
    delivered = []
    for i in range(50):
        producer.produce(topic, key=b"k%d" % i, value=VALUE, headers=[("trace", b"%d" % i)],
                         on_delivery=lambda err, msg: delivered.append((err, msg.offset())))
    assert producer.flush(30) == 0
    assert sorted(delivered) == [(None, i) for i in range(50)]
    found = entries(kafka_shared, topic)
    assert [fields for _, fields in found] == [kafka_fields(i) for i in range(50)]
    # LogAppendTime: each entry ID's ms is the append time, the records all went in one append
    assert len({entry_id.split(b"-")[0] for entry_id, _ in found}) <= 2


def test_kafka_python_produces_and_xreadgroup_reads(kafka_shared):
    from kafka import KafkaProducer

    topic = fresh_topic()
    producer = KafkaProducer(bootstrap_servers=kafka_shared.bootstrap, compression_type="lz4")  # idempotent
    futures = [producer.send(topic, key=b"k%d" % i, value=VALUE, headers=[("trace", b"%d" % i)]) for i in range(20)]
    producer.flush(20)
    assert [f.get(10).offset for f in futures] == list(range(20))
    producer.close(5)
    assert call(kafka_shared, "XGROUP", "CREATE", topic, "g", "0") == b"OK"
    reply = call(kafka_shared, "XREADGROUP", "GROUP", "g", "c", "COUNT", "100", "STREAMS", topic, ">")
    assert [fields for _, fields in reply[0][1]] == [kafka_fields(i) for i in range(20)]


def test_aiokafka_produces_and_redis_reads(kafka_shared):
    aiokafka = pytest.importorskip("aiokafka")
    topic = fresh_topic()

    async def run():
        producer = aiokafka.AIOKafkaProducer(bootstrap_servers=kafka_shared.bootstrap, compression_type="gzip")
        await producer.start()
        try:
            return [(await producer.send_and_wait(topic, VALUE, key=b"k%d" % i, headers=[("trace", b"%d" % i)])).offset
                    for i in range(5)]
        finally:
            await producer.stop()

    assert asyncio.run(run()) == list(range(5))
    assert [fields for _, fields in entries(kafka_shared, topic)] == [kafka_fields(i) for i in range(5)]


def test_kcat_produces_and_redis_reads(kafka_shared):
    if shutil.which("kcat") is None:
        pytest.skip("kcat is not installed (.ci/run installs it)")
    topic = fresh_topic()
    done = subprocess.run(["kcat", "-b", kafka_shared.bootstrap, "-t", topic, "-P", "-K", ":", "-z", "snappy",
                           "-H", "trace=1"], input=b"k0:v0\nk1:v1\n", capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert [fields for _, fields in entries(kafka_shared, topic)] == [
        [b"key", b"k0", b"value", b"v0", b"trace", b"1"], [b"key", b"k1", b"value", b"v1", b"trace", b"1"]]


def test_null_key_null_value_and_null_header_value(kafka_shared):
    """A null key or value is an absent field; a record with neither, nor headers, is an
    entry of no fields; a null header value is stored empty (docs/kafka.md)."""
    confluent_kafka = pytest.importorskip("confluent_kafka")
    topic = fresh_topic()
    producer = confluent_kafka.Producer({"bootstrap.servers": kafka_shared.bootstrap})
    producer.produce(topic, value=b"only a value")
    producer.produce(topic, key=b"tombstone")
    producer.produce(topic)
    producer.produce(topic, value=b"v", headers=[("empty", None)])
    assert producer.flush(20) == 0
    assert [fields for _, fields in entries(kafka_shared, topic)] == [
        [b"value", b"only a value"], [b"key", b"tombstone"], [], [b"value", b"v", b"empty", b""]]
    consumer = confluent_kafka.Consumer({"bootstrap.servers": kafka_shared.bootstrap, "group.id": "g",
                                         "enable.auto.commit": False})
    consumer.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
    got = consume(consumer, 4)
    assert [(m.key(), m.value(), m.headers()) for m in got] == [
        (None, b"only a value", None), (b"tombstone", None, None), (None, None, None), (None, b"v", [("empty", b"")])]


# -- write with Redis, read with each client ---------------------------------------------------

def xadd_mixed(server, topic: str) -> list[bytes]:
    """Entries in every shape the mapping distinguishes; returns their IDs."""
    r = server.client()
    return [
        r.execute_command("XADD", topic, "*", "key", "k0", "value", "v0"),
        r.execute_command("XADD", topic, "*", "value", "v1", "colour", "red", "key", "k1"),
        r.execute_command("XADD", topic, "*", "colour", "blue"),
        r.execute_command("XADD", topic, "*", "key", "k3", "key", "second", "value", "v3", "value", "again"),
    ]


EXPECTED = [  # (key, value, headers) of xadd_mixed's entries
    (b"k0", b"v0", []),
    (b"k1", b"v1", [(b"colour", b"red")]),
    (None, None, [(b"colour", b"blue")]),
    (b"k3", b"v3", [(b"key", b"second"), (b"value", b"again")]),
]


def consume(consumer, n: int, polls: int = 200) -> list:
    got = []
    for _ in range(polls):
        msg = consumer.poll(0.2)
        if msg is None:
            continue
        assert msg.error() is None, msg.error()
        got.append(msg)
        if len(got) == n:
            break
    consumer.close()
    return got


def test_xadd_read_by_librdkafka(kafka_shared):
    confluent_kafka = pytest.importorskip("confluent_kafka")
    topic = fresh_topic()
    ids = xadd_mixed(kafka_shared, topic)
    consumer = confluent_kafka.Consumer({"bootstrap.servers": kafka_shared.bootstrap, "group.id": "g",
                                         "enable.auto.commit": False})
    consumer.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
    got = consume(consumer, 4)
    assert [(m.offset(), m.key(), m.value(), [(k.encode(), v) for k, v in m.headers() or []]) for m in got] == [
        (i, *expected) for i, expected in enumerate(EXPECTED)]
    # the timestamp is the entry ID's ms, of type LogAppendTime
    assert [m.timestamp() for m in got] == [(confluent_kafka.TIMESTAMP_LOG_APPEND_TIME, int(i.split(b"-")[0]))
                                            for i in ids]


def test_xadd_read_by_kafka_python_and_written_back(kafka_shared):
    """Entry -> record -> entry keeps every field: key and value come first."""
    from kafka import KafkaConsumer, TopicPartition

    topic = fresh_topic()
    xadd_mixed(kafka_shared, topic)
    consumer = KafkaConsumer(bootstrap_servers=kafka_shared.bootstrap, enable_auto_commit=False,
                             consumer_timeout_ms=10_000)
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek(tp, 0)
    got = []
    for msg in consumer:
        got.append(msg)
        if len(got) == 4:
            break
    consumer.close()
    assert [(m.key, m.value, [(k.encode(), v) for k, v in m.headers]) for m in got] == EXPECTED
    copy = fresh_topic()  # (librdkafka writes them back: kafka-python refuses a null key and value)
    confluent_kafka = pytest.importorskip("confluent_kafka")
    producer = confluent_kafka.Producer({"bootstrap.servers": kafka_shared.bootstrap})
    for m in got:
        producer.produce(copy, key=m.key, value=m.value, headers=m.headers)
    assert producer.flush(20) == 0
    assert [fields for _, fields in entries(kafka_shared, copy)] == [
        [b"key", b"k0", b"value", b"v0"],
        [b"key", b"k1", b"value", b"v1", b"colour", b"red"],
        [b"colour", b"blue"],
        [b"key", b"k3", b"value", b"v3", b"key", b"second", b"value", b"again"],
    ]


def test_xadd_read_by_aiokafka(kafka_shared):
    aiokafka = pytest.importorskip("aiokafka")
    topic = fresh_topic()
    xadd_mixed(kafka_shared, topic)

    async def run():
        consumer = aiokafka.AIOKafkaConsumer(bootstrap_servers=kafka_shared.bootstrap, enable_auto_commit=False)
        await consumer.start()
        try:
            tp = aiokafka.TopicPartition(topic, 0)
            consumer.assign([tp])
            consumer.seek(tp, 0)
            return [await asyncio.wait_for(consumer.getone(), 10) for _ in range(4)]
        finally:
            await consumer.stop()

    got = asyncio.run(run())
    assert [(m.key, m.value, [(k.encode(), v) for k, v in m.headers]) for m in got] == EXPECTED


def test_xadd_read_by_kcat(kafka_shared):
    if shutil.which("kcat") is None:
        pytest.skip("kcat is not installed (.ci/run installs it)")
    topic = fresh_topic()
    xadd_mixed(kafka_shared, topic)
    done = subprocess.run(["kcat", "-b", kafka_shared.bootstrap, "-t", topic, "-C", "-p", "0", "-o", "0", "-c", "4",
                           "-f", "%o|%k|%s|%h\n"], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [b"0|k0|v0|", b"1|k1|v1|colour=red", b"2|||colour=blue",
                                        b"3|k3|v3|key=second,value=again"]


def test_a_consumer_waiting_is_woken_by_an_xadd(kafka_shared):
    """Fetch's long poll (max wait) ends when an XADD appends, not when the wait is up."""
    confluent_kafka = pytest.importorskip("confluent_kafka")
    topic = fresh_topic()
    r = kafka_shared.client()
    r.execute_command("XADD", topic, "*", "value", "first")
    consumer = confluent_kafka.Consumer({"bootstrap.servers": kafka_shared.bootstrap, "group.id": "g",
                                         "fetch.wait.max.ms": 30_000, "enable.auto.commit": False})
    consumer.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
    first = consume_one(consumer)
    assert first.value() == b"first"
    # the consumer now long-polls for 30 s; the XADD ends its wait
    r.execute_command("XADD", topic, "*", "value", "second")
    second = consume_one(consumer, timeout_s=10)
    consumer.close()
    assert second.value() == b"second"


def consume_one(consumer, timeout_s: float = 20.0):
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        msg = consumer.poll(0.2)
        if msg is not None:
            assert msg.error() is None, msg.error()
            return msg
    raise AssertionError(f"no message in {timeout_s}s")


def test_kafka_over_tls(partita_factory, certs):
    """kafka-tls-port: librdkafka over TLS produces and consumes; Metadata names the TLS port;
    plain text on it fails the handshake and is closed."""
    confluent_kafka = pytest.importorskip("confluent_kafka")
    port = free_port()
    server = partita_factory(["--kafka-tls-port", str(port), "--tls-cert-file", str(certs / "server.crt"),
                              "--tls-key-file", str(certs / "server.key"), "--tls-auth-clients", "no"])
    assert f"Kafka protocol listening (TLS) on 127.0.0.1:{port}, kafka-tls-port={port}" in server.log()
    tls = {"bootstrap.servers": f"127.0.0.1:{port}", "security.protocol": "ssl",
           "ssl.ca.location": str(certs / "ca.crt")}
    producer = confluent_kafka.Producer(tls)
    producer.produce("secure", key=b"k", value=b"v")
    assert producer.flush(30) == 0
    assert [f for _, f in entries(server, "secure")] == [[b"key", b"k", b"value", b"v"]]
    consumer = confluent_kafka.Consumer({**tls, "group.id": "g", "enable.auto.commit": False})
    consumer.assign([confluent_kafka.TopicPartition("secure", 0, 0)])
    assert consume_one(consumer).value() == b"v"
    assert [(b.id, b.port) for b in consumer.list_topics(timeout=10).brokers.values()] == [(0, port)]
    consumer.close()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as plain:
        plain.sendall(b"\x00\x00\x00\x10" + b"x" * 16)  # a Kafka frame, not a ClientHello
        data = read_until_closed(plain)
    assert data[:1] in (b"", b"\x15")  # closed, at most after a TLS alert: never a Kafka response
    producer.produce("secure", value=b"after")
    assert producer.flush(30) == 0
    assert server.proc.poll() is None
