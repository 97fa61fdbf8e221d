"""The caps on a whole read reply: XREAD / XREADGROUP's MAXCOUNT and MAXSIZE (Redis 8.10).

Owns: ``ReadBudget``, what is left of them while a read serves its keys in
order (COUNT is per key; these count over the keys, and once they are
spent the keys after are not served). MAXSIZE is a soft cap in bytes
counted as each entry's stored encoding (the form it is sent in) plus
``KEY_BYTES`` and the key's length per key served; the first entry of a
reply is served whatever its size, so a read always makes progress.

Must not know: sockets, protocols, reply shapes, error texts.
"""

from __future__ import annotations

from typing import Sequence

KEY_BYTES = 16  # a served key's share of the reply beyond its name (array and bulk headers)


class ReadBudget:
    """``max_count`` entries and ``max_size`` bytes for one read (0: no cap)."""

    __slots__ = ("count_left", "bytes_left", "served", "_keys")

    def __init__(self, max_count: int = 0, max_size: int = 0) -> None:
        self.count_left = max_count if max_count > 0 else None
        self.bytes_left = max_size if max_size > 0 else None
        self.served = 0
        self._keys: set[bytes] = set()

    @property
    def sized(self) -> bool:
        """Whether entry sizes matter (MAXSIZE given)."""
        return self.bytes_left is not None

    @property
    def spent(self) -> bool:
        return (self.count_left is not None and self.count_left <= 0) or \
            (self.bytes_left is not None and self.bytes_left <= 0 and self.served > 0)

    def count_for(self, count: int) -> int:
        """A key's COUNT (0: none) within what is left: the most entries it
        may serve (0: no cap); -1 when the budget is spent."""
        if self.spent:
            return -1
        left = self.count_left
        if left is None:
            return count
        return min(count, left) if count else left

    def take(self, key: bytes, sizes: Sequence[int]) -> int:
        """How many of a key's next entries, of these ``sizes`` (in order),
        are served; charges them."""
        n = len(sizes)
        if self.count_left is not None:
            n = min(n, max(self.count_left, 0))
        if self.bytes_left is not None and n:
            room = self.bytes_left
            if key not in self._keys:
                room -= KEY_BYTES + len(key)
            fit = 0
            for size in sizes[:n]:
                if size > room and (fit or self.served):
                    break
                room -= size
                fit += 1
            n = fit
            if n:
                self.bytes_left = room
        if n:
            self._keys.add(key)
            self.served += n
            if self.count_left is not None:
                self.count_left -= n
        return n

    def charge(self, key: bytes, n: int, size_bytes: int) -> None:
        """``n`` entries of ``key`` served elsewhere within what was left
        (another node's ``ReadBudget``: ``left``), taking ``size_bytes``."""
        if n:
            self._keys.add(key)
            self.served += n
            if self.count_left is not None:
                self.count_left -= n
        if self.bytes_left is not None:
            self.bytes_left -= size_bytes

    def left(self) -> tuple[int, int, int]:
        """``(max count, max size, served)`` for a ``ReadBudget`` of what is
        left on another node (``of``); 0: no cap."""
        count = 0 if self.count_left is None else max(self.count_left, 0)
        size = 0 if self.bytes_left is None else max(self.bytes_left, 0)
        assert not self.spent  # (so a cap left is > 0, not "none")
        return count, size, self.served

    @classmethod
    def of(cls, max_count: int, max_size: int, served: int) -> "ReadBudget":
        """What ``left`` gave, here: a budget of those caps, ``served`` entries in."""
        budget = cls(max_count, max_size)
        budget.served = served
        return budget

    def took(self, key: bytes, n: int) -> None:
        """A key served ``n`` entries read within ``count_for`` (no MAXSIZE)."""
        assert self.bytes_left is None
        if n:
            self._keys.add(key)
            self.served += n
            if self.count_left is not None:
                self.count_left -= n
                assert self.count_left >= 0
