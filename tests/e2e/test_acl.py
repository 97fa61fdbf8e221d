"""ACL users end to end, and differentially against a real redis-server 7.0.

The same users are created on both servers; the same raw requests must get
the same bytes back (NOPERM / NOAUTH / WRONGPASS texts, ACL LIST lines, ACL
GETUSER's shape). Partita-only behaviour (hashed storage, clients of a deleted
user, requirepass as the default user's password, aclfile) is tested alone.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from pathlib import Path

import pytest
import redis

from tests.conftest import REDIS_SERVER, PartitaProcess, RawConn, free_port, partita_command, raw_exchange
from tests.e2e.groups_support import Resp

# A producer that may only write, a consumer that may only read, both on orders*.
SETUP = [
    b"ACL SETUSER prod reset on >pp ~orders* +@write +@connection",
    b"ACL SETUSER cons reset on >cc ~orders* +@read +@connection",
    b"ACL SETUSER gone reset off >xx +@all ~*",
    b"ACL SETUSER cmds reset on nopass -@all +xadd +xlen allkeys",
]


def _setup(port: int) -> None:
    with RawConn(port) as conn:
        for line in SETUP:
            assert conn.request(line + b"\r\n") == b"+OK\r\n", line


@pytest.fixture(scope="module")
def pair(partita_shared, redis_server):
    _setup(partita_shared.port)
    _setup(redis_server.port)
    with RawConn(redis_server.port) as conn:
        conn.request(b"DEL orders other\r\nXADD orders 1-1 a 1\r\n", replies=2)
    with RawConn(partita_shared.port) as conn:
        conn.request(b"DEL orders other\r\nXADD orders 1-1 a 1\r\n", replies=2)
    return partita_shared, redis_server


def _inline(*lines: bytes) -> bytes:
    return b"".join(line + b"\r\n" for line in lines)


@pytest.mark.parametrize(
    "payload",
    [
        # the producer: writes to its keys only, reads nothing
        _inline(b"AUTH prod pp", b"XADD orders 2-1 a 1", b"XADD orders 2-1 a 1", b"XADD other 1-1 a 1", b"XRANGE orders - +",
                b"XLEN orders", b"CONFIG GET maxclients", b"ACL WHOAMI", b"DEL orders-none"),
        # the consumer: reads its keys only, writes nothing
        _inline(b"AUTH cons cc", b"XRANGE orders - + COUNT 1", b"XREAD COUNT 1 STREAMS orders 0",
                b"XREAD STREAMS orders other 0 0", b"XADD orders * a 1", b"XLEN other", b"PING"),
        # single commands
        _inline(b"AUTH cmds anything", b"XLEN orders", b"XADD zzz 1-1 a 1", b"XRANGE orders - +",
                b"DEL zzz", b"ACL WHOAMI"),
        # wrong passwords, unknown and disabled users: one text for all
        _inline(b"AUTH prod bad", b"AUTH nobody x", b"AUTH gone xx", b"AUTH default x", b"ACL WHOAMI"),
        # HELLO AUTH
        _inline(b"HELLO 2 AUTH prod bad", b"HELLO 2 AUTH cons cc", b"XADD orders * a 1", b"ACL WHOAMI"),
        # MULTI with a refused command fails the EXEC; a refused EXEC is EXECABORT
        _inline(b"AUTH cons cc", b"MULTI", b"XLEN orders", b"XADD orders * a 1", b"EXEC"),
        _inline(b"AUTH prod pp", b"MULTI", b"XRANGE orders - +", b"EXEC"),
    ],
    ids=["producer", "consumer", "single-commands", "wrongpass", "hello-auth", "multi-noperm", "exec-noperm"],
)
def test_acl_replies_equal_redis(pair, payload):
    partita, real = pair
    same_reply_but_ids(partita, real, payload)


def same_reply_but_ids(partita, real, payload: bytes) -> None:
    """``same_reply`` with HELLO's client id masked (the servers count clients
    differently), and its version (Partita names Redis 8.10, the reference
    redis-server is 7.0: test_admin_commands.py checks the version)."""
    ours, ours_closed = raw_exchange(partita.port, payload)
    theirs, theirs_closed = raw_exchange(real.port, payload)
    mask = re.compile(rb"(\$2\r\nid\r\n|\+id\r\n):\d+")
    version = re.compile(rb"(\$7\r\nversion\r\n)\$\d+\r\n[0-9.]+\r\n")
    ours, theirs = (version.sub(rb"\1V", mask.sub(rb"\1:N", r)) for r in (ours, theirs))
    assert ours == theirs, f"{payload!r}:\n{ours!r}\n{theirs!r}"
    assert ours_closed == theirs_closed


def test_acl_list_and_getuser_equal_redis(pair):
    partita, real = pair
    for payload in (
        _inline(b"ACL GETUSER prod"),
        _inline(b"ACL GETUSER cons"),
        _inline(b"ACL GETUSER gone"),
        _inline(b"ACL GETUSER nosuchuser"),
        _inline(b"HELLO 3", b"ACL GETUSER prod"),
        _inline(b"ACL USERS"),
        _inline(b"ACL WHOAMI"),
        _inline(b"ACL CAT"),
        _inline(b"ACL CAT nosuch"),
        _inline(b"ACL CAT a b"),
        _inline(b"ACL DELUSER default"),
        _inline(b"ACL SETUSER x badrule"),
        _inline(b"ACL SETUSER x +nocmd"),
        _inline(b"ACL SETUSER x +@nocat"),
        _inline(b"ACL SETUSER x <notapassword"),
        _inline(b"ACL SETUSER x #abc"),
        _inline(b"ACL SETUSER x allkeys ~foo"),
        _inline(b"ACL SETUSER"),
        _inline(b"ACL DRYRUN prod xrange orders - +"),
        _inline(b"ACL DRYRUN prod xadd other * a 1"),
        _inline(b"ACL DRYRUN prod xadd orders * a 1"),
        _inline(b"ACL DRYRUN nobody ping"),
        _inline(b"ACL SAVE"),
        _inline(b"ACL LOAD"),
    ):
        same_reply_but_ids(partita, real, payload)
    # (user cmds: Redis prints several single-command rules in hash order, which varies per run)
    ours = sorted(line for line in partita.client().acl_list() if not line.startswith(("user x ", "user cmds ")))
    theirs = sorted(line for line in real.client().acl_list() if not line.startswith(("user x ", "user cmds ")))
    assert ours == theirs
    with RawConn(partita.port) as conn:
        assert b"\r\n-@all +xadd +xlen\r\n" in conn.request(b"ACL GETUSER cmds\r\n")


def test_acl_cat_stream_lists_the_stream_commands_both_have(pair):
    partita, real = pair
    import server.commands  # noqa: F401  (declares every command)
    from server.registry import DECLARED

    ours = set(partita.client().acl_cat("stream"))
    theirs = set(real.client().acl_cat("stream"))
    # Partita's TOPIC and XGROUP CONFIG are stream commands Redis does not
    # have, and the local redis-server (7.0) lacks Redis 8's.
    newer = {name for name, spec in DECLARED.items() if int(spec.since.split(".")[0]) >= 8}
    assert ours - {n for n in ours if n.startswith("topic")} - {"xgroup|config"} - newer == theirs
    assert "xdelex" in newer


def test_noauth_with_requirepass_equals_redis(partita_factory, redis_server_with_password):
    partita = partita_factory(["--requirepass", "pw"])
    for payload in (
        _inline(b"XLEN orders", b"ACL WHOAMI", b"AUTH default pw", b"ACL WHOAMI"),
        _inline(b"AUTH pw", b"XLEN orders"),
        _inline(b"AUTH wrong", b"AUTH default wrong"),
        _inline(b"HELLO 3", b"HELLO 2 AUTH default pw"),
    ):
        same_reply_but_ids(partita, redis_server_with_password, payload)


def test_passwords_are_stored_as_sha256(partita_server):
    r = partita_server.client(decode_responses=True)
    assert r.execute_command("ACL SETUSER", "alice", "on", ">s3cret", "+@all", "~*")
    digest = hashlib.sha256(b"s3cret").hexdigest()
    user = r.acl_getuser("alice")
    assert user["passwords"] == [digest]
    assert "s3cret" not in " ".join(r.acl_list())
    # a hash given with '#' works as the password it stands for
    r.execute_command("ACL SETUSER", "bob", "on", "#" + hashlib.sha256(b"pw2").hexdigest(), "+@all", "~*")
    assert partita_server.client(username="bob", password="pw2").ping()
    # '<' removes a password; resetpass removes all and requires one again
    r.execute_command("ACL SETUSER", "alice", "<s3cret")
    with pytest.raises(redis.AuthenticationError):
        partita_server.client(username="alice", password="s3cret").ping()


def test_producer_and_consumer_with_redis_py(partita_server):
    admin = partita_server.client()
    admin.execute_command("ACL SETUSER", "producer", "on", ">p", "~orders*", "-@all", "+@write", "+@connection")
    admin.execute_command("ACL SETUSER", "consumer", "on", ">c", "~orders*", "-@all", "+@read", "+@connection")
    producer = partita_server.client(username="producer", password="p")
    consumer = partita_server.client(username="consumer", password="c", protocol=3)
    entry_id = producer.xadd("orders", {"item": "book"})
    assert consumer.xrange("orders") == [(entry_id, {b"item": b"book"})]
    with pytest.raises(redis.exceptions.NoPermissionError, match="no permissions to run the 'xrange'"):
        producer.xrange("orders")
    with pytest.raises(redis.exceptions.NoPermissionError, match="no permissions to run the 'xadd'"):
        consumer.xadd("orders", {"a": "1"})
    with pytest.raises(redis.exceptions.NoPermissionError, match="one of the keys"):
        producer.xadd("payments", {"a": "1"})
    # a change to a user reaches its connected clients at once
    admin.execute_command("ACL SETUSER", "producer", "+xrange")
    assert producer.xrange("orders") == [(entry_id, {b"item": b"book"})]
    admin.execute_command("ACL SETUSER", "producer", "-@all")
    with pytest.raises(redis.exceptions.NoPermissionError):
        producer.xadd("orders", {"a": "1"})


def test_deleting_a_user_closes_its_clients(partita_server):
    admin = partita_server.client()
    admin.execute_command("ACL SETUSER", "temp", "on", ">t", "+@all", "~*")
    with RawConn(partita_server.port) as conn:
        assert conn.request(b"AUTH temp t\r\n") == b"+OK\r\n"
        assert admin.execute_command("ACL DELUSER", "temp", "nosuch") == 1
        conn.sock.settimeout(5)
        assert conn.sock.recv(100) == b""  # closed by the server
    assert "temp" not in partita_server.client(decode_responses=True).acl_users()


def test_requirepass_is_the_default_users_password(partita_server):
    r = partita_server.client(decode_responses=True)
    assert r.acl_getuser("default")["flags"] == ["on", "nopass"]
    r.config_set("requirepass", "pw")
    assert "nopass" not in r.acl_getuser("default")["flags"]
    assert r.acl_getuser("default")["passwords"] == [hashlib.sha256(b"pw").hexdigest()]
    reply, _ = raw_exchange(partita_server.port, b"XLEN k\r\nAUTH pw\r\nXLEN k\r\n")
    assert reply.startswith(b"-NOAUTH Authentication required.\r\n+OK\r\n:0\r\n")
    r.config_set("requirepass", "")
    reply, _ = raw_exchange(partita_server.port, b"XLEN k\r\n")
    assert reply == b":0\r\n"


def test_restricted_default_user_applies_to_new_connections(partita_server):
    r = partita_server.client()
    r.execute_command("ACL SETUSER", "admin", "on", ">a", "+@all", "~*")
    r.execute_command("ACL SETUSER", "default", "-@all", "+@read", "+@connection")
    reply, _ = raw_exchange(partita_server.port, b"XLEN k\r\nXADD k * a 1\r\n")
    assert reply == b":0\r\n-NOPERM this user has no permissions to run the 'xadd' command\r\n"
    # RESET logs the client back in as the (restricted) default user
    reply, _ = raw_exchange(partita_server.port, b"AUTH admin a\r\nXADD k 1-1 a 1\r\nRESET\r\nXADD k * a 1\r\n")
    assert reply.endswith(b"+RESET\r\n-NOPERM this user has no permissions to run the 'xadd' command\r\n")


def test_aclfile_save_and_load(partita_factory, tmp_path):
    aclfile = tmp_path / "users.acl"
    aclfile.write_text("user default on nopass ~* &* +@all\nuser reader on #%s ~logs* resetchannels -@all +@read\n"
                       % hashlib.sha256(b"r").hexdigest())
    server = partita_factory(["--aclfile", str(aclfile)])
    r = server.client(decode_responses=True)
    assert sorted(r.acl_users()) == ["default", "reader"]
    assert server.client(username="reader", password="r").xlen("logs") == 0
    r.execute_command("ACL SETUSER", "writer", "on", ">w", "~logs*", "+@write")
    assert r.execute_command("ACL SAVE")
    assert "user writer on #" in aclfile.read_text()
    server.restart()
    r = server.client(decode_responses=True)
    assert sorted(r.acl_users()) == ["default", "reader", "writer"]
    aclfile.write_text("user default on nopass ~* &* +@all\nuser broken on +nosuchcommand\n")
    with pytest.raises(redis.ResponseError):
        r.execute_command("ACL LOAD")
    assert sorted(r.acl_users()) == ["default", "reader", "writer"]  # all or nothing


def test_users_live_in_memory_without_aclfile(partita_server):
    r = partita_server.client()
    r.execute_command("ACL SETUSER", "ephemeral", "on", "nopass")
    partita_server.restart()
    assert partita_server.client(decode_responses=True).acl_users() == ["default"]


# -- keys named by options (issue 28, finding 2) ---------------------------------


NOPERM_KEY = b"-NOPERM this user has no permissions to access one of the keys used as arguments\r\n"


def _bulk(text: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(text), text)


def test_dead_letter_keys_must_match_the_users_key_patterns(partita_server):
    admin = partita_server.client()
    admin.execute_command("ACL SETUSER", "app", "on", ">pw", "~orders*", "+@all")
    admin.xadd("orders", {"item": "book"}, id="1-1")
    # A group the admin dead-letters to a key the user may not write.
    admin.execute_command("XGROUP", "CREATE", "orders", "audit", "0", "MAXDELIVERIES", "3", "DEADLETTER", "payments")
    app = Resp(partita_server.port)
    assert app.call("AUTH", "app", "pw") == b"+OK\r\n"
    for argv in (
        ("XGROUP", "CREATE", "orders", "g1", "0", "MAXDELIVERIES", "1", "DEADLETTER", "payments"),
        ("XGROUP", "CREATE", "orders", "g1", "0", "MKSTREAM", "MAXDELIVERIES", "1", "DEADLETTER", "payments"),
        ("XGROUP", "CONFIG", "orders", "audit", "MAXDELIVERIES", "1", "DEADLETTER", "payments"),
        # without DEADLETTER, CONFIG keeps the group's key: this user's reads would write it
        ("XGROUP", "CONFIG", "orders", "audit", "MAXDELIVERIES", "1"),
    ):
        assert app.call(*argv) == NOPERM_KEY, argv
    assert app.call("ACL", "DRYRUN", "app", "XGROUP", "CREATE", "orders", "g1", "0", "MAXDELIVERIES", "1",
                    "DEADLETTER", "payments") == _bulk(b"This user has no permissions to access the 'payments' key")
    # Queued in MULTI: refused when given, so the EXEC fails.
    assert app.call("MULTI") == b"+OK\r\n"
    assert app.call("XGROUP", "CREATE", "orders", "g1", "0", "MAXDELIVERIES", "1",
                    "DEADLETTER", "payments") == NOPERM_KEY
    assert app.call("EXEC").startswith(b"-EXECABORT")
    # The reads of the refused group cannot move anything to payments.
    assert app.call("XREADGROUP", "GROUP", "g1", "c", "STREAMS", "orders", ">").startswith(b"-NOGROUP")
    # A dead-letter key the patterns allow is fine.
    assert app.call("XGROUP", "CREATE", "orders", "g2", "0", "MAXDELIVERIES", "1",
                    "DEADLETTER", "orders-dlq") == b"+OK\r\n"
    assert app.call("XGROUP", "CONFIG", "orders", "g2", "MAXDELIVERIES", "2") == b"+OK\r\n"
    app.close()
    assert admin.exists("payments") == 0
    assert admin.execute_command("XINFO", "GROUPS", "orders")[0][b"max-deliveries"] == 3


# -- EXEC checks the queued commands again (finding 3) ------------------------------


def _exec_after_narrowing(server, user: str, keys: tuple[str, str]) -> list[bytes]:
    """Queue commands as ``user``, let an admin narrow the user, then EXEC;
    the raw replies of every step."""
    mine, theirs = keys
    admin = Resp(server.port)
    admin.call("DEL", mine, theirs)
    admin.call("ACL", "SETUSER", user, "reset", "on", ">p", f"~{mine}*", f"~{theirs}*", "+@all")
    conn = Resp(server.port)
    out = [conn.call("AUTH", user, "p"), conn.call("MULTI")]
    for argv in (("XADD", mine, "1-1", "a", "1"), ("XADD", theirs, "1-1", "a", "1"),
                 ("XLEN", theirs), ("XLEN", mine), ("PING",)):
        out.append(conn.call(*argv))
    admin.call("ACL", "SETUSER", user, "resetkeys", f"~{mine}*", "-ping")
    out.append(conn.call("EXEC"))
    # A command queued while allowed and forbidden before EXEC.
    out.append(conn.call("MULTI"))
    out.append(conn.call("XLEN", mine))
    admin.call("ACL", "SETUSER", user, "-xlen")
    out.append(conn.call("EXEC"))
    out.append(conn.call("EXISTS", theirs))
    conn.close()
    out.append(admin.call("EXISTS", theirs))
    admin.close()
    return out


def test_exec_checks_acls_again_as_redis_does(partita_server, redis_server):
    keys = ("exec-mine", "exec-theirs")
    ours = _exec_after_narrowing(partita_server, "narrowed", keys)
    theirs = _exec_after_narrowing(redis_server, "narrowed", keys)
    assert ours == theirs
    assert ours[7].startswith(b"*5\r\n$3\r\n1-1\r\n-NOPERM ACLs rules changed between the moment the transaction "
                              b"was accumulated and the EXEC call. This command is no longer allowed for the "
                              b"following reason: no permission to touch the specified keys\r\n")
    assert ours[-1] == b":0\r\n"  # the refused XADD did not run


# -- ACL rules and user names (finding 4) ------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ("ACL", "SETUSER", "inj", "on", ">pw", "~ok\nuser evil on nopass ~* &* +@all"),
        ("ACL", "SETUSER", "a b", "on"),
        ("ACL", "SETUSER", "a\nb", "on"),
        ("ACL", "SETUSER", "a\tb", "on"),
        ("ACL", "SETUSER", b"a\x00b", "on"),
        ("ACL", "SETUSER", "inj", "~a b"),
        ("ACL", "SETUSER", "inj", "~a\tb"),
        ("ACL", "SETUSER", "inj", b"~a\x00b"),
        ("ACL", "SETUSER", "inj", "allkeys", "~a b"),
        ("ACL", "SETUSER", "inj", "resetchannels", "&a b"),
        ("ACL", "SETUSER", "inj", "&*", "&foo"),
        ("ACL", "SETUSER", "inj", "+xadd\r\nfoo"),
        ("ACL", "SETUSER", "inj", b"bad\x00x"),
        ("ACL", "SETUSER", "inj2", "on", "", "~x"),
        ("ACL", "SETUSER", "inj3", "on", ">pass word", ">pa\nss", "~a\"b", "~'k"),
        ("ACL", "SETUSER", "\"quoted", "on"),
    ],
)
def test_setuser_refuses_what_redis_refuses(partita_server, redis_server, argv):
    ours, theirs = Resp(partita_server.port), Resp(redis_server.port)
    assert ours.call(*argv) == theirs.call(*argv)
    ours.close()
    theirs.close()


def test_a_saved_aclfile_loads_again_whatever_names_and_patterns_were_accepted(partita_factory, tmp_path):
    aclfile = tmp_path / "users.acl"
    aclfile.write_text("")  # the aclfile must exist (as in Redis); empty, it holds no users
    server = partita_factory(["--aclfile", str(aclfile)])
    admin = Resp(server.port)
    assert admin.call("ACL", "SETUSER", "app", "on", ">pw", "~ok\nuser evil on nopass ~* &* +@all").startswith(b"-ERR")
    # Accepted by Redis too: quotes and control characters other than whitespace.
    for argv in (("ACL", "SETUSER", "\"evil", "on", "nopass", "~'k", "+@all"),
                 ("ACL", "SETUSER", "ev\"il", "on", "nopass", "~\"k", "+@all"),
                 ("ACL", "SETUSER", "ctl\x01", "on", "nopass", "~\x01k", "+@all")):
        assert admin.call(*argv) == b"+OK\r\n", argv
    assert admin.call("ACL", "SAVE") == b"+OK\r\n"
    before = admin.value("ACL", "LIST")
    assert admin.call("ACL", "LOAD") == b"+OK\r\n"
    admin.close()
    server.restart()
    admin = Resp(server.port)
    assert admin.value("ACL", "LIST") == before
    assert b"evil " not in b" ".join(before).replace(b"\"evil", b"")
    admin.close()


def _start_output(command: list[str], cwd: Path) -> tuple[int, str]:
    """A server process that should refuse to start: its exit code and what it wrote."""
    proc = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    return proc.returncode, proc.stdout + proc.stderr


def test_a_bad_aclfile_stops_the_start_naming_the_file_and_line(tmp_path):
    aclfile = tmp_path / "users.acl"
    aclfile.write_text("user default on nopass ~* &* +@all\nuser x on ~a\tb\nuser \"y on\n")
    code, output = _start_output(partita_command() + ["--port", "0", "--dir", str(tmp_path / "data"),
                                                      "--aclfile", str(aclfile)], tmp_path)
    assert code == 1, output
    assert f"{aclfile}:2: Syntax error." in output
    assert "Traceback" not in output
    assert "Ready to accept connections" not in output


def test_a_missing_aclfile_stops_the_start_as_redis_does_before_the_data_dir_is_touched(tmp_path):
    if not os.path.exists(REDIS_SERVER):
        pytest.skip(f"redis-server not found at {REDIS_SERVER}")
    aclfile = tmp_path / "missing.acl"
    theirs, their_output = _start_output([REDIS_SERVER, "--port", str(free_port()), "--bind", "127.0.0.1",
                                          "--save", "", "--appendonly", "no", "--dir", str(tmp_path),
                                          "--aclfile", str(aclfile)], tmp_path)
    ours, output = _start_output(partita_command() + ["--port", "0", "--dir", str(tmp_path / "data"),
                                                      "--aclfile", str(aclfile)], tmp_path)
    why = f"because of ACL errors: Error loading ACLs, opening file '{aclfile}': No such file or directory"
    assert (theirs, f"Aborting Redis startup {why}" in their_output) == (1, True), their_output
    assert (ours, f"Aborting Partita startup {why}" in output) == (1, True), output
    assert "Traceback" not in output and "Ready to accept connections" not in output
    assert not (tmp_path / "data").exists()


# What ACL LOAD reads at runtime; every server starts from GOOD_ACLFILE before each.
GOOD_ACLFILE = "user default on nopass ~* &* +@all\nuser keep on >pw ~k* +@read\n"
LOADED_FILES = {
    "missing": None,
    "malformed-rule": "user default on nopass ~* &* +@all\nuser bob on >p ~a\tb +@all\n",
    "unknown-rule": "user default on nopass ~* &* +@all\nuser bob on frobnicate +@all\n",
    "unknown-command": "user default on nopass ~* &* +@all\nuser bob on +nosuch -@nocat\n",
    "duplicate-user": "user default on nopass ~* &* +@all\nuser bob on\nuser bob off\n",
    "not-a-user-line": "user default on nopass ~* &* +@all\nusers bob on\nbob\nuser\n",
    "several-errors": "user default on nopass ~* &* +@all\nuser bob on ~* ~x +nosuch foo #abc\nxx\nuser bob on\n",
    "bad-username": "user default on nopass ~* &* +@all\nuser b\x0bob on\n",
    "empty": "",
    "crlf": "user default on nopass ~* &* +@all\r\nuser bob on >p ~k* +@read\r\n",
    "no-default-user": "user bob on nopass ~* +@all\n",
}


@pytest.fixture(scope="module")
def acl_load_pair(tmp_path_factory, redis_server_with_aclfile):
    aclfile = tmp_path_factory.mktemp("partita-acl") / "users.acl"
    aclfile.write_text(GOOD_ACLFILE)
    partita = PartitaProcess(aclfile.parent / "data", ["--aclfile", str(aclfile)]).start()
    partita.aclfile = aclfile
    yield partita, redis_server_with_aclfile
    partita.stop()


@pytest.mark.parametrize("name", list(LOADED_FILES))
def test_acl_load_replies_and_keeps_users_as_redis_does(acl_load_pair, name):
    """Redis's reply, the file's path aside; on any error no user changes."""
    answers = []
    for server in acl_load_pair:
        conn = Resp(server.port)
        server.aclfile.write_text(GOOD_ACLFILE)
        assert conn.call("ACL", "LOAD") == b"+OK\r\n"
        content = LOADED_FILES[name]
        if content is None:
            server.aclfile.unlink()
        else:
            server.aclfile.write_bytes(content.encode())
        reply = conn.call("ACL", "LOAD").replace(str(server.aclfile).encode(), b"<aclfile>")
        answers.append((reply, conn.call("ACL", "LIST")))
        conn.close()
    assert answers[0] == answers[1]


def test_a_failed_acl_save_answers_as_redis_does(acl_load_pair):
    answers = []
    for server in acl_load_pair:
        server.aclfile.unlink()
        (server.aclfile / "in-the-way").mkdir(parents=True)  # the rename onto it fails
        conn = Resp(server.port)
        answers.append(conn.call("ACL", "SAVE"))
        conn.close()
        (server.aclfile / "in-the-way").rmdir()
        server.aclfile.rmdir()
        server.aclfile.write_text(GOOD_ACLFILE)
    assert answers[0] == answers[1]


def test_acl_load_closes_only_the_clients_of_users_the_file_no_longer_has(partita_factory, tmp_path):
    # Redis 7.2+ (redis/redis#12171); 7.0.15 closed every client of a user other than default.
    aclfile = tmp_path / "users.acl"
    aclfile.write_text("user default on nopass ~* &* +@all\nuser kept on >pw ~* +@all\nuser gone on >pw ~* +@all\n")
    server = partita_factory(["--aclfile", str(aclfile)])
    with RawConn(server.port) as kept, RawConn(server.port) as gone:
        assert kept.request(b"AUTH kept pw\r\n") == gone.request(b"AUTH gone pw\r\n") == b"+OK\r\n"
        aclfile.write_text("user default on nopass ~* &* +@all\nuser kept on >pw ~k* +@all\n")
        assert kept.request(b"ACL LOAD\r\n") == b"+OK\r\n"
        assert kept.request(b"XLEN other\r\n") == NOPERM_KEY  # the file's rules, at once
        gone.sock.settimeout(5)
        assert gone.sock.recv(100) == b""  # closed by the server


# -- listing key names, writing every key (finding 5) --------------------------------------


def test_a_restricted_user_lists_only_the_keys_its_patterns_allow(partita_server):
    admin = Resp(partita_server.port)
    for topic in ("orders", "orders-eu", "payments"):
        assert admin.call("TOPIC", "CREATE", topic) == b"+OK\r\n"
    admin.call("ACL", "SETUSER", "app", "on", ">pw", "~orders*", "+@all")
    admin.call("ACL", "SETUSER", "safe", "on", ">pw", "~orders*", "+@all", "-@dangerous")
    # TOPIC LIST sits with KEYS: @keyspace @read @slow @dangerous
    for category in ("keyspace", "read", "slow", "dangerous"):
        assert b"topic|list" in admin.call("ACL", "CAT", category), category
    assert b"topic|list" not in admin.call("ACL", "CAT", "stream")
    app = Resp(partita_server.port)
    app.call("AUTH", "app", "pw")
    assert app.value("TOPIC", "LIST") == [b"orders", b"orders-eu"]
    assert app.value("TOPIC", "LIST", "*s") == [b"orders"]
    assert app.value("KEYS", "*") == [b"orders", b"orders-eu"]
    assert sorted(app.value("SCAN", "0", "COUNT", "100")[1]) == [b"orders", b"orders-eu"]
    # A command that writes every key needs every key.
    assert app.call("FLUSHALL") == NOPERM_KEY
    assert app.call("FLUSHDB") == NOPERM_KEY
    assert app.call("ACL", "DRYRUN", "app", "FLUSHALL") == _bulk(
        b"This user has no permissions to access one of the keys used as arguments")
    app.close()
    safe = Resp(partita_server.port)
    safe.call("AUTH", "safe", "pw")
    assert safe.call("TOPIC", "LIST") == b"-NOPERM this user has no permissions to run the 'topic|list' command\r\n"
    safe.close()
    assert admin.value("TOPIC", "LIST") == [b"orders", b"orders-eu", b"payments"]  # the default user sees all
    admin.close()
