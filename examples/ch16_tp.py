"""Chapter 16: tensor parallelism.

Each linear layer, the embedding and the LM head are split across N ranks, one process each,
holding its own slice of the weights. Column-split layers need no communication; a row-split
layer ends with an all-reduce, the LM head with an all-gather. This main shows what rank 0
holds, then runs every model at one or two TP sizes (N scheduler processes driven over their
sockets, as in chapter 14) and compares every token with transformers. Without enough GPUs
for a rank each, the ranks run on the CPU (gloo).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Dict, List

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("LOG_LEVEL", "WARNING")
if torch.cuda.device_count() < 4:  # one GPU per rank, or all ranks on the CPU
    os.environ.update(MINISGL_DEVICE="cpu", MINISGL_BOOK_DEVICE="cpu", MINISGL_BOOK_DTYPE="float32")
from examples.helpers.ranks import Ranks  # noqa: E402
from minisgl.distributed import DistributedInfo, reset_tp_info, set_tp_info  # noqa: E402
from minisgl.layers import set_rope_device  # noqa: E402
from minisgl.models import ModelConfig, create_model  # noqa: E402
from minisgl.scheduler import SchedulerConfig  # noqa: E402
from minisgl.utils import cached_load_hf_config, torch_dtype  # noqa: E402
from tools.models import PARITY_MODELS, SMOLLM2, ensure_model  # noqa: E402
from tools.parity import Case, book_dtype, build_prompts, run_parity_cases  # noqa: E402

# TP sizes per model: a size must split the attention heads, and split the key/value heads or
# be a multiple of them (more ranks than key/value heads: each rank keeps a copy of one).
# SmolLM2 has 9 heads and 3 key/value heads: 3 ranks.
TP_SIZES: Dict[str, List[int]] = {
    "tiny-qwen3": [2, 4],
    "tiny-qwen2": [2],
    "tiny-llama3": [2],
    "tiny-mistral": [4],  # one key/value head: each rank keeps a copy
    SMOLLM2: [3],
}
NEW_TOKENS = 32


def rank_shapes(name: str, tp_size: int, rank: int) -> Dict[str, torch.Size]:
    """The shapes of rank `rank`'s weights (a model on the meta device: no memory)."""
    config = ModelConfig.from_hf(cached_load_hf_config(str(ensure_model(name))))
    set_tp_info(rank, tp_size)
    set_rope_device(torch.device("cpu"))  # RoPE's tables are real even on the meta device
    try:
        with torch.device("meta"), torch_dtype(torch.float32):
            model = create_model(config)
        return {k: v.shape for k, v in model.state_dict().items()}
    finally:
        reset_tp_info()


def show_what_a_rank_holds(name: str, tp_size: int) -> None:
    whole, part = rank_shapes(name, 1, 0), rank_shapes(name, tp_size, 0)
    print(f"{name}, {tp_size} ranks: what rank 0 holds of layer 0 and of the vocabulary")
    print(f"  {'tensor':46s} {'whole':>12s} {'rank 0':>12s}  split")
    for key, shape in whole.items():
        if ".layers." in key and ".layers.0." not in key:
            continue
        mine = part[key]
        how = (
            "rows" if mine[0] < shape[0] else "columns" if len(shape) > 1 and mine[1] < shape[1]
            else "-"
        )  # fmt: skip
        shown = f"{tuple(shape)}", f"{tuple(mine)}"
        print(f"  {key:46s} {shown[0]:>12s} {shown[1]:>12s}  {how}")
    full = sum(s.numel() for s in whole.values())
    mine = sum(s.numel() for s in part.values())
    print(f"  parameters: {full:,} in the model, {mine:,} on rank 0 ({mine / full:.1%})\n")


def cases_for(name: str) -> List[Case]:
    labels = ["capital", "fibonacci", "colours (chat)"]
    return [Case(label, p, NEW_TOKENS) for label, p in zip(labels, build_prompts(name))]


def generate(name: str, cases: List[Case], run: int) -> List[List[int]]:
    tp_size = TP_SIZES[name][run]
    config = SchedulerConfig(
        model_path=str(ensure_model(name)),
        tp_info=DistributedInfo(0, tp_size),
        dtype=book_dtype(),
        max_running_req=8,
        page_size=4,
        num_page_override=256,
    )
    with Ranks(config) as ranks:
        return ranks.generate([c.prompt for c in cases], NEW_TOKENS)


def main() -> int:
    show_what_a_rank_holds("tiny-qwen3", 2)
    show_what_a_rank_holds("tiny-mistral", 4)  # 1 key/value head: each rank keeps a copy
    models = [m for m in PARITY_MODELS if m in TP_SIZES]
    where = "the CPU (gloo)" if os.environ.get("MINISGL_DEVICE") == "cpu" else "a GPU (NCCL)"
    print(f"every model at its TP sizes, each rank a process on {where}:")
    summary = run_parity_cases(
        generate,
        cases_for,
        models,
        runs=lambda name: len(TP_SIZES[name]),
        run_label=("ranks", lambda name, run: str(TP_SIZES[name][run])),
    )
    return 0 if summary.ok else 1


if __name__ == "__main__":
    sys.exit(main())
