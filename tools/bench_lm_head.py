"""The LM head on a CPU: `F.linear` against `lm_head_logits` (minisgl/layers/embedding.py).

    python tools/bench_lm_head.py              # one thread, as `steps.py check` runs
    python tools/bench_lm_head.py --threads 4

For SmolLM2's head (49152 x 576) and the tiny models' (49152 x 256), in float32, it times both
ways of computing the logits of 1 to 16 rows (the median of 20 calls after 3 warm-up calls)
and prints the largest difference between their results. Where `lm_head_logits` takes the
other path (more than 8 rows) the two columns time the same call.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from minisgl.layers.embedding import lm_head_logits  # noqa: E402

SHAPES = {"SmolLM2-135M": (49152, 576), "tiny models": (49152, 256)}
ROWS = [1, 2, 3, 4, 8, 16]


def milliseconds(call: Callable[[], torch.Tensor], repeats: int = 20) -> float:
    for _ in range(3):
        call()
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        call()
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    blas = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show())
    print(f"float32, {args.threads} thread(s), BLAS: {blas.group(1) if blas else 'unknown'}")
    print(f"{'head':<14} {'rows':>4} {'F.linear ms':>12} {'lm_head_logits ms':>18} {'speed-up':>9}"
          f" {'max |diff|':>11}")  # fmt: skip
    for name, (vocab, hidden) in SHAPES.items():
        weight = torch.randn(vocab, hidden) * 0.05
        for rows in ROWS:
            x = torch.randn(rows, hidden)
            plain = milliseconds(lambda x=x, w=weight: F.linear(x, w))
            ours = milliseconds(lambda x=x, w=weight: lm_head_logits(x, w, None))
            diff = (F.linear(x, weight) - lm_head_logits(x, weight, None)).abs().max().item()
            print(f"{name:<14} {rows:>4} {plain:>12.2f} {ours:>18.2f} {plain / ours:>8.1f}x"
                  f" {diff:>11.1e}")  # fmt: skip


if __name__ == "__main__":
    main()
