"""Small torch helpers: a default-dtype context and NVTX ranges for profiles."""

from __future__ import annotations

import functools
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterator, TypeVar

if TYPE_CHECKING:
    import torch

F = TypeVar("F", bound=Callable[..., Any])


@contextmanager
def torch_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Create tensors in `dtype` by default inside the block."""
    import torch

    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def nvtx_annotate(name: str, layer_id_field: str | None = None) -> Callable[[F], F]:
    """Wrap a method in an NVTX range (visible in Nsight Systems; free on a CPU).

    `name` may hold a "{}" filled with the attribute `layer_id_field` of the object.
    """

    def decorator(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            import torch

            if not torch.cuda.is_available():
                return fn(self, *args, **kwargs)
            label = name.format(getattr(self, layer_id_field)) if layer_id_field else name
            with torch.cuda.nvtx.range(label):
                return fn(self, *args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorator
