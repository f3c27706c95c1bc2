"""Chapter 02: the op layer.

First each op is compared with the transformers module it replaces. Then step 0's decoder is
wired by hand from the ops (q/k/v and gate/up merged into one matrix each) and must still
generate exactly transformers' tokens.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Dict, List

import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from minisgl.layers import (  # noqa: E402
    LinearColParallelMerged,
    LinearOProj,
    LinearQKVMerged,
    LinearRowParallel,
    OPList,
    ParallelLMHead,
    RMSNorm,
    RMSNormFused,
    VocabParallelEmbedding,
    get_rope,
    silu_and_mul,
)
from minisgl.layers.base import BaseOP  # noqa: E402
from tools.models import ensure_model  # noqa: E402
from tools.parity import eos_ids, run_parity  # noqa: E402


@torch.no_grad()
def compare_ops() -> None:
    """Each op against the transformers code it stands for, on random inputs."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import (
        LlamaRMSNorm,
        LlamaRotaryEmbedding,
        apply_rotary_pos_emb,
    )
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    torch.manual_seed(0)
    rows = []
    x = torch.randn(7, 576)
    hf_norm = LlamaRMSNorm(576, eps=1e-5)
    hf_norm.weight.data.normal_()
    ours = RMSNorm(576, 1e-5)
    ours.weight = hf_norm.weight.data
    rows.append(("RMSNorm(576)", "LlamaRMSNorm", ours.forward(x), hf_norm(x)))
    fused = RMSNormFused(576, 1e-5)
    fused.weight = hf_norm.weight.data
    residual = torch.randn(7, 576)
    rows.append(
        (
            "RMSNormFused(576)",
            "x + residual, LlamaRMSNorm",
            fused.forward(x, residual)[0],
            hf_norm(x + residual),
        )
    )
    heads = torch.randn(7, 4, 128)
    hf_qnorm = Qwen3RMSNorm(128, eps=1e-6)
    hf_qnorm.weight.data.normal_()
    qnorm = RMSNorm(128, 1e-6)
    qnorm.weight = hf_qnorm.weight.data
    inplace = heads.clone()
    qnorm.forward_inplace(inplace)
    rows.append(("RMSNorm(128) in place", "Qwen3RMSNorm (q_norm)", inplace, hf_qnorm(heads)))
    gate_up = torch.randn(7, 2 * 1536)
    rows.append(
        (
            "silu_and_mul",
            "silu(gate) * up",
            silu_and_mul(gate_up),
            torch.nn.functional.silu(gate_up[:, :1536]) * gate_up[:, 1536:],
        )
    )
    llama3 = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    for name, params in [
        ("default", {"rope_type": "default", "rope_theta": 1e6}),
        ("llama3", llama3),
        ("linear", {"rope_type": "linear", "rope_theta": 1e4, "factor": 4.0}),
    ]:
        config = LlamaConfig(
            hidden_size=512,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=128,
            rope_parameters=params,
            max_position_embeddings=4096,
        )
        positions = torch.tensor([0, 1, 5, 63, 64, 300, 4095])
        q, k = torch.randn(1, 4, 7, 128), torch.randn(1, 2, 7, 128)
        cos, sin = LlamaRotaryEmbedding(config)(q, positions[None])
        q_hf, _ = apply_rotary_pos_emb(q, k, cos, sin)
        scaling = (
            None
            if name == "default"
            else tuple((a, b) for a, b in params.items() if a != "rope_theta")
        )
        rope = get_rope(128, 128, 4096, params["rope_theta"], scaling)
        q_ours, k_ours = (
            q[0].transpose(0, 1).reshape(7, -1).clone(),
            k[0].transpose(0, 1).reshape(7, -1).clone(),
        )
        rope.forward(positions, q_ours, k_ours)
        rows.append(
            (
                f"RoPE {name}",
                "LlamaRotaryEmbedding",
                q_ours.view(7, 4, 128),
                q_hf[0].transpose(0, 1),
            )
        )
    print(f"{'op':24s} {'transformers reference':30s} {'max |difference|':>16s}")
    for op, ref, a, b in rows:
        print(f"{op:24s} {ref:30s} {float((a - b).abs().max()):16.3g}")
    print()


class HandWiredDecoder(BaseOP):
    """Step 0's decoder, assembled from this chapter's ops (chapter 03 does it properly)."""

    def __init__(self, model_dir: Path) -> None:
        c = json.loads((model_dir / "config.json").read_text())
        hidden, heads, layers = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"]
        self.num_heads, self.num_kv_heads = heads, c.get("num_key_value_heads", heads)
        self.head_dim = c.get("head_dim") or hidden // heads
        eps, inter, vocab = c["rms_norm_eps"], c["intermediate_size"], c["vocab_size"]
        has_bias = c.get("attention_bias", False) or c["model_type"] == "qwen2"
        rope = c["rope_parameters"]
        scaling = tuple((k, v) for k, v in rope.items() if k != "rope_theta")
        self.rope = get_rope(
            self.head_dim,
            self.head_dim,
            c["max_position_embeddings"],
            rope["rope_theta"],
            None if rope["rope_type"] == "default" else scaling,
        )
        self.embed = VocabParallelEmbedding(vocab, hidden)
        self.layers = OPList(
            [
                _Layer(c, hidden, heads, self.num_kv_heads, self.head_dim, inter, eps, has_bias)
                for _ in range(layers)
            ]
        )
        self.norm = RMSNormFused(hidden, eps)
        tied = c.get("tie_word_embeddings", False)
        self.head = ParallelLMHead(
            vocab, hidden, tie_word_embeddings=tied, tied_embedding=self.embed if tied else None
        )
        self.load_state_dict(_rename(load_file(model_dir / "model.safetensors"), layers))

    def forward(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        positions = torch.arange(start, start + len(ids))
        x, residual = self.embed.forward(ids), None
        for i, layer in enumerate(self.layers.op_list):
            x, residual = layer.input_layernorm.forward(x, residual)
            x = self.attention(layer, x, positions, i)
            x, residual = layer.post_attention_layernorm.forward(x, residual)
            x = layer.down.forward(silu_and_mul(layer.gate_up.forward(x)))
        x, _ = self.norm.forward(x, residual)
        return self.head.forward(x[-1:])[0]

    def attention(
        self, layer: "_Layer", x: torch.Tensor, positions: torch.Tensor, i: int
    ) -> torch.Tensor:
        n, d = len(x), self.head_dim
        sizes = [self.num_heads * d, self.num_kv_heads * d, self.num_kv_heads * d]
        q, k, v = layer.qkv.forward(x).split(sizes, dim=-1)
        q, k = q.contiguous(), k.contiguous()
        if layer.q_norm is not None:
            layer.q_norm.forward_inplace(q.view(n, -1, d))
            layer.k_norm.forward_inplace(k.view(n, -1, d))
        self.rope.forward(positions, q, k)
        start = int(positions[0])
        self.k_cache[i][start : start + n] = k.view(n, -1, d)
        self.v_cache[i][start : start + n] = v.reshape(n, -1, d)
        group = self.num_heads // self.num_kv_heads
        keys = self.k_cache[i][: start + n].repeat_interleave(group, dim=1)
        values = self.v_cache[i][: start + n].repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q.view(n, -1, d), keys) / math.sqrt(d)
        visible = torch.arange(start + n)[None, :] <= positions[:, None]
        probs = scores.masked_fill(~visible, float("-inf")).softmax(dim=-1)
        return layer.o_proj.forward(torch.einsum("hqk,khd->qhd", probs, values).reshape(n, -1))

    @torch.inference_mode()
    def generate(self, prompt: List[int], n: int, eos: List[int]) -> List[int]:
        shape = (len(prompt) + n, self.num_kv_heads, self.head_dim)
        self.k_cache = [torch.zeros(shape) for _ in self.layers.op_list]
        self.v_cache = [torch.zeros(shape) for _ in self.layers.op_list]
        ids, start, out = torch.tensor(prompt), 0, []
        while len(out) < n and not (out and out[-1] in eos):
            logits = self.forward(ids, start)
            start += len(ids)
            out.append(int(logits.argmax()))
            ids = torch.tensor(out[-1:])
        return out


class _Layer(BaseOP):
    def __init__(
        self,
        c: Dict,
        hidden: int,
        heads: int,
        kv_heads: int,
        head_dim: int,
        inter: int,
        eps: float,
        has_bias: bool,
    ) -> None:
        self.input_layernorm = RMSNormFused(hidden, eps)
        self.qkv = LinearQKVMerged(hidden, head_dim, heads, kv_heads, has_bias)
        qk_norm = c["model_type"] == "qwen3"
        self.q_norm = RMSNorm(head_dim, eps) if qk_norm else None
        self.k_norm = RMSNorm(head_dim, eps) if qk_norm else None
        self.o_proj = LinearOProj(heads * head_dim, hidden, has_bias=False)
        self.post_attention_layernorm = RMSNormFused(hidden, eps)
        self.gate_up = LinearColParallelMerged(hidden, [inter, inter], has_bias=False)
        self.down = LinearRowParallel(inter, hidden, has_bias=False)


def _rename(weights: Dict[str, torch.Tensor], layers: int) -> Dict[str, torch.Tensor]:
    """Checkpoint names -> our ops' names, merging q/k/v and gate/up into one matrix each."""
    out = {
        "embed.weight": weights.pop("model.embed_tokens.weight"),
        "norm.weight": weights.pop("model.norm.weight"),
    }
    if "lm_head.weight" in weights:
        out["head.weight"] = weights.pop("lm_head.weight")
    for i in range(layers):
        p, o = f"model.layers.{i}.", f"layers.{i}."
        take = lambda name, p=p: weights.pop(p + name)
        for kind in ("weight", "bias"):
            if p + f"self_attn.q_proj.{kind}" in weights:
                out[o + f"qkv.{kind}"] = torch.cat(
                    [take(f"self_attn.{x}_proj.{kind}") for x in "qkv"]
                )
        out[o + "o_proj.weight"] = take("self_attn.o_proj.weight")
        out[o + "gate_up.weight"] = torch.cat(
            [take("mlp.gate_proj.weight"), take("mlp.up_proj.weight")]
        )
        out[o + "down.weight"] = take("mlp.down_proj.weight")
        out[o + "input_layernorm.weight"] = take("input_layernorm.weight")
        out[o + "post_attention_layernorm.weight"] = take("post_attention_layernorm.weight")
        for norm in ("q_norm", "k_norm"):
            if p + f"self_attn.{norm}.weight" in weights:
                out[o + f"{norm}.weight"] = take(f"self_attn.{norm}.weight")
    assert not weights, f"weights left over: {sorted(weights)}"
    return out


def generate(name: str, prompts: List[List[int]], n: int) -> List[List[int]]:
    model, eos = HandWiredDecoder(ensure_model(name)), eos_ids(name)
    return [model.generate(p, n, eos) for p in prompts]


def main() -> int:
    compare_ops()
    return 0 if run_parity(generate, device="cpu", dtype=torch.float32).ok else 1


if __name__ == "__main__":
    sys.exit(main())
