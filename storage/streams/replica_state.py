"""The part of a partition's state that is not in its entry log, as one blob.

Owns: what a replication leader sends a follower besides batches — the
stream metadata (``stream.meta``), the deletion markers (XDEL) and every
consumer group of the partition (a ``GroupStore`` snapshot) — and applying
such a blob on the follower so that, after a leader change, the new leader
answers XINFO / XPENDING / XREADGROUP as the old one did.

This is the interim form of docs/replication.md's "control records": the
whole state travels whenever it changed (the leader compares a version
token), instead of as records in the log. It is correct, and its cost grows
with the size of the group state; the per-mutation log replaces it.

Blob layout (all integers little-endian)::

    u32 len + stream.meta JSON
    u32 n + n × u64 deleted offsets
    u32 len + group snapshot bytes (len 0: no groups)

Must not know: sockets, trio, the cluster.
"""

from __future__ import annotations

import struct
from array import array

from storage.checkpoint import write_atomic
from storage.streams.groups import GroupStore, groups_of
from storage.streams.stream import StreamMeta

_U32 = struct.Struct("<I")


def state_version(stream) -> tuple[int, int]:
    """Changes so far of the stream's metadata and of its groups (a leader
    resends the state when this moves)."""
    store = stream.__dict__.get("group_store")
    return stream.changes, store.changes if store is not None else 0


def encode_state(stream) -> bytes:
    meta = stream.meta.to_bytes()
    deleted = array("Q", stream.log.deleted_offsets())
    store = groups_of(stream)
    snap = store.snapshot_bytes() if store.groups else b""
    return b"".join([_U32.pack(len(meta)), meta, _U32.pack(len(deleted)), deleted.tobytes(),
                     _U32.pack(len(snap)), snap])


def apply_state(stream, blob: bytes) -> bool:
    """Make the follower's stream match the leader's ``encode_state``.

    Returns False when some deleted offset is past this replica's end (the
    entries are not fetched yet): the markers it has are applied and the
    caller asks again later. Raises ValueError on a malformed blob.
    """
    view = memoryview(blob)
    pos = 0

    def take(n: int) -> memoryview:
        nonlocal pos
        if pos + n > len(view):
            raise ValueError("truncated replica state")
        out = view[pos:pos + n]
        pos += n
        return out

    meta_len = _U32.unpack(take(4))[0]
    meta = StreamMeta.from_bytes(bytes(take(meta_len)))
    count = _U32.unpack(take(4))[0]
    deleted = array("Q")
    deleted.frombytes(bytes(take(8 * count)))
    snap_len = _U32.unpack(take(4))[0]
    snap = bytes(take(snap_len))
    if pos != len(view):
        raise ValueError("trailing bytes after replica state")
    log = stream.log
    end = log.log_end_offset
    complete = all(o < end for o in deleted)
    log.delete_entries(o for o in deleted if o < end)
    if meta != stream.meta:
        stream.meta = meta
        write_atomic(stream.meta_path, meta.to_bytes())
        stream._stored_meta = StreamMeta(**vars(meta))
    store: GroupStore = groups_of(stream)
    if snap or store.groups:
        store.replace(snap)
    return complete
