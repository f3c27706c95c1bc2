"""Which functions of the package a test ran, recorded in every process of the test run.

`tools/steps.py` reruns a carried-forward test in a later chapter only if that chapter changed
something the test ran or reads (tools/changes.py). To know what it ran, every module of the
package is compiled with one extra statement at the top of each function, nested ones
included: ``__book_hit__(N)``, where N stands for the function's top-level definition (a
module-level function or a method; a nested function counts as the one it is written in,
whose body holds it). The first call of each N is noted, so a hot function costs one set
lookup per call. Nothing else in the code changes: line numbers, tracebacks and the source
that ``inspect`` reads are those of the file.

Two kinds of process record:

* pytest's own process (the plugin ``book_record_plugin`` says so): the functions each test
  ran, in its setup, call and teardown, and those that module- and session-scoped fixtures ran
  while they were set up (they count for every test that uses the fixture);
* any other process (a worker a test started, forked or spawned): a file ``<pid>.hits`` in the
  record folder, written as it runs (a killed process has written what it ran so far), with
  the moments it started and ended. Its functions count for every test that ran while it lived.

Functions compiled from their source text (``@triton.jit``) are left alone: what they run is
not their code object. tools/changes.py treats a change to their body as a change to the module.
"""

from __future__ import annotations

import ast
import atexit
import builtins
import importlib.abc
import importlib.machinery
import os
import sys
import time
from typing import Dict, List, Optional, Set, Tuple

SOURCE_COMPILED = {"jit", "autotune", "heuristics", "script", "compile"}

_TABLE: List[Tuple[str, str]] = []  # N -> (file relative to the tree, top-level qualname)
_INDEX: Dict[Tuple[str, str], int] = {}
_current: Set[int] = set()  # where hits go now (the pytest plugin swaps it per test)
_folder: Optional[str] = None
_tree = ""
_fd: Optional[int] = None  # this process's .hits file, when it is not pytest's own process
_pid = 0


def hit(n: int) -> None:
    """Called at the top of every function of the package."""
    if n in _current:
        return
    _current.add(n)
    if _fd is not None:
        if os.getpid() != _pid:  # forked by a path that skipped the at-fork hook
            _become_child()
        file, qualname = _TABLE[n]
        os.write(_fd, f"H {file}\t{qualname}\n".encode())


def _open_hits() -> None:
    global _fd, _pid, _current
    _pid = os.getpid()
    _current = set()
    assert _folder is not None
    _fd = os.open(os.path.join(_folder, f"{_pid}.hits"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.write(_fd, f"S {time.monotonic():.6f}\n".encode())


def _become_child() -> None:
    """After a fork: this is a new process with hits of its own."""
    global _fd
    if _fd is not None:
        try:
            os.close(_fd)
        except OSError:
            pass
        _fd = None
    _open_hits()


def _note_end() -> None:
    if _fd is not None and os.getpid() == _pid:
        try:
            os.write(_fd, f"E {time.monotonic():.6f}\n".encode())
        except OSError:
            pass


def as_pytest_process() -> None:
    """pytest's own process records per test (the plugin swaps `_current`), in memory."""
    global _fd
    if _fd is not None:
        os.close(_fd)
        os.unlink(os.path.join(_folder or "", f"{_pid}.hits"))
        _fd = None


def table() -> List[Tuple[str, str]]:
    return _TABLE


def swap(target: Set[int]) -> Set[int]:
    """Send hits to `target` from now on; return where they went before."""
    global _current
    before, _current = _current, target
    return before


# --------------------------------------------------------------------------- instrumenting
def _is_source_compiled(node: ast.AST) -> bool:
    for decorator in getattr(node, "decorator_list", []):
        while isinstance(decorator, (ast.Call, ast.Subscript)):
            decorator = decorator.func if isinstance(decorator, ast.Call) else decorator.value
        name = getattr(decorator, "attr", None) or getattr(decorator, "id", None)
        if name in SOURCE_COMPILED:
            return True
    return False


def _number(file: str, qualname: str) -> int:
    key = (file, qualname)
    if key not in _INDEX:
        _INDEX[key] = len(_TABLE)
        _TABLE.append(key)
    return _INDEX[key]


def _prepend_hit(func: ast.AST, n: int) -> None:
    body = func.body  # type: ignore[attr-defined]
    first = body[0]
    call = ast.Expr(
        ast.Call(ast.Name("__book_hit__", ast.Load()), [ast.Constant(n)], []),
    )
    ast.copy_location(call, first)
    ast.copy_location(call.value, first)
    ast.copy_location(call.value.func, first)
    ast.copy_location(call.value.args[0], first)
    has_doc = (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    )
    body.insert(1 if has_doc else 0, call)


def _instrument_functions(node: ast.AST, n: int) -> None:
    """Every function inside `node` (nested defs, methods of local classes) reports `n`."""
    for child in ast.walk(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) and child is not node:
            if not _is_source_compiled(child):
                _prepend_hit(child, n)


def instrument(tree: ast.Module, file: str) -> ast.Module:
    def visit(body: List[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if _is_source_compiled(node):
                    continue
                n = _number(file, prefix + node.name)
                _instrument_functions(node, n)
                _prepend_hit(node, n)
            elif isinstance(node, ast.ClassDef):
                visit(node.body, f"{prefix}{node.name}.")

    visit(tree.body, "")
    return tree


class _RecordingLoader(importlib.machinery.SourceFileLoader):
    def get_code(self, fullname: str):  # type: ignore[override]
        path = self.get_filename(fullname)
        source = self.get_data(path)
        tree = ast.parse(source, filename=path)
        rel = os.path.relpath(os.path.realpath(path), _tree).replace(os.sep, "/")
        return compile(instrument(tree, rel), path, "exec", dont_inherit=True)


class _RecordingFinder(importlib.abc.MetaPathFinder):
    """Finds the package's modules in the tree, as usual, and gives them the loader above."""

    def __init__(self, package: str) -> None:
        self.package = package

    def find_spec(self, name, path=None, target=None):
        if name != self.package and not name.startswith(self.package + "."):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path if path else [_tree])
        if spec is None or not (spec.origin or "").endswith(".py"):
            return spec
        spec.loader = _RecordingLoader(name, spec.origin)
        return spec


def install(tree: str, package: str, folder: str) -> None:
    """Record this process (called by tools/guard/sitecustomize.py at start-up)."""
    global _folder, _tree
    _folder, _tree = folder, tree
    builtins.__book_hit__ = hit  # type: ignore[attr-defined]
    sys.meta_path.insert(0, _RecordingFinder(package))
    _open_hits()
    os.register_at_fork(after_in_child=_become_child)
    atexit.register(_note_end)
    real_exit = os._exit

    def exit_noting_the_end(code: int) -> None:  # multiprocessing's children leave this way
        _note_end()
        real_exit(code)

    os._exit = exit_noting_the_end  # type: ignore[assignment]
