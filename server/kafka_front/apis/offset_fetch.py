"""OffsetFetch (key 9): a group's committed offsets.

Versions 1-10 (v8+: several groups; v10: topics by topic ID). Topics null
(v2+): every committed offset of the group. A partition with no committed
offset: offset -1, metadata "" (the consumer then applies its
``auto.offset.reset``). ``require_stable`` changes nothing (no
transactions). v9+ with a member id, for a consumer group (KIP-848): the
member at its current epoch (UNKNOWN_MEMBER_ID, STALE_MEMBER_EPOCH;
``consumer_groups.ConsumerCoordinator.check_fetch``); no member id: an
admin's read, not checked.

Errors: NOT_COORDINATOR, GROUP_AUTHORIZATION_FAILED (the group's, top level
from v2, per partition in v1), TOPIC_AUTHORIZATION_FAILED, UNKNOWN_TOPIC_ID
per partition. A partition or topic that does not exist is not an error
(offset -1, or the offset committed before the topic went), as Kafka's
coordinator answers from the committed offsets alone.
"""

from __future__ import annotations

from server.kafka import codec
from server.kafka import errors as E
from server.kafka_front.apis.offset_commit import access_error
from server.kafka_front.group_checks import refusal

API_KEY = 9
NAME = "OffsetFetch"
VERSIONS = (1, 10)

R = codec.OffsetFetchResponse


def _group(ctx, group_id: str, wanted, by_id: bool, member: tuple[str | None, int] = (None, -1)
           ) -> tuple[int, list[tuple[object, str, list]]]:
    """``(group error, [(topic name or ID, name, [(partition, offset, epoch, metadata, error)])])``;
    ``member``: the v9+ member id and epoch."""
    error = refusal(ctx, group_id)
    if error is None and member[0] is not None and ctx.front.groups.is_consumer_group(group_id):
        error = ctx.front.consumer_groups.check_fetch(group_id, *member)
        error = error if error != E.NONE else None
    if error is not None:
        return error, []
    committed = ctx.front.groups.store.of_group(group_id) if ctx.front.groups.store is not None else {}
    if wanted is None:
        names: dict[str, list[int]] = {}
        for t, p in sorted(committed):
            names.setdefault(t, []).append(p)
        wanted = [(ctx.front.topic_uuid(ctx.session, t.encode()) if by_id else t, t, ps)
                  for t, ps in names.items()]
    out = []
    for key, name, partitions in wanted:
        rows = []
        for n in partitions:
            found = committed.get((name, n)) if name is not None else None
            error = access_error(ctx, name.encode() if name is not None else None, n)
            if error != E.NONE or found is None:
                rows.append((n, -1, -1, "", error))
            else:
                rows.append((n, found.offset, found.leader_epoch, found.metadata, E.NONE))
        out.append((key, name, rows))
    return E.NONE, out


def _wanted(ctx, topics, by_id: bool):
    if topics is None:
        return None
    out = []
    for t in topics:
        if by_id:
            name = ctx.front.topic_name(ctx.session, t.topic_id)
            out.append((t.topic_id, name.decode("utf-8", "surrogateescape") if name is not None else None,
                        list(t.partition_indexes)))
        else:
            out.append((t.name, t.name, list(t.partition_indexes)))
    return out


async def handle(ctx, req):
    body = req.body
    v = req.api_version
    if v < 8:
        error, topics = _group(ctx, body.group_id, _wanted(ctx, body.topics, False), False)
        if v < 2 and error != E.NONE:  # v1 carries the group's error in each partition
            topics = [(t.name, t.name, [(n, -1, -1, "", error) for n in t.partition_indexes])
                      for t in body.topics or []]
        return R(error_code=error, topics=[
            R.OffsetFetchResponseTopic(name=key, partitions=[
                R.OffsetFetchResponsePartition(partition_index=n, committed_offset=o, committed_leader_epoch=e,
                                               metadata=m, error_code=err)
                for n, o, e, m, err in rows])
            for key, _, rows in topics])
    by_id = v >= 10
    groups = []
    for g in body.groups:
        error, topics = _group(ctx, g.group_id, _wanted(ctx, g.topics, by_id), by_id, (g.member_id, g.member_epoch))
        groups.append(R.OffsetFetchResponseGroup(group_id=g.group_id, error_code=error, topics=[
            R.OffsetFetchResponseTopics(**({"topic_id": key} if by_id else {"name": key}), partitions=[
                R.OffsetFetchResponsePartitions(partition_index=n, committed_offset=o, committed_leader_epoch=e,
                                                metadata=m, error_code=err)
                for n, o, e, m, err in rows])
            for key, _, rows in topics]))
    return R(groups=groups)
