"""Helpers for the consumer-group end-to-end tests: a raw RESP client, and a
pair of them (Partita + redis-server) that runs the same commands on both;
for the Kafka group tests: ``kafka_topic`` (a topic made and filled through
librdkafka), ``kafka_settle`` (poll consumers until their assignments
share a topic's partitions), ``KAFKA_MEMBER_SCRIPT``, a librdkafka
group member to run (and kill) as a process, and ``KafkaPythonMember``, a
kafka-python group member polled on a thread of its own."""

from __future__ import annotations

import copy
import shlex
import socket
import threading
import time

import hiredis


class Resp:
    """One raw connection; ``call`` returns the reply's exact bytes."""

    def __init__(self, port: int, protocol: int = 2, timeout_s: float = 10.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
        self.protocol = protocol
        if protocol == 3:
            self.call("HELLO", "3")

    def send(self, *argv) -> None:
        parts = [a if isinstance(a, bytes) else str(a).encode() for a in argv]
        self.sock.sendall(b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts))

    def read(self) -> bytes:
        reader = hiredis.Reader()
        raw = b""
        while True:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError(f"closed after {raw!r}")
            raw += data
            reader.feed(data)
            if reader.gets() is not False:
                return raw

    def call(self, *argv) -> bytes:
        self.send(*argv)
        return self.read()

    def value(self, *argv):
        """The reply parsed (errors come back as ``hiredis.ReplyError`` values)."""
        reader = hiredis.Reader()
        reader.feed(self.call(*argv))
        return reader.gets()

    def close(self) -> None:
        self.sock.close()


def parse(raw: bytes):
    reader = hiredis.Reader()
    reader.feed(raw)
    return reader.gets()


def while_blocked(port: int, argv: tuple, action, timeout_s: float = 15.0) -> bytes:
    """Send ``argv`` (a blocking read) on a connection of its own, wait until
    the server counts a blocked client, run ``action()`` (on another
    connection), and return the blocked read's reply."""
    got: list = []
    watcher = Resp(port)
    thread = threading.Thread(target=lambda: got.append(Resp(port).call(*argv)))
    thread.start()
    try:
        deadline = time.monotonic() + timeout_s
        while b"blocked_clients:1\r\n" not in watcher.call("INFO", "clients"):
            assert time.monotonic() < deadline, f"{argv!r} never blocked"
            time.sleep(0.01)
        action()
    finally:
        thread.join(timeout_s)
        watcher.close()
    assert got, f"{argv!r} got no reply"
    return got[0]


def topic_with_one_pending(r: Resp, topic: str, group: str, partition: int) -> None:
    """Topic ``topic`` of 2 partitions with ``group`` on both, entry 1-0 on
    ``partition`` delivered to consumer ``c`` and pending."""
    assert r.call("TOPIC", "CREATE", topic, "PARTITIONS", "2") == b"+OK\r\n"
    r.call("XADD", f"{topic}#{partition}", "1-0", "f", "v")
    r.call("XGROUP", "CREATE", topic, group, "0")
    r.call("XREADGROUP", "GROUP", group, "c", "STREAMS", f"{topic}#{partition}", ">")


class Pair:
    """The same commands to Partita and to Redis."""

    def __init__(self, partita_port: int, redis_port: int, protocol: int) -> None:
        self.protocol = protocol
        self.partita = Resp(partita_port, protocol)
        self.redis = Resp(redis_port, protocol)
        self.partita.call("FLUSHALL")
        self.redis.call("FLUSHALL")

    def both(self, *argv) -> tuple[bytes, bytes]:
        return self.partita.call(*argv), self.redis.call(*argv)

    def same(self, *argv) -> bytes:
        mine, theirs = self.both(*argv)
        assert mine == theirs, f"{argv!r}\n partita: {mine!r}\n redis:   {theirs!r}"
        return mine

    def similar(self, *argv, idle_paths=(), tolerance_ms: int = 1000, partita_only=()):
        """Same reply once the values at ``idle_paths`` (times in ms) are within tolerance.

        ``partita_only`` lists ``(path, field)``: maps at ``path`` that must carry
        ``field`` in Partita's reply only (a field newer than the reference
        Redis, e.g. XINFO CONSUMERS ``inactive`` from 7.2); it is checked to be
        there and then dropped before comparing.
        """
        raw_mine, raw_theirs = self.both(*argv)
        mine, theirs = parse(raw_mine), parse(raw_theirs)
        if isinstance(mine, Exception) or isinstance(theirs, Exception):
            assert raw_mine == raw_theirs, f"{argv!r}\n partita: {raw_mine!r}\n redis:   {raw_theirs!r}"
            return mine
        for path, name in partita_only:
            for item in _at(mine, path):
                _drop_field(item, name)
        for path in idle_paths:
            for a, b in zip(_at(mine, path), _at(theirs, path)):
                assert abs(a - b) <= tolerance_ms, f"{argv!r} at {path}: {a} vs {b}"
        original = copy.deepcopy(mine)
        _blank(mine, idle_paths)
        _blank(theirs, idle_paths)
        assert mine == theirs, f"{argv!r}\n partita: {mine!r}\n redis:   {theirs!r}"
        return original

    def script(self, text: str) -> None:
        for line in text.strip().splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                self.same(*[a.encode("latin-1") for a in shlex.split(line)])

    def close(self) -> None:
        self.partita.close()
        self.redis.close()


def _at(value, path):
    """Values at ``path``: a tuple of indexes/keys; ``"*"`` means every element."""
    if not path:
        return [value]
    head, rest = path[0], path[1:]
    if head == "*":
        out = []
        for item in value:
            out.extend(_at(item, rest))
        return out
    if isinstance(value, dict):
        return _at(value[head], rest)
    if isinstance(value, list) and isinstance(head, bytes):  # RESP2 flat map
        return _at(value[value.index(head) + 1], rest)
    return _at(value[head], rest)


def _drop_field(mapping, name: bytes) -> None:
    """Remove ``name`` from a RESP3 map (dict) or RESP2 flat map (list); it must be there."""
    if isinstance(mapping, dict):
        assert name in mapping, f"{name!r} missing from {mapping!r}"
        del mapping[name]
    else:
        idx = mapping.index(name)
        del mapping[idx : idx + 2]


def _blank(value, paths) -> None:
    for path in paths:
        _set(value, path)


def _set(value, path) -> None:
    head, rest = path[0], path[1:]
    if head == "*":
        for item in value:
            if rest:
                _set(item, rest)
        if not rest:
            for i in range(len(value)):
                value[i] = 0
        return
    if isinstance(value, list) and isinstance(head, bytes):
        idx = value.index(head) + 1
    else:
        idx = head
    if rest:
        _set(value[idx], rest)
    else:
        value[idx] = 0


# python -c KAFKA_MEMBER_SCRIPT <bootstrap> <group> <topic> <JSON of more consumer settings>:
# a librdkafka group member that prints its assignment each time it changes, until killed.
KAFKA_MEMBER_SCRIPT = """
import json, sys, confluent_kafka
c = confluent_kafka.Consumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2], **json.loads(sys.argv[4])})
c.subscribe([sys.argv[3]])
shown = None
while True:
    c.poll(0.1)
    mine = sorted(tp.partition for tp in c.assignment())
    if mine != shown:
        print("assigned", mine, flush=True)
        shown = mine
"""


def kafka_topic(bootstrap: str, name: str, partitions: int, records_each: int = 0) -> str:
    """Create topic ``name`` with ``partitions`` (librdkafka's AdminClient) and produce
    ``records_each`` records to each partition."""
    import confluent_kafka
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, partitions)]).values():
        future.result(30)
    if records_each:
        producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap})
        for i in range(records_each * partitions):
            producer.produce(name, value=b"v%d" % i, partition=i % partitions)
        assert producer.flush(30) == 0
    return name


def kafka_settle(consumers, want_sizes: list[int], partitions: int, timeout_s: float = 60.0,
                 on_message=None) -> list[list[int]]:
    """Poll every consumer until their assignments are disjoint, cover the topic's ``partitions``
    and have the sorted sizes ``want_sizes``: the assignments. ``on_message``: called with
    each record polled meanwhile."""
    deadline = time.monotonic() + timeout_s
    got: list[list[int]] = []
    while time.monotonic() < deadline:
        for c in consumers:
            m = c.poll(0.05)
            if on_message is not None and m is not None and not m.error():
                on_message(m)
        got = [sorted(tp.partition for tp in c.assignment()) for c in consumers]
        flat = [p for g in got for p in g]
        if sorted(flat) == list(range(partitions)) and sorted(len(g) for g in got) == want_sizes:
            return got
    raise AssertionError(f"the group did not settle: {got}")


class KafkaPythonMember:
    """A kafka-python group member polled back to back on a thread of its own, as an
    application runs one; ``assignment()`` is its partitions as of its last poll.

    Not polled in turn with other members on one thread: kafka-python 3.0.12 joins its group
    inside ``poll``, and a join that completes between two polls is dropped and a new JoinGroup
    sent (``BaseCoordinator.join_group_async`` starts a new attempt once the last one is done);
    a leader's new JoinGroup starts another rebalance, whose join again outlasts the short
    poll. Members polled in short turns therefore rebalanced without end once a join took
    longer than a turn (seen: generation 50 after 30 s, the leader still holding every
    partition from the first one). Polled back to back with ``POLL_MS``, a join completes
    inside a poll.

    ``start(topic, on_records)``: waits for the topic's metadata (a leader assigning without
    it hands out nothing and rejoins), subscribes and polls until ``close()``, which closes the
    consumer on its thread (leaving the group). ``on_records(consumer, records)`` is called on
    that thread with each poll's records (it may commit)."""

    POLL_MS = 1000

    def __init__(self, **settings) -> None:
        import kafka

        self.consumer = kafka.KafkaConsumer(**settings)
        self._assigned: list[int] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def start(self, topic: str, on_records=None) -> None:
        deadline = time.monotonic() + 20
        while not self.consumer.partitions_for_topic(topic):
            assert time.monotonic() < deadline, f"kafka-python has no metadata of {topic}"
            time.sleep(0.05)
        self.consumer.subscribe([topic])
        self._thread = threading.Thread(target=self._run, args=(on_records,), daemon=True)
        self._thread.start()

    def _run(self, on_records) -> None:
        consumer = self.consumer
        try:
            while not self._stop.is_set():
                got = consumer.poll(timeout_ms=self.POLL_MS)
                self._assigned = sorted(tp.partition for tp in consumer.assignment())
                if got and on_records is not None:
                    on_records(consumer, got)
        except BaseException as e:  # shown by assignment() and close()
            self._error = e
        finally:
            consumer.close()

    def assignment(self) -> list[int]:
        if self._error is not None:
            raise AssertionError(f"the kafka-python member failed: {self._error!r}") from self._error
        return self._assigned

    def close(self) -> None:
        self._stop.set()
        if self._thread is None:
            self.consumer.close()
            return
        self._thread.join(timeout=30)
        assert not self._thread.is_alive(), "the kafka-python member did not stop"
        if self._error is not None:
            raise AssertionError(f"the kafka-python member failed: {self._error!r}") from self._error
