import os

import pytest

from storage.checkpoint import (
    CorruptCheckpointError, decode_rows, encode_rows, parse_json, read_rows, remove_stale_tmp,
    write_atomic, write_rows,
)
from storage.errors import StorageError


def test_rows_round_trip(tmp_path):
    p = tmp_path / "x.checkpoint"
    assert read_rows(p, 2) is None
    write_rows(p, [(1, 2), (3, 4)])
    assert p.read_bytes() == b"0\n2\n1 2\n3 4\n"
    assert read_rows(p, 2) == [(1, 2), (3, 4)]
    assert not (tmp_path / "x.checkpoint.tmp").exists()


@pytest.mark.parametrize("data", [b"", b"1\n0\n", b"0\n2\n1 2\n", b"0\n1\n1\n", b"0\n1\nx y\n", b"\xff"])
def test_corrupt_rows(data):
    with pytest.raises(CorruptCheckpointError):
        decode_rows(data, 2)


def test_write_atomic_failure_keeps_old_file(tmp_path, monkeypatch):
    p = tmp_path / "meta"
    write_atomic(p, b"old")

    def fail(*a):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", fail)
    with pytest.raises(StorageError, match="ENOSPC"):
        write_atomic(p, b"new")
    assert p.read_bytes() == b"old"
    assert not (tmp_path / "meta.tmp").exists()


def test_remove_stale_tmp(tmp_path):
    (tmp_path / "a.tmp").write_bytes(b"")
    (tmp_path / "b").write_bytes(b"")
    remove_stale_tmp(tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["b"]
    assert encode_rows([]) == b"0\n0\n"


@pytest.mark.parametrize("data", [b"0\n1\n-1 0\n", b"0\n1\n11 0\n", b"0\n1\n5 4294967296\n"])
def test_values_out_of_bounds_are_corrupt(data):
    with pytest.raises(CorruptCheckpointError, match="out of range"):
        decode_rows(data, 2, (10, 2**32 - 1))
    assert decode_rows(b"0\n1\n10 4294967295\n", 2, (10, 2**32 - 1)) == [(10, 2**32 - 1)]


def test_parse_json_makes_nesting_too_deep_for_the_parser_a_value_error():
    """json raises RecursionError for it, which a reader turning down
    ValueError would let escape."""
    assert parse_json(b'{"a": [[1]]}') == {"a": [[1]]}
    for data in (b"[" * 100000, b'{"a": ' + b"[" * 100000):
        with pytest.raises(ValueError, match="nested too deep"):
            parse_json(data)
    with pytest.raises(ValueError):
        parse_json(b"{not json")
