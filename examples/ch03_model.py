"""Chapter 03: the model and its weights.

Each reference model is built from its HF config (on the meta device, so no memory is spent
on weights that are about to be replaced), its weights are streamed in, and a full-sequence
forward pass is compared with transformers' logits at every position. Then the model
generates greedily with no KV cache at all: every step runs every sequence from its start.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from examples.helpers.checkpoint import build  # noqa: E402
from minisgl.core import Batch, Context, get_global_ctx, set_global_ctx  # noqa: E402
from minisgl.models import BaseLLMModel  # noqa: E402
from tools.models import PARITY_MODELS, ensure_model  # noqa: E402
from tools.parity import book_device, book_dtype, build_prompts, eos_ids, run_parity  # noqa: E402


def forward_sequences(model: BaseLLMModel, sequences: List[List[int]]) -> torch.Tensor:
    """Logits for every token of several whole sequences, run side by side in one batch."""
    batch = Batch(reqs=[], phase="prefill")
    batch.input_ids = torch.tensor([t for s in sequences for t in s], device=book_device())
    batch.positions = torch.cat([torch.arange(len(s)) for s in sequences]).to(book_device())
    with torch.inference_mode(), get_global_ctx().forward_batch(batch):
        return model.forward()


def compare_logits() -> None:
    from transformers import AutoModelForCausalLM

    print(
        f"{'model':14s} {'architecture':20s} {'layers':>6s} {'q/kv heads':>10s} {'head_dim':>8s} "
        f"{'tied':>5s} {'rope':>8s} {'tensors':>7s} {'max |logit diff|':>17s}"
    )
    for name in PARITY_MODELS:
        config, model, count = build(name)
        prompt = build_prompts(name)[2]  # the chat prompt: the longest
        ours = forward_sequences(model, [prompt])
        hf = AutoModelForCausalLM.from_pretrained(ensure_model(name), dtype=book_dtype())
        hf = hf.to(book_device())
        with torch.inference_mode():
            theirs = hf(torch.tensor([prompt], device=book_device())).logits[0]
        rope = (config.rotary_config.scaling or {}).get("rope_type", "default")
        diff = float((ours.float() - theirs.float()).abs().max())
        print(
            f"{name:14s} {config.architectures[0]:20s} {config.num_layers:6d} "
            f"{config.num_qo_heads:>5d}/{config.num_kv_heads:<4d} {config.head_dim:8d} "
            f"{str(config.tie_word_embeddings):>5s} {rope:>8s} {count:7d} {diff:17.2e}"
        )
        assert diff < 1e-3 or book_dtype() != torch.float32, f"{name}: logits differ by {diff}"
    print(f"(each over all {len(prompt)} positions of the chat prompt; {str(book_dtype())[6:]})\n")


def generate(name: str, prompts: List[List[int]], n: int) -> List[List[int]]:
    """Greedy decoding with no cache: every step reruns every unfinished sequence."""
    _, model, _ = build(name)
    eos = set(eos_ids(name))
    sequences = [list(p) for p in prompts]
    outputs: List[List[int]] = [[] for _ in prompts]
    for _ in range(n):
        active = [i for i, out in enumerate(outputs) if not (out and out[-1] in eos)]
        if not active:
            break
        logits = forward_sequences(model, [sequences[i] for i in active])
        ends = torch.cumsum(torch.tensor([len(sequences[i]) for i in active]), 0) - 1
        for i, token in zip(active, logits[ends].argmax(dim=-1).tolist()):
            sequences[i].append(token)
            outputs[i].append(token)
    return outputs


def main() -> int:
    set_global_ctx(Context(page_size=1))
    compare_logits()
    return 0 if run_parity(generate).ok else 1


if __name__ == "__main__":
    sys.exit(main())
