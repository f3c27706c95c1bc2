"""The "what it prints" blocks: a page shows a main's output, and the check compares it with a
fresh run.

A number that depends on the machine (its CPU, its BLAS, the number of threads, the load) must
not make the check fail on another machine. Two kinds of rule say which numbers those are,
book-wide in ``chapters/book.toml`` and per chapter in its manifest, under ``[prints]``:

* ``approx``: numbers compared within a tolerance: ``{ pattern = '...(?P<v>...)...',
  abs = 0.002 }`` (an absolute difference) or ``factor = 10`` (a ratio), with a ``why``.
  Each is replaced by a placeholder, so the rest of its line is still compared.
* ``mask``: regular expressions for what is not compared at all (timings), applied after the
  ``approx`` rules. The group named ``v``, or the whole match, becomes ``#`` on both sides.

Everything else, token counts and texts included, must match exactly.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from typing import Dict, List, Sequence, Tuple

PRINTS_RE = re.compile(r"<!-- prints: (?P<main>\S+) -->\s*\n```text\n(?P<body>.*?)```", re.DOTALL)
PLACEHOLDER = "\u2248"  # where an approximately compared number stood


@dataclass(frozen=True)
class Tolerance:
    """Numbers matched by `pattern` (its group "v") may differ by `abs`, or by a `factor`."""

    pattern: str
    abs: float = 0.0
    factor: float = 1.0
    why: str = ""

    def accepts(self, shown: float, fresh: float) -> bool:
        if abs(shown - fresh) <= self.abs:
            return True
        if self.factor > 1.0 and shown > 0 and fresh > 0:
            return max(shown, fresh) / min(shown, fresh) <= self.factor
        return False

    def describe(self) -> str:
        return f"+-{self.abs:g}" if self.abs else f"within a factor of {self.factor:g}"


@dataclass
class PrintRules:
    mask: List[str] = field(default_factory=list)
    approx: List[Tolerance] = field(default_factory=list)

    @staticmethod
    def from_toml(data: Dict) -> "PrintRules":
        approx = [Tolerance(**item) for item in data.get("approx", [])]
        return PrintRules(mask=list(data.get("mask", [])), approx=approx)

    def __add__(self, other: "PrintRules") -> "PrintRules":
        return PrintRules(self.mask + other.mask, self.approx + other.approx)


def normalise(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines())


def mask_output(text: str, patterns: Sequence[str]) -> str:
    """Replace what varies from run to run by "#": each pattern's group named "v" if it has
    one, else its whole match."""
    masked = normalise(text)

    def replace(match: re.Match) -> str:
        if "v" not in match.re.groupindex:
            return "#"
        start, end = match.span("v")
        whole_start = match.start()
        return match.group(0)[: start - whole_start] + "#" + match.group(0)[end - whole_start :]

    for pattern in patterns:
        masked = re.sub(pattern, replace, masked, flags=re.MULTILINE)
    return masked


def _pull_numbers(text: str, rules: Sequence[Tolerance]) -> Tuple[str, List[Tuple[Tolerance, str]]]:
    """The text with every approximately compared number replaced by PLACEHOLDER, and those
    numbers in order of appearance, each with its rule."""
    found: List[Tuple[int, Tolerance, str]] = []
    spans: List[Tuple[int, int]] = []
    for rule in rules:
        for match in re.finditer(rule.pattern, text, flags=re.MULTILINE):
            start, end = match.span("v")
            if any(s < end and start < e for s, e in spans):
                continue  # an earlier rule took this number
            spans.append((start, end))
            found.append((start, rule, match.group("v")))
    found.sort(key=lambda item: item[0])
    pieces, last = [], 0
    for start, _, number in found:
        pieces.append(text[last:start])
        pieces.append(PLACEHOLDER)
        last = start + len(number)
    pieces.append(text[last:])
    # a number that grew a digit shifts its column: padding before a placeholder is not compared
    skeleton = re.sub(r" +" + PLACEHOLDER, " " + PLACEHOLDER, "".join(pieces))
    return skeleton, [(rule, number) for _, rule, number in found]


def skeleton(text: str, rules: PrintRules) -> Tuple[str, List[Tuple[Tolerance, str]]]:
    """What must match exactly (the text, approximate numbers as placeholders, masked parts as
    "#"), and the approximate numbers with their rules."""
    pulled, numbers = _pull_numbers(normalise(text), rules.approx)
    return mask_output(pulled, rules.mask), numbers


def compare(shown: str, fresh: str, rules: PrintRules) -> List[str]:
    """Why the page's block `shown` does not stand for the fresh output (empty: it does)."""
    shown_skeleton, shown_numbers = skeleton(shown, rules)
    fresh_skeleton, fresh_numbers = skeleton(fresh, rules)
    if shown_skeleton != fresh_skeleton:  # show the texts themselves, not the skeletons
        diff = difflib.unified_diff(
            normalise(shown).splitlines(),
            normalise(fresh).splitlines(),
            "in the page",
            "the main now",
            lineterm="",
        )
        return ["\n".join(diff)]
    problems = []
    for (rule, a), (_, b) in zip(shown_numbers, fresh_numbers):
        if not rule.accepts(float(a), float(b)):
            problems.append(f"{a} in the page, {b} now (allowed: {rule.describe()}; {rule.why})")
    return problems
