"""Storage benchmark: append, read, recovery and memory of one partition log.

Run:
    /work/venv/bin/python -m bench.storage_bench --quick     # about a minute
    /work/venv/bin/python -m bench.storage_bench             # fuller sizes

Every figure is measured in the same run beside a dd-style sequential write
of the same size on the same disk (``--dir``, default a temp dir), so the
ratios mean something on any machine. Prints a markdown report.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from storage.entry_codec import encode_pair
from storage.log import LogConfig, PartitionLog

MiB = 1024 * 1024


def make_entry(ms: int, size: int) -> bytes:
    """A stored (stream-v1) entry ``ms-0`` with one field whose value pads it to ~size bytes."""
    pad = max(size - len(encode_pair((ms, 0), b"f", b"")) - 4, 1)
    return encode_pair((ms, 0), b"f", b"x" * pad)


def dd_write(path: Path, total_bytes: int, sync: bool) -> float:
    """MB/s of sequential 1 MiB writes (plus one fdatasync at the end when ``sync``)."""
    block = b"\0" * MiB
    os.sync()  # start from no dirty pages, as every append run does
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        for _ in range(total_bytes // MiB):
            os.write(fd, block)
        if sync:
            os.fdatasync(fd)
    finally:
        os.close(fd)
    dt = time.perf_counter() - t0
    os.unlink(path)
    return total_bytes / MiB / dt


def append_run(d: Path, entry_bytes: int, batch: int, fsync: str, total_bytes: int,
               time_budget_s: float) -> dict:
    """Append until ``total_bytes`` of entries or the time budget; returns rates."""
    shutil.rmtree(d, ignore_errors=True)
    log = PartitionLog.open(d, LogConfig())
    template = make_entry(10**12, entry_bytes)
    n_batches = max(total_bytes // (entry_bytes * batch), 1)
    ms = 1
    written = 0
    os.sync()  # the previous run's dirty pages must not throttle this one
    last_flush = time.perf_counter()
    t0 = time.perf_counter()
    deadline = t0 + time_budget_s
    done = 0
    for i in range(n_batches):
        ents = [(ms + k, 0, template) for k in range(batch)]
        ms += batch
        log.append(ents)
        written += batch * len(template)
        done += batch
        if fsync == "always":
            log.flush()
        elif fsync == "everysec":
            now = time.perf_counter()
            if now - last_flush >= 1.0:
                log.flush()
                last_flush = now
        if (i & 63) == 0 and time.perf_counter() > deadline:
            break
    if fsync != "no":
        log.flush()
    dt = time.perf_counter() - t0
    log.close()
    shutil.rmtree(d, ignore_errors=True)
    return {"entries_s": done / dt, "mb_s": written / MiB / dt, "entries": done, "seconds": dt}


def build_log(d: Path, entry_bytes: int, batch: int, total_bytes: int) -> int:
    shutil.rmtree(d, ignore_errors=True)
    log = PartitionLog.open(d, LogConfig())
    template = make_entry(10**12, entry_bytes)
    ms = 1
    for _ in range(max(total_bytes // (entry_bytes * batch), 1)):
        log.append([(ms + k, 0, template) for k in range(batch)])
        ms += batch
    end = log.log_end_offset
    log.close()
    return end


def read_run(d: Path, range_entries: int, seconds: float) -> dict:
    log = PartitionLog.open(d, LogConfig())
    end = log.log_end_offset
    rnd = random.Random(7)
    entries = 0
    reads = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(50):
            start = rnd.randrange(0, max(end - range_entries, 1))
            r = log.read(start, max_count=range_entries)
            entries += r.count
            reads += 1
    dt = time.perf_counter() - t0
    # sequential consumer: read the whole log in 1000-entry steps
    t1 = time.perf_counter()
    off = 0
    seq = 0
    while off < end:
        r = log.read(off, max_count=range_entries)
        seq += r.count
        off = r.next_offset
    dt_seq = time.perf_counter() - t1
    log.close()
    # a poll repeated on a freshly opened log (XREAD COUNT 1000 from the start,
    # as views): the batches were written before the open, so reads check CRCs
    log = PartitionLog.open(d, LogConfig())
    polls = 0
    t2 = time.perf_counter()
    while time.perf_counter() - t2 < seconds / 3:
        for _ in range(20):
            log.read_after_id(0, 0, range_entries, view=True)
            polls += 1
    dt_polls = time.perf_counter() - t2
    log.close()
    return {"random_entries_s": entries / dt, "reads_s": reads / dt, "seq_entries_s": seq / dt_seq,
            "polls_s": polls / dt_polls}


_KILL_CHILD = r"""
import sys, time
from pathlib import Path
from storage.log import LogConfig, PartitionLog
from bench.storage_bench import make_entry
d, entry_bytes, batch = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
log = PartitionLog.open(d, LogConfig())
template = make_entry(10**12, entry_bytes)
ms = log.last_id[0] + 1
last = time.perf_counter()
print("ready", flush=True)
while True:
    log.append([(ms + k, 0, template) for k in range(batch)])
    ms += batch
    now = time.perf_counter()
    if now - last >= 1.0:   # fsync everysec
        log.flush()
        last = now
"""


def recovery_run(d: Path, entry_bytes: int, batch: int, total_bytes: int, kill_after_s: float) -> dict:
    """Clean reopen, kill -9 under everysec flushing, and the no-flush worst case."""
    build_log(d, entry_bytes, batch, total_bytes)
    t0 = time.perf_counter()
    log = PartitionLog.open(d, LogConfig())
    clean_s = time.perf_counter() - t0
    size = log.size_bytes
    log.close()
    proc = subprocess.Popen([sys.executable, "-c", _KILL_CHILD, str(d), str(entry_bytes), str(batch)],
                            stdout=subprocess.PIPE, cwd=Path(__file__).resolve().parents[1])
    assert proc.stdout.readline().strip() == b"ready"
    time.sleep(kill_after_s)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    t0 = time.perf_counter()
    log = PartitionLog.open(d, LogConfig())
    kill_s = time.perf_counter() - t0
    size_after = log.size_bytes
    log.abandon()
    # worst case: no recovery checkpoint at all -> every segment is scanned
    os.unlink(d / "recovery-point.checkpoint")
    t0 = time.perf_counter()
    log = PartitionLog.open(d, LogConfig())
    full_s = time.perf_counter() - t0
    log.close()
    return {"size_mb": size / MiB, "size_after_kill_mb": size_after / MiB, "clean_s": clean_s,
            "kill9_s": kill_s, "full_scan_s": full_s}


_RSS_CHILD = r"""
import sys
from pathlib import Path
from storage.log import LogConfig, PartitionLog
from bench.storage_bench import make_entry
d, total_mb, step_mb = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
def rss_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
log = PartitionLog.open(d, LogConfig())
template = make_entry(10**12, 1024)
ms, written, next_report = 1, 0, 0
while written <= total_mb * 2**20:
    if written >= next_report:
        print(f"{written / 2**20:.0f} {rss_mb():.1f}", flush=True)
        next_report += step_mb * 2**20
    log.append([(ms + k, 0, template) for k in range(100)])
    ms += 100
    written += 100 * len(template)
    if (ms // 100) % 1000 == 0:
        log.read(max(log.log_end_offset - 1000, 0), max_count=1000)
log.close()
print(f"{written / 2**20:.0f} {rss_mb():.1f}", flush=True)
"""


def rss_run(d: Path, total_mb: int, step_mb: int) -> list[tuple[float, float]]:
    shutil.rmtree(d, ignore_errors=True)
    out = subprocess.run([sys.executable, "-c", _RSS_CHILD, str(d), str(total_mb), str(step_mb)],
                         capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1])
    shutil.rmtree(d, ignore_errors=True)
    return [tuple(map(float, line.split())) for line in out.stdout.split("\n") if line]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes (about a minute)")
    ap.add_argument("--dir", type=Path, default=None, help="scratch directory on the disk to measure")
    ap.add_argument("--recovery-mb", type=int, nargs="+", default=None, metavar="MB",
                    help="run only the recovery table, at these log sizes (e.g. 1024 8192)")
    args = ap.parse_args(argv)
    quick = args.quick
    base = Path(tempfile.mkdtemp(prefix="storage-bench-", dir=args.dir))
    try:
        if args.recovery_mb:
            recovery_table(base, args.recovery_mb)
        else:
            run(base, quick)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def recovery_table(base: Path, sizes_mb) -> None:
    print("\n## recovery (open time)\n")
    print("| log size | clean shutdown | kill -9 under everysec flushing | no checkpoint (full scan) |")
    print("|---|---|---|---|")
    for size_mb in sizes_mb:
        r = recovery_run(base / "k", 1024, 100, size_mb * MiB, 2.5)
        print(f"| {r['size_mb']:.0f} MiB (+{r['size_after_kill_mb'] - r['size_mb']:.0f} MiB by the killed writer) | "
              f"{r['clean_s'] * 1000:.1f} ms | {r['kill9_s'] * 1000:.1f} ms | {r['full_scan_s'] * 1000:.0f} ms |",
              flush=True)
        shutil.rmtree(base / "k", ignore_errors=True)


def run(base: Path, quick: bool) -> None:
    append_bytes = (128 if quick else 1024) * MiB
    budget_s = 8.0 if quick else 30.0
    print(f"# storage bench ({'quick' if quick else 'full'}), python {sys.version.split()[0]}, dir {base}\n")
    dd_sync = max(dd_write(base / "dd", append_bytes, sync=True) for _ in range(2))
    dd_nosync = max(dd_write(base / "dd", append_bytes, sync=False) for _ in range(2))
    print(f"dd-style sequential write of {append_bytes // MiB} MiB in 1 MiB blocks (best of 2): "
          f"{dd_nosync:.0f} MB/s without fsync, {dd_sync:.0f} MB/s with fdatasync at the end\n")

    print("## append\n")
    print("| entry | batch | fsync | entries/s | MB/s | % of dd with fdatasync (the disk's rate) |")
    print("|---|---|---|---|---|---|")
    for entry_bytes in (100, 1024):
        for batch in (1, 100):
            for fsync in ("no", "everysec", "always"):
                total = append_bytes if batch == 100 else append_bytes // 8
                budget = budget_s if fsync != "always" else budget_s / 4
                r = append_run(base / "a", entry_bytes, batch, fsync, total, budget)
                ref = dd_sync
                print(f"| {entry_bytes} B | {batch} | {fsync} | {r['entries_s']:,.0f} | {r['mb_s']:.0f} | "
                      f"{100 * r['mb_s'] / ref:.0f}% |", flush=True)

    print("\n## reads of 1000-entry ranges\n")
    print("| log | random ranges: entries/s | reads/s | sequential scan: entries/s "
          "| the first 1000 again after an open: reads/s |")
    print("|---|---|---|---|---|")
    for entry_bytes, batch in ((1024, 100), (100, 100), (100, 1), (1024, 1)):
        size = (256 if quick else 1024) * MiB if batch == 100 else (32 if quick else 128) * MiB
        build_log(base / "r", entry_bytes, batch, size)
        r = read_run(base / "r", 1000, 3.0 if quick else 10.0)
        print(f"| {entry_bytes} B entries, batches of {batch}, {size // MiB} MiB | {r['random_entries_s']:,.0f} | "
              f"{r['reads_s']:,.0f} | {r['seq_entries_s']:,.0f} | {r['polls_s']:,.0f} |", flush=True)
        shutil.rmtree(base / "r", ignore_errors=True)

    recovery_table(base, (256,) if quick else (1024, 4096))

    print("\n## RSS while one process appends 1 KiB entries in batches of 100\n")
    total_mb = 512 if quick else 4096
    points = rss_run(base / "m", total_mb, total_mb // 8)
    print("| written MiB | RSS MiB |")
    print("|---|---|")
    for written, rss in points:
        print(f"| {written:.0f} | {rss:.1f} |")


if __name__ == "__main__":
    main()
