"""The producer partitioner: which partition ``XADD <topic> ...`` writes to.

Owns: the choice of a partition for one entry of a multi-partition topic:

- when the topic's ``partition-key-field`` is set and the entry has that
  field, the partition is ``murmur2(value) & 0x7fffffff % partitions``:
  exactly Kafka's default partitioner for a keyed record
  (``Utils.toPositive(Utils.murmur2(keyBytes)) % numPartitions``), so the
  same key lands on the same partition in Partita and in Kafka, and stays
  there for as long as the partition count does not change;
- otherwise, for an idempotent producer's entry (XADD IDMP / IDMPAUTO),
  the same hash of its producer-id, so that a retry reaches the partition
  that recorded the first attempt;
- otherwise round-robin over the partitions, one counter per topic (soft
  state: it restarts at 0 with the server). The counter moves on per entry
  for XADDs taken one by one (``choose``) and per run for a pipelined run
  of keyless XADDs, which all go to one partition (``peek`` then
  ``advance``): Kafka's sticky partitioner for keyless records (KIP-480),
  so a pipeline becomes one log batch instead of one batch per partition.

Must not know: streams, files, sockets, RESP. Pure functions and a counter.
"""

from __future__ import annotations

from typing import Sequence

_M = 0x5BD1E995
_SEED = 0x9747B28C
_MASK32 = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2``: a signed 32-bit MurmurHash2 of ``data``."""
    length = len(data)
    h = (_SEED ^ length) & _MASK32
    length4 = length & ~3
    for i in range(0, length4, 4):
        k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24)
        k = (k * _M) & _MASK32
        k ^= k >> 24
        k = (k * _M) & _MASK32
        h = (h * _M) & _MASK32
        h ^= k
    rest = length & 3
    if rest == 3:
        h ^= data[length4 + 2] << 16
    if rest >= 2:
        h ^= data[length4 + 1] << 8
    if rest >= 1:
        h ^= data[length4]
        h = (h * _M) & _MASK32
    h ^= h >> 13
    h = (h * _M) & _MASK32
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for_key(key: bytes, partitions: int) -> int:
    """Kafka's keyed choice: ``toPositive(murmur2(key)) % partitions``."""
    assert partitions > 0
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def field_value(fields: Sequence[bytes], name: bytes) -> bytes | None:
    """The value of the first field called ``name`` in ``[f1, v1, f2, v2 ...]``."""
    for i in range(0, len(fields) - 1, 2):
        if fields[i] == name:
            return bytes(fields[i + 1])
    return None


class Partitioner:
    """Chooses partitions for the topics of one server (round-robin counters)."""

    def __init__(self) -> None:
        self._next: dict[bytes, int] = {}

    def choose(self, topic: bytes, partitions: int, fields: Sequence[bytes],
               key_field: bytes | None, sticky: bytes | None = None) -> int:
        """The partition for an entry with ``fields`` of ``topic``. An entry
        without a key field value goes by ``sticky``'s hash when given (an
        idempotent producer's id: its retries must reach the partition that
        recorded them), else round-robin."""
        assert partitions > 0
        if key_field:
            value = field_value(fields, key_field)
            if value is not None:
                return partition_for_key(value, partitions)
        if sticky is not None:
            return partition_for_key(sticky, partitions)
        n = self.peek(topic, partitions)
        self.advance(topic)
        return n

    def peek(self, topic: bytes, partitions: int) -> int:
        """The partition the next keyless entry (or run) of ``topic`` goes to."""
        assert partitions > 0
        return self._next.get(topic, 0) % partitions

    def advance(self, topic: bytes) -> None:
        """Move ``topic``'s round-robin counter on by one (after ``peek``)."""
        self._next[topic] = self._next.get(topic, 0) + 1

    def forget(self, topic: bytes) -> None:
        self._next.pop(topic, None)
