"""Settings read from MINISGL_* environment variables, once, at import.

    ENV.DISABLE_OVERLAP_SCHEDULING   MINISGL_DISABLE_OVERLAP_SCHEDULING=1 runs the plain loop
    ENV.DISABLE_CUSTOM_KERNELS       MINISGL_DISABLE_CUSTOM_KERNELS=1 runs chapter 19's kernels'
                                     PyTorch references instead (chapter 21's ablation)
    ENV.FUSED_QK_NORM_ROPE           Qwen3's q/k norms and RoPE in one Triton kernel on a GPU
                                     in 16 bits (project P1); MINISGL_FUSED_QK_NORM_ROPE=0 runs
                                     FlashInfer's three kernels instead
    ENV.FUSED_KV_STORE               that kernel also stores the layer's new keys and values
                                     in the KV pool (project P1); MINISGL_FUSED_KV_STORE=0
                                     leaves the store to the attention backend's kernel
    ENV.TRITON_DECODE                decode attention by the Triton kernel of equal chunks on a
                                     GPU where FlashInfer's plain decode kernel would run
                                     (project P1); MINISGL_TRITON_DECODE=0 runs FlashInfer's
                                     decode kernel instead
    ENV.TRITON_DECODE_SETTINGS       MINISGL_TRITON_DECODE_SETTINGS="splits=16,chunk=128,..."
                                     changes that kernel's settings (integers; P1's measurements)
    ENV.TRITON_PDL                   MINISGL_TRITON_PDL=1 launches the norms-and-RoPE kernel
                                     and the decode attention's kernels by the GPU's
                                     programmatic dependent launch (project P1)
    ENV.FUSED_GATE_UP_SILU           the MLP's gate/up product and SiLU in one Triton kernel
                                     on a GPU in 16 bits, at up to 64 rows (project P1);
                                     MINISGL_FUSED_GATE_UP_SILU=0 runs cuBLAS and FlashInfer
    ENV.SPLIT_O_DOWN                 MINISGL_SPLIT_O_DOWN=1 runs a dense decoder's o and down
                                     products on a GPU in 16 bits, at up to 256 rows, as a
                                     Triton product split over its inputs whose second kernel
                                     is the add-and-norm after it (project P1)
    ENV.SPLIT_DOWN_SILU              with SPLIT_O_DOWN, down's kernel makes silu(gate) * up
                                     as it loads its input, where the gate/up kernel did
                                     not; MINISGL_SPLIT_DOWN_SILU=0 runs FlashInfer's SiLU
    ENV.SPLIT_TILES                  MINISGL_SPLIT_TILES="2048:64=4,16,32,128;..." changes
                                     that kernel's tiles (P1's measurements)
    ENV.GUMBEL_SAMPLING              temperature sampling without top-k/top-p by the Triton
                                     Gumbel-max kernel on a GPU (project P1);
                                     MINISGL_GUMBEL_SAMPLING=0 samples with FlashInfer instead

A value that does not parse keeps the default (and says so on stderr). Later chapters add
their own settings here.
"""

from __future__ import annotations

import os
import sys
from typing import Callable, Dict, Generic, TypeVar

T = TypeVar("T")
MINISGL_ENV_PREFIX = "MINISGL_"


class BaseEnv:
    def _init(self, name: str) -> None:
        raise NotImplementedError


class EnvVar(BaseEnv, Generic[T]):
    def __init__(self, default_value: T, fn: Callable[[str], T]) -> None:
        self.value = default_value
        self.fn = fn

    def _init(self, name: str) -> None:
        raw = os.getenv(name)
        if raw is None:
            return
        try:
            self.value = self.fn(raw)
        except (ValueError, KeyError) as e:
            print(f"minisgl: ignoring {name}={raw!r} ({e})", file=sys.stderr)

    def __bool__(self) -> bool:
        return bool(self.value)

    def __str__(self) -> str:
        return str(self.value)


def _to_bool(text: str) -> bool:
    return text.strip().lower() in ("1", "true", "yes", "on")


def _to_settings(text: str) -> Dict[str, int]:
    """'a=1,b=2' (or 'a=1;b=2') -> {'a': 1, 'b': 2}; a part without '=' raises ValueError."""
    settings: Dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.replace(";", ",").split(","))):
        name, sep, value = part.partition("=")
        if not sep:
            raise ValueError(f"{part!r} is not NAME=VALUE")
        settings[name.strip()] = int(value)
    return settings


def EnvSettings() -> EnvVar[Dict[str, int]]:
    return EnvVar({}, _to_settings)


def EnvBool(default_value: bool) -> EnvVar[bool]:
    return EnvVar(default_value, _to_bool)


def EnvInt(default_value: int) -> EnvVar[int]:
    return EnvVar(default_value, int)


def EnvFloat(default_value: float) -> EnvVar[float]:
    return EnvVar(default_value, float)


class EnvClassSingleton:
    _instance: EnvClassSingleton | None = None

    DISABLE_OVERLAP_SCHEDULING = EnvBool(False)
    DISABLE_CUSTOM_KERNELS = EnvBool(False)
    FUSED_QK_NORM_ROPE = EnvBool(True)
    FUSED_KV_STORE = EnvBool(True)
    TRITON_DECODE = EnvBool(True)
    TRITON_DECODE_SETTINGS = EnvSettings()
    TRITON_PDL = EnvBool(False)
    FUSED_GATE_UP_SILU = EnvBool(True)
    SPLIT_O_DOWN = EnvBool(False)
    SPLIT_DOWN_SILU = EnvBool(True)
    SPLIT_TILES = EnvVar("", str)
    GUMBEL_SAMPLING = EnvBool(True)
    # how the shell (python -m minisgl.shell, chapter 15) samples its answers
    SHELL_MAX_TOKENS = EnvInt(2048)
    SHELL_TOP_K = EnvInt(-1)
    SHELL_TOP_P = EnvFloat(1.0)
    SHELL_TEMPERATURE = EnvFloat(0.6)

    def __new__(cls) -> EnvClassSingleton:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __init__(self) -> None:
        for name in dir(type(self)):
            value = getattr(self, name)
            if isinstance(value, BaseEnv):
                value._init(MINISGL_ENV_PREFIX + name)


ENV = EnvClassSingleton()
