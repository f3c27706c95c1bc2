"""Chapter 04: the KV pool's layout, store_kv through the kernel module, and page sizes."""

from __future__ import annotations

import pytest
import torch

from minisgl.kernel import store_cache
from minisgl.kvcache import BaseKVCachePool, create_kvcache_pool
from minisgl.kvcache.mha_pool import MHAKVCache
from minisgl.models import ModelConfig
from minisgl.utils import cached_load_hf_config


def make_pool(
    page_size: int, num_pages: int = 6, layers: int = 2, heads: int = 3, dim: int = 8
) -> MHAKVCache:
    pool = MHAKVCache(
        num_kv_heads=heads,
        num_layers=layers,
        head_dim=dim,
        num_pages=num_pages,
        page_size=page_size,
        dtype=torch.float32,
        device=torch.device("cpu"),
    )
    pool._kv_buffer.zero_()
    return pool


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_pool_layout(page_size: int) -> None:
    pool = make_pool(page_size)
    assert isinstance(pool, BaseKVCachePool)
    assert pool.k_cache(1).shape == (6, page_size, 3, 8) == pool.v_cache(0).shape
    assert pool.num_layers == 2 and pool.dtype == torch.float32 and pool.device.type == "cpu"
    # K and V of every layer are views into one buffer
    assert pool.k_cache(1).data_ptr() == pool._kv_buffer[0, 1].data_ptr()


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_store_kv_writes_exactly_the_given_slots(page_size: int) -> None:
    pool = make_pool(page_size)
    slots = torch.tensor(
        [0, page_size * 6 - 1, page_size * 2 + 1 % page_size, page_size + page_size // 2],
        dtype=torch.int32,
    )
    k = torch.randn(4, 3 * 8)  # as the qkv projection produces it: heads flattened
    v = torch.randn(4, 3, 8)  # or with the head axis: both are accepted
    pool.store_kv(k, v, slots, layer_id=1)
    flat_k = pool.k_cache(1).reshape(-1, 3, 8)
    flat_v = pool.v_cache(1).reshape(-1, 3, 8)
    for i, slot in enumerate(slots.tolist()):
        # slot = page * page_size + offset
        page, offset = divmod(slot, page_size)
        torch.testing.assert_close(pool.k_cache(1)[page, offset], k[i].view(3, 8), atol=0, rtol=0)
        torch.testing.assert_close(flat_v[slot], v[i], atol=0, rtol=0)
    written = torch.zeros(flat_k.shape[0], dtype=torch.bool)
    written[slots.long()] = True
    assert flat_k[~written].abs().sum() == 0 and flat_v[~written].abs().sum() == 0
    assert pool.k_cache(0).abs().sum() == 0  # the other layer is untouched


def test_store_cache_converts_to_the_cache_dtype() -> None:
    k_cache = torch.zeros(10, 2, 4, dtype=torch.bfloat16)
    v_cache = torch.zeros(10, 2, 4, dtype=torch.bfloat16)
    k, v = torch.randn(3, 8), torch.randn(3, 8)
    store_cache(k_cache, v_cache, torch.tensor([9, 0, 4]), k, v)
    torch.testing.assert_close(k_cache[9].float(), k[0].view(2, 4).bfloat16().float())
    torch.testing.assert_close(v_cache[4].float(), v[2].view(2, 4).bfloat16().float())


def test_create_pool_from_a_model_config(model_path) -> None:
    config = ModelConfig.from_hf(cached_load_hf_config(str(model_path("tiny-mistral"))))
    pool = create_kvcache_pool(
        config, num_pages=8, page_size=16, dtype=torch.float32, device=torch.device("cpu")
    )
    assert pool.k_cache(0).shape == (8, 16, config.num_kv_heads, config.head_dim)
    assert pool.num_layers == config.num_layers


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_page_table_rows_point_into_each_requests_own_pages(page_size: int) -> None:

    from examples.helpers.paging import PageAllocator

    table = torch.full((3, 40), -1, dtype=torch.int32)
    allocator = PageAllocator(num_pages=40, page_size=page_size, page_table=table)
    lengths = [5, 17, 3]
    for slot, length in enumerate(lengths):
        allocator.slots_for(slot, 0, length - 1)
        allocator.slots_for(slot, length - 1, length)  # one more token later, as in decode
    seen = set()
    for slot, length in enumerate(lengths):
        row = table[slot, :length].tolist()
        pages = [s // page_size for s in row]
        assert pages == sorted(pages)  # positions fill each page in order
        assert all(s % page_size == p % page_size for p, s in enumerate(row))
        assert not seen & set(pages)  # no page is shared between requests
        seen |= set(pages)
        assert len(set(pages)) == -(-length // page_size)  # ceil(length / page_size) pages
    allocator.release(1)
    assert len(allocator.free_pages) == 40 - sum(-(-n // page_size) for n in (5, 3))
