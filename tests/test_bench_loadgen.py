"""The group-loop load generator: its consumer processes read and ack the
whole stream, and a run that did not (a consumer failed, entries left
unacked) fails rather than printing figures."""

from __future__ import annotations

import pytest

from bench import loadgen


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
