"""Streaming weight loading: one tensor at a time, renamed and merged on the fly.

The checkpoint names q_proj, k_proj and v_proj (and gate_proj, up_proj) separately; our model
holds one merged matrix for each group. The loader keeps a tensor of a group in a small buffer
until the group is complete, then yields the concatenation. So at any moment it holds one
tensor being read plus the pieces of at most a few unfinished groups, never the checkpoint.
"""

from __future__ import annotations

import glob
import os
from typing import Dict, Iterator, Tuple

import safetensors
import torch

from minisgl.utils import download_hf_weight

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


def _checkpoint_files(folder: str) -> list[str]:
    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    # Mistral repositories ship a second, "consolidated" copy in another naming scheme
    files = [f for f in files if not f.endswith("consolidated.safetensors")] or files
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {folder}")
    return files


def load_weight(model_path: str, device: torch.device) -> Iterator[Tuple[str, torch.Tensor]]:
    """Yield (name, tensor) in our model's naming, merged, on `device`, one at a time."""
    folder = download_hf_weight(model_path)
    pending: Dict[str, Dict[str, torch.Tensor]] = {}  # merged key -> the slots read so far
    for file in _checkpoint_files(folder):
        with safetensors.safe_open(file, framework="pt", device=str(device)) as f:
            for name in f.keys():
                if name.startswith(("vision_tower.", "multi_modal_projector.")):
                    continue  # the language model of a multimodal checkpoint only
                tensor = f.get_tensor(name)
                name = name.removeprefix("language_model.")
                info = _get_merge_info(name)
                if info is None:
                    yield name, tensor
                    continue
                merged_key, slot, slots = info
                group = pending.setdefault(merged_key, {})
                group[slot] = tensor
                if len(group) == len(slots):
                    del pending[merged_key]
                    yield merged_key, torch.cat([group[s] for s in slots], dim=0)
    if pending:
        raise ValueError(f"incomplete merge groups in the checkpoint: {sorted(pending)}")
