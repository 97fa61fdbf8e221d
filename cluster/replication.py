"""One partition's replication state machines, free of I/O.

Owns: the leader side (each follower's progress, the ISR, the high
watermark, acks=all admission) and the follower side (what to ask for,
truncation by leader epoch, applying a fetch response to the log). Time is
a number passed in (``now_ms``); nothing here sleeps, reads a socket or
imports trio, so the rules are tested step by step (tests/cluster/).

Kafka's rules (docs/replication.md):

- the fetch offset is the acknowledgement: a follower fetching from offset
  ``o`` has everything below ``o`` (``FollowerProgress.match_offset``);
- a follower is *caught up* when it fetches from the leader's end offset; it
  leaves the ISR when not caught up for ``lag_max_ms`` and rejoins when its
  match offset reaches the high watermark;
- high watermark = min(match offsets over the ISR, the leader's own end),
  never moving backwards, and frozen while ``|ISR| < min_insync``;
- acks=all appends are refused before appending when ``|ISR| < min_insync``;
- a new follower truncates to the leader's end offset for its latest epoch
  (KIP-101) refined by its own end for the epoch the leader answers with
  (KIP-279), then fetches.

Must not know: sockets, RESP, trio, which node is which (ids are opaque).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Errors a leader answers a partition's fetch with (Kafka's names).
NOT_LEADER = "NOT_LEADER"
FENCED = "FENCED_LEADER_EPOCH"
UNKNOWN_EPOCH = "UNKNOWN_LEADER_EPOCH"  # the requester is ahead of this leader
OUT_OF_RANGE = "OFFSET_OUT_OF_RANGE"
UNKNOWN_PARTITION = "UNKNOWN_PARTITION"
TOPIC_ID_MISMATCH = "TOPIC_ID_MISMATCH"
DIVERGING = "DIVERGING_EPOCH"  # the follower's log is not a prefix of the leader's (KIP-595): truncate first


@dataclass
class FollowerProgress:
    match_offset: int = 0  # the follower has every offset below this
    last_caught_up_ms: int = 0
    last_fetch_ms: int = -1  # -1: never fetched since this leadership began
    fetched_bytes: int = 0
    group_pos: tuple[int, int] = (-1, -1)  # where it stands in the leader's group journal (generation, byte)
    state_version: int = -1  # the leader's stream state (markers, metadata) it has applied, at this epoch


@dataclass
class LeaderState:
    """The leader's view of one partition's replicas."""

    my_id: int
    replicas: list[int]
    epoch: int
    log: Any  # storage.log.PartitionLog
    now_ms: int
    min_insync: int = 1
    lag_max_ms: int = 30000
    isr: set[int] = field(default_factory=set)
    progress: dict[int, FollowerProgress] = field(default_factory=dict)
    # The ISR the controller committed for this partition's shard: the high
    # watermark also waits for these (an election may pick any of them), so
    # a shrink counts only once committed; expansions count at once.
    pinned: set[int] = field(default_factory=set)
    initial_isr: set[int] | None = None

    def __post_init__(self) -> None:
        # Conservative start: the committed ISR, or with no controller every
        # replica (nothing is acknowledged on fewer copies than the ISR the
        # last leader had); one that does not fetch leaves after lag_max_ms.
        self.isr = (set(self.initial_isr) & set(self.replicas)) | {self.my_id} \
            if self.initial_isr is not None else set(self.replicas)
        for rid in self.replicas:
            if rid != self.my_id:
                self.progress[rid] = FollowerProgress(match_offset=self.log.high_watermark,
                                                      last_caught_up_ms=self.now_ms)
        if len(self.replicas) > 1:
            self.log.hw_follows_end = False

    # -- followers report -------------------------------------------------

    def on_fetch(self, replica: int, fetch_offset: int, now_ms: int) -> bool:
        """A follower fetched from ``fetch_offset``; True if the HW moved."""
        p = self.progress.get(replica)
        if p is None:
            return False
        end = self.log.log_end_offset
        fetch_offset = min(fetch_offset, end)
        p.match_offset = fetch_offset
        p.last_fetch_ms = now_ms
        if fetch_offset >= end:
            p.last_caught_up_ms = now_ms
        if replica not in self.isr and fetch_offset >= self.log.high_watermark:
            self.isr.add(replica)
        return self.update_hw()

    def check_lag(self, now_ms: int) -> bool:
        """Drop followers not caught up for ``lag_max_ms``; True if the ISR shrank."""
        end = self.log.log_end_offset
        out = [rid for rid, p in self.progress.items()
               if rid in self.isr and p.match_offset < end and now_ms - p.last_caught_up_ms > self.lag_max_ms]
        for rid in out:
            self.isr.discard(rid)
        if out:
            self.update_hw()
        return bool(out)

    def update_hw(self) -> bool:
        log = self.log
        if log.hw_follows_end or len(self.isr) < self.min_insync:
            return False
        hw = log.log_end_offset
        for rid in self.isr | self.pinned if self.pinned else self.isr:
            p = self.progress.get(rid)
            if p is not None:
                hw = min(hw, p.match_offset)
        if hw > log.high_watermark:
            log.set_high_watermark(hw)
            return True
        return False

    # -- producers ask ----------------------------------------------------

    def drop(self, replica: int) -> None:
        """The controller took ``replica`` out of the ISR (fenced, restarted):
        it rejoins by fetching up to the high watermark again."""
        if replica != self.my_id:
            self.isr.discard(replica)

    def groups_replicated(self, target: tuple[int, int]) -> bool:
        """Every in-sync follower has applied the group journal up to ``target``."""
        for rid in self.isr | self.pinned:
            p = self.progress.get(rid)
            if p is not None and p.group_pos < target:
                return False
        return True

    def state_replicated(self, version: int) -> bool:
        """Every in-sync follower has applied the stream state (deletion
        markers, trims, metadata) as of ``version`` (``state_version``)."""
        for rid in self.isr | self.pinned:
            p = self.progress.get(rid)
            if p is not None and p.state_version < version:
                return False
        return True

    def accepts_acks_all(self) -> bool:
        return len(self.isr) >= self.min_insync

    def replicas_at(self, offset: int) -> int:
        """Followers known to hold every offset below ``offset`` (WAIT)."""
        return sum(1 for p in self.progress.values() if p.match_offset >= offset)

    def lag(self, replica: int) -> int:
        p = self.progress.get(replica)
        return self.log.log_end_offset - (p.match_offset if p else 0)


def truncation_offset(log: Any, leader_answer: tuple[int, int]) -> int | None:
    """Where a new follower truncates, given the leader's
    ``end_offset_for_epoch(my latest epoch)`` answer ``(epoch, end)``.

    None: nothing to truncate. ``(-1, -1)``: the leader has no epoch this
    old, so nothing of this log is known to match: truncate to its start.
    """
    epoch, leader_end = leader_answer
    if log.latest_epoch < 0:
        return None
    if epoch < 0:
        return log.log_start_offset
    my_epoch, my_end = log.end_offset_for_epoch(epoch)
    if my_epoch != epoch:
        # The leader's epoch is one this log never had (KIP-279): keep what
        # ends below it, judged by this log's own largest epoch under it.
        target = min(leader_end, my_end if my_end >= 0 else log.log_start_offset)
    else:
        target = min(leader_end, my_end)
    return target if target < log.log_end_offset else None


def apply_fetched(log: Any, batches: bytes, leader_hw: int, leader_log_start: int) -> int:
    """Append a fetch response's batches and follow the leader's high
    watermark and log start; returns the new end offset."""
    if batches:
        log.append_raw(batches)
    log.hw_follows_end = False
    log.set_high_watermark(min(leader_hw, log.log_end_offset))
    start = min(leader_log_start, log.high_watermark)
    if start > log.log_start_offset:
        log.advance_log_start_offset(start)
    return log.log_end_offset
