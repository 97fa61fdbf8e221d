"""Redis 8 stream behaviour that differs from Redis 7.0, as specifications.

No Redis 8 binary runs here (the differential tests compare with redis-server
7.0 where 7.0 and 8 agree), so these expect the replies Redis 8.10's command
pages, their histories and its release notes describe, byte for byte where
nothing varies (RESP2 and RESP3), through a real ``partita`` process and
through redis-py's own methods:

- XINFO STREAM / FULL: Redis 8's fields in its order and nothing else;
  XINFO CONSUMERS ``idle``/``inactive`` and FULL's ``seen-time``/``active-time``
  as 7.2 defined them (every XREADGROUP attempt creates its consumer);
- a blocked XREADGROUP whose key or group goes away: the command's own
  NOGROUP (7.2+ runs a woken command again); a blocked XREAD's deleted key
  blocks on;
- lag and entries-read as Redis 8.2.2+ computes them (redis #13338, #13473,
  #13958; XGROUP ENTRIESREAD at most entries-added, #14259);
- XSETID's 7.2+ checks, and XSETID on a stream trimmed empty;
- ``<ms>-*`` after ``<ms>-<max seq>``, and XREAD / XREADGROUP unbalanced
  stream lists (7.4's texts naming the command);
- ``XREAD ... +`` (7.4).
"""

from __future__ import annotations

import pytest

from tests.conftest import wait_for
from tests.e2e.streams_support import Error, Map, Null, RespClient, Simple, blocked_clients, encode, info_pairs, parse

PROTOCOLS = pytest.mark.parametrize("protocol", [2, 3], ids=["resp2", "resp3"])

XADD_ID_TOO_SMALL = Error("ERR The ID specified in XADD is equal or smaller than the target stream top item")
NOGROUP_TO_READ = Error("NOGROUP No such key 's' or consumer group 'g' in XREADGROUP with GROUP option")


def _fields(reply) -> dict:
    """A map reply parsed (``parse``) -> dict, RESP2 (flat) or RESP3 (pairs)."""
    if reply and isinstance(reply[0], tuple):
        return dict(reply)
    return dict(zip(reply[0::2], reply[1::2]))


@pytest.fixture
def client(shared_clients):
    return shared_clients


# ------------------------------------------------------------------ XINFO


# Redis 8.6's idempotence fields (XADD IDMP) with no IDMP used and no XCFGSET:
# the defaults, nothing tracked. They follow recorded-first-entry-id in both
# forms (tests/e2e/test_idmp.py checks their values).
IDEMPOTENCE_DEFAULTS = (("idmp-duration", 100), ("idmp-maxsize", 100), ("pids-tracked", 0), ("iids-tracked", 0),
                        ("iids-added", 0), ("iids-duplicates", 0))


@PROTOCOLS
def test_xinfo_stream_has_redis_8s_fields_in_its_order_and_nothing_else(client, protocol):
    c = client(protocol)
    c.call("XADD", "s", "1-1", "a", "1")
    c.call("XADD", "s", "2-1", "b", "2")
    assert c.call("XINFO", "STREAM", "s") == encode(Map([
        ("length", 2), ("radix-tree-keys", 1), ("radix-tree-nodes", 2),
        ("last-generated-id", "2-1"), ("max-deleted-entry-id", "0-0"), ("entries-added", 2),
        ("recorded-first-entry-id", "1-1"), *IDEMPOTENCE_DEFAULTS, ("groups", 0),
        ("first-entry", ["1-1", ["a", "1"]]), ("last-entry", ["2-1", ["b", "2"]]),
    ]), protocol)
    assert c.call("XINFO", "STREAM", "s", "FULL", "COUNT", "1") == encode(Map([
        ("length", 2), ("radix-tree-keys", 1), ("radix-tree-nodes", 2),
        ("last-generated-id", "2-1"), ("max-deleted-entry-id", "0-0"), ("entries-added", 2),
        ("recorded-first-entry-id", "1-1"), *IDEMPOTENCE_DEFAULTS, ("entries", [["1-1", ["a", "1"]]]),
        ("groups", []),
    ]), protocol)


@PROTOCOLS
def test_xinfo_stream_full_consumers_have_seen_time_then_active_time(client, protocol):
    c = client(protocol)
    c.call("XGROUP", "CREATE", "s", "g", "$", "MKSTREAM")
    c.call("XREADGROUP", "GROUP", "g", "idler", "STREAMS", "s", ">")  # creates the consumer (7.2+)
    c.call("XADD", "s", "1-1", "a", "1")
    c.call("XREADGROUP", "GROUP", "g", "reader", "STREAMS", "s", ">")
    full = _fields(parse(c.call("XINFO", "STREAM", "s", "FULL")))
    [group] = full[b"groups"]
    group = _fields(group)
    assert list(group) == [b"name", b"last-delivered-id", b"entries-read", b"lag", b"pel-count",
                           b"nacked-count", b"pending", b"consumers"]
    assert group[b"nacked-count"] == 0
    idler, reader = (_fields(x) for x in group[b"consumers"])
    assert list(reader) == [b"name", b"seen-time", b"active-time", b"pel-count", b"pending"]
    assert idler[b"name"] == b"idler" and idler[b"active-time"] == -1 and idler[b"pel-count"] == 0
    assert reader[b"active-time"] == reader[b"seen-time"] > 0 and reader[b"pel-count"] == 1


def test_xinfo_consumers_idle_and_inactive_of_a_consumer_that_read_nothing(client):
    """Redis's "Consumer seen-time and active-time" test: an XREADGROUP of an
    empty stream creates the consumer, with ``idle`` and ``inactive`` -1."""
    c = client(2)
    c.call("XGROUP", "CREATE", "s", "g", "$", "MKSTREAM")
    assert parse(c.call("XREADGROUP", "GROUP", "g", "Alice", "COUNT", "1", "STREAMS", "s", ">")) is None
    [alice] = parse(c.call("XINFO", "CONSUMERS", "s", "g"))
    alice = _fields(alice)
    assert list(alice) == [b"name", b"pending", b"idle", b"inactive"]
    assert alice[b"name"] == b"Alice" and alice[b"pending"] == 0 and alice[b"inactive"] == -1
    assert alice[b"idle"] >= 0
    c.call("XADD", "s", "1-1", "f", "v")
    c.call("XREADGROUP", "GROUP", "g", "Alice", "COUNT", "1", "STREAMS", "s", ">")
    alice = _fields(parse(c.call("XINFO", "CONSUMERS", "s", "g"))[0])
    assert 0 <= alice[b"inactive"] <= alice[b"idle"] + 1000 and alice[b"pending"] == 1


def test_redis_py_xinfo_methods(partita_shared):
    for protocol in (2, 3):
        r = partita_shared.client(protocol=protocol)
        r.flushall()
        r.xadd("s", {"a": 1}, id="1-1")
        r.xgroup_create("s", "g", id="0")
        r.xreadgroup("g", "c1", {"s": ">"}, count=1)
        r.xreadgroup("g", "c2", {"s": ">"}, count=1)  # nothing left: c2 is created all the same
        info = r.xinfo_stream("s")
        assert list(info) == ["length", "radix-tree-keys", "radix-tree-nodes", "last-generated-id",
                              "max-deleted-entry-id", "entries-added", "recorded-first-entry-id",
                              *(name for name, _ in IDEMPOTENCE_DEFAULTS), "groups", "first-entry", "last-entry"]
        assert info["groups"] == 1 and info["first-entry"] == (b"1-1", {b"a": b"1"})
        consumers = r.xinfo_consumers("s", "g")
        assert [x["name"] for x in consumers] == [b"c1", b"c2"]
        assert [x["pending"] for x in consumers] == [1, 0] and consumers[1]["inactive"] == -1
        assert all("idle" in x for x in consumers)
        [group] = r.xinfo_groups("s")
        assert group["consumers"] == 2 and group["entries-read"] == 1 and group["lag"] == 0
        full = r.xinfo_stream("s", full=True)
        assert [x["name"] for x in full["groups"][0]["consumers"]] == [b"c1", b"c2"]
        r.close()


# ------------------------------------------------------------ unblocking


@PROTOCOLS
@pytest.mark.parametrize("how", ["del", "flushall", "destroy"])
def test_blocked_xreadgroup_whose_key_or_group_goes_gets_the_commands_nogroup(partita_shared, client, protocol,
                                                                                 how):
    admin = client(2)
    reader = client(protocol)
    admin.call("XGROUP", "CREATE", "s", "g", "$", "MKSTREAM")
    reader.send("XREADGROUP", "GROUP", "g", "c", "BLOCK", "0", "STREAMS", "s", ">")
    assert wait_for(lambda: blocked_clients(partita_shared.port) == 1)
    {"del": lambda: admin.call("DEL", "s"), "flushall": lambda: admin.call("FLUSHALL"),
     "destroy": lambda: admin.call("XGROUP", "DESTROY", "s", "g")}[how]()
    assert reader.read_reply() == encode(NOGROUP_TO_READ, protocol)


def test_blocked_xread_whose_key_is_deleted_blocks_on(partita_shared, client):
    """Redis 7.2's "Blocking XREAD: key deleted": the read is not refused; an
    entry added to the re-created key after the position is served."""
    admin = client(2)
    reader = client(2)
    admin.call("XADD", "s", "666-0", "f", "v")
    reader.send("XREAD", "BLOCK", "0", "STREAMS", "s", "$")
    assert wait_for(lambda: blocked_clients(partita_shared.port) == 1)
    admin.call("DEL", "s")
    admin.call("XADD", "s", "667-0", "f", "v")
    assert parse(reader.read_reply()) == [[b"s", [[b"667-0", [b"f", b"v"]]]]]


# ------------------------------------------------------ lag, entries-read


def _group(c: RespClient) -> dict:
    return _fields(parse(c.call("XINFO", "GROUPS", "s"))[0])


def test_lag_after_trimming_past_the_group(client):
    """redis #13957 / #13958 (Redis 8): a group behind the first entry counts
    the remaining entries as its lag, and reads on with a valid counter."""
    c = client(2)
    for n in range(1, 6):
        c.call("XADD", "s", f"{n}-0", "data", str(n))
    c.call("XGROUP", "CREATE", "s", "g", "0")
    c.call("XREADGROUP", "GROUP", "g", "c", "COUNT", "1", "STREAMS", "s", ">")
    c.call("XTRIM", "s", "MAXLEN", "1")
    g = _group(c)
    assert (g[b"last-delivered-id"], g[b"entries-read"], g[b"lag"]) == (b"1-0", 1, 1)
    assert parse(c.call("XREADGROUP", "GROUP", "g", "c", "COUNT", "1", "STREAMS", "s", ">")) == [
        [b"s", [[b"5-0", [b"data", b"5"]]]]]
    g = _group(c)
    assert (g[b"entries-read"], g[b"lag"]) == (5, 0)


def test_lag_with_holes_before_the_first_entry(client):
    """redis #13337 (7.4): entries deleted after the group's last ID, then
    every entry up to the first live one: the lag is the length."""
    c = client(2)
    c.call("XGROUP", "CREATE", "s", "g", "$", "MKSTREAM")
    c.call("XADD", "s", "0-1", "name", "Mercury")
    c.call("XADD", "s", "0-2", "name", "Venus")
    c.call("XREADGROUP", "GROUP", "g", "alice", "STREAMS", "s", ">")
    c.call("XADD", "s", "0-3", "name", "Earth")
    c.call("XADD", "s", "0-4", "name", "Jupiter")
    c.call("XDEL", "s", "0-1", "0-2", "0-3")
    assert _group(c)[b"lag"] == 1
    c.call("XDEL", "s", "0-4")
    assert _group(c)[b"lag"] == 0  # nothing left


def test_entriesread_is_at_most_entries_added(client):
    """Redis 8.2.2 (#14259): XGROUP CREATE / SETID ENTRIESREAD above the
    stream's entries-added is taken as entries-added (the lag was negative)."""
    c = client(2)
    c.call("XADD", "s", "1-0", "f", "v")
    c.call("XGROUP", "CREATE", "s", "g", "$", "ENTRIESREAD", "100")
    g = _group(c)
    assert (g[b"entries-read"], g[b"lag"]) == (1, 0)
    c.call("XGROUP", "SETID", "s", "g", "0", "ENTRIESREAD", "50")
    assert _group(c)[b"entries-read"] == 1


# ------------------------------------------------------------------ XSETID


@PROTOCOLS
def test_xsetid_on_a_stream_trimmed_empty(client, protocol):
    """Redis's "XSETID can set a specific ID" / "cannot SETID with smaller ID":
    the check is against the entries that exist."""
    c = client(protocol)
    assert parse(c.call("XADD", "s", "MAXLEN", "0", "*", "a", "b"))
    assert c.call("XSETID", "s", "200-0") == encode(Simple("OK"), protocol)
    info = dict(info_pairs(c.call("XINFO", "STREAM", "s")))
    assert (info[b"last-generated-id"], info[b"entries-added"], info[b"length"]) == (b"200-0", 1, 0)
    assert parse(c.call("XADD", "s", "*", "a", "b"))
    assert c.call("XSETID", "s", "1-1") == encode(
        Error("ERR The ID specified in XSETID is smaller than the target stream top item"), protocol)


@PROTOCOLS
def test_xsetid_below_the_current_max_deleted_entry_id(client, protocol):
    """Redis 7.2+ (Redis's "XSETID cannot set smaller ID than current MAXDELETEDID")."""
    c = client(protocol)
    for n in (1, 2, 3):
        c.call("XADD", "s", f"1-{n}", "a", str(n))
    c.call("XDEL", "s", "1-2")
    c.call("XDEL", "s", "1-3")
    assert dict(info_pairs(c.call("XINFO", "STREAM", "s")))[b"max-deleted-entry-id"] == b"1-3"
    assert c.call("XSETID", "s", "1-2") == encode(
        Error("ERR The ID specified in XSETID is smaller than current max_deleted_entry_id"), protocol)
    assert c.call("XSETID", "s", "1-3") == encode(Simple("OK"), protocol)


def test_every_append_path_continues_above_ids_trimmed_before_an_xsetid_below_them(client):
    """After an XSETID below the IDs of trimmed entries (accepted, 7.2+) the
    log still holds those IDs: XADD IDMP and a pipelined run of ``XADD key *``
    (the C scanner's path) continue above them (``Stream.id_floor``), as a
    plain ``*`` does, and an IDMP retry still answers the original ID."""
    c = client(2)
    top = 10**15  # beyond any wall clock: IDs continue from it
    c.call("XADD", "s", f"{top}-0", "a", "b")
    c.call("XTRIM", "s", "MAXLEN", "0")
    assert c.call("XSETID", "s", "5-0") == b"+OK\r\n"
    first = c.call("XADD", "s", "IDMP", "p", "i", "*", "f", "v")
    assert first == encode(f"{top}-1")
    for _ in range(3):
        c.send("XADD", "s", "*", "f", "run")
    assert [c.read_reply() for _ in range(3)] == [encode(f"{top}-{n}") for n in (2, 3, 4)]
    assert c.call("XADD", "s", "IDMP", "p", "i", "*", "f", "v") == first
    assert c.call("XLEN", "s") == b":4\r\n"


# -------------------------------------------------------- XADD, XREAD texts


@PROTOCOLS
def test_xadd_ms_star_after_the_last_sequence_of_that_ms(client, protocol):
    c = client(protocol)
    c.call("XADD", "x", "1-18446744073709551615", "f", "v")
    assert c.call("XADD", "x", "1-*", "f", "v") == encode(XADD_ID_TOO_SMALL, protocol)


@PROTOCOLS
def test_unbalanced_stream_lists_name_the_command(client, protocol):
    c = client(protocol)
    c.call("XGROUP", "CREATE", "s", "g", "$", "MKSTREAM")
    assert c.call("XREAD", "COUNT", "1", "STREAMS", "s") == encode(Error(
        "ERR Unbalanced 'xread' list of streams: for each stream key an ID, '+', or '$' must be specified."), protocol)
    assert c.call("XREAD", "STREAMS", "s", "t", "0") == encode(Error(
        "ERR Unbalanced 'xread' list of streams: for each stream key an ID, '+', or '$' must be specified."), protocol)
    assert c.call("XREADGROUP", "GROUP", "g", "c", "COUNT", "1", "STREAMS", "s") == encode(Error(
        "ERR Unbalanced 'xreadgroup' list of streams: for each stream key an ID or '>' must be specified."), protocol)


def test_xread_plus_reads_the_last_entry(client):
    """``XREAD STREAMS key +`` (Redis 7.4): the last entry (7.0 refuses ``+``)."""
    c = client(2)
    assert c.call("XREAD", "STREAMS", "s", "+") == encode(Null(array=True))
    c.call("XADD", "s", "1-1", "a", "1")
    c.call("XADD", "s", "2-1", "b", "2")
    assert parse(c.call("XREAD", "COUNT", "5", "STREAMS", "s", "+")) == [[b"s", [[b"2-1", [b"b", b"2"]]]]]
    c.call("XDEL", "s", "2-1")
    assert parse(c.call("XREAD", "STREAMS", "s", "+")) == [[b"s", [[b"1-1", [b"a", b"1"]]]]]


def test_redis_py_approximate_trim_by_nodes(partita_server):
    """The predis / redis-rb case: nodes of 2 entries, five entries, ``~ 2``
    removes the first two nodes' worth that leave at least 2: 2 entries."""
    r = partita_server.client()
    r.config_set("stream-node-max-entries", 2)
    for n in range(5):
        r.xadd("s", {"n": n})
    assert r.xtrim("s", maxlen=2, approximate=True) == 2
    assert r.xlen("s") == 3
    assert r.xinfo_stream("s")["radix-tree-keys"] == 2
    r.close()
