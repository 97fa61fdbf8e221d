"""What the server observes of commands: MONITOR, SLOWLOG, LATENCY.

Owns: these handlers and Redis 7.0's replies and error texts for them. What
is recorded, and how, is ``server.diagnostics``'s; the dispatcher feeds it
(``Dispatcher._observe``); a MONITOR client's connection sends its lines.

Must not know: sockets, storage.
"""

from __future__ import annotations

from server.args import parse_int
from server.dispatch import NO_REPLY
from server.errors import err, subcommand_arity
from server.registry import command, container
from server.reply import OK, Verbatim, help_reply

_ADMIN = ("@admin", "@slow", "@dangerous")


# ------------------------------------------------------------------ MONITOR

@command("monitor", arity=1, flags="admin noscript loading stale", group="server", since="1.0.0",
         acl_categories=_ADMIN, summary="Listens for all requests received by the server in real-time.",
         syntax="MONITOR")
def monitor(ctx, argv):
    """MONITOR

    From now on the client is sent every command any client runs, as
    ``+<unix time>.<µs> [0 <addr>] "CMD" "arg" ...`` (its connection serves
    it: ``server.connection``), until QUIT, RESET or it leaves. As Redis:
    inside MULTI it is refused, a second MONITOR is not answered, and a
    monitor may not run commands that touch keys."""
    client = ctx.client
    if client.in_multi:  # (run by EXEC: a transaction wants one reply per command)
        raise err("MONITOR isn't allowed for DENY BLOCKING client")
    if client.monitor is not None:
        return NO_REPLY  # Redis ignores it
    client.begin_monitor(ctx.server.diagnostics.attach_monitor(client))
    return OK


# ------------------------------------------------------------------ SLOWLOG

container("slowlog", group="server", since="2.2.12", summary="A container for slow log commands.",
          acl_categories=("@slow",))


@command("slowlog|get", arity=-2, flags="admin loading stale", group="server", since="2.2.12",
         acl_categories=_ADMIN, summary="Returns the slow log's entries.", syntax="SLOWLOG GET [count]")
def slowlog_get(ctx, argv):
    """SLOWLOG GET [count]

    The newest ``count`` entries (default 10, -1: all): ``[id, unix time,
    µs, [args], "ip:port", client name]``."""
    if len(argv) > 3:
        raise subcommand_arity(argv)
    slowlog = ctx.server.diagnostics.slowlog
    count = 10
    if len(argv) == 3:
        count = parse_int(argv[2], "count should be greater than or equal to -1")
        if count < -1:
            raise err("count should be greater than or equal to -1")
        if count == -1:
            count = len(slowlog.entries)
    return [[entry_id, when, usec, args, addr, name]
            for entry_id, when, usec, args, addr, name in slowlog.get(count)]


@command("slowlog|len", arity=2, flags="admin loading stale", group="server", since="2.2.12",
         acl_categories=_ADMIN, summary="Returns the number of entries in the slow log.", syntax="SLOWLOG LEN")
def slowlog_len(ctx, argv):
    """SLOWLOG LEN"""
    return len(ctx.server.diagnostics.slowlog.entries)


@command("slowlog|reset", arity=2, flags="admin loading stale", group="server", since="2.2.12",
         acl_categories=_ADMIN, summary="Clears all entries from the slow log.", syntax="SLOWLOG RESET")
def slowlog_reset(ctx, argv):
    """SLOWLOG RESET"""
    ctx.server.diagnostics.slowlog.reset()
    return OK


@command("slowlog|help", arity=2, flags="loading stale", group="server", since="6.2.0",
         acl_categories=("@slow",), summary="Show helpful text about the different subcommands",
         syntax="SLOWLOG HELP")
def slowlog_help(ctx, argv):
    """SLOWLOG HELP"""
    return help_reply("SLOWLOG", [
        "GET [<count>]",
        "    Return top <count> entries from the slowlog (default: 10, -1 mean all).",
        "    Entries are made of:",
        "    id, timestamp, time in microseconds, arguments array, client IP and port,",
        "    client name",
        "LEN",
        "    Return the length of the slowlog.",
        "RESET",
        "    Reset the slowlog.",
    ])


# ------------------------------------------------------------------ LATENCY

container("latency", group="server", since="2.8.13", summary="A container for latency diagnostics commands.",
          acl_categories=("@slow",))

_LATENCY_FLAGS = "admin noscript loading stale"


@command("latency|latest", arity=2, flags=_LATENCY_FLAGS, group="server", since="2.8.13", acl_categories=_ADMIN,
         summary="Returns the latest latency samples for all events.", syntax="LATENCY LATEST")
def latency_latest(ctx, argv):
    """LATENCY LATEST

    ``[event, unix time, latest ms, all-time highest ms]`` per event:
    ``command``, ``fast-command``, ``aof-fsync-always``, ``aof-write``."""
    return [[event.encode(), *figures] for event, *figures in ctx.server.diagnostics.latency.latest()]


@command("latency|history", arity=3, flags=_LATENCY_FLAGS, group="server", since="2.8.13", acl_categories=_ADMIN,
         summary="Returns timestamp-latency samples for an event.", syntax="LATENCY HISTORY event")
def latency_history(ctx, argv):
    """LATENCY HISTORY event"""
    return ctx.server.diagnostics.latency.history(argv[2].decode("utf-8", "replace"))


@command("latency|reset", arity=-2, flags=_LATENCY_FLAGS, group="server", since="2.8.13", acl_categories=_ADMIN,
         summary="Resets the latency data for one or more events.", syntax="LATENCY RESET [event [event ...]]")
def latency_reset(ctx, argv):
    """LATENCY RESET [event [event ...]]"""
    latency = ctx.server.diagnostics.latency
    if len(argv) == 2:
        return latency.reset()
    return sum(latency.reset(event.decode("utf-8", "replace")) for event in argv[2:])


@command("latency|doctor", arity=2, flags=_LATENCY_FLAGS, group="server", since="2.8.13", acl_categories=_ADMIN,
         summary="Returns a human-readable latency analysis report.", syntax="LATENCY DOCTOR")
def latency_doctor(ctx, argv):
    """LATENCY DOCTOR"""
    config = ctx.server.config
    return Verbatim(ctx.server.diagnostics.latency.doctor(config.latency_monitor_threshold,
                                                          config.slowlog_log_slower_than, config.fsync))


@command("latency|graph", arity=3, flags=_LATENCY_FLAGS, group="server", since="2.8.13", acl_categories=_ADMIN,
         summary="Returns a latency graph for an event.", syntax="LATENCY GRAPH event")
def latency_graph(ctx, argv):
    """LATENCY GRAPH event"""
    event = argv[2].decode("utf-8", "replace")
    graph = ctx.server.diagnostics.latency.graph(event)
    if graph is None:
        raise err(f"No samples available for event '{event}'")
    return Verbatim(graph)


@command("latency|help", arity=2, flags="loading stale", group="server", since="2.8.13",
         acl_categories=("@slow",), summary="Returns helpful text about the different subcommands.",
         syntax="LATENCY HELP")
def latency_help(ctx, argv):
    """LATENCY HELP

    Redis 7.0's text without HISTOGRAM (per-command histograms of every
    call: not kept, they would cost every command)."""
    return help_reply("LATENCY", [
        "DOCTOR",
        "    Return a human readable latency analysis report.",
        "GRAPH <event>",
        "    Return an ASCII latency graph for the <event> class.",
        "HISTORY <event>",
        "    Return time-latency samples for the <event> class.",
        "LATEST",
        "    Return the latest latency samples for all events.",
        "RESET [<event> ...]",
        "    Reset latency data of one or more <event> classes.",
        "    (default: reset all data for all event classes)",
    ])
