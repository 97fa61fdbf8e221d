"""ACL SETUSER / DELUSER / GETUSER / LIST / USERS / WHOAMI / CAT / DRYRUN / GENPASS / LOG / SAVE / LOAD / HELP.

Owns: these handlers and Redis 7.0's replies and error texts for them. The
user model, rule parsing and the permission check are ``server.acl``'s; the
users live in ``ctx.server.acl`` (an ``AclRegistry``).

Must not know: sockets (clients of a deleted user are closed with
``client.kill()``), storage.
"""

from __future__ import annotations

import os

from server.acl import CATEGORIES, AclError, category_members, denial
from server.args import parse_int
from server.errors import err, subcommand_arity
from server.registry import command, container, redact_from
from server.reply import OK, Map, Set, Simple

_ADMIN = ("@admin", "@slow", "@dangerous")
_SLOW = ("@slow",)
_FLAGS = "admin noscript loading stale"

NO_ACLFILE = err(
    "This Redis instance is not configured to use an ACL file. You may want to specify users via the "
    "ACL SETUSER command and then issue a CONFIG REWRITE (assuming you have a Redis configuration file "
    "set) in order to store users in the Redis configuration."
)

container("acl", group="server", since="6.0.0", summary="A container for Access List Control commands.",
          acl_categories=_SLOW)


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def _after_change(ctx) -> None:
    """A user changed or vanished: its clients see it at once; clients of deleted users close."""
    server = ctx.server
    for client in server.acl.refresh_clients(list(server.clients.values())):
        if client is ctx.client:
            client.close_after_reply = True
        else:
            client.kill()


@command("acl|setuser", arity=-3, flags=_FLAGS, group="server", since="6.0.0", acl_categories=_ADMIN,
         summary="Creates and modifies an ACL user and its rules.",
         syntax="ACL SETUSER username [rule [rule ...]]", redact=redact_from(2))
def acl_setuser(ctx, argv):
    """ACL SETUSER username [rule [rule ...]]"""
    try:
        ctx.server.acl.setuser(_text(argv[2]), [_text(a) for a in argv[3:]])
    except AclError as e:
        raise err(e.message) from None
    _after_change(ctx)
    return OK


@command("acl|deluser", arity=-3, flags=_FLAGS, group="server", since="6.0.0", acl_categories=_ADMIN,
         summary="Deletes ACL users, and terminates their connections.",
         syntax="ACL DELUSER username [username ...]")
def acl_deluser(ctx, argv):
    """ACL DELUSER username [username ...]"""
    try:
        deleted = ctx.server.acl.deluser([_text(a) for a in argv[2:]])
    except AclError as e:
        raise err(e.message) from None
    _after_change(ctx)
    return deleted


@command("acl|getuser", arity=3, flags=_FLAGS, group="server", since="6.0.0", acl_categories=_ADMIN,
         summary="Lists the ACL rules of a user.",
         syntax="ACL GETUSER username")
def acl_getuser(ctx, argv):
    """ACL GETUSER username"""
    user = ctx.server.acl.users.get(_text(argv[2]))
    if user is None:
        return None
    return Map([
        ("flags", Set(user.flags())),
        ("passwords", list(user.passwords)),
        ("commands", user.describe_commands()),
        ("keys", user.describe_keys()),
        ("channels", "&*" if user.allchannels else ""),
        ("selectors", []),
    ])


@command("acl|list", arity=2, flags=_FLAGS, group="server", since="6.0.0", acl_categories=_ADMIN,
         summary="Dumps the effective rules in ACL file format.",
         syntax="ACL LIST")
def acl_list(ctx, argv):
    """ACL LIST"""
    users = ctx.server.acl.users
    return [users[name].describe() for name in sorted(users)]


@command("acl|users", arity=2, flags=_FLAGS, group="server", since="6.0.0", acl_categories=_ADMIN,
         summary="Lists all ACL users.",
         syntax="ACL USERS")
def acl_users(ctx, argv):
    """ACL USERS"""
    return sorted(ctx.server.acl.users)


@command("acl|whoami", arity=2, flags="noscript loading stale", group="server", since="6.0.0",
         acl_categories=_SLOW, summary="Returns the authenticated username of the current connection.",
         syntax="ACL WHOAMI")
def acl_whoami(ctx, argv):
    """ACL WHOAMI"""
    return ctx.client.user


@command("acl|cat", arity=-2, flags="noscript loading stale", group="server", since="6.0.0",
         acl_categories=_SLOW, summary="Lists the ACL categories, or the commands inside a category.",
         syntax="ACL CAT [category]")
def acl_cat(ctx, argv):
    """ACL CAT [category]"""
    if len(argv) > 3:
        raise subcommand_arity(argv)
    if len(argv) == 2:
        return list(CATEGORIES)
    category = _text(argv[2]).lower()
    if category not in CATEGORIES:
        raise err(f"Unknown category '{_text(argv[2])}'")
    return sorted(category_members(category))


@command("acl|dryrun", arity=-4, flags=_FLAGS, group="server", since="7.0.0", acl_categories=_ADMIN,
         summary="Simulates the execution of a command by a user, without executing the command.",
         syntax="ACL DRYRUN username command [arg [arg ...]]")
def acl_dryrun(ctx, argv):
    """ACL DRYRUN username command [arg [arg ...]]"""
    name = _text(argv[2])
    user = ctx.server.acl.users.get(name)
    if user is None:
        raise err(f"User '{name}' not found")
    cmd_argv = argv[3:]
    spec = ctx.dispatcher.lookup(cmd_argv) if ctx.dispatcher is not None else None
    if spec is None or not hasattr(spec, "handler"):
        raise err(f"Command '{_text(argv[3])}' not found")
    reason = denial(user, spec, cmd_argv)
    if reason is None:
        return OK
    kind, i = reason
    if kind == "command":
        return f"This user has no permissions to run the '{spec.name}' command"
    if i is None:  # a command that writes every key (FLUSHALL)
        return "This user has no permissions to access one of the keys used as arguments"
    return f"This user has no permissions to access the '{_text(cmd_argv[i])}' key"


@command("acl|genpass", arity=-2, flags="noscript loading stale", group="server", since="6.0.0",
         acl_categories=_SLOW, summary="Generates a pseudorandom, secure password that can be used to identify ACL users.",
         syntax="ACL GENPASS [bits]")
def acl_genpass(ctx, argv):
    """ACL GENPASS [bits]"""
    bits = 256
    if len(argv) > 3:
        raise subcommand_arity(argv)
    if len(argv) == 3:
        bits = parse_int(argv[2])
        if bits <= 0 or bits > 4096:
            raise err("ACL GENPASS argument must be the number of bits for the output password, "
                      "a positive number up to 4096")
    chars = (bits + 3) // 4
    return os.urandom((chars + 1) // 2).hex()[:chars]


@command("acl|log", arity=-2, flags=_FLAGS, group="server", since="6.0.0", acl_categories=_ADMIN,
         summary="Lists recent security events generated due to ACL rules.",
         syntax="ACL LOG [count | RESET]")
def acl_log(ctx, argv):
    """ACL LOG [count | RESET]

    Partita keeps no ACL log yet: the list is always empty.
    """
    if len(argv) == 3 and argv[2].lower() == b"reset":
        return OK
    if len(argv) == 3:
        parse_int(argv[2])
    elif len(argv) > 3:
        raise subcommand_arity(argv)
    return []


@command("acl|save", arity=2, flags=_FLAGS, group="server", since="6.0.0", acl_categories=_ADMIN,
         summary="Saves the effective ACL rules in the configured ACL file.",
         syntax="ACL SAVE")
def acl_save(ctx, argv):
    """ACL SAVE"""
    path = ctx.server.config.aclfile
    if not path:
        raise NO_ACLFILE
    try:
        ctx.server.acl.save(path)
    except AclError as e:
        raise err(e.message) from None
    return OK


@command("acl|load", arity=2, flags=_FLAGS, group="server", since="6.0.0", acl_categories=_ADMIN,
         summary="Reloads the rules from the configured ACL file.",
         syntax="ACL LOAD")
def acl_load(ctx, argv):
    """ACL LOAD"""
    path = ctx.server.config.aclfile
    if not path:
        raise NO_ACLFILE
    try:
        ctx.server.acl.load(path)
    except AclError as e:
        raise err(e.message) from None
    _after_change(ctx)
    return OK


@command("acl|help", arity=2, flags="loading stale", group="server", since="6.0.0", acl_categories=_SLOW,
         summary="Returns helpful text about the different subcommands.",
         syntax="ACL HELP")
def acl_help(ctx, argv):
    """ACL HELP"""
    lines = [
        "ACL <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
        "CAT [<category>]",
        "    List all commands that belong to <category>, or all command categories",
        "    when no category is specified.",
        "DELUSER <username> [<username> ...]",
        "    Delete a list of users.",
        "DRYRUN <username> <command> [<arg> ...]",
        "    Returns whether the user can execute the given command without executing the command.",
        "GETUSER <username>",
        "    Get the user's details.",
        "GENPASS [<bits>]",
        "    Generate a secure 256-bit user password. The optional `bits` argument can",
        "    be used to specify a different size.",
        "LIST",
        "    Show users details in config file format.",
        "LOAD",
        "    Reload users from the ACL file.",
        "LOG [<count> | RESET]",
        "    Show the ACL log entries.",
        "SAVE",
        "    Save the current config to the ACL file.",
        "SETUSER <username> <attribute> [<attribute> ...]",
        "    Create or modify a user with the specified attributes.",
        "USERS",
        "    List all the registered usernames.",
        "WHOAMI",
        "    Return the current connection username.",
        "HELP",
        "    Prints this help.",
    ]
    return [Simple(line) for line in lines]


