"""The transformers-4 idioms that transformers 5 breaks, on real remote code: each codemod's
output is imported and run in the installed transformers, beside the code it started from."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2] / "shared" / "fixtures"
PUBLISHED = Path(__file__).parent / "fixtures" / "remote-published"
MINICPM = SHARED / "vlm" / "minicpm-v-2"


def load_package(root: Path, name: str, files: dict[str, str]):
    """Write ``files`` as the package ``name`` under ``root`` and import its modules."""
    package = root / name
    package.mkdir()
    (package / "__init__.py").write_text("")
    for file, text in files.items():
        (package / file).write_text(text)
    sys.path.insert(0, str(root))
    try:
        return {file: importlib.import_module(f"{name}.{file[:-3]}") for file in files}
    finally:
        sys.path.remove(str(root))


@pytest.mark.skipif(not MINICPM.is_dir(), reason="../shared/fixtures/vlm/minicpm-v-2 is not here")
def test_rope_scaling_reads_get_the_value_4x_gave(tmp_path):
    """MiniCPM's attention (Llama-derived 4.x code) tests ``config.rope_scaling is None`` and then
    reads ``["type"]``: transformers 5 reads rope_scaling back as ``{"rope_type": "default", ...}``
    where config.json had null, so building it fails with KeyError: 'type'. Through
    legacy_rope_scaling the unscaled and both scaled configs build the 4.x rotary classes."""
    from hfcheck.porter.rewrite.codemods.config_v4 import LegacyRopeScaling
    from hfcheck.porter.rewrite.codemods.removed_apis import RemovedApis
    from hfcheck.porter.rewrite.state import PortState

    names = ("configuration_minicpm.py", "modeling_minicpm.py")
    state = PortState({n: (MINICPM / n).read_text() for n in names}, json.loads((MINICPM / "config.json").read_text()))
    RemovedApis().apply(state)  # the file imports APIs 5 removed: without this neither version imports
    before = dict(state.files)
    LegacyRopeScaling().apply(state)
    assert "self.config.rope_scaling" not in state.files["modeling_minicpm.py"]
    assert "legacy_rope_scaling(self)" in state.files["configuration_minicpm.py"]  # the config's own validation reads it too
    assert any("read(s) of rope_scaling go through legacy_rope_scaling" in c.what for c in state.changes)

    def build(modules, scaling):
        config = modules["configuration_minicpm.py"].MiniCPMConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=4,
                                                                   intermediate_size=128, rope_scaling=scaling)
        return type(modules["modeling_minicpm.py"].MiniCPMAttention(config, layer_idx=0).rotary_emb).__name__

    original = load_package(tmp_path, "minicpm_before", before)
    ported = load_package(tmp_path, "minicpm_after", state.files)
    with pytest.raises(KeyError, match="type"):
        build(original, None)
    assert build(ported, None) == "MiniCPMRotaryEmbedding"
    assert build(ported, {"type": "linear", "factor": 2.0}) == build(original, {"type": "linear", "factor": 2.0}) == "MiniCPMLinearScalingRotaryEmbedding"
    assert build(ported, {"type": "dynamic", "factor": 2.0}) == "MiniCPMDynamicNTKScalingRotaryEmbedding"
    helper = ported["modeling_minicpm.py"].legacy_rope_scaling
    from transformers import PretrainedConfig

    assert helper(PretrainedConfig()) is None
    assert helper(PretrainedConfig(rope_scaling={"type": "linear", "factor": 2.0})) == {"type": "linear", "factor": 2.0}


def test_config_attributes_5_no_longer_gives_are_read_as_4x_gave_them(tmp_path):
    """ChatGLM3 (real code): ``config.max_length`` (4.x's PretrainedConfig default, 20; 5 sets
    none) and ``config.use_cache`` (in config.json, which 5 drops while loading as a generation
    parameter) become getattr reads with what 4.x gave; on the real config object the original
    reads raise AttributeError and the rewritten ones return those values."""
    from hfcheck.porter.rewrite.codemods.config_v4 import DroppedConfigDefaults
    from hfcheck.porter.rewrite.state import PortState

    src = PUBLISHED / "chatglm3-6b"
    config = json.loads((src / "config.json").read_text())
    files = {p.name: p.read_text() for p in src.glob("*.py")}
    state = PortState(dict(files), config)
    DroppedConfigDefaults().apply(state)
    text = state.files["modeling_chatglm.py"]
    assert "getattr(config, 'max_length', 20)" in text and "getattr(self.config, 'use_cache', True)" in text
    assert "generation_config.max_length" in text  # a generation config still has it: untouched
    whats = {c.where: c.what for c in state.changes}
    assert "4.x's PretrainedConfig default" in whats["config.max_length"] and "config.json's value" in whats["config.use_cache"]

    modules = load_package(tmp_path, "chatglm3_config", {"configuration_chatglm.py": files["configuration_chatglm.py"]})
    keys = {k: v for k, v in config.items() if k not in ("auto_map", "architectures", "model_type", "transformers_version")}
    real = modules["configuration_chatglm.py"].ChatGLMConfig(**keys)
    for attr in ("max_length", "use_cache"):
        with pytest.raises(AttributeError):
            getattr(real, attr)


def test_chatglm3_rewritten_in_place_generates_as_the_original(tmp_path):
    """ChatGLM3 (real code) with --path rewrite: beside the config reads above, its encoder indexes
    the cache its model's forward passes on as ``kv_caches=past_key_values`` (the tuple shim goes on
    that forward), and its own ``_update_model_kwargs_for_generation`` calls GenerationMixin's
    removed ``_extract_past_from_model_output`` and extends a mask 5's generate leaves None. The
    cached greedy generate then equals the original's in its own release."""
    import contextlib
    import io

    from hfcheck.porter.cli import main

    out = tmp_path / "out"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(["port", str(PUBLISHED / "chatglm3-6b"), "--out", str(out), "--path", "rewrite", "--format", "json"])
    result = json.loads(buf.getvalue())
    assert code == 0 and result["status"] == "ported", result["message"]
    checks = {c["name"]: c for c in result["proof"]["checks"]}
    assert checks["greedy generate, 4 tokens with the KV cache"]["ok"]
    assert all(c["max_rel_error"] < 1e-4 for c in checks.values() if "max_rel_error" in c)
    where = {c["where"] for c in result["changes"] if c["code"] == "HFC811"}
    assert {"ChatGLMModel.forward", "ChatGLMForConditionalGeneration._update_model_kwargs_for_generation"} <= where
    text = (out / "modeling_chatglm.py").read_text()
    assert "outputs.past_key_values" in text and '_extract_past_from_model_output' not in text


def test_what_the_port_does_with_quantized_tensors_is_said():
    """A rewrite whose weight rules reshape parameters (the experts fixture stacks its experts)
    does not convert quantized tensors and says so; one without rules keeps them as published;
    a float config gets no statement."""
    from hfcheck.analyzer.sources import resolve
    from hfcheck.porter.output.weights import quantized_tensors
    from hfcheck.porter.rewrite.codemods import CODEMODS
    from hfcheck.porter.rewrite.state import PortState

    source = resolve(str(Path(__file__).parent / "fixtures" / "remote" / "experts"))
    state = PortState(dict(source.code_files), dict(source.config))
    for codemod in CODEMODS:
        codemod().apply(state)
    assert state.weight_rules
    awq = {**source.config, "quantization_config": {"quant_method": "awq", "bits": 4}}
    said = quantized_tensors(awq, state.weight_rules)
    assert said is not None and "4-bit awq" in said and "stack_experts" in said and "not converted" in said
    assert "load under the names they were published with" in (quantized_tensors(awq, []) or "")
    assert "weight plan are for float weights" in (quantized_tensors(awq, None) or "")
    assert quantized_tensors(source.config, state.weight_rules) is None
