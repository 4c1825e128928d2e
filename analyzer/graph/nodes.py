"""Small questions about fx nodes of a module's leaf trace, shared by every pattern."""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Iterator
from typing import TypeGuard

import torch
from torch import fx, nn
from torch.nn import functional as F

from hfcheck.analyzer.graph.tracer import is_opaque_call

_DTYPE_CASTS = frozenset({"to", "float", "double", "half", "bfloat16", "type_as"})


def child(module: nn.Module, node: fx.Node) -> nn.Module:
    return module.get_submodule(str(node.target))


def is_linear(node: object, module: nn.Module) -> TypeGuard[fx.Node]:
    """Is ``node`` a call of an ``nn.Linear`` child (subclasses included, as in vLLM)."""
    return (
        isinstance(node, fx.Node)
        and node.op == "call_module"
        and isinstance(child(module, node), nn.Linear)
    )


def reads_forward_input(node: fx.Node) -> bool:
    """A single-argument call whose argument is a forward parameter itself."""
    return (
        len(node.args) == 1
        and not node.kwargs
        and isinstance(node.args[0], fx.Node)
        and node.args[0].op == "placeholder"
    )


def peel(node: object) -> object:
    """Strip dtype casts (``.to()``, ``.float()``, ``.type_as()``)."""
    while isinstance(node, fx.Node) and node.op == "call_method" and node.target in _DTYPE_CASTS:
        node = node.args[0]
    return node


def linears_share_an_input(graph: fx.Graph, module: nn.Module) -> bool:
    """Do two linear children read the same value (casts peeled)? A gated MLP's gate and up
    projections do; an ``fc1 -> act -> fc2`` MLP's do not, so it has nothing to merge."""
    inputs = [peel(node.args[0]) for node in graph.nodes if is_linear(node, module) and node.args]
    return len(inputs) != len(set(inputs))


def is_fn(node: object, target: object) -> TypeGuard[fx.Node]:
    return isinstance(node, fx.Node) and node.op == "call_function" and node.target is target


def is_method(node: object, name: str) -> TypeGuard[fx.Node]:
    return isinstance(node, fx.Node) and node.op == "call_method" and node.target == name


def is_op(node: object, name: str) -> TypeGuard[fx.Node]:
    """``torch.<name>``, ``F.<name>``, ``operator.<name>`` or the tensor method ``.<name>()``."""
    return any(is_fn(node, getattr(ns, name, None)) for ns in (torch, F, operator)) or (
        hasattr(torch.Tensor, name) and is_method(node, name)
    )


def operand(node: fx.Node, index: int, name: str) -> object:
    """Operand ``index`` of ``node``, passed positionally or as keyword ``name``."""
    return node.args[index] if len(node.args) > index else node.kwargs.get(name)


def find(graph: fx.Graph, predicate: Callable[[fx.Node], bool]) -> fx.Node | None:
    return next((n for n in graph.nodes if predicate(n)), None)


def output_value(graph: fx.Graph) -> object | None:
    out = find(graph, lambda n: n.op == "output")
    return out.args[0] if out is not None and out.args else None


def upstream_linear(node: object, module: nn.Module) -> fx.Node | None:
    """Nearest linear producing ``node``, through reshapes and non-linear children,
    never through an attention call (its inputs are attention's, not the producer)."""
    return next(_nearest_linears(node, module, lambda n: n.args), None)


def downstream_linear(node: fx.Node, module: nn.Module) -> fx.Node | None:
    """Nearest linear consuming ``node``, through casts and scalings (breadth first)."""
    queue, seen = list(node.users), set()
    while queue:
        current = queue.pop(0)
        if current in seen:
            continue
        seen.add(current)
        if is_linear(current, module):
            return current
        if current.op in ("call_function", "call_method") and not is_opaque_call(current):
            queue.extend(current.users)
    return None


def returned_linear(graph: fx.Graph, module: nn.Module) -> str | None:
    """The linear producing the forward's (first) output: the row-parallel consumer."""
    value = output_value(graph)
    if isinstance(value, (tuple, list)) and value:
        value = value[0]
    linear = upstream_linear(value, module)
    return None if linear is None else str(linear.target)


def attention_key_value_linears(graph: fx.Graph, module: nn.Module) -> tuple[str, str] | None:
    """(key linear, value linear) when the one attention call's keys and values each come from
    a linear of their own; None otherwise (no single call, packed or shared projections)."""
    calls = [n for n in graph.nodes if is_opaque_call(n) and len(n.args) >= 3]
    if len(calls) != 1:
        return None
    q, k, v = (_linears_upstream(a, module) for a in calls[0].args[:3])
    if len(k) != 1 or len(v) != 1 or k == v or k & q or v & q:
        return None
    return str(next(iter(k)).target), str(next(iter(v)).target)


def _linears_upstream(node: object, module: nn.Module) -> set[fx.Node]:
    """The nearest linears feeding ``node`` along every input (lists included: a partial
    rotary ``cat``), never through an opaque attention call."""
    return set(_nearest_linears(node, module, lambda n: n.all_input_nodes))


def _nearest_linears(node: object, module: nn.Module, inputs: Callable[[fx.Node], Iterable[object]]) -> Iterator[fx.Node]:
    """The linears met walking up from ``node`` (depth first, ``inputs`` giving each node's), each
    ending its path: the walk never passes through a linear or an opaque attention call."""
    stack: list[object] = [node]
    seen: set[fx.Node] = set()
    while stack:
        current = stack.pop()
        if not isinstance(current, fx.Node) or current in seen:
            continue
        seen.add(current)
        if is_linear(current, module):
            yield current
        elif current.op in ("call_function", "call_method", "call_module") and not is_opaque_call(current):
            stack.extend(inputs(current))


def reaches(node: fx.Node, direction: str) -> set[fx.Node]:
    """Every node reachable from ``node`` along ``all_input_nodes`` or ``users``."""
    seen: set[fx.Node] = set()
    stack = [node]
    while stack:
        current = stack.pop()
        for nxt in getattr(current, direction):
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return seen
