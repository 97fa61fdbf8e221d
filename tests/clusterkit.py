"""A cluster of real ``partita`` processes on loopback for tests: start, find
leaders, read INFO replication, wait for replicas to converge, compare logs."""

from __future__ import annotations

import random
import re
import signal
import socket
import time

import redis

from cluster.topics import split_partition_key
from storage import records
from storage.log_manager import encode_topic
from tests.conftest import PartitaProcess, RawConn, free_port, wait_for
from tests.netproxy import ProxyMesh

LAG_MS = 1000


def leased(call, timeout_s: float = 15.0):
    """``call()``, again while the node answers ``-TRYAGAIN ... lost contact
    with the cluster controller``: a stopped or restarted node may be the
    controller's leader, and while another takes over a partition leader's
    lease can lapse; the command was refused before it ran (nothing
    written), and the error asks the client to retry."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return call()
        except redis.exceptions.TryAgainError as e:
            if "lost contact with the cluster controller" not in str(e) or time.monotonic() >= deadline:
                raise
            time.sleep(0.1)


def eventually(check, timeout_s: float = 20.0, what: str = "condition"):
    """``check()``'s first truthy result, polled (``wait_for``, every 100 ms)
    until ``timeout_s`` (a check that raises a client or assertion error
    counts as not yet); else an AssertionError naming ``what`` and the last
    result or error."""
    last = [None]

    def attempt() -> bool:
        try:
            last[0] = check()
        except (redis.RedisError, OSError, StopIteration, AssertionError, KeyError) as e:
            last[0] = e
            return False
        return bool(last[0])

    if wait_for(attempt, timeout_s, interval_s=0.1):
        return last[0]
    raise AssertionError(f"{what} not reached in {timeout_s}s (last: {last[0]!r})")


def running(tmp_path, **kwargs):
    """A fixture's body: the ``Cluster(tmp_path, **kwargs)``, stopped after
    the test, which fails if any node logged a traceback or a disk error."""
    c = Cluster(tmp_path, **kwargs)
    yield c
    c.stop()
    assert not c.unexpected_log_lines(), c.unexpected_log_lines()[:5]


def key_in_shard(cluster: "Cluster", shard: int, prefix: str = "k") -> bytes:
    """The first of ``{prefix}0``, ``{prefix}1``, ... whose slot is in
    ``shard`` (a cluster started with n nodes has n shards, shard s holding
    the s-th of n equal slot ranges). Pick a key by its shard, not by the
    node leading it: just after the start, a node that came up late is
    fenced and its shards are led by their other replica for a while."""
    client = cluster.alive().client()
    count = len(cluster.nodes)
    for i in range(1000):
        key = f"{prefix}{i}".encode()
        if client.execute_command("CLUSTER", "KEYSLOT", key) * count // 16384 == shard:
            return key
    raise AssertionError(f"no key in shard {shard}")


def partition_lines(server: PartitaProcess) -> dict[str, dict[str, str]]:
    """INFO replication's ``partitionN:key=...`` lines, by key."""
    with RawConn(server.port) as conn:
        info = conn.request(b"INFO replication\r\n").decode()
    out = {}
    for line in info.splitlines():
        if re.match(r"partition\d+:", line):
            fields = dict(item.split("=", 1) for item in line.split(":", 1)[1].split(","))
            out[fields["key"]] = fields
    return out


def partition_dir(key: bytes) -> str:
    """Where the log of ``key`` lives under a node's ``topics/``: ``t.orders/partition-3`` for
    ``orders#3`` (partition 3 of the topic ``orders``), ``t.orders/partition-0`` for ``orders``."""
    topic, partition = split_partition_key(key)
    return f"{encode_topic(topic)}/partition-{partition or 0}"


def placing_key(key: bytes) -> bytes:
    """The key whose slot places ``key``'s partition, and that INFO
    replication names it by: the topic for partition 0 (``orders#0`` is
    placed by ``orders``), else the key itself."""
    topic, partition = split_partition_key(key)
    return topic if partition == 0 else key


def listen_ports(n: int) -> list[int]:
    """``n`` free ports below the ephemeral range: nodes connect to each
    other while the cluster starts, and an outgoing connection's ephemeral
    port must not take a port a node not started yet is about to listen on."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return [free_port() for _ in range(n)]
    ports: list[int] = []
    rng = random.Random()
    while len(ports) < n:
        port = rng.randrange(10000, max(10001, low - 1))
        if port in ports:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
    return ports


class Cluster:
    """``n`` nodes, each with a client port (``node.port``) and a cluster bus
    port (``node.bus_port``, named in ``cluster-nodes``: ``id@host:port@bus``);
    ``node_extra(i)``: more arguments for node ``i`` (0-based) alone;
    with ``proxied``, every node reaches every other's bus through its own
    proxy (tests/netproxy.py), so ``isolate(node)`` can cut a node off its
    peers while it keeps running and clients still reach it."""

    def bootstrap(self) -> str:
        """Every node's Kafka listener, as a Kafka client's bootstrap list (``kafka=True``)."""
        return ",".join(f"127.0.0.1:{p}" for p in self.kafka_ports)

    def __init__(self, tmp_path, n: int = 3, extra: list[str] | None = None, *, proxied: bool = False,
                 launcher: list[str] | None = None, node_extra=None, kafka: bool = False) -> None:
        self.mesh = None
        ports = listen_ports(3 * n if kafka else 2 * n)
        self.ports, self.bus_ports = ports[:n], ports[n:2 * n]
        # With ``kafka``, every node's Kafka port (``node.kafka_port``), named in
        # its entry: ``id@host:port@bus@kafka``.
        self.kafka_ports = ports[2 * n:]
        self._owner = {p: i for i, p in enumerate(self.ports)}
        self._owner.update({p: i for i, p in enumerate(self.kafka_ports)})
        named = [f"@{k}" for k in self.kafka_ports] if kafka else [""] * n
        specs = [",".join(f"{i + 1}@127.0.0.1:{p}@{b}{named[i]}"
                          for i, (p, b) in enumerate(zip(self.ports, self.bus_ports)))] * n
        if proxied:
            pairs = [(i, j) for i in range(n) for j in range(n) if i != j]
            proxy_ports = dict(zip(pairs, listen_ports(len(pairs) + 2 * n)[2 * n:]))
            self.mesh = ProxyMesh(self.bus_ports, proxy_ports)
            specs = [",".join(f"{j + 1}@127.0.0.1:{self.ports[j]}@"
                              f"{self.bus_ports[j] if j == i else proxy_ports[(i, j)]}{named[j]}"
                              for j in range(n)) for i in range(n)]
        self.nodes: list[PartitaProcess] = []
        for i, port in enumerate(self.ports):
            node = PartitaProcess(tmp_path / f"node{i + 1}", [
                "--node-id", str(i + 1), "--cluster-nodes", specs[i],
                "--replica-lag-time-max-ms", str(LAG_MS), "--replica-fetch-wait-max-ms", "100",
                *(["--kafka-port", str(self.kafka_ports[i])] if kafka else []),
                *(extra or []), *(node_extra(i) if node_extra else [])], launcher=launcher)
            node.port = port
            node.bus_port = self.bus_ports[i]
            if kafka:
                node.kafka_port = self.kafka_ports[i]
            self.nodes.append(node)
        try:
            for node in self.nodes:
                node.start()
            self.wait_ready()
        except BaseException:
            self.stop()  # the caller never gets the cluster to stop
            raise

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Every running node has the controller's metadata and a live
        heartbeat lease (until then a leader answers -TRYAGAIN)."""
        deadline = time.monotonic() + timeout_s
        for node in self.nodes:
            if node.proc is None or node.proc.poll() is not None:
                continue
            while True:
                try:
                    with RawConn(node.port) as conn:
                        info = conn.request(b"INFO replication\r\n").decode()
                    if "controller_metadata:ready" in info and "controller_lease:ok" in info:
                        break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise AssertionError(f"node on port {node.port} not ready: controller not elected?")
                time.sleep(0.05)

    def join_node(self, tmp_path, extra: list[str] | None = None) -> PartitaProcess:
        """Start one more node that joins this running cluster (``cluster-join``)."""
        voters = ",".join(str(i + 1) for i in range(len(self.nodes)))
        port, bus_port = listen_ports(2)
        spec = ",".join([f"{i + 1}@127.0.0.1:{p}@{b}" for i, (p, b) in enumerate(zip(self.ports, self.bus_ports))]
                        + [f"{len(self.nodes) + 1}@127.0.0.1:{port}@{bus_port}"])
        node = PartitaProcess(tmp_path / f"node{len(self.nodes) + 1}", [
            "--node-id", str(len(self.nodes) + 1), "--cluster-nodes", spec, "--cluster-join", "yes",
            "--controller-nodes", voters, "--replica-lag-time-max-ms", str(LAG_MS),
            "--replica-fetch-wait-max-ms", "100", *(extra or [])])
        node.port = port
        node.bus_port = bus_port
        self.nodes.append(node)
        self.ports.append(port)
        self.bus_ports.append(bus_port)
        self._owner[port] = len(self.nodes) - 1
        node.start()
        self.wait_ready()
        return node

    def stop(self) -> None:
        for node in self.nodes:
            if node.proc is not None and node.proc.poll() is None:
                node.proc.send_signal(signal.SIGCONT)
                node.stop()
        if self.mesh is not None:
            self.mesh.close()

    def isolate(self, node: PartitaProcess) -> None:
        self.mesh.isolate(self.nodes.index(node))

    def heal(self, node: PartitaProcess) -> None:
        self.mesh.heal(self.nodes.index(node))

    def unexpected_log_lines(self) -> list[str]:
        """Tracebacks and disk errors in any node's log (every run since the
        cluster was made): a bug the test's own checks may not see."""
        found = []
        for node in self.nodes:
            try:
                text = node.log_path.read_text(errors="replace")
            except FileNotFoundError:
                continue
            for line in text.splitlines():
                if "Traceback" in line or "disk error" in line or "fsync failed" in line:
                    found.append(f"{node.log_path.name}: {line}")
        return found

    def wait_settled(self, timeout_s: float = 20.0) -> None:
        """Ready, and every running node shows the same shard leaders for a
        moment (a restarted node's registration may move leaderships first)."""
        self.wait_ready(timeout_s)
        deadline = time.monotonic() + timeout_s
        last = None
        while time.monotonic() < deadline:
            try:
                views = {repr(n.client(socket_timeout=5).execute_command("CLUSTER", "SLOTS"))
                         for n in self.nodes if n.proc is not None and n.proc.poll() is None}
            except (OSError, redis.RedisError):
                views = set()
            if len(views) == 1 and views == last:
                return
            last = views
            time.sleep(0.3)
        raise AssertionError(f"the nodes do not agree on the shard leaders: {last}")

    def wait_leading(self, timeout_s: float = 20.0) -> None:
        """Every node leads a slot range (as the preferred leaders do once
        settled: just after the start one node may lead another's range)."""
        eventually(lambda: {entry[2][1] for entry in self.alive().client().execute_command("CLUSTER", "SLOTS")}
                   == set(self.ports), timeout_s, what="every node leading a slot range")

    def node_at(self, port: int) -> PartitaProcess:
        return self.nodes[self._owner[port]]

    def alive(self) -> PartitaProcess:
        return next(n for n in self.nodes if n.proc is not None and n.proc.poll() is None)

    def leader_of(self, key: bytes) -> PartitaProcess:
        """The leader of ``key``'s slot in the view of a live node."""
        asked = self.alive().client()
        slot = asked.execute_command("CLUSTER", "KEYSLOT", placing_key(key))
        for first, last, leader, *_ in asked.execute_command("CLUSTER", "SLOTS"):
            if first <= slot <= last:
                return self.node_at(leader[1])
        raise AssertionError(slot)

    def followers_of(self, key: bytes, *, but_controller: bool = False) -> list[PartitaProcess]:
        """The nodes other than ``key``'s leader; ``but_controller``: not the
        controller's elected leader either, for a test that stops or kills
        "a follower" and means only that (stopping the controller's leader
        lets every node's lease lapse until another is elected: leader
        commands answer -TRYAGAIN meanwhile, and the ISR changes wait)."""
        leader = self.leader_of(key)
        controller = self.controller() if but_controller else None
        followers = [n for n in self.nodes if n is not leader and n is not controller]
        assert followers, "no follower that is not the controller's leader"
        return followers

    def controller(self) -> PartitaProcess:
        """The running node that leads the controller quorum (INFO
        replication's ``controller_role:leader``), once one is elected."""
        def leading(node) -> bool:
            info = node.client(socket_timeout=5).execute_command("INFO", "replication")
            return info.get("controller_role") == "leader"

        return eventually(lambda: next((n for n in self.nodes if n.proc is not None and n.proc.poll() is None
                                        and leading(n)), None), what="an elected controller")

    def taken_over(self, key: bytes, dead: PartitaProcess) -> PartitaProcess:
        """The live node leading ``key`` once the controller moved it off
        ``dead`` (just killed or stopped). With controller-fast-fencing (the
        default) the controller fences a node whose port refuses its
        connections at once and elects the first live in-sync replica: a
        ``CLUSTER FAILOVER FORCE`` sent right after the kill races that
        election and is refused when it elects another node ("not
        committed: shard N's leadership moved meanwhile"), so wait for the
        election instead."""
        return eventually(lambda: (leader := self.leader_of(key)) is not dead and leader,
                          what=f"a live leader of {key!r}")

    def on_leader(self, key: bytes, call, timeout_s: float = 15.0):
        """``call(client)`` with a client of ``key``'s leader, with the
        leader found again while it answers -MOVED (leadership moved after
        it was looked up: a failover, a preferred leader taking its shard
        back) and retried on a lapsed lease (``leased``)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return leased(lambda: call(self.leader_of(key).client()), timeout_s)
            except redis.exceptions.MovedError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.1)

    def wait_converged(self, key: str, timeout_s: float = 20.0) -> None:
        """Every replica's end offset equals the leader's high watermark and end."""
        self.wait_converged_on(self.nodes, key, timeout_s)

    def wait_converged_on(self, nodes: list, key: str, timeout_s: float = 20.0) -> None:
        """``wait_converged`` over the replicas ``nodes`` only."""
        key = placing_key(key.encode()).decode()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            lines = [partition_lines(n).get(key) for n in nodes]
            if all(lines):
                ends = {line["end_offset"] for line in lines}
                hws = {line["high_watermark"] for line in lines}
                if len(ends) == 1 and hws == ends:
                    return
            time.sleep(0.05)
        raise AssertionError(f"replicas did not converge: {[partition_lines(n).get(key) for n in nodes]}")

    def log_bytes(self, node: PartitaProcess, topic: str) -> bytes:
        """The log of ``topic`` (a partition key ``t#n`` names partition n of ``t``) on ``node``."""
        files = sorted((node.data_dir / "topics" / partition_dir(topic.encode())).glob("*.log"))
        assert files, f"no log of {topic} on {node.data_dir}"
        # Zeros after the last batch are preallocation (fsync always), as
        # many as each node happened to write: each file up to its batches' end.
        return b"".join(_batches(f.read_bytes()) for f in files)


def _batches(data: bytes) -> bytes:
    """The batches at the start of a segment file's bytes (a batch may end
    with zero bytes, so the preallocated zeros after them are found by
    walking the batches' lengths, not by stripping zeros)."""
    pos = 0
    while pos + records.HEADER_BYTES <= len(data):
        length = records.unpack_header(data, pos)[records.H_LENGTH]
        if length == 0:
            break
        pos += length
    return data[:pos]
