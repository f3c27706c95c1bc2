"""The parts every decoder shares: the gated MLP (or, in a mixture-of-experts model, the
router and the experts), attention with RoPE, and the decoder itself, written once and
configured per architecture."""

from __future__ import annotations

from typing import TYPE_CHECKING, Tuple

import torch

from minisgl.core import get_global_ctx
from minisgl.distributed import tp_info_or_one
from minisgl.env import ENV
from minisgl.layers import (
    AttentionLayer,
    BaseOP,
    LinearColParallelMerged,
    LinearOProj,
    LinearQKVMerged,
    LinearReplicated,
    LinearRowParallel,
    MoELayer,
    OPList,
    ParallelLMHead,
    RMSNorm,
    RMSNormFused,
    VocabParallelEmbedding,
    gelu_and_mul,
    silu_and_mul,
)
from minisgl.layers.gpu import flashinfer_for
from minisgl.utils import nvtx_annotate

from .base import BaseLLMModel

if TYPE_CHECKING:
    from .config import ModelConfig


def split_down_makes_silu(rows: int) -> bool:
    """In project P1's split form (on a GPU, an MLP of SiLU without bias), whether down's
    kernel makes its input's SiLU at `rows` rows: unless turned off (ENV.SPLIT_DOWN_SILU),
    wherever the gate/up kernel does not (turned off, or above its MAX_ROWS)."""
    from minisgl.kernel.triton.gate_up_silu import MAX_ROWS

    return bool(ENV.SPLIT_DOWN_SILU) and not (ENV.FUSED_GATE_UP_SILU and rows <= MAX_ROWS)


class GatedMLP(BaseOP):
    """down(act(gate(x)) * up(x)), with gate and up in one matrix."""

    def __init__(self, config: ModelConfig) -> None:
        self.gate_up_proj = LinearColParallelMerged(
            config.hidden_size,
            [config.intermediate_size, config.intermediate_size],
            has_bias=False,
        )
        activations = {"silu": silu_and_mul, "gelu": gelu_and_mul}
        if config.hidden_act not in activations:
            raise ValueError(f"unsupported activation {config.hidden_act!r}")
        self.act_fn = activations[config.hidden_act]
        self.down_proj = LinearRowParallel(
            config.intermediate_size, config.hidden_size, has_bias=False
        )

    @nvtx_annotate("MLP")
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj.forward(self.activate(x))

    def activate(self, x: torch.Tensor) -> torch.Tensor:
        """act(gate(x)) * up(x): the down product's input."""
        if self._fused_gate_up_silu(x):
            from minisgl.kernel.triton.gate_up_silu import gate_up_silu_triton

            return gate_up_silu_triton(x, self.gate_up_proj.weight)
        return self.act_fn(self.gate_up_proj.forward(x))

    def down_input(self, x: torch.Tensor) -> Tuple[torch.Tensor, bool]:
        """The down product's input in project P1's split form (`DecoderLayer.forward_split`),
        and whether SiLU is left to down's kernel: the gate/up product alone (True) where the
        gate/up kernel did not take SiLU in and `ENV.SPLIT_DOWN_SILU` is on; else
        act(gate(x)) * up(x) (False)."""
        if (
            self.act_fn is silu_and_mul
            and self.gate_up_proj.bias is None
            and split_down_makes_silu(x.shape[0])
        ):
            return self.gate_up_proj.forward(x), True
        return self.activate(x), False

    def _fused_gate_up_silu(self, x: torch.Tensor) -> bool:
        """Project P1's kernel for the gate/up product and SiLU: unless turned off (ENV), for
        SiLU without a bias, on a GPU in 16 bits, at few rows (a decode step's, mostly)."""
        from minisgl.kernel.triton.gate_up_silu import MAX_ROWS

        return (
            ENV.FUSED_GATE_UP_SILU
            and self.act_fn is silu_and_mul
            and self.gate_up_proj.bias is None
            and x.dim() == 2
            and x.shape[0] <= MAX_ROWS
            and flashinfer_for(x) is not None
        )


class MoEMLP(BaseOP):
    """The router (a linear layer every rank holds whole) scores the experts for each token;
    the experts' layer runs each token's best `num_experts_per_tok` of them."""

    def __init__(self, config: ModelConfig) -> None:
        self.experts = MoELayer(
            num_experts=config.num_experts,
            top_k=config.num_experts_per_tok,
            hidden_size=config.hidden_size,
            intermediate_size=config.moe_intermediate_size,
            renormalize=config.norm_topk_prob,
            activation=config.hidden_act,
        )
        self.gate = LinearReplicated(config.hidden_size, config.num_experts, has_bias=False)

    @nvtx_annotate("MoE")
    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        router_logits = self.gate.forward(hidden_states)  # [tokens, experts]
        return self.experts.forward(hidden_states, router_logits)


class RopeAttn(BaseOP):
    """Self-attention: the qkv projection, the attention itself (with RoPE and, for Qwen3, the
    q/k norms), and the output projection."""

    def __init__(
        self,
        config: ModelConfig,
        layer_id: int,
        *,
        has_attn_bias: bool = False,
        has_qk_norm: bool = False,
    ) -> None:
        head_dim = config.head_dim
        self.qkv_proj = LinearQKVMerged(
            hidden_size=config.hidden_size,
            head_dim=head_dim,
            num_qo_heads=config.num_qo_heads,
            num_kv_heads=config.num_kv_heads,
            has_bias=has_attn_bias,
        )
        self.has_qk_norm = has_qk_norm
        self.q_norm = RMSNorm(head_dim, eps=config.rms_norm_eps) if has_qk_norm else None
        self.k_norm = RMSNorm(head_dim, eps=config.rms_norm_eps) if has_qk_norm else None
        self.attn = AttentionLayer(
            layer_id=layer_id,
            num_qo_heads=config.num_qo_heads,
            num_kv_heads=config.num_kv_heads,
            head_dim=head_dim,
            rotary_config=config.rotary_config,
            q_norm=self.q_norm,
            k_norm=self.k_norm,
        )
        self.o_proj = LinearOProj(
            head_dim * config.num_qo_heads, config.hidden_size, has_bias=False
        )

    @nvtx_annotate("MHA")
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.o_proj.forward(self.attend(x))

    def attend(self, x: torch.Tensor) -> torch.Tensor:
        """The heads' outputs, side by side: the o product's input."""
        return self.attn.forward(self.qkv_proj.forward(x))


class DecoderLayer(BaseOP):
    """Pre-norm attention, then pre-norm MLP, each added to the residual stream."""

    def __init__(
        self, config: ModelConfig, layer_id: int, *, has_attn_bias: bool, has_qk_norm: bool
    ) -> None:
        self.self_attn = RopeAttn(
            config, layer_id, has_attn_bias=has_attn_bias, has_qk_norm=has_qk_norm
        )
        self.mlp = MoEMLP(config) if config.is_moe else GatedMLP(config)
        self.input_layernorm = RMSNormFused(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNormFused(config.hidden_size, config.rms_norm_eps)
        self._layer_id = layer_id

    @nvtx_annotate("Layer_{}", layer_id_field="_layer_id")
    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        x, residual = self.input_layernorm.forward(x, residual)
        x = self.self_attn.forward(x)
        x, residual = self.post_attention_layernorm.forward(x, residual)
        return self.mlp.forward(x), residual

    @nvtx_annotate("Layer_{}", layer_id_field="_layer_id")
    def forward_split(
        self, x: torch.Tensor, residual: torch.Tensor, next_norm: RMSNormFused
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """Project P1's form of `forward` (see `DecoderModel._split_o_down`): x comes in
        normalised, by the layer before (or the model's start), and o and down each end with
        the add-and-norm after them, down's with `next_norm`, the next layer's input norm."""
        from minisgl.kernel.triton.product_add_norm import product_add_rmsnorm

        after_attn, after_mlp = self.post_attention_layernorm, next_norm
        heads = self.self_attn.attend(x)
        o_weight = self.self_attn.o_proj.weight
        x = product_add_rmsnorm(heads, o_weight, residual, after_attn.weight, after_attn.eps)
        hidden, gated = self.mlp.down_input(x)
        down_weight = self.mlp.down_proj.weight
        x = product_add_rmsnorm(
            hidden, down_weight, residual, after_mlp.weight, after_mlp.eps, gated=gated
        )
        return x, residual


class DecoderModel(BaseOP):
    """Embedding, the layers, the final norm: token ids in, hidden states out."""

    def __init__(self, config: ModelConfig, *, has_attn_bias: bool, has_qk_norm: bool) -> None:
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = OPList(
            [
                DecoderLayer(config, i, has_attn_bias=has_attn_bias, has_qk_norm=has_qk_norm)
                for i in range(config.num_layers)
            ]
        )
        self.norm = RMSNormFused(config.hidden_size, config.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens.forward(input_ids)
        if self._split_o_down(x):
            return self._forward_split(x)
        residual: torch.Tensor | None = None
        for layer in self.layers.op_list:
            x, residual = layer.forward(x, residual)
        return self.norm.forward(x, residual)[0]

    def _forward_split(self, x: torch.Tensor) -> torch.Tensor:
        """The layers with o and down ending in the add-and-norm after them: each layer's
        down product ends with the next layer's input norm, the last one's with the final."""
        layers = self.layers.op_list
        next_norms = [layer.input_layernorm for layer in layers[1:]] + [self.norm]
        x, residual = layers[0].input_layernorm.forward(x, None)
        for layer, next_norm in zip(layers, next_norms):
            x, residual = layer.forward_split(x, residual, next_norm)
        return x

    def _split_o_down(self, x: torch.Tensor) -> bool:
        """Project P1's o and down products split over their inputs, each with the
        add-and-norm after it in its second kernel: when turned on (ENV), on a GPU in 16 bits,
        at few rows (a decode step's), on one rank (more would have to add up their partial
        products first), for gated MLPs whose o and down have no bias."""
        from minisgl.kernel.triton.product_add_norm import MAX_ROWS

        layers = self.layers.op_list
        return (
            ENV.SPLIT_O_DOWN
            and x.dim() == 2
            and x.shape[0] <= MAX_ROWS
            and flashinfer_for(x) is not None
            and tp_info_or_one().size == 1
            and all(isinstance(layer.mlp, GatedMLP) for layer in layers)
            and all(layer.self_attn.o_proj.bias is None for layer in layers)
            and all(layer.mlp.down_proj.bias is None for layer in layers)
        )


class DecoderForCausalLM(BaseLLMModel):
    """A dense decoder with an LM head. Subclasses set the two flags of their architecture."""

    has_attn_bias: bool = False  # Qwen2 puts a bias on q, k and v
    has_qk_norm: bool = False  # Qwen3 normalises every head of q and k

    def __init__(self, config: ModelConfig) -> None:
        self.model = DecoderModel(
            config, has_attn_bias=self.has_attn_bias, has_qk_norm=self.has_qk_norm
        )
        self.lm_head = ParallelLMHead(
            num_embeddings=config.vocab_size,
            embedding_dim=config.hidden_size,
            tie_word_embeddings=config.tie_word_embeddings,
            tied_embedding=self.model.embed_tokens if config.tie_word_embeddings else None,
        )
        super().__init__()

    def forward(self) -> torch.Tensor:
        batch = get_global_ctx().batch
        hidden = self.model.forward(batch.input_ids)
        if batch.is_prefill:  # only each request's last token predicts a new one
            hidden = hidden[batch.attn_metadata.get_last_indices(batch.size)]
        return self.lm_head.forward(hidden)


__all__ = ["GatedMLP", "MoEMLP", "RopeAttn", "DecoderLayer", "DecoderModel", "DecoderForCausalLM"]
