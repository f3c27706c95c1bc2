"""Chapter 04: the KV pool and the page table.

One pool holds the keys and values of every request, in fixed-size pages. A request owns a
list of pages; the page table maps (request slot, position) to the flat token slot where that
position's K/V live. The model now decodes with a real KV cache: a prefill writes the prompt's
K/V into the pool, and each decode step writes one token's and reads all of them back.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Dict, List

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from examples.helpers.checkpoint import build  # noqa: E402
from examples.helpers.paging import PageAllocator, prepare_batch  # noqa: E402
from minisgl.core import Context, Req, SamplingParams, get_global_ctx, set_global_ctx  # noqa: E402
from minisgl.kvcache import create_kvcache_pool  # noqa: E402
from minisgl.models import ModelConfig  # noqa: E402
from minisgl.utils import cached_load_hf_config  # noqa: E402
from tools.models import DEMO_MODEL, ensure_model  # noqa: E402
from tools.parity import book_device, book_dtype, eos_ids, run_parity  # noqa: E402


def show_layout() -> None:
    config = ModelConfig.from_hf(cached_load_hf_config(str(ensure_model(DEMO_MODEL))))
    per_token = 2 * config.num_layers * config.num_kv_heads * config.head_dim * 4
    print(
        f"SmolLM2-135M: 2 (K, V) x {config.num_layers} layers x {config.num_kv_heads} kv heads x "
        f"{config.head_dim} dims x 4 bytes = {per_token} bytes ({per_token / 1024:.1f} KiB) per "
        "token"
    )
    lengths = [5, 9, 3]
    for page_size in (1, 4, 16):
        table = torch.zeros(3, 16, dtype=torch.int32)
        allocator = PageAllocator(num_pages=64 // page_size, page_size=page_size, page_table=table)
        for slot, length in enumerate(lengths):
            allocator.slots_for(slot, 0, length)
        used = sum(len(p) for p in allocator.pages.values())
        waste = used * page_size - sum(lengths)
        print(
            f"\npage_size={page_size:<2d}: requests of {lengths} tokens take {used} pages "
            f"({used * page_size} slots, {waste} unused)"
        )
        for slot, length in enumerate(lengths):
            print(
                f"  request {slot}: pages {allocator.pages[slot]}, page table row "
                f"{table[slot, :length].tolist()}"
            )
    print()


def generate(name: str, prompts: List[List[int]], n: int, page_size: int = 4) -> List[List[int]]:
    """Greedy decoding with a paged KV cache: one prefill of every prompt, then decode steps."""
    config, model, _ = build(name)
    ctx = get_global_ctx()
    max_len = max(len(p) for p in prompts) + n
    num_pages = len(prompts) * (max_len // page_size + 1)
    device = torch.device(book_device())
    ctx.kv_cache = create_kvcache_pool(config, num_pages, page_size, book_dtype(), device)
    ctx.page_table = torch.zeros(len(prompts), max_len, dtype=torch.int32, device=device)
    allocator = PageAllocator(num_pages, page_size, ctx.page_table)
    reqs = [
        Req(
            input_ids=torch.tensor(p, dtype=torch.int32),
            table_idx=i,
            cached_len=0,
            output_len=n,
            uid=i,
            sampling_params=SamplingParams(max_tokens=n),
            cache_handle=None,
        )
        for i, p in enumerate(prompts)
    ]  # type: ignore[arg-type]
    eos, running, phase = set(eos_ids(name)), list(reqs), "prefill"
    outputs: Dict[int, List[int]] = {r.uid: [] for r in reqs}
    while running:
        batch = prepare_batch(running, phase, allocator)
        with torch.inference_mode(), ctx.forward_batch(batch):
            logits = model.forward()
        last = torch.cumsum(torch.tensor([r.extend_len for r in running]), 0).to(logits.device) - 1
        for req, token in zip(running, logits[last].argmax(dim=-1).tolist()):
            req.complete_one()
            req.append_host(torch.tensor([token], dtype=torch.int32))
            outputs[req.uid].append(token)
        finished = [r for r in running if outputs[r.uid][-1] in eos or not r.can_decode]
        for req in finished:
            allocator.release(req.table_idx)
        running, phase = [r for r in running if r not in finished], "decode"
    assert len(allocator.free_pages) == num_pages, "every page is back"
    return [outputs[r.uid] for r in reqs]


def main() -> int:
    set_global_ctx(Context(page_size=4))
    show_layout()
    return 0 if run_parity(generate).ok else 1


if __name__ == "__main__":
    sys.exit(main())
