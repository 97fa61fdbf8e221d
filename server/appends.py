"""Deferred appends: the XADDs of one scheduler tick share one log batch per stream.

Owns: the entries handlers added with ``Stream.add(..., defer=True)`` that are
not in the log yet (server-wide, per stream), ``commit()`` (one log batch per
stream, then what an immediate append would have been followed by:
``note_write`` for the fsync policy, waking readers and WATCHers of the keys,
the entries-in count), commit rounds and the failures of recent rounds.

Why: a log append costs one batch header, one CRC and one ``pwritev`` (about
16 µs on this machine's ext4, more than the rest of an XADD). Redis writes
its AOF once per event-loop iteration; this does the same for the partition
logs: a connection that deferred entries yields once (a shielded trio
checkpoint) before committing, so every connection made ready by the same
epoll round runs its batch first, and the first one to resume commits them
all. Pipelined and unpipelined clients both get one write per stream per tick.

The rule that keeps deferral invisible: nothing reads a deferred entry, and
no reply acknowledges one, before it is committed:

- ``Dispatcher.call`` commits before any command other than XADD, whoever
  sent it (read-your-writes inside a pipeline and across clients);
- XADD commits before it appends at once (options, explicit IDs, big entries);
- a connection settles (``Connection._settle``: commit, then turn the replies
  of failed entries into errors) before it sends replies or awaits anything
  other than the one yield above.

Other tasks that may run during that yield do not read entries of a stream
in a way a deferred entry could change: a blocked reader woken by its timeout
simply does not see entries nobody was told about yet; retention and the
fsync flusher work on what is in the log.

A commit that fails (disk full) drops that stream's deferred entries, as a
failed immediate append writes nothing; ``failure(round, stream)`` gives the
error reply the immediate append would have had, for every connection whose
replies of that round name that stream.

Must not know: sockets, RESP, what XADD parses. Uses the ``Stream`` contract
(``add(defer=True)``, ``commit()``, ``pending_bytes``, ``log``).
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from server.errors import CommandError

log = logging.getLogger("partita.appends")
FAILED_ROUNDS_KEPT = 256


class DeferredAppends:
    """One per server (``Dispatcher.appends``)."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self.streams: dict = {}  # stream -> [key, siblings, key, siblings, ...] to signal
        self.round = 1  # the round entries deferred now belong to
        self.flush_seq = 0  # the latest fsync-always sequence a commit noted
        self.failures: dict[int, tuple[CommandError, set]] = {}  # round -> (error, failed streams)
        self._on_error: Callable[[Exception], CommandError | None] | None = None

    def defer(self, stream: Any, key: bytes, siblings: Any, on_error: Callable) -> None:
        """``stream`` got a deferred entry through ``key``; ``siblings`` are the
        other keys whose readers wake (the partition and topic keys);
        ``on_error(exc)`` maps a commit failure to the command's error reply."""
        keys = self.streams.get(stream)
        if keys is None:
            self.streams[stream] = [key, siblings]
        elif keys[-2] != key:
            keys += (key, siblings)
        self._on_error = on_error

    def commit(self) -> None:
        """Write every deferred entry: one log batch per stream."""
        streams = self.streams
        if not streams:
            return
        self.streams = {}
        done = self.round
        self.round = done + 1
        server = self.server
        durability = server.durability
        policy = server.config.fsync
        signal = server.signal_key_modified
        failed = None
        failure = None
        written = 0
        for stream, keys in streams.items():
            try:
                written += stream.commit()
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
            server.topics.note_entries_in(written)
        if failed is not None:
            self._record_failure(done, failed, failure)

    def _record_failure(self, done: int, failed: set, failure: Exception) -> None:
        error = None
        if self._on_error is not None:
            try:
                error = self._on_error(failure)
            except Exception:  # noqa: BLE001
                error = None
        if type(error) is not CommandError:
            log.error("deferred append failed", exc_info=failure)
            self.server.stats.unexpected_error_replies += 1
            error = CommandError("ERR", f"internal error in 'xadd': {type(failure).__name__}: {failure}")
        failures = self.failures
        failures[done] = (error, failed)
        while len(failures) > FAILED_ROUNDS_KEPT:
            del failures[next(iter(failures))]

    def failure(self, round_: int, stream: Any) -> CommandError | None:
        """The error for an entry of ``stream`` deferred in ``round_``, or None."""
        found = self.failures.get(round_)
        if found is not None and stream in found[1]:
            return found[0]
        return None

    def count_failed_reply(self, error: CommandError) -> None:
        """Statistics of a reply turned into ``error`` (as a failed XADD counts)."""
        stats = self.server.stats
        stats.record_error(error.code)
        entry = stats.commands.get("xadd")
        if entry is not None:
            entry[3] += 1
