"""Chapter 06: the engine and the sampler.

An Engine owns the model, the KV pool, the page table, the attention backend and the sampler.
Here a batch of three requests of different lengths is assembled by hand (the scheduler of
chapter 07 will do it), prefilled, then decoded step by step through `Engine.forward_batch`.
Two requests decode greedily and must match transformers; the third samples.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Dict, List

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("LOG_LEVEL", "WARNING")  # the engine's start-up log shows timings
from examples.helpers.paging import PageAllocator, prepare_batch
from minisgl.core import Batch, Req, SamplingParams  # noqa: E402
from minisgl.distributed import DistributedInfo  # noqa: E402
from minisgl.engine import Engine, EngineConfig  # noqa: E402
from tools.models import DEMO_MODEL, ensure_model  # noqa: E402
from tools.parity import book_dtype, build_prompts, eos_ids, load_tokenizer, run_parity


def make_engine(
    name: str, num_pages: int = 256, page_size: int = 16, max_running_req: int = 8
) -> Engine:
    config = EngineConfig(
        model_path=str(ensure_model(name)),
        tp_info=DistributedInfo(0, 1),
        dtype=book_dtype(),
        max_running_req=max_running_req,
        page_size=page_size,
        num_page_override=num_pages,
    )
    return Engine(config)


def step(engine: Engine, reqs: List[Req], phase: str, allocator) -> List[int]:
    """Prepare one batch by hand, run it, and return each request's new token."""
    batch: Batch = prepare_batch(reqs, phase, allocator)
    batch.input_ids = batch.input_ids.to(engine.device)
    batch.positions = batch.positions.to(engine.device)
    batch.out_loc = batch.out_loc.to(engine.device)
    engine.attn_backend.prepare_metadata(batch)
    output = engine.forward_batch(batch, engine.sampler.prepare(batch))
    output.copy_done_event.synchronize()  # the host copy of the tokens is ready
    tokens = output.next_tokens_cpu.tolist()
    for req, token in zip(reqs, tokens):
        req.append_host(torch.tensor([token], dtype=torch.int32))
    return tokens


def run(
    engine: Engine,
    prompts: List[List[int]],
    params: List[SamplingParams],
    eos: List[int],
    trace=None,
) -> List[List[int]]:
    """Prefill every request in one batch, then decode the unfinished ones together."""
    allocator = PageAllocator(engine.num_pages, engine.ctx.page_size, engine.page_table)
    reqs = [
        Req(
            input_ids=torch.tensor(p, dtype=torch.int32),
            table_idx=i,
            cached_len=0,
            output_len=sp.max_tokens,
            uid=i,
            sampling_params=sp,
            cache_handle=None,
        )  # type: ignore[arg-type]
        for i, (p, sp) in enumerate(zip(prompts, params))
    ]
    outputs: Dict[int, List[int]] = {r.uid: [] for r in reqs}
    running, phase = list(reqs), "prefill"
    while running:
        if trace:
            trace(phase, running)
        for req, token in zip(running, step(engine, running, phase, allocator)):
            outputs[req.uid].append(token)
        finished = [
            r
            for r in running
            if (outputs[r.uid][-1] in eos and not r.sampling_params.ignore_eos) or not r.can_decode
        ]
        for req in finished:
            allocator.release(req.table_idx)
        running, phase = [r for r in running if r not in finished], "decode"
    return [outputs[r.uid] for r in reqs]


def hand_made_batch() -> None:
    engine = make_engine(DEMO_MODEL)
    tok = load_tokenizer(DEMO_MODEL)
    print(
        f"engine: {engine.num_pages} pages of {engine.ctx.page_size} tokens, page table "
        f"{tuple(engine.page_table.shape)}, backend {type(engine.attn_backend).__name__}, "
        f"device {engine.device.type}"
    )
    prompts = build_prompts(DEMO_MODEL)
    params = [
        SamplingParams(max_tokens=4),
        SamplingParams(max_tokens=7),
        SamplingParams(temperature=1.0, top_k=50, top_p=0.95, max_tokens=8),
    ]

    def trace(phase: str, running: List[Req]) -> None:
        lens = ", ".join(f"r{r.uid}: {r.cached_len}+{r.extend_len}" for r in running)
        print(f"  {phase:7s} batch of {len(running)}  (cached+new tokens) {lens}")

    outputs = run(engine, prompts, params, eos_ids(DEMO_MODEL), trace)
    for i, (out, sp) in enumerate(zip(outputs, params)):
        how = "greedy" if sp.is_greedy else f"T={sp.temperature} top_k={sp.top_k} top_p={sp.top_p}"
        print(f"  r{i} ({how}): {tok.decode(out)!r}")
    engine.shutdown()
    print()


def generate(name: str, prompts: List[List[int]], n: int) -> List[List[int]]:
    engine = make_engine(name)
    try:
        return run(engine, prompts, [SamplingParams(max_tokens=n)] * len(prompts), eos_ids(name))
    finally:
        engine.shutdown()


def main() -> int:
    hand_made_batch()
    return 0 if run_parity(generate).ok else 1


if __name__ == "__main__":
    sys.exit(main())
