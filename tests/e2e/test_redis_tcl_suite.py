"""Redis's own stream tests (its Tcl suite's ``unit/type/stream`` and
``unit/type/stream-cgroups``) against a fresh partita.

Redis's source is third-party code: it is never committed here but fetched by
``.ci/fetch_redis_tcl_tests.sh`` (``.ci/run`` calls it) from Debian's source
package of Redis ``VERSION`` (the newest Debian has; Debian has no 7.4 nor
8.10) into ``.ci/cache/redis-src-<version>/tests/``. Each run copies that
``tests/`` into the test's temporary directory (the runner writes its
``tmp/`` there) and runs Redis's own runner, ``tclsh tests/test_helper.tcl``,
in its external-server mode (``--host``/``--port``): it then leaves out by
itself the tests tagged ``external:skip`` (they start their own
redis-server: replication, restarts, DEBUG RELOAD, AOF), and ``--tags
-needs:debug`` leaves out those that need DEBUG. ``--singledb``: Partita has
one database (the runner otherwise SELECTs 9). One change to the copy:
the runner's external-mode setup sends FUNCTION FLUSH and SCRIPT FLUSH
before each file; Partita has no scripting, so the copy wraps those two in
``catch`` (``SCRIPTLESS_SETUP``).

``SKIPPED`` lists every other test left out (``--skiptest``), each with why:
it needs another data type, a Redis internal, or a command Partita does not
have. The run must pass with nothing else failing, every entry of ``SKIPPED``
must still name a test of the suite (a stale entry fails), and the partita
under test must have seen the stream commands (INFO commandstats).

Without the fetched suite or ``tclsh`` the test skips, saying how to get
them, except where the environment variable CI is set: there it fails.
docs/streams.md ("Redis's own stream tests") says how it runs and why each
test is left out.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from tests.conftest import REPO

VERSION = "8.6.3"  # .ci/fetch_redis_tcl_tests.sh's REDIS_VERSION
SUITE = REPO / ".ci" / "cache" / f"redis-src-{VERSION}" / "tests"
UNITS = ("unit/type/stream", "unit/type/stream-cgroups")
RUN_TIMEOUT_S = 900.0  # the runner's own per-test timeout (--timeout) reports a hang first
TEST_TIMEOUT_S = 120

# The runner's external-mode setup (tests/support/server.tcl), and what the
# copy runs instead: Partita has no functions or scripts to flush.
SCRIPTLESS_SETUP = {
    "\n    r function flush\n": "\n    catch {r function flush}\n",
    "\n    r script flush\n": "\n    catch {r script flush}\n",
}

_OTHER_TYPE = "needs another data type (Partita keeps streams only)"
_RDB = "DUMP / RESTORE: Redis's RDB serialization, a Redis internal Partita does not have"

# Test name (or /regexp) -> why it is left out.
SKIPPED: dict[str, str] = {
    "/^XIDMPRECORD ":
        "XIDMPRECORD (8.6.2) is Redis's internal command for its AOF rewrite and replication of IDMP "
        "state; Partita keeps that state in its own log and replicates it there",
    "XADD IDMP tracking survives RESTORE": _RDB,
    "/^Loading from legacy \\(Redis <= v": _RDB + " (it RESTOREs payloads of older RDB versions)",
    "Consumer seen-time and active-time":
        _RDB + " (it passes up to its final DUMP / RESTORE round trip)",
    "XADD IDMP tracking survives COPY": "COPY: a keyspace command Partita does not have",
    "XADD IDMP tracking correct after COPY REPLACE overwrites IDMP stream":
        "COPY: a keyspace command Partita does not have",
    "XREAD: XADD + DEL + LPUSH should not awake client": _OTHER_TYPE + " (LPUSH, a list)",
    "XREADGROUP wrong key type": _OTHER_TYPE + " (SET, a string)",
    "Blocking XREADGROUP: key type changed with SET": _OTHER_TYPE + " (SET, a string)",
    "Blocking XREADGROUP: key type changed with transaction": _OTHER_TYPE + " (SET, a string)",
    "Blocking XREAD: key type changed with SET": _OTHER_TYPE + " (SET, a string)",
    "Blocking XREADGROUP for stream key that has clients blocked on list": _OTHER_TYPE + " (BLPOP, a list)",
    "XREADGROUP of multiple entries changes dirty by one":
        "INFO rdb_changes_since_last_save: Redis's RDB dirty counter, a Redis internal",
    "XREADGROUP from PEL does not change dirty":
        "INFO rdb_changes_since_last_save: Redis's RDB dirty counter, a Redis internal",
}

# Commands the last block of stream-cgroups sends (the runner's CONFIG
# RESETSTAT starts each block afresh): the run must have reached the partita
# under test with each of them (INFO commandstats), or it tested another server.
EXPECTED_COMMANDS = ("xadd", "xreadgroup", "xack", "xgroup|create")

_COLOUR = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture(scope="module")
def redis_tcl_suite():
    """The fetched suite's ``tests/``; skipped without it or tclsh (failed under CI)."""
    reason = None
    if not (SUITE / "test_helper.tcl").exists():
        reason = f"Redis {VERSION}'s test suite is not in {SUITE}: fetch it with `.ci/fetch_redis_tcl_tests.sh`"
    elif shutil.which("tclsh") is None:
        reason = "no tclsh: install it with `apt-get install tcl` (.ci/fetch_redis_tcl_tests.sh does)"
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (CI must run it, never skip it)")
        pytest.skip(reason)
    return SUITE


def _copy(suite, dest):
    """The suite in ``dest`` with SCRIPTLESS_SETUP applied."""
    shutil.copytree(suite, dest, ignore=shutil.ignore_patterns("tmp"))
    server_tcl = dest / "support" / "server.tcl"
    text = server_tcl.read_text()
    for old, new in SCRIPTLESS_SETUP.items():
        assert text.count(old) == 1, f"{server_tcl}: the runner's setup changed, no {old.strip()!r}"
        text = text.replace(old, new)
    server_tcl.write_text(text)
    (dest / "tmp").mkdir()
    return dest


def _assert_not_stale(suite) -> None:
    """Every SKIPPED entry still names a test of the units (else it hides nothing)."""
    names = set()
    for unit in UNITS:
        names.update(re.findall(r'^\s*test [{"](.+?)[}"] \{\s*$', (suite / f"{unit}.tcl").read_text(), re.M))
    for entry in SKIPPED:
        if entry.startswith("/"):
            assert any(re.search(entry[1:], name) for name in names), f"stale skip: {entry}"
        else:
            assert entry in names, f"stale skip: {entry}"


def test_redis_stream_tests_pass(redis_tcl_suite, partita_server, tmp_path):
    _assert_not_stale(redis_tcl_suite)
    suite = _copy(redis_tcl_suite, tmp_path / "tests")
    args = [shutil.which("tclsh"), "tests/test_helper.tcl",
            "--host", partita_server.host, "--port", str(partita_server.port), "--singledb",
            *(arg for unit in UNITS for arg in ("--single", unit)),
            "--clients", "1", "--timeout", str(TEST_TIMEOUT_S), "--tags", "-needs:debug",
            *(arg for name in SKIPPED for arg in ("--skiptest", name))]
    try:
        run = subprocess.run(args, cwd=suite.parent, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"Redis's suite did not finish in {RUN_TIMEOUT_S}s:\n"
                    f"{_COLOUR.sub('', (exc.output or b'').decode(errors='replace'))[-5000:]}")
    output = _COLOUR.sub("", run.stdout.decode(errors="replace"))
    failed = re.findall(r"^\[(?:err|exception)\]: .*$", output, re.M)
    assert not failed, "Redis's stream tests failed:\n" + "\n".join(failed) + f"\n\n{output[-5000:]}"
    assert run.returncode == 0 and "All tests passed without errors!" in output, output[-5000:]
    for unit in UNITS:
        assert f"Testing {unit}\n" in output, f"{unit} did not run:\n{output[-5000:]}"
    passed = re.findall(r"^\[ok\]: ", output, re.M)
    skipped = re.findall(r"^\[skip\]: (.*)$", output, re.M)
    assert len(passed) > 250, f"only {len(passed)} tests passed:\n{output[-5000:]}"
    assert len(skipped) >= len(SKIPPED), skipped

    with partita_server.client(decode_responses=True) as r:
        calls = {name.removeprefix("cmdstat_"): fields["calls"] for name, fields in r.info("commandstats").items()}
    missing = [cmd for cmd in EXPECTED_COMMANDS if not calls.get(cmd)]
    assert not missing, f"the suite never sent {missing} to the partita under test"
