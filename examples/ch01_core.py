"""Chapter 01: requests, batches and the context around a forward pass.

Step 0's model, driven the way the engine will drive it: a `Req` says which of its tokens the
next forward pass computes (cached_len .. device_len), `complete_one` advances it, and the
loop stops when `can_decode` says the request has produced all it may.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from minisgl.core import Batch, Context, Req, SamplingParams, get_global_ctx, set_global_ctx  # noqa: E402
from tools.models import DEMO_MODEL, ensure_model  # noqa: E402
from tools.parity import eos_ids, load_example, load_tokenizer, run_parity  # noqa: E402

step0 = load_example("examples/ch00_step0.py")


def new_cache(model, length: int) -> None:
    shape = (length, model.num_kv_heads, model.head_dim)
    model.k_cache = [torch.zeros(shape) for _ in range(model.num_layers)]
    model.v_cache = [torch.zeros(shape) for _ in range(model.num_layers)]


def run_request(model, req: Req, eos: List[int], trace: bool = False, tok=None) -> List[int]:
    """Run one request to its end; each step computes exactly its extend part."""
    new_cache(model, req.max_device_len)
    outputs: List[int] = []
    ctx = get_global_ctx()
    while True:
        batch = Batch(reqs=[req], phase="prefill" if not outputs else "decode")
        start, end = req.cached_len, req.device_len
        before = (req.cached_len, req.device_len, req.extend_len, req.remain_len)
        with ctx.forward_batch(batch):  # layers will read the batch from the context
            logits = model.forward(req.input_ids[start:end], start)
        req.complete_one()
        token = int(logits.argmax())
        req.append_host(torch.tensor([token], dtype=req.input_ids.dtype))
        outputs.append(token)
        if trace:
            span = f"{start}..{end - 1}" if end - start > 1 else f"{start}"
            print(
                f"{len(outputs) - 1:4d}  {batch.phase:7s} {before[0]:6d} {before[1]:6d} "
                f"{before[2]:6d} {before[3]:6d}  {span:9s} {tok.decode([token])!r}"
            )
        if token in eos or not req.can_decode:
            return outputs


def walk_one_request() -> None:
    """Print a request's lengths at every step, for SmolLM2 and a short prompt."""
    model, tok = step0.Step0Model(ensure_model(DEMO_MODEL)), load_tokenizer(DEMO_MODEL)
    prompt = tok("The capital of France is").input_ids
    params = SamplingParams(max_tokens=6)
    req = Req(
        input_ids=torch.tensor(prompt, dtype=torch.int32),
        table_idx=0,
        cached_len=0,
        output_len=params.max_tokens,
        uid=0,
        sampling_params=params,
        cache_handle=None,
    )
    print(
        f"prompt: {len(prompt)} tokens, max_tokens={params.max_tokens}, greedy={params.is_greedy}"
    )
    print("step  phase   cached device extend remain  computes  sampled")
    run_request(model, req, eos_ids(DEMO_MODEL), trace=True, tok=tok)
    print(f"done:  {req}")
    print(f"text:  {tok.decode(req.input_ids.tolist())!r}\n")


def generate(name: str, prompts: List[List[int]], n: int) -> List[List[int]]:
    model, eos = step0.Step0Model(ensure_model(name)), eos_ids(name)
    outputs = []
    for uid, prompt in enumerate(prompts):
        params = SamplingParams(max_tokens=n)
        req = Req(
            input_ids=torch.tensor(prompt, dtype=torch.int32),
            table_idx=0,
            cached_len=0,
            output_len=n,
            uid=uid,
            sampling_params=params,
            cache_handle=None,
        )
        outputs.append(run_request(model, req, eos))
    return outputs


def main() -> int:
    set_global_ctx(Context(page_size=1))
    walk_one_request()
    summary = run_parity(generate, device="cpu", dtype=torch.float32)
    return 0 if summary.ok else 1


if __name__ == "__main__":
    sys.exit(main())
