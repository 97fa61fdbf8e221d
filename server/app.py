"""Composition root: build the server from a Config, run it, stop it cleanly.

Owns: the start-up order (validate → sockets (client, TLS, cluster bus) →
data dir → topics → peers accepted; a restarted cluster node catches up on
the controller's metadata → clients accepted, "Ready to accept
connections"), the task tree (accept loops, connections, the
``everysec`` flusher, the ops/sec sampler, topic maintenance: retention and
traffic rates), and shutdown: stop accepting,
let in-flight commands finish (bounded by ``shutdown-timeout``), flush and
close the topics.

It injects the front-end into the cluster runtime: the RESP peer link
(``server/peer_resp.py``) as the way one node reaches another, and the
server state as replication's ``Host`` (key signals, durability).

Must not know: RESP, what commands do, storage file formats.
"""

from __future__ import annotations

import fcntl
import functools
import gc
import logging
import os
import resource
import time
from pathlib import Path
from typing import Any

import trio

import server.commands  # noqa: F401  (registers every command)
from server.config import Config
from server.connection import Connection, close_idle_clients
from server.dispatch import Dispatcher
from cluster.broker.durability import Durability
from server.listener import accept_loop, bind_sockets
from server.reactor import Reactor
from cluster.nodes import parse_cluster_nodes
from cluster.runtime import replication
from server import bus, registry, tls, web
from server.kafka_front import listener as kafka_listener
from server.peer_resp import RespLink
from server.acl import AclRegistry, warn_if_unprotected
from server.state import REDIS_VERSION, ServerState, open_topics, partita_version

log = logging.getLogger("partita")

OPS_SAMPLE_INTERVAL_S = 0.1
# Descriptors the process may hold beyond max-open-files (partition files,
# flush rounds included) and maxclients (docs/guarantees.md): 40 for the
# standard streams and the log file, the data directory's lock
# (DATA_DIR_LOCK_FILE), the event loop's, the listening
# sockets, the fsync thread's eventfd, up to 16 segment mappings
# (storage.segment: a mapping keeps a copy of its file's; 8 mapped, 8 more
# retired but still held by unsent replies), a checkpoint and a group
# snapshot being written, the cluster bus; and 64 copies of client sockets
# the fsync thread sends held replies on (cluster/broker/_fsync.c SEND_DUPS_MAX).
RESERVED_FDS = 104


def check_open_files_limit(config: Config) -> None:
    """Say once, at start-up, when the process's descriptor limit is below
    what this configuration may open (max-open-files + maxclients +
    RESERVED_FDS): past it writes fail with EMFILE and clients wait."""
    needed = config.max_open_files + config.maxclients + RESERVED_FDS
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        log.warning("The open files limit (RLIMIT_NOFILE) is %d, below the %d descriptors this configuration "
                    "may use (max-open-files %d + maxclients %d + %d reserved): past it, writes fail with "
                    "'Too many open files' and new clients wait. Raise it (ulimit -n %d) or lower "
                    "max-open-files or maxclients.", soft, needed, config.max_open_files, config.maxclients,
                    RESERVED_FDS, needed)


# In the data directory: the pid of the server using it, locked (flock) while it runs.
DATA_DIR_LOCK_FILE = "partita.lock"


class DataDirError(Exception):
    """The data directory can't be used; the message says which and why
    (logged as one line, no traceback: server.__main__)."""


def prepare_data_dir(config: Config) -> tuple[Path, int]:
    """Create the data directory (after the config was fully validated; its
    parent must exist) and lock it for this process, before anything in it
    is read or written: ``(path, the lock's descriptor)``. Closing the
    descriptor (or the process's end) releases the lock; a second server on
    the directory gets DataDirError naming the first one's pid."""
    path = Path(config.dir).expanduser().resolve()
    try:
        path.mkdir(exist_ok=True)  # not its parents: a mistyped path or an unmounted volume is refused
        fd = os.open(path / DATA_DIR_LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except FileExistsError:  # mkdir's answer for a file in the way
        raise DataDirError(f"can't use data directory {path} (dir): Not a directory") from None
    except FileNotFoundError:
        raise DataDirError(f"can't use data directory {path} (dir): "
                           f"its parent directory {path.parent} does not exist") from None
    except OSError as e:
        raise DataDirError(f"can't use data directory {path} (dir): {e.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        owner = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        os.close(fd)
        raise DataDirError(f"data directory {path} is in use by another Partita process (pid {owner or '?'}): "
                           f"two servers must not write one directory") from None
    except BaseException:
        os.close(fd)
        raise
    try:  # information only; in place at a fixed width: on a full disk, only a new file's block can fail
        os.pwrite(fd, f"{os.getpid():<20}\n".encode(), 0)
    except OSError as e:
        log.warning("%s: the pid not written (%s); the directory is locked all the same",
                    path / DATA_DIR_LOCK_FILE, e.strerror)
    config.dir = str(path)
    return path, fd


def _close_before_serving(sockets: list, data_lock: int | None) -> None:
    """A start that fails after binding: the sockets closed, the data directory unlocked."""
    for sock in sockets:
        sock.close()
    if data_lock is not None:
        os.close(data_lock)


async def serve(config: Config, *, task_status=trio.TASK_STATUS_IGNORED, topics: Any = None) -> None:
    """Run a server until SHUTDOWN (or the caller cancels).

    ``task_status.started`` gets the ``ServerState`` once the sockets listen
    (``state.port`` is the bound port, useful with ``port 0``).
    """
    log.info("Partita %s (Redis %s protocol) starting, pid=%d", partita_version(), REDIS_VERSION, os.getpid())
    log.info("Configuration: %s", config.path if config.path else "no config file, using defaults")
    check_open_files_limit(config)
    if inert := config.inert_settings():
        log.warning("Accepted for compatibility with Redis, changing nothing in Partita: %s", ", ".join(inert))
    # Bind first: a busy port fails the start before the data dir is touched.
    sockets = bind_sockets(config.bind, config.port)
    try:  # TLS hook (server/tls.py): the context is checked and the port bound before the data dir
        tls_sockets, tls_context = tls.bind(config)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    try:  # the cluster bus (server/bus.py), bound before the data dir too
        bus_sockets = bus.bind(config)
    except BaseException:
        for sock in sockets + tls_sockets:
            sock.close()
        raise
    try:  # the HTTP port (server/web: metrics and the console), bound before the data dir too
        http_sockets = web.bind(config)
    except BaseException:
        for sock in sockets + tls_sockets + bus_sockets:
            sock.close()
        raise
    try:  # the Kafka ports (server/kafka_front/listener.py), likewise
        kafka_sockets, kafka_tls_sockets, kafka_tls_context = kafka_listener.bind(config)
    except BaseException:
        for sock in sockets + tls_sockets + bus_sockets + http_sockets:
            sock.close()
        raise
    sockets_to_close = sockets + tls_sockets + bus_sockets + http_sockets + kafka_sockets + kafka_tls_sockets
    try:  # the users (server/acl.py): a bad or missing aclfile stops the start before the data dir too
        acl = AclRegistry(config.requirepass, config.aclfile)
    except BaseException:
        _close_before_serving(sockets_to_close, None)
        raise
    data_lock = None
    try:
        data_dir, data_lock = prepare_data_dir(config)
        log.info("Data directory: %s", data_dir)
        if config.cluster_nodes:
            log.info("Cluster node %d; peers: %s", config.node_id, ", ".join(
                f"node {n.id} at {n.address} (bus {n.bus_port})"
                for n in parse_cluster_nodes(config.cluster_nodes) if n.id != config.node_id) or "none")
        if topics is None:
            topics = open_topics(config)
    except BaseException:
        _close_before_serving(sockets_to_close, data_lock)
        raise
    state = ServerState(config, topics, acl)

    def connect(node: Any) -> RespLink:  # a peer link over the cluster bus
        return RespLink(node.host, node.bus_port, secret=config.cluster_secret)

    try:
        state.replication = replication.build(config, topics, connect)
    except ValueError:
        _close_before_serving(sockets_to_close, data_lock)
        raise
    if state.replication is not None:
        state.replication.host = state
    # A flush round's chunk pins at most a quarter of the file cache (storage.handles).
    durability = Durability(round_fds_max=max(1, config.max_open_files // 4))
    durability.policy_of = getattr(topics, "fsync_policy_of", None)  # per-topic fsync
    state.durability = durability
    dispatcher = Dispatcher(state, registry.client_table())
    kafka_front = kafka_listener.make_front(state, kafka_sockets, kafka_tls_sockets)
    bus_dispatcher = Dispatcher(state, bus.table(), observed=False)  # the cluster bus's table (not monitored)
    state.port = sockets[0].getsockname()[1]
    config.port = state.port
    connections: set = set()
    state.connections = connections

    def apply_limits(name: str, value: Any) -> None:
        # CONFIG SET of a protocol limit reaches every connected client.
        if name in ("proto-max-bulk-len", "client-query-buffer-limit"):
            for conn in connections:
                if conn.parser is not None:
                    conn.parser.max_bulk_bytes = config.proto_max_bulk_len
                    conn.parser.query_buffer_limit_bytes = config.client_query_buffer_limit

    config.on_change(apply_limits)

    def apply_topic_defaults(name: str, value: Any) -> None:
        # CONFIG SET of a segment/retention default (or of fsync, which sets
        # preallocation) reaches topics without an override.
        if name in ("segment-bytes", "segment-ms", "retention-ms", "retention-bytes", "fsync", "appendfsync"):
            refresh = getattr(state.topics, "refresh_log_configs", None)
            if refresh is not None:
                refresh()

    config.on_change(apply_topic_defaults)
    try:
        async with trio.open_nursery() as root:
            root.start_soon(durability.run_everysec)
            state.reactor = Reactor()
            root.start_soon(state.reactor.run)
            root.start_soon(_sample_ops, state)
            root.start_soon(close_idle_clients, connections, config)  # the idle `timeout`
            root.start_soon(kafka_front.groups.run)  # Kafka groups' session and rebalance timeouts
            root.start_soon(kafka_front.consumer_groups.run)  # KIP-848 members' session timeouts
            if hasattr(topics, "retention_targets"):
                root.start_soon(_maintain_topics, state)
            if state.replication is not None:
                root.start_soon(state.replication.run)
            async with trio.open_nursery() as conn_nursery:
                listen_scope = trio.CancelScope()

                async def listen_all(task_status=trio.TASK_STATUS_IGNORED) -> None:
                    with listen_scope:
                        async with trio.open_nursery() as accepts:
                            for sock in bus_sockets:  # peers first (server/bus.py)
                                accepts.start_soon(accept_loop, state, sock, conn_nursery, connections,
                                                   functools.partial(Connection, state, bus_dispatcher),
                                                   functools.partial(bus.new_client, config))
                            if state.replication is not None:  # a restarted node: the metadata first
                                await state.replication.controller.wait_caught_up()
                            for sock in sockets:
                                accepts.start_soon(accept_loop, state, sock, conn_nursery, connections,
                                                   functools.partial(Connection, state, dispatcher))
                            for sock in tls_sockets:  # TLS hook (server/tls.py)
                                accepts.start_soon(accept_loop, state, sock, conn_nursery, connections,
                                                   functools.partial(tls.TlsConnection, state, dispatcher,
                                                                     context=tls_context))
                            for sock in http_sockets:  # read-only: /metrics and the console
                                accepts.start_soon(web.serve, state, sock)
                            kafka_listener.start_accepting(accepts, state, kafka_front, kafka_sockets,
                                                           kafka_tls_sockets, kafka_tls_context, conn_nursery,
                                                           connections)
                            task_status.started()

                await conn_nursery.start(listen_all)
                addrs = ", ".join(_sock_text(s) for s in sockets)
                log.info("Listening on %s, port=%d", addrs, state.port)
                if tls_sockets:
                    log.info("Listening (TLS) on %s, tls-port=%d", ", ".join(_sock_text(s) for s in tls_sockets),
                             tls_sockets[0].getsockname()[1])
                if bus_sockets:
                    log.info("Cluster bus listening on %s (%s)", ", ".join(_sock_text(s) for s in bus_sockets),
                             "peers present cluster-secret" if config.cluster_secret else "unauthenticated")
                    bus.warn_if_unauthenticated(config, bus_sockets, log)
                if http_sockets:
                    log.info("HTTP listening on %s (metrics: /metrics, console: /), http-port=%d",
                             ", ".join(_sock_text(s) for s in http_sockets), http_sockets[0].getsockname()[1])
                kafka_listener.log_ports(state, kafka_front, kafka_sockets, kafka_tls_sockets, _sock_text)
                # Safe defaults (server/acl.py): say so when exposed without a password.
                warn_if_unprotected(state.acl, [s.getsockname()[0] for s in sockets + tls_sockets
                                                + kafka_sockets + kafka_tls_sockets], log)
                log.info("Ready to accept connections")
                # Everything allocated so far lives as long as the server:
                # keep it out of the collector's generations (cheaper GC
                # passes on the request path).
                gc.collect()
                gc.freeze()
                task_status.started(state)
                await state.shutdown_requested.wait()
                log.info("Shutdown requested: no new connections, finishing in-flight commands")
                listen_scope.cancel()
                for sock in sockets + bus_sockets + http_sockets + kafka_sockets + kafka_tls_sockets:
                    sock.close()
                for conn in list(connections):
                    conn.stop()
                conn_nursery.cancel_scope.deadline = trio.current_time() + config.shutdown_timeout
            root.cancel_scope.cancel()
    finally:
        for sock in sockets_to_close:
            sock.close()
        with trio.CancelScope(shield=True):
            await _close_topics(state)
        os.close(data_lock)  # the last: the next server may start once the topics are closed
        log.info("Partita is now ready to exit, bye bye...")


async def _close_topics(state: ServerState) -> None:
    await durability_final_flush(state)
    if state.replication is not None:
        state.replication.close()
    started = time.monotonic()
    try:
        state.topics.close()  # on the trio thread: cluster objects may use trio
    except Exception:
        log.exception("closing topics failed")
        raise
    log.info("Topics flushed and closed in %.3fs", time.monotonic() - started)


async def durability_final_flush(state: ServerState) -> None:
    try:
        await state.durability.flush_everysec_now()
    except Exception:
        log.exception("final flush failed")
    state.durability.close()


def _sock_text(sock) -> str:
    try:
        host, port = sock.getsockname()[:2]
    except OSError:
        return "?"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


TOPIC_STATS_INTERVAL_S = 1.0


async def _maintain_topics(state: ServerState) -> None:
    """Background: traffic rates every second, retention every
    ``retention-check-interval-ms`` over every partition with a limit.

    Retention is synchronous storage work on this (the storage) thread; it
    yields to the other tasks between partitions, and each pass only deletes
    whole segments (an unlink each), so command handling is never held up
    for more than one partition's deletions. Each deleted segment is logged
    by ``cluster.topics``; totals are in INFO topics.
    """
    topics = state.topics
    next_retention_s = time.monotonic()
    while True:
        topics.stats.sample(time.monotonic())
        if time.monotonic() >= next_retention_s:
            interval_s = state.config.retention_check_interval_ms / 1000
            next_retention_s = time.monotonic() + interval_s
            try:
                for topic, n in topics.retention_targets():
                    topics.retain_partition(topic, n, int(time.time() * 1000))
                    await trio.sleep(0)
            except Exception:
                log.exception("retention pass failed")
        await trio.sleep(min(TOPIC_STATS_INTERVAL_S, state.config.retention_check_interval_ms / 1000))


async def _sample_ops(state: ServerState) -> None:
    while True:
        state.stats.sample_ops(time.monotonic())
        await trio.sleep(OPS_SAMPLE_INTERVAL_S)
