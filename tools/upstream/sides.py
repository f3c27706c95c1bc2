"""The two sides of a comparison: upstream's package at one commit (`Upstream`) and ours
(`OurTree`, from minisgl/ or from one chapter)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from tools.upstream.git import (
    PINNED_COMMIT,
    UpstreamError,
    default_cache_dir,
    ensure_clone,
    find_git_dir,
    git,
    git_message,
    is_url,
    resolve_commit,
)

UPSTREAM_PACKAGE = "python/minisgl"
OUR_PACKAGE = "minisgl"
REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Upstream:
    """Upstream's package at one commit of one git directory."""

    git_dir: Path
    commit: str  # the full hash

    def _git(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        return git(["--git-dir", str(self.git_dir), *args])

    @cached_property
    def files(self) -> list[str]:
        """Package-relative paths of every file under python/minisgl/ at the commit."""
        done = self._git("ls-tree", "-r", "-z", "--name-only", self.commit, "--", UPSTREAM_PACKAGE)
        if done.returncode != 0:
            raise UpstreamError(f"git ls-tree failed in {self.git_dir}: {git_message(done.stderr)}")
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
                f"{git_message(done.stderr)}"
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
    """Chapter `number`'s package, from tools/book.py's Book."""
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    try:
        from tools.book import Book, chapter_arg, chapter_name
    except Exception as e:  # any failure while importing it: report, do not crash
        raise UpstreamError(f"--chapter needs tools/book.py, which cannot be imported: {e}") from e
    try:
        book = Book(repo_root)
        book.chapter(number)
        stored = book.package_files(number)
        package = getattr(book, "package", OUR_PACKAGE)
    except Exception as e:  # BookError and friends: no chapters yet, a bad manifest, ...
        raise UpstreamError(
            f"--chapter {chapter_arg(number)}: cannot read the chapters in {repo_root}: {e}"
        ) from e
    prefix = package + "/"
    files = {k[len(prefix) :]: Path(v) for k, v in sorted(stored.items()) if k.startswith(prefix)}
    if not files:
        print(f"note: {chapter_name(number)} has no package files yet", file=sys.stderr)
    name = chapter_name(number)
    return OurTree(files=files, label=name, tag=name)


def our_tree(repo_root: Path, chapter: int | None) -> OurTree:
    return (
        ours_from_package(repo_root) if chapter is None else ours_from_chapter(repo_root, chapter)
    )
