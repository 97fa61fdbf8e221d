"""COMMAND, COMMAND COUNT / INFO / DOCS / LIST / GETKEYS / HELP.

Owns: these handlers. Everything they report comes from the command table
(``server.registry``): arity, flags, key positions, ACL categories, and the
docs ``arguments`` derived from each declared syntax line (``server.docs``).

Must not know: sockets, storage, any particular command's meaning.
"""

from __future__ import annotations

import fnmatch
from functools import lru_cache

from server.docs import SyntaxLineError, syntax_arguments
from server.errors import err, syntax_error
from server.registry import CommandSpec, container
from server.reply import Map, Set, Simple

_ACL = ("@slow", "@connection")

_command = container("command", arity=-1, flags="loading stale", group="server", since="2.8.13",
                     summary="Returns detailed information about all commands.", acl_categories=_ACL)


def _acl(spec: CommandSpec) -> list[str]:
    return [c if c.startswith("@") else "@" + c for c in spec.acl_categories]


def _key_specs(spec: CommandSpec) -> list[Map]:
    if spec.first_key <= 0 and spec.key_finder is None:
        return []
    if "write" in spec.flags:
        flags = Set([Simple("RW"), Simple("UPDATE")])
    else:
        flags = Set([Simple("RO"), Simple("ACCESS")])
    if spec.key_finder is not None and spec.first_key <= 0:
        return [Map([("flags", flags), ("begin_search", Map([("type", "unknown"), ("spec", Map())])),
                     ("find_keys", Map([("type", "unknown"), ("spec", Map())]))])]
    last = spec.last_key - spec.first_key if spec.last_key >= 0 else spec.last_key
    return [
        Map(
            [
                ("flags", flags),
                ("begin_search", Map([("type", "index"), ("spec", Map([("index", spec.first_key)]))])),
                ("find_keys", Map([("type", "range"), ("spec", Map(
                    [("lastkey", last), ("keystep", spec.key_step or 1), ("limit", 0)]))])),
            ]
        )
    ]


def command_info(spec: CommandSpec) -> list:
    """One COMMAND INFO entry, in Redis 7.0's ten-element form."""
    flags = set(spec.flags)
    if spec.key_finder is not None:
        flags.add("movablekeys")
    return [
        spec.name,
        spec.arity,
        Set([Simple(f) for f in sorted(flags)]),
        spec.first_key,
        spec.last_key,
        spec.key_step,
        Set([Simple(c) for c in _acl(spec)]),
        Set(),
        _key_specs(spec),
        [command_info(sub) for sub in spec.subcommands.values()],
    ]


@lru_cache(maxsize=None)
def _arguments(syntax: str, name_words: int) -> list:
    try:
        return syntax_arguments(syntax, name_words)
    except SyntaxLineError:
        return []


def _to_reply(value):
    if isinstance(value, dict):
        return Map((k, _to_reply(v)) for k, v in value.items())
    if isinstance(value, list):
        if value and all(isinstance(v, str) for v in value) and value[0] in ("optional", "multiple"):
            return Set([Simple(v) for v in value])
        return [_to_reply(v) for v in value]
    return value


def command_docs(spec: CommandSpec) -> Map:
    """One COMMAND DOCS entry: summary, since, group, arguments, subcommands."""
    doc = Map([("summary", spec.summary), ("since", spec.since), ("group", spec.group)])
    if spec.subcommands:
        doc["complexity"] = "Depends on subcommand."
        doc["subcommands"] = Map((sub.name, command_docs(sub)) for sub in spec.subcommands.values())
        return doc
    args = _arguments(spec.syntax, 2 if "|" in spec.name else 1)
    if args:
        doc["arguments"] = _to_reply(args)
    return doc


def _commands(ctx) -> dict[str, CommandSpec]:
    """The commands of the port ``ctx`` is on (``Dispatcher.table``)."""
    return ctx.dispatcher.table.commands


def command_all(ctx, argv):
    """COMMAND"""
    return [command_info(spec) for spec in _commands(ctx).values()]


_command.handler = command_all




from server.registry import command  # noqa: E402  (after the container exists)


@command("command|count", arity=2, flags="loading stale", group="server", since="2.8.13",
         acl_categories=_ACL, summary="Returns a count of commands.", syntax="COMMAND COUNT")
def command_count(ctx, argv):
    """COMMAND COUNT"""
    return len(_commands(ctx))


def _find(commands: dict[str, CommandSpec], name: bytes) -> CommandSpec | None:
    try:
        text = name.decode("ascii").lower()
    except UnicodeDecodeError:
        return None
    if "|" in text:
        parent, sub = text.split("|", 1)
        spec = commands.get(parent)
        return spec.subcommands.get(sub) if spec else None
    return commands.get(text)


@command("command|info", arity=-2, flags="loading stale", group="server", since="2.8.13",
         acl_categories=_ACL, summary="Returns information about one, multiple or all commands.",
         syntax="COMMAND INFO [command-name [command-name ...]]")
def command_info_cmd(ctx, argv):
    """COMMAND INFO [command-name [command-name ...]]"""
    if len(argv) == 2:
        return command_all(ctx, argv)
    out = []
    for name in argv[2:]:
        spec = _find(_commands(ctx), name)
        out.append(command_info(spec) if spec else None)
    return out


@command("command|docs", arity=-2, flags="loading stale", group="server", since="7.0.0",
         acl_categories=_ACL, summary="Returns documentary information about one, multiple or all commands.",
         syntax="COMMAND DOCS [command-name [command-name ...]]")
def command_docs_cmd(ctx, argv):
    """COMMAND DOCS [command-name [command-name ...]]"""
    if len(argv) == 2:
        return Map((spec.name, command_docs(spec)) for spec in _commands(ctx).values())
    out = Map()
    for name in argv[2:]:
        spec = _find(_commands(ctx), name)
        if spec is not None:
            out[spec.name] = command_docs(spec)
    return out


def _all_names(commands: dict[str, CommandSpec]) -> list[str]:
    names = []
    for spec in commands.values():
        names.append(spec.name)
        names.extend(sub.name for sub in spec.subcommands.values())
    return names


def _all_specs(commands: dict[str, CommandSpec]) -> list[CommandSpec]:
    specs = []
    for spec in commands.values():
        specs.append(spec)
        specs.extend(spec.subcommands.values())
    return specs


@command("command|list", arity=-2, flags="loading stale", group="server", since="7.0.0",
         acl_categories=_ACL, summary="Returns a list of command names.",
         syntax="COMMAND LIST [FILTERBY <MODULE module-name | ACLCAT category | PATTERN pattern>]")
def command_list(ctx, argv):
    """COMMAND LIST [FILTERBY <MODULE module-name | ACLCAT category | PATTERN pattern>]"""
    if len(argv) == 2:
        return _all_names(_commands(ctx))
    if len(argv) != 5 or argv[2].lower() != b"filterby":
        raise syntax_error()
    kind = argv[3].lower()
    value = argv[4].decode("utf-8", "replace")
    if kind == b"module":
        return []
    if kind == b"aclcat":
        cat = "@" + value.lower().lstrip("@")
        return [s.name for s in _all_specs(_commands(ctx)) if cat in _acl(s)]
    if kind == b"pattern":
        pattern = value.lower()
        return [s.name for s in _all_specs(_commands(ctx)) if fnmatch.fnmatchcase(s.name, pattern)]
    raise syntax_error()


@command("command|getkeys", arity=-4, flags="loading stale", group="server", since="2.8.13",
         acl_categories=_ACL, summary="Extracts the key names from an arbitrary command.",
         syntax="COMMAND GETKEYS command [arg [arg ...]]")
def command_getkeys(ctx, argv):
    """COMMAND GETKEYS command [arg [arg ...]]"""
    target = argv[2:]
    spec = _find(_commands(ctx), target[0])
    if spec is None or "|" in spec.name:
        raise err("Invalid command specified")
    if spec.subcommands and len(target) >= 2:
        sub = _find(_commands(ctx), target[0] + b"|" + target[1])
        if sub is not None:
            spec = sub
    if not spec.check_arity(len(target)):
        raise err("Invalid number of arguments specified for command")
    if spec.first_key <= 0 and spec.key_finder is None:
        raise err("The command has no key arguments")
    try:
        indexes = spec.key_indexes(target)
    except Exception:
        indexes = []
    if not indexes:
        raise err("Invalid arguments specified for command")
    return [target[i] for i in indexes]


@command("command|help", arity=2, flags="loading stale", group="server", since="5.0.0",
         acl_categories=_ACL, summary="Returns helpful text about the different subcommands.",
         syntax="COMMAND HELP")
def command_help(ctx, argv):
    """COMMAND HELP"""
    lines = [
        "COMMAND <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
        "(no subcommand)",
        "    Return details about all Redis commands.",
        "COUNT",
        "    Return the total number of commands in this Redis server.",
        "LIST",
        "    Return a list of all commands in this Redis server.",
        "INFO [<command-name> ...]",
        "    Return details about multiple Redis commands.",
        "    If no command names are given, documentation details for all",
        "    commands are returned.",
        "DOCS [<command-name> ...]",
        "    Return documentation details about multiple Redis commands.",
        "    If no command names are given, documentation details for all",
        "    commands are returned.",
        "GETKEYS <full-command>",
        "    Return the keys from a full Redis command.",
        "HELP",
        "    Prints this help.",
    ]
    return [Simple(line) for line in lines]
