"""Server and connection commands through real clients: INFO, CLIENT, COMMAND, CONFIG, tools."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import redis

from tests.conftest import REPO, PartitaProcess, RawConn, partita_command


def test_info_executable_is_absolute_when_started_by_a_relative_path(tmp_path):
    script = Path(partita_command()[0])
    if script.name != "partita":
        pytest.skip("no console script installed")
    server = PartitaProcess(tmp_path / "data", launcher=[os.path.relpath(script, REPO)]).start()
    try:
        assert server.client().info("server")["executable"] == str(script)
    finally:
        server.stop()


def test_info_sections_and_fields(partita_shared):
    r = partita_shared.client()
    info = r.info()
    for field in ("redis_version", "partita_version", "process_id", "tcp_port", "uptime_in_seconds",
                  "connected_clients", "maxclients", "blocked_clients", "used_memory", "total_connections_received",
                  "total_commands_processed", "instantaneous_ops_per_sec", "role", "used_cpu_sys"):
        assert field in info, field
    assert info["redis_version"] == "8.10.0" and info["role"] == "master"
    assert info["tcp_port"] == partita_shared.port
    assert info["used_memory_peak"] >= info["used_memory"]
    assert info["connected_slaves"] == 0  # one node: nothing follows it
    everything = r.info("everything")
    assert "cmdstat_info" in everything
    assert r.info("partita")["data_dir"] == str(partita_shared.data_dir)
    assert set(r.info("server", "clients")) >= {"redis_version", "connected_clients"}
    assert r.info("nosuchsection") == {}


def test_hello_and_info_name_the_redis_release_matched(partita_shared):
    """Clients gate Redis 8 stream features on the version: Redis 8.10's."""
    r = partita_shared.client(protocol=3)
    hello = r.execute_command("HELLO", "3")
    assert hello[b"version"] == b"8.10.0" and hello[b"server"] == b"redis"
    info = r.info("server")
    assert info["redis_version"] == "8.10.0" and "partita_version" in info
    r.close()


def test_info_keyspace_counts_topics(partita_server):
    r = partita_server.client()
    assert r.info("keyspace") == {}
    r.xadd("s1", {"f": "v"})
    r.xadd("s2", {"f": "v"})
    assert r.info("keyspace")["db0"] == {"keys": 2, "expires": 0, "avg_ttl": 0}


def test_commandstats_and_resetstat(partita_server):
    r = partita_server.client()
    for _ in range(3):
        r.echo("x")
    stats = r.info("commandstats")
    assert stats["cmdstat_echo"]["calls"] == 3
    assert r.config_resetstat() is True
    assert "cmdstat_echo" not in r.info("commandstats")


def test_client_list_info_kill(partita_shared):
    a = partita_shared.client(protocol=2)
    b = partita_shared.client(protocol=2)
    a.client_setname("alpha")
    b.client_setname("beta")
    names = {c["name"] for c in a.client_list()}
    assert {"alpha", "beta"} <= names
    me = a.client_info()
    assert me["name"] == "alpha" and me["cmd"] == "client|info" and me["resp"] == "2"
    b_id = b.client_id()
    assert a.client_kill_filter(_id=b_id) == 1
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(c["id"] == str(b_id) for c in a.client_list()):
        time.sleep(0.02)
    assert all(c["id"] != str(b_id) for c in a.client_list())


def test_client_kill_old_form_and_self(partita_shared):
    with RawConn(partita_shared.port) as victim, RawConn(partita_shared.port) as killer:
        victim.request(b"CLIENT SETNAME victim\r\n")
        listing = killer.request(b"CLIENT LIST\r\n").decode()
        addr = next(l for l in listing.splitlines() if "name=victim" in l).split("addr=")[1].split()[0]
        assert killer.request(f"CLIENT KILL {addr}\r\n".encode()) == b"+OK\r\n"
        assert victim.sock.recv(100) == b""
        assert killer.request(b"CLIENT KILL SKIPME no ID 99999999\r\n") == b":0\r\n"


def test_client_setinfo(partita_shared):
    with RawConn(partita_shared.port) as conn:
        assert conn.request(b"CLIENT SETINFO lib-name mylib\r\n") == b"+OK\r\n"
        assert conn.request(b"CLIENT SETINFO LIB-VER 1.2\r\n") == b"+OK\r\n"
        assert b"lib-name=mylib lib-ver=1.2" in conn.request(b"CLIENT INFO\r\n")
        assert conn.request(b"CLIENT SETINFO foo bar\r\n") == b"-ERR Unrecognized option 'foo'\r\n"


def ask(conn: RawConn, *argv: bytes):
    """Send one command, decode the reply with hiredis."""
    import hiredis

    from server.resp import encode_command

    reader = hiredis.Reader()
    reader.feed(conn.request(encode_command(list(argv))))
    return reader.gets()


def test_command_count_info_docs_list_getkeys(partita_shared):
    with RawConn(partita_shared.port) as conn:
        count = ask(conn, b"COMMAND", b"COUNT")
        assert count >= 20
        assert len(ask(conn, b"COMMAND")) == count
        ping = ask(conn, b"COMMAND", b"INFO", b"ping")[0]
        assert ping[:6] == [b"ping", -1, [b"fast"], 0, 0, 0]
        assert ask(conn, b"COMMAND", b"INFO", b"nosuch") == [None]
        watch = ask(conn, b"COMMAND", b"INFO", b"watch")[0]
        assert watch[3:6] == [1, -1, 1] and watch[8]  # key positions and a key spec
        docs = ask(conn, b"COMMAND", b"DOCS", b"watch")
        assert docs[0] == b"watch" and b"arguments" in docs[1]
        names = ask(conn, b"COMMAND", b"LIST")
        assert b"client|id" in names and b"ping" in names
        assert b"config|get" in ask(conn, b"COMMAND", b"LIST", b"FILTERBY", b"PATTERN", b"config*")
        assert b"ping" in ask(conn, b"COMMAND", b"LIST", b"FILTERBY", b"ACLCAT", b"connection")
        assert ask(conn, b"COMMAND", b"GETKEYS", b"WATCH", b"a", b"b") == [b"a", b"b"]


def test_command_docs_resp3_has_argument_maps(partita_shared):
    with RawConn(partita_shared.port) as conn:
        ask(conn, b"HELLO", b"3")
        docs = ask(conn, b"COMMAND", b"DOCS", b"client")
        kill = docs[b"client"][b"subcommands"][b"client|kill"]
        assert kill[b"summary"] and kill[b"arguments"]
        xread = ask(conn, b"COMMAND", b"DOCS", b"ping")[b"ping"]
        assert xread[b"arguments"] == [{b"name": b"message", b"type": b"string", b"flags": [b"optional"]}]


def test_config_get_set_several_and_globs(partita_shared):
    with RawConn(partita_shared.port) as conn:
        got = ask(conn, b"CONFIG", b"GET", b"maxclients", b"fsync", b"stream-node-*")
        pairs = dict(zip(got[::2], got[1::2]))
        assert pairs[b"maxclients"] == b"10000" and pairs[b"fsync"] == b"everysec"
        assert b"stream-node-max-entries" in pairs and b"stream-node-max-bytes" in pairs
        assert ask(conn, b"CONFIG", b"SET", b"stream-node-max-entries", b"50") == b"OK"
        assert ask(conn, b"CONFIG", b"GET", b"stream-node-max-entries") == [b"stream-node-max-entries", b"50"]
        assert ask(conn, b"CONFIG", b"SET", b"fsync", b"always", b"loglevel", b"warning") == b"OK"
        assert ask(conn, b"CONFIG", b"GET", b"appendfsync") == [b"appendfsync", b"always"]
        ask(conn, b"CONFIG", b"SET", b"fsync", b"everysec", b"loglevel", b"notice", b"stream-node-max-entries", b"100")


def test_config_accepts_redis_names_for_compatibility(partita_server):
    """Redis 8's redis.conf names: accepted, kept and shown, aliases together."""
    r = partita_server.client()
    assert r.config_set("maxmemory-policy", "noeviction") is True
    assert r.config_set("latency-monitor-threshold", 10) is True
    assert r.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
    assert r.config_get("latency-monitor-threshold") == {"latency-monitor-threshold": "10"}
    assert r.config_set("maxmemory-policy", "allkeys-lrm") is True  # Redis 8.6's policies
    assert r.config_set("slave-read-only", "no") is True
    assert r.config_get("replica-read-only") == {"replica-read-only": "no"}
    assert r.config_get("cluster-slot-stats-enabled") == {"cluster-slot-stats-enabled": "no"}
    with pytest.raises(redis.ResponseError, match="can't set immutable config"):
        r.config_set("io-threads", 4)
    assert len(r.config_get("*")) > 200
    r.close()


def test_config_set_proto_max_bulk_len_applies_to_connected_clients(partita_server):
    with RawConn(partita_server.port) as conn:
        assert conn.request(b"CONFIG SET proto-max-bulk-len 1mb\r\n") == b"+OK\r\n"
        conn.sock.sendall(b"*2\r\n$4\r\nECHO\r\n$2000000\r\n")
        assert conn.sock.recv(1000) == b"-ERR Protocol error: invalid bulk length\r\n"


def test_watch_multi_exec_with_real_writes(partita_server):
    a = partita_server.client()
    b = partita_server.client()
    with a.pipeline(transaction=True) as pipe:
        pipe.watch("s")
        pipe.multi()
        pipe.echo("x")
        b.xadd("s", {"f": "v"})
        with pytest.raises(redis.WatchError):
            pipe.execute()
    with a.pipeline(transaction=True) as pipe:
        pipe.watch("s")
        pipe.multi()
        pipe.echo("y")
        b.xadd("other", {"f": "v"})
        assert pipe.execute() == [b"y"]


@pytest.mark.skipif(shutil.which("redis-benchmark") is None, reason="redis-benchmark not installed (apt-get install redis-tools)")
def test_redis_benchmark_ping_completes(partita_shared):
    result = subprocess.run(
        ["redis-benchmark", "-p", str(partita_shared.port), "-t", "ping", "-q", "-n", "2000", "-c", "10"],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0
    out = result.stdout + result.stderr
    assert "PING_INLINE" in out and "PING_MBULK" in out and "requests per second" in out
    assert "ERR" not in out and "WARNING" not in out


# redis-benchmark's default tests (its names for -t) that use a Redis data
# type Partita does not have, and the command each is refused at (README.md
# "redis-benchmark").
BENCHMARK_REFUSED = {"set": "SET", "get": "GET", "incr": "INCR", "lpush": "LPUSH", "rpush": "RPUSH", "lpop": "LPOP",
                     "rpop": "RPOP", "sadd": "SADD", "hset": "HSET", "spop": "SPOP", "zadd": "ZADD",
                     "zpopmin": "ZPOPMIN", "lrange": "LPUSH", "mset": "MSET"}


def redis_benchmark(port: int, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["redis-benchmark", "-p", str(port), "-n", "100", "-q", *args], capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)


def rates(output: str) -> dict[str, float]:
    """Each finished test's requests per second (-q output)."""
    return {m.group(1): float(m.group(2)) for m in
            re.finditer(r"(?:^|\r)([^\r\n:]+): ([\d.]+) requests per second", output, re.MULTILINE)}


@pytest.mark.skipif(shutil.which("redis-benchmark") is None, reason="redis-benchmark not installed (apt-get install redis-tools)")
def test_redis_benchmark_without_t_runs_what_applies_and_names_what_is_refused(partita_shared):
    """With no -t: the tests that apply run; the first data-type test is
    refused with Redis's unknown-command error, which redis-benchmark (7.0
    and later: "We now immediately exit on error to avoid false results")
    prints before it exits 1. Every other default test, run on its own, is
    refused the same way, naming its command; XADD applies (the XADD test of
    releases after 7.0, or its command line with 7.0)."""
    port = partita_shared.port
    run = redis_benchmark(port)
    assert {"PING_INLINE", "PING_MBULK"} <= rates(run.stdout).keys() and min(rates(run.stdout).values()) > 0
    assert run.returncode == 1, run.stdout
    assert "Error from server: ERR unknown command 'SET', with args beginning with: 'key:__rand_int__'" in run.stderr
    for test, command in BENCHMARK_REFUSED.items():
        refused = redis_benchmark(port, "-t", test)
        assert refused.returncode == 1, test
        assert f"Error from server: ERR unknown command '{command}', with args beginning with: " in refused.stderr, test
    xadd = redis_benchmark(port, "-t", "xadd")
    if not rates(xadd.stdout):  # (this redis-benchmark has no XADD test: its command line)
        xadd = redis_benchmark(port, "XADD", "mystream", "*", "myfield", "xxx")
    assert xadd.returncode == 0 and len(rates(xadd.stdout)) == 1 and "Error" not in xadd.stderr
    assert partita_shared.client().xlen("mystream") >= 100


@pytest.mark.skipif(shutil.which("redis-cli") is None, reason="redis-cli not installed (apt-get install redis-tools)")
def test_redis_cli_one_shot(partita_shared):
    result = subprocess.run(["redis-cli", "-p", str(partita_shared.port), "CONFIG", "GET", "maxclients"],
                            capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert result.stdout.split() == ["maxclients", "10000"]


def test_shutdown_while_a_client_is_blocked(partita_server):
    blocked = RawConn(partita_server.port, timeout_s=15)
    blocked.sock.sendall(b"XREAD BLOCK 0 STREAMS nosuch $\r\n")
    deadline = time.monotonic() + 5
    r = partita_server.client()
    while time.monotonic() < deadline and r.info("clients")["blocked_clients"] != 1:
        time.sleep(0.02)
    assert r.info("clients")["blocked_clients"] == 1
    started = time.monotonic()
    assert partita_server.terminate() == 0
    assert time.monotonic() - started < 5
    assert blocked.sock.recv(100) == b""
    blocked.close()


def test_client_kill_closes_a_client_that_does_not_read(partita_server):
    import socket as socket_module

    from server.resp import encode_command

    stuck = socket_module.create_connection((partita_server.host, partita_server.port))
    stuck.setsockopt(socket_module.SOL_SOCKET, socket_module.SO_RCVBUF, 4096)
    stuck.sendall(b"CLIENT SETNAME stuck\r\n")
    value = b"v" * 100_000
    stuck.settimeout(0.5)
    try:
        for _ in range(200):  # ~20 MB of replies nobody reads
            stuck.sendall(encode_command([b"ECHO", value]))
    except (socket_module.timeout, OSError):
        pass  # the server stopped reading us: its send is blocked
    r = partita_server.client(protocol=2)
    entry = next(c for c in r.client_list() if c["name"] == "stuck")
    assert r.client_kill_filter(_id=entry["id"]) == 1
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(c["name"] == "stuck" for c in r.client_list()):
        time.sleep(0.02)
    assert not any(c["name"] == "stuck" for c in r.client_list())
    stuck.close()
