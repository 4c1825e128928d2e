"""Any group of >= 2 sibling linears reading the same forward input -> one merged column linear."""

from __future__ import annotations

import ast
from typing import cast

from torch import fx, nn

from hfcheck.analyzer.fusions.base import FusionContext, GraphPattern, Match
from hfcheck.analyzer.fusions.qkv import linears_by_input
from hfcheck.analyzer.graph import forward_source as src


class MergedColumn(GraphPattern):
    name = "merged_column"

    @classmethod
    def match_graph(cls, graph: fx.Graph, module: nn.Module) -> Match | None:
        groups = []
        for group in linears_by_input(graph, module).values():
            names = tuple(str(n.target) for n in group)
            if len(group) >= 2 and len(set(names)) == len(names) and not any("." in n for n in names):
                groups.append(names)
        if len(groups) != 1:
            return None
        match = Match(cls.name, groups[0], None)
        return None if hasattr(module, cls.merged_name(match)) else match  # as vLLM: never over an existing name

    rewrites_source = True

    @classmethod
    def merged_name(cls, match: Match) -> str:
        """``merged_proj_<len>_<name>_...`` (lengths tell ``a_b`` + ``c`` from ``a`` + ``b_c``)."""
        return "merged_proj_" + "_".join(f"{len(n)}_{n}" for n in match.projections)

    @classmethod
    def rewrite(cls, funcdef: ast.FunctionDef, match: Match, module: nn.Module) -> None:
        """The parallel calls -> one merged call and split, in the one block holding them."""
        src.merge_projections(funcdef, module, match.projections, cls.merged_name(match), src.same_block, "the parallel linears")

    @classmethod
    def validate(cls, match: Match, module: nn.Module, ctx: FusionContext) -> str | None:
        linears = [cast(nn.Linear, module.get_submodule(n)) for n in match.projections]  # find matched linears
        if len({lin.in_features for lin in linears}) != 1:
            return "the parallel linears have different in-features"
        if len({lin.bias is None for lin in linears}) != 1:
            return "only some of the parallel linears have a bias"
        bad = [n for n, lin in zip(match.projections, linears) if lin.out_features % ctx.tp_size]
        if bad:
            return f"out-features of {', '.join(bad)} do not divide by TP {ctx.tp_size}"
        return None
