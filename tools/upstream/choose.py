"""Choosing files: the package-relative path a FILE argument names, and the files that a list
of FILE arguments selects."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tools.upstream.git import UpstreamError
from tools.upstream.sides import OUR_PACKAGE, UPSTREAM_PACKAGE, OurTree, Upstream


def package_relative(name: str) -> str:
    """``minisgl/core.py``, ``python/minisgl/core.py``, ``./core.py`` -> ``core.py``."""
    rel = name.replace("\\", "/").strip()
    while rel.startswith("./"):
        rel = rel[2:]
    for prefix in (f"{UPSTREAM_PACKAGE}/", f"{OUR_PACKAGE}/"):
        if rel.startswith(prefix):
            rel = rel[len(prefix) :]
            break
    else:
        if rel in (UPSTREAM_PACKAGE, OUR_PACKAGE):
            rel = ""
    return rel.strip("/")


def select_files(names: Sequence[str], available: Iterable[str], where: str) -> list[str]:
    """The files that `names` mean (all when empty); a name that matches nothing is an error."""
    pool = sorted(set(available))
    if not names:
        return pool
    chosen: list[str] = []
    unknown: list[str] = []
    for name in names:
        rel = package_relative(name)
        if rel in pool:
            hits = [rel]
        else:
            hits = [p for p in pool if not rel or p.startswith(rel + "/")]
        if not hits:
            unknown.append(f"{OUR_PACKAGE}/{rel}")
        chosen.extend(h for h in hits if h not in chosen)
    if unknown:
        raise UpstreamError(f"{', '.join(unknown)}: found neither in {where}")
    return chosen


def where(ours: OurTree, upstream: Upstream) -> str:
    return f"ours ({ours.label}) nor in upstream ({UPSTREAM_PACKAGE}/ at {upstream.commit[:12]})"
