"""The "what it prints" check must give the same verdict on every machine: on the book's own
pages, every number that depends on the machine is compared within its tolerance (or not at
all), and everything else exactly."""

from __future__ import annotations

import random
import re
from typing import List, Tuple

import pytest

from tools.book import Book, Manifest
from tools.prints import PrintRules, Tolerance, compare, skeleton
from tools.steps import prints_blocks

BOOK = Book()
BLOCKS: List[Tuple[Manifest, str]] = [
    (chapter, block["body"]) for chapter in BOOK.chapters for block in prints_blocks(BOOK, chapter)
]
# a number with three decimals or more, or in scientific notation, looks like a measurement
MEASURED_RE = re.compile(r"\d+\.\d{3,}|\d(?:\.\d+)?e[-+]\d+")


def perturb(text: str, rules: PrintRules, scale: float, rng: random.Random) -> str:
    """Move every number that a rule covers: approx numbers by `scale` times their tolerance
    (up or down at random), masked ones anywhere."""
    for rule in rules.approx:

        def move(match: re.Match, rule: Tolerance = rule) -> str:
            old = match.group("v")
            value = float(old)
            sign = rng.choice((-1, 1))
            if rule.abs:
                new = max(0.0, value + sign * scale * rule.abs)
            else:
                new = value * rule.factor ** (sign * scale)
            digits = len(old.split(".")[1]) if "." in old and "e" not in old else None
            return _replace_v(match, f"{new:.{digits}f}" if digits is not None else f"{new:.2e}")

        text = re.sub(rule.pattern, move, text, flags=re.MULTILINE)
    for pattern in rules.mask:
        text = re.sub(pattern, lambda m: _replace_v(m, " 98765"), text, flags=re.MULTILINE)
    return text


def _replace_v(match: re.Match, new: str) -> str:
    if "v" not in match.re.groupindex:
        return new
    start, end = match.span("v")
    base = match.start()
    return match.group(0)[: start - base] + new + match.group(0)[end - base :]


def label(item: Tuple[Manifest, str]) -> str:
    return f"ch{item[0].label}"


@pytest.mark.parametrize("chapter, block", BLOCKS, ids=[label(b) for b in BLOCKS])
def test_machine_noise_within_the_tolerances_passes(chapter: Manifest, block: str) -> None:
    rules = BOOK.print_rules(chapter)
    rng = random.Random(chapter.number)
    for _ in range(5):
        noisy = perturb(block, rules, 0.8, rng)
        assert compare(block, noisy, rules) == [], noisy


@pytest.mark.parametrize("chapter, block", BLOCKS, ids=[label(b) for b in BLOCKS])
def test_a_number_outside_its_tolerance_fails(chapter: Manifest, block: str) -> None:
    rules = BOOK.print_rules(chapter)
    assert rules.approx, "every block shows margins"
    moved = perturb(block, PrintRules(approx=rules.approx), 3.0, random.Random(1))
    assert moved != block and compare(block, moved, rules)


@pytest.mark.parametrize("chapter, block", BLOCKS, ids=[label(b) for b in BLOCKS])
def test_a_changed_token_count_fails(chapter: Manifest, block: str) -> None:
    rules = BOOK.print_rules(chapter)
    changed = re.sub(r"tokens=(\d+)/", lambda m: f"tokens={int(m[1]) - 1}/", block)
    assert changed != block and compare(block, changed, rules)


@pytest.mark.parametrize("chapter, block", BLOCKS, ids=[label(b) for b in BLOCKS])
def test_every_measured_number_is_covered_by_a_rule(chapter: Manifest, block: str) -> None:
    """A number printed like a measurement must be compared loosely or masked: else the check
    would compare the author's CPU with the reader's."""
    exact_part, _ = skeleton(block, BOOK.print_rules(chapter))
    assert not MEASURED_RE.findall(exact_part)
