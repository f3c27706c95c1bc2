"""Which GPU architecture we run on (False everywhere on a CPU)."""

from __future__ import annotations

import functools
from typing import Tuple


@functools.cache
def _cuda_capability() -> Tuple[int, int] | None:
    import torch

    if not torch.cuda.is_available() or not torch.version.cuda:
        return None
    return torch.cuda.get_device_capability()


def is_arch_supported(major: int, minor: int = 0) -> bool:
    capability = _cuda_capability()
    return capability is not None and capability >= (major, minor)


def is_sm90_supported() -> bool:  # Hopper (H100, H200) and newer
    return is_arch_supported(9, 0)


def is_sm100_supported() -> bool:  # Blackwell and newer
    return is_arch_supported(10, 0)
