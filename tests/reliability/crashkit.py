"""Crash-test kit: write and consume numbered, checksummed entries against a
real ``partita`` process, SIGKILL it at random moments, restart it on the same
data dir, and check after every restart that nothing acknowledged was lost,
nothing was invented and nothing corrupt is served.

Owns: the entry format (``make_fields`` / ``check_fields``), the load
threads (``Producer``: pipelined XADD on a raw socket; ``Consumer``:
XREADGROUP + XACK), the ledger of what the server acknowledged, and
``verify`` (the invariants, as assertion failures with precise messages).

Must not know: how the server stores anything; it sees only replies. Used by
``test_crash.py`` (CI and soak runs); importable by a manual script.

Entry fields: ``p`` producer number, ``n`` sequence (per producer, from 0,
never reused, also across restarts), ``d`` filler of a length derived from
(p, n), ``c`` CRC32 of ``p:n:d``. An entry whose fields are not exactly these
four, or whose checksum fails, is corrupt.

Acknowledged means: the reply to that command was received by the client.
With ``fsync always`` every acknowledged XADD, XREADGROUP delivery and XACK
must survive the kill.
"""

from __future__ import annotations

import random
import socket
import threading
import time
import zlib
from dataclasses import dataclass, field

import hiredis

GROUP = b"g"


# ------------------------------------------------------------- entry format


def make_fields(producer: int, seq: int) -> list[bytes]:
    filler = (b"%d.%d|" % (producer, seq)) * (1 + (producer * 7919 + seq) % 9)
    p, n = b"%d" % producer, b"%d" % seq
    crc = b"%d" % zlib.crc32(p + b":" + n + b":" + filler)
    return [b"p", p, b"n", n, b"d", filler, b"c", crc]


def check_fields(fields: list[bytes]) -> tuple[int, int]:
    """(producer, seq) of a valid entry; raises AssertionError if corrupt."""
    assert isinstance(fields, list) and len(fields) == 8, f"corrupt entry fields {fields!r}"
    assert fields[0::2] == [b"p", b"n", b"d", b"c"], f"corrupt entry field names {fields!r}"
    p, n, d, c = fields[1::2]
    assert c == b"%d" % zlib.crc32(p + b":" + n + b":" + d), f"checksum mismatch in entry {fields!r}"
    producer, seq = int(p), int(n)
    assert make_fields(producer, seq) == fields, f"entry does not match its generator {fields!r}"
    return producer, seq


def parse_id(raw: bytes) -> tuple[int, int]:
    ms, _, seq = raw.partition(b"-")
    return int(ms), int(seq)


# ------------------------------------------------------------- raw client


def encode(*args: bytes | str | int) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for a in args:
        if isinstance(a, int):
            a = b"%d" % a
        elif isinstance(a, str):
            a = a.encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(parts)


class Conn:
    """A raw RESP2 client: pipelined sends, replies read one at a time."""

    def __init__(self, port: int, timeout_s: float = 10.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
        self.reader = hiredis.Reader()

    def send(self, payload: bytes) -> None:
        self.sock.sendall(payload)

    def reply(self):
        """The next reply (a ``hiredis.ReplyError`` for ``-ERR``); ConnectionError when closed."""
        while True:
            got = self.reader.gets()
            if got is not False:
                return got
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                raise ConnectionError("reply timed out") from None
            if not data:
                raise ConnectionError("server closed the connection")
            self.reader.feed(data)

    def call(self, *args):
        self.send(encode(*args))
        return self.reply()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


# ------------------------------------------------------------- the ledger


@dataclass
class Ledger:
    """What the clients sent and what the server acknowledged, across restarts."""

    keys: dict[bytes, list[bytes]]  # stream/topic key -> its partition keys
    sent: dict[int, int] = field(default_factory=dict)  # producer -> next seq (all below were sent or tried)
    acked: dict[tuple[int, int], bytes] = field(default_factory=dict)  # (p, n) -> ID from the XADD reply
    producer_key: dict[int, bytes] = field(default_factory=dict)
    delivered: dict[bytes, set[bytes]] = field(default_factory=dict)  # partition key -> IDs delivered (reply seen)
    group_acked: dict[bytes, set[bytes]] = field(default_factory=dict)  # partition key -> IDs whose XACK reply was seen
    ack_sent: dict[bytes, set[bytes]] = field(default_factory=dict)  # partition key -> IDs an XACK was sent for
    errors: list[str] = field(default_factory=list)  # unexpected error replies
    lock: threading.Lock = field(default_factory=threading.Lock)
    kills: int = 0
    entries_checked: int = 0

    def partition_keys(self) -> list[bytes]:
        return [pk for pks in self.keys.values() for pk in pks]


class Producer(threading.Thread):
    """Pipelined XADD of numbered entries until the connection dies or ``stop``."""

    def __init__(self, ledger: Ledger, port: int, producer: int, key: bytes, rng: random.Random,
                 stop: threading.Event) -> None:
        super().__init__(daemon=True, name=f"producer-{producer}")
        self.ledger, self.port, self.producer, self.key = ledger, port, producer, key
        self.rng, self.stop_event = rng, stop
        ledger.producer_key[producer] = key
        ledger.sent.setdefault(producer, 0)

    def run(self) -> None:
        try:
            conn = Conn(self.port)
        except OSError:
            return
        try:
            while not self.stop_event.is_set():
                batch = self.rng.randint(1, 16)
                first = self.ledger.sent[self.producer]
                seqs = range(first, first + batch)
                payload = b"".join(encode(b"XADD", self.key, b"*", *make_fields(self.producer, n)) for n in seqs)
                # Counted as sent before the bytes leave: a kill mid-send may
                # still leave some of them in the log (present, unacknowledged).
                self.ledger.sent[self.producer] = first + batch
                conn.send(payload)
                for n in seqs:
                    reply = conn.reply()
                    if isinstance(reply, hiredis.ReplyError):
                        with self.ledger.lock:
                            self.ledger.errors.append(f"XADD {self.key!r} p={self.producer} n={n}: {reply}")
                        continue
                    with self.ledger.lock:
                        self.ledger.acked[(self.producer, n)] = reply
        except (ConnectionError, OSError):
            pass  # the server was killed
        finally:
            conn.close()


class Consumer(threading.Thread):
    """XREADGROUP > then XACK of what it got, until the connection dies or ``stop``."""

    def __init__(self, ledger: Ledger, port: int, key: bytes, name: bytes, stop: threading.Event) -> None:
        super().__init__(daemon=True, name=f"consumer-{name.decode()}")
        self.ledger, self.port, self.key, self.consumer, self.stop_event = ledger, port, key, name, stop
        self.corrupt: list[str] = []

    def run(self) -> None:
        try:
            conn = Conn(self.port)
        except OSError:
            return
        try:
            while not self.stop_event.is_set():
                reply = conn.call(b"XREADGROUP", b"GROUP", GROUP, self.consumer, b"COUNT", 50, b"BLOCK", 100,
                                  b"STREAMS", self.key, b">")
                if isinstance(reply, hiredis.ReplyError):
                    with self.ledger.lock:
                        self.ledger.errors.append(f"XREADGROUP {self.key!r}: {reply}")
                    time.sleep(0.05)
                    continue
                if not _well_formed(reply):
                    self.corrupt.append(f"XREADGROUP {self.key!r}: malformed reply {reply!r:.600}")
                    continue
                for pk, entries in reply or []:
                    ids = []
                    for entry_id, fields in entries:
                        if fields is None:
                            continue  # deleted since delivery (we never delete)
                        try:
                            check_fields(fields)
                        except AssertionError as e:
                            self.corrupt.append(f"XREADGROUP {pk!r} {entry_id!r}: {e}")
                        ids.append(entry_id)
                    with self.ledger.lock:
                        self.ledger.delivered.setdefault(pk, set()).update(ids)
                    if ids:
                        with self.ledger.lock:  # may take effect even if the kill eats the reply
                            self.ledger.ack_sent.setdefault(pk, set()).update(ids)
                        acked = conn.call(b"XACK", pk, GROUP, *ids)
                        if isinstance(acked, hiredis.ReplyError):
                            with self.ledger.lock:
                                self.ledger.errors.append(f"XACK {pk!r}: {acked}")
                            continue
                        with self.ledger.lock:
                            self.ledger.group_acked.setdefault(pk, set()).update(ids)
        except (ConnectionError, OSError):
            pass
        except Exception as e:  # a reply the kit cannot parse: report it, do not die silently
            self.corrupt.append(f"consumer {self.consumer!r} failed: {type(e).__name__}: {e}")
        finally:
            conn.close()


def _well_formed(reply) -> bool:
    """RESP2 XREADGROUP: nil, or [[key, [[id, fields or nil], ...]], ...]."""
    if reply is None:
        return True
    try:
        return all(len(kv) == 2 and isinstance(kv[0], bytes)
                   and all(len(e) == 2 and isinstance(e[0], bytes) for e in kv[1]) for kv in reply)
    except TypeError:
        return False


# ------------------------------------------------------------- checks


def _xrange_all(conn: Conn, pk: bytes) -> list[tuple[bytes, list[bytes]]]:
    out: list = []
    start = b"-"
    while True:
        chunk = conn.call(b"XRANGE", pk, start, b"+", b"COUNT", 5000)
        assert not isinstance(chunk, hiredis.ReplyError), f"XRANGE {pk!r}: {chunk}"
        out.extend(chunk)
        if len(chunk) < 5000:
            return out
        start = b"(" + chunk[-1][0]


def _pairs(flat: list) -> dict:
    return {flat[i]: flat[i + 1] for i in range(0, len(flat), 2)}


def verify(ledger: Ledger, port: int) -> int:
    """Check every invariant against a freshly restarted server; the entries checked.

    Raises AssertionError naming the first broken invariant.
    """
    conn = Conn(port, timeout_s=30)
    try:
        found: dict[tuple[int, int], tuple[bytes, bytes]] = {}  # (p, n) -> (partition key, ID)
        last_id: dict[bytes, tuple[int, int]] = {}
        checked = 0
        for pk in ledger.partition_keys():
            entries = _xrange_all(conn, pk)
            prev = (0, 0)
            for raw_id, fields in entries:
                sid = parse_id(raw_id)
                assert sid > prev, f"{pk!r}: IDs out of order {prev} then {sid}"
                prev = sid
                producer, seq = check_fields(fields)  # no corrupt entry is served
                assert seq < ledger.sent.get(producer, 0), (
                    f"{pk!r} {raw_id!r}: entry p={producer} n={seq} was never sent")
                assert (producer, seq) not in found, (
                    f"entry p={producer} n={seq} appears twice: {found[(producer, seq)]} and {(pk, raw_id)}")
                found[(producer, seq)] = (pk, raw_id)
                checked += 1
            last_id[pk] = prev
        # Every acknowledged entry is there, with the ID it was acknowledged with.
        missing = [(k, v) for k, v in ledger.acked.items() if k not in found]
        assert not missing, f"{len(missing)} acknowledged entries lost, e.g. {sorted(missing)[:5]}"
        wrong = [(k, v, found[k][1]) for k, v in ledger.acked.items() if found[k][1] != v]
        assert not wrong, f"acknowledged entries with another ID: {wrong[:5]}"
        # Per producer and partition, sequence order is ID order (pipelines run in order).
        by_stream: dict[tuple[int, bytes], list[tuple[int, tuple[int, int]]]] = {}
        for (producer, seq), (pk, raw_id) in found.items():
            by_stream.setdefault((producer, pk), []).append((seq, parse_id(raw_id)))
        for (producer, pk), items in by_stream.items():
            items.sort()
            ids = [sid for _, sid in items]
            assert ids == sorted(ids), f"{pk!r}: producer {producer}'s entries are out of order"
        # Group state is never ahead of the log, nor behind what was acknowledged.
        for pk in ledger.partition_keys():
            present = {raw_id for (p2, raw_id) in found.values() if p2 == pk}
            groups = conn.call(b"XINFO", b"GROUPS", pk)
            assert not isinstance(groups, hiredis.ReplyError), f"XINFO GROUPS {pk!r}: {groups}"
            info = {g[b"name"]: g for g in map(_pairs, groups)}
            assert GROUP in info, f"{pk!r}: group {GROUP!r} lost"
            last_delivered = parse_id(info[GROUP][b"last-delivered-id"])
            assert last_delivered <= last_id[pk], (
                f"{pk!r}: last-delivered-id {last_delivered} is past the last entry {last_id[pk]}")
            delivered = ledger.delivered.get(pk, set())
            if delivered:
                top = max(map(parse_id, delivered))
                assert last_delivered >= top, (
                    f"{pk!r}: last-delivered-id {last_delivered} is behind an acknowledged delivery {top}")
            pending = conn.call(b"XPENDING", pk, GROUP, b"-", b"+", 10_000_000)
            assert not isinstance(pending, hiredis.ReplyError), f"XPENDING {pk!r}: {pending}"
            pending_ids = {row[0] for row in pending}
            assert int(info[GROUP][b"pending"]) == len(pending_ids), f"{pk!r}: XINFO pending != XPENDING rows"
            ghost = pending_ids - present
            assert not ghost, f"{pk!r}: pending entries not in the stream: {sorted(ghost)[:5]}"
            acked = ledger.group_acked.get(pk, set())
            back = pending_ids & acked
            assert not back, f"{pk!r}: acknowledged XACKs undone after restart: {sorted(back)[:5]}"
            lost = (delivered - ledger.ack_sent.get(pk, set())) - pending_ids
            assert not lost, f"{pk!r}: delivered, never acked, yet not pending: {sorted(lost)[:5]}"
            checked += len(pending_ids)
        return checked
    finally:
        conn.close()


# ------------------------------------------------------------- the loop


def setup(port: int, stream_key: bytes = b"s", topic_key: bytes = b"t", partitions: int = 3) -> Ledger:
    """A 1-partition stream and a multi-partition topic, each with group ``g``."""
    conn = Conn(port)
    try:
        assert conn.call(b"TOPIC", b"CREATE", topic_key, b"PARTITIONS", partitions) == b"OK"
        assert conn.call(b"XGROUP", b"CREATE", topic_key, GROUP, b"0") == b"OK"
        assert conn.call(b"XGROUP", b"CREATE", stream_key, GROUP, b"0", b"MKSTREAM") == b"OK"
    finally:
        conn.close()
    topic_parts = [topic_key + b"#%d" % i for i in range(partitions)]
    return Ledger(keys={stream_key: [stream_key], topic_key: topic_parts})


def run_round(ledger: Ledger, server, rng: random.Random, *, run_s: float) -> list[str]:
    """Load for ``run_s`` seconds, SIGKILL, restart, verify. Returns corrupt-read reports."""
    stop = threading.Event()
    threads: list[threading.Thread] = []
    keys = list(ledger.keys)
    for i in range(4):  # producers 0,1 on the stream, 2,3 on the topic
        threads.append(Producer(ledger, server.port, i, keys[i // 2], random.Random(rng.random()), stop))
    consumers = [Consumer(ledger, server.port, keys[0], b"c0", stop),
                 Consumer(ledger, server.port, keys[1], b"c1", stop),
                 Consumer(ledger, server.port, keys[1], b"c2", stop)]
    threads += consumers
    for t in threads:
        t.start()
    time.sleep(run_s)
    server.kill9()  # SIGKILL mid-traffic
    ledger.kills += 1
    stop.set()
    for t in threads:
        t.join(timeout=15)
        assert not t.is_alive(), f"{t.name} did not stop after the kill"
    server.start()
    ledger.entries_checked += verify(ledger, server.port)
    return [c for consumer in consumers for c in consumer.corrupt]
