"""One projection followed by ``.split((q, kv, kv))`` -> QKVParallelLinear with a per-rank split."""

from __future__ import annotations

import ast

from torch import fx, nn

from hfcheck.analyzer.fusions.base import FusionContext, GraphPattern, Match
from hfcheck.analyzer.graph import forward_source as src
from hfcheck.analyzer.graph.nodes import is_method, returned_linear, upstream_linear


def _split_sizes(node: fx.Node) -> tuple[int, int] | None:
    if not is_method(node, "split") or len(node.args) < 2:
        return None
    sizes = node.args[1]
    if not isinstance(sizes, (tuple, list)) or len(sizes) != 3:
        return None
    q, k, v = sizes
    if not (isinstance(q, int) and isinstance(k, int) and isinstance(v, int)):
        return None
    return (q, k) if k == v and q >= k else None


def packed_split(funcdef: ast.FunctionDef, name: str) -> None:
    """The one ``....split((q, kv, kv))`` of ``<name>``'s output -> per-rank sizes (vLLM's
    ``_split_call`` matches any attribute named ``name`` under the split)."""
    splits = [
        n
        for n in ast.walk(funcdef)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == "split"
        and n.args
        and isinstance(n.args[0], (ast.Tuple, ast.List))
        and len(n.args[0].elts) == 3
        and any(isinstance(i, ast.Attribute) and i.attr == name for i in ast.walk(n.func.value))
    ]
    if len(splits) != 1:
        raise src.RewriteRefused(f"self.{name} has {len(splits)} three-way splits in the source (needs exactly one)")
    splits[0].args[0] = src.local_sizes(name)


class PackedQKV(GraphPattern):
    name = "packed_qkv"

    @classmethod
    def match_graph(cls, graph: fx.Graph, module: nn.Module) -> Match | None:
        for node in graph.nodes:
            if (sizes := _split_sizes(node)) is None:
                continue
            q_size, kv_size = sizes
            source = upstream_linear(node.args[0], module)
            if source is None:
                continue
            name = str(source.target)
            if module.get_submodule(name).out_features != q_size + 2 * kv_size:
                continue
            o_name = returned_linear(graph, module)
            if o_name == name or (o_name is not None and module.get_submodule(o_name).in_features != q_size):
                o_name = None
            return Match(cls.name, (name,), o_name, {"q_size": q_size, "kv_size": kv_size})
        return None

    rewrites_source = True

    @classmethod
    def rewrite(cls, funcdef: ast.FunctionDef, match: Match, module: nn.Module) -> None:
        """The split sizes -> the sharded projection's per-rank widths."""
        packed_split(funcdef, match.projections[0])

    @classmethod
    def validate(cls, match: Match, module: nn.Module, ctx: FusionContext) -> str | None:
        head = getattr(module, "head_dim", None) or ctx.head_size
        q, kv = match.details["q_size"], match.details["kv_size"]
        if q % head or kv % head:
            return f"split sizes ({q}, {kv}, {kv}) do not divide by head_dim {head}"
        return None
