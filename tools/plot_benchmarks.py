"""Chapter 21's and project P1's plots, drawn with matplotlib from the measurements in
docs/data:

    python tools/plot_benchmarks.py    # docs/figures/ch21-*.svg and p1-*.svg

(`mkdocs build` draws them too, like every figure: docs/figures/ is not committed.)

* ch21-batch.svg: generated tokens per second against the number of requests decoding at once
  (tools/bench_ablation.py batch), one panel per device that has measurements;
* ch21-split.svg: a decode step's milliseconds split into parts, one bar per batch size
  (tools/bench_ablation.py split);
* p1-profile.svg, p1-profile-h100.svg, p1-profile-h200.svg: each engine's GPU time over the
  whole offline workload, by part, with the wall time of its run and the workload's physical
  limit on that GPU (tools/bench_p1.py profile, limit; the first on an H200 before the
  project's kernels, the second on an H100, the third on an H200 after them);
* p1-batch.svg, p1-batch-h200.svg: output tokens per second against the requests decoding at
  once, both engines and each size's limit (tools/bench_p1.py batch, on an H100 and on an H200);
* p1-gate-up.svg: how many more tokens per second this engine makes with the gate/up kernel
  than without, against the requests decoding at once (tools/bench_p1.py batch --variant, on
  an H100);
* p1-split.svg: a decode step in parts, one bar per batch size, before the project (chapter
  21's split) and after it (tools/bench_ablation.py split with P1's engine, on an H100).

The SVG files are deterministic for given data: no date in their metadata, fixed element ids.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import sys
from pathlib import Path
from typing import Any, Dict, List, Tuple

import matplotlib

matplotlib.use("svg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter, NullFormatter  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs" / "data"
FIGURES = ROOT / "docs" / "figures"
DEVICES = [("cpu", "CPU"), ("gpu", "GPU")]
PART_ORDER = [
    "matrix products",
    "attention",
    "norms, SiLU, RoPE",
    "KV store, embedding",
    "sampling",
    "other kernels",
    "model glue",
    "scheduler",
    "host (GPU idle)",
]
COLOURS = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3",
           "#8c8c8c", "#ccb974"]  # fmt: skip


def load(kind: str, data: Path) -> List[Tuple[str, Dict[str, Any]]]:
    found = []
    for key, title in DEVICES:
        path = data / f"ch21-{kind}-{key}.json"
        if path.exists():
            found.append((title, json.loads(path.read_text())))
    if not found:
        raise SystemExit(f"no {data}/ch21-{kind}-*.json: run tools/bench_ablation.py {kind}")
    return found


def save(fig: Any, path: Path) -> None:
    """The figure as an SVG that a page can inline: without the XML prolog, the doctype and
    the metadata, on one line (Markdown would cut a multi-line block into paragraphs)."""
    plt.rcParams["svg.hashsalt"] = "minisgl-book"  # fixed ids instead of random ones
    plt.rcParams["svg.fonttype"] = "none"  # text as text: the page's fonts, and no glyph paths
    out = io.StringIO()
    fig.savefig(out, format="svg", metadata={"Date": None}, bbox_inches="tight")
    plt.close(fig)
    svg = out.getvalue()
    svg = svg[svg.index("<svg") :]
    svg = re.sub(r"<metadata>.*?</metadata>", "", svg, flags=re.DOTALL)
    svg = re.sub(r"\s*\n\s*", " ", svg).strip()
    path.write_text(svg + "\n")


def plot_batch(data: Path, out: Path) -> Path:
    panels = load("batch", data)
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 3.8), squeeze=False)
    for ax, (title, measured) in zip(axes[0], panels):
        for (name, curve), marker in zip(measured["curves"].items(), "os^"):
            points = curve["points"]
            sizes = [p["batch"] for p in points]
            rates = [p["tokens"] / p["seconds"] for p in points]
            ax.plot(sizes, rates, marker=marker, label=name)
        first = next(iter(measured["curves"].values()))
        batch_axes(ax, sizes, f"{title}: prompts of {first['prompt_len']}, "
                              f"{first['new_tokens']} new tokens each")  # fmt: skip
    path = out / "ch21-batch.svg"
    save(fig, path)
    return path


def batch_axes(ax: Any, sizes: List[int], title: str) -> None:
    """The axes of a throughput-against-batch-size plot: both scales logarithmic, every size
    a tick, tokens per second written out."""
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(sizes, [str(s) for s in sizes])
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("requests decoding at once")
    ax.set_ylabel("generated tokens / s")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)


def plot_split(data: Path, out: Path) -> Path:
    panels = load("split", data)
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 3.8), squeeze=False)
    for ax, (title, measured) in zip(axes[0], panels):
        split_bars(ax, measured["rows"], f"{title}: one decode step, in parts")
    path = out / "ch21-split.svg"
    save(fig, path)
    return path


def plot_p1_split(data: Path, out: Path) -> Path:
    """A decode step in parts before the project (chapter 21's engine, its GPU run) and after
    it (`bench_ablation.py split` with the engine of P1), on one scale of milliseconds."""
    panels = [("before: chapter 21's engine", data / "ch21-split-gpu.json"),
              ("after: P1's engine", data / "p1-split-h100.json")]  # fmt: skip
    fig, axes = plt.subplots(1, 2, figsize=(10.4, 3.8), sharey=True)
    for ax, (title, path) in zip(axes, panels):
        measured = json.loads(path.read_text())
        machine = measured["machine"].removeprefix("one ").split(",")[0]
        split_bars(ax, measured["rows"], f"{title} ({machine})")
    path = out / "p1-split.svg"
    save(fig, path)
    return path


def split_bars(ax: Any, rows: List[Dict[str, Any]], title: str) -> None:
    """One stacked bar per batch size: the milliseconds of a decode step, by part."""
    labels = [str(r["batch"]) for r in rows]
    bottoms = [0.0] * len(rows)
    for part, colour in zip(PART_ORDER, COLOURS):
        heights = [r["parts"].get(part, 0.0) for r in rows]
        if not any(heights):
            continue
        ax.bar(labels, heights, bottom=bottoms, label=part, color=colour)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    ax.set_xlabel("requests in the decode batch")
    ax.set_ylabel("milliseconds per decode step")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(True, axis="y", alpha=0.3)


def plot_profile(data: Path, out: Path) -> Path:
    return profile_bars(data / "p1-profile.json", out / "p1-profile.svg")


def plot_profile_h100(data: Path, out: Path) -> Path:
    return profile_bars(data / "p1-profile-h100.json", out / "p1-profile-h100.svg")


def plot_profile_h200(data: Path, out: Path) -> Path:
    return profile_bars(data / "p1-profile-h200.json", out / "p1-profile-h200.svg")


def profile_bars(results_file: Path, path: Path) -> Path:
    """Each engine's GPU time by part (`bench_p1.py profile`'s results), its run's wall time,
    and the limit of the GPU the profile ran on."""
    from tools.bench_p1 import H100, H200, gpu_parts, workload_limit

    results = json.loads(results_file.read_text())
    machine = next(iter(results.values()))["machine"]
    parts = gpu_parts(results)
    unknown = {p for by_part in parts.values() for p in by_part} - set(PART_ORDER)
    assert not unknown, f"parts without a colour: {unknown}"
    labels = list(results)
    fig, ax = plt.subplots(figsize=(7.5, 1.4 + 0.5 * len(labels)))
    lefts = [0.0] * len(labels)
    for part, colour in zip(PART_ORDER, COLOURS):
        widths = [parts[label].get(part, 0.0) for label in labels]
        if not any(widths):
            continue
        ax.barh(labels, widths, left=lefts, label=part, color=colour, height=0.5)
        lefts = [a + b for a, b in zip(lefts, widths)]
    walls = [results[label]["host"]["seconds"] for label in labels]
    ax.scatter(walls, labels, marker="|", s=600, color="black", zorder=3,
               label="wall time of the run")  # fmt: skip
    limit = workload_limit(H100 if "H100" in machine else H200).seconds
    ax.axvline(limit, color="black", linestyle="--", linewidth=1,
               label=f"the limit, {limit:.2f} s")  # fmt: skip
    ax.set_xlim(0, max(walls) * 1.05)
    ax.invert_yaxis()  # the first engine on top, as in the table
    ax.set_xlabel(f"seconds of the timed run: GPU time by part ({machine.removeprefix('One ')})")
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), markerscale=0.5)
    save(fig, path)
    return path


def plot_p1_batch(data: Path, out: Path) -> Path:
    return batch_curves(data / "p1-batch-h100.json", out / "p1-batch.svg")


def plot_p1_batch_h200(data: Path, out: Path) -> Path:
    return batch_curves(data / "p1-batch-h200.json", out / "p1-batch-h200.svg")


def batch_curves(results_file: Path, path: Path) -> Path:
    """Output tokens per second against the requests decoding at once, each engine of
    `bench_p1.py batch` and the limit of each size on the GPU it ran on."""
    measured = json.loads(results_file.read_text())
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    sizes = [bound["batch"] for bound in measured["limit"]]
    for (label, points), marker in zip(measured["curves"].items(), "os^"):
        ax.plot(sizes, [p["tokens"] / p["seconds"] for p in points], marker=marker, label=label)
    ax.plot(sizes, [bound["tokens_per_s"] for bound in measured["limit"]], color="black",
            linestyle="--", linewidth=1, label=f"the limit ({measured['hardware']})")  # fmt: skip
    batch_axes(ax, sizes, f"{measured['machine']}: prompts of {measured['prompt_len']}, "
                          f"{measured['new_tokens']} new tokens each")  # fmt: skip
    save(fig, path)
    return path


def plot_p1_gate_up(data: Path, out: Path) -> Path:
    """This engine's tokens per second with the gate/up kernel over those without it (the
    variant `MINISGL_FUSED_GATE_UP_SILU=0`), at each batch size, and the most rows the kernel
    is used for."""
    from minisgl.kernel.triton.gate_up_silu import MAX_ROWS

    measured = json.loads((data / "p1-batch-gate-up-h100.json").read_text())
    with_kernel, without = (measured["curves"][k] for k in list(measured["curves"])[:2])
    sizes = [point["batch"] for point in with_kernel]
    gains = [
        100 * (a["tokens"] / a["seconds"]) / (b["tokens"] / b["seconds"]) - 100
        for a, b in zip(with_kernel, without)
    ]
    fig, ax = plt.subplots(figsize=(6.4, 3.2))
    ax.bar([str(b) for b in sizes], gains, color=COLOURS[0])
    ax.axhline(0, color="black", linewidth=0.8)
    at = sizes.index(MAX_ROWS) + 0.5  # between the last size that uses it and the next
    ax.axvline(at, color="black", linestyle="--", linewidth=1,
               label=f"above {MAX_ROWS} rows the engine runs cuBLAS and SiLU")  # fmt: skip
    ax.set_xlabel("requests decoding at once")
    ax.set_ylabel("more tokens / s with the kernel, %")
    ax.set_title(f"{measured['machine']}: prompts of {measured['prompt_len']}, "
                 f"{measured['new_tokens']} new tokens each", fontsize=9)  # fmt: skip
    ax.set_ylim(top=1.35 * max(gains))  # room for the legend above the bars
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    path = out / "p1-gate-up.svg"
    save(fig, path)
    return path


# name -> the function that draws docs/figures/<name>.svg from a folder of measurements
PLOTS = {
    "ch21-batch": plot_batch,
    "ch21-split": plot_split,
    "p1-profile": plot_profile,
    "p1-profile-h100": plot_profile_h100,
    "p1-profile-h200": plot_profile_h200,
    "p1-batch": plot_p1_batch,
    "p1-batch-h200": plot_p1_batch_h200,
    "p1-split": plot_p1_split,
    "p1-gate-up": plot_p1_gate_up,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--out", type=Path, default=FIGURES)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for plot in PLOTS.values():
        print(f"wrote {plot(args.data, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
