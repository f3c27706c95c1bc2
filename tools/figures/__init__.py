"""The handbook's figures, drawn as SVG with the standard library only.

Each figure is one function that returns the text of an SVG document, drawn with the
``Svg`` builder of ``svg.py``. The book-wide figures are in modules named for what they
show (``processes.py``, ``scheduling.py``, ...), a chapter's figures in ``chapters/chNN.py``.
``FIGURES`` names them all; ``generate(out_dir)`` writes each to ``out_dir/<name>.svg``.
``tools/mkdocs_hooks.py`` calls ``generate`` before every ``mkdocs build``, so the figures
are never committed. ``python -m tools.figures`` writes them to ``docs/figures/``
(optionally to another folder, or only the figures it names).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from tools.figures import module_map, processes, request_life, scheduling, step0
from tools.figures.chapters import (
    ch01,
    ch02,
    ch03,
    ch04,
    ch05,
    ch06,
    ch07,
    ch08,
    ch09,
    ch10,
    ch11,
    ch12,
    ch14,
    ch15,
    ch16,
    ch17,
    ch18,
    ch19,
)

DEFAULT_OUT = Path(__file__).resolve().parents[2] / "docs" / "figures"

FIGURES: dict[str, Callable[[], str]] = {
    "step0-loop": step0.fig_step0_loop,
    "processes": processes.fig_processes,
    "request-life": request_life.fig_request_life,
    "batching": scheduling.fig_batching,
    "overlap": scheduling.fig_overlap,
    "module-map": module_map.fig_module_map,
    "ch01-req-lengths": ch01.fig_req_lengths,
    "ch02-residual": ch02.fig_residual_stream,
    "ch02-llama3-rope": ch02.fig_llama3_rope,
    "ch03-weight-names": ch03.fig_weight_names,
    "ch03-decoder": ch03.fig_decoder,
    "ch04-page-table": ch04.fig_page_table,
    "ch04-out-loc": ch04.fig_out_loc,
    "ch05-ragged-batch": ch05.fig_ragged_batch,
    "ch05-backend-flow": ch05.fig_backend_flow,
    "ch06-engine": ch06.fig_engine,
    "ch06-top-k-top-p": ch06.fig_top_k_top_p,
    "ch07-loop": ch07.fig_loop,
    "ch07-timeline": ch07.fig_timeline,
    "ch07-token-pool": ch07.fig_token_pool,
    "ch08-pages": ch08.fig_pages,
    "ch08-cache-req": ch08.fig_cache_req,
    "ch08-admission": ch08.fig_admission,
    "ch09-tree": ch09.fig_tree,
    "ch09-split": ch09.fig_split,
    "ch10-timeline": ch10.fig_timeline,
    "ch10-chunks": ch10.fig_chunks,
    "ch11-overlap-loop": ch11.fig_overlap_loop,
    "ch11-one-request": ch11.fig_one_request,
    "ch12-sockets": ch12.fig_sockets,
    "ch12-slow-joiner": ch12.fig_slow_joiner,
    "ch14-one-turn": ch14.fig_one_turn,
    "ch15-one-request": ch15.fig_one_request,
    "ch16-column-row": ch16.fig_column_row,
    "ch16-layer-on-ranks": ch16.fig_layer_on_ranks,
    "ch17-three-tables": ch17.fig_three_tables,
    "ch17-plan-run": ch17.fig_plan_run,
    "ch18-capture-replay": ch18.fig_capture_replay,
    "ch18-padding": ch18.fig_padding,
    "ch19-two-builds": ch19.fig_two_builds,
    "ch19-store-warps": ch19.fig_store_warps,
}


def generate(out_dir: str | Path = DEFAULT_OUT, names: Iterable[str] | None = None) -> list[Path]:
    """Write the figures to ``out_dir/<name>.svg``; return the paths written or unchanged.

    A file is rewritten only when its text changes, so that ``mkdocs serve``,
    which watches the docs folder, does not rebuild in a loop.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    selected = list(FIGURES) if names is None else list(names)
    unknown = [n for n in selected if n not in FIGURES]
    if unknown:
        raise KeyError(f"unknown figure(s): {', '.join(unknown)}; known: {', '.join(FIGURES)}")
    paths = []
    for name in selected:
        svg = FIGURES[name]()
        path = out / f"{name}.svg"
        if not path.exists() or path.read_text(encoding="utf-8") != svg:
            path.write_text(svg, encoding="utf-8")
        paths.append(path)
    return paths
