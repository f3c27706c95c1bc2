"""What the real FlashInfer does with the mistakes its stand-in refuses (chapter 17), on a GPU.

    python tools/probe_flashinfer.py      # writes docs/data/ch17-flashinfer-probe.md

Each mistake is made on a fresh wrapper over a tiny paged cache (16 slots, 2 key/value heads
of 128, bfloat16: kernels the GPU kit's cache already holds), and the table says what the
library did: raised (which error) or accepted (and what it returned).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, List

import torch

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "data" / "ch17-flashinfer-probe.md"


def main() -> None:
    import flashinfer

    cuda, bf16, i32 = "cuda", torch.bfloat16, torch.int32
    workspace = torch.empty(128 << 20, dtype=torch.uint8, device=cuda)
    cache = torch.zeros(16, 1, 2, 128, device=cuda, dtype=bf16)
    q = torch.zeros(5, 4, 128, device=cuda, dtype=bf16)
    plan = dict(
        qo_indptr=torch.tensor([0, 3, 5], dtype=i32),
        paged_kv_indptr=torch.tensor([0, 3, 7], dtype=i32),
        paged_kv_indices=torch.tensor([0, 1, 2, 8, 9, 10, 11], dtype=i32, device=cuda),
        paged_kv_last_page_len=torch.ones(2, dtype=i32),
        num_qo_heads=4, num_kv_heads=2, head_dim_qk=128, page_size=1, causal=True,
        q_data_type=bf16,
    )  # fmt: skip

    def prefill(planned: bool = True):
        wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", backend="fa2")
        if planned:
            wrapper.plan(**plan)
        return wrapper

    def decode_plan_in(dtype: torch.dtype) -> None:
        wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", backend="fa2")
        indptr, indices = torch.tensor([0, 3], dtype=i32), torch.arange(3, dtype=i32, device=cuda)
        ones = torch.ones(1, dtype=i32)
        wrapper.plan(indptr, indices, ones, 4, 2, 128, 1, q_data_type=dtype, kv_data_type=dtype)

    long_indices = {**plan, "paged_kv_indices": plan["paged_kv_indices"].long()}
    mistakes: List[tuple[str, Callable[[], object]]] = [
        ("run before plan", lambda: prefill(planned=False).run(q, (cache, cache))),
        ("int64 indices", lambda: prefill(planned=False).plan(**long_indices)),
        ("a query with 4 rows, 5 planned", lambda: prefill().run(q[:4], (cache, cache))),
        ("a float16 query, bfloat16 planned", lambda: prefill().run(q.half(), (cache, cache))),
        ("a plan in float32", lambda: decode_plan_in(torch.float32)),
        ("(no mistake) planned, then run", lambda: prefill().run(q, (cache, cache))),
    ]  # fmt: skip
    rows = ["| what the engine does | FlashInfer " + flashinfer.__version__ + " |", "| --- | --- |"]
    for what, call in mistakes:
        try:
            result = call()
            shape = (
                f": an output of shape {tuple(result.shape)}" if hasattr(result, "shape") else ""
            )
            verdict = f"accepted{shape}"
        except Exception as e:  # noqa: BLE001 - what it raises is the finding
            verdict = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
        rows.append(f"| {what} | {verdict} |")
        print(what, "->", verdict)
    note = (
        f"\n\nOne {torch.cuda.get_device_name()}; written by `python tools/probe_flashinfer.py`.\n"
    )
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else OUT
    out.write_text("\n".join(rows) + note)


if __name__ == "__main__":
    main()
