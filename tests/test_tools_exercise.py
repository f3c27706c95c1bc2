"""tools/exercise.py: blanking a body, and the proof that every exercise of the book is real."""

from __future__ import annotations

import ast
import textwrap

import pytest

from tools.exercise import blank_function, verify
from tools.book import Book, BookError

SOURCE = textwrap.dedent(
    '''
    def plain(x):
        return x + 1


    def documented(x):
        """Keep me."""
        y = x * 2
        return y


    class Box:
        def method(self, x):
            """Doc."""
            return x

        @property
        def size(self):
            return 3
    '''
)


def test_blank_keeps_the_signature_and_docstring() -> None:
    out = blank_function(SOURCE, "documented", "ex-1", "double it")
    assert '"""Keep me."""' in out and "y = x * 2" not in out
    assert "raise NotImplementedError('exercise ex-1: write the body of documented')" in out
    assert "# double it" in out
    ast.parse(out)  # still valid Python
    ns: dict = {}
    exec(out, ns)
    assert ns["plain"](1) == 2
    with pytest.raises(NotImplementedError, match="ex-1"):
        ns["documented"](1)


def test_blank_a_method() -> None:
    out = blank_function(SOURCE, "Box.method", "ex-2", "")
    ns: dict = {}
    exec(out, ns)
    with pytest.raises(NotImplementedError):
        ns["Box"]().method(1)
    assert ns["Box"]().size == 3


def test_blank_unknown_names_fail_clearly() -> None:
    with pytest.raises(BookError, match="not found"):
        blank_function(SOURCE, "nothing", "x", "")
    with pytest.raises(BookError, match="not found"):
        blank_function(SOURCE, "Box.nothing", "x", "")


def test_every_exercise_in_the_book_is_real() -> None:
    """For every exercise: with its body removed the chapter's tests fail (on our
    NotImplementedError), and with the book's body they pass."""
    book = Book()
    verdicts = verify(book)
    assert len(verdicts) == sum(len(c.exercises) for c in book.chapters) >= 3
    for v in verdicts:
        assert v.blank_fails, f"{v.exercise.id}: the tests pass without the body\n{v.detail}"
        assert v.solution_passes, f"{v.exercise.id}: the book's body fails its tests\n{v.detail}"
