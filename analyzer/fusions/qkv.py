"""``q(x), k(x), v(x)`` -> one QKVParallelLinear ``qkv_proj`` split back into q, k, v."""

from __future__ import annotations

import ast
from typing import cast

from torch import fx, nn

from hfcheck.analyzer.fusions.base import FusionContext, GraphPattern, Match
from hfcheck.analyzer.graph import forward_source as src
from hfcheck.analyzer.graph.nodes import (
    child,
    is_linear,
    reads_forward_input,
    returned_linear,
)


def linears_by_input(graph: fx.Graph, module: nn.Module) -> dict[fx.Node, list[fx.Node]]:
    """Linear calls reading a forward parameter directly, grouped by that parameter."""
    groups: dict[fx.Node, list[fx.Node]] = {}
    for node in graph.nodes:
        if is_linear(node, module) and reads_forward_input(node):
            groups.setdefault(cast(fx.Node, node.args[0]), []).append(node)  # reads_forward_input: a placeholder node
    return groups


class QKV(GraphPattern):
    name = "qkv"

    @classmethod
    def match_graph(cls, graph: fx.Graph, module: nn.Module) -> Match | None:
        triples = [g for g in linears_by_input(graph, module).values() if len(g) == 3]
        if len(triples) != 1:
            return None
        nodes = triples[0]
        outs = [cast(nn.Linear, child(module, n)).out_features for n in nodes]  # is_linear: nn.Linear children
        if len(set(outs)) == 2:
            (q,) = (n for n, o in zip(nodes, outs) if outs.count(o) == 1)
            k, v = (n for n, o in zip(nodes, outs) if outs.count(o) == 2)
            if child(module, q).out_features != max(outs):
                return None
        elif len(set(outs)) == 1:
            q, k, v = nodes
        else:
            return None
        names = (str(q.target), str(k.target), str(v.target))
        o_name = returned_linear(graph, module)
        if o_name in names or (o_name is not None and module.get_submodule(o_name).in_features != child(module, q).out_features):
            o_name = None
        return Match(cls.name, names, o_name)

    rewrites_source = True

    @classmethod
    def merged_name(cls, match: Match) -> str:
        return "qkv_proj"

    @classmethod
    def rewrite(cls, funcdef: ast.FunctionDef, match: Match, module: nn.Module) -> None:
        """``q(x), k(x), v(x)`` -> ``qkv_proj(x).split(...)`` before the earliest call, in the
        innermost block holding all three; no other linear may read the same input (the
        trace may be partial, so exclusivity is proven in source)."""
        src.merge_projections(funcdef, module, match.projections, cls.merged_name(match), src.common_block, "q/k/v projections", exclusive=True)

    @classmethod
    def validate(cls, match: Match, module: nn.Module, ctx: FusionContext) -> str | None:
        q, k, v = (cast(nn.Linear, module.get_submodule(n)) for n in match.projections)  # find matched linears
        head = getattr(module, "head_dim", None) or ctx.head_size
        if not q.in_features == k.in_features == v.in_features:
            return "q/k/v projections have different in-features"
        if len({p.bias is None for p in (q, k, v)}) != 1:
            return "only some of q/k/v have a bias"
        if k.out_features != v.out_features:
            return "k and v projections differ in size"
        if q.out_features % head or k.out_features % head:
            return f"projection sizes do not divide by head_dim {head}"
        return None
