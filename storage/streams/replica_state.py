"""The part of a partition's state that is not in its entry log.

Owns: what a replication leader sends a follower besides batches, and
applying it on the follower, so that after a leader change the new leader
answers XINFO / XPENDING / XREADGROUP as the old one did:

- the stream's metadata (``stream.meta``, with XCFGSET's IDMP settings) and
  deletion markers (XDEL), as one small blob sent whenever they changed
  (``Stream.changes`` moved); the IDMP settings reach the follower's
  producer-state table before the fetch's batches (``apply_producer_config``;
  the idempotent ids themselves come with the batches). This is
  the interim form of docs/replication.md's control records; XDELs are rare
  and the blob holds one u64 per deleted entry;
- consumer groups, fetched like a log: the follower stands at a position
  ``(generation, byte)`` of the leader's group journal and gets the records
  after it, replayed into its own store; a follower at no known position
  (first fetch, a compaction on the leader, a new leader) gets a snapshot
  first. Cost per round: the group mutations since the last one.

State blob layout (integers little-endian)::

    u32 len + stream.meta JSON
    u32 n + n × u64 deleted offsets

Must not know: sockets, trio, the cluster.
"""

from __future__ import annotations

import struct
from array import array

from storage.checkpoint import write_atomic
from storage.streams.groups import GroupStore, groups_of
from storage.streams.stream import StreamMeta

_U32 = struct.Struct("<I")


def state_version(stream) -> int:
    """Changes so far of the stream's metadata and markers (a leader resends
    the blob when this moves)."""
    return stream.changes


def encode_state(stream) -> bytes:
    meta = stream.meta.to_bytes()
    deleted = array("Q", stream.log.deleted_offsets())
    return b"".join([_U32.pack(len(meta)), meta, _U32.pack(len(deleted)), deleted.tobytes()])


def group_changes(stream, generation: int, position: int) -> tuple[int, int, bytes | None, bytes]:
    """For a follower at ``(generation, position)`` of this leader's group
    journal: ``(generation, new position, snapshot or None, records)``."""
    store = groups_of(stream)
    records = store.journal_since(generation, position)
    gen, end = store.journal_position()
    if records is None:
        return gen, end, store.snapshot_bytes() if store.groups else b"", b""
    return gen, end, None, records


def apply_group_changes(stream, snapshot: bytes | None, records: bytes) -> None:
    """Apply ``group_changes`` on the follower. Raises GroupStateError when
    the records do not apply (the caller asks for a snapshot next time)."""
    store: GroupStore = groups_of(stream)
    if snapshot is not None and (snapshot or store.groups):
        store.replace(snapshot)
    if records:
        store.apply_journal(records)


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
        stream.configure_producers()
    return complete


def apply_producer_config(stream, blob: bytes) -> None:
    """Before the batches of the fetch that brought ``encode_state``'s
    ``blob``: the leader's IDMP settings (XCFGSET) for the follower's
    producer-state table, so that the batches appended after an XCFGSET are
    windowed, and those before it forgotten, as on the leader. Nothing is
    written (``apply_state`` does, after the batches). Raises ValueError on
    a malformed blob."""
    if len(blob) < 4:
        raise ValueError("truncated replica state")
    meta_len = _U32.unpack_from(blob, 0)[0]
    meta = StreamMeta.from_bytes(bytes(blob[4:4 + meta_len]))
    stream.configure_producers(meta)
