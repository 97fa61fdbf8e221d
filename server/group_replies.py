"""Reply shapes of consumer-group values that several command families show.

Owns: how the broker's group values (``cluster.broker.groups``) look in a
RESP reply where more than one command module shows them: a group's
dead-letter fields (XINFO GROUPS, XINFO STREAM FULL), the groups of XINFO
STREAM FULL, and a topic's groups with membership (TOPIC GROUPS, TOPIC
DESCRIBE); and ``shaped``, which shapes a group view the broker may only
give later (in a cluster it asks other nodes). Command modules never
import each other; they share these.

Must not know: group state, storage, how the values were computed.
"""

from __future__ import annotations

from types import CoroutineType
from typing import Any, Callable

from server.reply import Map
from storage.streams.ids import format_id


def shaped(found: Any, shape: Callable[[Any], Any]) -> Any:
    """``shape(found)``; when ``found`` is a coroutine (a cluster: the broker
    asks other nodes first), the coroutine of it, which the dispatcher awaits."""
    if type(found) is CoroutineType:
        return _shaped_when(found, shape)
    return shape(found)


async def _shaped_when(finding: Any, shape: Callable[[Any], Any]) -> Any:
    return shape(await finding)


def dead_letter_fields(info: Map, group: Any) -> None:
    """Partita's fields of a group with dead-lettering (none for a plain
    group, which then looks exactly as in Redis)."""
    if group.max_deliveries:
        info["max-deliveries"] = group.max_deliveries
        info["dead-letter-key"] = group.dead_letter_key
        info["dead-lettered"] = group.dead_lettered


def groups_full_reply(groups: list) -> list:
    """The ``groups`` value of ``XINFO STREAM key FULL`` (``GroupState`` per group)."""
    out = []
    for g in groups:
        info = Map()
        info["name"] = g.name
        info["last-delivered-id"] = format_id(g.last_id)
        info["entries-read"] = g.entries_read
        info["lag"] = g.lag
        info["pel-count"] = g.pel_count
        # Redis 8.8's count of entries released by XNACK; redis.io does not
        # say where it goes: after pel-count (docs/groups.md).
        info["nacked-count"] = g.nacked_count
        info["pending"] = [[format_id(sid), owner if owner is not None else b"", time_ms, deliveries]
                           for sid, owner, time_ms, deliveries in g.pending]  # (no owner: released by XNACK)
        consumers = []
        for c in g.consumers:
            ci = Map()
            ci["name"] = c.name
            ci["seen-time"] = c.seen_time_ms
            ci["active-time"] = c.active_time_ms  # Redis 7.2+
            ci["pel-count"] = c.pel_count
            ci["pending"] = [[format_id(sid), time_ms, deliveries] for sid, time_ms, deliveries in c.pending]
            consumers.append(ci)
        info["consumers"] = consumers
        dead_letter_fields(info, g)
        out.append(info)
    return out


def topic_groups_reply(views: list) -> list:
    """TOPIC GROUPS / TOPIC DESCRIBE's ``groups`` (``TopicGroupView`` per
    group, ``type`` redis; Kafka groups follow: server.kafka_front.view): members (name, partitions owned, idle ms) and per partition its
    key, owner (nil when unassigned or being handed over), pending,
    last-delivered-id, entries-read and lag."""
    out = []
    for view in views:
        info = Map()
        info["name"] = view.name
        info["type"] = "redis"
        members = []
        for member in view.members:
            row = Map()
            row["name"] = member.name
            row["partitions"] = member.partitions
            row["idle"] = member.idle_ms
            members.append(row)
        info["members"] = members
        rows = []
        for p in view.partitions:
            row = Map()
            row["partition"] = p.partition
            row["key"] = p.key
            row["owner"] = p.owner
            row["pending"] = p.pending
            row["last-delivered-id"] = format_id(p.last_id)
            row["entries-read"] = p.entries_read
            row["lag"] = p.lag
            rows.append(row)
        info["partitions"] = rows
        out.append(info)
    return out
