"""Checker of the stop-strings challenge: every way of splitting a few answers into pieces."""

from __future__ import annotations

import itertools
from typing import List, Tuple

import pytest

CASES: List[Tuple[str, List[str]]] = [
    ("The capital of France is Paris.\n\nUser: thanks", ["\n\nUser:"]),
    ("aaab and more", ["aab"]),  # a stop string that overlaps itself
    ("xaabaab", ["aab", "ab"]),  # one stop string inside another; the earliest wins
    ("one, two; three", [",", ";"]),  # one character long
    ("no stop here at all", ["STOP", "END"]),
    ("plain text", []),
    ("<|end|> at once", ["<|end|>"]),
    ("ends with a partial <|en", ["<|end|>"]),
]


def longest_prefix_end(text: str, stops: List[str]) -> int:
    return max(
        (n for s in stops for n in range(1, len(s)) if len(text) >= n and text.endswith(s[:n])),
        default=0,
    )


def splits(text: str, max_cuts: int = 3):
    for k in range(max_cuts + 1):
        for cuts in itertools.combinations(range(1, len(text)), k):
            bounds = (0, *cuts, len(text))
            yield [text[a:b] for a, b in zip(bounds, bounds[1:])]


@pytest.mark.parametrize("answer,stops", CASES)
def test_every_split_shows_the_cut_answer_as_early_as_possible(candidate, answer, stops) -> None:
    hits = [i for i in (answer.find(s) for s in stops if s) if i >= 0]
    cut = min(hits) if hits else len(answer)
    expected, stop_end = (
        answer[:cut],
        min((answer.find(s) + len(s) for s in stops if s and answer.find(s) == cut), default=None),
    )
    for pieces in splits(answer):
        matcher = candidate.StopMatcher(list(stops))
        shown, received, stopped = "", "", False
        for piece in pieces:
            received += piece
            out, stopped = matcher.feed(piece)
            shown += out
            assert expected.startswith(shown), f"{pieces}: showed {shown!r}, beyond the cut"
            if stopped:
                break
            held = received[len(shown) :]
            allowed = longest_prefix_end(received, [s for s in stops if s])
            assert len(held) <= allowed, f"{pieces}: held {held!r} back after {received!r}"
        if stop_end is not None:
            assert stopped and len(received) >= stop_end, f"{pieces}: stop string missed"
            assert len(received) - len(piece) < stop_end, f"{pieces}: reported late"
        else:
            assert not stopped
            shown += matcher.flush()
        assert shown == expected, f"{pieces}: showed {shown!r}"
