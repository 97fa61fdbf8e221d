"""Imports point down: server -> cluster -> storage, storage stays synchronous,
and cluster never imports server or a RESP library (issue 29).

Two independent checks: import-linter with the contracts in pyproject.toml,
and a direct one that imports every ``storage`` module in a fresh interpreter
and looks at ``sys.modules``. Both are shown to fail on a planted violation.
"""

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
FORBIDDEN_IN_STORAGE = ("trio", "hiredis", "redis", "server", "cluster")

_PROBE = textwrap.dedent("""
    import importlib, pkgutil, sys
    import storage
    for info in pkgutil.walk_packages(storage.__path__, "storage."):
        importlib.import_module(info.name)
    bad = sorted(m for m in sys.modules if m.split(".")[0] in {forbidden!r})
    print(",".join(bad))
""")


def storage_forbidden_imports(root: Path) -> list[str]:
    """Modules from FORBIDDEN_IN_STORAGE loaded by importing all of ``root/storage``."""
    env = dict(os.environ, PYTHONPATH=str(root))
    out = subprocess.run(
        [sys.executable, "-c", _PROBE.format(forbidden=set(FORBIDDEN_IN_STORAGE))],
        cwd=root, env=env, capture_output=True, text=True, check=True)
    line = out.stdout.strip()
    return line.split(",") if line else []


def run_lint_imports(cwd: Path, config: Path | None = None) -> subprocess.CompletedProcess:
    args = [str(LINT_IMPORTS)] + (["--config", str(config)] if config else [])
    env = dict(os.environ, PYTHONPATH=str(cwd))
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)


def test_import_linter_contracts_hold():
    result = run_lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: " in result.stdout and "broken" in result.stdout


def test_storage_imports_no_async_or_protocol_module():
    assert storage_forbidden_imports(ROOT) == []


def _planted_copy(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    shutil.copytree(ROOT / "storage", root / "storage",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (root / "storage" / "planted.py").write_text('"""A forbidden import."""\nimport trio  # noqa\n')
    return root


def test_direct_check_catches_a_planted_import(tmp_path):
    root = _planted_copy(tmp_path)
    assert "trio" in storage_forbidden_imports(root)


def test_import_linter_catches_a_planted_import(tmp_path):
    root = _planted_copy(tmp_path)
    config = root / ".importlinter"
    config.write_text(textwrap.dedent("""
        [importlinter]
        root_packages =
            storage
        include_external_packages = True

        [importlinter:contract:storage-sync]
        name = storage is synchronous and protocol-free
        type = forbidden
        source_modules =
            storage
        forbidden_modules =
            trio
            hiredis
    """))
    result = run_lint_imports(root, config)
    assert result.returncode != 0
    assert "storage.planted -> trio" in result.stdout
    (root / "storage" / "planted.py").unlink()
    assert run_lint_imports(root, config).returncode == 0


def test_import_linter_catches_cluster_importing_server(tmp_path):
    """The project's own contracts refuse a cluster module reaching into
    server/ (the cluster runtime reaches peers through injected links)."""
    root = tmp_path / "proj"
    for package in ("server", "cluster", "storage"):
        shutil.copytree(ROOT / package, root / package, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    assert run_lint_imports(root).returncode == 0
    (root / "cluster" / "planted.py").write_text('"""A forbidden import."""\nimport server.errors  # noqa\n')
    result = run_lint_imports(root)
    assert result.returncode != 0
    assert "cluster.planted -> server.errors" in result.stdout
