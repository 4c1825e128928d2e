"""The patterns, in vLLM's priority order. A new pattern is one file and one line here.

vLLM's MoE block fuser is a pattern too (``moe.MoEBlockFusion``), matched on blocks holding
experts where the walk meets them (``analysis.observe``), not here: vLLM runs it apart from
``get_fusers``, whose lists these are (the cross-check compares them)."""

from __future__ import annotations

from hfcheck.analyzer.fusions.attention import Attention
from hfcheck.analyzer.fusions.base import Pattern
from hfcheck.analyzer.fusions.glu import GLU
from hfcheck.analyzer.fusions.merged_column import MergedColumn
from hfcheck.analyzer.fusions.mla import MLA
from hfcheck.analyzer.fusions.packed_qkv import PackedQKV
from hfcheck.analyzer.fusions.qkv import QKV
from hfcheck.analyzer.fusions.rms_norm import RMSNorm

PATTERNS: tuple[type[Pattern], ...] = (
    # forward-redefining patterns first, highest priority first
    MLA,
    GLU,
    QKV,
    PackedQKV,
    MergedColumn,
    # patterns that leave the forward alone
    RMSNorm,
    Attention,
)
