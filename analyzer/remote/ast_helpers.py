"""The AST helpers every remote-code check family shares (public: ``porter`` and the
analyzer's graph reading use them too). Pure ``ast`` over a ``FileIndex``: nothing imported
or executed.

- ``dispatch_names`` / ``dispatch_calls`` / ``is_interface_lookup``: how a forward binds and
  calls the transformers attention interface, vLLM's test verbatim (``ALL_ATTENTION_FUNCTIONS[...]``
  or ``ALL_ATTENTION_FUNCTIONS.x(...)``); ``analyzer/graph/forward_source.attention_dispatch``
  reads the built class with the same functions;
- ``passes_source_test``: transformers' ``_can_set_attn_implementation`` on a module's source
  text (vLLM's second compatibility gate); ``rules/resolution.source_gate`` applies it to a
  loaded class;
- ``layer_loop_names``: the names a forward's loop over a layer list binds to one layer;
- ``is_self_attr``, ``self_attr_names``, ``is_call_to``, ``calls_to``, ``call_kw``,
  ``accepts_kwargs``, ``has_kwargs_expansion``: small readings of calls and attributes;
- ``location_status`` / ``where_in``: import time (fail) or inside a function (warn), and where.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator
from typing import TypeGuard

from hfcheck.analyzer.remote.index import FileIndex


def is_self_attr(node: ast.AST, attr: str | None = None) -> TypeGuard[ast.Attribute]:
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
        and (attr is None or node.attr == attr)
    )


def is_interface_lookup(node: ast.expr | None) -> bool:
    """vLLM's test, verbatim: ``ALL_ATTENTION_FUNCTIONS[...]`` or ``ALL_ATTENTION_FUNCTIONS.x(...)``."""
    if isinstance(node, ast.Call):
        node = node.func
    return isinstance(node, (ast.Attribute, ast.Subscript)) and isinstance(node.value, ast.Name) and node.value.id == "ALL_ATTENTION_FUNCTIONS"


def dispatch_names(funcdef: ast.AST) -> dict[str, int]:
    """Names bound from the attention interface in ``funcdef`` -> line of the binding."""
    names: dict[str, int] = {}
    for node in ast.walk(funcdef):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and is_interface_lookup(node.value):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name):
                    names.setdefault(t.id, node.lineno)
    return names


def dispatch_calls(funcdef: ast.AST) -> list[ast.Call]:
    names = dispatch_names(funcdef)
    return [n for n in ast.walk(funcdef) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in names]


def has_kwargs_expansion(call: ast.Call) -> bool:
    return any(k.arg is None for k in call.keywords)


def accepts_kwargs(funcdef: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return funcdef.args.kwarg is not None


def calls_to(file: FileIndex, node: ast.AST, predicate: Callable[[str], bool]) -> Iterator[tuple[ast.Call, str]]:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            name = file.call_name(sub)
            if name and predicate(name):
                yield sub, name


def is_call_to(file: FileIndex, value: ast.expr, suffix: str) -> bool:
    if not isinstance(value, ast.Call):
        return False
    name = file.call_name(value) or ""
    return name == suffix or name.endswith("." + suffix)


def self_attr_names(node: ast.AST) -> set[str]:
    return {n.attr for n in ast.walk(node) if is_self_attr(n)}


def layer_loop_names(forward: ast.AST, list_attrs: set[str]) -> set[str]:
    """The names a forward binds to one decoder layer while looping over a layer list
    (``for layer in self.layers[...]``, ``for i, layer in enumerate(self.h)``): the analyzer's
    HFC804 reading and the porter's kwargs codemod find the layer calls from them."""
    names: set[str] = set()
    for node in ast.walk(forward):
        if isinstance(node, (ast.For, ast.AsyncFor)) and list_attrs & self_attr_names(node.iter):
            target = node.target
            if isinstance(target, ast.Name):
                names.add(target.id)
            elif isinstance(target, ast.Tuple) and target.elts and isinstance(target.elts[-1], ast.Name):
                names.add(target.elts[-1].id)
    return names


def location_status(file: FileIndex, node: ast.AST) -> str:
    """Red flags that run on import are failures; inside functions, warnings."""
    return "fail" if file.import_time(node) else "warn"


def where_in(file: FileIndex, node: ast.AST) -> str:
    if file.import_time(node):
        return "at import time"
    func = file.enclosing_function(node)
    cls = file.enclosing_class(node)
    if func is not None and cls is not None:
        return f"in {cls.name}.{func.name}"
    return f"in {func.name}()" if func is not None else ""


def call_kw(call: ast.Call, name: str, position: int | None = None) -> ast.expr | None:
    for k in call.keywords:
        if k.arg == name:
            return k.value
    if position is not None and len(call.args) > position:
        return call.args[position]
    return None


def passes_source_test(text: str) -> bool:
    """transformers' ``_can_set_attn_implementation`` on a module's source text: a module that
    defines ``class *Attention*(nn.Module)`` must contain ``ALL_ATTENTION_FUNCTIONS.get_interface(``."""
    if re.search(r"^class \w*Attention\w*\(nn\.Module\):", text, re.MULTILINE):
        return "ALL_ATTENTION_FUNCTIONS.get_interface(" in text
    return True


# --------------------------------------------------------------------------- attention by hand


_DIRECT_ATTENTION = {
    "scaled_dot_product_attention": "torch's scaled_dot_product_attention",
    "flash_attn_func": "flash_attn",
    "flash_attn_varlen_func": "flash_attn",
    "flash_attn_qkvpacked_func": "flash_attn",
    "flash_attn_kvpacked_func": "flash_attn",
    "flash_attn_varlen_qkvpacked_func": "flash_attn",
    "flash_attn_varlen_kvpacked_func": "flash_attn",
    "flash_attn_with_kvcache": "flash_attn",
    "memory_efficient_attention": "xformers",
    "_flash_attention_forward": "transformers' flash-attention helper",
}


def _transposed(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.func.attr in ("transpose", "permute"):
            return True
        if isinstance(sub, ast.Attribute) and sub.attr == "mT":
            return True
    return False


def _matmuls(file: FileIndex, funcdef: ast.AST) -> list[ast.expr]:
    out: list[ast.expr] = []
    for node in ast.walk(funcdef):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
            out.append(node)
        elif isinstance(node, ast.Call):
            name = file.call_name(node) or ""
            method = node.func.attr if isinstance(node.func, ast.Attribute) else ""
            if name in ("torch.matmul", "torch.bmm", "torch.einsum", "torch.baddbmm") or method in ("matmul", "bmm"):
                out.append(node)
    return out


def _softmaxes(file: FileIndex, funcdef: ast.AST) -> list[ast.Call]:
    out = []
    for node in ast.walk(funcdef):
        if isinstance(node, ast.Call):
            name = file.call_name(node) or ""
            method = node.func.attr if isinstance(node.func, ast.Attribute) else ""
            if name.endswith("softmax") or method == "softmax":
                out.append(node)
    return out


def attention_by_hand(file: FileIndex, funcdef: ast.AST) -> tuple[ast.expr, str] | None:
    """(node, what) when ``funcdef`` computes attention itself: a direct SDPA / flash_attn
    call, or softmax(Q K^T) V written with matmuls."""
    for node in ast.walk(funcdef):
        if isinstance(node, ast.Call):
            name = file.call_name(node) or ""
            short = name.rpartition(".")[2] if name else (node.func.attr if isinstance(node.func, ast.Attribute) else "")
            if short in _DIRECT_ATTENTION:
                return node, f"calls {name or short} directly ({_DIRECT_ATTENTION[short]})"
    mm = _matmuls(file, funcdef)
    soft = _softmaxes(file, funcdef)
    if soft and len(mm) >= 2 and any(_transposed(m) or _einsum(file, m) for m in mm):
        return soft[0], "computes softmax(Q K^T) V by hand"
    return None


def _einsum(file: FileIndex, node: ast.AST) -> bool:
    """``torch.einsum("bthd,bshd->bhts", q, k)``: the equation transposes (MixFormer's attention)."""
    return isinstance(node, ast.Call) and (file.call_name(node) or "") == "torch.einsum"
