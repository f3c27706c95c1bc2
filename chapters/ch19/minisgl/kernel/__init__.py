from .argmax import argmax
from .index import indexing
from .radix import fast_compare_key
from .store import store_cache

__all__ = ["argmax", "indexing", "fast_compare_key", "store_cache"]
