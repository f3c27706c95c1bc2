"""Chapter 04: the model reads and writes the paged KV pool.

Retired at chapter 05, where the attention layer hands this work to an attention backend;
chapter 05's tests check the same K/V and tokens through it."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from examples.helpers import checkpoint, paging
from minisgl.core import Context, clear_global_ctx, set_global_ctx
from tests.support import load_example


@pytest.fixture()
def ch04():
    clear_global_ctx()
    set_global_ctx(Context(page_size=4))
    yield load_example("examples/ch04_kvpool.py")
    clear_global_ctx()


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_tokens_do_not_depend_on_the_page_size(ch04, page_size: int, model_path) -> None:
    step0 = load_example("examples/ch00_step0.py")
    prompts = [[5, 17, 230, 4000, 11], [8, 9], [100, 200, 300, 400, 500, 600, 700, 800, 900]]
    ours = ch04.generate("tiny-qwen3", prompts, 9, page_size=page_size)
    model = step0.Step0Model(model_path("tiny-qwen3"))
    assert ours == [model.generate(p, 9) for p in prompts]


def test_pool_holds_transformers_keys_and_values(ch04, model_path) -> None:
    """After a prefill, every layer's K/V in the pool, read through the page table, equal
    transformers' own cache (past_key_values) for the same prompt."""
    from minisgl.core import Req, SamplingParams, get_global_ctx
    from minisgl.kvcache import create_kvcache_pool

    config, model, _ = checkpoint.build("tiny-llama3")
    ctx = get_global_ctx()
    ctx.kv_cache = create_kvcache_pool(config, 8, 4, torch.float32, torch.device("cpu"))
    ctx.page_table = torch.zeros(2, 32, dtype=torch.int32)
    allocator = paging.PageAllocator(8, 4, ctx.page_table)
    allocator.free_pages = [5, 2, 7, 0, 6, 1, 3, 4]  # scattered pages
    prompt = [1, 300, 2000, 45, 7, 7, 9000, 12, 13, 14]
    req = Req(torch.tensor(prompt, dtype=torch.int32), 1, 0, 4, 0, SamplingParams(), None)  # type: ignore[arg-type]
    batch = paging.prepare_batch([req], "prefill", allocator)
    with torch.inference_mode(), ctx.forward_batch(batch):
        model.forward()
    hf = AutoModelForCausalLM.from_pretrained(model_path("tiny-llama3"), dtype=torch.float32)
    with torch.inference_mode():
        cache = hf(torch.tensor([prompt]), use_cache=True).past_key_values
    slots = ctx.page_table[1, : len(prompt)].long()
    for layer in range(config.num_layers):
        k = ctx.kv_cache.k_cache(layer).reshape(-1, config.num_kv_heads, config.head_dim)[slots]
        v = ctx.kv_cache.v_cache(layer).reshape(-1, config.num_kv_heads, config.head_dim)[slots]
        hf_k, hf_v = cache.layers[layer].keys[0], cache.layers[layer].values[0]  # [heads, len, dim]
        torch.testing.assert_close(k, hf_k.transpose(0, 1), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(v, hf_v.transpose(0, 1), atol=1e-5, rtol=1e-5)
