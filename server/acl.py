"""Access control: Redis 6/7 ACL users, their rules, and the permission check.

Owns: ``User`` (on/off, SHA-256 password hashes, key patterns, the set of
commands it may run), ``AclRegistry`` (every user of one server; ``default``
always exists and carries ``requirepass``), parsing ``ACL SETUSER`` rules
with Redis's error texts (user names and key / channel patterns never hold
spaces, control whitespace or NUL: they are written to the aclfile between
spaces), describing a user as ``ACL LIST`` / ``ACL GETUSER`` print it, the
NOPERM checks a dispatcher runs for a restricted client (when a command is
given, and again for each queued command at EXEC), which key names a
restricted client may see (KEYS, SCAN, TOPIC LIST), and the ``aclfile``
format (``user <name> <rules...>`` lines, read as Redis 7.0 reads them),
and each password's SCRAM-SHA-256 secret (``ScramSecret``: what the Kafka
port's SCRAM exchange checks a client against, docs/security.md "SCRAM
credentials"): derived when a password is given in clear (``>password``,
``requirepass``), kept beside the aclfile in ``<aclfile>.scram`` (written
by ACL SAVE, read with the aclfile), dropped with its password.

Must not know: sockets, RESP bytes, storage, what any command does. Command
categories and key positions come from the command table
(``server.registry``: each spec's ``acl_categories`` and ``key_indexes``).

The hot path stays free: a client whose user may run every command on every
key has ``client.acl = None`` and the dispatcher does nothing more than that
None check. Only clients of restricted users carry their ``User`` there;
``AclRegistry.refresh_clients`` re-derives it whenever a user changes
(Redis applies a changed user to its connected clients at once).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import logging
import os
from pathlib import Path
from typing import NamedTuple
from typing import Any, Iterable

from server.errors import CommandError
from server.glob import glob_match
from server.registry import DECLARED, CommandSpec

# Redis 7.0's categories, in ACL CAT order.
CATEGORIES: tuple[str, ...] = (
    "keyspace", "read", "write", "set", "sortedset", "list", "hash", "string", "bitmap",
    "hyperloglog", "geo", "stream", "pubsub", "admin", "fast", "slow", "blocking", "dangerous",
    "connection", "transaction", "scripting",
)

WRONGPASS = CommandError("WRONGPASS", "invalid username-password pair or user is disabled.")
KEY_DENIED = "this user has no permissions to access one of the keys used as arguments"
UNKNOWN_NAME = "Unknown command or category name in ACL"
BAD_USERNAME = "Usernames can't contain spaces or null characters"
# Redis's ACLStringHasSpaces: C isspace() in the C locale, and NUL.
_SPACES = frozenset(" \t\n\v\f\r\0")
# SCRAM-SHA-256's iteration count for new secrets: RFC 7677's minimum, and
# Kafka's (its range is 4096-16384).
SCRAM_ITERATIONS = 4096
SCRAM_SALT_BYTES = 16
SCRAM_SUFFIX = ".scram"  # the SCRAM secrets beside the aclfile: users.acl -> users.acl.scram

log = logging.getLogger("partita.acl")


class AclError(Exception):
    """A bad ACL rule or request; ``message`` is Redis's text after ``ERR``."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def hash_password(password: bytes) -> str:
    """Redis stores SHA-256 hex digests, never the password itself."""
    return hashlib.sha256(password).hexdigest()


class ScramSecret(NamedTuple):
    """What SCRAM-SHA-256 (RFC 5802 / 7677) keeps of a password: the
    salt and iteration count the server announces, ``stored_key`` =
    H(ClientKey) that checks a client's proof, ``server_key`` that signs the
    server's answer. Neither gives the password back, nor lets anyone log in
    with it (that takes ClientKey)."""

    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes


def scram_secret(password: bytes, salt: bytes, iterations: int = SCRAM_ITERATIONS) -> ScramSecret:
    """RFC 5802's derivation with the stdlib's PBKDF2 and HMAC. The password
    is used as given (UTF-8 from a client), without SASLprep, as Kafka's
    brokers and clients do."""
    salted = hashlib.pbkdf2_hmac("sha256", password, salt, iterations)
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    server_key = hmac.digest(salted, b"Server Key", "sha256")
    return ScramSecret(salt, iterations, hashlib.sha256(client_key).digest(), server_key)


def has_spaces(text: str) -> bool:
    """Whether a user name or pattern holds a character the aclfile cannot
    keep (its lines are split at spaces): whitespace or NUL, as Redis."""
    return not _SPACES.isdisjoint(text)


# -- the command table, as ACLs see it ----------------------------------------


def _leaf_specs() -> Iterable[CommandSpec]:
    """Every runnable spec: plain commands, subcommands, containers with a handler."""
    for spec in DECLARED.values():
        if spec.handler is not None:
            yield spec
        yield from spec.subcommands.values()


def all_command_names() -> frozenset[str]:
    return frozenset(spec.name for spec in _leaf_specs())


def categories_of(spec: CommandSpec) -> frozenset[str]:
    return frozenset(c.lstrip("@") for c in spec.acl_categories)


def category_members(category: str) -> frozenset[str]:
    """Names (``xadd``, ``config|get``) of the commands in ``category``."""
    return frozenset(spec.name for spec in _leaf_specs() if category in categories_of(spec))


def _names_for_command_rule(name: str) -> frozenset[str] | None:
    """``xadd`` -> {xadd}; ``config`` -> {config|get, ...}; ``config|get`` -> itself."""
    if "|" in name:
        parent, sub = name.split("|", 1)
        spec = DECLARED.get(parent)
        if spec is None or sub not in spec.subcommands:
            return None
        return frozenset((name,))
    spec = DECLARED.get(name)
    if spec is None:
        return None
    names = {sub.name for sub in spec.subcommands.values()}
    if spec.handler is not None:
        names.add(spec.name)
    return frozenset(names)


def _pattern(rule: str, after_star: bool, kind: str, listed: str) -> str:
    """The pattern of a ``~`` rule (``kind`` "keys") or a ``&`` rule
    (``kind`` "channels"), refused as Redis refuses it: after ``*``, or
    holding a space."""
    if after_star:
        raise AclError(f"Adding a pattern after the * pattern (or the 'all{kind}' flag) is not valid and does "
                       f"not have any effect. Try 'reset{kind}' to start with an empty list of {listed}")
    if has_spaces(rule[1:]):
        raise AclError("Syntax error")
    return rule[1:]


# -- users ---------------------------------------------------------------------


class User:
    """One ACL user. Mutated only through ``apply_rule``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.enabled = False
        self.nopass = False
        self.sanitize_payload = False
        self.passwords: list[str] = []  # SHA-256 hex, in the order added
        # SCRAM-SHA-256 secrets of the passwords given in clear (or read from
        # the aclfile's .scram file), by their SHA-256 hex; always a subset of
        # ``passwords``.
        self.scram: dict[str, ScramSecret] = {}
        self.allkeys = False
        self.key_patterns: list[bytes] = []
        self.allchannels = False
        self.allowed: set[str] = set()  # command names this user may run
        self.all_future = False  # +@all / allcommands last set the base (Redis's reserved bit)
        self.command_rules: list[str] = []  # rules after the last +@all / -@all, for describe

    # -- rules -----------------------------------------------------------

    def apply_rules(self, rules: Iterable[str]) -> None:
        for rule in rules:
            self.apply_rule(rule)

    def apply_rule(self, rule: str) -> None:
        """One ``ACL SETUSER`` modifier; AclError with Redis's reason on a bad one."""
        self._apply_rule(rule)
        for digest in [d for d in self.scram if d not in self.passwords]:
            del self.scram[digest]  # its password went (<, !, resetpass, nopass, reset)

    def _apply_rule(self, rule: str) -> None:
        low = rule.lower()
        if not rule:
            pass  # an empty rule changes nothing (Redis)
        elif low == "on":
            self.enabled = True
        elif low == "off":
            self.enabled = False
        elif low == "nopass":
            self.nopass = True
            self.passwords = []
        elif low == "resetpass":
            self.nopass = False
            self.passwords = []
        elif low in ("allkeys", "~*"):
            self.allkeys = True
            self.key_patterns = [b"*"]
        elif low == "resetkeys":
            self.allkeys = False
            self.key_patterns = []
        elif low in ("allchannels", "&*"):
            self.allchannels = True
        elif low == "resetchannels":
            self.allchannels = False
        elif low in ("allcommands", "+@all"):
            self.allowed = set(all_command_names())
            self.all_future = True
            self.command_rules = []
        elif low in ("nocommands", "-@all"):
            self.allowed = set()
            self.all_future = False
            self.command_rules = []
        elif low == "sanitize-payload":
            self.sanitize_payload = True
        elif low == "skip-sanitize-payload":
            self.sanitize_payload = False
        elif low == "reset":
            for step in ("resetpass", "resetkeys", "resetchannels", "off", "-@all"):
                self._apply_rule(step)
            self.sanitize_payload = True
        elif rule.startswith(">"):
            password = rule[1:].encode("utf-8", "surrogateescape")
            digest = hash_password(password)
            if digest not in self.passwords:
                self.passwords.append(digest)
            if digest not in self.scram:
                # The user's passwords share one salt, so that one SCRAM
                # exchange (one salt announced) can check any of them.
                salt = next(iter(self.scram.values())).salt if self.scram else os.urandom(SCRAM_SALT_BYTES)
                self.scram[digest] = scram_secret(password, salt)
            self.nopass = False
        elif rule.startswith("#"):
            digest = rule[1:]
            if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
                raise AclError("The password hash must be exactly 64 characters and contain only "
                               "lowercase hexadecimal characters")
            if digest not in self.passwords:
                self.passwords.append(digest)
            self.nopass = False
        elif rule.startswith("<") or rule.startswith("!"):
            digest = (hash_password(rule[1:].encode("utf-8", "surrogateescape")) if rule[0] == "<"
                      else rule[1:].lower())
            if digest not in self.passwords:
                raise AclError("The password you are trying to remove from the user does not exist")
            self.passwords.remove(digest)
        elif rule.startswith("~"):
            pattern = _pattern(rule, self.allkeys, "keys", "patterns").encode("utf-8", "surrogateescape")
            if pattern not in self.key_patterns:
                self.key_patterns.append(pattern)
        elif rule.startswith("&"):
            # Channels: Partita has no pub/sub; checked as Redis checks them,
            # for aclfile compatibility, and not kept.
            _pattern(rule, self.allchannels, "channels", "channels")
        elif rule.startswith(("+@", "-@")):
            category = low[2:]
            if category not in CATEGORIES:
                raise AclError(UNKNOWN_NAME)
            members = category_members(category)
            if rule[0] == "+":
                self.allowed |= members
            else:
                self.allowed -= members
            self.command_rules.append(rule[0] + "@" + category)
        elif rule.startswith(("+", "-")):
            name = low[1:]
            names = _names_for_command_rule(name)
            if names is None:
                raise AclError(UNKNOWN_NAME)
            if rule[0] == "+":
                self.allowed |= names
            else:
                self.allowed -= names
            # As Redis 7.0: a later rule for the same command replaces the earlier one.
            self.command_rules = [r for r in self.command_rules if r[1:] != name]
            self.command_rules.append(rule[0] + name)
        else:
            raise AclError("Syntax error")

    # -- questions -------------------------------------------------------

    @property
    def unrestricted(self) -> bool:
        """Every command on every key: its clients skip the ACL check entirely."""
        return self.allkeys and self.allowed >= all_command_names()

    def check_password(self, password: bytes) -> bool:
        if not self.enabled:
            return False
        if self.nopass:
            return True
        digest = hash_password(password)
        return any(hmac.compare_digest(digest, known) for known in self.passwords)

    def scram_secrets(self) -> list[ScramSecret]:
        """The SCRAM-SHA-256 secrets one exchange can check: those sharing
        the salt of the newest password that has one ([] when none has:
        passwords given only as ``#<hash>``, ``nopass``)."""
        newest = next((self.scram[d] for d in reversed(self.passwords) if d in self.scram), None)
        if newest is None:
            return []
        return [s for d in self.passwords if (s := self.scram.get(d)) is not None
                and (s.salt, s.iterations) == (newest.salt, newest.iterations)]

    def add_scram_secret(self, digest: str, secret: ScramSecret) -> bool:
        """Keep ``secret`` for the password of SHA-256 hex ``digest`` (read
        from the .scram file); False when the user has no such password."""
        if digest not in self.passwords:
            return False
        self.scram[digest] = secret
        return True

    def may_access_key(self, key: bytes) -> bool:
        if self.allkeys:
            return True
        return any(glob_match(pattern, key) for pattern in self.key_patterns)

    # -- describing ------------------------------------------------------

    def flags(self) -> list[str]:
        out = ["on" if self.enabled else "off"]
        if self.nopass:
            out.append("nopass")
        if self.sanitize_payload:
            out.append("sanitize-payload")
        return out

    def describe_commands(self) -> str:
        """``+@all -flushall`` / ``-@all +@read``: the base, categories, then single commands.

        Matches Redis 7.0.15 for the usual shapes; for rules that subtract a
        category after adding some of its commands Redis re-derives a longer
        equivalent list, which Partita does not imitate.
        """
        base = "+@all" if self.all_future else "-@all"
        cats = [r for r in self.command_rules if r[1] == "@"]
        # Redis 7.0.15 prints several single-command rules in its command
        # table's hash order (it differs between runs); Partita: as given.
        singles = [r for r in self.command_rules if r[1] != "@"]
        return " ".join([base] + cats + singles)

    def describe_keys(self) -> str:
        if self.allkeys:
            return "~*"
        return " ".join("~" + p.decode("utf-8", "surrogateescape") for p in self.key_patterns)

    def describe(self) -> str:
        """One ``ACL LIST`` line (also the ``aclfile`` format)."""
        parts = ["user", self.name] + self.flags()
        parts += ["#" + digest for digest in self.passwords]
        keys = self.describe_keys()
        if keys:
            parts.append(keys)
        parts.append("&*" if self.allchannels else "resetchannels")
        parts.append(self.describe_commands())
        return " ".join(parts)


# -- the permission check --------------------------------------------------------


def acl_key_indexes(spec: CommandSpec, argv: list[bytes]) -> list[int]:
    """Every key ``argv`` names: the key arguments (``key_indexes``) and the
    keys its options name for a later write (``option_keys``: XGROUP CREATE
    ... DEADLETTER k)."""
    indexes = spec.key_indexes(argv)
    if spec.option_keys is not None:
        indexes = indexes + spec.option_keys(argv)
    return indexes


def _writes_every_key(spec: CommandSpec) -> bool:
    """A keyspace command that writes without naming keys (FLUSHALL,
    FLUSHDB): it writes every key, so it needs every key."""
    return ("write" in spec.flags and spec.first_key <= 0 and spec.key_finder is None
            and "keyspace" in categories_of(spec))


def denial(user: User, spec: CommandSpec, argv: list[bytes]) -> tuple[str, int | None] | None:
    """Why ``user`` may not run ``argv``: ``("command", None)``, or
    ``("key", i)`` for the key at ``argv[i]`` (``i`` None: the command
    writes every key); None if it may."""
    if spec.name not in user.allowed:
        return ("command", None)
    if not user.allkeys:
        for i in acl_key_indexes(spec, argv):
            if not user.may_access_key(argv[i]):
                return ("key", i)
        if _writes_every_key(spec):
            return ("key", None)
    return None


def check(user: User, spec: CommandSpec, argv: list[bytes]) -> CommandError | None:
    """None if ``user`` may run ``argv``; else Redis 7.0's NOPERM error.

    Called by the dispatcher only for clients whose user is restricted
    (``client.acl is not None``).
    """
    reason = denial(user, spec, argv)
    if reason is None:
        return None
    if reason[0] == "command":
        return CommandError("NOPERM", f"this user has no permissions to run the '{spec.name}' command")
    return CommandError("NOPERM", KEY_DENIED)


def require_key(client: Any, key: bytes) -> None:
    """Raise the NOPERM error unless ``client`` may access ``key``: for a
    key a command will write that neither it nor its options name (XGROUP
    CONFIG keeping the group's dead-letter key)."""
    user = client.acl
    if user is not None and not user.may_access_key(key):
        raise CommandError("NOPERM", KEY_DENIED)


def visible_keys(client: Any, names: list[bytes]) -> list[bytes]:
    """The key ``names`` (KEYS, CLUSTER GETKEYSINSLOT) that ``client`` may
    see (``key_filter``)."""
    visible = key_filter(client)
    return names if visible is None else [k for k in names if visible(k)]


def key_filter(client: Any) -> Any:
    """For commands that list key names (KEYS, SCAN, TOPIC LIST): None when
    ``client`` may see every key, else a test ``name -> bool``.

    Redis 7.0 lists every key to any user allowed to run KEYS or SCAN
    (redis/redis#8152); Partita shows a restricted user only the names its
    key patterns allow.
    """
    user = client.acl
    if user is None or user.allkeys:
        return None
    return user.may_access_key


def denied(ctx: Any, spec: CommandSpec, argv: list[bytes]) -> CommandError | None:
    """The dispatcher's hook: the NOPERM reply for this command, or None.

    As Redis's ``rejectCommand``: a refused EXEC answers EXECABORT and ends
    the transaction; any other refusal inside MULTI fails the EXEC later.
    """
    client = ctx.client
    error = check(client.acl, spec, argv)
    if error is None:
        return None
    stats = ctx.server.stats
    stats.record_rejected(spec.name)
    stats.record_error("NOPERM")
    if spec.name == "exec":
        if client.in_multi:
            ctx.dispatcher.discard(ctx)
        return CommandError("EXECABORT", "Transaction discarded because of: " + error.line)
    if client.in_multi:
        client.multi_error = True
    return error


_EXEC_REASONS = {
    "command": "no permission to execute the command or subcommand",
    "key": "no permission to touch the specified keys",
}


def denied_at_exec(ctx: Any, spec: CommandSpec, argv: list[bytes]) -> CommandError | None:
    """EXEC's check of one queued command, right before it runs: the user
    may have been changed since it was queued. Redis 7.0's reply for that
    command (the others of the transaction run), or None."""
    reason = denial(ctx.client.acl, spec, argv)
    if reason is None:
        return None
    ctx.server.stats.record_error("NOPERM")
    return CommandError("NOPERM", "ACLs rules changed between the moment the transaction was accumulated and "
                        "the EXEC call. This command is no longer allowed for the following reason: "
                        + _EXEC_REASONS[reason[0]])


# -- the registry ------------------------------------------------------------------


class AclRegistry:
    """Every user of one server. ``default`` always exists.

    ``requirepass`` keeps its Redis meaning: it sets the default user's
    password (empty: ``nopass``). Users live in memory unless ``aclfile``
    names a file (``ACL SAVE`` / ``ACL LOAD``), exactly as in Redis.
    """

    def __init__(self, requirepass: str = "", aclfile: str = "") -> None:
        self.users: dict[str, User] = {}
        self.aclfile = aclfile
        self.users["default"] = self._new_default(requirepass)
        if aclfile:
            try:
                self.load(aclfile)
            except AclError as e:  # the server does not start (as Redis: exit 1)
                raise AclError(f"Aborting Partita startup because of ACL errors: {e.message}") from None

    @staticmethod
    def _new_default(requirepass: str) -> User:
        user = User("default")
        user.apply_rules(["on", "~*", "&*", "+@all"])
        user.apply_rule(">" + requirepass if requirepass else "nopass")
        return user

    @property
    def default(self) -> User:
        return self.users["default"]

    def set_requirepass(self, requirepass: str) -> None:
        """CONFIG SET requirepass: the default user's only password (or nopass)."""
        user = self.default
        user.apply_rule("resetpass")
        user.apply_rule(">" + requirepass if requirepass else "nopass")

    def default_authenticated(self) -> bool:
        """Whether a new connection starts authenticated (Redis: default is on + nopass)."""
        user = self.default
        return user.enabled and user.nopass

    def authenticate(self, name: bytes, password: bytes) -> User:
        """The user for AUTH / HELLO AUTH, or WRONGPASS (Redis's one text for every failure)."""
        user = self.users.get(name.decode("utf-8", "surrogateescape"))
        if user is None or not user.check_password(password):
            raise WRONGPASS
        return user

    def setuser(self, name: str, rules: list[str]) -> User:
        """Apply ``rules`` to a copy; the user changes only if every rule is valid."""
        if has_spaces(name):
            raise AclError(BAD_USERNAME)
        current = self.users.get(name)
        draft = User(name)
        if current is not None:
            draft.__dict__.update({k: (list(v) if isinstance(v, list) else set(v) if isinstance(v, set)
                                       else dict(v) if isinstance(v, dict) else v)
                                   for k, v in current.__dict__.items()})
        else:
            draft.apply_rule("resetchannels")  # Redis 7.0's acl-pubsub-default
        for rule in rules:
            try:
                draft.apply_rule(rule)
            except AclError as e:
                shown = rule.split("\0", 1)[0]  # Redis prints the rule as a C string
                raise AclError(f"Error in ACL SETUSER modifier '{shown}': {e.message}") from None
        if current is None:
            self.users[name] = draft
            return draft
        current.__dict__.update(draft.__dict__)
        return current

    def deluser(self, names: list[str]) -> int:
        if "default" in names:
            raise AclError("The 'default' user cannot be removed")
        deleted = 0
        for name in names:
            if self.users.pop(name, None) is not None:
                deleted += 1
        return deleted

    # -- clients -----------------------------------------------------------

    def login(self, client: Any, user: User) -> None:
        client.authenticated = True
        client.user = user.name
        client.acl = None if user.unrestricted else user

    def refresh_clients(self, clients: Iterable[Any]) -> list[Any]:
        """After a user changed: re-derive ``client.acl``; clients of deleted users are returned."""
        orphans = []
        for client in clients:
            user = self.users.get(client.user)
            if user is None:
                orphans.append(client)
            elif client.authenticated:
                client.acl = None if user.unrestricted else user
        return orphans

    # -- aclfile ---------------------------------------------------------------

    def dump(self) -> str:
        return "".join(user.describe() + "\n" for user in sorted(self.users.values(), key=lambda u: u.name))

    def load(self, path: str) -> None:
        """Replace every user with the file's; all or nothing.

        Read as Redis 7.0's ``ACLLoadFromFile`` reads it, with its error
        texts: the file must exist (a missing one is an error, at start
        and at ACL LOAD: an empty file holds no users), lines trimmed,
        blank ones skipped, each ``user <name> <rules>`` split at single
        spaces (no quoting: names and patterns cannot hold spaces), every
        rule applied to a new user. Partita also skips lines starting with
        ``#`` (comments; Redis 8.8 does too), and refuses a directory
        (Redis 7.0 reads one as an empty file, dropping every user).
        """
        try:
            text = Path(path).read_text(encoding="utf-8", errors="surrogateescape")
        except OSError as e:
            raise AclError(f"Error loading ACLs, opening file '{path}': {e.strerror}") from None
        fresh: dict[str, User] = {}
        errors = ""
        for lineno, raw in enumerate(text.split("\n"), 1):
            line = raw.strip(" \t\r\n")
            if not line or line.startswith("#"):
                continue
            args = line.split(" ")
            if args[0] != "user" or len(args) < 2:
                errors += f"{path}:{lineno} should start with user keyword followed by the username. "
                continue
            name = args[1]
            if has_spaces(name):
                errors += f"'{path}:{lineno}: username '{name}' contains invalid characters. "
                continue
            if name in fresh:
                errors += f"WARNING: Duplicate user '{name}' found on line {lineno}. "
                continue
            user = fresh[name] = User(name)
            user.apply_rule("resetchannels")  # Redis 7.0's acl-pubsub-default
            syntax_error = False
            for rule in args[2:]:
                rule = rule.strip("\t\r\n")
                try:
                    user.apply_rule(rule)
                except AclError as e:
                    if e.message == UNKNOWN_NAME:  # Redis names the rule only for these
                        errors += f"{path}:{lineno}: Error in applying operation '{rule}': {e.message}. "
                    elif not syntax_error:  # later errors may follow from the first
                        errors += f"{path}:{lineno}: {e.message}. "
                        syntax_error = True
        if errors:
            raise AclError(errors + "WARNING: ACL errors detected, no change to the previously active "
                           "ACL rules was performed")
        if "default" not in fresh:  # (requirepass stays the default user's password)
            fresh["default"] = self.users.get("default") or self._new_default("")
        _load_scram(path + SCRAM_SUFFIX, fresh)
        self.users = fresh

    def save(self, path: str) -> None:
        """The aclfile and, beside it, its users' SCRAM secrets (first: the
        aclfile never names a password whose secret was not saved). On a
        failure, Redis 7.0's reply, and its log line saying why."""
        try:
            _write_atomically(path + SCRAM_SUFFIX, _dump_scram(self.users), 0o600, "SCRAM secrets file")
            _write_atomically(path, self.dump(), 0o644, "ACL file")
        except _SaveError as e:
            log.warning("%s", e)
            raise AclError("There was an error trying to save the ACLs. Please check the server logs "
                           "for more information") from None


class _SaveError(Exception):
    """A step of ACL SAVE failed; the text is the log line (Redis's words)."""


def _write_atomically(path: str, text: str, mode: int, what: str) -> None:
    """Write ``path`` through a temporary file renamed over it; on an OSError
    the temporary file is removed and _SaveError names the step, as Redis's
    ``ACLSaveToFile`` logs it (``Renaming ACL file for ACL SAVE: ...``)."""
    tmp = path + ".tmp"
    step = "Opening temp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        try:
            with open(fd, "w", encoding="utf-8", errors="surrogateescape") as f:
                step = "Writing"
                f.write(text)
                f.flush()
                step = "Syncing"
                os.fsync(f.fileno())
            step = "Renaming"
            os.replace(tmp, path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError as e:
        raise _SaveError(f"{step} {what} for ACL SAVE: {e.strerror}") from None


# -- the .scram file ----------------------------------------------------------------
#
# One line per password that has a secret, after a comment line:
#   scram-sha-256 <user> <sha256-hex of the password> <iterations> <salt> <stored-key> <server-key>
# (salt and keys in base64). A secret whose user or password the aclfile no
# longer has is not read (and not written again by the next ACL SAVE).

_SCRAM_HEADER = ("# SCRAM-SHA-256 secrets of the users of the ACL file beside it, for the Kafka port's SASL "
                 "(written by ACL SAVE; docs/security.md)\n")


def _dump_scram(users: dict[str, User]) -> str:
    lines = [_SCRAM_HEADER]
    for user in sorted(users.values(), key=lambda u: u.name):
        for digest in user.passwords:
            secret = user.scram.get(digest)
            if secret is not None:
                lines.append(" ".join(["scram-sha-256", user.name, digest, str(secret.iterations)]
                                      + [base64.b64encode(b).decode() for b in
                                         (secret.salt, secret.stored_key, secret.server_key)]) + "\n")
    return "".join(lines)


def _load_scram(path: str, users: dict[str, User]) -> None:
    """Give ``users`` the secrets ``path`` keeps for their passwords. A
    missing file is an empty one; an unreadable file or line is logged and
    skipped (SCRAM is then refused for those passwords; PLAIN still works)."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="surrogateescape")
    except FileNotFoundError:
        return
    except OSError as e:
        log.warning("Cannot read the SCRAM secrets in %s (%s): SCRAM-SHA-256 on the Kafka port will refuse "
                    "the users whose passwords are not given in clear", path, e.strerror)
        return
    for lineno, line in enumerate(text.split("\n"), 1):
        if not line.strip() or line.startswith("#"):
            continue
        try:
            kind, name, digest, iterations, salt, stored, server = line.split(" ")
            secret = ScramSecret(base64.b64decode(salt, validate=True), int(iterations),
                                 base64.b64decode(stored, validate=True), base64.b64decode(server, validate=True))
            if kind != "scram-sha-256" or secret.iterations < 1 or len(secret.stored_key) != 32 \
                    or len(secret.server_key) != 32:
                raise ValueError(kind)
        except ValueError:
            log.warning("%s:%d is not a SCRAM secret line: skipped", path, lineno)
            continue
        user = users.get(name)
        if user is not None and digest not in user.scram:  # (a password given in clear keeps its own)
            user.add_scram_secret(digest, secret)


def warn_if_unprotected(registry: AclRegistry, addrs: list[str], logger: Any) -> bool:
    """Log a warning when listening beyond loopback while the default user needs no password."""
    import ipaddress

    exposed = []
    for addr in addrs:
        try:
            if not ipaddress.ip_address(addr.split("%")[0]).is_loopback:
                exposed.append(addr)
        except ValueError:
            exposed.append(addr)
    if exposed and registry.default_authenticated():
        logger.warning(
            "WARNING: Partita is listening on a non-loopback address without a password (%s): anyone "
            "who can reach it can read, write and delete every stream. Set requirepass or ACL users, "
            "and consider tls-port (docs/security.md).", ", ".join(exposed))
        return True
    return False
