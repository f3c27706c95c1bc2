"""Project P1: the GPU performance bar.

The project's changes are measured on a GPU (`tools/bench_p1.py ab`); this main shows what a
laptop can show of them. It works out the physical limit of upstream's offline workload on
one H200, the number the project's second bar is a fraction of. It builds the inputs of real
steps both ways, a small tensor per request (chapter 22) and one list per batch (this
project), and checks they are the same tensors, counting the tensors each way makes. It
shows which sampler this machine's engine runs. And it checks the engine against
transformers: the project may change how fast, never what.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, List
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("LOG_LEVEL", "WARNING")
import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
from minisgl.core import Batch, SamplingParams  # noqa: E402
from minisgl.engine import sample  # noqa: E402
from minisgl.llm import LLM  # noqa: E402
from minisgl.scheduler import scheduler  # noqa: E402
from tools.bench_p1 import SAMPLER_LOGITS, gumbel_fit, show_limit, workload_limit  # noqa: E402
from tools.models import MOE_PARITY_MODELS, ensure_model  # noqa: E402
from tools.parity import load_example, run_parity  # noqa: E402

NEW_TOKENS = 16  # per prompt of the parity check
STEP_MODEL = "tiny-qwen3"
STEP_REQUESTS = 64  # decode batches of this many requests, as a server at load sees them
CPU = torch.device("cpu")


@dataclass
class Lengths:
    """What building a step's inputs reads of a request, as it was at that step."""

    cached_len: int
    device_len: int
    table_idx: int

    @property
    def extend_len(self) -> int:
        return self.device_len - self.cached_len


@dataclass
class Step:
    """One prepared batch, as _make_positions and _make_input_tuple see it."""

    is_prefill: bool
    padded_reqs: List[Lengths]
    positions: torch.Tensor  # what the project's code built
    slots: torch.Tensor


def per_request_positions(step: Step) -> torch.Tensor:
    """Chapter 22's way: a small tensor per request, then one concatenation."""
    parts = [torch.arange(r.cached_len, r.device_len, dtype=torch.int32) for r in step.padded_reqs]
    return torch.cat(parts)


def per_request_slots(step: Step) -> torch.Tensor:
    parts = [torch.full((r.extend_len,), r.table_idx, dtype=torch.int64) for r in step.padded_reqs]
    return torch.cat(parts)


def record_steps(llm: LLM) -> List[Step]:
    """Every batch the LLM prepares while it serves STEP_REQUESTS prompts."""
    steps: List[Step] = []
    prepare = scheduler.Scheduler._prepare_batch

    def watched(self: scheduler.Scheduler, batch: Batch) -> scheduler.ForwardInput:
        forward_input = prepare(self, batch)
        lengths = [Lengths(r.cached_len, r.device_len, r.table_idx) for r in batch.padded_reqs]
        slots = forward_input.input_tuple[0]
        positions, slots = (t.to("cpu", copy=True) for t in (batch.positions, slots))
        steps.append(Step(batch.is_prefill, lengths, positions, slots))  # on a GPU too
        return forward_input

    with mock.patch.object(scheduler.Scheduler, "_prepare_batch", watched):
        prompts = [[(7 * i + j) % 1000 for j in range(3 + i % 29)] for i in range(STEP_REQUESTS)]
        llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    return steps


def built_per_request(step: Step) -> None:
    per_request_positions(step), per_request_slots(step)


def built_from_lists(step: Step) -> None:
    batch: Any = step  # it has what the two functions read of a Batch
    scheduler._make_positions(batch, CPU), scheduler._make_input_tuple(batch, CPU)


def count_tensors(build: Callable[[Step], None], step: Step) -> int:
    """Tensors `build` makes for one step (each a call into torch's allocator)."""
    made = 0

    class Count(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            nonlocal made
            result = func(*args, **(kwargs or {}))
            made += isinstance(result, torch.Tensor)
            return result

    with Count():
        build(step)
    return made


def microseconds(build: Callable[[Step], None], step: Step, repeat: int = 200) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        build(step)
    return (time.perf_counter() - start) / repeat * 1e6


def show_step_inputs() -> None:
    with LLM(str(ensure_model(STEP_MODEL)), dtype=torch.float32, num_page_override=4096) as llm:
        steps = record_steps(llm)
    prefill = [s for s in steps if s.is_prefill]
    decode = [s for s in steps if not s.is_prefill]
    print(f"{STEP_MODEL}, {STEP_REQUESTS} prompts of 3 to 31 tokens, 8 new tokens each: "
          f"{len(prefill)} prefill and {len(decode)} decode batches")  # fmt: skip
    same = all(
        torch.equal(per_request_positions(s), s.positions)
        and torch.equal(per_request_slots(s), s.slots)
        for s in steps
    )
    print(f"positions and token-pool slots equal chapter 22's in every batch: {same}")
    largest = {
        "prefill": max(prefill, key=lambda s: len(s.padded_reqs)),
        "decode": max(decode, key=lambda s: len(s.padded_reqs)),
    }
    print("the largest batch of each kind, and the tensors its inputs take to build:")
    print(f"{'batch':8s} {'requests':>8s} {'tokens':>6s} {'per request':>11s} {'one list':>8s}")
    for kind, step in largest.items():
        tokens = sum(r.extend_len for r in step.padded_reqs)
        print(f"{kind:8s} {len(step.padded_reqs):8d} {tokens:6d} "
              f"{count_tensors(built_per_request, step):11d} "
              f"{count_tensors(built_from_lists, step):8d}")  # fmt: skip
    print("host time to build that decode batch's inputs, on this machine (it varies):")
    for what, build in (("per request", built_per_request), ("one list", built_from_lists)):
        print(f"  {what:12s} {microseconds(build, largest['decode']):8.1f} us")
    if not same:
        raise SystemExit("the two ways built different inputs")


def sampler_name(logits: torch.Tensor) -> str:
    if sample.gumbel_kernel_applies(logits):
        return "the Gumbel-max kernel (FlashInfer with top-k or top-p)"
    return "FlashInfer" if sample.sampling_kernels(logits) else "the PyTorch code"


def show_sampler() -> None:
    print(f"logits on the CPU: {sampler_name(torch.zeros(2, 8))} samples")
    if torch.cuda.is_available():
        print(f"logits on the GPU: {sampler_name(torch.zeros(2, 8, device='cuda'))} samples")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rows, temperatures = 8192, (0.6, 1.5)
    where = "on the GPU" if device.type == "cuda" else "in Triton's interpreter"
    print(f"the Gumbel-max kernel {where}, {rows:,} draws at each temperature T from")
    print("  " + " ".join(f"{x:g}" for x in SAMPLER_LOGITS) + " (bfloat16)")
    print("chi-square of the counts (7 degrees of freedom) against softmax(logits / ...):")
    print("    T   ... T (< 30: fits)   ... the other T (> 300: does not fit)")
    fits = []
    for t, other in zip(temperatures, reversed(temperatures)):
        own, wrong = gumbel_fit(t, other, device, rows)
        fits.append(own < 30 and wrong > 300)
        own_text = "< 30" if own < 30 else f"{own:.1f}"
        wrong_text = "> 300" if wrong > 300 else f"{wrong:.1f}"
        print(f"  {t:3.1f}   {own_text:20s} {wrong_text}")
    if not all(fits):
        raise SystemExit("the Gumbel-max kernel does not draw from the softmax")


def main() -> int:
    print("== the physical limit of upstream's offline workload (Qwen3-0.6B's shape, bf16)")
    show_limit(workload_limit())

    print("\n== a step's inputs, built from one list instead of a tensor per request")
    show_step_inputs()

    print("\n== the sampler")
    show_sampler()

    print("\n== the engine after the project, every token against transformers")
    # chapter 22's generator: the same engine settings, on this project's tree
    generate = load_example("examples/ch22_gap.py").generate
    summary = run_parity(generate, models=MOE_PARITY_MODELS, max_new_tokens=NEW_TOKENS)
    return 0 if summary.ok else 1


if __name__ == "__main__":
    sys.exit(main())
