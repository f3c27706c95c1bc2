"""The LM head on a CPU: `F.linear` against the same product with its operands swapped.

    python tools/bench_lm_head.py              # one thread, as `steps.py check` runs
    python tools/bench_lm_head.py --threads 4

For SmolLM2's head (49152 x 576) and the tiny models' (49152 x 256), in float32, it times the
logits of 1 to 16 rows both ways (the median of 20 calls after 3 warm-up calls): `F.linear(x,
weight)`, and `(weight @ x.T).T`, which some CPUs run several times faster for a decode
step's few rows and others several times slower (a single row as two equal columns: one
column takes MKL's matrix-vector path). It prints the largest difference between the two
results too, and which way the head (`lm_head_logits` in minisgl/layers/embedding.py, which
times the two once on three rows) takes on this CPU.
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from typing import Callable

import torch
import torch.nn.functional as F

from minisgl.layers.embedding import SWAP_ROWS, _swapped_wins

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


def swapped(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`F.linear(x, weight)` as `weight @ x.T`, transposed back: [rows, vocabulary]."""
    columns = x.T if x.shape[0] > 1 else torch.cat([x, x]).T
    return torch.mm(weight, columns)[:, : x.shape[0]].T.contiguous()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    blas = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show())
    print(f"float32, {args.threads} thread(s), BLAS: {blas.group(1) if blas else 'unknown'}")
    print(f"{'head':<14} {'rows':>4} {'F.linear ms':>12} {'weight @ x.T ms':>16}"
          f" {'F.linear is':>12} {'max |diff|':>11}")  # fmt: skip
    for name, (vocab, hidden) in SHAPES.items():
        weight = torch.randn(vocab, hidden) * 0.05
        for rows in ROWS:
            x = torch.randn(rows, hidden)
            plain = milliseconds(lambda x=x, w=weight: F.linear(x, w))
            other = milliseconds(lambda x=x, w=weight: swapped(x, w))
            diff = (F.linear(x, weight) - swapped(x, weight)).abs().max().item()
            print(f"{name:<14} {rows:>4} {plain:>12.2f} {other:>16.2f}"
                  f" {other / plain:>10.1f}x {diff:>11.1e}")  # fmt: skip
    for name, (vocab, hidden) in SHAPES.items():
        way = "weight @ x.T" if _swapped_wins(torch.randn(vocab, hidden)) else "F.linear"
        print(f"{name}: the head takes {way} for 1 to {SWAP_ROWS} rows on this CPU")


if __name__ == "__main__":
    main()
