"""Chapter 17: GPU attention.

Two more attention backends, each wrapping a GPU library the way upstream does: "fi"
(FlashInfer: plan once per batch, run per layer) and "fa" (FlashAttention 3 through
sgl-kernel: one call per layer over the paged cache), and the hybrid "fa,fi" (FlashAttention
for prefill batches, FlashInfer for decode), upstream's choice on an H100 or H200.

Where a library is not installed, its stand-in (examples/helpers/gpu_libraries.py) takes its
place: same calls, same checks, plain arithmetic. This main shows which one each backend gets
and what the stand-in refuses, then generates with every backend that has kernels for float32
on this machine and compares every token with transformers. On a GPU it also compares, in
bfloat16 (the GPU libraries' type), each backend's logits with the torch backend's and with
transformers', position by position.
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
from pathlib import Path
from typing import Dict, List, Tuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("LOG_LEVEL", "WARNING")
from examples.helpers.checkpoint import build  # noqa: E402
from examples.helpers.gpu_libraries import STANDINS, use_standins  # noqa: E402
from examples.helpers.paging import PageAllocator, prepare_batch  # noqa: E402
from minisgl.attention import create_attention_backend  # noqa: E402
from minisgl.core import Context, Req, SamplingParams, clear_global_ctx, set_global_ctx  # noqa: E402
from minisgl.kvcache import create_kvcache_pool  # noqa: E402
from minisgl.llm import LLM  # noqa: E402
from tools.models import PARITY_MODELS, TINY_MODELS, ensure_model  # noqa: E402
from tools.parity import (  # noqa: E402
    Case,
    book_device,
    book_dtype,
    build_prompts,
    eos_ids,
    run_parity_cases,
)

BACKENDS = ["torch", "fi", "fa", "fa,fi"]  # "fa,fi": FlashAttention prefill, FlashInfer decode
NEW_TOKENS = 32
PAGE_SIZE = 4  # FlashInfer sees pages of one slot, FlashAttention pages of 4: both conventions


def show_libraries() -> Dict[str, bool]:
    standin = use_standins()
    for name, module in (("FlashInfer", "flashinfer"), ("FlashAttention", "flash_attn")):
        where = "the book's stand-in" if standin[module] else "installed"
        print(f"{name:15s} {where}")
    return standin


def load_standin(name: str):
    """The stand-in module itself, even where the real library is installed."""
    spec = importlib.util.spec_from_file_location(
        f"standin_{name}", STANDINS / name / "__init__.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def show_what_the_standin_refuses() -> None:
    """Three mistakes an engine can make with FlashInfer, each caught on the CPU."""
    fi = load_standin("flashinfer")
    workspace = torch.empty(1024, dtype=torch.uint8)
    k_cache = v_cache = torch.zeros(16, 1, 2, 8)  # 16 slots, 2 kv heads of 8
    q = torch.zeros(5, 4, 8)  # 5 query tokens, 4 heads
    plan = dict(
        qo_indptr=torch.tensor([0, 3, 5], dtype=torch.int32),
        paged_kv_indptr=torch.tensor([0, 3, 7], dtype=torch.int32),
        paged_kv_indices=torch.tensor([0, 1, 2, 8, 9, 10, 11], dtype=torch.int32),
        paged_kv_last_page_len=torch.ones(2, dtype=torch.int32),
        num_qo_heads=4, num_kv_heads=2, head_dim_qk=8, page_size=1, causal=True,
        q_data_type=torch.float32,
    )  # fmt: skip
    mistakes = {
        "run before plan": lambda w: w.run(q, (k_cache, v_cache)),
        "int64 indices": lambda w: w.plan(
            **{**plan, "paged_kv_indices": plan["paged_kv_indices"].long()}
        ),
        "a query that was not planned": lambda w: (
            w.plan(**plan),
            w.run(q[:4], (k_cache, v_cache)),
        ),
    }
    for what, call in mistakes.items():
        wrapper = fi.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
        try:
            call(wrapper)
            print(f"  {what}: accepted (the stand-in should have refused it)")
        except (RuntimeError, ValueError) as e:
            print(f"  {what}: {type(e).__name__}: {e}")
    wrapper = fi.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
    wrapper.plan(**plan)
    print(f"  planned, then run: output {tuple(wrapper.run(q, (k_cache, v_cache)).shape)}")


def float32_backends() -> List[str]:
    """The backends with float32 kernels here: the libraries compute in 16-bit types only
    (their stand-ins accept float32 on the CPU)."""
    return BACKENDS if book_device() == "cpu" else ["torch"]


def generate(name: str, cases: List[Case], run: int = 0) -> List[List[int]]:
    backend = float32_backends()[run]
    with LLM(
        str(ensure_model(name)), dtype=book_dtype(), attention_backend=backend,
        page_size=PAGE_SIZE, num_page_override=256, max_running_req=8,
    ) as llm:  # fmt: skip
        params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS)
        outputs = llm.generate([c.prompt for c in cases], params)
    eos = eos_ids(name)[:1]  # LLM.generate leaves out the EOS that ended a request
    return [o["token_ids"] + (eos if len(o["token_ids"]) < NEW_TOKENS else []) for o in outputs]


# ------------------------------------------------------------------- bfloat16, on a GPU
def forced_logits(name: str, backend: str, sequences: List[Tuple[List[int], List[int]]]):
    """Each (prompt, continuation): our logits at every continuation position, the
    continuation fed in whatever we would have chosen (teacher forcing). [n, vocab] each."""
    clear_global_ctx()
    ctx = Context(page_size=PAGE_SIZE)
    set_global_ctx(ctx)
    config, model, _ = build(name)
    longest = max(len(p) + len(c) for p, c in sequences)
    pages = len(sequences) * (longest // PAGE_SIZE + 2)
    device = torch.device(book_device())
    ctx.kv_cache = create_kvcache_pool(config, pages, PAGE_SIZE, book_dtype(), device)
    ctx.page_table = torch.zeros(len(sequences), longest + 1, dtype=torch.int32, device=device)
    ctx.attn_backend = create_attention_backend(backend, config)
    allocator = PageAllocator(pages, PAGE_SIZE, ctx.page_table)
    reqs = [
        Req(torch.tensor(p, dtype=torch.int32), i, 0, len(c), i, SamplingParams(), None)  # type: ignore[arg-type]
        for i, (p, c) in enumerate(sequences)
    ]
    rows: List[List[torch.Tensor]] = [[] for _ in sequences]
    for step in range(max(len(c) for _, c in sequences)):
        batch = prepare_batch(reqs, "prefill" if step == 0 else "decode", allocator)
        ctx.attn_backend.prepare_metadata(batch)
        with torch.inference_mode(), ctx.forward_batch(batch):
            logits = model.forward().float()
        for i, (req, (_, cont)) in enumerate(zip(reqs, sequences)):
            rows[i].append(logits[i])
            req.complete_one()
            req.append_host(torch.tensor([cont[step]], dtype=torch.int32))
    clear_global_ctx()
    return [torch.stack(r) for r in rows]


TABLE = [  # the bfloat16 comparison as a Markdown table (--bf16-table)
    "| model | backend | tokens | equal to transformers' | max abs diff, torch backend "
    "| max abs diff, transformers | tolerance | different tokens (prompt:position margin) |",
    "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |",
]


def bf16_step(x: float) -> float:
    """The distance between neighbouring bfloat16 numbers around x (8 significant bits)."""
    return 2.0 ** (math.floor(math.log2(abs(x))) - 7)


def compare_in_bfloat16() -> bool:
    """Every backend's logits against the torch backend's and transformers', at every position
    of transformers' greedy continuation. The tolerance is two bfloat16 steps at the largest
    logit: each backend rounds its own way, and a token may differ only where transformers'
    top two logits are that close (a near-tie)."""
    from transformers import AutoModelForCausalLM

    os.environ["MINISGL_BOOK_DTYPE"] = "bfloat16"
    print(
        f"{'model':14s} {'backend':7s} {'tokens':>6s} {'equal':>5s} {'max|d| torch':>12s} "
        f"{'max|d| HF':>9s} {'tolerance':>9s}  near-ties (prompt:position margin)"
    )
    ok = True
    for name in [m for m in PARITY_MODELS if m in TINY_MODELS]:
        hf = AutoModelForCausalLM.from_pretrained(ensure_model(name), dtype=torch.bfloat16).cuda()
        sequences, theirs = [], []
        for prompt in build_prompts(name):
            with torch.inference_mode():
                out = hf.generate(
                    torch.tensor([prompt]).cuda(), max_new_tokens=NEW_TOKENS,
                    min_new_tokens=NEW_TOKENS, do_sample=False,
                )  # fmt: skip
                full = hf(out[:, :-1]).logits[0, len(prompt) - 1 :].float()
            sequences.append((prompt, out[0, len(prompt) :].tolist()))
            theirs.append(full)
        tolerance = 2 * bf16_step(max(float(t.abs().max()) for t in theirs))
        ours = {b: forced_logits(name, b, sequences) for b in BACKENDS}
        for backend in BACKENDS:
            equal = total = 0
            ties, d_torch, d_hf = [], 0.0, 0.0
            for i, (mine, ref, base) in enumerate(zip(ours[backend], theirs, ours["torch"])):
                top2 = ref.topk(2, dim=-1).values
                margin = top2[:, 0] - top2[:, 1]
                same = mine.argmax(-1) == ref.argmax(-1)
                equal, total = equal + int(same.sum()), total + len(same)
                for pos in (~same).nonzero().flatten().tolist():
                    ties.append(f"{i}:{pos} {margin[pos]:.3f}")
                    ok &= float(margin[pos]) <= tolerance
                d_torch = max(d_torch, float((mine - base).abs().max()))
                d_hf = max(d_hf, float((mine - ref).abs().max()))
            ok &= d_torch <= tolerance
            print(
                f"{name:14s} {backend:7s} {total:6d} {equal:5d} {d_torch:12.4f} {d_hf:9.4f} "
                f"{tolerance:9.4f}  {', '.join(ties) or '-'}"
            )
            TABLE.append(
                f"| {name} | `{backend}` | {total} | {equal} | {d_torch:.4f} | {d_hf:.4f} | "
                f"{tolerance:.4f} | {', '.join(ties) or '-'} |"
            )
        del hf
    os.environ["MINISGL_BOOK_DTYPE"] = "float32"
    print(
        "every backend within tolerance, every different token at a near-tie:",
        "yes" if ok else "NO",
    )
    return ok


def main() -> int:
    print("== which library each backend gets")
    show_libraries()
    print("\n== what the FlashInfer stand-in refuses")
    show_what_the_standin_refuses()
    backends = float32_backends()
    print(f"\n== float32, every token against transformers: {', '.join(backends)}")
    if book_device() != "cpu":
        print("   (FlashInfer and FlashAttention have no float32 kernels on a GPU)")
    summary = run_parity_cases(
        generate,
        lambda name: [
            Case(f"prompt {i}", p, NEW_TOKENS) for i, p in enumerate(build_prompts(name))
        ],
        runs=len(backends),
        run_label=("backend", lambda name, run: backends[run]),
    )
    if torch.cuda.is_available():
        print("\n== bfloat16 on the GPU: logits against the torch backend and transformers")
        ok = compare_in_bfloat16()
        if "--bf16-table" in sys.argv:
            gpu = torch.cuda.get_device_name()
            note = (
                f"\n\nOne {gpu}, torch {torch.__version__}, bfloat16; written by "
                "`python examples/ch17_attention.py --bf16-table PATH`.\n"
            )
            Path(sys.argv[sys.argv.index("--bf16-table") + 1]).write_text("\n".join(TABLE) + note)
        if not ok:
            return 1
    else:
        print("\n(bfloat16 with the real libraries: run this main on an NVIDIA GPU)")
    return 0 if summary.ok else 1


if __name__ == "__main__":
    sys.exit(main())
