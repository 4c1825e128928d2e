"""Which patterns apply to a module: once per class (trace + match + source check), then
per instance (validate), exactly in the order and with the exclusivity vLLM uses."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from torch import nn

from hfcheck.analyzer.fusions.base import FusionContext, Match, Pattern
from hfcheck.analyzer.fusions.registry import PATTERNS
from hfcheck.analyzer.fusions.rms_norm import RMSNorm
from hfcheck.analyzer.graph import forward_source as src
from hfcheck.analyzer.graph.forward_source import RewriteRefused
from hfcheck.analyzer.graph.tracer import Trace, trace_module


@dataclass
class ClassFusions:
    """What one module class (with these child names) offers, before any instance check."""

    trace: Trace | None
    candidates: list[tuple[type[Pattern], Match]] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)
    """(fusion, reason): matched in the graph but the source rewrite is refused."""


_CACHE: dict[tuple, ClassFusions] = {}


def class_key(module: nn.Module) -> tuple:
    """vLLM caches per (type, child names): one entry per distinct module shape. One vLLM
    process holds one model; hfcheck scans many in one process (port's re-scans, the TUI, a
    sweep), and a trace bakes the instance's sizes (``split((self.embed_dim, ...))``), so the
    sizes are part of the key: parameter shapes and the module's own numeric attributes."""
    shapes = tuple((name, tuple(p.shape)) for name, p in module.named_parameters())
    numbers = tuple(sorted((k, v) for k, v in vars(module).items() if isinstance(v, (int, float)) and not isinstance(v, bool)))
    return (type(module), tuple(name for name, _ in module.named_children()), shapes, numbers)


def class_fusions(module: nn.Module) -> ClassFusions:
    key = class_key(module)
    if key in _CACHE:
        return _CACHE[key]
    children = list(module.children())
    linears = sum(isinstance(c, nn.Linear) for c in children)
    traced = trace_module(module) if linears >= 2 or not children else None
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


def is_rms_norm(module: nn.Module) -> bool:
    return any(p is RMSNorm for p, _ in class_fusions(module).candidates)


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
