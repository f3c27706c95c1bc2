"""Chapter 20: mixture of experts.

Qwen3-MoE replaces each layer's MLP with 8 experts (in the tiny model; 128 in Qwen3-30B-A3B)
of which a router picks 2 per token. This main follows one token through the router, shows how
the fused backend lays the (token, expert) pairs out for its grouped matrix products, holds the
fused Triton backend to the PyTorch loop on one layer, and then compares every token with
transformers: every dense model as before, and the MoE model with both backends (on a CPU
the Triton kernels run in Triton's interpreter).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import List

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("LOG_LEVEL", "WARNING")
from minisgl.core import SamplingParams  # noqa: E402
from minisgl.llm import LLM  # noqa: E402
from minisgl.moe.fused import FusedMoe, moe_align_block_size  # noqa: E402
from minisgl.moe.native import TorchMoe, select_experts  # noqa: E402
from tools.models import MOE_MODEL, MOE_PARITY_MODELS, ensure_model  # noqa: E402
from tools.parity import (  # noqa: E402
    Case,
    book_device,
    book_dtype,
    build_prompts,
    eos_ids,
    run_parity_cases,
)

NEW_TOKENS = 16


def make_llm(name: str, moe_backend: str = "auto") -> LLM:
    return LLM(str(ensure_model(name)), dtype=book_dtype(), page_size=4, num_page_override=256,
               max_running_req=8, cuda_graph_max_bs=0, moe_backend=moe_backend)  # fmt: skip


# ------------------------------------------------------------------ routing one token
def show_routing() -> None:
    """Layer 0's router on the last prompt token of the first prompt."""
    prompt = build_prompts(MOE_MODEL)[0]
    with make_llm(MOE_MODEL, "torch") as llm:
        model = llm.engine.model.model
        layer = model.layers.op_list[0]
        x = model.embed_tokens.forward(torch.tensor(prompt[-1:], device=llm.engine.device))
        x, _ = layer.input_layernorm.forward(x)  # the router sees a normalised input, but
        logits = layer.mlp.gate.forward(x)  # here without attention: an illustration
        weights, ids = select_experts(logits, 2, renormalize=True)
    probabilities = torch.softmax(logits.float(), dim=-1)[0]
    print("expert        " + " ".join(f"{e:6d}" for e in range(len(probabilities))))
    print("probability   " + " ".join(f"{p:6.3f}" for p in probabilities.tolist()))
    chosen = ", ".join(f"expert {e} {w:.3f}" for e, w in zip(ids[0].tolist(), weights[0].tolist()))
    print(f"top-2, renormalised to sum 1: {chosen}")


def show_alignment() -> None:
    topk_ids = torch.tensor([[2, 0], [0, 1], [2, 1], [0, 2]])
    sorted_ids, expert_ids, used = moe_align_block_size(topk_ids, block_size=4, num_experts=3)
    print(f"topk_ids (4 tokens x 2 choices): {topk_ids.tolist()}")
    print(f"pairs (token * 2 + choice) sorted by expert, padded with 8: {sorted_ids.tolist()}")
    print(f"expert of each block of 4: {expert_ids.tolist()}; entries in use: {used.item()}")


def fused_equals_torch() -> bool:
    """One MoE layer of the tiny model, 37 random tokens, both backends."""
    with make_llm(MOE_MODEL, "torch") as llm:
        experts = llm.engine.model.model.layers.op_list[0].mlp.experts
        g = torch.Generator().manual_seed(0)
        x = torch.randn(37, experts.hidden_size, generator=g).to(experts.gate_up_proj)
        logits = torch.randn(37, experts.num_experts, generator=g).to(x)
        args = (x, experts.gate_up_proj, experts.down_proj, logits, experts.top_k, True)
        ours, reference = FusedMoe().forward(*args), TorchMoe().forward(*args)
    tolerance, shown = (1e-5, "10^-5") if x.dtype == torch.float32 else (2e-2, "0.02")
    diff = (ours - reference).abs().max().item()
    print(f"37 tokens, one layer: max |fused - torch| {'<' if diff < tolerance else '>='} {shown}")
    return diff < tolerance


# ------------------------------------------------------------------ parity
def backends(name: str) -> List[str]:
    return ["torch", "fused"] if name == MOE_MODEL else ["auto"]


def generate(name: str, cases: List[Case], run: int = 0) -> List[List[int]]:
    with make_llm(name, backends(name)[run]) as llm:
        outputs = llm.generate([c.prompt for c in cases], SamplingParams(temperature=0.0,
                               max_tokens=NEW_TOKENS))  # fmt: skip
    eos = eos_ids(name)[:1]  # LLM.generate leaves out the EOS that ended a request
    return [o["token_ids"] + (eos if len(o["token_ids"]) < NEW_TOKENS else []) for o in outputs]


def main() -> int:
    print(f"== routing: {MOE_MODEL}, layer 0, the first prompt's last token")
    show_routing()
    print("\n== the fused backend's layout: each block of rows needs one expert")
    show_alignment()
    where = "compiled" if book_device() == "cuda" else "Triton's interpreter"
    print(f"\n== the fused backend ({where}) against the loop over the experts")
    ok = fused_equals_torch()
    print("\n== every token against transformers (MoE backend per run)")
    summary = run_parity_cases(
        generate,
        lambda name: [
            Case(f"prompt {i}", p, NEW_TOKENS) for i, p in enumerate(build_prompts(name))
        ],
        models=MOE_PARITY_MODELS,
        runs=lambda name: len(backends(name)),
        run_label=("moe", lambda name, run: backends(name)[run]),
    )
    return 0 if ok and summary.ok else 1


if __name__ == "__main__":
    sys.exit(main())
