"""Linear layers, each split across the tensor-parallel ranks in the way its place in the
transformer layer allows (y = x @ W.T, W of shape [out, in]):

    LinearQKVMerged          by columns (output features): rank r computes its own query heads
                             and its key/value heads; a model with fewer key/value heads than
                             ranks gives each rank a copy of one
    LinearColParallelMerged  by columns: the MLP's gate and up, each a slice of the features
    LinearOProj              by rows (input features): each rank holds the heads it computed,
                             makes a partial sum of the output, and all-reduce adds them up
    LinearRowParallel        by rows: the MLP's down projection, the same way
    LinearReplicated         not split (the MoE router)

A column split needs no communication (its input is whole on every rank); a row split needs
one all-reduce. Attention then MLP is column, row, column, row: two all-reduces per layer.
`full_*` sizes are the layer's, `local_*` sizes this rank's; with one rank they are equal and
the layer is the plain one of chapter 02.
"""

from __future__ import annotations

from typing import List

import torch
import torch.nn.functional as F

from minisgl.distributed import DistributedCommunicator, tp_info_or_one
from minisgl.utils import div_even

from .base import BaseOP


class _LinearTPImpl(BaseOP):
    """y = x @ weight.T + bias on this rank's slice of the weight."""

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
        tp_size = tp_info_or_one().size
        local_osize = sum(div_even(size, tp_size) for size in output_sizes)
        super().__init__(input_size, sum(output_sizes), input_size, local_osize, has_bias)


class LinearQKVMerged(_LinearTPImpl):
    def __init__(
        self,
        hidden_size: int,
        head_dim: int,
        num_qo_heads: int,
        num_kv_heads: int,
        has_bias: bool,
    ) -> None:
        tp_size = tp_info_or_one().size
        local_qo = div_even(num_qo_heads, tp_size)
        local_kv = div_even(num_kv_heads, tp_size, allow_replicate=True)
        full_osize = (num_qo_heads + 2 * num_kv_heads) * head_dim
        local_osize = (local_qo + 2 * local_kv) * head_dim
        super().__init__(hidden_size, full_osize, hidden_size, local_osize, has_bias)


class _RowParallel(_LinearTPImpl):
    """Split by input features: each rank's product is a partial sum of the output."""

    def __init__(self, input_size: int, output_size: int, has_bias: bool) -> None:
        tp_info = tp_info_or_one()
        local_isize = div_even(input_size, tp_info.size)
        super().__init__(input_size, output_size, local_isize, output_size, has_bias)
        self._tp_size = tp_info.size
        self._add_bias = tp_info.is_primary()  # added once, not once per rank
        self._comm = DistributedCommunicator()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias if self._add_bias else None)
        if self._tp_size > 1:
            y = self._comm.all_reduce(y)
        return y


class LinearOProj(_RowParallel):
    pass


class LinearRowParallel(_RowParallel):
    pass
