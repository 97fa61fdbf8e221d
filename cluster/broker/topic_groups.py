"""Cluster mode: XREADGROUP on a topic key whose partitions several nodes lead.

Each consumer group of a multi-partition topic has one coordinator, the
leader of the topic key's slot (where a cluster client sends the topic key;
other nodes answer ``-MOVED`` to it, ``Replication.route``). It holds the
group's membership on the topic (``cluster.membership``, the single node's
code: joins, heartbeats, session timeouts, cooperative sticky assignment,
revocation, the redelivery queue) and serves a member's read:

- the partitions it leads itself as a single node does
  (``GroupOps._serve_partition``);
- each partition led by another node through that node: a ``GroupPart`` per
  partition in one ``GroupReadRequest`` per leader, all leaders at once
  (``GROUPREAD`` on the bus). The leader runs the partition's share of the
  read with the same code (``serve_group_parts``: the handed-over entries
  first, delivery count +1, then CLAIM's idle entries, then new ones into
  the member's PEL) and writes the PEL changes to the partition's group
  journal, durable and replicated (acks=all) before it answers, as a
  client's XREADGROUP there would;
- the answers are merged as on one node: partition order, each under its
  partition key.

What the coordinator needs of a partition led elsewhere it asks its leader:
a handover to a new owner (``TopicGroupMembership.take_over``) is applied by
the leader on the owner's next read (every pending entry claimed for it and
delivered first: ``cluster.membership.hand_over``); the redelivery queue
travels with the read and comes back shortened; a revocation completes once
the old owner's pending count there, asked before each read
(``GROUP_PENDING``), is 0.

History reads (an explicit ID) ask every partition for the consumer's
pending entries after it. A read that finds nothing and may wait (BLOCK)
waits for an append on the partitions led here, for a rebalance (the
topic key's signal, here), and with a long poll for committed entries after
the group's position on each assigned partition led elsewhere
(``FanOut.wait_for_entries``), at most half a session timeout at a time (so
dead members expire), then serves again.

The membership survives the coordinator's failover: every change of it
(members, owners, targets) is appended to the internal stream
``members_key`` in the topic key's slot (``_persist_membership``; on a
coordinator that leads every partition too), before the read that made it
replies, and the slot's next leader restores the last one on its first
read of the group (``_restore_membership``, ``TopicGroupMembership.restore``),
as does a node that led the slot before, at each new leader epoch. A
read during which this node stopped leading a shard of the topic it led
(even if it leads it again at a later epoch by the end) is refused with
``TryAgain`` (``_check_epochs_led``): what it wrote before awaiting the
other leaders went to that epoch's logs. (The receipt, taken only once
the read is done, fails too where the read wrote: every acks=all wait holds
a partition to the epoch its writes were made at, ``PendingWrites``, and
the connection closes instead of sending the -TRYAGAIN; this fence still
refuses a read that lost a shard it led and did not write to.)
XGROUP on the topic key runs here too (``route`` sends it here): CREATE of
a new group and DESTROY forget the membership and delete its stream
(``_forget_membership``); SETID, CREATECONSUMER, DELCONSUMER and CONFIG
first ask the other leaders whether their partitions have the group
(``_check_group_away``: a topic's group lives on every partition, and a
command that would fail on one changes none); DELCONSUMER has the member
leave, its partitions led elsewhere handed to their new owners by their
leaders (``GROUP_HAND_OVER``), before their leaders delete the consumer
(``_delete_member_across``).

A topic's group views (XINFO GROUPS / CONSUMERS, TOPIC GROUPS) on any node
gather their facts where they are kept (``_group_facts_across``): each
partition's groups from its leader, the memberships from the coordinator
(synced there first: dead members expire), one ``GroupInfoRequest`` per
node (``GROUPINFO`` on the bus, ``serve_group_info``), all at once; the
merge is the single node's (``cluster.broker.groups.topic_views`` ...).

MAXCOUNT / MAXSIZE count over the partitions in order, as on one node: a
read with them asks the leaders one partition at a time, each within what
is left of them (``GroupPart.max_count`` ...), and charges what it served.
Not across nodes (refused): inside MULTI. A leader that
cannot be reached fails the read with ``TryAgain`` when no other partition
served anything (entries it may have delivered stay pending for the member:
its history read, ID 0, gets them).

Owns: the coordinator's read across nodes, the leader's share of it, the
membership's stream (its key and entry format), and gathering a topic's
group facts across nodes.
Must not know: sockets, RESP, reply shapes (Deliveries, as ``GroupOps``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import trio

from cluster.broker.budget import ReadBudget
from cluster.broker.groups import (NO_GROUP_FOR_KEY, Delivery, GroupOpError, GroupRead, _raise_first_error, _Target,
                                   _TopicTarget, follow_memberships, in_transaction)
from cluster.errors import ClusterError, TryAgain
from cluster.membership import hand_over, take_queued
from cluster.peer.link import Unreachable
from cluster.peer.messages import (GROUP_HAND_OVER, GROUP_PENDING, GROUP_READ_HISTORY, GROUP_READ_NEW,
                                   GroupInfoRequest, GroupInfoResponse, GroupPart, GroupPartRead, GroupReadRequest,
                                   GroupReadResponse, GroupRequest)
from cluster.peer.service import check_leads
from cluster.runtime.fanout import READ_TIMEOUT_S, unreachable
from cluster.topics import MEMBERS_PREFIX, partition_key
from storage.entry_codec import decode_entry, split_entries
from storage.streams.groups import groups_of
from storage.streams.ids import MAX_ID, MIN_ID, StreamId

GROUP_READ_LINKS = 4
PURPOSE = "groupread"
# The membership stream's settings: every change fsynced and on the in-sync
# replicas before the read that made it answers, nothing removed but by its
# own trims.
MEMBERS_CONFIG = ((b"fsync", b"always"), (b"acks", b"all"), (b"retention-ms", b"-1"), (b"retention-bytes", b"-1"))


def members_key(topic: bytes, group: bytes) -> bytes | None:
    """The internal stream keeping ``group``'s membership on ``topic``, in
    the topic key's slot (the topic's hash tag, or its name as one), so the
    slot's followers, one of which becomes the next coordinator, copy it;
    the group's name in hex (a ``#<digits>`` end would name a partition),
    after a hash tag's the topic's name in hex (topics of one hash tag have
    streams of their own). None when the topic's name cannot be made a
    hash tag."""
    start = topic.find(b"{")
    if start >= 0:
        end = topic.find(b"}", start + 1)
        if end > start + 1:
            return MEMBERS_PREFIX + topic[start + 1:end] + b"}" + topic.hex().encode() + b"." + group.hex().encode()
    if b"{" in topic or b"}" in topic:
        return None
    return MEMBERS_PREFIX + topic + b"}" + group.hex().encode()


def _snapshot_fields(snapshot: tuple) -> list[bytes]:
    members, owner, target = snapshot
    fields: list[bytes] = [b"partitions", b"%d" % len(owner)]
    for name in members:
        fields += [b"member", name]
    for o, t in zip(owner, target):  # b"" none, else b"+" and the name
        fields += [b"owner", b"" if o is None else b"+" + o, b"target", b"" if t is None else b"+" + t]
    return fields


def _snapshot_of(fields: list[bytes]) -> tuple[list[bytes], list, list]:
    members: list[bytes] = []
    owner: list = []
    target: list = []
    for name, value in zip(fields[::2], fields[1::2]):
        name = bytes(name)
        value = bytes(value)
        if name == b"member":
            members.append(value)
        elif name in (b"owner", b"target"):
            (owner if name == b"owner" else target).append(value[1:] if value else None)
    return members, owner, target


class _At(NamedTuple):
    """A partition named for ``check_leads``."""

    topic: bytes
    n: int


def _text(key: bytes) -> str:
    return key.decode("utf-8", "replace")


def _delivery(pkey: bytes, answer: GroupPartRead) -> Delivery:
    chunks = list(answer.chunks)
    return Delivery(pkey, answer.count, chunks, False, any(c.__class__ is tuple for c in chunks),
                    list(answer.claims) if answer.claims is not None else None)


class TopicGroupOps:
    """The topic group reads across nodes of ``cluster.broker.Session`` (a mixin)."""

    __slots__ = ()

    # The Session provides these (GroupOps among them).
    broker: Any
    client_id: int
    may_block: bool

    # -- the coordinator ---------------------------------------------------------

    def _led_across(self, targets: list) -> bool:
        """Whether a topic key of the read has partitions other nodes lead."""
        replication = self.broker.replication
        if replication is None:
            return False
        fanout = replication.fanout
        return any(t.__class__ is _TopicTarget and fanout.led_elsewhere(t.key) for t in targets)

    def _locate(self, m: Any) -> Any:
        """``m`` (a topic's membership), in a cluster: told which partitions
        other nodes lead, and, once per leader epoch of the topic key's slot,
        what the coordinator before kept of it (``_restore_membership``):
        when new here, and when this node coordinated the group before
        another did (its own view is older: members it last saw read then
        would expire and their entries go to the others)."""
        replication = self.broker.replication
        if replication is None:
            return m
        manager = replication.manager
        if m.away is None:
            topic = m.topic
            m.away = lambda p: manager.state.leader(manager.shard_of(topic, p)) != manager.my_id
        epoch = manager.state.epoch(manager.shard_of(m.topic, 0))
        if m.led_epoch != epoch:
            if m.led_epoch is not None:
                m.forget()
            m.led_epoch = epoch
            self._restore_membership(m)
        return m

    async def _group_read_across(self, targets: list, read: GroupRead) -> list[Delivery]:
        """XREADGROUP of ``targets``, some topic keys having partitions led
        elsewhere: served (``_serve_across``), and while nothing is and it
        may wait, waited for (``_group_wait_across``) and served again."""
        topic = next(t.key for t in targets if t.__class__ is _TopicTarget)
        if not self.may_block:
            raise self.broker.replication.fanout.in_transaction(topic)
        clock_ms = self.broker.clock_ms
        memberships = [t.membership for t in targets if t.__class__ is _TopicTarget]
        deadline = None if not read.block_ms else trio.current_time() + read.block_ms / 1000
        fence = self._epochs_led([m.topic for m in memberships])
        began = False
        try:
            while True:
                served, positions = await self._serve_across(targets, read)
                self._check_epochs_led(fence)
                if served or read.block_ms is None:
                    return served
                if not began:  # a blocked member stays alive while it waits
                    for m in memberships:
                        m.begin_read(read.consumer, clock_ms())
                    began = True
                slice_s = min(m.coordinator.session_timeout_ms for m in memberships) / 2000
                if deadline is not None:
                    remaining_s = deadline - trio.current_time()
                    if remaining_s <= 0:
                        return []
                    slice_s = min(slice_s, remaining_s)
                await self._group_wait_across(targets, positions, slice_s)
                self._check_still_there(targets, read.group)
                memberships = follow_memberships(targets, memberships, read.consumer, clock_ms())
        finally:
            if began:
                for m in memberships:
                    m.end_read(read.consumer, clock_ms())

    def _epochs_led(self, topics: list[bytes]) -> dict[int, int]:
        """``{shard: leader epoch}`` of the shards of ``topics``' partitions
        (and so of their keys' slots: partition 0's) that this node leads."""
        manager = self.broker.replication.manager
        shards = {manager.shard_of(topic, p) for topic in topics
                  for p in range(self.broker.topics.partition_count(topic))}
        state = manager.state
        return {s: state.epoch(s) for s in shards if state.leader(s) == manager.my_id}

    def _check_epochs_led(self, fence: dict[int, int]) -> None:
        """After an await of a read across nodes: every shard this node led
        when the read began (``_epochs_led``) is led here still, at the same
        epoch. Its writes before the await (the members stream's entry, the
        PEL of the partitions served here) went to the logs of that epoch:
        had this node lost a shard meanwhile, those writes may have been
        truncated away, and once it leads again its receipt would wait for
        the new epoch's log (its end offset as then), acknowledging a reply
        whose writes are gone. Raises TryAgain (the member reads again)."""
        manager = self.broker.replication.manager
        state = manager.state
        for shard, epoch in fence.items():
            if state.leader(shard) != manager.my_id or state.epoch(shard) != epoch:
                raise TryAgain("the group's coordinator lost or changed the leadership of a partition it "
                               "wrote to during the read; read again")

    async def _serve_across(self, targets: list, read: GroupRead) -> tuple[list[Delivery], dict]:
        """One round of the read over its keys, in order, within one
        MAXCOUNT / MAXSIZE: what it served, and per topic the positions to
        wait after (``{n: group's last ID}`` of its assigned partitions led
        elsewhere)."""
        fanout = self.broker.replication.fanout
        served: list[Delivery] = []
        positions: dict[bytes, dict[int, tuple[int, int]]] = {}
        budget = ReadBudget(read.max_count, read.max_size)
        for t in targets:
            if budget.spent:
                break  # the keys after are not served
            if t.__class__ is not _TopicTarget or not fanout.led_elsewhere(t.key):
                served.extend(self._serve([t], read, self.broker.clock_ms(), budget))
            elif t.after is None:
                served.extend(await self._serve_members_across(t, read, positions.setdefault(t.key, {}), budget))
            else:
                served.extend(await self._serve_history_across(t, read, budget))
        return served, positions

    async def _serve_in_order(self, m: Any, partitions: Any, budget: ReadBudget, serve_here: Any, part_of: Any,
                              ask: Any, take: Any) -> None:
        """``partitions`` of ``m``'s topic served in order: those led here by
        ``serve_here(p)``, the others by their leaders (``part_of(p, (max
        count, max size, served))``, asked with ``ask``, each answer given
        to ``take(part, answer)``): all at once when the read has no MAXCOUNT
        / MAXSIZE, else one at a time within what is left of them, as one
        node serves them."""
        capped = budget.count_left is not None or budget.bytes_left is not None
        batch: list[GroupPart] = []
        for p in partitions:
            if budget.spent:
                break
            if not m.away(p):
                serve_here(p)
                continue
            part = part_of(p, budget.left() if capped else (0, 0, 0))
            if not capped:
                batch.append(part)
                continue
            (answer,) = await ask([part])
            take(part, answer)
            if not isinstance(answer, ClusterError):
                budget.charge(partition_key(m.topic, p), answer.count, answer.size)
        if batch:
            for part, answer in zip(batch, await ask(batch)):
                take(part, answer)

    async def _serve_members_across(self, t: _TopicTarget, read: GroupRead, positions: dict,
                                    budget: ReadBudget) -> list[Delivery]:
        """``>`` on a topic: the member heartbeats (joins), the membership
        syncs (dead members expire, revocations end, handovers), then each
        partition assigned to it is served, here or by its leader."""
        m = self._locate(t.membership)
        consumer = read.consumer
        await self._ask_revoking(m)
        now_ms = self.broker.clock_ms()
        generation = m.coordinator.generation
        stores = m.heartbeat(consumer, now_ms)
        for store in stores:
            self.wrote_group(store)
        if stores or m.coordinator.generation != generation:
            self.broker.keys.signal(m.topic)  # other blocked members re-check
        self._persist_membership(m)
        deliveries: dict[int, Delivery] = {}
        failures: list[ClusterError] = []

        def serve_here(p: int) -> None:
            delivery = self._serve_partition(m, p, read, now_ms, budget)
            if delivery is not None:
                deliveries[p] = delivery

        def part_of(p: int, caps: tuple[int, int, int]) -> GroupPart:
            take = m.take_over.get(p) == consumer
            if take:
                del m.take_over[p]
            return GroupPart(m.topic, p, m.group, consumer, GROUP_READ_NEW, read.count, read.noack,
                             -1 if read.claim_ms is None else read.claim_ms, take_over=take,
                             redeliver=tuple(m.take_queue(p)), max_count=caps[0], max_size=caps[1], served=caps[2])

        async def ask(parts: list[GroupPart]) -> list:
            for part in parts:  # (a revocation waits for these: ``_ask_revoking``)
                m.reading[part.n] = m.reading.get(part.n, 0) + 1
            try:
                return await self._ask_parts(parts)
            finally:
                for part in parts:
                    left = m.reading.get(part.n, 1) - 1
                    if left > 0:
                        m.reading[part.n] = left
                    else:
                        m.reading.pop(part.n, None)

        def take(part: GroupPart, answer: Any) -> None:
            p = part.n
            if isinstance(answer, ClusterError):
                failures.append(answer)
                if part.take_over:  # (it may have been applied: applied again, it changes nothing more)
                    m.take_over.setdefault(p, consumer)
                if m.owner_of(p) == consumer and p not in m.take_over:
                    m.requeue(p, list(part.redeliver))
                return
            if m.owner_of(p) == consumer and p not in m.take_over:  # (still the member's after the await)
                m.requeue(p, list(answer.queue))
            positions[p] = answer.position
            if answer.count:
                deliveries[p] = _delivery(partition_key(m.topic, p), answer)

        await self._serve_in_order(m, m.assigned(consumer), budget, serve_here, part_of, ask, take)
        if failures and not deliveries:
            raise failures[0]
        return [deliveries[p] for p in sorted(deliveries)]

    def _restore_membership(self, m: Any) -> None:
        """A membership new here (this node became the coordinator: a
        failover, or its first read) takes over the one its members stream
        keeps, if any (``TopicGroupMembership.restore``)."""
        key = members_key(m.topic, m.group)
        if key is None or m.coordinator.members or self.broker.topics.get(key) is None:
            return
        found = self.range(key, MIN_ID, MAX_ID, past_hw=True)  # (entries beyond the high watermark: see offsets)
        if found is None or not found.count:
            return
        entry_id, fields = decode_entry(split_entries(found.chunks)[-1])
        if m.restore(*_snapshot_of(list(fields)), self.broker.clock_ms()):
            m.persisted, m.persisted_id = m.snapshot(), tuple(entry_id)

    def _persist_membership(self, m: Any) -> None:
        """The membership appended to its members stream when it changed
        (members, owners, targets): the read's reply waits for it to be
        durable and on the in-sync replicas, so a next coordinator has every
        assignment a member has read by. The entries before the previous one
        (acknowledged already, with an earlier read) are trimmed away."""
        key = members_key(m.topic, m.group)
        snapshot = m.snapshot()
        if key is None or snapshot == m.persisted:
            return
        from cluster.broker.session import Trim, XAddPlan  # (the module that imports this one)

        if self.broker.topics.get(key) is None:
            self.create_topic(key, 1, MEMBERS_CONFIG)
        new_id = self.append(XAddPlan(key, _snapshot_fields(snapshot)))
        if m.persisted_id is not None:
            removed = self.trim(key, Trim("MINID", minid=m.persisted_id))
            if removed.__class__ is not int:  # (it would wait for the replicas: next time)
                removed.close()
        m.persisted, m.persisted_id = snapshot, tuple(new_id)

    def _forget_membership(self, topic: bytes, group: bytes) -> None:
        """``group``'s membership on ``topic`` gone (XGROUP DESTROY, or
        CREATE of the group anew): here, and its members stream, so that no
        next coordinator restores it."""
        topics = self.broker.topics
        topics.drop_membership(topic, group)
        key = members_key(topic, group)
        if key is not None and topics.get(key) is not None and topics.delete(key):
            self.broker.keys.signal(key)

    def _members_streams(self, topic: bytes) -> list[tuple[bytes, bytes]]:
        """``(group, members stream)`` of every group of ``topic`` that has
        one (in a cluster; in the topic key's slot, so led where the topic's
        partition 0 is)."""
        topics = self.broker.topics
        if self.broker.replication is None or not topics.exists(topic):
            return []
        stream = topics.get(partition_key(topic, 0))
        found = []
        for group in list(groups_of(stream).groups) if stream is not None else ():
            key = members_key(topic, group)
            if key is not None and topics.get(key) is not None:
                found.append((group, key))
        return found

    def _memberships_to_rename(self, topic: bytes, dst: bytes) -> list[tuple[bytes, bytes | None]]:
        """Before RENAME ``topic`` ``dst`` in a cluster: the members streams
        to rename once the topic is ``dst`` (``(key, new key)``), those of
        a topic ``dst`` it replaces to delete (``(key, None)``), deleted
        first. A slot's keys both (RENAME's keys are), so led here."""
        doomed: list[tuple[bytes, bytes | None]] = [(key, None) for _, key in self._members_streams(dst)]
        return doomed + [(key, members_key(dst, group)) for group, key in self._members_streams(topic)]

    def _rename_memberships(self, renames: list[tuple[bytes, bytes | None]]) -> None:
        """``_memberships_to_rename``'s streams renamed or deleted, after the
        topic's RENAME: its members keep their partitions under the new name
        (the next read restores them, ``_restore_membership``); or
        ``_members_streams``' as ``(key, None)`` after a topic's deletion."""
        topics = self.broker.topics
        for key, new in renames:
            if new is None:
                topics.delete(key)
            else:
                self.broker.replication.rename(self, key, new)
                self.broker.keys.signal(new)
            self.broker.keys.signal(key)

    def _delete_member_across(self, topic: bytes, group: bytes, consumer: bytes) -> Any:
        """XGROUP DELCONSUMER of a topic whose partitions other nodes lead
        (None when this node leads them all): the awaitable of how many
        entries ``consumer`` had pending on the topic. The member leaves the
        membership; the partitions it owned led elsewhere are handed to
        their new owners by their leaders (every entry pending there made
        the new owner's, to be delivered to it first, as a handover here
        does) before each partition's leader deletes the consumer."""
        replication = self.broker.replication
        if replication is None or not replication.fanout.led_elsewhere(topic):
            return None
        if not self.may_block:
            raise in_transaction(topic)
        return self._delete_member(topic, group, consumer)

    async def _delete_member(self, topic: bytes, group: bytes, consumer: bytes) -> int:
        await self._check_group_away(topic, group)
        m = self._locate(self.broker.topics.membership(topic, group))
        partitions = range(self.broker.topics.partition_count(topic))
        pending = 0
        for p in partitions:
            if not m.away(p):
                g = self._partition_group(topic, p, group)[2]
                c = g.consumer(consumer) if g is not None else None
                pending += len(c.pending) if c is not None else 0
        asked = [GroupPart(topic, p, group, consumer, GROUP_PENDING) for p in partitions if m.away(p)]
        for answer in await self._ask_parts(asked):
            if isinstance(answer, ClusterError):
                raise answer
            pending += answer.pending
        for store in m.leave(consumer, self.broker.clock_ms()):
            self.wrote_group(store)
        self.broker.keys.signal(topic)
        handovers = [GroupPart(topic, p, group, owner, GROUP_HAND_OVER) for p, owner in m.take_over.items()]
        failure = None
        for part, answer in zip(handovers, await self._ask_parts(handovers)):
            if isinstance(answer, ClusterError):  # (left to the owner's next read; the consumer stays)
                failure = failure or answer
            elif m.take_over.get(part.n) == part.consumer:
                del m.take_over[part.n]
                m.requeue(part.n, list(answer.queue))
        self._persist_membership(m)
        if failure is not None:
            raise failure

        def op(pkey: bytes) -> int:
            return self.group_delete_consumer(pkey, group, consumer)

        _raise_first_error(await self._each_partition_away(
            topic, lambda pkey: GroupRequest("delconsumer", pkey, group, consumer=consumer), op))
        return pending

    async def _ask_revoking(self, m: Any) -> None:
        """The pending count of each revoking partition's old owner, from the
        partition's leader, for the membership's next sync. Not while a read
        of the partition is on its way (its leader may not have recorded
        what it delivers yet: the count would be too low)."""
        parts = [GroupPart(m.topic, p, m.group, old, GROUP_PENDING)
                 for p, old, _ in m.coordinator.revoking() if old is not None and m.away(p) and not m.reading.get(p)]
        counts = {}  # (anew each time: an older answer may be of another revocation)
        for part, answer in zip(parts, await self._ask_parts(parts)):
            if not isinstance(answer, ClusterError) and not m.reading.get(part.n):
                counts[part.n] = answer.pending
        m.remote_pending = counts

    async def _serve_history_across(self, t: _TopicTarget, read: GroupRead, budget: ReadBudget) -> list[Delivery]:
        """An explicit ID on a topic: the consumer's pending entries after it
        on every partition (those led elsewhere by their leaders)."""
        m = self._locate(t.membership)
        now_ms = self.broker.clock_ms()
        m.seen(read.consumer, now_ms)  # alive, even if a leader cannot be reached
        deliveries: dict[int, Delivery] = {}
        failures: list[ClusterError] = []

        def serve_here(p: int) -> None:
            delivery = self._serve_partition_history(m, p, t.after, read, now_ms, budget)
            if delivery is not None and delivery.count:
                deliveries[p] = delivery

        def part_of(p: int, caps: tuple[int, int, int]) -> GroupPart:
            return GroupPart(m.topic, p, m.group, read.consumer, GROUP_READ_HISTORY, read.count,
                             after=tuple(t.after), max_count=caps[0], max_size=caps[1], served=caps[2])

        def take(part: GroupPart, answer: Any) -> None:
            if isinstance(answer, ClusterError):
                failures.append(answer)
            elif answer.count:
                deliveries[part.n] = _delivery(partition_key(m.topic, part.n), answer)

        await self._serve_in_order(m, range(self.broker.topics.partition_count(m.topic)), budget, serve_here,
                                   part_of, self._ask_parts, take)
        if failures and not deliveries:
            raise failures[0]
        if not deliveries:
            return [Delivery(t.key, 0, [])]
        return [deliveries[p] for p in sorted(deliveries)]

    async def _ask_parts(self, parts: list[GroupPart]) -> list:
        """Each of ``parts`` served by its partition's leader (one request per
        leader, all at once; one that moved here is served here): its
        ``GroupPartRead``, or the ``ClusterError`` its leader failed with."""
        answers: list = [None] * len(parts)
        if not parts:
            return answers
        replication = self.broker.replication
        manager = replication.manager
        by_leader: dict[int, list[int]] = {}
        for i, part in enumerate(parts):
            by_leader.setdefault(manager.state.leader(manager.shard_of(part.topic, part.n)), []).append(i)

        async def ask(leader: int, indexes: list[int]) -> None:
            request = GroupReadRequest(tuple(parts[i] for i in indexes))
            try:
                if leader == manager.my_id:
                    response = self.serve_group_parts(request)
                else:
                    response = await self._call_leader(leader, request)
            except ClusterError as e:
                for i in indexes:
                    answers[i] = e
                return
            for i, answer in zip(indexes, response.parts):
                answers[i] = answer

        async with trio.open_nursery() as nursery:
            for leader, indexes in by_leader.items():
                nursery.start_soon(ask, leader, indexes)
        return answers

    async def _call_leader(self, leader: int, request: GroupReadRequest) -> GroupReadResponse:
        replication = self.broker.replication
        link = replication.link(leader, f"{PURPOSE}{self.client_id % GROUP_READ_LINKS}")
        link.reply_timeout_s = replication.config.forward_timeout_ms / 1000
        try:
            return await link.call(request)
        except Unreachable as e:
            keys = ", ".join(_text(partition_key(p.topic, p.n)) for p in request.parts)
            outcome = ("entries it delivered stay pending for the consumer (its history, ID 0, has them)"
                       if e.sent else "nothing was delivered")
            raise TryAgain(f"partition {keys} leader node {leader} unreachable: {e}; {outcome}") from None

    async def _group_wait_across(self, targets: list, positions: dict, timeout_s: float) -> None:
        """Until an append to a key of the read led here or a rebalance (the
        topic key's signal), a committed entry after ``positions`` on a
        partition led elsewhere, or ``timeout_s``."""
        broker = self.broker
        fanout = broker.replication.fanout
        keys: list[bytes] = []
        for t in targets:
            keys.append(t.key)
            if t.__class__ is _TopicTarget:
                keys.extend(broker.topics.expand(t.key))

        failures: list[BaseException] = []
        async with trio.open_nursery() as nursery:
            async def here() -> None:
                try:
                    await broker.keys.wait_for_keys(keys, timeout_s)
                except Exception as e:  # (TooManyBlockedError: raised as it is, not in a group)
                    failures.append(e)
                nursery.cancel_scope.cancel()

            async def away(topic: bytes, after: dict) -> None:
                starts = [after.get(n, (0, 0)) for n in range(max(after) + 1)]
                try:
                    await fanout.wait_for_entries(topic, starts, timeout_s, only=set(after))
                except ClusterError:
                    pass  # (the next round asks the leader again, and fails the read if it still cannot)
                nursery.cancel_scope.cancel()

            nursery.start_soon(here)
            for topic, after in positions.items():
                if after:
                    nursery.start_soon(away, topic, after)
        if failures:
            raise failures[0]

    # -- a topic's group views across nodes ---------------------------------------------

    async def _group_facts_across(self, topic: bytes, only: bytes | None) -> tuple[list, dict]:
        """``topic``'s group facts (``GroupOps.group_facts``) gathered where
        they are kept: each partition's groups from its leader, the
        memberships from the coordinator (the leader of partition 0, in the
        topic key's slot), one ``GroupInfoRequest`` per node, all at once;
        this node's share read here, after the others answered. Returns
        ``(groups per partition, memberships by group name)``. Raises
        ``TryAgain`` (a node unreachable, or a leadership moving) or the
        node's refusal."""
        manager = self.broker.replication.manager
        leader = manager.state.leader
        partitions = self.broker.topics.partition_count(topic)
        coordinator = leader(manager.shard_of(topic, 0))
        by_node: dict[int, list[int]] = {}
        for p in range(partitions):
            by_node.setdefault(leader(manager.shard_of(topic, p)), []).append(p)
        requests = {node: GroupInfoRequest(topic, tuple(ps), only, node == coordinator)
                    for node, ps in by_node.items()}
        answers = await self._ask_group_info(topic, requests)
        if manager.my_id in requests:
            self.commit_deferred()  # (other clients' writes meanwhile)
            answers[manager.my_id] = self.serve_group_info(requests[manager.my_id])
        parts: list = [()] * partitions
        memberships: dict = {}
        for node, request in requests.items():
            for p, groups in zip(request.partitions, answers[node].parts):
                parts[p] = groups
            memberships.update((m.name, m) for m in answers[node].members)
        return parts, memberships

    async def _ask_group_info(self, topic: bytes,
                              requests: dict[int, GroupInfoRequest]) -> dict[int, GroupInfoResponse]:
        """Each other node's answer to its request of ``requests`` (all at
        once); raises ``TryAgain`` (a node unreachable, or a leadership
        moving) or the node's refusal."""
        my_id = self.broker.replication.manager.my_id
        answers: dict[int, GroupInfoResponse] = {}
        failures: list[ClusterError] = []

        async def ask(node: int, request: GroupInfoRequest) -> None:
            link = self.broker.replication.link(node, f"{PURPOSE}{self.client_id % GROUP_READ_LINKS}")
            link.reply_timeout_s = READ_TIMEOUT_S
            try:
                answers[node] = await link.call(request)
            except (Unreachable, ClusterError) as e:
                failures.append(unreachable(node, [partition_key(topic, p) for p in request.partitions], e))

        async with trio.open_nursery() as nursery:
            for node, request in requests.items():
                if node != my_id:
                    nursery.start_soon(ask, node, request)
        if failures:
            raise failures[0]
        return answers

    async def _check_group_away(self, topic: bytes, name: bytes) -> None:
        """Refuse a topic key's group command (``-NOGROUP`` naming the
        partition key) when a partition other nodes lead lacks group
        ``name``, before anything is changed: each leader asked for the
        group on its partitions (``GroupOps._check_topic_group`` checked
        those led here). A group destroyed on a partition key meanwhile is
        not seen: the command then fails there, after the others changed."""
        manager = self.broker.replication.manager
        leader = manager.state.leader
        by_node: dict[int, list[int]] = {}
        for p in range(self.broker.topics.partition_count(topic)):
            node = leader(manager.shard_of(topic, p))
            if node != manager.my_id:
                by_node.setdefault(node, []).append(p)
        requests = {node: GroupInfoRequest(topic, tuple(ps), name, False) for node, ps in by_node.items()}
        answers = await self._ask_group_info(topic, requests)
        lacking = sorted(p for node, request in requests.items()
                         for p, groups in zip(request.partitions, answers[node].parts) if not groups)
        if lacking:
            raise GroupOpError(NO_GROUP_FOR_KEY, key=partition_key(topic, lacking[0]), group=name)

    def serve_group_info(self, request: GroupInfoRequest) -> GroupInfoResponse:
        """A ``GroupInfoRequest``: the groups of partitions this node leads
        (else ``TryAgain``: the asking node's view is behind) and, asked as
        the coordinator, the topic's memberships (``group_facts``; what
        syncing them writes is this session's, so the answer waits for it)."""
        self.commit_deferred()
        replication = self.broker.replication
        if replication is None:
            raise ClusterError("This instance has cluster support disabled")
        topic = request.topic
        asked = [_At(topic, n) for n in request.partitions]
        if request.members:
            asked.append(_At(topic, 0))  # (the coordinator leads the topic key's slot, partition 0's)
        check_leads(replication.manager, asked)
        return self.group_facts(topic, request.partitions, request.only, request.members)

    # -- a partition's leader ------------------------------------------------------

    def serve_group_parts(self, request: GroupReadRequest) -> GroupReadResponse:
        """A coordinator's ``GroupReadRequest``: each partition's share of a
        member's read, served here (this node must lead every one: else
        ``TryAgain``, nothing done); the group writes are this session's,
        so the answer waits for their durability and replication."""
        self.commit_deferred()
        replication = self.broker.replication
        if replication is None:
            raise ClusterError("This instance has cluster support disabled")
        check_leads(replication.manager, request.parts)
        now_ms = self.broker.clock_ms()
        return GroupReadResponse(tuple(self._serve_group_part(part, now_ms) for part in request.parts))

    def _serve_group_part(self, part: GroupPart, now_ms: int) -> GroupPartRead:
        pkey = partition_key(part.topic, part.n)
        stream = self.broker.topics.get(pkey)
        store = groups_of(stream) if stream is not None else None
        group = store.group(part.group) if store is not None else None
        if group is None:
            return GroupPartRead()
        consumer = part.consumer
        delivery = None
        queue: tuple = ()
        budget = ReadBudget.of(part.max_count, part.max_size, part.served)  # (what the read has left)
        if part.op == GROUP_READ_NEW:
            read = GroupRead(part.group, consumer, [pkey], [None], part.count, part.noack,
                             claim_ms=part.claim_ms if part.claim_ms >= 0 else None)
            if part.take_over:
                ids, wrote = hand_over(store, part.group, consumer, now_ms)
                if wrote:
                    self.wrote_group(store)
            else:
                ids = list(part.redeliver)
            mine, gone_through = take_queued(ids, group.consumer(consumer), budget.count_for(part.count))
            queue = tuple(ids[gone_through:])
            delivery = self._serve_owned(pkey, stream, store, group, read, mine, now_ms, budget)
        elif part.op == GROUP_HAND_OVER:
            ids, wrote = hand_over(store, part.group, consumer, now_ms)
            if wrote:
                self.wrote_group(store)
            queue = tuple(ids)
        elif part.op == GROUP_READ_HISTORY and group.consumer(consumer) is not None:
            delivery = self._serve_history(_Target(pkey, stream, store, group, StreamId(*part.after)), consumer,
                                           part.count, now_ms, budget)
        c = group.consumer(consumer)
        pending = len(c.pending) if c is not None else 0
        position = tuple(group.last_id)
        if delivery is None or not delivery.count:
            return GroupPartRead(queue=queue, pending=pending, position=position)
        chunks = tuple(c if c.__class__ is tuple else bytes(c) for c in delivery.chunks)
        claims = tuple(delivery.claims) if delivery.claims is not None else None
        size = part.max_size - budget.bytes_left if part.max_size else 0
        return GroupPartRead(delivery.count, chunks, claims, queue, pending, position, size)
