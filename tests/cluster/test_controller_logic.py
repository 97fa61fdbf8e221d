"""The controller's metadata state machine and decisions (cluster/controller/metadata.py),
step by step with a hand-driven clock: what it proposes is applied as Raft
would after commit, and the result checked against Kafka's rules."""

import json

from cluster.controller.metadata import ControllerLogic, Metadata, MetadataError
from cluster.nodes import Node, parse_address

import pytest
from hypothesis import given, settings, strategies as st

# 3 nodes, 3 shards, replication factor 3: shard i prefers node i+1.
REPLICAS = [[1, 2, 3], [2, 3, 1], [3, 1, 2]]


def fresh() -> Metadata:
    meta = Metadata()
    assert meta.apply(Metadata.init_record([(r, r[0], 1) for r in REPLICAS], [1, 2, 3])) == [("init", 0)]
    return meta


def run(logic: ControllerLogic, now_ms: int) -> list[tuple[int, int]]:
    """One controller tick: apply what it proposes (as if committed at once)."""
    records, moves = logic.decide(now_ms)
    for record in records:
        logic.meta.apply(record)
    return moves


def beat_all(logic: ControllerLogic, now_ms: int, nodes=(1, 2, 3), inc="a") -> None:
    for n in nodes:
        logic.beat(n, f"{inc}{n}", now_ms)


def controller(meta=None, **kw) -> ControllerLogic:
    logic = ControllerLogic(meta or fresh(), session_timeout_ms=3000, rebalance_delay_ms=5000, **kw)
    logic.became_leader(0)
    return logic


def test_init_applies_once_and_shard_records_are_conditional():
    meta = fresh()
    assert meta.apply(Metadata.init_record([([9], 9, 7)], [9])) == []  # already initialised
    s0 = meta.shards[0]
    assert (s0.leader, s0.epoch, s0.isr, s0.version) == (1, 1, [1, 2, 3], 0)
    # An ISR shrink decided on version 0 applies; a second one decided on 0 does not.
    assert meta.apply(Metadata.shard_record(0, 0, 1, 1, {1, 2})) == [("shard", 0)]
    assert meta.apply(Metadata.shard_record(0, 0, 1, 1, {1, 3})) == []
    assert (meta.shards[0].isr, meta.shards[0].version) == ([1, 2], 1)
    # A leader change needs a higher epoch and a leader in the new ISR, among the replicas.
    assert meta.apply(Metadata.shard_record(0, 1, 2, 1, {1, 2})) == []
    assert meta.apply(Metadata.shard_record(0, 1, 3, 2, {1, 2})) == []
    assert meta.apply(Metadata.shard_record(0, 1, 4, 2, {1, 2, 4})) == []
    assert meta.apply(Metadata.shard_record(0, 1, 2, 2, {2})) == [("shard", 0)]
    assert (meta.shards[0].leader, meta.shards[0].epoch) == (2, 2)
    # Garbage and the Raft no-op change nothing.
    assert meta.apply(b"") == [] and meta.apply(b"{not json") == [] and meta.apply(b'{"t":"shard"}') == []


def test_no_record_moves_an_epoch_by_more_than_one_or_without_the_leader():
    """Issue 28: whoever proposes it (a forged CTRLPROPOSE on the bus), a
    record cannot take a shard to an epoch the controller would not reach
    itself: +1 with a new leader, the same epoch with the same leader."""
    meta = fresh()
    assert meta.apply(Metadata.shard_record(0, 0, 2, 999999999, {1, 2, 3})) == []
    assert meta.apply(Metadata.shard_record(0, 0, 1, 2, {1, 2, 3})) == []  # same leader, new epoch
    assert meta.apply(Metadata.shard_record(0, 0, 2, 3, {1, 2, 3})) == []  # new leader, epoch + 2
    assert (meta.shards[0].leader, meta.shards[0].epoch, meta.shards[0].version) == (1, 1, 0)
    assert meta.apply(Metadata.shard_record(0, 0, 2, 2, {1, 2, 3})) == [("shard", 0)]
    assert (meta.shards[0].leader, meta.shards[0].epoch) == (2, 2)


def test_snapshot_round_trip():
    meta = fresh()
    meta.apply(Metadata.node_record(2, "x", True))
    meta.apply(Metadata.shard_record(1, 0, 3, 2, {3, 1}))
    back = Metadata.decode(meta.encode())
    assert back == meta
    with pytest.raises(MetadataError):
        Metadata.decode(b"{}")


def test_a_snapshot_with_a_field_of_the_wrong_type_does_not_decode():
    """As for records, a snapshot's fields are taken as they are made, not
    coerced: a node incarnation of 5, fenced of "yes" or a topic origin of
    "3" was not written by this module (MetadataError), where it used to
    become "5", True and 3."""
    meta = fresh()
    meta.apply(Metadata.node_record(2, "x", True))
    meta.apply(Metadata.join_record(4, "h", 7004, 17104))
    meta.apply(Metadata.topic_record(b"t", b"blob", "id1", 3))
    good = json.loads(meta.encode())
    assert Metadata.decode(json.dumps(good).encode()) == meta
    wrong = [("nodes", "2", ["x", "yes", ""]), ("nodes", "2", [5, True, ""]), ("nodes", "2", ["x", 1, ""]),
             ("nodes", "4", ["", False, 7004]), ("nodes", "2", ["x", True, "", "more"]), ("nodes", "2", "x"),
             ("topics", 0, ["t", "blob", "id1", "3"]), ("topics", 0, ["t", "blob", 1, 3]),
             ("topics", 0, [["t"], "blob", "id1", 3]), ("topics", 0, ["t", None, "id1", 3]),
             ("topics", 0, ["t", "blob", "id1"]), ("topics", 0, ["\u20ac", "blob", "id1", 3])]
    for part, key, value in wrong:
        snapshot = json.loads(meta.encode())
        snapshot[part][key] = value
        with pytest.raises(MetadataError):
            Metadata.decode(json.dumps(snapshot).encode())
    for key, value in (("initialized", 1), ("nodes", [["2", "x", True, ""]]), ("topics", {}),
                       ("nodes", {"02": ["x", True, ""]}), ("nodes", {"two": ["x", True, ""]})):
        snapshot = json.loads(meta.encode())
        snapshot[key] = value
        with pytest.raises(MetadataError):
            Metadata.decode(json.dumps(snapshot).encode())


def test_registration_then_fencing_elects_from_the_isr_in_preferred_order():
    logic = controller()
    beat_all(logic, 100)
    run(logic, 100)
    assert {n: m.incarnation for n, m in logic.meta.nodes.items()} == {1: "a1", 2: "a2", 3: "a3"}
    # Node 2 stops heartbeating; 1 and 3 go on.
    for t in range(200, 3200, 200):
        beat_all(logic, t, nodes=(1, 3))
        run(logic, t)
    assert not logic.meta.nodes[2].fenced  # not yet: within the session timeout
    beat_all(logic, 3300, nodes=(1, 3))
    run(logic, 3300)
    meta = logic.meta
    assert meta.nodes[2].fenced
    # Shard 1 (led by 2, replicas 2,3,1) goes to 3, the next in preference, epoch 2.
    assert (meta.shards[1].leader, meta.shards[1].epoch, meta.shards[1].isr) == (3, 2, [1, 3])
    # Node 2 leaves the other ISRs; those leaders and epochs stay.
    assert [(s.leader, s.epoch, s.isr) for s in (meta.shards[0], meta.shards[2])] == [(1, 1, [1, 3]), (3, 1, [1, 3])]


def test_a_new_controller_waits_a_whole_session_before_fencing():
    logic = controller()
    run(logic, 2900)
    assert not any(m.fenced for m in logic.meta.nodes.values())
    beat_all(logic, 2950, nodes=(1, 2))
    run(logic, 3100)
    assert [n for n, m in logic.meta.nodes.items() if m.fenced] == [3]


def test_no_live_isr_member_leaves_the_shard_leaderless_unless_unclean():
    for unclean in (False, True):
        meta = fresh()
        meta.apply(Metadata.shard_record(0, 0, 1, 1, {1}))  # only the leader in sync
        logic = controller(meta, unclean=lambda u=unclean: u)
        beat_all(logic, 3100, nodes=(2, 3))
        run(logic, 3100)
        s0 = logic.meta.shards[0]
        assert logic.meta.nodes[1].fenced
        if unclean:
            assert (s0.leader, s0.epoch, s0.isr) == (2, 2, [2])
        else:
            assert (s0.leader, s0.epoch, s0.isr) == (1, 1, [1])
            # The last ISR member returns: it leads again (the same epoch, it never stopped).
            beat_all(logic, 3200, nodes=(1, 2, 3))
            run(logic, 3200)
            assert not logic.meta.nodes[1].fenced and logic.meta.shards[0].leader == 1


def test_a_restarted_node_leaves_every_isr_but_stays_as_the_last_member():
    meta = fresh()
    meta.apply(Metadata.shard_record(2, 0, 3, 1, {3}))  # shard 2: only its leader 3 in sync
    logic = controller(meta)
    beat_all(logic, 100)
    run(logic, 100)
    # Node 3 restarts (new incarnation) within the session timeout; node 1 too.
    logic.beat(3, "b3", 200)
    run(logic, 200)
    meta = logic.meta
    assert meta.nodes[3].incarnation == "b3" and not meta.nodes[3].fenced
    assert meta.shards[0].isr == [1, 2]  # follower 3 must catch up again
    assert (meta.shards[1].leader, meta.shards[1].isr) == (2, [1, 2])
    assert (meta.shards[2].leader, meta.shards[2].epoch, meta.shards[2].isr) == (3, 1, [3])  # no better copy
    # A restarted leader with other live ISR members hands over to one of them.
    logic.beat(1, "b1", 300)
    run(logic, 300)
    assert (meta.shards[0].leader, meta.shards[0].epoch, meta.shards[0].isr) == (2, 2, [2])
    assert meta.shards[1].isr == [2]
    # Once its removals are done, a leader's ISR expansion is not undone.
    meta.apply(Metadata.shard_record(0, meta.shards[0].version, 2, 2, {1, 2, 3}))
    beat_all(logic, 400, nodes=(2,))
    logic.beat(1, "b1", 400)
    logic.beat(3, "b3", 400)
    run(logic, 400)
    assert meta.shards[0].isr == [1, 2, 3]


def test_a_leader_reporting_a_shard_offline_hands_it_to_a_live_isr_member_and_leaves_its_isr():
    logic = controller()
    beat_all(logic, 100)
    run(logic, 100)
    # Node 1 (leader of shard 0, follower of 1 and 2) reports a log of shard 0
    # and one of shard 1 offline after a failed fsync; it stays alive.
    logic.beat(1, "a1", 200, offline=[0, 1])
    beat_all(logic, 200, nodes=(2, 3))
    run(logic, 200)
    meta = logic.meta
    assert not meta.nodes[1].fenced
    # Shard 0 goes to 2 (next in preference) at the next epoch; 1 leaves its ISR.
    assert (meta.shards[0].leader, meta.shards[0].epoch, meta.shards[0].isr) == (2, 2, [2, 3])
    # Shard 1: 1 was a follower there: it leaves the ISR, the leader stays.
    assert (meta.shards[1].leader, meta.shards[1].epoch, meta.shards[1].isr) == (2, 1, [2, 3])
    # Shard 2, whose logs on 1 are fine, is untouched.
    assert (meta.shards[2].leader, meta.shards[2].epoch, meta.shards[2].isr) == (3, 1, [1, 2, 3])
    # Shard 0's preferred leader is not asked back while it reports it offline,
    # however long; once it restarted (new incarnation, nothing offline) it
    # rejoins the ISR by catching up, as any restarted node does.
    for t in range(300, 12000, 500):
        logic.beat(1, "a1", t, offline=[0, 1])
        beat_all(logic, t, nodes=(2, 3))
        assert run(logic, t) == []
    assert meta.shards[0].leader == 2 and 1 not in meta.shards[0].isr


def test_a_leader_reporting_a_shard_offline_keeps_it_when_no_other_isr_member_lives():
    meta = fresh()
    meta.apply(Metadata.shard_record(0, 0, 1, 1, {1}))  # only the leader in sync
    logic = controller(meta)
    beat_all(logic, 100)
    logic.beat(1, "a1", 100, offline=[0])
    run(logic, 100)
    # No better copy: it keeps the shard (reads go on; writes are refused there).
    assert (meta.shards[0].leader, meta.shards[0].epoch, meta.shards[0].isr) == (1, 1, [1])
    # A follower that caught up joins the ISR (the leader's proposal): now
    # there is one, and the shard moves to it.
    meta.apply(Metadata.shard_record(0, meta.shards[0].version, 1, 1, {1, 3}))
    beat_all(logic, 200, nodes=(2, 3))
    logic.beat(1, "a1", 200, offline=[0])
    run(logic, 200)
    assert (meta.shards[0].leader, meta.shards[0].epoch, meta.shards[0].isr) == (3, 2, [3])


def test_the_preferred_leader_is_asked_back_after_the_delay():
    meta = fresh()
    meta.apply(Metadata.shard_record(0, 0, 2, 2, {1, 2, 3}))  # shard 0 (prefers 1) led by 2
    logic = controller(meta)
    beat_all(logic, 100)
    assert run(logic, 100) == []
    beat_all(logic, 5000)
    assert run(logic, 5000) == []
    beat_all(logic, 5200)
    assert run(logic, 5200) == [(0, 1)]
    beat_all(logic, 5300)
    assert run(logic, 5300) == []  # asked once per retry period
    # Not while the preferred leader is out of the ISR.
    meta.apply(Metadata.shard_record(0, 1, 2, 2, {2, 3}))
    beat_all(logic, 20000)
    assert run(logic, 20000) == []


def test_a_takeover_makes_the_new_leader_the_preferred_replica_so_no_move_undoes_it():
    meta = fresh()
    assert meta.apply(meta.takeover_record(0, 2)) == [("shard", 0)]  # CLUSTER FAILOVER on node 2
    shard = meta.shards[0]
    assert (shard.leader, shard.epoch, shard.replicas, shard.isr) == (2, 2, [2, 1, 3], [1, 2, 3])
    logic = controller(meta)
    for t in (100, 5200, 20000):  # node 1 back in the ISR, far past the delay: no move
        beat_all(logic, t)
        assert run(logic, t) == []
    # The preferred leader taking its shard back changes no order.
    meta.apply(Metadata.shard_record(1, 0, 3, 2, {1, 2, 3}))
    assert meta.apply(meta.takeover_record(1, 2)) == [("shard", 1)]
    assert (meta.shards[1].leader, meta.shards[1].epoch, meta.shards[1].replicas) == (2, 3, [2, 3, 1])


def test_no_preferred_leader_move_when_the_delay_is_minus_one():
    meta = fresh()
    meta.apply(Metadata.shard_record(0, 0, 2, 2, {1, 2, 3}))
    logic = ControllerLogic(meta, session_timeout_ms=3000, rebalance_delay_ms=-1)
    logic.became_leader(0)
    for t in (100, 10000, 60000):
        beat_all(logic, t)
        assert run(logic, t) == []


def test_a_reassignment_waits_for_the_new_replicas_then_moves_leadership_then_shrinks():
    logic = controller()
    meta = logic.meta
    beat_all(logic, 100)
    run(logic, 100)
    # Shard 0 (replicas 1,2,3 led by 1) moves to 3,2: node 3 preferred.
    assert meta.apply(meta.reassign_record(0, [3, 2])) == [("shard", 0)]
    s0 = meta.shards[0]
    assert (s0.replicas, s0.target, s0.leader) == ([3, 2, 1], [3, 2], 1)
    # Not in sync yet (the leader proposes the new ISR once they catch up).
    meta.apply(Metadata.shard_record(0, s0.version, 1, 1, {1, 2}))
    beat_all(logic, 200)
    assert run(logic, 200) == []
    assert meta.shards[0].target == [3, 2]
    meta.apply(Metadata.shard_record(0, meta.shards[0].version, 1, 1, {1, 2, 3}))
    beat_all(logic, 300)
    assert run(logic, 300) == [(0, 3)]  # leadership first, the coordinated way
    assert meta.shards[0].replicas == [3, 2, 1]
    meta.apply(Metadata.shard_record(0, meta.shards[0].version, 3, 2, {1, 2, 3}))  # node 3 took it
    beat_all(logic, 400)
    run(logic, 400)
    s0 = meta.shards[0]
    assert (s0.replicas, s0.target, s0.leader, s0.epoch, s0.isr) == ([3, 2], None, 3, 2, [2, 3])
    # A record naming a node that does not exist, or an ISR outside the replicas, does not apply.
    assert meta.apply(Metadata.shard_record(0, s0.version, 3, 2, {2, 3}, replicas=[3, 9])) == []
    assert meta.apply(Metadata.shard_record(0, s0.version, 3, 2, {1, 3}, replicas=[3, 2])) == []


def test_a_joining_node_is_recorded_once_with_its_address_and_then_heartbeats_like_the_others():
    assert Metadata().apply(Metadata.join_record(4, "h", 7004, 17104)) == []  # not before the first record
    logic = controller()
    meta = logic.meta
    assert meta.apply(Metadata.join_record(4, "h", 7004, 17104)) == [("join", 4)]
    assert meta.apply(Metadata.join_record(4, "other", 1, 2)) == []
    assert meta.apply(Metadata.join_record(2, "h", 7002, 17002)) == []  # one of the first nodes
    assert meta.nodes[4].address == "h:7004@17104"
    assert Metadata.decode(meta.encode()).nodes[4].address == "h:7004@17104"
    beat_all(logic, 100, nodes=(1, 2, 3, 4))
    run(logic, 100)
    assert meta.nodes[4].incarnation == "a4" and meta.nodes[4].address == "h:7004@17104"
    beat_all(logic, 3200, nodes=(1, 2, 3))
    run(logic, 3200)
    assert meta.nodes[4].fenced and not meta.nodes[1].fenced


def test_a_node_whose_port_refuses_the_controller_is_fenced_at_once():
    """A refused connection means nothing listens on the node's port (its
    process is gone): fenced without waiting for the session timeout, unless
    it was heard from after the refusal (it restarted)."""
    logic = controller()
    beat_all(logic, 100)
    run(logic, 100)
    logic.connect_refused(2, 150)
    beat_all(logic, 200)  # heard after the refusal: it runs (again)
    run(logic, 200)
    assert not logic.meta.nodes[2].fenced
    logic.connect_refused(2, 300)
    beat_all(logic, 300, nodes=(1, 3))
    run(logic, 300)
    meta = logic.meta
    assert meta.nodes[2].fenced  # 200 ms after its last beat, not 3000
    assert (meta.shards[1].leader, meta.shards[1].epoch, meta.shards[1].isr) == (3, 2, [1, 3])
    # Restarted, it registers its new incarnation as after any fencing.
    beat_all(logic, 900, inc="b")
    run(logic, 900)
    assert not meta.nodes[2].fenced and meta.nodes[2].incarnation == "b2"


def test_a_refusal_counts_only_for_a_registered_node_and_on_the_controller_that_saw_it():
    logic = controller()
    logic.connect_refused(3, 50)  # a cluster's first start: node 3 not up yet
    beat_all(logic, 100, nodes=(1, 2))
    run(logic, 100)
    assert not logic.meta.nodes[3].fenced
    beat_all(logic, 200)
    run(logic, 200)
    logic.stepped_down()
    logic.connect_refused(3, 300)  # seen while not the controller: not its observation
    logic.became_leader(400)
    beat_all(logic, 500, nodes=(1, 2))
    run(logic, 500)
    assert not logic.meta.nodes[3].fenced
    logic.connect_refused(3, 600)
    run(logic, 600)
    assert logic.meta.nodes[3].fenced


# -- applying a record is all or nothing --------------------------------------------------

def test_an_init_record_that_does_not_decode_whole_changes_nothing():
    """A first record whose shards decode but whose node list does not is
    turned down whole: it used to install the shards and then fail on the
    nodes, leaving shards on a node that is not initialised (and in its
    next snapshot)."""
    shards = [(r, r[0], 1) for r in REPLICAS]
    for nodes in (["x"], [1, None], None, [1, [2]]):
        meta = Metadata()
        assert meta.apply(Metadata.init_record(shards, nodes)) == []
        assert meta.encode() == Metadata().encode()
    assert fresh().encode() != Metadata().encode()  # the same record, whole, applies whole


def test_a_record_with_a_field_of_the_wrong_type_changes_nothing():
    """Fields are taken as they are made, not coerced: ``"fenced": "false"``
    is not ``False`` and ``"leader": "2"`` is not node 2 (any such record
    was not made by this module: it is turned down, on every node alike)."""
    meta = fresh()
    before = meta.encode()
    for record in (b'{"t":"node","node":2,"inc":"b2","fenced":"false"}',
                   b'{"t":"node","node":2.0,"inc":"b2","fenced":false}',
                   b'{"t":"shard","s":0,"expect":0,"leader":"2","epoch":2,"isr":[1,2,3]}',
                   b'{"t":"shard","s":0,"expect":0,"leader":2,"epoch":2,"isr":[1,2,true]}',
                   b'{"t":"topic","name":"t","blob":"b","id":"i","origin":1,"nonce":["n"]}',
                   b'{"t":"topic","name":"\\u20ac","blob":"b","id":"i","origin":1,"nonce":"n"}'):
        assert meta.apply(record) == [], record
        assert meta.encode() == before, record


def test_a_record_or_snapshot_nested_too_deep_for_the_parser_is_a_metadata_error():
    """JSON nested deeper than the parser goes (json raises RecursionError,
    not ValueError) is a record or snapshot that does not decode like any
    other garbage: a MetadataError, not an unexpected exception (which
    ``apply`` propagates as a bug, stopping the node)."""
    meta = fresh()
    before = meta.encode()
    for blob in (b"[" * 100000, b'{"t":"node","node":2,"inc":' + b"[" * 100000):
        assert meta.apply(blob) == [] and meta.encode() == before
        with pytest.raises(MetadataError):
            Metadata.check_record(blob)
        with pytest.raises(MetadataError):
            Metadata.decode(blob)


def test_a_join_whose_address_does_not_read_back_is_refused_and_not_applied():
    """Every node reads a joined node's address back with ``parse_address``
    when it applies the record (``_sync_members``): a host that breaks that
    (an ``@`` in it) would make every node fail on the committed record and
    stop. ``join_record`` refuses it before it is proposed, and a record that
    has one anyway is turned down."""
    with pytest.raises(ValueError):
        Metadata.join_record(4, "h@x", 7004, 17104)
    meta = fresh()
    before = meta.encode()
    record = b'{"t":"join","node":4,"host":"h@x","port":7004,"bus":17104}'
    assert meta.apply(record) == [] and meta.encode() == before
    assert meta.apply(Metadata.join_record(4, "::1", 7004, 17104)) == [("join", 4)]
    assert parse_address(4, meta.nodes[4].address) == Node(4, "::1", 7004, 17104)


# Arbitrary JSON values to put in a record's fields.
_SCALARS = st.none() | st.booleans() | st.integers(-2, 5) | st.floats(0, 3) | st.text("ab1@\u20ac", max_size=3)
_JSON = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text("ab", max_size=2), inner, max_size=2), max_leaves=5)


def _states() -> list[Metadata]:
    registered = fresh()
    for n in (1, 2, 3):
        assert registered.apply(Metadata.node_record(n, f"a{n}", False))
    registered.apply(Metadata.topic_record(b"t", b"blob", "id1", 1))
    registered.apply(Metadata.join_record(4, "h", 7004, 17104))
    registered.apply(registered.reassign_record(1, [4, 3]))
    return [Metadata(), fresh(), registered]


def _records(meta: Metadata) -> list[bytes]:
    records = [Metadata.init_record([(r, r[0], 1) for r in REPLICAS], [1, 2, 3]),
               Metadata.join_record(5, "h", 7005, 17105),
               Metadata.node_record(2, "b2", False),  # a restart, where node 2 was registered
               Metadata.node_record(3, "a3", True),
               Metadata.topic_record(b"t", b"new", "id1", 2),
               Metadata.topic_record(b"t", None, "id1", 2),
               Metadata.topic_record(b"u", b"blob", "id2", 3)]
    if meta.initialized:
        records += [Metadata.shard_record(0, 0, 2, 2, {1, 2, 3}), meta.takeover_record(2, 1),
                    meta.reassign_record(0, [3, 2]),
                    Metadata.shard_record(1, meta.shards[1].version, 2, 1, {2, 3}, replicas=[4, 3], target=None)]
    return records


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_a_record_applies_whole_or_not_at_all_and_alike_on_every_node(data):
    """Any record, made here or one of its fields replaced by any JSON value
    or removed, on any state: ``apply`` does not raise; a record it turns
    down leaves the state exactly as it was (its snapshot encoding); and a
    node that restored the state from a snapshot does exactly the same."""
    meta = data.draw(st.sampled_from(_states()))
    rec = json.loads(data.draw(st.sampled_from(_records(meta))))
    key = data.draw(st.none() | st.sampled_from(sorted(rec)))
    if key is not None:
        value = data.draw(st.none() | _JSON)
        if data.draw(st.booleans()):
            rec.pop(key)
        else:
            rec[key] = value
    record = json.dumps(rec).encode()
    before = meta.encode()
    twin = Metadata.decode(before)
    changes = meta.apply(record)
    if not changes:
        assert meta.encode() == before
    assert twin.apply(record) == changes
    assert twin.encode() == meta.encode()
