"""What the forward's *source* says, where tracing cannot see, and vLLM's rewrite of it.

This module is the one home of vLLM's forward rewrite (``fx_utils.recover_forward``,
``self_call_and_refs``, ``bypass_existence_guard``, ``block_chain``, ``written_names`` /
``aliasing_names`` and each fuser's ``update_forward``). The analyzer runs the rewrite on a
fresh parse to decide whether a fusion happens (``Pattern.check_rewrite``); ``verify``
runs the same rewrite and compiles it to prove the fused numbers (``fused_forward``). One
code path, so the two cannot disagree about what vLLM refuses.

vLLM applies a fusion by rewriting the forward with ``ast``: one ``self.<proj>(x)`` call
per projection, other references only as existence guards, inputs written the same way,
no closure, no name-mangled attributes, nothing between the calls that rebinds or
mutates the input. If the rewrite is refused the fusion silently does not happen, so
hfcheck runs the same rewrite here and reports the reason. The attention dispatch
(``ALL_ATTENTION_FUNCTIONS``) and its ``scaling=`` / ``s_aux=`` arguments are also read
here, from source only.
"""

from __future__ import annotations

import ast
import copy
import inspect
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import TypeGuard

from torch import nn

from hfcheck.analyzer.remote.ast_helpers import dispatch_calls, dispatch_names

MERGED_TEMPORARY = "_vllm_merged_{}"
"""The names vLLM binds the parts of a merged projection to (``_splice_merged_split``)."""


class RewriteRefused(ValueError):
    """The forward's source does not admit the rewrite vLLM would make (vLLM skips the fusion)."""


@cache
def _parsed(fn) -> ast.FunctionDef:
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    funcdef = tree.body[0]
    if not isinstance(funcdef, ast.FunctionDef):
        raise RewriteRefused("forward source is not a plain function definition")
    return funcdef


def recover_forward(cls: type[nn.Module]) -> tuple[ast.FunctionDef, Callable]:
    """A fresh parse of ``cls.forward`` ready to rewrite, and the function it came from
    (vLLM's ``recover_forward``): refused for a closure, a forward without source and a
    name-mangled attribute (recompiled outside the class body it would change meaning);
    decorators and annotations dropped (the function is already unwrapped, annotations may
    not evaluate outside their module)."""
    fn = inspect.unwrap(cls.forward)
    if getattr(fn, "__code__", None) is None:
        raise RewriteRefused("forward has no Python source")
    if fn.__code__.co_freevars:
        raise RewriteRefused("forward is a closure")
    try:
        funcdef = copy.deepcopy(_parsed(fn))
    except (OSError, TypeError, SyntaxError) as exc:
        raise RewriteRefused(f"forward source unavailable ({type(exc).__name__})") from None
    funcdef.decorator_list = []
    funcdef.returns = None
    args = funcdef.args
    for arg in (*args.posonlyargs, *args.args, *args.kwonlyargs, *(a for a in (args.vararg, args.kwarg) if a)):
        arg.annotation = None
    for node in ast.walk(funcdef):
        name = getattr(node, "attr", None) or getattr(node, "id", None)
        if isinstance(name, str) and name.startswith("__") and not name.endswith("__"):
            raise RewriteRefused(f"{name} would be name-mangled")
    return funcdef, fn


def forward_def(cls: type[nn.Module]) -> ast.FunctionDef:
    """A fresh parse of ``cls.forward`` (callers may rewrite it), refused where vLLM refuses."""
    return recover_forward(cls)[0]


def compile_forward(funcdef: ast.FunctionDef, fn: Callable) -> Callable:
    """Compile a rewritten ``funcdef`` in ``fn``'s module, its lines where ``fn``'s were."""
    module = ast.Module(body=[funcdef], type_ignores=[])
    ast.fix_missing_locations(module)
    ast.increment_lineno(module, fn.__code__.co_firstlineno - 1)
    namespace: dict = {}
    exec(compile(module, fn.__code__.co_filename, "exec"), fn.__globals__, namespace)
    return namespace[funcdef.name]


def _self_attr(node: ast.AST, name: str) -> TypeGuard[ast.Attribute]:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == name
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    )


def _parents(funcdef: ast.FunctionDef) -> dict[int, ast.AST]:
    return {id(c): p for p in ast.walk(funcdef) for c in ast.iter_child_nodes(p)}


def _is_guard(ref: ast.Attribute, parents: dict[int, ast.AST]) -> bool:
    """``self.x is (not) None`` or a bare truth test: folded away by the rewrite."""
    parent = parents.get(id(ref))
    if isinstance(parent, ast.Compare) and len(parent.ops) == 1:
        other = parent.comparators[0] if parent.left is ref else parent.left
        if isinstance(parent.ops[0], (ast.Is, ast.IsNot)) and isinstance(other, ast.Constant) and other.value is None:
            return True
    if isinstance(parent, (ast.If, ast.IfExp, ast.While, ast.Assert)) and parent.test is ref:
        return True
    return isinstance(parent, ast.UnaryOp) and isinstance(parent.op, ast.Not)


def replace_node(tree: ast.AST, old: ast.AST, new: ast.AST) -> None:
    """Put ``new`` where ``old`` (by identity) is in ``tree`` (vLLM's ``replace_expr``)."""

    class _Swap(ast.NodeTransformer):
        def visit(self, node: ast.AST) -> ast.AST:
            return new if node is old else self.generic_visit(node)

    _Swap().visit(tree)


def _fold_guard(funcdef: ast.FunctionDef, ref: ast.Attribute, parents: dict[int, ast.AST]) -> None:
    """Fold an existence guard to the constant it has once the fusion exists, as vLLM's
    rewrite does (``self.x is not None`` -> True, ``self.x is None`` -> False, ``if self.x`` -> True)."""
    parent = parents.get(id(ref))
    if isinstance(parent, ast.Compare) and len(parent.ops) == 1 and isinstance(parent.ops[0], (ast.Is, ast.IsNot)):
        replace_node(funcdef, parent, ast.copy_location(ast.Constant(isinstance(parent.ops[0], ast.IsNot)), parent))
    else:
        replace_node(funcdef, ref, ast.copy_location(ast.Constant(True), ref))


def single_call(funcdef: ast.FunctionDef, name: str, *, guards_allowed: bool = True) -> ast.Call:
    """The one ``self.<name>(arg)`` call; other references must be existence guards,
    which are folded to their constant value in ``funcdef``."""
    uses = [n for n in ast.walk(funcdef) if _self_attr(n, name)]
    calls = [
        n
        for n in ast.walk(funcdef)
        if isinstance(n, ast.Call)
        and any(n.func is u for u in uses)
        and len(n.args) == 1
        and not isinstance(n.args[0], ast.Starred)
        and not n.keywords
    ]
    if len(calls) != 1:
        raise RewriteRefused(f"self.{name} is not called exactly once as self.{name}(x)")
    parents = _parents(funcdef)
    for ref in uses:
        if ref is calls[0].func:
            continue
        if not guards_allowed or not _is_guard(ref, parents):
            raise RewriteRefused(f"the forward reads self.{name} outside its call")
        _fold_guard(funcdef, ref, parents)
        parents = _parents(funcdef)
    return calls[0]


def same_input(calls: list[ast.Call]) -> bool:
    return len({ast.dump(c.args[0]) for c in calls}) == 1


def statement_path(block: list[ast.stmt], node: ast.AST) -> list[tuple[list[ast.stmt], int]]:
    """(statement list, index) pairs from ``block`` down to the statement holding ``node``
    (vLLM's ``block_chain``: bodies, else branches, handlers, finally, match cases)."""
    for index, stmt in enumerate(block):
        if not any(c is node for c in ast.walk(stmt)):
            continue
        inner = [getattr(stmt, f, None) for f in ("body", "orelse", "finalbody")]
        inner += [h.body for h in getattr(stmt, "handlers", [])]
        inner += [c.body for c in getattr(stmt, "cases", [])]
        for sub in inner:
            if isinstance(sub, list) and sub and (tail := statement_path(sub, node)):
                return [(block, index), *tail]
        return [(block, index)]
    return []


def common_block(funcdef: ast.FunctionDef, calls: list[ast.Call]) -> tuple[list[ast.stmt], list[int]]:
    """The innermost statement list containing every call, and each call's index there."""
    paths = [statement_path(funcdef.body, c) for c in calls]
    if any(not p for p in paths):
        raise RewriteRefused("projection calls not found in the forward body")
    depth = 0
    for level in zip(*paths):
        if len({id(b) for b, _ in level}) != 1:
            break
        depth += 1
    return paths[0][depth - 1][0], [p[depth - 1][1] for p in paths]


def same_block(funcdef: ast.FunctionDef, calls: list[ast.Call]) -> tuple[list[ast.stmt], list[int]]:
    """The one statement list every call sits directly in (merged column), and their indices."""
    paths = [statement_path(funcdef.body, c) for c in calls]
    if any(not p for p in paths):
        raise RewriteRefused("projection calls not found in the forward body")
    if len({id(p[-1][0]) for p in paths}) != 1:
        raise RewriteRefused("the parallel linear calls are in different blocks")
    return paths[0][-1][0], [p[-1][1] for p in paths]


def top_level(funcdef: ast.FunctionDef, calls: list[ast.Call]) -> tuple[list[ast.stmt], list[int]]:
    """The forward's body and the index of the top-level statement holding each call (MLA:
    ``q_a_proj`` usually sits in the ``else`` of ``if self.q_lora_rank is None``)."""
    indices = []
    for call in calls:
        index = next((i for i, stmt in enumerate(funcdef.body) if any(c is call for c in ast.walk(stmt))), None)
        if index is None:
            raise RewriteRefused("projection calls not found in the forward body")
        indices.append(index)
    return funcdef.body, indices


def _base_name(node: ast.expr) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _inplace_target(node: ast.AST) -> str | None:
    """The name written through (``x[i] = ``, ``x.a = ``) or mutated (``x.mul_()``)."""
    if isinstance(node, (ast.Attribute, ast.Subscript)) and isinstance(node.ctx, (ast.Store, ast.Del)):
        return _base_name(node)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and _inplace_name(node.func.attr):
        return _base_name(node.func.value)
    return None


def _inplace_name(name: str) -> bool:
    return name.endswith("_") and not name.endswith("__")


def _arg_names(call: ast.Call) -> set[str]:
    reads = [*call.args, *(k.value for k in call.keywords)]
    return {n.id for a in reads for n in ast.walk(a) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _writes_through_args(call: ast.Call) -> bool:
    """``out=``, ``inplace=True`` or a trailing-underscore function (``torch.relu_(x)``)."""
    for k in call.keywords:
        if k.arg == "out":
            return True
        if k.arg == "inplace" and not (isinstance(k.value, ast.Constant) and k.value.value is False):
            return True
    name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
    return _inplace_name(name)


def _written(region: list[ast.stmt]) -> set[str]:
    """Names ``region`` may rebind, write through, or mutate (over-approximated: a miss
    would mean wrong numbers, a false hit only a lost fusion)."""
    names: set[str] = set()
    for stmt in region:
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            names |= _arg_names(stmt.value)  # a discarded call is there for a side effect
        for node in ast.walk(stmt):
            if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
                names.add(node.id)
            elif (base := _inplace_target(node)) is not None:
                names.add(base)
            if isinstance(node, ast.Call) and _writes_through_args(node):
                names |= _arg_names(node)
    return names


_METADATA = frozenset({"shape", "dtype", "device", "ndim", "size", "dim", "numel", "item"})


def _aliasing_reads(node: ast.expr) -> set[str]:
    """Names ``node`` reads in a way that could return a view of them (not metadata)."""
    names: set[str] = set()
    stack: list[ast.AST] = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, ast.Attribute) and current.attr in _METADATA:
            continue
        if isinstance(current, ast.Call) and isinstance(current.func, ast.Attribute) and current.func.attr in _METADATA:
            stack.extend(current.args)
            stack.extend(k.value for k in current.keywords)
            continue
        if isinstance(current, ast.Name) and isinstance(current.ctx, ast.Load):
            names.add(current.id)
        stack.extend(ast.iter_child_nodes(current))
    return names


def _fresh(node: ast.expr, module: nn.Module) -> bool:
    """Does ``node`` allocate new storage (a linear's output, views of it, literals)?"""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.IfExp):
        if isinstance(node.test, ast.Constant):  # a folded existence guard: only one branch runs
            return _fresh(node.body if node.test.value else node.orelse, module)
        return _fresh(node.body, module) and _fresh(node.orelse, module)
    if isinstance(node, (ast.Tuple, ast.List)):
        return all(_fresh(e, module) for e in node.elts)
    while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        func = node.func
        if isinstance(func.value, ast.Name) and func.value.id == "self":
            attribute = getattr(module, func.attr, None)
            if attribute is None or isinstance(attribute, nn.Linear):
                return True
            return bool(node.args) and all(_fresh(a, module) for a in node.args)
        node = func.value
    return False


def _aliases(funcdef: ast.FunctionDef, seed: set[str], module: nn.Module) -> set[str]:
    """``seed`` plus every name that may be a view of one of them, transitively."""
    names = set(seed)
    assigns = [
        (n, n.value) for n in ast.walk(funcdef)
        if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.value is not None and not _fresh(n.value, module)
    ]
    changed = True
    while changed:
        changed = False
        for node, value in assigns:
            if not _aliasing_reads(value) & names:
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            stores = {c.id for t in targets for c in ast.walk(t) if isinstance(c, ast.Name) and isinstance(c.ctx, ast.Store)}
            if stores - names:
                names |= stores
                changed = True
    return names


def check_input_stable(
    funcdef: ast.FunctionDef, module: nn.Module, calls: list[ast.Call], block: list[ast.stmt], indices: list[int]
) -> None:
    """Hoisting the merged GEMM to the first call must not change what it reads: no name
    the input reads (or any possible view of it) is written between the projections."""
    read = {n.id for n in ast.walk(calls[0].args[0]) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    tracked = _aliases(funcdef, read, module)
    if tracked & _written(block[min(indices): max(indices) + 1]):
        raise RewriteRefused("the projection input (or a view of it) is rebound or mutated between the projections")


# --- the edits (each fuser's update_forward) ------------------------------------------


def local_sizes(merged: str) -> ast.expr:
    """``[s // self.<merged>.tp_size for s in self.<merged>.output_sizes]``: per-rank widths."""
    return ast.parse(f"[s // self.{merged}.tp_size for s in self.{merged}.output_sizes]", mode="eval").body


def splice_merged_split(funcdef: ast.FunctionDef, calls: list[ast.Call], block: list[ast.stmt], index: int, merged: str) -> None:
    """Insert ``_vllm_merged_0, ... = self.<merged>(x).split(local sizes, -1)`` at
    ``block[index]`` and put each temporary where its call was; refused when a temporary
    would shadow a name the forward already uses."""
    temps = [MERGED_TEMPORARY.format(i) for i in range(len(calls))]
    if {n.id for n in ast.walk(funcdef) if isinstance(n, ast.Name)} & set(temps):
        raise RewriteRefused("fused temporaries would shadow existing names")
    merged_call = ast.Call(ast.Attribute(ast.Name("self", ast.Load()), merged, ast.Load()), [copy.deepcopy(calls[0].args[0])], [])
    stmt = ast.Assign(
        targets=[ast.Tuple([ast.Name(t, ast.Store()) for t in temps], ast.Store())],
        value=ast.Call(ast.Attribute(merged_call, "split", ast.Load()), [local_sizes(merged), ast.Constant(-1)], []),
    )
    ast.copy_location(stmt, block[index])
    block.insert(index, stmt)
    for call, temp in zip(calls, temps):
        replace_node(funcdef, call, ast.Name(temp, ast.Load()))


def merge_projections(
    funcdef: ast.FunctionDef, module: nn.Module, names: tuple[str, ...], merged: str, placement, what: str, *, exclusive: bool = False
) -> None:
    """``self.a(x) ... self.b(x)`` -> one ``self.<merged>(x).split(...)`` before the first
    call, at the place ``placement`` (``common_block``, ``same_block``, ``top_level``) gives;
    the input must be written the same way and stay unchanged between the calls.
    ``exclusive`` (q/k/v): no other linear child may read the same input."""
    calls = [single_call(funcdef, n) for n in names]
    if not same_input(calls):
        raise RewriteRefused(f"{what} read inputs written differently")
    if exclusive:
        dumps = {ast.dump(c.args[0]) for c in calls}
        others = {n for n, c in module.named_children() if isinstance(c, nn.Linear)} - set(names)
        for node in ast.walk(funcdef):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in others
                and any(ast.dump(a) in dumps for a in node.args)
            ):
                raise RewriteRefused(f"another linear (self.{node.func.attr}) reads the same input")
    block, indices = placement(funcdef, calls)
    check_input_stable(funcdef, module, calls, block, indices)
    splice_merged_split(funcdef, calls, block, min(indices), merged)


# --- attention dispatch -------------------------------------------------------------


@dataclass(frozen=True)
class InterfaceDispatch:
    """How a forward dispatches through the transformers attention interface."""

    calls: int
    """Calls of a name bound from ``ALL_ATTENTION_FUNCTIONS`` (vLLM needs exactly one)."""
    scaling: str | None
    s_aux: str | None
    line: int | None


@cache
def attention_dispatch(forward) -> InterfaceDispatch | None:
    """Read the interface call from source, both idioms (``[impl]`` and ``get_interface``), with
    the readings the remote-code checks use (``analyzer/remote/ast_helpers.py``)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(inspect.unwrap(forward))))
    except (AttributeError, OSError, SyntaxError, TypeError):
        return None
    if not dispatch_names(tree):
        return None
    calls = dispatch_calls(tree)
    if len(calls) != 1:
        return InterfaceDispatch(len(calls), None, None, None)
    call = calls[0]

    def keyword(name: str) -> str | None:
        values = [k.value for k in call.keywords if k.arg == name]
        return ast.unparse(values[0]) if len(values) == 1 else None

    return InterfaceDispatch(1, keyword("scaling"), keyword("s_aux"), call.lineno)


def resolve_expression(expr: str | None, module: nn.Module) -> object:
    """The value of a literal or ``self.<attr>`` expression on ``module`` (else None)."""
    if expr is None:
        return None
    try:
        node = ast.parse(expr, mode="eval").body
    except SyntaxError:
        return None
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return getattr(module, node.attr, None)
    return None
