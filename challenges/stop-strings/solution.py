"""The book's StopMatcher: hold back the longest end of the unshown text that could still grow
into a stop string, and nothing more."""

from __future__ import annotations

from typing import List, Tuple


class StopMatcher:
    def __init__(self, stops: List[str]) -> None:
        self.stops = [s for s in stops if s]
        self.pending = ""  # received, not yet shown

    def _held(self, text: str) -> int:
        """Length of the longest end of `text` that is a proper prefix of a stop string."""
        best = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(text)), best, -1):
                if text.endswith(stop[:n]):
                    best = n
                    break
        return best

    def feed(self, piece: str) -> Tuple[str, bool]:
        text = self.pending + piece
        found = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        if found:
            self.pending = ""
            return text[: min(found)], True
        keep = self._held(text)
        self.pending = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep], False

    def flush(self) -> str:
        rest, self.pending = self.pending, ""
        return rest
