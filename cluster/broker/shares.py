"""Share groups (Kafka's KIP-932) as Redis consumer groups: acquisition and acknowledgement by offset (``ShareOps``).

A share group ``g`` reading topic ``t`` IS the Redis consumer group ``g`` of
each partition of ``t`` (docs/kafka.md, "Share groups"), and a member
``m`` of it is the consumer ``m`` of that group: what a Kafka share
consumer acquires is in the group's pending entries list under its member
id, what it acknowledges leaves it, and an XREADGROUP consumer of ``g``
shares the same entries (each goes to one of them at a time).

Owns, as ``Session`` methods (``ShareOps`` is one of its bases):

- ``share_acquire``: records acquired for a member = entries delivered to
  consumer ``<member id>`` as ``XREADGROUP GROUP g m CLAIM <lock ms>
  MAXCOUNT <max records> STREAMS <partitions> >`` delivers them (it is that
  read: ``read_group``, waiting as a blocked one does): first the group's
  pending entries released (ShareAcknowledge RELEASE, XNACK) or idle for the
  acquisition lock duration (a lock expired: what ``XAUTOCLAIM ... <lock
  ms>`` would take), longest idle first, then new entries. The group is
  created at the end of the partition (``$``: KIP-932's
  ``share.auto.offset.reset=latest``) the first time the share group reads
  it. Each acquired entry comes with its offset and its delivery count (the
  PEL's). An entry acquired more than ``delivery_limit`` times is archived
  instead (acknowledged; when the Redis group has MAXDELIVERIES with a
  dead-letter stream, that setting applies and dead-letters it, as for
  XREADGROUP) and not returned;
- ``share_acknowledge``: acknowledgements by offset: ACCEPT = XACK, RELEASE =
  XNACK FAIL (no owner, delivery time 0, the delivery count kept: the next
  acquisition takes it first, whoever asks, and counts one more delivery),
  REJECT = ``reject`` (dead-lettered, or acknowledged when the group has no
  dead-letter stream). Only what the member holds (pending, owned by it)
  may be acknowledged: anything else refuses the whole partition's
  acknowledgements (``ShareStateError``), as KIP-932's INVALID_RECORD_STATE;
- ``share_release``: a member's acquired entries released (as RELEASE:
  its share session closed, or it left the group) and, when it left, its
  consumer deleted from the groups.

Must not know: the Kafka wire format, share sessions and membership (the
front-end's, server/kafka_front/share_groups.py), error codes.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

from cluster.broker.groups import NACK_FAIL, GroupOpError, GroupRead
from cluster.broker.keys import TooManyBlockedError
from cluster.errors import ClusterError
from cluster.topics import partition_key
from storage.entry_codec import decode_entry
from storage.errors import Refusal
from storage.streams.groups import count_after, groups_of

# KIP-932's acknowledge types (ShareFetch / ShareAcknowledge AcknowledgeTypes).
GAP = 0  # an offset with no record (nothing to do)
ACCEPT = 1
RELEASE = 2
REJECT = 3
ACK_TYPES = (GAP, ACCEPT, RELEASE, REJECT)

# One acknowledgement batch may span at most this many offsets (each must be
# a record the member holds, or a gap): a bound on the work a request causes.
ACK_SPAN_MAX = 1 << 16

NOT_ACQUIRED = "share-not-acquired"  # an offset the member does not hold
BAD_ACKNOWLEDGEMENT = "share-bad-acknowledgement"  # a batch that is not well formed


class ShareStateError(Refusal):
    """Acknowledgements refused for one partition (``code``: ``NOT_ACQUIRED``
    or ``BAD_ACKNOWLEDGEMENT``); nothing of them was applied."""


class ShareRecords(NamedTuple):
    """What one partition gave an acquisition: its high watermark and log
    start, and the acquired entries in offset order: ``entries`` (``(offset,
    ms, seq)`` each), ``chunks`` (each one's stored encoding, one chunk an
    entry) and ``delivery_counts``."""

    high_watermark: int
    log_start_offset: int
    entries: list
    chunks: list
    delivery_counts: list


Partition = tuple[bytes, int]  # (topic, n)


class ShareOps:
    """The share group operations of ``cluster.broker.Session`` (a mixin)."""

    __slots__ = ()

    # The Session provides these.
    broker: Any

    def _share_stream(self, group: bytes, topic: bytes, n: int) -> Any:
        """Partition ``n`` of ``topic`` (led here: ``_led_stream``'s
        refusals), its Redis group ``group`` created at ``$`` if missing."""
        stream = self._led_stream(topic, n)
        if groups_of(stream).group(group) is None:
            self.group_create(partition_key(topic, n), group, None)
        return stream

    async def share_acquire(self, group: bytes, member: bytes, partitions: Sequence[Partition], *,
                            max_records: int, max_bytes: int, lock_ms: int, delivery_limit: int,
                            wait_ms: int) -> dict[Partition, ShareRecords | BaseException]:
        """Acquire records of ``partitions`` for ``member`` (module docstring):
        at most ``max_records`` (0: no cap) and about ``max_bytes`` over them
        all; waits up to ``wait_ms`` (0: not at all) when there are none.
        Per partition its records, or its refusal (TopicError, Moved,
        TryAgain: not led here)."""
        results: dict[Partition, Any] = {}
        where: dict[bytes, Partition] = {}
        for topic, n in partitions:
            try:
                self._share_stream(group, topic, n)
            except (Refusal, ClusterError) as e:
                results[(topic, n)] = e
                continue
            where[partition_key(topic, n)] = (topic, n)
        if not where:
            return results
        keys = list(where)
        read = GroupRead(group, member, keys, [None] * len(keys), claim_ms=lock_ms, max_count=max(0, max_records),
                         max_size=max(0, max_bytes), block_ms=wait_ms if wait_ms > 0 else None)
        try:
            deliveries = await self.read_group(read)
        except (GroupOpError, TooManyBlockedError):  # a key or the group went away meanwhile, or
            deliveries = []  # max-blocked-clients readers wait already: nothing acquired
        topics = self.broker.topics
        got = {d.key: d for d in deliveries}
        for pkey, (topic, n) in where.items():
            stream = topics.get(pkey)
            if stream is None:  # deleted while waiting
                continue
            log = stream.log
            d = got.get(pkey)
            if d is None or not d.count:
                results[(topic, n)] = ShareRecords(log.high_watermark, log.log_start_offset, [], [], [])
                continue
            store = groups_of(stream)
            g = store.group(group)
            limited = delivery_limit > 0 and not (g is not None and g.max_deliveries)
            held: list = []
            archived: list = []
            for chunk, (_, before) in zip(d.chunks, d.claims):
                chunk = bytes(chunk)
                sid, _ = decode_entry(chunk)
                count = count_after(before)
                if limited and count > delivery_limit:
                    archived.append(sid)
                    continue
                held.append((log.find_offset(sid[0], sid[1], inclusive=True), sid, chunk, count))
            if archived:
                self.ack(pkey, group, archived)
            held.sort()
            results[(topic, n)] = ShareRecords(
                log.high_watermark, log.log_start_offset,
                [(offset, sid[0], sid[1]) for offset, sid, _, _ in held],
                [chunk for _, _, chunk, _ in held],
                [count for _, _, _, count in held])
        return results

    def share_acknowledge(self, group: bytes, member: bytes, topic: bytes, n: int,
                          batches: Sequence[tuple[int, int, Sequence[int]]]) -> None:
        """Apply ``member``'s acknowledgements of partition ``n`` of ``topic``:
        ``(first offset, last offset, types)`` each, ``types`` one per
        offset or one for the whole batch (module docstring). Raises
        ShareStateError (nothing applied), ``_led_stream``'s refusals."""
        stream = self._led_stream(topic, n)
        g = groups_of(stream).group(group)
        log = stream.log
        chosen: dict[int, list] = {ACCEPT: [], RELEASE: [], REJECT: []}
        for first, last, types in batches:
            span = last - first + 1
            if span < 1 or span > ACK_SPAN_MAX or len(types) not in (1, span):
                raise ShareStateError(BAD_ACKNOWLEDGEMENT, first=first, last=last, types=len(types))
            for i in range(span):
                kind = types[0] if len(types) == 1 else types[i]
                if kind not in ACK_TYPES:
                    raise ShareStateError(BAD_ACKNOWLEDGEMENT, first=first, last=last, type=kind)
                if kind == GAP:
                    continue
                offset = first + i
                pe = None
                if g is not None and log.log_start_offset <= offset < log.log_end_offset:
                    sid = tuple(log.entry_id(offset))
                    pe = g.pel.get(sid)
                if pe is None or pe.consumer != member:
                    raise ShareStateError(NOT_ACQUIRED, offset=offset)
                chosen[kind].append(sid)
        pkey = partition_key(topic, n)
        if chosen[ACCEPT]:
            self.ack(pkey, group, chosen[ACCEPT])
        if chosen[RELEASE]:
            self.nack(pkey, group, NACK_FAIL, chosen[RELEASE])
        if chosen[REJECT]:
            self.reject(pkey, group, chosen[REJECT])

    def share_release(self, group: bytes, member: bytes, partitions: Sequence[Partition], *,
                      delete: bool = True) -> None:
        """On each of ``partitions`` led here, the entries ``member`` holds
        are released (RELEASE: its share session closed, or it left) and,
        with ``delete`` (it left the group), its consumer is deleted."""
        for topic, n in partitions:
            try:
                stream = self._led_stream(topic, n)
            except (Refusal, ClusterError):
                continue
            g = groups_of(stream).group(group)
            c = g.consumer(member) if g is not None else None
            if c is None:
                continue
            pkey = partition_key(topic, n)
            held = [sid for sid, _ in c.pending.items()]
            if held:
                self.nack(pkey, group, NACK_FAIL, held)
            if delete:
                self.group_delete_consumer(pkey, group, member)
