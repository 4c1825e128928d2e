"""The command as users run it: real subprocesses, a fresh offline HF cache, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from jsonschema import validate

from hfcheck.analyzer.report import schema


def hfcheck(*args: str, tmp_path: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m hfcheck`` offline against an empty HF cache (a fresh machine)."""
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "HF_HUB_CACHE": str(tmp_path / "hf" / "hub"), **(env or {})}
    return subprocess.run([sys.executable, "-m", "hfcheck", *args], capture_output=True, text=True, env=full_env, timeout=300)


def test_scan_bundled_qwen3_4b_offline_text(tmp_path):
    run = hfcheck("scan", "Qwen/Qwen3-4B", tmp_path=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "NATIVE-SPEED" in run.stdout
    assert "bundled snapshot" in run.stdout
    assert "vllm serve Qwen/Qwen3-4B --model-impl transformers" in run.stdout


@pytest.mark.parametrize("ref", ["Qwen/Qwen3-4B", "Qwen/Qwen3-32B"])
def test_scan_bundled_json_tp_sizes(tmp_path, ref):
    run = hfcheck("scan", ref, "--format", "json", tmp_path=tmp_path)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    validate(report, schema())
    assert report["model"]["source"] == "bundled"
    assert report["verdict"] == "native-speed"
    assert report["parallel"]["tp"]["sizes"] == {"1": True, "2": True, "4": True, "8": True}
    mods = {m["class"]: m["fusions"] for m in report["modules"]}
    assert mods["Qwen3Attention"] == ["qkv"] and mods["Qwen3MLP"] == ["glu"] and mods["Qwen3RMSNorm"] == ["rms_norm"]


def test_scan_bundled_qwen3_235b_fp8(tmp_path):
    report = json.loads(hfcheck("scan", "Qwen/Qwen3-235B-A22B-FP8", "--format", "json", tmp_path=tmp_path).stdout)
    assert report["moe"][0]["experts_replaceable"] and report["moe"][0]["internal_routing"]
    assert 230e9 < report["model"]["parameters"] < 240e9
    # FP8: about one byte per parameter; 64 heads / 4 KV heads
    assert 200 < report["memory"]["weights_gib"] < 240
    assert report["memory"]["suggested_tp"] == 4
    assert "--tensor-parallel-size 4 --enable-expert-parallel" in report["serve_command"]


def test_scan_gpt_oss_mxfp4_blocked_exit_1(tmp_path):
    run = hfcheck("scan", "openai/gpt-oss-20b", "--format", "json", tmp_path=tmp_path)
    assert run.returncode == 1
    report = json.loads(run.stdout)
    assert report["verdict"] == "blocked"
    # the transformers backend refuses MXFP4; vLLM's native GptOss implementation serves it
    assert report["serve"]["implementation"] == "native" and report["serve_command"] == "vllm serve openai/gpt-oss-20b"
    assert "mxfp4" in report["serve"]["note"]


def test_fail_under(tmp_path):
    assert hfcheck("scan", "Qwen/Qwen3-4B", "--fail-under", "100", tmp_path=tmp_path).returncode == 0
    local = tmp_path / "phi"
    local.mkdir()
    (local / "config.json").write_text(json.dumps({"model_type": "phi3", "architectures": ["Phi3ForCausalLM"]}))
    assert hfcheck("scan", str(local), "--fail-under", "10", tmp_path=tmp_path).returncode == 1  # phi3 fails HFC301


def _assert_tool_error(run: subprocess.CompletedProcess, needle: str) -> None:
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hfcheck: error:"), run.stderr
    assert needle in lines[0]
    assert "Traceback" not in run.stderr + run.stdout


def test_garbage_config(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{not json")
    _assert_tool_error(hfcheck("scan", str(tmp_path / "m"), tmp_path=tmp_path), "config.json")


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '"a string"'])
def test_a_broken_config_reads_the_same_for_scan_port_verify_and_serve(tmp_path, text):
    """config.json is read in one place (sources): every command says the same one line."""
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(text)
    lines = set()
    for command in (["scan"], ["verify"], ["serve"], ["port", "--out", str(tmp_path / "out")]):
        run = hfcheck(command[0], str(tmp_path / "m"), *command[1:], tmp_path=tmp_path)
        _assert_tool_error(run, "config.json: ")
        lines.add(run.stderr.strip())
    assert len(lines) == 1, lines
    assert not (tmp_path / "out").exists()


def test_folder_without_config(tmp_path):
    (tmp_path / "empty").mkdir()
    _assert_tool_error(hfcheck("scan", str(tmp_path / "empty"), tmp_path=tmp_path), "no config.json")


@pytest.mark.parametrize("module", ["hfcheck.sweep", "hfcheck.tui"])
def test_a_command_run_as_a_module_says_a_usage_error_in_one_line(tmp_path, module):
    """``python -m hfcheck.sweep`` / ``hfcheck.tui`` parse as ``hfcheck sweep`` / ``tui`` do."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    run = subprocess.run([sys.executable, "-m", module, "--no-such-flag"], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 2
    assert run.stderr.splitlines() == ["hfcheck: error: unrecognized arguments: --no-such-flag"]


def test_unknown_model_type_without_auto_map(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({"model_type": "no_such_lm", "architectures": ["NoSuchLMForCausalLM"], "num_hidden_layers": 2}))
    _assert_tool_error(hfcheck("scan", str(tmp_path / "m"), tmp_path=tmp_path), "no_such_lm")


def test_inconsistent_config(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({"model_type": "qwen3", "num_hidden_layers": "many"}))
    _assert_tool_error(hfcheck("scan", str(tmp_path / "m"), tmp_path=tmp_path), "")


def test_unreachable_reference(tmp_path):
    _assert_tool_error(hfcheck("scan", "nobody/nothing-here", tmp_path=tmp_path), "nobody/nothing-here")


def test_explain(tmp_path):
    run = hfcheck("explain", "HFC201", tmp_path=tmp_path)
    assert run.returncode == 0
    for heading in ("What it checks", "Why it matters", "Example", "Fix"):
        assert heading in run.stdout
    _assert_tool_error(hfcheck("explain", "HFC999", tmp_path=tmp_path), "HFC999")


def test_remote_code_without_trust_is_inconclusive(tmp_path):
    run = hfcheck("scan", "THUDM/chatglm3-6b", "--format", "json", tmp_path=tmp_path)
    report = json.loads(run.stdout)
    assert report["verdict"] == "inconclusive"
    assert report["model"]["remote_code"] is True
    assert any("not executed" in c["message"] for c in report["checks"])


def test_graph_export_graphml(tmp_path):
    import networkx as nx

    out = tmp_path / "g.graphml"
    run = hfcheck("scan", "Qwen/Qwen3-4B", "--format", "json", "--graph", str(out), tmp_path=tmp_path)
    assert run.returncode == 0, run.stderr
    graph = nx.read_graphml(out)
    # containment and the data flow of the attention forward: q_proj feeds q_norm, o_proj is last
    assert graph.has_edge("layers.0.self_attn", "layers.0.self_attn.q_proj")
    assert graph.has_edge("layers.0.self_attn.q_proj", "layers.0.self_attn.q_norm")
    assert graph.has_edge("layers.0.mlp.gate_proj", "layers.0.mlp.act_fn")
    assert graph.nodes["layers.0.self_attn"]["cls"] == "Qwen3Attention"


def test_deepseek_v3_needs_pipeline_stages(tmp_path):
    report = json.loads(hfcheck("scan", "deepseek-ai/DeepSeek-V3", "--format", "json", tmp_path=tmp_path).stdout)
    assert {m["class"]: m["fusions"] for m in report["modules"]}["DeepseekV3Attention"] == ["mla"]
    assert 660e9 < report["model"]["parameters"] < 680e9
    # FP8 weights (~625 GiB) exceed 8 x 80 GiB at 90% use: TP 8 with 2 pipeline stages
    assert report["memory"]["suggested_tp"] == 8 and report["memory"]["suggested_pp"] == 2
    assert "--tensor-parallel-size 8 --pipeline-parallel-size 2 --enable-expert-parallel" in report["serve_command"]
    assert "--trust-remote-code" in report["serve_command"]  # config.json carries auto_map
    # vLLM resolves transformers' own DeepseekV3ForCausalLM before auto_map: the remote code it
    # cannot fetch offline is noted, not held against the model
    assert report["verdict"] == "native-speed"
    assert all(c["status"] in ("pass", "info") for c in report["checks"] if c["code"].startswith("HFC8"))


def test_schema_command_prints_a_valid_json_schema(tmp_path):
    from jsonschema import Draft202012Validator

    run = hfcheck("schema", tmp_path=tmp_path)
    assert run.returncode == 0
    Draft202012Validator.check_schema(json.loads(run.stdout))


def test_explain_all_documents_every_rule(tmp_path):
    from hfcheck.analyzer.rules.registry import RULES

    out = hfcheck("explain", "--all", tmp_path=tmp_path).stdout
    for rule in RULES:
        assert f"{rule.code} {rule.name}" in out
        assert rule.fix.strip() and rule.why.strip() and rule.example.strip()


