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
