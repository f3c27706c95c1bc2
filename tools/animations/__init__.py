"""The handbook's animations: frames recorded from real runs of the chapters' code.

An animation is a list of frames, each an SVG picture and one line of narration (the
subtitle). A recorder runs the engine with a few of its methods wrapped, snapshots the real
objects after each event, and draws each snapshot with the figures' SVG library: nothing in a
frame is drawn by hand. ``python -m tools.animations [NAME ...]`` writes
``docs/animations/NAME.json``; ``mkdocs build`` writes those that are missing or older than
their sources. A page shows one with ``<!-- animation: NAME -->``, which
``tools/book_hooks.py`` turns into the player of ``docs/javascripts/animation.js``.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "docs" / "animations"


@dataclass
class Frame:
    svg: str
    narration: str


@dataclass
class Animation:
    name: str
    title: str  # what it shows, for the player's label
    frames: List[Frame] = field(default_factory=list)
    seconds_per_frame: float = 3.0

    def add(self, svg: str, narration: str) -> None:
        self.frames.append(Frame(svg, narration))

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))


@dataclass(frozen=True)
class Recorder:
    record: Callable[[], Animation]
    sources: List[str]  # files whose change makes the recorded frames stale (repo-relative)


def _recorders() -> Dict[str, Recorder]:
    """Every module of this package except the command line is one animation: its NAME, its
    record() and the SOURCES whose change makes its frames stale."""
    found = {}
    for info in sorted(pkgutil.iter_modules([str(Path(__file__).parent)]), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        found[module.NAME] = Recorder(module.record, module.SOURCES)
    return found


def names() -> List[str]:
    return list(_recorders())


def stale(name: str, out_dir: Path = DEFAULT_OUT) -> bool:
    target = out_dir / f"{name}.json"
    if not target.exists():
        return True
    sources = [ROOT / s for s in _recorders()[name].sources]
    return any(s.stat().st_mtime > target.stat().st_mtime for s in sources)


def generate(
    out_dir: Path = DEFAULT_OUT, wanted: Optional[Iterable[str]] = None, only_stale: bool = False
) -> List[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, recorder in _recorders().items():
        if wanted is not None and name not in wanted:
            continue
        if only_stale and not stale(name, out_dir):
            continue
        animation = recorder.record()
        target = out_dir / f"{name}.json"
        target.write_text(animation.to_json())
        written.append(target)
    return written
