"""Synchronous persistence of one node's Raft state in a directory.

Owns four files:

``raft.log``
    A write-ahead log of CRC32C-framed records, appended by ``save`` with
    one ``fsync`` per call::

        record := u32 body_len | u32 crc32c(body) | body      (little-endian)
        body   := u8 type | payload
        type 1, ENTRY:      u64 term | u64 index | data
        type 2, HARD_STATE: u64 term | i64 vote (-1: none) | u64 commit

    Replaying the records in order gives the state: the last HARD_STATE
    wins, and an ENTRY at index ``i`` first drops every entry at or after
    ``i`` (that is how a conflicting tail is truncated: nothing is ever
    rewritten in place). A record that is cut short or fails its CRC ends
    the log: at ``load`` it and everything after it are cut (the file as it
    was is kept as ``raft.log.damaged-<time>``, ``storage.salvage``, and the
    rest rewritten atomically), with a WARNING. Within one save
    the HARD_STATE record precedes the entries, so a surviving entry never
    has a term newer than the surviving term; a commit index past the
    surviving entries (its entries were torn) is lowered to the last one
    (the commit index is volatile state in Raft; nothing was applied from a
    save that did not finish).

    A torn write (nothing intact after the bad record) was never fsynced,
    so nothing was sent or acknowledged from it: cutting it loses nothing.
    Intact records *after* a bad one mean the disk damaged a record that
    was synced and acted on: the node may have acknowledged entries that
    the cut drops. ``lost_log_end`` then says the last ``(term, index)``
    its log may have held (the last intact ENTRY record after the damage,
    or an upper bound when damaged bytes follow it) and the Raft core
    restricts the node's votes until its log is back there
    (``Raft(lost_log_end=...)``).

``raft.vote``
    ``b"PRVT" | u8 version (1) | u64 term | i64 vote (-1: none) |
    u64 lost term | u64 lost index | u32 crc32c(the 37 bytes before)``,
    replaced atomically whenever the term or vote changes, before the log
    is appended. It keeps them when ``raft.log`` is damaged (a node that
    forgot a vote could vote twice in a term). ``load`` takes the newer of
    it and the log's; if it is missing or unreadable while records after
    the log's last intact HARD_STATE are damaged, the term and vote may be
    lost, and ``load`` refuses (``CorruptRaftStateError``). The lost
    ``(term, index)`` is ``lost_log_end`` (0, 0: none), kept here until the
    log reaches it again, so a restart before that does not forget it.

``raft.snapshot``
    ``b"PRSN" | u8 version (1) | u64 index | u64 term | u32 crc32c(data) |
    data``, replaced atomically (``storage.checkpoint.write_atomic``).
    A snapshot file that does not parse raises ``CorruptRaftStateError``
    (it was written atomically, so that is disk corruption, not a crash).

Installing a snapshot (``save`` of a Ready with a snapshot, or
``save_snapshot``) writes ``raft.snapshot`` and then rewrites ``raft.log``
atomically as the current HARD_STATE followed by the entries after the
snapshot. A crash between the two leaves the old log beside the new
snapshot; ``load`` copes: entries at or below the snapshot are dropped,
and the entries after it are kept only if the log holds the snapshot's
last entry with the snapshot's term (or starts right after it).

Thread contract: one ``RaftStore`` per directory, used by one thread at a
time (the caller may run it in a worker thread; it holds no locks).

Must not know: what the entries mean, trio, sockets, the Raft rules.
"""

from __future__ import annotations

import logging
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from crc32c import crc32c

from cluster.controller.raft import Entry, HardState, Ready, Snapshot
from cluster.nodes import ClusterConfigError
from storage import salvage
from storage.checkpoint import fsync_dir, read_file, remove_stale_tmp, write_all, write_atomic
from storage.errors import raise_storage_error

LOG_FILE = "raft.log"
SNAPSHOT_FILE = "raft.snapshot"
VOTE_FILE = "raft.vote"

logger = logging.getLogger("partita.controller")

_ENTRY = struct.Struct("<BQQ")  # type, term, index; then data
_HARD_STATE = struct.Struct("<BQqQ")  # type, term, vote, commit
_TYPE_ENTRY = 1
_TYPE_HARD_STATE = 2
_BODY_BYTES_MAX = 1 << 30
_ENTRY_RECORD_BYTES_MIN = salvage.FRAME_BYTES + _ENTRY.size
_SNAP_MAGIC = b"PRSN"
_SNAP_HEAD = struct.Struct("<4sBQQI")  # magic, version, index, term, crc32c(data)
_SNAP_VERSION = 1
_VOTE_MAGIC = b"PRVT"
_VOTE_HEAD = struct.Struct("<4sBQqQQ")  # magic, version, term, vote, lost term, lost index; then u32 crc32c
_VOTE_VERSION = 1


class CorruptRaftStateError(ClusterConfigError):
    """``raft.snapshot`` exists but does not parse, or ``raft.log`` is damaged
    where the term and vote may have been (and ``raft.vote`` cannot say).
    The server stops with this message (a configuration it cannot run)."""


_frame = salvage.frame


def _is_record(body: memoryview) -> bool:
    return (body[0] == _TYPE_ENTRY and len(body) >= _ENTRY.size) or (
        body[0] == _TYPE_HARD_STATE and len(body) == _HARD_STATE.size)


def _entry_record(e: Entry) -> bytes:
    return _frame(_ENTRY.pack(_TYPE_ENTRY, e.term, e.index) + e.data)


def _hard_state_record(hs: HardState) -> bytes:
    return _frame(_HARD_STATE.pack(_TYPE_HARD_STATE, hs.term, -1 if hs.vote is None else hs.vote, hs.commit))


def _hard_state(body: memoryview) -> HardState:
    _, term, vote, commit = _HARD_STATE.unpack_from(body, 0)
    return HardState(term, None if vote < 0 else vote, commit)


def _replay(data: bytes) -> tuple[HardState | None, list[Entry], int]:
    """The state ``data`` (raft.log's bytes) describes, and the length of its
    valid prefix (the rest is a torn or corrupt tail)."""
    hs: HardState | None = None
    log: list[Entry] = []
    pos = 0
    for item in salvage.scan(data, 0, max_length=_BODY_BYTES_MAX, plausible=_is_record, resync=False):
        if isinstance(item, salvage.Damage):
            break
        _, end, body = item
        if body[0] == _TYPE_ENTRY:
            _, term, index = _ENTRY.unpack_from(body, 0)
            if log and not log[0].index <= index <= log[-1].index + 1:
                break  # a gap or a rewind below the log's start: not written by save()
            if log:
                del log[index - log[0].index:]
            log.append(Entry(term, index, bytes(body[_ENTRY.size:])))
        else:
            hs = _hard_state(body)
        pos = end
    return hs, log, pos


@dataclass
class _Cut:
    """What lies after the valid prefix of a raft.log (``_survey``)."""

    intact: int = 0  # intact records after the cut: 0 means a torn write
    hard_state: HardState | None = None  # the last intact HARD_STATE after it
    vote_unsure: bool = False  # damaged bytes after the last intact HARD_STATE
    last_entry: tuple[int, int] | None = None  # (term, index) of the last intact ENTRY after it
    entries_unsure: int = 0  # how many more entries damaged bytes after that one may hold


def _survey(data: bytes, valid: int) -> _Cut:
    cut = _Cut()
    for item in salvage.scan(data, valid, max_length=_BODY_BYTES_MAX, plausible=_is_record):
        if isinstance(item, salvage.Damage):
            if not item.tail:  # a tail is a torn write: never synced, never acted on
                cut.vote_unsure = True
                cut.entries_unsure += max(1, item.size // _ENTRY_RECORD_BYTES_MIN)
            continue
        body = item[2]
        cut.intact += 1
        if body[0] == _TYPE_ENTRY:
            _, term, index = _ENTRY.unpack_from(body, 0)
            cut.last_entry, cut.entries_unsure = (term, index), 0
        else:
            cut.hard_state, cut.vote_unsure = _hard_state(body), False
    return cut


_Vote = tuple[int, "int | None", "tuple[int, int] | None"]  # term, vote, lost log end


def _encode_vote(vote: _Vote) -> bytes:
    term, voted_for, lost = vote
    head = _VOTE_HEAD.pack(_VOTE_MAGIC, _VOTE_VERSION, term, -1 if voted_for is None else voted_for,
                           *(lost or (0, 0)))
    return head + struct.pack("<I", crc32c(head))


def _decode_vote(data: bytes) -> _Vote | None:
    """What a ``raft.vote`` holds; None if it does not parse."""
    if len(data) != _VOTE_HEAD.size + 4:
        return None
    magic, version, term, voted_for, lost_term, lost_index = _VOTE_HEAD.unpack_from(data, 0)
    if magic != _VOTE_MAGIC or version != _VOTE_VERSION or struct.unpack_from("<I", data, _VOTE_HEAD.size)[0] \
            != crc32c(data[:_VOTE_HEAD.size]):
        return None
    return term, None if voted_for < 0 else voted_for, (lost_term, lost_index) if lost_index else None


def _encode_snapshot(s: Snapshot) -> bytes:
    return _SNAP_HEAD.pack(_SNAP_MAGIC, _SNAP_VERSION, s.index, s.term, crc32c(s.data)) + s.data


def _decode_snapshot(data: bytes) -> Snapshot:
    if len(data) < _SNAP_HEAD.size:
        raise CorruptRaftStateError("raft.snapshot: too short")
    magic, version, index, term, crc = _SNAP_HEAD.unpack_from(data, 0)
    body = data[_SNAP_HEAD.size:]
    if magic != _SNAP_MAGIC or version != _SNAP_VERSION:
        raise CorruptRaftStateError("raft.snapshot: bad magic or version")
    if crc32c(body) != crc:
        raise CorruptRaftStateError("raft.snapshot: CRC mismatch")
    return Snapshot(index, term, body)


class RaftStore:
    """A node's term, vote, commit, log and snapshot in ``directory``."""

    def __init__(self, directory: Path, *, sync: bool = True) -> None:
        """Args:
            directory: created if missing.
            sync: fsync writes (tests may turn it off for speed; a crash of
                the machine may then lose acknowledged state).
        """
        self.directory = Path(directory)
        self.sync = sync
        self._loaded = False
        self._hs = HardState(0, None, 0)
        self._vote_saved: _Vote | None = None  # what raft.vote holds
        self._snap_index = 0
        self._last_index = 0
        self._last_term = 0
        # (term, index) the log may have held before load cut damaged records
        # from it (the module docstring); None when nothing acted on was cut.
        self.lost_log_end: tuple[int, int] | None = None

    @property
    def log_path(self) -> Path:
        return self.directory / LOG_FILE

    @property
    def snapshot_path(self) -> Path:
        return self.directory / SNAPSHOT_FILE

    @property
    def vote_path(self) -> Path:
        return self.directory / VOTE_FILE

    def load(self) -> tuple[HardState | None, Snapshot | None, list[Entry]]:
        """What was persisted: ``Raft(..., hard_state=, snapshot=, entries=)``.

        Repairs the directory: a torn or damaged part of ``raft.log`` is cut
        off (the file as it was kept aside, a WARNING logged, and
        ``lost_log_end`` set if the cut may drop entries the node acted on),
        ``raft.vote`` is (re)written if missing or behind, and leftover
        ``*.tmp`` files of an interrupted atomic write are removed.

        Raises:
            CorruptRaftStateError: ``raft.snapshot`` does not parse, or the
                term and vote may be lost (the module docstring).
            StorageError: a disk error.
        """
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise_storage_error(f"create {self.directory}", exc)
        remove_stale_tmp(self.directory)
        raw_snap = read_file(self.snapshot_path)
        snapshot = _decode_snapshot(raw_snap) if raw_snap is not None else None
        raw_vote = read_file(self.vote_path)
        saved = _decode_vote(raw_vote) if raw_vote is not None else None
        voted = HardState(saved[0], saved[1], 0) if saved is not None else None
        if raw_vote is not None and saved is None:
            logger.warning("%s: unreadable, ignored (the term and vote of raft.log are used, and the file "
                           "rewritten)", self.vote_path)
        data = read_file(self.log_path) or b""
        hs, log, valid = _replay(data)
        cut = _survey(data, valid) if valid < len(data) else None
        if cut is not None and cut.vote_unsure and voted is None:
            raise CorruptRaftStateError(
                f"{self.log_path}: damaged at byte {valid}, where the latest term and vote may be, and "
                f"{self.vote_path} is {'missing' if raw_vote is None else 'unreadable'}: this node may have "
                "voted in a term it cannot name, and could vote twice in it; refusing to start. Restore "
                "the files, or remove the directory only if this node's vote is known not to matter")
        states = [x for x in (hs, cut.hard_state if cut else None, voted) if x is not None]
        if states:
            latest = max(states, key=lambda x: (x.term, x.vote is not None))
            hs = HardState(latest.term, latest.vote, max(x.commit for x in states))

        if snapshot is not None:
            at = [e for e in log if e.index == snapshot.index]
            keeps = (at[0].term == snapshot.term) if at else bool(log) and log[0].index == snapshot.index + 1
            log = [e for e in log if e.index > snapshot.index] if keeps else []
        last = log[-1].index if log else (snapshot.index if snapshot else 0)
        if hs is not None:
            floor = snapshot.index if snapshot else 0
            commit = max(min(hs.commit, last), floor)
            if log and log[-1].term > hs.term:
                # Cannot come from save() (the HARD_STATE goes first); keep Raft's
                # invariant term >= last log term rather than refuse to start.
                hs = HardState(log[-1].term, None, commit)
            elif commit != hs.commit:
                hs = HardState(hs.term, hs.vote, commit)
        self._hs = hs if hs is not None else HardState(0, None, 0)
        self._snap_index = snapshot.index if snapshot else 0
        self._last_index = last
        self._last_term = log[-1].term if log else (snapshot.term if snapshot else 0)
        self._loaded = True
        self._vote_saved = saved
        self.lost_log_end = saved[2] if saved is not None else None  # a cut by an earlier start
        if cut is not None:
            self._repair_log(data, valid, cut)
        self._save_vote()  # missing (older data), unreadable, behind the log, or caught up
        return hs, snapshot, log

    def _repair_log(self, data: bytes, valid: int, cut: _Cut) -> None:
        """Cut raft.log at ``valid`` (kept aside first) and say so."""
        kept = (self._last_term, self._last_index)
        aside = salvage.keep_aside(self.log_path)
        write_atomic(self.log_path, data[:valid] + _hard_state_record(self._hs), sync=self.sync)
        if not cut.intact:
            logger.warning("%s: torn tail: cut %d bytes at byte %d (a write cut short by a crash, never "
                           "acknowledged); the file as it was is kept as %s", self.log_path, len(data) - valid,
                           valid, aside)
            return
        end = cut.last_entry or kept
        if cut.entries_unsure:
            end = (self._hs.term, end[1] + cut.entries_unsure)
        if end > kept:
            self.lost_log_end = max(end, self.lost_log_end or end)
        logger.warning(
            "%s: damaged record at byte %d: the log is cut there (%d bytes, %d intact record(s) after the "
            "damage dropped); entries kept up to index %d, term %d and vote %s kept; the file as it was "
            "is kept as %s%s", self.log_path, valid, len(data) - valid, cut.intact, kept[1],
            self._hs.term, self._hs.vote, aside,
            "" if self.lost_log_end is None else
            f"; this node will not campaign, nor vote for a candidate whose log ends before it, until its "
            f"log holds term {self.lost_log_end[0]} index {self.lost_log_end[1]} again (it may have "
            "acknowledged entries up to there)")

    def _save_vote(self) -> None:
        """``raft.vote`` := the term, vote and lost log end, atomically, if
        any differs from what it holds (``lost_log_end`` is dropped once the
        stored log reaches it)."""
        if self.lost_log_end is not None and (self._last_term, self._last_index) >= self.lost_log_end:
            self.lost_log_end = None
        vote = (self._hs.term, self._hs.vote, self.lost_log_end)
        if self._vote_saved != vote and (self._hs.term or self.lost_log_end):
            write_atomic(self.vote_path, _encode_vote(vote), sync=self.sync)
            self._vote_saved = vote

    def save(self, ready: Ready) -> None:
        """Persist ``ready``'s hard state, snapshot and entries (before its
        messages are sent). One fsync, or with a snapshot an atomic rewrite.

        Raises:
            StorageError: a disk error; what was saved is unknown (restart).
        """
        self._ensure_loaded()
        hs = ready.hard_state if ready.hard_state is not None else self._hs
        if ready.snapshot is not None:
            self._install(ready.snapshot, hs, ready.entries)
            return
        if ready.hard_state is None and not ready.entries:
            return
        parts = []
        if ready.hard_state is not None:
            self._hs = hs
            self._save_vote()  # before the log: the vote is never older than the log's
            parts.append(_hard_state_record(ready.hard_state))
        if ready.entries:
            first = ready.entries[0].index
            assert self._snap_index < first <= self._last_index + 1, "raft store: entries leave a gap"
            parts.extend(_entry_record(e) for e in ready.entries)
        self._append_file(b"".join(parts))
        if ready.entries:
            self._last_index = ready.entries[-1].index
            self._last_term = ready.entries[-1].term
            if self.lost_log_end is not None:
                self._save_vote()

    def save_snapshot(self, snapshot: Snapshot) -> None:
        """The node's own compaction (``Raft.compact``): write the snapshot
        atomically, then rewrite the log without entries ``<= snapshot.index``.

        Raises:
            StorageError: a disk error.
        """
        self._ensure_loaded()
        if snapshot.index <= self._snap_index:
            return
        _, log, _ = _replay(read_file(self.log_path) or b"")
        assert snapshot.index <= self._last_index, "raft store: snapshot past the stored log"
        self._install(snapshot, self._hs, [e for e in log if e.index > snapshot.index])

    def _install(self, snapshot: Snapshot, hs: HardState, entries: list[Entry]) -> None:
        assert not entries or entries[0].index == snapshot.index + 1
        self._hs = hs
        self._save_vote()
        write_atomic(self.snapshot_path, _encode_snapshot(snapshot), sync=self.sync)
        body = _hard_state_record(hs) + b"".join(_entry_record(e) for e in entries)
        write_atomic(self.log_path, body, sync=self.sync)
        self._snap_index = snapshot.index
        self._last_index = entries[-1].index if entries else snapshot.index
        self._last_term = entries[-1].term if entries else snapshot.term
        if self.lost_log_end is not None:
            self._save_vote()

    def _ensure_loaded(self) -> None:
        if not self._loaded:
            self.load()

    def _append_file(self, data: bytes) -> None:
        path = self.log_path
        try:
            existed = path.exists()
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                write_all(fd, data, sync=self.sync)
            finally:
                os.close(fd)
        except OSError as exc:
            raise_storage_error(f"append to {path}", exc)
        if self.sync and not existed:
            fsync_dir(self.directory)
