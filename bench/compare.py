"""Partita beside redis-server, one workload at a time, in the same run.

Run: ``python -m bench compare [--quick] [--only NAME ...]``.

The ``kafka`` workload compares Partita's Kafka port with the disk rather
than with Redis: see ``w_kafka``.

For each workload both servers are started fresh (free port, empty data dir;
redis-server with AOF on and ``appendfsync everysec``, or ``always`` for the
fsync comparison), the same load is sent to each (redis-benchmark where it
can express the workload, ``bench.loadgen`` where it cannot), and a row is
recorded: req/s and entries/s for both, the ratio, p50/p99 latency, and each
server's CPU time per request read from /proc. Results go to
``bench/results/compare-<time>.md`` (and ``latest.md`` for a full run, not
for ``--only``), with PNG charts when
matplotlib (the ``bench`` extra) is installed. Every process started here is
stopped here, and only those.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import re
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from bench import loadgen
from bench.procs import ServerProcess, free_port

RESULTS_DIR = Path(__file__).with_name("results")
REDIS_AOF_EVERYSEC = ["--appendonly", "yes", "--appendfsync", "everysec"]
REDIS_AOF_ALWAYS = ["--appendonly", "yes", "--appendfsync", "always"]


@dataclass
class Measure:
    """One server's figures for one workload."""

    requests: int
    seconds: float
    entries: int
    cpu_seconds: float
    p50_ms: float | None = None
    p99_ms: float | None = None
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def req_per_s(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    @property
    def entries_per_s(self) -> float:
        return self.entries / self.seconds if self.seconds else 0.0

    @property
    def cpu_us_per_request(self) -> float:
        return 1e6 * self.cpu_seconds / self.requests if self.requests else 0.0

    @property
    def cpu_us_per_entry(self) -> float:
        return 1e6 * self.cpu_seconds / self.entries if self.entries else 0.0


@dataclass
class Row:
    name: str
    partita: Measure
    redis: Measure
    target: str = ""
    ratio_kind: str = "req/s"  # or "cpu/entry", "entries/s", "value", "MB/s" (``redis``: the baseline)
    met: bool | None = None  # an absolute target's verdict (RSS, restart time)

    @property
    def ratio(self) -> float:
        if self.ratio_kind == "cpu/entry":
            r = self.redis.cpu_us_per_entry
            return self.partita.cpu_us_per_entry / r if r else 0.0
        if self.ratio_kind == "entries/s":
            r = self.redis.entries_per_s
            return self.partita.entries_per_s / r if r else 0.0
        if self.ratio_kind in ("value", "MB/s"):
            r = self.redis.extra.get("value", 0.0)
            return self.partita.extra.get("value", 0.0) / r if r else 0.0
        r = self.redis.req_per_s
        return self.partita.req_per_s / r if r else 0.0


def redis_benchmark(port: int, command: list[str], *, requests: int, clients: int = 50,
                    pipeline: int = 1, extra: list[str] | None = None) -> tuple[float, float, float, float]:
    """Run redis-benchmark; returns (seconds, rps, p50_ms, p99_ms)."""
    exe = shutil.which("redis-benchmark") or "/usr/bin/redis-benchmark"
    cmd = [exe, "-p", str(port), "-c", str(clients), "-n", str(requests), "-P", str(pipeline),
           "--csv", *(extra or []), *command]
    started = time.monotonic()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=1800).stdout
    seconds = time.monotonic() - started
    rows = list(csv.DictReader(io.StringIO(out)))
    if not rows:
        raise RuntimeError(f"redis-benchmark printed no result: {out!r}")
    row = rows[-1]
    rps = float(row["rps"])
    # redis-benchmark's own clock excludes its start-up; prefer it for the rate.
    return requests / rps if rps else seconds, rps, float(row["p50_latency_ms"]), float(row["p99_latency_ms"])


def measured(server: ServerProcess, run: Callable[[], tuple[float, int, int, float | None, float | None]]) -> Measure:
    cpu0 = server.cpu_seconds()
    seconds, requests, entries, p50, p99 = run()
    cpu = server.cpu_seconds() - cpu0
    return Measure(requests=requests, seconds=seconds, entries=entries, cpu_seconds=cpu, p50_ms=p50, p99_ms=p99)


def bench_command(server: ServerProcess, command: list[str], *, requests: int, clients: int = 50,
                  pipeline: int = 1, entries_per_request: int = 1) -> Measure:
    def run():
        seconds, rps, p50, p99 = redis_benchmark(server.port, command, requests=requests,
                                                 clients=clients, pipeline=pipeline)
        return seconds, requests, requests * entries_per_request, p50, p99

    return measured(server, run)


def prefill(server: ServerProcess, key: str, count: int, value_bytes: int = 100) -> None:
    loadgen.fill_stream(server.port, key, count, value_bytes=value_bytes)


# --- workloads ----------------------------------------------------------------------------

def pair(partita_args: list[str], redis_args: list[str]):
    return ServerProcess("partita", list(partita_args)), ServerProcess("redis", list(redis_args))


def w_xadd(scale: float, pipeline: int) -> tuple[Measure, Measure]:
    n = int(200_000 * scale)
    results = []
    for server in pair(["--fsync", "everysec"], REDIS_AOF_EVERYSEC):
        with server:
            results.append(bench_command(server, ["XADD", "s", "*", "field", "v" * 100],
                                         requests=n, pipeline=pipeline))
    return results[0], results[1]


FSYNC_PAIRS = 5
# XADDs per run of each pair: ~2-3 s, so everysec's once-a-second fsync falls
# inside the window (100k took ~0.25 s: everysec never synced, and the first
# moments of a fresh server, its segment still growing, weighed on always).
FSYNC_PAIR_REQUESTS = 1_000_000


def w_xadd_always(scale: float) -> tuple[Measure, Measure, Measure, Measure]:
    """Partita fsync=always vs redis appendfsync always, and, for the 0.8x
    target, Partita always vs Partita everysec as the median of
    ``FSYNC_PAIRS`` back-to-back pairs: this VM's fsync time and CPU share
    swing by 2x within a minute, so one run of each compared 0.5x to 1.0x
    for the same code. Returns (always, redis, median-pair always, median-pair everysec)."""
    n = int(100_000 * scale)
    n_pair = int(FSYNC_PAIR_REQUESTS * scale)
    cmd = ["XADD", "s", "*", "field", "v" * 100]
    out = []
    for server in (ServerProcess("partita", ["--fsync", "always"]), ServerProcess("redis", REDIS_AOF_ALWAYS)):
        with server:
            out.append(bench_command(server, cmd, requests=n, pipeline=16))
    pairs = []
    for _ in range(FSYNC_PAIRS):
        pair_ = []
        for policy in ("always", "everysec"):
            with ServerProcess("partita", ["--fsync", policy]) as server:
                pair_.append(bench_command(server, cmd, requests=n_pair, pipeline=16))
        pairs.append(pair_)
    pairs.sort(key=lambda pr: pr[0].req_per_s / pr[1].req_per_s if pr[1].req_per_s else 0.0)
    print("  always/everysec per pair: "
          + ", ".join(f"{a.req_per_s / e.req_per_s:.2f}x" for a, e in pairs if e.req_per_s), flush=True)
    always, everysec = pairs[len(pairs) // 2]
    return out[0], out[1], always, everysec


XREAD_PAIRS = 5


def w_xread(scale: float, count: int, pairs: int = 1) -> tuple[Measure, Measure]:
    """XREAD COUNT ``count`` from the start of a 1M-entry stream, 50
    clients. With ``pairs`` > 1 both servers stay up and are measured
    alternately that many times; the pair of median CPU-per-entry ratio is
    returned: each server's CPU per request swings by 1.5x from one run to
    the next on this VM (Redis's 300-440 us for COUNT 1000 within minutes)."""
    stream_len = int(1_000_000 * scale)
    n = int((20_000 if count >= 1000 else 200_000) * scale)
    command = ["XREAD", "COUNT", str(count), "STREAMS", "s", "0-0"]
    partita, redis = pair(["--fsync", "everysec"], REDIS_AOF_EVERYSEC)
    with partita, redis:
        for server in (partita, redis):
            prefill(server, "s", stream_len)
        measured_pairs = [tuple(bench_command(server, command, requests=n, entries_per_request=min(count, stream_len))
                                for server in (partita, redis))
                          for _ in range(pairs)]
    measured_pairs.sort(key=lambda pr: pr[0].cpu_us_per_entry / pr[1].cpu_us_per_entry if pr[1].cpu_seconds else 0.0)
    if pairs > 1:
        print("  cpu/entry ratio per pair: "
              + ", ".join(f"{p.cpu_us_per_entry / r.cpu_us_per_entry:.2f}x" for p, r in measured_pairs
                          if r.cpu_seconds), flush=True)
    return measured_pairs[len(measured_pairs) // 2]


GROUP_CONSUMERS = 4


def w_group_loop(scale: float) -> tuple[Measure, Measure]:
    """A 200k-entry stream (100-byte values) consumed by one group of
    ``GROUP_CONSUMERS`` consumers at once, each in its own process on its
    own connection: ``XREADGROUP GROUP g c<i> COUNT 100 STREAMS s >`` then
    ``XACK`` of the batch, until the group has nothing left to deliver
    (``loadgen.group_consumers``, which fails unless every entry was acked).
    Entries per second and server CPU per entry are the issue's terms."""
    stream_len = int(200_000 * scale)
    results = []
    for server in pair(["--fsync", "everysec"], REDIS_AOF_EVERYSEC):
        with server:
            prefill(server, "s", stream_len)
            results.append(measured(server, lambda: loadgen.group_consumers(server.port, "s", GROUP_CONSUMERS)))
    return results[0], results[1]


MIXED_PARTITIONS = 6
MIXED_CONSUMERS = 3


def w_mixed(scale: float) -> tuple[Measure, Measure]:
    """Producers and a consumer group at once on 6 partitions.

    Partita: ``TOPIC CREATE t PARTITIONS 6``; redis-benchmark producers
    ``XADD t * field <100 B>`` (25 clients, -P 16; the topic's partitioner
    spreads them round-robin, each pipelined run to one partition); 3
    consumers ``XREADGROUP GROUP g c<i> COUNT 100 BLOCK 100 STREAMS t >``
    (the group assigns 2 partitions to each) with ``XACK`` on the partition
    key each reply names.

    Redis has no partitions: 6 plain streams ``t#000000000000`` ..
    ``t#000000000005`` (redis-benchmark ``-r 6`` and ``t#__rand_int__``
    spreads producers randomly over them), one group per stream, and the
    same 3 consumers each reading its own 2 streams in one XREADGROUP (the
    assignment Partita's group does, done by hand). Same entries, same
    batch sizes, same acks.

    Each consumer is its own process (``loadgen.mixed_consume``); they stop
    when together they have acked every entry produced, and the run fails
    unless the group then has nothing pending on any partition (stream) and
    the entries acked are exactly the ``n`` produced. The row: entries
    consumed per second from the consumers' start (the producers start
    right after) until the last XACK; requests count XADDs, XREADGROUPs and
    XACKs; server CPU per request covers producing and consuming.
    """
    n = int(200_000 * scale)
    assert n % 16 == 0, "redis-benchmark -P 16 sends whole pipelines: n XADDs exactly only if 16 divides n"
    value = "v" * 100
    results = []
    for server in pair(["--fsync", "everysec"], REDIS_AOF_EVERYSEC):
        with server:
            admin = loadgen.Client(server.port)
            if server.kind == "partita":
                admin.call("TOPIC", "CREATE", "t", "PARTITIONS", str(MIXED_PARTITIONS))
                admin.call("XGROUP", "CREATE", "t", "g", "0")
                consumer_keys = [["t"] for _ in range(MIXED_CONSUMERS)]
                stream_keys = [f"t#{i}" for i in range(MIXED_PARTITIONS)]
                produce = ["XADD", "t", "*", "field", value]
                extra: list[str] = []
            else:
                stream_keys = [f"t#{i:012d}" for i in range(MIXED_PARTITIONS)]
                for key in stream_keys:
                    admin.call("XGROUP", "CREATE", key, "g", "0", "MKSTREAM")
                per = MIXED_PARTITIONS // MIXED_CONSUMERS
                consumer_keys = [stream_keys[i * per:(i + 1) * per] for i in range(MIXED_CONSUMERS)]
                produce = ["XADD", "t#__rand_int__", "*", "field", value]
                extra = ["-r", str(MIXED_PARTITIONS)]
            admin.close()

            def run():
                seconds, requests, entries, p50, p99 = loadgen.mixed_consume(
                    server.port, consumer_keys, stream_keys, n,
                    lambda: redis_benchmark(server.port, produce, requests=n, clients=25, pipeline=16, extra=extra))
                return seconds, requests + n, entries, p50, p99

            results.append(measured(server, run))
    return results[0], results[1]


def w_rss(entries: int) -> tuple[Measure, Measure]:
    results = []
    for server in pair(["--fsync", "no"], ["--appendonly", "no"]):
        with server:
            started = time.monotonic()
            prefill(server, "s", entries)
            seconds = time.monotonic() - started
            m = Measure(requests=entries, seconds=seconds, entries=entries, cpu_seconds=server.cpu_seconds())
            m.extra["value"] = server.rss_bytes() / 1e6
            results.append(m)
    return results[0], results[1]


def w_restart(entries: int) -> tuple[Measure, Measure]:
    results = []
    for server in pair(["--fsync", "everysec"], REDIS_AOF_EVERYSEC):
        server.keep_dir = False
        with server:
            prefill(server, "s", entries, value_bytes=1000)
            time.sleep(1.5)  # let both servers' everysec fsync cover the data
            disk = server.disk_bytes()
            server.kill9()
            seconds = server.restart(timeout_s=600)
            m = Measure(requests=1, seconds=seconds, entries=entries, cpu_seconds=0.0)
            m.extra["value"] = seconds
            m.extra["disk_mb"] = disk / 1e6
            results.append(m)
    return results[0], results[1]


KAFKA_RECORD_BYTES = 1024
KAFKA_RECORDS = 500_000


def dd_mb_per_s(directory: Path, mib: int) -> Measure:
    """``dd if=/dev/zero of=<directory>/dd.bench bs=1M count=<mib> conv=fdatasync``:
    dd's own figure (bytes over its seconds), in MB/s (10^6 bytes)."""
    path = directory / "dd.bench"
    try:
        out = subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=1M", f"count={mib}", "conv=fdatasync"],
                             check=True, capture_output=True, text=True, timeout=1800).stderr
    finally:
        path.unlink(missing_ok=True)
    m = re.search(r"^(\d+) bytes .* copied, ([\d.]+) s", out, re.M)
    if m is None:
        raise RuntimeError(f"dd printed no figure: {out!r}")
    nbytes, seconds = int(m.group(1)), float(m.group(2))
    measure = Measure(requests=mib, seconds=seconds, entries=0, cpu_seconds=0.0)
    measure.extra["value"] = nbytes / seconds / 1e6
    return measure


def kafka_produce(server: ServerProcess, bootstrap: str, topic: str, n: int, acks: int) -> Measure:
    """``n`` records of ``KAFKA_RECORD_BYTES`` (no key) produced by librdkafka
    (confluent-kafka, its own batching: linger.ms 5, batches up to 1 MB, no
    compression) with ``acks``; from the first ``produce`` until ``flush``
    returned (every record acknowledged)."""
    import confluent_kafka

    failed: list = []
    producer = confluent_kafka.Producer({
        "bootstrap.servers": bootstrap, "acks": str(acks), "linger.ms": 5, "enable.idempotence": False,
        "queue.buffering.max.messages": 1_000_000, "queue.buffering.max.kbytes": 1024 * 1024,
        "delivery.report.only.error": True, "on_delivery": lambda err, msg: failed.append(err)})
    producer.list_topics(topic, timeout=30)  # connected, topic known: not timed
    value = os.urandom(KAFKA_RECORD_BYTES)

    def run():
        started = time.monotonic()
        produce, poll = producer.produce, producer.poll
        for i in range(n):
            while True:
                try:
                    produce(topic, value)
                    break
                except BufferError:  # the local queue is full: let librdkafka send
                    poll(0.005)
            if i % 10_000 == 0:
                poll(0)
        left = producer.flush(600)
        seconds = time.monotonic() - started
        if left or failed:
            raise RuntimeError(f"{left} records not delivered, {len(failed)} failed: {failed[:3]}")
        return seconds, n, n, None, None

    measure = measured(server, run)
    measure.extra["value"] = n * KAFKA_RECORD_BYTES / measure.seconds / 1e6
    return measure


def kafka_fetch(server: ServerProcess, bootstrap: str, topic: str, n: int) -> Measure:
    """The ``n`` records of ``topic`` from offset 0 by a librdkafka consumer
    (assigned partition 0, ``consume`` in batches of 10,000): from the
    assignment until the last record arrived."""
    import confluent_kafka

    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": "bench",
                                         "enable.auto.commit": False, "fetch.max.bytes": 50 * 2**20,
                                         "max.partition.fetch.bytes": 16 * 2**20})

    def run():
        started = time.monotonic()
        consumer.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
        got = 0
        while got < n:
            for msg in consumer.consume(num_messages=10_000, timeout=5.0):
                if msg.error() is not None:
                    raise RuntimeError(f"fetch failed: {msg.error()}")
                got += 1
        return time.monotonic() - started, got, got, None, None

    try:
        measure = measured(server, run)
    finally:
        consumer.close()
    measure.extra["value"] = measure.entries * KAFKA_RECORD_BYTES / measure.seconds / 1e6
    return measure


KAFKA_ROUNDS = 3


def w_kafka(scale: float) -> list[tuple[Measure, Measure, Measure, Measure]]:
    """Partita's Kafka port against the disk, ``KAFKA_ROUNDS`` rounds on one
    server. A round: dd with ``conv=fdatasync`` writes as many MiB as a
    produce sends, into Partita's data directory (same disk); librdkafka
    produces ``KAFKA_RECORDS`` 1 KiB records with acks=1 to one new topic
    and with acks=-1 to another, in turn first (one partition each, the
    server's ``fsync everysec``); a librdkafka consumer fetches the first topic from offset
    0 (its log still in the page cache, as a consumer that keeps up finds
    it). MB/s count record values (10^6 bytes); CPU is Partita's, per
    record. Returns each round's (dd, acks=1, acks=-1, fetch): this VM's
    disk and CPU share swing by 2x within a minute, so each row reports its
    median round (``median_round``)."""
    n = int(KAFKA_RECORDS * scale)
    kafka_port = free_port()
    rounds = []
    with ServerProcess("partita", ["--fsync", "everysec", "--kafka-port", str(kafka_port)]) as server:
        assert server.data_dir is not None
        bootstrap = f"127.0.0.1:{kafka_port}"
        for i in range(KAFKA_ROUNDS):
            admin = loadgen.Client(server.port)
            for topic in (f"acks1-{i}", f"acksall-{i}"):
                admin.call("TOPIC", "CREATE", topic)
            admin.close()
            dd = dd_mb_per_s(server.data_dir, max(1, n * KAFKA_RECORD_BYTES // 2**20))
            # (alternately first: the one after carries the other's dirty pages)
            if i % 2 == 0:
                acks1 = kafka_produce(server, bootstrap, f"acks1-{i}", n, 1)
                acks_all = kafka_produce(server, bootstrap, f"acksall-{i}", n, -1)
            else:
                acks_all = kafka_produce(server, bootstrap, f"acksall-{i}", n, -1)
                acks1 = kafka_produce(server, bootstrap, f"acks1-{i}", n, 1)
            fetch = kafka_fetch(server, bootstrap, f"acks1-{i}", n)
            rounds.append((dd, acks1, acks_all, fetch))
            print(f"  round {i + 1}: dd {dd.extra['value']:.0f} MB/s, acks=1 {acks1.extra['value']:.0f}, "
                  f"acks=-1 {acks_all.extra['value']:.0f}, fetch {fetch.extra['value']:.0f}", flush=True)
    return rounds


def median_round(rounds: list, measure: int, baseline: int) -> tuple[Measure, Measure]:
    """``(measure, baseline)`` of the round whose ratio of the two MB/s is the median."""
    pairs = sorted(((r[measure], r[baseline]) for r in rounds),
                   key=lambda pr: pr[0].extra["value"] / pr[1].extra["value"])
    return pairs[len(pairs) // 2]


# --- report ------------------------------------------------------------------------------

def fmt(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def markdown(rows: list[Row], header: str) -> str:
    lines = [header, "",
             "| workload | Partita req/s | Redis req/s | Partita entries/s | Redis entries/s | ratio | target "
             "| Partita p50/p99 ms | Redis p50/p99 ms | Partita CPU µs/req | Redis CPU µs/req |",
             "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        p, q = r.partita, r.redis
        met = target_met(r)
        if met is not None:
            r = Row(r.name, p, q, f"{r.target} ({'met' if met else 'NOT met'})", r.ratio_kind, met)
        if r.ratio_kind == "MB/s":  # Partita's MB/s beside a baseline's; CPU per record
            lines.append(f"| {r.name} | {fmt(p.extra.get('value'), 1)} MB/s | {fmt(q.extra.get('value'), 1)} MB/s "
                         f"| {fmt(p.entries_per_s, 0)} | | {r.ratio:.2f}x (MB/s) | {r.target} | | "
                         f"| {fmt(p.cpu_us_per_entry, 2)} per record | |")
            continue
        if r.ratio_kind == "value":
            lines.append(f"| {r.name} | {fmt(p.extra.get('value'), 2)} | {fmt(q.extra.get('value'), 2)} | | "
                         f"| {r.ratio:.2f}x | {r.target} | | | | |")
            continue
        ratio = f"{r.ratio:.2f}x ({r.ratio_kind})"
        if r.ratio_kind == "cpu/entry":  # the CPU columns are per request
            ratio = f"{r.ratio:.2f}x (cpu/entry: {fmt(p.cpu_us_per_entry, 2)} vs {fmt(q.cpu_us_per_entry, 2)} µs)"
        lines.append(
            f"| {r.name} | {fmt(p.req_per_s, 0)} | {fmt(q.req_per_s, 0)} | {fmt(p.entries_per_s, 0)} "
            f"| {fmt(q.entries_per_s, 0)} | {ratio} | {r.target} "
            f"| {fmt(p.p50_ms, 2)}/{fmt(p.p99_ms, 2)} | {fmt(q.p50_ms, 2)}/{fmt(q.p99_ms, 2)} "
            f"| {fmt(p.cpu_us_per_request, 2)} | {fmt(q.cpu_us_per_request, 2)} |")
    return "\n".join(lines) + "\n"


def target_met(row: Row) -> bool | None:
    """Whether a ratio target such as ``>= 0.35x`` or ``<= 0.35x`` is met (None: no ratio target)."""
    if row.met is not None:
        return row.met
    text = row.target.strip()
    for op in (">=", "<="):
        if text.startswith(op) and text.endswith("x"):
            try:
                bound = float(text[len(op):-1])
            except ValueError:
                return None
            return row.ratio >= bound if op == ">=" else row.ratio <= bound
    return None


def charts(rows: list[Row], stem: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    names = [r.name + ("  (lower is better)" if r.ratio_kind in ("cpu/entry", "value") else "")
             for r in rows]
    ratios = [r.ratio for r in rows]
    colours = {True: "tab:green", False: "tab:red", None: "tab:grey"}
    fig, ax = plt.subplots(figsize=(11, 0.5 * len(rows) + 1.5))
    bars = ax.barh(names, ratios, color=[colours[target_met(r)] for r in rows])
    for bar, r in zip(bars, rows):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {r.ratio:.2f}x  {r.target}",
                va="center", fontsize=8)
    ax.axvline(1.0, color="grey", linestyle="--")
    ax.set_xlim(0, max([1.0, *ratios]) * 1.45)
    ax.set_xlabel("Partita / Redis in the same run (green: target met, red: not met, grey: no target)")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(stem.with_suffix(".png"))
    plt.close(fig)


WORKLOADS = ["xadd", "xadd-p16", "xadd-always", "xread-10", "xread-1000", "group-loop", "mixed", "rss",
             "restart", "kafka"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench compare", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (a few minutes); figures are indicative")
    ap.add_argument("--only", nargs="*", choices=WORKLOADS, help="run only these workloads")
    ap.add_argument("--rss-entries", type=int, nargs="*", default=None,
                    help="stream sizes for the RSS workload (default 1M and 20M; --quick: 1M)")
    ap.add_argument("--restart-entries", type=int, default=None,
                    help="1 KiB entries written before the kill -9 restart (default 3M ≈ 3 GB; --quick 300k)")
    args = ap.parse_args(argv)
    scale = 0.1 if args.quick else 1.0
    chosen = args.only or WORKLOADS
    rows: list[Row] = []
    for name in chosen:
        print(f"running {name} ...", flush=True)
        if name == "xadd":
            p, r = w_xadd(scale, 1)
            rows.append(Row("XADD, 50 clients, unpipelined", p, r, ">= 0.5x"))
        elif name == "xadd-p16":
            p, r = w_xadd(scale, 16)
            rows.append(Row("XADD, 50 clients, -P 16", p, r, ">= 0.9x"))
        elif name == "xadd-always":
            p, r, p_always, p_everysec = w_xadd_always(scale)
            rows.append(Row("XADD -P 16, fsync always vs appendfsync always", p, r, "-"))
            rows.append(Row(f"XADD -P 16, Partita always vs Partita everysec (median of {FSYNC_PAIRS} pairs)",
                            p_always, p_everysec, ">= 0.9x"))
        elif name == "xread-10":
            p, r = w_xread(scale, 10)
            rows.append(Row("XREAD COUNT 10 over the stream", p, r, "-"))
        elif name == "xread-1000":
            p, r = w_xread(scale, 1000, XREAD_PAIRS)
            rows.append(Row(f"XREAD COUNT 1000, server CPU per entry (median of {XREAD_PAIRS} pairs)",
                            p, r, "<= 0.25x", "cpu/entry"))
        elif name == "group-loop":
            p, r = w_group_loop(scale)
            title = f"XREADGROUP COUNT 100 + XACK of the batch, {GROUP_CONSUMERS} consumers"
            rows.append(Row(f"{title}: server CPU per entry", p, r, "<= 0.8x", "cpu/entry"))
            rows.append(Row(f"{title}: entries/s", p, r, ">= 1.2x", "entries/s"))
        elif name == "mixed":
            p, r = w_mixed(scale)
            rows.append(Row("mixed: 25 producers -P 16 + 3 group consumers, 6 partitions (Redis: 6 streams)",
                            p, r, ">= 1.0x", "entries/s"))
        elif name == "rss":
            sizes = args.rss_entries or ([1_000_000] if args.quick else [1_000_000, 20_000_000])
            for size in sizes:
                p, r = w_rss(size)
                rows.append(Row(f"RSS MB after {size:,} entries", p, r, "Partita <= 150 MB at 20M", "value",
                                p.extra["value"] <= 150 if size >= 20_000_000 else None))
        elif name == "restart":
            entries = args.restart_entries or (300_000 if args.quick else 3_000_000)
            p, r = w_restart(entries)
            rows.append(Row(f"restart s after kill -9, {p.extra['disk_mb']:,.0f} MB on disk", p, r,
                            "Partita < 2 s", "value", p.extra["value"] < 2.0))
        elif name == "kafka":
            rounds = w_kafka(scale)
            of = f"median of {len(rounds)} rounds"
            rows.append(Row(f"Kafka produce, 1 KiB records, librdkafka, acks=1 (vs dd conv=fdatasync; {of})",
                            *median_round(rounds, 1, 0), ">= 0.5x", "MB/s"))
            rows.append(Row(f"Kafka produce, 1 KiB records, librdkafka, acks=-1 (vs dd conv=fdatasync; {of})",
                            *median_round(rounds, 2, 0), ">= 0.5x", "MB/s"))
            rows.append(Row(f"Kafka fetch, 1 KiB records, librdkafka consumer (vs the acks=1 produce; {of})",
                            *median_round(rounds, 3, 1), ">= 2x", "MB/s"))
    RESULTS_DIR.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    header = (f"# Partita vs redis-server — {time.strftime('%Y-%m-%d %H:%M')}"
              f"{' (quick)' if args.quick else ''}\n\nhost: {socket.gethostname()}, "
              f"command: `python -m bench compare{' --quick' if args.quick else ''}"
              f"{' --only ' + ' '.join(chosen) if args.only else ''}`")
    text = markdown(rows, header)
    out = RESULTS_DIR / f"compare-{stamp}.md"
    out.write_text(text)
    if not args.only:  # (latest.md is the last full run: one workload's rerun must not replace it)
        (RESULTS_DIR / "latest.md").write_text(text)
    charts(rows, RESULTS_DIR / f"compare-{stamp}")
    print(text)
    return 0
