"""Any group of >= 2 sibling linears reading the same forward input -> one merged column linear."""

from __future__ import annotations

from hfcheck.analyzer.fusions.base import FusionContext, Match, Pattern
from hfcheck.analyzer.fusions.qkv import linears_by_input
from hfcheck.analyzer.graph import forward_source as src
from hfcheck.analyzer.graph.tracer import Trace
from torch import nn


class MergedColumn(Pattern):
    name = "merged_column"

    @classmethod
    def find(cls, trace: Trace | None, module: nn.Module) -> Match | None:
        if trace is None or trace.graph is None:
            return None
        groups = []
        for group in linears_by_input(trace.graph, module).values():
            names = tuple(str(n.target) for n in group)
            if len(group) >= 2 and len(set(names)) == len(names) and not any("." in n for n in names):
                groups.append(names)
        if len(groups) != 1:
            return None
        return Match(cls.name, groups[0], None)

    @classmethod
    def check_rewrite(cls, match: Match, module: nn.Module) -> None:
        funcdef = src.forward_def(type(module))
        calls = [src.single_call(funcdef, n) for n in match.projections]
        if not src.same_input(calls):
            raise src.RewriteRefused("the parallel linears read inputs written differently")
        paths = [src.statement_path(funcdef.body, c) for c in calls]
        if any(not p for p in paths) or len({id(p[-1][0]) for p in paths}) != 1:
            raise src.RewriteRefused("the parallel linear calls are in different blocks")
        block = paths[0][-1][0]
        src.check_input_stable(funcdef, module, calls, block, [p[-1][1] for p in paths])
        src.splice_names_free(funcdef, len(calls))

    @classmethod
    def validate(cls, match: Match, module: nn.Module, ctx: FusionContext) -> str | None:
        linears = [module.get_submodule(n) for n in match.projections]
        if len({lin.in_features for lin in linears}) != 1:
            return "the parallel linears have different in-features"
        if len({lin.bias is None for lin in linears}) != 1:
            return "only some of the parallel linears have a bias"
        bad = [n for n, lin in zip(match.projections, linears) if lin.out_features % ctx.tp_size]
        if bad:
            return f"out-features of {', '.join(bad)} do not divide by TP {ctx.tp_size}"
        return None
