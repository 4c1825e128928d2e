"""What every fusion pattern is: a class with ``match`` (graph shape), ``rewrite`` (vLLM's
``update_forward``: the edit of the forward's source; ``check_rewrite`` runs it on a fresh
parse and keeps the refusal) and ``validate`` (this instance's sizes).

Mirrors vLLM's fusers: ``match`` runs once per module class on its leaf trace, the
survivors are validated per instance, and only the first forward-redefining pattern that
validates applies to an instance. Patterns report *why* they refuse, which vLLM only logs
at debug level.
"""

from __future__ import annotations

import ast
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar

from torch import fx, nn

from hfcheck.analyzer.graph import forward_source as src
from hfcheck.analyzer.graph.tracer import Trace, trace_module


@dataclass(frozen=True)
class FusionContext:
    """Model-wide facts a pattern's ``validate`` needs (vLLM reads them from its config)."""

    head_size: int
    tp_size: int = 1
    use_mla: bool = False
    attn_implementation: str = "hfcheck"
    divides_shared_output: bool = False
    """fp16 with ``routed_scaling_factor != 1``: vLLM divides the shared expert's output and
    keeps transformers routing (``moe.divides_shared_output``). Built by
    ``analysis.fusion_context`` for scan, the sandbox and verify alike."""
    vllm_series: str = "0.34"
    """The vLLM release modelled (``vllm.release.modelled_series``): the MoE block fuser differs."""


@dataclass
class Match:
    """A pattern found in a module class's forward."""

    fusion: str
    """Fusion name in hfcheck's vocabulary (see ``vocabulary.FUSIONS``)."""
    projections: tuple[str, ...] = ()
    """Children the fusion merges, in shard order."""
    row_parallel: str | None = None
    """The linear consuming the fused output (o_proj / down_proj): becomes rowwise."""
    details: dict = field(default_factory=dict)


class Pattern(ABC):
    """One vLLM fuser, re-stated. Subclasses set ``name`` and implement ``find``."""

    name: ClassVar[str]
    redefines_forward: ClassVar[bool] = True
    needs_trace: ClassVar[bool] = True
    rewrites_source: ClassVar[bool] = False
    """``rewrite`` edits the forward's source (qkv, merged_column, glu, packed_qkv, mla)."""

    @classmethod
    @abstractmethod
    def find(cls, trace: Trace | None, module: nn.Module) -> Match | None:
        """The pattern in ``module``'s trace, if present (class-level, cached by caller)."""

    @classmethod
    def rewrite(cls, funcdef: ast.FunctionDef, match: Match, module: nn.Module) -> None:
        """Edit ``funcdef`` (a fresh parse of the forward) as vLLM's ``update_forward`` does;
        raise ``RewriteRefused`` where vLLM's raises (the fusion is then skipped)."""
        raise NotImplementedError(f"{cls.name} does not rewrite the forward")

    @classmethod
    def check_rewrite(cls, match: Match, module: nn.Module) -> None:
        """Raise ``RewriteRefused`` when vLLM's source rewrite would fail: the rewrite itself,
        run on a fresh parse (the same code ``verify`` compiles, ``fused_forward``)."""
        if cls.rewrites_source:
            cls.rewrite(src.forward_def(type(module)), match, module)

    @classmethod
    def merged_name(cls, match: Match) -> str | None:
        """The attribute the fused projection gets on the module (vLLM's ``merged_name``)."""
        return None

    @classmethod
    def validate(cls, match: Match, module: nn.Module, ctx: FusionContext) -> str | None:
        """``None`` when this instance can take the fusion, else the reason it cannot."""
        return None


class GraphPattern(Pattern):
    """A pattern read off the module's fx graph: where fx could not trace the module there is no
    graph, and vLLM's fuser (which walks the same graph) finds nothing, so neither does this."""

    @classmethod
    def find(cls, trace: Trace | None, module: nn.Module) -> Match | None:
        if trace is None or trace.graph is None:
            return None
        return cls.match_graph(trace.graph, module)

    @classmethod
    @abstractmethod
    def match_graph(cls, graph: fx.Graph, module: nn.Module) -> Match | None:
        """The pattern in ``module``'s traced ``graph``, if present."""


def class_key(module: nn.Module) -> tuple:
    """vLLM caches per (type, child names): one entry per distinct module shape. One vLLM
    process holds one model; hfcheck scans many in one process (port's re-scans, the TUI, a
    sweep), and a trace bakes the instance's sizes (``split((self.embed_dim, ...))``), so the
    sizes are part of the key: parameter shapes and the module's own numeric attributes."""
    shapes = tuple((name, tuple(p.shape)) for name, p in module.named_parameters())
    numbers = tuple(sorted((k, v) for k, v in vars(module).items() if isinstance(v, (int, float)) and not isinstance(v, bool)))
    return (type(module), tuple(name for name, _ in module.named_children()), shapes, numbers)


def trace_for_patterns(module: nn.Module) -> Trace | None:
    """The trace the patterns match on: of a leaf module, or of one holding two or more linears
    (attention, MLP); None for other containers (a decoder layer is matched in its parts)."""
    children = list(module.children())
    linears = sum(isinstance(c, nn.Linear) for c in children)
    return trace_module(module) if linears >= 2 or not children else None
