"""A pytest plugin (``-p tests.support.stage_times``, as scripts/test runs it): where the suite's time went.

At the end of the run it prints the wall time per test folder (tests/unit, tests/integration, e2e) and the
slowest test files with their set-up and tear-down included, so a CI log says which stage grew.
"""

from __future__ import annotations

import time
from collections import defaultdict

import pytest

_spent: dict[str, float] = defaultdict(float)
_files: dict[str, float] = defaultdict(float)
_started = time.monotonic()
#: files listed after the folder totals
SLOWEST = 12


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = report.nodeid.split("::", 1)[0]
    parts = path.split("/")
    folder = "/".join(parts[:2]) if parts[0] == "tests" and len(parts) > 2 else parts[0]
    _spent[folder] += report.duration
    _files[path] += report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _spent:
        return
    write = terminalreporter.write_line
    terminalreporter.section("time per stage")
    for folder, seconds in sorted(_spent.items(), key=lambda kv: -kv[1]):
        write(f"{seconds:8.1f} s  {folder}")
    write(f"{time.monotonic() - _started:8.1f} s  pytest in all (collection included)")
    write("slowest files:")
    for path, seconds in sorted(_files.items(), key=lambda kv: -kv[1])[:SLOWEST]:
        write(f"{seconds:8.1f} s  {path}")
