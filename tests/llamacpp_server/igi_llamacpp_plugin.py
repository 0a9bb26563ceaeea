"""pytest plugin loaded (``-p igi_llamacpp_plugin``) into llama.cpp's own server test run.

- Their ``utils.py`` imports ``wget`` and their ``conftest.py`` ``filelock``, both only to fetch
  models from the Hugging Face hub: stand-ins here (the sidecar serves its default model and
  nothing is downloaded).
- Their session fixture starts every preset server once to fill the model cache: a no-op here.
- Tests the expectations file marks ``skip`` are skipped with its reason, so they start no server.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import types
from pathlib import Path

import pytest


def _no_download(url: str, out: str | None = None) -> str:
    raise RuntimeError(f"no downloads in this run ({url})")


class _FileLock:  # one pytest process: nothing to serialise
    def __init__(self, path: str) -> None:
        self.path = path

    def __enter__(self) -> _FileLock:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def _stub_modules() -> None:
    for name, attr, value in (("wget", "download", _no_download),
                              ("filelock", "FileLock", _FileLock)):
        if importlib.util.find_spec(name) is None:
            mod = types.ModuleType(name)
            setattr(mod, attr, value)
            sys.modules[name] = mod


_stub_modules()


def pytest_sessionstart(session: pytest.Session) -> None:
    import utils  # theirs: importable once their conftest (beside it) is loaded

    utils.ServerPreset.load_all = staticmethod(lambda: None)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """One JSON line per test as it ends (a run cut short still says what it ran)."""
    path = os.environ.get("IGI_LLAMACPP_RESULTS")
    if not path:
        return
    failed_setup = report.when == "setup" and not report.passed
    if report.when != "call" and not failed_setup and not (report.when == "teardown"
                                                           and report.failed):
        return
    outcome = "failed" if report.failed else "skipped" if report.skipped else "passed"
    text = str(report.longrepr) if report.longrepr is not None else ""
    if report.skipped and isinstance(report.longrepr, tuple):
        text = str(report.longrepr[2])
    where = [ln[1:].strip() for ln in text.splitlines() if ln.startswith(">")]
    message = next((ln[1:].strip() for ln in text.splitlines() if ln.startswith("E ")), text)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps({"nodeid": report.nodeid, "when": report.when, "outcome": outcome,
                            "message": message[:500], "where": where,
                            "seconds": round(report.duration, 2)}) + "\n")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from expectations import load, match  # beside this file

    path = os.environ.get("IGI_LLAMACPP_EXPECTED")
    if not path:
        return
    expected = load(Path(path))
    for item in items:
        exp = match(expected, item.nodeid)
        if exp is not None and exp.outcome == "skip":
            item.add_marker(pytest.mark.skip(reason=exp.reason))
