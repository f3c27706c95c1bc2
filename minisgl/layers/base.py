"""Ops: the engine's building blocks, without torch.nn.Module.

An op keeps its weights as plain tensor attributes. `state_dict` walks the attributes (tensors,
and ops holding tensors) and names them by path, `load_state_dict` swaps in the loaded tensors,
strictly: every weight must be given exactly once, with the right shape and dtype. There are no
hooks, no autograd and no module tree to traverse at every call: a forward pass is a chain of
plain method calls, which is all inference needs. Attributes whose names start with "_" (caches,
communicators, bookkeeping) are not weights.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, Dict, Generic, List, TypeVar

import torch

StateDict = Dict[str, torch.Tensor]


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


class BaseOP:
    @abstractmethod
    def forward(self, *args: Any, **kwargs: Any) -> Any: ...

    def state_dict(self, *, prefix: str = "", result: StateDict | None = None) -> StateDict:
        result = {} if result is None else result
        for name, value in self.__dict__.items():
            if name.startswith("_"):
                continue
            if isinstance(value, torch.Tensor):
                result[_join(prefix, name)] = value
            elif isinstance(value, BaseOP):
                value.state_dict(prefix=_join(prefix, name), result=result)
        return result

    def load_state_dict(
        self, state_dict: StateDict, *, prefix: str = "", _internal: bool = False
    ) -> None:
        """Take this op's weights out of `state_dict` (which is consumed as it goes)."""
        for name, value in self.__dict__.items():
            if name.startswith("_"):
                continue
            key = _join(prefix, name)
            if isinstance(value, torch.Tensor):
                if key not in state_dict:
                    raise KeyError(f"missing weight {key!r} (expected shape {tuple(value.shape)})")
                loaded = state_dict.pop(key)
                if loaded.shape != value.shape or loaded.dtype != value.dtype:
                    raise ValueError(
                        f"weight {key!r}: expected {tuple(value.shape)} {value.dtype}, "
                        f"got {tuple(loaded.shape)} {loaded.dtype}"
                    )
                setattr(self, name, loaded)
            elif isinstance(value, BaseOP):
                value.load_state_dict(state_dict, prefix=key, _internal=True)
        _check_consumed(state_dict, _internal)


def _check_consumed(state_dict: StateDict, internal: bool) -> None:
    if not internal and state_dict:
        raise RuntimeError(f"unexpected weights: {sorted(state_dict)}")


class StateLessOP(BaseOP):
    """An op without weights (attention, RoPE): it neither saves nor loads anything."""

    def __init__(self) -> None:
        super().__init__()

    def state_dict(self, *, prefix: str = "", result: StateDict | None = None) -> StateDict:
        return {} if result is None else result

    def load_state_dict(
        self, state_dict: StateDict, *, prefix: str = "", _internal: bool = False
    ) -> None:
        _check_consumed(state_dict, _internal)


T = TypeVar("T", bound=BaseOP)


class OPList(BaseOP, Generic[T]):
    """A list of ops, named 0, 1, 2, ... in the state dict (like the layers of a model)."""

    def __init__(self, ops: List[T]) -> None:
        super().__init__()
        self.op_list = ops

    def state_dict(self, *, prefix: str = "", result: StateDict | None = None) -> StateDict:
        result = {} if result is None else result
        for i, op in enumerate(self.op_list):
            op.state_dict(prefix=_join(prefix, str(i)), result=result)
        return result

    def load_state_dict(
        self, state_dict: StateDict, *, prefix: str = "", _internal: bool = False
    ) -> None:
        for i, op in enumerate(self.op_list):
            op.load_state_dict(state_dict, prefix=_join(prefix, str(i)), _internal=True)
        _check_consumed(state_dict, _internal)
