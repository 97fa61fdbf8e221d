"""Fetch redis-py's own test suite for the installed redis-py into .ci/cache/.

redis-py ships its tests only in its sdist on PyPI. This downloads the sdist of
exactly the installed version with pip (``pip download --no-deps --no-binary
:all: redis==<version>``) and unpacks its ``tests/`` and its ``pyproject.toml``
(the suite's pytest configuration) into ``.ci/cache/redis-py-<version>/``,
which tests/e2e/test_redis_py_suite.py runs against a real partita. Its
``redis/`` package is left out on purpose: the suite must import the installed
client, not a copy beside the tests. The cache is gitignored: redis-py's code is
third-party and never committed here.

Usage: ``.venv/bin/python .ci/fetch_redis_py_tests.py`` (.ci/run does it).
Idempotent: does nothing when the version's suite is already there.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

CACHE = Path(__file__).resolve().parent / "cache"
KEPT = ("tests/", "pyproject.toml")  # what the suite needs of the sdist


def suite_dir(version: str) -> Path:
    return CACHE / f"redis-py-{version}"


def fetch(version: str) -> Path:
    dest = suite_dir(version)
    if (dest / "tests" / "conftest.py").exists():
        return dest
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                        f"redis=={version}", "-d", tmp], check=True)
        sdist = Path(tmp) / f"redis-{version}.tar.gz"
        top = f"redis-{version}/"
        unpacked = Path(tmp) / "unpacked"
        with tarfile.open(sdist) as tar:
            members = [m for m in tar.getmembers()
                       if m.name.startswith(top) and m.name[len(top):].startswith(KEPT)]
            assert members, f"{sdist.name} has no {KEPT}"
            # The "data" filter (refusing links and paths out of the target) is
            # in every Python since 3.11.4; older ones unpack as before.
            safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            tar.extractall(unpacked, members=members, **safe)
        # One rename: a run that died half-way leaves no half suite behind.
        shutil.rmtree(dest, ignore_errors=True)
        (unpacked / top).rename(dest)
    return dest


def main() -> None:
    version = importlib.metadata.version("redis")
    print(f"redis-py {version}'s test suite: {fetch(version)}")


if __name__ == "__main__":
    main()
