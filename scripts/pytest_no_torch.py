"""pytest plugin of `make test-py312`: a test that stops at ``import torch`` is skipped, with the reason.

The Python 3.12 venv of `make test-py312` has no torch (PyPI's Linux torch for 3.12 is the CUDA build,
2.6 GB with the nvidia wheels it cannot import without). scripts/torch_free_tests.py leaves out the
modules that import torch at the top; this skips the tests that reach it later (a fixture that builds
a model, a command that loads the trainer). Any other error still fails, and the 3.11 suite runs all.
"""

from __future__ import annotations

import pytest

REASON = "needs torch, which the Python 3.12 venv of `make test-py312` does not have"


def _torch_missing(excinfo: pytest.ExceptionInfo[BaseException] | None) -> bool:
    if excinfo is None or not excinfo.errisinstance(ModuleNotFoundError):
        return False
    return (getattr(excinfo.value, "name", None) or "").partition(".")[0] == "torch"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> pytest.TestReport:
    report = yield
    if report.failed and _torch_missing(call.excinfo):
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0, f"Skipped: {REASON}")
    return report
