"""Replication benchmark: XADD on a 3-node cluster (rf 3) with acks=1 and acks=all beside one node.

Run:
    /work/venv/bin/python -m bench.replication_bench --quick   # one round, about 20 s
    /work/venv/bin/python -m bench.replication_bench           # three rounds, bigger runs (under 3 min)
    ... --fsync always                                         # every node (and the single one) under fsync always
    ... [--split] [--profile]                                  # diagnostics, see below

Owns: starting one single node and one 3-node cluster (``--replication-factor
3``) side by side, every node ``--fsync everysec`` (Partita's default; or
``--fsync always``, the single node too, so the ratios compare like with like); the
XADD load (redis-benchmark ``-c 50``, once with ``-P 16`` and once
unpipelined, ``XADD <key> * field <100 B>``) on a fresh topic per run, sent
to the node that leads the key's slot (found with CLUSTER KEYSLOT and CLUSTER
SLOTS; every cluster key is picked so node 1 leads it, so every cluster run
measures the same leader process); the topic is created on that leader with
``TOPIC CREATE <key> CONFIG acks 1|all`` (checked with TOPIC DESCRIBE) before
the run. Rounds run single node, acks=1 and acks=all back to back, so the
ratios compare figures taken seconds, not hours, apart on a shared machine.

After the load it checks that every run's entries are all there and that the
followers caught up: the leader's INFO replication line of each partition
shows ``isr=1/2/3`` and ``high_watermark == end_offset ==`` the XADDs sent,
and each follower's line shows the same end offset and high watermark (a
follower learns the high watermark on its next fetch: up to
``replica-fetch-wait-max-ms`` later). It also lists warnings
(``#``) and tracebacks in the partita logs. Reports req/s, p50/p99, the
leader's (and followers') CPU per request from /proc, and the ratios
acks=all/acks=1, acks=all/single, acks=1/single as markdown, printed and
written to ``bench/results/replication-<time>.md``; exits 1 when a check
failed.

Diagnostics: ``--split`` adds a fourth server, one partita in a cluster of
itself (rf 1): the cluster code path (routing, leader checks, acks
bookkeeping) with nothing to replicate, to tell that cost from replication's.
``--profile`` adds one -P 16 run per config under py-spy (not counted in the
tables) and reports the leader's CPU per XADD split by function.

Every process started here is stopped here, and only those.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from bench.compare import redis_benchmark
from bench.loadgen import Client
from bench.procs import ServerProcess, free_port

RESULTS_DIR = Path(__file__).with_name("results")
VALUE = "v" * 100
SOLO = "1-node cluster"  # --split: the cluster code path with nothing to replicate
MODES = (("-P 16", 16), ("unpipelined", 1))
TARGET_RATIO = 0.5  # issue 9: acks=all >= 0.5x single-node pipelined req/s
CATCH_UP_TIMEOUT_S = 20.0
LOG_LINE = re.compile(r"^\d+:[A-Z] .*? \d\d:\d\d:\d\d\.\d+ ([.\-*#]) (.*)$")


def code_version() -> str:
    """Where the servers' code comes from (the ``server`` package the partita
    executable imports) and, in a git checkout, its commit and any uncommitted
    change under server/, cluster/, storage/: others commit while this runs."""
    spec = importlib.util.find_spec("server")
    if spec is None or spec.origin is None:
        return "unknown"
    root = Path(spec.origin).resolve().parent.parent
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "server", "cluster", "storage"],
                               capture_output=True, text=True, check=True, timeout=10).stdout.split("\n")
    except (OSError, subprocess.SubprocessError):
        return f"{root} (not a git checkout)"
    changed = [line[3:] for line in dirty if line.strip()]
    return f"{root} at {head}" + (f", uncommitted changes in {', '.join(changed)}" if changed else ", clean")


def _text(value) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


@dataclass
class Run:
    """One redis-benchmark run against one config."""

    round: int
    config: str
    mode: str
    key: str
    requests: int
    seconds: float
    rps: float
    p50_ms: float
    p99_ms: float
    leader_cpu_s: float
    followers_cpu_s: float = 0.0

    @property
    def leader_us_per_request(self) -> float:
        return 1e6 * self.leader_cpu_s / self.requests

    @property
    def followers_us_per_request(self) -> float:
        return 1e6 * self.followers_cpu_s / self.requests


class Cluster:
    """Three partita processes on free ports forming one static cluster."""

    def __init__(self, size: int = 3, replication_factor: int = 3, fsync: str = "everysec") -> None:
        ports: list[int] = []
        while len(ports) < 2 * size:  # a client port and a cluster bus port per node
            p = free_port()
            if p not in ports:
                ports.append(p)
        ports, bus_ports = ports[:size], ports[size:]
        self.ids = list(range(1, size + 1))
        spec = ",".join(f"{i}@127.0.0.1:{p}@{b}" for i, p, b in zip(self.ids, ports, bus_ports))
        self.nodes = {
            i: ServerProcess("partita", ["--fsync", fsync, "--node-id", str(i), "--cluster-nodes", spec,
                                         "--replication-factor", str(replication_factor)], port=p)
            for i, p in zip(self.ids, ports)
        }

    def start(self) -> "Cluster":
        started = []
        try:
            for node in self.nodes.values():
                started.append(node)
                node.start()
        except BaseException:
            for node in started:
                node.cleanup()
            raise
        return self

    def cleanup(self) -> None:
        for node in self.nodes.values():
            node.cleanup()

    def by_port(self, port: int) -> ServerProcess:
        return next(n for n in self.nodes.values() if n.port == port)

    def leader_port(self, key: str) -> int:
        """The port of the node leading ``key``'s slot, from CLUSTER KEYSLOT and CLUSTER SLOTS."""
        c = Client(self.nodes[self.ids[0]].port)
        try:
            slot = int(c.call("CLUSTER", "KEYSLOT", key))
            for first, last, master, *_replicas in c.call("CLUSTER", "SLOTS"):
                if int(first) <= slot <= int(last):
                    return int(master[1])
        finally:
            c.close()
        raise RuntimeError(f"no node serves slot {slot} of {key!r}")

    def key_led_by(self, node_id: int, prefix: str) -> str:
        want = self.nodes[node_id].port
        for i in range(10_000):
            key = f"{prefix}-{i}"
            if self.leader_port(key) == want:
                return key
        raise RuntimeError(f"no key {prefix}-N led by node {node_id}")


def topic_config(port: int, key: str) -> dict[str, str]:
    c = Client(port)
    try:
        desc = c.call("TOPIC", "DESCRIBE", key)
    finally:
        c.close()
    flat = dict(zip(map(_text, desc[0::2]), desc[1::2])) if isinstance(desc, list) else desc
    cfg = flat.get("config") or flat.get(b"config") or []
    if isinstance(cfg, dict):
        return {_text(k): _text(v) for k, v in cfg.items()}
    return {_text(k): _text(v) for k, v in zip(cfg[0::2], cfg[1::2])}


def create_topic(port: int, key: str, acks: str | None) -> None:
    """TOPIC CREATE, retried while the cluster answers TRYAGAIN / CLUSTERDOWN
    (a leader's controller lease can lapse while the single-node run before
    this one holds both cores), as a client would retry; 30 s at most."""
    argv = ["TOPIC", "CREATE", key] + ([] if acks is None else ["CONFIG", "acks", acks])
    deadline = time.monotonic() + 30
    while True:
        c = Client(port)
        try:
            c.call(*argv)
            break
        except RuntimeError as e:
            retry = "TRYAGAIN" in str(e) or "CLUSTERDOWN" in str(e)
            if not retry or time.monotonic() > deadline:
                raise
        finally:
            c.close()
        time.sleep(0.2)
    if acks is not None:
        got = topic_config(port, key).get("acks")
        if got != acks:
            raise RuntimeError(f"topic {key}: TOPIC DESCRIBE says acks={got!r}, asked for {acks}")


def info_partitions(port: int) -> dict[str, dict[str, str]]:
    """``partitionN:key=K,...`` lines of INFO replication, by key."""
    c = Client(port)
    try:
        text = _text(c.call("INFO", "replication"))
    finally:
        c.close()
    out: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        if not line.startswith("partition") or ":" not in line:
            continue
        fields = dict(kv.split("=", 1) for kv in line.split(":", 1)[1].split(",") if "=" in kv)
        if "key" in fields:
            out[fields["key"]] = fields
    return out


def check_caught_up(cluster: Cluster, leader_id: int, expected: dict[str, int]) -> tuple[bool, float, list[str]]:
    """Poll until every key's partition is fully replicated; returns (ok, seconds waited, report lines)."""
    isr_all = "/".join(map(str, cluster.ids))
    leader = cluster.nodes[leader_id]
    followers = [n for i, n in cluster.nodes.items() if i != leader_id]
    start = time.monotonic()
    while True:
        lead = info_partitions(leader.port)
        fol = [info_partitions(f.port) for f in followers]
        problems = []
        lines = []
        for key, count in expected.items():
            p = lead.get(key)
            if p is None or p.get("role") != "leader":
                problems.append(f"{key}: no leader line on node {leader_id}")
                continue
            hw, end = int(p["high_watermark"]), int(p["end_offset"])
            f_ends = [(int(f[key]["end_offset"]), int(f[key]["high_watermark"])) if key in f else (None, None)
                      for f in fol]
            lines.append(f"{key}: isr={p['isr']} high_watermark={hw} end_offset={end} "
                         f"(sent {count}); followers end_offset/high_watermark: "
                         + ", ".join(f"{e}/{h}" for e, h in f_ends))
            if p["isr"] != isr_all or hw != end or end != count or any(e != end or h != end for e, h in f_ends):
                problems.append(lines[-1])
        waited = time.monotonic() - start
        if not problems:
            return True, waited, lines
        if waited > CATCH_UP_TIMEOUT_S:
            return False, waited, problems
        time.sleep(0.1)


def log_warnings(server: ServerProcess) -> list[str]:
    """Warning lines (``#``) and tracebacks of a partita log."""
    assert server.data_dir is not None
    path = server.data_dir / "partita.log"
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        m = LOG_LINE.match(line)
        if (m and m.group(1) == "#") or "Traceback" in line or "Error" in line and not m:
            out.append(line)
    return out


class Profiler:
    """py-spy record of one process's Python (``--gil``) for the duration of a ``with`` block (raw collapsed stacks)."""

    def __init__(self, pid: int, out: Path) -> None:
        self.pid, self.out = pid, out
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "Profiler":
        exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        # --gil: only samples that hold the GIL, i.e. run Python. Without it a
        # process that is runnable but waits for one of the 2 shared cores
        # (woken from epoll, preempted in a send) is sampled as busy where it
        # waits: under load that was most of the leader's samples.
        self.proc = subprocess.Popen([exe, "record", "--pid", str(self.pid), "--format", "raw", "--rate", "200",
                                      "--nonblocking", "--gil", "-o", str(self.out)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)  # let py-spy attach before the load starts
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(2)  # SIGINT: py-spy writes its output and exits
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def read_profile(path: Path) -> tuple[int, Counter, Counter]:
    """(samples, inclusive samples per function, self samples per function) of py-spy raw output."""
    inclusive: Counter[str] = Counter()
    leaf: Counter[str] = Counter()
    total = 0
    text = path.read_text(errors="replace") if path.exists() else ""
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        # "func (path/file.py:line)" -> "func (file.py)": one row per function
        frames = [re.sub(r" \((?:.*/)?([^/:]+)(?::\d+)?\)$", r" (\1)", f) for f in stack.split(";")]
        if frames and frames[0].startswith("process "):
            frames = frames[1:]
        total += n
        for f in set(frames):
            inclusive[f] += n
        if frames:
            leaf[frames[-1]] += n
    return total, inclusive, leaf


def profile_tables(profiled: dict[str, tuple[Run, Path]], top: int = 22) -> list[str]:
    """Leader CPU µs per XADD by function, one column per config: sample share x measured CPU/req."""
    data = {c: (run, *read_profile(path)) for c, (run, path) in profiled.items()}
    out = ["Samples: " + ", ".join(f"{c} {d[1]}" for c, d in data.items()) + ". "
           "A function's µs/req = its share of the samples x the run's leader CPU µs/req.", ""]

    def us(c: str, counter_index: int, frame: str) -> float:
        run, total = data[c][0], data[c][1]
        return run.leader_us_per_request * data[c][counter_index][frame] / total if total else 0.0

    skip = re.compile(r"^(<module>|main|run|unrolled_run|_run_connection|Connection\.run) \(")
    for title, idx in (("inclusive (the function and what it calls)", 2), ("self (the function's own lines)", 3)):
        frames: Counter[str] = Counter()
        for c in data:
            for f in data[c][idx]:
                if not skip.match(f):
                    frames[f] = max(frames[f], us(c, idx, f))
        configs = list(data)
        out += [f"Leader CPU µs per XADD, {title}:", "",
                "| function | " + " | ".join(configs) + " |", "|---|" + "---|" * len(configs)]
        out.append("| **total (measured, /proc)** | "
                   + " | ".join(f"**{data[c][0].leader_us_per_request:.1f}**" for c in configs) + " |")
        for f, _v in frames.most_common(top):
            out.append(f"| `{f}` | " + " | ".join(f"{us(c, idx, f):.1f}" for c in configs) + " |")
        out.append("")
    return out


def bench_run(rnd: int, config: str, mode: str, pipeline: int, key: str, port: int, requests: int,
              leader: ServerProcess, followers: list[ServerProcess], profile_to: Path | None = None) -> Run:
    cmd = ["XADD", key, "*", "field", VALUE]
    cpu0 = leader.cpu_seconds()
    fcpu0 = sum(f.cpu_seconds() for f in followers)
    if profile_to is not None:
        with Profiler(leader.pid, profile_to):
            cpu0 = leader.cpu_seconds()
            seconds, rps, p50, p99 = redis_benchmark(port, cmd, requests=requests, clients=50, pipeline=pipeline)
            cpu = leader.cpu_seconds() - cpu0
    else:
        seconds, rps, p50, p99 = redis_benchmark(port, cmd, requests=requests, clients=50, pipeline=pipeline)
        cpu = leader.cpu_seconds() - cpu0
    fcpu = sum(f.cpu_seconds() for f in followers) - fcpu0
    return Run(rnd, config, mode, key, requests, seconds, rps, p50, p99, cpu, fcpu)


def ratio(a: float, b: float) -> float:
    return a / b if b else 0.0


def median_ratio(by: dict, rounds: int, mode: str, top: str, bottom: str) -> float:
    return statistics.median(ratio(by[(i, top, mode)].rps, by[(i, bottom, mode)].rps) for i in range(rounds))


def markdown(runs: list[Run], header: str, rounds: int, configs: list[str]) -> tuple[list[str], float]:
    """The report's tables; also the target ratio (acks=all / single, -P 16)."""
    out = [header, ""]
    by = {(r.round, r.config, r.mode): r for r in runs}
    split = SOLO in configs
    # Summary: per mode, the median over rounds of req/s and of each round's ratios.
    cols = ["single node req/s", *([f"{SOLO} req/s"] if split else []), "acks=1 req/s", "acks=all req/s",
            "acks=all / acks=1", "acks=all / single", "acks=1 / single", *([f"{SOLO} / single"] if split else [])]
    out += ["| XADD, 50 clients | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    target = 0.0
    for mode, _p in MODES:
        med = {c: statistics.median(by[(i, c, mode)].rps for i in range(rounds)) for c in configs}
        r_all_s = median_ratio(by, rounds, mode, "acks=all", "single")
        cells = [f"{med['single']:,.0f}", *([f"{med[SOLO]:,.0f}"] if split else []),
                 f"{med['acks=1']:,.0f}", f"{med['acks=all']:,.0f}",
                 f"{median_ratio(by, rounds, mode, 'acks=all', 'acks=1'):.2f}x", f"**{r_all_s:.2f}x**",
                 f"{median_ratio(by, rounds, mode, 'acks=1', 'single'):.2f}x",
                 *([f"{median_ratio(by, rounds, mode, SOLO, 'single'):.2f}x"] if split else [])]
        out.append(f"| {mode} | " + " | ".join(cells) + " |")
        if mode == "-P 16":
            target = r_all_s
    met = target >= TARGET_RATIO
    out += ["", f"Target (issue 9): acks=all >= {TARGET_RATIO}x single-node -P 16 req/s: "
            f"**{target:.2f}x, {'met' if met else 'NOT met'}**" + (f" (median of {rounds} rounds)" if rounds > 1 else ""),
            ""]
    cpu = {c: statistics.median(by[(i, c, "-P 16")].leader_us_per_request for i in range(rounds)) for c in configs}
    out += ["Leader CPU per XADD at -P 16 (median): " + ", ".join(f"{c} {v:.1f} µs" for c, v in cpu.items()) + ".",
            ""]
    out += ["Every run (leader CPU: the process serving the XADDs; followers: both followers together; "
            "µs of user+system CPU per XADD, from /proc):", "",
            "| round | config | mode | key | requests | req/s | p50 ms | p99 ms | leader CPU µs/req "
            "| followers CPU µs/req |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        fol = f"{r.followers_us_per_request:.1f}" if r.config.startswith("acks") else "-"
        out.append(f"| {r.round + 1} | {r.config} | {r.mode} | `{r.key}` | {r.requests:,} | {r.rps:,.0f} "
                   f"| {r.p50_ms:.2f} | {r.p99_ms:.2f} | {r.leader_us_per_request:.1f} | {fol} |")
    return out, target


def xlen(port: int, key: str) -> int:
    c = Client(port)
    try:
        return int(c.call("XLEN", key))
    finally:
        c.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.replication_bench", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one round of smaller runs (about 20 s)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds of every config (default 3; --quick 1)")
    ap.add_argument("--requests", type=int, default=None,
                    help="XADDs per -P 16 run (default 300k; --quick 100k); unpipelined runs send a quarter")
    ap.add_argument("--fsync", choices=("everysec", "always"), default="everysec",
                    help="every node's fsync policy, the single node's too (default everysec)")
    ap.add_argument("--split", action="store_true",
                    help=f"also a '{SOLO}' (--cluster-nodes of itself, rf 1): the cluster code path, "
                         "nothing to replicate")
    ap.add_argument("--profile", action="store_true",
                    help="one more -P 16 run per config under py-spy; the leader's CPU per XADD by function")
    args = ap.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 3)
    n_p16 = args.requests or (100_000 if args.quick else 300_000)
    sizes = {"-P 16": n_p16, "unpipelined": max(n_p16 // 4, 1000)}
    configs = ["single", *([SOLO] if args.split else []), "acks=1", "acks=all"]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    RESULTS_DIR.mkdir(exist_ok=True)

    code = code_version()
    load0 = os.getloadavg()
    t0 = time.monotonic()
    single = ServerProcess("partita", ["--fsync", args.fsync])
    solo_port = free_port()
    solo = ServerProcess("partita", ["--fsync", args.fsync, "--node-id", "1",
                                     "--cluster-nodes", f"1@127.0.0.1:{solo_port}@{free_port()}"], port=solo_port)
    cluster = Cluster(3, 3, args.fsync)
    runs: list[Run] = []
    profiled: dict[str, tuple[Run, Path]] = {}
    expected: dict[str, int] = {}  # cluster key -> XADDs sent
    local: list[tuple[ServerProcess, str, int]] = []  # single / solo: (server, key, XADDs sent)
    try:
        single.start()
        if args.split:
            solo.start()
        cluster.start()
        leader_id = cluster.ids[0]
        leader = cluster.nodes[leader_id]
        followers = [n for i, n in cluster.nodes.items() if i != leader_id]

        def one_run(rnd: int, config: str, mode: str, pipeline: int, n: int, name: str,
                    profile_to: Path | None = None) -> Run:
            """Create the run's topic where its key is led, then load it."""
            if config in ("single", SOLO):
                server = single if config == "single" else solo
                key = f"{name}-0"
                create_topic(server.port, key, None if config == "single" else "1")
                local.append((server, key, n))
                where, fols, port = "", [], server.port
            else:
                acks = config.split("=")[1]
                key = cluster.key_led_by(leader_id, name)  # same length as the others: slot hashing is per byte
                port = cluster.leader_port(key)
                assert port == leader.port, (key, port)
                create_topic(port, key, acks)
                expected[key] = n
                where, server, fols = f" on {key} (leader node {leader_id}, port {port})", leader, followers
            print(f"{'profiling' if profile_to else f'round {rnd + 1}'}: {config} {mode} x{n:,}{where} ...",
                  flush=True)
            return bench_run(rnd, config, mode, pipeline, key, port, n, server, fols, profile_to)

        short = {"single": "single", SOLO: "rf1", "acks=1": "one", "acks=all": "all"}
        for rnd in range(rounds):
            for mode, pipeline in MODES:
                tag = "p16" if pipeline > 1 else "p1"
                for config in configs:
                    runs.append(one_run(rnd, config, mode, pipeline, sizes[mode], f"{short[config]}-{tag}-r{rnd}"))
            print(f"  round {rnd + 1}: " + ", ".join(f"{r.config} {r.mode} {r.rps:,.0f}/s"
                                                    for r in runs if r.round == rnd), flush=True)
        if args.profile:
            # Extra runs, not in the tables: py-spy takes CPU from the servers it watches.
            for config in configs:
                prof = RESULTS_DIR / f"replication-{stamp}-{short[config]}.pyspy.txt"
                profiled[config] = (one_run(-1, config, "-P 16", 16, n_p16, f"{short[config]}-prof", prof), prof)
        ok, waited, lines = check_caught_up(cluster, leader_id, expected)
        local_bad = [(s.port, k, xlen(s.port, k), n) for s, k, n in local if xlen(s.port, k) != n]
        servers = {"single": single, **({SOLO: solo} if args.split else {}),
                   **{f"node {i}": n for i, n in cluster.nodes.items()}}
        warnings = {name: log_warnings(s) for name, s in servers.items()}
    finally:
        single.cleanup()
        solo.cleanup()
        cluster.cleanup()
    elapsed = time.monotonic() - t0
    load1 = os.getloadavg()
    code_end = code_version()

    command = ("python -m bench.replication_bench" + (" --quick" if args.quick else "")
               + (f" --rounds {args.rounds}" if args.rounds else "")
               + (f" --requests {args.requests}" if args.requests else "")
               + (f" --fsync {args.fsync}" if args.fsync != "everysec" else "")
               + (" --split" if args.split else "") + (" --profile" if args.profile else ""))
    header = (f"# Replication: XADD on 3 nodes (rf 3), acks=1 and acks=all, vs one node — "
              f"{time.strftime('%Y-%m-%d %H:%M')}{' (quick)' if args.quick else ''}\n\n"
              f"host: {socket.gethostname()} ({os.cpu_count()} CPUs, shared; load average "
              f"{load0[0]:.2f} before, {load1[0]:.2f} after), command: `{command}`, {elapsed:.0f} s; "
              f"code: {code}{' (at the end: ' + code_end + ')' if code_end != code else ''}. "
              f"All partita processes run side by side, `--fsync {args.fsync}`; redis-benchmark "
              f"`-c 50 [-P 16] XADD <key> * field <100 B>`; {rounds} round(s) of "
              f"{' / '.join(configs)} back to back, each run on a fresh topic (cluster keys of 12 bytes: the leader hashes them per byte); "
              f"ratios are per round{', then the median' if rounds > 1 else ''}"
              + (f"; '{SOLO}' is one partita with `--node-id 1 --cluster-nodes 1@<itself>` (rf 1): "
                 "the cluster code path with nothing to replicate" if args.split else "") + ".")
    out, _target = markdown(runs, header, rounds, configs)
    out += ["", "## Replication check", ""]
    if ok:
        out.append(f"**Followers caught up**: {waited:.1f} s after the last run, every cluster partition "
                   f"had isr={'/'.join(map(str, cluster.ids))} and high_watermark == end_offset == the "
                   f"XADDs sent, and both followers had the same end offset and high watermark:")
    else:
        out.append(f"**Followers did NOT catch up** within {CATCH_UP_TIMEOUT_S:.0f} s (leader INFO replication):")
    out += ["", *[f"- {line}" for line in lines], ""]
    out.append("Single node" + (f" and {SOLO}" if args.split else "") + ": XLEN == XADDs sent for every run: "
               + ("yes." if not local_bad else f"NO (port, key, XLEN, sent): {local_bad}."))
    total_warn = sum(len(v) for v in warnings.values())
    out.append(f"Warnings or tracebacks in the partita logs: {total_warn}.")
    for name, lines_w in warnings.items():
        for w in lines_w[:5]:
            out.append(f"    {name}: {w}")
    if profiled:
        out += ["", "## Where the leader's time goes (py-spy record, 200 Hz, one extra -P 16 run per config)", ""]
        out += ["Profiled runs (py-spy shares the CPUs, so these are slower than the table): "
                + ", ".join(f"{c} {r.rps:,.0f} req/s, {r.leader_us_per_request:.1f} µs/req"
                            for c, (r, _p) in profiled.items()) + ".", ""]
        out += profile_tables(profiled)
        for _r, path in profiled.values():
            path.unlink(missing_ok=True)
    text = "\n".join(out) + "\n"
    path = RESULTS_DIR / f"replication-{stamp}.md"
    path.write_text(text)
    print(text)
    print(f"written to {path}")
    return 0 if ok and not local_bad and not total_warn else 1


if __name__ == "__main__":
    sys.exit(main())
