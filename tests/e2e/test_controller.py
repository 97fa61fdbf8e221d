"""The controller quorum end to end, real processes on loopback: automatic
failover after kill -9, a preferred leader taking its shard back, unclean
election off by default and on when configured, an isolated leader that
can acknowledge nothing while the others elect a new one, a forced failover
racing the controller's own election."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest
import redis

from storage.log_manager import encode_topic
from tests.clusterkit import Cluster, eventually as _eventually, key_in_shard, partition_dir, partition_lines, running


def _info(node) -> dict:
    return node.client(socket_timeout=5).execute_command("INFO", "replication")


def _key_led_by(cluster: Cluster, node) -> bytes:
    for i in range(1000):
        key = f"k{i}".encode()
        if cluster.leader_of(key) is node:
            return key
    raise AssertionError("no key led by that node")


@pytest.fixture
def cluster(tmp_path):
    yield from running(tmp_path, extra=["--controller-session-timeout-ms", "1500",
                                        "--leader-rebalance-delay-ms", "1000"])


def test_a_killed_leader_is_replaced_without_anyone_acting_and_takes_its_shard_back(cluster):
    _eventually(lambda: _info(cluster.nodes[0]).get("controller_metadata") == "ready", what="metadata ready")
    cluster.wait_leading()  # the preferred leaders: no shard moves back under the writes below
    key = b"auto"
    old = cluster.leader_of(key)
    client = old.client()
    acked = [client.xadd(key, {"n": i}) for i in range(200)]
    old.kill9()
    started = time.monotonic()
    new = _eventually(lambda: (lambda n: n if n is not old else None)(cluster.leader_of(key)),
                      what="a new leader")
    took = time.monotonic() - started
    assert took < 15, took
    fresh = new.client()
    # Every acknowledged entry, once the new leader's high watermark has
    # passed them (it trails by one fetch round of the remaining follower).
    _eventually(lambda: [entry_id for entry_id, _ in fresh.xrange(key)] == acked, what="acknowledged entries")
    acked.append(fresh.xadd(key, {"n": "after"}))
    # The dead node is flagged, its link down (Redis's link-state field);
    # its slots are served by the new leader.
    nodes = new.client().execute_command("CLUSTER", "NODES").decode()
    (dead,) = [line.split() for line in nodes.splitlines()
               if line.split()[1].endswith(f":{old.port}@{old.bus_port}")]
    assert dead[2:] == ["master,fail", "-", "0", "0", dead[6], "disconnected"]
    assert b"cluster_state:ok" in new.client().execute_command("CLUSTER", "INFO")
    assert _info(new)["controller_fenced"] == cluster.nodes.index(old) + 1
    # It comes back, catches up, and takes its shard back (the preferred leader).
    old.start()
    _eventually(lambda: cluster.leader_of(key) is old, timeout_s=30, what="the preferred leader back")
    cluster.wait_converged(key.decode())
    assert [entry_id for entry_id, _ in old.client().xrange(key)] == acked
    assert len({cluster.log_bytes(n, key.decode()) for n in cluster.nodes}) == 1
    assert _info(cluster.nodes[0])["controller_fenced"] == "-"


def _failing_disk_cluster(tmp_path) -> Cluster:
    """Three nodes whose disks fail on demand (tests/failing_fsync.py: write
    a path fragment into ``<node dir>.fail-fsync``), metadata ready and each
    node leading its own shard (a node that started late may have lost its
    shard for a while, and takes it back after the rebalance delay: a key's
    leader looked up before that is not its leader for long)."""
    launcher = [sys.executable, str(Path(__file__).resolve().parents[1] / "failing_fsync.py")]
    cluster = Cluster(tmp_path, extra=["--controller-session-timeout-ms", "1500",
                                       "--leader-rebalance-delay-ms", "1000"], launcher=launcher)
    try:
        _eventually(lambda: _info(cluster.nodes[0]).get("controller_metadata") == "ready", what="metadata ready")
        cluster.wait_leading()
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _fail_fsyncs(node, fragment: str) -> Path:
    """From now on ``node``'s fsyncs of files whose path contains
    ``fragment`` fail with EIO (tests/failing_fsync.py); the trigger file,
    to unlink when the disk is sound again."""
    trigger = node.data_dir.with_name(node.data_dir.name + ".fail-fsync")
    trigger.write_text(fragment)
    return trigger


def _back_on_a_sound_disk(cluster: Cluster, node, trigger: Path, key: bytes, acked: list) -> None:
    """``node`` (stopped) starts again with its disk sound: it recovers what
    it persisted, catches up and takes its shard back (the preferred
    leader), with every acknowledged entry."""
    trigger.unlink()
    node.start()
    cluster.wait_ready()
    _eventually(lambda: cluster.leader_of(key) is node, timeout_s=30, what="the preferred leader back")
    cluster.wait_converged(key.decode())
    assert [entry_id for entry_id, _ in node.client().xrange(key)] == acked


def test_a_leader_whose_disk_fails_an_fsync_hands_its_shard_to_an_in_sync_follower(tmp_path):
    """A failed fsync (EIO from a disk failing on demand, tests/failing_fsync.py)
    takes the leader's log of the partition offline: its XADDs are refused
    with -MISCONF, its heartbeat reports the shard, and the controller moves
    the shard to an in-sync follower, which takes the writes with every
    acknowledged entry (acks=all). The old leader keeps running and serving
    its other shards; once restarted on a sound disk it catches up and takes
    its shard back."""
    cluster = _failing_disk_cluster(tmp_path)
    try:
        key = b"disk"
        old = cluster.leader_of(key)
        client = old.client()
        acked = [client.xadd(key, {"n": i}) for i in range(50)]
        cluster.wait_converged(key.decode())
        trigger = _fail_fsyncs(old, f"/{encode_topic(key)}/")
        refusals = []

        def moved():
            try:
                acked.append(client.xadd(key, {"n": "more"}))  # acks=all: on the followers too
            except redis.ResponseError as e:
                refusals.append(f"{type(e).__name__}: {e}")
            leader = cluster.leader_of(key)
            return leader if leader is not old else None

        new = _eventually(moved, what="the shard moved off the failing disk")
        # Refused while offline (-MISCONF, for the few hundred milliseconds
        # until the move: never an acknowledgement), then redirected.
        assert refusals and all("Errors writing to the partition log: Input/output error" in r
                                or r.startswith("MovedError") for r in refusals), refusals
        assert "offline for writes after a failed fsync" in old.log()
        assert old.client().execute_command("INFO", "persistence")["aof_last_write_status"] == "err"
        # INFO replication names the shard on the old leader only.
        slot = new.client().execute_command("CLUSTER", "KEYSLOT", key)
        info = _info(old)
        ranges = {s: [int(x) for x in info[f"shard{s}"]["slots"].split("-")] for s in range(3)}
        shard = next(s for s, (first, last) in ranges.items() if first <= slot <= last)
        assert str(info["offline_shards"]) == str(shard)
        assert _info(new)["offline_shards"] == "-"
        assert "Traceback" not in old.log()
        fresh = new.client()
        acked.append(fresh.xadd(key, {"n": "on the new leader"}))
        _eventually(lambda: [entry_id for entry_id, _ in fresh.xrange(key)] == acked, what="acknowledged entries")
        with pytest.raises(redis.exceptions.MovedError):
            client.xadd(key, {"n": "to the old leader"})
        # The old leader is not fenced: it goes on heartbeating and following
        # the other shards (its copies of their partitions stay identical).
        assert _info(new)["controller_fenced"] == "-"
        other = next(k for k in (f"o{i}".encode() for i in range(1000))
                     if cluster.leader_of(k) not in (old, new))
        cluster.leader_of(other).client().xadd(other, {"n": "replicated to the old leader too"})
        cluster.wait_converged(other.decode())
        # Restarted on a sound disk: it recovers the log, catches up and leads again.
        assert old.terminate() == 0
        _back_on_a_sound_disk(cluster, old, trigger, key, acked)
    finally:
        cluster.stop()


def test_a_disk_that_fails_the_group_journal_first_still_moves_the_shard_at_the_next_append(tmp_path):
    """The disk under a partition starts failing while only its consumer
    group is written (XREADGROUP, XACK: the group journal's sync fails, and
    every rewrite of it after). The partition's next appends still reach
    the once-a-second fsync, which fails: the log goes offline and the
    controller moves the shard, as when the log's own sync fails first
    (the failing group journal used to keep the log from ever being synced,
    so the shard stayed on the failing disk with its writes unsynced)."""
    cluster = _failing_disk_cluster(tmp_path)
    try:
        key = b"disk"
        old = cluster.leader_of(key)
        client = old.client()
        acked = [client.xadd(key, {"n": i}) for i in range(20)]
        client.xgroup_create(key, "g", id="0")
        cluster.wait_converged(key.decode())
        # The log's entries synced (its recovery point checkpointed at its end): nothing left to sync.
        checkpoint = old.data_dir / "topics" / partition_dir(key) / "recovery-point.checkpoint"
        _eventually(lambda: checkpoint.read_bytes().endswith(b"\n20\n"), what="the log synced")
        trigger = _fail_fsyncs(old, f"/{encode_topic(key)}/")

        def group_journal_failed() -> bool:
            for entry_id, _ in client.xreadgroup("g", "c", {key: ">"}, count=1)[0][1]:
                client.xack(key, "g", entry_id)
            return "fsync of the group journal failed" in old.log()

        _eventually(group_journal_failed, what="the group journal's failed sync")
        assert "offline for writes" not in old.log()  # (the log had nothing to sync)

        def moved():
            try:
                acked.append(client.xadd(key, {"n": "more"}))
            except redis.ResponseError:
                pass  # -MISCONF while offline, then -MOVED
            return cluster.leader_of(key) is not old

        _eventually(moved, what="the shard moved off the failing disk")
        assert "offline for writes after a failed fsync" in old.log()
        assert old.terminate() == 0
        _back_on_a_sound_disk(cluster, old, trigger, key, acked)
    finally:
        cluster.stop()


def test_a_leader_whose_disk_fails_its_leader_epoch_checkpoint_hands_its_shard_over(tmp_path):
    """A new leader checkpoints its epoch before its first append; a disk
    that fails that fsync (EIO, only on ``leader-epoch.checkpoint``) takes
    the log offline as a failed segment fsync does (docs/guarantees.md), so
    the controller moves the shard to an in-sync follower instead of the
    leader refusing every write while it keeps the shard."""
    cluster = _failing_disk_cluster(tmp_path)
    try:
        failing = cluster.nodes[1]
        key = key_in_shard(cluster, 1)  # node 2 its preferred leader, leading it once every node is in
        _eventually(lambda: cluster.leader_of(key) is failing, what="node 2 leading shard 1")
        acked = [failing.client().xadd(key, {"n": i}) for i in range(20)]
        cluster.wait_converged(key.decode())
        trigger = _fail_fsyncs(failing, f"/{partition_dir(key)}/leader-epoch.checkpoint")
        # Leadership away and back (manual failovers stick, so a second one
        # brings it back): a new epoch on the failing disk.
        other = next(n for n in cluster.nodes if n is not failing)
        other.client(socket_timeout=20).execute_command("CLUSTER", "FAILOVER")
        _eventually(lambda: cluster.leader_of(key) is other, what="the failover")
        failing.client(socket_timeout=20).execute_command("CLUSTER", "FAILOVER")
        _eventually(lambda: cluster.leader_of(key) is failing, timeout_s=30, what="the failover back")

        def moved():
            leader = cluster.leader_of(key)
            try:
                acked.append(leader.client().xadd(key, {"n": "more"}))
            except redis.ResponseError:
                pass  # refused (or moved) while the failing leader holds it
            return leader if leader is not failing and "offline for writes after a failed fsync" in failing.log() \
                else None

        new = _eventually(moved, timeout_s=30, what="the shard moved off the failing disk")
        assert "Traceback" not in failing.log()
        fresh = new.client()
        acked.append(fresh.xadd(key, {"n": "on the new leader"}))
        _eventually(lambda: [entry_id for entry_id, _ in fresh.xrange(key)] == acked, what="acknowledged entries")
        assert failing.terminate() == 0
        _back_on_a_sound_disk(cluster, failing, trigger, key, acked)
    finally:
        cluster.stop()


def test_a_node_that_cannot_write_its_controller_state_stops_and_the_others_go_on(tmp_path):
    """Raft's promise is to persist before sending or applying: a node whose
    controller store fails an fsync (EIO, tests/failing_fsync.py) must not
    vote or acknowledge again. It logs why and exits with code 1; the others
    fence it and move its shard, with every acknowledged entry; restarted on
    a sound disk it recovers what it had persisted and leads again."""
    cluster = _failing_disk_cluster(tmp_path)
    try:
        victim = cluster.nodes[1]
        key = key_in_shard(cluster, 1)  # node 2 its preferred leader, leading it once every node is in
        _eventually(lambda: cluster.leader_of(key) is victim, what="node 2 leading shard 1")
        acked = [victim.client().xadd(key, {"n": i}) for i in range(20)]
        cluster.wait_converged(key.decode())
        trigger = _fail_fsyncs(victim, "/controller/")
        # A metadata change: every node appends (and must persist) its record.
        topic = b"made-while-failing"
        _eventually(lambda: cluster.leader_of(topic).client().execute_command("TOPIC", "CREATE", topic) == b"OK",
                    what="a topic created")
        assert victim.proc.wait(timeout=20) == 1
        log_text = victim.log()
        assert "Fatal: the controller state in" in log_text and "Input/output error" in log_text, log_text[-2000:]
        assert "Traceback" not in log_text
        new = _eventually(lambda: (lambda n: n if n is not victim else None)(cluster.leader_of(key)),
                          what="a new leader")
        fresh = new.client()
        _eventually(lambda: [entry_id for entry_id, _ in fresh.xrange(key)] == acked, what="acknowledged entries")
        acked.append(fresh.xadd(key, {"n": "after"}))
        _back_on_a_sound_disk(cluster, victim, trigger, key, acked)
    finally:
        cluster.stop()


def test_a_topic_a_node_cannot_create_does_not_stop_the_metadata_after_it(tmp_path):
    """Every node applies a committed TOPIC CREATE (and takes the topic from
    its leader's fetches, whichever comes first). One whose disk refuses
    that topic's files (EIO) logs it and goes on applying the records after
    it, asks again once a second (not in a busy loop), and takes the topic
    once the disk recovers."""
    cluster = _failing_disk_cluster(tmp_path)
    try:
        refused, after = b"refused-here", b"made-after"
        victim = next(n for n in cluster.nodes if n is not cluster.leader_of(refused))
        trigger = _fail_fsyncs(victim, f"/{encode_topic(refused)}/")
        for topic in (refused, after):
            _eventually(lambda t=topic: cluster.leader_of(t).client().execute_command("TOPIC", "CREATE", t) == b"OK",
                        what=f"{topic!r} created")
        topics = victim.data_dir / "topics"
        _eventually(lambda: (topics / encode_topic(after) / "topic.meta").exists(), what="the later topic applied")
        # The metadata log went on past the record it could not apply.
        _eventually(lambda: _info(victim)["controller_applied"] == max(_info(n)["controller_applied"]
                                                                       for n in cluster.nodes),
                    what="the victim's metadata caught up")
        assert not (topics / encode_topic(refused) / "topic.meta").exists()
        _eventually(lambda: "applying topic 'refused-here' from the metadata log failed" in victim.log()
                    and "refused-here: fetched topic not applied" in victim.log(), what="both refusals logged")
        time.sleep(1.5)
        assert victim.log().count("Input/output error") <= 16, victim.log()[-3000:]  # retried once a second
        trigger.unlink()
        _eventually(lambda: (topics / encode_topic(refused) / "topic.meta").exists(), what="the topic taken again")
        cluster.leader_of(refused).client().xadd(refused, {"n": "1"})
        cluster.wait_converged(refused.decode())  # the victim's copy too
        assert len({cluster.log_bytes(n, refused.decode()) for n in cluster.nodes}) == 1
        assert "Traceback" not in victim.log()
    finally:
        cluster.stop()


def test_unclean_leader_election_is_off_by_default_and_can_be_turned_on(tmp_path):
    # Two replicas per shard and one controller voter (node 1; nodes 2 and 3
    # are learners), so a shard can be left with no live in-sync replica.
    cluster = Cluster(tmp_path, extra=["--replication-factor", "2", "--controller-nodes", "1",
                                       "--controller-session-timeout-ms", "1000"])
    try:
        n1, n2, n3 = cluster.nodes
        _eventually(lambda: _info(n1).get("controller_metadata") == "ready", what="metadata ready")
        assert _info(n2)["controller_voters"] == 1
        key = key_in_shard(cluster, 1)  # shard 1: replicas 2, 3
        _eventually(lambda: cluster.leader_of(key) is n2, what="node 2 leading shard 1")
        n3.proc.send_signal(signal.SIGSTOP)
        _eventually(lambda: str(_info(n1)["controller_fenced"]) == "3", what="node 3 fenced")
        lost = [n2.client().xadd(key, {"n": i}) for i in range(50)]  # on node 2 alone (ISR {2})
        n2.kill9()
        n3.proc.send_signal(signal.SIGCONT)
        _eventually(lambda: str(_info(n1)["controller_fenced"]) == "2", what="node 2 fenced")
        time.sleep(2)  # the controller would have elected node 3 by now, were it allowed to
        assert cluster.leader_of(key) is n2
        assert b"cluster_state:fail" in n1.client().execute_command("CLUSTER", "INFO")
        with pytest.raises(redis.exceptions.MovedError):
            n3.client().xadd(key, {"n": "refused"})
        # Allowed: node 3 leads with what it has (nothing of the 50 entries).
        assert n1.client().config_set("unclean-leader-election", "yes")
        _eventually(lambda: cluster.leader_of(key) is n3, what="unclean election of node 3")
        assert n3.client().xlen(key) == 0
        after = n3.client().xadd(key, {"n": "after"})
        # The old leader returns, truncates its 50 entries and follows.
        n2.start()
        _eventually(lambda: partition_lines(n2).get(key.decode(), {}).get("role") == "follower",
                    what="node 2 following")
        _eventually(lambda: partition_lines(n2)[key.decode()]["end_offset"] == "1", what="node 2 truncated")
        assert [entry_id for entry_id, _ in n3.client().xrange(key)] == [after]
        assert not set(lost) & {entry_id for entry_id, _ in n3.client().xrange(key)}
    finally:
        cluster.stop()


def test_an_isolated_leader_acknowledges_nothing_while_the_others_elect_a_new_one(tmp_path):
    cluster = Cluster(tmp_path, extra=["--min-insync-replicas", "2", "--controller-session-timeout-ms", "1500",
                                       "--leader-rebalance-delay-ms", "-1"], proxied=True)
    try:
        _eventually(lambda: _info(cluster.nodes[0]).get("controller_metadata") == "ready", what="metadata ready")
        key = b"island"
        old = cluster.leader_of(key)
        acked = [old.client().xadd(key, {"n": i}) for i in range(20)]
        others = [n for n in cluster.nodes if n is not old]
        cluster.isolate(old)
        # Nothing written to the isolated leader is acknowledged: its followers
        # cannot fetch and its ISR shrink cannot be committed.
        with pytest.raises((redis.ConnectionError, redis.TimeoutError, redis.ResponseError)):
            old.client(socket_timeout=4).xadd(key, {"n": "island"})
        new = _eventually(lambda: (lambda n: n if n is not old else None)(
            cluster.node_at(_slot_leader_port(others[0], key))), what="a new leader")
        assert new in others
        acked.append(new.client().xadd(key, {"n": "mainland"}))
        cluster.heal(old)
        # The old leader learns the new epoch, drops what it alone had, follows.
        _eventually(lambda: partition_lines(old)[key.decode()]["role"] == "follower", what="old leader follows")
        cluster.wait_converged(key.decode())
        assert [entry_id for entry_id, _ in new.client().xrange(key)] == acked
        assert len({cluster.log_bytes(n, key.decode()) for n in cluster.nodes}) == 1
    finally:
        cluster.stop()


def _slot_leader_port(node, key: bytes) -> int:
    client = node.client(socket_timeout=5)
    slot = client.execute_command("CLUSTER", "KEYSLOT", key)
    for first, last, leader, *_ in client.execute_command("CLUSTER", "SLOTS"):
        if first <= slot <= last:
            return leader[1]
    raise AssertionError(slot)


def test_cluster_reassign_moves_a_shard_to_other_replicas_with_its_data(tmp_path):
    cluster = Cluster(tmp_path, extra=["--replication-factor", "2", "--controller-session-timeout-ms", "1500"])
    try:
        n1, n2, n3 = cluster.nodes
        key = key_in_shard(cluster, 0)  # shard 0: replicas 1, 2
        # Node 1, its preferred leader, leads it once every node is in (a
        # node that started late was fenced and may have lost its shards for
        # a while: then node 1 may lead shard 2 instead).
        _eventually(lambda: cluster.leader_of(key) is n1, what="node 1 leading shard 0")
        client = n1.client()
        acked = [client.xadd(key, {"n": i}) for i in range(300)]
        client.xgroup_create(key, "g", id="0")
        client.xreadgroup("g", "c", {key: ">"}, count=10)
        slot = n3.client().execute_command("CLUSTER", "KEYSLOT", key)
        with pytest.raises(redis.ResponseError, match="unknown node id 9"):
            n2.client().execute_command("CLUSTER", "REASSIGN", slot, 3, 9)
        # Move shard 0 to nodes 3 and 2, node 3 preferred: node 3 copies the
        # data by fetching, then leads; node 1 drops its copy.
        assert n2.client().execute_command("CLUSTER", "REASSIGN", slot, 3, 2) == b"OK"
        _eventually(lambda: cluster.leader_of(key) is n3, timeout_s=30, what="node 3 leading")
        _eventually(lambda: "target" not in str(_info(n1)["controller_shard0"]), timeout_s=30,
                    what="the reassignment finished")
        # Node 2 applies the committed metadata on its own time, after node 1 may.
        _eventually(lambda: _info(n2)["controller_shard0"]["replicas"] == "3/2", timeout_s=30,
                    what="node 2 applying the new replicas")
        assert [entry_id for entry_id, _ in n3.client().xrange(key)] == acked
        assert n3.client().xpending(key, "g")["pending"] == 10  # the group moved with it
        acked.append(n3.client().xadd(key, {"n": "after"}))
        cluster.wait_converged_on([n2, n3], key.decode())
        assert cluster.log_bytes(n2, key.decode()) == cluster.log_bytes(n3, key.decode())
        _eventually(lambda: key.decode() not in partition_lines(n1), what="node 1 dropping its copy")
        with pytest.raises(redis.exceptions.MovedError):
            n1.client().xadd(key, {"n": "moved"})
    finally:
        cluster.stop()
    assert not cluster.unexpected_log_lines(), cluster.unexpected_log_lines()[:5]


def test_a_new_node_joins_the_running_cluster_and_takes_a_shard(tmp_path):
    cluster = Cluster(tmp_path, extra=["--replication-factor", "2", "--controller-session-timeout-ms", "1500"])
    try:
        n1, n2, n3 = cluster.nodes
        key = key_in_shard(cluster, 0)  # shard 0: replicas 1, 2 (as in the reassign test above)
        _eventually(lambda: cluster.leader_of(key) is n1, what="node 1 leading shard 0")
        acked = [n1.client().xadd(key, {"n": i}) for i in range(200)]
        n4 = cluster.join_node(tmp_path, extra=["--replication-factor", "2",
                                                "--controller-session-timeout-ms", "1500"])
        # Every node knows it; it holds no slot yet.
        _eventually(lambda: all(len(n.client().execute_command("CLUSTER", "NODES").decode().splitlines()) == 4
                                for n in cluster.nodes), what="four nodes everywhere")
        assert _info(n4)["controller_role"] == "follower"
        assert all(n4.port != e[2][1] for e in n4.client().execute_command("CLUSTER", "SLOTS"))
        slot = n1.client().execute_command("CLUSTER", "KEYSLOT", key)
        assert n1.client().execute_command("CLUSTER", "REASSIGN", slot, 4, 1) == b"OK"
        _eventually(lambda: cluster.leader_of(key) is n4, timeout_s=30, what="node 4 leading")
        assert [entry_id for entry_id, _ in n4.client().xrange(key)] == acked
        acked.append(n4.client().xadd(key, {"n": "on node 4"}))
        # A restarted node of the first three still knows node 4 (from the metadata log).
        assert n2.terminate() == 0
        n2.start()
        cluster.wait_ready()
        assert f":{n4.port}@{n4.bus_port}" in n2.client().execute_command("CLUSTER", "NODES").decode()
        # Node 4 dies: node 1, in sync, takes the shard over.
        n4.kill9()
        _eventually(lambda: cluster.leader_of(key) is n1, timeout_s=20, what="node 1 leading again")
        _eventually(lambda: [entry_id for entry_id, _ in n1.client().xrange(key)] == acked,
                    what="every acknowledged entry on node 1")
    finally:
        cluster.stop()
    assert not cluster.unexpected_log_lines(), cluster.unexpected_log_lines()[:5]


def test_the_metadata_log_is_compacted_and_a_node_behind_it_catches_up_from_a_snapshot(tmp_path):
    # Two replicas per shard: node 3 does not replicate one shard, so it can
    # learn that shard's topics only from the metadata, not from a leader's fetch.
    cluster = Cluster(tmp_path, extra=["--controller-session-timeout-ms", "1500", "--replication-factor", "2",
                                       "--controller-snapshot-records", "20"])
    try:
        n1, n2, n3 = cluster.nodes
        assert n3.terminate() == 0
        # More records than the log keeps while node 3 is away: topics, and
        # their partitions' ISR changes (node 3 is fenced and out of every ISR).
        names = [f"snap{i}" for i in range(30)]
        for name in names:
            owner = _eventually(lambda name=name: cluster.leader_of(name.encode()) if cluster.leader_of(
                name.encode()) is not n3 else None, what=f"a live leader for {name}")
            assert owner.client().execute_command("TOPIC", "CREATE", name) == b"OK"
        _eventually(lambda: all(sorted(p.name for p in (n.data_dir / "controller").iterdir()) ==
                                ["raft.log", "raft.snapshot", "raft.vote"] for n in (n1, n2)),
                    what="snapshots on nodes 1 and 2")
        applied = int(_info(n1)["controller_applied"])
        n3.start()
        cluster.wait_ready()
        assert int(_info(n3)["controller_applied"]) >= applied
        # Node 3 has every topic, also the ones whose records it only got in the snapshot.
        on_disk = {p.name for p in (n3.data_dir / "topics").iterdir()}
        assert {encode_topic(name.encode()) for name in names} <= on_disk
        assert n3.terminate() == 0  # and restarts from its own snapshot
        n3.start()
        cluster.wait_ready()
        assert _info(n3)["controller_metadata"] == "ready"
    finally:
        cluster.stop()
    assert not cluster.unexpected_log_lines(), cluster.unexpected_log_lines()[:5]


def _shard_of(node, key: bytes) -> dict:
    """The controller's committed record of ``key``'s shard, as ``node``
    applied it (INFO replication's ``controller_shardN``)."""
    client = node.client(socket_timeout=5)
    slot = client.execute_command("CLUSTER", "KEYSLOT", key)
    info = client.execute_command("INFO", "replication")
    for name, value in info.items():
        if name.startswith("shard") and name[5:].isdigit():
            first, last = (int(x) for x in str(value["slots"]).split("-"))
            if first <= slot <= last:
                return {k: str(v) for k, v in info[f"controller_{name}"].items()}
    raise AssertionError(slot)


def _stays_leader(cluster: Cluster, key: bytes, node, window_s: float) -> None:
    """``node`` leads ``key``'s shard at every poll for ``window_s`` (a few
    times leader-rebalance-delay-ms: a preferred leader would have taken it
    back by then)."""
    deadline = time.monotonic() + window_s
    while time.monotonic() < deadline:
        assert cluster.leader_of(key) is node, "the shard went back to its old leader"
        time.sleep(0.1)


def test_a_manual_failover_sticks_past_the_rebalance_delay_and_a_restart_of_the_old_leader(cluster):
    """Redis's CLUSTER FAILOVER: the node that took over stays leader. It is
    committed as the shard's preferred replica with the new leadership, so
    the controller's preferred-leader rebalance (1 s here) does not hand the
    shard back, not even after the old leader restarts and is in sync."""
    _eventually(lambda: _info(cluster.nodes[0]).get("controller_metadata") == "ready", what="metadata ready")
    key = b"sticky"
    old = cluster.leader_of(key)
    new = next(n for n in cluster.nodes if n is not old)
    old_id, new_id = str(cluster.nodes.index(old) + 1), str(cluster.nodes.index(new) + 1)
    acked = [old.client().xadd(key, {"n": i}) for i in range(10)]
    assert new.client(socket_timeout=20).execute_command("CLUSTER", "FAILOVER") == b"OK"
    shard = _eventually(lambda: (lambda s: s if s["leader"] == new_id else None)(_shard_of(old, key)),
                        what="the failover applied on the old leader")
    assert shard["replicas"].split("/")[0] == new_id  # one record: leader and preferred replica
    assert old_id in shard["isr"].split("/")  # the old leader is eligible to take it back
    _stays_leader(cluster, key, new, 3.0)
    acked.append(new.client().xadd(key, {"n": "on the new leader"}))
    # The old leader restarts, rejoins the ISR, and still follows.
    assert old.terminate() == 0
    old.start()
    cluster.wait_ready()
    _eventually(lambda: old_id in _shard_of(new, key)["isr"].split("/"), timeout_s=30, what="the old leader in sync")
    _stays_leader(cluster, key, new, 3.0)
    assert _shard_of(old, key)["replicas"].split("/")[0] == new_id
    cluster.wait_converged(key.decode())
    assert [entry_id for entry_id, _ in new.client().xrange(key)] == acked
    assert "take back shard" not in "".join(n.log() for n in cluster.nodes)


# A session timeout no fast path can hide: without it, a killed leader's
# shard would wait 20 s for its new leader.
LONG_SESSION = ["--controller-session-timeout-ms", "20000", "--leader-rebalance-delay-ms", "-1"]


def _first_ack_after_kill(cluster: Cluster, key: bytes, old, timeout_s: float) -> tuple[float, list]:
    """kill -9 of ``old`` (``key``'s leader, with acknowledged entries), then
    the time until an XADD to ``key`` is acknowledged by another node, and
    that node's entries of ``key`` (every one acknowledged before)."""
    acked = [old.client().xadd(key, {"n": i}) for i in range(20)]
    old.kill9()
    started = time.monotonic()

    def xadd_on_new_leader():
        new = cluster.leader_of(key)
        if new is old:
            return None
        acked.append(new.client(socket_timeout=2).xadd(key, {"n": "after"}))
        return new

    new = _eventually(xadd_on_new_leader, timeout_s=timeout_s, what="an XADD acknowledged by a new leader")
    took = time.monotonic() - started
    _eventually(lambda: [entry_id for entry_id, _ in new.client().xrange(key)] == acked,
                what="every acknowledged entry on the new leader")
    return took, acked


@pytest.mark.parametrize("controller_too", [False, True], ids=["leader", "leader-and-controller"])
def test_a_killed_leader_is_replaced_at_once_not_after_the_session_timeout(tmp_path, controller_too):
    """kill -9 closes the dead process's sockets: its port refuses
    connections at once, which a timeout never proves. The controller, whose
    own connection to the node is refused, fences it without waiting for
    controller-session-timeout-ms (20 s here) and elects its shards' new
    leaders; a killed controller's voters, whose heartbeats are refused,
    elect a new one at once rather than after an election timeout."""
    cluster = Cluster(tmp_path, extra=LONG_SESSION)
    try:
        # Fast fencing is for registered nodes (a first start's nodes keep
        # their session while they come up): kill only once every node's
        # registration is committed and applied everywhere.
        everyone = list(range(1, len(cluster.nodes) + 1))  # (redis-py reads "1,2,3" as a list)
        _eventually(lambda: all(_info(n)["controller_registered"] == everyone for n in cluster.nodes),
                    what="every node registered, as every node sees it")
        ctrl = cluster.controller()
        old = ctrl if controller_too else next(n for n in cluster.nodes if n is not ctrl)
        key = _key_led_by(cluster, old)
        took, _ = _first_ack_after_kill(cluster, key, old, timeout_s=10.0)
        assert took < 10.0, took
        print(f"first acknowledged XADD {took:.2f} s after the kill")
        survivor = next(n for n in cluster.nodes if n is not old)
        assert _info(survivor)["controller_fenced"] == cluster.nodes.index(old) + 1
        assert "refuses connections (not running)" in "".join(n.log() for n in cluster.nodes if n is not old)
    finally:
        cluster.stop()


def test_a_paused_leader_is_fenced_only_after_its_session_timeout(tmp_path):
    """A SIGSTOPped process still has its sockets: connections to it are
    accepted by the kernel and then time out, they are not refused. So it is
    fenced by the session timeout as before, never at once (it could wake up
    and, within its lease, serve)."""
    session_ms = 4000
    cluster = Cluster(tmp_path, extra=["--controller-session-timeout-ms", str(session_ms),
                                       "--leader-rebalance-delay-ms", "-1"])
    try:
        ctrl = cluster.controller()
        paused = next(n for n in cluster.nodes if n is not ctrl)
        paused_id = cluster.nodes.index(paused) + 1
        key = _key_led_by(cluster, paused)
        paused.client().xadd(key, {"n": 1})
        paused.proc.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        _eventually(lambda: _info(ctrl)["controller_fenced"] == paused_id, timeout_s=30, what="the paused node fenced")
        # Its last heartbeat reached the controller at most one beat (250 ms)
        # before the SIGSTOP.
        assert time.monotonic() - stopped >= session_ms / 1000 - 0.5
        paused.proc.send_signal(signal.SIGCONT)
        new = cluster.node_at(_slot_leader_port(ctrl, key))  # (the resumed node's view may be a change behind)
        assert new is not paused
        # The acknowledged entry, once the new leader's high watermark has
        # passed it: the paused leader stopped before its followers' next
        # fetch told them the high watermark, and the new one learns it from
        # the remaining follower's first fetch.
        _eventually(lambda: len(new.client().xrange(key)) == 1, what="the acknowledged entry on the new leader")
    finally:
        cluster.stop()


def test_a_forced_failover_right_after_a_kill_answers_ok_on_the_node_the_controller_elects(tmp_path):
    """CLUSTER FAILOVER FORCE sent to a follower right after its leader's
    kill -9 races the controller's own election (fast fencing). When the
    controller elects that very follower, the node leads the shard, as the
    user asked: the failover answers OK whoever wins (not "not committed:
    ... leadership moved meanwhile"). (Whether it also became the preferred
    replica depends on the race: not when the election was applied before
    the command arrived, which then leaves that shard alone.)"""
    cluster = Cluster(tmp_path, extra=LONG_SESSION)
    try:
        ctrl = cluster.controller()
        old = next(n for n in cluster.nodes if n is not ctrl)
        key = _key_led_by(cluster, old)
        _eventually(lambda: len(_shard_of(ctrl, key)["isr"].split("/")) == 3, what="every replica in sync")
        old_id = str(cluster.nodes.index(old) + 1)
        # (the first live in-sync replica: the one the controller elects)
        asker_id = next(r for r in _shard_of(ctrl, key)["replicas"].split("/") if r != old_id)
        asker = cluster.nodes[int(asker_id) - 1]
        old.kill9()
        assert asker.client(socket_timeout=20).execute_command("CLUSTER", "FAILOVER", "FORCE") == b"OK"
        assert _shard_of(asker, key)["leader"] == asker_id
    finally:
        cluster.stop()
