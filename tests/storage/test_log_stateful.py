"""The log against a tiny in-memory model under random operation sequences."""

import os
import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from storage import segment
from storage.errors import OffsetOutOfRangeError
from storage.log import LogConfig, PartitionLog
from tests.storage.helpers import enc

CFG = LogConfig(segment_bytes=1024, index_interval_bytes=128)


class LogMachine(RuleBasedStateMachine):
    config = CFG

    @initialize()
    def setup(self):
        # Small enough that view reads remap the growing active segment and
        # evict each other's mappings within a few steps.
        self.saved = segment._REMAP_BYTES
        segment._REMAP_BYTES = 200
        self.dir = Path(tempfile.mkdtemp(prefix="logsm"))
        self.log = self._open()
        self.ids: dict[int, tuple[int, int, bytes]] = {}
        self.deleted: set[int] = set()
        self.start = 0
        self.end = 0
        self.last_id = (0, 0)

    def _open(self):
        log = PartitionLog.open(self.dir, self.config)
        log.cache.mappings.max_mapped = 2  # every log's own cache (reopened: a new one)
        return log

    def teardown(self):
        if hasattr(self, "log"):
            self.log.abandon()
            shutil.rmtree(self.dir, ignore_errors=True)
            segment._REMAP_BYTES = self.saved

    def live(self, lo, hi):
        return [o for o in range(max(lo, self.start), min(hi, self.end)) if o not in self.deleted]

    # -- writes ---------------------------------------------------------------

    @rule(n=st.integers(1, 6), gap=st.integers(0, 3), size=st.integers(0, 120))
    def append(self, n, gap, size):
        ms, seq = self.last_id
        batch = []
        for i in range(n):
            if gap == 0:
                seq += 1
            else:
                ms, seq = ms + gap, 0
            batch.append((ms, seq, enc(ms, seq, bytes([65 + i]) * size)))
        assert self.log.append(batch) == self.end
        for i, e in enumerate(batch):
            self.ids[self.end + i] = e
        self.end += n
        self.last_id = (ms, seq)

    @rule(data=st.data())
    def delete(self, data):
        offs = data.draw(st.lists(st.integers(max(0, self.start - 2), self.end + 2), max_size=5))
        new = {o for o in offs if self.start <= o < self.end} - self.deleted
        assert self.log.delete_entries(offs) == len(new)
        self.deleted |= new

    @rule(data=st.data())
    def truncate(self, data):
        off = data.draw(st.integers(0, self.end))
        self.log.truncate_to(off)
        if off >= self.end:
            return
        if off <= self.start:
            self.ids.clear()
            self.deleted.clear()
            self.start = off
            self.last_id = (0, 0)
        else:
            self.last_id = self.ids[off - 1][:2]
        self.ids = {o: e for o, e in self.ids.items() if o < off}
        self.deleted = {o for o in self.deleted if o < off}
        self.end = off

    @rule(data=st.data(), approx=st.booleans())
    def advance_start(self, data, approx):
        off = data.draw(st.integers(self.start, self.end))
        if approx:
            off = self.log.segment_base_at_or_below(off)
        self.log.advance_log_start_offset(off)
        self.start = max(self.start, off)

    @rule()
    def roll(self):
        self.log.roll()

    @rule()
    def flush(self):
        self.log.flush()
        assert self.log.recovery_point == self.end

    @rule(clean=st.booleans())
    def reopen(self, clean):
        if clean:
            self.log.close()
        else:
            self.log.abandon()
        self.log = self._open()

    # -- reads ----------------------------------------------------------------

    @rule(data=st.data(), max_count=st.none() | st.integers(0, 12),
          max_bytes=st.none() | st.integers(1, 600), view=st.booleans())
    def read(self, data, max_count, max_bytes, view):
        start = data.draw(st.integers(self.start, self.end))
        end = data.draw(st.none() | st.integers(start, self.end + 3))
        r = self.log.read(start, end, max_count=max_count, max_bytes=max_bytes, with_ids=True, view=view)
        assert self.log.cache.mappings.mapped <= 2
        want = self.live(start, self.end if end is None else end)
        if max_count is not None:
            want = want[:max_count]
        if max_bytes is not None:
            kept, total = [], 0
            for o in want:
                size = len(self.ids[o][2])
                if kept and total + size > max_bytes:
                    break
                kept.append(o)
                total += size
            want = kept
        assert [e[0] for e in r.entries] == want
        assert [(e[1], e[2]) for e in r.entries] == [self.ids[o][:2] for o in want]
        assert b"".join(r.chunks) == b"".join(self.ids[o][2] for o in want)
        assert r.count == len(want)
        if want:
            assert want[-1] < r.next_offset
            assert not self.live(want[-1] + 1, r.next_offset)

    @rule(data=st.data(), max_count=st.none() | st.integers(1, 12))
    def read_reverse(self, data, max_count):
        start = data.draw(st.integers(self.start, self.end))
        end = data.draw(st.integers(start, self.end + 2))
        r = self.log.read_reverse(start, end, max_count=max_count, with_ids=True)
        want = list(reversed(self.live(start, end)))[:max_count]
        assert [e[0] for e in r.entries] == want
        assert [bytes(c) for c in r.chunks] == [self.ids[o][2] for o in want]

    @rule(data=st.data(), inclusive=st.booleans())
    def find_offset(self, data, inclusive):
        hi = self.last_id[0] + 2
        ms = data.draw(st.integers(0, hi))
        seq = data.draw(st.integers(0, 3))
        got = self.log.find_offset(ms, seq, inclusive)
        want = self.end
        for o in range(self.start, self.end):
            i = self.ids[o][:2]
            if i >= (ms, seq) if inclusive else i > (ms, seq):
                want = o
                break
        assert got == want

    @precondition(lambda self: self.end > self.start)
    @rule(data=st.data())
    def entry(self, data):
        o = data.draw(st.integers(self.start, self.end - 1))
        assert self.log.entry_id(o) == self.ids[o][:2]
        assert self.log.entry_at(o) == (None if o in self.deleted else self.ids[o][2])

    @rule()
    def read_out_of_range(self):
        for bad in (self.start - 1, self.end + 1):
            if bad >= 0:
                try:
                    self.log.read(bad)
                except OffsetOutOfRangeError:
                    pass
                else:
                    raise AssertionError(f"read({bad}) did not raise")

    @invariant()
    def files_hold_only_batches_or_zeros_ahead(self):
        if not hasattr(self, "log"):
            return
        segs = self.log._segs
        for seg in segs[:-1]:  # sealed: trimmed to their last batch
            assert seg.file_size == seg.size == os.path.getsize(seg.log_path)
        active = segs[-1]
        assert active.file_size == os.path.getsize(active.log_path) >= active.size
        with open(active.log_path, "rb") as f:
            f.seek(active.size)
            assert f.read().count(0) == active.file_size - active.size

    @invariant()
    def offsets_match(self):
        if not hasattr(self, "log"):
            return
        log = self.log
        assert (log.log_start_offset, log.log_end_offset, log.high_watermark) == (self.start, self.end, self.end)
        assert log.live_count == len(self.live(self.start, self.end))
        if self.end > self.start or self.last_id != (0, 0):
            assert log.last_id == self.last_id


TestLogMachine = LogMachine.TestCase
TestLogMachine.settings = settings(max_examples=40, stateful_step_count=40, deadline=None,
                                   suppress_health_check=[HealthCheck.too_slow])


class PreallocatingLogMachine(LogMachine):
    """The same model with zeros kept written ahead of the active segment
    (``fsync always``'s setting, small enough to run out within a step):
    crashes (``reopen`` unclean) leave them for recovery to drop."""

    config = LogConfig(segment_bytes=1024, index_interval_bytes=128, preallocate_bytes=150)


TestPreallocatingLogMachine = PreallocatingLogMachine.TestCase
TestPreallocatingLogMachine.settings = TestLogMachine.settings
