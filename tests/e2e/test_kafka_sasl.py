"""SASL and ACLs on the Kafka port, with real clients against a real ``partita``: librdkafka
(confluent-kafka, kcat) and kafka-python authenticate with PLAIN and SCRAM-SHA-256 as the ACL
users the RESP port knows, over plain TCP and TLS; a wrong password, a client without SASL and
a user without the right to write are refused as Kafka refuses them; ACL changes reach
connected clients; SCRAM secrets survive ACL SAVE and a restart (docs/kafka.md "Authentication",
docs/security.md "SCRAM credentials")."""

from __future__ import annotations

import logging
import shutil
import subprocess
import uuid

import pytest

from server.acl import hash_password
from tests.conftest import PartitaProcess, free_port, wait_for, with_kafka

MECHANISMS = ["PLAIN", "SCRAM-SHA-256"]
ADMIN_PW = "admin-pw"


def fresh_topic() -> str:
    return "t" + uuid.uuid4().hex[:10]


@pytest.fixture(scope="module")
def sasl_server(tmp_path_factory):
    """A partita whose default user needs a password, with users set by ACL SETUSER."""
    port = free_port()
    server = PartitaProcess(tmp_path_factory.mktemp("partita") / "data",
                            ["--kafka-port", str(port), "--requirepass", ADMIN_PW]).start()
    r = server.client(password=ADMIN_PW)
    r.execute_command("ACL", "SETUSER", "alice", "on", ">alice-pw", "~*", "+@all")
    r.execute_command("ACL", "SETUSER", "reader", "on", ">reader-pw", "~*", "-@all", "+@read")
    yield with_kafka(server, port)
    server.stop()


def librdkafka_config(server, user: str, password: str, mechanism: str, **extra) -> dict:
    return {"bootstrap.servers": server.bootstrap, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": mechanism, "sasl.username": user, "sasl.password": password, **extra}


def consume_one(consumer):
    [msg] = consumer.consume(1, timeout=20)
    assert msg.error() is None, msg.error()
    return msg


def librdkafka_round_trip(server, config: dict) -> None:
    confluent_kafka = pytest.importorskip("confluent_kafka")
    topic = fresh_topic()
    producer = confluent_kafka.Producer(config)
    delivered = []
    producer.produce(topic, key=b"k", value=b"v", on_delivery=lambda err, msg: delivered.append(err))
    assert producer.flush(30) == 0 and delivered == [None]
    consumer = confluent_kafka.Consumer({**config, "group.id": "g", "enable.auto.commit": False})
    consumer.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
    assert consume_one(consumer).value() == b"v"
    consumer.close()
    r = server.client(password=ADMIN_PW)
    assert [fields for _, fields in r.xrange(topic)] == [{b"key": b"k", b"value": b"v"}]


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_librdkafka_authenticates_produces_and_consumes(sasl_server, mechanism):
    librdkafka_round_trip(sasl_server, librdkafka_config(sasl_server, "alice", "alice-pw", mechanism))


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_kafka_python_authenticates_produces_and_consumes(sasl_server, mechanism):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    auth = dict(bootstrap_servers=sasl_server.bootstrap, security_protocol="SASL_PLAINTEXT",
                sasl_mechanism=mechanism, sasl_plain_username="alice", sasl_plain_password="alice-pw")
    topic = fresh_topic()
    producer = KafkaProducer(**auth)  # (idempotent, kafka-python 3's default: InitProducerId as alice)
    assert producer.send(topic, key=b"k", value=b"v").get(20).offset == 0
    producer.close(5)
    consumer = KafkaConsumer(enable_auto_commit=False, consumer_timeout_ms=10_000, **auth)
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek(tp, 0)
    assert next(iter(consumer)).value == b"v"
    consumer.close()


def kcat(server, mechanism: str, password: str, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess:
    if shutil.which("kcat") is None:
        pytest.skip("kcat is not installed (.ci/run installs it)")
    return subprocess.run(["kcat", "-b", server.bootstrap, "-X", "security.protocol=SASL_PLAINTEXT",
                           "-X", f"sasl.mechanisms={mechanism}", "-X", "sasl.username=alice",
                           "-X", f"sasl.password={password}", *args], input=stdin, capture_output=True, timeout=60)


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_kcat_authenticates_produces_and_consumes(sasl_server, mechanism):
    topic = fresh_topic()
    done = kcat(sasl_server, mechanism, "alice-pw", "-t", topic, "-P", "-K", ":", stdin=b"k0:v0\nk1:v1\n")
    assert done.returncode == 0, done.stderr
    done = kcat(sasl_server, mechanism, "alice-pw", "-t", topic, "-C", "-o", "beginning", "-e", "-f", "%k=%s\\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [b"k0=v0", b"k1=v1"]


@pytest.mark.parametrize("mechanism,message", [
    ("PLAIN", "Authentication failed: Invalid username or password"),
    ("SCRAM-SHA-256", "Authentication failed during authentication due to invalid credentials with SASL "
                      "mechanism SCRAM-SHA-256"),
])
def test_a_wrong_password_is_refused_with_kafkas_error(sasl_server, mechanism, message, caplog):
    confluent_kafka = pytest.importorskip("confluent_kafka")
    errors = []
    producer = confluent_kafka.Producer(librdkafka_config(sasl_server, "alice", "wrong", mechanism,
                                                          error_cb=errors.append))
    assert wait_for(lambda: producer.poll(0.1) is not None and any(
        e.code() == confluent_kafka.KafkaError._AUTHENTICATION for e in errors), 20), errors
    assert any(message in e.str() for e in errors), [e.str() for e in errors]
    del producer  # (it would go on trying)
    from kafka import KafkaProducer
    from kafka.errors import KafkaError

    # kafka-python retries until bootstrap_timeout_ms, then says it could not bootstrap; each failure's
    # reason is in its log (the answer arrives before the close: Kafka's close delay)
    with caplog.at_level(logging.WARNING, "kafka"), pytest.raises(KafkaError):
        KafkaProducer(bootstrap_servers=sasl_server.bootstrap, security_protocol="SASL_PLAINTEXT",
                      sasl_mechanism=mechanism, sasl_plain_username="alice", sasl_plain_password="wrong",
                      enable_idempotence=False, bootstrap_timeout_ms=2_000)
    assert f"SaslAuthenticationFailedError: {message}" in caplog.text
    done = kcat(sasl_server, mechanism, "wrong", "-t", "t", "-P", stdin=b"v\n")  # (all brokers down: it ends)
    assert done.returncode != 0 and message.encode() in done.stderr, done.stderr
    assert sasl_server.client(password=ADMIN_PW).ping()


def test_a_client_without_sasl_is_closed_and_the_log_says_why(kafka_partita):
    confluent_kafka = pytest.importorskip("confluent_kafka")
    server = kafka_partita(["--requirepass", "pw"])
    assert "Kafka clients must authenticate with SASL (PLAIN, SCRAM-SHA-256)" in server.log()
    producer = confluent_kafka.Producer({"bootstrap.servers": server.bootstrap})
    with pytest.raises(confluent_kafka.KafkaException):
        producer.list_topics(timeout=3)
    assert wait_for(lambda: "during SASL handshake. (The server needs a password" in server.log(), 10)


def test_a_user_without_write_rights_gets_topic_authorization_failed(sasl_server):
    confluent_kafka = pytest.importorskip("confluent_kafka")
    topic = fresh_topic()
    sasl_server.client(password=ADMIN_PW).xadd(topic, {"value": "x"})
    producer = confluent_kafka.Producer(librdkafka_config(sasl_server, "reader", "reader-pw", "SCRAM-SHA-256"))
    delivered = []
    producer.produce(topic, value=b"v", on_delivery=lambda err, msg: delivered.append(err))
    producer.flush(30)
    assert [e.code() for e in delivered] == [confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED]
    # reading is its right: it consumes what is there
    consumer = confluent_kafka.Consumer(librdkafka_config(sasl_server, "reader", "reader-pw", "PLAIN",
                                                          **{"group.id": "g", "enable.auto.commit": False}))
    consumer.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
    assert consume_one(consumer).value() == b"x"
    consumer.close()


def test_acl_changes_reach_connected_kafka_clients(sasl_server):
    from kafka import KafkaProducer
    from kafka.errors import TopicAuthorizationFailedError

    r = sasl_server.client(password=ADMIN_PW)
    r.execute_command("ACL", "SETUSER", "bob", "on", ">bob-pw", "~bob-*", "+@all")
    topic = "bob-" + uuid.uuid4().hex[:8]
    producer = KafkaProducer(bootstrap_servers=sasl_server.bootstrap, security_protocol="SASL_PLAINTEXT",
                             sasl_mechanism="PLAIN", sasl_plain_username="bob", sasl_plain_password="bob-pw",
                             enable_idempotence=False, retries=0)
    assert producer.send(topic, value=b"1").get(20).offset == 0
    r.execute_command("ACL", "SETUSER", "bob", "resetkeys", "~other-*")
    with pytest.raises(TopicAuthorizationFailedError):
        producer.send(topic, value=b"2").get(20)
    r.execute_command("ACL", "SETUSER", "bob", "~bob-*")
    assert producer.send(topic, value=b"3").get(20).offset == 1
    assert [f[b"value"] for _, f in r.xrange(topic)] == [b"1", b"3"]
    # a deleted user's Kafka connections close, as its RESP ones
    assert any(c["user"] == "bob" for c in r.client_list())
    r.execute_command("ACL", "DELUSER", "bob")
    assert wait_for(lambda: not any(c["user"] == "bob" for c in r.client_list()), 10)
    producer.close(0)


def test_sasl_over_tls(partita_factory, certs):
    port = free_port()
    server = with_kafka(partita_factory(["--kafka-tls-port", str(port), "--requirepass", ADMIN_PW,
                                         "--tls-cert-file", str(certs / "server.crt"),
                                         "--tls-key-file", str(certs / "server.key"), "--tls-auth-clients", "no"]),
                        port)
    for mechanism in MECHANISMS:
        librdkafka_round_trip(server, librdkafka_config(server, "default", ADMIN_PW, mechanism, **{
            "security.protocol": "SASL_SSL", "ssl.ca.location": str(certs / "ca.crt")}))


def test_scram_secrets_survive_acl_save_and_a_restart(partita_factory, tmp_path):
    """ACL SAVE writes each password's SCRAM secret beside the aclfile; a user known only by
    its hash (#...) can use PLAIN, and SCRAM is refused with a log line that says what to do."""
    aclfile = tmp_path / "users.acl"
    aclfile.write_text("")  # the aclfile must exist (as in Redis); empty, it holds no users
    port = free_port()
    server = with_kafka(partita_factory(["--kafka-port", str(port), "--requirepass", ADMIN_PW,
                                         "--aclfile", str(aclfile)]), port)
    r = server.client(password=ADMIN_PW)
    r.execute_command("ACL", "SETUSER", "carol", "on", ">carol-pw", "~*", "+@all")
    r.execute_command("ACL", "SETUSER", "dave", "on", "#" + hash_password(b"dave-pw"), "~*", "+@all")
    assert r.execute_command("ACL", "SAVE") == b"OK"
    assert (tmp_path / "users.acl.scram").exists()
    server.restart()
    librdkafka_round_trip(server, librdkafka_config(server, "carol", "carol-pw", "SCRAM-SHA-256"))
    librdkafka_round_trip(server, librdkafka_config(server, "dave", "dave-pw", "PLAIN"))
    confluent_kafka = pytest.importorskip("confluent_kafka")
    errors = []
    producer = confluent_kafka.Producer(librdkafka_config(server, "dave", "dave-pw", "SCRAM-SHA-256",
                                                          error_cb=errors.append))
    assert wait_for(lambda: producer.poll(0.1) is not None and bool(errors), 20)
    assert wait_for(lambda: "'dave': the user has no SCRAM credentials" in server.log(), 10)
    assert "ACL SETUSER dave >password" in server.log()
