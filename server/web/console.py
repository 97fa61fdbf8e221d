"""The web console: its files and the JSON it polls (``GET /api/status``).

Owns: the console's assets (``server/web/static/``: one HTML page, its
script, its style sheet; shipped in the package, read once at import: no
build step, nothing fetched from elsewhere at run time) and the status
document the page polls every second: the node, the cluster (nodes,
controller, shards with leaders and ISR), topics with their partitions
(offsets, sizes, where each is led), consumer groups (members, the
assignment, lag and pending entries per partition), and the totals the
page's rolling charts turn into rates (entries in and out, group lag).

Must not know: HTTP, sockets, ACL rules (the caller passes which topics the
user may see), Prometheus.
"""

from __future__ import annotations

import time
from importlib import resources
from typing import Any, Callable

from cluster.broker.status import BrokerStatus, PartitionStatus, snapshot
from server.state import REDIS_VERSION, partita_version
from server.web.metrics import label

_TYPES = {".html": b"text/html; charset=utf-8", ".js": b"text/javascript; charset=utf-8",
          ".css": b"text/css; charset=utf-8", ".txt": b"text/plain; charset=utf-8"}


def _load_assets() -> dict[bytes, tuple[bytes, bytes]]:
    """URL path -> (content type, bytes) of every file in ``static/``."""
    out: dict[bytes, tuple[bytes, bytes]] = {}
    for item in resources.files("server.web").joinpath("static").iterdir():
        suffix = "." + item.name.rsplit(".", 1)[-1]
        if item.is_file() and suffix in _TYPES:
            out[b"/" + item.name.encode()] = (_TYPES[suffix], item.read_bytes())
    out[b"/"] = out[b"/index.html"]
    return out


ASSETS = _load_assets()


def status(state: Any, may_see: Callable[[bytes], bool] | None = None) -> dict[str, Any]:
    """The document ``/api/status`` answers (docs/metrics.md, "The console")."""
    s = snapshot(state.broker, may_see)
    stats = state.stats
    return {
        "time_ms": int(time.time() * 1000),
        "node": {
            "id": s.cluster.node_id if s.cluster is not None else None,
            "version": partita_version(),
            "redis_version": REDIS_VERSION,
            "port": state.port,
            "uptime_s": state.uptime_s(),
            "connected_clients": len(state.clients),
            "blocked_clients": state.blocked_clients,
            "commands": stats.total_commands_processed,
            "entries_in": s.entries_in,
            "entries_out": s.entries_out,
            "fsync": state.config.fsync,
        },
        "cluster": _cluster(s),
        "topics": _topics(s),
        "groups": _groups(s),
    }


def _cluster(s: BrokerStatus) -> dict[str, Any] | None:
    c = s.cluster
    if c is None:
        return None
    return {
        "node_id": c.node_id,
        "controller": {"role": c.controller_role, "leader": c.controller_leader, "term": c.controller_term,
                       "voters": list(c.controller_voters)},
        "leader_changes": c.leader_changes,
        "nodes": [{"id": n.id, "address": f"{n.host}:{n.port}", "bus_port": n.bus_port, "fenced": n.fenced,
                   "voter": n.id in c.controller_voters, "controller": n.id == c.controller_leader,
                   "shards_led": sum(1 for sh in c.shards if sh.leader == n.id)} for n in c.nodes],
        "shards": [{"shard": sh.shard, "slots": f"{sh.first_slot}-{sh.last_slot}", "leader": sh.leader,
                    "epoch": sh.epoch, "replicas": list(sh.replicas), "isr": list(sh.isr)} for sh in c.shards],
    }


def _partition(p: PartitionStatus) -> dict[str, Any]:
    return {"partition": p.partition, "key": label(p.key), "held": p.held, "leading": p.leading,
            "leader": p.leader, "epoch": p.epoch, "replicas": list(p.replicas), "isr": list(p.isr),
            "log_start_offset": p.log_start_offset, "log_end_offset": p.log_end_offset,
            "high_watermark": p.high_watermark, "size_bytes": p.size_bytes, "segments": p.segments,
            "entries": p.entries, "entries_added": p.entries_added}


def _topics(s: BrokerStatus) -> list[dict[str, Any]]:
    by_topic: dict[bytes, list[PartitionStatus]] = {}
    for p in s.partitions:
        by_topic.setdefault(p.topic, []).append(p)
    out = []
    for t in s.topics:
        parts = by_topic.get(t.name, [])
        held = [p for p in parts if p.held]
        out.append({"name": label(t.name), "partitions": t.partitions,
                    "entries": sum(p.entries or 0 for p in held),
                    "size_bytes": sum(p.size_bytes or 0 for p in held),
                    "entries_added": sum(p.entries_added or 0 for p in held),
                    "partition_list": [_partition(p) for p in parts]})
    return out


def _groups(s: BrokerStatus) -> list[dict[str, Any]]:
    groups: dict[tuple[bytes, bytes], dict[str, Any]] = {}
    for g in s.groups:
        row = groups.setdefault((g.topic, g.group), {"topic": label(g.topic), "group": label(g.group),
                                                     "members": [], "partitions": []})
        row["partitions"].append({
            "partition": g.partition, "pending": g.pending, "lag": g.lag, "entries_read": g.entries_read,
            "last_id": "%d-%d" % g.last_id, "owner": label(g.owner) if g.owner is not None else None,
            "consumers": [{"name": label(c.name), "pending": c.pending, "idle_ms": c.idle_ms} for c in g.consumers]})
    for m in s.members:
        row = groups.get((m.topic, m.group))
        if row is not None:
            row["members"].append({"name": label(m.name), "partitions": list(m.partitions), "alive": m.alive,
                                   "idle_ms": m.idle_ms})
    out = []
    for key in sorted(groups):
        row = groups[key]
        lags = [p["lag"] for p in row["partitions"]]
        row["lag"] = None if any(lag is None for lag in lags) else sum(lags)
        row["pending"] = sum(p["pending"] for p in row["partitions"])
        row["consumers"] = sorted({c["name"] for p in row["partitions"] for c in p["consumers"]})
        out.append(row)
    return out
