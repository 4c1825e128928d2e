"""What vLLM's transformers backend actually did, read from its own log, and how that compares
with hfcheck's prediction for the same model.

vLLM logs one INFO line per decision from the worker process (``base.py`` ``recursive_replace``,
``moe.py``), in 0.32 and 0.33 alike:

- ``Fused: q_proj + k_proj + v_proj (self_attn: Qwen3Attention) -> qkv_proj (QKVParallelLinear)``
- ``Fused: c_attn (attn: GPT2Attention) -> QKVParallelLinear`` (a packed projection split)
- ``Fused: gate_proj + up_proj (mlp: LlamaMLP) -> gate_up_proj (MergedColumnParallelLinear)`` (GLU)
- ``Fused: a_proj + b_proj (x: Cls) -> merged_proj_6_a_proj_6_b_proj (MergedColumnParallelLinear)``
- ``Fused: q_norm (Qwen3RMSNorm) -> RMSNorm (CustomOp)`` (or ``GemmaRMSNorm``)
- ``Fused: self_attn (DeepseekV3Attention) -> MLAAttention (attention interface)``
- ``Found: self_attn (Qwen3Attention) -> attention interface``
- ``Fused: gate + experts [+ shared experts] (Block) -> MoERunner (internal routing)``,
  ``Fused: experts (Experts) -> MoERunner (external routing)``

Messages are logged once per process (``info_once``), keyed by class: enough to compare per
module class, which is how hfcheck reports fusions.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hfcheck.analyzer.report.verdict import LOADS

_FUSED = re.compile(r"Fused: (?P<src>.+?) \((?:(?P<attr>[\w.]+): )?(?P<cls>\w+)\) -> (?P<dst>.+)$")
_FOUND = re.compile(r"Found: (?P<attr>[\w.]+) \((?P<cls>\w+)\) -> attention interface")
_ERROR = re.compile(r"(?:Error|Exception|error)\W*:?\s*(.+)$")


@dataclass
class RuntimeDecisions:
    backend: bool = False  # "Using Transformers modeling backend." was logged
    fusions: dict[str, set[str]] = field(default_factory=dict)  # module class -> hfcheck fusion names
    attention: set[str] = field(default_factory=set)  # classes dispatching through the interface
    moe: dict[str, str] = field(default_factory=dict)  # block/experts class -> "internal" | "external"

    def to_dict(self) -> dict[str, Any]:
        return {"transformers_backend": self.backend, "fusions": {k: sorted(v) for k, v in sorted(self.fusions.items())},
                "attention": sorted(self.attention), "moe": dict(sorted(self.moe.items()))}


def _fusion_of(src: str, dst: str) -> str | None:
    if "MoERunner" in dst:
        return None
    if "MLAAttention" in dst:
        return "mla"
    if "RMSNorm" in dst:
        return "rms_norm"
    if dst.strip() == "QKVParallelLinear":
        return "packed_qkv"
    if "QKVParallelLinear" in dst:
        return "qkv"
    if "MergedColumnParallelLinear" in dst:
        return "glu" if dst.startswith("gate_up_proj") else "merged_column"
    return None


def parse(log: str) -> RuntimeDecisions:
    out = RuntimeDecisions()
    for line in log.splitlines():
        if "Using Transformers modeling backend" in line:
            out.backend = True
        m = _FOUND.search(line)
        if m:
            out.attention.add(m.group("cls"))
            continue
        m = _FUSED.search(line)
        if not m:
            continue
        src, cls, dst = m.group("src"), m.group("cls"), m.group("dst").strip()
        if "MoERunner" in dst:
            out.moe[cls] = "internal" if "internal" in dst else "external"
            continue
        name = _fusion_of(src, dst)
        if name:
            out.fusions.setdefault(cls, set()).add(name)
            if name == "mla":
                out.attention.add(cls)
    return out


def load_error(log: str) -> str | None:
    """The line that says why vLLM did not start (the last exception-looking line). Where that
    is the engine's "Worker failed with error ''" (a bare ``assert`` in the worker), the worker's
    own exception and the source line that raised it instead."""
    candidates: list[str] = []
    source = None
    for line in log.splitlines():
        text = re.sub(r"^\(\w+ pid=\d+\)\s*", "", line).strip()
        text = re.sub(r"^(ERROR|WARNING|INFO) \d\d-\d\d [\d:]+ \[[^\]]+\]\s*", "", text)
        if re.match(r"^([\w.]+Error|[\w.]+Exception|Value error,)", text) or "does not dispatch through" in text \
                or "is not compatible with vLLM" in text or "Cannot find model module" in text:
            if "Worker failed with error ''" in text and candidates and source:
                return f"{candidates[-1]} in vLLM's worker at `{source}`"[:400]
            candidates.append(text)
        elif text and not text.startswith(("File ", "^", "~", "Traceback")):
            source = text
    return candidates[-1][:400] if candidates else None


FAILS_ON_CPU_BUILD = "cpu"
"""``details["fails_on"]`` of a finding that stops vLLM's CPU build only (HFC406)."""


def fails_on_cpu_build(report: dict[str, Any]) -> list[str]:
    """The messages of the report's findings that stop vLLM's CPU build, not a GPU one."""
    return [c["message"] for c in report.get("checks", []) if (c.get("details") or {}).get("fails_on") == FAILS_ON_CPU_BUILD]


def predicted(report: dict[str, Any], cpu_build: bool = False) -> RuntimeDecisions:
    """hfcheck's prediction in the same shape (from a scan report); ``cpu_build``: for vLLM's
    CPU build, where some routing vLLM does on GPUs stops the model (``fails_on_cpu_build``)."""
    loads = report.get("verdict") in LOADS and not (cpu_build and fails_on_cpu_build(report))
    out = RuntimeDecisions(backend=loads)
    for m in report.get("modules", []):
        names = {f for f in m.get("fusions", []) if f in ("qkv", "packed_qkv", "glu", "merged_column", "rms_norm", "mla")}
        if names:
            out.fusions[m["class"]] = names
        if m.get("attention_interface"):
            out.attention.add(m["class"])
    for block in report.get("moe", []):
        if block.get("experts_replaceable"):
            if block.get("block_taken_over"):  # vLLM 0.33 also takes a block over with the model's router
                out.moe[block["class"]] = "internal" if block.get("internal_routing") else "external"
            else:
                out.moe[block.get("experts_class") or block["class"]] = "external"
    return out


def differences(got: RuntimeDecisions, want: RuntimeDecisions) -> list[str]:
    """What vLLM did that hfcheck did not predict, and the other way round (one line each)."""
    diffs = []
    for cls in sorted(set(got.fusions) | set(want.fusions)):
        a, b = got.fusions.get(cls, set()), want.fusions.get(cls, set())
        if a != b:
            diffs.append(f"{cls}: vLLM fused {sorted(a) or 'nothing'}, hfcheck predicted {sorted(b) or 'nothing'}")
    for cls in sorted(got.attention ^ want.attention):
        diffs.append(f"{cls}: attention interface {'found by vLLM, not predicted' if cls in got.attention else 'predicted, not found by vLLM'}")
    for cls in sorted(set(got.moe) | set(want.moe)):
        if got.moe.get(cls) != want.moe.get(cls):
            diffs.append(f"{cls}: vLLM MoE routing {got.moe.get(cls, 'not replaced')}, hfcheck predicted {want.moe.get(cls, 'not replaced')}")
    return diffs



def predicted_loads(row: dict[str, Any]) -> bool:
    """Did hfcheck predict that the vLLM of this runtime row loads the model (the CPU build's
    own limits included, where the row ran there)."""
    want = row.get("predicted") or {}
    if "transformers_backend" in want:
        return bool(want["transformers_backend"])
    return row.get("verdict") in LOADS


def served(row: dict[str, Any]) -> bool:
    """vLLM served the model: it loaded, and its outputs were not shown wrong (``wrong_output``:
    a pooling row whose embedding does not match transformers', as when weights were dropped)."""
    return row.get("status") == "loaded" and not row.get("wrong_output")


def agreement(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Agreement between prediction and runtime over runtime cross-check rows (one per model type).

    Counted over the types whose small instance built and whose load vLLM attempted (``loaded``
    or ``refused``): the verdict agrees when vLLM loaded exactly the types hfcheck said load; a
    type agrees fully when, in addition, a loaded model's logged fusions, attention and MoE
    decisions equal the prediction and its greedy tokens equal transformers'. The one function
    the runtime cross-check's summary, its CI gate and the atlas column read."""
    built = [r for r in rows if r.get("status") in ("loaded", "refused")]
    verdict_ok = [r for r in built if served(r) == predicted_loads(r)]
    full_ok = [r for r in verdict_ok if not served(r) or (not r.get("differences") and r.get("tokens_match"))]
    return {"types": len(rows), "built": len(built), "verdict_agrees": len(verdict_ok), "all_agree": len(full_ok),
            "disagree": sorted(r["model_type"] for r in built if r not in full_ok)}


def runtime_cell(row: dict[str, Any]) -> str:
    """One atlas cell: what vLLM did with the type, and whether hfcheck predicted it."""
    status = row.get("status")
    if status == "loaded" and row.get("wrong_output"):
        mark = "✓" if not predicted_loads(row) else "✗"
        return f"{mark} loaded, but its output differs from transformers' ({row.get('wrong_output')})"
    if status == "loaded":
        tokens = ("embedding = transformers" if row.get("cosine") is not None else "tokens = transformers") if row.get("tokens_match") \
            else "tokens differ from transformers"
        same = not row.get("differences") and row.get("tokens_match") and predicted_loads(row)
        return f"{'✓' if same else '✗'} loaded, {tokens}" + ("" if not row.get("differences") else f"; {'; '.join(row['differences'])}")
    if status == "refused":
        mark = "✓" if not predicted_loads(row) else "✗"
        return f"{mark} refused: {row.get('error') or 'no error line'}"
    return f"not run ({status}): {row.get('error') or ''}".rstrip(": ")


def rows_prefix(kind: str = "") -> str:
    """The runtime cross-check's output files (``scripts/runtime_crosscheck.py``), one per vLLM
    version: ``runtime-vllm-<v>.jsonl`` (causal-LM types), ``runtime-vlm-vllm-<v>.jsonl`` (its
    vision-language cases, ``--vlm``), ``runtime-pooling-vllm-<v>.jsonl`` (``--pooling``)."""
    return f"runtime-{kind}-vllm-" if kind else "runtime-vllm-"


def latest_rows(folder, kind: str = "") -> tuple[str, dict[str, dict[str, Any]]] | None:
    """(vLLM version, rows by model type) of the newest runtime cross-check of ``kind`` ("",
    "vlm" or "pooling") in ``folder``, if any."""

    prefix = rows_prefix(kind)

    def version_of(path: Path) -> tuple[int, ...]:
        text = path.name[len(prefix):-len(".jsonl")]
        return tuple(int(p) if p.isdigit() else 0 for p in text.split("."))

    files = sorted((p for p in Path(folder).glob(f"{prefix}*.jsonl") if not p.name.endswith(".new.jsonl")), key=version_of)
    if not files:
        return None
    rows: dict[str, dict[str, Any]] = {}
    for line in files[-1].read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            rows[row["model_type"]] = row
    return files[-1].name[len(prefix):-len(".jsonl")], rows
