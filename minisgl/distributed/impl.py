"""The two collective operations tensor parallelism needs, and who carries them out.

    all_reduce(x)   every rank holds a partial sum of the same tensor; afterwards every rank
                    holds the whole sum (the output of a row-parallel layer)
    all_gather(x)   every rank holds a slice along dim 0; afterwards every rank holds all the
                    slices, rank 0's first (the LM head's logits, one vocabulary slice per rank)

A layer asks a `DistributedCommunicator` and never says how: the last plugin registered does
the work. The book's plugin is torch.distributed, whose process group the engine starts (gloo
on the CPU, NCCL on GPUs). On one rank both operations return their input untouched.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import List

import torch
import torch.distributed as dist


class DistributedImpl(ABC):
    @abstractmethod
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor: ...

    @abstractmethod
    def all_gather(self, x: torch.Tensor) -> torch.Tensor: ...


class TorchDistributedImpl(DistributedImpl):
    """torch.distributed on its default process group (the engine's)."""

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if dist.get_world_size() == 1:
            return x
        dist.all_reduce(x, op=dist.ReduceOp.SUM)  # in place: x is a fresh activation
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        world = dist.get_world_size()
        if world == 1:
            return x
        out = torch.empty((world * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
        _gather_into(out, x.contiguous())
        return out


# torch 2.13 renamed all_gather_into_tensor (the older name still works, with a warning)
_gather_into = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class DistributedCommunicator:
    """What layers call. `plugins` is shared by every instance, so one process has one way to
    communicate: the last plugin. (Upstream registers its own NCCL wrapper on top of torch's
    on GPUs; the book uses torch's alone.)"""

    plugins: List[DistributedImpl] = [TorchDistributedImpl()]

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return self.plugins[-1].all_reduce(x)

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        return self.plugins[-1].all_gather(x)


def destroy_distributed() -> None:
    """Back to torch.distributed alone (an engine's shutdown)."""
    DistributedCommunicator.plugins = [TorchDistributedImpl()]


__all__ = [
    "DistributedImpl",
    "TorchDistributedImpl",
    "DistributedCommunicator",
    "destroy_distributed",
]
