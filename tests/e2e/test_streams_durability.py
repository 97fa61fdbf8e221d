"""Streams survive kill -9: every acknowledged XADD (fsync always), XDEL,
XSETID and trim is there after a restart."""

from __future__ import annotations

import threading
import time

from tests.e2e.streams_support import RespClient, info_pairs, parse


def test_acknowledged_entries_survive_sigkill(partita_factory):
    server = partita_factory(["--fsync", "always"])
    acked: list[bytes] = []
    stop = threading.Event()

    def write():
        try:
            with RespClient(server.port) as c:
                n = 0
                while not stop.is_set():
                    n += 1
                    reply = c.call("XADD", "orders", "*", "n", str(n), "payload", "x" * (n % 50))
                    value = parse(reply)
                    assert isinstance(value, bytes) and b"-" in value, reply
                    acked.append(value)
        except (ConnectionError, OSError):
            pass  # the server was killed mid-request: that one was not acknowledged

    writer = threading.Thread(target=write)
    writer.start()
    deadline = time.monotonic() + 10
    while len(acked) < 300 and time.monotonic() < deadline:
        time.sleep(0.01)
    server.kill9()
    stop.set()
    writer.join(timeout=10)
    assert len(acked) >= 300
    server.start()
    with RespClient(server.port) as c:
        entries = parse(c.call("XRANGE", "orders", "-", "+"))
        ids = [e[0] for e in entries]
        assert ids[: len(acked)] == acked  # at most one unacknowledged entry may follow
        assert len(ids) - len(acked) in (0, 1)
        for n, (_, fields) in enumerate(entries[: len(acked)], start=1):
            assert fields == [b"n", b"%d" % n, b"payload", b"x" * (n % 50)]
        # New IDs continue after the recovered ones.
        new_id = parse(c.call("XADD", "orders", "*", "after", "restart"))
        last = tuple(map(int, ids[-1].split(b"-")))
        assert tuple(map(int, new_id.split(b"-"))) > last


def test_xdel_xsetid_and_trim_survive_sigkill(partita_factory):
    server = partita_factory(["--fsync", "always"])
    with RespClient(server.port) as c:
        for n in range(1, 11):
            c.call("XADD", "s", f"{n}-0", "n", str(n))
        assert c.call("XDEL", "s", "3-0", "10-0") == b":2\r\n"
        assert c.call("XTRIM", "s", "MAXLEN", "6") == b":2\r\n"
        assert c.call("XSETID", "s", "20-0", "ENTRIESADDED", "30", "MAXDELETEDID", "15-0") == b"+OK\r\n"
        c.call("XADD", "t", "5-5", "k", "v")
        c.call("XDEL", "t", "5-5")  # an empty stream remembers its last ID
        before_s = c.call("XINFO", "STREAM", "s")
        before_t = c.call("XINFO", "STREAM", "t")
        before_range = c.call("XRANGE", "s", "-", "+")
        before_offsets = _offsets(c, "s")
    server.kill9()
    server.start()
    with RespClient(server.port) as c:
        assert c.call("XRANGE", "s", "-", "+") == before_range
        assert parse(c.call("XRANGE", "s", "-", "+"))[0][0] == b"4-0"
        after_s = dict(info_pairs(c.call("XINFO", "STREAM", "s")))
        want_s = dict(info_pairs(before_s))
        for field in (b"length", b"last-generated-id", b"max-deleted-entry-id", b"entries-added",
                      b"recorded-first-entry-id"):
            assert after_s[field] == want_s[field], field
        assert _offsets(c, "s") == before_offsets == (3, 10)  # the log start and end (TOPIC DESCRIBE)
        assert after_s[b"last-generated-id"] == b"20-0" and after_s[b"entries-added"] == 30
        after_t = dict(info_pairs(c.call("XINFO", "STREAM", "t")))
        want_t = dict(info_pairs(before_t))
        assert after_t[b"length"] == 0 and after_t[b"last-generated-id"] == want_t[b"last-generated-id"] == b"5-5"
        assert c.call("XADD", "t", "5-5", "k", "v").startswith(b"-ERR The ID specified in XADD is equal or smaller")
        assert c.call("XADD", "s", "20-0", "k", "v").startswith(b"-ERR The ID specified in XADD is equal or smaller")
        assert c.call("XADD", "s", "20-*", "k", "v") == b"$4\r\n20-1\r\n"


def _offsets(c: RespClient, topic: str) -> tuple[int, int]:
    """A one-partition topic's log start and end offsets (TOPIC DESCRIBE)."""
    desc = parse(c.call("TOPIC", "DESCRIBE", topic))
    desc = dict(desc) if isinstance(desc[0], tuple) else dict(zip(desc[0::2], desc[1::2]))
    [part] = desc[b"partition-info"]
    part = dict(part) if isinstance(part[0], tuple) else dict(zip(part[0::2], part[1::2]))
    return part[b"log-start-offset"], part[b"log-end-offset"]


def test_delete_and_recreate_survive_restart(partita_factory):
    server = partita_factory(["--fsync", "always"])
    with RespClient(server.port) as c:
        c.call("XADD", "a", "1-1", "k", "v")
        c.call("XADD", "b", "1-1", "k", "v")
        c.call("DEL", "a")
        c.call("XADD", "a", "2-2", "k", "v2")
    server.restart()  # clean SIGTERM
    with RespClient(server.port) as c:
        assert parse(c.call("KEYS", "*")) == [b"a", b"b"]
        assert parse(c.call("XRANGE", "a", "-", "+")) == [[b"2-2", [b"k", b"v2"]]]
        assert c.call("DBSIZE") == b":2\r\n"


def _active_segment(data_dir):
    return max(data_dir.rglob("*.log"), key=lambda p: p.stat().st_mtime_ns)


def test_fsync_always_writes_zeros_ahead_and_a_clean_stop_trims_them(partita_factory):
    """CONFIG SET appendfsync always turns on preallocation for the open
    streams; kill -9 leaves the zeros for recovery, a clean stop cuts them."""
    server = partita_factory(["--fsync", "everysec"])
    with RespClient(server.port) as c:
        c.call("XADD", "s", "1-0", "n", "1")
        seg = _active_segment(server.data_dir)
        assert not seg.read_bytes().endswith(bytes(64))
        assert c.call("CONFIG", "SET", "appendfsync", "always") == b"+OK\r\n"
        for n in range(2, 12):
            c.call("XADD", "s", f"{n}-0", "n", str(n))
        assert seg.read_bytes().endswith(bytes(32 * 1024))
    server.kill9()
    server.extra_args = ["--fsync", "always"]
    server.start()
    with RespClient(server.port) as c:
        assert [e[0] for e in parse(c.call("XRANGE", "s", "-", "+"))] == [b"%d-0" % n for n in range(1, 12)]
        c.call("XADD", "s", "12-0", "n", "12")
        assert seg.read_bytes().endswith(bytes(32 * 1024))
    server.stop()
    data = seg.read_bytes()
    assert data.endswith(b"12\r\n")  # the last entry's value, no zeros after it
    server.start()
    with RespClient(server.port) as c:
        assert len(parse(c.call("XRANGE", "s", "-", "+"))) == 12
