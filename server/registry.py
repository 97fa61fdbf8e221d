"""The command table: every command declared once.

Owns: ``CommandSpec`` (name, arity, flags, key positions, syntax line,
summary, since, group, handler, subcommands), the declarations (``command``,
``container``, ``nowait_path``, ``run_path``, ``poll_path``: each command
declared once, where its handler is defined) and ``CommandTable``, the table
one server runs: built from the declarations by the composition root
(``client_table()``; the cluster bus builds its own), so a test builds one
of its own, adds its commands to it and throws it away, instead of changing
what every server of the process sees. Arity checks, ``COMMAND`` /
``COMMAND INFO|DOCS|LIST|COUNT|GETKEYS`` and ACL categories are derived from
these declarations and nothing else (redis ``commands/*.json``,
``server.c::commandCheckArity``).

Must not know: sockets, RESP bytes, storage.

Declaring a command::

    @command("xlen", arity=2, flags="readonly fast", keys=(1, 1, 1),
             group="stream", since="5.0.0",
             summary="Return the number of messages in a stream.",
             syntax="XLEN key")
    def xlen(ctx, argv): ...

Declaring a container and its subcommands (``CLIENT ID``)::

    container("client", group="connection", since="2.4.0", summary="...")

    @command("client|id", arity=2, flags="noscript loading stale", ...)
    def client_id(ctx, argv): ...

A handler takes ``(ctx, argv)`` where ``argv[0]`` is the command name as sent
(and ``argv[1]`` the subcommand for subcommands) and returns a reply value
(``server.reply``) or raises ``CommandError``. A handler is ``async def`` only
if it can block (spec flag ``blocking``).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

# Flags as Redis names them in COMMAND INFO.
KNOWN_FLAGS = frozenset(
    {
        "write", "readonly", "denyoom", "module", "admin", "pubsub", "noscript",
        "blocking", "loading", "stale", "skip_monitor", "skip_slowlog",
        "asking", "fast", "no_auth", "may_replicate", "sentinel",
        "only_sentinel", "no_mandatory_keys", "no_multi", "movablekeys",
        "allow_busy", "no_async_loading",
    }
)


@dataclass(eq=False)
class CommandSpec:
    name: str  # lower-case; "container|sub" for subcommands
    arity: int
    flags: frozenset[str]
    first_key: int
    last_key: int
    key_step: int
    group: str
    since: str
    summary: str
    syntax: str
    handler: Callable[..., Any] | None
    is_async: bool = False
    acl_categories: tuple[str, ...] = ()
    subcommands: dict[str, "CommandSpec"] = field(default_factory=dict)
    # For commands whose keys are found by a keyword (XREAD ... STREAMS k1 k2 id1 id2)
    # rather than fixed positions: a function argv -> list of key indexes.
    key_finder: Callable[[list[bytes]], list[int]] | None = None
    # Keys an option names for the command to write later (XGROUP CREATE ...
    # DEADLETTER k): a function argv -> list of their indexes. ACLs check
    # them as they check key arguments (``server.acl.acl_key_indexes``);
    # they are not key arguments for COMMAND GETKEYS, WATCH or routing.
    option_keys: Callable[[list[bytes]], list[int]] | None = None
    # For a blocking command: a plain function that answers the forms that
    # cannot wait (no BLOCK) without a coroutine; None from it means "take
    # the handler" (``nowait_path``, ``Dispatcher.call``).
    now: Callable[..., Any] | None = None
    # Arguments SLOWLOG and MONITOR show as "(redacted)" (passwords): a
    # function argv -> their indexes (``server.diagnostics.redacted``).
    redact: Callable[[list[bytes]], Any] | None = None

    @property
    def full_name(self) -> str:
        return self.name

    @property
    def display_name(self) -> str:
        return self.name.split("|")[-1]

    def check_arity(self, argc: int) -> bool:
        a = self.arity
        return argc == a if a >= 0 else argc >= -a

    def key_indexes(self, argv: list[bytes]) -> list[int]:
        """Positions of key arguments in ``argv`` (COMMAND GETKEYS, ACLs, WATCH)."""
        if self.key_finder is not None:
            return self.key_finder(argv)
        if self.first_key <= 0:
            return []
        last = self.last_key if self.last_key >= 0 else len(argv) + self.last_key
        return list(range(self.first_key, min(last, len(argv) - 1) + 1, self.key_step or 1))


DECLARED: dict[str, CommandSpec] = {}  # the client port's commands, as declared
# Internal commands between cluster nodes, served on the cluster bus only
# (``command(..., peer=True)``; server/bus.py): the client port does not
# know them.
PEER_DECLARED: dict[str, CommandSpec] = {}
_RUNS: dict[str, Callable] = {}  # run_path declarations
_POLLS: dict[str, Callable] = {}  # poll_path declarations


@dataclass(eq=False)
class CommandTable:
    """The commands one server (or one of its ports) runs: ``commands`` by
    lower-case name; ``runs``: a command's path for a run of it taken
    straight from received bytes (``Dispatcher.xadd_run``); ``polls``: a
    blocking command's form a consumer sends one request at a time, taken
    from received bytes (``Dispatcher.read_poll``)."""

    commands: dict[str, CommandSpec]
    runs: dict[str, Callable] = field(default_factory=dict)
    polls: dict[str, Callable] = field(default_factory=dict)
    # ``on_refused(ctx, error)``: what the port does besides replying about
    # a command refused before it runs (unknown, wrong arity): the cluster
    # bus, where peers never send one, logs it and closes the connection.
    on_refused: Callable[[Any, Any], None] | None = None

    def add(self, spec: CommandSpec) -> CommandSpec:
        """A command of this table only (tests' own commands)."""
        assert "|" not in spec.name and spec.name not in self.commands, spec.name
        self.commands[spec.name] = spec
        return spec


def client_table() -> CommandTable:
    """A new table of every declared client-port command, run and poll path."""
    return CommandTable(dict(DECLARED), dict(_RUNS), dict(_POLLS))


def nowait_path(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register ``fn(ctx, argv)`` as blocking command ``name``'s path for a
    call that will not wait: it returns the reply, or None when the command
    must go through its (async) handler after all. It must have done nothing
    a second try by the handler would see, before it returns None."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        spec = DECLARED[name]
        assert spec.is_async and spec.now is None, name
        spec.now = fn
        return fn

    return decorate


def run_path(name: str, fn: Callable) -> Callable:
    """Declare ``fn(ctx, data, pos, route)`` as command ``name``'s path for a
    run of it at ``data[pos:]``, taken from received bytes: ``(end,
    replies, count, token)`` or None to decline (``Dispatcher.xadd_run``)."""
    assert name in DECLARED and name not in _RUNS, name
    _RUNS[name] = fn
    return fn


def poll_path(name: str, fn: Callable) -> Callable:
    """Declare ``fn(ctx, data, out, route)`` as blocking command ``name``'s
    poll form: when ``data`` is exactly one such request it appends the
    encoded reply to ``out`` and returns True, or returns None to decline,
    having done nothing the general path would not do first (as a
    ``nowait_path``; ``Dispatcher.read_poll``)."""
    assert name in DECLARED and name not in _POLLS, name
    _POLLS[name] = fn
    return fn


def _flags(flags: str | tuple[str, ...] | frozenset[str]) -> frozenset[str]:
    items = frozenset(flags.split()) if isinstance(flags, str) else frozenset(flags)
    unknown = items - KNOWN_FLAGS
    assert not unknown, f"unknown command flags {sorted(unknown)}"
    return items


# Subcommands declared before their container, by container name: command
# modules load in any order and never import each other (XINFO's container
# is declared with XINFO STREAM, XINFO GROUPS elsewhere).
_ORPHANS: dict[str, list[CommandSpec]] = {}


def _adopt(parent: CommandSpec, spec: CommandSpec) -> None:
    sub = spec.name.split("|", 1)[1]
    assert sub not in parent.subcommands, f"duplicate subcommand {spec.name}"
    parent.subcommands[sub] = spec


def _register(spec: CommandSpec, table: dict[str, CommandSpec] = DECLARED) -> CommandSpec:
    if table is not DECLARED and table is not PEER_DECLARED:  # a test's own
        assert "|" not in spec.name and spec.name not in table, spec.name
        table[spec.name] = spec
        return spec
    if "|" in spec.name:
        parent = DECLARED.get(spec.name.split("|", 1)[0])
        if parent is None:
            _ORPHANS.setdefault(spec.name.split("|", 1)[0], []).append(spec)
        else:
            _adopt(parent, spec)
    else:
        assert spec.name not in DECLARED and spec.name not in PEER_DECLARED, f"duplicate command {spec.name}"
        table[spec.name] = spec
        for orphan in _ORPHANS.pop(spec.name, ()):
            _adopt(spec, orphan)
    return spec


def orphans() -> list[str]:
    """Subcommands whose container was never declared (a mistake)."""
    return [spec.name for specs in _ORPHANS.values() for spec in specs]


def redact_from(first: int) -> Callable[[list[bytes]], range]:
    """A ``redact`` declaration (``CommandSpec.redact``): every argument
    from index ``first`` on."""
    return lambda argv: range(first, len(argv))


def command(
    name: str,
    *,
    arity: int,
    flags: str = "",
    keys: tuple[int, int, int] = (0, 0, 0),
    group: str,
    since: str,
    summary: str,
    syntax: str,
    acl_categories: tuple[str, ...] = (),
    key_finder: Callable[[list[bytes]], list[int]] | None = None,
    option_keys: Callable[[list[bytes]], list[int]] | None = None,
    redact: Callable[[list[bytes]], Any] | None = None,
    waits: bool = False,
    peer: bool = False,
    table: dict[str, CommandSpec] | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Declare a command (or ``container|sub`` subcommand) and register its handler.

    ``waits``: the handler is async although Redis does not flag the command
    ``blocking`` (WAIT, CLUSTER FAILOVER, the internal long-poll fetch).
    ``option_keys``: see ``CommandSpec.option_keys``; every option that names
    a key the command writes, now or later, must be declared there.
    ``redact``: see ``CommandSpec.redact``; every argument that may carry a
    password must be declared there.
    ``peer``: an internal command between cluster nodes, in ``PEER_DECLARED``
    (the cluster bus) instead of ``DECLARED`` (the client port).
    ``table``: a plain command of that dict only, not declared for every
    server (a test's own commands, handed to its dispatcher's table).
    """

    def decorate(handler: Callable[..., Any]) -> Callable[..., Any]:
        flag_set = _flags(flags)
        is_async = inspect.iscoroutinefunction(handler)
        assert is_async == ("blocking" in flag_set or waits), (
            f"{name}: a handler is async exactly when its spec says 'blocking' (or waits=True)"
        )
        _register(
            CommandSpec(
                name=name.lower(),
                arity=arity,
                flags=flag_set,
                first_key=keys[0],
                last_key=keys[1],
                key_step=keys[2],
                group=group,
                since=since,
                summary=summary,
                syntax=syntax,
                handler=handler,
                is_async=is_async,
                acl_categories=acl_categories,
                key_finder=key_finder,
                option_keys=option_keys,
                redact=redact,
            ),
            table if table is not None else PEER_DECLARED if peer else DECLARED,
        )
        return handler

    return decorate


def container(
    name: str,
    *,
    group: str,
    since: str,
    summary: str,
    arity: int = -2,
    flags: str = "",
    acl_categories: tuple[str, ...] = (),
) -> CommandSpec:
    """Declare a command that only dispatches to subcommands (CLIENT, CONFIG ...)."""
    return _register(
        CommandSpec(
            name=name.lower(),
            arity=arity,
            flags=_flags(flags),
            first_key=0,
            last_key=0,
            key_step=0,
            group=group,
            since=since,
            summary=summary,
            syntax=f"{name.upper()} <subcommand> [<arg> ...]",
            handler=None,
            acl_categories=acl_categories,
        )
    )
