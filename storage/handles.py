"""A bounded LRU of open file descriptors shared by many partition logs.

Owns: which files are open. A data dir with thousands of partitions and
segments holds at most ``max_open_files`` descriptors: ``get(path)`` opens on
demand and closes the least recently used descriptor when over the limit.

Callers never keep a descriptor across another ``get`` call (it may have been
closed by then), and never hand one to another thread: ``FlushTicket`` takes
``os.dup`` copies instead.

Thread contract: main thread only.

Must not know: what the files hold.
"""

from __future__ import annotations

import os
from collections import OrderedDict

from storage.errors import raise_storage_error


class FileCache:
    """LRU of ``path -> fd`` (files opened read-write)."""

    def __init__(self, max_open_files: int = 1000) -> None:
        assert max_open_files >= 4
        self.max_open_files = max_open_files
        self._fds: OrderedDict[str, int] = OrderedDict()
        self.opens = 0  # how many times a file was opened (tests count these)

    def get(self, path: str, *, create: bool = False) -> int:
        """An fd for ``path`` (opened ``O_RDWR``), most recently used."""
        fds = self._fds
        fd = fds.get(path)
        if fd is not None:
            fds.move_to_end(path)
            return fd
        while len(fds) >= self.max_open_files:
            _, old = fds.popitem(last=False)
            os.close(old)
        flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0)
        try:
            fd = os.open(path, flags, 0o644)
        except OSError as exc:
            raise_storage_error(f"open {path}", exc)
        self.opens += 1
        fds[path] = fd
        return fd

    def peek(self, path: str) -> int | None:
        return self._fds.get(path)

    def close(self, path: str) -> None:
        fd = self._fds.pop(path, None)
        if fd is not None:
            os.close(fd)

    def close_under(self, directory: str) -> None:
        """Close every fd of a file inside ``directory``."""
        prefix = directory.rstrip("/") + "/"
        for path in [p for p in self._fds if p.startswith(prefix)]:
            self.close(path)

    def close_all(self) -> None:
        while self._fds:
            _, fd = self._fds.popitem()
            os.close(fd)

    def __len__(self) -> int:
        return len(self._fds)
