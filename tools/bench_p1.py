"""Project P1's numbers: the physical limit of upstream's offline workload on a GPU, and the
engine before and after the project, measured side by side.

    python tools/bench_p1.py limit          # the roofline of the workload (any machine)
    python tools/bench_p1.py ab             # on an NVIDIA GPU: docs/data/p1-ab.md

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
the limit.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OUT = ROOT / "docs" / "data" / "p1-ab.md"
RUN_TIMEOUT_S = 150  # one benchmark run: imports, start-up, warm-up and about 7 s timed


@dataclass(frozen=True)
class Hardware:
    name: str
    memory_bytes_per_s: float  # HBM bandwidth
    bf16_flops_per_s: float  # dense tensor-core peak


# NVIDIA's H200 SXM datasheet: 4.8 TB/s of HBM3e; 1,979 TFLOPS of BF16 with 2:4 sparsity,
# so 989.5 dense
H200 = Hardware("NVIDIA H200 SXM", memory_bytes_per_s=4.8e12, bf16_flops_per_s=989.5e12)


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


def ab_table(runs: Dict[str, List[Dict]], result: Limit) -> str:
    import torch

    rows = [
        "| tree | runs (output tokens/s) | mean | spread | of the limit |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    means = {}
    for label, results in runs.items():
        rates = [r["tokens"] / r["seconds"] for r in results]
        means[label] = statistics.mean(rates)
        spread = (max(rates) - min(rates)) / means[label]
        rows.append(
            f"| {label} | {', '.join(f'{r:,.0f}' for r in rates)} | {means[label]:,.0f} | "
            f"{spread:.1%} | {means[label] / result.tokens_per_s:.0%} |"
        )
    before, after = means.values()
    return (
        "\n".join(rows)
        + f"\n\nRatio after / before: {after / before:.3f}. The limit: {result.seconds:.2f} s, "
        f"{result.tokens_per_s:,.0f} output tokens/s ({H200.name}). Measured on one "
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}, "
        f"{sum(len(r) for r in runs.values())} runs alternating.\n"
    )


def ab(before: str, after: str, rounds: int, out: Path) -> None:
    work = Path(tempfile.mkdtemp(prefix="minisgl-p1-ab-"))
    try:
        trees = {
            f"chapter {before}": build_tree(before, work / before),
            f"project {after}": build_tree(after, work / after),
        }
        for label, tree in trees.items():  # not counted: fills the kernel caches
            print(f"warm-up {label}: {run_tree(tree)}", flush=True)
        runs: Dict[str, List[Dict]] = {label: [] for label in trees}
        for round in range(rounds):
            for label, tree in trees.items():
                runs[label].append(run_tree(tree))
                print(f"round {round + 1} {label}: {runs[label][-1]}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out.write_text(ab_table(runs, workload_limit()))
    print(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["limit", "ab"])
    parser.add_argument("--before", default="22", help="the chapter before the project")
    parser.add_argument("--after", default="P1")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if args.what == "limit":
        show_limit(workload_limit())
    else:
        ab(args.before, args.after, args.rounds, args.out)


if __name__ == "__main__":
    main()
