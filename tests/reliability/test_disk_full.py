"""Disk full: the server's data dir on a 4 MiB tmpfs, filled to the last byte.

Writes (XADD, XREADGROUP's delivery record, XACK) get
``-MISCONF Errors writing to the partition log: No space left on device``
and change nothing; reads and other clients carry on; once space is freed,
writes resume, and the log and group state are exactly what was
acknowledged, also after kill -9 and a restart (docs/guarantees.md).

Needs root (mount); skipped with the reason otherwise.
"""

from __future__ import annotations

import os
import subprocess
import sys

import hiredis
import pytest

from tests.conftest import REPO, PartitaProcess
from tests.reliability.crashkit import Conn, check_fields, make_fields

MISCONF = "MISCONF Errors writing to the partition log: No space left on device"


@pytest.fixture
def small_fs(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a 4 MiB tmpfs (needs root): {proc.stderr.strip() or proc.returncode}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _fill(path) -> None:
    """Write zeros until the file system is full."""
    with open(path, "wb", buffering=0) as f:
        for size in (1 << 16, 4096, 512, 1):
            try:
                while True:
                    f.write(b"\0" * size)
            except OSError:
                pass


def _is_misconf(reply) -> bool:
    return isinstance(reply, hiredis.ReplyError) and str(reply) == MISCONF


def test_disk_full_refuses_writes_cleanly_and_recovers(small_fs, tmp_path):
    server = PartitaProcess(small_fs / "data", ["--fsync", "always"])
    server.log_path = tmp_path / "server.log"  # the log must not share the full disk
    server.start()
    try:
        c = Conn(server.port)
        acked: list[tuple[bytes, int]] = []
        seq = 0

        def xadd():
            nonlocal seq
            reply = c.call(b"XADD", b"s", b"*", *make_fields(0, seq))
            if not isinstance(reply, hiredis.ReplyError):
                acked.append((reply, seq))
            seq += 1
            return reply

        for _ in range(300):  # more than one page of delivery records can take
            xadd()
        assert c.call(b"XGROUP", b"CREATE", b"s", b"g", b"0") == b"OK"
        _fill(small_fs / "filler")

        # XADD: some still fit (in a partly used page, and under fsync always
        # in the zeros written ahead of the log's end: up to 1 MiB of them,
        # docs/storage-format.md "Preallocation"); then a clean refusal.
        for _ in range(20000):
            reply = xadd()
            if isinstance(reply, hiredis.ReplyError):
                break
        assert _is_misconf(reply), f"XADD on a full disk: {reply!r}"
        assert _is_misconf(xadd())  # and again: no state change between refusals
        n_acked = len(acked)

        # Group journal writes: XREADGROUP deliveries until refused, then XACK.
        delivered: list[bytes] = []
        for _ in range(2000):
            reply = c.call(b"XREADGROUP", b"GROUP", b"g", b"c", b"COUNT", 1, b"STREAMS", b"s", b">")
            if isinstance(reply, hiredis.ReplyError):
                break
            assert reply is not None, "ran out of entries before the journal filled its page"
            delivered.append(reply[0][1][0][0])
        assert _is_misconf(reply), f"XREADGROUP on a full disk: {reply!r}"
        info = c.call(b"XINFO", b"GROUPS", b"s")[0]
        info = dict(zip(info[0::2], info[1::2]))
        assert info[b"last-delivered-id"] == (delivered[-1] if delivered else b"0-0"), \
            "a refused delivery moved last-delivered-id"
        assert info[b"pending"] == len(delivered)
        if delivered:
            reply = c.call(b"XACK", b"s", b"g", delivered[0])
            assert reply == 1 or _is_misconf(reply), reply
            acked_ids = {delivered[0]} if reply == 1 else set()
        else:
            acked_ids = set()

        # Reads and other clients are unaffected.
        other = Conn(server.port)
        assert other.call(b"PING") == b"PONG"
        assert other.call(b"XLEN", b"s") == n_acked
        entries = other.call(b"XRANGE", b"s", b"-", b"+")
        assert [(e[0], check_fields(e[1])[1]) for e in entries] == acked
        assert other.call(b"TOPIC", b"LIST") is not None
        other.close()
        assert "Traceback" not in server.log(), "a disk-full refusal logged a traceback"
        assert "disk error: append to" in server.log()

        # Free the space: writes resume on the same connection.
        os.unlink(small_fs / "filler")
        for _ in range(5):
            assert not isinstance(xadd(), hiredis.ReplyError)
        reply = c.call(b"XREADGROUP", b"GROUP", b"g", b"c", b"COUNT", 1, b"STREAMS", b"s", b">")
        delivered.append(reply[0][1][0][0])
        assert c.call(b"XACK", b"s", b"g", delivered[-1]) == 1
        acked_ids.add(delivered[-1])
        c.close()

        # Nothing half-written is visible, before or after a kill -9.
        for restart in ("kill9", "sigterm"):
            server.restart(kill9=(restart == "kill9"))
            c = Conn(server.port)
            entries = c.call(b"XRANGE", b"s", b"-", b"+")
            assert [(e[0], check_fields(e[1])[1]) for e in entries] == acked, f"log after {restart}"
            pending = {row[0] for row in c.call(b"XPENDING", b"s", b"g", b"-", b"+", 100000)}
            assert pending == set(delivered) - acked_ids, f"group state after {restart}"
            c.close()
        assert "recovery cut" not in server.log()
    finally:
        server.stop()


def test_a_shutdown_on_a_full_disk_is_clean_and_loses_nothing(small_fs, tmp_path):
    """SIGTERM while the disk is full: everything acknowledged is already on
    disk; what cannot be written then (checkpoints, a group snapshot) is
    logged, and the server exits normally. It restarts with everything once
    there is room."""
    server = PartitaProcess(small_fs / "data", ["--fsync", "everysec"])
    server.log_path = tmp_path / "server.log"
    server.start()
    try:
        c = Conn(server.port)
        acked = []
        for seq in range(200):
            reply = c.call(b"XADD", b"s", b"*", *make_fields(0, seq))
            acked.append((reply, seq))
        assert c.call(b"XGROUP", b"CREATE", b"s", b"g", b"0") == b"OK"
        delivered = c.call(b"XREADGROUP", b"GROUP", b"g", b"c", b"COUNT", 5, b"STREAMS", b"s", b">")[0][1]
        assert c.call(b"XACK", b"s", b"g", delivered[0][0]) == 1
        c.close()
        _fill(small_fs / "filler")
        server.proc.terminate()
        assert server.proc.wait(timeout=20) == 0, server.log()
        assert "Fatal" not in server.log() and "Traceback" not in server.log()
        os.unlink(small_fs / "filler")
        server.start()
        c = Conn(server.port)
        entries = c.call(b"XRANGE", b"s", b"-", b"+")
        assert [(e[0], check_fields(e[1])[1]) for e in entries] == acked
        pending = [row[0] for row in c.call(b"XPENDING", b"s", b"g", b"-", b"+", 100)]
        assert pending == [e[0] for e in delivered[1:]]
        c.close()
    finally:
        server.stop()


PAGE_BYTES = 4096  # tmpfs counts whole pages


def test_a_refused_first_xadd_leaves_no_stream_and_an_answered_one_stays(small_fs, tmp_path):
    """The first XADD to a new key writes the topic's metadata, the leader-
    epoch checkpoint and the entry. With 0, 1, 2, ... pages of the disk free,
    each XADD is either refused (then the key does not exist, now or after a
    kill -9 and restart) or answered with an ID (then the entry is there after
    the restart). It used to answer -MISCONF with the entry written (the
    epoch checkpoint failed after it), or leave an empty stream behind."""
    server = PartitaProcess(small_fs / "data")
    server.log_path = tmp_path / "server.log"
    server.start()
    try:
        c = Conn(server.port)
        assert c.call(b"PING") == b"PONG"
        replies = {}
        filler = small_fs / "filler"
        _fill(filler)
        for free_pages in range(6):
            os.truncate(filler, filler.stat().st_size - free_pages * PAGE_BYTES)
            key = b"k%d" % free_pages
            reply = c.call(b"XADD", key, b"*", b"n", b"%d" % free_pages)
            replies[key] = reply
            if isinstance(reply, hiredis.ReplyError):
                assert _is_misconf(reply), reply
                assert c.call(b"EXISTS", key) == 0, f"refused XADD with {free_pages} free page(s) left {key}"
            else:
                assert c.call(b"XLEN", key) == 1
            _fill(small_fs / f"filler{free_pages}")  # the next round has only the pages it frees
        assert any(isinstance(r, hiredis.ReplyError) for r in replies.values())
        assert not all(isinstance(r, hiredis.ReplyError) for r in replies.values())
        c.close()
        for name in os.listdir(small_fs):
            if name.startswith("filler"):
                os.unlink(small_fs / name)
        server.restart(kill9=True)
        c = Conn(server.port)
        for key, reply in replies.items():
            if isinstance(reply, hiredis.ReplyError):
                assert c.call(b"EXISTS", key) == 0, f"{key} refused, yet there after a restart"
            else:
                assert [e[0] for e in c.call(b"XRANGE", key, b"-", b"+")] == [reply], key
        c.close()
    finally:
        server.stop()


def test_a_failing_epoch_checkpoint_refuses_the_first_xadd_whole(tmp_path):
    """The same on a disk that fails the leader-epoch checkpoint's fsync
    (tests/failing_fsync.py): the entry used to be written before it and
    survive a restart although its XADD was answered with an error."""
    trigger = tmp_path / "data.fail-fsync"
    server = PartitaProcess(tmp_path / "data", launcher=[sys.executable, str(REPO / "tests" / "failing_fsync.py")])
    server.start()
    try:
        c = Conn(server.port)
        trigger.write_text("leader-epoch.checkpoint")
        reply = c.call(b"XADD", b"k", b"*", b"f", b"v")
        assert isinstance(reply, hiredis.ReplyError) and str(reply) == \
            "MISCONF Errors writing to the partition log: Input/output error", reply
        assert c.call(b"EXISTS", b"k") == 0
        assert c.call(b"KEYS", b"*") == []
        c.close()
        trigger.unlink()
        server.restart(kill9=True)
        c = Conn(server.port)
        assert c.call(b"EXISTS", b"k") == 0
        new_id = c.call(b"XADD", b"k", b"*", b"f", b"v")
        c.close()
        server.restart(kill9=True)
        c = Conn(server.port)
        assert [e[0] for e in c.call(b"XRANGE", b"k", b"-", b"+")] == [new_id]
        c.close()
    finally:
        server.stop()
