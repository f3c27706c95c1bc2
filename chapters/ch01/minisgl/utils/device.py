"""One interface to the device: streams, events, pinned memory, synchronisation, free memory.

On CUDA these are the real things. On the CPU there is one implicit queue: work runs when it
is issued, so a stream is a no-op, an event is complete as soon as it is recorded, and pinned
memory is plain memory. The engine and the scheduler are written once against this module,
and the same code path (the overlap scheduler's one-step delay included) runs on both.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Any, Iterator, List

import torch


def default_device(rank: int = 0) -> torch.device:
    """cuda:rank when a GPU is present, else the CPU. MINISGL_DEVICE=cpu forces the CPU."""
    if os.environ.get("MINISGL_DEVICE", "") != "cpu" and torch.cuda.is_available():
        return torch.device(f"cuda:{rank}")
    return torch.device("cpu")


def is_cuda(device: torch.device) -> bool:
    return device.type == "cuda"


class Stream:
    """A queue of device work. On the CPU, work is done when issued, so there is nothing to do."""

    def __init__(self, device: torch.device, raw: Any = None) -> None:
        self.device = device
        if raw is None and is_cuda(device):
            raw = torch.cuda.Stream(device)
        self.raw: torch.cuda.Stream | None = raw

    def wait_stream(self, other: Stream) -> None:
        """Work issued on self from now on waits for the work already issued on `other`."""
        if self.raw is not None and other.raw is not None:
            self.raw.wait_stream(other.raw)

    def wait_event(self, event: Event) -> None:
        if self.raw is not None and event.raw is not None:
            self.raw.wait_event(event.raw)

    def synchronize(self) -> None:
        if self.raw is not None:
            self.raw.synchronize()


def current_stream(device: torch.device) -> Stream:
    raw = torch.cuda.current_stream(device) if is_cuda(device) else None
    return Stream(device, raw)


def set_stream(stream: Stream) -> None:
    """Make `stream` the current stream of its device (for every kernel launched after)."""
    if stream.raw is not None:
        torch.cuda.set_stream(stream.raw)


@contextmanager
def use_stream(stream: Stream) -> Iterator[None]:
    if stream.raw is None:
        yield
    else:
        with torch.cuda.stream(stream.raw):
            yield


class Event:
    """A marker in a stream: "everything issued before this point"."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.raw: torch.cuda.Event | None = torch.cuda.Event() if is_cuda(device) else None

    def record(self, stream: Stream | None = None) -> None:
        if self.raw is not None:
            if stream is not None and stream.raw is not None:
                self.raw.record(stream.raw)
            else:
                self.raw.record()

    def synchronize(self) -> None:
        """Block the host until the marked work is done."""
        if self.raw is not None:
            self.raw.synchronize()

    def query(self) -> bool:
        return True if self.raw is None else bool(self.raw.query())


def synchronize(device: torch.device) -> None:
    if is_cuda(device):
        torch.cuda.synchronize(device)


def pin_memory(device: torch.device) -> bool:
    """Whether host staging buffers for `device` should be pinned (page-locked).

    Pinned memory lets a host-to-device copy run asynchronously; it only exists with CUDA.
    """
    return is_cuda(device)


def host_tensor(data: List[Any], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A CPU tensor holding `data`, pinned when it is bound for a GPU."""
    return torch.tensor(data, dtype=dtype, device="cpu", pin_memory=pin_memory(device))


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Copy a host tensor to `device`, without blocking the host when the source is pinned."""
    if tensor.device == device:
        return tensor
    return tensor.to(device, non_blocking=tensor.is_pinned())


def empty_cache(device: torch.device) -> None:
    if is_cuda(device):
        torch.cuda.empty_cache()


def total_memory(device: torch.device) -> int:
    """Bytes of memory `device` has in all (for the CPU: the machine's RAM)."""
    if is_cuda(device):
        return int(torch.cuda.get_device_properties(device).total_memory)
    return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def free_memory(device: torch.device) -> int:
    """Bytes that can still be allocated on `device` (for the CPU: the kernel's MemAvailable)."""
    if is_cuda(device):
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
