"""Transactions: MULTI EXEC DISCARD WATCH UNWATCH.

Owns: the declarations of these commands; the state machine itself lives in
``server.dispatch.Dispatcher`` because queueing happens before any handler
runs.

Must not know: sockets, storage.
"""

from __future__ import annotations

from server.errors import err
from server.registry import command
from server.reply import OK


@command("multi", arity=1, flags="noscript loading stale fast allow_busy", group="transactions",
         since="1.2.0", acl_categories=("@fast", "@transaction"),
         summary="Starts a transaction.",
         syntax="MULTI")
def multi(ctx, argv):
    """MULTI"""
    return ctx.dispatcher.multi(ctx)


@command("exec", arity=1, flags="noscript loading stale skip_slowlog", group="transactions",
         since="1.2.0", acl_categories=("@slow", "@transaction"),
         summary="Executes all commands in a transaction.",
         syntax="EXEC")
def exec_(ctx, argv):
    """EXEC"""
    return ctx.dispatcher.exec(ctx)


@command("discard", arity=1, flags="noscript loading stale fast allow_busy", group="transactions",
         since="2.0.0", acl_categories=("@fast", "@transaction"),
         summary="Discards a transaction.",
         syntax="DISCARD")
def discard(ctx, argv):
    """DISCARD"""
    return ctx.dispatcher.discard(ctx)


@command("watch", arity=-2, flags="noscript loading stale fast allow_busy", keys=(1, -1, 1),
         group="transactions", since="2.2.0", acl_categories=("@fast", "@transaction"),
         summary="Monitors changes to keys to determine the execution of a transaction.",
         syntax="WATCH key [key ...]")
def watch(ctx, argv):
    """WATCH key [key ...]"""
    if ctx.client.in_multi:
        raise err("WATCH inside MULTI is not allowed")
    for key in argv[1:]:
        ctx.server.watch(ctx.client, key)
    return OK


@command("unwatch", arity=1, flags="noscript loading stale fast allow_busy", group="transactions",
         since="2.2.0", acl_categories=("@fast", "@transaction"),
         summary="Forgets about watched keys of a transaction.",
         syntax="UNWATCH")
def unwatch(ctx, argv):
    """UNWATCH"""
    ctx.server.unwatch_all(ctx.client)
    return OK
