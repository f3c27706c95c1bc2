"""Decode step time with and without CUDA graphs (chapter 18), on an NVIDIA GPU.

    python tools/bench_decode.py                 # writes docs/data/ch18-decode-step.md
    python tools/bench_decode.py --sizes 1,16    # some batch sizes

The model has Qwen3-0.6B's shape with random weights, in bfloat16, with FlashInfer attention
(tools/bench_gpu.py makes it). For each batch size bs, bs requests of 256 random prompt tokens
generate 256 tokens each (EOS ignored), all in step: after one prefill every step is a decode
step of bs requests, with 257 to 511 keys each. The time of a step is the interval between two
consecutive decode steps as the scheduler issues them (overlap scheduling on), the median over
the middle half of the run; in that steady state the interval is whichever is slower, the
host's work for a step or the device's.

One process with graphs (captured for the batch sizes asked), one without; each builds its
engine once and runs the sizes one after another.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tools.bench_gpu import model_folder, print_result, run_for_result  # noqa: E402

OUT = ROOT / "docs" / "data" / "ch18-decode-step.md"
PROMPT, NEW = 256, 256
RUN_TIMEOUT_S = 400


def run(graphs: bool, sizes: List[int]) -> Dict[int, float]:
    """Median decode step time in ms for each batch size."""
    import random

    import torch

    from minisgl.core import SamplingParams
    from minisgl.llm import LLM

    graph_settings = dict(cuda_graph_bs=sizes) if graphs else dict(cuda_graph_max_bs=0)
    llm = LLM(
        str(model_folder()), dtype=torch.bfloat16, use_dummy_weight=True, page_size=256,
        max_seq_len_override=4096, max_running_req=max(sizes), attention_backend="fi",
        **graph_settings,
    )  # fmt: skip
    decode_calls: List[float] = []
    forward = llm.engine.forward_batch

    def timed(batch, args):  # type: ignore[no-untyped-def]
        if batch.is_decode:
            decode_calls.append(time.perf_counter())
        return forward(batch, args)

    llm.engine.forward_batch = timed  # type: ignore[method-assign]
    results: Dict[int, float] = {}
    try:
        llm.generate([[1, 2, 3, 4]], SamplingParams(temperature=0.1, max_tokens=8))  # warm-up
        rng = random.Random(0)
        for bs in sizes:
            prompts = [[rng.randint(0, 10000) for _ in range(PROMPT)] for _ in range(bs)]
            params = SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=NEW)
            decode_calls.clear()
            llm.generate(prompts, params)
            gaps = [b - a for a, b in zip(decode_calls, decode_calls[1:])]
            middle = gaps[len(gaps) // 4 : 3 * len(gaps) // 4]
            results[bs] = 1000 * statistics.median(middle)
    finally:
        llm.shutdown()
    return results


def run_in_child(graphs: bool, sizes: List[int]) -> Dict[int, float]:
    args = [
        __file__,
        "--child",
        "graphs" if graphs else "eager",
        "--sizes",
        ",".join(map(str, sizes)),
    ]
    return {int(k): v for k, v in run_for_result(args, RUN_TIMEOUT_S).items()}


def table(eager: Dict[int, float], graphs: Dict[int, float]) -> str:
    import torch

    rows = [
        "| batch size | eager (ms per step) | CUDA graph (ms per step) | speed-up |",
        "| ---: | ---: | ---: | ---: |",
    ]
    for bs in eager:
        rows.append(
            f"| {bs} | {eager[bs]:.2f} | {graphs[bs]:.2f} | {eager[bs] / graphs[bs]:.2f}x |"
        )
    gpu = torch.cuda.get_device_name()
    return (
        "\n".join(rows)
        + f"\n\nMeasured on one {gpu}, torch {torch.__version__}: Qwen3-0.6B's shape, random "
        f"weights, bfloat16, FlashInfer, prompts of {PROMPT} tokens, {NEW} new tokens each.\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1,16,64,256")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--child", choices=["graphs", "eager"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.child:
        result = run(args.child == "graphs", sizes)
        print_result(result)
        return
    eager = run_in_child(False, sizes)
    print("eager", eager, flush=True)
    graphs = run_in_child(True, sizes)
    print("graphs", graphs, flush=True)
    args.out.write_text(table(eager, graphs))
    print(args.out.read_text())


if __name__ == "__main__":
    main()
