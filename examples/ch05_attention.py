"""Chapter 05: the attention backend.

The attention layer now hands its work to a backend picked by name from a registry. This
chapter's backend, "torch", is plain PyTorch: it pads a ragged batch into a rectangle and
masks what each query may see. A prefill batch can mix requests with and without a cached
prefix; here one request reuses the K/V another one left in the pool.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Dict, List

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from examples.helpers.checkpoint import build  # noqa: E402
from examples.helpers.paging import PageAllocator, prepare_batch  # noqa: E402
from minisgl.attention import create_attention_backend  # noqa: E402
from minisgl.core import Context, Req, SamplingParams, get_global_ctx, set_global_ctx  # noqa: E402
from minisgl.kvcache import create_kvcache_pool  # noqa: E402
from tools.parity import book_device, book_dtype, eos_ids, run_parity  # noqa: E402


def make_req(tokens: List[int], slot: int, cached_len: int = 0, output_len: int = 1) -> Req:
    return Req(
        input_ids=torch.tensor(tokens, dtype=torch.int32),
        table_idx=slot,
        cached_len=cached_len,
        output_len=output_len,
        uid=slot,
        sampling_params=SamplingParams(max_tokens=output_len),
        cache_handle=None,
    )  # type: ignore[arg-type]


def setup(
    name: str, num_pages: int, page_size: int, rows: int, max_len: int, backend: str = "torch"
):
    config, model, _ = build(name)
    ctx = get_global_ctx()
    ctx.page_size = page_size
    device = torch.device(book_device())
    ctx.kv_cache = create_kvcache_pool(config, num_pages, page_size, book_dtype(), device)
    ctx.page_table = torch.zeros(rows, max_len, dtype=torch.int32, device=device)
    ctx.attn_backend = create_attention_backend(backend, config)
    return config, model, PageAllocator(num_pages, page_size, ctx.page_table)


def show_ragged_batch() -> None:
    """A prefill batch of three requests; the second one starts from a cached prefix."""
    _, model, allocator = setup("tiny-qwen3", num_pages=16, page_size=4, rows=4, max_len=32)
    ctx = get_global_ctx()
    shared = [11, 22, 33, 44]
    first = make_req(shared + [55], slot=0)  # computes the shared prefix...
    with ctx.forward_batch(batch := prepare_batch([first], "prefill", allocator)):
        ctx.attn_backend.prepare_metadata(batch)
        model.forward()
    # ... which the second request reuses: its page-table row starts with the same slots
    ctx.page_table[1, :4] = ctx.page_table[0, :4]
    allocator.pages[1] = list(allocator.pages[0][:1])  # the page that holds the prefix
    reqs = [
        make_req([7, 8, 9, 10, 11], slot=2),
        make_req(shared + [66, 77, 88], slot=1, cached_len=4),
        make_req([5, 6], slot=3),
    ]
    batch = prepare_batch(reqs, "prefill", allocator)
    ctx.attn_backend.prepare_metadata(batch)
    meta = batch.attn_metadata
    print(
        f"prefill batch: new tokens {[r.extend_len for r in reqs]}, cached prefix "
        f"{[r.cached_len for r in reqs]}, total length {[r.device_len for r in reqs]}"
    )
    print(
        f"cu_seqlens_q = {meta.cu_seqlens_q.tolist()}   last token of each request: "
        f"{meta.get_last_indices(3).tolist()}"
    )
    print(f"positions    = {batch.positions.tolist()}")
    print(f"out_loc      = {batch.out_loc.tolist()}")
    print(f"kv slots of request 1 (page-table row): {meta.kv_slots[1].tolist()}")
    print("what request 1's queries see (x) among its keys:")
    print("        " + " ".join(f"k{j}" for j in range(reqs[1].device_len)))
    for i in range(reqs[1].extend_len):
        row = meta.mask[1, 0, i, : reqs[1].device_len]
        print(
            f"  q{reqs[1].cached_len + i:<4d} " + "  ".join("x" if s else "." for s in row.tolist())
        )
    print()


def generate(name: str, prompts: List[List[int]], n: int) -> List[List[int]]:
    """One prefill batch for every prompt, then decode batches, all through the backend."""
    max_len = max(len(p) for p in prompts) + n
    pages = len(prompts) * (max_len // 16 + 1)
    _, model, allocator = setup(name, pages, 16, len(prompts), max_len)
    ctx = get_global_ctx()
    reqs = [make_req(p, i, output_len=n) for i, p in enumerate(prompts)]
    eos, running, phase = set(eos_ids(name)), list(reqs), "prefill"
    outputs: Dict[int, List[int]] = {r.uid: [] for r in reqs}
    while running:
        batch = prepare_batch(running, phase, allocator)
        ctx.attn_backend.prepare_metadata(batch)  # once per batch, for every layer
        with torch.inference_mode(), ctx.forward_batch(batch):
            logits = model.forward()  # one row per request now: its last token
        for req, token in zip(running, logits.argmax(dim=-1).tolist()):
            req.complete_one()
            req.append_host(torch.tensor([token], dtype=torch.int32))
            outputs[req.uid].append(token)
        finished = [r for r in running if outputs[r.uid][-1] in eos or not r.can_decode]
        for req in finished:
            allocator.release(req.table_idx)
        running, phase = [r for r in running if r not in finished], "decode"
    return [outputs[r.uid] for r in reqs]


def main() -> int:
    set_global_ctx(Context(page_size=4))
    show_ragged_batch()
    return 0 if run_parity(generate).ok else 1


if __name__ == "__main__":
    sys.exit(main())
