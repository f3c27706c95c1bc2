from __future__ import annotations

from typing import TYPE_CHECKING

from .base import BaseKVCachePool

if TYPE_CHECKING:
    import torch

    from minisgl.models import ModelConfig


def create_kvcache_pool(
    model_config: ModelConfig,
    num_pages: int,
    page_size: int,
    dtype: torch.dtype,
    device: torch.device,
) -> BaseKVCachePool:
    from .mha_pool import MHAKVCache

    return MHAKVCache(
        num_kv_heads=model_config.num_kv_heads,
        num_pages=num_pages,
        page_size=page_size,
        num_layers=model_config.num_layers,
        head_dim=model_config.head_dim,
        device=device,
        dtype=dtype,
    )


__all__ = ["create_kvcache_pool", "BaseKVCachePool"]
