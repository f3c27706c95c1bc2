"""tools/exercise.py: blanking a body, and telling a real exercise from one that its tests do
not judge."""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

import pytest

from tools.book import Book, BookError
from tools.exercise import blank_function, verify

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


GENERATORS = textwrap.dedent(
    """
    def numbers(n):
        for i in range(n):
            yield i


    async def pieces(n):
        for i in range(n):
            yield str(i)


    def returns_a_generator(n):
        def inner():
            yield n  # the yield of a nested function: returns_a_generator is no generator
        return inner()
    """
)


def test_a_blanked_generator_is_still_one_and_raises_when_iterated() -> None:
    import asyncio

    ns: dict = {}
    exec(blank_function(GENERATORS, "numbers", "ex-g", ""), ns)
    with pytest.raises(NotImplementedError, match="ex-g"):
        list(ns["numbers"](3))

    exec(blank_function(GENERATORS, "pieces", "ex-a", ""), ns)

    async def consume() -> list:
        return [piece async for piece in ns["pieces"](3)]

    with pytest.raises(NotImplementedError, match="ex-a"):
        asyncio.run(consume())
    out = blank_function(GENERATORS, "returns_a_generator", "ex-r", "")
    assert "yield" not in out.split("def returns_a_generator")[1]  # a plain function stays one


def test_blank_unknown_names_fail_clearly() -> None:
    with pytest.raises(BookError, match="not found"):
        blank_function(SOURCE, "nothing", "x", "")
    with pytest.raises(BookError, match="not found"):
        blank_function(SOURCE, "Box.nothing", "x", "")


def test_verify_tells_a_real_exercise_from_one_its_tests_do_not_judge(tmp_path: Path) -> None:
    """The book's own exercises are verified by `python tools/exercise.py verify` in .ci/run
    (every chapter's tests, twice per exercise: several minutes); here, on a small book, the
    same verdicts in both directions."""
    files = {
        "chapters/book.toml": 'package = "minisgl"\n',
        "chapters/ch00/manifest.toml": """
            chapter = 0
            title = "zero"
            main = "examples/ch00_main.py"
            tests = ["tests/test_ch00_calc.py"]
            creates = ["minisgl/__init__.py", "minisgl/calc.py"]
            [[exercise]]
            id = "ch00-double"
            file = "minisgl/calc.py"
            function = "double"
            tests = ["tests/test_ch00_calc.py::test_double"]
            [[exercise]]
            id = "ch00-unjudged"
            file = "minisgl/calc.py"
            function = "unused"
            tests = ["tests/test_ch00_calc.py::test_double"]
            """,
        "minisgl/__init__.py": "",
        "minisgl/calc.py": "def double(x):\n    return 2 * x\n\n\ndef unused(x):\n    return x\n",
        "examples/ch00_main.py": "print('parity: models=1 prompts=1 tokens=1/1 min_margin=1.0')\n",
        "tests/test_ch00_calc.py": "from minisgl.calc import double\n\n\n"
        "def test_double():\n    assert double(2) == 4\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(textwrap.dedent(text).lstrip("\n"))
    verdicts = {v.exercise.id: v for v in verify(Book(tmp_path))}
    assert verdicts["ch00-double"].real
    assert verdicts["ch00-unjudged"].solution_passes and not verdicts["ch00-unjudged"].blank_fails


def test_every_exercise_names_a_function_and_tests_that_exist() -> None:
    """Cheap checks on the book's exercises (the full proof runs in .ci/run)."""
    book = Book()
    exercises = [(c, ex) for c in book.chapters for ex in c.exercises]
    assert len(exercises) >= 19 and len({ex.id for _, ex in exercises}) == len(exercises)
    for chapter, ex in exercises:
        source = book.package_files(chapter.number).get(ex.file, book.root / ex.file).read_text()
        blank_function(source, ex.function, ex.id, ex.hint)  # the function exists
        for test in ex.tests:
            path, name = test.split("::", 1)
            assert path in book.tests_at(chapter.number), (
                f"{ex.id}: {path} does not run in its chapter"
            )
            base = re.escape(name.split("[")[0].split("::")[0])
            defined = rf"^(?:def|class) {base}\b|^{re.escape(name)} = "
            assert re.search(defined, (book.root / path).read_text(), re.M), f"{ex.id}: no {name}"
