"""Annotation spellings: rewrite the spellings that mean the same type into one
(``Optional[List[int]]`` -> ``list[int] | None``), and strip module qualifiers."""

from __future__ import annotations

import ast

_TYPING_BUILTINS = {
    "List": "list",
    "Dict": "dict",
    "Tuple": "tuple",
    "Set": "set",
    "FrozenSet": "frozenset",
    "Type": "type",
}
_TYPING_MODULES = {"typing", "typing_extensions", "t"}


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


def unqualified(text: str) -> str:
    """``torch.nn.Module`` -> ``Module`` (for comparing class bases by default)."""
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        return text
    return ast.unparse(_StripQualifiers().visit(tree))
