"""Group membership on multi-partition topics through a real partita:
assignment, session timeouts, hand-over of pending entries, joins, leaves, restart."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from tests.e2e.streams_support import blocked_clients

SESSION_MS = 400


def _pairs(value):
    if isinstance(value, dict):
        return value
    return dict(zip(value[::2], value[1::2]))


@pytest.fixture
def server(partita_factory):
    return partita_factory(["--group-session-timeout-ms", str(SESSION_MS)])


def read(r, consumer, count=None, topic="t", ack=True):
    """One XREADGROUP >; returns {partition key: [(id, fields)]}, acking unless told not to."""
    got = r.xreadgroup("g", consumer, {topic: ">"}, count=count) or []
    out = {}
    for key, entries in got:
        out[key.decode()] = entries
        if ack and entries:
            r.xack(key, "g", *[eid for eid, _ in entries])
    return out


def assignment(r, topic="t"):
    groups = r.execute_command("TOPIC", "GROUPS", topic, "g")
    g = _pairs(groups[0])
    return {_pairs(m)[b"name"].decode(): sorted(k.decode() for k in _pairs(m)[b"partitions"])
            for m in g[b"members"]}


def settle(r, consumers, want_each, topic="t", timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for c in consumers:
            read(r, c, topic=topic)
        a = assignment(r, topic)
        if sorted(a) == sorted(consumers) and all(len(v) == want_each for v in a.values()):
            return a
        time.sleep(0.02)
    raise AssertionError(f"assignment did not settle: {assignment(r, topic)}")


def wait_until(check, what, timeout_s=10.0):
    """Poll ``check()`` until it is true (bounded)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout_s}s")
        time.sleep(0.02)


def setup_topic(r, partitions=6):
    r.execute_command("TOPIC", "CREATE", "t", "PARTITIONS", str(partitions))
    assert r.xgroup_create("t", "g", id="$") is True
    for p in range(partitions):
        assert [g["name"] for g in r.xinfo_groups(f"t#{p}")] == [b"g"]


def test_six_partitions_three_consumers_each_own_two(server):
    r = server.client()
    setup_topic(r)
    a = settle(r, ["c1", "c2", "c3"], 2)
    assert sorted(k for v in a.values() for k in v) == [f"t#{p}" for p in range(6)]
    for i in range(60):
        r.xadd("t", {"i": i})
    seen = {}
    for c in ("c1", "c2", "c3"):
        for key, entries in read(r, c).items():
            assert key in a[c]  # only from its own partitions
            for _, fields in entries:
                assert fields[b"i"] not in seen
                seen[fields[b"i"]] = c
    assert len(seen) == 60
    assert [sum(1 for v in seen.values() if v == c) for c in ("c1", "c2", "c3")] == [20, 20, 20]


def test_silent_consumer_dies_and_its_pending_entries_go_first_to_the_new_owners(server):
    r = server.client()
    setup_topic(r)
    a = settle(r, ["c1", "c2", "c3"], 2)
    for i in range(30):
        r.xadd("t", {"i": i})
    read(r, "c1")
    read(r, "c2")
    left = read(r, "c3", ack=False)  # c3 takes its entries and stops reading
    assert sorted(left) == a["c3"] and sum(len(v) for v in left.values()) == 10
    deadline = time.monotonic() + SESSION_MS / 1000 + 5
    got: dict[str, list] = {"c1": [], "c2": []}
    while time.monotonic() < deadline:
        for c in ("c1", "c2"):
            for key, entries in read(r, c).items():
                got[c].append((key, [eid for eid, _ in entries]))
        if sorted(assignment(r)) == ["c1", "c2"] and sum(
                len(ids) for c in got for key, ids in got[c] if key in left) == 10:
            break
        time.sleep(0.05)
    final = assignment(r)
    assert sorted(final) == ["c1", "c2"] and [len(v) for v in final.values()] == [3, 3]
    for c in ("c1", "c2"):
        assert set(a[c]) <= set(final[c])  # sticky: only c3's partitions moved
    # The new owner of each of c3's partitions got c3's unacknowledged entries,
    # first, with delivery count 2.
    for key, entries in left.items():
        owner = next(c for c in final if key in final[c])
        batches = [ids for k, ids in got[owner] if k == key]
        assert batches[0] == [eid for eid, _ in entries]
    r.xadd("t", {"after": 1})
    # No entry is left pending for the dead consumer.
    for p in range(6):
        assert all(row["consumer"] != b"c3" for row in r.xpending_range(f"t#{p}", "g", "-", "+", 100))


def test_delivery_count_of_handed_over_entries(server):
    r = server.client()
    setup_topic(r, partitions=2)
    settle(r, ["a", "b"], 1)
    for i in range(4):
        r.xadd("t", {"i": i})
    b_part = assignment(r)["b"][0]
    read(r, "a")
    taken = read(r, "b", ack=False)[b_part]
    time.sleep(SESSION_MS / 1000 + 0.1)
    first = read(r, "a", ack=False)
    assert [eid for eid, _ in first[b_part]] == [eid for eid, _ in taken]
    rows = r.xpending_range(b_part, "g", "-", "+", 10)
    assert {row["consumer"] for row in rows} == {b"a"}
    assert {row["times_delivered"] for row in rows} == {2}


def test_a_joiner_takes_only_its_share_and_waits_for_acks(server):
    r = server.client()
    setup_topic(r)
    before = settle(r, ["c1", "c2"], 3)
    for i in range(12):
        r.xadd("t", {"i": i})
    held = read(r, "c1", ack=False)  # c1 holds unacknowledged entries on its 3 partitions
    read(r, "c2")
    assert sorted(held) == before["c1"]
    read(r, "c3")
    a = assignment(r)
    # The partition moving from c1 is revoked (nobody reads it) until c1 acks.
    assert len(a["c1"]) == 2 and set(a["c1"]) <= set(before["c1"])
    moving = (set(before["c1"]) - set(a["c1"])).pop()
    assert moving not in a["c3"]
    r.xadd(moving, {"new": 1})
    assert moving not in read(r, "c3")
    assert moving not in read(r, "c1")  # the revoked owner gets no new entries either
    # c1 acknowledges what it held there; then c3 takes the partition.
    r.xack(moving, "g", *[eid for eid, _ in held[moving]])
    got = read(r, "c3")
    assert [f for _, f in got[moving]] == [{b"new": b"1"}]
    final = settle(r, ["c1", "c2", "c3"], 2)
    # Only the two partitions c3 took changed hands.
    assert set(final["c1"]) <= set(before["c1"]) and set(final["c2"]) <= set(before["c2"])


def test_leave_hands_pending_entries_to_the_remaining_member(server):
    r = server.client()
    setup_topic(r, partitions=4)
    settle(r, ["x", "y"], 2)
    for i in range(8):
        r.xadd("t", {"i": i})
    read(r, "x")
    held = read(r, "y", ack=False)
    assert sum(len(v) for v in held.values()) == 4
    assert r.xgroup_delconsumer("t", "g", "y") == 4
    assert assignment(r) == {"x": [f"t#{p}" for p in range(4)]}
    got = read(r, "x")
    assert {k: [eid for eid, _ in v] for k, v in got.items()} == {
        k: [eid for eid, _ in v] for k, v in held.items()}


def test_blocked_member_wakes_for_its_partitions(server):
    r = server.client()
    setup_topic(r, partitions=3)
    settle(r, ["solo"], 3)
    result = {}

    def reader():
        c = server.client()
        result["got"] = c.xreadgroup("g", "solo", {"t": ">"}, block=5000)

    t = threading.Thread(target=reader)
    t.start()
    time.sleep(SESSION_MS / 1000 * 2)  # blocked longer than the session timeout: still a member
    r.xadd("t#1", {"late": 1})
    t.join(10)
    assert [k for k, _ in result["got"]] == [b"t#1"]
    assert list(assignment(r)) == ["solo"]


def test_a_blocked_member_reads_as_a_member_of_the_group_created_anew(server):
    """XGROUP DESTROY and CREATE in one transaction while a member blocks: the
    woken read looks the group up again, as Redis 7.2+ runs a woken
    XREADGROUP again, and goes on as a member of the new group (it went on
    with the destroyed group's assignment instead: a member no view showed,
    served the partitions the new group's members owned)."""
    r = server.client()
    setup_topic(r, partitions=2)
    settle(r, ["b"], 2)
    result = {}

    def reader():
        c = server.client(socket_timeout=60)  # (a timeout would send the read again: a new read)
        result["got"] = c.xreadgroup("g", "b", {"t": ">"}, block=30000)

    t = threading.Thread(target=reader)
    t.start()
    wait_until(lambda: blocked_clients(server.port) == 1, "the member did not block")
    with r.pipeline(transaction=True) as p:
        p.xgroup_destroy("t", "g")
        p.xgroup_create("t", "g", id="$")
        assert p.execute() == [1, True]
    wait_until(lambda: "b" in assignment(r), "the blocked member did not join the new group")
    wait_until(lambda: read(r, "o") == {} and sorted(map(len, assignment(r).values())) == [1, 1],
               "the two members did not get a partition each")
    owned = assignment(r)
    r.xadd(owned["o"][0], {"for": "o"})
    r.xadd(owned["b"][0], {"for": "b"})
    t.join(10)
    assert [(k.decode(), [f for _, f in e]) for k, e in result["got"]] == [(owned["b"][0], [{b"for": b"b"}])]
    assert {k: [f for _, f in e] for k, e in read(r, "o").items()} == {owned["o"][0]: [{b"for": b"o"}]}


@pytest.mark.parametrize("dead_letter_key", ["t", "t#1"])
def test_a_group_of_a_topic_cannot_dead_letter_into_the_topic(server, dead_letter_key):
    """The dead-letter stream of a topic's group must be outside the topic:
    into the topic key, a dead-lettering read failed (the key needs a
    partition); into a partition, its dead letters came back to the group
    (and CONFIG changed every partition but that one)."""
    r = server.client()
    setup_topic(r, partitions=3)
    refused = "the DEADLETTER key must differ from the stream key"
    for args in (("CREATE", "t", "h", "0"), ("CONFIG", "t", "g")):
        with pytest.raises(redis.ResponseError, match=refused):
            r.execute_command("XGROUP", *args, "MAXDELIVERIES", "1", "DEADLETTER", dead_letter_key)
    for p in range(3):
        assert [_pairs(g) for g in r.execute_command("XINFO", "GROUPS", f"t#{p}")] == [
            {b"name": b"g", b"consumers": 0, b"pending": 0, b"last-delivered-id": b"0-0",
             b"entries-read": None, b"lag": 0}]
    with pytest.raises(redis.ResponseError, match=refused):
        r.execute_command("XGROUP", "CREATE", "t#0", "h", "0", "MAXDELIVERIES", "1", "DEADLETTER", dead_letter_key)


@pytest.mark.parametrize("args", [
    ("XGROUP", "SETID", "t", "nog", "$"),
    ("XGROUP", "SETID", "t", "nog", "bad-id"),  # the group is looked up first, as in Redis
    ("XGROUP", "CREATECONSUMER", "t", "nog", "c"),
    ("XGROUP", "DELCONSUMER", "t", "nog", "c"),
    ("XGROUP", "CONFIG", "t", "nog", "MAXDELIVERIES", "2", "DEADLETTER", "dlq"),
    ("XINFO", "CONSUMERS", "t", "nog"),
])
def test_a_missing_group_of_a_topic_is_named_with_the_topic_key(server, args):
    """As Redis names the key it was given (SETID, CREATECONSUMER and CONFIG
    named partition 0's key, 't#0', which the client never sent)."""
    r = server.client()
    setup_topic(r, partitions=3)
    with pytest.raises(redis.ResponseError) as refused:
        r.execute_command(*args)
    assert str(refused.value) == "NOGROUP No such consumer group 'nog' for key name 't'"


def _group_state(r, partitions):
    """Per partition key: its groups (name, last-delivered-id, consumers, dead-letter settings)."""
    return {f"t#{p}": [(g["name"], g["last-delivered-id"], g["consumers"], g.get("max-deliveries"))
                       for g in r.xinfo_groups(f"t#{p}")] for p in range(partitions)}


@pytest.mark.parametrize("args", [
    ("XGROUP", "SETID", "t", "g", "$"),
    ("XGROUP", "CREATECONSUMER", "t", "g", "c"),
    ("XGROUP", "DELCONSUMER", "t", "g", "c"),
    ("XGROUP", "CONFIG", "t", "g", "MAXDELIVERIES", "2", "DEADLETTER", "dlq"),
])
def test_a_topic_group_command_refuses_a_group_missing_on_a_partition_and_changes_nothing(server, args):
    """A topic's group lives on every partition: once destroyed on one
    partition key, the topic key's command names that partition key and
    changes no partition (SETID, CREATECONSUMER and CONFIG changed the
    others, then failed on 't#2': a half-applied command)."""
    r = server.client()
    setup_topic(r, partitions=4)
    r.xgroup_createconsumer("t#1", "g", "c")
    r.xadd("t#0", {"a": 1})
    assert r.xgroup_destroy("t#2", "g") == 1
    before = _group_state(r, 4)
    with pytest.raises(redis.ResponseError) as refused:
        r.execute_command(*args)
    assert str(refused.value) == "NOGROUP No such consumer group 'g' for key name 't#2'"
    assert _group_state(r, 4) == before


def test_a_member_of_a_topic_group_missing_on_a_partition_is_refused_naming_it(server):
    """XREADGROUP on the topic key whose group a partition key destroyed:
    Redis's NOGROUP naming that partition key (the membership assigned
    't#2' to the member, which then never got its entries, with no error);
    XGROUP CREATE of the topic key makes the group whole again."""
    r = server.client()
    setup_topic(r, partitions=4)
    assert r.xgroup_destroy("t#2", "g") == 1
    r.xadd("t#2", {"on": 2})
    with pytest.raises(redis.ResponseError) as refused:
        r.xreadgroup("g", "c", {"t": ">"})
    assert str(refused.value) == "NOGROUP No such key 't#2' or consumer group 'g' in XREADGROUP with GROUP option"
    assert r.xgroup_create("t", "g", id="0") is True  # (only 't#2' lacked it)
    assert {k: [f for _, f in e] for k, e in read(r, "c").items()} == {"t#2": [{b"on": b"2"}]}


def test_a_blocked_member_is_refused_when_a_partition_key_destroys_the_group(server):
    """A member blocked on the topic key wakes when 't#1' loses the group,
    and is refused naming it, as a blocked reader whose group is destroyed."""
    r = server.client()
    setup_topic(r, partitions=2)
    settle(r, ["b"], 2)
    result = {}

    def reader():
        c = server.client(socket_timeout=60)
        try:
            result["got"] = c.xreadgroup("g", "b", {"t": ">"}, block=30000)
        except redis.ResponseError as e:
            result["error"] = str(e)

    t = threading.Thread(target=reader)
    t.start()
    wait_until(lambda: blocked_clients(server.port) == 1, "the member did not block")
    assert r.xgroup_destroy("t#1", "g") == 1
    t.join(10)
    assert result == {"error": "NOGROUP No such key 't#1' or consumer group 'g' in XREADGROUP with GROUP option"}


def test_info_counts_a_silent_member_out_once_its_session_times_out(server):
    """INFO topics' group_members counts live members: one silent for the
    session timeout is not, though nothing has expired it yet (no read, no
    group view since). It was counted until something synced the group."""
    r = server.client()
    setup_topic(r, partitions=2)
    read(r, "gone")

    def members() -> int:
        return r.info("topics")["group_members"]

    assert members() == 1
    wait_until(lambda: members() == 0, "the silent member still counted")


def test_views_and_manual_assignment_on_partition_keys(server):
    r = server.client()
    setup_topic(r, partitions=2)
    settle(r, ["m1", "m2"], 1)
    for i in range(4):
        r.xadd("t", {"i": i})
    consumers = {c["name"]: c for c in r.xinfo_consumers("t", "g")}
    assert set(consumers) == {b"m1", b"m2"}
    groups = r.xinfo_groups("t")
    assert groups[0]["name"] == b"g" and groups[0]["lag"] == 4
    # Explicit partition key: plain Redis semantics, no membership.
    got = r.xreadgroup("g", "manual", {"t#0": ">"})
    assert got[0][0] == b"t#0" and len(got[0][1]) == 2
    assert r.xpending("t#0", "g")["consumers"] == [{"name": b"manual", "pending": 2}]
    with pytest.raises(redis.ResponseError, match="needs a partition key"):
        r.xack("t", "g", "1-1")
    desc = _pairs(r.execute_command("TOPIC", "DESCRIBE", "t"))
    rows = [_pairs(p) for p in _pairs(desc[b"groups"][0])[b"partitions"]]
    assert [row[b"key"] for row in rows] == [b"t#0", b"t#1"]
    assert [row[b"lag"] for row in rows] == [0, 2]


def test_restart_keeps_group_state_and_pending_entries_come_back_first(server):
    r = server.client()
    setup_topic(r, partitions=3)
    settle(r, ["k"], 3)
    for i in range(6):
        r.xadd("t", {"i": i})
    held = read(r, "k", ack=False)
    assert sum(len(v) for v in held.values()) == 6
    server.restart()
    r = server.client()
    for p in range(3):
        assert r.xpending(f"t#{p}", "g")["pending"] == 2
    got = read(r, "k2")  # membership is rebuilt by reading: a new member takes everything
    assert {k: [eid for eid, _ in v] for k, v in got.items()} == {
        k: [eid for eid, _ in v] for k, v in held.items()}
    assert all(r.xpending(f"t#{p}", "g")["pending"] == 0 for p in range(3))


def test_concurrent_members_and_a_joiner_get_each_entry_once(server):
    """Members reading with BLOCK and acking at once, a producer, and a member
    joining half-way: every entry is delivered exactly once (nobody dies, so
    nothing is handed over), and the joiner gets a share."""
    r = server.client()
    setup_topic(r, partitions=6)
    total = 300
    deliveries: list = []
    lock = threading.Lock()
    stop = threading.Event()

    def member(name):
        c = server.client()
        while not stop.is_set():
            got = c.xreadgroup("g", name, {"t": ">"}, count=20, block=100) or []
            for key, entries in got:
                with lock:
                    deliveries.extend((name, key, eid) for eid, _ in entries)
                if entries:
                    c.xack(key, "g", *[eid for eid, _ in entries])

    threads = [threading.Thread(target=member, args=(n,)) for n in ("m1", "m2")]
    for t in threads:
        t.start()
    for i in range(total):
        r.xadd("t", {"i": i})
        if i == total // 2:
            late = threading.Thread(target=member, args=("m3",))
            late.start()
            threads.append(late)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and len(deliveries) < total:
        time.sleep(0.05)
    time.sleep(0.3)
    stop.set()
    for t in threads:
        t.join(10)
    ids = [(key, eid) for _, key, eid in deliveries]
    assert len(ids) == total and len(set(ids)) == total
    assert {name for name, _, _ in deliveries} == {"m1", "m2", "m3"}
    assert all(r.xpending(f"t#{p}", "g")["pending"] == 0 for p in range(6))


def test_xgroup_create_mkstream_with_a_bad_option_creates_no_topic(partita_factory):
    """A syntax error is answered before anything is made, also when MKSTREAM
    would create a topic of default-partitions (it created one before)."""
    r = partita_factory(["--default-partitions", "3"]).client()
    with pytest.raises(redis.ResponseError, match="unknown subcommand or wrong number of arguments for 'CREATE'"):
        r.execute_command("XGROUP", "CREATE", "fresh", "g", "$", "MKSTREAM", "NOSUCHOPTION", "x")
    assert r.exists("fresh") == 0
    assert r.execute_command("XGROUP", "CREATE", "fresh", "g", "$", "MKSTREAM") == b"OK"
    assert r.execute_command("TOPIC", "DESCRIBE", "fresh")  # a topic of 3 partitions, each with the group
    assert [g["name"] for g in r.xinfo_groups("fresh#2")] == [b"g"]
