"""Timing one kernel, or any call, on the device it runs on.

`perf_cuda` times a call on a GPU the way a kernel benchmark must: on its own stream, after a
warm-up, with CUDA events rather than the host's clock (a launch returns before the kernel
ends), and by default replaying a CUDA graph of several calls, so that the launch overhead of
each call does not hide a kernel of a few microseconds. `perf_cpu` is the same measurement for
a call that runs on the CPU. `compare_memory_kernel_perf` times two implementations of a
memory-bound operation and reports each as bandwidth: bytes moved per second.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, Tuple

import torch

from minisgl.utils import init_logger

logger = init_logger(__name__)


def perf_cuda(
    f: Callable[[], Any],
    *,
    init_stream: bool = True,
    repetitions: int = 10,
    cuda_graph_repetitions: int | None = 10,
) -> float:
    """Milliseconds per call of `f` on the current GPU. With `cuda_graph_repetitions` = N,
    N calls are captured in one graph and the graph is replayed `repetitions` times."""
    if repetitions <= 0:
        raise ValueError(f"repetitions must be positive, not {repetitions}")
    torch.cuda.synchronize()
    stream = torch.cuda.Stream() if init_stream else torch.cuda.current_stream()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        f()  # warm-up: a JIT kernel compiles, an allocator grows, outside the timing
        calls_per_replay = cuda_graph_repetitions or 1
        if cuda_graph_repetitions:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                for _ in range(cuda_graph_repetitions):
                    f()
            replay: Callable[[], Any] = graph.replay
        else:
            replay = f
        replay()
        start.record()
        for _ in range(repetitions):
            replay()
        end.record()
        end.synchronize()
    return start.elapsed_time(end) / (repetitions * calls_per_replay)


def perf_cpu(f: Callable[[], Any], *, repetitions: int = 10) -> float:
    """Milliseconds per call of `f` on the CPU: the best of `repetitions` timed calls after a
    warm-up (the minimum: other work on the machine only ever adds time)."""
    if repetitions <= 0:
        raise ValueError(f"repetitions must be positive, not {repetitions}")
    f()
    best = float("inf")
    for _ in range(repetitions):
        begin = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - begin)
    return best * 1000


def compare_memory_kernel_perf(
    *,
    baseline: Callable[[], Any],
    our_impl: Callable[[], Any],
    memory_footprint: int,
    description: str = " ",
    extra_kwargs: Dict[str, Any] | None = None,
    need_latency: bool = True,
) -> Tuple[float, float]:
    """Both calls timed with `perf_cuda` (or `perf_cpu` without a GPU), as bandwidth in GB/s:
    `memory_footprint` bytes read and written per call, divided by the time of a call."""
    timer = perf_cuda if torch.cuda.is_available() else perf_cpu
    kwargs = extra_kwargs or {}
    parts = []
    bandwidths = []
    for name, f in (("Baseline", baseline), ("Our Impl", our_impl)):
        ms = timer(f, **kwargs)
        bandwidths.append(memory_footprint / (ms * 1e6))
        latency = f"{ms:8.3f} ms | " if need_latency else ""
        parts.append(f"{name}: {latency}{bandwidths[-1]:8.3f} GB/s")
    logger.info(description + " | ".join(parts))
    return bandwidths[0], bandwidths[1]
