"""Checkpoints and segment files that contradict the log they describe.

Each damaged file is detected at open, logged with a WARNING that names it
and says what was done, and the log is repaired from what its segments hold
(or a read is refused with a clean error): never trusted blindly
(docs/guarantees.md, "Damaged files")."""

import os

import pytest

from storage.errors import READ_FAILED, StorageError
from storage.log import LogConfig, PartitionLog
from tests.storage.helpers import entries, read_all

CFG = LogConfig(segment_bytes=4096, index_interval_bytes=256)


def build(path, n=60):
    """A cleanly closed log of ``n`` entries (one per batch, several segments);
    returns what it serves."""
    log = PartitionLog.open(path, CFG)
    for i in range(n):
        log.append(entries(1 + i, 1, b"x" * 100))
    want = read_all(log)
    log.close()
    return want


def segment_names(path) -> list[str]:
    return sorted(n for n in os.listdir(path) if n.endswith(".log"))


def test_a_missing_segment_is_a_read_error(tmp_path):
    d = tmp_path / "p"
    build(d)
    log = PartitionLog.open(d, CFG)
    os.unlink(d / segment_names(d)[0])
    with pytest.raises(StorageError, match="open .* failed: ENOENT") as info:
        log.read(0)
    assert info.value.code == READ_FAILED
    log.close()
