"""MkDocs hooks for the handbook (listed under ``hooks:`` in mkdocs.yml).

``on_pre_build`` draws the figures (tools/figures.py) into ``<docs_dir>/figures/``
before any page is read, so that the pages' ``--8<-- "docs/figures/NAME.svg"``
includes find them. The figures are generated on every build and never committed.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
from pathlib import Path
from types import ModuleType

log = logging.getLogger("mkdocs.hooks.figures")

REPO_ROOT = Path(__file__).resolve().parent.parent
FIGURES_PY = REPO_ROOT / "tools" / "figures.py"


def _load_figures() -> ModuleType:
    """Import tools/figures.py by its path, whatever the current directory and sys.path are.

    The module is executed afresh on every build, so that ``mkdocs serve`` picks up
    edits to the figures without a restart.
    """
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    name = "tools.figures"
    spec = importlib.util.spec_from_file_location(name, FIGURES_PY)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {FIGURES_PY}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def on_pre_build(config, **kwargs) -> None:
    figures = _load_figures()
    out_dir = Path(config["docs_dir"]) / "figures"
    paths = figures.generate(out_dir)
    log.info("figures: %d SVG files in %s", len(paths), out_dir)
