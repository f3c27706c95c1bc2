"""Linear layers, named after the way tensor parallelism will split them (chapter 16).

In this chapter every process holds the whole weight, so all of them compute x @ W.T + b. The
names already say how each one is used in a transformer layer:

    LinearQKVMerged          q, k and v projections in one matrix (one matmul instead of three)
    LinearColParallelMerged  several projections side by side (the MLP's gate and up)
    LinearOProj              attention's output projection
    LinearRowParallel        the MLP's down projection
    LinearReplicated         a layer that is never split (the MoE router)
"""

from __future__ import annotations

from typing import List

import torch
import torch.nn.functional as F

from .base import BaseOP


class _LinearTPImpl(BaseOP):
    """y = x @ weight.T + bias, with the full and the local (per-rank) sizes recorded."""

    def __init__(
        self,
        full_isize: int,
        full_osize: int,
        local_isize: int,
        local_osize: int,
        has_bias: bool,
    ) -> None:
        self.full_input_size = full_isize
        self.full_output_size = full_osize
        self.local_input_size = local_isize
        self.local_output_size = local_osize
        self.weight = torch.empty(local_osize, local_isize)
        self.bias = torch.empty(local_osize) if has_bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class LinearReplicated(_LinearTPImpl):
    def __init__(self, input_size: int, output_size: int, has_bias: bool) -> None:
        super().__init__(input_size, output_size, input_size, output_size, has_bias)


class LinearColParallelMerged(_LinearTPImpl):
    def __init__(self, input_size: int, output_sizes: List[int], has_bias: bool) -> None:
        output_size = sum(output_sizes)
        super().__init__(input_size, output_size, input_size, output_size, has_bias)


class LinearQKVMerged(_LinearTPImpl):
    def __init__(
        self,
        hidden_size: int,
        head_dim: int,
        num_qo_heads: int,
        num_kv_heads: int,
        has_bias: bool,
    ) -> None:
        output_size = (num_qo_heads + 2 * num_kv_heads) * head_dim
        super().__init__(hidden_size, output_size, hidden_size, output_size, has_bias)


class LinearOProj(_LinearTPImpl):
    def __init__(self, input_size: int, output_size: int, has_bias: bool) -> None:
        super().__init__(input_size, output_size, input_size, output_size, has_bias)


class LinearRowParallel(_LinearTPImpl):
    def __init__(self, input_size: int, output_size: int, has_bias: bool) -> None:
        super().__init__(input_size, output_size, input_size, output_size, has_bias)
