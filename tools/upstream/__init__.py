"""Compare our package with upstream mini-sglang at the pinned commit.

    python -m tools.upstream diff --upstream PATH_OR_URL [--chapter N] [FILE ...]
    python -m tools.upstream api  --upstream PATH_OR_URL [--chapter N] [FILE ...]

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
a package's ``__init__.py`` re-exports are compared too). Each row is ``match``, ``missing``
(upstream only), ``extra`` (ours only) or ``different``. What counts as the same:

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

from tools.upstream.api_compare import (
    LEVEL_NOTES,
    STATUSES,
    ApiRow,
    ModuleApi,
    Status,
    api_report,
    compare_api,
    count_statuses,
    format_api,
)
from tools.upstream.api_normalize import normalize_annotation, unqualified
from tools.upstream.api_read import (
    KEYWORD_ONLY,
    POSITIONAL,
    POSITIONAL_ONLY,
    VAR_KEYWORD,
    VAR_POSITIONAL,
    ApiItem,
    Level,
    Param,
    class_item,
    field_item,
    function_item,
    is_public,
    module_api,
    parameters,
    render_signature,
)
from tools.upstream.choose import package_relative, select_files, where
from tools.upstream.cli import build_parser, main, run
from tools.upstream.diff import FileDiff, diff_file, diff_report, format_diff
from tools.upstream.git import (
    PINNED_COMMIT,
    UPSTREAM_URL,
    UpstreamError,
    clone_dir_for,
    default_cache_dir,
    ensure_clone,
    find_git_dir,
    git_message,
    is_url,
    resolve_commit,
)
from tools.upstream.sides import (
    OUR_PACKAGE,
    REPO_ROOT,
    UPSTREAM_PACKAGE,
    OurTree,
    Upstream,
    open_upstream,
    our_tree,
    ours_from_chapter,
    ours_from_package,
)

__all__ = [
    "ApiItem",
    "ApiRow",
    "FileDiff",
    "KEYWORD_ONLY",
    "LEVEL_NOTES",
    "Level",
    "ModuleApi",
    "OUR_PACKAGE",
    "OurTree",
    "PINNED_COMMIT",
    "POSITIONAL",
    "POSITIONAL_ONLY",
    "Param",
    "REPO_ROOT",
    "STATUSES",
    "Status",
    "UPSTREAM_PACKAGE",
    "UPSTREAM_URL",
    "Upstream",
    "UpstreamError",
    "VAR_KEYWORD",
    "VAR_POSITIONAL",
    "annotations",
    "api_report",
    "build_parser",
    "class_item",
    "clone_dir_for",
    "compare_api",
    "count_statuses",
    "default_cache_dir",
    "diff_file",
    "diff_report",
    "ensure_clone",
    "field_item",
    "find_git_dir",
    "format_api",
    "format_diff",
    "function_item",
    "git_message",
    "is_public",
    "is_url",
    "main",
    "module_api",
    "normalize_annotation",
    "open_upstream",
    "our_tree",
    "ours_from_chapter",
    "ours_from_package",
    "package_relative",
    "parameters",
    "render_signature",
    "resolve_commit",
    "run",
    "select_files",
    "unqualified",
    "where",
]
