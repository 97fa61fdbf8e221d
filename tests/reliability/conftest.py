"""The fault tests' totals (kills survived, entries checked) in the session summary."""

from __future__ import annotations

import sys


def pytest_terminal_summary(terminalreporter) -> None:
    lines = []
    for name in ("tests.reliability.test_crash", "tests.reliability.test_replication_faults",
                 "tests.reliability.test_controller_faults"):
        module = sys.modules.get(name)
        lines += getattr(module, "RESULTS", [])
    if lines:
        terminalreporter.section("fault test totals")
        for line in lines:
            terminalreporter.write_line(line)
