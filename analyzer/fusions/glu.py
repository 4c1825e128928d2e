"""``act(gate(x)) * up(x)`` -> ``gate_up_proj`` (MergedColumnParallelLinear) + an act-and-mul kernel.

The activation must be a child *module* whose class maps (through transformers'
``ACT2CLS``) to an activation vLLM has a fused ``...AndMul`` kernel for.
"""

from __future__ import annotations

import ast
import operator
from typing import cast

from torch import fx, nn

from hfcheck.analyzer.fusions.base import FusionContext, GraphPattern, Match
from hfcheck.analyzer.fusions.merged_column import MergedColumn
from hfcheck.analyzer.graph import forward_source as src
from hfcheck.analyzer.graph.nodes import find, is_linear, peel
from hfcheck.analyzer.terms.vocabulary import ACT_AND_MUL_KERNELS


def act_and_mul_name(act: nn.Module) -> str | None:
    """The fused-kernel name for ``act``'s class, as vLLM looks it up, or None."""
    from transformers.activations import ACT2CLS

    for name, cls in ACT2CLS.items():
        cls = cls[0] if isinstance(cls, tuple) else cls
        if cls is type(act) and name in ACT_AND_MUL_KERNELS:
            return name
    return None


def _act_of_gate(node: object, module: nn.Module) -> bool:
    return (
        isinstance(node, fx.Node)
        and node.op == "call_module"
        and not is_linear(node, module)
        and len(node.args) == 1
        and is_linear(node.args[0], module)
    )


def merge_glu(funcdef: ast.FunctionDef, gate: str, up: str, act: str, merged: str) -> None:
    """``act(gate(x)) * up(x)`` -> ``act(<merged>(x))`` (the activation becomes an act-and-mul)."""
    act_call = src.single_call(funcdef, act, guards_allowed=False)
    gate_call, up_call = src.single_call(funcdef, gate), src.single_call(funcdef, up)
    if act_call.args[0] is not gate_call:
        raise src.RewriteRefused("the activation does not directly wrap the gate projection")
    if not src.same_input([gate_call, up_call]):
        raise src.RewriteRefused("gate and up read inputs written differently")
    muls = [
        n
        for n in ast.walk(funcdef)
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult) and {id(n.left), id(n.right)} == {id(act_call), id(up_call)}
    ]
    if len(muls) != 1:
        raise src.RewriteRefused("no single `act(gate(x)) * up(x)` multiply in the source")
    cast(ast.Attribute, gate_call.func).attr = merged  # single_call finds `self.<gate>(...)`
    src.replace_node(funcdef, muls[0], act_call)


class GLU(GraphPattern):
    name = "glu"

    @classmethod
    def match_graph(cls, graph: fx.Graph, module: nn.Module) -> Match | None:
        for mul in graph.nodes:
            if not (mul.op == "call_function" and mul.target is operator.mul and len(mul.args) == 2):
                continue
            a, b = mul.args
            if _act_of_gate(a, module) and is_linear(b, module):
                act, up = a, b
            elif _act_of_gate(b, module) and is_linear(a, module):
                act, up = b, a
            else:
                continue
            gate = act.args[0]
            if len(gate.args) == 1 and len(up.args) == 1 and isinstance(gate.args[0], fx.Node) and gate.args[0] is up.args[0]:
                down = find(graph, lambda n: is_linear(n, module) and peel(n.args[0]) is mul)
                return Match(
                    cls.name,
                    (str(gate.target), str(up.target)),
                    str(down.target) if down is not None else None,
                    {"act": str(act.target)},
                )
        return None

    rewrites_source = True

    @classmethod
    def merged_name(cls, match: Match) -> str:
        return "gate_up_proj"

    @classmethod
    def rewrite(cls, funcdef: ast.FunctionDef, match: Match, module: nn.Module) -> None:
        """``act(gate(x)) * up(x)`` -> ``act(gate_up_proj(x))``."""
        gate, up = match.projections
        merge_glu(funcdef, gate, up, match.details["act"], cls.merged_name(match))

    @classmethod
    def validate(cls, match: Match, module: nn.Module, ctx: FusionContext) -> str | None:
        if reason := MergedColumn.validate(match, module, ctx):
            return reason
        gate, up = (module.get_submodule(n) for n in match.projections)
        if gate.out_features != up.out_features:
            return f"gate and up differ in size ({gate.out_features} vs {up.out_features})"
        act = module.get_submodule(match.details["act"])
        if act_and_mul_name(act) is None:
            return f"no fused act-and-mul kernel for the activation {type(act).__name__}"
        return None
