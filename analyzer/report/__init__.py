"""Analysis + findings -> the report: one plain dict, versioned by ``SCHEMA_VERSION``.

The published JSON Schema is ``scan.schema.json`` beside this file; a test validates
every family's report against it. Renderers read this dict, never rules.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any, NamedTuple

from hfcheck.analyzer.analysis import Analysis
from hfcheck.analyzer.facts.runner import backend_class
from hfcheck.analyzer.findings.rule import Finding
from hfcheck.analyzer.remote.checks import code_findings
from hfcheck.analyzer.report.memory import MemoryEstimate, estimate, suggested_parallelism
from hfcheck.analyzer.report.verdict import score_of, verdict_of
from hfcheck.analyzer.rules.parallel import (
    ANY_BACKEND,
    inferred_plan,
    refusal_scope,
    tp_constraints,
)
from hfcheck.analyzer.rules.registry import BY_CODE, RULES
from hfcheck.analyzer.terms import vocabulary as V
from hfcheck.analyzer.vllm.release import tables
from hfcheck.analyzer.vllm.sources import cite_all
from hfcheck.shared import version

if TYPE_CHECKING:
    from hfcheck.analyzer.analysis.observe import ModuleObservation, Observations

SCHEMA_VERSION = "1.3"
"""1.1: ``serve`` (which implementation the serve command uses, and why) and
``parallel.tp.refusal_scope`` (whether a refused TP size is refused by every backend).
1.3: ``target`` (the vLLM release, the transformers release it runs with, the platform),
``serve.auto`` (what ``--model-impl auto`` picks) and each check's ``vllm_source``."""


def schema() -> dict[str, Any]:
    return json.loads(resources.files("hfcheck.analyzer.report").joinpath("scan.schema.json").read_text())


def run_rules(analysis: Analysis) -> list[Finding]:
    findings: list[Finding] = []
    for rule in RULES:
        try:
            findings.extend(rule.on_platform(rule().check(analysis), analysis.target.platform))
        except Exception as exc:  # noqa: BLE001 - a rule bug is a recorded fact, never a crash of the scan
            findings.append(Finding(rule.code, "inconclusive", f"check crashed: {type(exc).__name__}: {exc}", None, rule.impact))
    return findings


def build_report(analysis: Analysis) -> dict[str, Any]:
    findings = run_rules(analysis)
    facts, obs, source = analysis.facts, analysis.observations, analysis.source
    verdict, score = verdict_of(findings), score_of(findings)
    sizes = _tp_sizes(analysis)
    mem = estimate(analysis)
    blockers = [f.message for f in findings if f.status == "fail" and f.impact == "blocker"]
    layers = _layers(analysis)
    modules = _modules(obs)
    moe = _moe(obs)
    tp_plan = _tp_plan(obs)
    pp_supported = bool(obs and (obs.pp_plan or len(obs.decoder_module_lists) == 1))
    ep_supported = bool(obs and facts.is_moe and obs.moe_blocks and all(b.experts_replaceable for _, b in obs.moe_blocks))
    serve = _serve_plan(analysis, verdict, mem, sizes, pp_supported, ep_supported)
    return {
        "schema_version": SCHEMA_VERSION,
        "hfcheck_version": version.__version__,
        "vllm_version_modelled": analysis.target.vllm,
        "transformers_version": _transformers_version(),
        "target": analysis.target.to_dict(),
        "verdict": verdict,
        "score": score,
        "model": _model_section(analysis, mem),
        "processor": analysis.processor.to_dict() if analysis.processor else None,
        "blockers": blockers,
        "checks": [_check(f) for f in findings],
        "modules": modules,
        "layers": layers,
        "moe": moe,
        "parallel": _parallel_section(obs, tp_plan, sizes, pp_supported, ep_supported),
        "memory": _memory_section(mem, serve.tp, serve.pp),
        "serve_command": serve.command,
        "serve": {"implementation": serve.implementation, "auto": facts.vllm_auto,
                  "note": serve_note(analysis, serve.implementation, blockers)},
        "missing_code": list(source.missing_code),
        "code_findings": code_findings(source),
        "analysis": _analysis_section(analysis),
        "timings_s": {k: round(v, 3) for k, v in analysis.timings.items()},
    }


def _check(finding: Finding) -> dict[str, Any]:
    """A finding as the report shows it, with the vLLM code its rule models (release predicted for)."""
    out = finding.to_dict()
    rule = BY_CODE.get(finding.code)
    if rule is not None and rule.vllm_source:
        out["vllm_source"] = cite_all(rule.vllm_source)
    return out


@dataclass(frozen=True)
class _TpSizes:
    """Each TP size's refusals and their scope, worked out once: ``parallel.tp`` and the serve sizing read them."""

    refusals: dict[int, list[str]]
    scopes: dict[int, str | None]
    working: list[int]


def _tp_sizes(analysis: Analysis) -> _TpSizes:
    """The TP sizes that load, and why (and by whom) the others are refused."""
    constraints = {size: tp_constraints(analysis, size) for size in V.TP_SIZES}
    refusals = {size: [reason for reason, _ in constraints[size]] for size in V.TP_SIZES}
    scopes = {size: refusal_scope(constraints[size]) for size in V.TP_SIZES}
    working = [s for s in V.TP_SIZES if not refusals[s]]
    return _TpSizes(refusals, scopes, working)


def _layers(analysis: Analysis) -> list[dict[str, Any]]:
    """Per layer, whether attention goes through the interface: observed where the tiny instance kept it, else assumed."""
    obs = analysis.observations
    layer_attention = obs.attention_by_layer if obs else {}
    # observations come from the tiny instance: where there are some, there is one
    kept = analysis.instance.kept_layers if analysis.instance is not None else 0
    return [
        {
            "index": i,
            "type": kind,
            "attention_interface": (i in layer_attention) if (obs and i < kept) else kind in V.SOFTMAX_LAYER_KINDS,
            "observed": bool(obs and i < kept),
        }
        for i, kind in enumerate(analysis.facts.layer_types)
    ]


def _modules(obs: Observations | None) -> list[dict[str, Any]]:
    """One entry per module class that fuses, reaches attention or is refused a fusion: rules judge classes."""
    modules: dict[str, dict[str, Any]] = {}
    for m in obs.modules if obs else []:
        if not (m.fusions or m.attention or m.refused or (m.rejected and m.linear_children)):
            continue
        entry = modules.setdefault(m.cls, {"class": m.cls, "fusions": [], "attention_interface": False, "not_fused": [], "trace": _trace_state(m)})
        _fold_module(entry, m)
    return list(modules.values())


def _fold_module(entry: dict[str, Any], m: ModuleObservation) -> None:
    """Fold one instance into its class's entry: a fusion some instance takes is no refusal of the class."""
    entry["fusions"] = sorted(set(entry["fusions"]) | set(m.fusions), key=V.FUSIONS.index)
    entry["attention_interface"] = entry["attention_interface"] or m.attention
    for name, reason in m.refused + m.rejected:
        item = {"fusion": name, "reason": reason}
        if name != "attention" and item not in entry["not_fused"] and name not in entry["fusions"] and not reason.startswith("a higher-priority"):
            entry["not_fused"].append(item)


def _moe(obs: Observations | None) -> list[dict[str, Any]]:
    """One entry per MoE block class: whether vLLM can take over its experts, and why not."""
    return [
        {
            "class": block.block_class,
            "experts_class": block.experts_class,
            "experts_replaceable": block.experts_replaceable,
            "internal_routing": block.internal_routing,
            "block_taken_over": block.block_taken_over,
            "reason": block.routing_reason if block.experts_replaceable else block.replace_reason,
        }
        for block in (obs.moe_classes() if obs else [])
    ]


def _tp_plan(obs: Observations | None) -> dict[str, Any] | None:
    """The model's declared TP plan, else the one vLLM's fusers would impose (None: neither)."""
    if obs is None:
        return None
    inferred = {} if obs.tp_plan else inferred_plan(obs)
    if obs.tp_plan or inferred:
        return {"source": "declared", "entries": obs.tp_plan} if obs.tp_plan else {"source": "inferred", "entries": inferred}
    return None


class _Serve(NamedTuple):
    """What the report suggests running; ``memory`` and ``serve`` both read it."""

    implementation: str | None
    tp: int | None
    pp: int
    command: str | None


def _serve_plan(analysis: Analysis, verdict: str, mem: MemoryEstimate | None, sizes: _TpSizes, pp_supported: bool, ep_supported: bool) -> _Serve:
    """The serve implementation and its parallelism: native vLLM is sized only against refusals every backend shares."""
    facts = analysis.facts
    implementation = serve_implementation(verdict, facts.vllm_native)
    if implementation == "native":  # sizes only the transformers backend refuses load natively
        tp, pp = suggested_parallelism(mem, [s for s in V.TP_SIZES if sizes.scopes[s] != ANY_BACKEND], True)
        command = serve_command(analysis, verdict, tp, pp, facts.is_moe, implementation)
    else:
        tp, pp = suggested_parallelism(mem, sizes.working, pp_supported)
        command = serve_command(analysis, verdict, tp, pp, ep_supported)
    return _Serve(implementation, tp, pp, command)


def _model_section(analysis: Analysis, mem: MemoryEstimate | None) -> dict[str, Any]:
    """Which model was scanned, from where, and what vLLM knows of its architecture."""
    facts, source = analysis.facts, analysis.source
    return {
        "ref": source.ref,
        "source": source.kind,
        "source_note": source.note,
        "revision": source.revision,
        "model_type": facts.model_type,
        "architectures": facts.architectures,
        "remote_code": bool(facts.auto_map),
        "vllm_native": facts.vllm_native,
        "vllm_native_mismatch": facts.vllm_native_mismatch,
        "parameters": mem.parameters if mem else None,
        "multimodal": facts.multimodal,
        "towers": facts.towers,
        "vllm_backend_class": backend_class(facts.architectures, facts.multimodal, facts.is_moe).name,
        "text_config_key": facts.text_config_key,
        "notes": list(facts.notes),
    }


def _parallel_section(obs: Observations | None, tp_plan: dict[str, Any] | None, sizes: _TpSizes, pp_supported: bool, ep_supported: bool) -> dict[str, Any]:
    """Which tensor, pipeline and expert parallel options the model supports, and why not."""
    return {
        "tp": {
            "plan": tp_plan,
            "sizes": {str(s): s in sizes.working for s in V.TP_SIZES},
            "refusals": {str(s): sizes.refusals[s] for s in V.TP_SIZES if sizes.refusals[s]},
            "refusal_scope": {str(s): sizes.scopes[s] for s in V.TP_SIZES if sizes.scopes[s]},
        },
        "pp": {"supported": pp_supported, "plan": (list(obs.pp_plan) if obs and obs.pp_plan else (obs.decoder_module_lists if obs else None))},
        "ep": {"supported": ep_supported},
    }


def _memory_section(mem: MemoryEstimate | None, tp: int | None, pp: int) -> dict[str, Any] | None:
    """The memory estimate behind the suggested parallelism (None: no instance to count)."""
    if not mem:
        return None
    return {
        "weights_gib": round(mem.weight_gib, 2),
        "kv_cache_gib_per_sequence": round(mem.kv_gib_per_sequence, 2),
        "context": mem.context,
        "assumed_gpu_gib": mem.gpu_gib,
        "suggested_tp": tp,
        "suggested_pp": pp,
    }


def _analysis_section(analysis: Analysis) -> dict[str, Any]:
    """How far the analysis got (tiny instance, graph), so a reader can weigh the checks."""
    return {
        "instance": analysis.instance.shrink if analysis.instance else None,
        "instance_error": analysis.instance_error,
        "vllm_build_problem": analysis.instance.vllm_build_problem if analysis.instance else None,
        "graph": analysis.observations is not None,
    }


def _trace_state(m) -> dict[str, Any]:
    """How far fx got through this class's forward (a partial graph is still matched)."""
    if m.trace_complete is None:
        return {"traced": False, "complete": False, "error": None}
    return {"traced": True, "complete": bool(m.trace_complete), "error": m.trace_error}


def serve_implementation(verdict: str, vllm_native: bool | None) -> str | None:
    """What the serve command runs: the transformers backend unless it refuses the model; then
    vLLM's native implementation where there is one; otherwise nothing."""
    if verdict != "blocked":
        return "transformers"
    return "native" if vllm_native else None


def serve_command(analysis: Analysis, verdict: str, tp: int | None, pp: int, ep: bool, implementation: str = "transformers") -> str | None:
    """``vllm serve`` for the transformers backend, or (``implementation="native"``) for vLLM's
    native implementation, which ``--model-impl auto`` (the default) picks."""
    if implementation == "transformers" and verdict == "blocked":
        return None
    ref = analysis.source.repo_id or analysis.source.location or analysis.source.ref
    parts = ["vllm", "serve", ref]
    if implementation == "transformers":
        if analysis.facts.vllm_auto != "listed":  # a listed architecture is served by the backend under the default auto
            parts += ["--model-impl", "transformers"]
        remote = bool(analysis.facts.auto_map)
    else:  # the native class is vLLM's own; only a config class transformers lacks is remote code
        remote = bool(analysis.facts.auto_map) and not analysis.facts.known_to_transformers
    if remote:
        parts.append("--trust-remote-code")
    if tp and tp > 1:
        parts += ["--tensor-parallel-size", str(tp)]
    if pp > 1:
        parts += ["--pipeline-parallel-size", str(pp)]
    if ep and tp and tp > 1:
        parts.append("--enable-expert-parallel")
    if analysis.facts.quant_method in tables(analysis.target.vllm)["quantization"]["deprecated"]:
        parts.append("--allow-deprecated-quantization")  # HFC701: refused without it
    return " ".join(parts)


def serve_note(analysis: Analysis, implementation: str | None, blockers: list[str]) -> str | None:
    """One sentence on why the command is not the transformers backend's, or why it needs no
    ``--model-impl`` (None: the backend's command, flag and all)."""
    facts = analysis.facts
    if implementation == "transformers":
        if facts.vllm_auto == "listed":
            return (f"vLLM {facts.vllm_table_version} lists {', '.join(facts.architectures)} to the transformers backend: the default "
                    "--model-impl auto serves it through the backend, so the command needs no --model-impl")
        return None
    why = "; ".join(blockers) or "a blocker check failed"
    archs = ", ".join(facts.architectures) or "this model"
    if implementation == "native":
        return (f"vLLM's native implementation of {archs} (vLLM {facts.vllm_table_version} registry; the default --model-impl auto "
                f"picks it); the transformers backend (--model-impl transformers) cannot serve it: {why}")
    native = ("and no architecture is named, so vLLM has no native implementation to use" if facts.vllm_native is None
              else f"and vLLM's native class of that name is not this model: {facts.vllm_native_mismatch}" if facts.vllm_native_mismatch
              else f"and vLLM {facts.vllm_table_version} lists {archs} to the transformers backend, so the default --model-impl auto "
                   "fails the same way" if facts.vllm_auto == "listed"
              else f"and vLLM has no native implementation of {archs} (vLLM {facts.vllm_table_version} registry)")
    return f"vLLM's transformers backend cannot serve it ({why}) {native}"


def _transformers_version() -> str:
    import transformers

    return transformers.__version__
