"""The README's walk-through, replayed line by line as a new user would type it.

Each ``127.0.0.1:6379> COMMAND`` line of the sections "A short session" and
"Topics and partitions" is run with the real ``redis-cli`` against a real
``partita`` (started as the ``$ .venv/bin/partita ...`` lines say, on a free
port and a fresh data directory shared by both sections), and its output must
be the lines the README shows under it. Entry IDs differ from run to run: a
README ID stands for whatever ID the run gave at the same place, the same one
every time it appears. A line ``...`` in the README skips lines of the output
(up to the next line shown, or to the end); an ``idle`` time may be any number.

The commands of "A replicated cluster" are replayed too: its nodes started
with the README's options (on free ports), its redis-cli lines, the kill -9.
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


def cluster_lines() -> list[str]:
    """The commands of "A replicated cluster", continuation lines joined and
    comments removed."""
    text = "\n".join(code_blocks("A replicated cluster")[0]).replace("\\\n", " ")
    lines = [re.sub(r"\s+#.*$", "", line).strip() for line in text.splitlines()]
    return [re.sub(r"\s+", " ", line) for line in lines if line]


def test_the_cluster_commands_start_a_cluster_that_keeps_serving_after_a_kill(tmp_path):
    """The README's cluster, node for node, on free ports (client port 700N
    and bus port of node N become two free ports, named in every
    cluster-nodes entry); each redis-cli line runs as typed, retried while
    the cluster answers that it is still starting."""
    from tests.clusterkit import listen_ports

    lines = cluster_lines()
    readme_ports = sorted({int(p) for p in re.findall(r"\b(700\d)\b", " ".join(lines))})
    free = listen_ports(2 * len(readme_ports))
    client = dict(zip(readme_ports, free))
    bus = dict(zip(readme_ports, free[len(readme_ports):]))

    def local(line: str) -> list[str]:
        line = re.sub(r"(\d+)@127\.0\.0\.1:(700\d)(@\d+)?",
                      lambda m: f"{m.group(1)}@127.0.0.1:{client[int(m.group(2))]}@{bus[int(m.group(2))]}", line)
        return [str(client[int(t)]) if t.isdigit() and int(t) in client else t for t in shlex.split(line)]

    nodes: dict[int, PartitaProcess] = {}
    try:
        for line in lines:
            args = local(line.rstrip("& "))
            if args[0] == ".venv/bin/partita":
                assert line.endswith("&"), line  # in the background, as the README says
                port, data = args[args.index("--port") + 1], args[args.index("--dir") + 1]
                rest = [a for i, a in enumerate(args[1:], 1)
                        if a not in ("--port", "--dir") and args[i - 1] not in ("--port", "--dir")]
                node = PartitaProcess(tmp_path / data, rest)
                node.port = int(port)
                nodes[int(args[args.index("--node-id") + 1])] = node.start()
            elif args[0] == "redis-cli":
                out = _until_served(args)
                assert "ERR" not in out and "Could not connect" not in out, (line, out)
                if "INFO" in args:
                    assert "cluster_enabled:1" in out
            else:
                assert args[:2] == ["kill", "-9"], line
                nodes[2].kill9()
        # After the kill: every key is written again, through any live node.
        for i in range(20):
            out = _until_served(["redis-cli", "-c", "-p", str(nodes[1].port), "XADD", f"key{i}", "*", "a", "1"])
            assert ENTRY_ID.fullmatch(out.strip()), out
    finally:
        for node in nodes.values():
            node.stop()


def _until_served(args: list[str], timeout_s: float = 60.0) -> str:
    """redis-cli's output, once the cluster no longer answers that it is
    starting or electing (TRYAGAIN, CLUSTERDOWN, a refused connection)."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        result = subprocess.run(args, capture_output=True, text=True, timeout=30)
        out = result.stdout + result.stderr
        transient = any(word in out for word in ("TRYAGAIN", "CLUSTERDOWN", "Could not connect"))
        if not transient or time.monotonic() > deadline:
            return out
        time.sleep(0.1)
