"""The engine's kernels on a GPU: time, and bandwidth against the device's peak.

    python tools/bench_kernels.py [--peak-gbs 4800] [--out docs/data/ch19-kernels-h200.md]

For Qwen3-0.6B's shapes in bfloat16 (8 KV heads of 128 per layer: rows of 2 KiB; an embedding
of 151,936 x 1,024: rows of 2 KiB), it times the KV store (CUDA, Triton and PyTorch's two
`index_copy_`) and the embedding lookup (CUDA and `F.embedding`) for a decode batch and a
prefill chunk. The GPU's time is that of 20 calls captured in a CUDA graph (the median of 10
replays), so that launching costs nothing; the last column is the wall time per call of 200
eager calls, which is the host's launch cost where that is larger. Bytes moved count every
byte read and written once (rows, and the indices). The peak is the H200's HBM3e bandwidth,
4.8 TB/s by its data sheet. Needs a GPU.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, List, Sequence

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from minisgl.kernel import indexing, store_cache  # noqa: E402
from minisgl.kernel.store import store_cache_reference  # noqa: E402
from minisgl.kernel.triton.store import store_cache_triton  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "docs" / "data" / "ch19-kernels-h200.md"
KV_HEADS, HEAD_DIM, SLOTS = 8, 128, 1 << 17
VOCAB, HIDDEN = 151_936, 1024
TOKENS = [256, 8192]  # a decode batch of 256 requests, a prefill chunk of 8192 tokens


def gpu_microseconds(call: Callable[[], object]) -> float:
    """The GPU's time per call: 20 calls captured in a CUDA graph, replayed 10 times (the
    median), so that the host's cost of launching does not count."""
    for _ in range(3):
        call()
    return replay_microseconds([call] * 20)


def replay_microseconds(calls: Sequence[Callable[[], object]]) -> float:
    """The GPU's time per call of `calls`, captured one after another in a CUDA graph and
    replayed 10 times (the median)."""
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    times = []
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / len(calls))
    return statistics.median(times)


def host_microseconds(call: Callable[[], object]) -> float:
    """Wall time per call of 200 calls in a row, eagerly: the launch cost where it exceeds
    the GPU's time."""
    torch.cuda.synchronize()
    began = time.perf_counter()
    for _ in range(200):
        call()
    torch.cuda.synchronize()
    return (time.perf_counter() - began) * 1e6 / 200


def rows(tokens: int, peak: float) -> List[str]:
    dtype, row = torch.bfloat16, KV_HEADS * HEAD_DIM
    caches = [torch.zeros(SLOTS, KV_HEADS, HEAD_DIM, device="cuda", dtype=dtype) for _ in range(2)]
    qkv = torch.randn(tokens, 4 * row, device="cuda", dtype=dtype)  # q has 16 heads: 2 x row
    k, v = qkv[:, 2 * row : 3 * row], qkv[:, 3 * row :]
    slots = torch.randperm(SLOTS, device="cuda")[:tokens].to(torch.int32)
    store_bytes = 2 * tokens * row * 2 * 2 + tokens * 4  # k and v, read and written; slots
    weights = torch.randn(VOCAB, HIDDEN, device="cuda", dtype=dtype)
    ids = torch.randint(0, VOCAB, (tokens,), device="cuda", dtype=torch.int32)
    out = torch.empty(tokens, HIDDEN, device="cuda", dtype=dtype)
    index_bytes = tokens * HIDDEN * 2 * 2 + tokens * 4
    ids_long = ids.long()
    cases = [
        ("KV store", "CUDA (store.cu)", lambda: store_cache(*caches, slots, k, v), store_bytes),
        ("KV store", "Triton", lambda: store_cache_triton(*caches, slots, k, v), store_bytes),
        ("KV store", "PyTorch, 2 x index_copy_",
         lambda: store_cache_reference(*caches, slots, k, v), store_bytes),
        ("embedding", "CUDA (index.cu)", lambda: indexing(weights, ids, output=out), index_bytes),
        ("embedding", "PyTorch, F.embedding", lambda: F.embedding(ids_long, weights), index_bytes),
    ]  # fmt: skip
    lines = []
    for what, how, call, nbytes in cases:
        us = gpu_microseconds(call)
        gbs = nbytes / us / 1e3
        lines.append(
            f"| {what} | {tokens:,} | {how} | {us:.1f} | {gbs:,.0f} | {100 * gbs / peak:.0f}% "
            f"| {host_microseconds(call):.1f} |"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--peak-gbs", type=float, default=4800.0, help="the device's peak GB/s")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_kernels.py needs a GPU")
    lines = [
        "| kernel | tokens | implementation | GPU µs | GB/s | of peak | µs per call, eager |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for tokens in TOKENS:
        lines += rows(tokens, args.peak_gbs)
    name = torch.cuda.get_device_name()
    lines += ["", f"Measured on one {name}, torch {torch.__version__}, bfloat16; peak "
              f"{args.peak_gbs:,.0f} GB/s."]  # fmt: skip
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
