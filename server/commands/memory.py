"""MEMORY USAGE / STATS / DOCTOR / MALLOC-STATS / PURGE / HELP.

Owns: these handlers and Redis 7.0's replies and error texts for them.
MEMORY USAGE's figure is the broker's (``cluster.broker.memory``: what a
key's open partitions hold in memory; its entries live on disk). The
process-wide figures are the resident set size's: Partita runs on Python's
allocator, which keeps no byte count of its own (docs/diagnostics.md).

Must not know: sockets, storage.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc

from server.args import parse_int
from server.errors import syntax_error
from server.registry import command, container
from server.reply import OK, Map, Verbatim, help_reply
from server.state import peak_rss_bytes, rss_bytes

container("memory", group="server", since="4.0.0", summary="A container for memory diagnostics commands.",
          acl_categories=("@slow",))

DEFAULT_SAMPLES = 5
# Below this, MEMORY DOCTOR finds the instance "empty or using very little
# memory" (Redis's 5 MB of total allocation; here what the data added to the
# resident set since start).
LITTLE_MEMORY_BYTES = 5 * 1024 * 1024
# MEMORY DOCTOR's texts (Redis's getMemoryDoctorReport).
_EMPTY = ("Hi Sam, this instance is empty or is using very little memory, my issues detector can't be used in "
          "these conditions. Please, leave for your mission on Earth and fill it with some data. The new Sam and I "
          "will be back to our programming as soon as I finished rebooting.\n")
_FINE = "Hi Sam, I can't find any memory issue in your instance. I can only account for what occurs on this base.\n"
_BIG_PEAK = ("Sam, I detected a few issues in this Redis instance memory implants:\n\n"
             " * Peak memory: In the past this instance used more than 150% the memory that is currently using. "
             "The allocator is normally not able to release memory after a peak, so you can expect to see a big "
             "fragmentation ratio, however this is actually harmless and is only due to the memory peak, and if "
             "the Redis instance Resident Set Size (RSS) is currently bigger than expected, the memory will be used "
             "as soon as you fill the Redis instance with more data. If the memory peak was only occasional and you "
             "want to try to reclaim memory, please try the MEMORY PURGE command, otherwise the only other option "
             "is to shutdown and restart the instance.\n\n"
             "I'm here to keep you safe, Sam. I want to help you.\n")


@command("memory|usage", arity=-3, flags="readonly", keys=(2, 2, 1), group="server", since="4.0.0",
         acl_categories=("@read", "@slow"), summary="Estimates the memory usage of a key.",
         syntax="MEMORY USAGE key [SAMPLES count]")
def memory_usage(ctx, argv):
    """MEMORY USAGE key [SAMPLES count]

    The bytes the key holds in memory: its open partitions' objects (index,
    group state, deferred entries ...), not its entries on disk; nil when it
    does not exist. SAMPLES: elements walked per container before the rest
    is estimated at their average (default 5, 0: all)."""
    samples = DEFAULT_SAMPLES
    i = 3
    while i < len(argv):
        if argv[i].lower() == b"samples" and i + 1 < len(argv):
            samples = parse_int(argv[i + 1])
            if samples < 0:
                raise syntax_error()
            i += 2
        else:
            raise syntax_error()
    return ctx.session.memory_usage(argv[2], samples)


@command("memory|stats", arity=2, group="server", since="4.0.0", acl_categories=("@slow",),
         summary="Returns details about memory usage.", syntax="MEMORY STATS")
def memory_stats(ctx, argv):
    """MEMORY STATS

    Redis's fields that have a meaning here, from the process's resident
    set size (docs/diagnostics.md "MEMORY")."""
    server = ctx.server
    total = rss_bytes()
    peak, startup = peak_rss_bytes(total), server.started_rss_bytes
    keys = server.key_count()
    dataset = _dataset_bytes(server)
    return Map([
        ("peak.allocated", peak),
        ("total.allocated", total),
        ("startup.allocated", startup),
        ("replication.backlog", 0),
        ("clients.slaves", 0),
        ("aof.buffer", ctx.session.deferred_bytes()),
        ("keys.count", keys),
        ("keys.bytes-per-key", dataset // keys if keys else 0),
        ("dataset.bytes", dataset),
        ("peak.percentage", total * 100 / peak if peak else 0.0),
    ])


@command("memory|doctor", arity=2, group="server", since="4.0.0", acl_categories=("@slow",),
         summary="Outputs a memory problems report.", syntax="MEMORY DOCTOR")
def memory_doctor(ctx, argv):
    """MEMORY DOCTOR

    Redis's texts: an instance without keys, or whose data added less than
    5 MB to the process, is "empty" (Redis: less than 5 MB allocated); a peak
    resident set over 150% of today's is reported; otherwise nothing to
    report."""
    server = ctx.server
    if server.key_count() == 0 or _dataset_bytes(server) < LITTLE_MEMORY_BYTES:
        return Verbatim(_EMPTY)
    rss = rss_bytes()
    if peak_rss_bytes(rss) > 1.5 * rss:
        return Verbatim(_BIG_PEAK)
    return Verbatim(_FINE)


def _dataset_bytes(server) -> int:
    """What the process's resident set grew by since start (MEMORY STATS
    dataset.bytes)."""
    return max(0, rss_bytes() - server.started_rss_bytes)


@command("memory|malloc-stats", arity=2, group="server", since="4.0.0", acl_categories=("@slow",),
         summary="Returns the allocator statistics.", syntax="MEMORY MALLOC-STATS")
def memory_malloc_stats(ctx, argv):
    """MEMORY MALLOC-STATS

    Redis's answer without jemalloc."""
    return b"Stats not supported for the current allocator"


@command("memory|purge", arity=2, group="server", since="4.0.0", acl_categories=("@slow",),
         summary="Asks the allocator to release memory.", syntax="MEMORY PURGE")
def memory_purge(ctx, argv):
    """MEMORY PURGE

    Collects unreachable objects and asks the C allocator to return free
    memory to the system (``malloc_trim``, where the C library has it)."""
    gc.collect()
    if _LIBC is not None:
        _LIBC.malloc_trim(0)
    return OK


def _libc():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _libc()


@command("memory|help", arity=2, flags="loading stale", group="server", since="4.0.0", acl_categories=("@slow",),
         summary="Returns helpful text about the different subcommands.", syntax="MEMORY HELP")
def memory_help(ctx, argv):
    """MEMORY HELP"""
    return help_reply("MEMORY", [
        "DOCTOR",
        "    Return memory problems reports.",
        "MALLOC-STATS",
        "    Return internal statistics report from the memory allocator.",
        "PURGE",
        "    Attempt to purge dirty pages for reclamation by the allocator.",
        "STATS",
        "    Return information about the memory usage of the server.",
        "USAGE <key> [SAMPLES <count>]",
        "    Return memory in bytes used by <key> and its value. Nested values are",
        "    sampled up to <count> times (default: 5, 0 means sample all).",
    ])
