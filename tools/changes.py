"""What changed in the package between two chapters, at the grain of functions and names.

A carried-forward test is rerun in a later chapter only if that chapter could change its
result (BOOK.md, rule 6). `tools/guard/book_record.py` records which functions of the
package each test ran; this module reads the two versions of the source and says which changes
could reach a test:

* the **body** of a function it ran changed (everything below its signature: nested functions,
  the docstring);
* a **name** it reads means something else now. A name of a module or a class means something
  else when what it is bound to changed (a signature, a decorator, a base class, a class
  attribute, the value of an assignment, the source of an import) or when it is gone; a name
  that is new means nothing else, since code that read it before would have failed (unless
  it hides a builtin, or it is a method, which can override one it inherits; an abstract
  method, new or gone, changes its class: it decides whether a subclass can be made). An object
  changed at import also counts as a name: a registry that gained an entry. And what a name
  means spreads: a statement run at import that reads a changed name binds changed names (a
  subclass of a changed class, a re-export);
* a member set on a class of the same module after its definition (``Cls.x = property(...)``)
  counts as a member of that class;
* a module now does something at import that is neither a definition nor a binding (a call at
  module level, an ``if`` or a ``try`` around definitions, a decorator not known to be pure):
  the module is **opaque**, and every test whose files can import it reruns. Making a named
  tuple of the package (``KernelConfig(num_threads=128)``) is a binding, as is making an
  object of a class of the same module;
* a file that is not Python (a kernel source) changed: the modules of its folder read it. One
  that does nothing at import but define and bind reads it only when its functions run, so
  the tests that ran one of them rerun; any other becomes opaque.

Names are compared without their module, which errs on the side of rerunning: a changed
module-level ``config`` counts for every reader of a variable or an attribute ``config``. A
changed member of a class (a method ``forward``, a field) counts for code that reads the
attribute ``.forward`` and also meets the class (or a subclass or re-export of it): reads its
name or ran one of its methods. Code that holds an object of the class got it from code that
named the class (a constructor call), or from a registry whose entry ran the class's
``__init__``. Comments and formatting never count.
"""

from __future__ import annotations

import ast
import builtins
import functools
from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, FrozenSet, Iterable, List, Optional, Set, Tuple

from tools.deps import absolute_module, is_type_checking_test, module_name

# Decorators that only wrap or describe the function they decorate and change nothing else.
PURE_DECORATORS = {
    "property",
    "setter",
    "getter",
    "deleter",
    "staticmethod",
    "classmethod",
    "cached_property",
    "abstractmethod",
    "dataclass",
    "total_ordering",
    "lru_cache",
    "cache",
    "wraps",
    "contextmanager",
    "asynccontextmanager",
    "overload",
    "override",
    "final",
    "runtime_checkable",
    "no_grad",
    "inference_mode",
    "nvtx_annotate",
    "model_validator",
    "field_validator",
}
# Decorators that compile the function from its source text instead of running its code
# object: the recorder cannot see it run, so a change of its body makes the module opaque.
SOURCE_COMPILED_DECORATORS = {"jit", "autotune", "heuristics", "script", "compile"}
# Calls that make a new object from their arguments and touch nothing else.
PURE_CALLS = {
    "init_logger",
    "getLogger",
    "TypeVar",
    "NewType",
    "ParamSpec",
    "Registry",
    "field",
    "namedtuple",
    "type",
    "object",
    "frozenset",
    "tuple",
    "dict",
    "list",
    "set",
    "str",
    "int",
    "float",
    "bool",
    "bytes",
    "range",
    "sorted",
    "len",
    "count",
    "compile",  # re.compile
    "Path",
    "Lock",
    "RLock",
    "Event",
    "defaultdict",
    "OrderedDict",
    "partial",
    "property",
    "cast",
    "getenv",
    "get",  # os.environ.get(...)
    "dtype",
    "device",
    # they read attributes, as `obj.name` does, and look at types
    "getattr",
    "hasattr",
    "isinstance",
    "issubclass",
}
BUILTIN_NAMES = set(dir(builtins))


def _last_name(node: ast.expr) -> Optional[str]:
    """'x' for `x`, `a.b.x`, `x(...)` and `x[...]` (the name a decorator or call goes by)."""
    while isinstance(node, (ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _registry_of(decorator: ast.expr) -> Optional[str]:
    """'REG' for a decorator `@REG.register(...)`: it adds an entry to the object REG."""
    if (
        isinstance(decorator, ast.Call)
        and isinstance(decorator.func, ast.Attribute)
        and decorator.func.attr == "register"
        and isinstance(decorator.func.value, ast.Name)
    ):
        return decorator.func.value.id
    return None


def names_in(nodes: Iterable[Optional[ast.AST]]) -> Set[str]:
    """Every name a piece of code reads: "x" for a variable or an imported name, ".x" for an
    attribute; a string constant that looks like an identifier counts as both (a registry's
    key, getattr(obj, "forward"))."""
    found: Set[str] = set()
    for root in nodes:
        for node in ast.walk(root) if root is not None else ():
            if isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Store):
                continue  # binding a name is not reading it
            if isinstance(node, ast.Name):
                found.add(node.id)
            elif isinstance(node, ast.Attribute):
                found.add("." + node.attr)
            elif isinstance(node, ast.alias):
                found.update(node.name.split("."))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                if node.value.isidentifier():
                    found |= {node.value, "." + node.value}
    return found


def reaches(changed: Set[str], reads: Set[str]) -> Set[str]:
    """The changed names that `reads` (from names_in) meets. A changed module-level name "x"
    is met by the variable x and by the attribute .x (module.x); a changed member ".x" only
    by the attribute .x."""
    return {n for n in changed if n in reads or (not n.startswith(".") and "." + n in reads)}


def meets(changed: Set[str], reads: Set[str]) -> bool:
    """Whether `reaches(changed, reads)` is not empty, without making it."""
    return any(r in changed or (r[:1] == "." and r[1:] in changed) for r in reads)


def _dump(nodes: Iterable[ast.AST]) -> str:
    return "\n".join(ast.dump(n, include_attributes=False) for n in nodes)


def is_type_checking(node: ast.stmt) -> bool:
    """An `if TYPE_CHECKING:` block."""
    return isinstance(node, ast.If) and is_type_checking_test(node.test)


def is_docstring(node: ast.stmt) -> bool:
    """A statement that is a string alone: a docstring where it comes first."""
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    )


def _pure(node: Optional[ast.expr], own_classes: Set[str]) -> bool:
    """An expression that builds a value and touches nothing else: no call but to PURE_CALLS
    or to a class of the same module, no await, yield or walrus."""
    for sub in ast.walk(node) if node is not None else ():
        if isinstance(sub, ast.Call):
            callee = _last_name(sub.func)
            if callee not in PURE_CALLS and callee not in own_classes:
                return False
        if isinstance(sub, (ast.Await, ast.Yield, ast.YieldFrom, ast.NamedExpr)):
            return False
    return True


def _targets(node: ast.stmt) -> Set[str]:
    if isinstance(node, ast.Assign):
        targets: List[ast.expr] = list(node.targets)
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        targets = [node.target]
    else:
        return set()
    return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}


def _names_only(node: ast.stmt) -> bool:
    """An assignment to names (x = ..., a, b = ...), not to an attribute or an item of an
    object that exists elsewhere (obj.x = ..., table[k] = ...: that changes the object)."""
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]  # type: ignore[attr-defined]
    return all(
        isinstance(n, (ast.Name, ast.Tuple, ast.List, ast.Starred, ast.Store))
        for t in targets
        for n in ast.walk(t)
    )


def _members_set(node: ast.Assign, classes: Set[str]) -> List[Tuple[str, str]]:
    """[(class, member)] for `Cls.member = ...` where every target is a member of a class
    this module defined above (a property added after `@dataclass` made the fields): a change
    of the class, not of the whole module. Empty for any other assignment."""
    members = []
    for target in node.targets:
        if not (
            isinstance(target, ast.Attribute)
            and isinstance(target.value, ast.Name)
            and target.value.id in classes
        ):
            return []
        members.append((target.value.id, target.attr))
    return members


def _is_dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


@dataclass
class Function:
    header: str  # decorators, arguments with their defaults, return annotation
    body: str
    reads: Set[str]  # what its body mentions
    registries: Set[str]  # objects its decorators add it to
    impure: List[str]  # decorators that may do something else at import
    compiled_from_source: bool  # @triton.jit and the like


@dataclass
class ClassInfo:
    header: str  # decorators, bases, keywords
    members: Dict[str, str]  # member name -> its definition (a method's header, a field)


@dataclass
class Binder:
    """Something evaluated at import that binds names from names it reads."""

    binds: Set[str]
    reads: Set[str]


@dataclass
class ModuleSummary:
    functions: Dict[str, Function] = field(default_factory=dict)  # qualname -> function
    classes: Dict[str, ClassInfo] = field(default_factory=dict)  # qualname -> class
    bindings: Dict[str, str] = field(default_factory=dict)  # imports and assignments
    opaque: Counter = field(default_factory=Counter)  # statements with other effects
    binders: List[Binder] = field(default_factory=list)

    def bound_names(self) -> Set[str]:
        top = {q for q in [*self.functions, *self.classes] if "." not in q}
        return top | set(self.bindings)


def named_tuples(source: str) -> Set[str]:
    """The classes of a module that are named tuples (``class C(NamedTuple)`` with no method
    of its own that runs on construction): making one builds a value and does nothing else."""
    found = set()
    for node in ast.parse(source).body:
        if (
            isinstance(node, ast.ClassDef)
            and [_last_name(b) for b in node.bases] == ["NamedTuple"]
            and not node.keywords
            and not node.decorator_list
            and not any(
                isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                and item.name in ("__new__", "__init__", "__init_subclass__")
                for item in node.body
            )
        ):
            found.add(node.name)
    return found


def summarise(
    source: str, filename: str = "<source>", tuples: Optional[Dict[str, Set[str]]] = None
) -> ModuleSummary:
    """The parts of a module that `diff` compares. `tuples`: the package's named tuples
    (dotted module -> class names, from `named_tuples`), which the module may make at import
    as it makes its own classes' objects (`filename` is then the file's path in the package,
    to resolve its relative imports)."""
    summary = ModuleSummary()
    tree = ast.parse(source, filename=filename)
    body = [s for s in tree.body if not is_type_checking(s)]
    own_classes = {n.name for n in body if isinstance(n, ast.ClassDef)}
    lazy = any(
        isinstance(n, ast.ImportFrom)
        and n.module == "__future__"
        and any(a.name == "annotations" for a in n.names)
        for n in body
    )
    for node in body[1:] if body and is_docstring(body[0]) else body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            reads = _add_function(summary, node, node.name, lazy)
            summary.binders.append(Binder({node.name}, reads))
        elif isinstance(node, ast.ClassDef):
            summary.binders.append(Binder({node.name}, _add_class(summary, node, node.name, lazy)))
        elif isinstance(node, ast.ImportFrom):
            source_module = absolute_module(filename, node.module, node.level)
            for alias in node.names:
                bound = alias.asname or alias.name
                summary.bindings[bound] = f"from {'.' * node.level}{node.module} {alias.name}"
                summary.binders.append(Binder({bound}, {alias.name}))
                if alias.name in (tuples or {}).get(source_module, ()):
                    own_classes.add(bound)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                bound = (alias.asname or alias.name).split(".")[0]
                summary.bindings[bound] = f"import {alias.name} as {alias.asname}"
        elif (
            isinstance(node, ast.Assign)
            and _pure(node.value, own_classes)
            and (members := _members_set(node, set(summary.classes)))
        ):
            text = ast.dump(node, include_attributes=False)
            for owner, member in members:
                info = summary.classes[owner]
                info.members[member] = info.members.get(member, "") + text
            summary.binders.append(Binder({o for o, _ in members}, names_in([node.value])))
        elif (
            isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign))
            and _names_only(node)
            and _pure(node.value, own_classes)
        ):
            text = ast.dump(node, include_attributes=False)
            for name in _targets(node):
                summary.bindings[name] = summary.bindings.get(name, "") + text
            summary.binders.append(Binder(_targets(node), names_in([node.value])))
        else:
            summary.opaque[ast.dump(node, include_attributes=False)] += 1
            summary.binders.append(Binder(_targets(node), names_in([node])))
    return summary


def _add_function(
    summary: ModuleSummary, node: ast.AST, qualname: str, lazy_annotations: bool
) -> Set[str]:
    """Record a def; return what its header reads when it runs (its annotations are not
    read under `from __future__ import annotations`)."""
    assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    decorators = list(node.decorator_list)
    header_parts = [*decorators, node.args, *([node.returns] if node.returns else [])]
    evaluated: List[ast.AST] = [*decorators, *node.args.defaults]
    evaluated += [d for d in node.args.kw_defaults if d is not None]
    if not lazy_annotations:
        evaluated += [a.annotation for a in _all_args(node.args) if a.annotation is not None]
        evaluated += [node.returns] if node.returns else []
    registries = {r for r in map(_registry_of, decorators) if r is not None}
    impure = [
        ast.unparse(d)
        for d in decorators
        if _registry_of(d) is None
        and _last_name(d) not in PURE_DECORATORS | SOURCE_COMPILED_DECORATORS
    ]
    summary.functions[qualname] = Function(
        header=f"{type(node).__name__}\n{_dump(header_parts)}",
        body=_dump(node.body),
        reads=names_in(node.body),
        registries=registries,
        impure=impure,
        compiled_from_source=any(_last_name(d) in SOURCE_COMPILED_DECORATORS for d in decorators),
    )
    return names_in(evaluated)


def _all_args(args: ast.arguments) -> List[ast.arg]:
    extra = [a for a in (args.vararg, args.kwarg) if a is not None]
    return [*args.posonlyargs, *args.args, *args.kwonlyargs, *extra]


def _add_class(
    summary: ModuleSummary, node: ast.ClassDef, qualname: str, lazy_annotations: bool
) -> Set[str]:
    """Record a class, its methods and nested classes; return what its definition reads."""
    header_parts = [*node.decorator_list, *node.bases, *node.keywords]
    reads = names_in(header_parts)
    members: Dict[str, str] = {}
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            reads |= _add_function(summary, item, f"{qualname}.{item.name}", lazy_annotations)
            members[item.name] = summary.functions[f"{qualname}.{item.name}"].header
        elif isinstance(item, ast.ClassDef):
            reads |= _add_class(summary, item, f"{qualname}.{item.name}", lazy_annotations)
            inner = summary.classes[f"{qualname}.{item.name}"]
            members[item.name] = inner.header + repr(sorted(inner.members.items()))
        elif not is_docstring(item):
            text = ast.dump(item, include_attributes=False)
            for name in _targets(item) or {text}:
                members[name] = members.get(name, "") + text
            reads |= names_in([item])
    summary.classes[qualname] = ClassInfo(_dump(header_parts), members)
    return reads


@dataclass
class FileChange:
    opaque: List[str] = field(default_factory=list)  # why the module counts as opaque
    bodies: Set[str] = field(default_factory=set)  # qualnames whose body changed
    names: Set[str] = field(default_factory=set)  # names that mean something else now
    owners: Dict[str, Set[str]] = field(default_factory=dict)  # ".member" -> its classes
    sources: List[str] = field(default_factory=list)  # changed files its functions read


def diff(old: Optional[ModuleSummary], new: Optional[ModuleSummary]) -> FileChange:
    """How module `old` became `new` (either may be None: a file added or removed)."""
    change = FileChange()
    if new is None:  # removed: every function it had and every name it bound
        assert old is not None
        change.bodies = set(old.functions)
        change.names = old.bound_names()
        change.opaque = [f"it ran {t[:80]} at import" for t in old.opaque]
        return change
    a = old or ModuleSummary()
    for qualname in sorted(set(a.functions) | set(new.functions)):
        fa, fb = a.functions.get(qualname), new.functions.get(qualname)
        if fa is not None and fb is not None and fa.header == fb.header:
            if fa.body != fb.body:
                change.bodies.add(qualname)
                if fa.compiled_from_source or fb.compiled_from_source:
                    change.opaque.append(f"{qualname} is compiled from its source and changed")
            continue
        *owner, name = qualname.split(".")
        if owner and ".".join(owner) not in a.classes:
            pass  # a method of a new class: no object of that class existed before
        elif owner:  # a method: one added can override one its class inherits
            # a dunder acts through the class (construction, operators); `super().__init__`
            # in a subclass is reached through the subclass, whose name changes with it
            if _is_dunder(name):
                change.names.add(owner[-1])
            else:
                _add_member(change, owner[-1], name)
        elif fa is not None or name in BUILTIN_NAMES:
            change.names.add(name)
        for f in (fa, fb):
            if f is not None:
                change.names |= f.registries
                change.opaque += [f"{qualname}'s decorator {d} runs at import" for d in f.impure]
    for qualname in sorted(set(a.classes) | set(new.classes)):
        ca, cb = a.classes.get(qualname), new.classes.get(qualname)
        name = qualname.split(".")[-1]
        if ca is None or cb is None:  # a new class is reached only through a changed name
            if cb is None or name in BUILTIN_NAMES:
                change.names.add(name)
            continue
        if ca.header != cb.header:
            change.names.add(name)
        for member in set(ca.members) | set(cb.members):
            ma, mb = ca.members.get(member), cb.members.get(member)
            if ma == mb:
                continue
            is_method = (ma or mb or "").startswith(("FunctionDef", "AsyncFunctionDef"))
            # an abstract method decides whether the class's subclasses can be made at all
            abstract = "abstractmethod" in (ma or "") + (mb or "")
            if not _is_dunder(member):
                _add_member(change, name, member)
            if _is_dunder(member) or not is_method or abstract:  # they act through the class
                change.names.add(name)
    for name in set(a.bindings) | set(new.bindings):
        was, now = a.bindings.get(name), new.bindings.get(name)
        if was != now and (was is not None or name in BUILTIN_NAMES):
            change.names.add(name)
    for text in set(a.opaque) | set(new.opaque):
        if a.opaque[text] != new.opaque[text]:
            change.opaque.append(f"a statement run at import changed: {text[:100]}")
    return change


def _add_member(change: FileChange, owner: str, member: str) -> None:
    change.names.add("." + member)
    change.owners.setdefault("." + member, set()).add(owner)


class _Readers:
    """The binders of a tree by each name that meets them: "x" meets a binder that reads x
    or .x; ".x" one that reads .x (as `reaches` says)."""

    def __init__(self, binders: Iterable[Binder]) -> None:
        self.by_name: Dict[str, List[Binder]] = {}
        for binder in binders:
            for read in binder.reads:
                self.by_name.setdefault(read, []).append(binder)
                if read.startswith("."):
                    self.by_name.setdefault(read[1:], []).append(binder)

    def close(self, names: Set[str]) -> Set[str]:
        """The changed names, closed over what runs at import: a statement that reads a
        changed name binds changed names (a subclass of a changed class, a re-export)."""
        result = set(names)
        todo = list(result)
        while todo:
            for binder in self.by_name.get(todo.pop(), ()):
                for bound in binder.binds - result:
                    result.add(bound)
                    todo.append(bound)
        return result


@dataclass
class TreeChange:
    """Everything that changed between two trees' packages."""

    files: Dict[str, FileChange]  # changed package file -> what changed in it
    names: Set[str]  # every name that means something else, spread over the new tree
    # ".member" -> the classes it changed in, and what is built from them at import (their
    # subclasses, re-exports): the member counts only for code that meets one of them
    owners: Dict[str, Set[str]] = field(default_factory=dict)

    def opaque_files(self) -> Dict[str, List[str]]:
        return {f: c.opaque for f, c in self.files.items() if c.opaque}

    def reasons(
        self, executed: Iterable[Tuple[str, str]], reads: Set[str], files: Set[str]
    ) -> List[str]:
        """Why a test might now behave differently (empty: it cannot). It ran the functions
        `executed` ((file, qualname) pairs), its code mentions `reads`, and its processes can
        import `files`."""
        executed = list(executed)
        why: List[str] = []
        for file, qualname in sorted(executed):
            change = self.files.get(file)
            if change is not None and qualname in change.bodies:
                why.append(f"{qualname} ({file}) changed")
        for file in sorted({file for file, _ in executed}):
            change = self.files.get(file)
            if change is not None and change.sources:
                why.append(f"{file}, whose code ran, reads {', '.join(change.sources)}: changed")
        for file, opaque in sorted(self.opaque_files().items()):
            if file in files:
                why.append(f"{file}: {opaque[0]}")
        classes_ran = {c for _, qualname in executed for c in qualname.split(".")[:-1]}
        shared = sorted(
            n
            for n in reaches(self.names, reads)
            if n not in self.owners
            or reaches(self.owners[n], reads)
            or self.owners[n] & classes_ran
        )
        if shared:
            why.append(f"it reads names that mean something else now: {', '.join(shared[:6])}")
        return why


# A check compares hundreds of pairs of trees whose files take a few versions each: a file's
# summary is made once per version (and per set of the package's named tuples), then shared.
# Nothing changes a summary after it is made.
PackageTuples = Tuple[Tuple[str, FrozenSet[str]], ...]  # sorted (dotted module, its tuples)


@functools.lru_cache(maxsize=None)
def _named_tuples(source: str) -> FrozenSet[str]:
    return frozenset(named_tuples(source))


@functools.lru_cache(maxsize=None)
def shared_summary(source: str, path: str, tuples: PackageTuples = ()) -> ModuleSummary:
    """`summarise`, made once per version of a file and shared: do not change it."""
    return summarise(source, path, {module: set(names) for module, names in tuples})


def _package_tuples(sources: Dict[str, str]) -> PackageTuples:
    """Dotted module -> its named tuples, for every module of a package {path: source}."""
    found = []
    for path, source in sources.items():
        name = module_name(path)
        if name is not None and path.endswith(".py") and (tuples := _named_tuples(source)):
            found.append((name, tuples))
    return tuple(sorted(found))


def tree_change(old: Dict[str, str], new: Dict[str, str]) -> TreeChange:
    """Compare two packages given as {relative path: source}. A non-Python file that differs
    is read by the modules of the nearest folder above it that has modules (kernel sources are
    read at run time): by their functions, or at import by one that does more than define."""
    files: Dict[str, FileChange] = {}
    old_tuples, new_tuples = _package_tuples(old), _package_tuples(new)
    summaries = {p: shared_summary(s, p, new_tuples) for p, s in new.items() if p.endswith(".py")}
    for path in sorted(set(old) | set(new)):
        if old.get(path) == new.get(path):
            continue
        if not path.endswith(".py"):
            # the modules of the nearest folder above it that has any (a kernel source in
            # kernel/csrc/jit/ is read by the modules of kernel/)
            folder = path
            readers: List[str] = []
            while "/" in folder and not readers:
                folder = folder.rsplit("/", 1)[0]
                readers = [m for m in summaries if m.startswith(folder + "/")]
            for module in readers:
                reader = files.setdefault(module, FileChange())
                if summaries[module].opaque:
                    reader.opaque.append(f"{path} changed")
                else:
                    reader.sources.append(path)
            continue
        before = shared_summary(old[path], path, old_tuples) if path in old else None
        change = diff(before, summaries.get(path))
        if change.opaque or change.bodies or change.names:
            merged = files.setdefault(path, FileChange())
            merged.opaque += change.opaque
            merged.bodies |= change.bodies
            merged.names |= change.names
            for member, classes in change.owners.items():
                merged.owners.setdefault(member, set()).update(classes)
    owners: Dict[str, Set[str]] = {}
    for change in files.values():
        for member, classes in change.owners.items():
            owners.setdefault(member, set()).update(classes)
    binders = [b for s in summaries.values() for b in s.binders]
    names = {n for change in files.values() for n in change.names}
    # a member read at import (`ALIAS = Cls.member`) changes what that binds, whatever it met
    members = set(owners)
    names |= {n for b in binders if meets(members, b.reads) for n in b.binds}
    readers = _Readers(binders)
    names = readers.close(names)
    closed = {m: readers.close(classes) for m, classes in owners.items()}
    return TreeChange(files, names, closed)
