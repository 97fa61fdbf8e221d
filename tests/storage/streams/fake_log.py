"""An in-memory stand-in for ``storage.log.PartitionLog`` (the documented contract).

Used only to test the stream layer while, or where, a real log is not wanted.
Segments are modelled by ``segment_entries`` entries each.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from pathlib import Path

from storage.producers import ProducerState


@dataclass
class FakeReadResult:
    count: int
    chunks: list
    next_offset: int
    entries: list | None = None


@dataclass
class FakeSegmentInfo:
    base_offset: int


@dataclass
class FakeLog:
    dir: Path = Path(".")
    segment_entries: int = 1000
    ids: list = field(default_factory=list)       # (ms, seq) per offset
    data: list = field(default_factory=list)      # encoded per offset
    deleted: set = field(default_factory=set)
    log_start_offset: int = 0

    @property
    def log_end_offset(self) -> int:
        return len(self.ids)

    @property
    def high_watermark(self) -> int:
        return self.log_end_offset

    @property
    def last_id(self):
        return self.ids[-1] if self.ids else (0, 0)  # kept when trimmed, as PartitionLog does

    @property
    def live_count(self) -> int:
        return sum(1 for o in range(self.log_start_offset, self.log_end_offset) if o not in self.deleted)

    def __post_init__(self) -> None:
        # The contract's producer-state table, kept in memory: the fake keeps
        # no snapshots, and replays what it was given.
        self.producer_batches: list = []
        self.producers = ProducerState(self.dir, lambda: 0, lambda: self.log_end_offset,
                                       lambda start: iter([b for b in self.producer_batches if b[0] >= start]))

    def append(self, entries, leader_epoch=0, producers=()):
        base = self.log_end_offset
        for ms, seq, enc in entries:
            assert (ms, seq) > (self.ids[-1] if self.ids else (0, 0))
            self.ids.append((ms, seq))
            self.data.append(enc)
        if producers:
            first_ids = [entries[r.index][:2] for r in producers]
            self.producer_batches.append((base, 0, list(producers), first_ids))
            self.producers.ensure_loaded()
            self.producers.applied(base, 0, producers, first_ids)
        return base

    def delete_entries(self, offsets):
        n = 0
        for o in offsets:
            if self.log_start_offset <= o < self.log_end_offset and o not in self.deleted:
                self.deleted.add(o)
                n += 1
        return n

    def deleted_offsets(self):
        return sorted(o for o in self.deleted if o >= self.log_start_offset)

    def advance_log_start_offset(self, offset):
        self.log_start_offset = max(self.log_start_offset, min(offset, self.log_end_offset))

    def segment_base_at_or_below(self, offset):
        return offset - offset % self.segment_entries

    def segments(self):
        first = self.segment_base_at_or_below(self.log_start_offset)
        return [FakeSegmentInfo(b) for b in range(first, max(self.log_end_offset, 1), self.segment_entries)]

    @property
    def segment_count(self):
        return len(self.segments())

    @property
    def size_bytes(self):
        return sum(len(d) for d in self.data[self.log_start_offset:])

    def _live(self, offsets):
        return [o for o in offsets if o not in self.deleted]

    def read(self, start_offset, end_offset=None, max_count=None, max_bytes=None, with_ids=False, view=False,
             past_hw=False):
        # (no high watermark here: every read reaches the log's end, ``past_hw`` or not)
        end = self.log_end_offset if end_offset is None else min(end_offset, self.log_end_offset)
        start = max(start_offset, self.log_start_offset)
        offs = self._live(range(start, end))
        if max_count is not None:
            offs = offs[:max_count]
        nxt = offs[-1] + 1 if offs else end
        return FakeReadResult(len(offs), [self.data[o] for o in offs], nxt,
                              [(o, *self.ids[o]) for o in offs] if with_ids else None)

    def read_reverse(self, start_offset, end_offset, max_count=None, with_ids=False):
        start = max(start_offset, self.log_start_offset)
        offs = self._live(range(min(end_offset, self.log_end_offset) - 1, start - 1, -1))
        if max_count is not None:
            offs = offs[:max_count]
        return FakeReadResult(len(offs), [self.data[o] for o in offs], start,
                              [(o, *self.ids[o]) for o in offs] if with_ids else None)

    def read_after_id(self, ms, seq, max_count=None, view=False):
        return self.read(self.find_offset(ms, seq, inclusive=False), max_count=max_count, view=view)

    def find_offset(self, ms, seq, inclusive=True):
        i = (bisect.bisect_left if inclusive else bisect.bisect_right)(self.ids, (ms, seq))
        return max(i, self.log_start_offset)

    def entry_id(self, offset):
        return self.ids[offset]

    def entry_at(self, offset):
        if offset < self.log_start_offset or offset >= self.log_end_offset or offset in self.deleted:
            return None
        return self.data[offset]
