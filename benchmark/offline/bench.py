"""Upstream's offline benchmark (benchmark/offline/bench.py), on this package.

    python benchmark/offline/bench.py --model Qwen/Qwen3-0.6B        # upstream's run, on a GPU
    python benchmark/offline/bench.py --model qwen3-0.6b-shape       # its shape, random weights
    python benchmark/offline/bench.py --model smollm2-135m --num-seqs 16 --max-input-len 128 \\
        --max-output-len 32                                          # a CPU-sized run

256 requests from random.seed(0), prompts of 100 to 1,024 random ids, 100 to 1,024 new tokens
each at temperature 0.6 with the EOS ignored; upstream's engine settings (4,096 tokens a
sequence, prefill batches of 16,384 tokens, CUDA graphs up to batch 256, pages of 256 tokens).
It prints the tokens, the seconds of one `generate` after a warm-up, and their ratio.
A name of the book's models (tools/models.py) is built in the cache; "qwen3-0.6b-shape" is
Qwen3-0.6B's config with random weights (tools/bench_gpu.py).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("LOG_LEVEL", "WARNING")

import torch  # noqa: E402

from minisgl.benchmark.offline import make_offline_workload, run_offline  # noqa: E402
from minisgl.core import SamplingParams  # noqa: E402
from minisgl.llm import LLM  # noqa: E402


def resolve(model: str) -> tuple[str, dict]:
    """The model's path, and the engine settings it needs."""
    from tools.models import SMOLLM2, TINY_MODELS, ensure_model

    if model == "qwen3-0.6b-shape":
        from tools.bench_gpu import model_folder

        return str(model_folder()), dict(use_dummy_weight=True)
    if model in TINY_MODELS or model == SMOLLM2:
        return str(ensure_model(model)), {}
    return model, {}  # a folder or a Hugging Face model id


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen3-0.6b-shape")
    parser.add_argument("--num-seqs", type=int, default=256)
    parser.add_argument("--max-input-len", type=int, default=1024)
    parser.add_argument("--max-output-len", type=int, default=1024)
    parser.add_argument("--page-size", type=int, default=256)
    args = parser.parse_args()
    gpu = torch.cuda.is_available()
    path, extra = resolve(args.model)
    settings = dict(max_seq_len_override=4096, max_extend_tokens=16384, page_size=args.page_size,
                    cuda_graph_max_bs=256 if gpu else 0, **extra)  # fmt: skip
    low_in, low_out = min(100, args.max_input_len), min(100, args.max_output_len)
    work = make_offline_workload(args.num_seqs, args.max_input_len, args.max_output_len,
                                 min_input_len=low_in, min_output_len=low_out)  # fmt: skip
    dtype = torch.bfloat16 if gpu else torch.float32
    with LLM(path, dtype=dtype, **settings) as llm:
        llm.generate(["Benchmark: "], SamplingParams(temperature=0.1))  # the warm-up
        result = run_offline(llm, work.prompts, work.sampling_params)
    if result.output_tokens != work.output_tokens:
        raise SystemExit(f"{result.output_tokens} tokens came back, {work.output_tokens} asked")
    print(f"Total: {result.output_tokens}tok, Time: {result.seconds:.2f}s, "
          f"Throughput: {result.throughput:.2f}tok/s")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
