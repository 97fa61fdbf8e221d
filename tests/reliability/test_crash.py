"""kill -9 at random moments under load, restart on the same data dir, and
check every invariant of ``crashkit.verify`` after each restart.

CI: a handful of kills in ~40 s. Soak: ``pytest -m soak tests/reliability``
(or ``PARTITA_SOAK_SECONDS=600``) keeps killing for as long as asked. The
totals (kills survived, entries checked) are printed: run with ``-s`` to see
them, and they are in the session summary line written by ``conftest.py``.
"""

from __future__ import annotations

import os
import random
import time

import pytest

from tests.conftest import PartitaProcess
from tests.reliability import crashkit

CI_SECONDS = 35.0
RESULTS: list[str] = []


def _crash_loop(tmp_path, seconds: float, seed: int) -> crashkit.Ledger:
    rng = random.Random(seed)
    server = PartitaProcess(tmp_path / "data", ["--fsync", "always"]).start()
    try:
        ledger = crashkit.setup(server.port)
        deadline = time.monotonic() + seconds
        corrupt: list[str] = []
        while time.monotonic() < deadline or ledger.kills < 3:
            corrupt += crashkit.run_round(ledger, server, rng, run_s=rng.uniform(0.05, 1.5))
            assert not corrupt, f"corrupt entries served: {corrupt[:3]}"
            assert not ledger.errors, f"unexpected error replies: {ledger.errors[:3]}"
        # Whatever the kills cut, the server logged its recovery and served on.
        assert "Ready to accept connections" in server.log()
        return ledger
    finally:
        server.stop()


def _report(ledger: crashkit.Ledger, label: str) -> None:
    line = (f"crash test ({label}): {ledger.kills} kills survived, {ledger.entries_checked} entries checked, "
            f"{len(ledger.acked)} acknowledged XADDs, "
            f"{sum(map(len, ledger.group_acked.values()))} acknowledged XACKs")
    print(line)
    RESULTS.append(line)


def test_kill9_under_load_loses_nothing_acknowledged(tmp_path):
    seed = int(os.environ.get("PARTITA_CRASH_SEED", "0")) or random.randrange(1 << 30)
    print(f"seed {seed} (PARTITA_CRASH_SEED={seed} reproduces the kill schedule)")
    ledger = _crash_loop(tmp_path, CI_SECONDS, seed)
    _report(ledger, "ci")
    assert ledger.kills >= 3 and len(ledger.acked) > 100


@pytest.mark.soak
def test_kill9_soak(tmp_path):
    seconds = float(os.environ.get("PARTITA_SOAK_SECONDS", "600"))
    seed = int(os.environ.get("PARTITA_CRASH_SEED", "0")) or random.randrange(1 << 30)
    print(f"seed {seed}, {seconds:.0f} s")
    ledger = _crash_loop(tmp_path, seconds, seed)
    _report(ledger, f"soak {seconds:.0f}s")


def test_verify_catches_each_broken_invariant(partita_server):
    """The checker is not vacuous: each kind of damage it claims to catch, it catches."""
    ledger = crashkit.setup(partita_server.port)
    conn = crashkit.Conn(partita_server.port)
    for n in range(5):
        ledger.acked[(0, n)] = conn.call(b"XADD", b"s", b"*", *crashkit.make_fields(0, n))
    ledger.sent[0] = 5
    delivered = conn.call(b"XREADGROUP", b"GROUP", b"g", b"c", b"COUNT", 2, b"STREAMS", b"s", b">")
    ids = [entry_id for entry_id, _ in delivered[0][1]]
    ledger.delivered[b"s"] = set(ids)
    assert crashkit.verify(ledger, partita_server.port) == 5 + 2

    def broken(change, message):
        import copy
        bad = copy.deepcopy({k: v for k, v in vars(ledger).items() if k != "lock"})
        bad = crashkit.Ledger(**bad)
        change(bad)
        with pytest.raises(AssertionError, match=message):
            crashkit.verify(bad, partita_server.port)

    broken(lambda lg: lg.acked.__setitem__((0, 9), b"1-1"), "acknowledged entries lost")
    broken(lambda lg: lg.sent.__setitem__(0, 3), "was never sent")
    broken(lambda lg: lg.acked.__setitem__((0, 0), b"1-1"), "with another ID")
    broken(lambda lg: lg.group_acked.__setitem__(b"s", {ids[0]}), "XACKs undone")
    conn.call(b"XACK", b"s", b"g", ids[1])
    broken(lambda lg: None, "never acked, yet not pending")
    conn.call(b"XADD", b"s", b"*", b"p", b"0", b"n", b"7", b"d", b"x", b"c", b"1")
    ledger.sent[0] = 8
    broken(lambda lg: None, "checksum mismatch")
    conn.close()
