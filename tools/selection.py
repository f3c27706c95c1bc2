"""Which carried-forward tests a chapter reruns, from what each one ran where it last ran.

BOOK.md, rule 6: a carried-forward test may skip a later chapter whose tree cannot change its
result. `tools/steps.py check` records, in every chapter it tests, which functions of the
package each test ran (tools/guard/book_record.py), in pytest's process and in every worker it
started. In a later chapter of the same check, a test reruns if, since the chapter where it last
ran, the tree changed (tools/changes.py):

* the body of a function it ran,
* what a name means that its code reads: the package's functions it ran, and, in its test
  file and the files outside the package that it imports, the code the test can reach from
  its own name (tools/outside.py),
* something a module it can import does at import time,
* or whether a name its files import, which the package had there, is gone;

or if it did not pass there. A test file whose collection ran something that changed reruns
whole, since it might now hold other tests. A chapter's own test files always run whole, and
so does every test of a chapter checked without the chapter before it.
"""

from __future__ import annotations

import json
import math
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Set, Tuple

from tools.book import Book, Manifest, chapter_name
from tools.changes import ModuleSummary, TreeChange, shared_summary, tree_change
from tools.deps import ImportGraph, module_name
from tools.outside import OutsideFile, OutsideReads, missing_imports, read_outside, top_level_names

Function = Tuple[str, str]  # (package file, top-level qualname)


@dataclass
class TestRecord:
    chapter: int  # where it last ran
    outcome: str  # "passed", "failed" or "skipped"
    ran: Set[Function]
    collect: Set[Function]  # what ran while its file was collected (and before)
    seconds: float = 0.0  # how long it took there


def _read_workers(folder: Path) -> List[Tuple[float, float, Set[Function]]]:
    """(start, end, functions) of every worker process of the run. A worker killed outright
    writes no end; pytest's process writes it for each one it finds gone after a test
    (tools/guard/book_record_plugin.py); one it never saw gone counts as alive until the end
    of the run."""
    workers = []
    for path in sorted(folder.glob("*.hits")):
        start, end, ran = math.inf, math.inf, set()
        for line in path.read_text(errors="replace").splitlines():
            kind, _, rest = line.partition(" ")
            if kind == "S":
                start = min(start, float(rest))
            elif kind == "E":
                end = float(rest)
            elif kind == "H" and "\t" in rest:
                file, qualname = rest.split("\t", 1)
                ran.add((file, qualname))
        if ran:
            workers.append((start, end, ran))
    return workers


def read_records(folder: Path, chapter: int) -> Dict[str, TestRecord]:
    """The records that one chapter's test run left in `folder` (empty if it wrote none)."""
    path = folder / "tests.json"
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    collect = {tuple(f) for f in data["collect"]}
    fixtures = {k: {tuple(f) for f in v} for k, v in data["fixtures"].items()}
    workers = _read_workers(folder)
    records = {}
    for nodeid, entry in data["tests"].items():
        ran: Set[Function] = {tuple(f) for f in entry["ran"]}  # type: ignore[misc]
        for key in entry["fixtures"]:
            ran |= fixtures.get(key, set())
        for start, end, functions in workers:
            if start <= entry["end"] and end >= entry["start"]:
                ran |= functions
        seconds = entry["end"] - entry["start"]
        records[nodeid] = TestRecord(chapter, entry["outcome"], ran, collect, seconds)  # type: ignore[arg-type]
    return records


@dataclass
class Selection:
    """What a chapter runs: whole test files, and single tests of the others."""

    whole: List[str] = field(default_factory=list)
    tests: List[str] = field(default_factory=list)  # pytest node ids
    not_rerun: Dict[str, int] = field(default_factory=dict)  # test file -> tests it skipped
    reasons: Dict[str, List[str]] = field(default_factory=dict)  # node id -> why it reruns
    predicted: Set[str] = field(default_factory=set)  # package files the run may import

    @property
    def arguments(self) -> List[str]:
        return [*self.whole, *self.tests]

    @property
    def files_run(self) -> int:
        return len(self.whole) + len({t.split("::")[0] for t in self.tests})

    def groups(self, seconds: Callable[[str], float], n: int) -> List[List[str]]:
        """The arguments in at most `n` groups of whole test files, of about the same expected
        time (`seconds` of an argument): the longest file first, each to the lightest group."""
        by_file: Dict[str, List[str]] = {}
        for argument in self.arguments:
            by_file.setdefault(argument.split("::")[0], []).append(argument)
        cost = {f: sum(seconds(a) for a in args) for f, args in by_file.items()}
        groups: List[List[str]] = [[] for _ in range(min(n, len(by_file)))]
        load = [0.0] * len(groups)
        for file in sorted(by_file, key=lambda f: -cost[f]):
            i = load.index(min(load))
            groups[i] += by_file[file]
            load[i] += cost[file]
        return [g for g in groups if g]

    def unpredicted(self, loaded: Iterable[Path]) -> List[str]:
        """A package file the tests' processes loaded (listed in the folders `loaded`) that the
        static reading of their imports (tools/deps.py) did not predict: that reading missed
        an import."""
        seen: Set[str] = set()
        for record in [r for folder in loaded for r in folder.glob("*.txt")]:
            seen.update(line for line in record.read_text().splitlines() if line)
        missed = sorted(seen - self.predicted)
        if not missed:
            return []
        return [
            f"the tests loaded {', '.join(missed)}, which tools/deps.py did not count among "
            f"their dependencies: a change there would not be seen"
        ]


class Selector:
    """Keeps the records of one check and chooses each chapter's tests from them."""

    def __init__(self, book: Book) -> None:
        self.book = book
        self.lock = threading.RLock()  # held by the check's workers while they read or add records
        self.records: Dict[str, TestRecord] = {}  # node id -> its last record
        self.nodes: Dict[str, List[str]] = {}  # test file -> its node ids, as last collected
        self._changes: Dict[Tuple[int, int], TreeChange] = {}
        self._texts: Dict[int, Dict[str, str]] = {}  # chapter -> its package's sources
        self._summaries: Dict[Tuple[int, str], Optional[ModuleSummary]] = {}
        self._outside_files: Dict[str, OutsideFile] = {}
        self._bound: Dict[int, Dict[str, Set[str]]] = {}
        # the outside files of a test file's closure -> their reader; and (those files, the
        # test file, a test's function or class) -> what that test reads in them
        self._outside_reads: Dict[Tuple[str, ...], OutsideReads] = {}
        self._test_reads: Dict[Tuple[Tuple[str, ...], str, str], Set[str]] = {}
        self._missing_imports: Dict[Tuple[Tuple[str, ...], int], List[str]] = {}

    # ----------------------------------------------------------------- records
    def remember(self, folder: Path, chapter: int) -> None:
        records = read_records(folder, chapter)
        by_file: Dict[str, List[str]] = {}
        for nodeid in records:
            by_file.setdefault(nodeid.split("::")[0], []).append(nodeid)
        for file, ran in by_file.items():
            known = self.nodes.get(file, [])
            if set(ran) <= set(known):  # some of its tests reran: the file still holds the others
                ran = known
            self.nodes[file] = ran
        self.records.update(records)

    def seconds(self, argument: str) -> float:
        """How long a pytest argument (a node id, or a whole file) took when it last ran; a
        guess for what never ran."""
        with self.lock:
            return self._seconds(argument)

    def _seconds(self, argument: str) -> float:
        if "::" in argument:
            record = self.records.get(argument)
            return record.seconds if record is not None else 1.0
        nodes = self.nodes.get(argument)
        return sum(self.records[n].seconds for n in nodes if n in self.records) if nodes else 10.0

    # ----------------------------------------------------------------- changes
    def _sources(self, chapter: int) -> Dict[str, str]:
        if chapter not in self._texts:
            self._texts[chapter] = {
                p: f.read_text(errors="replace")
                for p, f in self.book.package_files(chapter).items()
            }
        return self._texts[chapter]

    def change(self, before: int, after: int) -> TreeChange:
        key = (before, after)
        if key not in self._changes:
            self._changes[key] = tree_change(self._sources(before), self._sources(after))
        return self._changes[key]

    def _summary(self, chapter: int, file: str) -> Optional[ModuleSummary]:
        key = (chapter, file)
        if key not in self._summaries:
            source = self._sources(chapter).get(file)
            self._summaries[key] = (
                shared_summary(source, file)
                if source is not None and file.endswith(".py")
                else None
            )
        return self._summaries[key]

    def _reads(self, record: TestRecord, outside: Set[str]) -> Set[str]:
        reads = set(outside)
        for file, qualname in record.ran | record.collect:
            summary = self._summary(record.chapter, file)
            function = summary.functions.get(qualname) if summary is not None else None
            if function is not None:
                reads |= function.reads
        return reads

    def _outside(self, tree: Path, files: Iterable[str]) -> Dict[str, OutsideFile]:
        """The non-package files a test file brings in (its own code, conftest, tests/support,
        tools/...), read for what each of their parts reads (tools/outside.py): their
        functions are not recorded. They are the same text in every chapter that has them."""
        found = {}
        for rel in files:
            if rel not in self._outside_files:
                try:
                    self._outside_files[rel] = read_outside((tree / rel).read_text(), rel)
                except (OSError, SyntaxError):
                    self._outside_files[rel] = OutsideFile()
            found[rel] = self._outside_files[rel]
        return found

    def _package_names(self, chapter: int) -> Dict[str, Set[str]]:
        """Each module of chapter `chapter`'s package (dotted) -> the names it binds."""
        if chapter not in self._bound:
            self._bound[chapter] = {
                module_name(rel) or rel: top_level_names(path.read_text(errors="replace"))
                for rel, path in self.book.package_files(chapter).items()
                if rel.endswith(".py")
            }
        return self._bound[chapter]

    def _missing(self, outside: Dict[str, OutsideFile], chapter: int) -> List[str]:
        """The imports of the `outside` files that chapter `chapter`'s package lacks. Only one
        that a test's last chapter still had can change its result: a tool that imports a
        module of a later chapter (tools/split_k.py) is missing in every chapter before it."""
        key = (tuple(sorted(outside)), chapter)
        if key not in self._missing_imports:
            self._missing_imports[key] = missing_imports(
                outside, self.book.package, self._package_names(chapter)
            )
        return self._missing_imports[key]

    # ----------------------------------------------------------------- choosing
    def select(
        self, chapter: Manifest, tree: Path, test_files: List[str], everything: bool
    ) -> Selection:
        """The tests chapter `chapter` runs (every one of them when `everything`)."""
        graph = ImportGraph(tree, self.book.package)
        shared = ["tests/conftest.py", *(f for f in graph.files if f.startswith("tests/support/"))]
        selection = Selection()
        for test_file in test_files:
            closure = graph.closure([test_file, *shared])
            package = {f for f in closure if f.startswith(self.book.package + "/")}
            nodes = self.nodes.get(test_file, [])
            if everything or test_file in chapter.tests or not nodes:
                selection.whole.append(test_file)
                selection.predicted |= package
                continue
            outside = self._outside(
                tree, sorted(f for f in closure if f.endswith(".py") and f not in package)
            )
            missing = self._missing(outside, chapter.number)
            key = tuple(sorted(outside))
            if key not in self._outside_reads:
                self._outside_reads[key] = OutsideReads(outside)
            rerun = {}
            for nodeid in nodes:
                record = self.records[nodeid]
                if record.outcome != "passed":
                    rerun[nodeid] = [f"it {record.outcome} in {chapter_name(record.chapter)}"]
                    continue
                name = nodeid.split("::")[1].split("[")[0]  # its function or class
                if (key, test_file, name) not in self._test_reads:
                    found = self._outside_reads[key].of(test_file, name)
                    self._test_reads[key, test_file, name] = found
                change = self.change(record.chapter, chapter.number)
                gone = [m for m in missing if m not in self._missing(outside, record.chapter)]
                why = gone + change.reasons(
                    record.ran | record.collect,
                    self._reads(record, self._test_reads[key, test_file, name]),
                    package,
                )
                if why:
                    rerun[nodeid] = why
            collect_changed = any(
                self.change(self.records[n].chapter, chapter.number).reasons(
                    self.records[n].collect, set(), set()
                )
                for n in nodes[:1]
            )
            if collect_changed or len(rerun) == len(nodes):
                selection.whole.append(test_file)
            else:
                selection.tests.extend(n for n in nodes if n in rerun)
                if len(rerun) < len(nodes):
                    selection.not_rerun[test_file] = len(nodes) - len(rerun)
            if rerun:
                selection.predicted |= package
            selection.reasons.update(rerun)
        return selection
