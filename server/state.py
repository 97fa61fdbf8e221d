"""Server-wide state a command handler reaches through ``ctx.server``.

Owns: ``ServerState`` (config, topic registry, connected clients, statistics,
WATCH bookkeeping and blocked-reader wake-ups), ``Client`` (one connection's
session state), ``Stats`` (INFO counters).

Must not know: sockets and RESP bytes (connection.py), how topics are stored
(cluster/, storage/).

The contract for command handlers:

- ``server.config``: ``server.config.Config`` (``.fsync``, ``.default_partitions`` ...).
- ``server.topics``: a ``cluster.topics.TopicRegistry`` (``.key_count()``,
  ``.close()``), or the small stand-in below until that exists.
- ``server.broker``: the ``cluster.broker.Broker`` every command acts
  through (a handler uses its connection's session, ``ctx.session``).
- ``server.signal_key_modified(key)``: a write changed ``key``: WATCHers of it
  fail their EXEC and blocked readers waiting on it wake (the broker's key
  events; WATCH listens to them).
- ``await server.wait_for_keys(keys, timeout_s)``: True when one of ``keys``
  was signalled, False on timeout (None = forever). Cancellation-safe.
"""

from __future__ import annotations

import os
import resource
import time
from typing import Any, Callable

import trio

from cluster.broker import Broker
from cluster.histogram import Histogram
from server.acl import AclRegistry
from server.config import Config
from server.diagnostics import Diagnostics

# Commands whose run times go to a histogram as well (``Stats.latency``,
# the HTTP front-end's ``partita_command_duration_seconds``): XADD and the reads.
LATENCY_COMMANDS = ("xadd", "xread", "xreadgroup", "xrange", "xrevrange")

REDIS_VERSION = "8.10.0"  # the Redis release whose stream semantics Partita matches (docs/streams.md)


def partita_version() -> str:
    try:
        from importlib.metadata import version

        return version("partita")
    except Exception:  # not installed (running from a checkout)
        return "0.1.0"


class Stats:
    """Counters for INFO stats / commandstats; CONFIG RESETSTAT zeroes them."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.total_connections_received = 0
        self.total_commands_processed = 0
        self.xadd_run_commands = 0  # XADDs taken by the pipelined path (Dispatcher.xadd_run)
        self.rejected_connections = 0
        self.total_net_input_bytes = 0
        self.total_net_output_bytes = 0
        self.total_error_replies = 0
        self.unexpected_error_replies = 0
        self.keyspace_hits = 0
        self.keyspace_misses = 0
        # full command name -> [calls, usec, rejected_calls, failed_calls]
        self.commands: dict[str, list[int]] = {}
        # error code -> count (INFO errorstats)
        self.errors: dict[str, int] = {}
        # LATENCY_COMMANDS -> the run times of their calls answered at once
        # (a read that waited in BLOCK is counted above, not here).
        self.latency: dict[str, Histogram] = {name: Histogram() for name in LATENCY_COMMANDS}
        self._ops_samples: list[tuple[float, int]] = []

    def record_command(self, name: str, usec: int, failed: bool, at_once: bool = True) -> None:
        """A call of ``name`` that took ``usec``, counted once (one call on
        every command's path: bench/RESULTS.md "XREAD: the per-call
        Python"); ``at_once``: it was answered without waiting, so its
        latency histogram, if it has one, sees it too (a read that waited in
        BLOCK is counted, not timed)."""
        self.total_commands_processed += 1
        entry = self.commands.get(name)
        if entry is None:
            entry = self.commands[name] = [0, 0, 0, 0]
        entry[0] += 1
        entry[1] += usec
        if failed:
            entry[3] += 1
        if at_once:
            hist = self.latency.get(name)
            if hist is not None:
                hist.observe_us(usec)

    def record_rejected(self, name: str | None) -> None:
        if name:
            entry = self.commands.get(name)
            if entry is None:
                entry = self.commands[name] = [0, 0, 0, 0]
            entry[2] += 1

    def record_error(self, code: str) -> None:
        self.total_error_replies += 1
        self.errors[code] = self.errors.get(code, 0) + 1

    def sample_ops(self, now: float) -> None:
        """Called about ten times a second for instantaneous_ops_per_sec."""
        samples = self._ops_samples
        samples.append((now, self.total_commands_processed))
        if len(samples) > 16:
            del samples[0]

    @property
    def instantaneous_ops_per_sec(self) -> int:
        samples = self._ops_samples
        if len(samples) < 2:
            return 0
        (t0, c0), (t1, c1) = samples[0], samples[-1]
        if t1 <= t0 or c1 < c0:
            return 0
        return int((c1 - c0) / (t1 - t0))


def rss_bytes() -> int:
    """The process's resident set size now (INFO memory, MEMORY STATS)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def peak_rss_bytes(rss: int | None = None) -> int:
    """The process's highest resident set size so far, never below ``rss``
    (the size now, read by default): the kernel's two counts are not taken
    at the same moment."""
    if rss is None:
        rss = rss_bytes()
    return max(rss, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


def valid_client_name(name: bytes) -> bool:
    """Redis's rule for CLIENT SETNAME / HELLO SETNAME: printable ASCII
    ('!'..'~'), no spaces."""
    return all(33 <= b <= 126 for b in name)


class Client:
    """One connection's session: identity, protocol, auth, MULTI state."""

    __slots__ = (
        "id", "name", "protocol", "db", "authenticated", "user", "in_multi",
        "multi_queue", "multi_bytes", "multi_error", "watched", "watch_dirty", "lib_name", "lib_ver",
        "addr", "laddr", "fd", "created", "last_interaction", "last_command",
        "close_after_reply", "kill_requested", "no_evict", "no_touch", "blocked", "readonly",
        "_kill", "acl", "monitor", "_on_monitor", "peer",
    )

    def __init__(self, client_id: int, addr: str = "", laddr: str = "", fd: int = -1) -> None:
        now = time.time()
        self.id = client_id
        self.name = b""
        self.protocol = 2
        self.db = 0
        self.authenticated = True
        self.user = "default"
        self.in_multi = False
        self.multi_queue: list[Any] = []
        self.multi_bytes = 0
        self.multi_error = False
        self.watched: set[bytes] = set()
        self.watch_dirty = False
        self.lib_name = b""
        self.lib_ver = b""
        self.addr = addr
        self.laddr = laddr
        self.fd = fd
        self.created = now
        self.last_interaction = now
        self.last_command = "NULL"
        self.close_after_reply = False
        self.kill_requested = False
        self.no_evict = False
        self.no_touch = False
        self.blocked = False
        # READONLY (Redis Cluster's): reads of partitions this node follows
        # are served from its copy (``Replication.route``); READWRITE, RESET: off.
        self.readonly = False
        self._kill: Callable[[], None] | None = None
        # The ACL user (server.acl.User) when it is restricted; None when it
        # may run everything (the dispatcher's whole ACL cost is this check).
        self.acl: Any = None
        # In MONITOR mode: its ``server.diagnostics.MonitorFeed``; the
        # connection's hook that serves it (set by the connection).
        self.monitor: Any = None
        self._on_monitor: Callable[[], None] | None = None
        # A cluster peer's connection on the bus (``server.bus.new_client``),
        # not a client: no idle ``timeout`` closes it, as Redis's cluster
        # bus and replication links are not clients.
        self.peer = False

    def begin_monitor(self, feed: Any) -> None:
        """MONITOR: from now on this client is sent ``feed``'s lines (its
        connection serves them: ``_on_monitor``)."""
        self.monitor = feed
        if self._on_monitor is not None:
            self._on_monitor()

    def kill(self) -> None:
        """Close this client's connection (CLIENT KILL, SHUTDOWN)."""
        self.kill_requested = True
        if self._kill is not None:
            self._kill()

    def info_line(self) -> str:
        """One CLIENT LIST / CLIENT INFO line, fields as Redis 7.0 prints them."""
        now = time.time()
        flags = "O" if self.monitor is not None else ""
        if self.in_multi:
            flags += "x"
        if self.blocked:
            flags += "b"
        if self.kill_requested or self.close_after_reply:
            flags += "A"
        if self.readonly:
            flags += "r"
        if self.no_evict:
            flags += "e"
        if self.no_touch:
            flags += "T"
        name = self.name.decode("utf-8", "replace")
        return (
            f"id={self.id} addr={self.addr} laddr={self.laddr} fd={self.fd} name={name} "
            f"age={int(now - self.created)} idle={int(now - self.last_interaction)} "
            f"flags={flags or 'N'} db={self.db} sub=0 psub=0 ssub=0 multi={len(self.multi_queue) if self.in_multi else -1} "
            f"qbuf=0 qbuf-free=0 argv-mem=0 multi-mem=0 rbs=0 rbp=0 obl=0 oll=0 omem=0 tot-mem=0 "
            f"events=r cmd={self.last_command} user={self.user} redir=-1 resp={self.protocol} "
            f"lib-name={self.lib_name.decode('utf-8', 'replace')} lib-ver={self.lib_ver.decode('utf-8', 'replace')}"
        )


class _NoTopics:
    """Stand-in used until ``cluster.topics.TopicRegistry`` exists."""

    def key_count(self) -> int:
        return 0

    def close(self) -> None:
        pass


def open_topics(config: Config):
    """``TopicRegistry.open(dir, config)``, or a stand-in when cluster has none yet."""
    from pathlib import Path

    try:
        from cluster.topics import TopicRegistry  # type: ignore[import-not-found]

        return TopicRegistry.open(Path(config.dir), config)
    except ImportError as e:  # a layer below is not written yet
        import logging

        logging.getLogger("partita").warning("topic registry unavailable (%s); serving without topics", e)
        return _NoTopics()


class ServerState:
    """Everything shared by all connections of one server process."""

    def __init__(self, config: Config, topics: Any = None, acl: AclRegistry | None = None) -> None:
        self.config = config
        self.broker = Broker(topics if topics is not None else _NoTopics(), config)
        self.broker.keys.subscribe(self._watched_key_modified)
        self.clients: dict[int, Client] = {}
        self.stats = Stats()
        # MONITOR, SLOWLOG and LATENCY (server/diagnostics.py); the latency
        # sampler it hands to the broker and the group commit (None: off).
        self.diagnostics = Diagnostics(config)
        self.diagnostics.hand_sampler(self._hand_latency)
        self.started = time.time()
        self.started_monotonic = time.monotonic()
        self.started_rss_bytes = rss_bytes()  # MEMORY STATS startup.allocated
        self.pid = os.getpid()
        self.run_id = os.urandom(20).hex()
        self.port = config.port  # the bound port (differs when config says 0)
        self.reactor: Any = None  # server.reactor.Reactor watching plain client sockets, set by app
        self.shutdown_requested = trio.Event()
        self.shutdown_flags: set[str] = set()
        self.connections: set = set()  # server.connection.Connection objects, for shutdown
        self._next_client_id = 1
        self._watchers: dict[bytes, set[Client]] = {}
        # ACL users; ``requirepass`` is the default user's password (server/acl.py).
        # The server reads them (``acl``) before it touches the data directory.
        self.acl = acl if acl is not None else AclRegistry(config.requirepass, config.aclfile)

        def on_config_change(name: str, value: Any) -> None:
            if name == "requirepass":
                self.acl.set_requirepass(value)

        config.on_change(on_config_change)

    # The broker's parts, reached from the server for INFO, CONFIG and tests.

    @property
    def topics(self) -> Any:
        return self.broker.topics

    @topics.setter
    def topics(self, topics: Any) -> None:
        self.broker.topics = topics

    @property
    def durability(self) -> Any:
        """``cluster.broker.durability.Durability`` (set by app), or None."""
        return self.broker.durability

    @durability.setter
    def durability(self, durability: Any) -> None:
        self.broker.durability = durability
        if durability is not None:
            durability.latency = self.broker.latency

    def _hand_latency(self, sampler: Any) -> None:
        """The latency monitor went on (``sampler(event, ms)``) or off (None):
        the lower layers time their events only while it is on."""
        self.broker.latency = sampler
        if self.broker.durability is not None:
            self.broker.durability.latency = sampler

    @property
    def replication(self) -> Any:
        """``cluster.runtime.replication.Replication`` in a cluster, else None."""
        return self.broker.replication

    @replication.setter
    def replication(self, replication: Any) -> None:
        self.broker.replication = replication

    @property
    def blocked_clients(self) -> int:
        return self.broker.keys.blocked_clients

    # -- clients -----------------------------------------------------------

    def new_client(self, addr: str = "", laddr: str = "", fd: int = -1) -> Client:
        client = Client(self._next_client_id, addr, laddr, fd)
        self._next_client_id += 1
        client.authenticated = self.acl.default_authenticated()
        if client.authenticated and not self.acl.default.unrestricted:
            client.acl = self.acl.default
        self.clients[client.id] = client
        self.stats.total_connections_received += 1
        return client

    def remove_client(self, client: Client) -> None:
        if client.monitor is not None:
            self.diagnostics.detach_monitor(client.monitor)
            client.monitor = None
        self.unwatch_all(client)
        self.clients.pop(client.id, None)

    # -- WATCH -------------------------------------------------------------

    def watch(self, client: Client, key: bytes) -> None:
        if key in client.watched:
            return
        client.watched.add(key)
        watchers = self._watchers.get(key)
        if watchers is None:
            watchers = self._watchers[key] = set()
        watchers.add(client)

    def unwatch_all(self, client: Client) -> None:
        for key in client.watched:
            watchers = self._watchers.get(key)
            if watchers is not None:
                watchers.discard(client)
                if not watchers:
                    del self._watchers[key]
        client.watched.clear()
        client.watch_dirty = False

    def _watched_key_modified(self, key: bytes | None) -> None:
        """The broker's key event: WATCHers of ``key`` (every key: None) fail their EXEC."""
        if key is None:
            for watchers in self._watchers.values():
                for client in watchers:
                    client.watch_dirty = True
            return
        watchers = self._watchers.get(key)
        if watchers:
            for client in watchers:
                client.watch_dirty = True

    def signal_key_modified(self, key: bytes) -> None:
        """A write changed ``key``: fail WATCHers' EXEC, wake blocked readers."""
        self.broker.keys.signal(key)

    def signal_all_keys_modified(self) -> None:
        """FLUSHALL / FLUSHDB: every WATCH fails; blocked readers re-check."""
        self.broker.keys.signal_all()

    # -- blocked readers ---------------------------------------------------

    async def wait_for_keys(self, keys: list[bytes], timeout_s: float | None, *, internal: bool = False) -> bool:
        """Wait until one of ``keys`` is signalled; False on timeout
        (``cluster.broker.keys.KeyEvents.wait_for_keys``; its
        TooManyBlockedError becomes Redis's words in server/failures.py)."""
        return await self.broker.keys.wait_for_keys(keys, timeout_s, internal=internal)

    def key_count(self) -> int:
        try:
            return int(self.topics.key_count())
        except Exception:
            return 0

    def uptime_s(self) -> int:
        return int(time.monotonic() - self.started_monotonic)
