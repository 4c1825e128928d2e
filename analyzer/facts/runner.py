"""Which transformers-backend class vLLM builds for a model: generate or pooling, text or multimodal.

One home for vLLM's ``ModelConfig._get_transformers_backend_cls`` and the architecture
suffix table it reads (``_SUFFIX_TO_DEFAULTS`` / ``try_match_architecture_defaults``; identical
in 0.32 to 0.34): ``Transformers`` + ``MultiModal`` (the config nests a text config) + ``MoE`` (an
expert count) + ``EmbeddingModel`` / ``ForSequenceClassification`` when the architecture's
suffix defaults to pooling with that task, else ``ForCausalLM`` (a pooling runner over a
generative architecture adapts the LM class).
"""

from __future__ import annotations

from dataclasses import dataclass

from hfcheck.analyzer.vllm.release import tables

SUFFIX_DEFAULTS: tuple[tuple[str, str, str], ...] = (
    ("ForCausalLM", "generate", "none"),
    ("ForConditionalGeneration", "generate", "none"),
    ("ChatModel", "generate", "none"),
    ("LMHeadModel", "generate", "none"),
    ("ForTextEncoding", "pooling", "embed"),
    ("EmbeddingModel", "pooling", "embed"),
    ("ForSequenceClassification", "pooling", "classify"),
    ("ForTokenClassification", "pooling", "classify"),
    ("ForAudioClassification", "pooling", "classify"),
    ("ForImageClassification", "pooling", "classify"),
    ("ForVideoClassification", "pooling", "classify"),
    ("ClassificationModel", "pooling", "classify"),
    ("ForRewardModeling", "pooling", "embed"),
    ("RewardModel", "pooling", "embed"),
    ("Model", "pooling", "embed"),  # vLLM: "Let other `*Model`s take priority"
)
"""(architecture suffix, runner, task), first match wins (vLLM's order)."""


def backend_classes() -> frozenset[str]:
    """The classes ``vllm.model_executor.models.transformers`` defines in the release predicted
    for (its registry's ``_TRANSFORMERS_BACKEND_MODELS``); any other name raises "does not
    currently have a class to handle the requested model type"."""
    return frozenset(tables()["registry"]["transformers_backend_classes"])


@dataclass(frozen=True)
class BackendClass:
    name: str
    runner: str
    """"generate" | "pooling" (vLLM's default runner for the architecture)."""
    task: str
    """"none" (generation), "embed" or "classify"."""

    @property
    def pooling(self) -> bool:
        return self.runner == "pooling"

    @property
    def exists(self) -> bool:
        return self.name in backend_classes()


def architecture_defaults(architecture: str) -> tuple[str, str] | None:
    """(runner, task) for an architecture name, as ``try_match_architecture_defaults``."""
    for suffix, runner, task in SUFFIX_DEFAULTS:
        if architecture.endswith(suffix):
            return runner, task
    return None


def backend_class(architectures: list[str], multimodal: bool, moe: bool) -> BackendClass:
    """The class vLLM resolves for ``--model-impl transformers`` with ``--runner auto``."""
    runner, task = (architecture_defaults(architectures[0]) if architectures else None) or ("generate", "none")
    name = "Transformers" + ("MultiModal" if multimodal else "") + ("MoE" if moe else "")
    if runner == "pooling" and task == "embed":
        name += "EmbeddingModel"
    elif runner == "pooling" and task == "classify":
        name += "ForSequenceClassification"
    else:
        name += "ForCausalLM"
    return BackendClass(name, runner, task)


def is_mm_prefix_lm(model_type: str, config: dict) -> bool:
    """vLLM's ``is_mm_prefix_lm`` for a multimodal config (``config`` as config.json holds it):
    the config's own flag, else the release's list of model types
    (``ModelArchConfigConvertorBase.is_mm_prefix_lm``: bagel, gemma3, molmo2, moondream3,
    paligemma in 0.32 to 0.34). vLLM then makes each multimodal item's placeholder tokens attend
    both ways; only attention backends with ``supports_mm_prefix()`` apply it (FlashAttention 4,
    Triton, FlexAttention and the composite Triton ones; not FlashInfer, not the CPU build's)."""
    if isinstance(config.get("is_mm_prefix_lm"), bool):
        return config["is_mm_prefix_lm"]
    return model_type in tables()["mm_prefix_lm_model_types"]
