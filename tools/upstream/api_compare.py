"""`api`: comparing two modules' APIs row by row (`compare_api`), the report over the chosen
modules (`api_report`) and its table (`format_api`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from tools.upstream.api_read import ApiItem, Level, module_api
from tools.upstream.choose import package_relative, select_files, where
from tools.upstream.git import UpstreamError
from tools.upstream.sides import OUR_PACKAGE, OurTree, Upstream

Status = Literal["match", "missing", "extra", "different"]
STATUSES: tuple[Status, ...] = ("match", "missing", "different", "extra")


@dataclass(frozen=True)
class ApiRow:
    module: str  # package-relative path
    name: str
    status: Status
    ours: ApiItem | None
    upstream: ApiItem | None

    @property
    def kind(self) -> str:
        return (self.upstream or self.ours).kind  # type: ignore[union-attr]


@dataclass
class ModuleApi:
    module: str
    side: Literal["both", "only ours", "only upstream"]
    rows: list[ApiRow] = field(default_factory=list)
    problem: str | None = None  # a module that cannot be parsed


def _merged_order(upstream_names: list[str], our_names: list[str]) -> list[str]:
    """Upstream's order, with each name of ours alone placed after the last one of its class."""
    order = list(upstream_names)
    known = set(order)
    for name in our_names:
        if name in known:
            continue
        owner = name.split(".", 1)[0]
        at = max((i for i, n in enumerate(order) if n.split(".", 1)[0] == owner), default=None)
        order.insert(len(order) if at is None else at + 1, name)
        known.add(name)
    return order


def compare_api(
    module: str, ours: Sequence[ApiItem], upstream: Sequence[ApiItem], level: Level = "shape"
) -> list[ApiRow]:
    mine = {i.name: i for i in ours}
    theirs = {i.name: i for i in upstream}
    rows: list[ApiRow] = []
    for name in _merged_order(list(theirs), list(mine)):
        a, b = mine.get(name), theirs.get(name)
        if a is None:
            status: Status = "missing"
        elif b is None:
            status = "extra"
        else:
            status = "match" if a.key(level) == b.key(level) else "different"
        rows.append(ApiRow(module, name, status, a, b))
    return rows


def _parse_side(data: bytes, label: str) -> tuple[list[ApiItem], str | None]:
    try:
        return module_api(data, label), None
    except (SyntaxError, ValueError) as e:
        return [], f"{label} cannot be parsed: {e}"


def api_report(
    ours: OurTree, upstream: Upstream, names: Sequence[str] = (), level: Level = "shape"
) -> list[ModuleApi]:
    everything = [*ours.files, *upstream.files]
    chosen = select_files(names, everything, where(ours, upstream))
    named_files = {package_relative(n) for n in names} & set(everything)
    not_python = sorted(f"{OUR_PACKAGE}/{p}" for p in named_files if not p.endswith(".py"))
    if not_python:
        raise UpstreamError(f"api reads Python modules only: {', '.join(not_python)}")
    report: list[ModuleApi] = []
    upstream_files = set(upstream.files)
    for rel in (p for p in chosen if p.endswith(".py")):
        in_ours, in_upstream = rel in ours.files, rel in upstream_files
        side = "both" if in_ours and in_upstream else "only ours" if in_ours else "only upstream"
        mine, mine_problem = _parse_side(ours.read(rel), f"ours {rel}") if in_ours else ([], None)
        theirs, their_problem = (
            _parse_side(upstream.read(rel), f"upstream {rel}") if in_upstream else ([], None)
        )
        problem = mine_problem or their_problem
        rows = [] if problem else compare_api(rel, mine, theirs, level)
        report.append(ModuleApi(rel, side, rows, problem))  # type: ignore[arg-type]
    return report


def count_statuses(report: Sequence[ModuleApi]) -> dict[str, int]:
    counts = {s: 0 for s in STATUSES}
    for module in report:
        for row in module.rows:
            counts[row.status] += 1
    return counts


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


LEVEL_NOTES: dict[str, str] = {
    "names": "names only",
    "shape": "kinds, parameter names/kinds/defaults, bases, field defaults (annotations not "
    "compared; --strict compares them)",
    "strict": "kinds, parameters with annotations, return annotations, bases, fields "
    "(typing spellings such as List[int] = list[int] count as equal)",
}


@dataclass(frozen=True)
class _Columns:
    status: int
    kind: int
    name: int

    def head(self, row: ApiRow) -> str:
        return f"  {row.status:<{self.status}}  {row.kind:<{self.kind}}  {row.name:<{self.name}}  "

    @property
    def indent(self) -> str:
        return " " * (2 + self.status + 2 + self.kind + 2 + self.name + 2)


def _row_lines(row: ApiRow, cols: _Columns) -> list[str]:
    """One line; two for 'different' (ours above upstream), the kinds shown when they differ."""
    if row.status != "different":
        item = row.upstream or row.ours
        assert item is not None
        return [(cols.head(row) + item.text).rstrip()]
    assert row.ours is not None and row.upstream is not None
    same_kind = row.ours.kind == row.upstream.kind
    ours, theirs = (
        (row.ours.text, row.upstream.text)
        if same_kind
        else (f"{row.ours.kind} {row.ours.text}", f"{row.upstream.kind} {row.upstream.text}")
    )
    return [
        f"{cols.head(row)}ours:     {ours}".rstrip(),
        f"{cols.indent}upstream: {theirs}".rstrip(),
    ]


def _module_lines(module: ModuleApi, cols: _Columns, hide_match: bool) -> list[str]:
    shown = [r for r in module.rows if not (hide_match and r.status == "match")]
    if hide_match and not shown and not module.problem:
        return []  # nothing to report but matches (or no API at all)
    side = "" if module.side == "both" else f"  ({module.side})"
    lines = [f"{OUR_PACKAGE}/{module.module}{side}"]
    if module.problem:
        lines.append(f"  {module.problem}")
    elif not module.rows:
        lines.append("  (no public classes or functions)")
    for row in shown:
        lines.extend(_row_lines(row, cols))
    return lines


def format_api(report: Sequence[ModuleApi], level: Level, hide_match: bool = False) -> str:
    rows = [r for m in report for r in m.rows]
    cols = _Columns(
        status=max(len(s) for s in STATUSES),
        kind=max([len(r.kind) for r in rows] + [4]),
        name=min(max([len(r.name) for r in rows] + [4]), 48),
    )
    out = [line for module in report for line in _module_lines(module, cols, hide_match)]
    counts = count_statuses(report)
    sides = {
        s: sum(1 for m in report if m.side == s) for s in ("both", "only upstream", "only ours")
    }
    unparsed = sum(1 for m in report if m.problem)
    out.append(
        "summary: "
        + ", ".join(f"{counts[s]} {s}" for s in STATUSES)
        + f" in {_plural(len(report), 'module')} ({sides['both']} on both sides, "
        f"{sides['only upstream']} only upstream, {sides['only ours']} only ours"
        + (f", {unparsed} not parsed" if unparsed else "")
        + ")"
    )
    out.append(f"compared: {LEVEL_NOTES[level]}")
    return "\n".join(out) + "\n"
