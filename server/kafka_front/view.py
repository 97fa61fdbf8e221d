"""Kafka groups as TOPIC GROUPS / TOPIC DESCRIBE show them beside Redis groups (one view of all groups).

Owns: ``topic_groups_reply`` (and ``xinfo_groups_reply``, XINFO GROUPS's
rows, from it): for each Kafka group of this node's
coordinator that has members assigned to the topic or offsets committed on
it, a map ``name``, ``type`` (``kafka``), ``state``, ``protocol`` (a classic
group's chosen assignor, or ``consumer`` for a KIP-848 group),
``members`` (member id, client id, host, partition keys assigned) and per
partition: ``partition``, ``key``, ``owner`` (the member assigned it, nil),
``committed-offset`` (nil: none), ``end-offset`` (the high watermark) and
``lag`` (end offset - committed offset, as kafka-consumer-groups shows it;
nil without a committed offset or where another node leads the partition).

Kafka groups and Redis groups are separate namespaces: a Kafka group ``g``
and a Redis group ``g`` on the same topic are two groups, shown side by
side with their ``type``.

Must not know: the wire format, RESP parsing.
"""

from __future__ import annotations

from typing import Any

from cluster.topics import partition_key, split_partition_key
from server.kafka_front.groups import decode_assignment
from server.reply import Map


def topic_groups_reply(coordinator: Any, session: Any, topic: bytes, count: int, only: bytes | None) -> list:
    if coordinator is None:
        return []
    name = topic.decode("utf-8", "surrogateescape")
    store = coordinator.store
    out = []
    for gid in coordinator.group_ids():
        if only is not None and gid.encode() != only:
            continue
        committed = store.of_group(gid) if store is not None else {}
        g = coordinator.groups.get(gid)
        owners: dict[int, str] = {}
        members = []
        for m, mine in _members(coordinator, gid, name):
            for n in mine:
                owners[n] = m.member_id
            row = Map()
            row["name"] = m.member_id
            row["client-id"] = m.client_id
            row["host"] = m.client_host
            row["partitions"] = [partition_key(topic, n) for n in sorted(mine)]
            members.append(row)
        if not owners and not any(t == name for t, _ in committed):
            continue
        info = Map()
        info["name"] = gid.encode()
        info["type"] = "kafka"
        info["state"] = coordinator.state_of(gid)
        if coordinator.is_consumer_group(gid):
            info["protocol"] = "consumer"  # the KIP-848 protocol: the assignment is the server's
        else:
            info["protocol"] = (g.protocol or "") if g is not None else ""
        info["members"] = members
        rows = []
        for n in range(count):
            c = committed.get((name, n))
            try:
                end = session.record_offsets(topic, n).high_watermark
            except Exception:  # noqa: BLE001 - another node leads it: no end offset here
                end = None
            row = Map()
            row["partition"] = n
            row["key"] = partition_key(topic, n)
            row["owner"] = owners.get(n)
            row["committed-offset"] = c.offset if c is not None else None
            row["end-offset"] = end
            row["lag"] = max(end - c.offset, 0) if c is not None and end is not None else None
            rows.append(row)
        info["partitions"] = rows
        out.append(info)
    return out


def xinfo_groups_reply(coordinator: Any, session: Any, key: bytes) -> list:
    """XINFO GROUPS's rows for the Kafka groups of ``key``, after its Redis
    groups (whose rows stay Redis's): ``name``, ``type`` (``kafka``),
    ``consumers`` (the group's members), ``pending`` (0: Kafka groups keep
    a committed offset, not pending entries) and, for one partition, its
    ``committed-offset`` (nil: none) and ``lag``; for a topic key of several
    partitions, the ``lag`` summed (nil where a partition has none) and how
    many ``partitions``. A group shows on a partition where it committed an
    offset or a member is assigned it."""
    if coordinator is None:
        return []
    topic, n = split_partition_key(key)
    layout = session.record_topics([topic])[topic]
    count = len(layout.partitions) if layout else 0
    out = []
    for group in topic_groups_reply(coordinator, session, topic, count, None):
        rows = [r for r in group["partitions"] if n is None or r["partition"] == n]
        if n is not None and all(r["committed-offset"] is None and r["owner"] is None for r in rows):
            continue
        lags = [r["lag"] for r in rows]
        info = Map()
        info["name"] = group["name"]
        info["type"] = "kafka"
        info["consumers"] = len(group["members"])
        info["pending"] = 0
        if len(rows) == 1:
            info["committed-offset"] = rows[0]["committed-offset"]
        else:
            info["partitions"] = len(rows)
        info["lag"] = None if any(lag is None for lag in lags) else sum(lags)
        out.append(info)
    return out


def _members(coordinator: Any, gid: str, topic: str) -> list[tuple[Any, list[int]]]:
    """Each member of group ``gid`` (classic or KIP-848) with the partitions of ``topic`` assigned to it."""
    if coordinator.is_consumer_group(gid):
        return [(m, sorted(m.assigned.get(topic, ()))) for m in coordinator.consumer.groups[gid].members.values()]
    g = coordinator.groups.get(gid)
    if g is None:
        return []
    return [(m, decode_assignment(m.assignment).get(topic, []) if g.protocol_type == "consumer" else [])
            for m in g.members.values()]
