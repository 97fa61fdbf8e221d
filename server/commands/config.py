"""CONFIG GET / SET / RESETSTAT / REWRITE / HELP.

Owns: these handlers and Redis's replies and error texts for them. The
names, types and validation are ``server.config``'s.

Must not know: sockets, storage; how a changed value reaches running
connections (``Config.on_change`` hooks registered by the app).
"""

from __future__ import annotations

from server.config import SENSITIVE, ConfigError
from server.errors import err, syntax_error
from server.registry import command, container
from server.reply import OK, Map, Simple

_ACL = ("@admin", "@slow", "@dangerous")

container("config", group="server", since="2.0.0",
          summary="A container for server configuration commands.", acl_categories=("@slow",))


@command("config|get", arity=-3, flags="admin noscript loading stale", group="server", since="2.0.0",
         acl_categories=_ACL, summary="Returns the effective values of configuration parameters.",
         syntax="CONFIG GET parameter [parameter ...]")
def config_get(ctx, argv):
    """CONFIG GET parameter [parameter ...]"""
    patterns = [raw.decode("utf-8", "replace") for raw in argv[2:]]
    return Map(ctx.server.config.matching(patterns))


@command("config|set", arity=-4, flags="admin noscript loading stale", group="server", since="2.0.0",
         acl_categories=_ACL, summary="Sets configuration parameters in-flight.",
         syntax="CONFIG SET parameter value [parameter value ...]",
         redact=lambda argv: [i + 1 for i in range(2, len(argv) - 1, 2)
                              if argv[i].decode("latin-1").lower() in SENSITIVE])
def config_set(ctx, argv):
    """CONFIG SET parameter value [parameter value ...]"""
    if len(argv) % 2 != 0:  # a name without its value: Redis 7+'s syntax error
        raise syntax_error()
    pairs = [
        (argv[i].decode("utf-8", "surrogateescape"), argv[i + 1].decode("utf-8", "surrogateescape"))
        for i in range(2, len(argv), 2)
    ]
    try:
        ctx.server.config.set_many(pairs)
    except ConfigError as e:
        if e.message == "unknown":
            raise err(f"Unknown option or number of arguments for CONFIG SET - '{e.name}'") from None
        raise err(f"CONFIG SET failed (possibly related to argument '{e.name}') - {e.message}") from None
    return OK


@command("config|resetstat", arity=2, flags="admin noscript loading stale", group="server", since="2.0.0",
         acl_categories=_ACL, summary="Resets the server's statistics.",
         syntax="CONFIG RESETSTAT")
def config_resetstat(ctx, argv):
    """CONFIG RESETSTAT"""
    ctx.server.stats.reset()
    return OK


@command("config|rewrite", arity=2, flags="admin noscript loading stale", group="server", since="2.8.0",
         acl_categories=_ACL, summary="Persists the effective configuration to file.",
         syntax="CONFIG REWRITE")
def config_rewrite(ctx, argv):
    """CONFIG REWRITE"""
    try:
        ctx.server.config.rewrite()
    except ConfigError as e:
        raise err(e.message) from None
    return OK


@command("config|help", arity=2, flags="loading stale", group="server", since="5.0.0",
         acl_categories=("@slow",), summary="Returns helpful text about the different subcommands.",
         syntax="CONFIG HELP")
def config_help(ctx, argv):
    """CONFIG HELP"""
    lines = [
        "CONFIG <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
        "GET <pattern>",
        "    Return parameters matching the glob-like <pattern> and their values.",
        "SET <directive> <value>",
        "    Set the configuration <directive> to <value>.",
        "RESETSTAT",
        "    Reset statistics reported by the INFO command.",
        "REWRITE",
        "    Rewrite the configuration file.",
        "HELP",
        "    Prints this help.",
    ]
    return [Simple(line) for line in lines]
