"""The decode attention kernels as Nsight Compute sees them: what their warps wait on.

    python tools/bench_p1.py counters [--set loop] [--steps 129,577]
                                        # on an NVIDIA GPU with ncu: docs/data/p1-decode-counters.md

`decode-kernels` times each kernel; this says why it takes that time. For each of a few
decode steps of the run (by default step 129, the one with the most keys to read, and step
577, half as many requests of more uneven lengths), each kernel of the chosen set
(`bench_p1.DECODE_KERNEL_SETS`, the same calls `decode-kernels` times) and FlashInfer's runs
once under `ncu`, each kernel and step in its own process, only the measured call profiled
(`--profile-from-start off`, the call between `cudaProfilerStart` and `cudaProfilerStop`,
after a call that compiles it). The clocks are left as the GPU sets them (`--clock-control
none`); ncu empties the caches before each pass, so every kernel starts from cold L2.

A row per kernel launch: its time, the bytes it read from DRAM per second and as a share of
the peak ncu knows for this GPU, registers and shared memory per program, how many programs
fit on an SM (the smallest of ncu's limits), the share of an SM's warp slots its warps held
on average (achieved occupancy) against the most the limits allow (theoretical), and the
reasons its warps were not issuing, largest first, in cycles per issued instruction (ncu's
"warp state statistics": long scoreboard is a wait for global memory, barrier a wait at
`__syncthreads`, and so on). A kernel reads memory at full speed only when enough loads are
in flight; the stalls say whether its warps wait on memory (long scoreboard) or on something
the kernel could overlap.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from glob import glob
from pathlib import Path
from typing import Dict, List, Sequence

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools import supervise  # noqa: E402

OUT = ROOT / "docs" / "data" / "p1-decode-counters.md"
STEPS = (129, 577)  # the step with the most keys to read; a later one, fewer and more uneven
SECTIONS = ("SpeedOfLight", "MemoryWorkloadAnalysis", "LaunchStats", "Occupancy", "WarpStateStats")
# the DRAM's % of its peak, from the SpeedOfLight section, by either of its names
DRAM_PEAK = ("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
             "dram__throughput.avg.pct_of_peak_sustained_elapsed")  # fmt: skip
METRICS = ("gpu__time_duration.sum", "dram__bytes_read.sum")
FLASHINFER = "FlashInfer (now)"
STALL = re.compile(r"issue_stalled_(?P<reason>[a-z_]+?)(_per_issue_active)?\.ratio$")


def find_ncu() -> str | None:
    """ncu on the PATH, or the newest under /opt/nvidia (where the device image keeps it)."""
    found = shutil.which("ncu")
    if found:
        return found
    candidates = sorted(glob("/opt/nvidia/nsight-compute/*/ncu") + glob("/usr/local/cuda*/bin/ncu"))
    return candidates[-1] if candidates else None


@dataclass(frozen=True)
class Launch:
    """One profiled kernel launch, ncu's raw metrics by name (units in base units: ns, bytes)."""

    kernel: str
    metrics: Dict[str, str]

    def number(self, name: str) -> float | None:
        value = self.metrics.get(name, "").replace(",", "")
        try:
            return float(value)
        except ValueError:
            return None

    def stalls(self) -> List[tuple[str, float]]:
        """The reasons its warps did not issue, cycles per issued instruction, largest first."""
        found: Dict[str, float] = {}
        for name in self.metrics:
            match = STALL.search(name)
            value = self.number(name)
            if match and value is not None and match["reason"] not in ("not_selected", "selected"):
                found[match["reason"]] = max(found.get(match["reason"], 0.0), value)
        return sorted(found.items(), key=lambda item: -item[1])


def parse_raw_csv(text: str) -> List[Launch]:
    """ncu's `--csv --page raw` output: a header of column names, a row of units, a row per
    kernel launch. Lines of ncu's own messages (`==PROF==`, `==WARNING==`) are skipped."""
    lines = [line for line in text.splitlines() if line.startswith('"')]
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    if len(rows) < 2:
        return []
    header, launches = rows[0], []
    for row in rows[2:]:  # rows[1] holds the units
        metrics = dict(zip(header, row))
        launches.append(Launch(short_name(metrics.get("Kernel Name", "?")), metrics))
    return launches


def short_name(kernel: str) -> str:
    """A kernel's name without its template arguments and parameters."""
    name = re.split(r"[<(]", kernel, maxsplit=1)[0].strip()
    return name.split("::")[-1] or kernel


def programs_per_sm(launch: Launch) -> str:
    limits = [
        launch.number(name)
        for name in launch.metrics
        if name.startswith("launch__occupancy_limit_")
    ]
    limits = [limit for limit in limits if limit is not None]
    return f"{min(limits):.0f}" if limits else "-"


def row(step: int, batch: int, label: str, launch: Launch) -> str:
    ns, read = launch.number("gpu__time_duration.sum"), launch.number("dram__bytes_read.sum")
    dram = next((value for value in map(launch.number, DRAM_PEAK) if value is not None), None)
    registers = launch.number("launch__registers_per_thread")
    shared = sum(
        launch.number(name) or 0.0
        for name in ("launch__shared_mem_per_block_dynamic", "launch__shared_mem_per_block_static")
    )
    achieved = launch.number("sm__warps_active.avg.pct_of_peak_sustained_active")
    theoretical = launch.number("sm__maximum_warps_per_active_cycle_pct")
    grid = launch.number("launch__grid_size")
    stalls = ", ".join(f"{reason.replace('_', ' ')} {value:.1f}" for reason, value in
                       launch.stalls()[:4])  # fmt: skip

    def show(value: float | None, form: str) -> str:
        return "-" if value is None else format(value, form)

    cells = [
        str(step), str(batch), label, launch.kernel, show(grid, ".0f"),
        show(ns / 1e3 if ns else None, ".1f"),
        show(read / ns / 1e3 if ns and read is not None else None, ".2f"),
        show(dram, ".0f"), show(registers, ".0f"), f"{shared / 1024:.1f}",
        programs_per_sm(launch), show(achieved, ".0f"), show(theoretical, ".0f"), stalls or "-",
    ]  # fmt: skip
    return "| " + " | ".join(cells) + " |"


HEADER = (
    "| step | batch | settings | kernel | programs | us | TB/s read | DRAM % of peak | registers "
    "| shared KiB | programs per SM | achieved occupancy % | theoretical % | warps waiting, "
    "cycles per issue |\n"
    "| ---: | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
    "| --- |"
)


def child(kernel_set: str, label: str, steps: Sequence[int]) -> None:
    """Under ncu: each step's call of one kernel, compiled first, then profiled alone."""
    import torch

    from tools.bench_p1 import (
        DECODE_KERNEL_SETS,
        decode_buffers,
        decode_step_calls,
        run_decode_shapes,
    )

    shapes = [(step, contexts) for step, contexts in run_decode_shapes(1) if step in steps]
    cache, workspace, gen = decode_buffers(shapes)
    # decode_step_calls makes FlashInfer's calls and the engine's itself; of the set, this one
    settings = {
        name: value
        for name, value in DECODE_KERNEL_SETS[kernel_set].kernels.items()
        if name == label
    }
    for step, contexts in shapes:
        _, calls = decode_step_calls(step, contexts, cache, workspace, gen, settings)
        call, _ = calls[label]
        call()  # compiles it, and plans FlashInfer's wrapper
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        call()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # supervise.run then kills the running ncu's group


def write_table(out: Path, rows: List[str], failures: List[str], notes: str) -> None:
    """The rows so far, by step (in the order they were profiled within a step)."""
    import torch

    ordered = sorted(rows, key=lambda line: int(line.split("|")[1]))
    failed = f" Not profiled: {'; '.join(failures)}." if failures else ""
    out.write_text(
        "\n".join([HEADER, *ordered]) + "\n\nOne launch of each kernel under Nsight Compute "
        f"({notes}), at decode steps of the run, caches cold.{failed} "
        f"One {torch.cuda.get_device_name() if torch.cuda.is_available() else 'CPU, no GPU'}.\n"
    )


def counters(
    out: Path, kernel_set: str = "loop", steps: Sequence[int] = STEPS, only: Sequence[str] = ()
) -> None:
    """Profile FlashInfer's kernel and every kernel of `kernel_set` (or those of its labels in
    `only`) at `steps`; write the table."""
    before = signal.signal(signal.SIGTERM, _exit_on_sigterm)  # a `timeout` stops ncu's group too
    try:
        _profile(out, kernel_set, sorted(steps), only)
    finally:
        signal.signal(signal.SIGTERM, before)


def _profile(out: Path, kernel_set: str, steps: List[int], only: Sequence[str]) -> None:
    from tools.bench_p1 import DECODE_KERNEL_SETS, ENGINE, run_decode_shapes

    ncu = find_ncu()
    if ncu is None:
        raise SystemExit("counters needs Nsight Compute's ncu (not on the PATH nor in /opt/nvidia)")
    batches = {step: len(c) for step, c in run_decode_shapes(1) if step in steps}
    missing = sorted(set(steps) - set(batches))
    if missing:
        raise SystemExit(f"steps {missing} are not decode steps of the run (1 to 1,023)")
    labels = [FLASHINFER, ENGINE, *DECODE_KERNEL_SETS[kernel_set].kernels]
    unknown = sorted(set(only) - set(labels))
    if unknown:
        raise SystemExit(f"not kernels of the set {kernel_set!r}: {unknown}; it has {labels}")
    labels = [label for label in labels if label in only] if only else labels
    version = subprocess.run([ncu, "--version"], capture_output=True, text=True, timeout=60).stdout
    version = version.strip().splitlines()[-1] if version.strip() else "ncu"
    rows: List[str] = []
    failures: List[str] = []
    for label in labels:
        for step in steps:  # a process each: FlashInfer may launch more kernels at one step
            command = [ncu, "--profile-from-start", "off", "--clock-control", "none", "--csv",
                       "--page", "raw", "--print-units", "base"]  # fmt: skip
            command += ["--metrics", ",".join(METRICS)]
            for section in SECTIONS:
                command += ["--section", section]
            command += [sys.executable, str(Path(__file__).resolve()), "--child", "--set",
                        kernel_set, "--label", label, "--steps", str(step)]  # fmt: skip
            done = supervise.run(command, ROOT, dict(os.environ), timeout=300)
            launches = parse_raw_csv(done.stdout)
            if done.returncode != 0 or not launches:
                failures.append(f"{label} at step {step}: ncu rc {done.returncode}")
                print(f"ncu for {label!r} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
                continue
            for launch in launches:
                if not any(name in launch.metrics for name in DRAM_PEAK):
                    print("no DRAM % of peak; ncu's DRAM metrics:",
                          [name for name in launch.metrics if "dram" in name])  # fmt: skip
                rows.append(row(step, batches[step], label, launch))
                print(rows[-1], flush=True)
            write_table(out, rows, failures, f"{version}, {DECODE_KERNEL_SETS[kernel_set].notes}")
    write_table(out, rows, failures, f"{version}, {DECODE_KERNEL_SETS[kernel_set].notes}")
    if not rows:
        raise SystemExit(f"ncu profiled nothing: {'; '.join(failures)}")
    print(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--label", help=argparse.SUPPRESS)
    parser.add_argument("--set", dest="kernel_set", default="loop")
    parser.add_argument("--steps", default=",".join(map(str, STEPS)))
    parser.add_argument("--only", help="these kernels' labels only, separated by ';'")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    steps = sorted(int(step) for step in args.steps.split(","))
    if args.child:
        child(args.kernel_set, args.label, steps)
    else:
        counters(args.out, args.kernel_set, steps, args.only.split(";") if args.only else ())


if __name__ == "__main__":
    main()
