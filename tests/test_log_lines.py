"""Log lines are written for operators: no Python reprs in them (issue 34).

A ``%r`` (or ``!r``) in a log call's format prints ``b'orders'`` or
``('orders', 3)`` where an operator expects ``orders`` or ``orders#3``. This
reads every log call of the product's packages and refuses such a format.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("server", "cluster", "storage")
LOG_METHODS = {"debug", "info", "warning", "error", "exception", "critical"}


def repr_formats(source: str, filename: str) -> list[str]:
    """``file:line`` of each log call whose format string asks for a repr."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in LOG_METHODS and isinstance(node.func.value, ast.Name)
                and "log" in node.func.value.id.lower() and node.args):
            continue
        fmt = node.args[0]
        texts = [fmt.value] if isinstance(fmt, ast.Constant) and isinstance(fmt.value, str) else []
        if isinstance(fmt, ast.JoinedStr):
            texts = [v.value for v in fmt.values if isinstance(v, ast.Constant)]
            if any(isinstance(v, ast.FormattedValue) and v.conversion == ord("r") for v in fmt.values):
                texts.append("%r")
        if any("%r" in text for text in texts):
            found.append(f"{filename}:{node.lineno}")
    return found


def test_no_log_call_prints_a_python_repr():
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found += repr_formats(path.read_text(), str(path.relative_to(ROOT)))
    assert found == []


def test_the_check_sees_a_repr_in_a_format_or_an_f_string():
    source = 'log.info("topic %r gone", t)\nlogger.warning(f"key {k!r}")\nlog.info("topic %s", t)\n'
    assert repr_formats(source, "planted.py") == ["planted.py:1", "planted.py:2"]
