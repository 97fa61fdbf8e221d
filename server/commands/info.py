"""INFO [section [section ...]].

Owns: the INFO text: Redis's sections and field names (server, clients,
memory, persistence, stats, replication, cpu, commandstats, errorstats,
keyspace) plus ``topics`` (topics, partitions, bytes, entries in/out,
retention) and ``partita`` sections. ``redis_version`` names the Redis
version whose behaviour Partita matches; ``partita_version`` is Partita's own.

Must not know: sockets, storage files (keyspace counts come from
``server.topics.key_count()``).
"""

from __future__ import annotations

import os
import platform
import resource
import sys
import time

from server.registry import command
from server.reply import Verbatim
from server.state import REDIS_VERSION, partita_version, peak_rss_bytes, rss_bytes

DEFAULT_SECTIONS = ("server", "clients", "memory", "persistence", "stats", "replication", "cpu",
                    "errorstats", "keyspace", "topics", "partita")
ALL_SECTIONS = DEFAULT_SECTIONS[:-4] + ("commandstats", "errorstats", "keyspace", "topics", "partita")


def _human(n: int) -> str:
    for unit, factor in (("G", 1024**3), ("M", 1024**2), ("K", 1024)):
        if n >= factor:
            return f"{n / factor:.2f}{unit}"
    return f"{n}B"


def section_server(server) -> list[str]:
    now = time.time()
    uptime = server.uptime_s()
    config = server.config
    return [
        f"redis_version:{REDIS_VERSION}",
        f"partita_version:{partita_version()}",
        "redis_git_sha1:00000000",
        "redis_git_dirty:0",
        "redis_mode:standalone",
        f"os:{platform.system()} {platform.release()} {platform.machine()}",
        f"arch_bits:{64 if sys.maxsize > 2**32 else 32}",
        "multiplexing_api:epoll",
        f"python_version:{platform.python_version()}",
        f"process_id:{server.pid}",
        "process_supervised:no",
        f"run_id:{server.run_id}",
        f"tcp_port:{server.port}",
        f"server_time_usec:{int(now * 1_000_000)}",
        f"uptime_in_seconds:{uptime}",
        f"uptime_in_days:{uptime // 86400}",
        "hz:10",
        "configured_hz:10",
        f"executable:{os.path.abspath(sys.argv[0]) if sys.argv else ''}",
        f"config_file:{config.path.resolve() if config.path else ''}",
        "io_threads_active:0",
    ]


def section_clients(server) -> list[str]:
    return [
        f"connected_clients:{len(server.clients)}",
        "cluster_connections:0",
        f"maxclients:{server.config.maxclients}",
        "client_recent_max_input_buffer:0",
        "client_recent_max_output_buffer:0",
        f"blocked_clients:{server.blocked_clients}",
        "tracking_clients:0",
        "clients_in_timeout_table:0",
    ]


def section_memory(server) -> list[str]:
    rss = rss_bytes()
    peak = peak_rss_bytes(rss)
    return [
        f"used_memory:{rss}",
        f"used_memory_human:{_human(rss)}",
        f"used_memory_rss:{rss}",
        f"used_memory_rss_human:{_human(rss)}",
        f"used_memory_peak:{peak}",
        f"used_memory_peak_human:{_human(peak)}",
        f"maxmemory:{server.config.maxmemory}",
        f"maxmemory_human:{_human(server.config.maxmemory)}",
        "maxmemory_policy:noeviction",
        "mem_allocator:pymalloc",
    ]


def section_persistence(server) -> list[str]:
    durability = server.durability
    return [
        "loading:0",
        "async_loading:0",
        "rdb_changes_since_last_save:0",
        "rdb_bgsave_in_progress:0",
        f"rdb_last_save_time:{int(server.started)}",
        "rdb_last_bgsave_status:ok",
        "aof_enabled:1",
        "aof_rewrite_in_progress:0",
        "aof_rewrite_scheduled:0",
        f"aof_last_write_status:{'err' if durability and durability.last_flush_error else 'ok'}",
        f"partita_fsync_policy:{server.config.fsync}",
        f"partita_group_commits:{durability.fsync_count if durability else 0}",
    ]


def section_stats(server) -> list[str]:
    s = server.stats
    return [
        f"total_connections_received:{s.total_connections_received}",
        f"total_commands_processed:{s.total_commands_processed}",
        f"instantaneous_ops_per_sec:{s.instantaneous_ops_per_sec}",
        f"total_net_input_bytes:{s.total_net_input_bytes}",
        f"total_net_output_bytes:{s.total_net_output_bytes}",
        f"rejected_connections:{s.rejected_connections}",
        "expired_keys:0",
        "evicted_keys:0",
        f"keyspace_hits:{s.keyspace_hits}",
        f"keyspace_misses:{s.keyspace_misses}",
        "pubsub_channels:0",
        "pubsub_patterns:0",
        f"total_error_replies:{s.total_error_replies}",
        f"unexpected_error_replies:{s.unexpected_error_replies}",
        f"total_reads_processed:{s.total_commands_processed}",
    ]


def section_replication(server) -> list[str]:
    """Redis's fields as its tools read them: every node is the master of
    the partitions it leads, and the nodes following any of them are its
    ``slaveN`` (docs/replication.md); Partita's own lines follow."""
    repl = getattr(server, "replication", None)
    followers = repl.manager.follower_lines() if repl is not None else []
    return [
        "role:master",
        f"connected_slaves:{len(followers)}",
        *followers,
        "master_failover_state:no-failover",
        f"master_replid:{server.run_id}",
        "master_replid2:0000000000000000000000000000000000000000",
        "master_repl_offset:0",
        "second_repl_offset:-1",
        "repl_backlog_active:0",
        "repl_backlog_size:0",
        "repl_backlog_first_byte_offset:0",
        "repl_backlog_histlen:0",
    ] + _partition_roles(server)


def _partition_roles(server) -> list[str]:
    """Partita's replication, per partition (docs/replication.md): roles,
    ISR, high watermark, and per follower ``node<id>:<lag entries>:<lag bytes>``."""
    repl = getattr(server, "replication", None)
    if repl is None:
        return ["cluster_enabled:0"]
    controller = repl.controller.info_lines() if repl.controller is not None else []
    return ["cluster_enabled:1"] + repl.manager.info_lines() + controller


def section_cpu(server) -> list[str]:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return [
        f"used_cpu_sys:{usage.ru_stime:.6f}",
        f"used_cpu_user:{usage.ru_utime:.6f}",
        f"used_cpu_sys_children:{children.ru_stime:.6f}",
        f"used_cpu_user_children:{children.ru_utime:.6f}",
    ]


def section_commandstats(server) -> list[str]:
    lines = []
    for name, (calls, usec, rejected, failed) in server.stats.commands.items():
        per_call = usec / calls if calls else 0.0
        lines.append(
            f"cmdstat_{name}:calls={calls},usec={usec},usec_per_call={per_call:.2f},"
            f"rejected_calls={rejected},failed_calls={failed}"
        )
    return lines


def section_errorstats(server) -> list[str]:
    return [f"errorstat_{code}:count={count}" for code, count in server.stats.errors.items()]


def section_keyspace(server) -> list[str]:
    keys = server.key_count()
    return [f"db0:keys={keys},expires=0,avg_ttl=0"] if keys else []


def section_topics(server) -> list[str]:
    topics = server.topics
    stats = getattr(topics, "stats", None)
    if stats is None:
        return [f"topics:{server.key_count()}"]
    memberships = list(getattr(topics, "coordinators", {}).values())
    now_ms = server.broker.clock_ms()  # (the members' clock)
    return [
        f"topics:{topics.key_count()}",
        f"partitions:{topics.partition_total()}",
        f"topics_bytes:{topics.bytes_on_disk()}",
        f"entries_in_total:{stats.entries_in}",
        f"entries_out_total:{stats.entries_out}",
        f"entries_in_per_sec:{stats.in_per_sec:.2f}",
        f"entries_out_per_sec:{stats.out_per_sec:.2f}",
        f"retention_segments_deleted:{stats.retention_segments_deleted}",
        f"retention_bytes_deleted:{stats.retention_bytes_deleted}",
        f"idempotent_appends_total:{stats.idempotent_appends}",
        f"idempotent_duplicates_total:{stats.idempotent_duplicates}",
        f"group_memberships:{len(memberships)}",
        f"group_members:{sum(m.member_count(now_ms) for m in memberships)}",
    ]


def section_partita(server) -> list[str]:
    config = server.config
    return [
        f"partita_version:{partita_version()}",
        f"data_dir:{config.dir}",
        f"fsync:{config.fsync}",
        f"default_partitions:{config.default_partitions}",
        f"topics:{server.key_count()}",
        f"blocked_readers:{server.blocked_clients}",
        f"xadd_pipelined_calls:{server.stats.xadd_run_commands}",
    ]


SECTIONS = {
    "server": ("Server", section_server),
    "clients": ("Clients", section_clients),
    "memory": ("Memory", section_memory),
    "persistence": ("Persistence", section_persistence),
    "stats": ("Stats", section_stats),
    "replication": ("Replication", section_replication),
    "cpu": ("CPU", section_cpu),
    "commandstats": ("Commandstats", section_commandstats),
    "errorstats": ("Errorstats", section_errorstats),
    "keyspace": ("Keyspace", section_keyspace),
    "topics": ("Topics", section_topics),
    "partita": ("Partita", section_partita),
}


def render(server, names: list[str]) -> str:
    wanted: list[str] = []
    if not names:
        wanted = list(DEFAULT_SECTIONS)
    for name in names:
        low = name.lower()
        if low in ("all", "everything"):
            group = ALL_SECTIONS
        elif low == "default":
            group = DEFAULT_SECTIONS
        elif low in SECTIONS:
            group = (low,)
        else:
            group = ()
        for g in group:
            if g not in wanted:
                wanted.append(g)
    parts = []
    for name in [n for n in SECTIONS if n in wanted]:
        title, build = SECTIONS[name]
        parts.append("# " + title + "\r\n" + "".join(line + "\r\n" for line in build(server)))
    return "\r\n".join(parts)


@command("info", arity=-1, flags="loading stale", group="server", since="1.0.0",
         acl_categories=("@slow", "@dangerous"),
         summary="Returns information and statistics about the server.",
         syntax="INFO [section [section ...]]")
def info(ctx, argv):
    """INFO [section [section ...]]"""
    ctx.session.commit_deferred()  # the counters (entries in, bytes) count every XADD before it
    names = [raw.decode("utf-8", "replace") for raw in argv[1:]]
    return Verbatim(render(ctx.server, names))
