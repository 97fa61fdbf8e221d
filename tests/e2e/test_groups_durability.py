"""Group state survives kill -9: with fsync always, a consumer loop killed in
the middle restarts with exactly the pending entries it had not acknowledged."""

from __future__ import annotations

import random

import pytest


def _pending_ids(r, key, group):
    return [p["message_id"] for p in r.xpending_range(key, group, "-", "+", 100000)]


def test_kill9_in_a_consumer_loop_keeps_acked_and_pending(partita_factory):
    server = partita_factory(["--fsync", "always"])
    r = server.client()
    ids = [r.xadd("orders", {"n": str(i)}) for i in range(300)]
    r.xgroup_create("orders", "billing", id="0")
    rng = random.Random(7)
    acked: set[bytes] = set()
    delivered: list[bytes] = []
    for _round in range(25):
        reply = r.xreadgroup("billing", rng.choice(["a", "b", "c"]), {"orders": ">"}, count=rng.randint(1, 12))
        batch = [entry_id for entry_id, _ in reply[0][1]] if reply else []
        delivered.extend(batch)
        to_ack = [i for i in batch if rng.random() < 0.7]
        if to_ack:
            assert r.xack("orders", "billing", *to_ack) == len(to_ack)
            acked.update(to_ack)
    r.xgroup_createconsumer("orders", "billing", "idle-one")
    before_groups = r.xinfo_groups("orders")
    before_consumers = {c["name"]: c["pending"] for c in r.xinfo_consumers("orders", "billing")}
    server.kill9()
    server.start()
    r = server.client()
    expected_pending = [i for i in delivered if i not in acked]
    assert _pending_ids(r, "orders", "billing") == expected_pending
    after = r.xinfo_groups("orders")
    assert after == before_groups
    assert {c["name"]: c["pending"] for c in r.xinfo_consumers("orders", "billing")} == before_consumers
    # The loop carries on where it stopped.
    reply = r.xreadgroup("billing", "a", {"orders": ">"}, count=1)
    assert reply[0][1][0][0] == ids[len(delivered)]
    assert "truncated" not in server.log() or "groups" not in server.log()


@pytest.mark.parametrize("policy", ["always", "everysec"])
def test_a_key_deleted_before_its_group_writes_are_flushed(partita_factory, policy):
    """XGROUP CREATE, XREADGROUP, then DEL of the key in one pipeline: the
    group journal's writes are still to be flushed when the key and its
    files are gone. The flush that comes (the batch's group commit under
    always, the one at shutdown under everysec) has nothing left to sync
    for it: every reply arrives, nothing fails, SIGTERM exits 0."""
    server = partita_factory(["--fsync", policy])
    r = server.client()
    pipe = r.pipeline(transaction=False)
    for n in range(3):
        pipe.xadd(f"gone{n}", {"f": "v"}, id="1-1")
        pipe.xgroup_create(f"gone{n}", "g", id="0")
        pipe.xreadgroup("g", "c", {f"gone{n}": ">"})
        pipe.delete(f"gone{n}")
    pipe.xadd("kept", {"f": "v"}, id="1-1")
    replies = pipe.execute()
    assert replies[-2] == 1 and replies[-1] == b"1-1", replies
    assert r.info("persistence")["aof_last_write_status"] == "ok"
    assert server.terminate() == 0
    log = server.log()
    assert "fsync failed" not in log and "Traceback" not in log, log[-2000:]
