"""Partita's dead-letter extension: MAXDELIVERIES n DEADLETTER key.

An entry whose delivery count would exceed n (history re-reads, XCLAIM,
XAUTOCLAIM) leaves the PEL and is appended to the dead-letter stream with
its fields plus its origin; the move survives a restart.
"""

from __future__ import annotations

import pytest

from tests.e2e.groups_support import Resp


def _as_dict(value):
    if isinstance(value, dict):
        return {(k.encode() if isinstance(k, str) else k): v for k, v in value.items()}
    return dict(zip(value[::2], value[1::2]))


def _fields(entry):
    _id, fields = entry
    return fields if isinstance(fields, dict) else dict(zip(fields[::2], fields[1::2]))


def test_xautoclaim_moves_entries_past_max_deliveries(partita_server):
    r = partita_server.client()
    r.xadd("jobs", {"task": "a"}, id="1-0")
    r.xadd("jobs", {"task": "b"}, id="2-0")
    assert r.execute_command("XGROUP", "CREATE", "jobs", "workers", "0",
                             "MAXDELIVERIES", "2", "DEADLETTER", "jobs-dlq") == b"OK"
    r.xreadgroup("workers", "w1", {"jobs": ">"})  # delivery 1 of each
    r.xack("jobs", "workers", "2-0")
    cursor, claimed, deleted = r.execute_command("XAUTOCLAIM", "jobs", "workers", "w2", "0", "0")
    assert [e[0] for e in claimed] == [b"1-0"] and deleted == []  # delivery 2
    cursor, claimed, deleted = r.execute_command("XAUTOCLAIM", "jobs", "workers", "w3", "0", "0")
    assert claimed == [] and deleted == []  # a 3rd delivery would pass 2: dead-lettered
    assert r.xpending("jobs", "workers")["pending"] == 0
    dlq = r.xrange("jobs-dlq")
    assert len(dlq) == 1
    assert _fields(dlq[0]) == {
        b"task": b"a", b"dl-source-key": b"jobs", b"dl-source-id": b"1-0",
        b"dl-group": b"workers", b"dl-consumer": b"w2", b"dl-deliveries": b"2",
    }
    info = r.execute_command("XINFO", "GROUPS", "jobs")[0]
    info = _as_dict(info)
    assert (info[b"max-deliveries"], info[b"dead-letter-key"], info[b"dead-lettered"]) == (2, b"jobs-dlq", 1)
    partita_server.restart(kill9=True)
    r = partita_server.client()
    assert r.xpending("jobs", "workers")["pending"] == 0
    assert len(r.xrange("jobs-dlq")) == 1
    info = r.execute_command("XINFO", "GROUPS", "jobs")[0]
    assert _as_dict(info)[b"dead-lettered"] == 1


def test_history_reads_and_xclaim_dead_letter_too(partita_server):
    r = partita_server.client()
    r.xadd("s", {"f": "1"}, id="1-0")
    r.xadd("s", {"f": "2"}, id="2-0")
    r.xgroup_create("s", "g", id="0")
    raw = Resp(partita_server.port)  # redis-py would parse a "... CONFIG" reply as CONFIG GET's
    assert raw.call("XGROUP", "CONFIG", "s", "g", "MAXDELIVERIES", "1", "DEADLETTER", "dead") == b"+OK\r\n"
    r.xreadgroup("g", "c", {"s": ">"})
    # Re-reading its history would be the 2nd delivery: both go to "dead".
    reply = r.execute_command("XREADGROUP", "GROUP", "g", "c", "STREAMS", "s", "0")
    assert reply == [[b"s", []]]
    assert [_fields(e)[b"dl-source-id"] for e in r.xrange("dead")] == [b"1-0", b"2-0"]
    # XCLAIM with RETRYCOUNT or JUSTID is an operator's move: never dead-letters.
    r.xadd("s", {"f": "3"}, id="3-0")
    r.xreadgroup("g", "c", {"s": ">"})
    assert r.xclaim("s", "g", "d", 0, ["3-0"], justid=True) == [b"3-0"]
    assert r.xclaim("s", "g", "d", 0, ["3-0"]) == []
    assert len(r.xrange("dead")) == 3
    # MAXDELIVERIES 0 turns it off.
    assert raw.call("XGROUP", "CONFIG", "s", "g", "MAXDELIVERIES", "0") == b"+OK\r\n"
    r.xadd("s", {"f": "4"}, id="4-0")
    r.xreadgroup("g", "c", {"s": ">"})
    r.execute_command("XREADGROUP", "GROUP", "g", "c", "STREAMS", "s", "0")
    assert r.xpending("s", "g")["pending"] == 1
    info = r.execute_command("XINFO", "GROUPS", "s")[0]
    assert b"max-deliveries" not in _as_dict(info)


@pytest.mark.parametrize("args, message", [
    (["MAXDELIVERIES", "2"], "MAXDELIVERIES needs a DEADLETTER key"),
    (["DEADLETTER", "x"], "DEADLETTER needs MAXDELIVERIES > 0"),
    (["MAXDELIVERIES", "-1", "DEADLETTER", "x"], "MAXDELIVERIES must be >= 0"),
    (["MAXDELIVERIES", "x", "DEADLETTER", "x"], "value is not an integer or out of range"),
    (["MAXDELIVERIES", "1", "DEADLETTER", "s"], "the DEADLETTER key must differ from the stream key"),
    # s#0 is s (partition 0 of a 1-partition topic): its dead letters came back to the group.
    (["MAXDELIVERIES", "1", "DEADLETTER", "s#0"], "the DEADLETTER key must differ from the stream key"),
])
def test_dead_letter_option_errors(partita_server, args, message):
    import redis

    r = partita_server.client()
    r.xadd("s", {"f": "1"}, id="1-0")
    with pytest.raises(redis.ResponseError, match=message):
        r.execute_command("XGROUP", "CREATE", "s", "g", "0", *args)
    assert r.execute_command("XINFO", "GROUPS", "s") == []


def test_command_docs_declare_the_syntax(partita_server):
    raw = Resp(partita_server.port).call("COMMAND", "DOCS", "xgroup")
    assert b"MAXDELIVERIES" in raw and b"xgroup|config" in raw


def test_max_deliveries_past_u32_is_refused_before_anything_is_created(partita_server):
    """The group journal keeps MAXDELIVERIES as a u32: a larger count is
    refused with a clear error (it was an internal error after MKSTREAM had
    already created the key), and nothing is created or changed."""
    raw = Resp(partita_server.port)
    too_many = str(2**32)
    refused = b"-ERR MAXDELIVERIES must be between 0 and 4294967295\r\n"
    assert raw.call("XGROUP", "CREATE", "fresh", "g", "$", "MKSTREAM",
                    "MAXDELIVERIES", too_many, "DEADLETTER", "dlq") == refused
    assert raw.call("EXISTS", "fresh") == b":0\r\n"
    assert raw.call("XGROUP", "CREATE", "fresh", "g", "$", "MKSTREAM") == b"+OK\r\n"
    assert raw.call("XGROUP", "CONFIG", "fresh", "g", "MAXDELIVERIES", too_many,
                    "DEADLETTER", "dlq") == refused
    assert raw.call("XGROUP", "CONFIG", "fresh", "g", "MAXDELIVERIES", "4294967295",
                    "DEADLETTER", "dlq") == b"+OK\r\n"
