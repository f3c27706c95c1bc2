"""The attention layer: q/k norms and RoPE here, the rest in the attention backend.

The layer prepares q, k and v for the batch's new tokens; the backend chosen for the engine
(`ctx.attn_backend`) stores k and v in the KV pool and computes the attention, with the
metadata it prepared for this batch (on a GPU in 16 bits, P1's fused kernel may have stored
k and v already: the backend then gets None for both). With tensor parallelism (chapter 16)
it sees only this rank's heads: attention never mixes heads, so each rank attends alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from minisgl.core import get_global_ctx
from minisgl.distributed import tp_info_or_one
from minisgl.env import ENV
from minisgl.utils import div_even

from .base import StateLessOP
from .gpu import flashinfer_for
from .rotary import get_rope

if TYPE_CHECKING:
    from minisgl.kernel.triton.qk_norm_rope import KVStore
    from minisgl.layers import RMSNorm
    from minisgl.models import RotaryConfig


class AttentionLayer(StateLessOP):
    def __init__(
        self,
        layer_id: int,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        rotary_config: RotaryConfig,
        q_norm: RMSNorm | None = None,
        k_norm: RMSNorm | None = None,
    ) -> None:
        assert num_qo_heads % num_kv_heads == 0
        self.layer_id = layer_id
        self.head_dim = head_dim
        tp_size = tp_info_or_one().size  # this rank's heads (LinearQKVMerged split them)
        self.num_qo_heads = div_even(num_qo_heads, tp_size)
        self.num_kv_heads = div_even(num_kv_heads, tp_size, allow_replicate=True)
        self.qo_attn_dim = self.num_qo_heads * head_dim
        self.kv_attn_dim = self.num_kv_heads * head_dim
        self.rotary = get_rope(
            head_dim=head_dim,
            rotary_dim=rotary_config.rotary_dim,
            max_position=rotary_config.max_position,
            base=rotary_config.base,
            rope_scaling=tuple(rotary_config.scaling.items()) if rotary_config.scaling else None,
        )
        self.q_norm = q_norm
        self.k_norm = k_norm

    def forward(self, qkv: torch.Tensor) -> torch.Tensor:
        ctx = get_global_ctx()
        q, k, v = qkv.split([self.qo_attn_dim, self.kv_attn_dim, self.kv_attn_dim], dim=-1)
        stored = False  # whether k and v are in the KV pool already
        if self._fused_norms_and_rope(q):
            from minisgl.kernel.triton.qk_norm_rope import qk_norm_rope_triton

            assert self.q_norm is not None and self.k_norm is not None
            table = self.rotary._cos_sin_cache  # [max position, cos | sin], float32
            store = self._kv_store(v)
            qk_norm_rope_triton(q, k, self.q_norm.weight, self.k_norm.weight, self.q_norm.eps,
                                ctx.batch.positions, table, self.head_dim, store,
                                pdl=bool(ENV.TRITON_PDL))  # fmt: skip
            stored = store is not None
        else:
            if self.q_norm is not None:
                self.q_norm.forward_inplace(q.view(-1, self.num_qo_heads, self.head_dim))
            if self.k_norm is not None:
                self.k_norm.forward_inplace(k.view(-1, self.num_kv_heads, self.head_dim))
            q, k = self.rotary.forward(ctx.batch.positions, q, k)
        q = q.view(-1, self.num_qo_heads, self.head_dim)
        if stored:
            o = ctx.attn_backend.forward(q, None, None, self.layer_id, ctx.batch)
        else:
            o = ctx.attn_backend.forward(q, k, v, self.layer_id, ctx.batch)
        return o.view(-1, self.qo_attn_dim)

    def _fused_norms_and_rope(self, q: torch.Tensor) -> bool:
        """Project P1's one kernel for both norms and RoPE: asked for (ENV), with both norms,
        on a GPU in 16 bits (where FlashInfer's three kernels would run otherwise)."""
        return (
            ENV.FUSED_QK_NORM_ROPE
            and self.q_norm is not None
            and self.k_norm is not None
            and self.q_norm.eps == self.k_norm.eps
            and flashinfer_for(q) is not None
        )

    def _kv_store(self, v: torch.Tensor) -> KVStore | None:
        """The pool's rows for the fused kernel to store this layer's new keys and values in,
        asked for (ENV) and where the pool holds them as the kernel writes them (its dtype)."""
        from minisgl.kernel.triton.qk_norm_rope import KVStore

        ctx = get_global_ctx()
        if not ENV.FUSED_KV_STORE or ctx.kv_cache.dtype != v.dtype:
            return None
        k_pool, v_pool = ctx.kv_cache.k_cache(self.layer_id), ctx.kv_cache.v_cache(self.layer_id)
        rows = (-1, self.kv_attn_dim)  # [pages, page_size, kv heads, head_dim] as slots' rows
        return KVStore(k_pool.view(rows), v_pool.view(rows), ctx.batch.out_loc, v)
