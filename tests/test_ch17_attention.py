"""Chapter 17: the FlashInfer and FlashAttention backends, through their stand-ins on the CPU.
Each backend against the torch backend on ragged batches, when FlashInfer plans, what the
stand-ins refuse, the page-table conventions, and generation against transformers with a
cached prefix and chunked prefill."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from examples.helpers.gpu_libraries import check_kernel_dtype, use_standins

use_standins(always=True)  # the tests run on the CPU, where the real ones have no kernels

from minisgl.attention import create_attention_backend  # noqa: E402
from minisgl.core import Batch, Context, Req, SamplingParams, clear_global_ctx, set_global_ctx  # noqa: E402
from minisgl.kvcache.mha_pool import MHAKVCache  # noqa: E402

D = 16


@pytest.fixture()
def ctx():
    clear_global_ctx()
    context = Context(page_size=1)
    set_global_ctx(context)
    yield context
    clear_global_ctx()


def config(heads: int, kv_heads: int):
    return types.SimpleNamespace(head_dim=D, num_qo_heads=heads, num_kv_heads=kv_heads)


def ragged_batch(ctx, phase: str, page_size: int, heads: int, kv_heads: int, seed: int):
    """Three requests on scattered pages, their earlier keys already in the pool: the batch,
    and the new tokens' q, k, v."""
    torch.manual_seed(seed)
    ctx.page_size = page_size
    per_req = -(-24 // page_size)
    pool = MHAKVCache(kv_heads, 2, D, 4 * per_req, page_size, torch.float32, torch.device("cpu"))
    pool._kv_buffer.fill_(float("nan"))  # never-written slots may hold anything
    ctx.kv_cache = pool
    ctx.page_table = torch.zeros(4, 64, dtype=torch.int32)
    shapes = [(9, 0), (13, 6), (3, 0)] if phase == "prefill" else [(9, 8), (21, 20), (2, 1)]
    reqs = [
        Req(torch.arange(n, dtype=torch.int32), slot, c, 4, slot, SamplingParams(), None)  # type: ignore[arg-type]
        for slot, (n, c) in enumerate(shapes)
    ]
    perm = torch.randperm(pool.k_cache(0).shape[0])
    new_slots, ks, vs = [], [], []
    for r in reqs:
        pages = perm[r.table_idx * per_req : (r.table_idx + 1) * per_req]
        slots = (pages[:, None] * page_size + torch.arange(page_size)).flatten()[: r.device_len]
        ctx.page_table[r.table_idx, : r.device_len] = slots.int()
        k, v = torch.randn(r.device_len, kv_heads, D), torch.randn(r.device_len, kv_heads, D)
        pool.store_kv(k[: r.cached_len], v[: r.cached_len], slots[: r.cached_len].int(), 1)
        new_slots.append(slots[r.cached_len :])
        ks.append(k[r.cached_len :])
        vs.append(v[r.cached_len :])
    batch = Batch(reqs=reqs, phase=phase)  # type: ignore[arg-type]
    batch.padded_reqs = reqs
    batch.out_loc = torch.cat(new_slots).int()
    tokens = sum(r.extend_len for r in reqs)
    return batch, torch.randn(tokens, heads, D), torch.cat(ks), torch.cat(vs)


def attend(ctx, backend_name: str, heads: int, kv_heads: int, batch, q, k, v) -> torch.Tensor:
    backend = create_attention_backend(backend_name, config(heads, kv_heads))
    ctx.attn_backend = backend
    backend.prepare_metadata(batch)
    tokens = q.shape[0]
    return backend.forward(q, k.reshape(tokens, -1), v.reshape(tokens, -1), 1, batch)


@pytest.mark.parametrize("backend", ["fi", "fa"])
@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("phase", ["prefill", "decode"])
@pytest.mark.parametrize("heads, kv_heads", [(4, 2), (8, 1)])
def test_each_backend_equals_the_torch_backend(ctx, backend, page_size, phase, heads, kv_heads):
    batch, q, k, v = ragged_batch(ctx, phase, page_size, heads, kv_heads, seed=page_size + heads)
    ours = attend(ctx, backend, heads, kv_heads, batch, q, k, v)
    expected = attend(ctx, "torch", heads, kv_heads, batch, q, k, v)
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)
    last = torch.tensor([r.extend_len for r in batch.reqs]).cumsum(0) - 1
    assert batch.attn_metadata.get_last_indices(3).tolist() == last.tolist()


def test_flashinfer_plans_once_per_batch_at_the_first_layer(ctx) -> None:
    batch, q, k, v = ragged_batch(ctx, "prefill", 4, 4, 2, seed=1)
    backend = create_attention_backend("fi", config(4, 2))
    plans = []
    wrapper = backend.prefill_wrapper
    real_plan = wrapper.plan
    wrapper.plan = lambda **kw: (plans.append(kw), real_plan(**kw))[1]
    backend.prepare_metadata(batch)
    assert plans == []  # not yet: the previous batch may still be running (overlap)
    for layer in (0, 1):
        backend.forward(q, k.reshape(len(q), -1), v.reshape(len(q), -1), layer, batch)
    assert len(plans) == 1 and batch.attn_metadata.initialized
    assert plans[0]["qo_indptr"].tolist() == [0, 9, 16, 19]  # 9, 13 - 6 and 3 new tokens
    assert plans[0]["paged_kv_indptr"].tolist() == [0, 9, 22, 25]  # one page per key


def test_decode_uses_tensor_cores_from_four_query_heads_per_kv_head(ctx) -> None:
    ctx.kv_cache = MHAKVCache(2, 1, D, 4, 1, torch.float32, torch.device("cpu"))
    grouped = {h: create_attention_backend("fi", config(h, 2)).use_tensor_cores for h in (2, 4, 8)}
    assert grouped == {2: False, 4: False, 8: True}
    assert create_attention_backend("fi", config(8, 2)).decode_wrappers.use_tensor_cores


def test_flashattention_gets_page_numbers(ctx) -> None:
    batch, *_ = ragged_batch(ctx, "decode", 4, 4, 2, seed=3)
    backend = create_attention_backend("fa", config(4, 2))
    backend.prepare_metadata(batch)
    meta = batch.attn_metadata
    assert meta.page_table.shape == (3, 6)  # the longest request: 21 keys in 6 pages of 4
    for i, r in enumerate(batch.reqs):
        slots = ctx.page_table[r.table_idx, : r.device_len]
        pages = meta.page_table[i, : -(-r.device_len // 4)]
        assert (pages == slots[::4] // 4).all() and (
            slots % 4 == torch.arange(r.device_len) % 4
        ).all()
    assert meta.cache_seqlens.tolist() == [9, 21, 2] and meta.cu_seqlens_q.tolist() == [0, 1, 2, 3]


# ------------------------------------------------------------------- the stand-ins' checks
def stand_in():
    import flashinfer

    assert flashinfer.__version__.endswith("book-standin")
    workspace = torch.empty(64, dtype=torch.uint8)
    plan = dict(
        qo_indptr=torch.tensor([0, 3, 5], dtype=torch.int32),
        paged_kv_indptr=torch.tensor([0, 3, 7], dtype=torch.int32),
        paged_kv_indices=torch.tensor([0, 1, 2, 8, 9, 10, 11], dtype=torch.int32),
        paged_kv_last_page_len=torch.ones(2, dtype=torch.int32),
        num_qo_heads=4, num_kv_heads=2, head_dim_qk=8, page_size=1, causal=True,
        q_data_type=torch.float32,
    )  # fmt: skip
    return flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD"), plan


def test_the_flashinfer_standin_refuses_what_an_engine_gets_wrong() -> None:
    cache = (torch.randn(16, 1, 2, 8), torch.randn(16, 1, 2, 8))
    q = torch.randn(5, 4, 8)
    wrapper, plan = stand_in()
    with pytest.raises(RuntimeError, match="before plan"):
        wrapper.run(q, cache)
    bad_plans = {
        "dtype torch.int32": dict(paged_kv_indices=plan["paged_kv_indices"].long()),
        "should be the same": dict(qo_indptr=torch.tensor([0, 5], dtype=torch.int32)),
        "indices": dict(paged_kv_indices=plan["paged_kv_indices"][:-1]),
        "queries but only": dict(qo_indptr=torch.tensor([0, 4, 5], dtype=torch.int32)),
        "share": dict(num_kv_heads=3),
        "seq_lens disagrees": dict(seq_lens=torch.tensor([3, 3], dtype=torch.int32)),
    }
    for message, change in bad_plans.items():
        with pytest.raises(ValueError, match=message):
            stand_in()[0].plan(**{**plan, **change})
    wrapper.plan(**plan)
    with pytest.raises(ValueError, match="the plan says"):
        wrapper.run(q[:4], cache)  # the real kernel would read past the query's end
    with pytest.raises(ValueError, match="does not match the q_data_type"):
        wrapper.run(q.double(), cache)
    with pytest.raises(ValueError, match="the plan says"):
        wrapper.run(q, (cache[0][:, :, :1], cache[1][:, :, :1]))  # one kv head, two planned
    assert wrapper.run(q, cache).shape == (5, 4, 8)


def test_a_plan_keeps_its_own_copy_of_what_it_was_given() -> None:
    cache = (torch.randn(16, 1, 2, 8), torch.randn(16, 1, 2, 8))
    q = torch.randn(5, 4, 8)
    wrapper, plan = stand_in()
    indices = plan["paged_kv_indices"].clone()
    wrapper.plan(**{**plan, "paged_kv_indices": indices})
    before = wrapper.run(q, cache)
    indices.fill_(15)  # an engine reusing its buffer after planning
    torch.testing.assert_close(wrapper.run(q, cache), before)


def test_the_libraries_have_no_float32_kernels_on_a_gpu() -> None:
    with pytest.raises(ValueError, match="no kernels"):
        check_kernel_dtype(torch.float32, torch.device("cuda"), "FlashInfer")
    check_kernel_dtype(torch.bfloat16, torch.device("cuda"), "FlashInfer")
    check_kernel_dtype(torch.float32, torch.device("cpu"), "FlashInfer")  # the stand-in's widening


def test_the_flashattention_standin_checks_its_tables() -> None:
    from sgl_kernel.flash_attn import flash_attn_with_kvcache

    k_cache = v_cache = torch.randn(8, 4, 2, 8)  # 8 pages of 4
    args = dict(
        q=torch.randn(3, 4, 8), k_cache=k_cache, v_cache=v_cache,
        page_table=torch.tensor([[2, 5], [7, 0]], dtype=torch.int32),
        cache_seqlens=torch.tensor([6, 3], dtype=torch.int32),
        cu_seqlens_q=torch.tensor([0, 2, 3], dtype=torch.int32), max_seqlen_q=2, causal=True,
    )  # fmt: skip
    assert flash_attn_with_kvcache(**args).shape == (3, 4, 8)
    for message, change in {
        "int32": dict(page_table=args["page_table"].long()),
        "more keys than its row": dict(cache_seqlens=torch.tensor([9, 3], dtype=torch.int32)),
        "max_seqlen_q": dict(max_seqlen_q=1),
        "rows": dict(q=torch.randn(4, 4, 8)),
    }.items():
        with pytest.raises(ValueError, match=message):
            flash_attn_with_kvcache(**{**args, **change})


# ------------------------------------------------------------------- through the engine
def test_generation_with_cached_prefixes_and_chunks_matches_transformers(model_path) -> None:
    """Prompts sharing a prefix (the radix cache hands the second its keys: a prefill after a
    cached prefix) and a prefill budget of 16 tokens (later chunks), for each backend."""
    from minisgl.llm import LLM
    from tools.parity import hf_references

    name = "tiny-qwen3"
    base = [9, 120, 3001, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60]
    prompts = [base + [61, 62], base + [70], base[:5]]
    refs = [r.tokens for r in hf_references(name, prompts, 10, "cpu", torch.float32)]
    for backend in ("fi", "fa", "fa,fi"):
        with LLM(
            str(model_path(name)), dtype=torch.float32, attention_backend=backend, page_size=4,
            num_page_override=64, max_running_req=4, max_extend_tokens=16,
        ) as llm:  # fmt: skip
            params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
            first = llm.generate(prompts[:1], params)[0]["token_ids"]
            rest = [o["token_ids"] for o in llm.generate(prompts[1:], params)]
        assert [first, *rest] == refs, backend


def test_without_the_library_the_backend_says_what_to_install(ctx, monkeypatch) -> None:
    ctx.kv_cache = MHAKVCache(2, 1, D, 4, 1, torch.float32, torch.device("cpu"))
    monkeypatch.setitem(sys.modules, "flashinfer", None)  # as if it were not installed
    with pytest.raises(ImportError, match="pip install flashinfer-python"):
        create_attention_backend("fi", config(4, 2))
