"""Synchronous persistence of one node's Raft state in a directory.

Owns three files:

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
    the file: it and everything after it are discarded and the file is
    truncated there at ``load`` (a torn write at a crash). Within one save
    the HARD_STATE record precedes the entries, so a surviving entry never
    has a term newer than the surviving term; a commit index past the
    surviving entries (its entries were torn) is lowered to the last one
    (the commit index is volatile state in Raft; nothing was applied from a
    save that did not finish).

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

import os
import struct
from pathlib import Path

from crc32c import crc32c

from cluster.controller.raft import Entry, HardState, Ready, Snapshot
from storage.checkpoint import fsync_dir, read_file, remove_stale_tmp, write_all, write_atomic
from storage.errors import raise_storage_error

LOG_FILE = "raft.log"
SNAPSHOT_FILE = "raft.snapshot"

_FRAME = struct.Struct("<II")  # body length, crc32c(body)
_ENTRY = struct.Struct("<BQQ")  # type, term, index; then data
_HARD_STATE = struct.Struct("<BQqQ")  # type, term, vote, commit
_TYPE_ENTRY = 1
_TYPE_HARD_STATE = 2
_SNAP_MAGIC = b"PRSN"
_SNAP_HEAD = struct.Struct("<4sBQQI")  # magic, version, index, term, crc32c(data)
_SNAP_VERSION = 1


class CorruptRaftStateError(ValueError):
    """``raft.snapshot`` exists but does not parse."""


def _frame(body: bytes) -> bytes:
    return _FRAME.pack(len(body), crc32c(body)) + body


def _entry_record(e: Entry) -> bytes:
    return _frame(_ENTRY.pack(_TYPE_ENTRY, e.term, e.index) + e.data)


def _hard_state_record(hs: HardState) -> bytes:
    return _frame(_HARD_STATE.pack(_TYPE_HARD_STATE, hs.term, -1 if hs.vote is None else hs.vote, hs.commit))


def _replay(data: bytes) -> tuple[HardState | None, list[Entry], int]:
    """The state ``data`` (raft.log's bytes) describes, and the length of its
    valid prefix (the rest is a torn or corrupt tail)."""
    hs: HardState | None = None
    log: list[Entry] = []
    pos = 0
    view = memoryview(data)
    while pos + _FRAME.size <= len(view):
        n, crc = _FRAME.unpack_from(view, pos)
        body = view[pos + _FRAME.size:pos + _FRAME.size + n]
        if len(body) != n or n == 0 or crc32c(body) != crc:
            break
        kind = body[0]
        if kind == _TYPE_ENTRY and n >= _ENTRY.size:
            _, term, index = _ENTRY.unpack_from(body, 0)
            if log and not log[0].index <= index <= log[-1].index + 1:
                break  # a gap or a rewind below the log's start: not written by save()
            if log:
                del log[index - log[0].index:]
            log.append(Entry(term, index, bytes(body[_ENTRY.size:])))
        elif kind == _TYPE_HARD_STATE and n == _HARD_STATE.size:
            _, term, vote, commit = _HARD_STATE.unpack_from(body, 0)
            hs = HardState(term, None if vote < 0 else vote, commit)
        else:
            break
        pos += _FRAME.size + n
    return hs, log, pos


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
        self._snap_index = 0
        self._last_index = 0

    @property
    def log_path(self) -> Path:
        return self.directory / LOG_FILE

    @property
    def snapshot_path(self) -> Path:
        return self.directory / SNAPSHOT_FILE

    def load(self) -> tuple[HardState | None, Snapshot | None, list[Entry]]:
        """What was persisted: ``Raft(..., hard_state=, snapshot=, entries=)``.

        Repairs the directory: a torn tail of ``raft.log`` is cut off, and
        leftover ``*.tmp`` files of an interrupted atomic write are removed.

        Raises:
            CorruptRaftStateError: ``raft.snapshot`` does not parse.
            StorageError: a disk error.
        """
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise_storage_error(f"create {self.directory}", exc)
        remove_stale_tmp(self.directory)
        raw_snap = read_file(self.snapshot_path)
        snapshot = _decode_snapshot(raw_snap) if raw_snap is not None else None
        data = read_file(self.log_path) or b""
        hs, log, valid = _replay(data)
        if valid < len(data):
            self._truncate_file(valid)

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
        self._loaded = True
        return hs, snapshot, log

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
            parts.append(_hard_state_record(ready.hard_state))
        if ready.entries:
            first = ready.entries[0].index
            assert self._snap_index < first <= self._last_index + 1, "raft store: entries leave a gap"
            parts.extend(_entry_record(e) for e in ready.entries)
        self._append_file(b"".join(parts))
        self._hs = hs
        if ready.entries:
            self._last_index = ready.entries[-1].index

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
        write_atomic(self.snapshot_path, _encode_snapshot(snapshot), sync=self.sync)
        body = _hard_state_record(hs) + b"".join(_entry_record(e) for e in entries)
        write_atomic(self.log_path, body, sync=self.sync)
        self._hs = hs
        self._snap_index = snapshot.index
        self._last_index = entries[-1].index if entries else snapshot.index

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

    def _truncate_file(self, length: int) -> None:
        path = self.log_path
        try:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.ftruncate(fd, length)
                if self.sync:
                    os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise_storage_error(f"truncate {path}", exc)
