"""tools/figures: every figure is a well-formed SVG document, and the package loads plainly."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from xml.etree import ElementTree

from tools import figures
from tools.figures.__main__ import main

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tools" / "figures"
SVG_NS = "{http://www.w3.org/2000/svg}"

# Imports the package twice in a fresh interpreter and prints how often each file was executed.
PROBE = """
import collections, importlib.machinery, json
runs = collections.Counter()
exec_module = importlib.machinery.SourceFileLoader.exec_module
def counted(loader, module):
    runs[loader.path] += 1
    exec_module(loader, module)
importlib.machinery.SourceFileLoader.exec_module = counted
import tools.figures
import tools.figures
print(json.dumps(runs))
"""


def test_every_figure_is_a_well_formed_svg(tmp_path: Path) -> None:
    paths = figures.generate(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{n}.svg" for n in figures.FIGURES)
    ids: Counter[str] = Counter()
    for path in paths:
        root = ElementTree.parse(path).getroot()
        assert root.tag == f"{SVG_NS}svg", path.name
        # the figure's own name, so the ids it derives from it are its own
        assert f"book-svg-{path.stem}" in root.get("class", "").split(), path.name
        assert root.find(f"{SVG_NS}title") is not None, path.name
        ids.update(el.get("id") for el in root.iter() if el.get("id"))
    # a page inlines several figures: no id may appear twice among them all
    assert [i for i, n in ids.items() if n > 1] == []


def test_registry_lists_every_figure_function_once() -> None:
    functions = list(figures.FIGURES.values())
    assert len(set(functions)) == len(functions)
    assert all(name == name.lower() and " " not in name for name in figures.FIGURES)
    defined = {
        fn
        for name, module in sys.modules.items()
        if name.startswith("tools.figures.")
        for attr, fn in vars(module).items()
        if attr.startswith("fig_") and callable(fn)
    }
    # a name listed twice in the dict would leave one function out
    assert defined == set(functions)


def test_the_command_line_writes_the_figures_it_names(tmp_path: Path) -> None:
    assert main(["--out", str(tmp_path), "overlap", "ch01-req-lengths"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ch01-req-lengths.svg", "overlap.svg"]


def test_importing_twice_runs_each_module_once() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    runs = {
        Path(path).resolve(): n
        for path, n in json.loads(out).items()
        if Path(path).resolve().is_relative_to(PACKAGE)
    }
    expected = {p.resolve() for p in PACKAGE.rglob("*.py") if p.name != "__main__.py"}
    assert set(runs) == expected
    assert set(runs.values()) == {1}


def test_the_module_maps_badges_link_to_the_written_chapters(tmp_path: Path) -> None:
    from tools.figures.module_map import MODULES, fig_module_map, written_chapters

    svg = fig_module_map()
    links = re.findall(r'<a href="\.\./(chapters/[\w-]+)/">', svg)
    pages = written_chapters()
    badges = {chapter for _, mods, _ in MODULES for _, _, chapter, _ in mods}
    # the written ones, all, and no link for a chapter not written yet
    assert set(links) == {pages[c] for c in badges if c in pages}
    assert all((ROOT / "docs" / f"{link}.md").exists() for link in links)


def test_the_profile_plot_is_drawn_from_the_measurements(tmp_path) -> None:
    """docs/figures/p1-profile.svg: the same SVG from the same JSON, one bar per engine, the
    limit named in its legend."""
    import xml.etree.ElementTree as ET

    from tools import bench_p1, plot_benchmarks

    data = bench_p1.ROOT / "docs" / "data"  # the repository's: chapter trees have no docs/
    first = plot_benchmarks.plot_profile(data, tmp_path).read_bytes()
    assert plot_benchmarks.plot_profile(data, tmp_path).read_bytes() == first
    assert ET.fromstring(first).tag.endswith("svg")
    text = first.decode()
    limit = bench_p1.workload_limit().seconds
    assert f"the limit, {limit:.2f} s" in text
    assert "this engine" in text and "official mini-sglang" in text


def test_the_h100_profile_and_the_batch_plot_take_their_gpus_limit(tmp_path) -> None:
    """docs/figures/p1-profile-h100.svg and p1-batch.svg: drawn twice the same, each with the
    limit of the GPU its measurements ran on (an H100), not the H200's."""
    import xml.etree.ElementTree as ET

    from tools import bench_p1, plot_benchmarks

    data = bench_p1.ROOT / "docs" / "data"
    for plot in (plot_benchmarks.plot_profile_h100, plot_benchmarks.plot_p1_batch):
        first = plot(data, tmp_path).read_bytes()
        assert plot(data, tmp_path).read_bytes() == first
        assert ET.fromstring(first).tag.endswith("svg")
        text = first.decode()
        assert "H100" in text and "this engine" in text and "official mini-sglang" in text
    limit = bench_p1.workload_limit(bench_p1.H100).seconds
    assert f"the limit, {limit:.2f} s" in (tmp_path / "p1-profile-h100.svg").read_text()
    assert "the limit (NVIDIA H100 SXM)" in (tmp_path / "p1-batch.svg").read_text()


def test_the_split_before_and_after_the_project_names_both_gpus(tmp_path) -> None:
    """docs/figures/p1-split.svg: drawn twice the same; a panel for chapter 21's engine and one
    for P1's, each titled with the GPU it ran on, every batch size of both as a bar."""
    import xml.etree.ElementTree as ET

    from tools import bench_p1, plot_benchmarks

    data = bench_p1.ROOT / "docs" / "data"
    first = plot_benchmarks.plot_p1_split(data, tmp_path).read_bytes()
    assert plot_benchmarks.plot_p1_split(data, tmp_path).read_bytes() == first
    assert ET.fromstring(first).tag.endswith("svg")
    text = first.decode()
    assert "before: chapter 21's engine (NVIDIA H200)" in text
    assert "after: P1's engine (NVIDIA H100 80GB HBM3)" in text
    assert "host (GPU idle)" in text and "attention" in text


def test_the_gate_up_plot_compares_the_two_columns_of_its_batch_run(tmp_path) -> None:
    """docs/figures/p1-gate-up.svg: drawn twice the same, from the batch run with and without
    the kernel (its first two columns are those), with the kernel's row limit marked."""
    import xml.etree.ElementTree as ET

    from minisgl.kernel.triton.gate_up_silu import MAX_ROWS
    from tools import bench_p1, plot_benchmarks

    data = bench_p1.ROOT / "docs" / "data"
    labels = list(json.loads((data / "p1-batch-gate-up-h100.json").read_text())["curves"])
    assert labels[:2] == ["this engine", "this engine, cuBLAS and SiLU"]
    first = plot_benchmarks.plot_p1_gate_up(data, tmp_path).read_bytes()
    assert plot_benchmarks.plot_p1_gate_up(data, tmp_path).read_bytes() == first
    assert ET.fromstring(first).tag.endswith("svg")
    text = first.decode()
    assert "H100" in text and f"above {MAX_ROWS} rows the engine runs cuBLAS and SiLU" in text
