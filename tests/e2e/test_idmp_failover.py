"""XADD IDMP across a leader failover (three real nodes, tests/clusterkit.py):
the producer records travel in the log batches, so the new leader drops an
acks=all XADD's retry and answers the original ID; XCFGSET's settings and
forgetting reach it too (stream metadata)."""

from __future__ import annotations

import pytest

from tests.clusterkit import eventually, leased, running


@pytest.fixture
def cluster(tmp_path):
    yield from running(tmp_path, extra=["--controller-session-timeout-ms", "1500",
                                        "--leader-rebalance-delay-ms", "-1"])


def test_a_retry_after_a_failover_is_dropped_by_the_new_leader(cluster):
    key = b"payments"
    old = cluster.leader_of(key)
    client = old.client()
    leased(lambda: client.xadd(key, {"f": "warm-up"}, idmp=("svc", b"warm-up")))
    client.xcfgset(key, idmp_duration=200, idmp_maxsize=3)  # forgets warm-up, everywhere
    acked = {f"order-{i}".encode(): client.xadd(key, {"n": i}, idmp=("svc", f"order-{i}".encode()))
             for i in range(5)}
    auto = client.xadd(key, {"a": "1", "b": "2"}, idmpauto="svc-auto")
    cluster.wait_converged(key.decode())
    old.kill9()
    new = eventually(lambda: (lambda n: n if n is not old else None)(cluster.leader_of(key)),
                     what="a new leader")
    fresh = new.client()
    # The retries of the acknowledged appends the window still holds (the last 3).
    for iid in (b"order-2", b"order-3", b"order-4"):
        assert eventually(lambda: leased(lambda: fresh.xadd(key, {"n": "retry"}, idmp=("svc", iid))),
                          what="an answer from the new leader") == acked[iid]
    assert fresh.xadd(key, {"b": "2", "a": "1"}, idmpauto="svc-auto") == auto
    assert fresh.xlen(key) == 7  # warm-up, order-0..4, the IDMPAUTO entry: no retry added one
    info = fresh.xinfo_stream(key)
    assert (info["idmp-duration"], info["idmp-maxsize"], info["pids-tracked"], info["iids-added"]) == (200, 3, 2, 7)
    # Evicted (order-0) and forgotten (warm-up) ids are new appends, as on the old leader.
    assert fresh.xadd(key, {"n": "again"}, idmp=("svc", b"order-0")) != acked[b"order-0"]
    assert fresh.xadd(key, {"f": "again"}, idmp=("svc", b"warm-up")) not in acked.values()
    assert fresh.xlen(key) == 9
