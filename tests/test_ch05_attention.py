"""Chapter 05: the backend interface, the registry, and the "torch" backend against
transformers' attention on ragged batches."""

from __future__ import annotations

import types
from argparse import ArgumentTypeError
from typing import List

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM
from transformers.models.llama.modeling_llama import eager_attention_forward

from examples.helpers import paging
from minisgl.attention import (
    SUPPORTED_ATTENTION_BACKENDS,
    BaseAttnBackend,
    HybridBackend,
    create_attention_backend,
    validate_attn_backend,
)
from minisgl.core import Batch, Context, Req, SamplingParams, clear_global_ctx, set_global_ctx
from minisgl.kvcache.mha_pool import MHAKVCache
from tests.support import load_example


@pytest.fixture()
def ctx():
    clear_global_ctx()
    context = Context(page_size=1)
    set_global_ctx(context)
    yield context
    clear_global_ctx()


def fake_config(head_dim: int = 16, heads: int = 4, kv_heads: int = 2):
    return types.SimpleNamespace(head_dim=head_dim, num_qo_heads=heads, num_kv_heads=kv_heads)


def make_req(length: int, cached: int, slot: int) -> Req:
    return Req(
        torch.arange(length, dtype=torch.int32), slot, cached, 4, slot, SamplingParams(), None
    )  # type: ignore[arg-type]


def hf_attention(q, k, v, cached_len: int, groups: int) -> torch.Tensor:
    """transformers' eager attention for one request. q: [n, h, d]; k, v: [L, kv_h, d]."""
    n, length = q.shape[0], k.shape[0]
    allowed = torch.arange(length)[None, :] <= (cached_len + torch.arange(n))[:, None]
    mask = torch.zeros(n, length).masked_fill(~allowed, float("-inf"))[None, None]
    module = types.SimpleNamespace(num_key_value_groups=groups, training=False)
    out, _ = eager_attention_forward(
        module,
        q.transpose(0, 1)[None],
        k.transpose(0, 1)[None],
        v.transpose(0, 1)[None],
        mask,
        scaling=q.shape[-1] ** -0.5,
    )
    return out[0]  # [n, h, d]


@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("phase", ["prefill", "decode"])
@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (4, 2), (6, 1)])
def test_ragged_batch_matches_transformers(ctx, page_size, phase, heads, kv_heads) -> None:
    torch.manual_seed(page_size * 10 + heads)
    d = 16
    ctx.page_size = page_size
    per_req = -(-24 // page_size)  # pages that hold 24 tokens
    pool = MHAKVCache(
        kv_heads,
        num_layers=2,
        head_dim=d,
        num_pages=4 * per_req,
        page_size=page_size,
        dtype=torch.float32,
        device=torch.device("cpu"),
    )
    pool._kv_buffer.fill_(float("nan"))  # never-written slots may hold anything, NaN included
    ctx.kv_cache = pool
    ctx.page_table = torch.zeros(4, 64, dtype=torch.int32)
    backend = create_attention_backend("torch", fake_config(d, heads, kv_heads))
    # (total length, cached length) per request; a decode batch has one new token each
    shapes = [(9, 0), (13, 6), (3, 0)] if phase == "prefill" else [(9, 8), (21, 20), (2, 1)]
    reqs = [make_req(n, c, slot) for slot, (n, c) in enumerate(shapes)]
    # scattered pages; every request's keys at positions < cached_len are already in the pool
    perm = torch.randperm(pool.k_cache(0).shape[0])
    history = {}
    for r in reqs:
        pages = perm[r.table_idx * per_req : (r.table_idx + 1) * per_req]
        slots = (pages[:, None] * page_size + torch.arange(page_size)).flatten()[: r.device_len]
        ctx.page_table[r.table_idx, : r.device_len] = slots.int()
        k_hist, v_hist = (
            torch.randn(r.device_len, kv_heads, d),
            torch.randn(r.device_len, kv_heads, d),
        )
        pool.store_kv(
            k_hist[: r.cached_len], v_hist[: r.cached_len], slots[: r.cached_len].int(), 1
        )
        history[r.uid] = (k_hist, v_hist, slots)
    batch = Batch(reqs=reqs, phase=phase)
    batch.padded_reqs = reqs
    batch.out_loc = torch.cat([history[r.uid][2][r.cached_len :] for r in reqs]).int()
    tokens = sum(r.extend_len for r in reqs)
    q = torch.randn(tokens, heads, d)
    k = torch.cat([history[r.uid][0][r.cached_len :] for r in reqs])
    v = torch.cat([history[r.uid][1][r.cached_len :] for r in reqs])
    backend.prepare_metadata(batch)
    out = backend.forward(q, k.reshape(tokens, -1), v.reshape(tokens, -1), 1, batch)
    assert out.shape == (tokens, heads, d)
    start = 0
    for r in reqs:
        k_all, v_all, _ = history[r.uid]
        expected = hf_attention(
            q[start : start + r.extend_len], k_all, v_all, r.cached_len, heads // kv_heads
        )
        torch.testing.assert_close(
            out[start : start + r.extend_len], expected, atol=1e-5, rtol=1e-5
        )
        start += r.extend_len
    assert (
        batch.attn_metadata.get_last_indices(3).tolist()
        == torch.tensor([r.extend_len for r in reqs]).cumsum(0).sub(1).tolist()
    )


def test_registry_and_specs(ctx) -> None:
    ctx.kv_cache = MHAKVCache(2, 1, 16, 4, 1, torch.float32, torch.device("cpu"))
    assert "torch" in SUPPORTED_ATTENTION_BACKENDS.supported_names()
    assert isinstance(create_attention_backend("torch", fake_config()), BaseAttnBackend)
    assert not isinstance(create_attention_backend("torch,torch", fake_config()), HybridBackend)
    assert validate_attn_backend("auto") == "auto"
    with pytest.raises(ArgumentTypeError, match="unsupported Attention Backend: 'nope'"):
        validate_attn_backend("torch,nope")
    with pytest.raises(AssertionError):
        create_attention_backend("auto", fake_config())


def test_hybrid_backend_routes_by_phase() -> None:
    calls: List[str] = []

    class Recorder(BaseAttnBackend):
        def __init__(self, name: str) -> None:
            self.name = name

        def forward(self, q, k, v, layer_id, batch):
            calls.append(f"{self.name}.forward")
            return q

        def prepare_metadata(self, batch) -> None:
            calls.append(f"{self.name}.prepare")

        # the CUDA-graph hooks of chapter 18's interface (tests/test_ch18_cuda_graph.py)
        def init_capture_graph(self, max_seq_len, bs_list) -> None:
            calls.append(f"{self.name}.init_capture_graph")

        def prepare_for_capture(self, batch) -> None:
            calls.append(f"{self.name}.prepare_for_capture")

        def prepare_for_replay(self, batch) -> None:
            calls.append(f"{self.name}.prepare_for_replay")

    hybrid = HybridBackend(Recorder("p"), Recorder("d"))
    for phase in ("prefill", "decode"):
        batch = Batch(reqs=[], phase=phase)
        hybrid.prepare_metadata(batch)
        hybrid.forward(torch.zeros(1), torch.zeros(1), torch.zeros(1), 0, batch)
    assert calls == ["p.prepare", "p.forward", "d.prepare", "d.forward"]


@pytest.mark.parametrize(
    "name", ["tiny-qwen3", "tiny-qwen2", "tiny-llama3", "tiny-mistral", "smollm2-135m"]
)  # model_path skips a model left out
def test_prefill_and_decode_logits_match_transformers(name: str, ctx, model_path) -> None:
    """Through the backend: the prefill's last-token logits and three decode steps' logits
    equal transformers' for the same sequence."""
    hf = AutoModelForCausalLM.from_pretrained(model_path(name), dtype=torch.float32)
    ch05 = load_example("examples/ch05_attention.py")
    _, model, allocator = ch05.setup(name, num_pages=8, page_size=16, rows=1, max_len=64)
    g = torch.Generator().manual_seed(5)
    tokens = torch.randint(3, 49152, (20,), generator=g).tolist()
    req = ch05.make_req(tokens[:17], slot=0, output_len=8)
    phase = "prefill"
    for step in range(4):
        batch = paging.prepare_batch([req], phase, allocator)
        ctx.attn_backend.prepare_metadata(batch)
        with torch.inference_mode(), ctx.forward_batch(batch):
            ours = model.forward()[0]
        with torch.inference_mode():
            theirs = hf(torch.tensor([req.input_ids.tolist()])).logits[0, -1]
        torch.testing.assert_close(ours, theirs, atol=3e-4, rtol=1e-4)
        req.complete_one()
        req.append_host(torch.tensor([tokens[17 + step] if step < 3 else 0], dtype=torch.int32))
        phase = "decode"


def test_backend_generation_matches_step0(ctx, model_path) -> None:
    ch05, step0 = load_example("examples/ch05_attention.py"), load_example("examples/ch00_step0.py")
    prompts = [[9, 120, 3001], [77, 15, 16, 17, 18, 19, 20, 21, 22, 23], [5]]
    ours = ch05.generate("tiny-mistral", prompts, 12)
    model = step0.Step0Model(model_path("tiny-mistral"))
    assert ours == [model.generate(p, 12) for p in prompts]


@settings(max_examples=40, deadline=None)
@given(
    bs=st.integers(1, 4),
    kv_heads=st.integers(1, 3),
    group=st.integers(1, 4),
    q_len=st.integers(1, 9),
    extra_k=st.integers(0, 40),
    head_dim=st.sampled_from([8, 16, 64]),
    seed=st.integers(0, 2**16),
)
def test_on_the_cpu_sdpas_grouped_heads_equal_repeated_heads_bit_for_bit(
    bs: int, kv_heads: int, group: int, q_len: int, extra_k: int, head_dim: int, seed: int
) -> None:
    """The torch backend lets SDPA pair query head h with key/value head h // group on the
    CPU (enable_gqa) instead of copying each key/value head `group` times: the tokens stay
    transformers' only if the numbers are exactly the same."""
    g = torch.Generator().manual_seed(seed)
    k_len = q_len + extra_k
    q = torch.randn(bs, kv_heads * group, q_len, head_dim, generator=g)
    k, v = (torch.randn(bs, kv_heads, k_len, head_dim, generator=g) for _ in range(2))
    mask = torch.rand(bs, 1, q_len, k_len, generator=g) > 0.4
    mask[..., 0] = True  # every query sees a key
    repeated = F.scaled_dot_product_attention(
        q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), attn_mask=mask, scale=0.3
    )
    grouped = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3, enable_gqa=True)
    assert torch.equal(grouped, repeated)
