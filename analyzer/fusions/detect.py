"""Which patterns apply to a module: once per class (trace + match + source check), then
per instance (validate), exactly in the order and with the exclusivity vLLM uses."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from torch import nn

from hfcheck.analyzer.fusions.base import (
    FusionContext,
    Match,
    Pattern,
    class_key,
    trace_for_patterns,
)
from hfcheck.analyzer.fusions.registry import PATTERNS
from hfcheck.analyzer.fusions.rms_norm import clear_norm_cache
from hfcheck.analyzer.graph import forward_source as src
from hfcheck.analyzer.graph.forward_source import RewriteRefused
from hfcheck.analyzer.graph.tracer import Trace


@dataclass
class ClassFusions:
    """What one module class (with these child names) offers, before any instance check."""

    trace: Trace | None
    candidates: list[tuple[type[Pattern], Match]] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)
    """(fusion, reason): matched in the graph but the source rewrite is refused."""


_CACHE: dict[tuple, ClassFusions] = {}


def class_fusions(module: nn.Module) -> ClassFusions:
    key = class_key(module)
    if key in _CACHE:
        return _CACHE[key]
    traced = trace_for_patterns(module)
    result = ClassFusions(traced)
    _CACHE[key] = result  # before matching: MLA asks about child norms, never about itself
    for pattern in PATTERNS:
        if pattern.needs_trace and traced is None:
            continue
        match = pattern.find(traced, module)
        if match is None:
            continue
        try:
            pattern.check_rewrite(match, module)
        except RewriteRefused as exc:
            result.refused.append((pattern.name, str(exc)))
            continue
        result.candidates.append((pattern, match))
    return result


@dataclass
class InstanceFusions:
    chosen: list[Match]
    rejected: list[tuple[str, str]]
    """(fusion, reason): candidates this instance refused (sizes, kernels, priority)."""


def instance_fusions(module: nn.Module, ctx: FusionContext) -> InstanceFusions:
    """The patterns this instance takes: the first forward-redefining one that validates,
    plus every non-redefining one that validates."""
    chosen: list[Match] = []
    rejected: list[tuple[str, str]] = []
    redefined = False
    for pattern, match in class_fusions(module).candidates:
        if pattern.redefines_forward and redefined:
            rejected.append((pattern.name, "a higher-priority fusion already rewrote this forward"))
            continue
        if (reason := pattern.validate(match, module, ctx)) is not None:
            rejected.append((pattern.name, reason))
            continue
        redefined = redefined or pattern.redefines_forward
        chosen.append(match)
    return InstanceFusions(chosen, rejected)


BY_NAME: dict[str, type[Pattern]] = {p.name: p for p in PATTERNS}

_FORWARDS: dict[tuple, Callable] = {}


def fused_forward(module: nn.Module, match: Match) -> Callable:
    """The forward vLLM binds on ``module`` when it takes ``match``: the pattern's rewrite of
    the class's forward (the very code ``check_rewrite`` ran), compiled once per class and
    match. ``RewriteRefused`` where vLLM would skip the fusion."""
    pattern = BY_NAME[match.fusion]
    if not pattern.rewrites_source:
        raise ValueError(f"{match.fusion} does not rewrite the forward")
    key = (type(module), match.fusion, match.projections, repr(sorted(match.details.items())))
    if key not in _FORWARDS:
        funcdef, fn = src.recover_forward(type(module))
        pattern.rewrite(funcdef, match, module)
        _FORWARDS[key] = src.compile_forward(funcdef, fn)
    return _FORWARDS[key]


def clear_cache() -> None:
    _CACHE.clear()
    _FORWARDS.clear()
    clear_norm_cache()
