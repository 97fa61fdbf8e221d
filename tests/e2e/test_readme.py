"""The README's walk-through, replayed line by line as a new user would type it.

Each ``127.0.0.1:6379> COMMAND`` line of the sections "A short session" and
"Topics and partitions" is run with the real ``redis-cli`` against a real
``partita`` (started as the ``$ .venv/bin/partita ...`` lines say, on a free
port and a fresh data directory shared by both sections), and its output must
be the lines the README shows under it. Entry IDs differ from run to run: a
README ID stands for whatever ID the run gave at the same place, the same one
every time it appears. A line ``...`` in the README skips lines of the output
(up to the next line shown, or to the end); an ``idle`` time may be any number.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess

import pytest

from tests.conftest import REPO, PartitaProcess

README = REPO / "README.md"
PROMPT = "127.0.0.1:6379> "
ENTRY_ID = re.compile(r"\d{13}-\d+")
COMMENT = re.compile(r"\s{2,}#.*$")
INTEGER_VALUE = re.compile(r"^(\s*\d+\) )\(integer\) \d+$")

pytestmark = pytest.mark.skipif(shutil.which("redis-cli") is None, reason="redis-cli is not installed")


def code_blocks(section: str) -> list[list[str]]:
    """The fenced blocks of the README section titled ``section``."""
    text = README.read_text()
    start = text.index(f"\n## {section}\n")
    end = text.find("\n## ", start + 1)
    body = text[start:end if end != -1 else None]
    return [block.splitlines() for block in re.findall(r"```\n(.*?)```", body, re.S)]


def steps(lines: list[str]) -> list[tuple[str, list[str]]]:
    """(what to do, the lines the README shows after it): a ``$ `` shell line
    or a redis-cli command, comments removed."""
    out: list[tuple[str, list[str]]] = []
    for line in lines:
        if line.startswith("$ ") or line.startswith(PROMPT):
            out.append((COMMENT.sub("", line), []))
        elif out:
            out[-1][1].append(COMMENT.sub("", line).rstrip())
    return out


class IdMap:
    """The README's entry IDs bound, in order, to the ones this run gave."""

    def __init__(self) -> None:
        self.readme_to_run: dict[str, str] = {}

    def same(self, shown: str, got: str) -> bool:
        shown_ids, got_ids = ENTRY_ID.findall(shown), ENTRY_ID.findall(got)
        if ENTRY_ID.split(shown) != ENTRY_ID.split(got) or len(shown_ids) != len(got_ids):
            return False
        for a, b in zip(shown_ids, got_ids):
            bound = self.readme_to_run.setdefault(a, b)
            if bound != b:
                return False
        return True

    def to_run(self, text: str) -> str:
        return ENTRY_ID.sub(lambda m: self.readme_to_run[m.group(0)], text)


def matches(shown: list[str], got: list[str], ids: IdMap) -> bool:
    i = j = 0
    while i < len(shown):
        line = shown[i]
        if line.startswith("..."):
            if i + 1 == len(shown):
                return True
            while j < len(got) and not ids.same(shown[i + 1], got[j]):
                j += 1
            i += 1
            continue
        if j >= len(got):
            return False
        previous = shown[i - 1] if i else ""
        idle = previous.endswith('"idle"') and INTEGER_VALUE.match(line) and INTEGER_VALUE.match(got[j])
        if not (idle and INTEGER_VALUE.match(line).group(1) == INTEGER_VALUE.match(got[j]).group(1)) \
                and not ids.same(line, got[j]):
            return False
        i += 1
        j += 1
    return j == len(got)


def test_the_short_session_and_the_topics_example_work_as_shown(tmp_path):
    walk = steps(code_blocks("A short session")[0]) + steps(code_blocks("Topics and partitions")[0])
    server = PartitaProcess(tmp_path / "partita-data")
    ids = IdMap()
    try:
        for action, shown in walk:
            if action.startswith("$ .venv/bin/partita"):
                assert "--dir ./partita-data" in action and action.endswith("&")
                server.start()
                continue
            if action.startswith("$ "):
                assert action == "$ redis-cli", action
                continue
            command = ids.to_run(action[len(PROMPT):])  # an ID the README showed before
            result = subprocess.run(["redis-cli", "--no-raw", "-p", str(server.port), *shlex.split(command)],
                                    capture_output=True, text=True, timeout=30, cwd=tmp_path)
            if command == "SHUTDOWN":
                assert shown == ["not connected>"]
                assert server.proc.wait(timeout=30) == 0
                continue
            got = result.stdout.rstrip("\n").splitlines()
            assert matches(shown, got, ids), f"{action}\nREADME shows:\n" + "\n".join(shown) + \
                "\nthe server answered:\n" + "\n".join(got)
    finally:
        server.stop()
