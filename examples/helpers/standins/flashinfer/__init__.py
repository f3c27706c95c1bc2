"""A stand-in for the two FlashInfer wrappers the engine uses (FlashInfer 0.5.3's names,
arguments and checks), for machines without an NVIDIA GPU; examples/helpers/gpu_libraries.py
says when it is used.

A wrapper is planned, then run any number of times. `plan` keeps its own copy of everything it
was given; `run` uses that copy and the tensors it is handed, nothing else, so an engine that
plans with the wrong lengths or indices gets wrong numbers here as it would on the GPU.
Pages follow FlashInfer's convention: request b owns pages indices[indptr[b]:indptr[b + 1]],
all full except the last, which holds last_page_len[b] tokens.

The CUDA-graph decode wrapper (chapter 18) is different by design: it is given buffers once,
`plan` copies the offsets, indices and last page lengths into them, and `run` reads them there,
as the kernels captured in a graph do. A `run` is a kernel: the graph emulation of
minisgl/utils/cpu_graph.py does not look inside it (it runs under DisableTorchFunction).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import List, Optional, Tuple, Union

import torch

from examples.helpers.gpu_libraries import attend, check_kernel_dtype

__version__ = "0.5.3+book-standin"


@dataclass(frozen=True)
class _Plan:
    qo_indptr: List[int]  # request b's queries are rows qo_indptr[b]:qo_indptr[b + 1] of q
    kv_indptr: List[int]  # its pages are indices[kv_indptr[b]:kv_indptr[b + 1]]
    indices: torch.Tensor
    last_page_len: List[int]
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    q_dtype: torch.dtype
    kv_dtype: torch.dtype
    sm_scale: float

    def kv_len(self, b: int) -> int:
        pages = self.kv_indptr[b + 1] - self.kv_indptr[b]
        return (pages - 1) * self.page_size + self.last_page_len[b] if pages else 0


def _dtype(value: Union[str, torch.dtype, None], default: torch.dtype) -> torch.dtype:
    if value is None:
        return default
    return getattr(torch, value) if isinstance(value, str) else value


def _host_ints(tensor: torch.Tensor, name: str) -> List[int]:
    if tensor.dtype != torch.int32:
        raise ValueError(f"{name} must have dtype torch.int32, got {tensor.dtype}")
    if tensor.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(tensor.shape)}")
    return tensor.tolist()


class _Wrapper:
    def __init__(
        self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD", backend: str = "auto"
    ) -> None:
        if kv_layout not in ("NHD", "HND"):
            raise KeyError(f"Invalid kv_layout {kv_layout}")
        if kv_layout != "NHD":
            raise NotImplementedError("the stand-in models the NHD layout only")
        if float_workspace_buffer.dtype != torch.uint8:
            raise ValueError("the workspace buffer is raw bytes (torch.uint8)")
        if backend not in ("auto", "fa2", "fa3"):
            raise KeyError(f"Backend {backend} not supported")
        self.device = float_workspace_buffer.device
        self._kv_layout = kv_layout
        self._backend = backend
        self._plan: Optional[_Plan] = None

    def _make_plan(
        self,
        qo_indptr: List[int],
        kv_indptr: torch.Tensor,
        indices: torch.Tensor,
        last_page_len: torch.Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
        pos_encoding_mode: str,
        q_data_type: Union[str, torch.dtype, None],
        kv_data_type: Union[str, torch.dtype, None],
        sm_scale: Optional[float],
        seq_lens: Optional[torch.Tensor],
    ) -> _Plan:
        kv = _host_ints(kv_indptr, "kv_indptr")
        lasts = _host_ints(last_page_len, "last_page_len")
        if indices.dtype != torch.int32:
            raise ValueError(f"indices must have dtype torch.int32, got {indices.dtype}")
        if len(kv) != len(lasts) + 1 or len(qo_indptr) != len(kv):
            raise ValueError("The length of qo_indptr and kv_indptr should be the same.")
        for name, ptr in (("qo_indptr", qo_indptr), ("kv_indptr", kv)):
            if ptr[0] != 0 or any(b < a for a, b in zip(ptr, ptr[1:])):
                raise ValueError(f"{name} must start at 0 and never decrease: {ptr}")
        if kv[-1] != indices.numel():
            raise ValueError(f"kv_indptr[-1] = {kv[-1]} but there are {indices.numel()} indices")
        if any(not 1 <= n <= page_size for b, n in enumerate(lasts) if kv[b + 1] > kv[b]):
            raise ValueError(f"last_page_len must be in 1..{page_size}: {lasts}")
        if num_qo_heads % num_kv_heads:
            raise ValueError(f"{num_qo_heads} query heads do not share {num_kv_heads} kv heads")
        if pos_encoding_mode != "NONE":
            raise NotImplementedError("the stand-in applies no position encoding")
        q_dtype = _dtype(q_data_type, torch.float16)
        kv_dtype = _dtype(kv_data_type, q_dtype)
        check_kernel_dtype(q_dtype, self.device, "FlashInfer")
        plan = _Plan(
            qo_indptr=list(qo_indptr),
            kv_indptr=kv,
            indices=indices.to(self.device).clone(),  # plan's own copy
            last_page_len=lasts,
            num_qo_heads=num_qo_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            page_size=page_size,
            q_dtype=q_dtype,
            kv_dtype=kv_dtype,
            sm_scale=sm_scale if sm_scale is not None else 1.0 / math.sqrt(head_dim),
        )
        for b in range(len(lasts)):
            num_q, num_k = qo_indptr[b + 1] - qo_indptr[b], plan.kv_len(b)
            if num_q > num_k:
                raise ValueError(f"request {b}: {num_q} queries but only {num_k} keys")
        if seq_lens is not None and seq_lens.tolist() != [
            plan.kv_len(b) for b in range(len(lasts))
        ]:
            raise ValueError("seq_lens disagrees with kv_indptr and last_page_len")
        return plan

    def run(
        self,
        q: torch.Tensor,
        paged_kv_cache: Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]],
        *,
        out: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        result = torch.empty_like(q) if out is None else out  # allocated where a graph sees it
        with torch._C.DisableTorchFunction():  # a kernel: opaque to the graph emulation
            return self._run(q, paged_kv_cache, result)

    def _planned(self) -> _Plan:
        plan = self._plan
        if plan is None:
            raise RuntimeError(f"{type(self).__name__}.run() before plan()")
        return plan

    def _run(
        self,
        q: torch.Tensor,
        paged_kv_cache: Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]],
        result: torch.Tensor,
    ) -> torch.Tensor:
        plan = self._planned()
        if not isinstance(paged_kv_cache, tuple):
            raise NotImplementedError("the stand-in takes the cache as a (k_cache, v_cache) pair")
        k_cache, v_cache = paged_kv_cache
        if q.dtype != plan.q_dtype:
            raise ValueError(
                f"The dtype of q {q.dtype} does not match the q_data_type {plan.q_dtype} "
                "specified in plan function."
            )
        if k_cache.dtype != plan.kv_dtype:
            raise ValueError(
                f"The dtype of k {k_cache.dtype} does not match the kv_data_type "
                f"{plan.kv_dtype} specified in plan function."
            )
        expected_q = (plan.qo_indptr[-1], plan.num_qo_heads, plan.head_dim)
        if tuple(q.shape) != expected_q:
            raise ValueError(f"q has shape {tuple(q.shape)}, the plan says {expected_q}")
        pages_shape = (plan.page_size, plan.num_kv_heads, plan.head_dim)
        for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
            if cache.dim() != 4 or tuple(cache.shape[1:]) != pages_shape:
                raise ValueError(
                    f"{name} has shape {tuple(cache.shape)}, the plan says [pages, *{pages_shape}]"
                )
        if plan.indices.numel() and int(plan.indices.max()) >= k_cache.shape[0]:
            raise IndexError(f"a page index is beyond the cache's {k_cache.shape[0]} pages")
        for b in range(len(plan.last_page_len)):
            rows = slice(plan.qo_indptr[b], plan.qo_indptr[b + 1])
            pages = plan.indices[plan.kv_indptr[b] : plan.kv_indptr[b + 1]].long()
            num_k = plan.kv_len(b)
            keys = k_cache[pages].flatten(0, 1)[:num_k]  # [pages * page_size, kv heads, d]
            values = v_cache[pages].flatten(0, 1)[:num_k]
            result[rows] = attend(q[rows], keys, values, plan.sm_scale)
        return result


class BatchPrefillWithPagedKVCacheWrapper(_Wrapper):
    """Many queries per request (a prompt, a chunk), keys from the paged cache."""

    def plan(
        self,
        qo_indptr: torch.Tensor,
        paged_kv_indptr: torch.Tensor,
        paged_kv_indices: torch.Tensor,
        paged_kv_last_page_len: torch.Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim_qk: int,
        page_size: int,
        causal: bool = False,
        pos_encoding_mode: str = "NONE",
        sm_scale: Optional[float] = None,
        q_data_type: Union[str, torch.dtype] = "float16",
        kv_data_type: Optional[Union[str, torch.dtype]] = None,
        non_blocking: bool = True,
        seq_lens: Optional[torch.Tensor] = None,
    ) -> None:
        if not causal:
            raise NotImplementedError("the stand-in models causal attention only")
        qo = _host_ints(qo_indptr, "qo_indptr")
        self._plan = None  # a failed plan leaves nothing usable behind
        self._plan = self._make_plan(
            qo, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads,
            num_kv_heads, head_dim_qk, page_size, pos_encoding_mode, q_data_type, kv_data_type,
            sm_scale, seq_lens,
        )  # fmt: skip


class BatchDecodeWithPagedKVCacheWrapper(_Wrapper):
    """One query per request against its paged keys. With `use_tensor_cores` the real library
    runs its prefill kernel instead (faster when several query heads share a kv head); the
    arithmetic is the same."""

    def __init__(
        self,
        float_workspace_buffer: torch.Tensor,
        kv_layout: str = "NHD",
        use_cuda_graph: bool = False,
        use_tensor_cores: bool = False,
        paged_kv_indptr_buffer: Optional[torch.Tensor] = None,
        paged_kv_indices_buffer: Optional[torch.Tensor] = None,
        paged_kv_last_page_len_buffer: Optional[torch.Tensor] = None,
        backend: str = "auto",
    ) -> None:
        super().__init__(float_workspace_buffer, kv_layout, backend)
        self._use_tensor_cores = use_tensor_cores
        self._use_cuda_graph = use_cuda_graph
        self._fixed_batch_size = 0
        if use_cuda_graph:
            buffers = (
                paged_kv_indptr_buffer,
                paged_kv_indices_buffer,
                paged_kv_last_page_len_buffer,
            )
            names = (
                "paged_kv_indptr_buffer",
                "paged_kv_indices_buffer",
                "paged_kv_last_page_len_buffer",
            )
            for name, buffer in zip(names, buffers):
                if not torch.is_tensor(buffer):
                    raise ValueError(f"{name} should be a torch.Tensor in cudagraph mode")
                if buffer.dtype != torch.int32 or buffer.device != self.device:  # type: ignore[union-attr]
                    raise ValueError(f"{name} must be int32 on {self.device}")
            self._fixed_batch_size = len(paged_kv_last_page_len_buffer)  # type: ignore[arg-type]
            if len(paged_kv_indptr_buffer) != self._fixed_batch_size + 1:  # type: ignore[arg-type]
                raise ValueError("The size of paged_kv_indptr_buffer should be batch_size + 1")
        self._paged_kv_indptr_buf = paged_kv_indptr_buffer
        self._paged_kv_indices_buf = paged_kv_indices_buffer
        self._paged_kv_last_page_len_buf = paged_kv_last_page_len_buffer

    @property
    def is_cuda_graph_enabled(self) -> bool:
        return self._use_cuda_graph

    @property
    def use_tensor_cores(self) -> bool:
        return self._use_tensor_cores

    def plan(
        self,
        indptr: torch.Tensor,
        indices: torch.Tensor,
        last_page_len: torch.Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
        pos_encoding_mode: str = "NONE",
        q_data_type: Optional[Union[str, torch.dtype]] = "float16",
        kv_data_type: Optional[Union[str, torch.dtype]] = None,
        data_type: Optional[Union[str, torch.dtype]] = None,
        sm_scale: Optional[float] = None,
        non_blocking: bool = True,
        seq_lens: Optional[torch.Tensor] = None,
    ) -> None:
        if data_type is not None:  # the older name of both; the newer ones win
            q_data_type = data_type if q_data_type is None else q_data_type
            kv_data_type = data_type if kv_data_type is None else kv_data_type
        batch_size = len(last_page_len)
        self._plan = None
        plan = self._make_plan(
            list(range(batch_size + 1)), indptr, indices, last_page_len, num_qo_heads,
            num_kv_heads, head_dim, page_size, pos_encoding_mode, q_data_type, kv_data_type,
            sm_scale, seq_lens,
        )  # fmt: skip
        if self._use_cuda_graph:  # into the buffers the captured kernels read
            assert self._paged_kv_indices_buf is not None
            if batch_size != self._fixed_batch_size:
                raise ValueError(
                    f"The batch size should be fixed in cudagraph mode, the runtime batch size "
                    f"{batch_size} mismatches the batch size set during initialization "
                    f"{self._fixed_batch_size}"
                )
            if len(indices) > len(self._paged_kv_indices_buf):
                raise ValueError(
                    "The size of indices should be less than or equal to the allocated buffer"
                )
            self._paged_kv_indptr_buf.copy_(indptr)  # type: ignore[union-attr]
            self._paged_kv_last_page_len_buf.copy_(last_page_len)  # type: ignore[union-attr]
            self._paged_kv_indices_buf[: len(indices)].copy_(indices)
        self._plan = plan

    def _planned(self) -> _Plan:
        """In cudagraph mode the offsets, indices and last page lengths are read from the
        buffers at every run, whatever they hold by then; the rest is the plan's."""
        plan = super()._planned()
        if not self._use_cuda_graph:
            return plan
        kv_indptr = _host_ints(self._paged_kv_indptr_buf, "paged_kv_indptr_buffer")  # type: ignore[arg-type]
        return dataclasses.replace(
            plan,
            kv_indptr=kv_indptr,
            indices=self._paged_kv_indices_buf[: kv_indptr[-1]],  # type: ignore[index]
            last_page_len=_host_ints(self._paged_kv_last_page_len_buf, "last_page_len_buffer"),  # type: ignore[arg-type]
        )


class CUDAGraphBatchDecodeWithPagedKVCacheWrapper(BatchDecodeWithPagedKVCacheWrapper):
    """The decode wrapper for CUDA graphs: a fixed batch size, and buffers given once."""

    def __init__(
        self,
        workspace_buffer: torch.Tensor,
        indptr_buffer: torch.Tensor,
        indices_buffer: torch.Tensor,
        last_page_len_buffer: torch.Tensor,
        kv_layout: str = "NHD",
        use_tensor_cores: bool = False,
    ) -> None:
        super().__init__(
            workspace_buffer,
            kv_layout,
            use_cuda_graph=True,
            use_tensor_cores=use_tensor_cores,
            paged_kv_indptr_buffer=indptr_buffer,
            paged_kv_indices_buffer=indices_buffer,
            paged_kv_last_page_len_buffer=last_page_len_buffer,
        )


__all__ = [
    "BatchDecodeWithPagedKVCacheWrapper",
    "BatchPrefillWithPagedKVCacheWrapper",
    "CUDAGraphBatchDecodeWithPagedKVCacheWrapper",
]
