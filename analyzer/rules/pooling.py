"""vLLM's pooling path (``transformers/pooling.py`` and ``legacy.py``, 0.32 and 0.33): the
weights its legacy mapper drops, the positions it passes, and the classification head it needs.

Pooling models are judged by the other rules as vLLM builds them (the base model, attention
through the interface with an int ``layer_idx``, encoder-only attention for text encoders);
these rules add what only the pooling classes do.
"""

from __future__ import annotations

from typing import Any, cast

from hfcheck.analyzer.facts.config_fields import text_config_of
from hfcheck.analyzer.facts.runner import backend_class
from hfcheck.analyzer.findings.rule import Finding, Rule
from hfcheck.analyzer.terms.tolerances import SAME_HIDDEN_STATES

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
    vllm_source = ("model_executor/models/transformers/legacy.py::LegacyMixin.__init__",)

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


PROBE_IDS = (3, 17, 5, 9, 11, 2, 7, 13)


def vllm_positions(model_type: str, pad_token_id: int | None, length: int) -> list[int]:
    """The position ids vLLM hands a pooled encoder: ``0 .. length-1``, shifted by
    ``pad_token_id + 1`` when ``"roberta"`` is in the text config's ``model_type`` (``LegacyMixin``:
    ``is_roberta``, ``positions + padding_idx + 1``; vLLM 0.32 and 0.33 ``transformers/legacy.py``)."""
    shift = pad_token_id + 1 if "roberta" in (model_type or "") and isinstance(pad_token_id, int) else 0
    return [shift + i for i in range(length)]


class PoolingForwardAsCalled(Rule):
    code = "HFC912"
    name = "pooling-forward-as-called"
    impact = "blocker"
    what = ("A pooled encoder computes the same hidden states when called as vLLM calls it (token ids and vLLM's position ids, "
            "nothing else) as transformers computes them on the token ids alone.")
    why = (
        "vLLM's backend calls the base model with `input_ids` and its own `position_ids` (`Base.forward`) and no other input. "
        "`LegacyMixin` shifts the positions by `pad_token_id + 1` only when 'roberta' is in the model_type: an encoder whose "
        "embeddings count positions from the padding index under another name (CamemBERT, Data2VecText, Longformer, MPNet, "
        "LUKE, ESM) is fed positions 0.. and every embedding is wrong, silently (measured on vLLM's CPU build 0.32: cosine "
        "0.61 against transformers). A forward that needs more than token ids (X-MOD's language adapters without "
        "`default_language`) fails in vLLM's first run."
    )
    example = "CamembertModel: positions from pad_token_id + 1 in transformers, from 0 in vLLM: hidden states differ"
    fix = ("Serve it with vLLM's native implementation where one exists (`--model-impl auto`); give the config what the forward "
           "needs (`default_language`); or compute positions from 0 as BERT does.")
    vllm_source = (
        "model_executor/models/transformers/legacy.py::LegacyMixin.forward",
        "model_executor/models/transformers/base.py::Base.forward",
    )

    def check(self, analysis) -> list[Finding]:
        cls = _pooling_class(analysis)
        if cls is None or cls.name.startswith(("TransformersMoE", "TransformersMultiModal")) or analysis.config_object is None:
            return []
        import torch

        from hfcheck.analyzer.instance import InstanceError, build_tiny

        try:
            tiny = build_tiny(analysis.facts, analysis.config_object)
        except InstanceError as exc:
            return [self.inconclusive(f"no runnable small instance to call: {exc}")]
        text = text_config_of(tiny.config)
        # build_tiny builds a transformers model (PreTrainedModel), whose input embeddings hold a weight
        vocab = cast(Any, tiny.model).get_input_embeddings().weight.shape[0]
        pad = getattr(text, "pad_token_id", None)
        ids = [i % vocab for i in PROBE_IDS if i % vocab != pad] or [0]
        positions = vllm_positions(getattr(text, "model_type", ""), pad, len(ids))
        input_ids = torch.tensor([ids])

        def hidden(**kwargs) -> torch.Tensor:
            with torch.no_grad():
                out = tiny.model(input_ids=input_ids, use_cache=False, return_dict=True, **kwargs)
            return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]

        try:
            as_vllm = hidden(position_ids=torch.tensor([positions]))
        except Exception as exc:  # noqa: BLE001 - what vLLM's first forward would raise
            return [self.failed(f"{type(tiny.model).__name__} fails when called with token ids and positions alone, as vLLM calls it: "
                                f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ''}")]
        try:
            own = hidden()
        except Exception as exc:  # noqa: BLE001 - transformers' own call fails too: nothing to compare
            return [self.inconclusive(f"transformers' own call on token ids fails: {type(exc).__name__}")]
        gap = float((as_vllm - own).abs().max())
        shift = f"from {positions[0]}" + (", pad_token_id + 1 for a 'roberta' model type" if positions[0] else "")
        if not torch.allclose(as_vllm, own, rtol=SAME_HIDDEN_STATES[0], atol=SAME_HIDDEN_STATES[1]):
            return [self.failed(f"{type(tiny.model).__name__} computes other hidden states with vLLM's positions ({shift}) than with its own "
                                f"(max difference {gap:.3g}): vLLM serves a different function", max_difference=gap, first_position=positions[0])]
        return [self.passed(f"{type(tiny.model).__name__}: vLLM's call (positions {shift}) computes transformers' hidden states", max_difference=gap)]


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
    vllm_source = ("model_executor/models/transformers/pooling.py::SequenceClassificationMixin.__init__",)

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


POOLING_RULES: tuple[type[Rule], ...] = (LegacyDroppedWeights, PoolingForwardAsCalled, ClassifierHead)
