"""Background retention on every partition, through a real partita process."""

from __future__ import annotations

import time

from tests.conftest import wait_for


def _pairs(value):
    return value if isinstance(value, dict) else dict(zip(value[::2], value[1::2]))


def _partition_info(r, topic):
    info = _pairs(r.execute_command("TOPIC", "DESCRIBE", topic))
    return [_pairs(p) for p in info[b"partition-info"]]


def test_retention_bytes_deletes_old_segments_on_every_partition(partita_factory):
    server = partita_factory(["--retention-check-interval-ms", "100"])
    r = server.client()
    r.execute_command("TOPIC", "CREATE", "r", "PARTITIONS", "2",
                      "CONFIG", "segment-bytes", "1024", "retention-bytes", "4096")
    r.execute_command("TOPIC", "CREATE", "keep", "CONFIG", "segment-bytes", "1024")
    for i in range(300):
        r.xadd("r", {"n": i, "pad": "x" * 20})
        r.xadd("keep", {"n": i})

    def trimmed():
        parts = _partition_info(r, "r")
        return all(p[b"log-start-offset"] > 0 and p[b"bytes"] < 4096 + 1024 for p in parts)

    assert wait_for(trimmed), _partition_info(r, "r")
    for p in _partition_info(r, "r"):
        assert p[b"bytes"] >= 4096  # never below the limit: whole segments only
        assert p[b"length"] == p[b"log-end-offset"] - p[b"log-start-offset"]
    # The newest entries are still there, in order; the oldest are gone.
    newest = r.xrevrange("r#0", count=1)[0][1]
    assert int(newest[b"n"]) in (298, 299)
    first = r.xrange("r#0", count=1)[0][1]
    assert int(first[b"n"]) > 0
    # A topic without a limit keeps everything.
    assert r.xlen("keep") == 300 and _partition_info(r, "keep")[0][b"log-start-offset"] == 0
    info = r.info("topics")
    assert info["retention_segments_deleted"] > 0 and info["retention_bytes_deleted"] > 0
    lines = [line for line in server.log().splitlines() if "Retention: deleted segment" in line]
    assert len(lines) == info["retention_segments_deleted"]
    assert any("of r#0" in line for line in lines) and any("of r#1" in line for line in lines)
    # XADD keeps generating increasing IDs after retention.
    last = r.xrevrange("r#1", count=1)[0][0]
    r.xadd("r#1", {"after": 1})
    assert r.xrevrange("r#1", count=1)[0][0] > last


def test_retention_ms_and_config_set_of_the_default(partita_factory):
    server = partita_factory(["--retention-check-interval-ms", "100", "--segment-bytes", "1024"])
    r = server.client()
    for i in range(100):
        r.xadd("old", {"n": i})
    time.sleep(0.3)
    segments = _partition_info(r, "old")[0][b"segments"]
    assert segments > 2 and _partition_info(r, "old")[0][b"log-start-offset"] == 0
    # The server-wide default reaches topics without an override.
    r.config_set("retention-ms", "100")
    assert wait_for(lambda: _partition_info(r, "old")[0][b"segments"] == 1)
    assert r.xlen("old") < 100
    r.xadd("old", {"n": "new"})
    assert r.xrevrange("old", count=1)[0][1] == {b"n": b"new"}
