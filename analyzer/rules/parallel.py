"""Tensor and pipeline parallel: the plans vLLM will use and the sizes that work."""

from __future__ import annotations

import re

from torch import nn

from hfcheck.analyzer.findings.rule import Finding, ObservedRule, Rule
from hfcheck.analyzer.terms import vocabulary as V


def inferred_plan(obs) -> dict[str, str]:
    """The plan vLLM's fusers impose: fused projections colwise, their consumers rowwise."""
    plan: dict[str, str] = {}
    for m in obs.modules:
        for fusion, projections in m.projections.items():
            if fusion in ("qkv", "packed_qkv", "glu", "merged_column", "mla"):
                for p in projections:
                    plan[_generic(f"{m.path}.{p}")] = "colwise"
        for row in m.row_parallel.values():
            plan[_generic(f"{m.path}.{row}")] = "rowwise"
    return plan


def _generic(path: str) -> str:
    return re.sub(r"\.\d+\.", ".*.", path)


def replicated_linears(analysis, plan: dict[str, str]) -> list[str]:
    """Linears of the built model that neither the plan nor FusedMoE shards (generic paths).
    MoE routers are left out: native implementations replicate them too."""
    obs, inst, facts = analysis.observations, analysis.instance, analysis.facts
    experts = tuple(f"{path}.experts." for path, block in obs.moe_blocks if block.experts_replaceable)
    left = set()
    for name, module in inst.model.named_modules():
        if not isinstance(module, nn.Linear) or name.startswith(experts):
            continue
        if facts.is_moe and module.out_features == facts.num_experts:
            continue
        if _generic(name) not in plan:
            left.add(_generic(name))
    return sorted(left)


ANY_BACKEND, THIS_BACKEND = "any-backend", "transformers-backend"
"""Who refuses a TP size: every vLLM implementation of the model, native included (a property
of the model's geometry), or only the transformers backend (a loss against native vLLM)."""


def tp_constraints(analysis, size: int) -> list[tuple[str, str]]:
    """Why TP ``size`` cannot load, each reason with its scope (empty when it loads).

    ``ANY_BACKEND``: vLLM refuses it whatever implements the model. The head count is checked
    by ``ModelConfig.verify_with_parallel_config`` for every model; KV-head replication,
    gate/up (MergedColumnParallelLinear) and expert (FusedMoE) sizes are the same layers a
    native implementation shards. ``THIS_BACKEND``: a merge only the transformers backend makes
    (``merged_column`` over arbitrary sibling linears)."""
    facts, reasons = analysis.facts, []
    heads, kv = facts.num_heads, facts.num_kv_heads
    if isinstance(heads, int) and heads > 0 and heads % size:
        reasons.append((f"{heads} attention heads do not divide by {size}", ANY_BACKEND))
    if isinstance(kv, int) and kv > 0 and not facts.uses_mla:
        if size >= kv and size % kv:
            reasons.append((f"TP {size} is not a multiple of {kv} KV heads (needed to replicate them)", ANY_BACKEND))
        elif size < kv and kv % size:
            reasons.append((f"{kv} KV heads do not divide by {size}", ANY_BACKEND))
    if facts.is_moe and isinstance(facts.moe_intermediate_size, int) and facts.moe_intermediate_size % size:
        reasons.append((f"expert intermediate size {facts.moe_intermediate_size} does not divide by {size}", ANY_BACKEND))
    obs, inst = analysis.observations, analysis.instance
    if obs is not None and inst is not None:
        for m in obs.modules:
            for fusion, scope in (("glu", ANY_BACKEND), ("merged_column", THIS_BACKEND)):
                for p in m.projections.get(fusion, ()):
                    out = inst.model.get_submodule(f"{m.path}.{p}" if m.path else p).out_features
                    if out % size:
                        reasons.append((f"{m.cls}.{p} ({out} outputs, merged) does not divide by {size}", scope))
    return sorted(set(reasons))


def tp_refusals(analysis, size: int) -> list[str]:
    """Why TP ``size`` cannot load (empty when it can), whoever refuses it."""
    return [reason for reason, _ in tp_constraints(analysis, size)]


def refusal_scope(constraints: list[tuple[str, str]]) -> str | None:
    """``THIS_BACKEND`` when the transformers backend alone refuses for any reason, else
    ``ANY_BACKEND``; None when nothing refuses."""
    if not constraints:
        return None
    return THIS_BACKEND if any(scope == THIS_BACKEND for _, scope in constraints) else ANY_BACKEND


class TensorParallelPlan(ObservedRule):
    code = "HFC501"
    name = "tp-plan"
    impact = "parallel"
    what = "A tensor-parallel plan exists: declared (`base_model_tp_plan`) or inferred from the fusions and their row-parallel consumers."
    why = "Without a plan, vLLM (>= 0.25) warns and replicates every linear the fusers did not shard: TP > 1 loads but gains little."
    example = "a remote-code model with no base_model_tp_plan and no fused projections"
    fix = "Declare `base_model_tp_plan` on the config class (q/k/v/gate/up colwise, o/down rowwise), or make the projections fuse."
    vllm_source = (
        "model_executor/models/transformers/base.py::Base._tp_plan",
        "model_executor/models/transformers/base.py::Base.recursive_replace",
        "model_executor/models/transformers/utils.py::replace_linear_class",
    )

    without_instance = "no instance to read the plan from"

    def check_observed(self, analysis, obs) -> list[Finding]:
        if obs.tp_plan:
            out = [self.passed(f"declared tp plan with {len(obs.tp_plan)} entries", plan="declared")]
            linears = [(n, mod) for n, mod in analysis.instance.model.named_modules() if isinstance(mod, nn.Linear)]
            fused = {f"{m.path}.{p}" for m in obs.modules for ps in m.projections.values() for p in ps}
            replicated = set()
            for name, _ in linears:
                if name in fused:
                    continue
                style = next((s for pat, s in obs.tp_plan.items() if re.match(pat, name)), None)
                if style is not None and style not in V.TP_STYLES_SHARDED:
                    replicated.add(f"{_generic(name)} ({style})")
            if replicated:
                out.append(self.warned(f"vLLM silently replicates linears with styles it does not shard: {', '.join(sorted(replicated)[:5])}", "Use colwise/rowwise styles for linears vLLM should shard."))
            return out
        plan = inferred_plan(obs)
        if not plan:
            return [self.failed("no tp plan and nothing fuses: every linear is replicated under TP", plan=None)]
        left = replicated_linears(analysis, plan)
        if not left:  # the fusers shard every projection, as a native implementation would
            return [self.passed(f"no declared tp plan; the fusers shard every projection ({len(plan)}), so nothing is left replicated", plan="inferred")]
        return [self.warned(f"no declared tp plan; vLLM shards what it fuses ({len(plan)} projections) and replicates the rest: {', '.join(left[:5])}", plan="inferred")]


class TensorParallelSizes(Rule):
    code = "HFC502"
    name = "tp-sizes"
    impact = "parallel"
    what = "For TP sizes 1, 2, 4 and 8: attention heads, KV heads and merged projection sizes divide as vLLM requires."
    why = (
        "vLLM refuses a TP size whose head count does not divide; KV heads are replicated when TP >= num_kv_heads (TP must "
        "then be a multiple). Those limits come from the model's shape and hold for vLLM's native implementation too, so "
        "they are listed (info), not counted against the transformers backend; only a refusal the native path would not "
        "make (a merge only this backend makes) is a warning."
    )
    example = "14 heads: TP 4 and 8 are refused, by the native implementation as well (info)"
    fix = "Pick a TP size from the working list, or combine TP with pipeline parallelism."
    vllm_source = (
        "config/model.py::ModelConfig.verify_with_parallel_config",
        "model_executor/layers/linear.py::QKVParallelLinear.__init__",
        "model_executor/layers/linear.py::MergedColumnParallelLinear.__init__",
    )

    def check(self, analysis) -> list[Finding]:
        out, ok = [], []
        for size in V.TP_SIZES:
            constraints = tp_constraints(analysis, size)
            if not constraints:
                ok.append(size)
                continue
            reasons = "; ".join(reason for reason, _ in constraints)
            if refusal_scope(constraints) == ANY_BACKEND:
                out.append(self.noted(f"TP {size}: not possible with any vLLM backend, native included ({reasons})", size=size, scope=ANY_BACKEND))
            else:
                mine = "; ".join(reason for reason, scope in constraints if scope == THIS_BACKEND)
                shared = "; ".join(reason for reason, scope in constraints if scope == ANY_BACKEND)
                also = f"; also, for any backend: {shared}" if shared else ""
                out.append(self.warned(f"TP {size}: refused by the transformers backend ({mine}){also}", size=size, scope=THIS_BACKEND))
        out.insert(0, self.passed(f"TP sizes that load: {', '.join(map(str, ok)) or 'none'}", sizes=ok))
        return out


class PipelineParallel(ObservedRule):
    code = "HFC601"
    name = "pp-plan"
    impact = "parallel"
    what = "Pipeline parallel: a declared `base_model_pp_plan`, or a decoder with exactly one ModuleList vLLM can split."
    why = "vLLM refuses PP > 1 for 'models with multiple `ModuleList`s in the base model' or none at all."
    example = "a decoder holding `layers` and `mamba_layers` ModuleLists: PP refused"
    fix = "Keep all decoder layers in one nn.ModuleList and declare `base_model_pp_plan` on the config class."
    vllm_source = ("model_executor/models/transformers/base.py::Base.pipeline_parallel",)

    without_instance = "no instance to inspect"

    def check_observed(self, analysis, obs) -> list[Finding]:
        if obs.pp_plan:
            return [self.passed(f"declared pp plan: {', '.join(obs.pp_plan)}", plan=list(obs.pp_plan))]
        lists = obs.decoder_module_lists
        if len(lists) == 1:  # PP works as on the native path; vLLM only logs a warning
            return [self.passed(f"no declared pp plan; vLLM infers the split from {obs.decoder_class}.{lists[0]} (it logs a warning at load)", plan=lists)]
        if not lists:
            return [self.failed(f"no ModuleList in {obs.decoder_class}: pipeline parallel refused")]
        return [self.failed(f"{len(lists)} ModuleLists in {obs.decoder_class} ({', '.join(lists)}): pipeline parallel refused")]
