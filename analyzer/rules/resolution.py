"""Can vLLM find and accept a transformers implementation of this model at all?"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from typing import Any

from hfcheck.analyzer.facts.config_fields import text_config_of
from hfcheck.analyzer.findings.rule import Finding, Rule
from hfcheck.analyzer.remote.ast_helpers import passes_source_test
from hfcheck.analyzer.vllm.release import tables


def source_gate(cls: type) -> bool:
    """transformers' ``_can_set_attn_implementation`` heuristic, read without caching on the class."""
    module = sys.modules.get(cls.__module__)
    if module is None:
        return False
    try:
        code = inspect.getsource(module)
    except (OSError, TypeError):
        return False
    return passes_source_test(code)


class ClassResolution(Rule):
    code = "HFC101"
    name = "transformers-class-found"
    impact = "blocker"
    what = "config.architectures names a class transformers exports, or auto_map names an AutoModel class."
    why = (
        "vLLM's transformers backend resolves `getattr(transformers, architecture)`, then the "
        "config's auto_map. Neither: 'Cannot find model module ... not a registered model in the "
        "Transformers library'."
    )
    example = '"architectures": ["MyNewLMForCausalLM"]   # not in transformers, no auto_map'
    fix = "Publish the modeling code with the model and name it in config.json's auto_map (AutoConfig, AutoModel, AutoModelForCausalLM)."
    vllm_source = ("model_executor/models/registry.py::_ModelRegistry._try_resolve_transformers",)

    def check(self, analysis) -> list[Finding]:
        facts = analysis.facts
        if analysis.class_origin == "transformers":
            return [self.passed(f"{analysis.transformers_class.__name__} is a transformers class")]
        if analysis.class_origin == "auto_map":
            return [self.passed("auto_map names the model classes (remote code: needs --trust-remote-code)", remote=True)]
        archs = ", ".join(facts.architectures) or "(none)"
        return [self.failed(f"no transformers class for {archs} and no AutoModel entry in auto_map")]


class CompatibilityGate(Rule):
    code = "HFC102"
    name = "backend-compatibility-gate"
    impact = "blocker"
    what = "The class sets `_supports_attention_backend = True`, or its modeling module passes transformers' source test."
    why = (
        "vLLM checks `cls.is_backend_compatible() or cls._can_set_attn_implementation()`; the source "
        "test fails when the module defines `class *Attention*(nn.Module)` without calling "
        "`ALL_ATTENTION_FUNCTIONS.get_interface(`. Failing: 'The Transformers implementation of X is not compatible with vLLM.' "
        "The gate is asked by `_try_resolve_transformers` only: an architecture the registry lists to the backend "
        "(`_TRANSFORMERS_SUPPORTED_MODELS`) is built under `--model-impl auto` without it."
    )
    vllm_source = ("model_executor/models/registry.py::_ModelRegistry._try_resolve_transformers",)
    example = "class MyPreTrainedModel(PreTrainedModel):\n    _supports_attention_backend = False   # and attention written by hand"
    fix = "Dispatch attention through ALL_ATTENTION_FUNCTIONS.get_interface(...) and set `_supports_attention_backend = True` on the PreTrainedModel subclass."

    def check(self, analysis) -> list[Finding]:
        cls = analysis.transformers_class
        gate = getattr(analysis.sandbox, "gate_passes", None)
        if cls is None and gate is not None:
            if gate:
                return [self.passed("the remote model class passes the gate (checked in the sandbox)")]
            return [self.failed("the remote model class neither sets _supports_attention_backend nor dispatches via get_interface (checked in the sandbox)")]
        if cls is None:
            if analysis.class_origin == "auto_map":
                return [self.inconclusive("remote class not imported (untrusted code is never executed)")]
            return [self.inconclusive("no class to test")]
        if getattr(cls, "_supports_attention_backend", False):
            return [self.passed(f"{cls.__name__}._supports_attention_backend is True")]
        if source_gate(cls):
            return [self.passed(f"{cls.__name__}'s module passes the source test (interface dispatch found)")]
        refused = f"{cls.__name__} neither sets _supports_attention_backend nor dispatches via get_interface"
        if analysis.facts.vllm_auto == "listed":  # auto takes the registry's backend class without asking the gate
            return [self.warned(f"{refused}: `--model-impl transformers` refuses it, while the default `--model-impl auto` (vLLM "
                                f"{analysis.facts.vllm_table_version} lists the architecture to the backend) builds it without asking")]
        return [self.failed(refused)]


class NativeImplementation(Rule):
    code = "HFC103"
    name = "vllm-native-implementation"
    impact = "info"
    what = "What vLLM's registry does with the architecture under `--model-impl auto` (the default), in the release predicted for."
    why = (
        "With `--model-impl auto`, vLLM uses its native class when it has one, serves the architectures its registry lists "
        "to the transformers backend (`_TRANSFORMERS_SUPPORTED_MODELS`) through the backend, and falls back to the backend "
        "for a name it does not know. Releases move architectures between these (0.34 lists Gemma, OLMoE, StableLM and Aria "
        "to the backend). hfcheck analyses the transformers backend (`--model-impl transformers`); a native class is an "
        "alternative, not a requirement."
    )
    vllm_source = ("model_executor/models/registry.py::_ModelRegistry.inspect_model_cls",
                   "model_executor/models/registry.py::_TRANSFORMERS_SUPPORTED_MODELS")
    example = "Qwen3ForCausalLM: native in vLLM; GemmaForCausalLM (0.34): listed to the backend; MyLMForCausalLM: transformers backend only"
    fix = "Nothing to fix; pass --model-impl transformers to use the backend analysed here."

    def check(self, analysis) -> list[Finding]:
        facts = analysis.facts
        return [self.noted(facts.vllm_auto_note, auto=facts.vllm_auto)]


MODELLED_FEATURES: dict[str, Callable[[Any], bool]] = {
    "Aria": lambda analysis: analysis.facts.model_type == "aria",
    "video inputs": lambda analysis: bool(analysis.processor and "video" in analysis.processor.modalities),
    "MTP": lambda analysis: False,  # speculative decoding with the model's own MTP layers: not part of a scan
}
"""The features of the backend's ``check_version(minimum, feature)`` calls hfcheck knows how to
recognise in a model (a release drill lists any other as not modelled)."""


def backend_minimums(analysis) -> list[tuple[dict, bool | None]]:
    """The release's ``check_version(minimum, feature)`` calls (its tables), each with whether it
    applies to this model (None: a feature hfcheck does not model)."""
    entries = tables(analysis.target.vllm).get("backend_min_transformers", [])
    return [(entry, MODELLED_FEATURES[entry["feature"]](analysis) if entry["feature"] in MODELLED_FEATURES else None) for entry in entries]


class BackendTransformersMinimum(Rule):
    code = "HFC108"
    name = "backend-transformers-minimum"
    impact = "blocker"
    what = "The transformers release vLLM runs with is at least what the backend asks for this model's features."
    why = (
        "vLLM's pin admits a range of transformers releases, but parts of its backend ask for more: `Base.check_version` "
        "raises ImportError ('Transformers modeling backend requires transformers>=X for Y'). vLLM 0.34 asks 5.18 for Aria "
        "(`MoEMixin.__init__`, the whole model refuses to load) and for video inputs (they are disabled, images still work), "
        "and 5.20 for MTP drafts; its pin starts at 5.16.1."
    )
    vllm_source = (
        "model_executor/models/transformers/base.py::Base.check_version",
        "model_executor/models/transformers/moe.py::MoEMixin.__init__",
        "model_executor/models/transformers/multimodal.py::MultiModalProcessingInfo._is_video_model",
    )
    example = "AriaForConditionalGeneration with vLLM 0.34.0 and transformers 5.17.0: ImportError at load"
    fix = "Install a transformers release at or above the minimum (pip install 'transformers>=X'), within vLLM's pin."

    def check(self, analysis) -> list[Finding]:
        from packaging.version import Version

        have = analysis.target.transformers
        out = []
        for entry, applies in backend_minimums(analysis):
            if not applies:
                continue
            where = f"{entry['file'].rsplit('/', 1)[-1]}:{entry['line']}"
            if Version(have) >= Version(entry["minimum"]):
                out.append(self.passed(f"{entry['feature']}: transformers {have} >= {entry['minimum']} (vLLM {analysis.target.vllm} {where})"))
            elif entry["feature"] == "video inputs":
                out.append(self.warned(f"vLLM {analysis.target.vllm} disables video inputs below transformers {entry['minimum']} "
                                       f"({where}); transformers {have} here: images only"))
            else:
                out.append(self.failed(f"vLLM {analysis.target.vllm} requires transformers >= {entry['minimum']} for {entry['feature']} "
                                       f"({where}: ImportError at load); transformers {have} here"))
        return out


class InstanceBuilt(Rule):
    code = "HFC104"
    name = "tiny-instance-built"
    impact = "blocker"
    what = "The model builds the way vLLM builds it (AutoModel.from_config with vLLM's attention implementation), as a tiny meta-device instance hfcheck walks."
    why = (
        "vLLM constructs the base model with AutoModel and `_attn_implementation = \"vllm\"`; a model that "
        "cannot be built that way fails at load. Fusions, attention coverage and MoE handling are read off "
        "this module tree; without one those checks are inconclusive."
    )
    example = "remote code without --trust-remote-code: the classes are not executed, so no instance"
    fix = "For remote code, pass --trust-remote-code (issue: sandboxed execution) or rely on the static findings."
    vllm_source = (
        "model_executor/models/transformers/base.py::Base._create_model",
        "model_executor/models/transformers/base.py::Base._patch_config",
    )

    def check(self, analysis) -> list[Finding]:
        if analysis.instance is not None:
            inst = analysis.instance
            built = f"built {type(inst.model).__name__} with {inst.kept_layers} of {analysis.facts.num_layers} layers on the meta device"
            if inst.vllm_build_problem:
                return [self.failed(f"vLLM cannot construct it: {inst.vllm_build_problem}; {built} another way for the other checks")]
            return [self.passed(built)]
        return [self.inconclusive(f"no tiny instance: {analysis.instance_error}")]


GLOBALLY_READ_ATTRIBUTES = ("sliding_window",)
"""Text-config attributes vLLM reads model-wide, with no per-layer path: ``ModelConfig.__post_init__``
calls ``get_sliding_window()`` = ``getattr(hf_text_config, "sliding_window", None)`` (vLLM 0.32
and 0.33 ``config/model.py``). Per-layer widths (head_dim, kv heads) go through
``model_arch_config_convertor`` instead, which handles heterogeneous configs."""


class PerLayerAttributeReadGlobally(Rule):
    code = "HFC107"
    name = "per-layer-attribute-read-globally"
    impact = "blocker"
    what = "No attribute vLLM reads model-wide is a per-layer attribute of a heterogeneous config (`per_layer_config`)."
    why = (
        "transformers' heterogeneous configs raise `AmbiguousGlobalPerLayerAttributeError` when a per-layer attribute is read "
        "from the config itself. vLLM's `ModelConfig.__post_init__` reads `hf_text_config.sliding_window` "
        "(`get_sliding_window`), so a config whose layers each set their own sliding window is refused before any weight "
        "loads (measured on vLLM's CPU build 0.32 with NeoMME's default config)."
    )
    example = "NeoMMEConfig: per_layer_config sets sliding_window per layer -> AmbiguousGlobalPerLayerAttributeError"
    fix = "Keep `sliding_window` model-wide (a `layer_types` list can still mark full-attention layers), or wait for a vLLM that reads it per layer."
    vllm_source = (
        "config/model.py::ModelConfig.__post_init__",
        "config/model.py::ModelConfig.get_sliding_window",
    )

    def check(self, analysis) -> list[Finding]:
        if analysis.config_object is None:
            return []
        text = text_config_of(analysis.config_object)
        if not getattr(text, "is_heterogeneous", False):
            return []
        per_layer = set(getattr(getattr(text, "_heterogeneity_spec", None), "per_layer_attributes", ()) or ())
        clash = [name for name in GLOBALLY_READ_ATTRIBUTES if name in per_layer]
        if clash:
            return [self.failed(f"{type(text).__name__} sets {', '.join(clash)} per layer, and vLLM reads it model-wide at start "
                                "(AmbiguousGlobalPerLayerAttributeError)", attributes=clash)]
        return [self.passed(f"{type(text).__name__} is heterogeneous ({', '.join(sorted(per_layer))} per layer); vLLM reads none of them model-wide")]
