"""The data every part of the engine passes around: requests, batches, and the global context."""

from __future__ import annotations

import math
import numbers
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator, List, Literal

import torch

if TYPE_CHECKING:
    from minisgl.attention import BaseAttnBackend, BaseAttnMetadata
    from minisgl.kvcache import BaseCacheHandle, BaseKVCachePool
    from minisgl.moe import BaseMoeBackend


@dataclass
class SamplingParams:
    """How one request picks its tokens. The defaults are greedy decoding.

    A value outside its range raises ValueError when the object is made, naming the field
    and what it may be: a request that cannot be served is refused before it holds anything.
    """

    temperature: float = 0.0  # 0: greedy
    top_k: int = -1  # -1: no top-k filter
    top_p: float = 1.0  # 1: no nucleus filter
    ignore_eos: bool = False
    max_tokens: int = 1024  # 0: no new token

    def __post_init__(self) -> None:
        problems = []
        if (
            not _is_number(self.temperature)
            or not math.isfinite(self.temperature)
            or self.temperature < 0
        ):
            problems.append(
                f"temperature must be a finite number >= 0 (0 is greedy), not {self.temperature!r}"
            )
        if not _is_int(self.top_k) or not (self.top_k == -1 or self.top_k >= 1):
            problems.append(f"top_k must be -1 (no filter) or an integer >= 1, not {self.top_k!r}")
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            problems.append(f"top_p must be in (0, 1] (1 is no filter), not {self.top_p!r}")
        if not _is_int(self.max_tokens) or self.max_tokens < 0:
            problems.append(f"max_tokens must be an integer >= 0, not {self.max_tokens!r}")
        if not isinstance(self.ignore_eos, bool):
            problems.append(f"ignore_eos must be true or false, not {self.ignore_eos!r}")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def is_greedy(self) -> bool:
        # top_k == 1 is greedy whatever the temperature; a top-p filter is never a no-op
        return (self.temperature <= 0.0 or self.top_k == 1) and self.top_p == 1.0


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


@dataclass(eq=False)
class Req:
    """One request as the engine sees it.

    Its tokens (prompt, then outputs) are in `input_ids`, on the CPU. Three lengths track its
    progress through the KV cache:

        cached_len  tokens whose K/V are already in the cache
        device_len  tokens the device knows about (the cache plus those being computed now)
        max_device_len  the prompt plus every output token it may produce

    A forward pass computes tokens cached_len .. device_len-1 (the "extend" part); afterwards
    `complete_one` moves cached_len up to device_len and makes room for the token just sampled.
    """

    input_ids: torch.Tensor  # on the CPU
    table_idx: int  # the request's row in the page table and the token pool
    cached_len: int
    output_len: int  # the most tokens it may still produce
    uid: int
    sampling_params: SamplingParams
    cache_handle: BaseCacheHandle

    def __post_init__(self) -> None:
        assert self.input_ids.is_cpu, "a request's tokens live on the CPU"
        self.device_len = len(self.input_ids)
        self.max_device_len = len(self.input_ids) + self.output_len
        assert 0 <= self.cached_len < self.device_len <= self.max_device_len

    @property
    def remain_len(self) -> int:
        return self.max_device_len - self.device_len

    @property
    def extend_len(self) -> int:
        return self.device_len - self.cached_len

    def complete_one(self) -> None:
        """One forward pass done: its tokens are cached, and one sampled token is on its way."""
        self.cached_len = self.device_len
        self.device_len += 1

    def append_host(self, next_token: torch.Tensor) -> None:
        self.input_ids = torch.cat([self.input_ids, next_token])

    @property
    def can_decode(self) -> bool:
        return self.remain_len > 0

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(uid={self.uid}, table_idx={self.table_idx}, "
            f"cached_len={self.cached_len}, device_len={self.device_len}, "
            f"max_device_len={self.max_device_len})"
        )


@dataclass
class Batch:
    """The requests of one forward pass, all in the same phase."""

    reqs: List[Req]
    phase: Literal["prefill", "decode"]
    # set by the scheduler
    input_ids: torch.Tensor = field(init=False)
    positions: torch.Tensor = field(init=False)
    out_loc: torch.Tensor = field(init=False)  # where each token's K/V is written
    padded_reqs: List[Req] = field(init=False)  # reqs, plus dummies up to a CUDA graph size
    # set by the attention backend
    attn_metadata: BaseAttnMetadata = field(init=False)

    @property
    def is_prefill(self) -> bool:
        return self.phase == "prefill"

    @property
    def is_decode(self) -> bool:
        return self.phase == "decode"

    @property
    def size(self) -> int:
        return len(self.reqs)

    @property
    def padded_size(self) -> int:
        return len(self.padded_reqs)


@dataclass
class Context:
    """State that every layer needs during a forward pass, reachable without threading it
    through every call: the page table, the KV pool, the backends and the current batch."""

    page_size: int
    # one row per request slot, one column per token position; it holds token locations,
    # as if every page had size 1, whatever `page_size` is
    page_table: torch.Tensor = field(init=False)
    attn_backend: BaseAttnBackend = field(init=False)
    kv_cache: BaseKVCachePool = field(init=False)
    moe_backend: BaseMoeBackend = field(init=False)  # for a mixture-of-experts model
    _batch: Batch | None = field(default=None, init=False)

    @property
    def batch(self) -> Batch:
        assert self._batch is not None, "no batch is being run"
        return self._batch

    @contextmanager
    def forward_batch(self, batch: Batch) -> Iterator[None]:
        assert self._batch is None, "forward_batch does not nest"
        try:
            self._batch = batch
            yield
        finally:
            self._batch = None


_GLOBAL_CTX: Context | None = None


def set_global_ctx(ctx: Context) -> None:
    global _GLOBAL_CTX
    assert _GLOBAL_CTX is None, "the global context is already set"
    _GLOBAL_CTX = ctx


def get_global_ctx() -> Context:
    assert _GLOBAL_CTX is not None, "the global context is not set"
    return _GLOBAL_CTX


def clear_global_ctx() -> None:
    """Forget the global context, so that another engine can start in this process."""
    global _GLOBAL_CTX
    _GLOBAL_CTX = None
