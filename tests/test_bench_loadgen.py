"""The consumer-group load generators (group-loop and mixed): their
consumer processes read and ack every entry, and a run that did not (a
consumer failed, entries left unacked or produced beyond what was counted)
fails rather than printing figures."""

from __future__ import annotations

import pytest

from bench import loadgen
from tests.conftest import wait_for


def test_four_consumer_processes_read_and_ack_the_whole_stream(partita_server):
    loadgen.fill_stream(partita_server.port, "s", 2_000)
    seconds, requests, entries, p50, p99 = loadgen.group_consumers(partita_server.port, "s", 4)
    assert entries == 2_000
    # 20 batches of 100, each a read and an ack, plus each consumer's empty last read
    assert requests == 2 * 20 + 4
    assert seconds > 0 and p50 is not None and p99 is not None
    client = loadgen.Client(partita_server.port)
    assert client.call("XPENDING", "s", "g")[0] == 0
    client.close()


def test_a_consumer_whose_read_fails_fails_the_run(partita_server):
    loadgen.fill_stream(partita_server.port, "s", 100)
    with pytest.raises(RuntimeError, match="group consumer failed: c1: .*not an integer"):
        loadgen.group_consumers(partita_server.port, "s", 1, count="x")


def test_entries_not_acked_fail_the_run(partita_server):
    loadgen.fill_stream(partita_server.port, "s", 100)
    with pytest.raises(RuntimeError, match="0 entries acked of 100"):
        loadgen.group_consumers(partita_server.port, "s", 0)


def _group_info(client: loadgen.Client, key: str) -> dict:
    """XINFO GROUPS of ``key``'s one group as a dict of its fields."""
    (group,) = client.call("XINFO", "GROUPS", key)
    return {group[i].decode(): group[i + 1] for i in range(0, len(group), 2)}


def _xreadgroup_calls(client: loadgen.Client) -> int:
    stats = client.call("INFO", "commandstats").decode()
    return int(stats.split("cmdstat_xreadgroup:calls=")[1].split(",")[0]) if "cmdstat_xreadgroup:" in stats else 0


def _after_empty_reads(client: loadgen.Client, consumers: int) -> None:
    """Wait until the consumers have called XREADGROUP twice each more:
    with nothing produced yet every read comes back empty, so they went on
    reading after empty reads (consumers that stopped on an empty read
    would leave this waiting)."""
    start = _xreadgroup_calls(client)
    assert wait_for(lambda: _xreadgroup_calls(client) >= start + 2 * consumers)


def _topic_with_group(port: int, partitions: int) -> list[str]:
    admin = loadgen.Client(port)
    admin.call("TOPIC", "CREATE", "t", "PARTITIONS", str(partitions))
    admin.call("XGROUP", "CREATE", "t", "g", "0")
    admin.close()
    return [f"t#{i}" for i in range(partitions)]


def test_mixed_three_consumer_processes_consume_a_topic_written_after_they_started(partita_server):
    port = partita_server.port
    partition_keys = _topic_with_group(port, 6)
    admin = loadgen.Client(port)

    def produce():
        # every consumer has read and found nothing before the first entry:
        # an empty read must not stop one, only every entry acked does
        _after_empty_reads(admin, 3)
        assert _group_info(admin, "t")["members"] == 3
        loadgen.fill_stream(port, "t", 2_000, pipeline=100)

    seconds, requests, entries, p50, p99 = loadgen.mixed_consume(port, [["t"]] * 3, partition_keys, 2_000, produce)
    assert entries == 2_000
    assert seconds > 0 and requests > 0 and p50 is not None and p99 is not None
    assert [admin.call("XPENDING", key, "g")[0] for key in partition_keys] == [0] * 6
    assert sum(admin.call("XLEN", key) for key in partition_keys) == 2_000
    admin.close()


def test_mixed_on_redis_each_consumer_reads_its_two_streams(redis_server):
    """The Redis side of the mixed row: 6 plain streams, a group on each,
    consumer c<i> reading its own 2 in one XREADGROUP."""
    port = redis_server.port
    keys = [f"mixed-loadgen#{i:012d}" for i in range(6)]
    admin = loadgen.Client(port)
    for key in keys:
        admin.call("XGROUP", "CREATE", key, "g", "0", "MKSTREAM")

    def produce():
        _after_empty_reads(admin, 3)
        for key in keys:
            loadgen.fill_stream(port, key, 300, pipeline=100)

    consumer_keys = [keys[0:2], keys[2:4], keys[4:6]]
    _seconds, _requests, entries, _p50, _p99 = loadgen.mixed_consume(port, consumer_keys, keys, 1_800, produce)
    assert entries == 1_800
    assert [admin.call("XPENDING", key, "g")[0] for key in keys] == [0] * 6
    admin.close()


def test_mixed_entries_produced_beyond_the_total_fail_the_run(partita_server):
    port = partita_server.port
    partition_keys = _topic_with_group(port, 6)
    with pytest.raises(RuntimeError, match=r"acked of 2000 \(1900 produced\)"):
        loadgen.mixed_consume(port, [["t"]] * 3, partition_keys, 1_900,
                              lambda: loadgen.fill_stream(port, "t", 2_000, pipeline=100))


def test_mixed_a_consumer_whose_read_fails_fails_the_run(partita_server):
    partition_keys = _topic_with_group(partita_server.port, 6)
    with pytest.raises(RuntimeError, match="group consumer failed: c1: .*not an integer"):
        loadgen.mixed_consume(partita_server.port, [["t"]], partition_keys, 1, lambda: None, count="x")


def test_a_consumer_process_that_cannot_start_fails_the_run_with_its_own_error(partita_server):
    partition_keys = _topic_with_group(partita_server.port, 6)
    with pytest.raises(Exception, match="pickle"):  # a key no process can be handed
        loadgen.mixed_consume(partita_server.port, [[lambda: b"t"]], partition_keys, 1, lambda: None)
