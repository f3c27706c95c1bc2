"""Stand-ins for the GPU attention libraries of chapter 17, and the arithmetic they share.

FlashInfer needs an NVIDIA GPU, and FlashAttention 3 (upstream takes it from `sgl_kernel`) an
H100 or newer. So that a laptop runs the engine's FlashInfer and FlashAttention backends, the
folder `standins/` holds two small packages with the same names and the same calls,
`flashinfer` and `sgl_kernel.flash_attn`. `use_standins()` puts that folder on the import path
for each library that is not installed; the engine's code is the same either way.

A stand-in checks what the real library checks (argument types, shapes, the order of calls)
and refuses what it cannot know: FlashInfer's `run` before its `plan`, a run whose query does
not have the shape that was planned, indices that are not int32. It computes with the plain
arithmetic below, in float32, one request at a time.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Dict

import torch

STANDINS = Path(__file__).resolve().parent / "standins"
LIBRARIES = {"flashinfer": "flashinfer", "flash_attn": "sgl_kernel"}  # what -> module to import


def use_standins(always: bool = False) -> Dict[str, bool]:
    """Make each GPU attention library importable: the real one if it is installed, else its
    stand-in (`always`: the stand-ins, even where the real ones are installed, as the tests
    want, which run on the CPU). Returns, per library, whether it is the stand-in. Call it
    before the engine imports the library (processes started later inherit the path)."""
    if always:
        if str(STANDINS) in sys.path:
            sys.path.remove(str(STANDINS))
        sys.path.insert(0, str(STANDINS))  # before everything else: the stand-ins win
        for module in [m for m in sys.modules if m.split(".")[0] in LIBRARIES.values()]:
            if not _is_standin(module.split(".")[0]):
                del sys.modules[module]
    missing = [m for m in LIBRARIES.values() if importlib.util.find_spec(m) is None]
    if missing and str(STANDINS) not in sys.path:
        sys.path.append(str(STANDINS))  # after everything else: a real library still wins
    return {name: _is_standin(module) for name, module in LIBRARIES.items()}


def _is_standin(module: str) -> bool:
    spec = importlib.util.find_spec(module)
    return spec is not None and spec.origin is not None and STANDINS in Path(spec.origin).parents


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """One request's causal attention: q [new tokens, heads, d] against k, v [keys, kv heads, d],
    the queries being the last len(q) of the keys' positions (a decode step, a prefill, or a
    chunk after a cached prefix). Query head h reads key/value head h // (heads / kv heads)."""
    num_q, num_k = q.shape[0], k.shape[0]
    group = q.shape[1] // k.shape[1]
    keys = k.float().repeat_interleave(group, dim=1)
    values = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), keys) * scale
    sees = torch.arange(num_k, device=q.device)[None, :] <= (
        torch.arange(num_q, device=q.device)[:, None] + (num_k - num_q)
    )
    scores = scores.masked_fill(~sees, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), values).to(q.dtype)


def check_kernel_dtype(dtype: torch.dtype, device: torch.device, library: str) -> None:
    """The real kernels exist for 16-bit types only. On a CPU the stand-in also computes in
    float32, so that the book's CPU runs keep their exact comparison with transformers."""
    allowed = (torch.float16, torch.bfloat16) + ((torch.float32,) if device.type == "cpu" else ())
    if dtype not in allowed:
        raise ValueError(f"{library} has no kernels for {dtype} on {device.type}")
