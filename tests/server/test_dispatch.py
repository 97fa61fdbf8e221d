"""The dispatcher: lookup, Redis's errors, NOAUTH, MULTI/EXEC/WATCH, without sockets."""

from __future__ import annotations

import pytest

import server.commands  # noqa: F401  (registers every command)
from server.config import Config
from server.dispatch import Context, Dispatcher
from server.errors import CommandError
from server.registry import client_table, command
from server.reply import NULL_ARRAY, OK, QUEUED, encode
from server.state import ServerState


def make(requirepass: str = "", commands: dict | None = None):
    """A state, a dispatcher (``commands``: the test's own, added to its
    table) and a client's context."""
    config = Config()
    config.requirepass = requirepass
    state = ServerState(config)
    table = client_table()
    table.commands.update(commands or {})
    dispatcher = Dispatcher(state, table)
    client = state.new_client("127.0.0.1:1", "127.0.0.1:6379")
    return state, dispatcher, Context(state, client, dispatcher)


def line(reply) -> bytes:
    return encode(reply, 2)


def test_unknown_command_text_matches_redis():
    _, d, ctx = make()
    assert line(d.call(ctx, [b"foo", b"a", b"b"])) == (
        b"-ERR unknown command 'foo', with args beginning with: 'a' 'b' \r\n"
    )
    assert line(d.call(ctx, [b"foo"])) == b"-ERR unknown command 'foo', with args beginning with: \r\n"


def test_unknown_command_args_are_cut_near_128_chars():
    _, d, ctx = make()
    reply = d.call(ctx, [b"foo"] + [b"x" * 100] * 5)
    assert reply.message.count("'x") == 2


def test_wrong_arity_names_the_command_and_subcommand():
    _, d, ctx = make()
    assert d.call(ctx, [b"ECHO"]).message == "wrong number of arguments for 'echo' command"
    assert d.call(ctx, [b"client", b"id", b"x"]).message == "wrong number of arguments for 'client|id' command"
    assert d.call(ctx, [b"client"]).message == "wrong number of arguments for 'client' command"


def test_unknown_subcommand():
    _, d, ctx = make()
    assert d.call(ctx, [b"client", b"foo"]).message == "unknown subcommand 'foo'. Try CLIENT HELP."
    assert d.call(ctx, [b"config", b"x"]).message == "unknown subcommand 'x'. Try CONFIG HELP."


def test_command_names_are_case_insensitive():
    _, d, ctx = make()
    assert d.call(ctx, [b"PiNg"]) == "PONG"
    assert d.call(ctx, [b"CLIENT", b"Id"]) == ctx.client.id


def test_noauth_until_auth_and_no_auth_commands_pass():
    state, d, ctx = make(requirepass="secret")
    assert line(d.call(ctx, [b"PING"])) == b"-NOAUTH Authentication required.\r\n"
    assert line(d.call(ctx, [b"AUTH", b"wrong"])) == (
        b"-WRONGPASS invalid username-password pair or user is disabled.\r\n"
    )
    assert d.call(ctx, [b"AUTH", b"default", b"secret"]) == OK
    assert d.call(ctx, [b"PING"]) == "PONG"


def test_auth_without_password_configured():
    _, d, ctx = make()
    assert d.call(ctx, [b"AUTH", b"x"]).message.startswith("AUTH <password> called without any password")


def test_multi_exec_runs_queue_in_order():
    _, d, ctx = make()
    assert d.call(ctx, [b"MULTI"]) == OK
    assert d.call(ctx, [b"ECHO", b"a"]) == QUEUED
    assert d.call(ctx, [b"PING"]) == QUEUED
    assert d.call(ctx, [b"EXEC"]) == [b"a", "PONG"]
    assert not ctx.client.in_multi


def test_multi_errors():
    _, d, ctx = make()
    assert d.call(ctx, [b"EXEC"]).message == "EXEC without MULTI"
    assert d.call(ctx, [b"DISCARD"]).message == "DISCARD without MULTI"
    d.call(ctx, [b"MULTI"])
    assert d.call(ctx, [b"MULTI"]).message == "MULTI calls can not be nested"
    assert d.call(ctx, [b"WATCH", b"k"]).message == "WATCH inside MULTI is not allowed"
    assert d.call(ctx, [b"DISCARD"]) == OK


def test_execabort_after_queue_time_error():
    _, d, ctx = make()
    d.call(ctx, [b"MULTI"])
    assert d.call(ctx, [b"ECHO"]).message == "wrong number of arguments for 'echo' command"
    assert d.call(ctx, [b"nosuch"]).code == "ERR"
    err = d.call(ctx, [b"EXEC"])
    assert (err.code, err.message) == ("EXECABORT", "Transaction discarded because of previous errors.")


def test_watch_fails_exec_when_key_modified():
    state, d, ctx = make()
    assert d.call(ctx, [b"WATCH", b"k"]) == OK
    d.call(ctx, [b"MULTI"])
    d.call(ctx, [b"PING"])
    state.signal_key_modified(b"k")
    assert d.call(ctx, [b"EXEC"]) is NULL_ARRAY
    # The watch is gone after EXEC: the next transaction runs.
    d.call(ctx, [b"MULTI"])
    d.call(ctx, [b"PING"])
    assert d.call(ctx, [b"EXEC"]) == ["PONG"]


def test_watch_other_key_does_not_fail_and_unwatch_clears():
    state, d, ctx = make()
    d.call(ctx, [b"WATCH", b"k"])
    state.signal_key_modified(b"other")
    d.call(ctx, [b"MULTI"])
    assert d.call(ctx, [b"EXEC"]) == []
    d.call(ctx, [b"WATCH", b"k"])
    d.call(ctx, [b"UNWATCH"])
    state.signal_key_modified(b"k")
    d.call(ctx, [b"MULTI"])
    assert d.call(ctx, [b"EXEC"]) == []
    assert state._watchers == {}


def test_shutdown_not_allowed_in_multi():
    _, d, ctx = make()
    d.call(ctx, [b"MULTI"])
    assert d.call(ctx, [b"SHUTDOWN"]).message == "Command not allowed inside a transaction"


@pytest.fixture
def blocking_command():
    """A blocking test command, for ``make(commands=blocking_command)``."""
    commands: dict = {}

    @command("test-block", arity=2, flags="blocking", group="test", since="0", summary="",
             syntax="TEST-BLOCK key", table=commands)
    async def test_block(ctx, argv):
        if ctx.client.in_multi or not ctx.may_block:
            return None
        woke = await ctx.server.wait_for_keys([argv[1]], 5)
        return b"woke" if woke else None

    return commands


async def test_blocking_command_returns_coroutine_and_wakes(blocking_command, autojump_clock):
    import trio

    state, d, ctx = make(commands=blocking_command)
    coro = d.call(ctx, [b"test-block", b"k"])
    result = []

    async def run():
        result.append(await coro)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        await trio.sleep(1)
        assert state.blocked_clients == 1
        state.signal_key_modified(b"k")
    assert result == [b"woke"]
    assert state.blocked_clients == 0


async def test_blocking_wait_times_out_and_cancels_cleanly(blocking_command, autojump_clock):
    import trio

    state, d, ctx = make(commands=blocking_command)
    assert await d.call(ctx, [b"test-block", b"k"]) is None  # 5 s virtual timeout
    with trio.move_on_after(1):
        await d.call(ctx, [b"test-block", b"k"])
    assert state.blocked_clients == 0


def test_blocking_command_inside_exec_does_not_block(blocking_command):
    _, d, ctx = make(commands=blocking_command)
    d.call(ctx, [b"MULTI"])
    assert d.call(ctx, [b"test-block", b"k"]) == QUEUED
    assert d.call(ctx, [b"EXEC"]) == [None]


def test_stats_count_commands_and_errors():
    state, d, ctx = make()
    d.call(ctx, [b"PING"])
    d.call(ctx, [b"ECHO"])
    d.call(ctx, [b"SELECT", b"1"])
    assert state.stats.commands["ping"][0] == 1
    assert state.stats.commands["select"][3] == 1
    assert state.stats.errors["ERR"] == 2


def test_select_only_db_zero():
    _, d, ctx = make()
    assert d.call(ctx, [b"SELECT", b"0"]) == OK
    assert d.call(ctx, [b"SELECT", b"1"]).message == "DB index is out of range"
    assert d.call(ctx, [b"SELECT", b"x"]).message == "value is not an integer or out of range"


def test_hello_switches_protocol_and_validates():
    _, d, ctx = make()
    reply = d.call(ctx, [b"HELLO", b"3"])
    assert reply["proto"] == 3 and ctx.client.protocol == 3
    assert reply["server"] == "redis" and reply["role"] == "master"
    assert d.call(ctx, [b"HELLO", b"4"]).code == "NOPROTO"
    assert d.call(ctx, [b"HELLO", b"x"]).message == "Protocol version is not an integer or out of range"
    assert d.call(ctx, [b"HELLO", b"3", b"foo"]).message == "Syntax error in HELLO option 'foo'"
    d.call(ctx, [b"HELLO", b"2", b"SETNAME", b"me"])
    assert ctx.client.name == b"me" and ctx.client.protocol == 2


def test_hello_auth():
    _, d, ctx = make(requirepass="pw")
    assert d.call(ctx, [b"HELLO", b"3"]).code == "NOAUTH"
    assert d.call(ctx, [b"HELLO", b"3", b"AUTH", b"default", b"bad"]).code == "WRONGPASS"
    assert d.call(ctx, [b"HELLO", b"3", b"AUTH", b"default", b"pw"])["proto"] == 3


def test_reset_returns_to_defaults():
    _, d, ctx = make()
    d.call(ctx, [b"HELLO", b"3", b"SETNAME", b"n"])
    d.call(ctx, [b"MULTI"])
    assert d.call(ctx, [b"RESET"]) == "RESET"
    assert (ctx.client.protocol, ctx.client.name, ctx.client.in_multi) == (2, b"", False)


def test_command_error_raised_by_handler_becomes_reply():
    _, d, ctx = make()
    reply = d.call(ctx, [b"CONFIG", b"SET", b"nosuch", b"1"])
    assert isinstance(reply, CommandError)
    assert reply.message == "Unknown option or number of arguments for CONFIG SET - 'nosuch'"


def test_multi_queue_is_bounded_by_query_buffer_limit():
    state, d, ctx = make()
    state.config.client_query_buffer_limit = 1024 * 1024
    d.call(ctx, [b"MULTI"])
    big = b"x" * 100_000
    replies = [d.call(ctx, [b"ECHO", big]) for _ in range(12)]
    assert replies[0] == QUEUED
    assert isinstance(replies[-1], CommandError)
    assert len(ctx.client.multi_queue) < 11
    assert d.call(ctx, [b"EXEC"]).code == "EXECABORT"


def test_handler_bug_becomes_an_error_reply():
    commands: dict = {}

    @command("test-bug", arity=1, group="test", since="0", summary="", syntax="TEST-BUG", table=commands)
    def test_bug(ctx, argv):
        raise KeyError("boom")

    state, d, ctx = make(commands=commands)
    reply = d.call(ctx, [b"test-bug"])
    assert reply.code == "ERR" and "internal error in 'test-bug'" in reply.message
    assert state.stats.unexpected_error_replies == 1
    assert d.call(ctx, [b"PING"]) == "PONG"


# -- cross protocol scripting (Redis's securityWarningCommand) -------------------------


@pytest.mark.parametrize("argv", [[b"POST", b"/", b"HTTP/1.1"], [b"post"], [b"Host:", b"x"], [b"HOST:"]])
def test_post_and_host_kill_the_client_and_reply_nothing(argv):
    from server.dispatch import NO_REPLY

    state, d, ctx = make(requirepass="secret")  # before AUTH too
    assert d.call(ctx, argv) is NO_REPLY
    assert ctx.client.close_after_reply and ctx.client.kill_requested


def test_post_inside_multi_queues_nothing():
    from server.dispatch import NO_REPLY

    _, d, ctx = make()
    d.call(ctx, [b"MULTI"])
    assert d.call(ctx, [b"POST", b"/"]) is NO_REPLY
    assert ctx.client.multi_queue == [] and ctx.client.kill_requested


def test_the_attack_is_logged_at_most_once_a_minute(caplog, monkeypatch):
    import server.dispatch as dispatch

    now = [1000.0]
    monkeypatch.setattr(dispatch.time, "monotonic", lambda: now[0])
    state, d, _ = make()

    def attack():
        client = state.new_client("127.0.0.1:2", "127.0.0.1:6379")
        d.call(Context(state, client, d), [b"POST", b"/"])

    with caplog.at_level("WARNING", logger="partita.dispatch"):
        attack()
        now[0] += 59.0
        attack()
        now[0] += 2.0  # 61 s after the first
        attack()
    logged = [r for r in caplog.records if r.getMessage() == dispatch.ATTACK_LOG]
    assert len(logged) == 2
