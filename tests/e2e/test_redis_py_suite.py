"""redis-py's own stream tests, from the sdist of the installed redis-py, against a fresh partita and cluster.

redis-py's tests are third-party code: they are never committed here but fetched
by ``.ci/fetch_redis_py_tests.py`` (``.ci/run`` calls it) into
``.ci/cache/redis-py-<version>/``. Each case starts its own partita or cluster
(the suite FLUSHDBs between its tests) and runs, in a subprocess with the suite's own
pytest configuration, every test of ``tests/test_commands.py`` and
``tests/test_asyncio/test_commands.py`` whose name names a stream command,
with the server URLs those tests use (``--redis-url``, ``--redis-mod-url``)
pointing at it, and nothing that would point them elsewhere in the
environment. Partita reports ``redis_version:8.10.0``, so the suite's
version-gated tests all run; a test skipped because the server looks too old
fails this test.

The cases cover redis-py 8's client configurations: RESP3 (its default) and
RESP2, each with the legacy response shapes (its default) and with the unified
ones (``legacy_responses=False``, its newest); and its RedisCluster against a
fresh 3-node cluster with replication (there every group command once waited
out the followers' 500 ms long poll).

Without the fetched suite the test skips, saying how to fetch it, except where
the environment variable CI is set: there it fails, so CI never skips it quietly.
docs/streams.md ("redis-py's own tests") says how it runs and what is left out.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from tests.clusterkit import Cluster
from tests.conftest import REPO

VERSION = importlib.metadata.version("redis")
SUITE = REPO / ".ci" / "cache" / f"redis-py-{VERSION}"
SUITE_FILES = ("tests/test_commands.py", "tests/test_asyncio/test_commands.py")
RUN_TIMEOUT_S = 900.0  # the suite's own per-test timeout (30 s) reports a hang first

# Every stream test: those whose names name a stream command (``xack`` also
# selects the xackdel tests, ``xdel`` the xdelex ones, ``xread`` the xreadgroup
# ones and the asyncio client's streaming-lag metric tests of XREAD/XREADGROUP).
STREAM_COMMANDS = ("xadd", "xread", "xreadgroup", "xack", "xackdel", "xdelex", "xnack", "xclaim",
                   "xautoclaim", "xpending", "xinfo", "xgroup", "xtrim", "xlen", "xrange", "xrevrange",
                   "xdel", "xsetid", "xcfgset", "stream")

# Stream tests left out, node id -> why. A test belongs here only when it needs
# another data type or a Redis internal Partita does not have, when it is wrong
# for Redis 8, or when it checks something Partita does differently on purpose
# (and docs/streams.md lists that difference). None does today: redis-py's
# stream tests use streams and the keyspace commands Partita has (DEL, TYPE,
# FLUSHDB), so the list is empty and every selected test must pass.
DESELECTED: dict[str, str] = {}

# On a cluster, left out as well: these tests read two streams of different
# hash slots in one XREADGROUP, which redis-py's RedisCluster refuses before
# sending anything ("all keys must map to the same key slot"); their
# ``..._multiple_streams_same_slots`` twins run the same checks on a cluster.
DESELECTED_ON_A_CLUSTER: dict[str, str] = {
    **DESELECTED,
    "tests/test_commands.py::TestRedisCommands::test_xreadgroup_with_claim_min_idle_time_multiple_streams":
        "two keys of different slots in one XREADGROUP: refused by RedisCluster itself",
    "tests/test_asyncio/test_commands.py::TestRedisCommands::test_xreadgroup_with_claim_min_idle_time_multiple_streams":
        "two keys of different slots in one XREADGROUP: refused by RedisCluster itself",
}

# Skips the suite may make on its own (prefixes of the reason): tests of the
# behaviour of servers older than Partita's redis_version (e.g. lag before
# Redis 8.2.2); on a cluster, also the single-connection variant of its asyncio
# tests (their ``[single]`` client), which it runs against standalone servers
# only. A skip for any other reason (a server too old, a missing module) means
# a test did not run.
OLDER_SERVERS_ONLY = "Redis version required < "
ASYNC_SUITE_STANDALONE_ONLY = "cluster mode enabled"

# Commands the selected tests send; the run must have reached this partita
# with each of them (INFO commandstats), or it tested some other server.
EXPECTED_COMMANDS = ("xadd", "xread", "xreadgroup", "xack", "xackdel", "xdelex", "xnack", "xclaim",
                     "xautoclaim", "xpending", "xinfo|stream", "xinfo|groups", "xinfo|consumers",
                     "xgroup|create", "xgroup|setid", "xgroup|destroy", "xgroup|delconsumer",
                     "xgroup|createconsumer", "xtrim", "xlen", "xrange", "xrevrange", "xdel", "xcfgset")

CLIENT_CONFIGS = {
    "resp3": [],
    "resp2": ["--protocol=2"],
    "resp3-unified": ["--legacy-responses=false"],
    "resp2-unified": ["--protocol=2", "--legacy-responses=false"],
}


@pytest.fixture(scope="module")
def redis_py_suite():
    """The fetched suite's directory; skipped without it (failed under CI)."""
    if not (SUITE / "tests" / "conftest.py").exists():
        reason = (f"redis-py {VERSION}'s test suite is not in {SUITE}: fetch it with "
                  f"`.venv/bin/python .ci/fetch_redis_py_tests.py`")
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (CI must run it, never skip it)")
        pytest.skip(reason)
    return SUITE


def _suite_env() -> dict[str, str]:
    """This environment without what would point the suite elsewhere: its conftest
    reads RE_CLUSTER / REDIS_ENDPOINTS_CONFIG_PATH (a Redis Enterprise database),
    and pytest reads PYTEST_ADDOPTS / PYTEST_PLUGINS."""
    dropped = {"RE_CLUSTER", "REDIS_ENDPOINTS_CONFIG_PATH", "PYTEST_ADDOPTS", "PYTEST_PLUGINS"}
    return {k: v for k, v in os.environ.items() if k not in dropped}


def _results(junit_xml) -> tuple[list[str], list[str], list[tuple[str, str]]]:
    """(passed, failed with their messages, skipped with their reasons) node names."""
    passed, failed, skipped = [], [], []
    for case in ET.parse(junit_xml).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        problem = case.find("failure") if case.find("failure") is not None else case.find("error")
        skip = case.find("skipped")
        if problem is not None:
            failed.append(f"{name}: {problem.get('message', '')[:300]}")
        elif skip is not None:
            skipped.append((name, skip.get("message", "")))
        else:
            passed.append(name)
    return passed, failed, skipped


def _run_suite(suite, url: str, options: list[str], deselected: dict[str, str], allowed_skips: tuple[str, ...],
               tmp_path) -> list[str]:
    """Run the stream tests against ``url``; assert they all passed (or were
    skipped for an allowed reason); the tests that passed."""
    junit_xml = tmp_path / "redis-py.xml"
    args = [sys.executable, "-m", "pytest", *SUITE_FILES,
            "-k", " or ".join(STREAM_COMMANDS),
            *(f"--deselect={node}" for node in deselected),
            # The servers the selected tests use: the partita under test only.
            f"--redis-url={url}", f"--redis-mod-url={url}", *options,
            f"--junitxml={junit_xml}", "-q", "-rfEs", "-p", "no:cacheprovider",
            # The suite's filterwarnings names coverage's warning class; coverage is not installed.
            "-o", "filterwarnings=default"]
    try:
        run = subprocess.run(args, cwd=suite, env=_suite_env(), stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"redis-py's suite did not finish in {RUN_TIMEOUT_S}s:\n"
                    f"{(exc.output or b'').decode(errors='replace')[-5000:]}")
    output = run.stdout.decode(errors="replace")
    assert junit_xml.exists(), f"redis-py's suite wrote no report (exit {run.returncode}):\n{output[-5000:]}"
    passed, failed, skipped = _results(junit_xml)

    assert not failed, "redis-py stream tests failed:\n" + "\n".join(failed) + f"\n\n{output[-5000:]}"
    assert run.returncode == 0, output[-5000:]
    unexpected_skips = [f"{name}: {why}" for name, why in skipped if not why.startswith(allowed_skips)]
    assert not unexpected_skips, "skipped, so not run:\n" + "\n".join(unexpected_skips)
    for node in deselected:  # a stale entry (a test renamed or removed) hides nothing: drop it
        path, *_, name = node.split("::")
        assert f"def {name.split('[')[0]}(" in (suite / path).read_text(), f"stale: {node}"
    assert passed, output[-5000:]
    return passed


def _assert_reached(servers, passed: list[str]) -> None:
    """The selected tests sent every stream command to these servers (and
    not to some other server)."""
    calls: dict[str, int] = {}
    for server in servers:
        with server.client(decode_responses=True) as r:
            for name, fields in r.info("commandstats").items():
                calls[name.removeprefix("cmdstat_")] = calls.get(name.removeprefix("cmdstat_"), 0) + fields["calls"]
    missing = [cmd for cmd in EXPECTED_COMMANDS if not calls.get(cmd)]
    assert not missing, f"the suite never sent {missing} to the partita under test ({len(passed)} passed)"


@pytest.mark.parametrize("config", list(CLIENT_CONFIGS))
def test_redis_py_stream_tests_pass(redis_py_suite, partita_server, tmp_path, config):
    url = f"redis://{partita_server.host}:{partita_server.port}"
    passed = _run_suite(redis_py_suite, url, CLIENT_CONFIGS[config], DESELECTED, (OLDER_SERVERS_ONLY,), tmp_path)
    _assert_reached([partita_server], passed)


def test_redis_py_stream_tests_pass_on_a_cluster(redis_py_suite, tmp_path):
    """The same tests through redis-py's RedisCluster (its conftest switches
    to it when INFO says ``cluster_enabled:1``) against a 3-node cluster,
    with replication as users run it (acks=all, the default 500 ms long poll
    of the followers' fetches), RESP3."""
    cluster = Cluster(tmp_path, extra=["--replica-fetch-wait-max-ms", "500"])
    try:
        url = f"redis://127.0.0.1:{cluster.ports[0]}"
        passed = _run_suite(redis_py_suite, url, [f"--redis-cluster-nodes={len(cluster.nodes)}"],
                            DESELECTED_ON_A_CLUSTER, (OLDER_SERVERS_ONLY, ASYNC_SUITE_STANDALONE_ONLY), tmp_path)
        _assert_reached(cluster.nodes, passed)
    finally:
        cluster.stop()
    assert not cluster.unexpected_log_lines(), cluster.unexpected_log_lines()[:5]
