"""``Session`` is assembled from the broker's operation classes (GroupOps,
ReadOps, ...), which share one namespace: a helper named like another
part's would silently replace it for every caller (an XGROUP CREATE
answered OK once through a clash of ``_then``). No two parts may define
the same name."""

from __future__ import annotations

from cluster.broker.session import Session


def test_no_two_parts_of_a_session_define_the_same_name():
    owners: dict[str, list[str]] = {}
    for part in Session.__mro__:
        if part is object:
            continue
        for name in vars(part):
            if not (name.startswith("__") and name.endswith("__")):
                owners.setdefault(name, []).append(part.__name__)
    clashes = {name: parts for name, parts in owners.items() if len(parts) > 1}
    assert clashes == {}
