"""Multi-head latent attention: ``rms_norm(linear(x))`` chains for the q and kv down
projections merge into ``fused_qkv_a_proj``; the kv expansion is absorbed by vLLM's MLA
attention. Validates only when the model uses MLA (``kv_lora_rank`` in the config).
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from typing import cast

from torch import fx, nn

from hfcheck.analyzer.fusions.base import FusionContext, GraphPattern, Match
from hfcheck.analyzer.fusions.rms_norm import is_rms_norm
from hfcheck.analyzer.graph import forward_source as src
from hfcheck.analyzer.graph.nodes import (
    child,
    downstream_linear,
    is_linear,
    returned_linear,
    upstream_linear,
)

DEEPSEEK_MLA_TYPES = frozenset({
    "axk1", "deepseek_v2", "deepseek_v3", "deepseek_v32", "deepseek_v4", "deepseek_v41", "dots3_note",
    "deepseek_mtp", "k3_dspark", "glm5_next", "glm5_next_text", "glm_moe_dsa", "glm4_moe_lite",
    "glm4_moe_lite_mtp", "kimi_k2", "kimi_linear", "longcat_flash", "pangu_ultra_moe",
    "pangu_ultra_moe_mtp", "bailing_hybrid", "bailing_hybrid_mtp", "bailing_hybrid_v3_mtp", "hy_v4",
    "hy_v4_mtp",
})
"""Text model types whose head size vLLM computes as ``kv_lora_rank + qk_rope_head_dim``
(``ModelArchConfigConvertorBase.is_deepseek_mla``, the same list in 0.32 and 0.33). Any other
MLA model gets the plain head size: transformers' MLA configs set ``head_dim`` to the rope part."""

MLA_HEAD_SIZES = (320, 512, 576)
"""``MLACommonBackend.get_supported_head_sizes``: the attention metadata of every MLA backend
(GPU and CPU) refuses any other head size at the first forward ("Head dimension 64 is not
supported by MLA")."""


def vllm_head_size(text_model_type: str, head_dim: int | None, kv_lora_rank: int | None, qk_rope_head_dim: int | None) -> int | None:
    """The head size vLLM's model config reports (``get_head_size``) for an MLA model: the
    latent width for the DeepSeek family, else the config's head_dim (``hidden // heads`` when
    it has none, which ``head_dim`` here already is)."""
    if text_model_type in DEEPSEEK_MLA_TYPES and kv_lora_rank is not None:
        return kv_lora_rank + (qk_rope_head_dim or 0)
    return head_dim


def refused_head_size(facts) -> int | None:
    """The head size vLLM's MLA attention refuses at start for this model, else None."""
    if not facts.uses_mla:
        return None
    size = vllm_head_size(facts.text_model_type, facts.head_dim, facts.kv_lora_rank, facts.qk_rope_head_dim)
    return None if size in MLA_HEAD_SIZES else size


def _reads_input(node: fx.Node) -> bool:
    return len(node.args) == 1 and isinstance(node.args[0], fx.Node) and node.args[0].op == "placeholder"


def _norm_width(norm: nn.Module) -> int:
    weight = getattr(norm, "weight", None)
    return weight.numel() if weight is not None else -1


def expands_latent(module: nn.Module, method_name: str, kv_b: str) -> bool:
    """``self.<method>(kv_c_normed, k_pe)``: two inputs, every return a pair, applies ``kv_b``."""
    method = getattr(type(module), method_name, None)
    code = getattr(inspect.unwrap(method), "__code__", None) if method is not None else None
    if method is None or code is None or code.co_argcount != 3 or kv_b not in code.co_names:
        return False
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(method)))
    except (OSError, TypeError, SyntaxError):
        return False
    returns = [n for n in ast.walk(tree) if isinstance(n, ast.Return)]
    return bool(returns) and all(isinstance(r.value, ast.Tuple) and len(r.value.elts) == 2 for r in returns)


def bypass_latent_expansion(funcdef: ast.FunctionDef, module: nn.Module, kv_b: str) -> None:
    """MLA: the one KV expansion call ``self.<expand>(kv_c, k_pe)`` -> ``(kv_c, k_pe)``, so the
    latent reaches vLLM's MLA attention unexpanded."""
    calls = [
        n
        for n in ast.walk(funcdef)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and isinstance(n.func.value, ast.Name)
        and n.func.value.id == "self"
        and len(n.args) == 2
        and not n.keywords
        and expands_latent(module, n.func.attr, kv_b)
    ]
    if len(calls) != 1:
        raise src.RewriteRefused("no single `self.<expand>(kv_c_normed, k_pe)` method applying kv_b_proj")
    src.replace_node(funcdef, calls[0], ast.Tuple(list(calls[0].args), ast.Load()))


class MLA(GraphPattern):
    name = "mla"

    @classmethod
    def match_graph(cls, graph: fx.Graph, module: nn.Module) -> Match | None:
        chains = []
        for node in graph.nodes:
            if node.op != "call_module" or is_linear(node, module) or not node.args:
                continue
            source = upstream_linear(node.args[0], module)
            if source is None or not _reads_input(source) or not is_rms_norm(child(module, node)):
                continue
            chains.append((source, node))

        def is_kv(chain: tuple[fx.Node, fx.Node]) -> bool:
            # chain[0] came from upstream_linear: an nn.Linear
            return cast(nn.Linear, child(module, chain[0])).out_features != _norm_width(child(module, chain[1]))

        kv_chains = [c for c in chains if is_kv(c)]
        q_chains = [c for c in chains if not is_kv(c)]
        if len(kv_chains) != 1 or len(q_chains) > 1:
            return None
        kv_a, kv_norm = kv_chains[0]
        claimed = {kv_a.target}
        details: dict = {"kv_a_proj": str(kv_a.target)}
        if q_chains:
            q_a, q_norm = q_chains[0]
            q_b = downstream_linear(q_norm, module)
            if q_b is None:
                return None
            claimed |= {q_a.target, q_b.target}
            details["q_a_proj"] = str(q_a.target)
        else:
            direct = {n.target for n in graph.nodes if is_linear(n, module) and _reads_input(n)} - claimed
            if len(direct) != 1:
                return None
            claimed |= direct
        kv_b = downstream_linear(kv_norm, module)
        if kv_b is None or kv_b.target in claimed:
            return None
        claimed.add(kv_b.target)
        details["kv_b_proj"] = str(kv_b.target)
        o_name = returned_linear(graph, module)
        projections = (details["q_a_proj"], details["kv_a_proj"]) if "q_a_proj" in details else (details["kv_a_proj"],)
        return Match(cls.name, projections, None if o_name in claimed else o_name, details)

    rewrites_source = True

    @classmethod
    def merged_name(cls, match: Match) -> str | None:
        return "fused_qkv_a_proj" if "q_a_proj" in match.details else None

    @classmethod
    def rewrite(cls, funcdef: ast.FunctionDef, match: Match, module: nn.Module) -> None:
        """q_a and kv_a -> ``fused_qkv_a_proj`` split at the top-level statement before both;
        the KV expansion call bypassed so the latent reaches vLLM's MLA attention."""
        if "q_a_proj" in match.details:
            names = (match.details["q_a_proj"], match.details["kv_a_proj"])
            merged = cls.merged_name(match)
            assert merged is not None  # named whenever q_a_proj is in the match
            src.merge_projections(funcdef, module, names, merged, src.top_level, "q and kv down-projections")
        bypass_latent_expansion(funcdef, module, match.details["kv_b_proj"])

    @classmethod
    def validate(cls, match: Match, module: nn.Module, ctx: FusionContext) -> str | None:
        return None if ctx.use_mla else "the config has no kv_lora_rank, so vLLM does not use MLA"
