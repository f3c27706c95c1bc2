"""tools/upstream/ against a small fixture upstream repository and a fixture book root.

The fixture upstream has two commits: the first is the one the tests pin to, the second changes
utils.py. Our side differs from it on purpose: a missing method, an extra function and method, a
changed signature, an annotation spelled differently, an identical module, files on one side only.
Everything runs offline on local git repositories.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from tools.upstream.api_compare import (
    STATUSES,
    ModuleApi,
    api_report,
    compare_api,
    count_statuses,
    format_api,
)
from tools.upstream.api_normalize import normalize_annotation
from tools.upstream.api_read import module_api
from tools.upstream.cli import main
from tools.upstream.diff import diff_report
from tools.upstream.git import clone_dir_for, is_url
from tools.upstream.sides import open_upstream, ours_from_chapter, ours_from_package

ROOT = Path(__file__).resolve().parents[1]

GIT_ENV = {
    "GIT_AUTHOR_NAME": "Fixture",
    "GIT_AUTHOR_EMAIL": "fixture@example.com",
    "GIT_COMMITTER_NAME": "Fixture",
    "GIT_COMMITTER_EMAIL": "fixture@example.com",
    "GIT_CONFIG_NOSYSTEM": "1",
}

UPSTREAM_CORE = """\
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional


@dataclass
class SamplingParams:
    temperature: float = 0.0
    top_k: int = -1
    stop: List[int] = field(default_factory=list)

    @property
    def is_greedy(self) -> bool:
        return self.temperature <= 0.0


class Req:
    def __init__(self, uid: int, input_ids: List[int], max_tokens: int = 16) -> None:
        self.uid = uid

    def append(self, token: int) -> None:
        pass

    def finished(self) -> bool:
        return False

    def __call__(self, x: int) -> int:
        return x

    def _private(self) -> None:
        pass


def make_req(uid: int, prompt: Optional[List[int]] = None, *, max_tokens: int = 16) -> Req:
    return Req(uid, prompt or [], max_tokens)


def _helper() -> None:
    pass
"""

OUR_CORE = """\
from dataclasses import dataclass, field


@dataclass
class SamplingParams:
    temperature: float = 0.0
    top_k: "int" = -1
    stop: list[int] = field(default_factory=list)

    @property
    def is_greedy(self) -> bool:
        return self.temperature <= 0.0


class Req:
    def __init__(self, uid: int, input_ids: list[int], max_tokens: int = 32) -> None:
        self.uid = uid

    def append(self, token: str) -> None:
        pass

    def __call__(self, x: int) -> int:
        return x

    def reset(self) -> None:
        pass


def make_req(uid: int, prompt: list[int] | None = None, *, max_tokens: int = 16) -> Req:
    return Req(uid, prompt or [], max_tokens)


def helper_of_ours() -> int:
    return 1
"""

UTILS_V1 = """\
def clamp(x: int, lo: int = 0, hi: int = 10) -> int:
    return max(lo, min(hi, x))
"""
UTILS_V2 = UTILS_V1.replace("hi: int = 10", "hi: int = 100")
SERVER = "def serve(port: int = 8000) -> None:\n    pass\n"
EXTRA = "def only_here() -> None:\n    pass\n"

# What `api` must say about core.py at the default level, in this order.
CORE_ROWS = [
    ("SamplingParams", "match"),
    ("SamplingParams.temperature", "match"),
    ("SamplingParams.top_k", "match"),
    ("SamplingParams.stop", "match"),
    ("SamplingParams.is_greedy", "match"),
    ("Req", "match"),
    ("Req.__init__", "different"),
    ("Req.append", "match"),
    ("Req.finished", "missing"),
    ("Req.__call__", "match"),
    ("Req.reset", "extra"),
    ("make_req", "match"),
    ("helper_of_ours", "extra"),
]


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "commit.gpgsign=false", "-c", "init.defaultBranch=main", *args],
        cwd=repo,
        env={**os.environ, **GIT_ENV},
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def commit_all(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


@dataclass(frozen=True)
class Fixture:
    upstream: Path  # a checkout with a work tree
    first: str  # the commit the tests pin to
    second: str  # HEAD: utils.py changed
    ours: Path  # a book root with minisgl/


@pytest.fixture(scope="module")
def fx(tmp_path_factory: pytest.TempPathFactory) -> Fixture:
    base = tmp_path_factory.mktemp("upstream")
    repo = base / "mini-sglang"
    repo.mkdir()
    git(repo, "init", "-q")
    write(
        repo,
        {
            "README.md": "not part of the package\n",
            "python/minisgl/__init__.py": "",
            "python/minisgl/core.py": UPSTREAM_CORE,
            "python/minisgl/utils.py": UTILS_V1,
            "python/minisgl/server.py": SERVER,
            "python/minisgl/kernel/store.cu": "// a kernel\n",
        },
    )
    first = commit_all(repo, "first")
    write(repo, {"python/minisgl/utils.py": UTILS_V2})
    second = commit_all(repo, "second")

    ours = base / "book"
    write(
        ours,
        {
            "minisgl/__init__.py": "",
            "minisgl/core.py": OUR_CORE,
            "minisgl/utils.py": UTILS_V1,
            "minisgl/extra.py": EXTRA,
        },
    )
    (ours / "minisgl" / "__pycache__").mkdir()
    (ours / "minisgl" / "__pycache__" / "core.cpython-311.pyc").write_bytes(b"\0junk")
    return Fixture(repo, first, second, ours)


@pytest.fixture(autouse=True)
def _no_user_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Never touch the reader's clone cache, never fall back to the GitHub URL."""
    monkeypatch.setenv("MINISGL_BOOK_CACHE", str(tmp_path / "book-cache"))
    monkeypatch.delenv("MINISGL_UPSTREAM", raising=False)


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def base_args(fx: Fixture, command: str, commit: str | None = None) -> list[str]:
    return [
        command,
        "--upstream",
        str(fx.upstream),
        "--commit",
        commit or fx.first,
        "--repo-root",
        str(fx.ours),
    ]


def statuses(modules: list[ModuleApi], module: str) -> list[tuple[str, str]]:
    [found] = [m for m in modules if m.module == module]
    return [(r.name, r.status) for r in found.rows]


# ----------------------------------------------------------------------------------- upstream


def test_open_upstream_reads_the_pinned_commit(fx: Fixture) -> None:
    u = open_upstream(str(fx.upstream), fx.first)
    assert u.commit == fx.first
    assert u.files == ["__init__.py", "core.py", "kernel/store.cu", "server.py", "utils.py"]
    assert u.read("utils.py").decode() == UTILS_V1
    assert open_upstream(str(fx.upstream), fx.second).read("utils.py").decode() == UTILS_V2
    assert open_upstream(str(fx.upstream), fx.first[:10]).commit == fx.first  # a prefix works


def test_bare_git_dir_works(fx: Fixture, tmp_path: Path) -> None:
    bare = tmp_path / "bare.git"
    git(tmp_path, "clone", "-q", "--bare", str(fx.upstream), str(bare))
    u = open_upstream(str(bare), fx.first)
    assert u.git_dir == bare.resolve()
    assert u.read("core.py").decode() == UPSTREAM_CORE


def test_clone_from_url_into_the_cache_then_fetch(fx: Fixture, tmp_path: Path) -> None:
    source = tmp_path / "source"
    git(tmp_path, "clone", "-q", str(fx.upstream), str(source))
    url, cache = source.as_uri(), tmp_path / "cache"
    assert is_url(url) and not is_url(str(source))

    u = open_upstream(url, fx.first, cache)
    assert u.git_dir == clone_dir_for(url, cache) and u.git_dir.parent == cache
    assert u.read("utils.py").decode() == UTILS_V1

    write(source, {"python/minisgl/utils.py": "# third\n"})
    third = commit_all(source, "third")  # not in the cache yet: open_upstream must fetch it
    assert open_upstream(url, third, cache).read("utils.py") == b"# third\n"

    shutil.rmtree(source)  # offline again: the cached clone still serves known commits
    assert open_upstream(url, fx.second, cache).read("utils.py").decode() == UTILS_V2
    assert [p.name for p in cache.iterdir()] == [u.git_dir.name]  # no leftover staging folder


def test_cli_with_a_file_url(
    fx: Fixture, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [
        "diff",
        "--upstream",
        fx.upstream.as_uri(),
        "--commit",
        fx.first,
        "--repo-root",
        str(fx.ours),
        "--cache-dir",
        str(tmp_path),
        "--stat",
        "utils.py",
    ]
    rc, out, err = cli(capsys, *args)
    assert rc == 0
    assert out.splitlines()[0] == "identical: minisgl/utils.py"
    assert "cloning" in err


# --------------------------------------------------------------------------------------- diff


def test_diff_one_file(fx: Fixture, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = cli(capsys, *base_args(fx, "diff"), "minisgl/core.py")
    assert rc == 0
    lines = out.splitlines()
    assert lines[0] == f"--- upstream/python/minisgl/core.py\t{fx.first[:12]}"
    assert lines[1] == "+++ minisgl/core.py\tours"
    assert "-    def finished(self) -> bool:" in lines
    assert (
        "-    def __init__(self, uid: int, input_ids: List[int], max_tokens: int = 16) -> None:"
        in lines
    )
    assert (
        "+    def __init__(self, uid: int, input_ids: list[int], max_tokens: int = 32) -> None:"
        in lines
    )
    assert "+def helper_of_ours() -> int:" in lines
    added = sum(1 for line in lines[2:] if line.startswith("+"))
    removed = sum(1 for line in lines[2:] if line.startswith("-"))
    assert lines[-2] == f"differ: minisgl/core.py (+{added} -{removed})"
    assert lines[-1].startswith("summary: 1 differ, 0 identical, 0 only ours, 0 only upstream")


def test_diff_all_files_lists_each_side(fx: Fixture, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = cli(capsys, *base_args(fx, "diff"), "--stat")
    assert rc == 0
    assert out.splitlines()[1:] == [
        "only ours: minisgl/extra.py",
        "only upstream: minisgl/kernel/store.cu",
        "only upstream: minisgl/server.py",
        "identical: minisgl/__init__.py",
        "identical: minisgl/utils.py",
        (
            "summary: 1 differ, 2 identical, 1 only ours, 2 only upstream "
            f"(ours: minisgl/; upstream: python/minisgl/ at {fx.first[:12]})"
        ),
    ]
    assert out.splitlines()[0].startswith("differ: minisgl/core.py (+")
    assert "pycache" not in out


def test_file_names_in_every_spelling(fx: Fixture) -> None:
    ours = ours_from_package(fx.ours)
    u = open_upstream(str(fx.upstream), fx.first)
    for name in ("core.py", "minisgl/core.py", "python/minisgl/core.py", "./minisgl/core.py"):
        assert [d.path for d in diff_report(ours, u, [name])] == ["core.py"]
    assert [d.path for d in diff_report(ours, u, ["kernel/"])] == ["kernel/store.cu"]
    assert [d.status for d in diff_report(ours, u, ["extra.py", "server.py"])] == [
        "only ours",
        "only upstream",
    ]


def test_commit_pin_picks_the_version(fx: Fixture, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = cli(capsys, *base_args(fx, "diff", fx.first), "utils.py")
    assert (rc, out.splitlines()[0]) == (0, "identical: minisgl/utils.py")
    rc, out, _ = cli(capsys, *base_args(fx, "diff", fx.second), "utils.py")
    assert rc == 0
    assert "-def clamp(x: int, lo: int = 0, hi: int = 100) -> int:" in out.splitlines()
    assert "+def clamp(x: int, lo: int = 0, hi: int = 10) -> int:" in out.splitlines()
    assert "differ: minisgl/utils.py (+1 -1)" in out.splitlines()


# ---------------------------------------------------------------------------------------- api


def test_api_statuses(fx: Fixture) -> None:
    ours = ours_from_package(fx.ours)
    u = open_upstream(str(fx.upstream), fx.first)
    modules = api_report(ours, u)
    assert [(m.module, m.side) for m in modules] == [
        ("__init__.py", "both"),
        ("core.py", "both"),
        ("extra.py", "only ours"),
        ("server.py", "only upstream"),
        ("utils.py", "both"),
    ]
    assert statuses(modules, "core.py") == CORE_ROWS
    assert statuses(modules, "extra.py") == [("only_here", "extra")]
    assert statuses(modules, "server.py") == [("serve", "missing")]
    assert statuses(modules, "utils.py") == [("clamp", "match")]
    assert count_statuses(modules) == {"match": 10, "missing": 2, "different": 1, "extra": 3}


def test_api_levels(fx: Fixture) -> None:
    ours = ours_from_package(fx.ours)
    u = open_upstream(str(fx.upstream), fx.first)
    strict = dict(statuses(api_report(ours, u, ["core.py"], "strict"), "core.py"))
    # token: int -> str differs; "int" = int, list[int] = List[int], X | None = Optional[X] do not
    assert {n for n, s in strict.items() if s == "different"} == {"Req.__init__", "Req.append"}
    assert strict["SamplingParams.top_k"] == strict["SamplingParams.stop"] == "match"
    assert strict["make_req"] == "match"
    names = dict(statuses(api_report(ours, u, ["core.py"], "names"), "core.py"))
    assert "different" not in names.values()
    assert names["Req.finished"] == "missing" and names["Req.reset"] == "extra"


def test_api_table(fx: Fixture, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = cli(capsys, *base_args(fx, "api"), "core.py", "server.py")
    assert rc == 0
    lines = out.splitlines()
    rows = [line for line in lines if line.startswith("  ") and line.split()[0] in STATUSES]
    assert [(r.split()[0], r.split()[2]) for r in rows] == [
        *((s, n) for n, s in CORE_ROWS),
        ("missing", "serve"),
    ]
    assert lines[0] == "minisgl/core.py"
    assert rows[0].split() == ["match", "dataclass", "SamplingParams"]
    assert rows[4].split()[:4] == ["match", "property", "SamplingParams.is_greedy", "->"]
    # a match row shows upstream's text (ours spells the annotation "int")
    assert rows[2].split() == ["match", "field", "SamplingParams.top_k", ":", "int", "=", "-1"]
    init = rows[6]
    assert init.split()[:4] == ["different", "method", "Req.__init__", "ours:"]
    assert init.endswith(
        "ours:     (self, uid: int, input_ids: list[int], max_tokens: int = 32) -> None"
    )
    below = lines[lines.index(init) + 1]
    assert (
        below.strip()
        == "upstream: (self, uid: int, input_ids: List[int], max_tokens: int = 16) -> None"
    )
    assert below.index("upstream:") == init.index("ours:")
    assert rows[11].split(None, 3) == [
        "match",
        "function",
        "make_req",
        "(uid: int, prompt: Optional[List[int]] = None, *, max_tokens: int = 16) -> Req",
    ]
    assert "minisgl/server.py  (only upstream)" in lines
    assert rows[-1].split() == [
        "missing",
        "function",
        "serve",
        "(port:",
        "int",
        "=",
        "8000)",
        "->",
        "None",
    ]
    assert lines[-2] == (
        "summary: 9 match, 2 missing, 1 different, 2 extra in 2 modules "
        "(1 on both sides, 1 only upstream, 0 only ours)"
    )
    assert lines[-1].startswith("compared: kinds, parameter names/kinds/defaults")


def test_api_hide_match_and_fail_on_missing(
    fx: Fixture, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, _ = cli(capsys, *base_args(fx, "api"), "--hide-match", "--fail-on-missing", "core.py")
    assert rc == 1
    assert [
        line.split()[0]
        for line in out.splitlines()[1:-2]
        if line.startswith("  ") and not line.startswith("   ")
    ] == ["different", "missing", "extra", "extra"]
    rc, _, _ = cli(capsys, *base_args(fx, "api"), "--fail-on-missing", "utils.py")
    assert rc == 0
    rc, out, _ = cli(capsys, *base_args(fx, "api"), "--hide-match")
    modules = [line for line in out.splitlines() if line.startswith("minisgl/")]
    assert modules == [  # utils.py and __init__.py have nothing but matches (or nothing)
        "minisgl/core.py",
        "minisgl/extra.py  (only ours)",
        "minisgl/server.py  (only upstream)",
    ]


def test_module_api_reads_every_kind_of_definition() -> None:
    source = textwrap.dedent("""
        from typing import TYPE_CHECKING, ClassVar, NamedTuple, overload
        from abc import ABC, abstractmethod
        import functools, torch

        if TYPE_CHECKING:
            class Hidden:
                def run(self) -> None: ...

        @dataclass(frozen=True, eq=False)
        class Config(Base, metaclass=Meta):
            size: int
            name: str = "x"
            counter: ClassVar[int] = 0
            _secret: int = 1

        class Pair(NamedTuple):
            left: int
            right: int = 0

        class Backend(ABC):
            @abstractmethod
            def forward(self, a, /, b, *args, c: int = 1, **kw) -> "Tensor": ...
            @property
            def size(self) -> int: ...
            @size.setter
            def size(self, value: int) -> None: ...
            @functools.cached_property
            def table(self): ...
            @staticmethod
            def make(*, device) -> "Backend": ...
            @classmethod
            def build(cls, n: int = 2): ...
            async def serve(self, port=80): ...
            @overload
            def get(self, i: int) -> int: ...
            def get(self, i): ...
            def _private(self): ...
            def __len__(self) -> int: ...

        def top(x, *, y) -> None: ...
        def _hidden(): ...
    """)
    items = {i.name: i for i in module_api(source)}
    assert list(items) == [
        "Hidden",
        "Hidden.run",
        "Config",
        "Config.size",
        "Config.name",
        "Pair",
        "Pair.left",
        "Pair.right",
        "Backend",
        "Backend.forward",
        "Backend.size",
        "Backend.table",
        "Backend.make",
        "Backend.build",
        "Backend.serve",
        "Backend.get",
        "Backend.__len__",
        "top",
    ]
    kinds_and_texts = {name: (i.kind, i.text) for name, i in items.items()}
    assert kinds_and_texts["Config"] == (
        "dataclass(eq=False, frozen=True)",
        "(Base, metaclass=Meta)",
    )
    assert kinds_and_texts["Config.name"] == ("field", ": str = 'x'")
    assert kinds_and_texts["Pair"] == ("class", "(NamedTuple)")
    assert kinds_and_texts["Pair.right"] == ("field", ": int = 0")
    assert kinds_and_texts["Backend.forward"] == (
        "abstract method",
        "(self, a, /, b, *args, c: int = 1, **kw) -> 'Tensor'",
    )
    assert kinds_and_texts["Backend.size"] == ("property (settable)", "-> int")
    assert kinds_and_texts["Backend.table"] == ("cached_property", "")
    assert kinds_and_texts["Backend.make"] == ("staticmethod", "(*, device) -> 'Backend'")
    assert kinds_and_texts["Backend.build"] == ("classmethod", "(cls, n: int = 2)")
    assert kinds_and_texts["Backend.serve"] == ("async method", "(self, port=80)")
    assert kinds_and_texts["Backend.get"] == ("method", "(self, i)")
    assert kinds_and_texts["top"] == ("function", "(x, *, y) -> None")


def test_default_level_ignores_annotations_and_qualifiers() -> None:
    a = module_api("class A(torch.nn.Module):\n    def f(self, x: List[int] = None): ...\n")
    b = module_api("class A(nn.Module):\n    def f(self, x: 'list[int]' = None) -> int: ...\n")
    c = module_api("class A(nn.Module):\n    def f(self, y=None): ...\n")
    assert [r.status for r in compare_api("m.py", b, a)] == ["match", "match"]
    assert [r.status for r in compare_api("m.py", b, a, "strict")] == ["different", "different"]
    assert [r.status for r in compare_api("m.py", c, a)] == ["match", "different"]


def test_all_exports_are_rows() -> None:
    theirs = module_api('from .a import A, B\n__all__ = ["A", "B"]\n')
    mine = module_api('from .a import A\nfrom .c import C\n__all__ = ("A",)\n__all__ += ["C"]\n')
    rows = compare_api("pkg/__init__.py", mine, theirs)
    assert [(r.name, r.kind, r.status) for r in rows] == [
        ("__all__.A", "export", "match"),
        ("__all__.B", "export", "missing"),
        ("__all__.C", "export", "extra"),
    ]


def test_a_changed_kind_shows_both_kinds() -> None:
    theirs = module_api("class A:\n    @property\n    def size(self) -> int: ...\n")
    mine = module_api("class A:\n    def size(self) -> int: ...\n")
    rows = compare_api("m.py", mine, theirs, "names")
    assert [r.status for r in rows] == ["match", "match"]
    rows = compare_api("m.py", mine, theirs)
    assert [r.status for r in rows] == ["match", "different"]
    text = format_api([ModuleApi("m.py", "both", rows)], "shape", hide_match=True)
    assert text.splitlines()[:3] == [
        "minisgl/m.py",
        "  different  property  A.size  ours:     method (self) -> int",
        "                               upstream: property -> int",
    ]


@pytest.mark.parametrize(
    "given, expected",
    [
        ("Optional[List[int]]", "list[int] | None"),
        ("typing.Union[str, int]", "int | str"),
        ("None | Dict[str, 'Req']", "dict[str, Req] | None"),
        ("Literal['prefill', 'decode']", "Literal['prefill', 'decode']"),
        ("torch.Tensor", "torch.Tensor"),
        ("Tuple[int, ...]", "tuple[int, ...]"),
    ],
)
def test_normalize_annotation(given: str, expected: str) -> None:
    assert normalize_annotation(given) == expected


def test_signature_rendering_round_trips() -> None:
    for sig in [
        "(a, b=1, /, c=2, *d, e, f=3, **g)",
        "(a, /, *, b)",
        "()",
        "(*, x: int = 1) -> None",
    ]:
        [item] = module_api(f"def f{sig}: ...")
        assert item.text == sig.replace("x: int=1", "x: int = 1")


# ------------------------------------------------------------------------------------ chapters


def test_chapter_tree(fx: Fixture, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "book"
    shutil.copytree(fx.ours, root)
    early_core = OUR_CORE.split("\n\ndef make_req")[0] + "\n"  # chapter 1 has no make_req yet
    write(
        root,
        {
            "chapters/book.toml": 'package = "minisgl"\n',
            "chapters/ch01/manifest.toml": 'chapter = 1\ntitle = "one"\nmain = "examples/ch01.py"\n'
            'creates = ["minisgl/core.py", "minisgl/utils.py"]\n',
            "chapters/ch01/minisgl/core.py": early_core,
            "chapters/ch02/manifest.toml": 'chapter = 2\ntitle = "two"\nmain = "examples/ch02.py"\n'
            'modifies = ["minisgl/core.py"]\n'
            'creates = ["minisgl/extra.py", "minisgl/__init__.py"]\n',
        },
    )
    ours = ours_from_chapter(root, 1)
    assert (ours.label, sorted(ours.files)) == ("chapter 01", ["core.py", "utils.py"])
    assert ours.files["core.py"] == root / "chapters/ch01/minisgl/core.py"

    args = [
        "api",
        "--upstream",
        str(fx.upstream),
        "--commit",
        fx.first,
        "--repo-root",
        str(root),
        "--chapter",
        "1",
        "core.py",
    ]
    rc, out, _ = cli(capsys, *args)
    assert rc == 0
    assert [line.split()[:3] for line in out.splitlines() if "make_req" in line] == [
        ["missing", "function", "make_req"]
    ]
    rc, out, _ = cli(capsys, *(a if a != "api" else "diff" for a in args[:-1]), "--stat")
    assert "only upstream: minisgl/__init__.py" in out.splitlines()
    assert "extra.py" not in out and "(ours: chapter 01;" in out
    assert ours_from_chapter(root, 2).files["core.py"] == root / "minisgl/core.py"


def test_chapter_without_chapters_is_a_clear_error(
    fx: Fixture, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, err = cli(capsys, *base_args(fx, "diff"), "--chapter", "3")
    assert (rc, out) == (2, "")
    assert err.startswith("error: --chapter 3: cannot read the chapters in ")
    assert "Traceback" not in err


def test_script_runs_from_its_path(fx: Fixture) -> None:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    done = subprocess.run(
        [sys.executable, "-m", "tools.upstream", *base_args(fx, "api"), "utils.py"],
        capture_output=True,
        text=True,
        cwd=fx.ours,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1].split()[:3] == ["match", "function", "clamp"]


# -------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "case, message",
    [
        ("not a repo", "is not a git repository"),
        ("no such path", "does not exist"),
        ("unknown commit", "commit 20fcd7f3c6a1898a61139fae1c97cc7a40bd8d66 not found in"),
        ("unknown file", "minisgl/nowhere.py: found neither in ours (minisgl/) nor in upstream"),
        ("api on a kernel", "api reads Python modules only: minisgl/kernel/store.cu"),
        ("clone fails", "git clone file://"),
    ],
)
def test_clear_errors(
    fx: Fixture, tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, message: str
) -> None:
    args = {
        "not a repo": ["diff", "--upstream", str(tmp_path)],
        "no such path": ["diff", "--upstream", str(tmp_path / "missing")],
        "unknown commit": ["diff", "--upstream", str(fx.upstream)],  # the real pin is not there
        "unknown file": [*base_args(fx, "diff"), "nowhere.py"],
        "api on a kernel": [*base_args(fx, "api"), "kernel/store.cu"],
        "clone fails": [
            "diff",
            "--upstream",
            (tmp_path / "gone").as_uri(),
            "--cache-dir",
            str(tmp_path / "cache"),
        ],
    }[case]
    rc, out, err = cli(capsys, *args, "--repo-root", str(fx.ours))
    assert (rc, out) == (2, "")
    assert err.splitlines()[-1].startswith("error: ") and message in err, err
    assert "Traceback" not in err


def test_chapter_takes_a_project_and_refuses_what_names_nothing(
    fx: Fixture, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stop:
        cli(capsys, *base_args(fx, "diff"), "--chapter", "P9")
    assert stop.value.code == 2
    assert "'P9' names no chapter: a chapter is 0 to 22" in capsys.readouterr().err
    rc, out, err = cli(capsys, *base_args(fx, "diff"), "--chapter", "p1")
    assert (rc, out) == (2, "")
    assert err.startswith("error: --chapter P1: cannot read the chapters in ")
