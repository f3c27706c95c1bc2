"""Writing a batch's new keys and values into the KV pool.

Token i of the batch goes to row indices[i] of the flat cache (one row per token slot, every
page laid end to end). This is the PyTorch reference: one indexed copy for K, one for V.
Chapter 19 replaces it on the GPU with a CUDA kernel that copies both in one launch.
"""

from __future__ import annotations

import torch


def store_cache(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    indices: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> None:
    """k_cache, v_cache: [num_slots, heads, head_dim]; k, v: [n, heads * head_dim] or
    [n, heads, head_dim]; indices: [n] slot of each new token."""
    num_slots = k_cache.shape[0]
    k_flat, v_flat = k_cache.view(num_slots, -1), v_cache.view(num_slots, -1)
    index = indices.long()
    k_flat.index_copy_(0, index, k.reshape(len(index), k_flat.shape[1]).to(k_flat.dtype))
    v_flat.index_copy_(0, index, v.reshape(len(index), v_flat.shape[1]).to(v_flat.dtype))
