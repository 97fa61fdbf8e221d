"""The web console in a real browser: a 3-node cluster of real ``partita``
processes with a 6-partition topic and a consumer group, the console of node
1 loaded by headless Chromium, its rendered DOM read (nodes, shards, the
topic's partitions, the group's lag) and a screenshot taken.

Skipped only when Chromium is missing (Debian's ``chromium``; .ci/run
installs it). ``PARTITA_CONSOLE_SCREENSHOT=/path.png`` keeps a copy of the
screenshot."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import urllib.request
from html.parser import HTMLParser

import pytest

from tests.clusterkit import Cluster, eventually, leased, listen_ports
from tests.metricskit import documented_metrics, missing_from, scrape

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="headless Chromium is not installed (Debian package 'chromium'; .ci/run installs it)")

TOPIC = "orders"
PARTITIONS = 6
GROUP = "billing"
BROWSER_TIMEOUT_S = 120


class _Dom(HTMLParser):
    """The elements of a dumped DOM that carry ``data-*`` attributes, each
    with the ``data-topic`` / ``data-group`` container it sits in."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[dict[str, str]] = []
        self.found: list[tuple[str, dict[str, str], dict[str, str] | None]] = []
        self.body: dict[str, str] = {}

    def handle_starttag(self, tag, attrs):
        attrs = {k: v or "" for k, v in attrs}
        if tag == "body":
            self.body = attrs
        container = next((a for a in reversed(self.stack) if "data-topic" in a), None)
        if any(k.startswith("data-") for k in attrs):
            self.found.append((tag, attrs, container))
        if tag == "div":
            self.stack.append(attrs)

    def handle_endtag(self, tag):
        if tag == "div" and self.stack:
            self.stack.pop()

    def elements(self, tag: str, **match: str) -> list[tuple[dict[str, str], dict[str, str] | None]]:
        return [(attrs, container) for t, attrs, container in self.found
                if t == tag and all(attrs.get(k.replace("_", "-")) == v for k, v in match.items())]


def _chromium(url: str, *args: str, profile) -> str:
    done = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
         f"--user-data-dir={profile}", "--window-size=1400,1500", "--virtual-time-budget=15000", *args, url],
        capture_output=True, timeout=BROWSER_TIMEOUT_S, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _status(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status", timeout=10) as response:
        return json.load(response)


def _check_cluster_metrics(cluster: Cluster, http_ports: list[int], leaders: list) -> None:
    """Every node's scrape has the documented cluster metrics; each partition's
    leader, and only it, reports its ISR, its followers' lag and the group."""
    documented = documented_metrics()["Cluster"] | {"partita_partition_replica_lag_entries"}
    roles = []
    for i, port in enumerate(http_ports):
        samples = scrape(port)
        assert not missing_from(samples, documented), (i + 1, missing_from(samples, documented))
        assert samples[("partita_cluster_node_id", ())] == i + 1
        roles.append(samples[("partita_controller_role", (("role", "leader"),))])
        for n, leader in enumerate(leaders):
            leads = leader is cluster.nodes[i]
            labels = (("partition", str(n)), ("topic", TOPIC))
            assert samples[("partita_partition_leader", labels)] == (1.0 if leads else 0.0)
            assert (("partita_partition_isr_size", labels) in samples) == leads
            group = tuple(sorted((("group", GROUP),) + labels))
            assert (("partita_group_lag_entries", group) in samples) == leads
    assert sorted(roles) == [0.0, 0.0, 1.0]  # one controller leader


def _key(n: int) -> bytes:
    return f"{TOPIC}#{n}".encode()


def test_console_shows_a_three_node_cluster_with_a_topic_and_a_group(tmp_path):
    http_ports = listen_ports(3)
    cluster = Cluster(tmp_path, node_extra=lambda i: ["--http-port", str(http_ports[i])])
    stop = threading.Event()
    try:
        owner = cluster.leader_of(TOPIC.encode())
        assert leased(lambda: owner.client().execute_command(
            "TOPIC", "CREATE", TOPIC, "PARTITIONS", PARTITIONS)) == b"OK"
        leaders = [cluster.leader_of(TOPIC.encode() if n == 0 else _key(n)) for n in range(PARTITIONS)]
        for n, leader in enumerate(leaders):  # the topic reaches every partition's leader in the background
            eventually(lambda: leader.client().exists(_key(n)), what=f"{TOPIC} on the leader of partition {n}")
        for n, leader in enumerate(leaders):
            client = leader.client()
            for i in range(10 + n):
                leased(lambda: client.xadd(_key(n), {"n": n, "i": i}))
            leased(lambda: client.xgroup_create(_key(n), GROUP, id="0"))
            leased(lambda: client.xreadgroup(GROUP, f"worker-{n % 2}", {_key(n): ">"}, count=3))
        lags = {n: 10 + n - 3 for n in range(PARTITIONS)}

        def node1_view():  # node 1 holds a replica of every partition (replication factor 3)
            st = _status(http_ports[0])
            topic = next(t for t in st["topics"] if t["name"] == TOPIC)
            group = next(g for g in st["groups"] if g["group"] == GROUP)
            ends = [p["log_end_offset"] for p in topic["partition_list"]]
            got = {p["partition"]: p["lag"] for p in group["partitions"]}
            return st if ends == [10 + n for n in range(PARTITIONS)] and got == lags else None

        st = eventually(node1_view, what="node 1's console status showing every partition and the group")
        assert [n["id"] for n in st["cluster"]["nodes"]] == [1, 2, 3]
        _check_cluster_metrics(cluster, http_ports, leaders)

        def produce():  # live traffic while the browser watches: the charts move
            clients = [leader.client() for leader in leaders]
            i = 0
            while not stop.is_set():
                n = i % PARTITIONS
                try:
                    clients[n].xadd(_key(n), {"live": i})
                except Exception:  # noqa: BLE001 - a lease hiccup: the next one goes on
                    pass
                i += 1
                stop.wait(0.005)

        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        url = f"http://127.0.0.1:{http_ports[0]}/"
        dom = _Dom()
        dom.feed(_chromium(url, "--dump-dom", profile=tmp_path / "profile-dom"))
        assert int(dom.body.get("data-ready", "0")) >= 2, "the page did not poll twice"
        topics = dom.elements("div", data_topic=TOPIC, data_partitions=str(PARTITIONS))
        assert len([a for a, _ in topics if "topic" in a.get("class", "")]) == 1, topics
        rows = [a for a, c in dom.elements("tr") if c is not None and c.get("class") == "topic"
                and c.get("data-topic") == TOPIC and "data-partition" in a]
        assert sorted(int(a["data-partition"]) for a in rows) == list(range(PARTITIONS))
        groups = [a for a, _ in dom.elements("div", data_group=GROUP, data_topic=TOPIC)]
        assert len(groups) == 1
        assert int(groups[0]["data-lag"]) >= sum(lags.values())  # live writes only add lag
        group_rows = {int(a["data-partition"]): int(a["data-lag"]) for a, c in dom.elements("tr")
                      if c is not None and c.get("data-group") == GROUP and "data-partition" in a}
        assert sorted(group_rows) == list(range(PARTITIONS))
        assert all(group_rows[n] >= lags[n] for n in range(PARTITIONS)), group_rows
        assert sorted(int(a["data-node"]) for a, _ in dom.elements("tr") if "data-node" in a) == [1, 2, 3]
        assert len([a for a, _ in dom.elements("tr") if "data-shard" in a]) == len(st["cluster"]["shards"])
        assert [a for a, _ in dom.elements("polyline") if a.get("data-series") == "in"], "no throughput line"
        assert [a for a, _ in dom.elements("polyline") if a.get("data-series") == f"{GROUP} @ {TOPIC}"], \
            "no lag line for the group"

        shot = tmp_path / "console.png"
        _chromium(url, f"--screenshot={shot}", profile=tmp_path / "profile-shot")
        assert shot.stat().st_size > 10_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        keep = os.environ.get("PARTITA_CONSOLE_SCREENSHOT")
        if keep:
            shutil.copyfile(shot, keep)
    finally:
        stop.set()
        cluster.stop()
    assert not cluster.unexpected_log_lines(), cluster.unexpected_log_lines()[:5]
