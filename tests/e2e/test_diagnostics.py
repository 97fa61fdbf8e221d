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

from server.resp import encode_command
from tests.conftest import RawConn, wait_for


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
