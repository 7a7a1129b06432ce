"""A pytest plugin that writes one JSON line per test: its outcome and, on failure, why.

Loaded by ``compat/zephon_suite.py`` (``-p zc_outcomes``) for both runs it compares: Zephon's
test suite on Zephon 0.2.0 itself and on zephon_columnar through the import alias. The file is
named by ``ZC_OUTCOMES`` in the environment.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

_results: dict[str, dict[str, Any]] = {}


def _failure(report: pytest.TestReport | pytest.CollectReport) -> dict[str, Any]:
    text = str(report.longrepr) if report.longrepr is not None else ""
    crash = getattr(report.longrepr, "reprcrash", None)  # pytest's ReprFileLocation, when it has one
    lines = [line for line in text.splitlines() if line.strip()]
    message = crash.message if crash is not None else (lines[-1] if lines else "")
    return {
        "error": message.strip()[:400],
        "private": "PrivateInternalUsed" in text or "zephon._internal" in text,
    }


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    entry = _results.get(report.nodeid)
    if entry is None:
        entry = _results[report.nodeid] = {"test": report.nodeid, "outcome": "passed", "seconds": 0.0}
    entry["seconds"] = round(entry["seconds"] + report.duration, 3)
    if report.failed and entry["outcome"] in ("passed", "skipped"):
        entry["outcome"] = "error" if report.when != "call" else "failed"
        if hasattr(report, "wasxfail"):
            entry["outcome"] = "xpassed"
        entry.update(_failure(report))
    elif report.skipped and entry["outcome"] == "passed":
        entry["outcome"] = "xfailed" if hasattr(report, "wasxfail") else "skipped"


def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    """Name the running test beside the outcomes: if the process dies, the harness knows which."""
    path = os.environ.get("ZC_OUTCOMES")
    if path:
        with open(f"{path}.current", "w", encoding="utf-8") as out:
            out.write(nodeid)


def pytest_runtest_logfinish(nodeid: str, location: tuple[str, int | None, str]) -> None:
    _write(_results.pop(nodeid))


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        _write({"test": report.nodeid, "outcome": "collection-error", "seconds": 0.0, **_failure(report)})


def _write(entry: dict[str, Any]) -> None:
    """Each test's line is written when it finishes, so a run that crashes keeps what it did."""
    path = os.environ.get("ZC_OUTCOMES")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(entry) + "\n")
