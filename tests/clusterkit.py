"""A cluster of real ``partita`` processes on loopback for tests: start, find
leaders, read INFO replication, wait for replicas to converge, compare logs."""

from __future__ import annotations

import random
import re
import signal
import socket
import time

from tests.conftest import PartitaProcess, RawConn, free_port

LAG_MS = 1000


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
    def __init__(self, tmp_path, n: int = 3, extra: list[str] | None = None) -> None:
        self.ports = listen_ports(n)
        spec = ",".join(f"{i + 1}@127.0.0.1:{p}" for i, p in enumerate(self.ports))
        self.nodes: list[PartitaProcess] = []
        for i, port in enumerate(self.ports):
            node = PartitaProcess(tmp_path / f"node{i + 1}", [
                "--node-id", str(i + 1), "--cluster-nodes", spec,
                "--replica-lag-time-max-ms", str(LAG_MS), "--replica-fetch-wait-max-ms", "100",
                *(extra or [])])
            node.port = port
            self.nodes.append(node)
        for node in self.nodes:
            node.start()

    def stop(self) -> None:
        for node in self.nodes:
            if node.proc is not None and node.proc.poll() is None:
                node.proc.send_signal(signal.SIGCONT)
                node.stop()

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

    def node_at(self, port: int) -> PartitaProcess:
        return self.nodes[self.ports.index(port)]

    def alive(self) -> PartitaProcess:
        return next(n for n in self.nodes if n.proc is not None and n.proc.poll() is None)

    def leader_of(self, key: bytes) -> PartitaProcess:
        """The leader of ``key``'s slot in the view of a live node."""
        asked = self.alive().client()
        slot = asked.execute_command("CLUSTER", "KEYSLOT", key)
        for first, last, leader, *_ in asked.execute_command("CLUSTER", "SLOTS"):
            if first <= slot <= last:
                return self.node_at(leader[1])
        raise AssertionError(slot)

    def followers_of(self, key: bytes) -> list[PartitaProcess]:
        leader = self.leader_of(key)
        return [n for n in self.nodes if n is not leader]

    def wait_converged(self, key: str, timeout_s: float = 20.0) -> None:
        """Every replica's end offset equals the leader's high watermark and end."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            lines = [partition_lines(n).get(key) for n in self.nodes]
            if all(lines):
                ends = {line["end_offset"] for line in lines}
                hws = {line["high_watermark"] for line in lines}
                if len(ends) == 1 and hws == ends:
                    return
            time.sleep(0.05)
        raise AssertionError(f"replicas did not converge: {[partition_lines(n).get(key) for n in self.nodes]}")

    def log_bytes(self, node: PartitaProcess, topic: str) -> bytes:
        files = sorted((node.data_dir / "topics").glob(f"*{topic}*/partition-0/*.log"))
        assert files, f"no log of {topic} on {node.data_dir}"
        return b"".join(f.read_bytes() for f in files)
