"""Automatic failover under load: a 3-node cluster whose nodes reach each
other through proxies (tests/netproxy.py) runs acks=all producers (XADD, and
two librdkafka producers with acks=-1, one idempotent, on a 4-partition
topic through the nodes' Kafka ports) and consumer groups while the harness
kills (SIGKILL), pauses (SIGSTOP) and isolates nodes — leaders and
followers —, fails a leader's disk under one partition (fsync returns EIO,
tests/failing_fsync.py; the node is restarted once the shard moved, as after
replacing the disk) and moves leadership by hand. No one tells the cluster a node died or its disk failed: the
controller quorum notices, elects a new leader from the ISR, and gives
preferred leaders their shards back.

At the end, every acknowledged XADD must be on its partition's final leader
exactly once and in acknowledgement order, every acknowledged Kafka record
at the partition and offset its delivery report named (the idempotent
producer's records once within one producer epoch — copies librdkafka
re-sent after bumping its epoch are counted apart, see
faultkit.check_kafka —, the other's at least once: its duplicates are
counted), every replica's log byte-identical, and the consumer groups must
have gone on from where their acknowledged progress was: no acknowledged XACK undone (its entry is not
pending again) and every entry consumed and acknowledged once the faults
stop. The Kafka topic is also read by a consumer group on its topic key
(issue 31): two members call XREADGROUP on the group's coordinator (the
leader of the topic key's slot, killed and paused like any leader), which
has the partitions led elsewhere served over the cluster bus, and XACK on
the partition keys' leaders; the same checks hold for it, and no entry
goes to both members (neither is silent past its session timeout).

CI: about 30 s of faults. Soak: ``PARTITA_SOAK_SECONDS=600 pytest -m soak
tests/reliability/test_controller_faults.py -s``. Totals are printed and go
into the session summary.
"""

from __future__ import annotations

import os
import random
import re
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from tests.clusterkit import Cluster, eventually, partition_dir, partition_lines
from tests.reliability.faultkit import (KafkaLedger, Ledger, check_kafka, check_key, fault_seed, final_entries,
                                        kafka_producers, no_retry_client, produce, produce_kafka, soak_seconds)

CI_SECONDS = 30.0
KEYS = [b"c0", b"c1", b"c2", b"c3"]
# The Kafka producers' topic: its partitions' slots are led by all three nodes.
KAFKA_TOPIC = "orders"
KAFKA_KEYS = [b"orders#0", b"orders#1", b"orders#2", b"orders#3"]
GROUP = "g"
# The consumer group on the Kafka topic's key, and its members.
TOPIC_GROUP = "tg"
TOPIC_MEMBERS = ("m0", "m1")
SESSION_MS = 1500
# The faults drawn from (``PARTITA_FAULTS=fail_disk_leader,kill_leader``: only those, to chase one).
FAULTS = [name for name in os.environ.get("PARTITA_FAULTS", "").split(",") if name] or [
    "kill_leader", "pause_leader", "isolate_leader", "isolate_follower", "kill_follower", "pause_follower",
    "failover", "fail_disk_leader"]
RESULTS: list[str] = []


@dataclass
class GroupLedger(Ledger):
    xacked: dict[bytes, set[bytes]] = field(default_factory=dict)
    # XACKs sent whose reply did not come (the connection failed): they may have taken effect.
    xack_unknown: dict[bytes, set[bytes]] = field(default_factory=dict)
    undone: dict[bytes, list[bytes]] = field(default_factory=dict)  # acknowledged XACKs seen undone
    received: dict[bytes, set[bytes]] = field(default_factory=dict)
    xack_errors: list[str] = field(default_factory=list)
    failed_reads: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        self.xacked = {k: set() for k in self.keys}
        self.undone = {k: [] for k in self.keys}
        self.received = {k: set() for k in self.keys}
        self.xack_unknown = {k: set() for k in self.keys}


@dataclass
class TopicGroupLedger:
    """What the members of the topic key's group saw, by ``(partition key, ID)``."""
    delivered: dict[tuple[bytes, bytes], set[str]] = field(default_factory=dict)  # to which members
    # When each XACK's reply came (monotonic): an entry delivered by a read
    # sent after that was undone; one sent before may be the other member's
    # copy, read while the XACK was on its way.
    xacked: dict[tuple[bytes, bytes], float] = field(default_factory=dict)
    xack_unknown: set[tuple[bytes, bytes]] = field(default_factory=set)
    undone: list[tuple[bytes, bytes]] = field(default_factory=list)
    # To diagnose an undone XACK from the report alone: who acknowledged it,
    # when (wall clock, as in the node logs) and how many it found pending;
    # and the first reads that delivered acknowledged entries again.
    xack_by: dict[tuple[bytes, bytes], tuple[str, float, int]] = field(default_factory=dict)
    undone_reads: list[str] = field(default_factory=list)
    failed_reads: int = 0

    def note_undone(self, member: str, start: str, got: list[tuple[bytes, bytes]], sent: float) -> None:
        undone = [e for e in got if self.xacked.get(e, sent) < sent]
        self.undone.extend(undone)
        if undone and len(self.undone_reads) < 5:
            first = undone[0]
            by, at, count = self.xack_by.get(first, ("?", 0.0, -1))
            self.undone_reads.append(
                f"{len(undone)} delivered again to {member} (XREADGROUP {start}) at "
                f"{time.strftime('%H:%M:%S', time.gmtime())}, first {first}: its XACK answered "
                f"{count} by {by} at {time.strftime('%H:%M:%S', time.gmtime(at))}.{int(at * 1000) % 1000:03d}")


def _leader_client(cluster: Cluster, key: bytes) -> redis.Redis:
    return no_retry_client(cluster.leader_of(key), socket_timeout=5)


def _consume(cluster: Cluster, key: bytes, ledger: GroupLedger, stop: threading.Event) -> None:
    """One consumer of group ``g``: its own pending entries first (a reply
    lost to a fault leaves them there), then new ones; XACK each batch and
    record the IDs of every XACK the leader acknowledged."""
    client = None
    while not stop.is_set():
        try:
            if client is None:
                client = _leader_client(cluster, key)
            got = []
            for start in ("0", ">"):
                reply = client.xreadgroup(GROUP, "c", {key: start}, count=50, block=100 if start == ">" else None)
                got = [entry_id for _, entries in reply or [] for entry_id, _ in entries]
                # An entry whose XACK was acknowledged must never come back
                # (pending again, or delivered again as new).
                ledger.undone[key].extend(e for e in got if e in ledger.xacked[key])
                ledger.received[key].update(got)
                if got:
                    break
            if got:
                try:
                    client.xack(key, GROUP, *got)
                except (redis.ConnectionError, redis.TimeoutError, OSError):
                    ledger.xack_unknown[key].update(got)
                    raise
                except redis.ResponseError as e:
                    ledger.xack_errors.append(str(e)[:60])
                    raise
                ledger.xacked[key].update(got)
        except (redis.RedisError, OSError, StopIteration, AssertionError):
            ledger.failed_reads += 1
            client = None
            time.sleep(0.05)


def _consume_topic(cluster: Cluster, member: str, ledger: TopicGroupLedger, stop: threading.Event) -> None:
    """One member of group ``tg`` on the Kafka topic's key: its own pending
    entries first, then new ones, read through the group's coordinator (the
    leader of the topic key's slot; anything else answers -MOVED and the
    member finds it again), each batch acknowledged with XACK on the
    partition keys' leaders."""
    client = None
    while not stop.is_set():
        try:
            if client is None:
                client = _leader_client(cluster, KAFKA_TOPIC.encode())
            got = []
            for start in ("0", ">"):
                sent = time.monotonic()
                reply = client.xreadgroup(TOPIC_GROUP, member, {KAFKA_TOPIC: start}, count=50,
                                          block=100 if start == ">" else None)
                got = [(key, entry_id) for key, entries in reply or [] for entry_id, _ in entries]
                ledger.note_undone(member, start, got, sent)
                for e in got:
                    ledger.delivered.setdefault(e, set()).add(member)
                if got:
                    break
            for key in {key for key, _ in got}:
                ids = [entry_id for k, entry_id in got if k == key]
                leader = cluster.leader_of(key)
                try:
                    count = no_retry_client(leader, socket_timeout=5).xack(key, TOPIC_GROUP, *ids)
                except (redis.ConnectionError, redis.TimeoutError, OSError):
                    ledger.xack_unknown.update((key, i) for i in ids)
                    raise
                ledger.xacked.update(dict.fromkeys(((key, i) for i in ids), time.monotonic()))
                ledger.xack_by.update(dict.fromkeys(((key, i) for i in ids), (leader.data_dir.name, time.time(), count)))
        except (redis.RedisError, OSError):
            ledger.failed_reads += 1
            client = None
            time.sleep(0.05)


def _topic_group_done(cluster: Cluster, ledger: TopicGroupLedger) -> bool:
    """Every entry of the Kafka topic acknowledged (or its XACK's reply
    lost) and nothing pending, on each partition's leader."""
    for key in KAFKA_KEYS:
        client = cluster.leader_of(key).client()
        stored = {(key, entry_id) for entry_id, _ in client.xrange(key)}
        if not stored <= ledger.xacked.keys() | ledger.xack_unknown or client.xpending(key, TOPIC_GROUP)["pending"]:
            return False
    return True


def _check_topic_group(cluster: Cluster, ledger: TopicGroupLedger,
                       stored: dict[bytes, list[tuple[bytes, dict]]]) -> int:
    """The topic key's group, once the faults stopped and the members
    drained it: no acknowledged XACK undone, nothing pending, every stored
    entry consumed and acknowledged. Returns how many entries went to both
    members (none: see below)."""
    assert not ledger.undone, (f"topic group: {len(ledger.undone)} acknowledged XACKs undone, first "
                               f"{ledger.undone[:3]}; " + "; ".join(ledger.undone_reads))
    done = ledger.xacked.keys() | ledger.xack_unknown
    for key in KAFKA_KEYS:
        pending = cluster.leader_of(key).client().xpending_range(key, TOPIC_GROUP, "-", "+", 100000)
        assert not pending, f"topic group, {key!r}: {len(pending)} entries still pending after the drain"
        unconsumed = [entry_id for entry_id, _ in stored[key] if (key, entry_id) not in done]
        assert not unconsumed, (f"topic group, {key!r}: {len(unconsumed)} entries never consumed, first "
                                f"{unconsumed[:3]} (delivered: {[(key, u) in ledger.delivered for u in unconsumed[:3]]})")
    # A member's partitions (and its pending entries) pass to the other only
    # when its session expired, and no fault here silences a member that long
    # (the faults last at most 4 s; the session is the default 10 s).
    twice = sorted(e for e, members in ledger.delivered.items() if len(members) > 1)
    assert not twice, (f"topic group: {len(twice)} entries delivered to both members, first {twice[:3]}; "
                       f"expiries the coordinators logged: {_member_expiries(cluster)[:5]}")
    return len(twice)


def _member_expiries(cluster: Cluster) -> list[str]:
    """The coordinators' log lines of members that expired (every run of every node)."""
    found = []
    for node in cluster.nodes:
        text = node.log_path.read_text(errors="replace") if node.log_path.exists() else ""
        found += [f"{node.log_path.name}: {line}" for line in text.splitlines() if "expired (silent for" in line]
    return found


def _controller_view(node) -> dict[str, str]:
    info = node.client(socket_timeout=5).execute_command("INFO", "replication")
    return {k: v for k, v in info.items() if str(k).startswith("controller")}


def _wait_view(cluster: Cluster, good, what: str, timeout_s: float = 30.0) -> None:
    """Poll the controller's view (``good(view, shards)``) until it holds."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            view = _controller_view(cluster.alive())
            last = view
            shards = [v for k, v in view.items() if re.match(r"controller_shard\d+$", k)]
            if shards and good(view, shards):
                return
        except (redis.RedisError, OSError):
            pass
        time.sleep(0.1)
    raise AssertionError(f"{what}: {last}")


def _wait_healthy(cluster: Cluster) -> None:
    """No node fenced and every shard's ISR complete, as the controller sees it."""
    _wait_view(cluster, lambda view, shards: view.get("controller_fenced") == "-"
               and all(len(str(s["isr"]).split("/")) == 3 for s in shards),
               "the cluster did not become healthy")


def _wait_preferred_leaders(cluster: Cluster) -> None:
    """Every shard led by its preferred leader: the controller's rebalance
    after the last restart is done, and nothing moves while the final
    checks read the leaders."""
    _wait_view(cluster, lambda view, shards: all(str(s["leader"]) == str(s["replicas"]).split("/")[0]
                                                 for s in shards),
               "the preferred leaders did not take their shards back")


def _epochs(cluster: Cluster) -> int:
    view = _controller_view(cluster.alive())
    return sum(int(v["epoch"]) for k, v in view.items() if re.match(r"controller_shard\d+$", k))


def _fault(cluster: Cluster, rng: random.Random, ledger: GroupLedger) -> None:
    key = rng.choice(KEYS + KAFKA_KEYS)
    action = rng.choice(FAULTS)
    leader = cluster.leader_of(key)
    followers = [n for n in cluster.nodes if n is not leader]
    if action == "fail_disk_leader":
        # The next once-a-second fsync of the key's files on the leader fails:
        # the log goes offline, the leader's heartbeat reports the shard and
        # the controller moves it to an in-sync follower.
        trigger = leader.data_dir.with_name(leader.data_dir.name + ".fail-fsync")
        trigger.write_text(f"/{partition_dir(key)}/")
        try:
            deadline = time.monotonic() + 30
            while cluster.leader_of(key) is leader:
                assert time.monotonic() < deadline, f"{key!r}: the shard never left the failing disk"
                time.sleep(0.1)
        finally:
            trigger.unlink()
        code = leader.terminate()  # the disk replaced: a restart reopens and recovers the log
        assert code == 0, f"the node with the failed disk exited with {code}:\n{leader.log()[-4000:]}"
        leader.start()
    elif action == "kill_leader":
        leader.kill9()
        time.sleep(rng.uniform(0.3, 4.0))
        leader.start()
    elif action in ("pause_leader", "pause_follower"):
        victim = leader if action == "pause_leader" else rng.choice(followers)
        victim.proc.send_signal(signal.SIGSTOP)
        time.sleep(rng.uniform(0.3, 4.0))  # past the session timeout or not
        victim.proc.send_signal(signal.SIGCONT)
    elif action in ("isolate_leader", "isolate_follower"):
        victim = leader if action == "isolate_leader" else rng.choice(followers)
        cluster.isolate(victim)
        time.sleep(rng.uniform(0.5, 4.0))
        cluster.heal(victim)
    elif action == "kill_follower":
        victim = rng.choice(followers)
        victim.kill9()
        time.sleep(rng.uniform(0.1, 1.0))
        victim.start()
    else:
        try:
            rng.choice(followers).client(socket_timeout=20).execute_command("CLUSTER", "FAILOVER")
        except redis.ResponseError as e:  # e.g. it could not catch up in time: the old leader goes on
            ledger.count(f"failover refused ({str(e)[:40]})")
            return
    ledger.count(action)
    _wait_healthy(cluster)


def _check(cluster: Cluster, ledger: GroupLedger) -> tuple[int, int]:
    checked = xacks = 0
    for key in KEYS:
        stored = check_key(cluster, key, ledger.acked[key])
        client = cluster.leader_of(key).client()
        # Consumer groups: no acknowledged XACK was undone (checked as the
        # consumers read), and with the faults over every stored entry was
        # consumed and acknowledged (or its XACK was sent and its reply lost:
        # then it must not be pending either).
        undone = ledger.undone[key]
        assert not undone, f"{key!r}: {len(undone)} acknowledged XACKs undone, first {undone[:3]}"
        pending = client.xpending_range(key, GROUP, "-", "+", 100000)
        assert not pending, f"{key!r}: {len(pending)} entries still pending after the drain"
        done = ledger.xacked[key] | ledger.xack_unknown[key]
        unconsumed = [s for s in stored if s not in done]
        if unconsumed:
            raise AssertionError(f"{key!r}: {len(unconsumed)} entries never consumed, first {unconsumed[:3]} "
                                 f"(received: {[u in ledger.received[key] for u in unconsumed[:3]]}, "
                                 f"acked XADDs: {[u in ledger.acked[key] for u in unconsumed[:3]]}, "
                                 f"XACK errors: {ledger.xack_errors[:5]}); "
                                 f"on the leader: {client.xinfo_groups(key)}, "
                                 f"replicas: {[partition_lines_for(n, key) for n in cluster.nodes]}")
        checked += len(stored)
        xacks += len(ledger.xacked[key])
    return checked, xacks


def _kafka_partitions(cluster: Cluster) -> tuple[dict[bytes, list[tuple[bytes, dict]]],
                                                  dict[bytes, dict[int, tuple[int, int]]]]:
    """Each partition's entries on its final leader, position n holding
    offset n, and the (producer id, epoch) of each idempotent producer's
    entry there (``kafka_producers``; every replica's log is the same)."""
    stored, producers = {}, {}
    for key in KAFKA_KEYS:
        stored[key] = final_entries(cluster, key)
        added = cluster.on_leader(key, lambda client: client.xinfo_stream(key))["entries-added"]  # noqa: B023
        assert added == len(stored[key]), f"{key!r}: offsets with no entry: {added} added, {len(stored[key])} stored"
        producers[key] = kafka_producers(cluster.log_bytes(cluster.nodes[0], key.decode()))
    return stored, producers


def partition_lines_for(node, key: bytes) -> dict:
    return partition_lines(node).get(key.decode(), {})


def _drain(cluster: Cluster, ledger: GroupLedger, topic_ledger: TopicGroupLedger, timeout_s: float = 60.0) -> None:
    """With the producers stopped, wait until the consumers have acknowledged every stored entry."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            clients = {k: cluster.leader_of(k).client() for k in KEYS}
            if all(set(e for e, _ in clients[k].xrange(k)) <= ledger.xacked[k] | ledger.xack_unknown[k]
                   and clients[k].xpending(k, GROUP)["pending"] == 0 for k in KEYS) \
                    and _topic_group_done(cluster, topic_ledger):
                return
        except (redis.RedisError, OSError):
            pass
        time.sleep(0.2)


def _run(tmp_path, seconds: float, seed: int) -> str:
    rng = random.Random(seed)
    cluster = Cluster(tmp_path, extra=["--min-insync-replicas", "2",
                                       "--controller-session-timeout-ms", str(SESSION_MS),
                                       "--leader-rebalance-delay-ms", "2000"], proxied=True, kafka=True,
                      launcher=[sys.executable, str(Path(__file__).resolve().parents[1] / "failing_fsync.py")])
    ledger = GroupLedger(KEYS)
    topic_ledger = TopicGroupLedger()
    kafka = [KafkaLedger(KAFKA_KEYS, tag=b"i", idempotent=True), KafkaLedger(KAFKA_KEYS, tag=b"n")]
    stop_producers, stop_consumers = threading.Event(), threading.Event()
    try:
        _wait_healthy(cluster)
        for key in KEYS:
            _leader_client(cluster, key).xgroup_create(key, GROUP, id="0", mkstream=True)
        _leader_client(cluster, KAFKA_TOPIC.encode()).execute_command(
            "TOPIC", "CREATE", KAFKA_TOPIC, "PARTITIONS", len(KAFKA_KEYS))
        # On the topic key: every partition's leader creates it (retried while
        # a partition is still being placed).
        eventually(lambda: _leader_client(cluster, KAFKA_TOPIC.encode()).xgroup_create(KAFKA_TOPIC, TOPIC_GROUP, id="0"),
                   what="XGROUP CREATE on the topic key")
        _wait_preferred_leaders(cluster)
        assert len({cluster.leader_of(k).port for k in KAFKA_KEYS}) == 3  # every node leads a partition
        epochs_before = _epochs(cluster)
        producers = ([threading.Thread(target=produce, args=(cluster, k, ledger, stop_producers)) for k in KEYS]
                     + [threading.Thread(target=produce_kafka, args=(cluster, KAFKA_TOPIC, k, stop_producers))
                        for k in kafka])
        threads = (producers
                   + [threading.Thread(target=_consume, args=(cluster, k, ledger, stop_consumers)) for k in KEYS]
                   + [threading.Thread(target=_consume_topic, args=(cluster, m, topic_ledger, stop_consumers))
                      for m in TOPIC_MEMBERS])
        for t in threads:
            t.start()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            _fault(cluster, rng, ledger)
        stop_producers.set()
        for t in producers:
            t.join(120)  # a Kafka producer flushes what it has queued first
        _drain(cluster, ledger, topic_ledger)
        stop_consumers.set()
        for t in threads:
            t.join(30)
        for node in cluster.nodes:
            assert node.proc.poll() is None, f"a node died:\n{node.log()[-3000:]}"
        _wait_healthy(cluster)
        _wait_preferred_leaders(cluster)
        leader_changes = _epochs(cluster) - epochs_before
        checked, xacks = _check(cluster, ledger)
        kafka_stored, kafka_producers_of = _kafka_partitions(cluster)
        kafka_checked = [check_kafka(k, kafka_stored, kafka_producers_of) for k in kafka]
        handed_over = _check_topic_group(cluster, topic_ledger, kafka_stored)
    finally:
        stop_producers.set()
        stop_consumers.set()
        cluster.stop()
    # The injected EIO is logged where it happens (the failed fsync, the log
    # taken offline); anything else is a bug.
    unexpected = [line for line in cluster.unexpected_log_lines() if "Input/output error" not in line]
    assert not unexpected, unexpected[:5]
    acked = sum(map(len, ledger.acked.values()))
    faults = ledger.fault_summary()
    line = (f"controller faults (seed {seed}, {seconds:.0f}s): {faults}; {leader_changes} leader changes; "
            f"{acked} acknowledged XADDs, {checked} entries checked on final leaders, "
            f"{xacks} entries consumed and acknowledged; {ledger.failed_writes} failed writes and "
            f"{ledger.failed_reads} failed reads retried; "
            f"topic-key group: {len(topic_ledger.xacked)} entries consumed and acknowledged by "
            f"{len(TOPIC_MEMBERS)} members, {handed_over} handed from one to the other, "
            f"{topic_ledger.failed_reads} failed reads retried; "
            + "; ".join(f"Kafka acks=-1 {'idempotent' if k.idempotent else 'non-idempotent'}: "
                        f"{sum(map(len, k.acked.values()))} acknowledged, {checked_k} checked at their offsets "
                        f"({sum(o.count(-1) for o in k.offsets.values())} reported with no offset: found by value), "
                        f"{dups} duplicates"
                        + (f" ({across} re-sent under a new producer epoch)" if k.idempotent else "")
                        + f", {k.failed_writes} failed deliveries, "
                        f"{k.request_errors} failed requests and {k.retries} retried (librdkafka statistics)"
                        for k, (checked_k, dups, across) in zip(kafka, kafka_checked)))
    print(line)
    RESULTS.append(line)
    assert acked > 100 and leader_changes > 0
    assert all(sum(map(len, k.acked.values())) > 100 for k in kafka)
    return line


def test_automatic_failover_survives_faults_under_load(tmp_path):
    _run(tmp_path, CI_SECONDS, fault_seed())


@pytest.mark.soak
def test_automatic_failover_soak(tmp_path):
    _run(tmp_path, soak_seconds(), fault_seed())
