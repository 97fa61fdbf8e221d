"""MONITOR, SLOWLOG, LATENCY and MEMORY beside a real redis-server 7.0.

Where Partita means to match Redis byte for byte (the monitor's lines and
its own replies, the slow log's entries, every error text, HELP, the
doctors' fixed texts) the same bytes go to both servers and the replies are
compared, with only what differs between two runs made equal (the time,
the client's port, a command's duration). What Redis cannot show here
(latency events: redis-server has no slow stream command, Partita no DEBUG
SLEEP; MEMORY USAGE of a stream key: Partita's is its in-memory cost, see
docs/streams.md) is checked as a specification.
"""

from __future__ import annotations

import re
import socket
import time

import hiredis
import pytest

from server.resp import encode_command
from tests.conftest import RawConn, same_reply, wait_for

QUIET_S = 0.3


def cmd(*args: bytes | str) -> bytes:
    return encode_command([a.encode() if isinstance(a, str) else a for a in args])


class Monitor:
    """A raw client that sent MONITOR: reads what it is sent, line by line."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.addr = ""
        self.buf = b""
        self.sock.sendall(cmd("CLIENT", "INFO") + cmd("MONITOR"))
        info = self.read_until(lambda b: b.endswith(b"+OK\r\n"))
        self.addr = re.search(rb" addr=(\S+)", info).group(1).decode()

    def read_until(self, done, timeout_s: float = 10.0) -> bytes:
        """Everything received until ``done(received)`` holds."""
        deadline = time.monotonic() + timeout_s
        while not done(self.buf):
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError(f"closed after {self.buf!r}")
            self.buf += data
        out, self.buf = self.buf, b""
        return out

    def lines_until(self, marker: bytes) -> bytes:
        """What was received up to and including the line that ends with ``marker``."""
        return self.read_until(lambda b: marker + b"\r\n" in b)

    def close(self) -> None:
        self.sock.close()


def normalized(data: bytes, addrs: dict[str, str]) -> bytes:
    """Monitor output with each line's time (checked: now, to the µs) and
    its client's address (one of ``addrs``, shown by name) made equal."""
    now_s = time.time()

    def line(m: re.Match) -> bytes:
        stamp = float(m.group(1))
        assert abs(stamp - now_s) < 30, m.group(0)
        assert re.fullmatch(rb"\d+\.\d{6}", m.group(1)), m.group(0)
        addr = m.group(2).decode()
        assert addr in addrs, (addr, addrs)
        return b"+<time> [0 " + addrs[addr].encode() + b"] "

    return re.sub(rb"\+(\d+\.\d+) \[0 ([^\]]+)\] ", line, data)


def client_addr(conn: RawConn) -> str:
    info = conn.request(cmd("CLIENT", "INFO"))
    return re.search(rb" addr=(\S+)", info).group(1).decode()


def both(partita, redis_server):
    return (("partita", partita), ("redis", redis_server))


# -- MONITOR --------------------------------------------------------------------

# Every command as Redis prints it: binary arguments quoted as sdscatrepr
# quotes them, AUTH / HELLO AUTH redacted, admin commands (CONFIG, SLOWLOG,
# MONITOR) and refused ones (unknown, wrong arity) not shown, a transaction's
# commands shown as they run.
MONITORED = [
    cmd("XADD", "s", "1-1", "f", b"a\x00b\"\\\n\r\t\x07\x08\xff\x7f ~"),
    cmd("XLEN", "s"),
    cmd("XRANGE", "s", "-", "+", "COUNT", "1"),
    cmd("AUTH", "secret"),
    cmd("AUTH", "someone", "secret"),
    cmd("HELLO", "3", "AUTH", "default", "secret", "SETNAME", "x"),
    cmd("HELLO", "2", "SETNAME", "named"),
    cmd("CLIENT", "SETNAME", "renamed"),
    cmd("MULTI"), cmd("XLEN", "s"), cmd("PING"), cmd("EXEC"),
    cmd("ECHO", ""),
    b"PING inline\r\n",
    cmd("CONFIG", "SET", "slowlog-max-len", "128"),
    cmd("SLOWLOG", "LEN"),
    cmd("NOSUCHCOMMAND", "x"),
    cmd("XLEN"),
    cmd("ECHO", "end"),
]


def test_monitor_shows_every_command_as_redis_does(partita_server, redis_server):
    seen = {}
    for name, server in both(partita_server, redis_server):
        monitor = Monitor(server.port)
        with RawConn(server.port) as client:
            addrs = {client_addr(client): "client", monitor.addr: "monitor"}
            for payload in MONITORED:
                client.request(payload)
            seen[name] = normalized(monitor.lines_until(b'"ECHO" "end"'), addrs)
        monitor.close()
    assert seen["partita"] == seen["redis"]
    assert b'"XADD" "s" "1-1" "f" "a\\x00b\\"\\\\\\n\\r\\t\\a\\b\\xff\\x7f ~"' in seen["partita"]
    assert b'"AUTH" "(redacted)" "(redacted)"' in seen["partita"]


def test_monitor_own_commands_and_their_order_match_redis(partita_server, redis_server):
    """A monitor runs commands that do not touch keys, each reply before its
    own line; keyspace ones are refused (and fail its transaction, as any
    refused command does); a second MONITOR is not answered; its QUIT is
    answered, not shown to it, and closes it."""
    own = (cmd("PING") + cmd("XLEN", "s") + cmd("ECHO", "x")
           + cmd("MULTI") + cmd("XLEN", "s") + cmd("PING") + cmd("EXEC")
           + cmd("MONITOR") + cmd("CLIENT", "GETNAME") + cmd("XADD", "s", "*", "f", "v")
           + cmd("ECHO", "end"))
    seen = {}
    for name, server in both(partita_server, redis_server):
        monitor = Monitor(server.port)
        monitor.sock.sendall(own)
        got = monitor.lines_until(b'"ECHO" "end"')
        monitor.sock.sendall(cmd("QUIT"))
        got += monitor.read_until(lambda b: b.endswith(b"+OK\r\n"))
        monitor.sock.settimeout(5)
        assert monitor.sock.recv(100) == b""  # closed
        seen[name] = normalized(got, {monitor.addr: "monitor"})
        monitor.close()
    assert seen["partita"] == seen["redis"]
    assert b"-EXECABORT" in seen["partita"]


def test_monitor_reset_ends_monitoring_as_redis_does(partita_server, redis_server):
    """RESET, even pipelined right after MONITOR, ends it: the client's next
    commands are plain again (XLEN runs) and no longer show lines."""
    payload = cmd("MONITOR") + cmd("RESET") + cmd("XLEN", "never-written") + cmd("PING")
    same_reply(partita_server, redis_server, payload, quiet_s=QUIET_S)


def test_monitor_protocol_error_matches_redis(partita_server, redis_server):
    """A monitor that sends garbage gets the lines before it, then Redis's
    protocol error, and is closed."""
    seen = {}
    for name, server in both(partita_server, redis_server):
        monitor = Monitor(server.port)
        monitor.sock.sendall(cmd("ECHO", "before") + b"*1\r\n$abc\r\n")
        got = monitor.read_until(lambda b: b.endswith(b"\r\n") and b"Protocol error" in b)
        monitor.sock.settimeout(5)
        assert monitor.sock.recv(100) == b""  # closed
        seen[name] = normalized(got, {monitor.addr: "monitor"})
        monitor.close()
    assert seen["partita"] == seen["redis"]


def test_monitor_sees_each_pipelined_xadd_and_stops_with_its_client(partita_server):
    """While a monitor is attached the pipelined XADD path steps aside (each
    command is shown); once it leaves, the path is taken again and the
    monitor is gone from CLIENT LIST."""
    r = partita_server.client()

    def pipelined_calls() -> int:
        return r.info("partita")["xadd_pipelined_calls"]

    run = b"".join(cmd("XADD", "p", "*", "n", str(i)) for i in range(50))
    monitor = Monitor(partita_server.port)
    before = pipelined_calls()
    with RawConn(partita_server.port) as client:
        client.request(run + cmd("ECHO", "end"), replies=51)
    lines = monitor.lines_until(b'"ECHO" "end"')
    assert [int(n) for n in re.findall(rb'"XADD" "p" "\*" "n" "(\d+)"', lines)] == list(range(50))
    assert pipelined_calls() == before
    assert "flags=O" in r.execute_command("CLIENT", "LIST").decode()
    monitor.close()
    assert wait_for(lambda: "flags=O" not in r.execute_command("CLIENT", "LIST").decode())
    with RawConn(partita_server.port) as client:
        client.request(run, replies=50)
    assert pipelined_calls() > before


def test_monitor_through_redis_py(partita_server):
    """redis-py's Monitor parses the lines (time, db, address, command)."""
    r = partita_server.client()
    other = partita_server.client()
    other.ping()  # (its connection's handshake before the monitor)
    with r.monitor() as m:
        other.xadd("rp", {"f": "v w"}, id="1-1")
        other.xlen("rp")
        commands = [m.next_command() for _ in range(2)]
    assert [c["command"] for c in commands] == ["XADD rp 1-1 f v w", "XLEN rp"]
    assert all(c["db"] == 0 and abs(c["time"] - time.time()) < 30 for c in commands)


def test_monitor_shows_a_blocking_read_once_when_called_as_redis_does(partita_server, redis_server):
    seen = {}
    for name, server in both(partita_server, redis_server):
        r = server.client()
        r.ping()  # (its handshake before the monitor; CLIENT LIST, an admin command, is not shown)
        monitor = Monitor(server.port)
        with RawConn(server.port) as reader, RawConn(server.port) as writer:
            addrs = {monitor.addr: "monitor", client_addr(reader): "reader", client_addr(writer): "writer"}
            reader.sock.sendall(cmd("XREAD", "BLOCK", "0", "STREAMS", "b", "$"))
            assert wait_for(lambda: b"flags=b" in r.execute_command("CLIENT", "LIST"))
            writer.request(cmd("ECHO", "blocked"))
            writer.request(cmd("XADD", "b", "1-1", "f", "v"))
            reader.request(b"", replies=1)
            writer.request(cmd("ECHO", "end"))
            seen[name] = normalized(monitor.lines_until(b'"ECHO" "end"'), addrs)
        monitor.close()
        r.close()
    assert seen["partita"] == seen["redis"]


# -- SLOWLOG -----------------------------------------------------------------------

LOGGED = [
    cmd("XADD", "sl", "1-1", "f", "v"),
    cmd("XLEN", "sl"),
    cmd("AUTH", "secret"),
    cmd("AUTH", "someone", "secret"),
    cmd("HELLO", "2", "AUTH", "default", "secret"),
    cmd("CONFIG", "SET", "masterauth", "secret"),
    cmd("CONFIG", "SET", "masterauth", "secret", "slowlog-max-len", "128"),
    cmd("ACL", "SETUSER", "someone", ">secret", "on"),
    cmd("ACL", "DELUSER", "someone"),
    cmd("MULTI"), cmd("XLEN", "sl"), cmd("EXEC"),
    cmd("XLEN", "k" * 200),
    cmd("XDEL", "sl", *[f"9-{i}" for i in range(40)]),
    cmd("NOSUCHCOMMAND"),
    cmd("XLEN"),
    cmd("CLIENT", "SETNAME", "slow"),
    cmd("XRANGE", "sl", "-", "+"),
]


def slowlog_entries(conn: RawConn, addr: str) -> list:
    """SLOWLOG GET -1 with each entry's id made relative to the oldest, its
    time and duration checked and dropped, its address checked."""
    reader = hiredis.Reader()
    reader.feed(conn.request(cmd("SLOWLOG", "GET", "-1")))
    entries = reader.gets()
    first_id = entries[-1][0] if entries else 0
    out = []
    for entry_id, stamp, duration_us, args, entry_addr, name in entries:
        assert abs(stamp - time.time()) < 30 and duration_us >= 0
        assert entry_addr.decode() == addr
        out.append((entry_id - first_id, args, name))
    return out


def test_slowlog_entries_match_redis(partita_server, redis_server):
    """slowlog-log-slower-than 0 logs every command that ran (not the refused
    ones, not EXEC), with Redis's truncation of long arguments and argument
    lists and its redaction of passwords; -1 logs nothing, not even the
    CONFIG SET that turned it off."""
    seen = {}
    for name, server in both(partita_server, redis_server):
        with RawConn(server.port) as conn:
            addr = client_addr(conn)
            conn.request(cmd("CONFIG", "SET", "slowlog-log-slower-than", "0") + cmd("SLOWLOG", "RESET"), replies=2)
            for payload in LOGGED:
                conn.request(payload)
            conn.request(cmd("CONFIG", "SET", "slowlog-log-slower-than", "-1") + cmd("XLEN", "sl"), replies=2)
            seen[name] = slowlog_entries(conn, addr)
            assert conn.request(cmd("CONFIG", "SET", "slowlog-log-slower-than", "10000")) == b"+OK\r\n"
    assert seen["partita"] == seen["redis"]
    logged = {tuple(args) for _, args, _ in seen["partita"]}
    assert (b"AUTH", b"(redacted)", b"(redacted)") in logged
    assert (b"ACL", b"SETUSER", b"(redacted)", b"(redacted)", b"(redacted)") in logged
    assert (b"XLEN", b"k" * 128 + b"... (72 more bytes)") in logged


def test_slowlog_redacts_passwords_of_refused_auth_too(partita_server):
    """Where Redis refuses AUTH / HELLO before it reads their passwords and
    so shows them, Partita still redacts them (docs/diagnostics.md)."""
    with RawConn(partita_server.port) as conn:
        addr = client_addr(conn)
        conn.request(cmd("CONFIG", "SET", "slowlog-log-slower-than", "0") + cmd("SLOWLOG", "RESET")
                     + cmd("AUTH", "a", "secret", "c") + cmd("HELLO", "4", "AUTH", "default", "secret")
                     + cmd("CONFIG", "SET", "slowlog-log-slower-than", "-1"), replies=5)
        logged = [args for _, args, _ in slowlog_entries(conn, addr)]
    assert [b"AUTH", b"(redacted)", b"(redacted)", b"(redacted)"] in logged
    assert [b"HELLO", b"4", b"AUTH", b"(redacted)", b"(redacted)"] in logged


def test_slowlog_max_len_len_reset_and_thresholds_match_redis(partita_server, redis_server):
    payload = (cmd("CONFIG", "SET", "slowlog-log-slower-than", "0") + cmd("SLOWLOG", "RESET")
               + cmd("CONFIG", "SET", "slowlog-max-len", "2")
               + cmd("ECHO", "a") + cmd("ECHO", "b") + cmd("ECHO", "c") + cmd("SLOWLOG", "LEN")
               + cmd("CONFIG", "SET", "slowlog-max-len", "0") + cmd("ECHO", "d") + cmd("SLOWLOG", "LEN")
               + cmd("CONFIG", "SET", "slowlog-max-len", "128")
               + cmd("CONFIG", "SET", "slowlog-log-slower-than", "100000000") + cmd("SLOWLOG", "RESET")
               + cmd("ECHO", "e") + cmd("SLOWLOG", "LEN") + cmd("SLOWLOG", "GET", "0")
               + cmd("CONFIG", "SET", "slowlog-log-slower-than", "10000"))
    same_reply(partita_server, redis_server, payload, quiet_s=QUIET_S)


def blocked_reads_logged(server, threshold: str) -> list:
    """The slow log's XREADs after one blocked 200 ms and timed out."""
    payload = (cmd("CONFIG", "SET", "slowlog-log-slower-than", threshold) + cmd("SLOWLOG", "RESET")
               + cmd("XREAD", "BLOCK", "200", "STREAMS", "nothing-here", "$")
               + cmd("CONFIG", "SET", "slowlog-log-slower-than", "-1"))
    with RawConn(server.port) as conn:
        addr = client_addr(conn)
        try:
            conn.request(payload, replies=4)
            return [args for _, args, _ in slowlog_entries(conn, addr) if args[0] == b"XREAD"]
        finally:
            conn.request(cmd("CONFIG", "SET", "slowlog-log-slower-than", "10000"))


def test_slowlog_counts_what_a_blocked_command_ran_not_its_wait(partita_server, redis_server):
    """A read blocked 200 ms ran for far less: under a 100 ms threshold it is
    not logged, as in Redis. Under 0 it is, once, when it times out: Redis
    7.2+ counts a timed-out blocked command (blocked.c
    replyToBlockedClientTimedOut calls updateStatsOnUnblock); 7.0 did not."""
    assert blocked_reads_logged(partita_server, "100000") == blocked_reads_logged(redis_server, "100000") == []
    assert blocked_reads_logged(partita_server, "0") == [[b"XREAD", b"BLOCK", b"200", b"STREAMS", b"nothing-here",
                                                          b"$"]]


SLOWLOG_ERRORS = [
    cmd("SLOWLOG"), cmd("SLOWLOG", "GET", "-2"), cmd("SLOWLOG", "GET", "x"), cmd("SLOWLOG", "GET", "1", "2"),
    cmd("SLOWLOG", "LEN", "x"), cmd("SLOWLOG", "RESET", "x"), cmd("SLOWLOG", "NOSUCH"), cmd("SLOWLOG", "HELP"),
    cmd("SLOWLOG", "HELP", "x"),
    cmd("CONFIG", "SET", "slowlog-log-slower-than", "-2"), cmd("CONFIG", "SET", "slowlog-max-len", "-1"),
    cmd("CONFIG", "SET", "slowlog-max-len", "x"), cmd("CONFIG", "GET", "slowlog-max-len"),
    cmd("CONFIG", "GET", "slowlog-log-slower-than"),
]


@pytest.mark.parametrize("payload", SLOWLOG_ERRORS, ids=lambda p: repr(p[:40]))
def test_slowlog_replies_and_errors_match_redis(partita_shared, redis_server, payload):
    same_reply(partita_shared, redis_server, payload, quiet_s=QUIET_S)


# -- LATENCY -----------------------------------------------------------------------

LATENCY_SAME = [
    cmd("LATENCY"), cmd("LATENCY", "NOSUCH"), cmd("LATENCY", "LATEST", "x"), cmd("LATENCY", "HISTORY"),
    cmd("LATENCY", "HISTORY", "a", "b"), cmd("LATENCY", "HISTORY", "nosuch"), cmd("LATENCY", "GRAPH"),
    cmd("LATENCY", "GRAPH", "nosuch"), cmd("LATENCY", "RESET", "nosuch", "other"), cmd("LATENCY", "DOCTOR", "x"),
    cmd("LATENCY", "HELP", "x"),
    cmd("CONFIG", "SET", "latency-monitor-threshold", "-1"), cmd("CONFIG", "SET", "latency-monitor-threshold", "x"),
    cmd("CONFIG", "GET", "latency-monitor-threshold"),
]


@pytest.mark.parametrize("payload", LATENCY_SAME, ids=lambda p: repr(p[:40]))
def test_latency_errors_match_redis(partita_shared, redis_server, payload):
    same_reply(partita_shared, redis_server, payload, quiet_s=QUIET_S)


def test_latency_without_events_matches_redis(partita_server, redis_server):
    """No events: LATEST empty, RESET 0, DOCTOR's two texts (off / on).
    (Both processes without transparent huge pages, else each doctor adds
    its advice about them: redis-server disables them for itself.)"""
    with open(f"/proc/{partita_server.proc.pid}/smaps_rollup") as f:
        if any(line.startswith("AnonHugePages:") and line.split()[1] != "0" for line in f):
            pytest.skip("partita has transparent huge pages: LATENCY DOCTOR advises about them")
    payload = (cmd("LATENCY", "LATEST") + cmd("LATENCY", "RESET") + cmd("LATENCY", "DOCTOR")
               + cmd("CONFIG", "SET", "latency-monitor-threshold", "100000") + cmd("LATENCY", "DOCTOR")
               + cmd("CONFIG", "SET", "latency-monitor-threshold", "0"))
    same_reply(partita_server, redis_server, payload, quiet_s=QUIET_S)


def test_latency_help_is_redis_without_histogram(partita_shared, redis_server):
    """Partita keeps no per-command histograms: HELP leaves HISTOGRAM out,
    and LATENCY HISTOGRAM is an unknown subcommand (docs/streams.md)."""
    r, ref = partita_shared.client(), redis_server.client()
    ours, theirs = r.execute_command("LATENCY", "HELP"), ref.execute_command("LATENCY", "HELP")
    at = theirs.index(b"HISTOGRAM [COMMAND ...]")
    assert ours == theirs[:at] + theirs[at + 3:]
    with pytest.raises(Exception, match=r"unknown subcommand 'HISTOGRAM'. Try LATENCY HELP."):
        r.execute_command("LATENCY", "HISTOGRAM")


def test_latency_records_slow_commands(partita_server):
    """A command of latency-monitor-threshold ms or more is an event, named
    as Redis names it (XDEL is a fast command: ``fast-command``): LATEST,
    HISTORY, GRAPH and DOCTOR show it, RESET forgets it."""
    r = partita_server.client()
    pipe = r.pipeline(transaction=False)
    for i in range(5000):
        pipe.xadd("big", {"field": "value", "n": i})
    ids = pipe.execute()
    r.config_set("latency-monitor-threshold", 1)
    chunks = iter(range(0, len(ids), 500))

    def event() -> bool:
        """An XDEL of 500 entries (tens of ms here) until one is an event."""
        start = next(chunks, None)
        if start is not None:
            r.xdel("big", *ids[start:start + 500])
        return any(e[0] == b"fast-command" for e in r.execute_command("LATENCY", "LATEST"))

    assert wait_for(event, timeout_s=60)
    r.config_set("latency-monitor-threshold", 0)
    (_, stamp, latest_ms, max_ms), = [e for e in r.execute_command("LATENCY", "LATEST") if e[0] == b"fast-command"]
    assert abs(stamp - time.time()) < 60 and 1 <= latest_ms <= max_ms
    history = r.execute_command("LATENCY", "HISTORY", "fast-command")
    assert history and all(len(s) == 2 and s[1] >= 1 for s in history)
    assert r.execute_command("LATENCY", "HISTORY", "FAST-COMMAND") == []  # names are exact, as in Redis
    graph = r.execute_command("LATENCY", "GRAPH", "fast-command").decode()
    assert graph.startswith("fast-command - high ") and "-" * 80 in graph
    doctor = r.execute_command("LATENCY", "DOCTOR").decode()
    # Other events may come first (any command of 1 ms or more on a loaded machine).
    assert doctor.startswith("Dave, I have observed latency spikes") and re.search(r"\n\d+\. fast-command: ", doctor)
    assert r.execute_command("LATENCY", "RESET", "FAST-COMMAND") == 1  # (any case, as in Redis)
    assert r.execute_command("LATENCY", "HISTORY", "fast-command") == []


# -- MEMORY ------------------------------------------------------------------------

MEMORY_SAME = [
    cmd("MEMORY"), cmd("MEMORY", "NOSUCH"), cmd("MEMORY", "HELP"), cmd("MEMORY", "HELP", "x"),
    cmd("MEMORY", "USAGE"), cmd("MEMORY", "USAGE", "nosuchkey"), cmd("MEMORY", "USAGE", "nosuchkey", "SAMPLES", "0"),
    cmd("MEMORY", "USAGE", "k", "SAMPLES"), cmd("MEMORY", "USAGE", "k", "SAMPLES", "x"),
    cmd("MEMORY", "USAGE", "k", "SAMPLES", "-1"), cmd("MEMORY", "USAGE", "k", "NOSUCH", "1"),
    cmd("MEMORY", "STATS", "x"), cmd("MEMORY", "DOCTOR", "x"), cmd("MEMORY", "PURGE", "x"),
    cmd("MEMORY", "MALLOC-STATS", "x"), cmd("MEMORY", "PURGE"),
]


@pytest.mark.parametrize("payload", MEMORY_SAME, ids=lambda p: repr(p[:40]))
def test_memory_replies_and_errors_match_redis(partita_shared, redis_server, payload):
    same_reply(partita_shared, redis_server, payload, quiet_s=QUIET_S)


def test_resp3_replies_match_redis(partita_server, redis_server):
    """In RESP3: the doctors' reports are verbatim strings, MEMORY USAGE of a
    missing key is RESP3's null, the lists stay arrays."""
    batch = [cmd("LATENCY", "DOCTOR"), cmd("MEMORY", "DOCTOR"), cmd("MEMORY", "USAGE", "nosuch"),
             cmd("SLOWLOG", "GET", "0"), cmd("LATENCY", "LATEST"), cmd("LATENCY", "HISTORY", "command"),
             cmd("MEMORY", "HELP"), cmd("SLOWLOG", "HELP")]
    seen = {}
    for name, server in both(partita_server, redis_server):
        with RawConn(server.port) as conn:
            conn.request(cmd("HELLO", "3"))
            seen[name] = conn.request(b"".join(batch), replies=len(batch))
    assert seen["partita"] == seen["redis"]
    assert seen["partita"].startswith(b"=")


def test_memory_doctor_of_an_instance_with_little_data_matches_redis(partita_server, redis_server):
    partita_server.client().xadd("few", {"f": "v"})
    redis_server.client().xadd("few", {"f": "v"})
    same_reply(partita_server, redis_server, cmd("MEMORY", "DOCTOR"), quiet_s=QUIET_S)


def test_memory_usage_of_a_stream_is_its_in_memory_cost(partita_server):
    """What the stream's open partitions hold in memory: it grows with what
    is kept in memory per entry (deletion markers: 8 bytes each; pending
    entries of a group), not with the entries' bytes on disk."""
    r = partita_server.client()
    ids = [r.xadd("mem", {"f": "v"}) for _ in range(500)]
    base = r.memory_usage("mem")
    assert isinstance(base, int) and base > 0
    r.xdel("mem", *ids[:400])
    after_deletes = r.memory_usage("mem", samples=0)
    assert after_deletes >= base + 8 * 400
    r.xgroup_create("mem", "g", "0")
    r.xreadgroup("g", "c", {"mem": ">"})
    assert r.memory_usage("mem", samples=0) > after_deletes + 100 * 50
    assert r.memory_usage("nosuch") is None


def test_memory_stats_fields(partita_shared):
    stats = partita_shared.client().memory_stats()
    for field in ("peak.allocated", "total.allocated", "startup.allocated", "keys.count", "dataset.bytes"):
        assert isinstance(stats[field], int), field
    assert stats["total.allocated"] > 0 and stats["peak.allocated"] >= stats["total.allocated"]
