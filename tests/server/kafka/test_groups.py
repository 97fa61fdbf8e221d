"""The Kafka group coordinator's state machine (server/kafka_front/groups.py) and the offset
stream's replay (storage/group_offsets.py), on trio's autojump clock: joins and generations, sync,
heartbeats, leaving, rebalances on a join and on a session's expiry, the rebalance timeout,
static members, MEMBER_ID_REQUIRED, who may commit; offsets replayed from their entries, snapshots,
the old journal read for an upgrade."""

from __future__ import annotations

import json

import pytest
import trio

from server.kafka import errors as E
from server.kafka_front.groups import COMPLETING, EMPTY, PREPARING, STABLE, Coordinator
from storage import group_offsets
from storage.streams.ids import StreamId

PROTOCOLS = [("range", b"r-meta"), ("roundrobin", b"rr-meta")]
SESSION_MS = 10_000
REBALANCE_MS = 30_000


async def join(c, member_id="", instance_id=None, protocols=PROTOCOLS, group="g", required=False):
    return await c.join(group, member_id, instance_id, SESSION_MS, REBALANCE_MS, "consumer", protocols,
                        "client", "/127.0.0.1", required)


async def start(nursery):
    c = Coordinator()
    nursery.start_soon(c.run)
    return c


async def joined_pair(nursery, c, instances=(None, None)):
    """A member joins alone (generation 1), then a second joins while the first rejoins:
    their generation 2 join results."""
    first = await join(c, instance_id=instances[0])
    assert first.error == E.NONE and first.generation == 1 and first.leader == first.member_id
    results = {}

    async def rejoin(key, member_id, instance):
        results[key] = await join(c, member_id, instance)

    async with trio.open_nursery() as n:
        n.start_soon(rejoin, "a", first.member_id, instances[0])
        n.start_soon(rejoin, "b", "", instances[1])
    a, b = results["a"], results["b"]
    assert a.generation == b.generation == 2
    return a, b


async def test_a_single_member_joins_syncs_and_is_stable(nursery, autojump_clock):
    c = await start(nursery)
    r = await join(c)
    assert (r.error, r.generation, r.protocol, r.leader) == (E.NONE, 1, "range", r.member_id)
    assert r.members == [(r.member_id, None, b"r-meta")]
    assert c.state_of("g") == COMPLETING
    assert await c.sync("g", 1, r.member_id, None, None, None, {r.member_id: b"asg"}) == \
        (E.NONE, "consumer", "range", b"asg")
    assert c.state_of("g") == STABLE
    assert c.heartbeat("g", 1, r.member_id, None) == E.NONE
    assert c.heartbeat("g", 0, r.member_id, None) == E.ILLEGAL_GENERATION
    assert c.heartbeat("g", 1, "nobody", None) == E.UNKNOWN_MEMBER_ID


async def test_a_second_member_rebalances_and_the_follower_waits_for_the_leaders_sync(nursery, autojump_clock):
    c = await start(nursery)
    a, b = await joined_pair(nursery, c)
    leader, follower = (a, b) if a.leader == a.member_id else (b, a)
    assert len(leader.members) == 2 and follower.members == []
    got = {}

    async def follower_sync():
        got["f"] = await c.sync("g", 2, follower.member_id, None, None, None, {})

    async with trio.open_nursery() as n:
        n.start_soon(follower_sync)
        await trio.sleep(1)
        assert "f" not in got  # waits for the leader
        lead = await c.sync("g", 2, leader.member_id, None, None, None,
                            {leader.member_id: b"L", follower.member_id: b"F"})
    assert lead[3] == b"L" and got["f"][3] == b"F"


async def test_heartbeat_during_a_rebalance_says_rejoin(nursery, autojump_clock):
    c = await start(nursery)
    r = await join(c)
    await c.sync("g", 1, r.member_id, None, None, None, {r.member_id: b""})
    async with trio.open_nursery() as n:
        n.start_soon(join, c)  # a newcomer: the group prepares a rebalance
        await trio.sleep(0.1)
        assert c.state_of("g") == PREPARING
        assert c.heartbeat("g", 1, r.member_id, None) == E.REBALANCE_IN_PROGRESS
        assert (await c.sync("g", 1, r.member_id, None, None, None, {}))[0] == E.REBALANCE_IN_PROGRESS
        assert (await join(c, r.member_id)).generation == 2


async def test_a_member_that_heartbeats_but_does_not_rejoin_is_dropped_at_the_rebalance_timeout(
        nursery, autojump_clock):
    c = await start(nursery)

    async def long_session_join(member_id=""):
        return await c.join("g", member_id, None, 60_000, 5_000, "consumer", PROTOCOLS, "client", "", False)

    r = await long_session_join()
    await c.sync("g", 1, r.member_id, None, None, None, {r.member_id: b""})
    t0 = trio.current_time()
    newcomer = None

    async def newcomer_joins():
        nonlocal newcomer
        newcomer = await long_session_join()

    async with trio.open_nursery() as n:
        n.start_soon(newcomer_joins)
        await trio.sleep(0.1)
        while c.heartbeat("g", 1, r.member_id, None) == E.REBALANCE_IN_PROGRESS:  # told, never rejoins
            await trio.sleep(1)
    assert 5 <= trio.current_time() - t0 <= 6
    assert newcomer.generation == 2 and newcomer.leader == newcomer.member_id
    assert [m for m, _, _ in newcomer.members] == [newcomer.member_id]
    assert c.heartbeat("g", 2, r.member_id, None) == E.UNKNOWN_MEMBER_ID


async def test_a_silent_member_expires_after_its_session_and_the_group_rebalances(nursery, autojump_clock):
    c = await start(nursery)
    a, b = await joined_pair(nursery, c)
    leader = a if a.leader == a.member_id else b
    other = b if leader is a else a
    async with trio.open_nursery() as n:
        n.start_soon(c.sync, "g", 2, other.member_id, None, None, None, {})
        await trio.sleep(0)
        await c.sync("g", 2, leader.member_id, None, None, None, {})
    t0 = trio.current_time()
    # only the leader heartbeats; the other goes silent
    while c.heartbeat("g", 2, leader.member_id, None) == E.NONE:
        await trio.sleep(3)
    assert SESSION_MS / 1000 <= trio.current_time() - t0 <= SESSION_MS / 1000 + 3
    r = await join(c, leader.member_id)
    assert r.generation == 3 and [m for m, _, _ in r.members] == [leader.member_id]


async def test_leave_rebalances_and_the_last_member_leaves_the_group_empty(nursery, autojump_clock):
    c = await start(nursery)
    r = await join(c)
    assert c.leave("g", [(r.member_id, None)]) == (E.NONE, [E.NONE])
    assert c.state_of("g") == EMPTY
    assert c.leave("g", [(r.member_id, None)]) == (E.NONE, [E.UNKNOWN_MEMBER_ID])


async def test_v4_joins_need_a_member_id_first(nursery, autojump_clock):
    c = await start(nursery)
    r = await join(c, required=True)
    assert r.error == E.MEMBER_ID_REQUIRED and r.member_id
    again = await join(c, r.member_id, required=True)
    assert again.error == E.NONE and again.member_id == r.member_id
    assert (await join(c, "made-up", required=True)).error == E.UNKNOWN_MEMBER_ID


async def test_a_static_member_rejoining_keeps_its_assignment_without_a_rebalance(nursery, autojump_clock):
    c = await start(nursery)
    a, b = await joined_pair(nursery, c, ("i-a", "i-b"))
    await _settle(c, 2)
    follower, instance = (b, "i-b") if a.leader == a.member_id else (a, "i-a")
    # the follower restarts: it joins with no member id and its instance id
    r = await join(c, instance_id=instance)
    assert r.error == E.NONE and r.generation == 2 and r.member_id != follower.member_id
    assert c.state_of("g") == STABLE
    assert (await c.sync("g", 2, r.member_id, instance, None, None, {}))[3] == b"asg"
    # the old member id is fenced
    assert c.heartbeat("g", 2, follower.member_id, instance) == E.FENCED_INSTANCE_ID
    assert c.heartbeat("g", 2, r.member_id, instance) == E.NONE


async def _settle(c, gen):
    """Sync every member of generation ``gen`` with the assignment b"asg" (the leader last)."""
    g = c.groups["g"]
    async with trio.open_nursery() as n:
        for mid in list(g.members):
            if mid != g.leader:
                n.start_soon(c.sync, "g", gen, mid, None, None, None, {})
        await trio.sleep(0)
        await c.sync("g", gen, g.leader, None, None, None, {m: b"asg" for m in g.members})


async def test_offset_commit_rules(nursery, autojump_clock):
    c = await start(nursery)
    assert c.check_commit("g", -1, "", None, 8) == E.NONE  # a simple consumer, no group yet
    r = await join(c)
    assert c.check_commit("g", 1, r.member_id, None, 8) == E.REBALANCE_IN_PROGRESS  # awaiting sync
    await c.sync("g", 1, r.member_id, None, None, None, {r.member_id: b""})
    assert c.check_commit("g", 1, r.member_id, None, 8) == E.NONE
    assert c.check_commit("g", 0, r.member_id, None, 8) == E.ILLEGAL_GENERATION
    assert c.check_commit("g", 1, "other", None, 8) == E.UNKNOWN_MEMBER_ID
    assert c.check_commit("g", -1, "", None, 8) == E.UNKNOWN_MEMBER_ID  # the group has members


def _replay(entries):
    state = group_offsets.GroupOffsets("g")
    for n, fields in enumerate(entries, 1):
        state.apply(StreamId(n, 0), fields)
    return state


def test_a_groups_offsets_replay_from_its_stream_the_latest_entry_winning():
    state = _replay([
        group_offsets.commit_fields([("t", 0, 5, 0, "m"), ("t", 1, 7, -1, "")], 1000),
        group_offsets.commit_fields([("t", 0, 6, 0, "")], 2000),
        [b"commit", b'[["t", 0'],  # unreadable (written by hand): skipped
        group_offsets.delete_fields([("t", 1)]),
        group_offsets.commit_fields([("u", 2, 9, 3, "x")], 3000),
    ])
    assert {k: (v.offset, v.leader_epoch, v.metadata) for k, v in state.offsets.items()} == {
        ("t", 0): (6, 0, ""), ("u", 2): (9, 3, "x")}
    assert state.applied == StreamId(5, 0)
    dropped = _replay([group_offsets.commit_fields([("t", 0, 5, 0, "")], 1), group_offsets.drop_fields(),
                       group_offsets.commit_fields([("t", 1, 2, 0, "")], 2)])
    assert list(dropped.offsets) == [("t", 1)]  # the group deleted, then committed to again


def test_an_entry_nested_too_deep_for_the_parser_is_skipped_as_unreadable(caplog):
    """JSON nested deeper than the parser goes (json raises RecursionError,
    not ValueError): skipped with a warning like any unreadable entry."""
    with caplog.at_level("WARNING", logger="partita.storage"):
        state = _replay([group_offsets.commit_fields([("t", 0, 5, 0, "")], 1000),
                         [b"commit", b"[" * 100000],
                         group_offsets.commit_fields([("t", 1, 7, 0, "")], 2000)])
    assert "skipping an unreadable offsets entry 2-0" in caplog.text
    assert {k: v.offset for k, v in state.offsets.items()} == {("t", 0): 5, ("t", 1): 7}
    assert state.applied == StreamId(3, 0) and state.since_snapshot == 3


@pytest.mark.parametrize("payload", [b'{"a12345": 0}', b'"a12345"', b'[{"t": 0}]', b'["a1"]'])
def test_an_entry_whose_rows_are_not_lists_is_skipped_as_unreadable(caplog, payload):
    """A payload that is not a list of rows (written there by hand): an
    object or a string is not taken apart into a row, character by
    character, as a commit of topic "a", partition 1, offset 2."""
    for kind in (b"commit", b"delete"):
        with caplog.at_level("WARNING", logger="partita.storage"):
            state = _replay([group_offsets.commit_fields([("t", 0, 5, 0, "")], 1000), [kind, payload]])
        assert "skipping an unreadable offsets entry 2-0" in caplog.text
        assert {k: v.offset for k, v in state.offsets.items()} == {("t", 0): 5}
        caplog.clear()


def test_a_snapshot_replaces_what_came_before_and_is_due_every_so_many_entries():
    commits = [group_offsets.commit_fields([("t", i % 3, i, 0, "")], i) for i in range(12)]
    state = _replay(commits)
    assert state.compaction_due(10) and not state.compaction_due(12)
    snapshot = group_offsets.snapshot_fields(state.offsets)
    after = _replay([snapshot, group_offsets.commit_fields([("t", 0, 100, 0, "")], 99)])
    assert {k: v.offset for k, v in after.offsets.items()} == {("t", 0): 100, ("t", 1): 10, ("t", 2): 11}
    assert after.snapshot_id == StreamId(1, 0) and after.since_snapshot == 1
    whole = _replay(commits + [snapshot])  # the stream trimmed up to a snapshot replays the same
    assert whole.offsets == state.offsets and not whole.compaction_due(0)


def test_the_journal_of_older_versions_is_read_once_for_an_upgrade(tmp_path):
    lines = [{"g": "g", "t": "t", "p": 0, "o": 5, "e": 0, "m": "m", "ts": 1},
             {"g": "g", "t": "t", "p": 1, "o": 7},
             {"g": "g", "t": "t", "p": 1, "o": None},
             {"g": "h", "t": "t", "p": 0, "o": 1},
             {"g": "h", "del": True}]
    data = b"".join(json.dumps(r).encode() + b"\n" for r in lines) + b'{"g": "g", "t": "t", "p"'  # torn
    (tmp_path / group_offsets.FILE_NAME).write_bytes(data)
    assert group_offsets.read_journal(tmp_path) == {"g": {("t", 0): group_offsets.Committed(5, 0, "m", 1)}}
    assert group_offsets.read_journal(tmp_path / "none") == {}


def test_a_journal_line_nested_too_deep_for_the_parser_is_skipped_as_torn(tmp_path, caplog):
    """Nested deeper than the parser goes (json raises RecursionError): the
    line is skipped with a warning like a torn one; the others are read."""
    good = json.dumps({"g": "g", "t": "t", "p": 0, "o": 5}).encode()
    (tmp_path / group_offsets.FILE_NAME).write_bytes(b"[" * 100000 + b"\n" + good + b"\n")
    with caplog.at_level("WARNING", logger="partita.storage"):
        assert group_offsets.read_journal(tmp_path) == {"g": {("t", 0): group_offsets.Committed(5, -1, "", 0)}}
    assert "skipping an unreadable line" in caplog.text


async def test_a_group_with_no_members_left_is_forgotten(nursery, autojump_clock):
    c = await start(nursery)
    r = await join(c, group="once")
    c.leave("once", [(r.member_id, None)])
    await trio.sleep(0.1)  # the timer task runs
    assert c.group_ids() == []
    assert c.heartbeat("once", 1, r.member_id, None) == E.UNKNOWN_MEMBER_ID
