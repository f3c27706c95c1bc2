"""The attention layer: q/k norms, RoPE, the KV pool, and attention over it.

Each request of the batch brings its new tokens (its "extend" part: the whole prompt in a
prefill, one token in a decode step). Their keys and values go into the KV pool at the slots
`batch.out_loc`; then each request's queries attend to all of its keys, old and new, which
the page table lists in order. Chapter 05 moves this last step into a pluggable backend.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from minisgl.core import get_global_ctx

from .base import StateLessOP
from .rotary import get_rope

if TYPE_CHECKING:
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
        self.num_qo_heads = num_qo_heads
        self.num_kv_heads = num_kv_heads
        self.qo_attn_dim = num_qo_heads * head_dim
        self.kv_attn_dim = num_kv_heads * head_dim
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
        positions = get_global_ctx().batch.positions
        q, k, v = qkv.split([self.qo_attn_dim, self.kv_attn_dim, self.kv_attn_dim], dim=-1)
        if self.q_norm is not None:
            self.q_norm.forward_inplace(q.view(-1, self.num_qo_heads, self.head_dim))
        if self.k_norm is not None:
            self.k_norm.forward_inplace(k.view(-1, self.num_kv_heads, self.head_dim))
        q, k = self.rotary.forward(positions, q, k)
        ctx = get_global_ctx()
        batch = ctx.batch
        ctx.kv_cache.store_kv(k, v, batch.out_loc, self.layer_id)
        k_cache = ctx.kv_cache.k_cache(self.layer_id).view(-1, self.num_kv_heads, self.head_dim)
        v_cache = ctx.kv_cache.v_cache(self.layer_id).view(-1, self.num_kv_heads, self.head_dim)
        q = q.view(-1, self.num_qo_heads, self.head_dim)
        o = torch.empty_like(q)
        start = 0
        for req in batch.reqs:  # one request at a time; chapter 05 batches this
            end = start + req.extend_len
            slots = ctx.page_table[req.table_idx, : req.device_len].long()
            o[start:end] = _attend(q[start:end], k_cache[slots], v_cache[slots], req.cached_len)
            start = end
        return o.view(-1, self.qo_attn_dim)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cached_len: int) -> torch.Tensor:
    """q: [n, heads, d], the queries of positions cached_len .. cached_len+n-1; k, v: [L, kv_heads,
    d] for positions 0 .. L-1. Query i sees keys up to its own position."""
    n, length = q.shape[0], k.shape[0]
    visible = torch.arange(length, device=q.device)[None, :] <= (
        cached_len + torch.arange(n, device=q.device)[:, None]
    )
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    o = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=visible
    )
    return o.transpose(0, 1)
