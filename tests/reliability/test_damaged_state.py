"""Damaged state files at start-up (issue 28: a stop, one damaged file, a
start), through the real server: a ``topic.meta`` with an impossible
partition count, a stray entry among the topic directories, a damaged
record inside ``groups.journal``, a damaged record inside the controller's
``raft.log``.

The rule (docs/guarantees.md, "Damaged state files"): the damage is found,
logged with a WARNING that names the file and says what was done, and the
state is rebuilt from what the files themselves hold, or refused clearly;
a damaged file is kept aside (``<name>.damaged-<time>``), never destroyed.
"""

from __future__ import annotations

import json
import os
import shutil
import struct

import pytest

from tests.clusterkit import Cluster, eventually
from tests.conftest import PartitaProcess

P = "topics/t.s/partition-0/"
PENDING = 200


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A cleanly stopped data dir: stream s (300 entries) whose group g has
    200 entries delivered to consumer c, 20 of them acked; topic t of 3
    partitions (60 entries); plus what it serves."""
    base = tmp_path_factory.mktemp("pristine")
    server = PartitaProcess(base / "data").start()
    try:
        r = server.client()
        for i in range(300):
            r.xadd("s", {"n": str(i)})
        r.execute_command("TOPIC", "CREATE", "t", "PARTITIONS", "3")
        for i in range(60):
            r.xadd("t", {"n": str(i)})
        r.xgroup_create("s", "g", id="0")
        r.xreadgroup("g", "c", {"s": ">"}, count=PENDING)
        r.xack("s", "g", *[e[0] for e in r.xrange("s", count=20)])
        expected = _state(r)
    finally:
        assert server.terminate() == 0
    assert len(expected["pending"]) == PENDING - 20
    return base / "data", expected


def _state(r) -> dict:
    return {
        "s": r.xrange("s"),
        "t": r.xlen("t"),
        "pending": [(p["message_id"], p["consumer"]) for p in r.xpending_range("s", "g", "-", "+", 1000)],
        "groups": r.xinfo_groups("s"),
    }


def _copy(tmp_path, pristine):
    data = tmp_path / "data"
    shutil.copytree(pristine[0], data)
    return data


# ------------------------------------------------------------ topic.meta


def test_topic_meta_claiming_millions_of_partitions_is_repaired_from_the_directories(tmp_path, pristine):
    """It used to be trusted: the first XLEN created 486k directories on the
    main thread, and SIGTERM went unanswered. TOPIC CREATE allows 1..1024."""
    data = _copy(tmp_path, pristine)
    meta_path = data / "topics/t.t/topic.meta"
    meta = json.loads(meta_path.read_bytes())
    meta["partitions"] = 99_999_999
    damaged = json.dumps(meta).encode()
    meta_path.write_bytes(damaged)
    server = PartitaProcess(data).start()
    try:
        log = server.log()
        assert f"{meta_path}: topic 't' claims 99999999 partitions, not a count between 1 and the limit of 1024" in log, log
        assert "repaired to the 3 partition(s) found on disk" in log
        r = server.client()
        assert r.xlen("t") == pristine[1]["t"]
        assert r.execute_command("TOPIC", "DESCRIBE", "t")[b"partitions"] == 3
        assert sorted(p.name for p in (data / "topics/t.t").iterdir() if p.name.startswith("partition-")) == [
            "partition-0", "partition-1", "partition-2"]
        asides = list((data / "topics/t.t").glob("topic.meta.damaged-*"))
        assert len(asides) == 1 and asides[0].read_bytes() == damaged  # the evidence is kept
        assert json.loads(meta_path.read_bytes())["partitions"] == 3
        assert server.terminate() == 0  # SIGTERM is answered
    finally:
        server.stop()


@pytest.mark.parametrize("partitions", [0, -4, "7"])
def test_topic_meta_with_a_partition_count_topic_create_never_writes_is_repaired(tmp_path, pristine, partitions):
    data = _copy(tmp_path, pristine)
    meta_path = data / "topics/t.t/topic.meta"
    meta = json.loads(meta_path.read_bytes())
    meta["partitions"] = partitions
    meta_path.write_bytes(json.dumps(meta).encode())
    server = PartitaProcess(data).start()
    try:
        assert f"{meta_path}: topic 't' claims {json.dumps(partitions)} partitions" in server.log()  # as in the file
        assert server.client().xlen("t") == pristine[1]["t"]
    finally:
        server.stop()


def test_topic_meta_config_value_topic_alter_refuses_is_ignored_with_a_warning(tmp_path, pristine):
    data = _copy(tmp_path, pristine)
    meta_path = data / "topics/t.t/topic.meta"
    meta = json.loads(meta_path.read_bytes())
    meta["config"] = {"segment-bytes": -5, "retention-ms": 60000}
    meta_path.write_bytes(json.dumps(meta).encode())
    server = PartitaProcess(data).start()
    try:
        assert (f"{meta_path}: topic 't' has segment-bytes -5, a value TOPIC ALTER refuses: ignored, "
                "the server's value applies") in server.log()
        r = server.client()
        for i in range(30):
            r.xadd("t", {"n": str(i)})
        assert r.xlen("t") == pristine[1]["t"] + 30
        described = r.execute_command("TOPIC", "DESCRIBE", "t")
        assert described[b"overrides"] == [b"retention-ms"]
    finally:
        server.stop()


# ------------------------------------------------------------ the topics directory


def test_stray_entries_among_the_topic_directories_are_skipped_with_a_warning(tmp_path, pristine):
    """A regular file ``topics/t.zzz`` stopped the start with three tracebacks."""
    data = _copy(tmp_path, pristine)
    topics = data / "topics"
    (topics / "t.zzz").write_bytes(b"not a directory")
    (topics / "t.%ZZ").mkdir()  # not a valid escape
    (topics / "t.Upper").mkdir()  # not how any key is written (it would be t.%55pper)
    (topics / "h.0123").mkdir()  # no topic.key
    (topics / "notes.txt").write_text("an operator's notes")
    (topics / "t.t" / "partition-x").mkdir()
    (topics / "t.t" / "partition-9").write_bytes(b"a file, not a partition")
    (topics / "t.t" / "partition-5000").mkdir()  # past TOPIC CREATE's limit: would widen t to 5001
    server = PartitaProcess(data).start()
    try:
        log = server.log()
        assert "Traceback" not in log
        for name, why in [("t.zzz", "not a directory"), ("t.%ZZ", "not a topic directory name"),
                          ("t.Upper", "not a topic directory name"), ("h.0123", "no readable topic.key"),
                          ("notes.txt", "not a topic directory name"),
                          ("t.t/partition-9", "not a directory"),
                          ("t.t/partition-x", "not a partition directory name"),
                          ("t.t/partition-5000", "partition 5000 is beyond the limit of 1024 partitions")]:
            assert f"{topics / name}: {why}: skipped" in log, (name, log)
        r = server.client()
        assert _state(r) == pristine[1]
        assert sorted(k.decode() for k in r.keys("*")) == ["s", "t"]
        assert (topics / "t.zzz").read_bytes() == b"not a directory"  # left for the operator
        assert server.terminate() == 0
    finally:
        server.stop()


# ------------------------------------------------------------ groups.journal


def _first_record(journal: bytes) -> tuple[int, int]:
    """(position, payload length) of the journal's first record."""
    length, _crc = struct.unpack_from("<II", journal, 24)
    return 24, length


@pytest.mark.parametrize("where", ["payload", "length"])
def test_one_damaged_byte_in_the_first_group_journal_record_loses_no_pending_entry(tmp_path, pristine, where):
    """The first record is the XGROUP CREATE. Replay used to stop there, drop
    the whole group (180 pending entries) and truncate the file in place.
    Now the records after it are found again (by the damaged record's own
    length, or by searching the next intact record when the length is the
    damaged byte), the group is re-created from them, and the file as it
    was is kept aside."""
    data = _copy(tmp_path, pristine)
    path = data / P / "groups.journal"
    raw = bytearray(path.read_bytes())
    pos, length = _first_record(bytes(raw))
    at = pos + 8 + 4 if where == "payload" else pos + 1  # a byte of the group name, or of the length
    raw[at] ^= 0x20
    path.write_bytes(bytes(raw))
    server = PartitaProcess(data).start()
    try:
        r = server.client()
        state = _state(r)
        assert state["pending"] == pristine[1]["pending"]
        assert state["groups"] == pristine[1]["groups"]
        assert state["s"] == pristine[1]["s"]
        log = server.log()
        assert f"{path}: damaged record(s) skipped: bytes 24..{24 + 8 + length}" in log, log
        asides = list(path.parent.glob("groups.journal.damaged-*"))
        assert len(asides) == 1 and asides[0].read_bytes() == bytes(raw)  # the evidence, untouched
        assert f"the file as it was is kept as {asides[0]}" in log
        assert "group 'g' re-created from the records after the damage" in log
        # The repaired state is durable and the journal usable: one more ack, a restart.
        r.xack("s", "g", state["pending"][0][0])
        assert server.terminate() == 0
        server.start()
        r = server.client()
        assert _state(r)["pending"] == pristine[1]["pending"][1:]
        assert "groups.journal:" not in server.log()  # nothing more to repair
    finally:
        server.stop()


def test_a_damaged_group_journal_record_in_the_middle_costs_only_that_record(tmp_path, pristine):
    """The damaged record here is the XACK of 20 entries: they are pending
    again (delivered again, never lost); everything else is as it was."""
    data = _copy(tmp_path, pristine)
    path = data / P / "groups.journal"
    raw = bytearray(path.read_bytes())
    pos = 24
    records = []
    while pos < len(raw):
        length, _ = struct.unpack_from("<II", raw, pos)
        records.append((pos, length, raw[pos + 8]))
        pos += 8 + length
    ack_pos, ack_len, op = records[-1]
    assert op == 9  # ACK
    raw[ack_pos + 8 + ack_len // 2] ^= 0xFF
    # One more record after it, so the damage is not the tail: a TOUCH of consumer c.
    payload = bytes([6]) + struct.pack("<I", 1) + b"g" + struct.pack("<I", 1) + b"d" + struct.pack("<q", 1)
    from crc32c import crc32c
    raw += struct.pack("<II", len(payload), crc32c(payload)) + payload
    path.write_bytes(bytes(raw))
    server = PartitaProcess(data).start()
    try:
        r = server.client()
        pending = _state(r)["pending"]
        assert len(pending) == PENDING
        assert pending[20:] == pristine[1]["pending"]
        assert [c["name"] for c in r.xinfo_consumers("s", "g")] == [b"c", b"d"]  # the record after it applied
        assert f"{path}: damaged record(s) skipped: bytes {ack_pos}..{ack_pos + 8 + ack_len}" in server.log()
    finally:
        server.stop()


# ------------------------------------------------------------ raft.log


def _wait_caught_up(node, other, timeout_s: float = 20.0) -> None:
    """Until ``node``'s controller has committed as far as ``other``'s and
    votes as any voter (``controller_votes:ok``)."""
    def caught_up() -> bool:
        mine, theirs = (n.client(socket_timeout=5).execute_command("INFO", "replication") for n in (node, other))
        seen = (mine["controller_commit_index"], theirs["controller_commit_index"], mine["controller_votes"])
        assert seen[0] >= seen[1] and seen[2] == "ok", f"commit, theirs, votes: {seen}"
        return True

    eventually(caught_up, timeout_s, f"node on port {node.port} caught up")


def _raft_records(raw: bytes) -> list[tuple[int, int, int]]:
    """(position, body length, type) of each record of a raft.log."""
    out, pos = [], 0
    while pos + 8 <= len(raw):
        n, _ = struct.unpack_from("<II", raw, pos)
        out.append((pos, n, raw[pos + 8]))
        pos += 8 + n
    return out


def test_a_damaged_raft_log_record_is_logged_kept_aside_and_the_node_catches_up(tmp_path):
    """raft.log used to be truncated at the damaged record without a word:
    the node forgot the entries after it, and with them the term and vote
    of every later HARD_STATE record. Now the cut is logged, the file kept
    aside, term and vote come from ``raft.vote``, and the node does not
    vote or campaign until its log again holds what it may have held."""
    cluster = Cluster(tmp_path, extra=["--controller-session-timeout-ms", "1500"])
    try:
        for i in range(6):
            # Topic records in the metadata log, whichever node leads the name.
            name = f"topic{i}"
            node = cluster.leader_of(name.encode())
            node.client().execute_command("TOPIC", "CREATE", name, "PARTITIONS", "2")
        victim = cluster.nodes[2]
        _wait_caught_up(victim, cluster.nodes[0])
        assert victim.terminate() == 0
        path = victim.data_dir / "controller" / "raft.log"
        raw = bytearray(path.read_bytes())
        entries = [rec for rec in _raft_records(bytes(raw)) if rec[2] == 1]
        assert len(entries) >= 4, entries
        pos, n, _ = entries[len(entries) // 2]
        raw[pos + 8 + n - 1] ^= 0xFF  # the last byte of a middle entry
        path.write_bytes(bytes(raw))
        victim.start()
        log = victim.log()
        assert f"{path}: damaged record at byte {pos}" in log, log
        asides = list(path.parent.glob("raft.log.damaged-*"))
        assert len(asides) == 1 and asides[0].read_bytes() == bytes(raw)
        assert "will not campaign, nor vote for a candidate whose log ends before it, until its log holds term" in log
        # It catches up from the leader and then counts as a voter again.
        _wait_caught_up(victim, cluster.nodes[0])
        cluster.wait_ready()
        assert not cluster.unexpected_log_lines()
    finally:
        cluster.stop()


def test_a_node_whose_term_and_vote_may_be_lost_refuses_to_start(tmp_path):
    """The double fault: the last HARD_STATE record of raft.log is damaged and
    raft.vote is gone too. Starting could vote twice in a term; the node
    refuses, naming the files, and leaves them as they are."""
    cluster = Cluster(tmp_path)
    try:
        victim = cluster.nodes[2]
        assert victim.terminate() == 0
        path = victim.data_dir / "controller" / "raft.log"
        records = _raft_records(path.read_bytes())
        last_entry = max(k for k, rec in enumerate(records) if rec[2] == 1)
        pos, n, _ = [rec for rec in records[:last_entry] if rec[2] == 2][-1]
        # As if it stopped right after appending entries (before a later
        # commit-only HARD_STATE), then the disk damaged the HARD_STATE before them.
        end = records[last_entry][0] + 8 + records[last_entry][1]
        raw = bytearray(path.read_bytes()[:end])
        raw[pos + 8 + n - 1] ^= 0xFF
        path.write_bytes(bytes(raw))
        (path.parent / "raft.vote").unlink()
        with pytest.raises(RuntimeError, match="partita exited with 1") as info:
            victim.start()
        text = str(info.value)
        assert f"{path}: damaged at byte {pos}, where the latest term and vote may be" in text
        assert "refusing to start" in text and "Traceback" not in text
        assert path.read_bytes() == bytes(raw)
    finally:
        cluster.stop()
