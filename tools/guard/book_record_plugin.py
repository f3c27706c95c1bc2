"""pytest's side of the record (tools/guard/book_record.py): what each test ran.

Loaded by `tools/steps.py` with ``-p book_record_plugin`` when it records a chapter's tests.
At the end of the session it writes ``tests.json`` in the record folder: for each test, its
outcome, the moments it started and ended (to match the workers that ran meanwhile), and the
functions it ran, counting those that its module- and session-scoped fixtures ran when they were
set up, and those that ran while the test files were collected.
"""

from __future__ import annotations

import json
import os
import time
from typing import Dict, List, Set

import book_record as record
import pytest

_collect: Set[int] = set()  # what ran before the first test (collection, conftest)
_fixtures: Dict[str, Set[int]] = {}  # "<baseid>::<name>" -> what its set-up ran
_tests: Dict[str, Dict] = {}


def pytest_configure(config: pytest.Config) -> None:
    record.as_pytest_process()
    record.swap(_collect)


def _fixture_key(fixturedef: pytest.FixtureDef) -> str:
    return f"{fixturedef.baseid}::{fixturedef.argname}"


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef, request: pytest.FixtureRequest):
    if fixturedef.scope == "function":
        yield
        return
    before = record.swap(_fixtures.setdefault(_fixture_key(fixturedef), set()))
    try:
        yield
    finally:
        record.swap(before)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    ran: Set[int] = set()
    entry: Dict = {"outcome": "passed", "start": time.monotonic()}
    _tests[item.nodeid] = entry
    before = record.swap(ran)
    try:
        yield
    finally:
        record.swap(before)
        entry["end"] = time.monotonic()
        fixtures = []
        for name in item.fixturenames:  # type: ignore[attr-defined]
            defs = item._fixtureinfo.name2fixturedefs.get(name)  # type: ignore[attr-defined]
            if defs and defs[-1].scope != "function":
                fixtures.append(_fixture_key(defs[-1]))
        entry["ran"], entry["fixtures"] = ran, fixtures


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    entry = _tests.get(report.nodeid)
    if entry is None:
        return
    if report.failed:
        entry["outcome"] = "failed"
    elif report.skipped and entry["outcome"] != "failed":
        entry["outcome"] = "skipped"


def pytest_sessionfinish(session: pytest.Session) -> None:
    folder = os.environ.get("MINISGL_BOOK_RECORD")
    if not folder:
        return
    table = record.table()

    def named(ids: Set[int]) -> List[List[str]]:
        return sorted([*table[i]] for i in ids)

    out = {
        "collect": named(_collect),
        "fixtures": {key: named(ids) for key, ids in _fixtures.items()},
        "tests": {
            nodeid: {
                "outcome": e["outcome"],
                "start": e["start"],
                "end": e.get("end", e["start"]),
                "ran": named(e.get("ran", set())),
                "fixtures": e.get("fixtures", []),
            }
            for nodeid, e in _tests.items()
        },
    }
    with open(os.path.join(folder, "tests.json"), "w") as f:
        json.dump(out, f)
