"""Rewrite a module class's forward source the way vLLM's fusers do, and compile it.

The edits (each applied to a fresh parse, never to the analyzer's cached trees):
- ``merge``: ``self.a(x) ... self.b(x)`` -> one ``t0, t1 = self.<merged>(x).split(local_sizes, -1)``
  inserted before the earliest call (in the innermost block holding all of them, or at the
  top level for MLA), each call replaced by its temporary; existence guards on the merged
  names are folded to constants.
- ``glu``: ``act(gate(x)) * up(x)`` -> ``act(gate_up(x))`` (``act`` becomes an act-and-mul).
- ``packed split``: ``self.qkv(x)....split((q, kv, kv))`` -> per-rank sizes.
- ``latent``: the MLA expansion call ``self.<expand>(kv_c, k_pe)`` -> ``(kv_c, k_pe)``.
"""

from __future__ import annotations

import ast
import copy
import inspect
import textwrap
from collections.abc import Callable

from torch import nn


class RewriteError(ValueError):
    """The forward does not admit the rewrite (vLLM would have skipped this fusion)."""


def parse_forward(cls: type[nn.Module]) -> tuple[ast.FunctionDef, Callable]:
    fn = inspect.unwrap(cls.forward)
    code = getattr(fn, "__code__", None)
    if code is None:
        raise RewriteError("forward has no Python source")
    if code.co_freevars:
        raise RewriteError("forward is a closure")
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError) as exc:
        raise RewriteError(f"forward source unavailable ({type(exc).__name__})") from None
    funcdef = tree.body[0]
    if not isinstance(funcdef, ast.FunctionDef):
        raise RewriteError("forward is not a plain function definition")
    funcdef.decorator_list = []
    funcdef.returns = None
    a = funcdef.args
    for arg in (*a.posonlyargs, *a.args, *a.kwonlyargs, *(x for x in (a.vararg, a.kwarg) if x)):
        arg.annotation = None
    return funcdef, fn


def compile_forward(funcdef: ast.FunctionDef, fn: Callable) -> Callable:
    module = ast.Module(body=[funcdef], type_ignores=[])
    ast.fix_missing_locations(module)
    ast.increment_lineno(module, fn.__code__.co_firstlineno - 1)
    namespace: dict = {}
    exec(compile(module, fn.__code__.co_filename, "exec"), fn.__globals__, namespace)
    return namespace[funcdef.name]


def _is_self_attr(node: ast.AST, name: str) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == name and isinstance(node.value, ast.Name) and node.value.id == "self"


def _parents(root: ast.AST) -> dict[int, ast.AST]:
    return {id(child): parent for parent in ast.walk(root) for child in ast.iter_child_nodes(parent)}


def replace_node(root: ast.AST, old: ast.AST, new: ast.AST) -> None:
    class _Swap(ast.NodeTransformer):
        def visit(self, node: ast.AST) -> ast.AST:
            return new if node is old else self.generic_visit(node)

    _Swap().visit(root)


def self_call(funcdef: ast.FunctionDef, name: str, *, fold_guards: bool = True) -> ast.Call:
    """The one ``self.<name>(x)`` call; other references must be existence guards (folded)."""
    refs = [n for n in ast.walk(funcdef) if _is_self_attr(n, name)]
    calls = [
        n
        for n in ast.walk(funcdef)
        if isinstance(n, ast.Call) and any(n.func is r for r in refs) and len(n.args) == 1 and not n.keywords
        and not isinstance(n.args[0], ast.Starred)
    ]
    if len(calls) != 1:
        raise RewriteError(f"self.{name} is not called exactly once as self.{name}(x)")
    call = calls[0]
    for ref in refs:
        if ref is call.func:
            continue
        if not fold_guards:
            raise RewriteError(f"self.{name} is read outside its call")
        _fold_guard(funcdef, ref, name)
    return call


def _fold_guard(funcdef: ast.FunctionDef, ref: ast.Attribute, name: str) -> None:
    parent = _parents(funcdef).get(id(ref))
    if isinstance(parent, ast.Compare) and len(parent.ops) == 1 and isinstance(parent.ops[0], (ast.Is, ast.IsNot)):
        other = parent.comparators[0] if parent.left is ref else parent.left
        if isinstance(other, ast.Constant) and other.value is None:
            replace_node(funcdef, parent, ast.Constant(isinstance(parent.ops[0], ast.IsNot)))
            return
    truth = (
        (isinstance(parent, (ast.If, ast.IfExp, ast.While, ast.Assert)) and parent.test is ref)
        or (isinstance(parent, ast.UnaryOp) and isinstance(parent.op, ast.Not))
    )
    if truth:
        replace_node(funcdef, ref, ast.Constant(True))
        return
    raise RewriteError(f"self.{name} is read outside its call")


def _statement_path(block: list[ast.stmt], node: ast.AST) -> list[tuple[list[ast.stmt], int]]:
    for index, stmt in enumerate(block):
        if not any(c is node for c in ast.walk(stmt)):
            continue
        for field in ("body", "orelse", "finalbody"):
            inner = getattr(stmt, field, None)
            if isinstance(inner, list) and inner and (tail := _statement_path(inner, node)):
                return [(block, index), *tail]
        for handler in getattr(stmt, "handlers", []):
            if tail := _statement_path(handler.body, node):
                return [(block, index), *tail]
        return [(block, index)]
    return []


def _insertion_point(funcdef: ast.FunctionDef, calls: list[ast.Call], top_level: bool) -> tuple[list[ast.stmt], int]:
    paths = [_statement_path(funcdef.body, c) for c in calls]
    if any(not p for p in paths):
        raise RewriteError("projection call not found in the forward body")
    if top_level:
        return funcdef.body, min(p[0][1] for p in paths)
    depth = 0
    for level in zip(*paths):
        if len({id(block) for block, _ in level}) != 1:
            break
        depth += 1
    return paths[0][depth - 1][0], min(p[depth - 1][1] for p in paths)


def local_sizes_expr(merged: str) -> ast.expr:
    return ast.parse(f"[s // self.{merged}.tp_size for s in self.{merged}.output_sizes]", mode="eval").body


def merge(funcdef: ast.FunctionDef, names: tuple[str, ...], merged: str, *, top_level: bool = False) -> None:
    calls = [self_call(funcdef, n) for n in names]
    if len({ast.dump(c.args[0]) for c in calls}) != 1:
        raise RewriteError("the merged projections read inputs written differently")
    temps = [f"_hfc_merged_{i}" for i in range(len(calls))]
    if {n.id for n in ast.walk(funcdef) if isinstance(n, ast.Name)} & set(temps):
        raise RewriteError("fused temporaries would shadow existing names")
    block, index = _insertion_point(funcdef, calls, top_level)
    stmt = ast.Assign(
        targets=[ast.Tuple([ast.Name(t, ast.Store()) for t in temps], ast.Store())],
        value=ast.Call(
            func=ast.Attribute(
                ast.Call(ast.Attribute(ast.Name("self", ast.Load()), merged, ast.Load()), [copy.deepcopy(calls[0].args[0])], []),
                "split",
                ast.Load(),
            ),
            args=[local_sizes_expr(merged), ast.Constant(-1)],
            keywords=[],
        ),
    )
    ast.copy_location(stmt, block[index])
    block.insert(index, stmt)
    for call, temp in zip(calls, temps):
        replace_node(funcdef, call, ast.Name(temp, ast.Load()))


def glu(funcdef: ast.FunctionDef, gate: str, up: str, act: str, merged: str) -> None:
    act_call = self_call(funcdef, act, fold_guards=False)
    gate_call, up_call = self_call(funcdef, gate), self_call(funcdef, up)
    if act_call.args[0] is not gate_call:
        raise RewriteError("the activation does not directly wrap the gate projection")
    if ast.dump(gate_call.args[0]) != ast.dump(up_call.args[0]):
        raise RewriteError("gate and up read inputs written differently")
    muls = [
        n
        for n in ast.walk(funcdef)
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult) and {id(n.left), id(n.right)} == {id(act_call), id(up_call)}
    ]
    if len(muls) != 1:
        raise RewriteError("no single act(gate(x)) * up(x) multiply")
    gate_call.func.attr = merged
    replace_node(funcdef, muls[0], act_call)


def packed_split(funcdef: ast.FunctionDef, name: str) -> None:
    splits = [
        n
        for n in ast.walk(funcdef)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "split" and n.args
        and isinstance(n.args[0], (ast.Tuple, ast.List)) and len(n.args[0].elts) == 3
        and any(_is_self_attr(i, name) for i in ast.walk(n.func.value))
    ]
    if len(splits) != 1:
        raise RewriteError(f"self.{name} has {len(splits)} three-way splits")
    splits[0].args[0] = local_sizes_expr(name)


def latent(funcdef: ast.FunctionDef, module: nn.Module, kv_b: str) -> None:
    def expands(method_name: str) -> bool:
        method = getattr(type(module), method_name, None)
        code = getattr(inspect.unwrap(method), "__code__", None) if method is not None else None
        if code is None or code.co_argcount != 3 or kv_b not in code.co_names:
            return False
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(method)))
        except (OSError, TypeError, SyntaxError):
            return False
        returns = [n for n in ast.walk(tree) if isinstance(n, ast.Return)]
        return bool(returns) and all(isinstance(r.value, ast.Tuple) and len(r.value.elts) == 2 for r in returns)

    calls = [
        n
        for n in ast.walk(funcdef)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name)
        and n.func.value.id == "self" and len(n.args) == 2 and not n.keywords and expands(n.func.attr)
    ]
    if len(calls) != 1:
        raise RewriteError("no single KV expansion method call")
    replace_node(funcdef, calls[0], ast.Tuple(list(calls[0].args), ast.Load()))
