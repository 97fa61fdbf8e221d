"""The real ``partita`` process: start-up, config errors, clients, shutdown."""

from __future__ import annotations

import asyncio
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import RawConn, free_port, partita_command, raw_exchange, wait_for


def test_start_up_log_names_version_pid_port_dir(partita_server):
    log = partita_server.log()
    assert "Partita" in log and "Redis 8.10.0" in log
    assert f"pid={partita_server.proc.pid}" in log
    assert f"port={partita_server.port}" in log
    assert str(partita_server.data_dir) in log
    assert log.rstrip().endswith("Ready to accept connections")


def test_inline_ping_answers_pong(partita_shared):
    data, _ = raw_exchange(partita_shared.port, b"PING\r\n")
    assert data == b"+PONG\r\n"


def test_redis_py_resp2(partita_shared):
    r = partita_shared.client(protocol=2)
    assert r.ping() is True
    assert r.echo(b"hi") == b"hi"
    assert r.client_id() > 0
    assert r.client_setname("me") is True and r.client_getname() in ("me", b"me")
    assert r.config_get("port") == {"port": str(partita_shared.port)}
    assert r.info("server")["redis_version"] == "8.10.0"
    assert r.client_info()["resp"] == "2"
    r.close()


def test_redis_py_resp3(partita_shared):
    r = partita_shared.client(protocol=3)
    assert r.ping() is True
    assert r.config_get("maxclients") == {b"maxclients": b"10000"} or r.config_get("maxclients") == {"maxclients": "10000"}
    info = r.info()
    assert info["redis_version"] == "8.10.0" and info["role"] == "master"
    assert isinstance(r.execute_command("HELLO", "3"), dict)
    assert r.client_info()["resp"] == "3"
    r.close()


def test_redis_py_asyncio(partita_shared):
    import redis.asyncio as aioredis

    async def main():
        r = aioredis.Redis(host=partita_shared.host, port=partita_shared.port)
        try:
            results = await asyncio.gather(*(r.echo(f"m{i}") for i in range(20)))
            async with r.pipeline(transaction=True) as pipe:
                pipe.ping().echo("x")
                tx = await pipe.execute()
        finally:
            await r.aclose()
        return results, tx

    results, tx = asyncio.run(main())
    assert results == [f"m{i}".encode() for i in range(20)]
    assert tx == [True, b"x"]


def test_pipeline_of_many_commands(partita_shared):
    r = partita_shared.client()
    pipe = r.pipeline(transaction=False)
    for i in range(2000):
        pipe.echo(str(i))
    assert pipe.execute() == [str(i).encode() for i in range(2000)]


def test_large_value_round_trips(partita_shared):
    r = partita_shared.client()
    value = b"v" * (3 * 1024 * 1024)
    assert r.echo(value) == value


def test_garbage_closes_that_client_while_others_are_served(partita_shared):
    with RawConn(partita_shared.port) as good:
        assert good.request(b"PING\r\n") == b"+PONG\r\n"
        data, closed = raw_exchange(partita_shared.port, b"*1\r\n\x00\x01garbage\r\n")
        assert data == b"-ERR Protocol error: expected '$', got '\x00'\r\n" and closed
        assert good.request(b"ECHO still\r\n") == b"$5\r\nstill\r\n"


def test_declared_4gb_bulk_is_refused_without_allocating(partita_shared):
    with RawConn(partita_shared.port) as good:
        rss_before = _rss_kb(partita_shared.proc.pid)
        data, closed = raw_exchange(partita_shared.port, b"*2\r\n$4\r\nECHO\r\n$4294967296\r\n" + b"x" * 65536)
        assert data == b"-ERR Protocol error: invalid bulk length\r\n" and closed
        assert good.request(b"PING\r\n") == b"+PONG\r\n"
        assert _rss_kb(partita_shared.proc.pid) - rss_before < 50_000


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def test_maxclients_reached(partita_factory):
    server = partita_factory(["--maxclients", "2"])
    a = RawConn(server.port)
    b = RawConn(server.port)
    try:
        assert a.request(b"PING\r\n") == b"+PONG\r\n"
        assert b.request(b"PING\r\n") == b"+PONG\r\n"
        data, closed = raw_exchange(server.port, b"PING\r\n")
        assert data == b"-ERR max number of clients reached\r\n" and closed
    finally:
        a.close()
        b.close()


def test_requirepass(partita_factory):
    server = partita_factory(["--requirepass", "s3cret"])
    with RawConn(server.port) as conn:
        assert conn.request(b"PING\r\n") == b"-NOAUTH Authentication required.\r\n"
        assert conn.request(b"AUTH s3cret\r\n") == b"+OK\r\n"
        assert conn.request(b"PING\r\n") == b"+PONG\r\n"
    r = server.client(password="s3cret")
    assert r.ping() is True


def test_sigterm_shuts_down_cleanly(partita_server):
    r = partita_server.client()
    r.ping()
    started = time.monotonic()
    assert partita_server.terminate(signal.SIGTERM) == 0
    assert time.monotonic() - started < 10
    log = partita_server.log()
    assert "Received SIGTERM" in log and "bye bye" in log


def test_sigint_shuts_down_cleanly(partita_server):
    assert partita_server.terminate(signal.SIGINT) == 0


def test_shutdown_command_exits_zero(partita_server):
    with socket.create_connection((partita_server.host, partita_server.port)) as s:
        s.sendall(b"SHUTDOWN NOSAVE\r\n")
        assert s.recv(100) == b""  # closed without a reply, as Redis does
    assert partita_server.proc.wait(timeout=10) == 0


def test_shutdown_abort_without_shutdown(partita_shared):
    with RawConn(partita_shared.port) as conn:
        assert conn.request(b"SHUTDOWN ABORT\r\n") == b"-ERR No shutdown in progress.\r\n"


def test_restart_keeps_port(partita_server):
    port = partita_server.port
    partita_server.restart()
    assert partita_server.port == port
    assert partita_server.client().ping() is True
    partita_server.restart(kill9=True)
    assert partita_server.client().ping() is True


def test_a_restart_logs_what_it_loaded_and_the_recovery_it_did(partita_factory):
    partita_server = partita_factory(["--fsync", "no"])  # no flush rounds: no recovery point past 0
    r = partita_server.client()
    r.execute_command("TOPIC", "CREATE", "t", "PARTITIONS", "3")
    r.execute_command("TOPIC", "CREATE", "u")
    r.xadd("u", {"a": "1"})
    partita_server.restart(kill9=True)
    assert re.search(r"Loaded 2 topic\(s\), 4 partition\(s\) in \d+\.\d{3}s", partita_server.log())
    assert partita_server.client().xlen("u") == 1  # the first use opens u's log
    assert wait_for(lambda: re.search(r"\S*u/partition-0: recovery checked offsets 0\.\.0 \(written after "
                                      r"the last flush\) in \d+\.\d{3}s", partita_server.log()))


def _run_partita(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(partita_command() + args, cwd=cwd, capture_output=True, text=True, timeout=30,
                          stdin=subprocess.DEVNULL)


def test_bad_config_file_exits_1_naming_the_line_and_writes_nothing(tmp_path):
    conf = tmp_path / "partita.conf"
    data = tmp_path / "data"
    conf.write_text(f"dir {data}\nport 7777\nnosuch-option 5\n")
    result = _run_partita([str(conf)], tmp_path)
    assert result.returncode == 1
    assert f"{conf}, line 3" in result.stderr and "nosuch-option" in result.stderr
    assert not data.exists()


def test_bad_command_line_value_exits_1(tmp_path):
    data = tmp_path / "data"
    result = _run_partita(["--dir", str(data), "--fsync", "sometimes"], tmp_path)
    assert result.returncode == 1
    assert "fsync" in result.stderr and "must be one of the following" in result.stderr
    assert not data.exists()


def test_missing_config_file_exits_1(tmp_path):
    result = _run_partita([str(tmp_path / "nope.conf")], tmp_path)
    assert result.returncode == 1 and "can't open config file" in result.stderr


def test_config_file_and_rewrite(partita_factory, tmp_path):
    conf = tmp_path / "partita.conf"
    conf.write_text("# my settings\nloglevel notice\nmaxclients 50\n")
    server = partita_factory(config_file=conf)
    r = server.client()
    assert r.config_get("maxclients") == {"maxclients": "50"}
    assert r.config_set("maxclients", 60) is True
    assert r.config_rewrite() in (True, b"OK")
    text = conf.read_text()
    assert "# my settings" in text and "maxclients 60" in text
    server.restart()
    assert server.client().config_get("maxclients") == {"maxclients": "60"}


def test_config_rewrite_without_file(partita_shared):
    with RawConn(partita_shared.port) as conn:
        assert conn.request(b"CONFIG REWRITE\r\n") == b"-ERR The server is running without a config file\r\n"


def test_console_script_help_lists_every_option_with_its_default():
    result = subprocess.run(partita_command() + ["--help"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0 and "partita.conf" in result.stdout
    assert "  --port [6379] (fixed)\n      TCP port to listen on" in result.stdout
    assert "  --fsync [everysec]\n" in result.stdout
    assert "maxmemory-policy" in result.stdout  # accepted for compatibility, listed once at the end


def test_busy_port_exits_1_before_creating_the_data_dir(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        data = tmp_path / "data"
        result = _run_partita(["--port", str(port), "--dir", str(data)], tmp_path)
    assert result.returncode == 1
    assert "Address already in use" in result.stdout + result.stderr
    assert not data.exists()


def test_fsync_always_group_commits_concurrent_writers(partita_factory):
    import threading

    server = partita_factory(["--fsync", "always"])
    errors = []

    def writer(i):
        try:
            r = server.client(protocol=2)
            for j in range(20):
                r.xadd("gc", {"w": str(i), "j": str(j)})
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    r = server.client(protocol=2)
    assert r.xlen("gc") == 400
    info = r.info("persistence")
    assert info["partita_fsync_policy"] == "always"
    assert 1 <= info["partita_group_commits"] < 400


@pytest.mark.parametrize("args, why", [
    (["--cluster-nodes", "1@127.0.0.1:7001,2@127.0.0.1:7002", "--node-id", "3"], "node-id 3 is not one of cluster-nodes"),
    (["--cluster-nodes", "1@127.0.0.1", "--node-id", "1"], "is not <node-id>@<host>:<port>"),
    (["--cluster-nodes", "1@127.0.0.1:7001", "--node-id", "1", "--replication-factor", "2"],
     "replication-factor 2 needs at least 2 nodes"),
    (["--cluster-nodes", "1@127.0.0.1:7001,2@127.0.0.1:7002", "--node-id", "1", "--controller-nodes", "1,5"],
     "node(s) 5 not in cluster-nodes"),
    (["--cluster-nodes", "1@127.0.0.1:7001,2@127.0.0.1:7002", "--node-id", "2", "--cluster-join", "yes"],
     "a node joining a running cluster is not a controller voter"),
    (["--node-id", "3"], "node-id 3 needs cluster-nodes"),
    (["--cluster-join", "yes"], "cluster-join yes needs cluster-nodes"),
    (["--controller-nodes", "1,2"], "controller-nodes 1,2 needs cluster-nodes"),
])
def test_bad_cluster_configuration_exits_1_and_writes_nothing(tmp_path, args, why):
    data = tmp_path / "data"
    result = _run_partita(["--dir", str(data), *args], tmp_path)
    assert result.returncode == 1
    assert "Fatal: cluster configuration:" in result.stderr and why in result.stderr
    assert not data.exists()


def test_a_second_server_on_a_data_dir_in_use_exits_1_and_leaves_the_first_serving(partita_server):
    r = partita_server.client()
    r.xadd("kept", {"a": "1"})
    result = _run_partita(["--port", "0", "--dir", str(partita_server.data_dir)], partita_server.data_dir.parent)
    assert result.returncode == 1
    out = result.stdout + result.stderr
    assert f"data directory {partita_server.data_dir} is in use by another Partita process " \
           f"(pid {partita_server.proc.pid})" in out
    assert "Traceback" not in out and "Ready to accept connections" not in out
    assert r.xlen("kept") == 1
    partita_server.restart()  # a clean stop leaves no lock behind
    assert partita_server.client().xlen("kept") == 1


@pytest.mark.parametrize("make, reason", [
    (lambda p: p.write_text("x"), "Not a directory"),
    (lambda p: (p.parent / "file").write_text("x"), "Not a directory"),
], ids=["dir-is-a-file", "parent-is-a-file"])
def test_a_data_dir_the_system_refuses_exits_1_naming_the_option_and_why(tmp_path, make, reason):
    data = tmp_path / "data"
    make(data)
    where = data if data.exists() else tmp_path / "file" / "data"
    result = _run_partita(["--port", "0", "--dir", str(where)], tmp_path)
    assert result.returncode == 1
    out = result.stdout + result.stderr
    assert f"Fatal: can't use data directory {where} (dir): {reason}" in out
    assert "Traceback" not in out


def test_a_data_dir_whose_parent_is_missing_is_refused_not_created(tmp_path):
    """A mistyped path, or a volume not mounted yet: creating the whole path
    would serve an empty server and hide what it writes once the volume is
    there. As Redis refuses a missing dir; Partita creates only the last one."""
    data = tmp_path / "not-mounted" / "data"
    result = _run_partita(["--port", "0", "--dir", str(data)], tmp_path)
    assert result.returncode == 1
    out = result.stdout + result.stderr
    assert (f"Fatal: can't use data directory {data} (dir): its parent directory {data.parent} does not exist"
            in out)
    assert "Traceback" not in out and not data.parent.exists()


def test_redis_multi_word_directives_of_a_config_file_start(partita_factory, tmp_path):
    conf = tmp_path / "multi.conf"  # as redis.conf writes them
    conf.write_text("save 900 1 300 10\nclient-output-buffer-limit normal 0 0 0 pubsub 32mb 8mb 60\n")
    server = partita_factory(config_file=conf)
    r = server.client()
    assert r.config_get("save") == {"save": "900 1 300 10"}
    limits = r.config_get("client-output-buffer-limit")["client-output-buffer-limit"]
    assert limits.startswith("normal 0 0 0 ") and limits.endswith(f"pubsub {32 * 1024**2} {8 * 1024**2} 60")


def test_a_logfile_that_cannot_be_opened_exits_1_naming_it_and_writes_nothing(tmp_path):
    data, logfile = tmp_path / "data", tmp_path / "no-such-dir" / "partita.log"
    result = _run_partita(["--port", "0", "--dir", str(data), "--logfile", str(logfile)], tmp_path)
    assert result.returncode == 1
    assert result.stderr == (f"*** FATAL CONFIG ERROR ***\nlogfile '{logfile}': "
                             f"Can't open the log file: No such file or directory\n")
    assert not data.exists()


@pytest.mark.parametrize("option", ["tls-port", "kafka-tls-port"])
def test_a_tls_port_without_its_files_exits_1_in_one_line_naming_it_and_writes_nothing(tmp_path, option):
    data = tmp_path / "data"
    result = _run_partita(["--port", "0", "--dir", str(data), f"--{option}", str(free_port())], tmp_path)
    assert result.returncode == 1
    out = result.stdout + result.stderr
    assert f"# Fatal: {option} needs tls-cert-file and tls-key-file\n" in out and "Traceback" not in out
    assert not data.exists()


@pytest.mark.parametrize("option", ["http-port", "kafka-port"])
def test_a_listener_port_clashing_with_another_names_its_option(tmp_path, option):
    data, port = tmp_path / "data", free_port()
    result = _run_partita(["--port", str(port), f"--{option}", str(port), "--dir", str(data)], tmp_path)
    assert result.returncode == 1
    assert (f"Fatal: Failed listening on port {port} ({option}), aborting: 127.0.0.1: Address already in use"
            in result.stdout + result.stderr)
    assert not data.exists()


def test_settings_partita_accepts_but_does_not_honour_are_named_at_start(partita_factory):
    server = partita_factory(["--daemonize", "yes", "--appendonly", "no", "--maxmemory", "1gb", "--hz", "10"])
    assert ("# Accepted for compatibility with Redis, changing nothing in Partita: appendonly no, daemonize yes, "
            "maxmemory 1073741824\n") in server.log()  # hz 10 is Redis's default: not named


def test_no_such_warning_with_the_defaults(partita_server):
    assert "changing nothing in Partita" not in partita_server.log()
