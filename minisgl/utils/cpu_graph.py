"""A CUDA graph's contract, kept on the CPU.

A CUDA graph records the kernels that a piece of code launches, with the addresses they read
and write. Replaying it launches the same kernels on the same addresses; the Python code that
launched them does not run again. Three rules follow for the code that is captured:

* its inputs are whatever its buffers hold at replay: a new input must be copied into them;
* it must keep reading the same memory: a buffer replaced by a new tensor is not seen (the
  graph reads the old address, maybe freed by then);
* it must not wait for the device (`.item()`, `.tolist()`, `int(t)`, `nonzero`, a boolean
  mask): the result would be frozen into the graph, so CUDA refuses it while capturing.

The CPU has no graphs. `EmulatedGraph` keeps the captured function and runs it again at replay,
on the very objects it captured, so that an input left out of its buffer gives the stale
answer a real graph gives. While it captures and replays, a torch function mode refuses what
CUDA would refuse (a host synchronisation) and what it would silently get wrong (a replay
reading a tensor that the capture did not read). A stand-in for a device kernel (chapter 17's
FlashInfer and sgl-kernel stand-ins) runs under `torch._C.DisableTorchFunction()`: what a
kernel does inside is the device's business.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterator, List, Set

import torch
from torch.overrides import TorchFunctionMode

# methods and functions that hand a device value to the host, or whose result's shape depends
# on the values (so the host must wait for them to know it)
HOST_SYNCS = {
    "item", "tolist", "numpy", "cpu", "__bool__", "__int__", "__float__", "__index__",
    "nonzero", "argwhere", "masked_select", "unique", "unique_consecutive",
}  # fmt: skip


class GraphContractError(RuntimeError):
    """Code run inside a (emulated) CUDA graph broke one of the graph's rules."""


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)


def _storage(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


def _describe(tensor: torch.Tensor) -> str:
    return f"a {tuple(tensor.shape)} {str(tensor.dtype).removeprefix('torch.')} tensor"


def _host_sync(name: str, args: tuple) -> str | None:
    """Why the call waits for the device, or None."""
    if name in HOST_SYNCS:
        return f"{name}() reads a value on the host"
    if name == "__getitem__" and any(
        t.dtype == torch.bool for t in _tensors(args[1:]) if t.dim() > 0
    ):
        return "indexing with a boolean mask (its result's size depends on the values)"
    if name == "repeat_interleave" and any(isinstance(a, torch.Tensor) for a in args[1:2]):
        return "repeat_interleave with a tensor of repeats (the result's size depends on them)"
    return None


class _Watch(TorchFunctionMode):
    """Sees every torch call of one run of the step: refuses host synchronisations, and notes
    the storages read that were not made during the run (the step's inputs and weights).
    With `known` (a replay), reading any other storage is refused."""

    def __init__(self, what: str, known: Set[int] | None = None) -> None:
        super().__init__()
        self.what = what
        self.known = known
        self.made: Set[int] = set()  # storages the run allocated
        self.read: Set[int] = set()  # storages it read that existed before it
        # the tensors behind them, kept alive by the graph: a freed address could be given to
        # a new tensor, which the check below would then take for the captured one
        self.inputs: List[torch.Tensor] = []

    def __torch_function__(
        self, func: Callable, types: Any, args: tuple = (), kwargs: Dict | None = None
    ) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        if (why := _host_sync(name, args)) is not None:
            raise GraphContractError(
                f"{self.what}: {why}; a CUDA graph cannot wait for the device (CUDA refuses "
                "the capture: 'operation not permitted when stream is capturing')"
            )
        for tensor in _tensors((args, kwargs)):
            key = _storage(tensor)
            if key in self.made or key in self.read:
                continue
            if self.known is not None and key not in self.known:
                raise GraphContractError(
                    f"{self.what}: {name}() reads {_describe(tensor)} that the capture never "
                    "read; a real graph would read the buffer captured in its place (a buffer "
                    "was replaced, or a new input was not copied into the captured one)"
                )
            self.read.add(key)
            self.inputs.append(tensor)
        result = func(*args, **kwargs)
        self.made.update(_storage(t) for t in _tensors(result) if _storage(t) not in self.read)
        return result


class EmulatedGraph:
    """The interface of torch.cuda.CUDAGraph that the engine uses, on the CPU."""

    def __init__(self) -> None:
        self.step: Callable[[], None] | None = None
        self.storages: Set[int] = set()
        self.inputs: List[torch.Tensor] = []

    def capture(self, step: Callable[[], None]) -> None:
        """Run `step` once, keeping it and the tensors it read."""
        with _Watch("capturing a CUDA graph") as watch:
            step()
        self.step, self.storages, self.inputs = step, watch.read, watch.inputs

    def replay(self) -> None:
        """Run the captured step again, on the objects it captured."""
        assert self.step is not None, "replay before capture"
        with _Watch("replaying a CUDA graph", known=self.storages):
            self.step()
