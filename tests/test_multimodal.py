"""Vision-language models as vLLM's transformers backend takes them (``TransformersMultiModal*``):
real transformers classes at their default or published configs, scanned end to end."""

from __future__ import annotations

import json
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


def test_siglip_pooling_head_is_a_multihead_attention_blocker_on_the_cpu_build(tmp_path, monkeypatch):
    # SiglipVisionConfig's default keeps the pooling head (nn.MultiheadAttention): measured dying in
    # vLLM's CPU build's profiling run ("mat2 must be a matrix, got 1-D tensor"); on CUDA the replaced
    # out_proj keeps its weight, so there the failure is recorded, not counted
    folder = write_model(tmp_path / "g3", "gemma3", "Gemma3ForConditionalGeneration")
    monkeypatch.setenv("HFCHECK_PLATFORM", "cpu")
    r = scan(folder)
    (finding,) = check(r, "HFC907")
    assert finding["status"] == "fail" and finding["details"]["modules"] == ["vision_tower.head.attention"]
    assert r["verdict"] == "blocked"
    monkeypatch.setenv("HFCHECK_PLATFORM", "cuda")
    (on_cuda,) = check(scan(folder), "HFC907")
    assert on_cuda["status"] == "info" and on_cuda["details"]["fails_on"] == "cpu"


def test_gemma3_backend_class_language_model_and_encoders(gemma3):
    assert gemma3["model"]["vllm_backend_class"] == "TransformersMultiModalForCausalLM"
    assert "language_model" in check(gemma3, "HFC901")[0]["message"]
    assert check(gemma3, "HFC908")[0]["message"].startswith("encoders: image -> SiglipVisionModel")
    # the language model is judged as a text model: Gemma3Attention fuses q/k/v and dispatches
    gemma_attention = next(m for m in gemma3["modules"] if m["class"] == "Gemma3Attention")
    assert gemma_attention["fusions"] == ["qkv"] and gemma_attention["attention_interface"]


@pytest.fixture(scope="module")
def tiny_llava(tmp_path_factory) -> Path:
    from hfcheck.runtime.tiny_vlm import write_llava

    folder = tmp_path_factory.mktemp("tiny-llava")
    write_llava(folder)
    return folder


def test_processor_built_offline_and_called_like_vllm(tiny_llava):
    # a real LlavaProcessor (word-level tokenizer, CLIP's PIL image processor) built from the folder
    # and called on a real image with return_text_replacement_offsets=True
    r = scan(tiny_llava)
    p = r["processor"]
    assert p["processor_class"] == "LlavaProcessor" and p["built"] and p["modalities"] == ["image"]
    assert p["probe"] == {"num_image_tokens": [4], "offsets": 1, "image_rows": [1, 1],
                          "embed_token": {"id": 4, "token": "<image>", "count": 4, "features_id": 4, "features_token": "<image>"}}
    assert "builds from the folder offline" in check(r, "HFC902")[0]["message"]
    assert check(r, "HFC904")[0]["status"] == check(r, "HFC905")[0]["status"] == "pass"
    assert r["verdict"] == "native-speed"


def test_processor_that_returns_no_offsets_fails(tiny_llava, tmp_path):
    # the same folder with a processor whose __call__ is its own (as 4.x-era processors wrote it)
    import shutil

    folder = tmp_path / "custom-call"
    shutil.copytree(tiny_llava, folder)
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoProcessor": "processing_custom.CustomProcessor"}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "processing_custom.py").write_text(
        "from transformers import ProcessorMixin\n\n\n"
        "class CustomProcessor(ProcessorMixin):\n"
        "    attributes = ['image_processor', 'tokenizer']\n\n"
        "    def __call__(self, text=None, images=None, **kwargs):\n"
        "        return self.tokenizer(text)\n"
    )
    r = scan(folder)
    p = r["processor"]
    assert p["remote"] and p["built"] is None and list(p["source_line"]["__call__"]) == ["processing_custom.py", 7]
    offsets, counts = check(r, "HFC905")[0], check(r, "HFC904")[0]
    assert offsets["status"] == "fail" and "processing_custom.py:7" in offsets["message"]
    assert counts["status"] == "fail" and "_get_num_multimodal_tokens" in counts["message"]


@pytest.mark.skipif(not VLM_FIXTURES.is_dir(), reason="needs ../shared/fixtures/vlm")
def test_minicpm_v2_remote_processor_read_never_run():
    # flat config: vLLM serves it as a text model; its remote processor is read with ast only
    r = scan(VLM_FIXTURES / "minicpm-v-2")
    assert r["model"]["vllm_backend_class"] == "TransformersForCausalLM"
    (path,) = check(r, "HFC900")
    assert path["status"] == "warn" and "image inputs never reach the model" in path["message"]
    p = r["processor"]
    assert p["processor_class"] == "MiniCPMVProcessor" and p["remote"] and p["built"] is None
    assert "processing_minicpmv.py:31" in check(r, "HFC904")[0]["message"]
    assert "processing_minicpmv.py:51" in check(r, "HFC905")[0]["message"]


@pytest.mark.skipif(not VLM_FIXTURES.is_dir(), reason="needs ../shared/fixtures/vlm")
@pytest.mark.parametrize("folder,processor,modalities", [
    ("llava-1.5-7b-hf", "LlavaProcessor", ["image"]),
    ("qwen2.5-vl-3b-instruct", "Qwen2_5_VLProcessor", ["image", "video"]),
    ("smolvlm-256m-instruct", "Idefics3Processor", ["image"]),
])
def test_published_vlm_folders_name_their_processor(folder, processor, modalities):
    r = scan(VLM_FIXTURES / folder)
    p = r["processor"]
    assert p["processor_class"] == processor and p["modalities"] == modalities and p["chat_template"]
    assert all(c["status"] == "pass" for code in ("HFC901", "HFC902", "HFC903", "HFC904", "HFC905") for c in check(r, code))
    assert r["verdict"] == "native-speed"


def test_text_model_scan_has_no_processor_side(scan_type):
    r = scan_type("qwen3")
    assert r["processor"] is None and not r["model"]["multimodal"]
    assert not [c for c in r["checks"] if c["code"].startswith("HFC9")]


def test_remote_vlm_with_layer_count_in_llm_config_gets_an_analysis():
    # InternVL2 keeps its language model's fields under llm_config; this used to end with exit 2
    # "config.json has no layer count (num_hidden_layers)"
    from hfcheck.analyzer.facts import collect_facts

    folder = Path(__file__).parent / "data" / "internvl2-2b"
    facts, _ = collect_facts(json.loads((folder / "config.json").read_text()))
    assert (facts.num_layers, facts.num_heads, facts.num_kv_heads, facts.text_config_key) == (24, 16, 8, "llm_config")
    assert facts.towers == ["vision_config"]
    r = scan(folder)
    # remote code, not executed: undecided rather than an error
    assert r["model"]["model_type"] == "internvl_chat" and r["verdict"] == "inconclusive"


@pytest.fixture(scope="module")
def tiny_idefics3(tmp_path_factory) -> Path:
    from hfcheck.runtime.tiny_vlm import write_idefics3

    folder = tmp_path_factory.mktemp("tiny-idefics3")
    write_idefics3(folder)
    return folder


def test_idefics3_rows_and_embedding_token_as_vllm_reads_them(tiny_idefics3):
    # SmolVLM's shape with tiles: 5 rows of image data, 5 counted; <image> is the most frequent
    # token of the replacement, the one vLLM fills (both measured served by vLLM's CPU build)
    r = scan(tiny_idefics3)
    assert r["processor"]["probe"]["image_rows"] == [5, 5]
    assert r["processor"]["probe"]["embed_token"]["token"] == "<image>"
    assert check(r, "HFC905")[0]["status"] == check(r, "HFC909")[0]["status"] == "pass"


def test_processor_counting_no_rows_fails(tiny_idefics3, tmp_path):
    # do_image_splitting off: transformers' Idefics3Processor counts 0 image rows for the 1 it returns;
    # vLLM: "returned 1 row(s) of image data for 1 image(s), which cannot be split into the [0] row(s)"
    import shutil

    folder = tmp_path / "no-splitting"
    shutil.copytree(tiny_idefics3, folder)
    config = json.loads((folder / "processor_config.json").read_text())
    config["image_processor"]["do_image_splitting"] = False
    (folder / "processor_config.json").write_text(json.dumps(config))
    (finding,) = check(scan(folder), "HFC909")
    assert finding["status"] == "fail" and "1 row(s) of image data for one image but counts 0" in finding["message"]


def test_wrapper_tokens_outnumbering_features_fail(tiny_idefics3, tmp_path):
    # one feature token a tile: each replacement holds more <fake_token_around_image> than <image>,
    # and vLLM takes the most frequent token as the one holding the embeddings
    import shutil

    folder = tmp_path / "one-token-a-tile"
    shutil.copytree(tiny_idefics3, folder)
    config = json.loads((folder / "processor_config.json").read_text())
    config["image_seq_len"] = 1
    (folder / "processor_config.json").write_text(json.dumps(config))
    (finding,) = check(scan(folder), "HFC905")
    assert finding["status"] == "fail" and "<fake_token_around_image>" in finding["message"] and "model puts them at <image>" in finding["message"]


def test_a_small_folder_from_any_types_defaults(tmp_path):
    """LLaVA-NeXT from its default config and its processor class alone (no builder written for
    it): the processor's size arguments come from the config, transformers' own forward accepts
    the image, and the scan reads the folder's processor as vLLM would build it."""
    import torch
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from hfcheck.runtime.tiny_vlm import PROMPT_WORDS
    from hfcheck.runtime.vlm_folders import write_from_defaults

    folder = tmp_path / "llava_next"
    placeholder = write_from_defaults("llava_next", folder)
    assert placeholder == "<image>"
    processor = AutoProcessor.from_pretrained(folder)
    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32).eval()
    assert sum(p.numel() for p in model.parameters()) < 1_000_000
    inputs = processor(text=f"{placeholder} {PROMPT_WORDS}", images=[Image.new("RGB", (40, 30), (9, 99, 199))], return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=2, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert out.shape[1] == inputs["input_ids"].shape[1] + 2
    report = scan(folder)
    assert report["processor"]["built"] and report["processor"]["probe"]["offsets"] == 1


def test_a_type_whose_processor_needs_what_is_missing_says_so(tmp_path):
    from hfcheck.runtime.vlm_folders import write_from_defaults

    pytest.importorskip("transformers")
    import importlib.util

    if importlib.util.find_spec("torchvision") is not None:
        pytest.skip("torchvision is installed here")
    with pytest.raises(LookupError, match="needs torchvision"):
        write_from_defaults("qwen2_vl", tmp_path / "qwen2_vl")
