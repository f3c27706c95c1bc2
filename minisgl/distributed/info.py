"""Which tensor-parallel rank this process is, out of how many."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DistributedInfo:
    rank: int
    size: int

    def __post_init__(self) -> None:
        assert 0 <= self.rank < self.size, f"rank {self.rank} out of range for size {self.size}"

    def is_primary(self) -> bool:
        return self.rank == 0


_TP_INFO: DistributedInfo | None = None


def set_tp_info(rank: int, size: int) -> None:
    global _TP_INFO
    if _TP_INFO is not None:
        raise RuntimeError(
            f"the TP info is already set ({_TP_INFO}): an engine made earlier in this process "
            "is still alive; call its shutdown() first (or make it with `with LLM(...) as llm:`)"
        )
    _TP_INFO = DistributedInfo(rank, size)


def get_tp_info() -> DistributedInfo:
    if _TP_INFO is None:
        raise RuntimeError("the TP info is not set: call set_tp_info first")
    return _TP_INFO


def try_get_tp_info() -> DistributedInfo | None:
    return _TP_INFO


def tp_info_or_one() -> DistributedInfo:
    """The TP info an engine set, else one rank: a layer built outside an engine (a test,
    chapter 02's hand-wired decoder) runs alone."""
    return _TP_INFO if _TP_INFO is not None else DistributedInfo(0, 1)


def reset_tp_info() -> None:
    """Forget the TP info, so that another engine can start in this process."""
    global _TP_INFO
    _TP_INFO = None


__all__ = [
    "DistributedInfo",
    "set_tp_info",
    "get_tp_info",
    "try_get_tp_info",
    "tp_info_or_one",
    "reset_tp_info",
]
