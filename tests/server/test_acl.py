"""ACL users, rules and the dispatcher's check, and the SCRAM secrets users keep for the Kafka
port, without sockets (server/acl.py)."""

from __future__ import annotations

import hashlib
import os
import stat

import pytest

import server.commands  # noqa: F401  (registers every command)
from server.acl import AclError, AclRegistry, User, category_members, check, hash_password, scram_secret
from server.config import Config
from server.dispatch import Context, Dispatcher
from server.registry import DECLARED
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
    xadd, xrange = DECLARED["xadd"], DECLARED["xrange"]
    assert check(reader, xrange, [b"XRANGE", b"k", b"-", b"+"]) is None
    assert check(reader, xadd, [b"XADD", b"k", b"*", b"a", b"1"]).line == (
        "NOPERM this user has no permissions to run the 'xadd' command")
    assert check(writer, xadd, [b"XADD", b"k", b"*", b"a", b"1"]) is None
    assert check(writer, xrange, [b"XRANGE", b"k", b"-", b"+"]) is not None
    assert "xreadgroup" in category_members("write") and "xread" in category_members("read")


def test_key_patterns_use_the_commands_key_positions():
    u = user("on", "nopass", "~orders*", "+@all")
    xread = DECLARED["xread"]
    assert check(u, xread, [b"XREAD", b"STREAMS", b"orders", b"orders#2", b"0", b"0"]) is None
    denied = check(u, xread, [b"XREAD", b"COUNT", b"1", b"STREAMS", b"orders", b"other", b"0", b"0"])
    assert denied.line == "NOPERM this user has no permissions to access one of the keys used as arguments"
    # keyless commands need no pattern
    assert check(u, DECLARED["ping"], [b"PING"]) is None


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


# -- issue 28 -------------------------------------------------------------------------


def test_names_and_patterns_that_the_aclfile_cannot_keep_are_refused():
    registry = AclRegistry()
    for name in ("a b", "a\nb", "a\tb", "a\rb", "a\x0bb", "a\x0cb", "a\x00b"):
        with pytest.raises(AclError, match="^Usernames can't contain spaces or null characters$"):
            registry.setuser(name, ["on"])
    for rule in ("~a b", "~ok\nuser evil on nopass ~* +@all", "&a b", "~a\x00b"):
        with pytest.raises(AclError, match="Syntax error$"):
            registry.setuser("u", [rule])
    with pytest.raises(AclError, match="^Error in ACL SETUSER modifier '~a': Syntax error$"):
        registry.setuser("u", ["~a\x00b"])  # shown as Redis shows it, a C string
    # What Redis keeps: other control characters, quotes, bytes past ASCII.
    registry.setuser("q\"x\x01\x85", ["on", "~'k\x01", "", ">pass word"])
    assert registry.users["q\"x\x01\x85"].key_patterns == [b"'k\x01"]
    assert set(registry.users) == {"default", "q\"x\x01\x85"}


def test_aclfile_errors_as_redis_7_0_reports_them(tmp_path):
    # The texts are redis-server 7.0.15's for the same file (ACL LOAD).
    path = tmp_path / "users.acl"
    path.write_text("user default on nopass ~* &* +@all\n"
                    "user\tx on\n"
                    "user a on ~a\tb ~c\td\n"
                    "user b on +nosuch -nosuch2\n"
                    "user b on\n"
                    "user\n")
    registry = AclRegistry()
    with pytest.raises(AclError) as raised:
        registry.load(str(path))
    assert raised.value.message == (
        f"{path}:2 should start with user keyword followed by the username. "
        f"{path}:3: Syntax error. "
        f"{path}:4: Error in applying operation '+nosuch': Unknown command or category name in ACL. "
        f"{path}:4: Error in applying operation '-nosuch2': Unknown command or category name in ACL. "
        "WARNING: Duplicate user 'b' found on line 5. "
        f"{path}:6 should start with user keyword followed by the username. "
        "WARNING: ACL errors detected, no change to the previously active ACL rules was performed")
    assert set(registry.users) == {"default"}


def test_aclfile_lines_split_at_spaces_as_redis_splits_them(tmp_path):
    path = tmp_path / "users.acl"
    path.write_text("  user \"evil on nopass ~'k +@all\r\n\n# a comment (Partita)\nuser a  on\t\n")
    registry = AclRegistry(aclfile=str(path))
    assert set(registry.users) == {"default", "\"evil", "a"}
    assert registry.users["\"evil"].key_patterns == [b"'k"] and registry.users["a"].enabled
    registry.save(str(path))
    assert AclRegistry(aclfile=str(path)).dump() == registry.dump()


def test_a_bad_aclfile_stops_the_registry_at_start(tmp_path):
    path = tmp_path / "users.acl"
    path.write_text("user x on ~a\tb\n")
    with pytest.raises(AclError, match=f"^Aborting Partita startup because of ACL errors: {path}:1: Syntax error"):
        AclRegistry(aclfile=str(path))


def test_a_missing_aclfile_stops_the_registry_at_start(tmp_path):
    # As redis-server 7.0.15: the aclfile must exist (an empty file holds no users).
    path = tmp_path / "users.acl"
    with pytest.raises(AclError) as raised:
        AclRegistry(aclfile=str(path))
    assert raised.value.message == ("Aborting Partita startup because of ACL errors: "
                                     f"Error loading ACLs, opening file '{path}': No such file or directory")
    path.write_text("")
    assert set(AclRegistry(aclfile=str(path)).users) == {"default"}


def test_acl_load_of_a_missing_aclfile_keeps_every_user(tmp_path):
    path = tmp_path / "users.acl"
    path.write_text("user default on nopass ~* &* +@all\nuser a on nopass ~* +@all\n")
    registry = AclRegistry(aclfile=str(path))
    before = registry.dump()
    path.unlink()
    with pytest.raises(AclError) as raised:
        registry.load(str(path))  # ACL LOAD
    assert raised.value.message == f"Error loading ACLs, opening file '{path}': No such file or directory"
    assert registry.dump() == before


def test_a_directory_as_aclfile_is_refused(tmp_path):
    # Redis 7.0 reads a directory as an empty file: ACL LOAD would drop every user.
    registry = AclRegistry()
    registry.setuser("a", ["on", "nopass"])
    with pytest.raises(AclError) as raised:
        registry.load(str(tmp_path))
    assert raised.value.message == f"Error loading ACLs, opening file '{tmp_path}': Is a directory"
    assert set(registry.users) == {"default", "a"}


def test_a_failed_acl_save_answers_redis_text_and_logs_why(tmp_path, caplog):
    registry = AclRegistry()
    path = tmp_path / "users.acl"
    (path / "in-the-way").mkdir(parents=True)  # a rename onto a non-empty directory fails
    with caplog.at_level("WARNING", logger="partita.acl"), pytest.raises(AclError) as raised:
        registry.save(str(path))
    assert raised.value.message == ("There was an error trying to save the ACLs. Please check the server logs "
                                    "for more information")
    assert [r.getMessage() for r in caplog.records] == ["Renaming ACL file for ACL SAVE: Is a directory"]
    assert sorted(os.listdir(tmp_path)) == ["users.acl", "users.acl.scram"]  # no temporary file left


def test_keys_named_by_options_are_checked_like_key_arguments():
    u = user("on", "nopass", "~orders*", "+@all")
    create = DECLARED["xgroup"].subcommands["create"]
    config = DECLARED["xgroup"].subcommands["config"]
    ok = [b"XGROUP", b"CREATE", b"orders", b"g", b"0", b"MKSTREAM", b"MAXDELIVERIES", b"1",
          b"DEADLETTER", b"orders-dlq"]
    assert check(u, create, ok) is None
    bad = ok[:-1] + [b"payments"]
    assert check(u, create, bad).line == ("NOPERM this user has no permissions to access one of the keys "
                                          "used as arguments")
    assert check(u, config, [b"XGROUP", b"CONFIG", b"orders", b"g", b"DEADLETTER", b"x",
                             b"MAXDELIVERIES", b"1"]) is not None
    # They are not key arguments: COMMAND GETKEYS and routing do not see them.
    assert create.key_indexes(bad) == [2]


def test_only_keyspace_commands_that_write_every_key_need_allkeys():
    u = user("on", "nopass", "~orders*", "+@all")
    specs = [spec for top in DECLARED.values() for spec in [top, *top.subcommands.values()]
             if spec.handler is not None and spec.first_key <= 0 and spec.key_finder is None]
    needs_all = sorted(spec.name for spec in specs if check(u, spec, spec.name.encode().split(b"|")) is not None)
    assert needs_all == ["flushall", "flushdb"]


def test_exec_checks_each_queued_command_again(tmp_path):
    from cluster.topics import TopicRegistry

    state, d, ctx = make()
    state.config.dir = str(tmp_path)
    state.topics = TopicRegistry.open(tmp_path, state.config)
    state.acl.setuser("r", ["on", "nopass", "~a*", "~b*", "+@all"])
    state.acl.login(ctx.client, state.acl.users["r"])
    d.call(ctx, [b"MULTI"])
    d.call(ctx, [b"XADD", b"a", b"1-1", b"f", b"v"])
    d.call(ctx, [b"XADD", b"b", b"1-1", b"f", b"v"])
    d.call(ctx, [b"PING"])
    state.acl.setuser("r", ["resetkeys", "~a*", "-ping"])
    state.acl.refresh_clients([ctx.client])
    replies = d.call(ctx, [b"EXEC"])
    prefix = ("ACLs rules changed between the moment the transaction was accumulated and the EXEC call. "
              "This command is no longer allowed for the following reason: ")
    assert replies[0] == b"1-1"
    assert replies[1].line == "NOPERM " + prefix + "no permission to touch the specified keys"
    assert replies[2].line == "NOPERM " + prefix + "no permission to execute the command or subcommand"
    assert state.topics.exists(b"a") and not state.topics.exists(b"b")
    state.topics.close()


# -- SCRAM secrets (docs/security.md "SCRAM secrets") -------------------------------------


def test_secrets_follow_the_passwords():
    acl = AclRegistry("first")
    default = acl.default
    assert list(default.scram) == [hash_password(b"first")]
    acl.set_requirepass("second")  # CONFIG SET requirepass
    assert list(default.scram) == [hash_password(b"second")]
    acl.setuser("u", ["on", ">a", ">b"])
    user = acl.users["u"]
    assert list(user.scram) == [hash_password(b"a"), hash_password(b"b")]
    assert len({s.salt for s in user.scram.values()}) == 1
    for rules, left in ((["!" + hash_password(b"a")], [b"b"]), (["nopass"], []), ([">c"], [b"c"]),
                        (["resetpass"], []), ([">d"], [b"d"]), (["reset"], [])):
        acl.setuser("u", rules)
        assert list(user.scram) == [hash_password(p) for p in left], rules
    acl.setuser("u", [">e"])
    with pytest.raises(Exception):
        acl.setuser("u", ["resetpass", "bogus-rule"])  # refused: the user keeps its password and secret
    assert list(user.scram) == [hash_password(b"e")] and user.passwords == [hash_password(b"e")]


def test_acl_save_keeps_the_secrets_beside_the_aclfile_and_acl_load_reads_them(tmp_path):
    path = str(tmp_path / "users.acl")
    (tmp_path / "users.acl").write_text("")  # an aclfile must exist, empty at first (as Redis)
    acl = AclRegistry("", path)
    acl.setuser("alice", ["on", ">wonderland", "~*", "+@all"])
    acl.save(path)
    saved = (tmp_path / "users.acl").read_text()
    assert "wonderland" not in saved and "#" + hash_password(b"wonderland") in saved
    scram_file = tmp_path / "users.acl.scram"
    assert stat.S_IMODE(os.stat(scram_file).st_mode) == 0o600
    assert "wonderland" not in scram_file.read_text()
    reloaded = AclRegistry("", path)  # a restart
    secret = reloaded.users["alice"].scram[hash_password(b"wonderland")]
    assert secret == acl.users["alice"].scram[hash_password(b"wonderland")]
    assert secret == scram_secret(b"wonderland", secret.salt, 4096)
    # a secret whose password is gone from the aclfile is not taken; a damaged line is skipped
    (tmp_path / "users.acl").write_text("user alice on #" + hash_password(b"other") + " ~* +@all\n")
    with scram_file.open("a") as f:
        f.write("scram-sha-256 alice not-a-line\n")
    reloaded.load(path)  # ACL LOAD
    assert reloaded.users["alice"].scram == {}
