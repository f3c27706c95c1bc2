"""MkDocs hooks for the handbook (listed under ``hooks:`` in mkdocs.yml).

``on_pre_build`` draws the figures (the package tools/figures/, and the plots of chapter 21 and
project P1 with tools/plot_benchmarks.py) into ``<docs_dir>/figures/``
before any page is read, so that the pages' ``--8<-- "docs/figures/NAME.svg"``
includes find them. The figures are generated on every build and never committed.
"""

from __future__ import annotations

import importlib
import logging
import sys
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from tools import animations, figures  # noqa: E402

log = logging.getLogger("mkdocs.hooks.figures")


def _reload_figures() -> None:
    """Run the figure code afresh, so that ``mkdocs serve`` draws edits without a restart.

    Each module binds names from the modules it imports, so the order matters: the SVG
    library first, then the figure modules, and the package, which lists them, last.
    """
    prefix = f"{figures.__name__}."
    loaded = [m for name, m in list(sys.modules.items()) if name.startswith(prefix)]
    drawing = [m for m in loaded if m is not figures.svg and not hasattr(m, "__path__")]
    for module in [figures.svg, *drawing, figures]:
        importlib.reload(module)


def on_pre_build(config: MkDocsConfig, **kwargs: object) -> None:
    _reload_figures()
    out_dir = Path(config["docs_dir"]) / "figures"
    paths = figures.generate(out_dir)
    # chapter 21's and project P1's plots, from the measurements in docs/data (matplotlib)
    from tools import plot_benchmarks

    data_dir = Path(config["docs_dir"]) / "data"
    paths += [plot(data_dir, out_dir) for plot in plot_benchmarks.PLOTS.values()]
    log.info("figures: %d SVG files in %s", len(paths), out_dir)
    # the animations run the engine to record their frames: only those missing or stale
    recorded = animations.generate(Path(config["docs_dir"]) / "animations", only_stale=True)
    log.info("animations: %d recorded afresh", len(recorded))
