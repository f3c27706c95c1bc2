from .argmax import argmax
from .index import indexing
from .moe_impl import fused_moe_kernel_triton, moe_sum_reduce_triton
from .radix import fast_compare_key
from .store import store_cache

__all__ = [
    "argmax",
    "indexing",
    "fast_compare_key",
    "store_cache",
    "fused_moe_kernel_triton",
    "moe_sum_reduce_triton",
]
