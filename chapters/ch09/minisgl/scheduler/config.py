from __future__ import annotations

from dataclasses import dataclass

from minisgl.engine import EngineConfig


@dataclass(frozen=True)
class SchedulerConfig(EngineConfig):
    max_extend_tokens: int = 8192  # the most prompt tokens one prefill batch may compute
    cache_type: str = "radix"  # the prefix cache: "radix" or "naive"
    offline_mode: bool = False  # requests come from LLM.generate, not from sockets

    @property
    def max_forward_len(self) -> int:
        return self.max_extend_tokens
