"""Consumer groups on multi-partition topic keys: membership reads and views.

Owns what the group commands do when their key is a topic of several
partitions (``server.commands.groups`` hands over when
``ctx.server.topics.is_multi(key)``):

- ``XREADGROUP GROUP g c ... STREAMS <topic> >``: ``c`` joins (or
  heartbeats) the group's membership (``cluster.membership``); it gets
  entries from the partitions assigned to it only, each partition under its
  partition key ``<topic>#<n>``: first the entries handed over to it from a
  previous owner (delivery count +1), then new ones; COUNT applies per
  partition. With an ID instead of ``>``: the consumer's own pending entries
  on every partition (Redis's history read), per partition key.
- ``XGROUP CREATE | SETID | DESTROY | CREATECONSUMER | CONFIG <topic> ...``:
  the same command on every partition (``$`` = each partition's last ID).
- ``XGROUP DELCONSUMER <topic> g c``: ``c`` leaves the membership first (its
  partitions and their pending entries go to the remaining members), then the
  consumer is deleted on every partition; the reply counts the entries it
  still had pending (handed over, or dropped if no member is left).
- ``XINFO GROUPS / CONSUMERS <topic>`` and ``TOPIC GROUPS``: views of the
  groups with membership, assignment and per-partition lag.

XACK, XPENDING, XCLAIM, XAUTOCLAIM take partition keys (replies name them).

Must not know: sockets, RESP bytes, files.
"""

from __future__ import annotations

import trio

import server.commands.groups as _g
from cluster.topics import partition_key
from server.errors import CommandError, err
from server.reply import NULL_ARRAY, OK, Map, Raw
from storage.streams.groups import group_lag, groups_of
from storage.streams.ids import format_id, parse_strict_id


def _no_group_error(key: bytes, group: bytes) -> CommandError:
    return CommandError(
        "NOGROUP",
        f"No such key '{_g._c(key)}' or consumer group '{_g._c(group)}' in XREADGROUP with GROUP option",
    )


def _partition_group(ctx, topic: bytes, p: int, group: bytes):
    stream = ctx.server.topics.get(partition_key(topic, p))
    store = groups_of(stream)
    return stream, store, store.group(group)


def _note_stores(ctx, stores) -> None:
    for store in stores:
        ctx.session.wrote_group(store)


# ------------------------------------------------------------ XREADGROUP


class _TopicPlan:
    __slots__ = ("key", "membership", "after")

    def __init__(self, key, membership, after) -> None:
        self.key = key
        self.membership = membership
        self.after = after


def _serve_partition(ctx, m, p: int, consumer: bytes, count: int, noack: bool, now_ms: int):
    """Handed-over entries first (delivery count +1), then new ones."""
    topic = m.topic
    pkey = partition_key(topic, p)
    stream, store, group = _partition_group(ctx, topic, p, m.group)
    if group is None:
        return None
    chunks: list = []
    ids = m.take_redeliveries(p, consumer, count)
    if ids:
        live, gone = [], []
        for sid in ids:
            encoded = _g._entry(stream, sid)
            if encoded is None:
                gone.append(sid)
            else:
                live.append(sid)
                chunks.append(encoded)
        if gone:
            store.drop_pending(m.group, gone)
        if live:
            store.redeliver(m.group, consumer, live, now_ms)
            ctx.server.topics.note_entries_out(len(live))
        ctx.session.wrote_group(store)
    remaining = count - len(chunks) if count else 0
    if not count or remaining > 0:
        raw = _g._serve_new(ctx, _g._Target(pkey, stream, store, group, None), consumer,
                            remaining, noack, now_ms)
        if raw is not None:
            # raw.count, not len(chunks): a log read returns a run of
            # contiguous entries as ONE chunk, so counting chunks framed
            # the reply short and desynchronised the client (found by the
            # crash test's reply-shape check).
            chunks.extend(raw.chunks)
            return Raw(len(chunks) - len(raw.chunks) + raw.count, chunks)
    return Raw(len(chunks), chunks) if chunks else None


def _serve_topic_new(ctx, plan: _TopicPlan, args, now_ms: int) -> list:
    m = plan.membership
    stores = m.heartbeat(args.consumer, now_ms)
    _note_stores(ctx, stores)
    if stores:
        ctx.server.signal_key_modified(m.topic)  # other blocked members re-check
    served = []
    for p in m.assigned(args.consumer):
        raw = _serve_partition(ctx, m, p, args.consumer, args.count, args.noack, now_ms)
        if raw is not None:
            served.append((partition_key(m.topic, p), raw))
    return served


def _serve_topic_history(ctx, plan: _TopicPlan, args, now_ms: int) -> list:
    m = plan.membership
    served = []
    for p in range(ctx.server.topics.partition_count(m.topic)):
        pkey = partition_key(m.topic, p)
        stream, store, group = _partition_group(ctx, m.topic, p, m.group)
        if group is None or group.consumer(args.consumer) is None:
            continue
        target = _g._Target(pkey, stream, store, group, plan.after)
        raw = _g._serve_history(ctx, target, args.consumer, args.count, now_ms)
        if raw.count:
            served.append((pkey, raw))
    return served or [(plan.key, Raw(0, []))]


async def xreadgroup(ctx, args):
    """XREADGROUP with at least one multi-partition topic key (see the module docstring)."""
    topics = ctx.server.topics
    plans: list = []
    for key, raw in zip(args.keys, args.id_args):
        if topics.is_multi(key):
            _, _, group = _partition_group(ctx, key, 0, args.group)
            if group is None:
                raise _no_group_error(key, args.group)
            if raw == b"$":
                raise err(_g.DOLLAR_IN_XREADGROUP)
            after = None if raw == b">" else parse_strict_id(raw)
            plans.append(_TopicPlan(key, topics.membership(key, args.group), after))
        else:
            stream = topics.get(key)
            store = groups_of(stream) if stream is not None else None
            group = store.group(args.group) if store is not None else None
            if group is None:
                raise _no_group_error(key, args.group)
            if raw == b"$":
                raise err(_g.DOLLAR_IN_XREADGROUP)
            after = None if raw == b">" else parse_strict_id(raw)
            plans.append(_g._Target(key, stream, store, group, after))

    def serve(now_ms: int) -> list:
        served = []
        for plan in plans:
            if isinstance(plan, _TopicPlan):
                if plan.after is None:
                    served.extend(_serve_topic_new(ctx, plan, args, now_ms))
                else:
                    served.extend(_serve_topic_history(ctx, plan, args, now_ms))
            elif plan.after is not None:
                plan.store.touch_consumer(plan.group.name, args.consumer, now_ms)
                ctx.session.wrote_group(plan.store)
                served.append((plan.key, _g._serve_history(ctx, plan, args.consumer, args.count, now_ms)))
            else:
                raw = _g._serve_new(ctx, plan, args.consumer, args.count, args.noack, now_ms)
                if raw is not None:
                    served.append((plan.key, raw))
        return served

    served = serve(_g.clock_ms())
    if served:
        return _g._read_reply(ctx, served)
    if args.timeout_ms is None or ctx.client.in_multi or not ctx.may_block:
        return NULL_ARRAY

    # Block: wake on an append to any partition (XADD signals the topic key
    # too) or a rebalance, and at least twice per session timeout to let
    # dead members expire; the reader counts as alive meanwhile.
    wait_keys: list[bytes] = []
    memberships = []
    for plan in plans:
        if isinstance(plan, _TopicPlan):
            wait_keys.append(plan.key)
            wait_keys.extend(topics.expand(plan.key))
            memberships.append(plan.membership)
        else:
            wait_keys.append(plan.key)
    deadline = None if args.timeout_ms == 0 else trio.current_time() + args.timeout_ms / 1000
    for m in memberships:
        m.begin_read(args.consumer, _g.clock_ms())
    try:
        while True:
            slice_s = min(m.coordinator.session_timeout_ms for m in memberships) / 2000
            if deadline is not None:
                remaining_s = deadline - trio.current_time()
                if remaining_s <= 0:
                    return NULL_ARRAY
                slice_s = min(slice_s, remaining_s)
            await ctx.server.wait_for_keys(wait_keys, slice_s)
            for plan in plans:
                if isinstance(plan, _TopicPlan):
                    if not topics.is_multi(plan.key):
                        return CommandError("UNBLOCKED", "the stream key no longer exists")
                    if _partition_group(ctx, plan.key, 0, args.group)[2] is None:
                        return CommandError("NOGROUP", "the consumer group this client was blocked on no longer exists")
            served = serve(_g.clock_ms())
            if served:
                return _g._read_reply(ctx, served)
    finally:
        for m in memberships:
            m.end_read(args.consumer, _g.clock_ms())


# ---------------------------------------------------------------- XGROUP


def per_partition(ctx, argv: list[bytes], handler, key_index: int = 2) -> list:
    """Run a group command on each partition key of the topic at ``argv[key_index]``."""
    replies = []
    for pkey in ctx.server.topics.expand(argv[key_index]):
        sub = list(argv)
        sub[key_index] = pkey
        try:
            replies.append(handler(ctx, sub))
        except CommandError as e:
            replies.append(e)
    return replies


def _first_error(replies):
    for r in replies:
        if isinstance(r, CommandError):
            return r
    return None


def xgroup_create(ctx, argv, handler):
    """XGROUP CREATE on a topic: the group on every partition that lacks it."""
    replies = per_partition(ctx, argv, handler)
    errors = [r for r in replies if isinstance(r, CommandError)]
    if errors and all(e.code == "BUSYGROUP" for e in errors) and len(errors) == len(replies):
        raise errors[0]
    other = [e for e in errors if e.code != "BUSYGROUP"]
    if other:
        raise other[0]
    ctx.server.topics.drop_membership(argv[2], argv[3])
    return OK


def xgroup_all_ok(ctx, argv, handler):
    """SETID / CONFIG on a topic: every partition, OK when all are."""
    error = _first_error(per_partition(ctx, argv, handler))
    if error is not None:
        raise error
    return OK


def xgroup_any(ctx, argv, handler):
    """DESTROY / CREATECONSUMER on a topic: 1 if any partition changed."""
    replies = per_partition(ctx, argv, handler)
    error = _first_error(replies)
    if error is not None:
        raise error
    if argv[1].lower() == b"destroy":
        ctx.server.topics.drop_membership(argv[2], argv[3])
    return 1 if any(replies) else 0


def xgroup_delconsumer(ctx, argv, handler):
    """DELCONSUMER on a topic: leave (hand over), then delete everywhere."""
    topics = ctx.server.topics
    key, group, consumer = argv[2], argv[3], argv[4]
    _, _, g0 = _partition_group(ctx, key, 0, group)
    if g0 is None:
        raise _g._nogroup_for_key(key, group)
    pending = 0
    for p in range(topics.partition_count(key)):
        _, _, g = _partition_group(ctx, key, p, group)
        c = g.consumer(consumer) if g is not None else None
        pending += len(c.pending) if c is not None else 0
    m = topics.coordinators.get((key, group))
    if m is not None:
        _note_stores(ctx, m.leave(consumer, _g.clock_ms()))
        ctx.server.signal_key_modified(key)
    replies = per_partition(ctx, argv, handler)
    error = _first_error(replies)
    if error is not None:
        raise error
    return pending


# ----------------------------------------------------------------- views


def _partition_rows(ctx, topic: bytes, group_name: bytes, m) -> list:
    rows = []
    for p in range(ctx.server.topics.partition_count(topic)):
        stream, store, group = _partition_group(ctx, topic, p, group_name)
        if group is None:
            continue
        row = Map()
        row["partition"] = p
        row["key"] = partition_key(topic, p)
        row["owner"] = m.owner_of(p) if m is not None else None
        row["pending"] = len(group.pel)
        row["last-delivered-id"] = format_id(group.last_id)
        row["entries-read"] = group.entries_read
        row["lag"] = group_lag(_g._Counters(stream), group)
        rows.append(row)
    return rows


def _sync(ctx, topic: bytes, group: bytes):
    m = ctx.server.topics.coordinators.get((topic, group))
    if m is not None:
        _note_stores(ctx, m.sync(_g.clock_ms()))
    return m


def groups_view(ctx, topic: bytes, only: bytes | None) -> list:
    """TOPIC GROUPS / TOPIC DESCRIBE's ``groups``: members, assignment, lag."""
    topics = ctx.server.topics
    names: set[bytes] = set()
    for p in range(topics.partition_count(topic)):
        names.update(groups_of(topics.get(partition_key(topic, p))).groups)
    if only is not None:
        if only not in names:
            raise _g._nogroup_for_key(topic, only)
        names = {only}
    now = _g.clock_ms()
    out = []
    for name in sorted(names):
        m = _sync(ctx, topic, name) if topics.partition_count(topic) > 1 else None
        info = Map()
        info["name"] = name
        members = []
        if m is not None:
            for member in sorted(m.coordinator.members.values(), key=lambda x: x.name):
                row = Map()
                row["name"] = member.name
                row["partitions"] = [partition_key(topic, p) for p in m.assigned(member.name)]
                row["idle"] = max(now - member.last_seen_ms, 0)
                members.append(row)
        info["members"] = members
        info["partitions"] = _partition_rows(ctx, topic, name, m)
        out.append(info)
    return out


def xinfo_groups(ctx, key: bytes) -> list:
    """XINFO GROUPS <topic>: each group summed over the partitions."""
    out = []
    for g in groups_view(ctx, key, None):
        info = Map()
        info["name"] = g["name"]
        consumers: set[bytes] = set()
        for p in range(ctx.server.topics.partition_count(key)):
            _, _, group = _partition_group(ctx, key, p, g["name"])
            if group is not None:
                consumers.update(group.consumers)
        info["consumers"] = len(consumers)
        info["pending"] = sum(row["pending"] for row in g["partitions"])
        lags = [row["lag"] for row in g["partitions"]]
        info["lag"] = None if any(x is None for x in lags) else sum(lags)
        info["members"] = len(g["members"])
        info["partitions"] = len(g["partitions"])
        out.append(info)
    return out


def xinfo_consumers(ctx, key: bytes, group_name: bytes) -> list:
    """XINFO CONSUMERS <topic> g: every consumer of any partition: pending
    (summed), idle, whether it is a live member, and the partitions it owns."""
    topics = ctx.server.topics
    _, _, g0 = _partition_group(ctx, key, 0, group_name)
    if g0 is None:
        raise _g._nogroup_for_key(key, group_name)
    m = _sync(ctx, key, group_name)
    now = _g.clock_ms()
    rows: dict[bytes, dict] = {}
    for p in range(topics.partition_count(key)):
        _, _, group = _partition_group(ctx, key, p, group_name)
        if group is None:
            continue
        for c in group.consumers.values():
            row = rows.setdefault(c.name, {"pending": 0, "seen": c.seen_time_ms})
            row["pending"] += len(c.pending)
            row["seen"] = max(row["seen"], c.seen_time_ms)
    if m is not None:
        for member in m.coordinator.members.values():
            row = rows.setdefault(member.name, {"pending": 0, "seen": member.last_seen_ms})
            row["seen"] = max(row["seen"], member.last_seen_ms)
    out = []
    for name in sorted(rows):
        row = rows[name]
        info = Map()
        info["name"] = name
        info["pending"] = row["pending"]
        info["idle"] = max(now - row["seen"], 0)
        info["member"] = 1 if m is not None and m.coordinator.is_alive(name) else 0
        info["partitions"] = [partition_key(key, p) for p in m.assigned(name)] if m is not None else []
        out.append(info)
    return out
