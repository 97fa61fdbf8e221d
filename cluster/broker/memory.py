"""MEMORY USAGE of a key: what its partitions keep in memory.

Owns, as ``Session`` methods (``MemoryOps`` is one of its bases):
``memory_usage(key, samples)`` and ``deferred_bytes()``.

What is counted: Partita keeps a stream's entries on disk, so a key's
memory is the objects its open partitions hold: the ``Stream`` and its
partition log, the segments and their in-memory indexes (the active
segment's index arrays, sealed segments' indexes read back while cached),
the deletion markers, the idempotent producers' table, the group store with
its groups, consumers and pending entries, and entries deferred to the next
log write; plus the key itself. The walk sums ``sys.getsizeof`` of every
object reachable from those, once each, entering only storage's own objects
(types of ``storage.*`` modules) and the built-in containers they hold. It
does not count what every partition shares (``storage.handles``: the file
cache and the segment mappings), nor anything else they reach (loggers,
paths, callbacks, locks, the topic registry), nor the mapped segment files
(the kernel's page cache) or the entries on disk. A partition not opened
since start costs nothing and is not opened to be measured. In a container
of more than ``samples`` elements (0: all) only the first ``samples`` are
walked and the rest are counted at their average, as Redis samples a
stream's nodes for ``MEMORY USAGE ... SAMPLES``.

Must not know: sockets, protocols, reply shapes.
"""

from __future__ import annotations

import sys
from array import array
from collections import deque
from typing import Any, Iterable

from cluster.topics import TopicError

# Objects whose ``sys.getsizeof`` is their whole cost (an array's items
# included: the deletion markers are arrays of 8-byte offsets).
_LEAVES = (str, bytes, bytearray, array, memoryview, int, float, complex, type(None))
_SEQUENCES = (list, tuple, set, frozenset, deque)
_SHARED_MODULES = ("storage.handles",)


class MemoryOps:
    """MEMORY USAGE and MEMORY STATS' figures of the broker's own."""

    __slots__ = ()  # (Session's attributes are its slots: a base without them would give it a dict)
    broker: Any

    def memory_usage(self, key: bytes, samples: int = 5) -> int | None:
        """Bytes ``key`` holds in memory (the module docstring); None when
        the key does not exist."""
        self.commit_deferred()
        try:
            streams = self.broker.topics.open_streams_of(key)
        except TopicError:  # a partition the topic does not have: no such key
            return None
        if streams is None:
            return None
        return sys.getsizeof(key) + deep_size(streams, samples)

    def deferred_bytes(self) -> int:
        """Field and value bytes of the entries deferred to the next log write."""
        return sum(stream.pending_bytes for stream in self.broker.appends.streams)


def deep_size(roots: Iterable[Any], samples: int = 0) -> int:
    """``sys.getsizeof`` summed over the objects reachable from ``roots``
    that belong to them (the module docstring), sampling containers of more
    than ``samples`` elements (0: walk all)."""
    seen: set[int] = set()

    def sampled(items: Iterable[Any], n: int, size_of: Any) -> int:
        if not samples or n <= samples:
            return sum(map(size_of, items))
        walked = 0
        for i, item in enumerate(items):
            if i == samples:
                break
            walked += size_of(item)
        return walked * n // samples

    def pair_size(pair: tuple[Any, Any]) -> int:
        return size(pair[0]) + size(pair[1])

    def size(obj: Any, whole: bool = False) -> int:
        """``whole``: an object's attribute dict, never sampled."""
        oid = id(obj)
        if oid in seen:
            return 0
        seen.add(oid)
        if isinstance(obj, _LEAVES):
            return sys.getsizeof(obj)
        if isinstance(obj, dict):
            if whole:
                return sys.getsizeof(obj) + sum(map(pair_size, obj.items()))
            return sys.getsizeof(obj) + sampled(obj.items(), len(obj), pair_size)
        if isinstance(obj, _SEQUENCES):
            return sys.getsizeof(obj) + sampled(obj, len(obj), size)
        cls = type(obj)
        module = cls.__module__
        if not module.startswith("storage.") or module.startswith(_SHARED_MODULES):
            return 0  # not the key's own (shared, or outside storage)
        total = sys.getsizeof(obj)
        attrs = getattr(obj, "__dict__", None)
        if attrs is not None:
            total += size(attrs, whole=True)
        for klass in cls.__mro__:
            slots = klass.__dict__.get("__slots__", ())
            for slot in (slots,) if isinstance(slots, str) else slots:
                if slot not in ("__dict__", "__weakref__"):
                    value = getattr(obj, slot, None)
                    if value is not None:
                        total += size(value)
        return total

    return sum(size(root) for root in roots)
