"""What the server observes of the commands it runs: MONITOR, the slow log, the latency monitor.

Owns:

- ``SlowLog``: Redis 7's entries (id, unix time, duration in µs, the
  arguments: 32 at most, the last then ``... (N more arguments)``, each
  128 bytes at most, then ``... (N more bytes)``; the client's address and
  name), newest first, at most ``slowlog-max-len`` (redis ``slowlog.c``).
- ``LatencyMonitor``: per event, the last 160 one-second samples (the
  highest latency of each second) and the all-time highest; LATENCY
  DOCTOR's report and LATENCY GRAPH's sparkline in Redis's words and shapes
  (redis ``latency.c``, ``sparkline.c``).
- ``MonitorFeed``: a MONITOR client's lines waiting to be sent, in Redis's
  form ``+<s>.<µs> [0 <addr>] "CMD" "arg" ...`` with ``sdscatrepr``'s
  escaping (redis ``replicationFeedMonitors``).
- Redaction: arguments a command declares sensitive (``CommandSpec.redact``:
  AUTH's, HELLO AUTH's, ACL SETUSER's, CONFIG SET of a password) are shown
  as ``(redacted)`` in both, as Redis 7 shows them.
- ``Diagnostics``: the three, fed by the dispatcher through ``observe``; the
  thresholds come from the config (``slowlog-log-slower-than`` µs, -1 off;
  ``latency-monitor-threshold`` ms, 0 off); ``observe_us``, the one number
  the dispatchers compare a command's duration with (0 while a monitor is
  attached: every command is shown), is pushed to them when it changes.

Must not know: sockets, RESP, what a command does (a spec's name, flags and
``redact`` only). A MONITOR client's connection sends its feed
(``server.connection``).
"""

from __future__ import annotations

import logging
import re
import time
from collections import deque
from itertools import islice
from typing import Any, Callable

log = logging.getLogger("partita.diagnostics")

REDACTED = b"(redacted)"
SLOWLOG_ENTRY_MAX_ARGC = 32
SLOWLOG_ENTRY_MAX_STRING = 128
LATENCY_TS_LEN = 160  # samples kept per event (one per second)
NEVER_US = 1 << 62  # a duration no command reaches: nothing to observe
# Commands Redis never shows to monitors (server.c::call: CMD_SKIP_MONITOR | CMD_ADMIN).
_NOT_MONITORED = frozenset({"admin", "skip_monitor"})


def redacted(spec: Any, argv: list[bytes]) -> list[bytes]:
    """``argv`` with the arguments ``spec`` declares sensitive replaced by ``(redacted)``."""
    redact = spec.redact
    if redact is None:
        return argv
    shown = list(argv)
    for i in redact(argv):
        if 0 < i < len(shown):
            shown[i] = REDACTED
    return shown


# -- the slow log --------------------------------------------------------------

class SlowLog:
    """Entries ``(id, unix_s, duration_us, args, addr, name)``, newest first."""

    def __init__(self) -> None:
        self.entries: deque[tuple[int, int, int, list[bytes], bytes, bytes]] = deque()
        self.next_id = 0

    def push(self, argv: list[bytes], duration_us: int, addr: str, name: bytes, max_len: int,
             now_s: int | None = None) -> None:
        """Log one command (already redacted) as Redis's ``slowlogCreateEntry``."""
        argc = len(argv)
        kept = min(argc, SLOWLOG_ENTRY_MAX_ARGC)
        args = []
        for j in range(kept):
            if kept != argc and j == kept - 1:
                args.append(b"... (%d more arguments)" % (argc - kept + 1))
                break
            arg = argv[j]
            if len(arg) > SLOWLOG_ENTRY_MAX_STRING:
                arg = arg[:SLOWLOG_ENTRY_MAX_STRING] + b"... (%d more bytes)" % (len(arg) - SLOWLOG_ENTRY_MAX_STRING)
            args.append(bytes(arg))
        entry = (self.next_id, int(time.time()) if now_s is None else now_s, duration_us, args,
                 addr.encode(), bytes(name))
        self.next_id += 1
        entries = self.entries
        entries.appendleft(entry)
        while len(entries) > max_len:  # (a lowered slowlog-max-len applies at the next entry, as in Redis)
            entries.pop()

    def get(self, count: int) -> list:
        return list(islice(self.entries, max(0, count)))

    def reset(self) -> None:
        self.entries.clear()


# -- the latency monitor ---------------------------------------------------------

class LatencySeries:
    """One event's samples: a ring of ``[unix_s, latency_ms]`` (0 s: empty)."""

    __slots__ = ("samples", "idx", "max")

    def __init__(self) -> None:
        self.samples = [[0, 0] for _ in range(LATENCY_TS_LEN)]
        self.idx = 0
        self.max = 0

    def add(self, latency_ms: int, now_s: int) -> None:
        """Redis's ``latencyAddSample``: one sample per second, the highest."""
        if latency_ms > self.max:
            self.max = latency_ms
        prev = self.samples[(self.idx + LATENCY_TS_LEN - 1) % LATENCY_TS_LEN]
        if prev[0] == now_s:
            if latency_ms > prev[1]:
                prev[1] = latency_ms
            return
        self.samples[self.idx] = [now_s, latency_ms]
        self.idx = (self.idx + 1) % LATENCY_TS_LEN

    def ordered(self) -> list[list[int]]:
        """The samples, oldest first (LATENCY HISTORY)."""
        return [s for j in range(LATENCY_TS_LEN)
                for s in [self.samples[(self.idx + j) % LATENCY_TS_LEN]] if s[0]]

    def latest(self) -> list[int]:
        return self.samples[(self.idx + LATENCY_TS_LEN - 1) % LATENCY_TS_LEN]


class LatencyMonitor:
    """Events by name (``command``, ``fast-command``, ``aof-fsync-always``,
    ``aof-write``: docs/diagnostics.md has what each measures)."""

    def __init__(self, clock_s: Callable[[], float] = time.time) -> None:
        self.events: dict[str, LatencySeries] = {}
        self.clock_s = clock_s

    def add(self, event: str, latency_ms: int) -> None:
        series = self.events.get(event)
        if series is None:
            series = self.events[event] = LatencySeries()
        series.add(latency_ms, int(self.clock_s()))

    def reset(self, event: str | None = None) -> int:
        """Forget ``event`` (any case), or every event; how many were."""
        names = [name for name in self.events if event is None or name.lower() == event.lower()]
        for name in names:
            del self.events[name]
        return len(names)

    def latest(self) -> list[list]:
        """LATENCY LATEST: ``[event, unix_s, latest_ms, max_ms]`` per event."""
        return [[name, *series.latest(), series.max] for name, series in self.events.items()]

    def history(self, event: str) -> list[list[int]]:
        series = self.events.get(event)
        return [] if series is None else [list(s) for s in series.ordered()]

    def _stats(self, series: LatencySeries) -> tuple[int, int, int, int]:
        """(samples, average ms, mean deviation ms, period s) as Redis's ``analyzeLatencyForEvent``."""
        samples = series.ordered()
        if not samples:
            return 0, 0, 0, 0
        n = len(samples)
        avg = sum(s[1] for s in samples) // n
        period = int(self.clock_s()) - min(s[0] for s in samples)
        mad = sum(abs(avg - s[1]) for s in samples) // n
        return n, avg, mad, period or 1

    def doctor(self, threshold_ms: int, slowlog_us: int, fsync: str) -> str:
        """LATENCY DOCTOR's report, in Redis's words (``createLatencyReport``)
        for the events Partita has."""
        if not self.events and threshold_ms == 0:
            return ("I'm sorry, Dave, I can't do that. Latency monitoring is disabled in this Redis instance. "
                    "You may use \"CONFIG SET latency-monitor-threshold <milliseconds>.\" in order to enable it. "
                    "If we weren't in a deep space mission I'd suggest to take a look at "
                    "https://redis.io/topics/latency-monitor.\n")
        report = []
        advise: set[str] = set()
        advices = 0
        for num, (event, series) in enumerate(self.events.items(), 1):
            if num == 1:
                report.append("Dave, I have observed latency spikes in this Redis instance. "
                              "You don't mind talking about it, do you Dave?\n\n")
            n, avg, mad, period = self._stats(series)
            report.append(f"{num}. {event}: {n} latency spikes (average {avg}ms, mean deviation {mad}ms, "
                          f"period {period / n:.2f} sec). Worst all time event {series.max}ms.")
            low = event.lower()
            if low == "command":
                if slowlog_us < 0:
                    advise.add("slowlog_enabled")
                    advices += 1
                elif slowlog_us // 1000 > threshold_ms:
                    advise.add("slowlog_tuning")
                    advices += 1
                advise.update(("slowlog_inspect", "large_objects"))
                advices += 2
            elif low == "fast-command":
                advise.add("scheduler")
                advices += 1
            elif low == "aof-fsync-always":
                advise.add("relax_fsync_policy")
                advices += 1
            report.append("\n")
        if anon_huge_pages_bytes() > 0:
            advise.add("disable_thp")
            advices += 1
        if not self.events and not advices:
            report.append("Dave, no latency spike was observed during the lifetime of this Redis instance, "
                          "not in the slightest bit. I honestly think you ought to sit down calmly, take a "
                          "stress pill, and think things over.\n")
        elif not advices:
            report.append("\nWhile there are latency events logged, I'm not able to suggest any easy fix. "
                          "Please use the Redis community to get some help, providing this report in your "
                          "help request.\n")
        else:
            report.append("\nI have a few advices for you:\n\n")
            for name, text in _ADVICES:
                if name in advise and (name != "relax_fsync_policy" or fsync == "always"):
                    report.append(text.replace("%THRESHOLD_US%", str(threshold_ms * 1000)))
        return "".join(report)

    def graph(self, event: str) -> str | None:
        """LATENCY GRAPH's text (Redis's ``latencyCommandGenSparkeline``), None without samples."""
        series = self.events.get(event)
        if series is None:
            return None
        now = int(self.clock_s())
        values, labels = [], []
        for stamp, latency in series.ordered():
            values.append(latency)
            elapsed = now - stamp
            if elapsed < 60:
                labels.append(f"{elapsed}s")
            elif elapsed < 3600:
                labels.append(f"{elapsed // 60}m")
            elif elapsed < 3600 * 24:
                labels.append(f"{elapsed // 3600}h")
            else:
                labels.append(f"{elapsed // (3600 * 24)}d")
        high, low = (max(values), min(values)) if values else (0, 0)
        head = f"{event} - high {high} ms, low {low} ms (all time high {series.max} ms)\n" + "-" * 80 + "\n"
        return head + sparkline(values, labels, columns=80, rows=4)


_ADVICES = (
    ("slowlog_enabled", "- There are latency issues with potentially slow commands you are using. Try to enable "
     "the Slow Log Redis feature using the command 'CONFIG SET slowlog-log-slower-than %THRESHOLD_US%'. If the "
     "Slow log is disabled Redis is not able to log slow commands execution for you.\n"),
    ("slowlog_tuning", "- Your current Slow Log configuration only logs events that are slower than your "
     "configured latency monitor threshold. Please use 'CONFIG SET slowlog-log-slower-than %THRESHOLD_US%'.\n"),
    ("slowlog_inspect", "- Check your Slow Log to understand what are the commands you are running which are too "
     "slow to execute. Please check https://redis.io/commands/slowlog for more information.\n"),
    ("scheduler", "- The system is slow to execute Redis code paths not containing system calls. This usually "
     "means the system does not provide Redis CPU time to run for long periods. You should try to:\n"
     "  1) Lower the system load.\n"
     "  2) Use a computer / VM just for Redis if you are running other software in the same system.\n"
     "  3) Check if you have a \"noisy neighbour\" problem.\n"
     "  4) Check with 'redis-cli --intrinsic-latency 100' what is the intrinsic latency in your system.\n"
     "  5) Check if the problem is allocator-related by recompiling Redis with MALLOC=libc, if you are using "
     "Jemalloc. However this may create fragmentation problems.\n"),
    ("relax_fsync_policy", "- Your fsync policy is set to 'always'. It is very hard to get good performances with "
     "such a setup, if possible try to relax the fsync policy to 'onesec'.\n"),
    ("large_objects", "- Deleting, expiring or evicting (because of maxmemory policy) large objects is a blocking "
     "operation. If you have very large objects that are often deleted, expired, or evicted, try to fragment "
     "those objects into multiple smaller objects.\n"),
    ("disable_thp", "- I detected a non zero amount of anonymous huge pages used by your process. This creates "
     "very serious latency events in different conditions, especially when Redis is persisting on disk. To "
     "disable THP support use the command 'echo never > /sys/kernel/mm/transparent_hugepage/enabled', make sure "
     "to also add it into /etc/rc.local so that the command will be executed again after a reboot. Note that "
     "even if you have already disabled THP, you still need to restart the Redis process to get rid of the huge "
     "pages already created.\n"),
)


def anon_huge_pages_bytes() -> int:
    """The process's transparent huge pages (Redis's ``THPGetAnonHugePagesSize``)."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("AnonHugePages:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def sparkline(values: list[int], labels: list[str], columns: int, rows: int) -> str:
    """Redis's ``sparklineRender`` with ``SPARKLINE_FILL``: ``rows`` rows of
    ``_o#|`` per ``columns`` samples, then each sample's label downwards."""
    charset_fill = "_o#"
    out = []
    if not values:
        return ""
    lo, hi = min(values), max(values)
    relmax = (hi - lo) or 1
    steps = len(charset_fill) * rows
    for start in range(0, len(values), columns):
        if start:
            out.append("\n")
        part = range(start, min(start + columns, len(values)))
        row = 0
        while True:
            chars = [" "] * len(part)
            more = False
            for j, i in enumerate(part):
                step = int((values[i] - lo) * steps / relmax)
                step = min(max(step, 0), steps - 1)
                if row < rows:
                    more = True
                    charidx = step - (rows - row - 1) * len(charset_fill)
                    if 0 <= charidx < len(charset_fill):
                        chars[j] = charset_fill[charidx]
                    elif charidx >= len(charset_fill):
                        chars[j] = "|"
                else:
                    if row - rows < 1:  # the margin above the labels
                        more = True
                        break
                    label = labels[i]
                    at = row - rows - 1
                    if len(label) > at:
                        more = True
                        chars[j] = label[at]
            if not more:
                break
            row += 1
            out.append("".join(chars) + "\n")
    return "".join(out)


# -- MONITOR -------------------------------------------------------------------------

_PLAIN = re.compile(rb'[^\x20\x21\x23-\x5b\x5d-\x7e]')  # bytes sdscatrepr writes otherwise
_ESCAPES = {i: (b"\\x%02x" % i) for i in range(256)}
_ESCAPES.update({i: bytes([i]) for i in range(0x20, 0x7f)})
_ESCAPES.update({ord("\\"): b"\\\\", ord('"'): b'\\"', ord("\n"): b"\\n", ord("\r"): b"\\r",
                 ord("\t"): b"\\t", 7: b"\\a", 8: b"\\b"})


def quoted(arg: bytes) -> bytes:
    """``arg`` as Redis's ``sdscatrepr`` writes it: quoted, escaped."""
    if _PLAIN.search(arg) is None:
        return b'"' + bytes(arg) + b'"'
    return b'"' + b"".join(_ESCAPES[b] for b in arg) + b'"'


def monitor_line(argv: list[bytes], addr: str, db: int = 0, now_us: int | None = None) -> bytes:
    """One MONITOR line (a RESP simple string), as ``replicationFeedMonitors`` writes it."""
    if now_us is None:
        now_us = time.time_ns() // 1000
    sec, usec = divmod(now_us, 1_000_000)
    return b"+%d.%06d [%d %s] %s\r\n" % (sec, usec, db, addr.encode(), b" ".join(map(quoted, argv)))


class MonitorFeed:
    """A MONITOR client's output waiting to be sent: lines fed by every
    connection's commands and its own replies, in the order they were made
    (the connection inserts its replies, ``server.connection``).

    ``on_line`` (set by the connection) is called for each line: it wakes
    the connection's task; ``on_overflow`` when the bytes waiting pass the
    hard ``client-output-buffer-limit`` of normal clients (Redis counts
    monitor output there too)."""

    __slots__ = ("client", "lines", "size", "config", "on_line", "on_overflow")

    def __init__(self, client: Any, config: Any) -> None:
        self.client = client
        self.lines: list[bytes] = []
        self.size = 0
        self.config = config
        self.on_line: Callable[[], None] | None = None
        self.on_overflow: Callable[[], None] | None = None

    def push(self, line: bytes) -> None:
        """A command's line; none once the client is closing (Redis adds
        nothing to a client it will close after its reply: a monitor's own
        QUIT is not shown to it)."""
        if self.client.close_after_reply:
            return
        self.lines.append(line)
        self._added(len(line))

    def insert_reply(self, at: int, reply: bytes) -> None:
        """The monitor's own reply to one of its commands, before the lines
        fed since position ``at`` (its command's own line among them)."""
        self.lines.insert(at, reply)
        self._added(len(reply))

    def _added(self, nbytes: int) -> None:
        self.size += nbytes
        hard = self.config.client_output_buffer_limit["normal"][0]
        if hard and self.size > hard and self.on_overflow is not None:
            self.on_overflow()
        if self.on_line is not None:
            self.on_line()

    def take(self) -> bytes:
        """Everything waiting, joined; the feed is empty after."""
        data = b"".join(self.lines)
        self.lines.clear()
        self.size = 0
        return data


# -- the three together ----------------------------------------------------------------

class Diagnostics:
    """MONITOR, SLOWLOG and LATENCY of one server (``ServerState.diagnostics``)."""

    def __init__(self, config: Any, clock_s: Callable[[], float] = time.time) -> None:
        self.config = config
        self.slowlog = SlowLog()
        self.latency = LatencyMonitor(clock_s)
        self.monitors: list[MonitorFeed] = []
        self._listeners: list[Callable[[int], None]] = []
        # Lower layers' latency events (the group commit round, the log write
        # of deferred appends) reach ``sample`` through these, None while the
        # latency monitor is off (their timing costs nothing then).
        self._samplers: list[Callable[[Any], None]] = []
        self.observe_us = NEVER_US
        self._update()
        config.on_change(self._config_changed)

    # -- thresholds --------------------------------------------------------------

    def _config_changed(self, name: str, value: Any) -> None:
        if name in ("slowlog-log-slower-than", "latency-monitor-threshold"):
            self._update()

    def _update(self) -> None:
        """Recompute ``observe_us`` and tell every listener; hand the latency
        sampler to the lower layers, or None while the monitor is off."""
        config = self.config
        slower = config.slowlog_log_slower_than
        threshold_ms = config.latency_monitor_threshold
        observe = NEVER_US
        if slower >= 0:
            observe = slower
        if threshold_ms:
            observe = min(observe, threshold_ms * 1000)
        if self.monitors:
            observe = 0
        if observe != self.observe_us:
            self.observe_us = observe
            for listener in self._listeners:
                listener(observe)
        sampler = self.sample if threshold_ms else None
        for hand in self._samplers:
            hand(sampler)

    def subscribe(self, listener: Callable[[int], None]) -> None:
        """Call ``listener(observe_us)`` now and whenever it changes (a dispatcher)."""
        self._listeners.append(listener)
        listener(self.observe_us)

    def hand_sampler(self, hand: Callable[[Any], None]) -> None:
        """Call ``hand(sampler)`` now and whenever the latency monitor is
        switched on or off: ``sampler(event, latency_ms)`` records an event
        of a lower layer if it reaches the threshold; None: off."""
        self._samplers.append(hand)
        hand(self.sample if self.config.latency_monitor_threshold else None)

    # -- what the dispatcher reports ---------------------------------------------

    def observe(self, spec: Any, client: Any, argv: list[bytes], usec: int, feed: bool = True) -> None:
        """A command ran for ``usec`` µs (not counting what it waited for):
        show it to the monitors (unless ``feed`` is False: a blocking one,
        shown when it began), log it if slow, sample its latency."""
        flags = spec.flags
        shown = None
        if feed and self.monitors and not (flags & _NOT_MONITORED):
            shown = redacted(spec, argv)
            self.feed_monitors(shown, client.addr)
        config = self.config
        slower = config.slowlog_log_slower_than
        if 0 <= slower <= usec and "skip_slowlog" not in flags:
            if shown is None:
                shown = redacted(spec, argv)
            self.slowlog.push(shown, usec, client.addr, client.name, config.slowlog_max_len)
        threshold_ms = config.latency_monitor_threshold
        if threshold_ms and usec // 1000 >= threshold_ms:
            self.latency.add("fast-command" if "fast" in flags else "command", usec // 1000)

    def feed_monitors(self, argv: list[bytes], addr: str) -> None:
        line = monitor_line(argv, addr)
        for feed in self.monitors:
            feed.push(line)

    def began(self, spec: Any, client: Any, argv: list[bytes]) -> None:
        """A blocking command began: the monitors see it now (Redis shows
        it once, when it is first called)."""
        if self.monitors and not (spec.flags & _NOT_MONITORED):
            self.feed_monitors(redacted(spec, argv), client.addr)

    def sample(self, event: str, latency_ms: int) -> None:
        """A lower layer's latency event (Redis's ``latencyAddSampleIfNeeded``)."""
        threshold_ms = self.config.latency_monitor_threshold
        if threshold_ms and latency_ms >= threshold_ms:
            self.latency.add(event, latency_ms)

    # -- monitors ------------------------------------------------------------------

    def attach_monitor(self, client: Any) -> MonitorFeed:
        feed = MonitorFeed(client, self.config)
        self.monitors.append(feed)
        self._update()
        return feed

    def detach_monitor(self, feed: MonitorFeed) -> None:
        if feed in self.monitors:
            self.monitors.remove(feed)
            self._update()
