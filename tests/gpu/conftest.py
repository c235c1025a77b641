"""The GPU tests run in sessions with a time budget, which may end before pytest's summary: each
failure's traceback and each test's duration are written the moment the test ends."""

from __future__ import annotations

import sys

import pytest


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.failed:
        sys.stderr.write(f"\n{report.nodeid} failed in {report.when} after {report.duration:.1f} s:\n")
        sys.stderr.write(f"{report.longreprtext}\n\n")
    elif report.when == "call":
        sys.stderr.write(f"  ({report.duration:.1f} s)\n")
    sys.stderr.flush()
