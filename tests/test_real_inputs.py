"""Right answers on real inputs (issue 14): real published configs, real remote code, the real CLI.

1. A TP size vLLM's native implementation refuses too is not a loss of the transformers backend.
2. Remote code's imports are judged in vLLM's environment, not in hfcheck's own venv.
3. A model the transformers backend refuses but vLLM implements natively gets the native command.
4. Any config.json, however mangled, ends as exit 0/1 with JSON or exit 2 with one line.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest
from conftest import BUNDLED
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hfcheck.analyzer.vllm.environment import serving_environment
from hfcheck.cli import main

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT.parent / "shared" / "fixtures" / "remote-real"
needs_real = pytest.mark.skipif(not REAL.is_dir(), reason="../shared/fixtures/remote-real is not here")

# Qwen/Qwen2.5-7B-Instruct's config.json as published (28 heads, 4 KV heads).
QWEN25_7B = {
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645,
    "hidden_act": "silu", "hidden_size": 3584, "initializer_range": 0.02, "intermediate_size": 18944,
    "max_position_embeddings": 32768, "max_window_layers": 28, "model_type": "qwen2", "num_attention_heads": 28,
    "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "sliding_window": 131072, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.43.1",
    "use_cache": True, "use_sliding_window": False, "vocab_size": 152064,
}


def scan(ref: str, *extra: str) -> tuple[int, str, str]:
    """``hfcheck scan REF [extra] `` in-process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(["scan", ref, *extra])
        except SystemExit as exc:  # argparse
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def scan_json(ref: str) -> dict:
    code, out, err = scan(ref, "--format", "json")
    assert code in (0, 1), err
    return json.loads(out)


def folder(tmp_path: Path, config: dict) -> str:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


def checks(report: dict, code: str) -> list[dict]:
    return [c for c in report["checks"] if c["code"] == code]


# --------------------------------------------------------------------------- 1. TP sizes native refuses too


def test_qwen25_7b_is_native_speed_with_tp8_listed_as_impossible_for_any_backend(tmp_path):
    r = scan_json(folder(tmp_path, QWEN25_7B))
    assert (r["verdict"], r["score"]) == ("native-speed", 100)  # was runs 96/100: TP 8 counted as a loss
    tp = r["parallel"]["tp"]
    assert tp["sizes"] == {"1": True, "2": True, "4": True, "8": False}
    assert tp["refusals"] == {"8": ["28 attention heads do not divide by 8"]}
    assert tp["refusal_scope"] == {"8": "any-backend"}
    ok, eight = checks(r, "HFC502")
    assert ok["status"] == "pass" and ok["message"] == "TP sizes that load: 1, 2, 4"
    assert eight["status"] == "info" and "not possible with any vLLM backend" in eight["message"] and "28 attention heads" in eight["message"]
    assert r["serve_command"] == f"vllm serve {tmp_path} --model-impl transformers"


def test_text_report_lists_why_tp8_does_not_load(tmp_path):
    code, out, _ = scan(folder(tmp_path, QWEN25_7B))
    assert code == 0
    assert "NATIVE-SPEED" in out and "TP sizes that load: 1, 2, 4" in out
    assert "not possible with any vLLM" in " ".join(out.split())


@pytest.mark.parametrize(
    "model_type,overrides",
    [("llama", {"hidden_size": 2560, "num_attention_heads": 20, "num_key_value_heads": 4}), ("qwen3", {"num_attention_heads": 20, "num_key_value_heads": 4}), ("mistral", {"num_attention_heads": 12, "num_key_value_heads": 12, "head_dim": 128})],
)
def test_geometry_refusals_never_cost_score(scan_type, model_type, overrides):
    """Head counts that do not divide are the model's shape: info, never a warning, for any family."""
    r = scan_type(model_type, **overrides)
    assert r["parallel"]["tp"]["refusals"] and set(r["parallel"]["tp"]["refusal_scope"].values()) == {"any-backend"}
    assert all(c["status"] in ("pass", "info") for c in checks(r, "HFC502"))
    assert r["verdict"] == "native-speed" and r["score"] == 100


def test_no_declared_plans_but_everything_sharded_is_native_speed(scan_type):
    """StableLM declares neither a tp nor a pp plan: the fusers shard every projection and vLLM
    infers the PP split (it logs a warning), exactly the native path's parallel options."""
    r = scan_type("stablelm")
    (tp_plan,) = checks(r, "HFC501")
    (pp_plan,) = checks(r, "HFC601")
    assert tp_plan["status"] == "pass" and "nothing is left replicated" in tp_plan["message"]
    assert pp_plan["status"] == "pass" and "infers the split" in pp_plan["message"]
    assert r["verdict"] == "native-speed"


def test_replicated_linears_are_still_a_loss(scan_type):
    """GPT-BigCode's MLP (c_fc, c_proj) is not fused, so without a plan vLLM replicates it: runs."""
    r = scan_type("gpt_bigcode")
    (tp_plan,) = checks(r, "HFC501")
    assert tp_plan["status"] == "warn" and "h.*.mlp.c_fc" in tp_plan["message"] and "h.*.mlp.c_proj" in tp_plan["message"]
    assert r["verdict"] == "runs"


# --------------------------------------------------------------------------- 2. the serving environment


def test_environment_table_is_the_modelled_release():
    from hfcheck.analyzer.vllm.release import modelled_version, tables

    env = serving_environment()
    assert env.vllm_version == modelled_version()
    assert env.transformers_requirement == tables()["pins"]["transformers"]
    assert env.provides("einops") and env.provides("torch") and env.provides("transformers") and env.provides("json")
    for absent in ("bitsandbytes", "flash_attn", "transformers_stream_generator", "accelerate", "xformers"):
        assert not env.provides(absent), absent
    assert env.transformers_still_has("5.24") == "all" and env.transformers_still_has("5.0") == "none"
    assert env.transformers_still_has("5.18") == "some"


WHEEL = Path(os.environ.get("HFCHECK_VLLM_WHEELS", "/work/wheels")) / "vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl"


@pytest.mark.skipif(not WHEEL.is_file(), reason="the vLLM 0.34.0 wheel is not on this machine")
def test_environment_table_holds_every_requirement_of_the_wheel():
    """Every Requires-Dist of vLLM 0.34.0 (no extra; Linux x86_64, Python 3.11) is in the closure
    (flashinfer-python 0.7.3, not on the package index here, as assumed)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    from hfcheck.analyzer.vllm.environment import environment_of

    with zipfile.ZipFile(WHEEL) as whl:
        meta = whl.read("vllm-0.34.0.dist-info/METADATA").decode()
    env = environment_of("0.34.0")
    have = {canonicalize_name(d) for d in env.distributions}
    marker_env = {"platform_machine": "x86_64", "sys_platform": "linux", "platform_system": "Linux", "python_version": "3.11", "python_full_version": "3.11.7", "extra": ""}
    wanted = [Requirement(line.split(":", 1)[1].strip()) for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    wanted = [r for r in wanted if r.marker is None or r.marker.evaluate(marker_env)]
    assert len(wanted) > 60
    assert {canonicalize_name(r.name) for r in wanted} <= have
    assert env.transformers_requirement == str(next(r.specifier for r in wanted if r.name == "transformers"))


def _hfc812(report: dict) -> list[dict]:
    return [c for c in checks(report, "HFC812") if c["status"] in ("fail", "warn")]


@needs_real
@pytest.mark.parametrize("name", ["mpt-7b", "falcon-7b-instruct-rw"])
def test_einops_is_not_a_blocker_vllm_installs_it(name):
    r = scan_json(str(REAL / name))
    assert not any("einops" in c["message"] for c in r["checks"])
    assert not any("einops" in b for b in r["blockers"])
    (ok,) = checks(r, "HFC812")
    assert ok["status"] == "pass" and "vLLM 0.34.0's environment" in ok["message"]


@needs_real
def test_missing_packages_named_with_the_environment_assumed():
    qwen = _hfc812(scan_json(str(REAL / "qwen-7b")))
    assert next(c for c in qwen if "transformers_stream_generator" in c["message"])["status"] == "fail"
    assert not any("einops" in c["message"] for c in qwen)
    baichuan = scan_json(str(REAL / "baichuan2-13b-chat"))
    failing = {c["message"].split(",")[0] for c in _hfc812(baichuan) if c["status"] == "fail"}
    # accelerate is in hfcheck's own test environment, but vLLM does not install it
    assert failing == {"imports bitsandbytes", "imports accelerate"}
    assert all("which is not in vLLM 0.34.0's environment" in b for b in baichuan["blockers"] if "imports" in b)


# --------------------------------------------------------------------------- 3. blocked here, served natively


def test_qwen3_next_gets_the_native_command_and_the_reason():
    r = scan_json("Qwen/Qwen3-Next-80B-A3B-Instruct")
    assert r["verdict"] == "blocked" and r["model"]["vllm_native"] is True
    assert r["serve"]["implementation"] == "native"
    assert r["serve_command"].startswith("vllm serve Qwen/Qwen3-Next-80B-A3B-Instruct") and "--model-impl" not in r["serve_command"]
    assert "--tensor-parallel-size" in r["serve_command"] and f"--tensor-parallel-size {r['memory']['suggested_tp']}" in r["serve_command"]
    note = r["serve"]["note"]
    assert "native implementation of Qwen3NextForCausalLM" in note and "--model-impl transformers" in note and "linear_attention" in note
    code, out, _ = scan("Qwen/Qwen3-Next-80B-A3B-Instruct")
    assert code == 1
    text = " ".join(out.split())
    assert "No vllm serve command" not in text and "Run it with vLLM's native implementation:" in text
    assert "vllm serve Qwen/Qwen3-Next-80B-A3B-Instruct --tensor-parallel-size" in text


def test_tui_detail_pane_shows_the_native_command():
    from rich.console import Console

    from hfcheck.tui.detail import report_detail

    r = scan_json("Qwen/Qwen3-Next-80B-A3B-Instruct")
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(report_detail(r))
    text = " ".join(console.export_text().split())
    assert "Run it (vLLM's native implementation): vllm serve Qwen/Qwen3-Next-80B-A3B-Instruct" in text
    assert "No vllm serve command" not in text and "cannot serve it" in text


@needs_real
def test_blocked_without_native_says_both():
    r = scan_json(str(REAL / "qwen-7b"))
    assert r["verdict"] == "blocked" and r["model"]["vllm_native"] is False
    assert r["serve_command"] is None and r["serve"]["implementation"] is None
    assert "no native implementation of QWenLMHeadModel" in r["serve"]["note"]


# --------------------------------------------------------------------------- 4. bad input, every field

BASE = json.loads((BUNDLED / "Qwen__Qwen3-4B" / "config.json").read_text())
KEYS = sorted(set(BASE) | {"auto_map", "quantization_config", "text_config", "layer_types", "num_experts", "kv_lora_rank", "is_encoder_decoder", "routed_scaling_factor"})
BAD_VALUES = st.one_of(
    st.none(),
    st.integers(min_value=-(10**6), max_value=-1),
    st.integers(min_value=10**6, max_value=10**18),
    st.sampled_from([0, 1, 2.5, math.nan, math.inf, -math.inf, True, False, "", "x", "auto", [], [1], ["x"], [None], {}, {"a": 1}, {"AutoModel": 3}]),
    st.text(max_size=8),
    st.lists(st.integers(min_value=-5, max_value=10**9), max_size=3),
    st.dictionaries(st.text(max_size=4), st.one_of(st.none(), st.integers(), st.text(max_size=4)), max_size=2),
)
DELETE = object()
MUTATION = st.tuples(st.sampled_from(KEYS), st.one_of(st.just(DELETE), BAD_VALUES))


def _mutate(mutations) -> dict:
    config = dict(BASE)
    for key, value in mutations:
        if value is DELETE:
            config.pop(key, None)
        else:
            config[key] = value
    return config


def _assert_clean_ending(config: dict) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(config))
        code, out, err = scan(tmp, "--format", "json")
    assert "Traceback" not in err
    assert code in (0, 1, 2), (code, err)
    if code == 2:
        assert len(err.strip().splitlines()) == 1 and err.startswith("hfcheck: error: "), err
    else:
        report = json.loads(out)
        assert report["verdict"] in ("native-speed", "runs", "blocked", "inconclusive")


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(MUTATION, min_size=1, max_size=3))
def test_any_mutation_of_a_real_config_ends_cleanly(mutations):
    _assert_clean_ending(_mutate(mutations))


@pytest.mark.parametrize(
    "key,value,needle",
    [
        ("auto_map", "x", 'auto_map is "x" (a string), expected an object'),
        ("architectures", 3, "architectures is 3, expected a list of class names"),
        ("num_hidden_layers", 10**12, "num_hidden_layers is 1000000000000, expected an integer from 1 to 10000"),
        ("num_attention_heads", "x", 'num_attention_heads is "x" (a string), expected an integer'),
        ("quantization_config", [1], "quantization_config is [1] (a list), expected an object"),
        ("model_type", ["qwen3"], 'model_type is ["qwen3"] (a list), expected a string'),
    ],
)
def test_the_issue_examples_are_one_line_errors(tmp_path, key, value, needle):
    config = dict(BASE, **{key: value})
    code, out, err = scan(folder(tmp_path, config), "--format", "json")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert needle in err


def test_the_real_cli_prints_one_line_for_a_string_auto_map(tmp_path):
    run = subprocess.run([sys.executable, "-m", "hfcheck", "scan", folder(tmp_path, dict(BASE, auto_map="x")), "--format", "json"],
                         capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.strip().splitlines() == [f'hfcheck: error: {tmp_path}: config.json: auto_map is "x" (a string), expected an object mapping Auto classes to \'module.Class\' references']


def test_every_real_config_passes_the_border():
    """The field checks refuse no real config: every transformers default, bundled snapshot and fixture."""
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from hfcheck.analyzer.facts.config_fields import check_config

    seen = 0
    for model_type in CONFIG_MAPPING:
        try:
            config = AutoConfig.for_model(model_type).to_dict()
        except Exception:  # noqa: BLE001 - transformers' own default that does not build
            continue
        check_config(config)
        seen += 1
    for path in [*BUNDLED.glob("*/config.json"), *(ROOT.parent / "shared" / "fixtures").glob("*/*/config.json"), *(ROOT / "tests" / "fixtures").glob("*/*/config.json")]:
        check_config(json.loads(path.read_text()))
        seen += 1
    assert seen > 300
