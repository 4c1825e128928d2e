"""Does every decoder layer dispatch attention through the transformers interface?"""

from __future__ import annotations

from hfcheck.analyzer.facts.runner import is_mm_prefix_lm
from hfcheck.analyzer.findings.rule import Finding, ObservedRule, Rule
from hfcheck.analyzer.terms import vocabulary as V

_SSM_BESIDE_ATTENTION = frozenset({"hybrid", "hybrid_sliding"})


class AttentionCoverage(Rule):
    code = "HFC201"
    name = "attention-coverage"
    impact = "blocker"
    what = "Every decoder layer has exactly one module that calls the attention interface and carries an int `layer_idx`."
    why = (
        "vLLM allocates one attention layer (and its KV cache) per decoder layer from these modules. "
        "A layer without one fails at load: 'Layer i (type) does not dispatch through the Transformers "
        "attention interface and vLLM has no other way to handle it.' This is what refuses linear "
        "attention, SSM/Mamba, convolution and recurrent layers. Two dispatching modules in one layer also fail."
    )
    example = "Qwen3-Next: layers 0-2 of every 4 are linear attention (Gated DeltaNet): blocked"
    fix = "Only softmax attention (full / sliding / chunked) is served; a model with other layer kinds needs a native vLLM implementation."
    vllm_source = (
        "model_executor/models/transformers/base.py::Base._create_attention_instances",
        "model_executor/models/transformers/base.py::Base.recursive_replace",
        "model_executor/models/transformers/fusers/attention.py::AttentionFuser.layer_index",
    )

    def check(self, analysis) -> list[Finding]:
        facts = analysis.facts
        kinds = facts.layer_types
        other = [(i, k) for i, k in enumerate(kinds) if k not in V.SOFTMAX_LAYER_KINDS and k not in _SSM_BESIDE_ATTENTION]
        findings: list[Finding] = []
        if other:
            findings.append(
                self.failed(
                    f"{len(other)} of {len(kinds)} layers do not use softmax attention: {_by_kind(other)}",
                    blocking_layers=[{"index": i, "type": k} for i, k in other],
                )
            )
        obs = analysis.observations
        if obs is None:
            if not findings:
                findings.append(self.inconclusive("no instance to walk; config says every layer is softmax attention"))
            return findings
        built = analysis.instance.kept_layers
        missing = [i for i in range(built) if i not in obs.attention_by_layer]
        doubled = {i: paths for i, paths in obs.attention_by_layer.items() if len(paths) > 1}
        if missing and not other:
            reason = _missing_reason(obs)
            findings.append(
                self.failed(
                    f"layers {', '.join(map(str, missing[:8]))} of the tiny instance have no module dispatching through the attention interface{reason}",
                    blocking_layers=[{"index": i, "type": kinds[i] if i < len(kinds) else "unknown"} for i in missing],
                )
            )
        for i, paths in doubled.items():
            findings.append(self.failed(f"layer {i} dispatches attention from more than one module ({', '.join(paths)})"))
        if not findings:
            findings.append(self.passed(f"all {len(kinds)} layers dispatch through the attention interface once ({_count(kinds)})"))
        return findings


def _missing_reason(obs) -> str:
    unindexed = [m.path for m in obs.modules if m.attention and m.layer_idx is None]
    if unindexed:
        return f" (dispatching modules without an int layer_idx: {', '.join(unindexed[:3])})"
    rejected = [m.path for m in obs.modules if any(n == "attention" for n, _ in m.rejected)]
    if rejected:
        return f" ({rejected[0]} dispatches but its config is not the patched text config)"
    return " (attention is written by hand or called directly, e.g. F.scaled_dot_product_attention)"


def _by_kind(layers: list[tuple[int, str]], shown: int = 10) -> str:
    """``linear_attention layers 0, 1, 2, ... (+28)``, one group per kind."""
    groups: dict[str, list[int]] = {}
    for i, k in layers:
        groups.setdefault(k, []).append(i)
    parts = []
    for kind, idx in groups.items():
        more = f", ... (+{len(idx) - shown})" if len(idx) > shown else ""
        parts.append(f"{kind} layers {', '.join(map(str, idx[:shown]))}{more}")
    return "; ".join(parts)


def _count(kinds) -> str:
    counts: dict[str, int] = {}
    for k in kinds:
        counts[k] = counts.get(k, 0) + 1
    return ", ".join(f"{n} {k}" for k, n in counts.items())


class UnmanagedStateSpace(Rule):
    code = "HFC202"
    name = "ssm-beside-attention"
    impact = "blocker"
    what = "Layers that run an SSM (Mamba) mixer beside attention in the same layer (`hybrid`)."
    why = (
        "Falcon-H1-style layers pass vLLM's attention-coverage gate (the attention dispatches) but the SSM "
        "half runs unmanaged: no state cache, no batching across requests. Treat as unsupported."
    )
    example = "falcon_h1: every layer is `hybrid` (attention + Mamba2 in parallel)"
    fix = "Serve it with a native vLLM implementation (`--model-impl auto`) where one exists."
    vllm_source = ("model_executor/models/transformers/base.py::Base._create_attention_instances",)

    def check(self, analysis) -> list[Finding]:
        hybrid = [i for i, k in enumerate(analysis.facts.layer_types) if k in _SSM_BESIDE_ATTENTION]
        if hybrid:
            return [self.failed(f"{len(hybrid)} layers run an SSM beside attention that vLLM leaves unmanaged", blocking_layers=[{"index": i, "type": analysis.facts.layer_types[i]} for i in hybrid])]
        return [self.passed("no SSM mixer beside attention")]


class MLAHeadSize(Rule):
    code = "HFC205"
    name = "mla-head-size"
    impact = "blocker"
    what = "A model whose attention fuses as MLA has a head size vLLM's MLA attention accepts (320, 512 or 576)."
    why = (
        "With `kv_lora_rank` in the config and MLA fused, vLLM runs MLAAttention, whose metadata refuses any "
        "head size outside its kernels' list at the first forward ('Head dimension 64 is not supported by MLA'), "
        "on GPU and CPU alike. vLLM computes the head size as kv_lora_rank + qk_rope_head_dim only for the "
        "DeepSeek family of model types it lists; any other MLA model gets its config's head_dim, which "
        "transformers' MLA configs set to the rope part (32 or 64)."
    )
    example = "minicpm3: MLA fuses, head_dim = qk_rope_head_dim = 32: vLLM fails at start"
    fix = (
        "Serve it with vLLM's native implementation where one exists (`--model-impl auto`); for the transformers "
        "backend vLLM has to list the model type with its DeepSeek-style MLA models."
    )
    vllm_source = (
        "model_executor/layers/attention/mla_attention.py::MLACommonMetadata.__post_init__",
        "transformers_utils/model_arch_config_convertor.py::ModelArchConfigConvertorBase.get_head_size",
        "transformers_utils/model_arch_config_convertor.py::ModelArchConfigConvertorBase.is_deepseek_mla",
    )

    def check(self, analysis) -> list[Finding]:
        from hfcheck.analyzer.fusions.mla import refused_head_size

        facts = analysis.facts
        if not facts.uses_mla:
            return []  # no kv_lora_rank: vLLM does not use MLA
        size = refused_head_size(facts)
        obs = analysis.observations
        if size is None:
            return [self.passed(f"MLA head size {facts.kv_lora_rank} + {facts.qk_rope_head_dim} is one vLLM's MLA kernels take")]
        if obs is None:
            return [self.inconclusive(f"head size {size} is refused by vLLM's MLA attention if MLA fuses; no instance to trace")]
        fused = sorted({m.cls for m in obs.modules if "mla" in m.fusions})
        if not fused:
            return [self.passed(f"MLA does not fuse, so vLLM falls back to full attention (head size {size} is not checked)")]
        return [self.failed(
            f"{fused[0]} fuses as MLA, but vLLM reads head size {size} for model type {facts.text_model_type!r} "
            "(not one of its DeepSeek-style MLA types), and its MLA attention takes only 320, 512 or 576: "
            "vLLM fails at the first forward",
        )]


class ValueHeadSize(Rule):
    code = "HFC206"
    name = "attention-value-head-size"
    impact = "blocker"
    what = "Values have the head size of keys: the key and value projections are equally wide."
    why = (
        "vLLM builds each attention layer with one head size for queries, keys and values (the transformers "
        "backend passes no separate value head size), views values as kv_heads x head_dim and returns num_heads x "
        "head_dim features per token. A model whose values are narrower or wider (v_head_dim != head_dim) fails at "
        "the first forward: its output projection gets another width (\"shape '[-1, 2048]' is invalid for input of "
        "size 512\", measured on MiMo-V2-Flash with vLLM 0.32). MLA is exempt: vLLM's MLA layer takes v_head_dim."
    )
    example = "MiMo-V2-Flash: k_proj -> kv_heads x 192, v_proj -> kv_heads x 128"
    fix = "Serve it with vLLM's native implementation where one exists (`--model-impl auto`)."
    vllm_source = (
        "model_executor/models/transformers/base.py::Base._create_attention_instances",
        "model_executor/models/transformers/__init__.py::vllm_attention_forward",
        "model_executor/layers/attention/attention.py::Attention.forward",
    )

    def check(self, analysis) -> list[Finding]:
        obs = analysis.observations
        if obs is None or analysis.facts.uses_mla:
            return []
        judged = obs.module_classes(lambda m: m.attention and m.key_value_widths is not None)
        for m in judged:
            keys, values = m.key_value_widths
            if keys != values:
                return [self.failed(
                    f"{m.cls}'s key projection makes {keys} features and its value projection {values}: values have "
                    "another head size than keys, and vLLM, which gives both one head size, fails at the first forward",
                    module=m.cls,
                )]
        if not judged:
            return [self.noted("not judged: no attention module whose keys and values come from linears of their own")] if obs.attention_by_layer else []
        return [self.passed("keys and values have one head size, as vLLM's attention has")]


class AttentionArguments(ObservedRule):
    code = "HFC203"
    name = "attention-arguments-resolvable"
    impact = "blocker"
    what = "The `scaling=` (and `s_aux=`) passed to the attention interface is a literal or a numeric `self.<attr>`."
    why = "vLLM reads the softmax scale and attention sinks from the forward's source; anything else raises 'Cannot resolve attention scaling expression'."
    example = "attention_interface(self, q, k, v, mask, scaling=self.head_dim ** -0.5)   # an expression: refused"
    fix = "Store the scale on the module in __init__ (`self.scaling = self.head_dim ** -0.5`) and pass `scaling=self.scaling`."
    vllm_source = (
        "model_executor/models/transformers/fusers/attention.py::AttentionFuser.scale",
        "model_executor/models/transformers/fusers/attention.py::AttentionFuser.sinks",
        "model_executor/models/transformers/fusers/attention.py::AttentionFuser.match",
    )

    without_instance = "no instance to read"

    def check_observed(self, analysis, obs) -> list[Finding]:
        if obs.attention_problems:
            return [self.failed("; ".join(obs.attention_problems[:3]))]
        sinks = [m.cls for m in obs.modules if m.sinks]
        extra = f"; attention sinks (s_aux) on {sinks[0]}" if sinks else ""
        return [self.passed("attention scale and sinks resolve" + extra, sinks=bool(sinks))]


class EncoderModels(Rule):
    code = "HFC204"
    name = "encoder-decoder"
    impact = "blocker"
    what = (
        "Encoder-decoder models are refused; a text model with a non-causal attention module (is_causal = False) is "
        "served with encoder-only attention, which cannot generate. Multimodal models are not: their towers may be "
        "bidirectional, and their language model gets decoder attention."
    )
    why = (
        "vLLM's transformers backend (`Base._get_attn_cls`) returns EncoderOnlyAttention when `has_encoder(model) and not "
        "is_multimodal`, with `is_multimodal` `config != config.get_text_config()` in 0.32 and 0.33 and "
        "`model_config.is_multimodal_model` in 0.34 (the same answer for a model the backend serves itself; 0.34 also serves "
        "native PaliGemma's Gemma language model through the backend, as a view of a multimodal model): "
        "any module with is_causal = False makes a *text* model encoder-only. A multimodal model always gets causal "
        "decoder attention for its language model, so a bidirectional language model there is computed causally; where "
        "vLLM serves the type as a multimodal prefix LM (`is_mm_prefix_lm`: PaliGemma, Gemma 3, Molmo 2, Bagel, Moondream 3, "
        "or a config that sets it) only image tokens attend both ways (measured on PaliGemma in transformers 5.19: its "
        "earlier positions see later text tokens of the prompt)."
    )
    example = "t5, bart (is_encoder_decoder: true): refused; Gemma 3 (bidirectional SigLIP tower): decoder attention, served"
    fix = "Use a decoder-only checkpoint, or a native vLLM implementation where one exists."
    vllm_source = (
        "model_executor/models/transformers/base.py::Base._get_attn_cls",
        "config/model.py::ModelConfig.is_multimodal_model",
        "config/model.py::ModelConfig.is_mm_prefix_lm",
    )

    def check(self, analysis) -> list[Finding]:
        facts = analysis.facts
        if facts.is_encoder_decoder:
            return [self.failed("encoder-decoder model: vLLM's transformers backend does not support it")]
        from hfcheck.analyzer.instance import generates

        obs = analysis.observations
        if obs is None or not obs.encoder_attention:
            return [self.passed("decoder-only")]
        if facts.multimodal:
            return self._multimodal(obs, is_mm_prefix_lm(facts.model_type, analysis.source.config))
        if generates(analysis.transformers_class):
            return [self.failed(
                f"{analysis.transformers_class.__name__} generates, but {obs.encoder_attention[0]} has is_causal = False: vLLM "
                "serves the model with encoder-only attention, which keeps no KV cache, and generation stops at start "
                "('requires at least one cacheable group')",
                "Set is_decoder = True in config.json (causal attention), or serve the base model for pooling.",
            )]
        return [self.noted(f"encoder-only: {obs.encoder_attention[0]} has is_causal = False; served with encoder attention (pooling, not generation)")]

    def _multimodal(self, obs, prefix_lm: bool) -> list[Finding]:
        components = {m.path: m.component for m in obs.modules}
        attention = {m.path for m in obs.modules if m.attention}
        in_language = [p for p in obs.encoder_attention if components.get(p) is None and p in attention]
        if in_language and prefix_lm:
            return [self.failed(
                f"{in_language[0]} (language model) has is_causal = False: vLLM serves the type as a multimodal prefix LM, "
                "but its bidirectional attention covers each image's tokens only (is_mm_prefix_lm; FlashAttention, Triton and "
                "FlexAttention backends, not the CPU build's), while transformers' attends both ways over the whole prompt: "
                "its outputs differ from transformers'",
                "Serve it with vLLM's native implementation, or make the language model causal.",
            )]
        if in_language:
            return [self.failed(
                f"{in_language[0]} (language model) has is_causal = False, but vLLM gives a multimodal model's language "
                "model causal decoder attention: its outputs differ from transformers'",
                "Serve it with a native vLLM implementation, or make the language model causal.",
            )]
        towers = sorted({components[p] for p in obs.encoder_attention if components.get(p)})
        where = f"only in {', '.join(towers)}" if towers else "outside the language model's attention"
        return [self.passed(f"multimodal: bidirectional modules {where}; vLLM gives the language model decoder attention")]
