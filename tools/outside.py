"""What a test's own code reads outside the package, per test, read from the source.

`tools/guard/book_record.py` records which of the package's functions a test ran. The code
around them is not recorded: the test file and conftest.py (pytest compiles those itself, to
rewrite their asserts) and the helpers they import (tools/, examples/, tests/support/). For
those files a test's reads are read from the source, starting from the test's own name and
following what the code names, the way Python would find it:

* a plain name, in the file that reads it (a function, a class or an assignment of its own)
  or in the file it imports it from (``from tools.parity import hf_references``; through a
  re-export, a relative import or ``import *`` too);
* an attribute, in the files the reader's file holds as modules: those it imports whole
  (``import tools.parity``) or names as a path (``load_example("examples/ch09_radix.py")``);
* a fixture (an argument's name, or a string: ``getfixturevalue("server")``), in the
  reader's file and in conftest.py;
* a class counts whole, every method.

Some code runs for every test, named or not, and counts for each: a module-level statement
other than an import or a definition (``RadixAgainstModel.TestCase.settings = ...``), every
decorator that runs at import (a parametrize list decides which tests there are; one inside
a function runs with the function), ``pytestmark``, pytest's hooks
and autouse fixtures. A file's ``if __name__ == "__main__":`` block counts only where reached
code names the file (``"examples/ch15_server.py"``, ``"-m", "tools.bench_offline"``): it runs
as a program then, never on import.

What a reached part reads is every name it mentions (tools/changes.names_in), less the plain
names its own file binds (a def, a class, an assignment; never one it imports anywhere):
test_ch15_server's ``ENV`` is its own, not ``minisgl.env.ENV``; a name imported under another
one (``import ... as``) counts by its own name too. An import reads nothing by itself (the
code that uses the name does), but one whose name is gone from the package fails the whole
test file at import: :func:`missing_imports` names those.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Set, Tuple

from tools.changes import is_docstring, is_type_checking, names_in
from tools.deps import absolute_module, module_name


@dataclass
class Part:
    """A piece of an outside file: a definition, or what runs at import."""

    reads: Set[str] = field(default_factory=set)  # what it mentions, less the file's own names
    plain: Set[str] = field(default_factory=set)  # names it reads as variables
    attributes: Set[str] = field(default_factory=set)  # names it reads as attributes
    fixtures: Set[str] = field(default_factory=set)  # its arguments' names, its identifier strings
    paths: Set[str] = field(default_factory=set)  # strings that may name a file or module


@dataclass
class OutsideFile:
    definitions: Dict[str, List[Part]] = field(default_factory=dict)  # top-level name -> parts
    at_import: Part = field(default_factory=Part)  # what runs for every test
    always: Set[str] = field(default_factory=set)  # hooks and autouse fixtures
    main: Part = field(default_factory=Part)  # the `if __name__ == "__main__":` block
    imports: List[Tuple[str, str]] = field(default_factory=list)  # (module, name or "")
    imported: Dict[str, Tuple[str, str]] = field(default_factory=dict)  # bound -> (module, name)
    modules: Set[str] = field(default_factory=set)  # modules it imports whole (dotted)
    star: List[str] = field(default_factory=list)  # modules it imports every name of
    paths: Set[str] = field(default_factory=set)  # strings that may name a file or module


def _is_main_block(node: ast.stmt) -> bool:
    """`if __name__ == "__main__":`"""
    test = getattr(node, "test", None)
    return (
        isinstance(node, ast.If)
        and isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
        and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in test.comparators)
    )


def _is_autouse_fixture(node: ast.AST) -> bool:
    return any(
        isinstance(d, ast.Call)
        and any(
            k.arg == "autouse" and isinstance(k.value, ast.Constant) and k.value.value is True
            for k in d.keywords
        )
        for d in getattr(node, "decorator_list", [])
    )


def _decorators(node: ast.AST) -> List[ast.expr]:
    """The decorators that run at import: a definition's own and, in a class, those of its
    methods and inner classes. A function's inner definitions are decorated when it runs, so
    they count only where the function is reached."""
    found = list(getattr(node, "decorator_list", []))
    if isinstance(node, ast.ClassDef):
        for s in node.body:
            if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found += _decorators(s)
    return found


def _assigned(node: ast.stmt) -> Optional[Set[str]]:
    """The names an assignment binds (x = ..., a, b = ...); None for any other statement and
    for one that sets an attribute or an item (that changes an object that exists elsewhere)."""
    if isinstance(node, ast.Assign):
        targets: List[ast.expr] = list(node.targets)
    elif isinstance(node, ast.AnnAssign) and node.value is not None:
        targets = [node.target]
    else:
        return None
    names = set()
    for sub in (n for t in targets for n in ast.walk(t)):
        if isinstance(sub, ast.Name):
            names.add(sub.id)
        elif not isinstance(sub, (ast.Tuple, ast.List, ast.Starred, ast.Store)):
            return None
    return names


def _arguments(node: ast.AST) -> Set[str]:
    """The argument names of every function in `node`."""
    return {
        a.arg
        for sub in ast.walk(node)
        if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for a in [*sub.args.posonlyargs, *sub.args.args, *sub.args.kwonlyargs]
    }


def read_outside(source: str, rel: str) -> OutsideFile:
    """The parts of one file outside the package (`rel`, relative to the tree) and what each
    part reads and names."""
    tree = ast.parse(source, filename=rel)
    body = [s for s in tree.body if not is_type_checking(s)]
    result = OutsideFile()
    result.paths = _paths(
        n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    )
    for node in ast.walk(tree):  # anywhere: a test function's own imports count too
        if isinstance(node, ast.Import):
            for a in node.names:
                result.modules.add(a.name)
                if a.asname:
                    result.imported[a.asname] = (a.name, "")
        elif isinstance(node, ast.ImportFrom):
            source = absolute_module(rel, node.module, node.level)
            for a in node.names:
                if a.name == "*":
                    result.star.append(source)
                    continue
                result.imported[a.asname or a.name] = (source, a.name)
                result.modules.add(f"{source}.{a.name}")  # `from tools import parity`
    own: Set[str] = set()
    for s in body:
        if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(s.name)
        own |= _assigned(s) or set()
    own -= set(result.imported) | {m.split(".")[0] for m in result.modules}

    def part(nodes: Iterable[ast.AST], arguments: Iterable[str] = ()) -> Part:
        nodes = list(nodes)
        mentioned = names_in(nodes)
        strings = {
            n.value
            for node in nodes
            for n in ast.walk(node)
            if isinstance(n, ast.Constant) and isinstance(n.value, str)
        }
        return Part(
            reads=mentioned - own,
            plain={n for n in mentioned if not n.startswith(".")},
            attributes={n[1:] for n in mentioned if n.startswith(".")},
            fixtures=set(arguments) | {s for s in strings if s.isidentifier()},
            paths=_paths(strings),
        )

    at_import: List[ast.AST] = []
    main: List[ast.AST] = []
    for s in body:
        if _is_main_block(s):
            main.append(s)
        elif isinstance(s, ast.ImportFrom):
            result.imports += [(absolute_module(rel, s.module, s.level), a.name) for a in s.names]
        elif isinstance(s, ast.Import):
            result.imports += [(a.name, "") for a in s.names]
        elif isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            at_import += _decorators(s)
            result.definitions.setdefault(s.name, []).append(part([s], _arguments(s)))
            if s.name.startswith("pytest_") or _is_autouse_fixture(s):
                result.always.add(s.name)
        elif (names := _assigned(s)) and "pytestmark" not in names:
            for name in names:
                result.definitions.setdefault(name, []).append(part([s]))
        elif not is_docstring(s):  # a call, an `if`, a `try`: it runs at import
            at_import.append(s)
    result.at_import = part(at_import)
    result.main = part(main)
    return result


def _paths(strings: Iterable[str]) -> Set[str]:
    """The strings that may name a file ("examples/ch15_server.py") or a module."""
    return {s for s in strings if ("/" in s or "." in s) and len(s) < 200 and " " not in s}


def _names_file(text: str, rel: str) -> bool:
    """Whether a string constant names the file `rel`: a path to it, or its module."""
    return text in (rel, module_name(rel)) or rel.endswith("/" + text) or text.endswith("/" + rel)


class OutsideReads:
    """What each test reads in the outside files of one test file's closure (`files`: its
    test file, conftest.py and the helpers they can import)."""

    def __init__(self, files: Dict[str, OutsideFile]) -> None:
        self.files = files
        self.by_module = {module_name(rel): rel for rel in files}
        self.conftests = [rel for rel in files if rel.endswith("conftest.py")]
        # the modules each file holds: those it imports whole, and those it names by path (a
        # module-level `ch06 = load_example("examples/ch06_engine.py")` serves every function)
        self.held = {rel: self._named(f.paths) for rel, f in files.items()}
        for rel, f in files.items():
            self.held[rel] += [self.by_module[m] for m in f.modules if m in self.by_module]

    def _named(self, paths: Set[str]) -> List[str]:
        return [r for r in self.files if any(_names_file(s, r) for s in paths)]

    def of(self, test_file: str, name: str) -> Set[str]:
        """What the test `name` of `test_file` (its function or class, or the assignment
        that binds it) reads."""
        files = self.files
        reads: Set[str] = set()
        todo: List[Tuple[str, str]] = [(test_file, name)]  # (file, top-level name) to take in
        seen: Set[Tuple[str, str]] = set()
        programs: Set[str] = set()  # files that reached code runs as programs

        def take(rel: str, piece: Part) -> None:
            """Count what `piece` of file `rel` reads, and queue what it names."""
            reads.update(piece.reads)
            f = files[rel]
            for n in piece.plain | piece.fixtures:  # a fixture may be imported, too
                if n in f.imported:
                    reads.add(f.imported[n][1] or n)  # renamed by `as`: the package's own name
                todo.append((rel, n))
            for n in piece.attributes | piece.fixtures:  # getattr(module, "name") too
                todo.extend((r, n) for r in self.held[rel])
            for n in piece.fixtures:
                todo.extend((r, n) for r in self.conftests)
            for r in self._named(piece.paths):
                if r not in programs:
                    programs.add(r)
                    take(r, files[r].main)

        for rel, f in files.items():
            take(rel, f.at_import)
            todo.extend((rel, n) for n in f.always)
        while todo:
            key = todo.pop()
            if key in seen or key[0] not in files:
                continue
            seen.add(key)
            rel, n = key
            f = files[rel]
            for piece in f.definitions.get(n, []):
                take(rel, piece)
            if n in f.imported:  # defined elsewhere: follow the import (a re-export too)
                module, original = f.imported[n]
                if original and module in self.by_module:
                    todo.append((self.by_module[module], original))
            elif n not in f.definitions:  # perhaps from a module it imports every name of
                todo.extend((self.by_module[m], n) for m in f.star if m in self.by_module)
        return reads


def missing_imports(
    files: Dict[str, OutsideFile], package: str, exists: Dict[str, Set[str]]
) -> List[str]:
    """The top-level imports of `files` that the package no longer has. `exists` maps each of
    the package's modules (dotted) to the names it binds at its top level (top_level_names)."""
    missing = []
    for rel, f in sorted(files.items()):
        for module, name in f.imports:
            if module != package and not module.startswith(package + "."):
                continue
            if module not in exists:
                missing.append(f"{rel} imports {module}, which is gone")
            elif name and name != "*" and not {name, "__getattr__"} & exists[module]:
                if f"{module}.{name}" not in exists:
                    missing.append(f"{rel} imports {name} from {module}, which no longer has it")
    return missing


def top_level_names(source: str) -> Set[str]:
    """Every name a module binds at its top level, under an `if` or a `try` too."""
    names: Set[str] = set()
    todo: List[ast.stmt] = list(ast.parse(source).body)
    while todo:
        s = todo.pop()
        if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(s.name)
        elif isinstance(s, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in s.names}
        elif isinstance(s, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
            todo += [*s.body, *s.orelse, *getattr(s, "finalbody", [])]
            todo += [x for h in getattr(s, "handlers", []) for x in h.body]
            targets = [getattr(s, "target", None)]
            targets += [i.optional_vars for i in getattr(s, "items", [])]
            names |= {
                n.id
                for t in targets
                if t is not None
                for n in ast.walk(t)
                if isinstance(n, ast.Name)
            }
        else:
            names |= {
                n.id
                for n in ast.walk(s)
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
            }
    return names
