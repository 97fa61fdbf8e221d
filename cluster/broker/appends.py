"""Deferred appends: the XADDs of one scheduler tick share one log batch per stream.

Owns: the entries sessions appended with deferral (``Session.append`` of a
deferrable plan) that are not in the log yet (broker-wide, per stream),
``commit()`` (one log batch per stream, then what an immediate append is
followed by: the write noted for the fsync policy, readers of the keys woken,
the entries-in count), commit rounds and the failures of recent rounds.

Why: a log append costs one batch header, one CRC and one ``pwritev`` (about
16 µs on this machine's ext4, more than the rest of an XADD). Redis writes
its AOF once per event-loop iteration; this does the same for the partition
logs: a front-end connection that deferred entries yields once before it
settles its receipt, so every connection made ready by the same epoll round
runs its batch first, and the first one to settle commits them all.
Pipelined and unpipelined clients both get one write per stream per tick.

The rule that keeps deferral invisible: nothing reads a deferred entry, and
no reply acknowledges one, before it is committed. Every broker operation
other than a deferred append commits first (``Session.commit_deferred``),
and ``Session.take_receipt`` commits before the front-end may send the
replies it covers. Other tasks that run meanwhile (a blocked reader woken by
its timeout, retention, the fsync flusher) work on what is in the log.

A commit that fails (disk full) drops that stream's deferred entries, as a
failed immediate append writes nothing; ``failure(round, stream)`` gives the
exception the immediate append would have raised, for every session whose
replies of that round name that stream (the front-end renders it).

Must not know: sockets, protocols, what a command parses. Uses the
``Stream`` contract (``add(defer=True)``, ``defer_encoded``, ``commit()``,
``pending_bytes``, ``log``).
"""

from __future__ import annotations

import logging
import time
from typing import Any

log = logging.getLogger("partita.appends")
FAILED_ROUNDS_KEPT = 256


class DeferredAppends:
    """One per broker (``Broker.appends``)."""

    def __init__(self, broker: Any) -> None:
        self.broker = broker
        self.streams: dict = {}  # stream -> [key, siblings, key, siblings, ...] to signal
        self.round = 1  # the round entries deferred now belong to
        self.flush_seq = 0  # the latest fsync-always sequence a commit noted
        self.failures: dict[int, tuple[BaseException, set]] = {}  # round -> (error, failed streams)

    def defer(self, stream: Any, key: bytes, siblings: Any) -> None:
        """``stream`` got a deferred entry through ``key``; ``siblings`` are the
        other keys whose readers wake (the partition and topic keys)."""
        keys = self.streams.get(stream)
        if keys is None:
            self.streams[stream] = [key, siblings]
        elif keys[-2] != key:
            keys += (key, siblings)

    def commit(self) -> None:
        """Write every deferred entry: one log batch per stream."""
        streams = self.streams
        if not streams:
            return
        self.streams = {}
        done = self.round
        self.round = done + 1
        broker = self.broker
        durability = broker.durability
        policy = broker.config.fsync
        signal = broker.keys.signal
        latency = broker.latency
        failed = None
        failure = None
        written = 0
        for stream, keys in streams.items():
            try:
                if latency is None:
                    written += stream.commit()
                else:  # the latency monitor is on: each log write is an aof-write event (Redis's name)
                    started = time.perf_counter_ns()
                    written += stream.commit()
                    latency("aof-write", (time.perf_counter_ns() - started) // 1_000_000)
            except Exception as exc:  # noqa: BLE001 - every deferred reply must learn it
                if failed is None:
                    failed, failure = set(), exc
                failed.add(stream)
                continue
            if durability is not None:
                seq = durability.note_write(stream.log, policy)
                if seq > self.flush_seq:
                    self.flush_seq = seq
            for i in range(0, len(keys), 2):
                signal(keys[i])
                for other in keys[i + 1]:
                    signal(other)
        if written:
            broker.topics.note_entries_in(written)
        if failed is not None:
            failures = self.failures
            failures[done] = (failure, failed)
            while len(failures) > FAILED_ROUNDS_KEPT:
                del failures[next(iter(failures))]

    def failure(self, round_: int, stream: Any) -> BaseException | None:
        """The exception for an entry of ``stream`` deferred in ``round_``, or None."""
        found = self.failures.get(round_)
        if found is not None and stream in found[1]:
            return found[0]
        return None
