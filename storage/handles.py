"""A bounded LRU of open file descriptors shared by many partition logs.

Owns: which files are open. A data dir with thousands of partitions and
segments holds at most ``max_open_files`` descriptors (the logs' files and
the partitions' consumer-group journals): ``get(path)`` opens on demand and
closes the least recently used descriptor when over the limit.

Callers never keep a descriptor across another ``get`` call (it may have been
closed by then), except a pinned one: ``pin(path)`` is ``get`` plus a promise
that the descriptor stays open, and keeps its number, until ``unpin(fd)``.
A flush ticket (``storage.log.FlushTicket``) pins the files it syncs, so the
sync can run on another thread through the cache's own descriptors: a flush
round needs no descriptor of its own, and a round over any number of
partitions stays within ``max_open_files``. Pinned descriptors count towards
the limit and are never closed to make room; ``close``, ``close_under`` and
``close_all`` of a pinned one take it out of the cache at once (the next
``get`` opens the file anew) and close it at its last ``unpin``. Callers keep
the pinned descriptors well below the limit (a flush ticket pins at most an
eighth of it, a flush round a quarter); were every descriptor pinned, ``get``
would open one past the limit rather than fail.

Mapped segments (``Mappings``, the cache's ``mappings``): zero-copy reads
slice a read-only mapping of a segment file, and a mapping holds address
space (and, made by ``mmap.mmap`` of the file, a ``dup`` of its descriptor)
until unmapped; the cache that
bounds a data dir's descriptors bounds its mappings too, least recently used
unmapped first.

Thread contract: main thread only (``pin``/``unpin`` included: the thread
that syncs a pinned descriptor only uses it).

Must not know: what the files hold.
"""

from __future__ import annotations

import os
import weakref
from collections import OrderedDict
from typing import Any

from storage.errors import raise_storage_error


# Mapped segments at once (least recently used unmapped first), and mappings
# unmapped while a reader still held views of them that may stay alive
# before reads copy instead of mapping: together they bound the address
# space, the file pages counted in the process's RSS and the descriptors
# mappings hold (docs/guarantees.md "Open file descriptors").
MAX_MAPPED_SEGMENTS = 8
MAX_RETIRED_MAPPINGS = 8


class Mappings:
    """The segments of one file cache that are mapped (``Segment.mapped``).

    ``owner.unmap()`` is called on the least recently used one past
    ``max_mapped``. A mapping unmapped while views of it were still held
    (the replies of a pipeline of reads over many partitions, sent
    together) is ``retire``d: it keeps its descriptor until its last view
    goes (then it leaves this set by itself), and while ``max_retired`` are
    alive no new mapping is made (``may_map``): reads ``pread`` instead.
    """

    def __init__(self, max_mapped: int = MAX_MAPPED_SEGMENTS, max_retired: int = MAX_RETIRED_MAPPINGS) -> None:
        self.max_mapped = max_mapped
        self.max_retired = max_retired
        self._mapped: OrderedDict[Any, None] = OrderedDict()
        self._retired: weakref.WeakSet = weakref.WeakSet()

    def touch(self, owner: Any) -> None:
        self._mapped.move_to_end(owner)

    def may_map(self) -> bool:
        """Whether a new mapping may be made (this owner's old mapping and
        the least recently used one may both retire)."""
        return len(self._retired) + 2 <= self.max_retired

    def add(self, owner: Any) -> None:
        self._mapped[owner] = None
        while len(self._mapped) > self.max_mapped:
            next(iter(self._mapped)).unmap()

    def remove(self, owner: Any) -> None:
        self._mapped.pop(owner, None)

    def retire(self, mapping: Any) -> None:
        self._retired.add(mapping)

    def __contains__(self, owner: Any) -> bool:
        return owner in self._mapped

    @property
    def mapped(self) -> int:
        return len(self._mapped)

    @property
    def retired(self) -> int:
        return len(self._retired)


class FileCache:
    """LRU of ``path -> fd`` (files opened read-write, directories read-only),
    and the ``mappings`` of its segment files."""

    def __init__(self, max_open_files: int = 1000) -> None:
        assert max_open_files >= 4
        self.max_open_files = max_open_files
        self.mappings = Mappings()
        self._fds: OrderedDict[str, int] = OrderedDict()
        self._pins: dict[int, int] = {}  # fd -> pins; the fd is in _fds or _dropped
        self._dropped: set[int] = set()  # pinned fds taken out of the cache: closed at their last unpin
        self.opens = 0  # how many times a file was opened (tests count these)

    def get(self, path: str, *, create: bool = False, directory: bool = False) -> int:
        """An fd for ``path`` (opened ``O_RDWR``; with ``directory``,
        ``O_RDONLY | O_DIRECTORY``), most recently used."""
        fds = self._fds
        fd = fds.get(path)
        if fd is not None:
            fds.move_to_end(path)
            return fd
        while len(fds) + len(self._dropped) >= self.max_open_files and self._close_lru():
            pass
        if directory:
            flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
        else:
            flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0)
        try:
            fd = os.open(path, flags, 0o644)
        except OSError as exc:
            raise_storage_error(f"open {path}", exc)
        self.opens += 1
        fds[path] = fd
        return fd

    def _close_lru(self) -> bool:
        """Close the least recently used descriptor not pinned; False if
        every one is pinned."""
        fds, pins = self._fds, self._pins
        if not pins:
            os.close(fds.popitem(last=False)[1])
            return True
        for path, fd in fds.items():  # pinned ones were used last: few are passed over
            if fd not in pins:
                del fds[path]
                os.close(fd)
                return True
        return False

    def pin(self, path: str, *, create: bool = False, directory: bool = False) -> int:
        """``get(path)``, kept open until ``unpin`` of the fd returned (once
        per ``pin``)."""
        fd = self.get(path, create=create, directory=directory)
        self._pins[fd] = self._pins.get(fd, 0) + 1
        return fd

    def unpin(self, fd: int) -> None:
        left = self._pins[fd] - 1
        if left:
            self._pins[fd] = left
            return
        del self._pins[fd]
        if fd in self._dropped:
            self._dropped.discard(fd)
            os.close(fd)

    @property
    def pinned(self) -> int:
        """Descriptors pinned now (tests check that flushes release theirs)."""
        return len(self._pins)

    def peek(self, path: str) -> int | None:
        return self._fds.get(path)

    def close(self, path: str) -> None:
        fd = self._fds.pop(path, None)
        if fd is not None:
            self._release(fd)

    def _release(self, fd: int) -> None:
        if fd in self._pins:
            self._dropped.add(fd)
        else:
            os.close(fd)

    def close_under(self, directory: str) -> None:
        """Close every fd of ``directory`` and of a file inside it."""
        directory = directory.rstrip("/")
        prefix = directory + "/"
        for path in [p for p in self._fds if p == directory or p.startswith(prefix)]:
            self.close(path)

    def close_all(self) -> None:
        while self._fds:
            self._release(self._fds.popitem()[1])

    def __len__(self) -> int:
        """Descriptors open (pinned ones taken out of the cache included)."""
        return len(self._fds) + len(self._dropped)
