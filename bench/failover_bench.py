"""How long a shard is unavailable when its leader dies: a 3-node cluster on
its defaults (controller-session-timeout-ms 3000), kill -9 of a shard's
leader, then the time until an XADD to that shard is acknowledged by the new
leader. Measured twice per round: a leader that is not the elected controller
(the controller fences it as soon as its connection to it is refused) and one
that is (a Raft election comes first: its voters find the refusal on their
heartbeats and campaign at once).

    /work/venv/bin/python -m bench failover [--rounds N]

Uses the test suite's cluster kit (tests/clusterkit.py), so it runs from a
checkout. Prints one line per case with every round and the median.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[1]


def _one(controller_too: bool) -> float:
    sys.path.insert(0, str(ROOT))
    from tests.clusterkit import Cluster

    with tempfile.TemporaryDirectory() as tmp:
        cluster = Cluster(Path(tmp), 3)
        try:
            ctrl = next(n for n in cluster.nodes
                        if n.client().execute_command("INFO", "replication")["controller_role"] == "leader")
            key = next(k for k in (f"k{i}".encode() for i in range(5000))
                       if (cluster.leader_of(k) is ctrl) == controller_too)
            old = cluster.leader_of(key)
            old.client().xadd(key, {"a": 1})
            old.kill9()
            started = time.monotonic()
            while True:
                try:
                    new = cluster.leader_of(key)
                    if new is not old:
                        new.client(socket_timeout=2).xadd(key, {"a": 2})
                        return time.monotonic() - started
                except (redis.RedisError, OSError, AssertionError, StopIteration):
                    pass
                time.sleep(0.02)
        finally:
            cluster.stop()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench failover")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    for controller_too in (False, True):
        times = [_one(controller_too) for _ in range(args.rounds)]
        what = "leader also the controller" if controller_too else "leader not the controller"
        print(f"{what}: {', '.join(f'{t:.2f}' for t in times)} s (median {statistics.median(times):.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
