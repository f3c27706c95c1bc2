"""Project P1's numbers: the physical limit of upstream's offline workload on a GPU, the
engine before and after the project and beside the official one, and where the time goes.

    python tools/bench_p1.py limit          # the roofline of the workload (any machine)
    python tools/bench_p1.py ab [--files F,...]
                                            # on an NVIDIA GPU: docs/data/p1-ab.md
    python tools/bench_p1.py side --official UPSTREAM/python [--official-site DIR]
                                            # this engine and the official one: p1-side.md
    python tools/bench_p1.py options [--official UPSTREAM/python]
                                            # without each of the project's kernels: p1-options.md
    python tools/bench_p1.py batch [--official UPSTREAM/python]
                                            # throughput against batch size: p1-batch.{md,json}
    python tools/bench_p1.py profile [--official UPSTREAM/python]
                                            # where the time goes, in both: p1-profile.md
    python tools/bench_p1.py attention      # the decode attention kernel alone
    python tools/bench_p1.py attention-run  # ... at the shapes of the run's decode steps
    python tools/bench_p1.py norms-rope     # the fused q/k norms and RoPE against FlashInfer
    python tools/bench_p1.py kv-store       # that kernel storing k and v, or the store's kernel
    python tools/bench_p1.py pdl            # a layer's attention, launched early (PDL) or not
    python tools/bench_p1.py gate-up        # the gate/up product and SiLU in one kernel
    python tools/bench_p1.py decode-kernels [--set options|settings|tma|parts|loop]
                                            # the book's decode kernel against FlashInfer's
    python tools/bench_p1.py sampler        # the Gumbel-max sampler against FlashInfer's
    python tools/bench_p1.py matmuls        # the decode steps' matrix products, cuBLAS(Lt)
    python tools/bench_p1.py split-k        # o and down split over K, in Triton, vs cuBLAS
    python tools/bench_p1.py split-k-norm   # the same, its second kernel the add-and-norm
    python tools/bench_p1.py compiled       # the decode kernel as compiled for Hopper (no GPU)
    python tools/bench_p1.py counters [--set loop] [--steps 129,577]
                                            # ... under Nsight Compute: what its warps wait on

**limit.** A lower bound on the time of the workload on one H200, from three facts of the
hardware and the shapes alone: a prefill is bound by arithmetic (two FLOPs per weight per
prompt token, plus causal attention), a decode step by memory (every weight read once per
step, every cached key and value of every running request read once per step). The
schedule is the best one the workload allows: every request admitted at once (its 256
requests fit the KV cache), so the decode steps are as few as the longest output.

**ab.** Builds two chapters' trees with `tools/steps.py build` (chapter 22, the engine before
the project, and P1's) and runs upstream's offline benchmark in each (`tools/bench_gpu.py`'s
full configuration: FlashInfer, CUDA graphs, overlap, custom kernels), alternating, each run a
fresh process, after one run of each that is not counted (it fills the kernel caches). The
table gives every run, the means, the spread and the ratio, and each mean as a fraction of
the limit. With `--files`, one change at a time: P1's tree against a copy of it in which only
those files are chapter 22's.

**side.** This checkout's engine and the official mini-sglang (`tools/bench_gpu.py
--official`: upstream's sources from a folder outside the repository), the same way:
alternating, fresh processes, one uncounted run of each first. The table gives the ratio of
the means, this engine's over the official one's: the project's bar is 1.10.

**options.** This engine as it is, then with each of the project's kernels turned off by its
environment variable (`OPTIONS`), then with all of them off, and the official engine if its
sources are given: alternating as `side` runs them. The table adds each engine's mean time per
forward step (the run's wall time over its prefill and decode steps, counted in the run) and
the ratio of each mean to this engine's.

**batch.** Decode throughput with b requests at once, b from 1 to 256: b prompts of 256
random ids, 256 new tokens each (chapter 21's sweep), each engine timing every size `--rounds`
times in one process (the best is kept), beside the limit of the same requests on this GPU.

**profile.** Two more runs of each engine: one with torch.profiler recording the GPU's
kernels (seconds of each part in the timed run), one with the scheduler's functions timed
(milliseconds per scheduler turn; its wall time gives the GPU's busy share), the engines side
by side. `--from-json` makes the tables again from a run's saved results.

**attention, attention-run.** FlashInfer's decode attention for one layer, timed with CUDA
events: in the variants the engine could use at three full shapes, and at the shapes of the
workload's own decode steps.

**norms-rope.** The q and k norms and RoPE of one layer of Qwen3-0.6B's shape, in bfloat16: as
FlashInfer's three kernels and as the book's one Triton kernel, at decode and prefill token
counts. First each result is compared with the same arithmetic in float32 (the largest error,
in bfloat16 steps at 1.0, the size of a normalised value), then
each is timed as a CUDA graph of 20 calls (a decode step is replayed as a graph: the launches
cost what they cost there, not what the host pays to issue them).

**kv-store.** The same kernel for one layer of Qwen3-0.6B's shape, in bfloat16, then the
engine's KV store (two launches), against the kernel storing the keys and values itself (one),
at decode and prefill token counts, into a pool of 65,536 slots at slots drawn at random: the
two pools and the two q's are compared byte for byte, then each is timed as a CUDA graph of 20
calls.

**pdl.** The attention half of one layer of Qwen3-0.6B's shape in bfloat16, as the engine
runs it at decode: the q/k/v product, the norms-and-RoPE kernel storing k and v, the decode
attention's two kernels (the engine's settings, pages of 256), the o product. With
`MINISGL_TRITON_PDL`'s launches and without, at several batches of 1,024 or 4,096 keys per
request: first the outputs and pools are compared byte for byte, then each is timed as a
CUDA graph of 20 calls. Then the engine on the tiny Qwen3, greedy, both ways, token for token.

**gate-up.** The MLP's gate/up product and SiLU of one layer of Qwen3-0.6B's shape in
bfloat16, as cuBLAS's product and FlashInfer's SiLU-and-mul (two launches) and as the book's
one Triton kernel (`MINISGL_FUSED_GATE_UP_SILU`), at the batch of every 16th decode step of
the run padded to its CUDA graph, each timed as a CUDA graph of 20 calls: the kernel with the
engine's tile for the batch, and at every 64th step with each tile of `GATE_UP_CANDIDATES`,
the fastest kept. The whole run's saving estimated from them; then the engine on the tiny
Qwen3, greedy, both ways (its sums run in another order, so a token may differ).

**sampler.** Temperature sampling of a decode batch's bfloat16 logits (Qwen3's 151,936
tokens, temperature 0.6), as upstream samples (a float32 copy, FlashInfer's softmax, its draw
from the probabilities) and by the book's Gumbel-max kernel, at four batch sizes, each timed
in a CUDA graph (or, where its capture fails, with CUDA events around calls issued from
Python; the table says which), beside the time of reading the logits once. Then both draw
16,384 tokens from logits whose mass lies on 8 tokens, and their frequencies are compared
with the softmax's probabilities.

**decode-kernels.** The decode attention at the shapes of every 64th decode step of the run,
by FlashInfer's kernel and by the book's Triton kernel in one set of its settings
(`DECODE_KERNEL_SETS`), each replayed in a CUDA graph: TB/s of keys and values read, the
whole run's estimate, and the largest difference from FlashInfer's output.

**matmuls.** The matrix products of a decode step (q/k/v, o, gate/up and down of one layer,
and the LM head) at the batch of every 16th step of the run, padded to its CUDA graph's size,
by cuBLAS and cuBLASLt, each in a CUDA graph: against reading the weights once per step.

**split-k.** The two products with 1,024 outputs, o and down, at batches 1 to 64: cuBLAS
against a Triton product that cuts the sum over the inputs into slices
(`tools/split_k.py`), each setting of it (slices, tile sizes) timed in a CUDA graph and the
fastest kept, with its largest difference from cuBLAS's result.

**split-k-norm.** o and down as a decode step runs them, each followed by the add-and-norm
of the residual stream, at the batch of every 128th step of the run: cuBLAS and FlashInfer's
`fused_add_rmsnorm` against the split product whose second kernel does the add-and-norm
(`minisgl/kernel/triton/product_add_norm.py`), with the engine's tiles and the fastest of
its settings (slices, tiles) at each batch; then the engine's tokens with it and without. Every call
of a timing reads its own copy of the weights, as a layer does, not a copy the L2 still
holds; the whole run's estimate; the largest difference from FlashInfer's result.

**compiled.** On any machine: the decode kernel's pieces as Triton compiles them for the
H100 and H200, with the alignment a launch from the engine gives (`tools/compiled_kernel.py`):
registers, shared memory, programs per SM, and the PTX's loads, stores and products.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Sequence, Set, Tuple

if TYPE_CHECKING:
    import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OUT = ROOT / "docs" / "data" / "p1-ab.md"
SIDE_OUT = ROOT / "docs" / "data" / "p1-side.md"
PROFILE_OUT = ROOT / "docs" / "data" / "p1-profile.md"
OPTIONS_OUT = ROOT / "docs" / "data" / "p1-options.md"
BATCH_OUT = ROOT / "docs" / "data" / "p1-batch.md"
ATTENTION_OUT = ROOT / "docs" / "data" / "p1-attention.md"
ATTENTION_RUN_OUT = ROOT / "docs" / "data" / "p1-attention-run.md"
DECODE_KERNELS_OUT = {
    "options": ROOT / "docs" / "data" / "p1-decode-options.md",
    "settings": ROOT / "docs" / "data" / "p1-decode-settings.md",
    "tma": ROOT / "docs" / "data" / "p1-decode-tma.md",
    "parts": ROOT / "docs" / "data" / "p1-decode-parts.md",
    "loop": ROOT / "docs" / "data" / "p1-decode-loop.md",
    "layout": ROOT / "docs" / "data" / "p1-decode-layout.md",
    "occupancy": ROOT / "docs" / "data" / "p1-decode-occupancy.md",
    "merge": ROOT / "docs" / "data" / "p1-decode-merge.md",
}
NORMS_ROPE_OUT = ROOT / "docs" / "data" / "p1-norms-rope.md"
KV_STORE_OUT = ROOT / "docs" / "data" / "p1-kv-store.md"
PDL_OUT = ROOT / "docs" / "data" / "p1-pdl.md"
GATE_UP_OUT = ROOT / "docs" / "data" / "p1-gate-up.md"
# (rows, intermediate columns, inputs a load, stages): the tiles gate-up tries, 4 warps each,
# those whose loads in flight (x's and two weights' tiles, 2 bytes each) fit in 200 KiB
GATE_UP_CANDIDATES = [
    (m, n, k, stages)
    for m in (16, 32, 64, 128) for n in (16, 32, 64, 128) for k in (64, 128) for stages in (3, 4)
    if stages * (m + 2 * n) * k * 2 <= 200 * 1024
]  # fmt: skip
SAMPLER_OUT = ROOT / "docs" / "data" / "p1-sampler.md"
MATMULS_OUT = ROOT / "docs" / "data" / "p1-matmuls.md"
SPLIT_K_OUT = ROOT / "docs" / "data" / "p1-split-k.md"
SPLIT_K_BATCHES = (1, 8, 16, 32, 64)
# (slices of K, outputs per tile, inputs per load): the settings split-k tries
SPLIT_K_SETTINGS = [(s, n, k) for s in (2, 4, 8, 16) for n in (32, 64, 128) for k in (64, 128)]
SPLIT_K_NORM_OUT = ROOT / "docs" / "data" / "p1-split-k-norm.md"
# (slices of K, rows per tile, outputs per tile, inputs per load): what split-k-norm tries
SPLIT_K_NORM_SETTINGS = [
    (s, m, n, k)
    for s in (1, 2, 4, 8) for m in (16, 32, 64, 128) for n in (32, 64, 128) for k in (64, 128)
]  # fmt: skip
COLD_WEIGHTS = 20  # copies of a weight, one per call of a timing: more than the L2 holds
RUN_TIMEOUT_S = 150  # one benchmark run: imports, start-up, warm-up and about 7 s timed
# logits of 8 tokens, all of different sizes: the samplers' draws are checked against them
SAMPLER_LOGITS = [2.0, 1.0, 0.5, 0.0, -1.0, 1.5, 0.2, -3.0]


@dataclass(frozen=True)
class Hardware:
    name: str
    memory_bytes_per_s: float  # HBM bandwidth
    bf16_flops_per_s: float  # dense tensor-core peak


# NVIDIA's H200 SXM datasheet: 4.8 TB/s of HBM3e; 1,979 TFLOPS of BF16 with 2:4 sparsity,
# so 989.5 dense
H200 = Hardware("NVIDIA H200 SXM", memory_bytes_per_s=4.8e12, bf16_flops_per_s=989.5e12)
# the H100 SXM datasheet: 3.35 TB/s of HBM3, the same 989.5 dense bf16 TFLOPS
H100 = Hardware("NVIDIA H100 SXM", memory_bytes_per_s=3.35e12, bf16_flops_per_s=989.5e12)


def this_gpu() -> Hardware:
    """The datasheet for the limit on the GPU this process sees: the H100 SXM's on one (torch
    names it "NVIDIA H100 80GB HBM3"), else the H200's, the GPU the page's limit is for."""
    import torch

    name = torch.cuda.get_device_name() if torch.cuda.is_available() else ""
    return H100 if "H100" in name and "PCIe" not in name else H200


@dataclass(frozen=True)
class Shape:
    """What the limit needs to know of a decoder: counted from its config."""

    layer_weights: int  # parameters of one decoder layer (its matrices)
    lm_head_weights: int  # vocab x hidden, read once per step (tied or not)
    kv_bytes_per_token: int  # keys and values of one token, every layer
    attention_width: int  # query heads x head_dim: one key or value row's FLOPs per layer
    num_layers: int
    itemsize: int  # bytes of a weight

    @classmethod
    def from_config(cls, config: Dict, itemsize: int = 2) -> Shape:
        hidden, inter = config["hidden_size"], config["intermediate_size"]
        heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
        head_dim = config.get("head_dim", hidden // heads)
        layers = config["num_hidden_layers"]
        attention = hidden * head_dim * (2 * heads + 2 * kv_heads)  # q, o; k, v
        mlp = 3 * hidden * inter  # gate, up, down
        return cls(
            layer_weights=attention + mlp,
            lm_head_weights=config["vocab_size"] * hidden,
            kv_bytes_per_token=2 * layers * kv_heads * head_dim * itemsize,
            attention_width=heads * head_dim,
            num_layers=layers,
            itemsize=itemsize,
        )

    @property
    def matmul_weights(self) -> int:
        """Weights each token multiplies: every layer's matrices and the LM head."""
        return self.num_layers * self.layer_weights + self.lm_head_weights


@dataclass(frozen=True)
class Limit:
    prefill_s: float  # arithmetic of every prompt token
    decode_s: float  # each step: its bytes or its arithmetic, whichever takes longer
    decode_weights_s: float  # of which: every weight read once per step
    decode_kv_s: float  # and every cached key and value read once per step
    decode_steps: int
    output_tokens: int
    hardware: str  # the GPU it is for

    @property
    def seconds(self) -> float:
        return self.prefill_s + self.decode_s

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds


def limit(
    shape: Shape, prompt_lens: Sequence[int], output_lens: Sequence[int], hw: Hardware = H200
) -> Limit:
    """The workload's lower bound on `hw`, as the module's docstring says. The first output
    token of a request comes from its prefill; the other `n - 1` from decode steps, step s
    (1, 2, ...) attending to the prompt and s tokens."""
    flops = 0.0
    for n in prompt_lens:
        flops += 2 * shape.num_layers * shape.layer_weights * n  # the layers' matrices
        flops += 2 * 2 * shape.num_layers * shape.attention_width * n * (n + 1) / 2  # QK, PV
        flops += 2 * shape.lm_head_weights  # the last token's logits
    steps = max(output_lens) - 1
    weight_bytes = shape.matmul_weights * shape.itemsize
    decode_s = weights_s = kv_s = 0.0
    for step in range(1, steps + 1):
        contexts = [n_in + step for n_in, n_out in zip(prompt_lens, output_lens) if n_out > step]
        kv_bytes = sum(contexts) * shape.kv_bytes_per_token
        step_flops = 2 * shape.matmul_weights * len(contexts)
        step_flops += 2 * 2 * shape.num_layers * shape.attention_width * sum(contexts)
        memory_s = (weight_bytes + kv_bytes) / hw.memory_bytes_per_s
        decode_s += max(memory_s, step_flops / hw.bf16_flops_per_s)
        weights_s += weight_bytes / hw.memory_bytes_per_s
        kv_s += kv_bytes / hw.memory_bytes_per_s
    return Limit(
        prefill_s=flops / hw.bf16_flops_per_s,
        decode_s=decode_s,
        decode_weights_s=weights_s,
        decode_kv_s=kv_s,
        decode_steps=steps,
        output_tokens=sum(output_lens),
        hardware=hw.name,
    )


def workload_limit(hw: Hardware = H200) -> Limit:
    """The limit of upstream's offline workload (256 requests from random.seed(0)) with
    Qwen3-0.6B's shape in bf16."""
    from minisgl.benchmark.offline import make_offline_workload
    from tools.bench_gpu import QWEN3_0_6B

    work = make_offline_workload()
    outputs = [p.max_tokens for p in work.sampling_params]
    return limit(Shape.from_config(QWEN3_0_6B), [len(p) for p in work.prompts], outputs, hw)


def show_limit(result: Limit, hw: Hardware = H200) -> None:
    print(f"on one {hw.name}: {hw.memory_bytes_per_s / 1e12:.1f} TB/s, "
          f"{hw.bf16_flops_per_s / 1e12:.1f} dense bf16 TFLOP/s")  # fmt: skip
    rows = [
        ("prefill, arithmetic", result.prefill_s),
        (f"decode, {result.decode_steps} steps", result.decode_s),
        ("  reading the weights", result.decode_weights_s),
        ("  reading the keys and values", result.decode_kv_s),
        ("the limit", result.seconds),
    ]
    for what, seconds in rows:
        print(f"{what:30s} {seconds:5.2f} s")
    print(f"output tokens {result.output_tokens:,}: at most {result.tokens_per_s:,.0f} per second")


# ------------------------------------------------------------------------------- a/b
def build_tree(chapter: str, out: Path) -> Path:
    subprocess.run(
        [sys.executable, str(ROOT / "tools" / "steps.py"), "build", chapter, "--out", str(out)],
        check=True,
        capture_output=True,
    )
    return out


def run_tree(tree: Path) -> Dict:
    from tools.bench_gpu import run_for_result

    return run_for_result([str(tree / "tools" / "bench_gpu.py"), "--child", "fi-graphs"],
                          RUN_TIMEOUT_S)  # fmt: skip


def step_ms(result: Dict) -> float | None:
    """A run's mean time per forward step (prefill and decode), where the run counted them."""
    steps = result.get("prefill_steps", 0) + result.get("decode_steps", 0)
    return 1000 * result["seconds"] / steps if steps else None


def runs_table(
    runs: Dict[str, List[Dict]], result: Limit, ratio: str, base: str | None = None
) -> str:
    """Every run's output tokens per second, the means, their spread, and each mean as a
    fraction of the limit; the means' ratios to engine `base` (the last one by default)."""
    import torch

    counted = all(step_ms(r) is not None for results in runs.values() for r in results)
    rows = [
        "| engine | runs (output tokens/s) | mean | spread | of the limit |"
        + (" ms per step |" if counted else ""),
        "| --- | --- | ---: | ---: | ---: |" + (" ---: |" if counted else ""),
    ]
    means = {}
    for label, results in runs.items():
        rates = [r["tokens"] / r["seconds"] for r in results]
        means[label] = statistics.mean(rates)
        spread = (max(rates) - min(rates)) / means[label]
        row = (
            f"| {label} | {', '.join(f'{r:,.0f}' for r in rates)} | {means[label]:,.0f} | "
            f"{spread:.1%} | {means[label] / result.tokens_per_s:.0%} |"
        )
        if counted:
            row += f" {statistics.mean(step_ms(r) for r in results):.2f} |"  # type: ignore[misc]
        rows.append(row)
    base = base or list(means)[-1]
    others = [(k, m) for k, m in means.items() if k != base]
    if len(others) == 1:
        ratios = f"{ratio}: {others[0][1] / means[base]:.3f}"
    else:
        ratios = f"Ratios to {base}: " + "; ".join(f"{k} {m / means[base]:.3f}" for k, m in others)
    if counted:
        pairs = {(r["prefill_steps"], r["decode_steps"]) for rs in runs.values() for r in rs}
        made = " to ".join(f"{p} + {d}" for p, d in sorted(pairs)[:: max(1, len(pairs) - 1)])
        ratios += (
            ". A step is one forward pass of the model; the runs made"
            f" {made} prefill + decode steps"
        )
    return (
        "\n".join(rows) + f"\n\n{ratios}. The limit: {result.seconds:.2f} s, "
        f"{result.tokens_per_s:,.0f} output tokens/s ({result.hardware}). Measured on one "
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}, "
        f"{sum(len(r) for r in runs.values())} runs in all ({rounds_words(runs)}), alternating.\n"
    )


def alternate(
    engines: Dict[str, Callable[[], Dict]],
    rounds: int,
    warm: Sequence[str] | None = None,
    after_round: Callable[[Dict[str, List[Dict]]], None] | None = None,
) -> Dict[str, List[Dict]]:
    """Run each engine (or each of `warm`) once uncounted (it fills the kernel caches on
    disk), then `rounds` times each, taking turns; `after_round` sees the runs so far after
    each round (a table written then survives a run cut short)."""
    for label, run in engines.items():
        if warm is None or label in warm:
            print(f"warm-up {label}: {run()}", flush=True)
    runs: Dict[str, List[Dict]] = {label: [] for label in engines}
    for round in range(rounds):
        for label, run in engines.items():
            runs[label].append(run())
            print(f"round {round + 1} {label}: {runs[label][-1]}", flush=True)
        if after_round is not None:
            after_round(runs)
    return runs


def ab(before: str, after: str, rounds: int, out: Path, files: List[str] | None = None) -> None:
    """Chapter `before`'s tree against chapter `after`'s; given `files`, `after`'s tree
    against itself with only those files as `before` has them (one change of the project)."""
    work = Path(tempfile.mkdtemp(prefix="minisgl-p1-ab-"))
    try:
        trees = {f"project {after}": build_tree(after, work / after)}
        if files:
            old = build_tree(before, work / before)
            mixed = work / "mixed"
            shutil.copytree(trees[f"project {after}"], mixed)
            for name in files:
                shutil.copy(old / name, mixed / name)
            trees[f"project {after}, {', '.join(files)} of chapter {before}"] = mixed
        else:
            trees[f"chapter {before}"] = build_tree(before, work / before)
        runs = alternate(
            {k: functools.partial(run_tree, tree) for k, tree in trees.items()}, rounds
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out.write_text(runs_table(runs, workload_limit(this_gpu()), f"Ratio {after} / {before}"))
    print(out.read_text())


def rounds_words(runs: Dict[str, List]) -> str:
    """How many runs each engine made, in words: "3 rounds of 2 engines" where all made as
    many, else each engine's count."""
    counts = {len(r) for r in runs.values()}
    if len(counts) == 1:
        n = counts.pop()
        engines = f"{len(runs)} engine{'s' if len(runs) != 1 else ''}"
        return f"{n} round{'s' if n != 1 else ''} of {engines}"
    return ", ".join(f"{label} {len(r)}" for label, r in runs.items())


def variant_environment(settings: str) -> Dict[str, str]:
    """`NAME=VALUE,...` as a dictionary; a part whose name is not in capitals belongs to the
    value before it, so that a value may hold commas itself:
    `MINISGL_TRITON_DECODE_SETTINGS=page_loop=1,block_n=32` is one variable."""
    env: Dict[str, str] = {}
    name = None
    for part in settings.split(","):
        key, _, value = part.partition("=")
        if name is not None and not key.isupper():
            env[name] += "," + part
        else:
            name, env[key] = key, value
    return env


def engines(
    source: Path | None,
    site: Path | None,
    variants: Sequence[str] = (),
    jobs: List[Dict] | None = None,
) -> Dict[str, Callable[..., Any]]:
    """label -> run(profile=None): this checkout's engine, each of its `variants` ("LABEL:
    NAME=VALUE,...": the engine with those environment variables), and, given its sources,
    upstream's; on the workload, or on `jobs` (then a run gives a result per job)."""
    from tools.bench_gpu import run_in_child, run_official_in_child

    given = {} if jobs is None else {"jobs": jobs}
    runs: Dict[str, Callable[..., Any]] = {
        "this engine": functools.partial(run_in_child, "fi-graphs", **given)
    }
    for variant in variants:
        label, _, settings = variant.partition(":")
        env = variant_environment(settings)
        runs[f"this engine, {label}"] = functools.partial(
            run_in_child, "fi-graphs", env=env, **given
        )
    if source is not None:
        runs["official mini-sglang"] = functools.partial(
            run_official_in_child, source, site, **given
        )
    return runs


def side(source: Path, site: Path | None, rounds: int, out: Path, variants: List[str]) -> None:
    bound = workload_limit(this_gpu())

    def write(measured: Dict[str, List[Dict]]) -> None:
        out.write_text(runs_table(measured, bound, "Ratio this engine / official"))

    alternate(engines(source, site, variants), rounds, after_round=write)
    print(out.read_text())


# the project's kernels, each of which the engine can run without: (what the row says, the
# environment that turns it off)
OPTIONS: List[Tuple[str, Dict[str, str]]] = [
    ("without the sampler of one pass", {"MINISGL_GUMBEL_SAMPLING": "0"}),
    ("without the fused norms and RoPE", {"MINISGL_FUSED_QK_NORM_ROPE": "0"}),
    ("without the decode kernel of equal pieces", {"MINISGL_TRITON_DECODE": "0"}),
]


def options(source: Path | None, site: Path | None, rounds: int, out: Path) -> None:
    """This engine, then without each of the project's kernels, then without all of them,
    then (given its sources) the official engine: alternating as `side` does. Only this
    engine and the official one get an uncounted run: the variants run kernels that this
    engine's uncounted run compiled, or FlashInfer's, which the kit's cache holds."""

    def variant(label: str, env: Dict[str, str]) -> str:  # as `side --variant` takes them
        return f"{label}:" + ",".join(f"{k}={v}" for k, v in env.items())

    everything = {k: v for _, env in OPTIONS for k, v in env.items()}
    variants = [variant(label, env) for label, env in OPTIONS]
    runs = engines(source, site, variants + [variant("without all three", everything)])
    bound = workload_limit(this_gpu())
    switches = "; ".join(
        f"{label}, {', '.join(f'`{k}={v}`' for k, v in env.items())}" for label, env in OPTIONS
    )

    def write(measured: Dict[str, List[Dict]]) -> None:
        table = runs_table(measured, bound, "", base="this engine")
        out.write_text(table + f"\nThe kernels turned off by: {switches}.\n")

    alternate(runs, rounds, warm=["this engine", "official mini-sglang"], after_round=write)
    print(out.read_text())


BATCH_SIZES = [1, 2, 4, 8, 16, 32, 64, 128, 256]
BATCH_PROMPT, BATCH_NEW = 256, 256


def batch_jobs(sizes: Sequence[int] = BATCH_SIZES, round: int = 0) -> List[Dict[str, List]]:
    """For each size b: b prompts of BATCH_PROMPT random ids below 10,000, each to generate
    BATCH_NEW tokens, as chapter 21's batch sweep makes them (seeded by b); a later `round`
    draws other prompts, so that no engine finds them in its prefix cache."""
    import random

    jobs = []
    for b in sizes:
        rng = random.Random(b + 1_000_000 * round)
        prompts = [[rng.randint(0, 10000) for _ in range(BATCH_PROMPT)] for _ in range(b)]
        jobs.append(dict(prompts=prompts, new_tokens=[BATCH_NEW] * b))
    return jobs


def batch_limits(hw: Hardware, sizes: Sequence[int] = BATCH_SIZES) -> List[Dict[str, float]]:
    """The limit of each of `batch_jobs`: all of a job's requests at once, as the run has them."""
    from tools.bench_gpu import QWEN3_0_6B

    shape = Shape.from_config(QWEN3_0_6B)
    found = []
    for b in sizes:
        bound = limit(shape, [BATCH_PROMPT] * b, [BATCH_NEW] * b, hw)
        found.append(dict(batch=b, seconds=bound.seconds, tokens_per_s=bound.tokens_per_s))
    return found


def batch(
    source: Path | None, site: Path | None, repeat: int, out: Path, variants: Sequence[str] = ()
) -> None:
    """Throughput against batch size: each engine (and each of this engine's `variants`, as
    `side` takes them) in one fresh process runs `batch_jobs` `repeat` times over (the best of
    each size is kept), beside each size's limit."""
    import torch

    jobs = [job for round in range(repeat) for job in batch_jobs(round=round)]
    runs = engines(source, site, variants, jobs=jobs)
    curves = {}
    for label, run in runs.items():
        best: Dict[int, Dict] = {}
        for point in run():
            if point["batch"] not in best or point["seconds"] < best[point["batch"]]["seconds"]:
                best[point["batch"]] = point
        curves[label] = [best[b] for b in BATCH_SIZES]
        print(f"{label}: {curves[label]}", flush=True)
    hw = this_gpu()
    data = dict(
        machine=f"One {torch.cuda.get_device_name()}, torch {torch.__version__}",
        hardware=hw.name, prompt_len=BATCH_PROMPT, new_tokens=BATCH_NEW, repeat=repeat,
        curves=curves, limit=batch_limits(hw),
    )  # fmt: skip
    out.with_suffix(".json").write_text(json.dumps(data, indent=1) + "\n")
    out.write_text(batch_table(data))
    print(out.read_text())


def batch_table(data: Dict) -> str:
    labels = list(data["curves"])
    rows = [
        "| requests at once | " + " | ".join(labels) + " | the limit | "
        + " | ".join(f"{label}, of the limit" for label in labels) + " |",
        "| ---: |" + " ---: |" * (2 * len(labels) + 1),
    ]  # fmt: skip
    for i, bound in enumerate(data["limit"]):
        rates = [data["curves"][k][i]["tokens"] / data["curves"][k][i]["seconds"] for k in labels]
        rows.append(
            f"| {bound['batch']} | " + " | ".join(f"{r:,.0f}" for r in rates)
            + f" | {bound['tokens_per_s']:,.0f} | "
            + " | ".join(f"{r / bound['tokens_per_s']:.0%}" for r in rates) + " |"
        )  # fmt: skip
    return (
        "\n".join(rows)
        + f"\n\nOutput tokens per second: each size b is b prompts of {data['prompt_len']} random"
        f" ids, {data['new_tokens']} new tokens each, the best of {data['repeat']} runs in one"
        f" process per engine. The limit: {data['hardware']}. {data['machine']}.\n"
    )


def profile(
    source: Path | None, site: Path | None, out: Path, only: List[str], variants: List[str]
) -> None:
    """Two profiled runs of each engine: the GPU's kernels by part, and the host's functions
    (ms per scheduler turn). The results go to out's .json, the tables to out."""
    import torch

    results: Dict[str, Dict] = {}
    for label, run in engines(source, site, variants).items():
        if only and label not in only:
            continue
        results[label] = dict(
            machine=f"One {torch.cuda.get_device_name()}, torch {torch.__version__}"
        )
        for what in ("kernels", "host"):
            results[label][what] = run(profile=what)
            print(f"{label}, {what}: {json.dumps(results[label][what])}", flush=True)
    out.with_suffix(".json").write_text(json.dumps(results, indent=1))
    out.write_text(profile_tables(results))
    print(out.read_text())


def gpu_parts(results: Dict[str, Dict]) -> Dict[str, Dict[str, float]]:
    """engine -> part -> seconds of GPU time in `profile`'s kernel run (chapter 21's parts)."""
    from tools.bench_ablation import gpu_part

    parts: Dict[str, Dict[str, float]] = {label: {} for label in results}
    for label, result in results.items():
        for name, seconds in result["kernels"]["kernels"].items():
            part = gpu_part(name)
            parts[label][part] = parts[label].get(part, 0.0) + seconds
    return parts


def profile_tables(results: Dict[str, Dict]) -> str:
    """The tables of `profile`'s results. The GPU's busy share is the kernels' time over the
    wall time of the run with timers (the profiler's own run is slower: it records every
    launch)."""
    labels = list(results)
    parts = gpu_parts(results)
    order = sorted(parts[labels[0]], key=lambda part: -parts[labels[0]][part])
    gpu_rows = ["| GPU time, s | " + " | ".join(labels) + " |", "| --- |" + " ---: |" * len(labels)]
    for part in order:
        gpu_rows.append(
            f"| {part} | " + " | ".join(f"{parts[k].get(part, 0):.2f}" for k in labels) + " |"
        )
    kernels = {label: sum(parts[label].values()) for label in labels}
    wall = {label: results[label]["host"]["seconds"] for label in labels}
    gpu_rows += [
        "| all kernels | " + " | ".join(f"{kernels[k]:.2f}" for k in labels) + " |",
        "| wall time of `generate` | " + " | ".join(f"{wall[k]:.2f}" for k in labels) + " |",
        "| GPU busy | " + " | ".join(f"{kernels[k] / wall[k]:.0%}" for k in labels) + " |",
    ]
    timed = {label: r["host"]["host"] for label, r in results.items()}
    turns = {label: t["Scheduler.overlap_loop"]["calls"] for label, t in timed.items()}
    host_rows = ["| host, ms per turn | " + " | ".join(labels) + " |"]
    host_rows.append("| --- |" + " ---: |" * len(labels))
    for name in dict.fromkeys(n for t in timed.values() for n in t):
        cells = [
            f"{1e3 * timed[k][name]['seconds'] / turns[k]:.3f}" if name in timed[k] else ""
            for k in labels
        ]
        host_rows.append(f"| `{name}` | " + " | ".join(cells) + " |")
    waits = {k: timed[k].get("Event.synchronize", {"seconds": 0.0})["seconds"] for k in labels}
    working = [f"{1e3 * (timed[k]['Scheduler.overlap_loop']['seconds'] - waits[k]) / turns[k]:.2f}"
               for k in labels]  # fmt: skip
    host_rows.append("| a turn less its waits for the GPU | " + " | ".join(working) + " |")
    machine = results[labels[0]].get("machine", "")
    return (
        "\n".join(gpu_rows)
        + "\n\n"
        + "\n".join(host_rows)
        + f"\n\nScheduler turns: {', '.join(f'{k} {n:,}' for k, n in turns.items())}."
        + (f" {machine}." if machine else "")
        + " Made by `python tools/bench_p1.py profile`.\n"
    )


def gpu_microseconds(run: Callable[[], object], warm_up: int, repeat: int) -> float:
    """The GPU time of one call of `run`, in microseconds: CUDA events around `repeat` calls,
    after `warm_up` calls that are not timed."""
    import torch

    for _ in range(warm_up):
        run()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeat):
        run()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / repeat


GRAPH_TIMING = "20 calls in a CUDA graph, the median of 10 replays"
EAGER_TIMING = "CUDA events over 50 calls issued from Python, after 5 (its capture failed)"


def graph_or_eager_microseconds(call: Callable[[], object]) -> Tuple[float, str]:
    """The GPU's time per call in a CUDA graph, so that the host's launching does not count,
    and how it was timed; eagerly where the call cannot be captured."""
    import torch

    from tools.bench_kernels import gpu_microseconds as graph_microseconds

    try:
        return graph_microseconds(call), GRAPH_TIMING
    except RuntimeError:
        torch.cuda.synchronize()
        return gpu_microseconds(call, 5, 50), EAGER_TIMING


def timing_words(timings: Dict[str, set]) -> str:
    """How each column was timed, in one phrase where all were timed alike."""
    if len(set().union(*timings.values())) == 1:
        return next(iter(next(iter(timings.values()))))
    return "; ".join(f"{label}: {' and '.join(sorted(how))}" for label, how in timings.items())


def norm_rope_inputs(head_dim: int) -> Tuple[torch.Tensor, torch.Generator, List[torch.Tensor]]:
    """For the norms-and-RoPE kernel at Qwen3-0.6B's shape on the GPU: the RoPE table (base
    10^6), a generator seeded 0, and the q and k norms' weights in bfloat16 drawn from it."""
    import torch

    from minisgl.layers.rotary import RotaryEmbedding

    table = RotaryEmbedding(head_dim, head_dim, 40960, 1e6)._cos_sin_cache.cuda()
    gen = torch.Generator(device="cuda").manual_seed(0)
    weights = [torch.rand(head_dim, generator=gen, device="cuda").bfloat16() + 0.5 for _ in "qk"]
    return table, gen, weights


def norms_rope(out: Path) -> None:
    import flashinfer
    import torch

    from minisgl.kernel.triton.qk_norm_rope import qk_norm_rope_triton
    from tools.bench_kernels import gpu_microseconds as graph_microseconds

    heads, kv_heads, head_dim, eps = 16, 8, 128, 1e-6
    table, gen, weights = norm_rope_inputs(head_dim)
    rows = [
        "| tokens | FlashInfer, 3 kernels, us | one Triton kernel, us "
        "| largest error, FlashInfer | largest error, Triton |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]

    def exact(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The same arithmetic in float32 from the same bfloat16 inputs, rounded never."""
        y = x.float()
        q, k = y[:, : heads * head_dim], y[:, heads * head_dim : (heads + kv_heads) * head_dim]
        for part, n, w in ((q, heads, weights[0]), (k, kv_heads, weights[1])):
            view = part.view(x.shape[0], n, head_dim)
            view.mul_(torch.rsqrt(view.pow(2).mean(-1, keepdim=True) + eps) * w.float())
        cos, sin = table[positions].chunk(2, dim=-1)
        for part, n in ((q, heads), (k, kv_heads)):
            first, second = part.view(x.shape[0], n, head_dim).chunk(2, dim=-1)
            c, s = cos[:, None, :], sin[:, None, :]
            first_out, second_out = first * c - second * s, second * c + first * s
            first.copy_(first_out)
            second.copy_(second_out)
        return y

    def three(x: torch.Tensor, positions: torch.Tensor) -> None:
        q, k = x[:, : heads * head_dim], x[:, heads * head_dim : (heads + kv_heads) * head_dim]
        for part, n, w in ((q, heads, weights[0]), (k, kv_heads, weights[1])):
            view = part.view(x.shape[0], n, head_dim)
            flashinfer.rmsnorm(view, w, eps, out=view)
        flashinfer.apply_rope_with_cos_sin_cache_inplace(
            positions, q, k, head_dim, table, is_neox=True
        )

    def one(x: torch.Tensor, positions: torch.Tensor) -> None:
        q, k = x[:, : heads * head_dim], x[:, heads * head_dim : (heads + kv_heads) * head_dim]
        qk_norm_rope_triton(q, k, *weights, eps, positions, table, head_dim)

    for tokens in (1, 64, 256, 8192):
        width = (heads + 2 * kv_heads) * head_dim
        qkv = torch.randn(tokens, width, generator=gen, device="cuda").bfloat16()
        positions = torch.randint(0, 4096, (tokens,), generator=gen, device="cuda")
        a, b = qkv.clone(), qkv.clone()
        three(a, positions)
        one(b, positions)
        reference = exact(qkv, positions)
        # in bfloat16 steps at 1.0 (2^-7): the normalised values have a mean square near 1
        errors = [(r.float() - reference).abs().max().item() / 2**-7 for r in (a, b)]
        times = [
            graph_microseconds(functools.partial(f, qkv.clone(), positions)) for f in (three, one)
        ]
        rows.append(f"| {tokens} | {times[0]:.1f} | {times[1]:.1f} | {errors[0]:.2f} steps | "
                    f"{errors[1]:.2f} steps |")  # fmt: skip
        print(rows[-1], flush=True)
    out.write_text("\n".join(rows) + f"\n\nOne {torch.cuda.get_device_name()}.\n")
    print(out.read_text())


def kv_store(out: Path) -> None:
    import torch

    from minisgl.kernel import store_cache
    from minisgl.kernel.triton.qk_norm_rope import KVStore, qk_norm_rope_triton
    from tools.bench_kernels import gpu_microseconds as graph_microseconds

    heads, kv_heads, head_dim, eps, slots = 16, 8, 128, 1e-6, 65536
    table, gen, weights = norm_rope_inputs(head_dim)
    rows = [
        "| tokens | norms and RoPE, then the KV store, us | one kernel storing k and v, us "
        "| pools and q equal |",
        "| ---: | ---: | ---: | :---: |",
    ]

    def split(x: torch.Tensor) -> List[torch.Tensor]:
        return list(x.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], -1))

    def two(x: torch.Tensor, pools: torch.Tensor, at: torch.Tensor, positions: torch.Tensor):
        q, k, v = split(x)
        qk_norm_rope_triton(q, k, *weights, eps, positions, table, head_dim)
        shape = (slots, kv_heads, head_dim)
        store_cache(pools[0].view(shape), pools[1].view(shape), at, k, v)

    def one(x: torch.Tensor, pools: torch.Tensor, at: torch.Tensor, positions: torch.Tensor):
        q, k, v = split(x)
        store = KVStore(pools[0], pools[1], at, v)
        qk_norm_rope_triton(q, k, *weights, eps, positions, table, head_dim, store)

    engine_rows = same_tokens_both_ways("FUSED_KV_STORE", "the store in the kernel")
    for tokens in (1, 64, 256, 8192):
        qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=gen,
                          device="cuda").bfloat16()  # fmt: skip
        positions = torch.randint(0, 4096, (tokens,), generator=gen, device="cuda")
        at = torch.randperm(slots, generator=gen, device="cuda")[:tokens].int()
        pools = torch.zeros(2, slots, kv_heads * head_dim, device="cuda", dtype=torch.bfloat16)
        results = []
        for f in (two, one):
            x, p = qkv.clone(), pools.clone()
            f(x, p, at, positions)
            results.append((split(x)[0], p))
        equal = all(torch.equal(a, b) for a, b in zip(*results))
        written = (results[1][1][:, at.long()] != 0).any(-1).all().item()
        assert equal and written, (equal, written)
        times = [
            graph_microseconds(functools.partial(f, qkv.clone(), pools.clone(), at, positions))
            for f in (two, one)
        ]
        rows.append(f"| {tokens} | {times[0]:.1f} | {times[1]:.1f} | yes |")
        print(rows[-1], flush=True)
    out.write_text("\n".join(rows) + f"\n\n{engine_rows}One {torch.cuda.get_device_name()}.\n")
    print(out.read_text())


def same_tokens_both_ways(switch: str, what: str, must_match: bool = True) -> str:
    """The engine on the tiny Qwen3 in bfloat16, greedy, with ENV's switch on and off: its
    prefills run eagerly, its decode steps in CUDA graphs. A switch that changes how the
    kernels run, not their arithmetic, must leave every token the same; one that sums in
    another order (`must_match=False`) is counted, not asserted."""
    import torch

    from minisgl.core import SamplingParams
    from minisgl.env import ENV
    from minisgl.llm import LLM
    from tools.models import ensure_model

    model = str(ensure_model("tiny-qwen3"))
    prompts = [[(7 * i + 3 * j) % 997 + 1 for j in range(5 + 37 * i)] for i in range(8)]
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    tokens: Dict[bool, List[List[int]]] = {}
    setting = getattr(ENV, switch)
    default = setting.value
    try:
        for on in (False, True):
            setting.value = on
            with LLM(model, dtype=torch.bfloat16) as llm:
                tokens[on] = [list(r["token_ids"]) for r in llm.generate(prompts, params)]  # type: ignore[arg-type]
    finally:
        setting.value = default
    same = sum(a == b for x, y in zip(tokens[False], tokens[True]) for a, b in zip(x, y))
    total = sum(len(x) for x in tokens[False])
    assert total == 64 * len(prompts) and (tokens[False] == tokens[True] or not must_match), (
        same,
        total,
    )
    return (
        f"The engine with and without {what} (tiny-qwen3, bfloat16, greedy, "
        f"{len(prompts)} prompts of {len(prompts[0])} to {len(prompts[-1])} tokens): {same} of "
        f"{total} tokens the same.\n\n"
    )


def pdl(out: Path) -> None:
    import torch
    import torch.nn.functional as F

    from minisgl.kernel.triton.decode_attention import decode_attention_triton
    from minisgl.kernel.triton.qk_norm_rope import KVStore, qk_norm_rope_triton
    from tools.bench_kernels import gpu_microseconds as graph_microseconds

    hidden, heads, kv_heads, head_dim, eps = 1024, 16, 8, 128, 1e-6
    settings = engine_decode_settings()
    page = settings["page_size"]
    table, gen, weights = norm_rope_inputs(head_dim)
    cuda = dict(device="cuda", dtype=torch.bfloat16)
    w_qkv = torch.randn((heads + 2 * kv_heads) * head_dim, hidden, generator=gen, **cuda) / 32
    w_o = torch.randn(hidden, heads * head_dim, generator=gen, **cuda) / 32
    rows = [
        "| requests | keys each | without PDL, us | with PDL, us | outputs and pools equal |",
        "| ---: | ---: | ---: | ---: | :---: |",
    ]

    def attention_half(batch: int, length: int) -> Tuple[Callable, torch.Tensor]:
        """The layer's attention half for `batch` requests of `length` keys, as a function
        of the pools (k, v) and of whether to launch early; and the pools it starts from."""
        pages = torch.randperm(batch * length // page, generator=gen, device="cuda")
        slots = (pages.view(batch, -1, 1) * page + torch.arange(page, device="cuda")).flatten()
        indices = slots.int()
        indptr = (torch.arange(batch + 1, device="cuda") * length).int()
        at = indices[indptr[1:].long() - 1]  # each request's newest key: the step's token
        positions = torch.full((batch,), length - 1, device="cuda", dtype=torch.int64)
        x = torch.randn(batch, hidden, generator=gen, **cuda)
        pool = torch.randn(2, batch * length, kv_heads * head_dim, generator=gen, **cuda)

        def layer(pools: torch.Tensor, launch_early: bool) -> torch.Tensor:
            qkv = F.linear(x, w_qkv)
            q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], -1)
            store = KVStore(pools[0], pools[1], at, v)
            qk_norm_rope_triton(q, k, *weights, eps, positions, table, head_dim, store,
                                pdl=launch_early)  # fmt: skip
            caches = [p.view(-1, kv_heads, head_dim) for p in pools]
            o = decode_attention_triton(q.view(batch, heads, head_dim), *caches, indptr,
                                        indices, **settings, pdl=launch_early)  # fmt: skip
            return F.linear(o.view(batch, -1), w_o)

        return layer, pool

    for batch, length in ((1, 1024), (16, 1024), (64, 1024), (256, 1024), (64, 4096)):
        layer, pool = attention_half(batch, length)
        results = []
        for launch_early in (False, True):
            pools = pool.clone()
            results.append((layer(pools, launch_early), pools))
        equal = all(torch.equal(a, b) for a, b in zip(*results))
        assert equal, "PDL changed a result"
        times = [
            graph_microseconds(functools.partial(layer, pool.clone(), launch_early))
            for launch_early in (False, True)
        ]
        rows.append(f"| {batch} | {length} | {times[0]:.1f} | {times[1]:.1f} | yes |")
        print(rows[-1], flush=True)
    engine_rows = same_tokens_both_ways("TRITON_PDL", "PDL")
    out.write_text(
        "\n".join(rows) + "\n\nEach row: the q/k/v product, the norms and RoPE storing k and "
        "v, the decode attention's two kernels, the o product. " + engine_rows +
        f"One {torch.cuda.get_device_name()}.\n"
    )  # fmt: skip
    print(out.read_text())


def chi_square(counts: torch.Tensor, logits: torch.Tensor, temperature: float) -> float:
    """How far the counts of each token are from softmax(logits / temperature)'s
    shares of their sum."""
    import torch

    expected = torch.softmax(logits.double() / temperature, -1) * counts.sum()
    return float(((counts.double() - expected) ** 2 / expected).sum())


def gumbel_fit(
    temperature: float, other: float, device: torch.device, rows: int = 8192
) -> Tuple[float, float]:
    """`rows` draws of the Gumbel-max kernel from SAMPLER_LOGITS in bfloat16 (blocks of 4
    tokens, so the vocabulary is two blocks; a fixed seed) at `temperature`: the chi-square of
    their counts against the softmax at that temperature, and at `other`."""
    import torch

    from minisgl.engine.sample import MIN_TEMPERATURE
    from minisgl.kernel.triton.sample import gumbel_max_sample

    logits = torch.tensor(SAMPLER_LOGITS).bfloat16()
    tokens = gumbel_max_sample(
        logits.repeat(rows, 1).to(device), torch.full((rows,), temperature, device=device),
        MIN_TEMPERATURE, seed=7, block=4, rows_per_program=1024,
    )  # fmt: skip
    counts = torch.bincount(tokens.cpu().long(), minlength=len(SAMPLER_LOGITS))
    return chi_square(counts, logits, temperature), chi_square(counts, logits, other)


def sampler(out: Path) -> None:
    import flashinfer.sampling as fi_sampling
    import torch

    from minisgl.engine.sample import MIN_TEMPERATURE as greedy_below
    from minisgl.kernel.triton.sample import gumbel_max_sample

    vocab, temperature = 151_936, 0.6
    gen = torch.Generator(device="cuda").manual_seed(0)

    def upstream(logits: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return fi_sampling.sampling_from_probs(fi_sampling.softmax(logits.float(), t))

    def gumbel(logits: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return gumbel_max_sample(logits, t, greedy_below, seed=int(torch.randint(1 << 31, ())))

    hw = this_gpu()
    rows = [
        "| batch | float32 copy + FlashInfer softmax + draw, us | Gumbel-max kernel, us | "
        "reading the logits once, us |",
        "| ---: | ---: | ---: | ---: |",
    ]
    timings: Dict[str, set] = {"FlashInfer's way": set(), "the kernel": set()}
    for batch in (1, 16, 64, 256):
        logits = (torch.randn(batch, vocab, generator=gen, device="cuda") * 3).bfloat16()
        t = torch.full((batch,), temperature, device="cuda")
        us = []
        for f, how in zip((upstream, gumbel), timings.values()):
            per_call, timing = graph_or_eager_microseconds(functools.partial(f, logits, t))
            us.append(per_call)
            how.add(timing)
        floor = logits.numel() * logits.element_size() / hw.memory_bytes_per_s * 1e6
        rows.append(f"| {batch} | {us[0]:.1f} | {us[1]:.1f} | {floor:.1f} |")
        print(rows[-1], flush=True)
    # mass on 8 tokens: the others are 40 below, e^-66 each at this temperature
    top = torch.tensor(SAMPLER_LOGITS, device="cuda")
    logits = torch.full((256, vocab), -40.0, device="cuda")
    where = torch.arange(8, device="cuda") * 9973  # spread over the vocabulary's blocks
    logits[:, where] = top
    logits, t = logits.bfloat16(), torch.full((256,), temperature, device="cuda")
    p = torch.softmax(logits[0, where].float() / temperature, -1)
    gaps = []
    for draw in (upstream, gumbel):
        tokens = torch.cat([draw(logits, t).long() for _ in range(64)])
        counts = torch.stack([(tokens == w).sum() for w in where]).float()
        assert counts.sum() == tokens.numel(), "a token outside the 8 was drawn"
        gaps.append((counts / tokens.numel() - p).abs().max().item())
    out.write_text(
        "\n".join(rows) + f"\n\nGPU time of one call, {timing_words(timings)}. "
        f"Reading the logits once: their bytes at the {hw.name}'s "
        f"{hw.memory_bytes_per_s / 1e12:.2f} TB/s. "
        f"16,384 draws from 8 tokens at temperature {temperature}: the largest difference "
        f"between a token's frequency and its probability is {gaps[0]:.4f} for FlashInfer's "
        f"draw and {gaps[1]:.4f} for the Gumbel-max kernel (one standard deviation of a "
        f"frequency near 0.5 is 0.0039). One {torch.cuda.get_device_name()}.\n"
    )
    print(out.read_text())


def attention(out: Path) -> None:
    """One layer's decode attention of Qwen3-0.6B's shape (16 query and 8 key/value heads of
    128, bfloat16) with FlashInfer, in the variants the engine could use, at batch sizes and
    context lengths of the workload: microseconds per call and the keys and values read per
    second (the H200's bandwidth is the ceiling)."""
    import torch
    from flashinfer import BatchDecodeWithPagedKVCacheWrapper

    heads, kv_heads, head_dim, page = 16, 8, 128, 256
    rows = [
        "| batch | context | variant | us per layer | K+V read, TB/s |",
        "| ---: | ---: | --- | ---: | ---: |",
    ]
    workspace = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
    gen = torch.Generator(device="cpu").manual_seed(0)
    for batch, context in [(64, 1024), (256, 512), (256, 1024)]:
        pages_per_req = context // page
        num_pages = batch * pages_per_req
        cache = torch.randn(2, num_pages, page, kv_heads, head_dim, dtype=torch.bfloat16,
                            device="cuda")  # fmt: skip
        # pages scattered as the allocator leaves them: a random permutation
        page_ids = torch.randperm(num_pages, generator=gen).to(torch.int32)
        q = torch.randn(batch, heads, head_dim, dtype=torch.bfloat16, device="cuda")
        slots = (page_ids[:, None] * page + torch.arange(page, dtype=torch.int32)).view(-1)
        variants = {
            "pages of 1 token, decode kernel (now)": (1, False, slots),
            "pages of 1 token, tensor-core kernel": (1, True, slots),
            "pages of 256 tokens, decode kernel": (page, False, page_ids),
            "pages of 256 tokens, tensor-core kernel": (page, True, page_ids),
        }
        for name, (page_size, tensor_cores, indices) in variants.items():
            wrapper = BatchDecodeWithPagedKVCacheWrapper(
                workspace, "NHD", use_tensor_cores=tensor_cores, backend="fa2"
            )
            per_req = context // page_size
            wrapper.plan(
                indptr=torch.arange(batch + 1, dtype=torch.int32) * per_req,
                indices=indices.cuda(),
                last_page_len=torch.full((batch,), page_size, dtype=torch.int32),
                num_qo_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                page_size=page_size, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16,
            )  # fmt: skip
            kv = cache.view(2, -1, page_size, kv_heads, head_dim)
            us = gpu_microseconds(functools.partial(wrapper.run, q, (kv[0], kv[1])), 5, 50)
            read = 2 * batch * context * kv_heads * head_dim * 2
            rows.append(f"| {batch} | {context} | {name} | {us:.1f} | {read / us / 1e6:.2f} |")
            print(rows[-1], flush=True)
        del cache
    out.write_text("\n".join(rows) + f"\n\nOne {torch.cuda.get_device_name()}.\n")
    print(out.read_text())


def whole_run(steps: List[int], us: List[float], layers: int) -> float:
    """Seconds of a kernel over the whole run, from its microseconds per layer at `steps`:
    every layer of every step, the steps in between interpolated linearly."""
    seconds = 0.0
    for (s0, t0), (s1, t1) in zip(zip(steps, us), zip(steps[1:], us[1:])):
        seconds += (s1 - s0) * (t0 + t1) / 2 * layers / 1e6
    return seconds + us[-1] * layers / 1e6


def attention_over_the_run(out: Path, every: int = 64) -> None:
    """The decode attention kernel at the shapes of the workload's own decode steps (every
    `every`-th step: the requests still running, each with its prompt and the tokens so far),
    through the wrapper the engine replays in its CUDA graphs and through the plain one:
    microseconds per layer and bandwidth per step, and the whole run's kernel time estimated
    from them (28 layers, steps in between interpolated)."""
    import torch
    from flashinfer import (
        BatchDecodeWithPagedKVCacheWrapper,
        CUDAGraphBatchDecodeWithPagedKVCacheWrapper,
    )

    from minisgl.benchmark.offline import make_offline_workload

    heads, kv_heads, head_dim, layers, page = 16, 8, 128, 28, 256
    work = make_offline_workload()
    prompt_lens = [len(prompt) for prompt in work.prompts]
    output_lens = [params.max_tokens for params in work.sampling_params]
    steps = [*range(1, max(output_lens) - 1, every), max(output_lens) - 1]
    workspace = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
    slots_max = sum(n + m for n, m in zip(prompt_lens, output_lens)) + page * len(prompt_lens)
    cache = torch.randn(2, slots_max, 1, kv_heads, head_dim, dtype=torch.bfloat16, device="cuda")
    rows = [
        "| step | batch | mean keys | graph wrapper: us per layer | TB/s | plain: us | TB/s |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    times: Dict[str, List[float]] = {"graph": [], "plain": []}
    for step in steps:
        contexts = [n + step for n, m in zip(prompt_lens, output_lens) if m > step]
        batch, total = len(contexts), sum(contexts)
        # each request's slots: whole pages of 256, pages in a random order (as allocated)
        pages = [(n + page - 1) // page for n in contexts]
        order = torch.randperm(sum(pages), generator=torch.Generator().manual_seed(step))
        own_pages = order.split(pages)
        slots = torch.cat([
            (own[:, None] * page + torch.arange(page)).view(-1)[:n]
            for own, n in zip(own_pages, contexts)
        ]).to(torch.int32).cuda()  # fmt: skip
        indptr = torch.tensor([0] + contexts, dtype=torch.int32).cumsum(0).to(torch.int32)
        ones = torch.ones(batch, dtype=torch.int32)
        q = torch.randn(batch, heads, head_dim, dtype=torch.bfloat16, device="cuda")
        wrappers = {
            "graph": CUDAGraphBatchDecodeWithPagedKVCacheWrapper(
                workspace, kv_layout="NHD", use_tensor_cores=False,
                indptr_buffer=torch.empty(batch + 1, dtype=torch.int32, device="cuda"),
                indices_buffer=torch.empty(total, dtype=torch.int32, device="cuda"),
                last_page_len_buffer=torch.empty(batch, dtype=torch.int32, device="cuda"),
            ),
            "plain": BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", backend="fa2"),
        }  # fmt: skip
        wrappers["graph"]._backend = "fa2"  # as the engine's (chapter 18)
        cells = []
        for name, wrapper in wrappers.items():
            wrapper.plan(
                indptr=indptr, indices=slots, last_page_len=ones, num_qo_heads=heads,
                num_kv_heads=kv_heads, head_dim=head_dim, page_size=1,
                q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16,
            )  # fmt: skip
            us = gpu_microseconds(functools.partial(wrapper.run, q, (cache[0], cache[1])), 3, 20)
            times[name].append(us)
            cells += [f"{us:.1f}", f"{2 * total * kv_heads * head_dim * 2 / us / 1e6:.2f}"]
        rows.append(f"| {step} | {batch} | {total / batch:.0f} | " + " | ".join(cells) + " |")
        print(rows[-1], flush=True)

    estimates = ", ".join(
        f"{name} {whole_run(steps, us, layers):.2f} s" for name, us in times.items()
    )
    out.write_text(
        "\n".join(rows) + f"\n\nThe whole run's decode attention, estimated: {estimates}. "
        f"One {torch.cuda.get_device_name()}.\n"
    )
    print(out.read_text())


def run_decode_shapes(every: int = 64):
    """The decode steps of the workload, every `every`-th: (step, the keys of each request
    still running, in the workload's order)."""
    from minisgl.benchmark.offline import make_offline_workload

    work = make_offline_workload()
    prompt_lens = [len(prompt) for prompt in work.prompts]
    output_lens = [params.max_tokens for params in work.sampling_params]
    steps = [*range(1, max(output_lens) - 1, every), max(output_lens) - 1]
    for step in steps:
        yield step, [n + step for n, m in zip(prompt_lens, output_lens) if m > step]


def flashinfer_decode(
    workspace, q, cache, contexts: List[int], slots, order: List[int] | None, page_size: int = 1
):
    """FlashInfer's decode through the CUDA-graph wrapper, planned as the engine plans it
    (pages of one slot), for the requests in `order` (all, as given, if None): the call, and
    the rows of q it answers. `page_size` > 1: `cache` is the HND copy of `hnd_cache`, read
    in its pages of that many slots (each request's slots are whole pages, first to last)."""
    import torch
    from flashinfer import CUDAGraphBatchDecodeWithPagedKVCacheWrapper

    requests = list(range(len(contexts))) if order is None else order
    lengths = [contexts[r] for r in requests]
    pages = [slots[r][::page_size] // page_size for r in requests]
    batch, total = len(lengths), sum(len(p) for p in pages)
    wrapper = CUDAGraphBatchDecodeWithPagedKVCacheWrapper(
        workspace, kv_layout="NHD" if page_size == 1 else "HND", use_tensor_cores=False,
        indptr_buffer=torch.empty(batch + 1, dtype=torch.int32, device="cuda"),
        indices_buffer=torch.empty(total, dtype=torch.int32, device="cuda"),
        last_page_len_buffer=torch.empty(batch, dtype=torch.int32, device="cuda"),
    )  # fmt: skip
    wrapper._backend = "fa2"  # as the engine's (chapter 18)
    heads, head_dim = q.shape[1:]
    wrapper.plan(
        indptr=torch.tensor([0] + [len(p) for p in pages]).cumsum(0).to(torch.int32),
        indices=torch.cat(pages).to(torch.int32).cuda(),
        last_page_len=torch.tensor([(n - 1) % page_size + 1 for n in lengths], dtype=torch.int32),
        num_qo_heads=heads, num_kv_heads=cache[0].shape[-3 if page_size > 1 else -2],
        head_dim=head_dim, page_size=page_size, q_data_type=torch.bfloat16,
        kv_data_type=torch.bfloat16,
    )  # fmt: skip
    kv = (cache[0], cache[1]) if page_size > 1 else (cache[0].unsqueeze(1), cache[1].unsqueeze(1))
    return functools.partial(wrapper.run, q[requests], kv), requests


@dataclass(frozen=True)
class DecodeKernels:
    """A set of the Triton decode kernel's settings to run beside FlashInfer's kernel."""

    kernels: Dict[str, Dict]  # label: the settings
    notes: str  # what the labels mean, under the table


PIECES = dict(splits=8, chunk=256, num_stages=3)  # the engine's pieces, an index per key
PAGE_RUNS = dict(PIECES, page_size=256)  # ... one index per 64 keys (the workload's pages)
ENGINE = "the engine's"  # a column of every set: the settings the engine runs the kernel with


def engine_decode_settings() -> Dict:
    """The decode kernel's settings in the engine (TRITON_DECODE_SETTINGS of
    minisgl/attention/fi.py), with the workload's pages of 256 slots."""
    from minisgl.attention.fi import TRITON_DECODE_SETTINGS

    settings = dict(TRITON_DECODE_SETTINGS)
    settings["page_size"] = DECODE_PAGE if settings.pop("page_runs") else 1
    return settings


DECODE_KERNEL_SETS = {
    # the options of the merge and of the pieces' sizes (docs/data/p1-decode-kernels-h100.md)
    "options": DecodeKernels(
        {
            "Triton 8 x 256, two kernels (the engine's)": PIECES,
            "Triton 8 x 256, merged in the kernel": dict(PIECES, merge_here=True),
            "Triton 8 x 256, equal pieces, two kernels": dict(PIECES, equal=True),
            "Triton 8 x 256, equal, merged": dict(PIECES, equal=True, merge_here=True),
            "Triton 8 x 128, equal, merged": dict(PIECES, chunk=128, equal=True, merge_here=True),
            "Triton 16 x 128, equal, merged": dict(
                PIECES, splits=16, chunk=128, equal=True, merge_here=True
            ),
        },
        "Triton S x C: each request's keys in at most S pieces per key/value head, each of at "
        "least C keys (equal: as many pieces, of equal size), 64 loaded at a time, 4 warps, 3 "
        "stages; a second kernel merges the pieces, or, merged in the kernel, the last piece of "
        "a request to finish does",
    ),
    # one index per load of keys, and the launch settings around it
    # (docs/data/p1-decode-settings.md)
    "settings": DecodeKernels(
        {
            "Triton, an index per key": PIECES,
            "page runs": PAGE_RUNS,
            "page runs, 128 keys, 2 stages": dict(PAGE_RUNS, num_stages=2, block_n=128),
            "page runs, 8 warps": dict(PAGE_RUNS, num_warps=8),
            "page runs, 4 stages": dict(PAGE_RUNS, num_stages=4),
            "page runs, 4 x 512": dict(PAGE_RUNS, splits=4, chunk=512),
            "page runs, 16 x 256": dict(PAGE_RUNS, splits=16),
        },
        "Triton: each request's keys in at most 8 pieces per key/value head of at least 256 keys "
        "(S x C: S pieces of at least C), 64 loaded at a time, 4 warps, 3 stages, two kernels, "
        "unless the label says otherwise; an index per key: the slot of every key is read; page "
        "runs: the slot of the first of every 64 keys, the others follow it (the workload's "
        "pages hold 256 slots)",
    ),
    # the keys and values by the GPU's bulk copies (docs/data/p1-decode-tma.md)
    "tma": DecodeKernels(
        {
            "page runs": PAGE_RUNS,
            "TMA": dict(PAGE_RUNS, tma=True),
            "TMA, 2 stages": dict(PAGE_RUNS, num_stages=2, tma=True),
            "TMA, 4 stages": dict(PAGE_RUNS, num_stages=4, tma=True),
            "TMA, 128 keys, 2 stages": dict(PAGE_RUNS, num_stages=2, block_n=128, tma=True),
        },
        "Triton: each request's keys in at most 8 pieces per key/value head of at least 256 keys, "
        "64 loaded at a time, 4 warps, 3 stages, two kernels, one index per 64 keys (page runs), "
        "unless the label says otherwise; TMA: each load of keys or values is one bulk copy of "
        "a tile of the cache (Hopper's tensor memory accelerator) instead of the threads' own "
        "loads",
    ),
    # the pieces' results for the merge in float32 or bfloat16 (docs/data/p1-decode-parts.md)
    "parts": DecodeKernels(
        {
            "page runs": PAGE_RUNS,
            "bfloat16 pieces": dict(PAGE_RUNS, narrow_parts=True),
            "merged in the kernel": dict(PAGE_RUNS, merge_here=True),
            "bfloat16 pieces, merged in the kernel": dict(
                PAGE_RUNS, narrow_parts=True, merge_here=True
            ),
        },
        "Triton: each request's keys in at most 8 pieces per key/value head of at least 256 keys, "
        "64 loaded at a time, 4 warps, 3 stages, one index per 64 keys (page runs); each piece "
        "writes its result in float32 for a second kernel to merge, unless the label says "
        "otherwise; a request of one piece writes its output itself; bfloat16 pieces: the "
        "results in bfloat16; merged in the kernel: the last piece of a request to finish merges",
    ),
    # an index read once per page, before a loop over the page's loads that reads none, so
    # that the compiler keeps 2 or 3 loads of keys in flight (docs/data/p1-decode-loop.md)
    "loop": DecodeKernels(
        {
            "page runs": PAGE_RUNS,
            "page loop": dict(PAGE_RUNS, page_loop=True),
            "page loop, 4 stages": dict(PAGE_RUNS, page_loop=True, num_stages=4),
            "page loop, 2 stages": dict(PAGE_RUNS, page_loop=True, num_stages=2),
            "page loop, merged in the kernel": dict(PAGE_RUNS, page_loop=True, merge_here=True),
            "page loop, 32 keys a load": dict(PAGE_RUNS, page_loop=True, block_n=32),
            "page loop, 32 keys a load, 4 stages": dict(
                PAGE_RUNS, page_loop=True, block_n=32, num_stages=4
            ),
            "heads first": dict(PAGE_RUNS, heads_first=True),
            "page loop, heads first": dict(PAGE_RUNS, page_loop=True, heads_first=True),
        },
        "Triton: each request's keys in at most 8 pieces per key/value head of at least 256 keys, "
        "64 loaded at a time, 4 warps, 3 stages, two kernels, one index per 64 keys (page runs), "
        "unless the label says otherwise; page loop: one index per page of 256 keys, read before "
        "a loop over the page's loads (compiled, 3 stages keep 2 loads of keys and of values in "
        "shared memory, 4 stages 3, 2 stages 1; 32 keys a load halves each buffer); heads first: "
        "the grid's first axis is the key/value head, so that programs started side by side read "
        "the heads of the same requests",
    ),
    # more programs per SM: the registers a thread may take capped (Triton 3.6 gives the
    # engine's kernel 104, 4 programs of 4 warps per SM; 96 or fewer fit 5, which its shared
    # memory also allows) (docs/data/p1-decode-occupancy.md)
    "occupancy": DecodeKernels(
        {
            "page runs": PAGE_RUNS,
            "heads first": dict(PAGE_RUNS, heads_first=True),
            "96 registers": dict(PAGE_RUNS, max_registers=96),
            "80 registers": dict(PAGE_RUNS, max_registers=80),
            "96 registers, heads first": dict(PAGE_RUNS, max_registers=96, heads_first=True),
            "32 keys, 80 registers": dict(PAGE_RUNS, block_n=32, max_registers=80),
            "32 keys, 80 registers, 4 stages": dict(
                PAGE_RUNS, block_n=32, max_registers=80, num_stages=4
            ),
            "page loop, 96 registers": dict(PAGE_RUNS, page_loop=True, max_registers=96),
        },
        "Triton: each request's keys in at most 8 pieces per key/value head of at least 256 keys, "
        "64 loaded at a time, 4 warps, 3 stages, two kernels, one index per 64 keys (page runs), "
        "as many registers as the compiler takes, unless the label says otherwise; N registers: "
        "a thread of the pieces' kernel takes at most N (Triton's maxnreg; the compiler spills "
        "the rest to local memory); heads first: the grid's first axis is the key/value head; "
        "page loop: one index per page of 256 keys, before a loop over its loads",
    ),
    # the second kernel, which merges each head's pieces: 14 of a layer's 253 us at step 129
    # on the H100 (docs/data/p1-decode-counters-h100.md) (docs/data/p1-decode-merge.md)
    "merge": DecodeKernels(
        {
            "page runs": PAGE_RUNS,
            "merge, 1 warp": dict(PAGE_RUNS, merge_warps=1),
            "merge, 2 warps": dict(PAGE_RUNS, merge_warps=2),
            "merged in the kernel": dict(PAGE_RUNS, merge_here=True),
            "heads first": dict(PAGE_RUNS, heads_first=True),
            "heads first, merge, 1 warp": dict(PAGE_RUNS, heads_first=True, merge_warps=1),
            "heads first, merge, 2 warps": dict(PAGE_RUNS, heads_first=True, merge_warps=2),
        },
        "Triton: each request's keys in at most 8 pieces per key/value head of at least 256 keys, "
        "64 loaded at a time, 4 warps, 3 stages, one index per 64 keys (page runs), a second "
        "kernel of 4 warps a program merging each head's pieces, unless the label says "
        "otherwise; merged in the kernel: the last piece of a request to finish merges; heads "
        "first: the grid's first axis is the key/value head",
    ),
    # the cache's layout: a page's keys token by token (NHD, the engine's), or head by head
    # (HND: one head's keys of a page are one block of memory) (docs/data/p1-decode-layout.md)
    "layout": DecodeKernels(
        {
            "FlashInfer, HND pages": dict(flashinfer=True, kv_layout="HND"),
            "page runs": PAGE_RUNS,
            "heads first": dict(PAGE_RUNS, heads_first=True),
            "HND": dict(PAGE_RUNS, kv_layout="HND"),
            "HND, heads first": dict(PAGE_RUNS, kv_layout="HND", heads_first=True),
            "HND, 4 stages": dict(PAGE_RUNS, kv_layout="HND", num_stages=4),
            "HND, TMA": dict(PAGE_RUNS, kv_layout="HND", tma=True),
            "HND, TMA, 4 stages": dict(PAGE_RUNS, kv_layout="HND", tma=True, num_stages=4),
            "HND, 128 keys, 2 stages": dict(PAGE_RUNS, kv_layout="HND", block_n=128, num_stages=2),
        },
        "Triton: each request's keys in at most 8 pieces per key/value head of at least 256 keys, "
        "64 loaded at a time, 4 warps, 3 stages, two kernels, one index per 64 keys (page runs), "
        "unless the label says otherwise; heads first: the grid's first axis is the key/value "
        "head; HND: the same keys and values in a copy of the cache laid out [pages, key/value "
        "heads, 256 slots, 128], so that one head's keys in a page are 64 KB in one block (the "
        "engine's cache, NHD, is [slots, key/value heads, 128]); TMA: each load of keys or "
        "values one bulk copy of a 16 KB block; FlashInfer, HND pages: "
        "FlashInfer's decode kernel reading that copy in its pages of 256",
    ),
}


DECODE_HEADS, DECODE_KV_HEADS, DECODE_HEAD_DIM, DECODE_PAGE = 16, 8, 128, 256  # Qwen3-0.6B
_HND_COPIES: Dict[int, "torch.Tensor"] = {}


def hnd_cache(cache: "torch.Tensor") -> "torch.Tensor":
    """The keys and values of `cache` [2, slots, kv heads, head_dim] laid out by page and then
    by head: [2, pages, kv heads, DECODE_PAGE, head_dim], slot s being token s % DECODE_PAGE of
    page s // DECODE_PAGE. Made once per cache."""
    if cache.data_ptr() not in _HND_COPIES:
        two, slots, heads, dim = cache.shape
        pages = cache.view(two, slots // DECODE_PAGE, DECODE_PAGE, heads, dim)
        _HND_COPIES[cache.data_ptr()] = pages.transpose(2, 3).contiguous()
    return _HND_COPIES[cache.data_ptr()]


def decode_buffers(shapes: List[Tuple[int, List[int]]]):
    """A bfloat16 cache of random keys and values large enough for every step of `shapes`, a
    FlashInfer workspace, and the generator the steps' queries come from."""
    import torch

    slots_max = (max(sum(c) for _, c in shapes) // DECODE_PAGE + 257) * DECODE_PAGE  # whole pages
    gen = torch.Generator(device="cuda").manual_seed(0)
    cache = torch.randn(
        2, slots_max, DECODE_KV_HEADS, DECODE_HEAD_DIM, generator=gen, device="cuda"
    ).bfloat16()
    workspace = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
    return cache, workspace, gen


def decode_step_calls(
    step: int, contexts: List[int], cache, workspace, gen, kernels: Dict[str, Dict]
) -> Tuple["torch.Tensor", Dict[str, Tuple[Callable[[], "torch.Tensor"], List[int]]]]:
    """One decode step of the run, requests of `contexts` keys: its queries, and for each
    kernel (FlashInfer's two orders, then `kernels`' Triton settings) the call and the rows of
    the queries it answers. Each request's slots are whole pages of 256, the pages in a random
    order, as the allocator leaves them."""
    import torch

    from minisgl.kernel.triton.decode_attention import decode_attention_triton

    batch, page = len(contexts), DECODE_PAGE
    q = torch.randn(batch, DECODE_HEADS, DECODE_HEAD_DIM, generator=gen, device="cuda").bfloat16()
    pages = [(n + page - 1) // page for n in contexts]
    order = torch.randperm(sum(pages), generator=torch.Generator().manual_seed(step))
    slots = [(own[:, None] * page + torch.arange(page)).view(-1)[:n]
             for own, n in zip(order.split(pages), contexts)]  # fmt: skip
    longest = sorted(range(batch), key=lambda r: -contexts[r])
    indptr = torch.tensor([0] + contexts).cumsum(0).to(torch.int32).cuda()
    indices = torch.cat(slots).to(torch.int32).cuda()
    calls = {
        "FlashInfer (now)": flashinfer_decode(workspace, q, cache, contexts, slots, None),
        "FlashInfer, longest first": flashinfer_decode(
            workspace, q, cache, contexts, slots, longest
        ),
    }
    for label, settings in {ENGINE: engine_decode_settings(), **kernels}.items():
        settings = dict(settings)
        source = hnd_cache(cache) if settings.get("kv_layout") == "HND" else cache
        if settings.pop("flashinfer", False):
            calls[label] = flashinfer_decode(workspace, q, source, contexts, slots, None, page)
            continue
        calls[label] = (functools.partial(
            decode_attention_triton, q, source[0], source[1], indptr, indices, **settings
        ), list(range(batch)))  # fmt: skip
    return q, calls


def decode_kernels(out: Path, every: int = 64, kernel_set: str = "options") -> None:
    """The decode attention at the shapes of the run's decode steps, by FlashInfer's decode
    kernel (as the engine calls it: the CUDA-graph wrapper, the requests in the batch's order,
    then longest first) and by the book's Triton kernel of equal chunks in several settings:
    TB/s of keys and values read per step (GPU time in a CUDA graph), the largest difference
    from FlashInfer's output, and the whole run's kernel time estimated (28 layers, steps in
    between interpolated)."""
    import torch

    from tools.bench_kernels import gpu_microseconds as graph_microseconds

    kv_heads, head_dim, layers = DECODE_KV_HEADS, DECODE_HEAD_DIM, 28
    shapes = list(run_decode_shapes(every))
    cache, workspace, gen = decode_buffers(shapes)
    kernels = DECODE_KERNEL_SETS[kernel_set]
    labels = ["FlashInfer (now)", "FlashInfer, longest first", ENGINE, *kernels.kernels]
    times: Dict[str, List[float]] = {label: [] for label in labels}
    worst: Dict[str, float] = {label: 0.0 for label in labels}
    rows = [
        "| step | batch | mean keys | " + " | ".join(labels) + " |",
        "| ---: | ---: | ---: | " + " | ".join("---:" for _ in labels) + " |",
    ]
    for step, contexts in shapes:
        batch, total = len(contexts), sum(contexts)
        q, calls = decode_step_calls(step, contexts, cache, workspace, gen, kernels.kernels)
        reference = torch.empty_like(q)
        reference[calls["FlashInfer (now)"][1]] = calls["FlashInfer (now)"][0]()
        cells = []
        for label, (call, requests) in calls.items():
            result = torch.empty_like(q)
            result[requests] = call()
            worst[label] = max(worst[label], (result - reference).abs().max().item())
            us = graph_microseconds(call)
            times[label].append(us)
            cells.append(f"{2 * total * kv_heads * head_dim * 2 / us / 1e6:.2f}")
        rows.append(f"| {step} | {batch} | {total / batch:.0f} | " + " | ".join(cells) + " |")
        print(rows[-1], flush=True)

    steps = [step for step, _ in shapes]

    rows.append(
        "| whole run, s | | | "
        + " | ".join(f"{whole_run(steps, times[k], layers):.2f}" for k in labels)
        + " |"
    )
    rows.append(
        "| largest difference | | | " + " | ".join(f"{worst[k]:.3g}" for k in labels) + " |"
    )
    engine = ", ".join(f"{k}={v}" for k, v in engine_decode_settings().items())
    out.write_text(
        "\n".join(rows) + "\n\nTB/s of keys and values read, from the GPU time of each kernel "
        f"replayed in a CUDA graph. The engine's: its settings ({engine}). {kernels.notes}. "
        f"One {torch.cuda.get_device_name()}.\n"
    )
    print(out.read_text())


def decode_products(config: Dict) -> Dict[str, Tuple[int, int]]:
    """A decode step's matrix products of one layer, merged as the engine merges them, and the
    LM head: name -> (in features, out features)."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim", hidden // heads)
    return {
        "qkv": (hidden, (heads + 2 * kv_heads) * head_dim),
        "o": (heads * head_dim, hidden),
        "gate_up": (hidden, 2 * inter),
        "down": (inter, hidden),
        "lm_head": (hidden, config["vocab_size"]),
    }


def graph_batch(batch: int, sizes: Sequence[int]) -> int:
    """The CUDA graph a batch replays: the smallest captured size that holds it."""
    return min(size for size in sizes if size >= batch)


def matmuls(out: Path, every: int = 16) -> None:
    """The decode steps' matrix products (bfloat16, `F.linear` as the engine calls it) at the
    batch of every `every`-th step of the run, padded to the CUDA graph it replays: each timed in
    a CUDA graph, by cuBLAS and by cuBLASLt (torch's two back-ends), against the time of
    reading the weights at the GPU's bandwidth. The whole run's matrix products estimated from
    them (every layer of every step, steps in between interpolated)."""
    import torch
    import torch.nn.functional as F

    from minisgl.engine.graph import _determine_cuda_graph_bs
    from tools.bench_gpu import QWEN3_0_6B

    hw, layers = this_gpu(), QWEN3_0_6B["num_hidden_layers"]
    products = decode_products(QWEN3_0_6B)
    sizes = _determine_cuda_graph_bs(None, 256, 0, torch.device("cuda"))  # as bench_gpu's run
    shapes = [(step, graph_batch(len(c), sizes), len(c)) for step, c in run_decode_shapes(every)]
    steps = [step for step, _, _ in shapes]
    libraries = ["cublas", "cublaslt"]
    gen = torch.Generator(device="cuda").manual_seed(0)
    weights = {
        name: torch.randn(n, k, generator=gen, device="cuda", dtype=torch.bfloat16) * 0.02
        for name, (k, n) in products.items()
    }
    us: Dict[Tuple[str, int, str], float] = {}  # (library, batch, product) -> microseconds
    for library in libraries:
        torch.backends.cuda.preferred_blas_library(library)
        for batch in sorted({b for _, b, _ in shapes}):
            for name, (k, _) in products.items():
                x = torch.randn(batch, k, generator=gen, device="cuda", dtype=torch.bfloat16)
                us[library, batch, name], _ = graph_or_eager_microseconds(
                    functools.partial(F.linear, x, weights[name])
                )
    torch.backends.cuda.preferred_blas_library("default")
    shape = Shape.from_config(QWEN3_0_6B)  # the same matrices (the test says so)
    step_bytes = shape.matmul_weights * shape.itemsize

    def step_us(library: str, batch: int) -> float:
        layer = sum(us[library, batch, n] for n in products if n != "lm_head")
        return layers * layer + us[library, batch, "lm_head"]

    columns = ["step", "batch", "graph", *(f"{n} us" for n in products), "step ms",
               "weights TB/s", "TFLOP/s", "cuBLASLt: step ms"]  # fmt: skip
    rows = ["| " + " | ".join(columns) + " |", "|" + " ---: |" * len(columns)]
    for step, batch, running in shapes:
        if (step - 1) % 64 and step != steps[-1]:
            continue  # the table shows every 64th step; the estimate uses all
        t = step_us("cublas", batch)
        flops = 2 * batch * shape.matmul_weights  # two per weight per row
        rows.append(
            f"| {step} | {running} | {batch} | "
            + " | ".join(f"{us['cublas', batch, n]:.1f}" for n in products)
            + f" | {t / 1e3:.2f} | {step_bytes / t / 1e6:.2f} | {flops / t / 1e6:.0f}"
            + f" | {step_us('cublaslt', batch) / 1e3:.2f} |"
        )
        print(rows[-1], flush=True)
    estimates = {
        lib: whole_run(steps, [step_us(lib, b) for _, b, _ in shapes], 1) for lib in libraries
    }
    floor = steps[-1] * step_bytes / hw.memory_bytes_per_s  # steps 1 to the last
    out.write_text(
        "\n".join(rows) + f"\n\nThe whole run's matrix products (decode steps), estimated: cuBLAS "
        f"{estimates['cublas']:.2f} s, cuBLASLt {estimates['cublaslt']:.2f} s; reading the "
        f"weights once per step at {hw.memory_bytes_per_s / 1e12:.2f} TB/s ({hw.name}'s "
        f"datasheet): {floor:.2f} s. {step_bytes / 1e9:.2f} GB of weights per step. Each "
        f"product timed as {GRAPH_TIMING} (or eagerly, where its capture failed). "
        f"One {torch.cuda.get_device_name()}.\n"
    )
    print(out.read_text())


def split_k(out: Path) -> None:
    """o and down (bfloat16) at SPLIT_K_BATCHES rows: cuBLAS's `F.linear` against
    `split_k_linear` in each of SPLIT_K_SETTINGS, each timed in a CUDA graph; the fastest
    setting, its largest difference from cuBLAS's result, and the time of reading the weights.
    """
    import torch
    import torch.nn.functional as F

    from tools.bench_gpu import QWEN3_0_6B
    from tools.split_k import split_k_linear

    hw, layers = this_gpu(), QWEN3_0_6B["num_hidden_layers"]
    products = {n: s for n, s in decode_products(QWEN3_0_6B).items() if n in ("o", "down")}
    gen = torch.Generator(device="cuda").manual_seed(0)
    columns = ["product", "rows", "cuBLAS us", "split-K us", "slices, tile, load",
               "largest difference", "weights at full bandwidth us"]  # fmt: skip
    rows = ["| " + " | ".join(columns) + " |", "|" + " ---: |" * len(columns)]
    saved: Dict[int, float] = {}  # rows -> microseconds a layer saves
    largest = 0.0  # the largest output of cuBLAS, to read the differences against
    for name, (k, n) in products.items():
        weight = torch.randn(n, k, generator=gen, device="cuda", dtype=torch.bfloat16) * 0.02
        floor = n * k * weight.element_size() / hw.memory_bytes_per_s * 1e6
        for batch in SPLIT_K_BATCHES:
            x = torch.randn(batch, k, generator=gen, device="cuda", dtype=torch.bfloat16)
            reference = F.linear(x, weight)
            largest = max(largest, reference.float().abs().max().item())
            cublas, _ = graph_or_eager_microseconds(functools.partial(F.linear, x, weight))
            best: Tuple[float, Tuple[int, int, int], float] | None = None
            for split, block_n, block_k in SPLIT_K_SETTINGS:
                if k % (split * block_k):
                    continue
                partial = torch.empty(split, batch, n, device="cuda", dtype=torch.float32)
                result = torch.empty_like(reference)
                call = functools.partial(
                    split_k_linear, x, weight, split, block_n, block_k, partial, result
                )
                call()
                diff = (result.float() - reference.float()).abs().max().item()
                us, _ = graph_or_eager_microseconds(call)
                if best is None or us < best[0]:
                    best = (us, (split, block_n, block_k), diff)
            assert best is not None
            saved[batch] = saved.get(batch, 0.0) + max(0.0, cublas - best[0])
            setting = ", ".join(map(str, best[1]))
            rows.append(
                f"| {name} | {batch} | {cublas:.2f} | {best[0]:.2f} | {setting} | "
                f"{best[2]:.3g} | {floor:.2f} |"
            )
            print(rows[-1], flush=True)
    per_step = ", ".join(f"{layers * us:.0f} us at batch {b}" for b, us in saved.items())
    out.write_text(
        "\n".join(rows) + f"\n\nA decode step, taking the faster of the two for o and down in "
        f"each of its {layers} layers, would save {per_step}. Each product timed as "
        f"{GRAPH_TIMING}; weights read at {hw.memory_bytes_per_s / 1e12:.2f} TB/s ({hw.name}'s "
        f"datasheet). The largest difference is from cuBLAS's result (outputs up to "
        f"{largest:.1f}). One {torch.cuda.get_device_name()}.\n"
    )
    print(out.read_text())


def cold_microseconds(calls: Sequence[Callable[[], object]]) -> float:
    """The GPU's time per call of `calls`, each run once and then all replayed in a CUDA
    graph (`replay_microseconds`): each call reads its own weights, so none finds them in
    the L2 cache, as a layer of a decode step does not."""
    from tools.bench_kernels import replay_microseconds

    for call in calls:
        call()
    return replay_microseconds(calls)


def gated_words(batches: Set[int], gate_up_rows: int) -> str:
    """The table's sentence on the batches where down's columns include its input's SiLU."""
    if not batches:
        return ""
    return (
        f"At batches {min(batches)} to {max(batches)} down's columns include its input's SiLU "
        f"(above {gate_up_rows} rows the gate/up kernel does not make it): FlashInfer's "
        f"`silu_and_mul` before cuBLAS, made as the split kernel loads it. "
    )


def searched_words(unsearched: List[int], search_s: float) -> str:
    """The table's sentence on batches that the search, past its time, left out."""
    if not unsearched:
        return ""
    batches = ", ".join(map(str, sorted(unsearched)))
    return (
        f"The search stopped after {search_s:.0f} s: at batches {batches} the fastest is the "
        f"engine's tile, untried against the others. "
    )


def split_k_norm_settings(batch: int) -> List[Tuple[int, int, int, int]]:
    """The settings split-k-norm tries at a batch: tiles of rows from a quarter of the batch
    (rounded up to a power of two) to all of it, as tl.dot allows (16 rows or more)."""
    rows = max(16, 1 << (batch - 1).bit_length())
    return [s for s in SPLIT_K_NORM_SETTINGS if rows // 4 <= s[1] <= rows]


def split_k_norm(out: Path, every: int = 128, search_s: float = math.inf) -> None:
    """o and down, each with the add-and-norm after it, at the run's decode batches: cuBLAS
    and FlashInfer against `product_add_rmsnorm` (minisgl/kernel/triton/product_add_norm.py)
    with the engine's tile and with the fastest of SPLIT_K_NORM_SETTINGS. Writes the table
    and, beside it (.tiles), the fastest tiles as MINISGL_SPLIT_TILES takes them. Past
    `search_s` seconds the batches left (the smallest) keep the engine's tile, so that a
    short GPU call still ends with a whole table."""
    import flashinfer
    import torch
    import torch.nn.functional as F
    from triton.runtime.errors import OutOfResources

    from minisgl.engine.graph import _determine_cuda_graph_bs
    from minisgl.kernel.triton.gate_up_silu import MAX_ROWS as GATE_UP_MAX_ROWS
    from minisgl.kernel.triton.product_add_norm import SplitTile, product_add_rmsnorm, split_tile
    from minisgl.models.utils import split_down_makes_silu
    from tools.bench_gpu import QWEN3_0_6B
    from tools.bench_kernels import gpu_microseconds as warm_microseconds

    hw, layers = this_gpu(), QWEN3_0_6B["num_hidden_layers"]
    eps = QWEN3_0_6B["rms_norm_eps"]
    products = {n: s for n, s in decode_products(QWEN3_0_6B).items() if n in ("o", "down")}
    sizes = _determine_cuda_graph_bs(None, 256, 0, torch.device("cuda"))  # as bench_gpu's run
    shapes = [(step, graph_batch(len(c), sizes), len(c)) for step, c in run_decode_shapes(every)]
    gen = torch.Generator(device="cuda").manual_seed(0)
    hidden = QWEN3_0_6B["hidden_size"]
    norm_weight = 1 + 0.1 * torch.randn(hidden, generator=gen, device="cuda")
    norm_weight = norm_weight.to(torch.bfloat16)
    cublas: Dict[Tuple[str, int], Tuple[float, float]] = {}  # cold, warm
    engine: Dict[Tuple[str, int], float] = {}
    best: Dict[Tuple[str, int], Tuple[float, SplitTile]] = {}
    differ = [0.0, 0, 0]  # the largest difference; outputs that differ; outputs compared
    all_weights = {
        name: [
            torch.randn(n, k, generator=gen, device="cuda", dtype=torch.bfloat16) * k**-0.5
            for _ in range(COLD_WEIGHTS)
        ]
        for name, (k, n) in products.items()
    }
    unsearched: List[int] = []
    gated_batches: Set[int] = set()
    start = time.monotonic()
    for batch in sorted({b for _, b, _ in shapes}, reverse=True):  # the largest first
        search = time.monotonic() - start < search_s
        if not search:
            unsearched.append(batch)
        for name, (k, n) in products.items():
            weights = all_weights[name]
            # down as the engine runs it: its input's SiLU made by down's kernel where the
            # engine leaves it there, by FlashInfer's in the unfused path
            gated = name == "down" and split_down_makes_silu(batch)
            if gated:
                gated_batches.add(batch)
            width = 2 * k if gated else k
            x = torch.randn(batch, width, generator=gen, device="cuda", dtype=torch.bfloat16)
            residual = torch.randn(batch, n, generator=gen, device="cuda", dtype=torch.bfloat16)

            def unfused(weight: torch.Tensor) -> torch.Tensor:
                y = F.linear(flashinfer.silu_and_mul(x) if gated else x, weight)  # noqa: B023
                flashinfer.fused_add_rmsnorm(y, residual, norm_weight, eps)  # noqa: B023
                return y

            def split(
                tile: SplitTile, x=x, residual=residual, weights=weights, gated=gated
            ) -> float:
                return cold_microseconds([
                    functools.partial(product_add_rmsnorm, x, w, residual, norm_weight, eps, tile,
                                      gated)
                    for w in weights
                ])  # fmt: skip

            calls = [functools.partial(unfused, w) for w in weights]
            cublas[name, batch] = (cold_microseconds(calls), warm_microseconds(calls[0]))
            engine[name, batch] = split(split_tile(k, batch))
            best[name, batch] = (engine[name, batch], split_tile(k, batch))
            for setting in split_k_norm_settings(batch) if search else []:
                if k % (setting[0] * setting[3]):
                    continue
                tile = SplitTile(*setting)
                try:
                    us = split(tile)
                except OutOfResources:  # more shared memory than an SM has
                    torch.cuda.synchronize()
                    continue
                if us < best[name, batch][0]:
                    best[name, batch] = (us, tile)
            done = f"cuBLAS + add-and-norm {cublas[name, batch]}, split {engine[name, batch]:.2f}"
            print(f"{name} {batch}: {done}, fastest {best[name, batch]}", flush=True)
            ours = residual.clone()
            expected = unfused(weights[0])  # normalised in place of the product
            stream = residual  # the unfused path's residual, after it
            best_tile = best[name, batch][1]
            got = product_add_rmsnorm(x, weights[0], ours, norm_weight, eps, best_tile, gated)
            gap = (got.float() - expected.float()).abs()
            stream_gap = (ours.float() - stream.float()).abs().max().item()
            differ[0] = max(differ[0], gap.max().item(), stream_gap)
            differ[1] += int((gap > 0).sum().item())
            differ[2] += gap.numel()
    steps = [step for step, _, _ in shapes]

    def label(tile: SplitTile) -> str:
        return f"{tile.slices}, {tile.block_m}, {tile.block_n}, {tile.block_k}"

    columns = []
    for name in products:
        columns += [f"{name}: cuBLAS + add-and-norm us", f"{name}: split us", "fastest us",
                    "its tile"]  # fmt: skip
    rows = ["| step | batch | graph | " + " | ".join(columns) + " |",
            "| ---: | ---: | ---: |" + " ---: | ---: | ---: | :---: |" * len(products)]  # fmt: skip
    for step, batch, running in shapes:
        cells = []
        for name in products:
            cells += [f"{cublas[name, batch][0]:.1f}", f"{engine[name, batch]:.1f}",
                      f"{best[name, batch][0]:.1f}", label(best[name, batch][1])]  # fmt: skip
        rows.append(f"| {step} | {running} | {batch} | " + " | ".join(cells) + " |")
        print(rows[-1], flush=True)

    def run_seconds(times: Callable[[int], float]) -> float:
        return whole_run(steps, [times(b) for _, b, _ in shapes], layers)

    before = run_seconds(lambda b: sum(cublas[n, b][0] for n in products))
    split_run = run_seconds(lambda b: sum(engine[n, b] for n in products))
    fastest = run_seconds(lambda b: sum(best[n, b][0] for n in products))
    warm = ", ".join(
        f"{n} {cublas[n, b][1]:.1f} against {cublas[n, b][0]:.1f}"
        for b in (shapes[0][1], shapes[-1][1]) for n in products
    )  # fmt: skip
    tiles = ";".join(
        f"{k}:{b}={','.join(label(best[n, b][1]).split(', '))}"
        for n, (k, _) in products.items() for b in sorted({b for _, b, _ in shapes})
    )  # fmt: skip
    out.with_suffix(".tiles").write_text(tiles + "\n")
    tokens = same_tokens_both_ways("SPLIT_O_DOWN", "o and down split", must_match=False)
    floor = sum(k * n * 2 for k, n in products.values()) / hw.memory_bytes_per_s * 1e6
    out.write_text(
        "\n".join(rows) + f"\n\nTiles: slices, rows, outputs, inputs a load. The whole run's "
        f"decode steps, estimated ({layers} layers, steps in between interpolated): o and down "
        f"with their add-and-norms {before:.3f} s by cuBLAS and FlashInfer, {split_run:.3f} s "
        f"split with the engine's tiles, {fastest:.3f} s with the fastest. Reading both "
        f"weights once takes {floor:.1f} us a layer at {hw.memory_bytes_per_s / 1e12:.2f} TB/s "
        f"({hw.name}'s datasheet). Each timed as {COLD_WEIGHTS} calls in a CUDA graph, each "
        f"with its own copy of the weights, the median of 10 replays; with one copy, warm in "
        f"the L2, cuBLAS + add-and-norm take (us, at {shapes[0][1]} and {shapes[-1][1]} rows) "
        f"{warm}. {gated_words(gated_batches, GATE_UP_MAX_ROWS)}"
        f"{searched_words(unsearched, search_s)}Largest difference from "
        f"FlashInfer's result (normalised output and "
        f"residual, bfloat16) {differ[0]:.3g}; {differ[1]} of {differ[2]} outputs differ. "
        f"{tokens}One {torch.cuda.get_device_name()}.\n"
    )
    print(out.read_text())


def gate_up(out: Path, every: int = 16) -> None:
    """The gate/up product and SiLU of one layer, unfused and by the book's kernel, at the
    run's decode batches (see the module's docstring)."""
    import torch
    import torch.nn.functional as F
    from triton.runtime.errors import OutOfResources

    from minisgl.engine.graph import _determine_cuda_graph_bs
    from minisgl.kernel.triton.gate_up_silu import (
        MAX_ROWS,
        GateUpTile,
        gate_up_silu_triton,
        gate_up_tile,
    )
    from minisgl.layers.activation import silu_and_mul
    from tools.bench_gpu import QWEN3_0_6B
    from tools.bench_kernels import gpu_microseconds as graph_microseconds

    hidden, inter = QWEN3_0_6B["hidden_size"], QWEN3_0_6B["intermediate_size"]
    layers = QWEN3_0_6B["num_hidden_layers"]
    sizes = _determine_cuda_graph_bs(None, 256, 0, torch.device("cuda"))  # as bench_gpu's run
    shapes = [(step, graph_batch(len(c), sizes), len(c)) for step, c in run_decode_shapes(every)]
    gen = torch.Generator(device="cuda").manual_seed(0)
    weight = torch.randn(2 * inter, hidden, generator=gen, device="cuda", dtype=torch.bfloat16)
    weight *= hidden**-0.5
    last = shapes[-1][0]
    table_batches = {b for step, b, _ in shapes if (step - 1) % 64 == 0 or step == last}
    unfused_us: Dict[int, float] = {}
    fused_us: Dict[int, float] = {}
    best: Dict[int, Tuple[float, GateUpTile]] = {}
    largest = [0.0, 0.0]  # the largest difference from the unfused result, its largest output
    for batch in sorted({b for _, b, _ in shapes}):
        x = torch.randn(batch, hidden, generator=gen, device="cuda", dtype=torch.bfloat16)
        expected = silu_and_mul(F.linear(x, weight))
        got = gate_up_silu_triton(x, weight)
        largest[0] = max(largest[0], (got.float() - expected.float()).abs().max().item())
        largest[1] = max(largest[1], expected.float().abs().max().item())
        product = functools.partial(F.linear, x, weight)
        unfused_us[batch] = graph_microseconds(lambda: silu_and_mul(product()))  # noqa: B023
        fused_us[batch] = graph_microseconds(functools.partial(gate_up_silu_triton, x, weight))
        if batch not in table_batches:
            continue
        for m, n, k, stages in GATE_UP_CANDIDATES:
            if m > max(16, 2 * batch):  # more than twice the rows: mostly padding
                continue
            tile = GateUpTile(block_m=m, block_n=n, block_k=k, num_stages=stages)
            try:
                us = graph_microseconds(functools.partial(gate_up_silu_triton, x, weight, tile))
            except OutOfResources:  # more shared memory than an SM has
                torch.cuda.synchronize()
                continue
            if batch not in best or us < best[batch][0]:
                best[batch] = (us, tile)
    steps = [step for step, _, _ in shapes]
    rows = [
        "| step | batch | graph | product + SiLU, us | one kernel, us | its tile | "
        "fastest tile, us | that tile (rows, columns, inputs, stages) |",
        "| ---: | ---: | ---: | ---: | ---: | :---: | ---: | :---: |",
    ]

    def label(tile: GateUpTile) -> str:
        return f"{tile.block_m}, {tile.block_n}, {tile.block_k}, {tile.num_stages}"

    for step, batch, running in shapes:
        if (step - 1) % 64 and step != last:
            continue  # the table shows every 64th step and the last; the estimate uses all
        us, tile = best[batch]
        rows.append(
            f"| {step} | {running} | {batch} | {unfused_us[batch]:.1f} | {fused_us[batch]:.1f}"
            f" | {label(gate_up_tile(batch))} | {us:.1f} | {label(tile)} |"
        )
        print(rows[-1], flush=True)
    engine_us = {b: fused_us[b] if b <= MAX_ROWS else unfused_us[b] for b in unfused_us}
    run = {
        name: whole_run(steps, [times[b] for _, b, _ in shapes], layers)
        for name, times in (("unfused", unfused_us), ("fused", fused_us), ("engine", engine_us))
    }
    tokens = same_tokens_both_ways("FUSED_GATE_UP_SILU", "the kernel", must_match=False)
    out.write_text(
        "\n".join(rows) + f"\n\nThe whole run's decode steps, estimated ({layers} layers): "
        f"product + SiLU {run['unfused']:.3f} s, one kernel {run['fused']:.3f} s, as the engine "
        f"runs them (the kernel up to {MAX_ROWS} rows) {run['engine']:.3f} s. Largest "
        f"difference from the unfused result {largest[0]:.3g} (outputs up to {largest[1]:.1f}, "
        f"bfloat16). Each timed as {GRAPH_TIMING}; 4 warps a program. {tokens}"
        f"One {torch.cuda.get_device_name()}.\n"
    )
    print(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "what",
        choices=[
            "limit",
            "ab",
            "side",
            "options",
            "batch",
            "profile",
            "attention",
            "attention-run",
            "norms-rope",
            "kv-store",
            "pdl",
            "gate-up",
            "decode-kernels",
            "sampler",
            "matmuls",
            "split-k",
            "split-k-norm",
            "compiled",
            "counters",
        ],
    )
    parser.add_argument("--before", default="22", help="the chapter before the project")
    parser.add_argument("--after", default="P1")
    parser.add_argument("--files", help="ab: only these files (comma-separated) from --before")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--every", type=int, help="split-k-norm: every how many steps a batch")
    parser.add_argument(
        "--search-s",
        type=float,
        default=math.inf,
        help="split-k-norm: seconds for the search of tiles; smaller batches past it keep the "
        "engine's tile",
    )
    parser.add_argument("--official", type=Path, help="a folder holding upstream's minisgl")
    parser.add_argument("--official-site", type=Path, help="packages first on upstream's path")
    parser.add_argument(
        "--only", help="profile: these engines' labels, comma-separated; counters: these "
        "kernels' labels, separated by ';'"
    )  # fmt: skip
    parser.add_argument("--from-json", type=Path, help="profile: redo the tables from this")
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--set", dest="kernel_set", choices=DECODE_KERNEL_SETS,
        help="decode-kernels (default options), counters (default loop): the Triton kernel's "
        "settings to run",
    )  # fmt: skip
    parser.add_argument("--steps", help="counters: the run's decode steps (default 129,577)")
    parser.add_argument(
        "--variant", action="append", default=[],
        help='side, profile, batch: also this engine with settings, e.g. '
        '"three kernels:MINISGL_FUSED_QK_NORM_ROPE=0" or '
        '"loop 32:MINISGL_TRITON_DECODE_SETTINGS=page_loop=1,block_n=32"',
    )  # fmt: skip
    args = parser.parse_args()
    if args.what == "limit":
        show_limit(workload_limit())
    elif args.what == "ab":
        files = args.files.split(",") if args.files else None
        ab(args.before, args.after, args.rounds, args.out or OUT, files)
    elif args.what == "side":
        if args.official is None:
            parser.error("side needs --official: a folder holding upstream's minisgl package")
        side(args.official, args.official_site, args.rounds, args.out or SIDE_OUT, args.variant)
    elif args.what == "options":
        options(args.official, args.official_site, args.rounds, args.out or OPTIONS_OUT)
    elif args.what == "batch":
        batch(args.official, args.official_site, args.rounds, args.out or BATCH_OUT, args.variant)
    elif args.what == "attention":
        attention(args.out or ATTENTION_OUT)
    elif args.what == "norms-rope":
        norms_rope(args.out or NORMS_ROPE_OUT)
    elif args.what == "kv-store":
        kv_store(args.out or KV_STORE_OUT)
    elif args.what == "pdl":
        pdl(args.out or PDL_OUT)
    elif args.what == "gate-up":
        gate_up(args.out or GATE_UP_OUT)
    elif args.what == "decode-kernels":
        kernel_set = args.kernel_set or "options"
        decode_kernels(args.out or DECODE_KERNELS_OUT[kernel_set], kernel_set=kernel_set)
    elif args.what == "sampler":
        sampler(args.out or SAMPLER_OUT)
    elif args.what == "attention-run":
        attention_over_the_run(args.out or ATTENTION_RUN_OUT)
    elif args.what == "matmuls":
        matmuls(args.out or MATMULS_OUT)
    elif args.what == "split-k":
        split_k(args.out or SPLIT_K_OUT)
    elif args.what == "split-k-norm":
        split_k_norm(args.out or SPLIT_K_NORM_OUT, args.every or 128, args.search_s)
    elif args.what == "compiled":
        from tools.compiled_kernel import OUT as COMPILED_OUT
        from tools.compiled_kernel import compiled

        compiled(args.out or COMPILED_OUT)
    elif args.what == "counters":
        from tools.kernel_counters import OUT as COUNTERS_OUT
        from tools.kernel_counters import STEPS, counters

        steps = sorted(int(s) for s in args.steps.split(",")) if args.steps else STEPS
        only = args.only.split(";") if args.only else []
        counters(args.out or COUNTERS_OUT, args.kernel_set or "loop", steps, only)
    else:
        only = args.only.split(",") if args.only else []
        if args.from_json:  # the tables again, from a run's saved results
            (args.out or PROFILE_OUT).write_text(
                profile_tables(json.loads(args.from_json.read_text()))
            )
        else:
            profile(args.official, args.official_site, args.out or PROFILE_OUT, only, args.variant)


if __name__ == "__main__":
    main()
