"""The HTTP port of a real ``partita``: ``/metrics`` in Prometheus's format
(read back with prometheus_client's own parsers), the documented scrape
config, who may read (Basic auth against the ACL users), and the rules of a
read-only HTTP server (methods, paths, keep-alive, a taken port)."""

from __future__ import annotations

import base64
import http.client
import os
import re
import socket

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families

from tests.conftest import PartitaProcess, free_port, wait_for
from tests.metricskit import DOCS, documented_metrics, missing_from, parse_samples


def _scrape_config() -> dict[str, str]:
    """``scheme`` and ``metrics_path`` of docs/metrics.md's scrape config."""
    block = re.search(r"## Scrape config\n\n```yaml\n(.*?)```", DOCS.read_text(), re.S).group(1)
    assert "scrape_configs:" in block and "static_configs:" in block
    return {key: re.search(rf"^\s*{key}:\s*(\S+)\s*$", block, re.M).group(1)
            for key in ("scheme", "metrics_path")}


def _get(port: int, path: str, *, auth: tuple[str, str] | None = None, method: str = "GET",
         headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        headers = dict(headers or {})
        if auth is not None:
            headers["Authorization"] = "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        conn.request(method, path, headers=headers)
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def _samples(port: int, **kwargs) -> dict[tuple[str, tuple], float]:
    """Every sample of a scrape, parsed by prometheus_client: (name, sorted labels) -> value."""
    status, headers, body = _get(port, _scrape_config()["metrics_path"], **kwargs)
    assert status == 200, body
    assert headers["content-type"].startswith("text/plain; version=0.0.4")
    return parse_samples(body.decode())


def _value(samples, name: str, **labels) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


@pytest.fixture
def node(partita_factory):
    port = free_port()
    server = partita_factory(["--http-port", str(port)])
    server.http_port = port
    return server


def test_documented_scrape_config_scrapes_a_running_node(node):
    config = _scrape_config()
    assert config["scheme"] == "http"
    assert f"http-port={node.http_port}" in node.log()
    samples = _samples(node.http_port)
    info = [(dict(labels), value) for (name, labels), value in samples.items() if name == "partita_build_info"]
    assert len(info) == 1 and info[0][1] == 1.0 and info[0][0]["redis_version"] == "8.10.0", info
    assert ("process_cpu_seconds_total", ()) in samples
    assert _value(samples, "partita_connected_clients") == 0.0


def test_metrics_change_after_xadd_and_xreadgroup(node):
    client = node.client()
    assert client.execute_command("TOPIC", "CREATE", "orders", "PARTITIONS", "3") == b"OK"
    before = _samples(node.http_port)
    assert _value(before, "partita_partition_log_end_offset", topic="orders", partition="1") == 0.0
    assert _value(before, "partita_commands_total", command="xadd") is None

    for i in range(5):
        client.xadd("orders#1", {"i": i})
    client.xadd("orders#2", {"i": 99})
    client.xgroup_create("orders#1", "billing", id="0")
    got = client.xreadgroup("billing", "c1", {"orders#1": ">"}, count=2)
    assert len(got[0][1]) == 2
    client.xreadgroup("billing", "c1", {"orders#1": ">"}, count=1)  # the hot path: timed

    after = _samples(node.http_port)
    p1 = {"topic": "orders", "partition": "1"}
    assert _value(after, "partita_partition_log_end_offset", **p1) == 5.0
    assert _value(after, "partita_partition_high_watermark", **p1) == 5.0
    assert _value(after, "partita_partition_entries", **p1) == 5.0
    assert _value(after, "partita_partition_entries_appended_total", **p1) == 5.0
    assert _value(after, "partita_partition_log_start_offset", **p1) == 0.0
    assert _value(after, "partita_partition_segments", **p1) == 1.0
    assert _value(after, "partita_partition_size_bytes", **p1) > 0
    assert _value(after, "partita_partition_log_end_offset", topic="orders", partition="2") == 1.0
    assert _value(after, "partita_partition_leader", **p1) == 1.0
    group = {**p1, "group": "billing"}
    assert _value(after, "partita_group_lag_entries", **group) == 2.0
    assert _value(after, "partita_group_pending_entries", **group) == 3.0
    assert _value(after, "partita_group_consumers", **group) == 1.0
    assert _value(after, "partita_group_entries_read", **group) == 3.0
    assert _value(after, "partita_commands_total", command="xadd") == 6.0
    assert _value(after, "partita_commands_total", command="xreadgroup") == 2.0
    assert _value(after, "partita_command_duration_seconds_count", command="xadd") == 6.0
    assert _value(after, "partita_command_duration_seconds_bucket", command="xadd", le="+Inf") == 6.0
    assert _value(after, "partita_command_duration_seconds_count", command="xreadgroup") >= 1.0
    assert _value(after, "partita_entries_in_total") == 6.0
    assert _value(after, "partita_entries_out_total") == 3.0
    assert _value(after, "partita_topics") == 1.0

    client.xack("orders#1", "billing", got[0][1][0][0])
    client.xadd("orders#1", {"i": 5})
    again = _samples(node.http_port)
    assert _value(again, "partita_group_pending_entries", **group) == 2.0
    assert _value(again, "partita_group_lag_entries", **group) == 3.0
    assert _value(again, "partita_partition_log_end_offset", **p1) == 6.0


def test_errors_by_command_and_code(node):
    client = node.client()
    client.ping()
    errors_before = _value(_samples(node.http_port), "partita_error_replies_total", code="ERR") or 0.0
    with pytest.raises(Exception):
        client.execute_command("XADD", "k", "notanid", "f", "v")
    samples = _samples(node.http_port)
    assert _value(samples, "partita_command_failures_total", command="xadd") == 1.0
    assert _value(samples, "partita_error_replies_total", code="ERR") == errors_before + 1


def test_fsync_rounds_are_counted_under_always(partita_factory):
    port = free_port()
    server = partita_factory(["--http-port", str(port), "--fsync", "always"])
    client = server.client()
    for i in range(3):
        client.xadd("s", {"i": i})
    samples = _samples(port)
    assert _value(samples, "partita_fsync_round_duration_seconds_count", policy="always") >= 1.0
    assert _value(samples, "partita_fsync_round_duration_seconds_sum", policy="always") > 0.0


def test_openmetrics_when_the_scraper_asks(node):
    node.client().xadd("s", {"a": 1})
    status, headers, body = _get(node.http_port, "/metrics",
                                 headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert status == 200
    assert headers["content-type"].startswith("application/openmetrics-text")
    names = {f.name for f in openmetrics_families(body.decode())}
    assert {"partita_commands", "partita_partition_log_end_offset", "partita_command_duration_seconds"} <= names


def test_requirepass_needs_basic_auth(partita_factory):
    port = free_port()
    partita_factory(["--http-port", str(port), "--requirepass", "s3cret"])
    for path in ("/metrics", "/", "/api/status"):
        status, headers, _ = _get(port, path)
        assert status == 401, path
        assert headers["www-authenticate"].startswith("Basic realm=")
    assert _get(port, "/metrics", auth=("default", "wrong"))[0] == 401
    assert _get(port, "/metrics", auth=("nobody", "s3cret"))[0] == 401
    assert _get(port, "/metrics", auth=("default", "s3cret"))[0] == 200
    assert _get(port, "/api/status", auth=("", "s3cret"))[0] == 200  # an empty name is default, as AUTH <password>
    status, headers, _ = _get(port, "/metrics", headers={"Authorization": "Bearer s3cret"})
    assert status == 401


def test_acl_users_need_the_read_category_and_see_their_keys(partita_factory):
    port = free_port()
    server = partita_factory(["--http-port", str(port), "--requirepass", "admin"])
    client = server.client(password="admin")
    client.xadd("orders", {"a": 1})
    client.xadd("secrets", {"a": 1})
    client.execute_command("ACL", "SETUSER", "prom", "on", ">scrape", "~orders*", "-@all", "+@read")
    client.execute_command("ACL", "SETUSER", "writer", "on", ">w", "~*", "-@all", "+xadd")
    client.execute_command("ACL", "SETUSER", "nearly", "on", ">n", "~*", "+@read", "-xrange")
    status, _, body = _get(port, "/metrics", auth=("writer", "w"))
    assert status == 403 and b"@read" in body
    assert _get(port, "/api/status", auth=("nearly", "n"))[0] == 403
    samples = _samples(port, auth=("prom", "scrape"))
    assert _value(samples, "partita_partition_entries", topic="orders", partition="0") == 1.0
    assert not any(dict(labels).get("topic") == "secrets" for _, labels in samples)
    status, _, body = _get(port, "/api/status", auth=("prom", "scrape"))
    assert status == 200 and b'"orders"' in body and b"secrets" not in body
    client.execute_command("ACL", "SETUSER", "prom", "off")
    assert _get(port, "/metrics", auth=("prom", "scrape"))[0] == 401


def test_read_only_paths_and_methods(node):
    status, headers, body = _get(node.http_port, "/")
    assert status == 200 and headers["content-type"].startswith("text/html") and b"console.js" in body
    assert "script-src" in headers["content-security-policy"] or "default-src 'self'" in headers[
        "content-security-policy"]
    for asset, kind in (("/console.js", "text/javascript"), ("/console.css", "text/css")):
        status, headers, body = _get(node.http_port, asset)
        assert status == 200 and headers["content-type"].startswith(kind) and body
    status, headers, body = _get(node.http_port, "/metrics", method="HEAD")
    assert status == 200 and body == b"" and int(headers["content-length"]) > 0
    assert _get(node.http_port, "/nope")[0] == 404
    status, headers, _ = _get(node.http_port, "/metrics", method="POST")
    assert status == 405 and headers["allow"] == "GET, HEAD"
    assert _get(node.http_port, "/api/status", method="DELETE")[0] == 405


def test_keep_alive_serves_several_requests_on_one_connection(node):
    conn = http.client.HTTPConnection("127.0.0.1", node.http_port, timeout=10)
    try:
        for path in ("/metrics", "/api/status", "/metrics"):
            conn.request("GET", path)
            response = conn.getresponse()
            assert response.status == 200
            response.read()
    finally:
        conn.close()


def test_garbage_gets_400_and_the_server_goes_on(node):
    with socket.create_connection(("127.0.0.1", node.http_port), timeout=10) as s:
        s.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        reply = b""
        while chunk := s.recv(4096):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 400")
    assert _get(node.http_port, "/metrics")[0] == 200
    assert node.client().ping()


def test_http_port_taken_stops_the_start(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        server = PartitaProcess(tmp_path / "data", ["--http-port", str(port)])
        with pytest.raises(RuntimeError, match=rf"Failed listening on port {port} \(http-port\)"):
            server.start()
    assert not (tmp_path / "data").exists()  # refused before the data directory was made


def test_off_by_default(partita_server):
    assert "HTTP listening" not in partita_server.log()


def test_shutdown_closes_the_http_port(node):
    assert _get(node.http_port, "/metrics")[0] == 200
    assert node.terminate() == 0

    def refused() -> bool:
        try:
            _get(node.http_port, "/metrics")
        except OSError:
            return True
        return False

    assert wait_for(refused, 5.0)


def test_every_documented_metric_is_served(node):
    documented = documented_metrics()
    assert set(documented) == {"Per partition", "Per consumer group and partition", "Per node", "Cluster"}
    client = node.client()
    client.execute_command("TOPIC", "CREATE", "t", "PARTITIONS", "2")
    client.xadd("t#0", {"a": 1})
    client.xgroup_create("t", "g", id="0")
    client.xreadgroup("g", "member", {"t": ">"})  # a topic-wide member
    client.xrange("t#0")
    samples = _samples(node.http_port)
    single = set().union(*(names for section, names in documented.items() if section != "Cluster"))
    single.discard("partita_partition_replica_lag_entries")  # followers only: the cluster test checks it
    assert not missing_from(samples, single)
    assert _value(samples, "partita_group_members", topic="t", group="g") == 1.0
    assert not any(name.startswith(("partita_controller", "partita_cluster")) for name, _ in samples)


def test_the_grafana_dashboard_uses_documented_metrics():
    import json

    dashboard = json.loads((DOCS.parent / "grafana-dashboard.json").read_text())
    used = {re.sub(r"_(bucket|sum|count)$", "", name)
            for panel in dashboard["panels"] for target in panel["targets"]
            for name in re.findall(r"partita_[a-z_]+", target["expr"])}
    documented = set().union(*documented_metrics().values())
    assert used and not used - documented, used - documented


# -- what a scanner or a wrong client sends ---------------------------------------

CONNECTIONS_MAX = 64  # docs/metrics.md: "at most 64 connections at once"


def _exchange(port: int, data: bytes, timeout_s: float = 10.0) -> bytes:
    """Send ``data`` on a fresh connection; everything the server sends back
    until it closes (``socket.timeout`` if it does not within ``timeout_s``)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
        s.sendall(data)
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    return reply


def _open_fds(node) -> int:
    return len(os.listdir(f"/proc/{node.proc.pid}/fd"))


def _closed_by_server(s: socket.socket, timeout_s: float = 10.0) -> bool:
    s.settimeout(timeout_s)
    try:
        while s.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return True


def test_what_is_not_an_http_request_line_gets_400_at_once(node):
    # HTTP/0.9, a RESP command, an inline command: no headers will follow, so
    # the answer may not wait for them (it did, 30 s).
    for data in (b"GET /\r\n", b"*1\r\n$4\r\nPING\r\n", b"PING\r\n"):
        reply = _exchange(node.http_port, data)
        assert reply.startswith(b"HTTP/1.1 400 ") and b"HTTP port" in reply, (data, reply)
    assert node.client().ping()


def test_empty_lines_before_a_request_line_are_ignored(node):
    # RFC 9112 section 2.2: a server should ignore at least one (it answered 400).
    reply = _exchange(node.http_port, b"\r\n\r\nGET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 200 ")


def test_other_http_versions_get_505(node):
    for data in (b"GET / HTTP/2.0\r\nHost: x\r\n\r\n", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
                 b"GET / HTTP/3.1\r\nHost: x\r\n\r\n"):
        reply = _exchange(node.http_port, data)
        assert reply.startswith(b"HTTP/1.1 505 "), (data, reply)


def test_a_body_declared_too_large_gets_413_before_it_is_sent(node):
    reply = _exchange(node.http_port, b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 413 ") and b"Connection: close" in reply


def test_a_chunked_body_too_large_gets_413(node):
    chunk = b"4000\r\n" + b"x" * 0x4000 + b"\r\n"
    reply = _exchange(node.http_port, b"GET /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                      + chunk * 3 + b"0\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 413 ")


def test_a_body_framed_both_ways_gets_400_and_a_close(node):
    # RFC 9112 section 6.3: the connection must not go on after such a request
    # (a proxy in front may have framed it by Content-Length: request smuggling).
    reply = _exchange(node.http_port, b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
                                      b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 400 ") and reply.count(b"HTTP/1.1 ") == 1


def test_expect_100_continue_is_answered(node):
    with socket.create_connection(("127.0.0.1", node.http_port), timeout=10) as s:
        s.sendall(b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
        assert s.recv(65536).startswith(b"HTTP/1.1 100 Continue\r\n")
        s.sendall(b"hello")
        assert s.recv(65536).startswith(b"HTTP/1.1 405 ")


def test_absolute_form_and_percent_encoded_targets(node):
    assert _get(node.http_port, f"http://127.0.0.1:{node.http_port}/metrics")[0] == 200
    assert _get(node.http_port, "/%6Detrics?x=1")[0] == 200
    assert _get(node.http_port, "/%2E%2E/metrics")[0] == 404
    assert _get(node.http_port, "/../metrics")[0] == 404


def test_a_request_head_over_16_kib_gets_431(node):
    for data in (b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
                 b"GET / HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(3000)) + b"\r\n"):
        assert _exchange(node.http_port, data).startswith(b"HTTP/1.1 431 ")


def test_idle_connections_do_not_keep_new_clients_out(node):
    redis = node.client()
    assert redis.ping() and _get(node.http_port, "/metrics")[0] == 200
    baseline = _open_fds(node)
    idle = [socket.create_connection(("127.0.0.1", node.http_port), timeout=10)
            for _ in range(CONNECTIONS_MAX + 10)]
    try:
        assert _get(node.http_port, "/metrics")[0] == 200  # was reset: 64 idle clients held every slot
        assert _closed_by_server(idle[0])  # the idlest made room
        assert redis.ping()
    finally:
        for s in idle:
            s.close()
    assert wait_for(lambda: _open_fds(node) <= baseline, 10.0)  # (<=: the scrape before may still be closing)


def test_when_every_connection_is_busy_a_new_client_gets_503(node):
    redis = node.client()
    assert redis.ping()
    baseline = _open_fds(node)
    busy = [socket.create_connection(("127.0.0.1", node.http_port), timeout=10) for _ in range(CONNECTIONS_MAX)]
    try:
        for s in busy:
            s.sendall(b"GET /metrics HT")  # one byte at a time, a request in progress
        for s in busy:  # each is a request in progress once a byte more gets its answer
            s.sendall(b"TP/1.1\r\nHost: x\r\n\r\nGET /metrics HT")
            assert s.recv(1).startswith(b"H")
        status, headers, body = _get(node.http_port, "/metrics")
        assert status == 503 and headers["retry-after"] == "1" and b"Busy" in body
        assert redis.ping()
    finally:
        for s in busy:
            s.close()
    assert wait_for(lambda: _open_fds(node) <= baseline, 10.0)  # (<=: the scrape before may still be closing)
    assert _get(node.http_port, "/metrics")[0] == 200
