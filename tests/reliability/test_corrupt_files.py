"""Damaged files at start-up: the real server on a data dir with one file
truncated, overwritten with garbage, missing, or left half-written (*.tmp).

Per file, the decision documented in docs/guarantees.md ("Damaged files"):
recover what is intact and log precisely what was dropped; never serve bytes
that were not validated (a damaged batch is an error reply, never garbage on
the wire); where guessing could lose acknowledged data, refuse (the server,
or the one partition's group state) with a message naming the file.
"""

from __future__ import annotations

import os
import shutil

import pytest
import redis
from crc32c import crc32c

from tests.conftest import PartitaProcess

P = "topics/t.s/partition-0/"
ACTIVE = P + "00000000000000000180.log"
MIDDLE = P + "00000000000000000060.log"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A cleanly stopped data dir: stream s (10 segments, 1 XDEL, group g with
    7 pending) and topic t (3 partitions, 60 entries); plus what it serves."""
    base = tmp_path_factory.mktemp("pristine")
    server = PartitaProcess(base / "data", ["--segment-bytes", "4096"]).start()
    try:
        r = server.client()
        for i in range(200):
            r.xadd("s", {"n": str(i), "pad": "x" * 50})
        r.execute_command("TOPIC", "CREATE", "t", "PARTITIONS", "3")
        for i in range(60):
            r.xadd("t", {"n": str(i)})
        r.xgroup_create("s", "g", id="0")
        r.xreadgroup("g", "c", {"s": ">"}, count=10)
        r.xack("s", "g", *[e[0] for e in r.xrange("s", count=3)])
        r.xdel("s", r.xrange("s", count=5)[4][0])
        expected = _state(r)
    finally:
        assert server.terminate() == 0
    return base / "data", expected


def _state(r) -> dict:
    return {
        "s": r.xrange("s"),
        "t": r.xlen("t"),
        "pending": [p["message_id"] for p in r.xpending_range("s", "g", "-", "+", 1000)],
    }


def _start(tmp_path, pristine, damage) -> tuple[PartitaProcess, redis.Redis]:
    src, _ = pristine
    data = tmp_path / "data"
    shutil.copytree(src, data)
    damage(data)
    server = PartitaProcess(data)
    server.start()
    r = server.client()
    # Partitions open (recover, log what they dropped) on first use; group
    # state on the first group command.
    r.xlen("s")
    r.xlen("t")
    return server, r


def _truncate(path, n):
    os.truncate(path, path.stat().st_size - n)


def _garble(path, at, n=16):
    raw = bytearray(path.read_bytes())
    raw[at:at + n] = bytes((b ^ 0x5A) for b in raw[at:at + n])
    path.write_bytes(bytes(raw))


# ------------------------------------------------------------ the log


def test_torn_tail_of_the_active_segment_is_cut_and_logged(tmp_path, pristine):
    server, r = _start(tmp_path, pristine, lambda d: _truncate(d / ACTIVE, 30))
    try:
        assert r.xrange("s") == pristine[1]["s"][:-1]  # exactly the last entry is gone
        log = server.log()  # partitions open (and recover) on first use
        assert "recovery cut the log at offset 199 (segment 180, position" in log
        assert "torn batch (174 of 204 bytes); removed 174 bytes and 0 later segment(s)" in log
        assert r.xadd("s", {"n": "new"})  # and appends continue after the cut
    finally:
        server.stop()


@pytest.mark.parametrize("where", ["middle", "active"])
def test_garbage_inside_a_trusted_segment_is_never_served(tmp_path, pristine, where):
    """Below the recovery point nothing is scanned at start (start-up cost
    does not grow with the log); reads CRC-check such batches instead."""
    path = MIDDLE if where == "middle" else ACTIVE
    server, r = _start(tmp_path, pristine, lambda d: _garble(d / path, 300))
    try:
        with pytest.raises(redis.ResponseError, match=r"corrupt partition log, not served: .*"
                           + path.split("/")[-1] + r": corrupt batch at position \d+: CRC mismatch"):
            r.xrange("s")
        # Everything before the damaged batch is still served, and writes go on.
        good = pristine[1]["s"][:40] if where == "middle" else pristine[1]["s"][:150]
        assert r.xrange("s", count=len(good)) == good
        assert r.xadd("s", {"n": "after"})
        assert r.xlen("t") == pristine[1]["t"]
        assert "refused to serve a damaged batch" in server.log()
    finally:
        server.stop()


def test_truncated_trusted_segment_is_an_error_not_a_short_read(tmp_path, pristine):
    server, r = _start(tmp_path, pristine, lambda d: _truncate(d / MIDDLE, 30))
    try:
        with pytest.raises(redis.ResponseError, match="corrupt partition log, not served: .*batch runs past the end"):
            r.xrange("s")
        assert r.ping()
    finally:
        server.stop()


@pytest.mark.parametrize("damage", ["garbage-index", "short-idindex", "missing-index"])
def test_damaged_indexes_are_rebuilt(tmp_path, pristine, damage):
    def do(d):
        if damage == "garbage-index":
            _garble(d / (MIDDLE[:-4] + ".index"), 0, 8)
        elif damage == "short-idindex":
            _truncate(d / (MIDDLE[:-4] + ".idindex"), 5)
        else:
            (d / (ACTIVE[:-4] + ".index")).unlink()

    server, r = _start(tmp_path, pristine, do)
    try:
        assert _state(r) == pristine[1]
        mid = pristine[1]["s"][70][0]
        assert r.xrange("s", mid, "+", count=1)[0][0] == mid  # ID lookups through the rebuilt index
    finally:
        server.stop()


@pytest.mark.parametrize("name,content,message", [
    ("recovery-point.checkpoint", b"zz\x00garbage", "ignoring corrupt recovery-point.checkpoint (bad header)"),
    ("recovery-point.checkpoint", None, None),
    ("log-start-offset.checkpoint", b"0\n1\nfoo bar\n", "ignoring corrupt log-start-offset.checkpoint"),
    ("leader-epoch.checkpoint", b"\xff\xfe", "ignoring corrupt leader-epoch.checkpoint"),
])
def test_damaged_checkpoints_are_ignored_and_logged(tmp_path, pristine, name, content, message):
    def do(d):
        if content is None:
            (d / P / name).unlink()
        else:
            (d / P / name).write_bytes(content)

    server, r = _start(tmp_path, pristine, do)
    try:
        if message:
            assert message in server.log()
        assert _state(r) == pristine[1]  # a lost recovery point only means a longer scan
    finally:
        server.stop()


def test_garbage_deletion_markers_are_dropped_and_logged(tmp_path, pristine):
    server, r = _start(tmp_path, pristine, lambda d: (d / P / "00000000000000000000.xdel").write_bytes(b"\x01\x02\x03"))
    try:
        assert "00000000000000000000.xdel: dropped 3 bytes of torn or corrupt deletion markers after 0 good record(s)" \
            in server.log()
        assert r.xlen("s") == len(pristine[1]["s"]) + 1  # the XDEL'd entry is back, as the log line says
    finally:
        server.stop()


def _warned(server, *parts) -> bool:
    """A WARNING line (``#``) of this run containing every one of ``parts``."""
    return any(" # " in line and all(p in line for p in parts) for line in server.log().splitlines())


def _segment_files(data) -> list[str]:
    return sorted(n for n in os.listdir(data / P) if n.endswith(".log"))


def test_recovery_point_past_the_log_end_is_not_trusted(tmp_path, pristine):
    """It used to make the log end 99,999,999,997 (XLEN said so) and the next
    XADD create segment 00000000099999999999.log."""
    server, r = _start(tmp_path, pristine,
                       lambda d: (d / P / "recovery-point.checkpoint").write_bytes(b"0\n1\n99999999999\n"))
    try:
        assert _state(r) == pristine[1]
        assert _warned(server, "recovery-point.checkpoint", "99999999999", "past the log end 200")
        before = _segment_files(server.data_dir)
        r.xadd("s", {"n": "new"})
        assert _segment_files(server.data_dir) == before
        assert r.xlen("s") == len(pristine[1]["s"]) + 1
        server.restart()
        r = server.client()
        assert r.xlen("s") == len(pristine[1]["s"]) + 1
        assert "recovery-point.checkpoint" not in server.log()  # repaired: nothing to say the next time
    finally:
        server.stop()


@pytest.mark.parametrize("row", [b"99999999999 0 0", b"99999999999 1 1", b"18446744073709551616 0 0"])
def test_log_start_past_the_log_end_hides_nothing(tmp_path, pristine, row):
    """A log start the log cannot have had (past its end although the log
    still holds everything it held then) is ignored; it used to hide every
    entry and delete every segment but the last."""
    server, r = _start(tmp_path, pristine,
                       lambda d: (d / P / "log-start-offset.checkpoint").write_bytes(b"0\n1\n" + row + b"\n"))
    try:
        assert _state(r) == pristine[1]
        assert len(_segment_files(server.data_dir)) == 10
        assert _warned(server, "log-start-offset.checkpoint")
        r.xadd("s", {"n": "new"})
        server.restart()
        assert server.client().xlen("s") == len(pristine[1]["s"]) + 1
    finally:
        server.stop()


@pytest.mark.parametrize("content", [b"0\n1\n100000000000000000000 0\n", b"0\n1\n7 0\n", b"0\n1\n0 500\n"])
def test_leader_epochs_the_log_contradicts_are_rebuilt_from_it(tmp_path, pristine, content):
    """An epoch of 1e20 used to fail every XADD (``argument out of range``)."""
    server, r = _start(tmp_path, pristine, lambda d: (d / P / "leader-epoch.checkpoint").write_bytes(content))
    try:
        assert _warned(server, "leader-epoch.checkpoint", "rebuilt from the log")
        assert r.xadd("s", {"n": "new"})
        assert r.xlen("s") == len(pristine[1]["s"]) + 1
        assert (server.data_dir / P / "leader-epoch.checkpoint").read_bytes() == b"0\n1\n0 0\n"
    finally:
        server.stop()


def test_stray_segment_file_out_of_offset_range_is_ignored(tmp_path, pristine):
    """``99999999999999999999.log`` used to become the active segment: every
    XADD then failed with ``argument out of range``."""
    stray = P + "99999999999999999999.log"
    server, r = _start(tmp_path, pristine, lambda d: (d / stray).write_bytes(b"junk"))
    try:
        assert _state(r) == pristine[1]
        assert _warned(server, "99999999999999999999.log", "out of range")
        assert r.xadd("s", {"n": "new"})
        assert (server.data_dir / stray).read_bytes() == b"junk"  # left for the operator
    finally:
        server.stop()


def test_zeroed_segment_below_the_recovery_point_is_a_loud_warning(tmp_path, pristine):
    """Batches below the recovery point were fsynced: finding zeros there is
    lost data, not preallocation (it used to be dropped with an INFO line)."""
    def zero(d):
        path = d / ACTIVE
        path.write_bytes(bytes(path.stat().st_size))

    server, r = _start(tmp_path, pristine, zero)
    try:
        assert r.xlen("s") == len(pristine[1]["s"]) - 20
        assert _warned(server, ACTIVE.split("/")[-1], "offsets 180..199", "lost")
        assert "preallocated zeros" not in server.log()
        assert r.xadd("s", {"n": "new"})
    finally:
        server.stop()


def test_damaged_header_of_the_first_batch_is_a_clean_error(tmp_path, pristine):
    """It used to be ``internal error in 'xrange': error: 'I' format requires ...``."""
    def damage(d):
        path = d / P / "00000000000000000000.log"
        raw = bytearray(path.read_bytes())
        raw[0:8] = bytes.fromhex("123456789abcde01")
        path.write_bytes(bytes(raw))

    server, r = _start(tmp_path, pristine, damage)
    try:
        with pytest.raises(redis.ResponseError, match=r"^corrupt partition log, not served: .*"
                           r"00000000000000000000\.log: corrupt batch at position 0: base offset"):
            r.xrange("s")
        assert "internal error" not in server.log()
        assert r.xadd("s", {"n": "after"})
    finally:
        server.stop()


@pytest.mark.parametrize("damage", ["deleted", "directory"])
def test_unreadable_segment_is_a_read_error_not_a_write_error(tmp_path, pristine, damage):
    """Reads used to answer ``-MISCONF Errors writing ...``, the text for a
    refused write."""
    server, r = _start(tmp_path, pristine, lambda d: None)  # the partition is open now
    try:
        path = server.data_dir / MIDDLE
        path.unlink()
        if damage == "directory":
            path.mkdir()
        with pytest.raises(redis.ResponseError) as info:
            r.xrange("s")
        text = str(info.value)
        assert text.startswith("error reading the partition log: open ") and MIDDLE.split("/")[-1] in text, text
        assert ("No such file or directory" if damage == "deleted" else "Is a directory") in text
        assert r.xrange("s", count=59) == pristine[1]["s"][:59]  # offsets 0..59 (one XDEL'd) still are
        assert r.xadd("s", {"n": "after"})
    finally:
        server.stop()


def _set_entry_format(path, entry_format: int, batches: int | None = None) -> None:
    """Byte 28 (the entry format) of the first ``batches`` batches of a
    segment file (all when None), CRCs made to match: a batch as another
    version wrote it, not a damaged one."""
    raw = bytearray(path.read_bytes())
    pos = done = 0
    while pos < len(raw) and (batches is None or done < batches):
        length = int.from_bytes(raw[pos + 8:pos + 12], "little")
        raw[pos + 28] = entry_format
        raw[pos + 12:pos + 16] = crc32c(bytes(raw[pos + 16:pos + length])).to_bytes(4, "little")
        pos += length
        done += 1
    path.write_bytes(bytes(raw))


def test_a_data_dir_from_before_the_entry_format_byte_is_served_as_it_was(tmp_path, pristine):
    """Logs written before batches named their entry format (byte 28 was a
    reserved zero) read as stream-v1, and take new entries."""
    def old(d):
        for path in (d / "topics").glob("*/partition-*/*.log"):
            _set_entry_format(path, 0)

    server, r = _start(tmp_path, pristine, old)
    try:
        assert _state(r) == pristine[1]
        new_id = r.xadd("s", {"n": "new"})
        assert r.xrange("s") == pristine[1]["s"] + [(new_id, {b"n": b"new"})]
        assert "recovery cut" not in server.log()
    finally:
        server.stop()


def test_a_batch_in_an_unknown_entry_format_is_refused_not_sent(tmp_path, pristine):
    server, r = _start(tmp_path, pristine, lambda d: _set_entry_format(d / MIDDLE, 9, batches=1))
    try:
        with pytest.raises(redis.ResponseError, match=r"^corrupt partition log, not served: .*"
                           + MIDDLE.split("/")[-1] + r": corrupt batch at position 0: unknown entry format 9 "):
            r.xrange("s")
        assert r.xrange("s", count=59) == pristine[1]["s"][:59]  # what precedes it is served
        assert r.xadd("s", {"n": "after"})
        assert "recovery cut" not in server.log()
    finally:
        server.stop()


# ------------------------------------------------------------ metadata and group state


@pytest.mark.parametrize("content", [
    b"{garbage",
    # Numbers out of range: XADD used to fail with an internal error.
    b'{"entries_added_adjust": 0, "last_generated_id": [1180591620717411303424, 0], '
    b'"max_deleted_entry_id": [0, 0], "version": 1}',
    b'{"entries_added_adjust": 1e400, "last_generated_id": [0, 0], "max_deleted_entry_id": [0, 0], "version": 1}',
])
def test_garbage_stream_meta_is_rebuilt_from_the_log(tmp_path, pristine, content):
    server, r = _start(tmp_path, pristine, lambda d: (d / P / "stream.meta").write_bytes(content))
    try:
        assert "stream.meta: corrupt stream metadata" in server.log()
        assert "rebuilt from the log" in server.log()
        assert _state(r) == pristine[1]
        last = pristine[1]["s"][-1][0]
        new = r.xadd("s", {"n": "new"})
        assert tuple(map(int, new.split(b"-"))) > tuple(map(int, last.split(b"-")))
        assert r.xinfo_groups("s")[0]["lag"] is None  # unknown rather than wrong
    finally:
        server.stop()


def test_torn_group_journal_tail_is_truncated_and_logged(tmp_path, pristine):
    def do(d):
        path = d / P / "groups.journal"
        path.write_bytes(path.read_bytes()[:-7] + b"garbage")

    server, r = _start(tmp_path, pristine, do)
    try:
        # The cut record was the last XACK (3 IDs): they are pending again, nothing else changed.
        assert r.xpending("s", "g")["pending"] == len(pristine[1]["pending"]) + 3
        assert "groups.journal: torn or corrupt tail: truncated 66 bytes at byte 286 after 2 records" in server.log()
        assert r.xrange("s") == pristine[1]["s"]
    finally:
        server.stop()


@pytest.mark.parametrize("name,content,message", [
    ("groups.journal", None, "groups.journal: journal header invalid does not follow snapshot generation 0"),
    ("groups.snapshot", b"PGSNAP01garbagegarbagegarbage", "groups.snapshot: bad snapshot header"),
])
def test_unreadable_group_state_is_refused_not_discarded(tmp_path, pristine, name, content, message):
    """Dropping the file would silently forget acknowledged deliveries and
    acks; the partition's group commands refuse instead, naming the file."""
    def do(d):
        if content is None:
            _garble(d / P / name, 0, 8)
        else:
            (d / P / name).write_bytes(content)

    server, r = _start(tmp_path, pristine, do)
    try:
        before = (server.data_dir / P / name).read_bytes()
        for call in (lambda: r.xpending("s", "g"), lambda: r.xreadgroup("g", "c", {"s": ">"}),
                     lambda: r.xack("s", "g", "1-1")):
            with pytest.raises(redis.ResponseError, match="consumer group state unreadable, refusing to guess: .*" + message):
                call()
        assert (server.data_dir / P / name).read_bytes() == before  # left for the operator
        assert r.xrange("s") == pristine[1]["s"]  # the stream itself is served
        assert r.xlen("t") == pristine[1]["t"]
        assert "Traceback" not in server.log()
    finally:
        server.stop()


def test_stray_tmp_files_of_interrupted_atomic_writes(tmp_path, pristine):
    tmps = [P + "recovery-point.checkpoint.tmp", P + "stream.meta.tmp", P + "groups.snapshot.tmp",
            P + "groups.journal.tmp", "topics/t.t/topic.meta.tmp"]

    def do(d):
        for rel in tmps:
            (d / rel).write_bytes(b"half")

    server, r = _start(tmp_path, pristine, do)
    try:
        assert _state(r) == pristine[1]
        r.xadd("s", {"n": "more"})
        r.xack("s", "g", pristine[1]["pending"][0])
        assert server.terminate() == 0
        server.start()
        r = server.client()
        assert r.xlen("s") == len(pristine[1]["s"]) + 1
        assert len(r.xpending_range("s", "g", "-", "+", 100)) == len(pristine[1]["pending"]) - 1
        for rel in tmps[:4]:  # a partition's tmp files are removed when it is opened
            assert not (server.data_dir / rel).exists(), rel
    finally:
        server.stop()


def test_garbage_topic_meta_refuses_to_start(tmp_path, pristine):
    src, _ = pristine
    data = tmp_path / "data"
    shutil.copytree(src, data)
    (data / "topics/t.t/topic.meta").write_bytes(b"{not json")
    with pytest.raises(RuntimeError, match="partita exited with 1"):
        PartitaProcess(data).start()
    assert (data / "topics/t.t/topic.meta").read_bytes() == b"{not json"  # nothing rewritten


def test_garbage_topic_meta_message_names_the_file(tmp_path, pristine):
    src, _ = pristine
    data = tmp_path / "data"
    shutil.copytree(src, data)
    (data / "topics/t.t/topic.meta").write_bytes(b"{not json")
    server = PartitaProcess(data)
    with pytest.raises(RuntimeError) as info:
        server.start()
    assert "t.t/topic.meta" in str(info.value).split("Traceback")[0]


def test_missing_topic_meta_does_not_hide_partitions(tmp_path, pristine):
    server, r = _start(tmp_path, pristine, lambda d: (d / "topics/t.t/topic.meta").unlink())
    try:
        assert r.xlen("t") == pristine[1]["t"]
    finally:
        server.stop()
