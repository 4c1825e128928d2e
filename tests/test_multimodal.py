"""Vision-language models as vLLM's transformers backend takes them (``TransformersMultiModal*``):
real transformers classes at their default or published configs, scanned end to end."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import write_model

VLM_FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "vlm"


def check(report, code):
    return [c for c in report["checks"] if c["code"] == code]


def scan(folder: Path) -> dict:
    from hfcheck.analyzer.analysis import analyse
    from hfcheck.analyzer.report import build_report
    from hfcheck.analyzer.sources import resolve

    return build_report(analyse(resolve(str(folder))))


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory) -> dict:
    """Gemma 3 as every published 4B/12B/27B checkpoint configures it: SigLIP tower without its
    pooling head (``vision_use_head: false``)."""
    folder = write_model(tmp_path_factory.mktemp("gemma3"), "gemma3", "Gemma3ForConditionalGeneration",
                         vision_config={"model_type": "siglip_vision_model", "vision_use_head": False})
    return scan(folder)


def test_gemma3_bidirectional_tower_is_not_encoder_only(gemma3):
    # vLLM: EncoderOnlyAttention only when has_encoder(model) and not is_multimodal(config)
    (finding,) = check(gemma3, "HFC204")
    assert finding["status"] == "pass" and "vision_tower" in finding["message"]
    assert gemma3["verdict"] != "blocked", gemma3["blockers"]
    assert gemma3["model"]["multimodal"] and gemma3["model"]["towers"] == ["vision_config"]


def test_text_model_with_bidirectional_attention_is_still_encoder_only(scan_type):
    # BERT's LM head class generates, but its attention is bidirectional: vLLM's encoder-only path
    r = scan_type("bert")
    (finding,) = check(r, "HFC204")
    assert finding["status"] == "fail" and "encoder-only" in finding["message"]


def test_tower_mlp_without_a_gate_is_not_a_missing_fusion(gemma3):
    by_module = {c["details"].get("module"): c for c in check(gemma3, "HFC302")}
    assert by_module["SiglipMLP"]["status"] == "info" and "nothing to fuse" in by_module["SiglipMLP"]["message"]
    assert by_module["Gemma3MLP"]["status"] == "pass"


@pytest.mark.skipif(not VLM_FIXTURES.is_dir(), reason="needs ../shared/fixtures/vlm")
def test_llava_published_config_clip_mlp_costs_nothing():
    r = scan(VLM_FIXTURES / "llava-1.5-7b-hf")
    by_module = {c["details"].get("module"): c for c in check(r, "HFC302")}
    assert by_module["CLIPMLP"]["status"] == "info" and by_module["LlamaMLP"]["status"] == "pass"
    assert r["verdict"] == "native-speed" and r["score"] == 100
