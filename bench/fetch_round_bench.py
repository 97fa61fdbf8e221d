"""Fetch round benchmark: the CPU of one replica fetch round, in one process, by idle partitions.

Run:
    .venv/bin/python -m bench fetch-round            # 0, 4, 8, 16 idle partitions
    .venv/bin/python -m bench fetch-round 0 32       # those counts

Owns: a leader and a follower ``ReplicaManager`` (2 nodes, rf 2) over
TopicRegistry directories in a temporary directory, no sockets and no trio:
one round is what the follower's fetcher and the leader's ``PeerService``
do with a fetch apart from the I/O: ``fetch_request``, the request encoded
and decoded as on the bus (server/peer_resp.py, hiredis), ``serve_fetch``,
the response encoded and decoded, ``apply_fetch``. One partition gets one
100-byte entry per round; the others (``k``) stay idle. Prints the process
CPU per round (``time.process_time``, the entry's append subtracted),
median of 3 passes of 400 rounds. A multi-second run on a shared machine
moves by 10-20%; the per-idle-partition slope is the figure to read.

Every file it makes is under its temporary directory, removed at the end.
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path

import hiredis

from cluster.nodes import ClusterState, Node, Placement, key_slot
from cluster.replica_manager import ReplicaManager, Settings
from cluster.topics import TopicRegistry
from server.peer_resp import decode_request, decode_response, encode_request, encode_response
from server.reply import encode

ROUNDS = 400
VALUE = b"v" * 100


def _wire(args: list[bytes]):
    """A request's arguments as the bus reads them (a RESP array through hiredis)."""
    reader = hiredis.Reader()
    reader.feed(b"".join([b"*%d\r\n" % len(args)] + [b"$%d\r\n%s\r\n" % (len(a), a) for a in args]))
    return reader.gets()


def _wire_reply(value):
    reader = hiredis.Reader()
    reader.feed(encode(value, 2))
    return reader.gets()


def _node(root: Path, my_id: int) -> tuple[TopicRegistry, ReplicaManager]:
    cfg = types.SimpleNamespace(segment_bytes=1 << 24, stream_node_max_entries=100, acks="all",
                                min_insync_replicas=1)
    registry = TopicRegistry.open(root / f"n{my_id}", cfg)
    placement = Placement([Node(1, "h", 1), Node(2, "h", 2)], my_id)
    manager = ReplicaManager(registry, placement, ClusterState(placement, root / f"n{my_id}"),
                             Settings(lag_max_ms=10**9, fetch_wait_ms=200))
    return registry, manager


def us_per_round(idle: int) -> float:
    root = Path(tempfile.mkdtemp(prefix="fetch-round-"))
    try:
        (leader_reg, leader), (follower_reg, follower) = _node(root, 1), _node(root, 2)
        try:
            placement = leader.placement
            keys = [k for k in (b"s%d" % i for i in range(100_000))
                    if placement.replicas(placement.shard_of_slot(key_slot(k)))[0] == 1][:idle + 1]

            def add(key: bytes, n: int) -> None:
                for _ in range(n):
                    stream, pkey = leader_reg.append_target(key, [b"f", VALUE])
                    leader.before_append(pkey.rsplit(b"#", 1)[0], 0)
                    stream.add([b"f", VALUE])

            def one_round() -> None:
                asked, todo = follower.truncation_request(1)
                if todo:
                    follower.apply_truncation(1, todo, leader.end_offsets_for_epochs(asked))
                request = follower.fetch_request(1)
                response, _news = leader.serve_fetch(decode_request(_wire(encode_request(request))))
                follower.apply_fetch(1, decode_response(request, _wire_reply(encode_response(response))))

            for key in keys:
                add(key, 10)
            for _ in range(5):  # discovery, truncation, catching up
                one_round()
            assert len(follower.fetch_request(1).partitions) == idle + 1
            passes = []
            for _ in range(3):
                started = time.process_time()
                for _ in range(ROUNDS):
                    add(keys[0], 1)
                    one_round()
                both = time.process_time() - started
                started = time.process_time()
                add(keys[0], ROUNDS)
                appends = time.process_time() - started
                passes.append(1e6 * (both - appends) / ROUNDS)
            return statistics.median(passes)
        finally:
            leader_reg.close()
            follower_reg.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    counts = [int(a) for a in (argv if argv is not None else sys.argv[1:])] or [0, 4, 8, 16]
    print("| idle partitions | CPU µs per fetch round (request, RESP both ways, serve, apply) |")
    print("|---|---|")
    for idle in counts:
        print(f"| {idle} | {us_per_round(idle):.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
