"""RMSNorm by dataflow: ``x * rsqrt(mean(x**2) + eps) [* w | * (1 + w)]`` or ``torch.rms_norm``.

Matched on leaf modules (no children) with exactly one forward input. A class whose
name ends in ``RMSNorm`` that does not match is left unfused by vLLM with a warning.
"""

from __future__ import annotations

import inspect

from torch import fx, nn

from hfcheck.analyzer.fusions.base import Match, Pattern, class_key, trace_for_patterns
from hfcheck.analyzer.graph.nodes import find, is_op, operand, output_value, peel
from hfcheck.analyzer.graph.tracer import Trace, forward_parameters

_FIXED = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def _input_count(cls: type[nn.Module]) -> int:
    params = list(forward_parameters(cls).values())
    return sum(1 for p in params[1:] if p.kind in _FIXED) if params else 1


def _squared(node: object, x: fx.Node) -> bool:
    node = peel(node)
    if is_op(node, "pow"):
        return peel(operand(node, 0, "input")) is x and operand(node, 1, "exponent") == 2
    if is_op(node, "square"):
        return peel(operand(node, 0, "input")) is x
    if is_op(node, "mul"):
        return peel(operand(node, 0, "input")) is x and peel(operand(node, 1, "other")) is x
    return False


def _inverse_sqrt(node: object) -> bool:
    return is_op(node, "rsqrt") or (is_op(node, "pow") and operand(node, 1, "exponent") == -0.5)


def _is_variance_plus_eps(rsqrt: fx.Node, x: fx.Node) -> bool:
    add = peel(operand(rsqrt, 0, "input"))
    if not is_op(add, "add"):
        return False
    ops = [operand(add, 0, "input"), operand(add, 1, "other")]
    consts = [a for a in ops if isinstance(a, (int, float))]
    nodes = [a for a in ops if isinstance(a, fx.Node)]
    # eps may be a constant or an attribute read (``self.variance_epsilon``) folded to a float
    if len(nodes) == 2:
        return False
    if len(consts) != 1 or len(nodes) != 1:
        return False
    mean = peel(nodes[0])
    return is_op(mean, "mean") and _squared(operand(mean, 0, "input"), x)


def _one_plus(node: object) -> bool:
    node = peel(node)
    return is_op(node, "add") and any(
        isinstance(a, (int, float)) and a == 1 for a in (operand(node, 0, "input"), operand(node, 1, "other"))
    )


def _trailing(graph: fx.Graph, node: fx.Node) -> bool:
    value = output_value(graph)
    return value is not None and peel(value) is not node


class RMSNorm(Pattern):
    name = "rms_norm"
    redefines_forward = False

    @classmethod
    def find(cls, trace: Trace | None, module: nn.Module) -> Match | None:
        if trace is None or trace.graph is None or _input_count(type(module)) != 1:
            return None
        graph = trace.graph
        x = find(graph, lambda n: n.op == "placeholder")
        if x is None:
            return None
        native = find(graph, lambda n: is_op(n, "rms_norm"))
        if native is not None and peel(operand(native, 0, "input")) is x:
            return None if _trailing(graph, native) else Match(cls.name, details={"zero_centered": False})
        rsqrt = find(graph, lambda n: _inverse_sqrt(n) and _is_variance_plus_eps(n, x))
        if rsqrt is None:
            return None
        normalize = find(
            graph, lambda n: is_op(n, "mul") and rsqrt in map(peel, (operand(n, 0, "input"), operand(n, 1, "other")))
        )
        if normalize is None:
            return None
        tail, zero_centered = normalize, False
        for node in graph.nodes:
            if not is_op(node, "mul") or node is normalize:
                continue
            ops = [peel(a) for a in (operand(node, 0, "input"), operand(node, 1, "other")) if isinstance(a, fx.Node)]
            if len(ops) == 2 and normalize in ops:
                weight = next(o for o in ops if o is not normalize)
                tail, zero_centered = node, _one_plus(weight)
                break
        if _trailing(graph, tail):
            return None
        return Match(cls.name, details={"zero_centered": zero_centered})


_NORMS: dict[tuple, bool] = {}


def is_rms_norm(module: nn.Module) -> bool:
    """Whether vLLM's RMSNorm fuser takes this module's class (MLA asks it of the norms
    between its projections); once per class key, as ``detect.class_fusions`` answers it."""
    key = class_key(module)
    if key not in _NORMS:
        _NORMS[key] = RMSNorm.find(trace_for_patterns(module), module) is not None
    return _NORMS[key]


def clear_norm_cache() -> None:
    _NORMS.clear()
