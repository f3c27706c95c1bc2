"""Your StopMatcher (challenge stop-strings). Run: python tools/challenge.py check stop-strings"""

from __future__ import annotations

from typing import List, Tuple


class StopMatcher:
    def __init__(self, stops: List[str]) -> None:
        self.stops = [s for s in stops if s]

    def feed(self, piece: str) -> Tuple[str, bool]:
        raise NotImplementedError("return (text safe to show, whether a stop string was found)")

    def flush(self) -> str:
        raise NotImplementedError("return what is still held back")
