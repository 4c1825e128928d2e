"""The module that dispatches through the transformers attention interface.

vLLM serves attention only through this interface: the forward must bind a name from
``ALL_ATTENTION_FUNCTIONS`` (``[impl]`` or ``.get_interface(...)``) and call it exactly
once; the module's ``config._attn_implementation`` must be the patched text config's,
and its ``layer_idx`` (an int) says which decoder layer it serves.
"""

from __future__ import annotations

from torch import nn

from hfcheck.analyzer.fusions.base import FusionContext, Match, Pattern
from hfcheck.analyzer.graph.forward_source import attention_dispatch, resolve_expression
from hfcheck.analyzer.graph.tracer import Trace


class Attention(Pattern):
    name = "attention"
    redefines_forward = False
    needs_trace = False

    @classmethod
    def find(cls, trace: Trace | None, module: nn.Module) -> Match | None:
        dispatch = attention_dispatch(type(module).forward)
        if dispatch is None or dispatch.calls != 1:
            return None
        return Match(cls.name, details={"scaling": dispatch.scaling, "s_aux": dispatch.s_aux, "line": dispatch.line})

    @classmethod
    def validate(cls, match: Match, module: nn.Module, ctx: FusionContext) -> str | None:
        impl = getattr(getattr(module, "config", None), "_attn_implementation", None)
        if impl != ctx.attn_implementation:
            return "the module's config is not the text config vLLM patches (no self.config, or another config)"
        return None


def layer_index(module: nn.Module) -> int | None:
    value = getattr(module, "layer_idx", None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def scaling_problem(match: Match, module: nn.Module) -> str | None:
    """vLLM raises at load when ``scaling=`` is neither a literal nor a numeric ``self.<attr>``."""
    expr = match.details.get("scaling")
    if expr is None:
        return None
    value = resolve_expression(expr, module)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"cannot resolve the attention scaling expression {expr!r}"
    return None


def sinks_problem(match: Match, module: nn.Module) -> str | None:
    expr = match.details.get("s_aux")
    if expr is None:
        return None
    value = resolve_expression(expr, module)
    if value is not None and not isinstance(value, nn.Parameter):
        return f"cannot resolve the attention s_aux expression {expr!r}"
    return None
