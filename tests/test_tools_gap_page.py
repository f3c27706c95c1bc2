"""Chapter 22's page names, in code spans, every place its main resolves in the package (and
the main fails if one is gone): the map on the page and the code cannot drift apart."""

from __future__ import annotations

import re
from pathlib import Path

from tools.parity import load_example

ROOT = Path(__file__).resolve().parents[1]


def test_the_page_names_every_plug_point_of_the_main() -> None:
    page = (ROOT / "docs" / "chapters" / "ch22-gap.md").read_text()
    spans = re.findall(r"`([^`\n]+)`", page)
    gap = load_example("examples/ch22_gap.py")
    missing = [
        name
        for _, names in gap.PLUG_POINTS
        for name in names
        if not any(re.search(rf"\b{re.escape(name.split('.')[-1])}\b", s) for s in spans)
    ]
    assert not missing, f"the page does not name {missing}"
