"""Real published model folders that hfcheck got wrong, each kept as found (see the README.md of
each folder under tests/data/ and ../shared/fixtures/vlm/): the decoder under a sub-config key
no list names (InfiMM's ``language``), a processor whose class does not import here (Mistral
Small 3.1's PixtralProcessor without torchvision), and M-RoPE sections at a shrunk head width
(Qwen2.5-VL and GLM-4.1V)."""

from __future__ import annotations

import copy
import json
import warnings
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
VLM_FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "vlm"
INFIMM = DATA / "infimm-zephyr"
MISTRAL_31 = DATA / "mistral-small-3.1-24b-instruct-2503"
QWEN25_VL = VLM_FIXTURES / "qwen2.5-vl-3b-instruct"


def _config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


def _checks(report: dict, prefix: str) -> dict[str, dict]:
    return {c["code"]: c for c in report["checks"] if c["code"].startswith(prefix)}


# --- 1. the decoder's sub-config wherever it is ------------------------------------------------


def test_infimm_decoder_under_language_is_found_and_named():
    # InfiMM-Zephyr keeps Zephyr's config under "language" and EVA-CLIP's under "visual": this
    # used to end with exit 2 "config.json has no layer count (num_hidden_layers)"
    from hfcheck.analyzer.facts import collect_facts

    facts, cfg_obj = collect_facts(_config(INFIMM))
    assert cfg_obj is None and facts.text_config_key == "language"
    assert (facts.num_layers, facts.hidden_size, facts.num_heads, facts.num_kv_heads, facts.head_dim, facts.vocab_size) == (
        32, 4096, 32, 8, 128, 32002)
    assert facts.text_model_type == "mistral" and facts.sliding_window == 4096
    assert any("'language'" in note for note in facts.notes)


def test_infimm_scans_instead_of_exiting_2(capsys):
    from hfcheck.cli import main

    code = main(["scan", str(INFIMM), "--format", "json"])
    report = json.loads(capsys.readouterr().out)
    assert code in (0, 1) and report["model"]["model_type"] == "infimm-zephyr"
    assert report["model"]["remote_code"] and report["verdict"] == "inconclusive"  # remote code is not executed


def test_a_vision_tower_is_never_taken_for_the_decoder():
    # InternVL2's vision_config has a layer count, heads and a hidden size too; without its
    # llm_config there is no decoder, and the tower must not be read as one
    from hfcheck.analyzer.facts import collect_facts
    from hfcheck.analyzer.facts.errors import FactsError

    config = _config(DATA / "internvl2-2b")
    assert collect_facts(config)[0].text_config_key == "llm_config"
    del config["llm_config"]
    with pytest.raises(FactsError, match="no layer count"):
        collect_facts(config)


def test_the_decoder_is_found_under_any_key_and_checked_there():
    # the same real decoder config under a name no list holds: found, and its fields checked
    from hfcheck.analyzer.facts import collect_facts
    from hfcheck.analyzer.facts.errors import FactsError

    config = _config(INFIMM)
    config["lm"] = config.pop("language")
    assert collect_facts(config)[0].text_config_key == "lm"
    config["lm"]["num_attention_heads"] = "32"
    with pytest.raises(FactsError, match=r"lm\.num_attention_heads"):
        collect_facts(config)


def test_known_names_win_over_other_decoder_like_objects():
    from hfcheck.analyzer.facts.config_fields import text_subconfig

    config = _config(INFIMM)
    config["text_config"] = copy.deepcopy(config["language"])
    assert text_subconfig(config)[0] == "text_config"
    nested = {"model_type": "x", "thinker_config": {"text_config": config["language"], "vision_config": config["language"]}}
    assert text_subconfig(nested)[0] == "thinker_config.text_config"


# --- 2. a processor whose class does not import here ------------------------------------------


def test_mistral_small_31_processor_is_read_not_left_open():
    # PixtralProcessor's module imports the torchvision image processor; without torchvision
    # transformers hands out a placeholder. Its source still says what vLLM needs.
    from hfcheck.analyzer.scan import scan

    report = scan(str(MISTRAL_31)).report
    p = report["processor"]
    assert p["processor_class"] == "PixtralProcessor" and p["found_in"] == "processor_config.json"
    assert p["is_processor_mixin"] is True and p["modalities"] == ["image"]
    assert p["counts_tokens"] is True and p["replaces"] == {"image": True} and p["call_reaches_replacements"] is True
    assert p["read_by"] in ("class", "library source") and p["read_note"]
    if p["read_by"] == "library source":  # torchvision absent (CI): read from transformers' own file, and it says why
        assert "processing_pixtral.py" in p["read_note"] and "not imported" in p["read_note"]
        assert not p["problems"]
    checks = _checks(report, "HFC90")
    assert all(checks[code]["status"] == "pass" for code in ("HFC902", "HFC903", "HFC904", "HFC905")), checks
    assert report["verdict"] != "inconclusive"


def test_reading_transformers_source_agrees_with_inspecting_the_class():
    # every processor class transformers maps a model type to: where the class imports, the
    # static read of its source (followed through its bases) gives the same facts
    import transformers
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

    from hfcheck.analyzer.facts import processor as P

    compared = 0
    for name in sorted(set(PROCESSOR_MAPPING_NAMES.values())):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                cls = getattr(transformers, name, None)
            except Exception:  # noqa: BLE001 - a module that does not import: nothing to compare with
                continue
        if not isinstance(cls, type) or "<locals>" in cls.__qualname__:
            continue
        inspected, read = P.ProcessorFacts([], name, "test"), P.ProcessorFacts([], name, "test")
        P._inspect_class(inspected, name)
        assert P._read_library_source(read, name, P._library_module(name, cls), "test"), name
        keys = ("is_processor_mixin", "modalities", "counts_tokens", "replaces", "call_reaches_replacements")
        assert [getattr(read, k) for k in keys] == [getattr(inspected, k) for k in keys], name
        compared += 1
    assert compared > 50


# --- 3. M-RoPE sections at the shrunk head width ----------------------------------------------


def test_shrink_scales_mrope_sections():
    from hfcheck.analyzer.instance.shrink import scaled_sections

    assert scaled_sections([16, 24, 24], 8) == [2, 3, 3]
    assert scaled_sections([16, 24, 24], 64) == [16, 24, 24]
    assert scaled_sections([1, 1, 62], 4) == [1, 1, 2]  # every axis keeps a frequency
    for section, target in (([16, 24, 24], 16), ([8, 12, 12], 4), ([24, 20, 20], 16), ([11, 3, 50], 7)):
        out = scaled_sections(section, target)
        assert sum(out) == target and min(out) >= 1


@pytest.mark.parametrize("source", ["qwen2.5-vl-3b-instruct", "glm4v", "glm4v_moe", "qwen2_vl"])
def test_tiny_instance_with_mrope_runs(source):
    # the real Qwen2.5-VL-3B config (mrope_section [16, 24, 24]) and the default configs of
    # GLM-4.1V (no sections: its code's [8, 12, 12]) and GLM-4.5V (partial rotary 0.5)
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    from hfcheck.analyzer.facts import collect_facts
    from hfcheck.analyzer.facts.config_fields import text_config_of
    from hfcheck.analyzer.instance.shrink import rotary_half, shrunk_config

    raw = _config(VLM_FIXTURES / source) if "." in source else AutoConfig.for_model(source).to_dict()
    facts, cfg_obj = collect_facts(raw)
    for head_dim in (16, 32):  # the analyzer's tiny instance, the runtime's folders
        config, _ = shrunk_config(facts, cfg_obj, "tiny", head_dim=head_dim)
        text = text_config_of(config)
        rope = text.rope_parameters
        assert sum(rope["mrope_section"]) == rotary_half(text, rope) and min(rope["mrope_section"]) >= 1
        tower = config.vision_config
        for name, value in {"hidden_size": 64, "intermediate_size": 128, "num_heads": 2, "depth": 2, "num_hidden_layers": 2,
                            "out_hidden_size": text.hidden_size}.items():
            if isinstance(getattr(tower, name, None), int):
                setattr(tower, name, value)
        torch.manual_seed(0)
        model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32).eval()
        with torch.no_grad():
            model(input_ids=torch.randint(0, 100, (1, 6)))


@pytest.mark.parametrize("model_type", ["glm4v", "qwen2_5_vl"])
def test_runtime_small_vlm_uses_the_shrinks_sections(model_type):
    # the runtime's small VLM folders (head_dim 32) take the shrink's sections, no copy of their own
    import torch
    from transformers import AutoModelForImageTextToText

    from hfcheck.analyzer.instance.shrink import rotary_half
    from hfcheck.analyzer.sources.model_types import VLM, default_config
    from hfcheck.runtime.tiny_vlm import word_tokenizer
    from hfcheck.runtime.vlm_folders import _small_config

    raw, _ = default_config(model_type, VLM)
    config, text, _, _ = _small_config(raw, word_tokenizer({}), model_type)
    assert text.head_dim == 32 and sum(text.rope_parameters["mrope_section"]) == rotary_half(text, text.rope_parameters) == 16
    model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        model(input_ids=torch.randint(0, 60, (1, 5)))


def test_verify_runs_the_tiny_qwen25_vl():
    # `hfcheck verify` on the real folder: "the tiny instance runs" used to fail with
    # "split_with_sizes expects split_sizes to sum exactly to 32 ... got [16, 24, 24]"
    from hfcheck.analyzer.scan import scan
    from hfcheck.verify.runner import verify_analysis

    scanned = scan(str(QWEN25_VL))
    proofs = verify_analysis(scanned.analysis, parallel=False, blocked=scanned.report["verdict"] == "blocked")  # verify's re-tuned instance
    assert not [p for p in proofs if p.claim == "the tiny instance runs"], [p.to_dict() for p in proofs]
    assert proofs and all(p.kind == "fusion" and p.status == "proven" for p in proofs), [p.to_dict() for p in proofs]


def test_the_port_shrink_cuts_the_decoder_where_the_facts_found_it():
    # the port's shrink of a remote config dict shrinks the same sub-config the facts read
    from hfcheck.analyzer.instance.shrink import shrink_config

    small = shrink_config(_config(INFIMM))
    language = small["language"]
    assert (language["num_hidden_layers"], language["num_key_value_heads"], language["vocab_size"]) == (2, 2, 512)
    assert language["hidden_size"] == language["num_attention_heads"] * 16 and small["visual"] == _config(INFIMM)["visual"]
