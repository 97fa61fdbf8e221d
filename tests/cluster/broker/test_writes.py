"""The broker's stream writes (cluster/broker/session.py) on a real topic
registry: what each returns, and the receipt its reply waits for."""

from __future__ import annotations

from cluster.broker import XAddPlan
from cluster.broker.references import DELETED, NOT_FOUND
from storage.streams import StreamId


class RecordingDurability:
    """Durability's ``note_write`` contract: every write under ``always``
    gets the next group-commit sequence."""

    def __init__(self) -> None:
        self.noted: list = []

    def note_write(self, log, policy: str) -> int:
        self.noted.append(log)
        return len(self.noted) if policy == "always" else 0


def test_delete_each_says_which_ids_it_deleted_in_their_order(make_broker):
    broker = make_broker(fsync="always")
    broker.durability = RecordingDurability()
    session = broker.session()
    for ms in (1, 2, 3):
        session.append(XAddPlan(b"s", [b"f", b"v"], ms, 0))
    session.take_receipt()
    ids = [StreamId(2, 0), StreamId(9, 9), StreamId(2, 0), StreamId(1, 0)]
    assert session.delete_each(b"s", ids) == [DELETED, NOT_FOUND, NOT_FOUND, DELETED]
    assert session.take_receipt().flush_seq  # the deletion markers' write is waited for
    assert session.delete_each(b"s", [StreamId(2, 0)]) == [NOT_FOUND]
    assert session.take_receipt() is None  # nothing deleted, nothing written
    assert session.delete_each(b"missing", [StreamId(1, 0)]) == [NOT_FOUND]
    assert session.length(b"s") == 1


def test_the_log_writes_of_deferred_appends_are_timed_only_while_the_latency_monitor_is_on(make_broker):
    """Each stream's commit of deferred appends is one ``aof-write`` sample
    for the front-end's latency monitor (``Broker.latency``); None: untimed."""
    broker = make_broker()
    writer, reader = broker.session(1), broker.session(2)
    writer.may_defer = True
    samples = []
    broker.latency = lambda event, ms: samples.append((event, ms))
    for key in (b"a", b"b", b"a"):
        writer.append(XAddPlan(key, [b"f", b"v"]))
        assert writer.deferred is not None
    reader.length(b"a")  # (a read commits every deferred append first)
    assert sorted(event for event, _ in samples) == ["aof-write", "aof-write"]  # one per stream
    assert all(isinstance(ms, int) and ms >= 0 for _, ms in samples)
    broker.latency = None
    writer.append(XAddPlan(b"a", [b"f", b"v"]))
    reader.length(b"a")
    assert len(samples) == 2
