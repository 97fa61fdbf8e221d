"""Every partition's replica on this node: which it leads, which it follows,
serving followers' fetches and fetching from leaders.

Owns: the role of each partition (from its canonical key's hash slot, the
slot's shard and ``ClusterState``), the ``LeaderState`` of each partition
this node leads, one fetcher task per leader node this node follows
(``run_fetcher``), what a fetch asks and answers (the typed
``FetchRequest`` / ``FetchResponse`` of cluster/peer/messages.py), topic
discovery (a leader lists the partitions it leads for the asking follower,
with their ``topic.meta``), and a high-watermark checkpoint per partition.

Leadership is an input: ``ClusterState`` says who leads each shard at which
epoch; this module acts on it and never decides it (the controller's
committed metadata does, cluster/runtime/controller_driver.py). Peers carry their
``ClusterState`` view in every fetch request and reply; it is only compared
(``ClusterState.note_peer_view`` logs a disagreement), never adopted.

Canonical partition key: the bare topic name for a one-partition topic
(what clients send), ``topic#n`` otherwise. Its slot decides the shard.

Must not know: sockets, RESP bytes, commands. A fetcher reaches its leader
through a ``cluster.peer.link.PeerLink`` (``server/peer_resp.py`` over the
cluster bus, ``MemoryLink`` in tests).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import trio

from cluster import replication as rp
from cluster.errors import BadRequest, ClusterError, Moved, NotEnoughReplicas, Paused
from cluster.nodes import ClusterState, Placement, key_slot
from cluster.peer.link import PeerLink
from cluster.peer.messages import (Discovered, EpochEnd, EpochPartition, EpochRequest, EpochResponse,
                                   FetchedPartition, FetchPartition, FetchRequest, FetchResponse, PartitionEnd)
from cluster.topics import TopicRegistry, partition_key, split_partition_key
from storage.checkpoint import read_file, write_atomic
from storage.errors import StorageError
from storage.log_manager import decode_topic
from storage.streams.groups import GroupStateError, groups_of
from storage.streams.replica_state import (apply_group_changes, apply_producer_config, apply_state, encode_state,
                                           group_changes, state_version)

log = logging.getLogger("partita.replication")

HW_CHECKPOINT = "replication.hw"
RETRY_S = 0.5  # a fetcher whose leader is unreachable retries this often
# A leader that answers NOT_LEADER (this node has not applied the metadata
# that moved it yet: a Raft heartbeat brings it) is asked again after this.
NOT_LEADER_RETRY_S = 0.1
# What this replica's disk refused (a partition's batches or state, a topic)
# is asked for again this long after, not in the next fetch: the leader
# would answer at once, and a refusing disk would turn the fetcher into a
# busy loop.
APPLY_RETRY_MS = 1000
# A high-watermark checkpoint that failed is tried again by the ticks only
# this much later (a failing disk: one "disk error" line per partition per
# period, not one per tick).
HW_RETRY_MS = 10_000


@dataclass
class Settings:
    lag_max_ms: int = 30000
    fetch_wait_ms: int = 500
    fetch_max_bytes: int = 1024 * 1024
    # The batches one fetch response served here carries at most, whatever
    # the request asks (Kafka's fetch.max.bytes on the broker's side): a
    # fetch naming many partitions, or one partition many times, with a huge
    # max-bytes must not read a whole log into memory. Partitions past it get
    # no batches this round (their followers ask again).
    fetch_response_max_bytes: int = 64 * 1024 * 1024


# The names this module has always raised them under (cluster/errors.py).
NotLeaderError = Moved
NotEnoughReplicasError = NotEnoughReplicas


@dataclass
class Followed:
    """A partition this node follows."""

    topic: bytes
    n: int
    epoch_truncated: int = -1  # the shard epoch whose truncation step is done
    state_token: bytes = b""  # the leader's state version last applied
    group_token: bytes = b""  # where this replica stands in the leader's group journal
    # A fetch reply of this leader was applied: the log's high watermark is
    # one the leader sent (``committed_copy``). Before that it may be the
    # log's end as opened here, past entries never committed.
    hw_known: bool = False


def key_gone(registry: TopicRegistry, topic: bytes, n: int) -> bool:
    """The partition does not exist on this node (its topic was deleted, or
    a peer named a partition number the topic never had, negative ones too)."""
    return not 0 <= n < registry.partitions_of(topic)


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


class ReplicaManager:
    def __init__(self, registry: TopicRegistry, placement: Placement, state: ClusterState,
                 settings: Settings | None = None, *, clock_ms: Callable[[], int] = _now_ms,
                 topic_setting: Callable[[bytes, str], Any] | None = None) -> None:
        self.registry = registry
        self.placement = placement
        self.state = state
        self.settings = settings or Settings()
        self.clock_ms = clock_ms
        self.my_id = placement.my_id
        self.token = os.urandom(6).hex().encode()
        self.leaders: dict[tuple[bytes, int], rp.LeaderState] = {}
        self.followed: dict[int, dict[tuple[bytes, int], Followed]] = {}  # leader id -> partitions
        self.discovery_token: dict[int, bytes] = {}  # leader id -> its last topics token
        self.on_hw_advance: Callable[[bytes, int], None] = lambda topic, n: None
        self.on_group_progress: Callable[[], None] = lambda: None
        # A follower wrote fetched batches to a log, or changes to a group
        # store: the server has it synced by its fsync policy.
        self.on_applied: Callable[[Any], None] | None = None
        self.by_directory: dict[str, tuple[bytes, int]] = {}  # partition directory -> (topic, n) led here
        self._leading_stamp: tuple[int, int] | None = None
        self._topic_setting = topic_setting or (lambda topic, name: registry.config_value(topic, name))
        self.fetch_counts = {"served": 0, "fetched": 0, "truncations": 0}
        self.last_fetch_ms: dict[int, int] = {}  # follower node -> when it last fetched here
        self._led_since: dict[int, tuple[int, int]] = {}  # shard -> (epoch, ms) this leadership was first seen
        self._hw_saved: dict[tuple[bytes, int], int] = {}
        self._hw_failed: dict[tuple[bytes, int], tuple[str, int]] = {}  # key -> (error, retry at ms)
        self._follow_stamp: dict[int, tuple[int, int]] = {}
        self.paused: dict[int, tuple[int, int]] = {}  # shard -> (epoch, until ms)
        self._fetch_errors: dict[int, str] = {}  # leader -> the last fetch failure logged
        self._not_leading: set[int] = set()  # leaders whose last fetch reply said NOT_LEADER
        self._apply_errors: dict[tuple[bytes, int, str], str] = {}  # (partition, what) -> the last disk error logged
        self._apply_backoff: dict[tuple[bytes, int], int] = {}  # partition -> not fetched before (ms)
        self._rediscover_at: dict[int, int] = {}  # leader -> when to ask for its topics again (ms)
        self._shard_cache: dict[bytes, tuple[int, int]] = {}  # key -> (slot, shard): pure functions of the key

    # -- where a partition lives -------------------------------------------

    def canonical_key(self, topic: bytes, n: int) -> bytes:
        """The key whose slot places partition ``n``: the bare topic name for
        partition 0 (what clients send for a one-partition topic, and stable
        when a topic grows), ``topic#n`` for the others."""
        return topic if n == 0 else partition_key(topic, n)

    def shard_of(self, topic: bytes, n: int) -> int:
        return self.key_shard(self.canonical_key(topic, n))[1]

    def key_shard(self, key: bytes) -> tuple[int, int]:
        """``(slot, shard)`` of a client key: the key's own slot, and the shard
        of its partition (``t#0`` is partition 0, placed by ``t``)."""
        cached = self._shard_cache.get(key)
        if cached is not None:
            return cached
        slot = key_slot(key)
        try:
            topic, n = split_partition_key(key)
        except Exception:  # noqa: BLE001 - a malformed key is refused later, by the command
            topic, n = key, None
        place = key_slot(topic) if n == 0 else slot
        found = slot, self.placement.shard_of_slot(place)
        if len(self._shard_cache) >= 65536:
            self._shard_cache.clear()
        self._shard_cache[key] = found
        return found

    def forget_placement(self) -> None:
        """The shards changed under the cached key → shard answers (a joining node learned them)."""
        self._shard_cache.clear()

    def leads_shard(self, shard: int) -> bool:
        return self.state.leader(shard) == self.my_id

    def check_key(self, key: bytes) -> int:
        """The key's shard; NotLeaderError for a key this node does not lead."""
        slot, shard = self.key_shard(key)
        leader = self.state.leader(shard)
        if leader != self.my_id:
            raise NotLeaderError(slot, self.placement.by_id[leader])
        return shard

    def committed_copy(self, key: bytes) -> bool:
        """Whether this node follows the partition ``key`` names and knows
        which of its copy's entries are committed: it applied a fetch reply
        of the partition's current leader since it started following it
        (READONLY reads are served from such a copy only: ``Followed.hw_known``)."""
        shard = self.key_shard(key)[1]
        try:
            topic, n = split_partition_key(key)
        except Exception:  # noqa: BLE001 - a malformed key is refused later, by the command
            return False
        followed = self.followed.get(self.state.leader(shard))
        f = followed.get((topic, n or 0)) if followed is not None else None
        return f is not None and f.hw_known

    def is_paused(self, shard: int) -> bool:
        """A manual failover is moving ``shard``: its writes wait (TRYAGAIN)."""
        paused = self.paused.get(shard)
        if paused is None:
            return False
        if paused[0] == self.state.epoch(shard) and self.clock_ms() < paused[1]:
            return True
        del self.paused[shard]
        return False

    def is_replicated(self) -> bool:
        return self.placement.replication_factor > 1

    # -- leading ----------------------------------------------------------

    def leader_state(self, topic: bytes, n: int) -> rp.LeaderState | None:
        """This node's leader state of the partition (made on first use at the
        shard's current epoch), or None when it does not lead it, or the
        partition no longer exists (its topic deleted or renamed since)."""
        shard = self.shard_of(topic, n)
        leader, epoch = self.state.shards[shard]
        if leader != self.my_id or key_gone(self.registry, topic, n):
            self.leaders.pop((topic, n), None)
            return None
        stream = self.registry.stream_of(topic, n)
        plog = stream.log
        ls = self.leaders.get((topic, n))
        if ls is not None and ls.epoch == epoch and ls.log is plog and ls.replicas == self.placement.replicas(shard):
            return ls  # (another log: the topic was deleted and created again; other replicas: reassigned)
        if plog.hw_follows_end and self.placement.replication_factor > 1:  # freshly opened here: start from the checkpointed HW
            saved = self._read_hw(plog)
            plog.hw_follows_end = False
            plog.set_high_watermark(saved if saved is not None else plog.log_end_offset)
        stream.leader_epoch = max(epoch, plog.latest_epoch)
        committed = self.state.isr[shard] if self.state.controlled else None
        ls = rp.LeaderState(self.my_id, self.placement.replicas(shard), epoch, plog, self.clock_ms(),
                            min_insync=self.min_insync(topic), lag_max_ms=self.settings.lag_max_ms,
                            pinned=set(committed or ()), initial_isr=committed)
        self.leaders[(topic, n)] = ls
        self.by_directory[str(plog.directory)] = (topic, n)
        log.info("leading %s at epoch %d (replicas %s, end offset %d, high watermark %d)",
                 self.canonical_key(topic, n).decode("utf-8", "replace"), epoch,
                 ls.replicas, plog.log_end_offset, plog.high_watermark)
        return ls

    def min_insync(self, topic: bytes) -> int:
        return int(self._topic_setting(topic, "min-insync-replicas") or 1)

    def acks_all(self, topic: bytes) -> bool:
        return self.is_replicated() and self._topic_setting(topic, "acks") == "all"

    def pause(self, shard: int, ms: int) -> None:
        """Refuse writes to ``shard`` for ``ms`` (a manual failover is moving it); 0 resumes."""
        if ms > 0:
            self.paused[shard] = (self.state.epoch(shard), self.clock_ms() + ms)
        else:
            self.paused.pop(shard, None)

    def shard_ends(self, shard: int) -> tuple[PartitionEnd, ...]:
        """The end of each of the shard's partitions here (entries, stream
        state, group journal): what a follower must hold to take over."""
        out: list[PartitionEnd] = []
        reg = self.registry
        for topic in reg.topics():
            for n in range(reg.partitions_of(topic)):
                if self.shard_of(topic, n) == shard:
                    stream = reg.stream_of(topic, n)
                    plog = stream.log
                    ls = self.leader_state(topic, n)
                    if ls is None:
                        continue
                    ls.update_hw()  # followers' fetches may have moved it: re-evaluate
                    prefix = b"%s:%d:" % (self.token, ls.epoch)
                    gen, end = groups_of(stream).journal_position()
                    out.append(PartitionEnd(topic, n, plog.log_end_offset, plog.high_watermark,
                                            prefix + b"%d" % state_version(stream), prefix + b"%d:%d" % (gen, end)))
        return tuple(out)

    def holds(self, leader: int, ends: Sequence[PartitionEnd]) -> bool:
        """Whether this follower has everything ``shard_ends`` listed (entries,
        stream state, group journal) and the leader's HW covers the entries."""
        parts = self.followed.get(leader, {})
        for end in ends:
            f = parts.get((end.topic, end.n))
            if f is None or end.high_watermark < end.end_offset:
                return False
            plog = self.registry.stream_of(end.topic, end.n).log
            if (plog.log_end_offset < end.end_offset or f.group_token != end.group_token
                    or f.state_token != end.state_token):
                return False
        return True

    def before_append(self, topic: bytes, n: int) -> rp.LeaderState | None:
        """Called before an XADD appends: raises Moved when another node
        leads the partition, Paused during a manual failover, and
        NotEnoughReplicas for an acks=all topic whose ISR is smaller than
        min-insync-replicas (nothing written)."""
        ls = self.leader_state(topic, n)
        shard = self.shard_of(topic, n)
        if ls is None:
            raise Moved(key_slot(self.canonical_key(topic, n)), self.placement.by_id[self.state.leader(shard)])
        if self.is_paused(shard):
            raise Paused()
        ls.min_insync = self.min_insync(topic)
        if self.acks_all(topic) and not ls.accepts_acks_all():
            raise NotEnoughReplicas(len(ls.isr), self.canonical_key(topic, n), ls.min_insync)
        return ls

    def _prune(self) -> None:
        """Forget leader states of partitions deleted since (DEL, TOPIC DELETE)."""
        reg = self.registry
        for (topic, n), ls in list(self.leaders.items()):
            stream = reg.cached_stream(topic, n) if n < reg.partitions_of(topic) else None
            if stream is None or stream.log is not ls.log:
                del self.leaders[(topic, n)]
                self.by_directory.pop(str(ls.log.directory), None)
                self._hw_saved.pop((topic, n), None)
                self._hw_failed.pop((topic, n), None)

    def tick(self) -> None:
        """Periodic: ISR shrink by lag, HW checkpoints."""
        now = self.clock_ms()
        self._prune()
        stamp = (self.state.version, self.registry.generation)
        if stamp != self._leading_stamp:
            # Leader states for every partition led here, not only the ones
            # touched since: group writes and ISR reports look them up.
            self._leading_stamp = stamp
            reg = self.registry
            for topic in reg.topics():
                for n in range(reg.partitions_of(topic)):
                    if self.leads_shard(self.shard_of(topic, n)):
                        self.leader_state(topic, n)
        for (topic, n), ls in list(self.leaders.items()):
            before = set(ls.isr)
            hw = ls.log.high_watermark
            ls.min_insync = self.min_insync(topic)
            ls.check_lag(now)
            ls.update_hw()
            if ls.isr != before:
                log.warning("%s: ISR %s -> %s", self.canonical_key(topic, n).decode("utf-8", "replace"),
                            sorted(before), sorted(ls.isr))
            if ls.log.high_watermark != hw:
                self.on_hw_advance(topic, n)
        self.save_hw_checkpoints(prune=False, now_ms=now)  # pruned above

    def partition_at(self, directory: Any) -> tuple[bytes, int] | None:
        """``(topic, n)`` of a partition directory (``topics/<topic>/partition-<n>``)."""
        found = self.by_directory.get(str(directory))
        if found is not None:
            return found
        path = Path(directory)
        topic = decode_topic(path.parent.name)
        prefix, _, n = path.name.partition("-")
        if topic is None or prefix != "partition" or not n.isdigit():
            return None
        return topic, int(n)

    # -- the controller's ISR ---------------------------------------------------

    def on_isr_committed(self, shard: int, isr: set[int]) -> None:
        """The controller committed ``isr`` for ``shard``: the leader states of
        its partitions wait for those replicas from now on, and drop the ones
        the controller removed (they rejoin by catching up)."""
        for (topic, n), ls in list(self.leaders.items()):
            if self.shard_of(topic, n) != shard:
                continue
            for gone in ls.pinned - isr:
                ls.drop(gone)
            ls.pinned = set(isr)
            if ls.update_hw():
                self.on_hw_advance(topic, n)

    def offline_shards(self) -> list[int]:
        """The shards of which this node holds a partition whose log is
        offline for writes (a failed fsync): until it restarts it can neither
        lead them nor follow them (its heartbeat tells the controller, which
        moves their leadership and takes it out of their ISRs)."""
        return sorted({self.shard_of(topic, n) for topic, n in self.registry.offline_partitions()})

    def isr_proposals(self) -> list[tuple[int, set[int]]]:
        """``(shard, ISR)`` for each shard this node leads whose ISR here (the
        replicas in sync on every one of its partitions) is not what the
        controller has: the ISR change to propose. An expansion looks at every
        partition of the shard on this node, not only the ones touched since
        this node became leader."""
        if not self.state.controlled:
            return []
        now = self.clock_ms()
        mine = {s for s in range(self.placement.shard_count) if self.leads_shard(s)}
        local: dict[int, set[int]] = {}
        for (topic, n), ls in self.leaders.items():
            s = self.shard_of(topic, n)
            if s in mine:
                local[s] = set(ls.isr) if s not in local else local[s] & ls.isr
        out = []
        for s in sorted(mine):
            committed = self.state.isr[s]
            if s not in local:  # no partition here: in sync = fetching from this node
                # Counted from when this leadership began at the latest, as a
                # LeaderState starts every follower caught up (Kafka's
                # lastCaughtUpTime): a new leader must not drop followers that
                # have not had the time to fetch from it yet.
                since = self._leading_since(s, now)
                want = {self.my_id} | {r for r in self.placement.replicas(s) if r != self.my_id
                                       and now - max(self.last_fetch_ms.get(r, since), since)
                                       <= self.settings.lag_max_ms}
            else:
                want = local[s]
            if want - committed:
                want = self._shard_isr_everywhere(s, want)
            if want != committed:
                out.append((s, want))
        return out

    def _leading_since(self, shard: int, now: int) -> int:
        """When this node was first seen leading ``shard`` at its current epoch."""
        epoch = self.state.epoch(shard)
        seen = self._led_since.get(shard)
        if seen is None or seen[0] != epoch:
            seen = self._led_since[shard] = (epoch, now)
        return seen[1]

    def _shard_isr_everywhere(self, shard: int, want: set[int]) -> set[int]:
        reg = self.registry
        for topic in reg.topics():
            for n in range(reg.partitions_of(topic)):
                if self.shard_of(topic, n) == shard:
                    ls = self.leader_state(topic, n)
                    if ls is not None:
                        want = want & ls.isr
        return want

    # -- serving a follower's fetch -----------------------------------------

    def serve_fetch(self, request: FetchRequest) -> tuple[FetchResponse, bool]:
        """One follower's fetch; returns ``(response, has_news)``. ``has_news``
        False means the response carries nothing a follower waits for (the
        caller may hold it up to max-wait and ask again). Raises
        ``BadRequest`` when the asking node is no other member of the
        cluster (a stranger on the bus): nothing of it is recorded."""
        replica = request.replica
        if replica == self.my_id or replica not in self.placement.by_id:
            raise BadRequest(f"node {replica} is not another member of this cluster")
        self.state.note_peer_view(request.view, f"node {replica}")
        now = self.clock_ms()
        self.last_fetch_ms[replica] = now
        news = False
        topics_token = b"%s:%d:%d" % (self.token, self.registry.generation, self.state.version)
        discovered = None
        if request.topics_token != topics_token:
            discovered = self._discover_for(replica)
            news = True
        results = []
        budget = self.settings.fetch_response_max_bytes
        for part in request.partitions:
            res, item_news = self._serve_partition(replica, part, min(request.max_bytes, budget), now)
            if res is not None:
                results.append(res)
                budget -= len(res.batches)
            news |= item_news
        self.fetch_counts["served"] += 1
        return FetchResponse(self.state.encode(), topics_token, discovered, tuple(results)), news

    def _discover_for(self, replica: int) -> tuple[Discovered, ...]:
        out: list[Discovered] = []
        reg = self.registry
        for topic in reg.topics():
            for n in range(reg.partitions_of(topic)):
                shard = self.shard_of(topic, n)
                if self.leads_shard(shard) and replica in self.placement.replicas(shard):
                    out.append(Discovered(topic, n, reg.topic_meta_blob(topic)))
        return tuple(out)

    def _serve_partition(self, replica: int, part: FetchPartition, max_bytes: int,
                         now: int) -> tuple[FetchedPartition | None, bool]:
        """One partition's answer and whether it is news; None when the
        answer would change nothing of the follower's copy as its request
        shows it (left out of the response: ``FetchResponse``)."""
        reg = self.registry
        topic, n, offset, their_epoch = part.topic, part.n, part.offset, part.last_epoch
        their_state, their_groups = part.state_token, part.group_token
        if key_gone(reg, topic, n):
            return FetchedPartition(topic, n, rp.UNKNOWN_PARTITION), True
        ls = self.leader_state(topic, n)
        if ls is None:
            return FetchedPartition(topic, n, rp.NOT_LEADER), True
        if reg.topic_id(topic) != part.topic_id:
            return FetchedPartition(topic, n, rp.TOPIC_ID_MISMATCH, topic_meta=reg.topic_meta_blob(topic)), True
        plog = ls.log
        if offset < plog.log_start_offset or offset > plog.log_end_offset:
            return FetchedPartition(topic, n, rp.OUT_OF_RANGE, log_start=plog.log_start_offset,
                                    log_end=plog.log_end_offset), True
        if their_epoch >= 0 and offset > plog.log_start_offset:
            # KIP-595's check: the follower's log must end inside what this
            # leader has for the follower's last epoch, else the two diverge
            # and the follower truncates (REPLEPOCH) before fetching on.
            epoch, end = plog.end_offset_for_epoch(their_epoch)
            if epoch != their_epoch or end < offset:
                return FetchedPartition(topic, n, rp.DIVERGING), True
        hw_before = plog.high_watermark
        if ls.on_fetch(replica, offset, now):
            self.on_hw_advance(topic, n)
        batches = b""
        if offset < plog.log_end_offset and max_bytes > 0:  # (0 or less: the response is full)
            batches, _next = plog.read_batches(offset, max_bytes)
            ls.progress[replica].fetched_bytes += len(batches)
        stream = reg.stream_of(topic, n)
        prefix = b"%s:%d:" % (self.token, ls.epoch)
        token = prefix + b"%d" % state_version(stream)
        state = encode_state(stream) if token != their_state else None
        progress = ls.progress.get(replica)
        if their_state.startswith(prefix) and progress is not None:
            applied = int(their_state[len(prefix):])
            if progress.state_version != applied:
                progress.state_version = applied
                self.on_group_progress()
        gen, pos = -1, -1
        if their_groups.startswith(prefix):
            gen, pos = (int(x) for x in their_groups[len(prefix):].split(b":"))
            if progress is not None and progress.group_pos != (gen, pos):
                progress.group_pos = (gen, pos)
                self.on_group_progress()
        gen, end, snapshot, records = group_changes(stream, gen, pos)
        group_token = prefix + b"%d:%d" % (gen, end)
        hw = plog.high_watermark
        if (not batches and state is None and snapshot is None and not records and group_token == their_groups
                and part.high_watermark == hw and min(plog.log_start_offset, hw) <= part.log_start):
            return None, False  # (apply_fetch would leave the copy as it is)
        news = (bool(batches) or state is not None or plog.high_watermark != hw_before
                or snapshot is not None or bool(records))
        return FetchedPartition(topic, n, "", plog.high_watermark, plog.log_start_offset, plog.log_end_offset,
                                batches, token, state, group_token, snapshot, records or b""), news

    def end_offsets_for_epochs(self, request: EpochRequest) -> EpochResponse:
        """For each partition, this leader's largest epoch up to the asked one
        and that epoch's end offset (KIP-101), or an error code."""
        out: list[EpochEnd] = []
        for part in request.partitions:
            if key_gone(self.registry, part.topic, part.n):
                out.append(EpochEnd(error=rp.UNKNOWN_PARTITION))
                continue
            ls = self.leader_state(part.topic, part.n)
            if ls is None:
                out.append(EpochEnd(error=rp.NOT_LEADER))
                continue
            e, end = ls.log.end_offset_for_epoch(part.epoch)
            out.append(EpochEnd(e, end))
        return EpochResponse(tuple(out))

    # -- following ------------------------------------------------------------

    def leaders_to_follow(self) -> list[int]:
        """Nodes leading a shard this node replicates (not itself)."""
        out = set()
        for shard in self.placement.shards_of(self.my_id):
            leader = self.state.leader(shard)
            if leader != self.my_id:
                out.add(leader)
        for gone in [lid for lid in self.followed if lid not in out]:
            del self.followed[gone]
            self._follow_stamp.pop(gone, None)
        return sorted(out)

    def _follows(self, leader: int) -> dict[tuple[bytes, int], Followed]:
        parts = self.followed.setdefault(leader, {})
        stamp = (self.registry.generation, self.state.version)
        if self._follow_stamp.get(leader) == stamp:
            return parts
        self._follow_stamp[leader] = stamp
        # Partitions already on disk in the leader's shards are followed from the start.
        for topic in self.registry.topics():
            for n in range(self.registry.partitions_of(topic)):
                if (topic, n) not in parts and self._follows_from(topic, n) == leader:
                    parts[(topic, n)] = Followed(topic, n)
        for key in [k for k in parts
                    if key_gone(self.registry, *k) or self._follows_from(*k) != leader]:
            del parts[key]
        return parts

    def _follows_from(self, topic: bytes, n: int) -> int | None:
        shard = self.shard_of(topic, n)
        if self.my_id not in self.placement.replicas(shard):
            return None
        leader = self.state.leader(shard)
        return leader if leader != self.my_id else None

    def fetch_request(self, leader: int) -> FetchRequest:
        """The fetch for the followed partitions whose truncation step is done
        for the shard's current epoch (the others fetch once it is)."""
        parts = self._follows(leader)
        token = self.discovery_token.get(leader, b"")
        backoff = self._apply_backoff
        if backoff or self._rediscover_at:
            now = self.clock_ms()
            if now >= self._rediscover_at.get(leader, now + 1):
                del self._rediscover_at[leader]
                token = b""  # a topic it could not take: listed again
            for key, until in list(backoff.items()):
                if now >= until:
                    del backoff[key]
        wanted: list[FetchPartition] = []
        for f in parts.values():
            if f.epoch_truncated != self.state.epoch(self.shard_of(f.topic, f.n)):
                continue
            if backoff and (f.topic, f.n) in backoff:
                continue  # its last fetched changes were refused by this disk: not yet
            stream = self.registry.stream_of(f.topic, f.n)
            plog = stream.log
            if plog.sync_failure is not None:
                continue  # it could not apply them (offline after a failed fsync): not fetched, it leaves the ISR
            known = f.hw_known  # (else the leader sends the high watermark and log start in any case)
            wanted.append(FetchPartition(f.topic, f.n, self.registry.topic_id(f.topic) or "", plog.log_end_offset,
                                         plog.latest_epoch, f.state_token, f.group_token,
                                         plog.high_watermark if known else -1, plog.log_start_offset if known else -1))
        return FetchRequest(self.my_id, self.state.encode(), self.settings.fetch_wait_ms,
                            self.settings.fetch_max_bytes, token, tuple(wanted))

    def truncation_request(self, leader: int) -> tuple[EpochRequest, list[Followed]]:
        """The epoch query for followed partitions whose truncation step is
        not done for the shard's current epoch."""
        asked: list[EpochPartition] = []
        todo = []
        for f in self._follows(leader).values():
            epoch = self.state.epoch(self.shard_of(f.topic, f.n))
            if f.epoch_truncated == epoch:
                continue
            plog = self.registry.stream_of(f.topic, f.n).log
            if plog.sync_failure is not None:
                continue  # offline after a failed fsync: it takes no part until reopened (fetch_request)
            if (f.topic, f.n) in self._apply_backoff:
                continue  # this disk refused its last cut: not yet (fetch_request ends the wait)
            if plog.latest_epoch < 0:
                f.epoch_truncated = epoch
                continue
            asked.append(EpochPartition(f.topic, f.n, plog.latest_epoch))
            todo.append(f)
        return EpochRequest(tuple(asked)), todo

    def apply_truncation(self, leader: int, todo: list[Followed], response: EpochResponse) -> None:
        if len(response.ends) != len(todo):
            raise ValueError(f"node {leader} answered {len(response.ends)} epochs for {len(todo)} partitions")
        for f, answer in zip(todo, response.ends):
            if answer.error:
                continue  # the leader moved or lost it: the next fetch says what to do
            if self._follows_from(f.topic, f.n) != leader or key_gone(self.registry, f.topic, f.n):
                continue  # leadership moved, or the topic went, while the request was out
            stream = self.registry.stream_of(f.topic, f.n)
            stream.commit()
            plog = stream.log
            plog.hw_follows_end = False
            target = rp.truncation_offset(plog, (answer.epoch, answer.end_offset))
            if target is not None:
                log.warning("%s: truncating from %d to %d (leader's end of epoch %s)",
                            self.canonical_key(f.topic, f.n).decode("utf-8", "replace"),
                            plog.log_end_offset, target, answer.epoch)
                try:
                    plog.truncate_to(target)
                except StorageError as e:
                    # This disk refused the cut (full, or a failed fsync took
                    # the log offline): this partition only; asked again later.
                    self._apply_failed(f.topic, f.n, "truncation", e)
                    continue
                self._apply_ok(f.topic, f.n, "truncation")
                self.fetch_counts["truncations"] += 1
            f.epoch_truncated = self.state.epoch(self.shard_of(f.topic, f.n))

    def apply_fetch(self, leader: int, response: FetchResponse) -> bool:  # noqa: C901 - one reply, one pass
        """Apply a fetch response; True when anything was appended."""
        if response.view:
            self.state.note_peer_view(response.view, f"node {leader}")
        if response.discovered is not None:
            self.discovery_token[leader] = response.topics_token
            if not self._apply_discovery(leader, response.discovered):
                self._rediscover_at[leader] = self.clock_ms() + APPLY_RETRY_MS
        appended = False
        parts = self.followed.get(leader, {})
        for res in response.partitions:
            topic, n = res.topic, res.n
            f = parts.get((topic, n))
            if f is None or self._follows_from(topic, n) != leader:
                continue  # not followed from this leader (any more): never touch a log this node leads
            if key_gone(self.registry, topic, n):
                parts.pop((topic, n), None)  # deleted here while the fetch was out
                continue
            if res.error:
                self._on_fetch_error(leader, f, res)
                continue
            token, state, group_token = res.state_token, res.state, res.group_token
            group_snapshot, group_records = res.group_snapshot, res.group_records
            stream = self.registry.stream_of(topic, n)
            before = stream.log.log_end_offset
            hw_before = stream.log.high_watermark
            try:
                stream.commit()
                if state is not None:  # XCFGSET's IDMP settings reach the producer state before the batches
                    apply_producer_config(stream, state)
                rp.apply_fetched(stream.log, res.batches, res.high_watermark, res.log_start)
            except (StorageError, ValueError) as e:
                # This replica's disk refused (full, or the log is offline
                # after a failed fsync), or the batches or state do not
                # parse (InvalidBatchError: nothing was appended): skip the
                # partition, not the fetch; it stays behind (and leaves the
                # ISR while it does), the others go on.
                self._apply_failed(topic, n, "batches", e)
                continue
            self._apply_ok(topic, n, "batches")
            f.hw_known = True
            if stream.log.high_watermark > hw_before:
                self.on_hw_advance(topic, n)  # READONLY readers blocked on this copy (XREAD BLOCK) wake
            grew = stream.log.log_end_offset != before
            if grew:
                appended = True
                stream.leader_epoch = max(stream.leader_epoch, stream.log.latest_epoch)
            if self.on_applied is not None and (grew or state is not None):
                self.on_applied(stream.log)  # its batches, or the deletion markers the state brings
            try:
                if state is not None and apply_state(stream, state):
                    f.state_token = token
                if group_snapshot is not None or group_records:
                    try:
                        apply_group_changes(stream, group_snapshot, group_records)
                        f.group_token = group_token
                        if self.on_applied is not None:
                            self.on_applied(groups_of(stream))
                    except GroupStateError as e:
                        log.warning("%s: replicated group state did not apply (%s): asking for a snapshot",
                                    self.canonical_key(topic, n).decode("utf-8", "replace"), e)
                        f.group_token = b""
                else:
                    f.group_token = group_token
            except (StorageError, ValueError) as e:
                # The stream's or the groups' state could not be written
                # (disk full), or it does not parse (nothing of it applied):
                # the leader sends it again with the next fetch.
                self._apply_failed(topic, n, "stream and group state", e)
                continue
            self._apply_ok(topic, n, "stream and group state")
            self.fetch_counts["fetched"] += 1
        return appended

    def _apply_discovery(self, leader: int, discovered: Sequence[Discovered]) -> bool:
        """Take the topics ``leader`` lists; False if one could not be
        created or updated here (a disk error: logged once, retried)."""
        parts = self.followed.setdefault(leader, {})
        complete = True
        for found in discovered:
            topic, n = found.topic, found.n
            try:
                self.registry.adopt_topic(topic, found.meta)
            except (StorageError, OSError) as e:
                self._apply_failed(topic, n, "topic", e)
                complete = False
                continue
            self._apply_ok(topic, n, "topic")
            if (topic, n) not in parts and self._follows_from(topic, n) == leader:
                parts[(topic, n)] = Followed(topic, n)
        # A partition the leader does not list is not taken as deleted: a
        # new leader may not know a topic yet, and deletions reach every node
        # through the controller's metadata log (cluster/runtime/controller_driver.py).
        return complete

    def _apply_failed(self, topic: bytes, n: int, what: str, error: Exception) -> None:
        """Log a partition's disk error, or the malformed data a leader sent
        for it (a ValueError), once per new reason (it recurs every fetch)."""
        self._apply_backoff[(topic, n)] = self.clock_ms() + APPLY_RETRY_MS
        text = str(error) if isinstance(error, StorageError) else f"the leader sent malformed data: {error}"
        if self._apply_errors.get((topic, n, what)) != text:
            self._apply_errors[(topic, n, what)] = text
            log.warning("%s: fetched %s not applied, this replica falls behind: %s",
                        self.canonical_key(topic, n).decode("utf-8", "replace"), what, text)

    def _apply_ok(self, topic: bytes, n: int, what: str) -> None:
        if self._apply_errors and self._apply_errors.pop((topic, n, what), None) is not None:
            log.info("%s: applying fetched %s again", self.canonical_key(topic, n).decode("utf-8", "replace"), what)

    def _on_fetch_error(self, leader: int, f: Followed, res: FetchedPartition) -> None:
        name = self.canonical_key(f.topic, f.n).decode("utf-8", "replace")
        error = res.error
        if error == rp.OUT_OF_RANGE:
            lso, leo = res.log_start, res.log_end
            plog = self.registry.stream_of(f.topic, f.n).log
            if plog.log_end_offset < lso:
                log.warning("%s: end offset %d is below the leader's log start %d: restarting the replica there",
                            name, plog.log_end_offset, lso)
                try:
                    plog.restart_at(lso)
                except StorageError as e:  # as a truncation's: this partition only
                    self._apply_failed(f.topic, f.n, "restart", e)
            elif plog.log_end_offset > leo:
                f.epoch_truncated = -1  # truncate by epoch again before fetching
        elif error == rp.TOPIC_ID_MISMATCH:
            log.warning("%s: the leader's topic is another incarnation: replacing this replica", name)
            self.registry.adopt_topic(f.topic, res.topic_meta)
            self.followed.get(leader, {}).pop((f.topic, f.n), None)
            self.discovery_token.pop(leader, None)
        elif error == rp.DIVERGING:
            log.warning("%s: the log diverges from the leader's: truncating by epoch first", name)
            f.epoch_truncated = -1
        elif error == rp.UNKNOWN_PARTITION:
            self.followed.get(leader, {}).pop((f.topic, f.n), None)
            self.discovery_token.pop(leader, None)
        elif error == rp.NOT_LEADER:
            # The controller's metadata says who leads now; this node has not
            # applied it yet (the fetchers restart when it does): not again at once.
            self._not_leading.add(leader)

    async def run_fetcher(self, leader: int, link: PeerLink) -> None:
        """Fetch from ``leader`` until it no longer leads anything this node
        follows (the caller restarts fetchers when the cluster view changes)."""
        while leader in self.leaders_to_follow():
            try:
                request, todo = self.truncation_request(leader)
                if todo:
                    self.apply_truncation(leader, todo, await link.call(request))
                self.apply_fetch(leader, await link.call(self.fetch_request(leader)))
                if self._fetch_errors.pop(leader, None) is not None:
                    log.info("fetching from node %d again", leader)
                if leader in self._not_leading:
                    self._not_leading.discard(leader)
                    await trio.sleep(NOT_LEADER_RETRY_S)
            except (ConnectionError, OSError, EOFError, ClusterError) as e:  # unreachable, or refused
                # Once per new reason (a peer that is down says so every retry).
                text = str(e)
                if self._fetch_errors.get(leader) != text:
                    self._fetch_errors[leader] = text
                    log.warning("fetch from node %d failed (retrying every %.1fs): %s", leader, RETRY_S, text)
                await trio.sleep(RETRY_S)
            except Exception:  # a bug or a damaged reply must not stop the node
                log.exception("fetch from node %d failed", leader)
                await trio.sleep(RETRY_S)
            await trio.sleep(0)

    # -- checkpoints -------------------------------------------------------------

    def _read_hw(self, plog: Any) -> int | None:
        data = read_file(plog.directory / HW_CHECKPOINT)
        try:
            return int(data) if data else None
        except ValueError:
            return None

    def save_hw_checkpoints(self, *, prune: bool = True, now_ms: int | None = None) -> None:
        """Write the high watermarks that moved. Best effort: the file only
        shortens what a restart shows at once (docs/guarantees.md). With
        ``now_ms`` (the ticks) one that failed waits ``HW_RETRY_MS``."""
        if prune:
            self._prune()
        for key, ls in self.leaders.items():
            hw = ls.log.high_watermark
            if self._hw_saved.get(key) == hw:
                continue
            failed = self._hw_failed.get(key)
            if failed is not None and now_ms is not None and now_ms < failed[1]:
                continue
            try:
                write_atomic(ls.log.directory / HW_CHECKPOINT, b"%d" % hw, sync=False)
                self._hw_saved[key] = hw
                self._hw_failed.pop(key, None)
            except (OSError, StorageError) as e:
                if failed is None or failed[0] != str(e):  # warned about once per new reason
                    log.warning("high watermark checkpoint of %s failed (retried every %ds): %s",
                                self.canonical_key(*key).decode("utf-8", "replace"), HW_RETRY_MS // 1000, e)
                self._hw_failed[key] = (str(e), self.clock_ms() + HW_RETRY_MS)

    def partition_view(self, topic: bytes, n: int) -> dict[str, Any]:
        """Where a partition lives, for TOPIC DESCRIBE: its leader, replicas,
        epoch, and (on its leader) ISR and high watermark."""
        shard = self.shard_of(topic, n)
        view: dict[str, Any] = {"leader": self.state.leader(shard), "leader-epoch": self.state.epoch(shard),
                                "replicas": self.placement.replicas(shard)}
        ls = self.leader_state(topic, n)
        if ls is not None:
            view["isr"] = sorted(ls.isr)
            view["high-watermark"] = ls.log.high_watermark
        return view

    def committed_view(self, topic: bytes, n: int) -> dict[str, Any]:
        """Where a partition lives by the controller's committed metadata,
        the same on every node (TOPIC DESCRIBE in a cluster): leader, leader
        epoch, replicas (preferred leader first), ISR; and ``local-replica``:
        this node's part in it (leader / follower / none)."""
        shard = self.shard_of(topic, n)
        leader = self.state.leader(shard)
        replicas = list(self.placement.replicas(shard))
        local = "leader" if leader == self.my_id else "follower" if self.my_id in replicas else "none"
        return {"leader": leader, "leader-epoch": self.state.epoch(shard), "replicas": replicas,
                "isr": sorted(self.state.isr[shard]), "local-replica": local}

    def replica_lags(self, topic: bytes, n: int) -> dict[int, int]:
        """On the partition's leader: each follower's entries behind the log
        end (its fetch offset is its ack); empty where this node does not lead."""
        ls = self.leader_state(topic, n)
        if ls is None:
            return {}
        return {rid: ls.lag(rid) for rid in ls.replicas if rid != self.my_id}

    # -- INFO ---------------------------------------------------------------------

    def follower_lines(self) -> list[str]:
        """Redis's ``slaveN:`` lines of INFO replication, one per node that
        follows a partition this node leads: ``offset`` is the sum of the
        offsets it has of them, ``lag`` the seconds since its last fetch,
        ``state`` online when it is in every such partition's ISR, else
        send_bulk (catching up)."""
        now_ms = self.clock_ms()
        followers: dict[int, list[tuple[rp.LeaderState, rp.FollowerProgress]]] = {}
        for (topic, n), ls in list(self.leaders.items()):  # (leader_state drops deleted partitions)
            if self.leader_state(topic, n) is ls:
                for rid, progress in ls.progress.items():
                    followers.setdefault(rid, []).append((ls, progress))
        lines = []
        for i, (rid, led) in enumerate(sorted(followers.items())):
            node = self.placement.by_id.get(rid)
            if node is None:
                continue
            fetched_ms = max(p.last_fetch_ms for _, p in led)
            lag_s = (now_ms - fetched_ms) // 1000 if fetched_ms >= 0 else -1
            state = "online" if all(rid in ls.isr for ls, _ in led) else "send_bulk"
            lines.append(f"slave{i}:ip={node.host},port={node.port},state={state},"
                         f"offset={sum(p.match_offset for _, p in led)},lag={lag_s}")
        return lines

    def info_lines(self) -> list[str]:
        lines = [f"cluster_node_id:{self.my_id}", f"cluster_nodes:{len(self.placement.nodes)}",
                 f"replication_factor:{self.placement.replication_factor}",
                 f"fetches_served:{self.fetch_counts['served']}",
                 f"fetch_results_applied:{self.fetch_counts['fetched']}",
                 f"truncations:{self.fetch_counts['truncations']}",
                 f"offline_shards:{','.join(map(str, self.offline_shards())) or '-'}"]
        for s in range(self.placement.shard_count):
            first, last = self.placement.slot_range(s)
            lines.append(f"shard{s}:slots={first}-{last},leader={self.state.leader(s)},"
                         f"epoch={self.state.epoch(s)},replicas={'/'.join(map(str, self.placement.replicas(s)))}")
        i = 0
        for (topic, n), ls in sorted(self.leaders.items()):
            if self.leader_state(topic, n) is not ls:
                continue
            plog = ls.log
            per_entry = plog.size_bytes / max(1, plog.log_end_offset - plog.log_start_offset)
            lag = "/".join(f"node{rid}:{ls.lag(rid)}:{int(ls.lag(rid) * per_entry)}"
                           for rid in sorted(ls.progress))
            lines.append(f"partition{i}:key={self.canonical_key(topic, n).decode('utf-8', 'replace')},role=leader,"
                         f"epoch={ls.epoch},isr={'/'.join(map(str, sorted(ls.isr)))},"
                         f"high_watermark={ls.log.high_watermark},end_offset={ls.log.log_end_offset},lag={lag}")
            i += 1
        for leader, parts in sorted(self.followed.items()):
            for (topic, n) in sorted(parts):
                stream = self.registry.cached_stream(topic, n)
                if stream is None:
                    continue
                plog = stream.log
                lines.append(f"partition{i}:key={self.canonical_key(topic, n).decode('utf-8', 'replace')},"
                             f"role=follower,leader={leader},epoch={self.state.epoch(self.shard_of(topic, n))},"
                             f"high_watermark={plog.high_watermark},end_offset={plog.log_end_offset}")
                i += 1
        return lines
