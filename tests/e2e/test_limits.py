"""Limits end to end: output buffers, blocked readers, query buffers, idle and slow clients.

Each limit is checked on a real ``partita`` process over TCP: the client that
crosses it is closed (or refused) with Redis's behaviour and log text, and
the other clients carry on.
"""

from __future__ import annotations

import resource
import socket
import threading
import time

import pytest
import redis

from tests.conftest import RawConn, raw_exchange, wait_for

ENTRY_BYTES = 1000


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _fill_stream(r, key: str, entries: int) -> None:
    pipe = r.pipeline(transaction=False)
    for i in range(entries):
        pipe.xadd(key, {"v": "x" * ENTRY_BYTES})
    pipe.execute()


def _entries_past_kernel_buffers() -> int:
    """Entries of ENTRY_BYTES whose XRANGE reply outgrows the server's largest
    TCP send buffer by 1 MB. The server counts what the socket did not take
    against the limits (the kernel's buffer is not Partita's output buffer),
    so a reply the kernel could swallow whole could leave a remainder under
    the limit on one machine and over it on another."""
    try:
        with open("/proc/sys/net/ipv4/tcp_wmem") as f:
            wmem_max = int(f.read().split()[2])
    except (OSError, ValueError, IndexError):
        wmem_max = 4 * 1024 * 1024
    return (wmem_max + 1024 * 1024) // ENTRY_BYTES + 1


def _non_reader(port: int, requests: int, payload: bytes) -> socket.socket:
    """A client that pipelines ``requests`` copies of ``payload`` and never reads."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.sendall(payload * requests)
    return sock


# -- client-output-buffer-limit -------------------------------------------------


def test_output_buffer_hard_limit_closes_a_client_that_never_reads(partita_factory):
    server = partita_factory(["--client-output-buffer-limit", "normal 256kb 0 0"])
    r = server.client()
    _fill_stream(r, "big", _entries_past_kernel_buffers())  # each XRANGE reply > 5 MB
    rss_before = _rss_bytes(server.proc.pid)
    sock = _non_reader(server.port, 200, b"XRANGE big - +\r\n")
    try:
        assert wait_for(lambda: "overcoming of output buffer limits" in server.log())
        line = next(l for l in server.log().splitlines() if "output buffer limits" in l)
        assert "Client id=" in line and "scheduled to be closed ASAP" in line
        assert wait_for(lambda: len(r.client_list()) == 1)  # only r is left
        assert _rss_bytes(server.proc.pid) - rss_before < 64 * 1024**2
        assert r.ping()
    finally:
        sock.close()


def test_output_buffer_soft_limit_closes_after_soft_seconds(partita_factory):
    server = partita_factory(["--client-output-buffer-limit", "normal 0 1kb 1"])
    r = server.client()
    _fill_stream(r, "big", _entries_past_kernel_buffers())
    started = time.monotonic()
    sock = _non_reader(server.port, 50, b"XRANGE big - +\r\n")
    try:
        assert wait_for(lambda: "overcoming of output buffer limits" in server.log())
        assert time.monotonic() - started >= 0.9  # the soft limit waited its second
        assert wait_for(lambda: len(r.client_list()) == 1)
    finally:
        sock.close()


def test_without_output_limits_a_non_reader_holds_no_more_than_a_batch(partita_server):
    """Redis's default (normal 0 0 0) keeps the client; the server stops reading it instead."""
    r = partita_server.client()
    _fill_stream(r, "big", 2000)
    rss_before = _rss_bytes(partita_server.proc.pid)
    sock = _non_reader(partita_server.port, 200, b"XRANGE big - +\r\n")
    try:
        time.sleep(1.5)
        assert len(r.client_list()) == 2  # still connected
        assert _rss_bytes(partita_server.proc.pid) - rss_before < 64 * 1024**2
        assert r.xlen("big") == 2000
    finally:
        sock.close()


def test_client_output_buffer_limit_config_text_equals_redis(partita_shared, redis_server):
    ours, theirs = partita_shared.client(), redis_server.client()
    try:
        for client in (ours, theirs):
            client.config_set("client-output-buffer-limit", "normal 1mb 512kb 10")
        assert ours.config_get("client-output-buffer-limit") == theirs.config_get("client-output-buffer-limit")
        for client in (ours, theirs):
            client.config_set("client-output-buffer-limit", "replica 1 1 1 pubsub 2 2 2")
        assert ours.config_get("client-output-buffer-limit") == theirs.config_get("client-output-buffer-limit")
        for bad in ("normal 1 2", "bogus 1 2 3", "normal x 1 1", "normal -1 0 0", "normal 1 1 x"):
            errors = []
            for client in (ours, theirs):
                with pytest.raises(redis.ResponseError) as e:
                    client.config_set("client-output-buffer-limit", bad)
                errors.append(str(e.value))
            assert errors[0] == errors[1], bad
    finally:
        for client in (ours, theirs):
            client.config_set("client-output-buffer-limit",
                              "normal 0 0 0 replica 256mb 64mb 60 pubsub 32mb 8mb 60")


# -- max-blocked-clients ------------------------------------------------------------


def test_max_blocked_clients_refuses_one_more_block_with_a_clear_error(partita_factory):
    server = partita_factory(["--max-blocked-clients", "2"])
    r = server.client()
    r.xadd("s", {"a": 1}, id="1-1")
    blocked = [RawConn(server.port) for _ in range(2)]
    try:
        for conn in blocked:
            conn.sock.sendall(b"XREAD BLOCK 0 STREAMS s $\r\n")
        assert wait_for(lambda: r.info("clients")["blocked_clients"] == 2)
        with pytest.raises(redis.ResponseError, match="max-blocked-clients reached"):
            r.xread({"s": "$"}, block=100)
        r.xgroup_create("s", "g", id="$")
        with pytest.raises(redis.ResponseError, match="max-blocked-clients reached"):
            r.xreadgroup("g", "c", {"s": ">"}, block=100)
        # Reads that need not wait are served as usual.
        assert r.xread({"s": "0"}, block=100)
        # A write wakes both; the slots are free again.
        r.xadd("s", {"b": 2})
        for conn in blocked:
            assert conn.request(b"", replies=1).startswith(b"*1\r\n")
        assert not r.xread({"s": "$"}, block=50)  # blocks (and times out): no error
    finally:
        for conn in blocked:
            conn.close()


# -- client-query-buffer-limit and proto-max-bulk-len over a real socket -------------


def test_query_buffer_limit_closes_only_that_client(partita_factory):
    server = partita_factory(["--client-query-buffer-limit", "1mb"])
    other = server.client()
    # A request that declares a 1.5 MB argument and sends 1.2 MB of it: more
    # than 1mb pending in the query buffer.
    payload = b"*2\r\n$4\r\nECHO\r\n$1500000\r\n" + b"x" * 1_200_000
    reply, closed = raw_exchange(server.port, payload, timeout_s=10)
    assert closed
    assert "max query buffer length" in server.log()
    assert other.ping()


def test_proto_max_bulk_len_set_at_run_time_reaches_connected_clients(partita_server):
    r = partita_server.client()
    with RawConn(partita_server.port) as conn:
        assert conn.request(b"PING\r\n") == b"+PONG\r\n"
        r.config_set("proto-max-bulk-len", "1mb")
        conn.sock.sendall(b"*2\r\n$4\r\nECHO\r\n$2000000\r\n")
        conn.sock.settimeout(5)
        data = conn.sock.recv(1000)
        assert data == b"-ERR Protocol error: invalid bulk length\r\n"
    assert r.ping()


# -- idle and slow clients -----------------------------------------------------------


def test_timeout_closes_idle_clients_only(partita_factory):
    server = partita_factory(["--timeout", "1"])
    busy = server.client()
    with RawConn(server.port) as idle:
        assert idle.request(b"PING\r\n") == b"+PONG\r\n"
        for _ in range(8):  # busy for 2 s: never idle a whole second
            assert busy.ping()
            time.sleep(0.25)
        idle.sock.settimeout(5)
        assert idle.sock.recv(10) == b""


def _latencies_ms(r, rounds: int) -> list[float]:
    out = []
    for i in range(rounds):
        started = time.perf_counter()
        r.ping()
        r.xadd("lat", {"i": i})
        out.append((time.perf_counter() - started) * 1000)
    return sorted(out)


def _p99(samples: list[float]) -> float:
    return samples[int(len(samples) * 0.99) - 1]


def test_idle_and_slowloris_clients_do_not_slow_others(partita_factory):
    idle_count, slow_count = 2000, 50
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = idle_count + slow_count + 200
    if soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < {need}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need * 2, hard))
    server = partita_factory()  # inherits the raised limit
    r = server.client()
    _latencies_ms(r, 50)  # warm up
    before = _latencies_ms(r, 400)
    idle = []
    slow = []
    stop = threading.Event()
    try:
        for _ in range(idle_count):
            idle.append(socket.create_connection(("127.0.0.1", server.port)))
        for _ in range(slow_count):
            slow.append(socket.create_connection(("127.0.0.1", server.port)))

        def slowloris() -> None:
            request = b"*3\r\n$4\r\nXADD\r\n$4\r\nslow\r\n$1\r\n*\r\n"
            i = 0
            while not stop.is_set():  # every slow client: one byte per second
                for sock in slow:
                    try:
                        sock.send(request[i % len(request):i % len(request) + 1])
                    except OSError:
                        pass
                i += 1
                stop.wait(1.0)

        thread = threading.Thread(target=slowloris, daemon=True)
        thread.start()
        assert wait_for(lambda: r.info("clients")["connected_clients"] >= idle_count + slow_count + 1, 30)
        after = _latencies_ms(r, 400)
    finally:
        stop.set()
        for sock in idle + slow:
            sock.close()
    p99_before, p99_after = _p99(before), _p99(after)
    assert p99_after < max(3 * p99_before, 50.0), (p99_before, p99_after)
