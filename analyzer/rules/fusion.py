"""Do the projections fuse the way vLLM's native models are fused?"""

from __future__ import annotations

from hfcheck.analyzer.findings.rule import Finding, ObservedRule

_PROJECTION_FUSIONS = {"qkv", "packed_qkv", "mla"}


def _why_not(module, wanted: set[str]) -> str:
    for name, reason in module.refused + module.rejected:
        if name in wanted:
            return f"{name}: {reason}"
    if module.trace_complete is False and module.trace_error:
        return f"the forward traced only partly ({module.trace_error})"
    if module.linear_children == 0:
        return "its projections are not nn.Linear children (e.g. Conv1D or a custom layer)"
    if module.linear_children == 1:
        return "one projection without a recognisable three-way split"
    return "its linears do not read the forward's input directly (e.g. a norm or reshape in between)"


class AttentionProjections(ObservedRule):
    code = "HFC301"
    name = "qkv-fusion"
    impact = "speed"
    what = "Each attention module's q/k/v projections fuse (`qkv`, `packed_qkv` or `mla`) and its output projection becomes row-parallel."
    why = (
        "vLLM's native models run one QKVParallelLinear GEMM sharded by heads. Unfused projections run "
        "as three separate (replicated) GEMMs: slower, and not sharded under tensor parallelism."
    )
    example = "GPT-2: c_attn is a Conv1D, not nn.Linear, so nothing fuses"
    fix = "Use three nn.Linear projections called once each on the forward's hidden_states (or one nn.Linear followed by .split((q, kv, kv), -1))."
    vllm_source = (
        "model_executor/models/transformers/fusers/qkv.py::QKVFuser",
        "model_executor/models/transformers/fusers/packed_qkv.py::PackedQKVFuser",
        "model_executor/models/transformers/fusers/mla.py::MLAFuser",
    )

    without_instance = "no instance to trace"

    def check_observed(self, analysis, obs) -> list[Finding]:
        attn = {m.cls: m for m in obs.modules if m.attention}
        if not attn:
            return [self.inconclusive("no attention module to check")]
        out = []
        for cls, m in attn.items():
            fused = _PROJECTION_FUSIONS & set(m.fusions)
            if fused:
                name = next(iter(fused))
                row = m.row_parallel.get(name)
                out.append(self.passed(f"{cls}: {name} fuses {' + '.join(m.projections.get(name, ()))}" + (f", {row} row-parallel" if row else ""), module=cls))
            else:
                out.append(self.failed(f"{cls}: q/k/v do not fuse: {_why_not(m, _PROJECTION_FUSIONS | {'merged_column'})}", module=cls))
        return out


def _looks_like_mlp(m) -> bool:
    if m.attention or m.linear_children < 2:
        return False
    name = m.cls.lower()
    return any(s in name for s in ("mlp", "feedforward", "ffn", "expert")) or "glu" in {n for n, _ in m.refused + m.rejected}


class GatedMLP(ObservedRule):
    code = "HFC302"
    name = "glu-fusion"
    impact = "speed"
    what = "Gated MLPs `act(gate(x)) * up(x)` fuse into `gate_up_proj` + a fused act-and-mul kernel, with a row-parallel down projection."
    why = "Unfused, gate and up run as two replicated GEMMs plus an unfused activation: slower than native and not sharded under TP."
    example = (
        "an activation without a fused kernel (e.g. relu2) or gate/up of different sizes: no glu. "
        "CLIPMLP / SiglipMLP (fc1 -> act -> fc2, no gate): nothing to fuse, noted only"
    )
    fix = "Call `self.act_fn(self.gate_proj(x)) * self.up_proj(x)` with an ACT2FN activation that has a fused kernel (silu, gelu, gelu_pytorch_tanh) and equal gate/up sizes."
    vllm_source = (
        "model_executor/models/transformers/fusers/glu.py::GLUFuser.match",
        "model_executor/models/transformers/fusers/glu.py::GLUFuser.validate",
        "model_executor/models/transformers/fusers/merged_column.py::MergedColumnParallelFuser",
    )

    without_instance = "no instance to trace"

    def check_observed(self, analysis, obs) -> list[Finding]:
        out = []
        for m in obs.module_classes(_looks_like_mlp):
            if m.linears_share_input is False and not m.fusions:
                out.append(self.noted(f"{m.cls}: no gate (each linear reads the previous one's output): nothing to fuse", module=m.cls))
            elif "glu" in m.fusions:
                out.append(self.passed(f"{m.cls}: glu fuses {' + '.join(m.projections['glu'])}", module=m.cls))
            elif "merged_column" in m.fusions:
                out.append(self.warned(f"{m.cls}: only merged_column ({_why_not(m, {'glu'})})", module=m.cls))
            else:
                out.append(self.failed(f"{m.cls}: gate/up do not fuse: {_why_not(m, {'glu', 'merged_column'})}", module=m.cls))
        if not out:
            out.append(self.noted("no dense MLP module with two or more projections"))
        return out


class RMSNormDetected(ObservedRule):
    code = "HFC303"
    name = "rms-norm-fusion"
    impact = "speed"
    what = "Every RMSNorm is recognised by its dataflow and replaced by vLLM's fused (TP-aware) RMSNorm."
    why = "vLLM warns '<X>RMSNorm looks like an RMSNorm but its computation did not match' and runs the slow eager norm."
    example = "a norm computing in a helper function, or with extra work after the weight multiply"
    fix = "Write the norm as `x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)` times `self.weight` (or `1 + self.weight`) and return it."
    vllm_source = (
        "model_executor/models/transformers/fuser.py::get_fusers",
        "model_executor/models/transformers/fusers/rms_norm.py::RMSNormFuser.match",
    )

    without_instance = "no instance to trace"

    def check_observed(self, analysis, obs) -> list[Finding]:
        out = []
        for m in obs.module_classes(lambda m: m.cls.endswith("RMSNorm")):
            if "rms_norm" in m.fusions:
                out.append(self.passed(f"{m.cls} matches the RMSNorm dataflow", module=m.cls))
            else:
                out.append(self.failed(f"{m.cls} looks like an RMSNorm but does not match the pattern" + (f" (trace: {m.trace_error})" if m.trace_error else ""), module=m.cls))
        return out or [self.noted("no class named *RMSNorm")]
