"""What the cluster fault tests share: the ledger of acknowledged writes, an
acks=all producer thread (XADD, or librdkafka with acks=-1), and the check of
one key on its final leader."""

from __future__ import annotations

import json
import os
import random
import struct
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from storage.records import H_BASE, H_LENGTH, KIND_SEQUENCE, producer_records, unpack_header
from tests.clusterkit import Cluster


@dataclass
class Ledger:
    keys: list[bytes]
    acked: dict[bytes, list[bytes]] = field(default_factory=dict)
    failed_writes: int = 0
    faults: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.acked = {k: [] for k in self.keys}

    def count(self, fault: str) -> None:
        self.faults[fault] = self.faults.get(fault, 0) + 1

    def fault_summary(self) -> str:
        return ", ".join(f"{v} {k}" for k, v in sorted(self.faults.items()))


def no_retry_client(node, **kwargs) -> redis.Redis:
    """A client that never resends a command by itself (redis-py retries on
    connection errors by default): a command whose reply was lost must count
    as unknown, not as the error a silent second attempt got."""
    return node.client(retry=Retry(NoBackoff(), 0), **kwargs)


def produce(cluster: Cluster, key: bytes, ledger: Ledger, stop: threading.Event) -> None:
    """One producer: XADD to the key's leader; on any error, find the leader
    again and go on. Only replies count as acknowledged."""
    client = None
    i = 0
    while not stop.is_set():
        try:
            if client is None:
                client = no_retry_client(cluster.leader_of(key), socket_timeout=5)
            ledger.acked[key].append(client.xadd(key, {"n": str(i)}))
        except (redis.RedisError, OSError, StopIteration, AssertionError):
            ledger.failed_writes += 1
            client = None
            time.sleep(0.05)
        i += 1


def final_entries(cluster: Cluster, key: bytes) -> list[tuple[bytes, dict]]:
    """The entries of ``key`` on its final leader, once every replica has
    them all, and every replica's log byte-identical."""
    cluster.wait_converged(key.decode(), timeout_s=30)
    # The last fault may have restarted the controller's leader (a lease
    # lapsing meanwhile refuses the read with -TRYAGAIN) or a node that takes
    # its shard back meanwhile (-MOVED): retried on the leader found again.
    stored = cluster.on_leader(key, lambda client: client.xrange(key))
    logs = {cluster.log_bytes(n, key.decode()) for n in cluster.nodes}
    assert len(logs) == 1, f"{key!r}: replicas differ"
    return stored


def check_key(cluster: Cluster, key: bytes, acked: list[bytes]) -> list[bytes]:
    """Every acknowledged entry of ``key`` on its final leader once and in
    acknowledgement order, and every replica's log byte-identical; returns
    the IDs stored."""
    stored = [entry_id for entry_id, _ in final_entries(cluster, key)]
    assert len(stored) == len(set(stored)), f"{key!r}: duplicate IDs"
    position = {entry_id: i for i, entry_id in enumerate(stored)}
    missing = [a for a in acked if a not in position]
    assert not missing, f"{key!r}: {len(missing)} acknowledged entries lost, first {missing[:3]}"
    order = [position[a] for a in acked]
    assert order == sorted(order), f"{key!r}: acknowledged entries out of order"
    return stored


@dataclass
class KafkaLedger(Ledger):
    """A Kafka producer's ledger: ``keys`` are its topic's partition keys
    (partition n is ``keys[n]``), ``acked[key]`` the values its delivery
    reports acknowledged, in their order, and ``offsets[key]`` the offset
    each was acknowledged at (-1: the report named none, as librdkafka's
    does when the broker answered no base offset); ``retries`` librdkafka's
    own resends (its statistics' ``txretries``); ``failed_writes`` records
    whose delivery report was an error."""
    tag: bytes = b""  # the start of every value this producer sends
    idempotent: bool = False
    offsets: dict[bytes, list[int]] = field(default_factory=dict)
    retries: int = 0
    request_errors: int = 0  # requests that failed or timed out (statistics' txerrs + req_timeouts)
    unflushed: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        self.offsets = {k: [] for k in self.keys}


def produce_kafka(cluster: Cluster, topic: str, ledger: KafkaLedger, stop: threading.Event) -> None:
    """One librdkafka producer with acks=all (-1), idempotent or not, sending
    to each partition in turn until ``stop``, then flushing. Only a
    successful delivery report counts as acknowledged, at the partition and
    offset it names; librdkafka retries failed requests by itself.
    ``PARTITA_KAFKA_DEBUG`` (e.g. ``eos,msg``) is librdkafka's ``debug``:
    its epoch bumps and each request's error, on stderr."""
    import confluent_kafka

    def delivered(err, msg) -> None:
        if err is not None:
            ledger.failed_writes += 1
            return
        key = ledger.keys[msg.partition()]
        ledger.acked[key].append(msg.value())
        offset = msg.offset()
        ledger.offsets[key].append(-1 if offset is None else offset)

    def statistics(text: str) -> None:
        brokers = json.loads(text)["brokers"].values()
        ledger.retries = max(ledger.retries, sum(b.get("txretries", 0) for b in brokers))
        ledger.request_errors = max(ledger.request_errors, sum(b.get("txerrs", 0) + b.get("req_timeouts", 0)
                                                               for b in brokers))

    producer = confluent_kafka.Producer({
        "bootstrap.servers": cluster.bootstrap(), "acks": "all", "enable.idempotence": ledger.idempotent,
        "linger.ms": 5, "message.timeout.ms": 60_000, "retry.backoff.ms": 100,
        "topic.metadata.refresh.interval.ms": 1000, "statistics.interval.ms": 500, "stats_cb": statistics,
        **({"debug": os.environ["PARTITA_KAFKA_DEBUG"]} if os.environ.get("PARTITA_KAFKA_DEBUG") else {})})
    i = 0
    while not stop.is_set():
        try:
            producer.produce(topic, value=b"%s%08d" % (ledger.tag, i), partition=i % len(ledger.keys),
                             on_delivery=delivered)
            i += 1
        except BufferError:  # the queue is full while no leader answers: wait for reports
            pass
        producer.poll(0.005)  # paced as the XADD producers are, not at librdkafka's full speed
    ledger.unflushed = producer.flush(90)
    producer.poll(0)


def kafka_producers(log: bytes) -> dict[int, tuple[int, int]]:
    """The (producer id, epoch) that appended each offset of a partition log
    (``Cluster.log_bytes``) for the entries a Kafka idempotent producer
    appended: the producer records of the log's batches (storage.records)."""
    owners = {}
    pos = 0
    while pos < len(log):
        header = unpack_header(log, pos)
        for rec in producer_records(log, pos, header):
            if rec.kind == KIND_SEQUENCE:
                producer_id = struct.unpack_from("<q", rec.producer)[0]
                for i in range(rec.index, rec.index + rec.count):
                    owners[header[H_BASE] + i] = (producer_id, rec.epoch)
        pos += header[H_LENGTH]
    return owners


def check_kafka(ledger: KafkaLedger, stored: dict[bytes, list[tuple[bytes, dict]]],
                producers: dict[bytes, dict[int, tuple[int, int]]]) -> tuple[int, int, int]:
    """Every record ``ledger`` acknowledged is in ``stored`` (each partition
    key's entries on its final leader, ``final_entries``) at its acknowledged
    offset; an idempotent producer's records are there once within one
    (producer id, epoch) (``producers``: each key's ``kafka_producers``),
    another's at least once. Returns (records checked, duplicates stored,
    of them copies under another epoch of the producer).

    Why only within one epoch: librdkafka's idempotent (not transactional)
    producer answers an OUT_OF_ORDER_SEQUENCE_NUMBER that follows a request
    which failed unpersisted (NOT_LEADER, NOT_ENOUGH_REPLICAS: "skipped
    sequence numbers") by draining and bumping its epoch (KIP-360); it then
    re-sends every record not yet acknowledged from sequence 0 at the new
    epoch, those whose earlier request may have been appended included
    (NOT_ENOUGH_REPLICAS_AFTER_APPEND, a timeout, a broken connection). A
    Kafka broker cannot know the new epoch's batch repeats the old one's and
    stores it twice too. Seen with seed 227914594: i00001854 and i00001858
    at offsets 995/996 from producer id 8888569518781 epoch 0 (base
    sequences 463, 464), again at 1624/1625 from the same id at epoch 1
    (base sequences 0, 1); with seed 44 (``PARTITA_KAFKA_DEBUG=eos,msg``)
    i00002321 at offset 1182 (epoch 1, sequence 301) got
    NOT_ENOUGH_REPLICAS_AFTER_APPEND ("MsgPossiblyPersisted"; it was
    committed), then an out-of-order answer behind a NOT_LEADER on another
    partition bumped the epoch and librdkafka stored it again at 1372
    (epoch 2, sequence 0). Such copies are counted; a copy within one epoch
    (or of an entry with no producer record) is Partita's dedup failing and
    fails the check."""
    assert not ledger.unflushed, f"{ledger.unflushed} records never got a delivery report"
    checked = duplicates = across_epochs = 0
    for key in ledger.keys:
        values = [fields.get(b"value") for _, fields in stored[key]]
        counts = Counter(v for v in values if v is not None and v.startswith(ledger.tag))
        lost = [(offset, value, values[offset] if 0 <= offset < len(values) else None)
                for value, offset in zip(ledger.acked[key], ledger.offsets[key])
                if not (counts[value] if offset < 0 else offset < len(values) and values[offset] == value)]
        assert not lost, (f"{key!r}: {len(lost)} of {len(ledger.acked[key])} acknowledged records not at their "
                          f"offset, first (offset, acknowledged, stored) {lost[:3]}")
        twice = sum(c - 1 for c in counts.values())
        if ledger.idempotent and twice:
            copies = {v: [(i, producers[key].get(i)) for i, w in enumerate(values) if w == v]
                      for v, c in counts.items() if c > 1}
            same = {v: c for v, c in copies.items()
                    if None in (owners := [o for _, o in c]) or len(set(owners)) < len(owners)}
            if same:
                raise AssertionError(f"{key!r}: {len(same)} idempotent records stored twice by one producer epoch, "
                                     f"first (value, [(offset, (producer id, epoch))]) {list(same.items())[:3]}")
            across_epochs += twice
        checked += len(ledger.acked[key])
        duplicates += twice
    return checked, duplicates, across_epochs


def fault_seed() -> int:
    """``PARTITA_FAULT_SEED`` or a random one, printed so a failure can be replayed."""
    seed = int(os.environ.get("PARTITA_FAULT_SEED", "0")) or random.randrange(1 << 30)
    print(f"seed {seed} (PARTITA_FAULT_SEED={seed} reproduces the fault schedule)")
    return seed


def soak_seconds() -> float:
    return float(os.environ.get("PARTITA_SOAK_SECONDS", "300"))
