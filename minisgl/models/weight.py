"""Streaming weight loading: one tensor at a time, cut, renamed and merged on the fly.

With tensor parallelism (chapter 16) each rank keeps only its part of each tensor, cut as its
layer is split: rows of q, k, v, gate and up (column-parallel layers), columns of o and down
(row-parallel layers), a slice of the vocabulary for the embedding and the LM head; norms are
whole on every rank. The checkpoint names q_proj, k_proj and v_proj (and gate_proj, up_proj)
separately; our model holds one merged matrix for each group. The loader keeps a tensor of a
group in a small buffer until the group is complete, then yields the concatenation of the
rank's parts. So at any moment it holds one tensor being read plus the pieces of at most a few
unfinished groups, never the checkpoint.
"""

from __future__ import annotations

import glob
import os
import re
from typing import TYPE_CHECKING, Dict, Iterator, Tuple

import safetensors
import torch

from minisgl.distributed import DistributedInfo, tp_info_or_one
from minisgl.utils import cached_load_hf_config, div_ceil, div_even, download_hf_weight

if TYPE_CHECKING:
    from .config import ModelConfig

# checkpoint suffix -> (merged suffix, its slot, every slot of the merged tensor in order)
_MERGE_GROUPS: Dict[str, Tuple[str, str, Tuple[str, ...]]] = {
    ".q_proj": (".qkv_proj", "q", ("q", "k", "v")),
    ".k_proj": (".qkv_proj", "k", ("q", "k", "v")),
    ".v_proj": (".qkv_proj", "v", ("q", "k", "v")),
    ".gate_proj": (".gate_up_proj", "gate", ("gate", "up")),
    ".up_proj": (".gate_up_proj", "up", ("gate", "up")),
}


def _get_merge_info(key: str) -> Tuple[str, str, Tuple[str, ...]] | None:
    """For a tensor of a merge group: (merged key, its slot, all slots); else None."""
    for suffix, (merged_suffix, slot, slots) in _MERGE_GROUPS.items():
        if suffix + "." in key:
            return key.replace(suffix + ".", merged_suffix + "."), slot, slots
    return None


_COLUMNS = (".q_proj.", ".k_proj.", ".v_proj.", ".gate_proj.", ".up_proj.")  # cut by rows
_ROWS = (".o_proj.", ".down_proj.")  # cut by columns
_VOCABULARY = ("embed_tokens.", "lm_head.")


def _shard_tensor(name: str, tensor: torch.Tensor, tp: DistributedInfo, num_kv_heads: int):
    """Rank `tp.rank`'s part of a checkpoint tensor (the tensor itself on one rank)."""
    rank, size = tp.rank, tp.size
    if size == 1:
        return tensor
    if any(s in name for s in (".k_proj.", ".v_proj.")) and num_kv_heads < size:
        # fewer key/value heads than ranks: each rank keeps a copy of one head
        head_dim = tensor.shape[0] // num_kv_heads
        head = rank * num_kv_heads // size
        return tensor[head * head_dim : (head + 1) * head_dim].clone()
    if any(s in name for s in _COLUMNS):
        rows = div_even(tensor.shape[0], size)
        return tensor[rank * rows : (rank + 1) * rows].clone()
    if any(s in name for s in _ROWS) and tensor.dim() == 2:  # a bias stays whole (rank 0 adds it)
        columns = div_even(tensor.shape[1], size)
        return tensor[:, rank * columns : (rank + 1) * columns].clone()
    if any(name.startswith(s) or f".{s}" in name for s in _VOCABULARY):
        rows = div_ceil(tensor.shape[0], size)
        part = tensor[rank * rows : (rank + 1) * rows]
        if part.shape[0] < rows:  # the last slice, when the ranks do not divide the vocabulary
            padding = part.new_zeros((rows - part.shape[0], *part.shape[1:]))
            return torch.cat([part, padding])
        return part.clone()
    return tensor


_EXPERT = re.compile(r"^(?P<prefix>.+\.experts)\.(?P<index>\d+)\.(?P<name>\w+)\.weight$")


def _expert_slot(key: str) -> Tuple[str, int] | None:
    """For one expert's (merged) weight, `...experts.7.gate_up_proj.weight`: the stacked key
    `...experts.gate_up_proj` and the expert's number 7; else None."""
    match = _EXPERT.match(key)
    if match is None:
        return None
    return f"{match['prefix']}.{match['name']}", int(match["index"])


def _model_config(model_path: str) -> ModelConfig:
    from .config import ModelConfig

    return ModelConfig.from_hf(cached_load_hf_config(model_path))


def _checkpoint_files(folder: str) -> list[str]:
    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    # Mistral repositories ship a second, "consolidated" copy in another naming scheme
    files = [f for f in files if not f.endswith("consolidated.safetensors")] or files
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {folder}")
    return files


def load_weight(model_path: str, device: torch.device) -> Iterator[Tuple[str, torch.Tensor]]:
    """Yield (name, tensor) in our model's naming, this rank's part, merged, on `device`, one
    at a time."""
    folder = download_hf_weight(model_path)
    tp = tp_info_or_one()
    num_kv_heads = _model_config(model_path).num_kv_heads if tp.size > 1 else 0  # cuts k, v
    pending: Dict[str, Dict[str, torch.Tensor]] = {}  # merged key -> the slots read so far
    experts: Dict[str, Dict[int, torch.Tensor]] = {}  # stacked key -> the experts read so far
    num_experts = 0  # read from the config at the first expert's weight

    def stack_experts(name: str, tensor: torch.Tensor) -> Iterator[Tuple[str, torch.Tensor]]:
        """A MoE layer holds its experts' weights as one tensor [experts, ...]: collect them."""
        nonlocal num_experts
        slot = _expert_slot(name)
        if slot is None:
            yield name, tensor
            return
        num_experts = num_experts or _model_config(model_path).num_experts
        key, index = slot
        group = experts.setdefault(key, {})
        group[index] = tensor
        if len(group) == num_experts:
            del experts[key]
            yield key, torch.stack([group[i] for i in range(num_experts)])

    for file in _checkpoint_files(folder):
        with safetensors.safe_open(file, framework="pt", device=str(device)) as f:
            for name in f.keys():
                if name.startswith(("vision_tower.", "multi_modal_projector.")):
                    continue  # the language model of a multimodal checkpoint only
                tensor = f.get_tensor(name)
                name = name.removeprefix("language_model.")
                tensor = _shard_tensor(name, tensor, tp, num_kv_heads)
                info = _get_merge_info(name)
                if info is None:
                    yield from stack_experts(name, tensor)
                    continue
                merged_key, slot, slots = info
                group = pending.setdefault(merged_key, {})
                group[slot] = tensor
                if len(group) == len(slots):
                    del pending[merged_key]
                    yield from stack_experts(merged_key, torch.cat([group[s] for s in slots]))
    if pending:
        raise ValueError(f"incomplete merge groups in the checkpoint: {sorted(pending)}")
    if experts:
        raise ValueError(f"experts missing from the checkpoint in: {sorted(experts)}")
