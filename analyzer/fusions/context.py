"""What vLLM reads from the config when it fuses (``FusionContext``), built in one place for the
scan, the remote-code sandbox, verify and the cross-check against vLLM's own code."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hfcheck.analyzer.fusions.base import FusionContext
from hfcheck.analyzer.fusions.moe import divides_shared_output
from hfcheck.analyzer.vllm.release import modelled_series

if TYPE_CHECKING:
    from hfcheck.analyzer.facts import ModelFacts


def fusion_context(facts: ModelFacts, tp_size: int = 1, *, head_size: int | None = None, attn_implementation: str | None = None) -> FusionContext:
    """What vLLM reads from the config when it fuses: the one constructor scan, the sandbox
    and verify use (``head_size``: verify's shrunk instance has its own)."""
    extra = {"attn_implementation": attn_implementation} if attn_implementation else {}
    return FusionContext(
        head_size=head_size or facts.head_dim or 1,
        tp_size=tp_size,
        use_mla=facts.uses_mla,
        divides_shared_output=divides_shared_output(facts.dtype, facts.routed_scaling_factor),
        vllm_series=modelled_series(),
        **extra,
    )
