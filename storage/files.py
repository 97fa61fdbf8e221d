"""File names inside a partition directory.

Owns: the naming scheme. ``ls`` sorts segments because names are the 20-digit
zero-padded base offset (Kafka's ``LogFileUtils``):

    00000000000000000000.log       record batches
    00000000000000000000.index     sparse offset index (offset -> file position)
    00000000000000000000.idindex   sparse ID index (stream ID -> offset; also the time index)
    00000000000000000000.xdel      deletion markers (XDEL), append-only
    recovery-point.checkpoint      offsets below are fsynced
    log-start-offset.checkpoint    log start offset (+ last ID, for an emptied log)
    leader-epoch.checkpoint        epoch -> start offset

Must not know: what is inside the files.
"""

from __future__ import annotations

from pathlib import Path

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
ID_INDEX_SUFFIX = ".idindex"
MARKERS_SUFFIX = ".xdel"
SEGMENT_SUFFIXES = (LOG_SUFFIX, INDEX_SUFFIX, ID_INDEX_SUFFIX, MARKERS_SUFFIX)

RECOVERY_POINT_FILE = "recovery-point.checkpoint"
LOG_START_FILE = "log-start-offset.checkpoint"
LEADER_EPOCH_FILE = "leader-epoch.checkpoint"

OFFSET_DIGITS = 20


def base_name(base_offset: int) -> str:
    """``00000000000000000042`` for base offset 42."""
    assert 0 <= base_offset < 10**OFFSET_DIGITS
    return f"{base_offset:020d}"


def segment_path(directory: Path, base_offset: int, suffix: str) -> Path:
    return directory / (base_name(base_offset) + suffix)


def parse_base_offset(name: str, suffix: str) -> int | None:
    """The base offset in ``name`` if it is ``<20 digits><suffix>``, else None."""
    if not name.endswith(suffix):
        return None
    stem = name[: -len(suffix)]
    if len(stem) != OFFSET_DIGITS or not stem.isdigit() or not stem.isascii():
        return None
    return int(stem)
