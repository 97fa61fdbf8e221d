"""Group operations benchmark: the broker's XREADGROUP and XACK per entry, in one process.

Run:
    .venv/bin/python -m bench group-ops              # 100k entries, batches of 100
    .venv/bin/python -m bench group-ops 100000 10    # entries, batch size
    .venv/bin/python -m bench group-ops 20000 1 handlers  # through the command handlers

Owns: a ``Broker`` over a TopicRegistry in a temporary directory, no
sockets and no trio: a stream of 100-byte values, one group, and the
group-loop row's broker calls: ``Session.read_group_nowait`` of a batch
(``COUNT`` the batch size, ``>``) by consumers c0..c3 in turn, and
``Session.ack`` of each batch two reads later (the group's PEL holds a few
deliveries, as with the row's 4 consumers at once), its IDs parsed from
bytes as the XACK handler does (``parse_strict_id_tuples``). Prints the
process CPU (``time.process_time``) per entry of each, three passes.
What it leaves out: RESP, the command handlers, the connection, the kernel.
With ``handlers`` the same loop goes through the command handlers instead
(``server.commands.groups``: XREADGROUP's no-wait path and XACK, from their
argument lists, with their replies shaped; no RESP encoding): batches of 1
give the per-call cost of every layer from the handler down.

Every file it makes is under its temporary directory, removed at the end.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
import types
from pathlib import Path

from cluster.broker import Broker, XAddPlan
from cluster.broker.groups import GroupRead
from cluster.topics import TopicRegistry
from storage.entry_codec import decode_entry, split_entries
from storage.streams.groups import groups_of
from storage.streams.ids import parse_strict_id_tuples

try:  # the handler layer (server/), for ``handlers``
    from server.commands import groups as group_commands
except ImportError:  # pragma: no cover
    group_commands = None

VALUE = b"v" * 100
CONSUMERS = 4
ACK_LAG = 2  # reads between a batch's delivery and its XACK


class _Client:
    protocol = 2


class _Context:
    """What the group handlers use of a command's context."""

    def __init__(self, session) -> None:
        self.session = session
        self.client = _Client()
        self.views = False

    def read_view(self) -> bool:
        return True


def one_pass(entries: int, batch: int, handlers: bool = False) -> tuple[float, float]:
    """(XREADGROUP, XACK) CPU µs per entry over a new stream of ``entries``."""
    root = Path(tempfile.mkdtemp(prefix="group-ops-"))
    config = types.SimpleNamespace(segment_bytes=1 << 26, stream_node_max_entries=100, fsync="everysec",
                                   max_blocked_clients=0, default_partitions=1, group_session_timeout_ms=10_000)
    registry = TopicRegistry.open(root / "data", config)
    try:
        session = Broker(registry, config).session()
        for _ in range(entries):
            session.append(XAddPlan(b"s", [b"v", VALUE]))
        session.group_create(b"s", b"g", (0, 0))
        log = registry.get(b"s").log
        res = log.read(log.log_start_offset, log.log_end_offset)
        raws = [b"%d-%d" % tuple(decode_entry(e)[0]) for e in split_entries(res.chunks)]
        batches = [raws[i:i + batch] for i in range(0, entries, batch)]
        reads = [GroupRead(b"g", b"c%d" % k, [b"s"], [None], count=batch, view=True) for k in range(CONSUMERS)]
        ctx = _Context(session)
        argvs = [[b"XREADGROUP", b"GROUP", b"g", b"c%d" % k, b"COUNT", b"%d" % batch, b"STREAMS", b"s", b">"]
                 for k in range(CONSUMERS)]
        read_s = ack_s = 0.0
        clock = time.process_time
        for k in range(len(batches) + ACK_LAG):
            t0 = clock()
            if k >= len(batches):
                pass
            elif handlers:
                reply = group_commands.xreadgroup_now(ctx, argvs[k % CONSUMERS])
                assert reply[0][1].count == len(batches[k])  # [[key, entries]] (RESP2)
            else:
                served = session.read_group_nowait(reads[k % CONSUMERS])
                assert sum(d.count for d in served) == len(batches[k])
            t1 = clock()
            if k < ACK_LAG:
                pass
            elif handlers:
                acked = group_commands.xack(ctx, [b"XACK", b"s", b"g"] + batches[k - ACK_LAG])
                assert acked == len(batches[k - ACK_LAG])
            else:
                acked = session.ack(b"s", b"g", parse_strict_id_tuples(batches[k - ACK_LAG]), None)
                assert acked == len(batches[k - ACK_LAG])
            t2 = clock()
            read_s += t1 - t0
            ack_s += t2 - t1
        assert not groups_of(registry.get(b"s")).group(b"g").pel  # every entry delivered and acked
        return 1e6 * read_s / entries, 1e6 * ack_s / entries
    finally:
        registry.close()
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    argv = list(argv if argv is not None else sys.argv[1:])
    handlers = "handlers" in argv
    args = [int(a) for a in argv if a != "handlers"]
    entries = args[0] if args else 100_000
    batch = args[1] if len(args) > 1 else 100
    passes = [one_pass(entries, batch, handlers) for _ in range(3)]
    through = "through the command handlers" if handlers else "the broker's calls"
    print(f"{entries} entries, batches of {batch}, {through}: CPU µs per entry, 3 passes")
    print("XREADGROUP " + " ".join(f"{r:.3f}" for r, _ in passes))
    print("XACK       " + " ".join(f"{a:.3f}" for _, a in passes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
