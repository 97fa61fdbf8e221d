"""``python -m bench <name>``: run one of Partita's benchmarks.

- ``compare``: Partita beside redis-server, every workload (bench/compare.py).
- ``storage``: the partition log on its own (bench/storage_bench.py).
- ``replication``: a 3-node cluster, acks=all and acks=1, beside one node (bench/replication_bench.py).
- ``failover``: how long a shard is unavailable after its leader's kill -9 (bench/failover_bench.py).
- ``fetch-round``: the CPU of one replica fetch round in one process, by idle partitions (bench/fetch_round_bench.py).
- ``group-ops``: the broker's XREADGROUP and XACK CPU per entry in one process (bench/group_ops_bench.py).
"""

from __future__ import annotations

import importlib
import sys

BENCHES = {"compare": "bench.compare", "storage": "bench.storage_bench",
           "replication": "bench.replication_bench", "failover": "bench.failover_bench",
           "fetch-round": "bench.fetch_round_bench", "group-ops": "bench.group_ops_bench"}


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in BENCHES:
        print(__doc__)
        return 2
    module = importlib.import_module(BENCHES[sys.argv[1]])
    return module.main(sys.argv[2:]) or 0


if __name__ == "__main__":
    sys.exit(main())
