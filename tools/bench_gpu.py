"""Upstream's offline benchmark on an NVIDIA GPU: our engine with each attention backend, and
transformers' batched generate as the floor.

    python tools/bench_gpu.py                      # on a machine with a GPU
    python tools/bench_gpu.py --only torch,fi      # some configurations

It writes docs/data/ch17-gpu-bench.md (or --out; chapter 18's table is made with
`--only fi,fi-graphs,transformers --out docs/data/ch18-gpu-bench.md`). The workload is upstream's
benchmark/offline/bench.py: 256 requests made with random.seed(0), each a prompt of 100..1024
random token ids below 10,000 and 100..1024 new tokens, temperature 0.6, EOS ignored; the
model has Qwen3-0.6B's shape (28 layers, 16 query and 8 key/value heads of 128, vocabulary
151,936) with random weights, in bfloat16; page size 256, prefill batches of at most 16,384
tokens. Random weights do the same work as real ones: every request generates exactly its
number of tokens.

Each configuration runs in a process of its own: it builds the engine, generates one short
warm-up request (FlashInfer compiles or loads its kernels then), and times `LLM.generate` of
the 256 requests. transformers runs a smaller job, the floor: 64 prompts of 256 tokens, 256
new tokens each, in one batch.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tools.models import cache_dir, ensure_model  # noqa: E402

OUT = ROOT / "docs" / "data" / "ch17-gpu-bench.md"
RESULT = "RESULT "  # the prefix of the line a measuring child prints its result on
RUN_TIMEOUT_S = 540  # one configuration; the whole call on the lent GPU has 600 s
QWEN3_0_6B = dict(
    architectures=["Qwen3ForCausalLM"],
    model_type="qwen3",
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    vocab_size=151936,
    tie_word_embeddings=True,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    max_position_embeddings=40960,
    attention_bias=False,
    hidden_act="silu",
    torch_dtype="bfloat16",
    bos_token_id=151643,
    eos_token_id=151645,
)
# name -> (what the row says, the engine's settings)
CONFIGURATIONS: Dict[str, Tuple[str, Dict]] = {
    "torch": (
        "torch backend (chapter 05), overlap on",
        dict(attention_backend="torch", cuda_graph_max_bs=0),
    ),
    "fi": (
        "FlashInfer (chapter 17), overlap on",
        dict(attention_backend="fi", cuda_graph_max_bs=0),
    ),
    "fi-graphs": (
        "FlashInfer + CUDA graphs up to batch 256, overlap on",
        dict(attention_backend="fi"),
    ),
}


def model_folder() -> Path:
    """Qwen3-0.6B's config with a small tokenizer (the prompts are token ids; the engine only
    reads its EOS id), no weights: the engine makes random ones (use_dummy_weight)."""
    folder = cache_dir() / "models" / "qwen3-0.6b-shape"
    folder.mkdir(parents=True, exist_ok=True)
    tiny = ensure_model("tiny-qwen3")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_bytes((tiny / name).read_bytes())
    (folder / "config.json").write_text(json.dumps(QWEN3_0_6B, indent=1))
    return folder


def workload() -> Tuple[List[List[int]], List[int]]:
    """Upstream's requests, drawn in upstream's order from random.seed(0)."""
    from minisgl.benchmark.offline import make_offline_workload

    work = make_offline_workload()
    return work.prompts, [p.max_tokens for p in work.sampling_params]


def build_engine(name: str):
    """Our engine in configuration `name`, after one short warm-up request (FlashInfer
    compiles or loads its kernels then)."""
    import torch

    from minisgl.core import SamplingParams
    from minisgl.llm import LLM

    llm = LLM(
        str(model_folder()), dtype=torch.bfloat16, use_dummy_weight=True, page_size=256,
        max_seq_len_override=4096, max_extend_tokens=16384, **CONFIGURATIONS[name][1],
    )  # fmt: skip
    try:
        llm.generate([[1, 2, 3, 4]], SamplingParams(temperature=0.1, max_tokens=8))
    except BaseException:
        llm.shutdown()
        raise
    return llm


def run_ours(name: str) -> Dict:
    from minisgl.core import SamplingParams

    prompts, new_tokens = workload()
    llm = build_engine(name)
    try:
        params = [
            SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=n) for n in new_tokens
        ]
        start = time.perf_counter()
        outputs = llm.generate(prompts, params)
        seconds = time.perf_counter() - start
    finally:
        llm.shutdown()
    generated = sum(len(o["token_ids"]) for o in outputs)
    assert generated == sum(new_tokens), (generated, sum(new_tokens))
    return dict(seconds=seconds, tokens=generated, prompt_tokens=sum(map(len, prompts)))


def run_transformers() -> Dict:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(model_folder())
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    batch, length, new = 64, 256, 256
    ids = torch.randint(0, 10000, (batch, length), device="cuda")

    def generate(n: int) -> None:
        model.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=0.6,
            max_new_tokens=n, min_new_tokens=n, pad_token_id=0,
        )  # fmt: skip

    generate(4)  # warm-up
    torch.cuda.synchronize()
    start = time.perf_counter()
    generate(new)
    torch.cuda.synchronize()
    return dict(
        seconds=time.perf_counter() - start, tokens=batch * new, prompt_tokens=batch * length
    )


def run_for_result(args: List[str], timeout: float, env: Dict[str, str] | None = None) -> Any:
    """Run `python *args` in a fresh process (LOG_LEVEL=WARNING, `env` on top) and return the
    JSON of the last line it prints as `print_result` does. If it fails, the tail of its
    output goes to stderr and the run stops, naming the command."""
    env = {**os.environ, "LOG_LEVEL": "WARNING", **(env or {})}
    done = subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    if done.returncode != 0 or not lines:
        sys.stderr.write(done.stdout[-4000:] + done.stderr[-4000:])
        raise SystemExit(f"{args}: exit code {done.returncode}")
    return json.loads(lines[-1].removeprefix(RESULT))


def print_result(result: Any) -> None:
    """What a child of `run_for_result` prints last: its result, as one line of JSON."""
    print(RESULT + json.dumps(result), flush=True)


def run_in_child(name: str) -> Dict:
    return run_for_result([__file__, "--child", name], RUN_TIMEOUT_S)


def table(results: Dict[str, Dict]) -> str:
    import torch

    rows = [
        "| engine | output tokens | seconds | output tokens/s |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name, result in results.items():
        what = CONFIGURATIONS[name][0] if name in CONFIGURATIONS else (
            "transformers `generate`, batch 64, prompts of 256, 256 new tokens (the floor)"
        )  # fmt: skip
        rate = result["tokens"] / result["seconds"]
        rows.append(f"| {what} | {result['tokens']:,} | {result['seconds']:.1f} | {rate:,.0f} |")
    gpu = torch.cuda.get_device_name()
    return "\n".join(rows) + f"\n\nMeasured on one {gpu}, torch {torch.__version__}.\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=",".join([*CONFIGURATIONS, "transformers"]))
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        result = run_transformers() if args.child == "transformers" else run_ours(args.child)
        print_result(result)
        return
    results = {}
    for name in args.only.split(","):
        results[name] = run_in_child(name)
        print(name, results[name], flush=True)
    args.out.write_text(table(results))
    print(args.out.read_text())


if __name__ == "__main__":
    main()
