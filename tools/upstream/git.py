"""Git helpers: run git against one named repository, clone or fetch a URL into the cache,
and resolve the commit to read."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

PINNED_COMMIT = "20fcd7f3c6a1898a61139fae1c97cc7a40bd8d66"
UPSTREAM_URL = "https://github.com/sgl-project/mini-sglang.git"

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


def _git_env(ceiling: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _GIT_REDIRECTS}
    env["GIT_TERMINAL_PROMPT"] = "0"  # a URL that needs a password fails instead of waiting
    if ceiling is not None:
        env["GIT_CEILING_DIRECTORIES"] = str(ceiling)
    return env


def git(
    args: Sequence[str], *, cwd: Path | None = None, ceiling: Path | None = None
) -> subprocess.CompletedProcess[bytes]:
    """Run git; the caller looks at returncode. Only a missing git binary raises."""
    try:
        return subprocess.run(
            ["git", *args], cwd=cwd, env=_git_env(ceiling), capture_output=True, check=False
        )
    except FileNotFoundError as e:
        raise UpstreamError("git is not installed (it is needed to read upstream)") from e


def git_message(stderr: bytes) -> str:
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
    done = git(["rev-parse", "--absolute-git-dir"], cwd=path, ceiling=path.parent)
    if done.returncode != 0:
        raise UpstreamError(
            f"{path} is not a git repository (expected the top of a mini-sglang checkout or a bare "
            f"git directory; git says: {git_message(done.stderr)})"
        )
    return Path(done.stdout.decode().strip())


def resolve_commit(git_dir: Path, commit: str) -> str | None:
    """The full hash that `commit` (a hash, a prefix, a branch or tag) names, if git has it."""
    done = git(
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
    done = git(
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
        raise UpstreamError(f"git fetch {url} failed: {git_message(done.stderr)}")


def ensure_clone(url: str, commit: str, cache_dir: Path) -> Path:
    """A bare clone of `url` under `cache_dir` that has `commit` (cloned or fetched as needed)."""
    target = clone_dir_for(url, cache_dir)
    if not target.exists():
        cache_dir.mkdir(parents=True, exist_ok=True)
        print(f"cloning {url} into {target} ...", file=sys.stderr)
        staging = Path(tempfile.mkdtemp(prefix=".clone-", dir=cache_dir))
        try:
            done = git(["clone", "--bare", "--quiet", url, str(staging / "repo.git")])
            if done.returncode != 0:
                raise UpstreamError(
                    f"git clone {url} failed: {git_message(done.stderr)} "
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
