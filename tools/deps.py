"""Which files of a chapter's tree a test file can bring in, read from the code.

`tools/selection.py` uses this static reading twice: a test reruns if a module its file can
import became opaque (it does something else at import), and the check verifies that every
package module the tests' processes really loaded was predicted here. The dependencies are the
closure of the file's imports over the tree, taken from the source (``ast``), with every import
counted, at module level and inside functions, except those under ``if TYPE_CHECKING:``, which
never run. Imports that the source does not spell out are covered by three rules that err on
the side of including:

* ``importlib.import_module(...)`` with a name that is not a constant depends on every module
  of the calling module's package (the model registry picks a module by architecture);
* a command line written out as a list that runs a module (``[sys.executable, "-m",
  "minisgl", ...]``) depends on that module, and a string constant that names a Python file
  of the tree (``"examples/ch07_scheduler.py"``, as in ``load_example``) on that file;
* a package module (not a package's ``__init__.py``) depends on the files that are not Python
  in its folder and below (kernel sources read at run time).
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional, Set, Tuple


def module_name(rel: str) -> Optional[str]:
    """'minisgl/a/b.py' -> 'minisgl.a.b', 'minisgl/a/__init__.py' -> 'minisgl.a'."""
    if not rel.endswith(".py"):
        return None
    parts = rel[: -len(".py")].split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def absolute_module(rel: str, module: Optional[str], level: int) -> str:
    """The module that `from <level dots><module> import ...` in file `rel` names."""
    if level == 0:
        return module or ""
    parts = (module_name(rel) or "").split(".")
    base = parts if rel.endswith("__init__.py") else parts[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, module] if module else base)


class ImportGraph:
    """The files of one tree (relative paths) and which files each one brings in."""

    def __init__(self, tree: Path, package: str) -> None:
        self.tree = Path(tree)
        self.package = package
        self.files = sorted(
            p.relative_to(self.tree).as_posix()
            for p in self.tree.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts
        )
        self.modules: Dict[str, str] = {}  # dotted name -> file, for every Python file
        for rel in self.files:
            name = module_name(rel)
            if name is not None:
                self.modules[name] = rel
        self._edges: Dict[str, Set[str]] = {}

    # ------------------------------------------------------------------ one file's imports
    def _with_parents(self, name: str) -> Set[str]:
        """The files that importing `name` runs: its own and its packages' __init__.py."""
        found = set()
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            rel = self.modules.get(".".join(parts[:i]))
            if rel is not None:
                found.add(rel)
        return found

    def _package_modules(self, package: str) -> Set[str]:
        prefix = package + "."
        return {
            rel for name, rel in self.modules.items() if name == package or name.startswith(prefix)
        }

    def edges(self, rel: str) -> Set[str]:
        if rel in self._edges:
            return self._edges[rel]
        found: Set[str] = set()
        if rel.endswith(".py"):
            found |= self._python_edges(rel)
        own = module_name(rel)
        if (
            own is not None
            and own.split(".")[0] == self.package
            and not rel.endswith("__init__.py")
        ):
            folder = rel.rsplit("/", 1)[0] + "/"
            found |= {f for f in self.files if f.startswith(folder) and not f.endswith(".py")}
        found.discard(rel)
        self._edges[rel] = found
        return found

    def _python_edges(self, rel: str) -> Set[str]:
        found: Set[str] = set()
        named = _references((self.tree / rel).read_text(), rel)
        for module in named.modules:
            found |= self._with_parents(module)
        for package in named.packages:
            found |= self._package_modules(package)
        for module in named.run:
            if module in self.modules:
                found |= self._with_parents(module) | self._with_parents(f"{module}.__main__")
        found |= {f for f in named.files if f in self.files}
        return found

    # ------------------------------------------------------------------ closure
    def closure(self, roots: Iterable[str]) -> Set[str]:
        seen: Set[str] = set()
        todo = [r for r in roots if r in self.files]
        while todo:
            rel = todo.pop()
            if rel in seen:
                continue
            seen.add(rel)
            todo.extend(self.edges(rel) - seen)
        return seen

    def package_dependencies(self, roots: Iterable[str]) -> Set[str]:
        """The package's files among everything `roots` bring in."""
        return {f for f in self.closure(roots) if f.startswith(self.package + "/")}


@dataclass(frozen=True)
class References:
    """What one Python file names that may bring in other files, before any tree is known."""

    modules: Tuple[str, ...] = ()  # imported, with the packages above them
    packages: Tuple[str, ...] = ()  # every module of these (`import_module` of a computed name)
    run: Tuple[str, ...] = ()  # `-m NAME` in a command line written out as a list
    files: Tuple[str, ...] = ()  # string constants ending in .py (`load_example(...)`)


@functools.lru_cache(maxsize=None)
def _references(source: str, rel: str) -> References:
    """The file's references, read once per version of it (a check reads each tree's files)."""
    try:
        tree = ast.parse(source, filename=rel)
    except SyntaxError:
        return References()
    modules: List[str] = []
    packages: List[str] = []
    run: List[str] = []
    files: List[str] = []
    own = module_name(rel) or ""
    for node in _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            modules += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = absolute_module(rel, node.module, node.level)
            if base:  # `from pkg import submodule` brings in pkg.submodule if there is one
                modules += [base, *(f"{base}.{alias.name}" for alias in node.names)]
        elif isinstance(node, ast.Call) and _is_import_module(node):
            name = node.args[0] if node.args else None
            if isinstance(name, ast.Constant) and isinstance(name.value, str):
                dots = len(name.value) - len(name.value.lstrip("."))
                target = absolute_module(rel, name.value[dots:] or None, dots)
                modules += [target] if target else []
            else:  # a computed name: anything in the caller's package
                packages.append(own.rsplit(".", 1)[0] if "." in own else own)
        elif isinstance(node, (ast.List, ast.Tuple)):  # [sys.executable, "-m", "minisgl", ...]
            items = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
            run += [n for f, n in zip(items, items[1:]) if f == "-m" and isinstance(n, str)]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value.endswith(".py"):
                files.append(node.value)
    return References(tuple(modules), tuple(packages), tuple(run), tuple(files))


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node of `tree` except what sits under `if TYPE_CHECKING:` (it never runs)."""
    todo: List[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, ast.If) and is_type_checking_test(node.test):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))


def is_type_checking_test(test: ast.expr) -> bool:
    """`TYPE_CHECKING` or `typing.TYPE_CHECKING`: the test of a block that runs only for
    the type checker."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _is_import_module(node: ast.Call) -> bool:
    func = node.func
    return (isinstance(func, ast.Attribute) and func.attr == "import_module") or (
        isinstance(func, ast.Name) and func.id == "import_module"
    )
