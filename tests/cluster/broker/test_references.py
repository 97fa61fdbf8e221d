"""The broker's reference-minding deletions (``cluster.broker.references``):
XDELEX, XACKDEL and a trim's reference policy on a real topic registry,
checked by what the session returns, what the streams and the groups hold
after, and what the reply's receipt waits for: the deletion markers noted
before the group journal, and on acks=all topics the group journal."""

from __future__ import annotations

import pytest

from cluster.broker import Trim, XAddPlan
from cluster.broker.references import ACKED, DELETED, DELREF, KEEPREF, NOT_FOUND, REFERENCED
from storage.streams.groups import groups_of
from storage.streams.ids import StreamId

MAX = (2**64 - 1, 2**64 - 1)


class RecordingDurability:
    def __init__(self) -> None:
        self.noted: list = []

    def note_write(self, log, policy: str) -> int:
        self.noted.append(log)
        return len(self.noted)


class RecordingReplication:
    """``note_group_write`` and ``note_state_write`` of an acks=all topic:
    the reply waits for the group store and for the stream's state."""

    def __init__(self) -> None:
        self.stores: list = []

    def note_group_write(self, session, store) -> None:
        self.stores.append(store)
        if session.repl_pending is None:
            session.repl_pending = {}
        session.repl_pending[("groups", store)] = store

    def note_state_write(self, session, stream) -> None:
        if session.repl_pending is None:
            session.repl_pending = {}
        session.repl_pending[("state", stream)] = stream


@pytest.fixture
def broker(make_broker):
    b = make_broker(fsync="always")
    b.durability = RecordingDurability()
    return b


def _stream(session, key: bytes = b"s", n: int = 5) -> None:
    for ms in range(1, n + 1):
        session.append(XAddPlan(key, [b"f", b"v"], ms, 0))


def _read(session, key: bytes, group: bytes, count: int = 0) -> None:
    from cluster.broker.groups import GroupRead

    session.read_group_nowait(GroupRead(group, b"c", [key], [None], count=count))


def _ids(session, key: bytes = b"s") -> list[tuple]:
    stream = session.broker.topics.get(key)
    res = stream.log.read(stream.log.log_start_offset, with_ids=True)
    return [(ms, seq) for _, ms, seq in res.entries]


def _pending(session, group: bytes, key: bytes = b"s") -> list[tuple]:
    return [sid for sid, *_ in session.pending(key, group, (0, 0), MAX, 100)]


def test_delete_each_by_policy(broker):
    session = broker.session()
    _stream(session)
    session.group_create(b"s", b"g1", (0, 0))
    session.group_create(b"s", b"g2", (0, 0))
    _read(session, b"s", b"g1")
    _read(session, b"s", b"g2", count=2)
    ids = [StreamId(ms, 0) for ms in (1, 3, 5, 9)]
    assert session.delete_each(b"s", ids, ACKED) == [REFERENCED, REFERENCED, REFERENCED, NOT_FOUND]
    assert session.ack(b"s", b"g1", [(3, 0)]) == 1
    assert session.delete_each(b"s", [StreamId(3, 0)], ACKED) == [REFERENCED]  # g2 can still deliver it
    session.take_receipt()
    broker.durability.noted.clear()
    assert session.delete_each(b"s", [StreamId(1, 0), StreamId(4, 0)], DELREF) == [DELETED, DELETED]
    store = groups_of(broker.topics.get(b"s"))
    assert broker.durability.noted == [broker.topics.get(b"s").log, store]  # markers, then the group journal
    assert _pending(session, b"g1") == [(2, 0), (5, 0)]
    assert _pending(session, b"g2") == [(2, 0)]
    assert session.delete_each(b"s", [StreamId(5, 0)], KEEPREF) == [DELETED]
    assert _pending(session, b"g1") == [(2, 0), (5, 0)]  # KEEPREF: the reference stays
    assert _ids(session) == [(2, 0), (3, 0)]


def test_ack_delete_acknowledges_then_deletes_by_policy(broker):
    session = broker.session()
    _stream(session, n=3)
    session.group_create(b"s", b"g1", (0, 0))
    session.group_create(b"s", b"g2", (0, 0))
    _read(session, b"s", b"g1")
    _read(session, b"s", b"g2")
    session.take_receipt()
    broker.replication = RecordingReplication()  # from here on, as on an acks=all topic's leader
    assert session.ack_delete(b"s", b"g1", [(1, 0), (1, 0), (9, 0)], ACKED) == [REFERENCED, NOT_FOUND, NOT_FOUND]
    receipt = session.take_receipt()
    assert receipt.repl_pending  # acks=all: the ack waits for the in-sync replicas
    assert session.ack_delete(b"s", b"g2", [(1, 0)], ACKED) == [DELETED]
    assert ("state", broker.topics.get(b"s")) in session.take_receipt().repl_pending  # the deletion, replicated
    assert session.ack_delete(b"s", b"g1", [(2, 0)], DELREF) == [DELETED]
    assert _pending(session, b"g2") == [(3, 0)]
    assert session.ack_delete(b"s", b"nope", [(3, 0)]) == [NOT_FOUND]
    assert session.ack_delete(b"missing", b"g1", [(3, 0)]) == [NOT_FOUND]
    assert session.ack_delete(b"s", b"g1", [(3, 0)], KEEPREF) == [DELETED]
    assert _ids(session) == [] and _pending(session, b"g2") == [(3, 0)]
    assert session.ack_delete(b"s", b"g2", [(3, 0)], ACKED) == [DELETED]  # gone already: acknowledged, 1


@pytest.mark.parametrize("strategy", ["MAXLEN", "MINID"])
def test_an_acked_trim_removes_what_no_group_needs_around_what_it_keeps(broker, strategy):
    session = broker.session()
    _stream(session, n=8)
    session.group_create(b"s", b"g", (0, 0))
    _read(session, b"s", b"g", count=6)  # 7-0, 8-0: never delivered, needed
    assert session.ack(b"s", b"g", [(1, 0), (2, 0), (4, 0), (6, 0)]) == 4
    trim = Trim("MAXLEN", maxlen=3, policy=ACKED) if strategy == "MAXLEN" else \
        Trim("MINID", minid=(6, 0), policy=ACKED)
    removed = session.trim(b"s", trim)
    if strategy == "MAXLEN":  # 5 to remove, 4 deletable: 1, 2 (the log start moves), 4 and 6 (markers)
        assert (removed, _ids(session)) == (4, [(3, 0), (5, 0), (7, 0), (8, 0)])
    else:  # below 6-0: 1, 2, 4
        assert (removed, _ids(session)) == (3, [(3, 0), (5, 0), (6, 0), (7, 0), (8, 0)])
    stream = broker.topics.get(b"s")
    assert tuple(stream.max_deleted_entry_id) == (0, 0)  # a trim's markers leave it alone
    assert _pending(session, b"g") == [(3, 0), (5, 0)]


def test_a_delref_trim_drops_the_references_of_what_it_removed_only(broker):
    session = broker.session()
    _stream(session, n=5)
    session.group_create(b"s", b"g", (0, 0))
    _read(session, b"s", b"g")
    assert session.delete(b"s", [StreamId(1, 0)]) == 1  # a dangling reference before the trim
    assert session.trim(b"s", Trim("MAXLEN", maxlen=2, policy=DELREF)) == 2
    assert _pending(session, b"g") == [(1, 0), (4, 0), (5, 0)]  # 2, 3 removed by the trim; 1 was not
    session.append(XAddPlan(b"s", [b"f", b"v"], 6, 0, trim=Trim("MAXLEN", maxlen=1, policy=DELREF)))
    assert _ids(session) == [(6, 0)]
    assert _pending(session, b"g") == [(1, 0)]


def test_an_approximate_acked_trim_deletes_entry_by_entry_past_a_needed_entry(broker):
    """Redis 8.6's ``streamTrim``: ``~`` with ACKED does not stop at the node
    holding the first needed entry; it deletes that node's deletable entries."""
    session = broker.session()
    _stream(session, n=4)
    session.group_create(b"s", b"g", (0, 0))
    _read(session, b"s", b"g", count=1)
    assert session.trim(b"s", Trim("MAXLEN", approx=True, maxlen=0, policy=ACKED)) == 0
    assert session.ack(b"s", b"g", [(1, 0)]) == 1
    assert session.trim(b"s", Trim("MINID", approx=True, minid=MAX, policy=ACKED)) == 1  # 2-0 on: undelivered
    session.group_set_id(b"s", b"g", None, None)
    assert session.trim(b"s", Trim("MAXLEN", approx=True, maxlen=0, policy=ACKED)) == 3


def test_a_topic_key_needs_a_partition_key(broker):
    from cluster.topics import NEEDS_PARTITION_KEY, TopicError

    session = broker.session()
    broker.topics.create_topic(b"t", 2)
    for call in (lambda: session.delete_each(b"t", [StreamId(1, 0)], DELREF),
                 lambda: session.ack_delete(b"t", b"g", [(1, 0)], ACKED)):
        with pytest.raises(TopicError) as refused:
            call()
        assert refused.value.code == NEEDS_PARTITION_KEY
