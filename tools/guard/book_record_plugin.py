"""pytest's side of the record (tools/guard/book_record.py): what each test ran.

Loaded by `tools/steps.py` with ``-p book_record_plugin`` when it records a chapter's tests.
At the end of the session it writes ``tests.json`` in the record folder: for each test, its
outcome, the moments it started and ended (to match the workers that ran meanwhile), and the
functions it ran, counting those that its module- and session-scoped fixtures ran when they were
set up, and those that ran while the test files were collected.

A worker killed outright (SIGKILL) writes no end in its ``.hits`` file, and would count as alive
until the end of the run: what it ran would count for every later test, which would then rerun
for nothing in the chapters after. So after each test the plugin writes the end of every worker
that is gone by then.
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
_ended: Set[str] = set()  # the .hits files known to hold their end
_PROC = os.path.exists("/proc/self/stat")  # Linux: a killed, unreaped child is a zombie there


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
        _end_the_dead_workers()


def _alive(pid: int) -> bool:
    if _PROC:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            return False
        return state not in (b"Z", b"X")  # a zombie runs nothing any more
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _end_the_dead_workers() -> None:
    """Write an end, now, in the .hits file of every worker that is gone without one. Now is
    after the test's end and before the next test's start: the worker counts for the tests it
    lived through, never for a later one."""
    folder = os.environ.get("MINISGL_BOOK_RECORD")
    if not folder:
        return
    for name in os.listdir(folder):
        if not name.endswith(".hits") or name in _ended:
            continue
        path = os.path.join(folder, name)
        with open(path, "rb") as f:
            lines = f.read().splitlines()
        if any(line.startswith(b"E ") for line in lines):
            _ended.add(name)
        elif not _alive(int(name.removesuffix(".hits"))):
            with open(path, "a") as f:
                f.write(f"E {time.monotonic():.6f}\n")
            _ended.add(name)


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
