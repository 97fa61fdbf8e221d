"""Connection and server commands: PING ECHO HELLO AUTH SELECT QUIT RESET TIME SHUTDOWN.

Owns: these handlers and Redis's replies and error texts for them.

Must not know: sockets (closing is asked for with ``client.close_after_reply``
or ``server.shutdown_requested``), storage.
"""

from __future__ import annotations

import time

from server.acl import WRONGPASS  # noqa: F401  (re-exported: Redis's one text for every failed AUTH)
from server.args import parse_int
from server.dispatch import NO_REPLY
from server.errors import BAD_CLIENT_NAME, CommandError, err, syntax_error
from server.registry import command, redact_from
from server.reply import OK, PONG, Map, Simple
from server.state import REDIS_VERSION, valid_client_name

NO_PASSWORD = err(
    "AUTH <password> called without any password configured for the default user. "
    "Are you sure your configuration is correct?"
)
def check_password(ctx, user: bytes, password: bytes) -> None:
    """Authenticate the client as ``user`` (an ACL user, server/acl.py) or raise WRONGPASS."""
    acl = ctx.server.acl
    acl.login(ctx.client, acl.authenticate(user, password))


@command("ping", arity=-1, flags="fast", group="connection", since="1.0.0",
         acl_categories=("@fast", "@connection"),
         summary="Returns the server's liveliness response.",
         syntax="PING [message]")
def ping(ctx, argv):
    """PING [message]"""
    if len(argv) > 2:
        raise err("wrong number of arguments for 'ping' command")
    if len(argv) == 2:
        return argv[1]
    return PONG


@command("echo", arity=2, flags="loading stale fast", group="connection", since="1.0.0",
         acl_categories=("@fast", "@connection"),
         summary="Returns the given string.",
         syntax="ECHO message")
def echo(ctx, argv):
    """ECHO message"""
    return argv[1]


@command("quit", arity=-1, flags="noscript loading stale fast no_auth allow_busy", group="connection",
         since="1.0.0", acl_categories=("@fast", "@connection"),
         summary="Closes the connection.",
         syntax="QUIT")
def quit_(ctx, argv):
    """QUIT"""
    ctx.client.close_after_reply = True
    return OK


def _hello_auth_indexes(argv: list[bytes]) -> list[int]:
    """HELLO's AUTH username and password, where the handler would read them
    (SLOWLOG and MONITOR show them redacted, as Redis)."""
    found = []
    i = 2
    while i < len(argv):
        more = len(argv) - i - 1
        option = argv[i].lower()
        if option == b"auth" and more >= 2:
            found += (i + 1, i + 2)
            i += 3
        elif option == b"setname" and more >= 1:
            i += 2
        else:
            break
    return found


@command("hello", arity=-1, flags="noscript loading stale fast no_auth allow_busy", group="connection",
         since="6.0.0", acl_categories=("@fast", "@connection"),
         summary="Handshakes with the Redis server.",
         syntax="HELLO [protover [AUTH username password] [SETNAME clientname]]",
         redact=_hello_auth_indexes)
def hello(ctx, argv):
    """HELLO [protover [AUTH username password] [SETNAME clientname]]"""
    client = ctx.client
    protocol = client.protocol
    if len(argv) >= 2:
        protocol = parse_int(argv[1], "Protocol version is not an integer or out of range")
        if protocol < 2 or protocol > 3:
            raise CommandError("NOPROTO", "unsupported protocol version")
    auth: tuple[bytes, bytes] | None = None
    name: bytes | None = None
    i = 2
    while i < len(argv):
        more = len(argv) - i - 1
        option = argv[i].lower()
        if option == b"auth" and more >= 2:
            auth = (argv[i + 1], argv[i + 2])
            i += 3
        elif option == b"setname" and more >= 1:
            name = argv[i + 1]
            if not valid_client_name(name):
                raise BAD_CLIENT_NAME
            i += 2
        else:
            raise err(f"Syntax error in HELLO option '{argv[i].decode('utf-8', 'replace')}'")
    if auth is not None:
        check_password(ctx, *auth)
    if not client.authenticated:
        raise CommandError("NOAUTH", "HELLO must be called with the client already authenticated, "
                           "otherwise the HELLO AUTH <user> <pass> option can be used to "
                           "authenticate the client and select the RESP protocol version at the same time")
    if name is not None:
        client.name = name
    client.protocol = protocol
    return Map(
        [
            ("server", "redis"),
            ("version", REDIS_VERSION),
            ("proto", protocol),
            ("id", client.id),
            ("mode", "standalone"),
            ("role", "master"),
            ("modules", []),
        ]
    )


@command("auth", arity=-2, flags="noscript loading stale fast no_auth allow_busy", group="connection",
         since="1.0.0", acl_categories=("@fast", "@connection"),
         summary="Authenticates the connection.",
         syntax="AUTH [username] password", redact=redact_from(1))
def auth(ctx, argv):
    """AUTH [username] password"""
    if len(argv) > 3:
        raise syntax_error()
    if len(argv) == 2:
        if ctx.server.acl.default.nopass:
            raise NO_PASSWORD
        check_password(ctx, b"default", argv[1])
    else:
        check_password(ctx, argv[1], argv[2])
    return OK


@command("select", arity=2, flags="loading stale fast", group="connection", since="1.0.0",
         acl_categories=("@fast", "@connection"),
         summary="Changes the selected database.",
         syntax="SELECT index")
def select(ctx, argv):
    """SELECT index"""
    index = parse_int(argv[1])
    if index != 0:
        raise err("DB index is out of range")
    return OK


@command("reset", arity=1, flags="noscript loading stale fast no_auth allow_busy", group="connection",
         since="6.2.0", acl_categories=("@fast", "@connection"),
         summary="Resets the connection.",
         syntax="RESET")
def reset(ctx, argv):
    """RESET"""
    client = ctx.client
    if client.in_multi:
        ctx.dispatcher.discard(ctx)
    ctx.server.unwatch_all(client)
    if client.monitor is not None:  # a monitor stops monitoring (its connection notices)
        ctx.server.diagnostics.detach_monitor(client.monitor)
        client.monitor = None
    client.protocol = 2
    client.name = b""
    client.db = 0
    client.no_evict = False
    client.no_touch = False
    client.readonly = False  # (Redis: READWRITE mode)
    acl = ctx.server.acl
    client.authenticated = False
    client.acl = None
    client.user = "default"
    if acl.default_authenticated():
        acl.login(client, acl.default)
    return Simple("RESET")


@command("time", arity=1, flags="loading stale fast", group="server", since="2.6.0",
         acl_categories=("@fast",),
         summary="Returns the server time.",
         syntax="TIME")
def time_(ctx, argv):
    """TIME"""
    now_us = time.time_ns() // 1000
    return [str(now_us // 1_000_000).encode(), str(now_us % 1_000_000).encode()]


@command("shutdown", arity=-1, flags="admin noscript loading stale no_multi allow_busy", group="server",
         since="1.0.0", acl_categories=("@admin", "@slow", "@dangerous"),
         summary="Synchronously saves the database(s) to disk and shuts down the Redis server.",
         syntax="SHUTDOWN [NOSAVE | SAVE] [NOW] [FORCE] [ABORT]")
def shutdown(ctx, argv):
    """SHUTDOWN [NOSAVE | SAVE] [NOW] [FORCE] [ABORT]"""
    flags: set[str] = set()
    for raw in argv[1:]:
        word = raw.decode("latin-1").lower()
        if word not in ("nosave", "save", "now", "force", "abort") or word in flags:
            raise syntax_error()
        flags.add(word)
    if "nosave" in flags and "save" in flags:
        raise syntax_error()
    if "abort" in flags:
        if len(flags) > 1:
            raise syntax_error()
        raise err("No shutdown in progress.")
    # Partition logs are always on disk: SAVE / NOSAVE change nothing; the
    # logs are flushed and closed on the way out either way.
    ctx.server.shutdown_flags = flags
    ctx.server.shutdown_requested.set()
    ctx.client.close_after_reply = True
    return NO_REPLY
