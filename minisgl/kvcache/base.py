"""The KV pool interface (where every layer's keys and values live) and the prefix cache
interface (which token slots hold which token sequences, for reuse)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import NamedTuple

import torch


class BaseKVCachePool(ABC):
    """Keys and values of every layer, for a fixed number of token slots grouped in pages."""

    @abstractmethod
    def k_cache(self, index: int) -> torch.Tensor: ...

    @abstractmethod
    def v_cache(self, index: int) -> torch.Tensor: ...

    @abstractmethod
    def store_kv(
        self, k: torch.Tensor, v: torch.Tensor, out_loc: torch.Tensor, layer_id: int
    ) -> None:
        """Write the keys and values of a batch's new tokens to slots `out_loc` of a layer."""

    @property
    @abstractmethod
    def device(self) -> torch.device: ...

    @property
    @abstractmethod
    def dtype(self) -> torch.dtype: ...

    @property
    @abstractmethod
    def num_layers(self) -> int: ...


@dataclass(frozen=True)
class BaseCacheHandle(ABC):
    """A matched prefix: how many tokens, and where their K/V are (get_matched_indices)."""

    cached_len: int

    @abstractmethod
    def get_matched_indices(self) -> torch.Tensor: ...


class SizeInfo(NamedTuple):
    evictable_size: int  # cached tokens no running request uses: they may be evicted
    protected_size: int  # cached tokens some running request uses (locked)

    @property
    def total_size(self) -> int:
        return self.evictable_size + self.protected_size


class InsertResult(NamedTuple):
    cached_len: int  # how much of the inserted sequence the cache already held
    handle: BaseCacheHandle  # the inserted prefix


class MatchResult(NamedTuple):
    cuda_handle: BaseCacheHandle  # the prefix found in device memory


class BasePrefixCache(ABC):
    """Keeps the K/V of finished (or partly computed) sequences so that later requests that
    start the same way can skip recomputing that prefix.

    The cache owns the token slots it holds. A handle returned by `match_prefix` must be
    locked before its slots are used, and unlocked when the request is done with them:
    locked (protected) slots are never evicted.
    """

    @abstractmethod
    def lock_handle(self, handle: BaseCacheHandle, unlock: bool = False) -> None: ...

    @abstractmethod
    def match_prefix(self, input_ids: torch.Tensor) -> MatchResult:
        """The longest cached prefix of input_ids. Changes nothing in the cache."""

    @abstractmethod
    def insert_prefix(self, input_ids: torch.Tensor, indices: torch.Tensor) -> InsertResult:
        """Take ownership of the slots `indices` holding input_ids' K/V. The part the cache held
        already (result.cached_len) stays the caller's to free."""

    @abstractmethod
    def evict(self, size: int) -> torch.Tensor:
        """Drop at least `size` unlocked cached tokens; return their slots (to be freed)."""

    @abstractmethod
    def reset(self) -> None: ...

    @property
    @abstractmethod
    def size_info(self) -> SizeInfo: ...

    @abstractmethod
    def check_integrity(self) -> None:
        """Raise if the cache's bookkeeping is inconsistent."""
