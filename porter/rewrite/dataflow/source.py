"""The source side: statements and blocks of the remote code (ast), liveness of variables, and
the module attributes (head size, head counts, scale) that express recorded numbers symbolically.
"""

from __future__ import annotations

import ast
from typing import Any

from hfcheck.porter.rewrite.dataflow.proof import close

HEAD_ATTRS = ("head_dim", "head_size", "hidden_size_per_head", "attention_head_size", "hidden_size_per_attention_head", "kv_channels",
              "attn_head_size", "dim_head")


def block_of(body: list[ast.stmt], line: int) -> tuple[list[ast.stmt], int] | None:
    """(innermost statement list holding ``line``, index of the statement there)."""
    for i, s in enumerate(body):
        if not (s.lineno <= line <= (s.end_lineno or s.lineno)):
            continue
        for attr in ("body", "orelse", "finalbody"):
            inner = getattr(s, attr, None)
            if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                found = block_of(inner, line)
                if found is not None:
                    return found
        for handler in getattr(s, "handlers", []) or []:
            found = block_of(handler.body, line)
            if found is not None:
                return found
        return body, i
    return None


def stmt_span(s: ast.stmt) -> tuple[int, int]:
    first = min([s.lineno] + [d.lineno for d in getattr(s, "decorator_list", [])])
    return first, s.end_lineno or s.lineno


def _names(nodes: list[ast.stmt], ctx: type) -> set[str]:
    return {n.id for s in nodes for n in ast.walk(s) if isinstance(n, ast.Name) and isinstance(n.ctx, ctx)}


def read_names(nodes: list[ast.stmt]) -> set[str]:
    return _names(nodes, ast.Load)


def live_after(name: str, stmts: list[ast.stmt]) -> bool:
    """Whether ``name`` is read in ``stmts`` (in order) before a plain assignment replaces it."""
    for s in stmts:
        if name in read_names([s]):
            return True
        if isinstance(s, (ast.Assign, ast.AnnAssign)) and name in bound_names([s]):
            return False
    return False


def bound_names(nodes: list[ast.stmt]) -> set[str]:
    return _names(nodes, ast.Store)


def method_of(tree: ast.Module, cls: str, name: str) -> ast.FunctionDef | None:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    return item
    return None


def head_size_attr(head_dim: int, scalars: dict[str, Any]) -> str | None:
    for name in HEAD_ATTRS:
        if scalars.get(name) == head_dim:
            return f"self.{name}"
    for name, value in scalars.items():
        if isinstance(value, int) and not isinstance(value, bool) and value == head_dim and "head" in name:
            return f"self.{name}"
    return None


def to_bhsd_source(name: str, layout: str, head_dim: int, scalars: dict[str, Any], refuse, line: int) -> str:
    if layout == "bhsd":
        return name
    if layout == "bshd":
        return f"{name}.transpose(1, 2)"
    if layout == "sbhd":
        return f"{name}.permute(1, 2, 0, 3)"
    attr = head_size_attr(head_dim, scalars)
    if attr is None:
        raise refuse(line, f"`{name}` holds all heads in one dimension and the module keeps no head size attribute to split it by")
    if layout == "sbD":
        return f"{name}.view(*{name}.shape[:-1], -1, {attr}).permute(1, 2, 0, 3)"
    return f"{name}.view(*{name}.shape[:-1], -1, {attr}).transpose(1, 2)"


def scaling_source(scale: float, head_dim: int, scalars: dict[str, Any]) -> tuple[str | None, str | None]:
    """(scaling= source, or None for the default 1/sqrt(head_dim); expression for __init__)."""
    if close(scale, head_dim**-0.5):
        attr = head_size_attr(head_dim, scalars)
        return (None, f"{attr}**-0.5") if attr else (None, None)
    if close(scale, 1.0):
        return "1.0", None
    for name, value in scalars.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            continue
        if close(float(value), scale):
            return f"self.{name}", None
        if close(float(value) ** -0.5, scale):
            return None, f"self.{name}**-0.5"
        if close(1.0 / float(value), scale):
            return None, f"1 / self.{name}"
    return None, None


def attr_like(scalars: dict[str, Any], value: int, want: tuple[str, ...], avoid: tuple[str, ...]) -> str | None:
    """``self.<attr>`` of an int attribute equal to ``value`` whose name has one of ``want``
    and none of ``avoid`` (a head count, a key/value group count)."""
    for name, v in scalars.items():
        low = name.lower()
        if isinstance(v, int) and not isinstance(v, bool) and v == value and any(w in low for w in want) and not any(a in low for a in avoid):
            return f"self.{name}"
    return None


def attr_of(scalars: dict[str, Any], value: int, preferred: tuple[str, ...]) -> str | None:
    for name in preferred:
        if scalars.get(name) == value and not isinstance(scalars.get(name), bool):
            return f"self.{name}"
    return None
