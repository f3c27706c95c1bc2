"""Reading an API with `ast`: the public classes, functions, methods, fields and ``__all__``
names of one module's source (`module_api`), as `ApiItem` rows."""

from __future__ import annotations

import ast
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from tools.upstream.api_normalize import normalize_annotation, unqualified

Level = Literal["names", "shape", "strict"]

POSITIONAL_ONLY = "positional-only"
POSITIONAL = "positional-or-keyword"
VAR_POSITIONAL = "var-positional"
KEYWORD_ONLY = "keyword-only"
VAR_KEYWORD = "var-keyword"


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
        for i, (a, d) in enumerate(zip(positional, defaults, strict=False))
    ]
    if args.vararg:
        params.append(
            Param(args.vararg.arg, VAR_POSITIONAL, None, _unparse(args.vararg.annotation))
        )
    for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=False):
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
    strict = tuple(
        (*s, normalize_annotation(p.annotation)) for s, p in zip(shape, params, strict=False)
    )
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
    shape = tuple(unqualified(normalize_annotation(b) or b) for b in bases)
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
