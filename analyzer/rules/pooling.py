"""vLLM's pooling path (``transformers/pooling.py`` and ``legacy.py``, 0.32 and 0.33): the
weights its legacy mapper drops, and the classification head it needs.

Pooling models are judged by the other rules as vLLM builds them (the base model, attention
through the interface with an int ``layer_idx``, encoder-only attention for text encoders);
these rules add what only the pooling classes do.
"""

from __future__ import annotations

from hfcheck.analyzer.facts.runner import backend_class
from hfcheck.analyzer.rules.base import Finding, Rule

LEGACY_DROPPED_PREFIXES = ("model.lm_head.", "model.predictions.", "model.qa_outputs.", "model.embeddings_project.",
                           "model.discriminator_predictions.")
"""``LegacyMixin``'s ``orig_to_new_prefix`` entries mapped to None: checkpoint tensors under these
names are never loaded (vLLM 0.33 ``transformers/legacy.py``)."""


def _pooling_class(analysis):
    facts = analysis.facts
    cls = backend_class(facts.architectures, facts.multimodal, facts.is_moe)
    return cls if cls.pooling else None


class LegacyDroppedWeights(Rule):
    code = "HFC910"
    name = "pooling-dropped-weights"
    impact = "blocker"
    what = "No parameter of a pooled base model lives under a prefix vLLM's legacy pooling mapper drops."
    why = (
        "`TransformersEmbeddingModel` and `TransformersForSequenceClassification` (text, not MoE) map checkpoint names with "
        "`LegacyMixin`'s WeightsMapper, which drops `model.lm_head.`, `model.predictions.`, `model.qa_outputs.`, "
        "`model.embeddings_project.` and `model.discriminator_predictions.`: a base model whose own layer sits there "
        "(ELECTRA's `embeddings_project`, used when `embedding_size != hidden_size`) is left uninitialised and every "
        "embedding is wrong, silently (measured on vLLM's CPU build 0.32: cosine 0.0 against transformers)."
    )
    example = "ElectraModel with embedding_size 128, hidden_size 256: embeddings_project.weight never loaded"
    fix = "Serve it with vLLM's native implementation where one exists (`--model-impl auto`), or give the layer another name."

    def check(self, analysis) -> list[Finding]:
        cls = _pooling_class(analysis)
        if cls is None or cls.name.startswith(("TransformersMoE", "TransformersMultiModal")):
            return []
        if analysis.instance is None:
            return [self.inconclusive("no instance to read parameter names from")]
        dropped = sorted({
            f"model.{name}" for name, _ in analysis.instance.model.named_parameters()
            if f"model.{name}".startswith(LEGACY_DROPPED_PREFIXES)
        })
        if dropped:
            return [self.failed(f"{cls.name} drops {dropped[0]}" + (f" (+{len(dropped) - 1})" if len(dropped) > 1 else "")
                                + ": vLLM never loads it, and the model computes with an uninitialised layer", parameters=dropped[:8])]
        return [self.passed(f"{cls.name}: no parameter under a prefix vLLM's legacy mapper drops")]


class ClassifierHead(Rule):
    code = "HFC911"
    name = "pooling-classifier-head"
    impact = "blocker"
    what = "A sequence-classification model's `AutoModelForSequenceClassification` has a `classifier` or `score` layer."
    why = (
        "vLLM 0.33 `SequenceClassificationMixin` builds `AutoModelForSequenceClassification` on the meta device and takes "
        "`getattr_iter(model, ['classifier', 'score'])` as its head: neither raises 'Could not find `classifier` or `score` "
        "layer in the `AutoModelForSequenceClassification` instance' at start."
    )
    example = "BertForSequenceClassification.classifier, LlamaForSequenceClassification.score: found"
    fix = "Name the classification head `classifier` or `score`, as transformers' classes do."

    def check(self, analysis) -> list[Finding]:
        cls = _pooling_class(analysis)
        if cls is None or cls.task != "classify" or analysis.config_object is None:
            return []
        import torch
        from transformers import AutoModelForSequenceClassification

        try:
            with torch.device("meta"):
                model = AutoModelForSequenceClassification.from_config(analysis.config_object)
        except Exception as exc:  # noqa: BLE001 - vLLM builds the same class and would fail the same way
            return [self.failed(f"AutoModelForSequenceClassification cannot build the config: {type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}")]
        head = next((name for name in ("classifier", "score") if getattr(model, name, None) is not None), None)
        if head is None:
            return [self.failed(f"{type(model).__name__} has neither `classifier` nor `score`: vLLM cannot find its head")]
        return [self.passed(f"{type(model).__name__}.{head} is the head vLLM pools into")]


POOLING_RULES: tuple[type[Rule], ...] = (LegacyDroppedWeights, ClassifierHead)
