"""Choosing the next token of every request in a batch, each with its own parameters.

Greedy requests take the largest logit. The others sample from softmax(logits / temperature),
restricted first to the `top_k` most likely tokens, then to the smallest set of those whose
probabilities add up to `top_p` (the nucleus), renormalised. One batch may mix all of them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, List, Tuple

import torch

from minisgl.env import ENV
from minisgl.utils import nvtx_annotate
from minisgl.utils.device import host_tensor, to_device

if TYPE_CHECKING:
    from minisgl.core import Batch, Req

MIN_TEMPERATURE = 1e-6  # a greedy request's row in a batch that also samples
MIN_TOP_P = 1e-6


@dataclass
class BatchSamplingArgs:
    temperatures: torch.Tensor | None  # [bs]; None when every request is greedy
    top_k: torch.Tensor | None = None  # [bs] int; None when no request filters by top-k
    top_p: torch.Tensor | None = None  # [bs] float; None when no request filters by top-p
    any_greedy: bool = False  # some rows are greedy (their argmax replaces the draw)


def make_device_tensor(data: List, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return to_device(host_tensor(data, dtype, device), device)


def sample_impl(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """One token per row of logits [bs, vocab]."""
    probs = torch.softmax(logits / temperatures[:, None], dim=-1)
    if top_k is not None or top_p is not None:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        rank = torch.arange(probs.shape[-1], device=probs.device)[None, :]
        keep = torch.ones_like(sorted_probs, dtype=torch.bool)
        if top_k is not None:
            keep &= rank < top_k[:, None]
            sorted_probs = sorted_probs * keep
            sorted_probs = sorted_probs / sorted_probs.sum(dim=-1, keepdim=True)
        if top_p is not None:
            before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass of the more likely tokens
            keep &= before < top_p[:, None]  # the most likely token is always kept
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs * keep)
    return torch.multinomial(probs, num_samples=1, generator=generator).view(-1)


@functools.cache
def _flashinfer_sampling() -> ModuleType | None:
    try:
        import flashinfer.sampling as sampling
    except ImportError:
        return None
    return sampling if hasattr(sampling, "sampling_from_probs") else None


def sampling_kernels(logits: torch.Tensor) -> ModuleType | None:
    """FlashInfer's sampling module where it applies: logits on a GPU, FlashInfer installed,
    MINISGL_DISABLE_CUSTOM_KERNELS not set. Elsewhere the PyTorch code above samples."""
    if not logits.is_cuda or ENV.DISABLE_CUSTOM_KERNELS:
        return None
    return _flashinfer_sampling()


def gumbel_kernel_applies(logits: torch.Tensor) -> bool:
    """The Gumbel-max kernel samples logits on a GPU, unless MINISGL_GUMBEL_SAMPLING=0 or
    MINISGL_DISABLE_CUSTOM_KERNELS=1. It knows no top-k or top-p: the caller checks those."""
    return logits.is_cuda and bool(ENV.GUMBEL_SAMPLING) and not ENV.DISABLE_CUSTOM_KERNELS


def sample_gumbel_max(logits: torch.Tensor, temperatures: torch.Tensor) -> torch.Tensor:
    """Every row in one pass over the logits as they are (bfloat16 in the engine): the
    sampled rows drawn from softmax(logits / temperature), the greedy rows (temperature
    MIN_TEMPERATURE) their argmax. The seed comes from torch's generator, so
    torch.manual_seed repeats a run's draws."""
    from minisgl.kernel.triton.sample import gumbel_max_sample

    seed = int(torch.randint(1 << 31, ()))
    return gumbel_max_sample(logits, temperatures, MIN_TEMPERATURE, seed)


def sample_flashinfer(
    sampling: ModuleType,
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
) -> torch.Tensor:
    """The same draw with FlashInfer's kernels, as upstream samples: a softmax that divides by
    the temperature in the same pass, then one kernel that draws from the probabilities (with
    the top-k / top-p filters applied inside it). The PyTorch code above makes several passes
    over the [bs, vocab] array, each a kernel launched from the host."""
    probs = sampling.softmax(logits, temperatures)
    if top_k is None and top_p is None:
        return sampling.sampling_from_probs(probs)
    if top_p is None:
        return sampling.top_k_sampling_from_probs(probs, top_k)
    if top_k is None:
        return sampling.top_p_sampling_from_probs(probs, top_p)
    return sampling.top_k_top_p_sampling_from_probs(probs, top_k, top_p)


@dataclass
class Sampler:
    device: torch.device
    vocab_size: int
    # the requests of the last batch prepared, and their arguments
    _last: Tuple[List[Req], BatchSamplingArgs] | None = field(default=None, init=False, repr=False)

    def prepare(self, batch: Batch) -> BatchSamplingArgs:
        """Gather the batch's sampling parameters into tensors (on the device), once. Most
        decode batches hold the same requests as the one before (requests join and leave only
        now and then), and then get its tensors again: the sampler only reads them."""
        if self._last is not None and self._last[0] == batch.reqs:  # the same Req objects
            return self._last[1]
        args = self._prepare(batch.reqs)
        self._last = (list(batch.reqs), args)
        return args

    def _prepare(self, reqs: List[Req]) -> BatchSamplingArgs:
        params = [r.sampling_params for r in reqs]
        if all(p.is_greedy for p in params):
            return BatchSamplingArgs(temperatures=None)
        temperatures = [
            MIN_TEMPERATURE if p.is_greedy else max(p.temperature, MIN_TEMPERATURE) for p in params
        ]
        top_ks = [p.top_k if p.top_k >= 1 else self.vocab_size for p in params]
        top_ps = [min(max(p.top_p, MIN_TOP_P), 1.0) for p in params]
        args = BatchSamplingArgs(
            make_device_tensor(temperatures, torch.float32, self.device),
            any_greedy=any(p.is_greedy for p in params),
        )
        if any(k < self.vocab_size for k in top_ks):
            args.top_k = make_device_tensor(top_ks, torch.int32, self.device)
        if any(p < 1.0 for p in top_ps):
            args.top_p = make_device_tensor(top_ps, torch.float32, self.device)
        return args

    @nvtx_annotate("Sampler")
    def sample(self, logits: torch.Tensor, args: BatchSamplingArgs) -> torch.Tensor:
        if args.temperatures is None:
            return torch.argmax(logits, dim=-1)
        if args.top_k is None and args.top_p is None and gumbel_kernel_applies(logits):
            return sample_gumbel_max(logits, args.temperatures)
        logits = logits.float()
        sampling = sampling_kernels(logits)
        if sampling is not None:
            sampled = sample_flashinfer(sampling, logits, args.temperatures, args.top_k, args.top_p)
        else:
            sampled = sample_impl(logits, args.temperatures, args.top_k, args.top_p)
        if not args.any_greedy:
            return sampled
        # greedy rows of a mixed batch: the argmax itself, not a draw at a tiny temperature
        greedy = torch.argmax(logits, dim=-1)
        return torch.where(args.temperatures <= MIN_TEMPERATURE, greedy, sampled)
