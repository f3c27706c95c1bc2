"""Small integer helpers and a marker for "not given"."""

from __future__ import annotations

from typing import Callable, TypeVar

F = TypeVar("F", bound=Callable)


def call_if_main(name: str = "__main__", discard: bool | None = None) -> Callable[[F], F | None]:
    """Decorator: run the function at once when `name` is "__main__".

    `discard` says whether the decorated name is kept; by default it is dropped in a script
    (name == "__main__") and kept in an imported module.
    """
    running = name == "__main__"
    drop = running if discard is None else discard

    def decorator(fn: F) -> F | None:
        if running:
            fn()
        return None if drop else fn

    return decorator


def div_even(a: int, b: int, allow_replicate: bool = False) -> int:
    """a / b, which must divide exactly. With allow_replicate, b > a is allowed when a divides
    b (more ranks than key/value heads: each head is replicated), and the answer is 1."""
    if allow_replicate and b > a:
        assert b % a == 0, f"{b=} must be a multiple of {a=} to replicate"
        return 1
    assert a % b == 0, f"{a=} must be a multiple of {b=}"
    return a // b


def div_ceil(a: int, b: int) -> int:
    return (a + b - 1) // b


def align_ceil(a: int, b: int) -> int:
    """The smallest multiple of b that is >= a."""
    return div_ceil(a, b) * b


def align_down(a: int, b: int) -> int:
    """The largest multiple of b that is <= a."""
    return (a // b) * b


class Unset:
    """The type of UNSET: "no value given", where None is a meaningful value."""

    def __repr__(self) -> str:
        return "UNSET"


UNSET = Unset()
