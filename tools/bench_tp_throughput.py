"""The throughput part of tools/bench_tp.py: which configurations run, on which GPUs, and the
table of their results (docs/data/ch16-tp-gpu.md and its .json).

A configuration is a model shape, a TP size and CUDA graphs on or off. Each runs in a fresh
child process (tools/bench_tp_child.py's `measure`), started as soon as enough GPUs are free,
in the order given (`chosen_runs`), each child seeing only its own GPUs
(CUDA_VISIBLE_DEVICES): on 4 GPUs, two TP=1 runs and a TP=2 run go side by side, a TP=4 run
alone. Each result is printed, and the table and the JSON rewritten, as it arrives.
"""

from __future__ import annotations

import json
import os
import sys
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

from tools.bench_gpu import QWEN3_0_6B, RESULT, model_folder
from tools.bench_tp_child import fitting, gpu_ids, problems_of, run_child, time_left

ROOT = Path(__file__).resolve().parents[1]
MIN_START_S = 60  # no configuration starts with less time than this left
QWEN3_8B = {
    **QWEN3_0_6B,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "tie_word_embeddings": False,
}


@dataclass(frozen=True)
class Shape:
    label: str  # what the table calls it
    folder: Callable[[], Path]  # made by the parent, before any child reads it


def _tiny_folder() -> Path:
    from tools.models import ensure_model

    return ensure_model("tiny-qwen3")


SHAPES: Dict[str, Shape] = {
    "0.6b": Shape("Qwen3-0.6B shape", model_folder),
    "8b": Shape("Qwen3-8B shape", lambda: model_folder("qwen3-8b-shape", QWEN3_8B)),
    "tiny": Shape("tiny Qwen3 shape", _tiny_folder),
}


@dataclass(frozen=True)
class Settings:
    """How throughput runs on one kind of device."""

    dtype: str
    engine: Dict[str, Any]  # SchedulerConfig's fields
    workload: Dict[str, int] | None  # make_offline_workload's arguments; None: upstream's
    probe: Dict[str, int]  # tools/bench_tp_child.py's Probe: batch, skip, steps
    warmup: int  # requests
    shapes: Tuple[str, ...]
    graphs: Tuple[bool, ...]
    sizes: Tuple[int, ...]
    timeout_s: Dict[str, int]  # by shape


SETTINGS = {
    "cuda": Settings(
        dtype="bfloat16",
        engine=dict(
            attention_backend="fi",
            page_size=256,
            max_seq_len_override=4096,
            max_extend_tokens=16384,
        ),
        workload=None,
        probe=dict(batch=256, skip=8, steps=16),
        warmup=8,
        shapes=("0.6b", "8b"),
        graphs=(True, False),
        sizes=(1, 2, 4),
        timeout_s={"0.6b": 180, "8b": 240},
    ),
    "cpu": Settings(
        dtype="float32",
        engine=dict(
            attention_backend="torch",
            page_size=16,
            max_running_req=8,
            max_seq_len_override=256,
            max_extend_tokens=512,
            num_page_override=128,
        ),
        workload=dict(
            num_seqs=6, max_input_len=48, max_output_len=10, min_input_len=16, min_output_len=6
        ),
        probe=dict(batch=4, skip=2, steps=3),
        warmup=2,
        shapes=("tiny",),
        graphs=(False,),
        sizes=(1, 2),
        timeout_s={"tiny": 120},
    ),
}


@dataclass(frozen=True)
class Run:
    """One configuration."""

    shape: str
    tp: int
    graphs: bool

    def __str__(self) -> str:
        return f"{self.shape}, TP={self.tp}, CUDA graphs {'on' if self.graphs else 'off'}"


def chosen_runs(device: str, shapes: List[str], sizes: List[int], graphs: List[bool]) -> List[Run]:
    """With CUDA graphs first, then without; in each, TP=1 first: if the time runs out, what is
    lost is the last TP sizes without graphs, not the baseline."""
    tp_sizes = sorted(fitting(sizes, device))
    order = sorted(graphs, reverse=True)
    return [Run(shape, tp, g) for g in order for tp in tp_sizes for shape in shapes]


def throughput(
    device: str, runs: List[Run], out_dir: Path, deadline: float, one_at_a_time: bool, jobs: int
) -> bool:
    """Every run in a child of its own; each result printed and tabled as it comes. On the
    CPU, `jobs` runs side by side. True if every run gave a result."""
    settings = SETTINGS[device]
    folders = {shape: str(SHAPES[shape].folder()) for shape in {run.shape for run in runs}}
    gpus = gpu_ids(device)
    results: List[Dict] = []

    def measured(run: Run, taken: List[str]) -> Dict:
        timeout = max(1.0, min(settings.timeout_s[run.shape], time_left(deadline)))
        return measure_in_child(run, device, folders[run.shape], taken, timeout)

    def record(run: Run, result: Dict) -> None:
        results.append(dict(shape=run.shape, tp=run.tp, graphs=run.graphs, **result))
        shown = {k: v for k, v in result.items() if k not in ("windows", "machine")}
        print(f"{run}: {json.dumps(shown)}", flush=True)
        write_outputs(out_dir, device, results, len(gpus), not one_at_a_time)

    print(f"\nthroughput on {device}: {len(runs)} configurations", flush=True)
    slots = gpus or [f"cpu {i}" for i in range(jobs)]
    if one_at_a_time:
        run_packed(runs, slots, lambda run: len(slots), measured, record, deadline)
    else:
        run_packed(runs, slots, lambda run: run.tp if gpus else 1, measured, record, deadline)
    print((out_dir / table_name(device)).read_text() if results else "no results")
    return bool(results) and all("error" not in r for r in results)


def run_packed(
    runs: List[Run], slots: List[str], need: Callable[[Run], int],
    measured: Callable[[Run, List[str]], Dict], record: Callable[[Run, Dict], None],
    deadline: float,
) -> None:  # fmt: skip
    """Start the runs in order, each as soon as `need(run)` slots (GPUs) are free; record each
    result, in this thread, as it arrives."""
    free, queue = list(slots), list(runs)
    running: Dict[Future, Tuple[Run, List[str]]] = {}
    with ThreadPoolExecutor(max_workers=len(slots)) as pool:
        while queue or running:
            while queue and (n := min(need(queue[0]), len(slots))) <= len(free):
                run = queue.pop(0)
                if time_left(deadline) < MIN_START_S:
                    record(run, dict(error="not started: out of time"))
                    continue
                taken, free = free[:n], free[n:]
                running[pool.submit(measured, run, taken)] = (run, taken)
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                run, taken = running.pop(future)
                free += taken
                record(run, future.result())


def child_spec(run: Run, device: str, folder: str) -> Dict[str, Any]:
    """What tools/bench_tp_child.py's `measure` is told."""
    settings = SETTINGS[device]
    return dict(
        model=folder, tp=run.tp, graphs=run.graphs, device=device, dtype=settings.dtype,
        engine=settings.engine, workload=settings.workload, probe=settings.probe,
        warmup=settings.warmup,
    )  # fmt: skip


def measure_in_child(
    run: Run, device: str, folder: str, gpus: List[str], timeout: float
) -> Dict[str, Any]:
    """The run's result, or {"error": why}, from a fresh process that sees only `gpus`."""
    env = dict(os.environ)
    if device == "cuda":
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    spec = json.dumps(child_spec(run, device, folder))
    cmd = [sys.executable, str(ROOT / "tools" / "bench_tp.py"), "--child", "throughput", spec]
    outcome = run_child(cmd, ROOT, env, timeout)
    lines = [line for line in outcome.stdout.splitlines() if line.startswith(RESULT)]
    problems = problems_of(outcome, f"the child of {run}", timeout)
    print("\n".join(problems), end="\n" if problems else "", flush=True)
    if outcome.returncode != 0 or not lines:
        return dict(error="timed out" if outcome.timed_out else f"exit code {outcome.returncode}")
    return {**json.loads(lines[-1].removeprefix(RESULT)), "child_s": outcome.seconds}


# ------------------------------------------------------------------------------ the table
def table_name(device: str) -> str:
    return f"ch16-tp-{'gpu' if device == 'cuda' else 'cpu'}.md"


def write_outputs(
    out_dir: Path, device: str, results: List[Dict], gpus: int, side_by_side: bool
) -> None:
    """The table, and the JSON it is made from (`--from-json` makes the table again)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    saved = dict(device=device, gpus=gpus, side_by_side=side_by_side, results=results)
    (out_dir / table_name(device)).with_suffix(".json").write_text(json.dumps(saved, indent=1))
    (out_dir / table_name(device)).write_text(table(device, results, gpus, side_by_side))


def step_numbers(result: Dict, device: str) -> Tuple[float, float, bool]:
    """(a decode step, its all-reduces), seconds, the mean over the ranks' windows (on GPUs
    the GPU time of the step's kernels, on the CPU its wall time); and whether a window held
    something else than decode steps at the probe's batch size."""
    windows, batch = result["windows"], SETTINGS[device].probe["batch"]
    step = [w["device_s" if device == "cuda" else "wall_s"] / w["steps"] for w in windows]
    reduce = [w["all_reduce_s"] / w["steps"] for w in windows]
    mixed = any(w["prefills"] or w["batch_sizes"] != [batch] for w in windows)
    return sum(step) / len(step), sum(reduce) / len(reduce), mixed


def table(device: str, results: List[Dict], gpus: int, side_by_side: bool) -> str:
    order = {shape: i for i, shape in enumerate(SHAPES)}
    results = sorted(results, key=lambda r: (order[r["shape"]], not r["graphs"], r["tp"]))
    base = {(r["shape"], r["graphs"]): r["tokens"] / r["seconds"]
            for r in results if r["tp"] == 1 and "error" not in r}  # fmt: skip
    batch = SETTINGS[device].probe["batch"]
    rows = [
        f"| model | CUDA graphs | TP | output tokens | seconds | output tokens/s | vs TP=1 | "
        f"decode step at batch {batch}, ms | all-reduce per step, µs | all-reduce share |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        head = f"| {SHAPES[r['shape']].label} | {'on' if r['graphs'] else 'off'} | {r['tp']} |"
        if "error" in r:  # in the tokens/s column
            rows.append(head + " |" * 2 + f" {r['error']} |" + " |" * 4)
            continue
        rate = r["tokens"] / r["seconds"]
        one = base.get((r["shape"], r["graphs"]))
        step, reduce, mixed = step_numbers(r, device)
        reduced = f"{reduce * 1e6:,.0f} | {reduce / step:.0%}" if r["tp"] > 1 else "- | -"
        rows.append(
            f"{head} {r['tokens']:,} | {r['seconds']:.1f} | {rate:,.0f} | "
            f"{f'{rate / one:.2f}x' if one else '-'} | {step * 1e3:.2f}{' *' if mixed else ''} "
            f"| {reduced} |"
        )
    return "\n".join(rows) + "\n\n" + notes(device, results, gpus, side_by_side)


def notes(device: str, results: List[Dict], gpus: int, side_by_side: bool) -> str:
    """What the table's numbers are, and where they were measured."""
    done = [r for r in results if "error" not in r]
    if not done:
        return "No configuration finished.\n"
    first, settings = done[0], SETTINGS[device]
    probe, machine = settings.probe, first["machine"]
    work = (
        f"{first['requests']} requests, {first['prompt_tokens']:,} prompt and "
        f"{first['tokens']:,} output tokens, temperature 0.6, EOS ignored"
    )
    window = (
        f"{probe['batch']} requests of 32-token prompts decoded together; on every rank "
        f"torch.profiler recorded decode steps {probe['skip'] + 1} to "
        f"{probe['skip'] + probe['steps']}"
    )
    if device != "cuda":
        return (
            "A CPU check of the script, not a measurement to quote: tiny Qwen3's shape, random "
            f"weights, float32, gloo; {work}. The decode step: {window}; its wall time, and "
            f"the time of gloo's all-reduce work. {machine['cpu']}, {machine['cores']} cores, "
            f"torch {machine['torch']}. Made by `python tools/bench_tp.py throughput --device "
            "cpu`.\n\n" + what_the_windows_held(device, done)
        )
    together = (
        "Configurations that need fewer GPUs than the machine has ran side by side, on "
        "disjoint GPUs." if side_by_side else "One configuration at a time."
    )  # fmt: skip
    paragraphs = [
        f"Upstream's offline workload (tools/bench_gpu.py's `workload`): {work}. Random weights "
        "in bfloat16, FlashInfer attention, page size 256, prefill batches of at most 16,384 "
        "tokens, overlap scheduling on; CUDA graphs of the decode step up to batch 256 where "
        "on. Qwen3-8B's shape: 36 layers, hidden 4,096, MLP 12,288, 32 query and 8 key/value "
        "heads of 128, vocabulary 151,936, untied LM head.",
        f"Each configuration in a fresh process: its ranks (one GPU each, NCCL), "
        f"{settings.warmup} warm-up requests, then the timed run: every request in one "
        f"message to rank 0, the clock from the send to the last token. {together}",
        f"The decode step, after the timed run: {window}: the GPU time of all kernels per "
        "step, and of NCCL's all-reduce kernels (two per layer and one for the embedding; the "
        "LM head's all-gather is not counted), the mean over the ranks. A collective's kernel "
        "runs until every rank has reached it: its time includes the wait for the slowest "
        "rank.",
        f"Measured on {gpus} x {machine['gpu']}, torch {machine['torch']}, CUDA "
        f"{machine['cuda']}, NCCL {machine['nccl']}, FlashInfer {machine['flashinfer']}, "
        "NVLink multicast off (NCCL_NVLS_ENABLE=0). Made by `python tools/bench_tp.py "
        "throughput`.",
    ]
    return "\n\n".join(paragraphs) + "\n\n" + what_the_windows_held(device, done)


def what_the_windows_held(device: str, results: List[Dict]) -> str:
    """The collectives the profiler saw, and the meaning of a step time marked *."""
    seen = sorted({name for r in results for w in r["windows"] for name in w["collectives"]})
    text = f"Collectives seen in the windows: {', '.join(seen) or 'none'}.\n"
    if any(step_numbers(r, device)[2] for r in results):
        text += "\n* The window held a prefill, or another batch size (the JSON says which).\n"
    return text
