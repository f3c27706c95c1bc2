"""`diff`: a unified diff per file, upstream (old) -> ours (new), and its summary lines."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from tools.upstream.choose import select_files, where
from tools.upstream.sides import OUR_PACKAGE, UPSTREAM_PACKAGE, OurTree, Upstream


@dataclass(frozen=True)
class FileDiff:
    path: str  # package-relative
    status: Literal["differ", "identical", "only ours", "only upstream"]
    lines: tuple[str, ...] = ()  # the unified diff, without line ends
    added: int = 0
    removed: int = 0


def _text(data: bytes) -> list[str] | None:
    try:
        return data.decode("utf-8").splitlines()
    except UnicodeDecodeError:
        return None


def diff_file(rel: str, ours: OurTree, upstream: Upstream, context: int = 3) -> FileDiff:
    in_ours, in_upstream = rel in ours.files, rel in upstream.files
    if not in_upstream:
        return FileDiff(rel, "only ours")
    if not in_ours:
        return FileDiff(rel, "only upstream")
    theirs_bytes, ours_bytes = upstream.read(rel), ours.read(rel)
    if theirs_bytes == ours_bytes:
        return FileDiff(rel, "identical")
    before, after = _text(theirs_bytes), _text(ours_bytes)
    old_name, new_name = f"upstream/{UPSTREAM_PACKAGE}/{rel}", f"{OUR_PACKAGE}/{rel}"
    if before is None or after is None:
        return FileDiff(rel, "differ", (f"Binary files {old_name} and {new_name} differ",))
    lines = tuple(
        difflib.unified_diff(
            before,
            after,
            old_name,
            new_name,
            fromfiledate=upstream.commit[:12],
            tofiledate=ours.tag,
            n=context,
            lineterm="",
        )
    )
    body = lines[2:]
    added = sum(1 for line in body if line.startswith("+"))
    removed = sum(1 for line in body if line.startswith("-"))
    if not lines:  # same lines, different line ends or a final newline
        lines = (f"{new_name}: differs from upstream only in line endings",)
    return FileDiff(rel, "differ", lines, added, removed)


def diff_report(
    ours: OurTree, upstream: Upstream, names: Sequence[str] = (), context: int = 3
) -> list[FileDiff]:
    paths = select_files(names, [*ours.files, *upstream.files], where(ours, upstream))
    return [diff_file(rel, ours, upstream, context) for rel in paths]


def format_diff(report: Sequence[FileDiff], ours: OurTree, upstream: Upstream, stat: bool) -> str:
    out: list[str] = []
    if not stat:
        for item in report:
            out.extend(item.lines)
    for status in ("differ", "only ours", "only upstream", "identical"):
        for item in report:
            if item.status == status:
                counts = f" (+{item.added} -{item.removed})" if status == "differ" else ""
                out.append(f"{status}: {OUR_PACKAGE}/{item.path}{counts}")
    counts = {
        s: sum(1 for i in report if i.status == s)
        for s in ("differ", "identical", "only ours", "only upstream")
    }
    out.append(
        f"summary: {counts['differ']} differ, {counts['identical']} identical, "
        f"{counts['only ours']} only ours, {counts['only upstream']} only upstream "
        f"(ours: {ours.label}; upstream: {UPSTREAM_PACKAGE}/ at {upstream.commit[:12]})"
    )
    return "\n".join(out) + "\n"
