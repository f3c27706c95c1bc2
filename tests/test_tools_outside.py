"""tools/outside.py: what a test's own code, and the helpers it imports, read, test by test."""

from __future__ import annotations

import textwrap
from typing import Dict

from tools.outside import OutsideFile, OutsideReads, missing_imports, read_outside, top_level_names

FILES = {
    "tests/conftest.py": """
        import pytest
        from minisgl.core import Watched

        @pytest.fixture
        def engine():
            return Engine()

        @pytest.fixture(autouse=True)
        def tidy():
            yield
            Watched.check()
        """,
    "tools/helper.py": """
        from minisgl.scheduler import Scheduler, SchedulerConfig

        def make_config():
            return SchedulerConfig()

        def make_scheduler():
            return Scheduler(make_config())

        def unrelated():
            return Batch()

        if __name__ == "__main__":
            print(Context())
        """,
    "tools/loaded.py": """
        def build():
            return LoadedThing()
        """,
    "tests/test_x.py": """
        import pytest
        import tools.helper
        from minisgl.core import ENV as PACKAGE_ENV, Req, VALUE
        from tools.helper import make_config

        ENV = {"mode": "test"}  # the file's own: not minisgl's ENV
        RUN = ["python", "tools/helper.py"]

        def _value():
            return VALUE

        def test_config():
            assert make_config() is not None and ENV["mode"] == "test"

        def test_scheduler():
            assert tools.helper.make_scheduler()

        def test_value(engine):
            assert _value() == 1

        def test_package_env():
            assert PACKAGE_ENV

        @pytest.mark.parametrize("n", SIZES)
        def test_sizes(n):
            assert n

        def test_runs_the_helper():
            assert RUN

        LOADED = load("tools/loaded.py")  # a module loaded by its path, for every function

        def test_a_loaded_module():
            assert LOADED.build()

        class TestGroup:
            def test_one(self):
                assert Req

            @pytest.mark.parametrize("k", KINDS)  # a method's decorator runs at import
            def test_kinds(self, k):
                assert k

        def test_inner_definitions():
            @memoize(INNER_CACHE)  # runs when this test runs, not at import
            def inner():
                return 1

            assert inner()
        """,
}


def outside(files: Dict[str, str] = FILES) -> Dict[str, OutsideFile]:
    return {rel: read_outside(textwrap.dedent(text), rel) for rel, text in files.items()}


def reads(name: str) -> set:
    return OutsideReads(outside()).of("tests/test_x.py", name)


def test_a_test_reads_what_it_reaches_by_name_and_nothing_else() -> None:
    # its own function, then make_config imported from tools/helper.py; not the helper's
    # other functions, nor the other tests' names
    config = reads("test_config")
    assert "SchedulerConfig" in config
    assert not {"Scheduler", "Batch", "VALUE", "Req", "Context"} & config
    # an attribute of a module the file imports whole
    assert {"Scheduler", "SchedulerConfig"} <= reads("test_scheduler")
    # its own helper, and the fixture its argument names (in conftest.py)
    value = reads("test_value")
    assert {"VALUE", "Engine"} <= value and "Scheduler" not in value
    # a class counts whole
    assert "Req" in reads("TestGroup")
    # a function of a module the file loaded by its path
    assert "LoadedThing" in reads("test_a_loaded_module")
    assert "LoadedThing" not in reads("test_config")


def test_imports_are_followed_through_re_exports_relative_and_star_imports() -> None:
    files = {
        "tests/support/__init__.py": "from .kit import make_kit\n",
        "tests/support/kit.py": """
            def make_kit():
                return KitThing()

            def other():
                return OtherThing()
            """,
        "tests/test_y.py": """
            from tests.support import make_kit
            from tests.support.kit import *

            def test_kit():
                assert make_kit()

            def test_other():
                assert other()
            """,
    }
    reader = OutsideReads(outside(files))
    assert "KitThing" in reader.of("tests/test_y.py", "test_kit")
    assert "OtherThing" not in reader.of("tests/test_y.py", "test_kit")
    assert "OtherThing" in reader.of("tests/test_y.py", "test_other")


def test_what_runs_for_every_test_counts_for_every_test() -> None:
    for name in ("test_config", "test_value", "TestGroup"):
        found = reads(name)
        assert "SIZES" in found  # a parametrize list: it decides which tests there are
        assert "KINDS" in found  # and a method's
        assert ".check" in found and "Watched" in found  # an autouse fixture


def test_a_decorator_inside_a_function_counts_where_the_function_runs() -> None:
    assert {"memoize", "INNER_CACHE"} <= reads("test_inner_definitions")
    assert not {"memoize", "INNER_CACHE"} & reads("test_config")


def test_a_name_the_file_binds_itself_is_its_own() -> None:
    assert "ENV" not in reads("test_config")  # the file's ENV = {...}
    assert "ENV" in reads("test_package_env")  # minisgl's ENV, imported under another name


def test_a_main_block_counts_only_where_the_file_is_named() -> None:
    assert "Context" not in reads("test_scheduler")  # imported: its main block never runs
    assert "Context" in reads("test_runs_the_helper")  # run as a program: "tools/helper.py"


def test_an_import_the_package_no_longer_has_is_named() -> None:
    files = outside()
    exists = {
        "minisgl": set(),
        "minisgl.core": {"ENV", "Req", "Watched"},  # VALUE is gone
        "minisgl.scheduler": {"Scheduler", "SchedulerConfig"},
    }
    assert missing_imports(files, "minisgl", exists) == [
        "tests/test_x.py imports VALUE from minisgl.core, which no longer has it"
    ]
    del exists["minisgl.scheduler"]
    assert "tools/helper.py imports minisgl.scheduler, which is gone" in missing_imports(
        files, "minisgl", exists
    )


def test_top_level_names_include_those_under_an_if_or_a_try() -> None:
    source = textwrap.dedent(
        """
        import os
        from a import b as c
        try:
            import fast
        except ImportError:
            fast = None
        if os.name == "nt":
            def windows(): ...
        else:
            LIMIT: int = 3
        def f():
            inner = 1
        """
    )
    assert top_level_names(source) == {"os", "c", "fast", "windows", "LIMIT", "f"}
