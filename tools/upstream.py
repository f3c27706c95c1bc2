"""Compare our package with upstream mini-sglang at the pinned commit.

    python tools/upstream.py diff --upstream PATH_OR_URL [--chapter N] [FILE ...]
    python tools/upstream.py api  --upstream PATH_OR_URL [--chapter N] [FILE ...]

``--upstream`` is a checkout of sgl-project/mini-sglang, a bare git directory of it, or a git URL
(cloned once, bare, into ``$MINISGL_BOOK_CACHE/upstream``, else ``~/.cache/minisgl-book/upstream``).
Upstream files are read with ``git ls-tree`` and ``git show COMMIT:path`` at ``PINNED_COMMIT``
(``--commit`` overrides it), so the checkout's own branch and working tree do not matter.

Our side is ``minisgl/`` of the repository, or, with ``--chapter N``, the package as it stands at
chapter N (built by ``tools/steps.py``). A FILE is named by its path in the package:
``core.py``, ``minisgl/core.py`` and ``python/minisgl/core.py`` all mean the same file, and a
folder (``engine/``) means every file under it.

``diff`` prints a unified diff per file (upstream is the old side, ours the new), then one line per
file: ``differ``, ``identical``, ``only ours`` or ``only upstream``, then a summary.

``api`` reads every module with ``ast`` (neither package is imported) and lists its public API:
module-level classes and functions, the public methods of classes (dunder methods such as
``__init__`` and ``__call__`` included; properties, class/static and abstract methods marked),
the annotated class-level attributes (the fields of dataclasses, NamedTuples and pydantic
models), and the names a module lists in ``__all__`` (rows ``__all__.Name``, kind ``export``, so
a package's ``__init__.py`` re-exports are compared too). Each row is ``match``, ``missing`` (upstream only), ``extra`` (ours only) or
``different``. What counts as the same:

* ``--names-only``: the name exists on both sides.
* default: the kind (method, property, ...) and the parameters' names, kinds and defaults agree,
  class bases agree up to module qualifiers (``nn.Module`` = ``torch.nn.Module``), and a field's
  default agrees. Annotations are shown but not compared.
* ``--strict``: the default, plus annotations and return annotations, compared after rewriting the
  spellings that mean the same type (``List[int]`` = ``list[int]``, ``Optional[X]`` = ``X | None``,
  ``Union[A, B]`` = ``B | A``, ``"Req"`` = ``Req``, ``typing.Any`` = ``Any``); a module qualifier
  still counts (``torch.Tensor`` differs from ``Tensor``).

Exit status: 0 when the comparison ran (whatever it found), 1 for ``api --fail-on-missing`` when
upstream has API that we lack, 2 for an error (bad path, unknown commit, unknown file, ...).
"""

from __future__ import annotations

import argparse
import ast
import difflib
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Literal

PINNED_COMMIT = "20fcd7f3c6a1898a61139fae1c97cc7a40bd8d66"
UPSTREAM_URL = "https://github.com/sgl-project/mini-sglang.git"
UPSTREAM_PACKAGE = "python/minisgl"
OUR_PACKAGE = "minisgl"
REPO_ROOT = Path(__file__).resolve().parents[1]

Level = Literal["names", "shape", "strict"]
Status = Literal["match", "missing", "extra", "different"]
STATUSES: tuple[Status, ...] = ("match", "missing", "different", "extra")

# Environment variables that would point git at some other repository than the one we name.
_GIT_REDIRECTS = (
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_OBJECT_DIRECTORY",
    "GIT_COMMON_DIR",
    "GIT_NAMESPACE",
)
_URL_RE = re.compile(r"^([a-z][a-z0-9+.-]*://|[\w.-]+@[\w.-]+:)", re.IGNORECASE)


class UpstreamError(Exception):
    """Something the user can fix: a path, a commit, a file name. Printed without a traceback."""


# =============================================================================================
# git
# =============================================================================================


def _git_env(ceiling: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _GIT_REDIRECTS}
    env["GIT_TERMINAL_PROMPT"] = "0"  # a URL that needs a password fails instead of waiting
    if ceiling is not None:
        env["GIT_CEILING_DIRECTORIES"] = str(ceiling)
    return env


def _git(
    args: Sequence[str], *, cwd: Path | None = None, ceiling: Path | None = None
) -> subprocess.CompletedProcess[bytes]:
    """Run git; the caller looks at returncode. Only a missing git binary raises."""
    try:
        return subprocess.run(
            ["git", *args], cwd=cwd, env=_git_env(ceiling), capture_output=True, check=False
        )
    except FileNotFoundError as e:
        raise UpstreamError("git is not installed (it is needed to read upstream)") from e


def _git_message(stderr: bytes) -> str:
    """The line of git's stderr that says what went wrong (its first fatal: or error: line)."""
    lines = [line.strip() for line in stderr.decode(errors="replace").splitlines() if line.strip()]
    fatal = [line for line in lines if line.startswith(("fatal:", "error:"))]
    return (fatal or lines or ["no message from git"])[0]


def is_url(source: str) -> bool:
    """True for ``https://...``, ``file://...``, ``ssh://...`` and scp-like ``git@host:path``."""
    return bool(_URL_RE.match(source))


def find_git_dir(path: Path) -> Path:
    """The git directory of a checkout's top folder, or of a bare repository, at `path`."""
    path = path.expanduser().resolve()
    if not path.exists():
        raise UpstreamError(f"{path} does not exist")
    if not path.is_dir():
        raise UpstreamError(f"{path} is not a directory (expected a mini-sglang checkout)")
    # The ceiling stops git from walking up: a folder inside some other repository is refused.
    done = _git(["rev-parse", "--absolute-git-dir"], cwd=path, ceiling=path.parent)
    if done.returncode != 0:
        raise UpstreamError(
            f"{path} is not a git repository (expected the top of a mini-sglang checkout or a bare "
            f"git directory; git says: {_git_message(done.stderr)})"
        )
    return Path(done.stdout.decode().strip())


def resolve_commit(git_dir: Path, commit: str) -> str | None:
    """The full hash that `commit` (a hash, a prefix, a branch or tag) names, if git has it."""
    done = _git(
        ["--git-dir", str(git_dir), "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}"]
    )
    return done.stdout.decode().strip() if done.returncode == 0 else None


def default_cache_dir() -> Path:
    base = os.environ.get("MINISGL_BOOK_CACHE") or Path.home() / ".cache" / "minisgl-book"
    return Path(base) / "upstream"


def clone_dir_for(url: str, cache_dir: Path) -> Path:
    """One bare clone per URL: ``<name>-<hash of the URL>.git``."""
    name = re.sub(r"\.git$", "", url.rstrip("/").rsplit("/", 1)[-1].rsplit(":", 1)[-1])
    name = re.sub(r"[^\w.-]", "_", name) or "upstream"
    digest = hashlib.sha1(url.encode()).hexdigest()[:10]
    return cache_dir / f"{name}-{digest}.git"


def _fetch_all(git_dir: Path, url: str) -> None:
    done = _git(
        [
            "--git-dir",
            str(git_dir),
            "fetch",
            "--quiet",
            url,
            "+refs/heads/*:refs/heads/*",
            "+refs/tags/*:refs/tags/*",
        ]
    )
    if done.returncode != 0:
        raise UpstreamError(f"git fetch {url} failed: {_git_message(done.stderr)}")


def ensure_clone(url: str, commit: str, cache_dir: Path) -> Path:
    """A bare clone of `url` under `cache_dir` that has `commit` (cloned or fetched as needed)."""
    target = clone_dir_for(url, cache_dir)
    if not target.exists():
        cache_dir.mkdir(parents=True, exist_ok=True)
        print(f"cloning {url} into {target} ...", file=sys.stderr)
        staging = Path(tempfile.mkdtemp(prefix=".clone-", dir=cache_dir))
        try:
            done = _git(["clone", "--bare", "--quiet", url, str(staging / "repo.git")])
            if done.returncode != 0:
                raise UpstreamError(
                    f"git clone {url} failed: {_git_message(done.stderr)} "
                    "(without internet, pass --upstream PATH to a local checkout)"
                )
            if not target.exists():  # another run may have finished first: keep theirs
                (staging / "repo.git").rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    if resolve_commit(target, commit) is None:
        print(f"fetching {url} into {target} ...", file=sys.stderr)
        _fetch_all(target, url)
    return target


# =============================================================================================
# the two sides
# =============================================================================================


@dataclass(frozen=True)
class Upstream:
    """Upstream's package at one commit of one git directory."""

    git_dir: Path
    commit: str  # the full hash

    def _git(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        return _git(["--git-dir", str(self.git_dir), *args])

    @cached_property
    def files(self) -> list[str]:
        """Package-relative paths of every file under python/minisgl/ at the commit."""
        done = self._git("ls-tree", "-r", "-z", "--name-only", self.commit, "--", UPSTREAM_PACKAGE)
        if done.returncode != 0:
            raise UpstreamError(
                f"git ls-tree failed in {self.git_dir}: {_git_message(done.stderr)}"
            )
        prefix = UPSTREAM_PACKAGE + "/"
        paths = [p for p in done.stdout.decode().split("\0") if p.startswith(prefix)]
        if not paths:
            raise UpstreamError(
                f"{UPSTREAM_PACKAGE}/ does not exist at commit {self.commit[:12]} in "
                f"{self.git_dir}; is this a clone of sgl-project/mini-sglang?"
            )
        return sorted(p[len(prefix) :] for p in paths)

    def read(self, rel: str) -> bytes:
        done = self._git("show", f"{self.commit}:{UPSTREAM_PACKAGE}/{rel}")
        if done.returncode != 0:
            raise UpstreamError(
                f"cannot read {UPSTREAM_PACKAGE}/{rel} at {self.commit[:12]}: "
                f"{_git_message(done.stderr)}"
            )
        return done.stdout


def open_upstream(
    source: str, commit: str = PINNED_COMMIT, cache_dir: Path | None = None
) -> Upstream:
    """Upstream from a local path (checkout or bare git dir) or a URL (cloned into the cache)."""
    if is_url(source):
        git_dir = ensure_clone(source, commit, cache_dir or default_cache_dir())
    else:
        git_dir = find_git_dir(Path(source))
    full = resolve_commit(git_dir, commit)
    if full is None:
        where = source if is_url(source) else str(git_dir)
        raise UpstreamError(
            f"commit {commit} not found in {where} (is it a clone of sgl-project/mini-sglang? "
            "run `git fetch` there, pass a URL to clone from, or choose another --commit)"
        )
    return Upstream(git_dir=git_dir, commit=full)


@dataclass(frozen=True)
class OurTree:
    """Our package: package-relative path -> the file that holds it."""

    files: dict[str, Path]
    label: str  # "minisgl/" or "chapter 05"
    tag: str = "ours"  # the new side's date field in a diff header: "ours" or "chapter 05"

    def read(self, rel: str) -> bytes:
        try:
            return self.files[rel].read_bytes()
        except OSError as e:
            raise UpstreamError(f"cannot read our {OUR_PACKAGE}/{rel} ({self.label}): {e}") from e


def _is_package_file(path: Path, package: Path) -> bool:
    parts = path.relative_to(package).parts
    return (
        path.is_file()
        and "__pycache__" not in parts
        and not any(part.startswith(".") or part.endswith(".egg-info") for part in parts)
        and path.suffix not in (".pyc", ".pyo")
    )


def ours_from_package(repo_root: Path) -> OurTree:
    package = repo_root / OUR_PACKAGE
    if not package.is_dir():
        print(
            f"note: {package} does not exist yet; every upstream file is 'only upstream'",
            file=sys.stderr,
        )
        return OurTree(files={}, label=f"{OUR_PACKAGE}/")
    files = {
        p.relative_to(package).as_posix(): p
        for p in sorted(package.rglob("*"))
        if _is_package_file(p, package)
    }
    return OurTree(files=files, label=f"{OUR_PACKAGE}/")


def ours_from_chapter(repo_root: Path, number: int) -> OurTree:
    """Chapter `number`'s package, from tools/steps.py's Book."""
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    try:
        from tools.steps import Book
    except Exception as e:  # any failure while importing it: report, do not crash
        raise UpstreamError(f"--chapter needs tools/steps.py, which cannot be imported: {e}") from e
    try:
        book = Book(repo_root)
        book.chapter(number)
        stored = book.package_files(number)
        package = getattr(book, "package", OUR_PACKAGE)
    except Exception as e:  # BookError and friends: no chapters yet, a bad manifest, ...
        raise UpstreamError(
            f"--chapter {number}: cannot read the chapters in {repo_root}: {e}"
        ) from e
    prefix = package + "/"
    files = {k[len(prefix) :]: Path(v) for k, v in sorted(stored.items()) if k.startswith(prefix)}
    if not files:
        print(f"note: chapter {number:02d} has no package files yet", file=sys.stderr)
    return OurTree(files=files, label=f"chapter {number:02d}", tag=f"chapter {number:02d}")


def our_tree(repo_root: Path, chapter: int | None) -> OurTree:
    return (
        ours_from_package(repo_root) if chapter is None else ours_from_chapter(repo_root, chapter)
    )


# =============================================================================================
# choosing files
# =============================================================================================


def package_relative(name: str) -> str:
    """``minisgl/core.py``, ``python/minisgl/core.py``, ``./core.py`` -> ``core.py``."""
    rel = name.replace("\\", "/").strip()
    while rel.startswith("./"):
        rel = rel[2:]
    for prefix in (f"{UPSTREAM_PACKAGE}/", f"{OUR_PACKAGE}/"):
        if rel.startswith(prefix):
            rel = rel[len(prefix) :]
            break
    else:
        if rel in (UPSTREAM_PACKAGE, OUR_PACKAGE):
            rel = ""
    return rel.strip("/")


def select_files(names: Sequence[str], available: Iterable[str], where: str) -> list[str]:
    """The files that `names` mean (all when empty); a name that matches nothing is an error."""
    pool = sorted(set(available))
    if not names:
        return pool
    chosen: list[str] = []
    unknown: list[str] = []
    for name in names:
        rel = package_relative(name)
        if rel in pool:
            hits = [rel]
        else:
            hits = [p for p in pool if not rel or p.startswith(rel + "/")]
        if not hits:
            unknown.append(f"{OUR_PACKAGE}/{rel}")
        chosen.extend(h for h in hits if h not in chosen)
    if unknown:
        raise UpstreamError(f"{', '.join(unknown)}: found neither in {where}")
    return chosen


def _where(ours: OurTree, upstream: Upstream) -> str:
    return f"ours ({ours.label}) nor in upstream ({UPSTREAM_PACKAGE}/ at {upstream.commit[:12]})"


# =============================================================================================
# diff
# =============================================================================================


@dataclass(frozen=True)
class FileDiff:
    path: str  # package-relative
    status: Literal["differ", "identical", "only ours", "only upstream"]
    lines: tuple[str, ...] = ()  # the unified diff, without line ends
    added: int = 0
    removed: int = 0


def _text(data: bytes) -> list[str] | None:
    try:
        return data.decode("utf-8").splitlines()
    except UnicodeDecodeError:
        return None


def diff_file(rel: str, ours: OurTree, upstream: Upstream, context: int = 3) -> FileDiff:
    in_ours, in_upstream = rel in ours.files, rel in upstream.files
    if not in_upstream:
        return FileDiff(rel, "only ours")
    if not in_ours:
        return FileDiff(rel, "only upstream")
    theirs_bytes, ours_bytes = upstream.read(rel), ours.read(rel)
    if theirs_bytes == ours_bytes:
        return FileDiff(rel, "identical")
    before, after = _text(theirs_bytes), _text(ours_bytes)
    old_name, new_name = f"upstream/{UPSTREAM_PACKAGE}/{rel}", f"{OUR_PACKAGE}/{rel}"
    if before is None or after is None:
        return FileDiff(rel, "differ", (f"Binary files {old_name} and {new_name} differ",))
    lines = tuple(
        difflib.unified_diff(
            before,
            after,
            old_name,
            new_name,
            fromfiledate=upstream.commit[:12],
            tofiledate=ours.tag,
            n=context,
            lineterm="",
        )
    )
    body = lines[2:]
    added = sum(1 for line in body if line.startswith("+"))
    removed = sum(1 for line in body if line.startswith("-"))
    if not lines:  # same lines, different line ends or a final newline
        lines = (f"{new_name}: differs from upstream only in line endings",)
    return FileDiff(rel, "differ", lines, added, removed)


def diff_report(
    ours: OurTree, upstream: Upstream, names: Sequence[str] = (), context: int = 3
) -> list[FileDiff]:
    paths = select_files(names, [*ours.files, *upstream.files], _where(ours, upstream))
    return [diff_file(rel, ours, upstream, context) for rel in paths]


def format_diff(report: Sequence[FileDiff], ours: OurTree, upstream: Upstream, stat: bool) -> str:
    out: list[str] = []
    if not stat:
        for item in report:
            out.extend(item.lines)
    for status in ("differ", "only ours", "only upstream", "identical"):
        for item in report:
            if item.status == status:
                counts = f" (+{item.added} -{item.removed})" if status == "differ" else ""
                out.append(f"{status}: {OUR_PACKAGE}/{item.path}{counts}")
    counts = {
        s: sum(1 for i in report if i.status == s)
        for s in ("differ", "identical", "only ours", "only upstream")
    }
    out.append(
        f"summary: {counts['differ']} differ, {counts['identical']} identical, "
        f"{counts['only ours']} only ours, {counts['only upstream']} only upstream "
        f"(ours: {ours.label}; upstream: {UPSTREAM_PACKAGE}/ at {upstream.commit[:12]})"
    )
    return "\n".join(out) + "\n"


# =============================================================================================
# api: what a module offers, read with ast
# =============================================================================================

POSITIONAL_ONLY = "positional-only"
POSITIONAL = "positional-or-keyword"
VAR_POSITIONAL = "var-positional"
KEYWORD_ONLY = "keyword-only"
VAR_KEYWORD = "var-keyword"

_TYPING_BUILTINS = {
    "List": "list",
    "Dict": "dict",
    "Tuple": "tuple",
    "Set": "set",
    "FrozenSet": "frozenset",
    "Type": "type",
}
_TYPING_MODULES = {"typing", "typing_extensions", "t"}


@dataclass(frozen=True)
class Param:
    name: str
    kind: str
    default: str | None = None  # source text
    annotation: str | None = None  # source text

    def render(self) -> str:
        star = {VAR_POSITIONAL: "*", VAR_KEYWORD: "**"}.get(self.kind, "")
        text = star + self.name
        if self.annotation is not None:
            text += f": {self.annotation}"
        if self.default is not None:
            text += f" = {self.default}" if self.annotation is not None else f"={self.default}"
        return text


@dataclass(frozen=True)
class ApiItem:
    """One public name of a module: a class, function, method, property or field."""

    name: str  # qualified within the module: "Req", "Req.append_host", "SamplingParams.top_k"
    kind: str  # "class", "dataclass(eq=False)", "function", "method", "property", "field", ...
    text: str  # what to show after the name: "(self, x: int = 1) -> int", ": float = 0.0"
    shape: tuple = ()  # compared by default
    strict: tuple = ()  # compared with --strict

    def key(self, level: Level) -> tuple:
        return () if level == "names" else self.shape if level == "shape" else self.strict


class _AnnotationNormalizer(ast.NodeTransformer):
    """Rewrites the spellings of a type that mean the same type into one spelling."""

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        if isinstance(node.value, str):  # a forward reference: "Req" -> Req
            try:
                inner = ast.parse(node.value, mode="eval").body
            except SyntaxError:
                return node
            return self.visit(inner)
        return node

    def visit_Name(self, node: ast.Name) -> ast.AST:
        return ast.Name(_TYPING_BUILTINS.get(node.id, node.id), ast.Load())

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        if isinstance(node.value, ast.Name) and node.value.id in _TYPING_MODULES:
            return self.visit_Name(ast.Name(node.attr, ast.Load()))
        return self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> ast.AST:
        head = self.visit(node.value)
        if isinstance(head, ast.Name) and head.id == "Literal":  # its strings are values
            return ast.Subscript(head, node.slice, ast.Load())
        inner = self.visit(node.slice)
        if isinstance(head, ast.Name) and head.id == "Optional":
            return _union([inner, ast.Constant(None)])
        if isinstance(head, ast.Name) and head.id == "Union":
            return _union(list(inner.elts) if isinstance(inner, ast.Tuple) else [inner])
        return ast.Subscript(head, inner, ast.Load())

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        node = self.generic_visit(node)
        return _union([node]) if isinstance(node.op, ast.BitOr) else node


def _union(members: list[ast.expr]) -> ast.expr:
    flat: list[ast.expr] = []
    while members:
        m = members.pop(0)
        if isinstance(m, ast.BinOp) and isinstance(m.op, ast.BitOr):
            members[:0] = [m.left, m.right]
        else:
            flat.append(m)
    texts = sorted({ast.unparse(m) for m in flat}, key=lambda t: (t == "None", t))
    return ast.parse(" | ".join(texts), mode="eval").body


class _StripQualifiers(ast.NodeTransformer):
    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        return ast.Name(node.attr, ast.Load())


def normalize_annotation(text: str | None) -> str | None:
    """One spelling per type: ``Optional[List[int]]`` -> ``list[int] | None``."""
    if text is None:
        return None
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        return text
    return ast.unparse(_AnnotationNormalizer().visit(tree))


def _unqualified(text: str) -> str:
    """``torch.nn.Module`` -> ``Module`` (for comparing class bases by default)."""
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        return text
    return ast.unparse(_StripQualifiers().visit(tree))


def _unparse(node: ast.AST | None) -> str | None:
    return None if node is None else ast.unparse(node)


def is_public(name: str) -> bool:
    return not name.startswith("_") or (name.startswith("__") and name.endswith("__"))


def _decorator_name(node: ast.expr) -> str:
    """``@x``, ``@a.b.x``, ``@x(...)`` -> ``x``."""
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def parameters(args: ast.arguments) -> tuple[Param, ...]:
    positional = [*args.posonlyargs, *args.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(args.defaults))
    defaults += args.defaults
    params = [
        Param(
            a.arg,
            POSITIONAL_ONLY if i < len(args.posonlyargs) else POSITIONAL,
            _unparse(d),
            _unparse(a.annotation),
        )
        for i, (a, d) in enumerate(zip(positional, defaults))
    ]
    if args.vararg:
        params.append(
            Param(args.vararg.arg, VAR_POSITIONAL, None, _unparse(args.vararg.annotation))
        )
    for a, d in zip(args.kwonlyargs, args.kw_defaults):
        params.append(Param(a.arg, KEYWORD_ONLY, _unparse(d), _unparse(a.annotation)))
    if args.kwarg:
        params.append(Param(args.kwarg.arg, VAR_KEYWORD, None, _unparse(args.kwarg.annotation)))
    return tuple(params)


def render_signature(params: Sequence[Param], returns: str | None) -> str:
    parts: list[str] = []
    star_written = any(p.kind == VAR_POSITIONAL for p in params)
    for i, p in enumerate(params):
        if p.kind == KEYWORD_ONLY and not star_written:
            parts.append("*")
            star_written = True
        parts.append(p.render())
        last_posonly = p.kind == POSITIONAL_ONLY and (
            i + 1 == len(params) or params[i + 1].kind != POSITIONAL_ONLY
        )
        if last_posonly:
            parts.append("/")
    text = f"({', '.join(parts)})"
    return f"{text} -> {returns}" if returns is not None else text


def _function_kind(node: ast.FunctionDef | ast.AsyncFunctionDef, in_class: bool) -> str:
    decorators = {_decorator_name(d) for d in node.decorator_list}
    kind = "function"
    if in_class:
        kind = next(
            (
                d
                for d in ("property", "cached_property", "staticmethod", "classmethod")
                if d in decorators
            ),
            "method",
        )
    if isinstance(node, ast.AsyncFunctionDef):
        kind = f"async {kind}"
    if "abstractmethod" in decorators:
        kind = f"abstract {kind}"
    return kind


def function_item(
    node: ast.FunctionDef | ast.AsyncFunctionDef, qualname: str, in_class: bool
) -> ApiItem:
    kind = _function_kind(node, in_class)
    returns = _unparse(node.returns)
    if kind.endswith("property"):
        text = f"-> {returns}" if returns is not None else ""
        return ApiItem(qualname, kind, text, (kind,), (kind, normalize_annotation(returns)))
    params = parameters(node.args)
    shape = tuple((p.name, p.kind, p.default) for p in params)
    strict = tuple((*s, normalize_annotation(p.annotation)) for s, p in zip(shape, params))
    return ApiItem(
        qualname,
        kind,
        render_signature(params, returns),
        (kind, shape),
        (kind, strict, normalize_annotation(returns)),
    )


def _dataclass_kind(decorators: Sequence[ast.expr]) -> str | None:
    for d in decorators:
        if _decorator_name(d) != "dataclass":
            continue
        options = sorted(
            f"{k.arg}={ast.unparse(k.value)}" for k in getattr(d, "keywords", []) if k.arg
        )
        return f"dataclass({', '.join(options)})" if options else "dataclass"
    return None


def class_item(node: ast.ClassDef, qualname: str) -> ApiItem:
    kind = _dataclass_kind(node.decorator_list) or "class"
    bases = [ast.unparse(b) for b in node.bases]
    bases += [
        f"{k.arg}={ast.unparse(k.value)}" if k.arg else f"**{ast.unparse(k.value)}"
        for k in node.keywords
    ]
    text = f"({', '.join(bases)})" if bases else ""
    shape = tuple(_unqualified(normalize_annotation(b) or b) for b in bases)
    strict = tuple(normalize_annotation(b) for b in bases)
    return ApiItem(qualname, kind, text, (kind, shape), (kind, strict))


def field_item(node: ast.AnnAssign, qualname: str) -> ApiItem | None:
    annotation = ast.unparse(node.annotation)
    if (normalize_annotation(annotation) or "").startswith("ClassVar"):
        return None
    default = _unparse(node.value)
    text = f": {annotation}" + (f" = {default}" if default is not None else "")
    return ApiItem(
        qualname,
        "field",
        text,
        ("field", default),
        ("field", default, normalize_annotation(annotation)),
    )


def _all_names(node: ast.stmt) -> list[str] | None:
    """The names in ``__all__ = [...]`` (or ``+=``, or a tuple); None for any other statement."""
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        target, value = node.targets[0], node.value
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and node.value is not None:
        target, value = node.target, node.value
    else:
        return None
    if not (isinstance(target, ast.Name) and target.id == "__all__"):
        return None
    if not isinstance(value, (ast.List, ast.Tuple)):
        return None
    return [e.value for e in value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]


def _statements(body: Sequence[ast.stmt]) -> Iterable[ast.stmt]:
    """The statements of one scope, looking inside if/try/with blocks (not inside defs)."""
    for node in body:
        if isinstance(node, ast.If):
            yield from _statements([*node.body, *node.orelse])
        elif isinstance(node, ast.Try):
            handlers = [s for h in node.handlers for s in h.body]
            yield from _statements([*node.body, *handlers, *node.orelse, *node.finalbody])
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            yield from _statements(node.body)
        else:
            yield node


def _scope_api(body: Sequence[ast.stmt], prefix: str, in_class: bool) -> dict[str, ApiItem]:
    items: dict[str, ApiItem] = {}
    for node in _statements(body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and is_public(node.name):
            decorators = {_decorator_name(d) for d in node.decorator_list}
            qualname = prefix + node.name
            if "overload" in decorators:
                continue
            if decorators & {"setter", "deleter"}:
                getter = items.get(qualname)
                if getter is not None and getter.kind.endswith("property"):
                    kind = f"{getter.kind} (settable)"
                    items[qualname] = ApiItem(
                        qualname, kind, getter.text, (kind,), (kind, *getter.strict[1:])
                    )
                continue
            items[qualname] = function_item(node, qualname, in_class)
        elif isinstance(node, ast.ClassDef) and is_public(node.name):
            qualname = prefix + node.name
            items[qualname] = class_item(node, qualname)
            items.update(_scope_api(node.body, qualname + ".", in_class=True))
        elif not in_class and _all_names(node) is not None:
            for name in _all_names(node) or []:
                items[f"__all__.{name}"] = ApiItem(
                    f"__all__.{name}", "export", "", ("export",), ("export",)
                )
        elif (
            in_class
            and isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and is_public(node.target.id)
        ):
            item = field_item(node, prefix + node.target.id)
            if item is not None:
                items[item.name] = item
    return items


def module_api(source: str | bytes, filename: str = "<module>") -> list[ApiItem]:
    """The public API of one module's source, in the order of definition."""
    tree = ast.parse(source, filename)
    return list(_scope_api(tree.body, "", in_class=False).values())


# =============================================================================================
# api: comparing
# =============================================================================================


@dataclass(frozen=True)
class ApiRow:
    module: str  # package-relative path
    name: str
    status: Status
    ours: ApiItem | None
    upstream: ApiItem | None

    @property
    def kind(self) -> str:
        return (self.upstream or self.ours).kind  # type: ignore[union-attr]


@dataclass
class ModuleApi:
    module: str
    side: Literal["both", "only ours", "only upstream"]
    rows: list[ApiRow] = field(default_factory=list)
    problem: str | None = None  # a module that cannot be parsed


def _merged_order(upstream_names: list[str], our_names: list[str]) -> list[str]:
    """Upstream's order, with each name of ours alone placed after the last one of its class."""
    order = list(upstream_names)
    known = set(order)
    for name in our_names:
        if name in known:
            continue
        owner = name.split(".", 1)[0]
        at = max((i for i, n in enumerate(order) if n.split(".", 1)[0] == owner), default=None)
        order.insert(len(order) if at is None else at + 1, name)
        known.add(name)
    return order


def compare_api(
    module: str, ours: Sequence[ApiItem], upstream: Sequence[ApiItem], level: Level = "shape"
) -> list[ApiRow]:
    mine = {i.name: i for i in ours}
    theirs = {i.name: i for i in upstream}
    rows: list[ApiRow] = []
    for name in _merged_order(list(theirs), list(mine)):
        a, b = mine.get(name), theirs.get(name)
        if a is None:
            status: Status = "missing"
        elif b is None:
            status = "extra"
        else:
            status = "match" if a.key(level) == b.key(level) else "different"
        rows.append(ApiRow(module, name, status, a, b))
    return rows


def _parse_side(data: bytes, label: str) -> tuple[list[ApiItem], str | None]:
    try:
        return module_api(data, label), None
    except (SyntaxError, ValueError) as e:
        return [], f"{label} cannot be parsed: {e}"


def api_report(
    ours: OurTree, upstream: Upstream, names: Sequence[str] = (), level: Level = "shape"
) -> list[ModuleApi]:
    everything = [*ours.files, *upstream.files]
    chosen = select_files(names, everything, _where(ours, upstream))
    named_files = {package_relative(n) for n in names} & set(everything)
    not_python = sorted(f"{OUR_PACKAGE}/{p}" for p in named_files if not p.endswith(".py"))
    if not_python:
        raise UpstreamError(f"api reads Python modules only: {', '.join(not_python)}")
    report: list[ModuleApi] = []
    upstream_files = set(upstream.files)
    for rel in (p for p in chosen if p.endswith(".py")):
        in_ours, in_upstream = rel in ours.files, rel in upstream_files
        side = "both" if in_ours and in_upstream else "only ours" if in_ours else "only upstream"
        mine, mine_problem = _parse_side(ours.read(rel), f"ours {rel}") if in_ours else ([], None)
        theirs, their_problem = (
            _parse_side(upstream.read(rel), f"upstream {rel}") if in_upstream else ([], None)
        )
        problem = mine_problem or their_problem
        rows = [] if problem else compare_api(rel, mine, theirs, level)
        report.append(ModuleApi(rel, side, rows, problem))  # type: ignore[arg-type]
    return report


def count_statuses(report: Sequence[ModuleApi]) -> dict[str, int]:
    counts = {s: 0 for s in STATUSES}
    for module in report:
        for row in module.rows:
            counts[row.status] += 1
    return counts


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


LEVEL_NOTES: dict[str, str] = {
    "names": "names only",
    "shape": "kinds, parameter names/kinds/defaults, bases, field defaults (annotations not "
    "compared; --strict compares them)",
    "strict": "kinds, parameters with annotations, return annotations, bases, fields "
    "(typing spellings such as List[int] = list[int] count as equal)",
}


@dataclass(frozen=True)
class _Columns:
    status: int
    kind: int
    name: int

    def head(self, row: ApiRow) -> str:
        return f"  {row.status:<{self.status}}  {row.kind:<{self.kind}}  {row.name:<{self.name}}  "

    @property
    def indent(self) -> str:
        return " " * (2 + self.status + 2 + self.kind + 2 + self.name + 2)


def _row_lines(row: ApiRow, cols: _Columns) -> list[str]:
    """One line; two for 'different' (ours above upstream), the kinds shown when they differ."""
    if row.status != "different":
        item = row.upstream or row.ours
        assert item is not None
        return [(cols.head(row) + item.text).rstrip()]
    assert row.ours is not None and row.upstream is not None
    same_kind = row.ours.kind == row.upstream.kind
    ours, theirs = (
        (row.ours.text, row.upstream.text)
        if same_kind
        else (f"{row.ours.kind} {row.ours.text}", f"{row.upstream.kind} {row.upstream.text}")
    )
    return [
        f"{cols.head(row)}ours:     {ours}".rstrip(),
        f"{cols.indent}upstream: {theirs}".rstrip(),
    ]


def _module_lines(module: ModuleApi, cols: _Columns, hide_match: bool) -> list[str]:
    shown = [r for r in module.rows if not (hide_match and r.status == "match")]
    if hide_match and not shown and not module.problem:
        return []  # nothing to report but matches (or no API at all)
    side = "" if module.side == "both" else f"  ({module.side})"
    lines = [f"{OUR_PACKAGE}/{module.module}{side}"]
    if module.problem:
        lines.append(f"  {module.problem}")
    elif not module.rows:
        lines.append("  (no public classes or functions)")
    for row in shown:
        lines.extend(_row_lines(row, cols))
    return lines


def format_api(report: Sequence[ModuleApi], level: Level, hide_match: bool = False) -> str:
    rows = [r for m in report for r in m.rows]
    cols = _Columns(
        status=max(len(s) for s in STATUSES),
        kind=max([len(r.kind) for r in rows] + [4]),
        name=min(max([len(r.name) for r in rows] + [4]), 48),
    )
    out = [line for module in report for line in _module_lines(module, cols, hide_match)]
    counts = count_statuses(report)
    sides = {
        s: sum(1 for m in report if m.side == s) for s in ("both", "only upstream", "only ours")
    }
    unparsed = sum(1 for m in report if m.problem)
    out.append(
        "summary: "
        + ", ".join(f"{counts[s]} {s}" for s in STATUSES)
        + f" in {_plural(len(report), 'module')} ({sides['both']} on both sides, "
        f"{sides['only upstream']} only upstream, {sides['only ours']} only ours"
        + (f", {unparsed} not parsed" if unparsed else "")
        + ")"
    )
    out.append(f"compared: {LEVEL_NOTES[level]}")
    return "\n".join(out) + "\n"


# =============================================================================================
# command line
# =============================================================================================


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--upstream",
        metavar="PATH_OR_URL",
        default=os.environ.get("MINISGL_UPSTREAM", UPSTREAM_URL),
        help="a mini-sglang checkout, a bare git dir, or a git URL to clone "
        "(default: $MINISGL_UPSTREAM, else %(default)s)",
    )
    common.add_argument(
        "--commit",
        default=PINNED_COMMIT,
        help="upstream commit to read (default: the pinned %(default)s)",
    )
    common.add_argument(
        "--chapter",
        type=int,
        metavar="N",
        help="compare chapter N's package (from tools/steps.py), not minisgl/",
    )
    common.add_argument(
        "--repo-root",
        type=Path,
        default=REPO_ROOT,
        metavar="DIR",
        help="the book's repository (default: the one that holds this tool)",
    )
    common.add_argument(
        "--cache-dir",
        type=Path,
        metavar="DIR",
        help="where URL clones go (default: $MINISGL_BOOK_CACHE/upstream, "
        "else ~/.cache/minisgl-book/upstream)",
    )
    common.add_argument(
        "files",
        nargs="*",
        metavar="FILE",
        help="package files or folders: core.py, minisgl/engine/ (default: all)",
    )

    parser = argparse.ArgumentParser(
        prog="upstream.py",
        description="Compare our minisgl/ (or a chapter's) with upstream mini-sglang's "
        f"{UPSTREAM_PACKAGE}/ at the pinned commit {PINNED_COMMIT[:12]}.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_diff = sub.add_parser(
        "diff",
        parents=[common],
        help="unified diff, upstream -> ours",
        description="Unified diff of each file, upstream (old) -> ours (new).",
    )
    p_diff.add_argument(
        "-U",
        "--context",
        type=int,
        default=3,
        metavar="N",
        help="lines of context (default: %(default)s)",
    )
    p_diff.add_argument("--stat", action="store_true", help="only the per-file summary lines")
    p_api = sub.add_parser(
        "api",
        parents=[common],
        help="public API table, read with ast",
        description="Public classes, functions, methods and fields of each "
        "module, compared by name and signature.",
    )
    level = p_api.add_mutually_exclusive_group()
    level.add_argument("--names-only", action="store_true", help="compare names only")
    level.add_argument(
        "--strict",
        action="store_true",
        help="compare annotations too (typing spellings normalised)",
    )
    p_api.add_argument("--hide-match", action="store_true", help="leave out the 'match' rows")
    p_api.add_argument(
        "--fail-on-missing", action="store_true", help="exit 1 when upstream has API that we lack"
    )
    return parser


def run(args: argparse.Namespace) -> int:
    upstream = open_upstream(args.upstream, args.commit, args.cache_dir)
    ours = our_tree(args.repo_root.resolve(), args.chapter)
    if args.command == "diff":
        report = diff_report(ours, upstream, args.files, args.context)
        sys.stdout.write(format_diff(report, ours, upstream, args.stat))
        return 0
    level: Level = "names" if args.names_only else "strict" if args.strict else "shape"
    modules = api_report(ours, upstream, args.files, level)
    sys.stdout.write(format_api(modules, level, args.hide_match))
    return 1 if args.fail_on_missing and count_statuses(modules)["missing"] else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        status = run(args)
        sys.stdout.flush()  # a closed pipe shows up here, not at exit
        return status
    except UpstreamError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `... | head`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
