"""``LogManager.rename_topic``: a topic directory renamed atomically across
crashes. A crash is simulated at each step (``rename_step_hook`` raises: the
files stay as the step left them, nothing is flushed or closed after it,
as after kill -9); a new LogManager over the same directory must then find
the topic under exactly one name, with all its entries and the right
``topic.meta`` (and ``topic.key`` for long names)."""

from __future__ import annotations

import pytest

from storage import log_manager as lm_module
from storage.log_manager import RENAME_INTENT, LogManager, encode_topic
from tests.storage.helpers import entries, read_all

STEPS = ["begin", "intent", "aside", "moved", "named", "done"]
LONG = b"L" * 300  # its directory is h.<sha256>, named by its topic.key


class Crash(Exception):
    """The process died here."""


@pytest.fixture(autouse=True)
def no_hook():
    yield
    lm_module.rename_step_hook = None


def _make(tmp_path, name: bytes, first_ms: int, partitions: int = 2) -> LogManager:
    lm = LogManager(tmp_path)
    for n in range(partitions):
        lm.partition(name, n).append(entries(first_ms + 10 * n, 3, name[:8]))
    lm.write_topic_meta(name, b"meta of " + name[:8])
    return lm


def _contents(lm: LogManager, name: bytes) -> dict[int, list]:
    return {n: [(off, ms, seq) for off, ms, seq, _ in read_all(lm.partition(name, n))]
            for n in lm.partitions_on_disk(name)}


@pytest.mark.parametrize("src,dst", [(b"a", b"b"), (b"a", LONG), (LONG, b"b")], ids=["short", "to-long", "from-long"])
@pytest.mark.parametrize("dst_exists", [False, True], ids=["new", "over"])
@pytest.mark.parametrize("step", STEPS)
def test_a_crash_at_any_step_leaves_the_topic_under_one_name(tmp_path, src, dst, dst_exists, step):
    if step == "aside" and not dst_exists:
        pytest.skip("no destination to put aside")
    lm = _make(tmp_path, src, 1000)
    if dst_exists:
        lm.partition(dst, 0).append(entries(1, 5, b"old dst"))
        lm.write_topic_meta(dst, b"old dst meta")
    expected = _contents(lm, src)

    def crash(reached: str) -> None:
        if reached == step:
            raise Crash(step)

    lm_module.rename_step_hook = crash
    with pytest.raises(Crash):
        lm.rename_topic(src, dst, b"new meta")
    lm_module.rename_step_hook = None
    # The process died: its descriptors go, nothing more is written.
    for log in lm.open_partitions():
        log.abandon()

    again = LogManager(tmp_path)
    topics = again.topics()
    if step == "begin":  # the intent never reached the disk: as before
        assert topics == sorted([src] + ([dst] if dst_exists else []))
        assert _contents(again, src) == expected
        assert again.read_topic_meta(src) == b"meta of " + src[:8]
    else:
        assert topics == [dst]
        assert _contents(again, dst) == expected
        assert again.read_topic_meta(dst) == b"new meta"
        assert (tmp_path / "topics" / encode_topic(dst) / "topic.key").exists() == (dst == LONG)
    assert not (tmp_path / RENAME_INTENT).exists()
    assert not (tmp_path / "trash").exists() or not any((tmp_path / "trash").iterdir())
    # And the logs append where they were.
    name = dst if step != "begin" else src
    log = again.partition(name, 0)
    log.append(entries(5000, 1))
    assert log.log_end_offset == 4
    again.close()


def test_a_rename_without_a_crash(tmp_path):
    lm = _make(tmp_path, b"a", 1000, partitions=3)
    expected = _contents(lm, b"a")
    seen = []
    lm_module.rename_step_hook = seen.append
    lm.rename_topic(b"a", b"b", b"meta b")
    assert seen == ["begin", "intent", "moved", "named", "done"]
    assert lm.topics() == [b"b"]
    assert _contents(lm, b"b") == expected
    assert not (tmp_path / RENAME_INTENT).exists()
    lm.close()


@pytest.mark.parametrize("content", [b"{not json", b"[" * 100000])
def test_an_unreadable_intent_renames_nothing_and_is_kept_aside(tmp_path, caplog, content):
    """Nested deeper than the parser goes (json raises RecursionError) included."""
    _make(tmp_path, b"a", 1000).close()
    (tmp_path / RENAME_INTENT).write_bytes(content)
    with caplog.at_level("WARNING", logger="partita.storage"):
        lm = LogManager(tmp_path)
    assert lm.topics() == [b"a"]
    assert "is unreadable" in caplog.text
    assert not (tmp_path / RENAME_INTENT).exists()
    assert list(tmp_path.glob(RENAME_INTENT + ".damaged-*"))
    lm.close()
