"""Chapter 02: every op against the transformers module it replaces, and the op protocol."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import (
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

from minisgl.layers import (
    BaseOP,
    LinearColParallelMerged,
    LinearOProj,
    LinearQKVMerged,
    LinearReplicated,
    LinearRowParallel,
    OPList,
    ParallelLMHead,
    RMSNorm,
    RMSNormFused,
    StateLessOP,
    VocabParallelEmbedding,
    gelu_and_mul,
    get_rope,
    set_rope_device,
    silu_and_mul,
)

LLAMA3 = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}


@pytest.mark.parametrize("size", [1, 3, 64, 577])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_matches_transformers(size: int, dtype: torch.dtype) -> None:
    torch.manual_seed(size)
    x = (torch.randn(9, size) * 4).to(dtype)
    hf = LlamaRMSNorm(size, eps=1e-5).to(dtype)
    with torch.no_grad():
        hf.weight.normal_()
        expected = hf(x)
    ours = RMSNorm(size, 1e-5)
    ours.weight = hf.weight.detach()
    torch.testing.assert_close(ours.forward(x), expected, atol=0, rtol=0)


def test_fused_add_rms_norm_keeps_the_residual_stream() -> None:
    torch.manual_seed(0)
    x, residual = torch.randn(5, 33), torch.randn(5, 33)
    op = RMSNormFused(33, 1e-6)
    op.weight = torch.randn(33)
    hf = LlamaRMSNorm(33, eps=1e-6)
    hf.weight.data = op.weight.clone()
    normed, stream = op.forward(x)  # the first layer starts the stream
    assert stream is x
    torch.testing.assert_close(normed, hf(x).detach(), atol=0, rtol=0)
    normed, stream = op.forward(x, residual)
    torch.testing.assert_close(stream, x + residual, atol=0, rtol=0)
    torch.testing.assert_close(normed, hf(x + residual).detach(), atol=0, rtol=0)


def test_per_head_norm_in_place_matches_qwen3() -> None:
    torch.manual_seed(1)
    qkv = torch.randn(6, 3 * 4 * 128)
    q = qkv[:, : 4 * 128]  # a view, as AttentionLayer will have it
    hf = Qwen3RMSNorm(128, eps=1e-6)
    hf.weight.data.normal_()
    expected = hf(q.reshape(6, 4, 128)).detach()
    op = RMSNorm(128, 1e-6)
    op.weight = hf.weight.detach()
    op.forward_inplace(q.view(6, 4, 128))
    torch.testing.assert_close(qkv[:, : 4 * 128].view(6, 4, 128), expected, atol=0, rtol=0)


@pytest.mark.parametrize("width", [1, 13, 1536])
def test_gated_activations(width: int) -> None:
    x = torch.randn(4, 2 * width)
    torch.testing.assert_close(silu_and_mul(x), F.silu(x[:, :width]) * x[:, width:])
    torch.testing.assert_close(gelu_and_mul(x), F.gelu(x[:, :width]) * x[:, width:])
    out = torch.empty(4, width)
    assert silu_and_mul(x, out=out) is out


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_type": "default", "rope_theta": 1e6},
        LLAMA3,
        {"rope_type": "linear", "rope_theta": 1e4, "factor": 4.0},
    ],
    ids=["default", "llama3", "linear"],
)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_rope_matches_transformers(rope: dict, head_dim: int) -> None:
    config = LlamaConfig(
        hidden_size=3 * head_dim,
        num_attention_heads=3,
        num_key_value_heads=1,
        head_dim=head_dim,
        rope_parameters=rope,
        max_position_embeddings=4096,
    )
    positions = torch.tensor([0, 1, 2, 31, 63, 64, 65, 1000, 4095])
    n = len(positions)
    q, k = torch.randn(1, 3, n, head_dim), torch.randn(1, 1, n, head_dim)
    cos, sin = LlamaRotaryEmbedding(config)(q, positions[None])
    q_hf, k_hf = apply_rotary_pos_emb(q, k, cos, sin)
    scaling = (
        None
        if rope["rope_type"] == "default"
        else tuple((a, b) for a, b in rope.items() if a != "rope_theta")
    )
    op = get_rope(head_dim, head_dim, 4096, rope["rope_theta"], scaling)
    # a q and a k that are views into one qkv tensor, as in AttentionLayer
    qkv = torch.cat(
        [q[0].transpose(0, 1).reshape(n, -1), k[0].transpose(0, 1).reshape(n, -1)], dim=-1
    )
    q_view, k_view = qkv.split([3 * head_dim, head_dim], dim=-1)
    op.forward(positions.to(torch.int32), q_view, k_view)
    torch.testing.assert_close(
        qkv[:, : 3 * head_dim].view(n, 3, head_dim), q_hf[0].transpose(0, 1), atol=0, rtol=0
    )
    torch.testing.assert_close(
        qkv[:, 3 * head_dim :].view(n, 1, head_dim), k_hf[0].transpose(0, 1), atol=0, rtol=0
    )


def test_llama3_scaling_changes_only_the_slow_frequencies() -> None:
    plain = get_rope(128, 128, 4096, 500000.0, None)
    scaled = get_rope(
        128, 128, 4096, 500000.0, tuple((k, v) for k, v in LLAMA3.items() if k != "rope_theta")
    )
    # row = [cos | sin] of 64 frequencies; wavelengths under 64 / 4 = 16 tokens are kept: the
    # first five frequencies of 500000^(-2i/128)
    cos_plain, cos_scaled = plain._cos_sin_cache[100, :64], scaled._cos_sin_cache[100, :64]
    assert torch.equal(cos_plain[:5], cos_scaled[:5])
    assert (cos_plain[5:] - cos_scaled[5:]).abs().max() > 0.01


def test_get_rope_is_shared_and_refuses_meta_without_a_device() -> None:
    a = get_rope(64, 64, 128, 10000.0, None)
    assert get_rope(64, 64, 128, 10000.0, None) is a
    with pytest.raises(ValueError, match="unsupported RoPE scaling"):
        get_rope(64, 64, 128, 10000.0, (("rope_type", "yarn"), ("factor", 2.0)))
    set_rope_device(None)  # type: ignore[arg-type]
    with torch.device("meta"):
        with pytest.raises(RuntimeError, match="set_rope_device"):
            get_rope(64, 64, 129, 10000.0, None)
        set_rope_device(torch.device("cpu"))
        rope = get_rope(64, 64, 130, 10000.0, None)
    assert rope._cos_sin_cache.device.type == "cpu"


def test_merged_linears_equal_separate_projections() -> None:
    torch.manual_seed(2)
    hidden, head_dim, heads, kv_heads = 48, 16, 4, 2
    q_proj = torch.nn.Linear(hidden, heads * head_dim, bias=True)
    k_proj = torch.nn.Linear(hidden, kv_heads * head_dim, bias=True)
    v_proj = torch.nn.Linear(hidden, kv_heads * head_dim, bias=True)
    qkv = LinearQKVMerged(hidden, head_dim, heads, kv_heads, has_bias=True)
    qkv.load_state_dict(
        {
            "weight": torch.cat([q_proj.weight, k_proj.weight, v_proj.weight]).detach(),
            "bias": torch.cat([q_proj.bias, k_proj.bias, v_proj.bias]).detach(),
        }
    )
    x = torch.randn(5, hidden)
    q, k, v = qkv.forward(x).split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], -1)
    with torch.no_grad():
        torch.testing.assert_close(q, q_proj(x))
        torch.testing.assert_close(k, k_proj(x))
        torch.testing.assert_close(v, v_proj(x))
    gate_up = LinearColParallelMerged(hidden, [30, 30], has_bias=False)
    assert gate_up.weight.shape == (60, hidden)
    for cls in (LinearOProj, LinearRowParallel, LinearReplicated):
        op = cls(hidden, 7, has_bias=False)
        assert op.weight.shape == (7, hidden) and op.bias is None


class _Block(BaseOP):
    def __init__(self) -> None:
        self.norm = RMSNorm(4, 1e-6)
        self.proj = LinearReplicated(4, 2, has_bias=True)
        self._scratch = torch.zeros(3)  # private: not a weight
        self.rope = get_rope(64, 64, 16, 10000.0, None)  # state-less


def test_state_dict_walks_attributes_and_lists() -> None:
    model = OPList([_Block(), _Block()])
    assert sorted(model.state_dict()) == [
        "0.norm.weight",
        "0.proj.bias",
        "0.proj.weight",
        "1.norm.weight",
        "1.proj.bias",
        "1.proj.weight",
    ]
    assert isinstance(model.op_list[0].rope, StateLessOP)


def test_loading_is_strict() -> None:
    model = OPList([_Block()])
    good = {k: torch.randn_like(v) for k, v in model.state_dict().items()}
    model.load_state_dict(dict(good))
    assert model.op_list[0].proj.weight is good["0.proj.weight"]
    with pytest.raises(KeyError, match="missing weight '0.norm.weight'"):
        OPList([_Block()]).load_state_dict({k: v for k, v in good.items() if "norm" not in k})
    with pytest.raises(RuntimeError, match="unexpected weights: \\['0.extra'\\]"):
        OPList([_Block()]).load_state_dict({**good, "0.extra": torch.zeros(1)})
    with pytest.raises(ValueError, match="expected \\(4,\\)"):
        OPList([_Block()]).load_state_dict({**good, "0.norm.weight": torch.zeros(5)})
    with pytest.raises(ValueError, match="torch.float64"):
        OPList([_Block()]).load_state_dict(
            {**good, "0.norm.weight": torch.zeros(4, dtype=torch.float64)}
        )


def test_tied_and_untied_lm_heads() -> None:
    torch.manual_seed(3)
    embed = VocabParallelEmbedding(50, 8)
    embed.weight = torch.randn(50, 8)
    ids = torch.tensor([3, 0, 49])
    torch.testing.assert_close(embed.forward(ids), embed.weight[ids])
    tied = ParallelLMHead(50, 8, tie_word_embeddings=True, tied_embedding=embed)
    assert tied.state_dict(prefix="lm_head") == {}
    leftovers = {"lm_head.weight": torch.zeros(50, 8)}
    tied.load_state_dict(leftovers, prefix="lm_head", _internal=True)
    assert leftovers == {}  # a redundant copy in the checkpoint is dropped
    x = torch.randn(2, 8)
    torch.testing.assert_close(tied.forward(x), x @ embed.weight.T)
    untied = ParallelLMHead(50, 8, bias=True)
    assert sorted(untied.state_dict(prefix="lm_head")) == ["lm_head.bias", "lm_head.weight"]
    with pytest.raises(AssertionError):
        ParallelLMHead(50, 8, tie_word_embeddings=True)


@pytest.mark.parametrize("swapped", [False, True])
def test_the_heads_product_either_way_round_gives_f_linears_logits(monkeypatch, swapped) -> None:
    """Whichever way `_swapped_wins` chose on this CPU, both ways give `F.linear`'s logits up to
    float32 rounding, for a decode step's rows (one row included) and past them."""
    from minisgl.layers import embedding

    torch.manual_seed(4)
    weight, bias = torch.randn(300, 16), torch.randn(300)
    monkeypatch.setitem(embedding._SWAPPED_WINS, (tuple(weight.shape), weight.dtype), swapped)
    calls = []
    monkeypatch.setattr(embedding.torch, "mm", lambda *a: calls.append(1) or torch.matmul(*a))
    for rows in (1, 2, 3, embedding.SWAP_ROWS, embedding.SWAP_ROWS + 1):
        x = torch.randn(rows, 16)
        for b in (None, bias):
            got = embedding.lm_head_logits(x, weight, b)
            assert got.shape == (rows, 300) and got.is_contiguous()
            torch.testing.assert_close(got, F.linear(x, weight, b), rtol=1e-5, atol=1e-5)
    assert len(calls) == (2 * 4 if swapped else 0)  # swapped only up to SWAP_ROWS rows


def test_the_head_times_both_ways_once_per_matrix(monkeypatch) -> None:
    from minisgl.layers import embedding

    timed = []
    real = embedding._best_seconds
    monkeypatch.setattr(embedding, "_best_seconds", lambda call: timed.append(1) or real(call))
    monkeypatch.setattr(embedding, "_SWAPPED_WINS", {})
    weight = torch.randn(200, 8)
    first = embedding._swapped_wins(weight)
    assert len(timed) == 2 and isinstance(first, bool)
    assert embedding._swapped_wins(torch.randn(200, 8)) == first and len(timed) == 2
    embedding._swapped_wins(torch.randn(201, 8))
    assert len(timed) == 4  # another shape is timed again
    logits = embedding.lm_head_logits(torch.randn(2, 8, device="meta"), weight.to("meta"), None)
    assert logits.shape == (2, 200) and len(timed) == 4  # off the CPU: F.linear, nothing timed


def test_hand_wired_decoder_generates_step0s_tokens(model_path) -> None:
    from tests.support import load_example

    ch02, step0 = load_example("examples/ch02_ops.py"), load_example("examples/ch00_step0.py")
    for name in ("tiny-qwen3", "tiny-qwen2"):
        folder = model_path(name)
        prompt = [9, 120, 3001, 77, 15]
        assert ch02.HandWiredDecoder(folder).generate(prompt, 12, []) == step0.Step0Model(
            folder
        ).generate(prompt, 12)
