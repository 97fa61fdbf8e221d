"""ACL users, rules and the dispatcher's check, without sockets (server/acl.py)."""

from __future__ import annotations

import hashlib

import pytest

import server.commands  # noqa: F401  (registers every command)
from server.acl import AclError, AclRegistry, User, category_members, check
from server.config import Config
from server.dispatch import Context, Dispatcher
from server.registry import COMMANDS
from server.state import ServerState


def make():
    state = ServerState(Config())
    dispatcher = Dispatcher(state)
    client = state.new_client("127.0.0.1:1", "127.0.0.1:6379")
    return state, dispatcher, Context(state, client, dispatcher)


def user(*rules: str) -> User:
    u = User("u")
    u.apply_rules(rules)
    return u


def test_default_user_is_unrestricted_so_its_clients_skip_the_check():
    state, _, ctx = make()
    assert state.acl.default.unrestricted
    assert ctx.client.acl is None and ctx.client.authenticated


def test_read_and_write_categories_split_producers_from_consumers():
    reader = user("on", "nopass", "~*", "+@read")
    writer = user("on", "nopass", "~*", "+@write")
    xadd, xrange = COMMANDS["xadd"], COMMANDS["xrange"]
    assert check(reader, xrange, [b"XRANGE", b"k", b"-", b"+"]) is None
    assert check(reader, xadd, [b"XADD", b"k", b"*", b"a", b"1"]).line == (
        "NOPERM this user has no permissions to run the 'xadd' command")
    assert check(writer, xadd, [b"XADD", b"k", b"*", b"a", b"1"]) is None
    assert check(writer, xrange, [b"XRANGE", b"k", b"-", b"+"]) is not None
    assert "xreadgroup" in category_members("write") and "xread" in category_members("read")


def test_key_patterns_use_the_commands_key_positions():
    u = user("on", "nopass", "~orders*", "+@all")
    xread = COMMANDS["xread"]
    assert check(u, xread, [b"XREAD", b"STREAMS", b"orders", b"orders#2", b"0", b"0"]) is None
    denied = check(u, xread, [b"XREAD", b"COUNT", b"1", b"STREAMS", b"orders", b"other", b"0", b"0"])
    assert denied.line == "NOPERM this user has no permissions to access one of the keys used as arguments"
    # keyless commands need no pattern
    assert check(u, COMMANDS["ping"], [b"PING"]) is None


def test_subcommand_rules():
    u = user("+config|get")
    assert "config|get" in u.allowed and "config|set" not in u.allowed
    u.apply_rule("+config")
    assert {"config|set", "config|rewrite"} <= u.allowed
    u.apply_rule("-config")
    assert not any(name.startswith("config") for name in u.allowed)


def test_passwords_are_sha256_and_removable():
    u = user("on", ">a", ">b", ">a")
    assert u.passwords == [hashlib.sha256(b"a").hexdigest(), hashlib.sha256(b"b").hexdigest()]
    assert u.check_password(b"b") and not u.check_password(b"c")
    u.apply_rule("<a")
    assert not u.check_password(b"a")
    with pytest.raises(AclError, match="does not exist"):
        u.apply_rule("<a")
    u.apply_rule("off")
    assert not u.check_password(b"b")  # disabled users never authenticate


def test_bad_rules_change_nothing():
    registry = AclRegistry()
    registry.setuser("x", ["on", ">p", "+@read"])
    before = registry.users["x"].describe()
    with pytest.raises(AclError, match="Error in ACL SETUSER modifier '\\+nosuch'"):
        registry.setuser("x", ["-@all", "+nosuch"])
    assert registry.users["x"].describe() == before


def test_describe_as_acl_list():
    registry = AclRegistry()
    registry.setuser("prod", ["reset", "on", ">pp", "~orders*", "+@write", "+@connection"])
    assert registry.users["prod"].describe() == (
        "user prod on sanitize-payload #" + hashlib.sha256(b"pp").hexdigest()
        + " ~orders* resetchannels -@all +@write +@connection")
    assert registry.default.describe() == "user default on nopass ~* &* +@all"
    registry.setuser("c3", ["+@all", "-flushall", "allkeys"])
    assert registry.users["c3"].describe() == "user c3 off ~* resetchannels +@all -flushall"


def test_requirepass_sets_the_default_users_password():
    registry = AclRegistry(requirepass="pw")
    assert not registry.default_authenticated()
    assert registry.authenticate(b"default", b"pw") is registry.default
    registry.set_requirepass("")
    assert registry.default_authenticated()


def test_dispatcher_refuses_restricted_clients_and_fails_their_exec():
    state, d, ctx = make()
    state.acl.setuser("r", ["on", "nopass", "~*", "+@read", "+@connection", "+@transaction"])
    state.acl.login(ctx.client, state.acl.users["r"])
    assert ctx.client.acl is state.acl.users["r"]
    assert d.call(ctx, [b"PING"]) == "PONG"
    assert d.call(ctx, [b"XADD", b"k", b"*", b"a", b"1"]).code == "NOPERM"
    d.call(ctx, [b"MULTI"])
    assert d.call(ctx, [b"XADD", b"k", b"*", b"a", b"1"]).code == "NOPERM"
    assert d.call(ctx, [b"EXEC"]).code == "EXECABORT"
    assert state.stats.errors["NOPERM"] == 2
