"""Chapter 19: CUDA kernels.

The engine's own kernels (minisgl/kernel/csrc/): the KV store, the embedding lookup (with a
tensor-parallel rank's vocabulary range), the radix cache's key comparison, and a block
reduction (argmax); and the KV store once more in Triton. On a GPU nvcc and Triton compile them;
on a CPU the host compiler builds the same CUDA files against minisgl/sim.h, a simulator that
runs them thread by thread, and Triton runs in its interpreter.

This main holds each kernel to its PyTorch reference, shows two bugs the simulator exposes (a
block's index left out, a barrier left out), then runs the engine, whose KV store, embedding
and radix cache now call the kernels, and compares every token with transformers, counting the
kernel calls so that they are seen to run.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("LOG_LEVEL", "WARNING")
import minisgl.kernel as kernel  # noqa: E402
from minisgl.core import SamplingParams  # noqa: E402
from minisgl.kernel.index import indexing_reference  # noqa: E402
from minisgl.kernel.radix import compare_key_reference  # noqa: E402
from minisgl.kernel.store import store_cache_reference  # noqa: E402
from minisgl.kernel.triton.store import store_cache_triton  # noqa: E402
from minisgl.kernel.utils import KERNEL_PATH, load_source  # noqa: E402
from minisgl.llm import LLM  # noqa: E402
from tools.models import ensure_model  # noqa: E402
from tools.parity import book_device, book_dtype, eos_ids, run_parity  # noqa: E402

DEVICE = book_device()
NEW_TOKENS = 24


# ----------------------------------------------------------------- kernels against PyTorch
def kv_batch(tokens: int, heads: int, head_dim: int, dtype: torch.dtype) -> Tuple:
    """Empty caches of 64 slots, and k, v as views into one qkv output (strided rows)."""
    g = torch.Generator().manual_seed(tokens)
    width = heads * head_dim
    qkv = torch.randn(tokens, 4 * width, generator=g).to(DEVICE, dtype)
    k, v = qkv[:, 2 * width : 3 * width], qkv[:, 3 * width :]
    slots = torch.randperm(64, generator=g)[:tokens].to(DEVICE, torch.int32)
    caches = [torch.zeros(64, heads, head_dim, device=DEVICE, dtype=dtype) for _ in range(2)]
    return caches, slots, k, v


def store_equal(store: Callable, tokens: int, heads: int, head_dim: int, dtype) -> bool:
    (kc, vc), slots, k, v = kv_batch(tokens, heads, head_dim, dtype)
    (kr, vr), *_ = kv_batch(tokens, heads, head_dim, dtype)
    store(kc, vc, slots, k, v)
    store_cache_reference(kr, vr, slots, k, v)
    return torch.equal(kc, kr) and torch.equal(vc, vr)


def index_equal(vocab: int, width: int, vocab_range: Tuple[int, int] | None) -> bool:
    g = torch.Generator().manual_seed(width)
    rows = vocab if vocab_range is None else vocab_range[1]
    weights = torch.randn(rows, width, generator=g).to(DEVICE)
    ids = torch.randint(0, vocab, (37,), generator=g).to(DEVICE)
    ours = kernel.indexing(weights, ids, vocab_range=vocab_range)
    return torch.equal(ours, indexing_reference(weights, ids, vocab_range=vocab_range))


def compare_key_equal() -> bool:
    a = torch.arange(300, dtype=torch.int32)
    cases = [(a, a.clone()), (a, a[:120].clone()), (a, torch.cat([a[:77], a[:5]]))]
    return all(kernel.fast_compare_key(x, y) == compare_key_reference(x, y) for x, y in cases)


def argmax_equal() -> bool:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(9, 1000, generator=g)
    logits[3] = 0.0  # a row of ties: the first index wins
    logits[5, 10] = logits[5, 900] = 50.0
    logits = logits.to(DEVICE)
    return torch.equal(kernel.argmax(logits), torch.argmax(logits, dim=-1))


def check_kernels() -> bool:
    where = "nvcc, on the GPU" if DEVICE == "cuda" else "the host compiler and minisgl/sim.h"
    print(
        f"CUDA kernels built by {where}; Triton {'compiled' if DEVICE == 'cuda' else 'interpreted'}"
    )
    rows: List[Tuple[str, str, bool]] = [
        ("store_cache", "10 tokens, 2 x 16 float32 (128 B rows)",
         store_equal(kernel.store_cache, 10, 2, 16, torch.float32)),
        ("store_cache", "37 tokens, 4 x 64 float16 (512 B rows)",
         store_equal(kernel.store_cache, 37, 4, 64, torch.float16)),
        ("store (Triton)", "37 tokens, 4 x 64 float16",
         store_equal(store_cache_triton, 37, 4, 64, torch.float16)),
        ("indexing", "37 ids of 1000, rows of 64 float32", index_equal(1000, 64, None)),
        ("indexing", "rows of 1024 float32: 4 warps a row", index_equal(1000, 1024, None)),
        ("indexing", "vocabulary range (500, 250)", index_equal(1000, 64, (500, 250))),
        ("fast_compare_key", "equal, a prefix, a difference at 77", compare_key_equal()),
        ("argmax", "9 rows of 1000, ties to the first", argmax_equal()),
    ]  # fmt: skip
    print(f"{'kernel':17s} {'case':40s} {'equal to PyTorch':>16s}")
    for name, case, equal in rows:
        print(f"{name:17s} {case:40s} {'yes' if equal else 'NO':>16s}")
    return all(equal for *_, equal in rows)


# ----------------------------------------------------------------- two bugs
def broken(file: str, correct: str, wrong: str, wrapper: str):
    """The kernel file with one piece of text replaced, built for the simulator."""
    source = (KERNEL_PATH / "jit" / file).read_text()
    assert source.count(correct) >= 1, f"{file} no longer has {correct!r}"
    return load_source(f"broken_{Path(file).stem}", source.replace(correct, wrong), wrapper)


def show_bugs() -> bool:
    """Each bug is built for the simulator only: on a GPU it would race, or write out of
    bounds, and give wrong answers only some of the time."""
    print("- store.cu without blockIdx.x in the warp's number (every block does block 0's rows):")
    store = broken(
        "store.cu", "+ blockIdx.x * kWarpsPerBlock", "",
        "TVM_FFI_DLL_EXPORT_TYPED_FUNC(launch, (StoreKernel<128, 16, 128>::run));",
    )  # fmt: skip
    (kc, vc), slots, k, v = kv_batch(10, 2, 16, torch.float32)
    (kr, vr), *_ = kv_batch(10, 2, 16, torch.float32)
    store.launch(kc.view(64, -1).cpu(), vc.view(64, -1).cpu(), slots.cpu(), k.cpu(), v.cpu())
    store_cache_reference(kr, vr, slots, k, v)
    missing = int((kc.cpu() != kr.cpu()).flatten(1).any(1).sum())
    print(f"    {missing} of 10 tokens' keys are not in the cache (the rows of warps 4-9)")
    print("- argmax.cu without its __syncthreads() (threads read shared memory not yet written):")
    argmax = broken(
        "argmax.cu", "__syncthreads();", "",
        "TVM_FFI_DLL_EXPORT_TYPED_FUNC(launch, (ArgmaxKernel<128>::run));",
    )  # fmt: skip
    logits = torch.randn(9, 1000, generator=torch.Generator().manual_seed(0))
    out = torch.empty(9, dtype=torch.int64)
    argmax.launch(logits, out)
    wrong = int((out != torch.argmax(logits, dim=-1)).sum())
    print(f"    {wrong} of 9 rows get the wrong token")
    return missing > 0 and wrong > 0


# ----------------------------------------------------------------- the engine
CALLS: Dict[str, int] = {"store_cache": 0, "indexing": 0, "fast_compare_key": 0}


def count_calls() -> None:
    """Wrap the three kernels the engine calls (looked up in minisgl.kernel at each call)."""
    for name in CALLS:
        inner = getattr(kernel, name)

        def counted(*args, _inner=inner, _name=name, **kwargs):  # type: ignore[no-untyped-def]
            CALLS[_name] += 1
            return _inner(*args, **kwargs)

        setattr(kernel, name, counted)


def generate(name: str, prompts: List[List[int]], n: int) -> List[List[int]]:
    with LLM(str(ensure_model(name)), dtype=book_dtype(), page_size=4, num_page_override=256,
             max_running_req=8, cuda_graph_max_bs=0) as llm:  # fmt: skip
        # the prompts share their chat template's first tokens: each one walks the radix tree
        outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=n))
    eos = eos_ids(name)[:1]  # LLM.generate leaves out the EOS that ended a request
    return [o["token_ids"] + (eos if len(o["token_ids"]) < n else []) for o in outputs]


def main() -> int:
    print("== each kernel against its PyTorch reference")
    ok = check_kernels()
    if DEVICE == "cpu":
        print("\n== two bugs, built for the simulator")
        ok &= show_bugs()
    print("\n== the engine on its kernels, every token against transformers")
    count_calls()
    summary = run_parity(generate, max_new_tokens=NEW_TOKENS, show_text=False)
    print("kernel calls: " + ", ".join(f"{name} {n}" for name, n in CALLS.items()))
    return 0 if ok and summary.ok and all(CALLS.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
