"""Small files that must be replaced atomically: checkpoints and metadata blobs.

Owns: ``write_atomic`` (write ``<name>.tmp``, fsync it, rename over ``<name>``,
fsync the directory) and ``read_file``; ``parse_json``, which the JSON blobs'
readers use (from disk or a peer: garbage of any shape is a ValueError);
plus the text checkpoint format used
by the partition log (recovery point, log start offset, leader epochs):

    line 1: the format version (``0``)
    line 2: the number of entries N
    N lines: space-separated decimal integers

A reader sees either the old file or the new one, never a mix. A file that
does not parse, or holds a value outside the bounds the caller gives, is
reported as corrupt (``CorruptCheckpointError``) so the caller can fall back
to a safe default (e.g. recovery point 0 = scan all).

Thread contract: functions are stateless; safe from any thread as long as two
threads never write the same path at once (callers serialise that).

Must not know: what the numbers mean.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from storage.errors import READ_FAILED, raise_storage_error

TMP_SUFFIX = ".tmp"


class CorruptCheckpointError(ValueError):
    """A checkpoint file exists but does not parse."""


def fsync_dir(path: Path) -> None:
    """fsync a directory so renames and creates inside it are durable."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise_storage_error(f"fsync directory {path}", exc, sync=True)


def write_all(fd: int, data: bytes, *, sync: bool = True) -> None:
    """Write all of ``data`` at ``fd``'s position (``os.write`` may write less), then fsync."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]
    if sync:
        os.fsync(fd)


def write_atomic(path: Path, data: bytes, *, sync: bool = True) -> None:
    """Replace ``path`` with ``data`` atomically (tmp + fsync + rename + dir fsync).

    Raises:
        StorageError: on any disk error; the old file is left in place.
            ``SyncError`` when an fsync failed (of the file, or of the
            directory after the rename: which file a crash leaves is unknown).
    """
    tmp = path.with_name(path.name + TMP_SUFFIX)
    step = "write"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            write_all(fd, data, sync=False)
            if sync:
                step = "fsync"
                os.fsync(fd)
        finally:
            os.close(fd)
        step = "write"
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise_storage_error(f"{step} {path}", exc, sync=step == "fsync")
    if sync:
        fsync_dir(path.parent)


def read_file(path: Path) -> bytes | None:
    """The whole file, or None if it does not exist."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise_storage_error(f"read {path}", exc, READ_FAILED)


def parse_json(data: bytes) -> Any:
    """``json.loads``, except that JSON nested deeper than the parser goes
    (``json`` raises RecursionError for it: ``b"[" * 100000``) is a
    ValueError like any other text that does not parse, so a reader that
    turns down garbage turns that down too."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("JSON nested too deep") from None


def encode_rows(rows: list[tuple[int, ...]]) -> bytes:
    lines = ["0", str(len(rows))]
    lines += [" ".join(str(v) for v in row) for row in rows]
    return ("\n".join(lines) + "\n").encode()


def decode_rows(data: bytes, width: int, limits: tuple[int, ...] | None = None) -> list[tuple[int, ...]]:
    """Parse the text checkpoint format; with ``limits`` (the largest value of
    each column) every value must lie in ``[0, limit]``, so no number read
    from the file is used unbounded. Raises CorruptCheckpointError."""
    try:
        lines = data.decode("ascii").split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        if len(lines) < 2 or lines[0] != "0":
            raise ValueError("bad header")
        n = int(lines[1])
        if n != len(lines) - 2:
            raise ValueError("entry count does not match")
        rows = []
        for line in lines[2:]:
            row = tuple(int(v) for v in line.split(" "))
            if len(row) != width:
                raise ValueError("bad row width")
            if limits is not None:
                for value, limit in zip(row, limits):
                    if not 0 <= value <= limit:
                        raise ValueError(f"value {value} out of range (0..{limit})")
            rows.append(row)
        return rows
    except (UnicodeDecodeError, ValueError) as exc:
        raise CorruptCheckpointError(str(exc)) from None


def write_rows(path: Path, rows: list[tuple[int, ...]]) -> None:
    write_atomic(path, encode_rows(rows))


def read_rows(path: Path, width: int, limits: tuple[int, ...] | None = None) -> list[tuple[int, ...]] | None:
    """Rows of a checkpoint file (``decode_rows``); None if missing. Raises CorruptCheckpointError."""
    data = read_file(path)
    if data is None:
        return None
    return decode_rows(data, width, limits)


def remove_stale_tmp(directory: Path) -> None:
    """Remove ``*.tmp`` files left by a crash in the middle of ``write_atomic``."""
    try:
        for entry in os.scandir(directory):
            if entry.name.endswith(TMP_SUFFIX):
                os.unlink(entry.path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise_storage_error(f"clean {directory}", exc)
