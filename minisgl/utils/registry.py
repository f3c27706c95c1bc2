"""Name -> implementation tables (attention backends, cache managers, ...)."""

from __future__ import annotations

from argparse import ArgumentTypeError
from typing import Callable, Dict, Generic, Iterable, List, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, type: str) -> None:
        self._registry: Dict[str, T] = {}
        self._type = type  # what the entries are, for error messages

    def register(self, name: str) -> Callable[[T], T]:
        if name in self._registry:
            raise KeyError(f"{self._type} {name!r} is already registered")

        def decorator(item: T) -> T:
            self._registry[name] = item
            return item

        return decorator

    def __getitem__(self, name: str) -> T:
        if name not in self._registry:
            raise KeyError(f"unsupported {self._type}: {name!r} (known: {self.supported_names()})")
        return self._registry[name]

    def supported_names(self) -> List[str]:
        return list(self._registry)

    def assert_supported(self, names: str | Iterable[str]) -> None:
        """Raise an argparse-friendly error for any name that is not registered."""
        for name in [names] if isinstance(names, str) else names:
            if name not in self._registry:
                raise ArgumentTypeError(
                    f"unsupported {self._type}: {name!r}; supported: {self.supported_names()}"
                )
