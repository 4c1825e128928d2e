"""A report's table cells, in words, for every view that lists models: the atlas (Markdown),
the sweep's table and the TUI's rows take their cells from here, so a column reads the same
wherever it appears."""

from __future__ import annotations

from typing import Any

from hfcheck.analyzer.terms import vocabulary as V


def fusions_cell(report: dict[str, Any]) -> str:
    """The fusions vLLM makes anywhere in the model, in vLLM's order (``none``)."""
    names = {f for m in report.get("modules", []) for f in m.get("fusions", [])}
    return ", ".join(sorted(names, key=lambda n: V.FUSIONS.index(n) if n in V.FUSIONS else len(V.FUSIONS))) or "none"


def tp_cell(report: dict[str, Any]) -> str:
    """Every TP size that loads (``none``)."""
    sizes = (report.get("parallel") or {}).get("tp", {}).get("sizes") or {}
    ok = [s for s, works in sizes.items() if works]
    return ", ".join(ok) if ok else "none"


def largest_tp(report: dict[str, Any]) -> int | None:
    sizes = (report.get("parallel") or {}).get("tp", {}).get("sizes") or {}
    ok = [int(s) for s, works in sizes.items() if works]
    return max(ok) if ok else None


def pp_cell(report: dict[str, Any]) -> str:
    return "yes" if (report.get("parallel") or {}).get("pp", {}).get("supported") else "no"


def native_cell(report: dict[str, Any]) -> str:
    """Whether vLLM has a native class for the architecture (``?``: unknown)."""
    native = (report.get("model") or {}).get("vllm_native")
    return "yes" if native else ("no" if native is False else "?")


def moe_detail(report: dict[str, Any]) -> str:
    """Each MoE block and whether FusedMoE replaces its experts (the atlas's column)."""
    blocks = report.get("moe") or []
    if not blocks:
        return "—"
    return "; ".join(f"{b.get('class')}: {'replaceable' if b.get('experts_replaceable') else 'not replaceable'}" for b in blocks)


def moe_summary(report: dict[str, Any]) -> str:
    """The MoE blocks in one word or two (the TUI's narrow column)."""
    blocks = report.get("moe") or []
    if not blocks:
        return "—"
    if all(b.get("experts_replaceable") for b in blocks):
        return "fused+EP" if (report.get("parallel") or {}).get("ep", {}).get("supported") else "fused"
    return "not fused"
