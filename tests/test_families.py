"""Every family the issue names, scanned from real transformers code (default configs,
structural tiny instance on the meta device). Expected values are what vLLM 0.33's own
``get_fusers`` and load-time gates decide (cross-checked with vLLM installed)."""

from __future__ import annotations

import pytest
import torch
from jsonschema import validate
from torch import nn

from hfcheck.analyzer.fusions.base import FusionContext
from hfcheck.analyzer.report import schema


def fusions(report, cls):
    return next(m["fusions"] for m in report["modules"] if m["class"] == cls)


def check(report, code):
    return [c for c in report["checks"] if c["code"] == code]


@pytest.mark.parametrize(
    "model_type",
    ["qwen3", "qwen3_moe", "llama", "mistral", "mixtral", "gemma3_text", "phi3", "gpt2", "gpt_neox", "deepseek_v3",
     "gpt_oss", "olmo2", "falcon_h1", "jamba", "mamba", "mamba2", "qwen3_next", "bamba", "minimax", "lfm2", "t5", "bart"],
)
def test_report_matches_schema(scan_type, model_type):
    validate(scan_type(model_type), schema())


def test_qwen3_native_speed(scan_type):
    r = scan_type("qwen3")
    assert r["verdict"] == "native-speed" and r["score"] == 100
    assert fusions(r, "Qwen3Attention") == ["qkv"]
    assert fusions(r, "Qwen3MLP") == ["glu"]
    assert fusions(r, "Qwen3RMSNorm") == ["rms_norm"]
    assert next(m for m in r["modules"] if m["class"] == "Qwen3Attention")["attention_interface"]
    assert r["parallel"]["tp"]["plan"]["source"] == "declared"
    assert r["parallel"]["pp"]["supported"] and not r["parallel"]["ep"]["supported"]
    assert r["serve_command"].startswith("vllm serve ")


def test_qwen3_moe_experts_replaced_internal_routing(scan_type):
    r = scan_type("qwen3_moe")
    (moe,) = r["moe"]
    assert moe["class"] == "Qwen3MoeSparseMoeBlock"
    assert moe["experts_replaceable"] and moe["internal_routing"]
    assert r["parallel"]["ep"]["supported"]
    assert r["verdict"] == "native-speed"


@pytest.mark.parametrize("model_type,attn,mlp", [("llama", "LlamaAttention", "LlamaMLP"), ("mistral", "MistralAttention", "MistralMLP"), ("olmo2", "Olmo2Attention", "Olmo2MLP")])
def test_dense_llama_like(scan_type, model_type, attn, mlp):
    r = scan_type(model_type)
    assert fusions(r, attn) == ["qkv"] and fusions(r, mlp) == ["glu"]
    assert r["verdict"] == "native-speed"


def test_olmo2_full_width_qk_norms_are_rms_norms(scan_type):
    # q/k norms over the full width: vLLM's TP-aware RMSNorm all-gathers them
    r = scan_type("olmo2")
    assert fusions(r, "Olmo2RMSNorm") == ["rms_norm"]


def test_mixtral_experts(scan_type):
    r = scan_type("mixtral")
    (moe,) = r["moe"]
    assert moe["experts_replaceable"] and moe["internal_routing"]


def test_gemma3_sliding_layers(scan_type):
    r = scan_type("gemma3_text")
    kinds = {layer["type"] for layer in r["layers"]}
    assert kinds == {"sliding_attention", "full_attention"}
    assert all(layer["attention_interface"] for layer in r["layers"])
    assert fusions(r, "Gemma3Attention") == ["qkv"] and fusions(r, "Gemma3MLP") == ["glu"]
    assert r["verdict"] == "native-speed"


def test_phi3_packed_projections_do_not_fuse(scan_type):
    r = scan_type("phi3")
    assert fusions(r, "Phi3Attention") == []
    assert r["verdict"] == "runs"
    assert check(r, "HFC301")[0]["status"] == "fail"


def test_gpt2_conv1d(scan_type):
    r = scan_type("gpt2")
    assert fusions(r, "GPT2Attention") == []
    assert "Conv1D" in check(r, "HFC301")[0]["message"] or "not nn.Linear" in check(r, "HFC301")[0]["message"]
    assert r["parallel"]["tp"]["sizes"] == {"1": True, "2": True, "4": True, "8": False}  # 12 heads
    assert "12 attention heads do not divide by 8" in r["parallel"]["tp"]["refusals"]["8"]


def test_gpt_neox_packed_without_split(scan_type):
    r = scan_type("gpt_neox")
    assert fusions(r, "GPTNeoXAttention") == []
    assert r["verdict"] == "runs"


def test_deepseek_v3_mla_and_shared_experts(scan_type):
    r = scan_type("deepseek_v3")
    assert fusions(r, "DeepseekV3Attention") == ["mla"]
    (moe,) = r["moe"]
    assert moe["experts_replaceable"] and moe["internal_routing"]
    assert "shared" in moe["reason"]
    assert check(r, "HFC205")[0]["status"] == "pass"  # head size kv_lora_rank + rope = 576


@pytest.mark.parametrize("model_type,head_size", [("minicpm3", 32), ("youtu", 64)])
def test_mla_outside_vllms_deepseek_types_is_refused_for_its_head_size(scan_type, model_type, head_size):
    # Measured on vLLM 0.32 (CPU build): "Head dimension 64 is not supported by MLA" at the first
    # forward; vLLM takes kv_lora_rank + rope only for the DeepSeek-style types it lists.
    r = scan_type(model_type)
    (finding,) = check(r, "HFC205")
    assert finding["status"] == "fail" and f"head size {head_size}" in finding["message"]
    assert r["verdict"] == "blocked"


def test_values_of_another_head_size_than_keys_are_refused(scan_type):
    # Measured on vLLM 0.32 (CPU build): MiMo-V2-Flash's values are 128 wide per head, its keys 192;
    # vLLM gives both one head size: "shape '[-1, 2048]' is invalid for input of size 512".
    r = scan_type("mimo_v2_flash")
    (finding,) = check(r, "HFC206")
    assert finding["status"] == "fail" and "makes 768 features and its value projection 512" in finding["message"]
    assert r["verdict"] == "blocked"
    # gemma3: head_dim 256 with hidden 2304; gemma4: per-layer head_dim (256 sliding, 512 global);
    # qwen3_next: gated attention, q_proj makes queries and the gate
    for model_type in ("qwen3", "gemma3_text", "gemma4_text", "qwen3_next"):
        assert check(scan_type(model_type), "HFC206")[0]["status"] == "pass"
    assert check(scan_type("deepseek_v3"), "HFC206") == []  # MLA takes v_head_dim itself


def test_no_kv_lora_rank_no_mla_head_size_gate(scan_type):
    assert check(scan_type("qwen3"), "HFC205") == []


def test_gpt_oss_sinks_biased_experts_and_mxfp4(scan_type):
    r = scan_type("gpt_oss")
    (moe,) = r["moe"]
    assert not moe["experts_replaceable"] and "2-D" in moe["reason"]
    assert check(r, "HFC203")[0]["details"]["sinks"] is True
    assert not r["parallel"]["ep"]["supported"]
    q = scan_type("gpt_oss", quantization_config={"quant_method": "mxfp4"})
    assert q["verdict"] == "blocked" and any("mxfp4" in b for b in q["blockers"])


@pytest.mark.parametrize(
    "model_type,kind",
    [("mamba", "linear_attention"), ("mamba2", "linear_attention"), ("jamba", "linear_attention"), ("qwen3_next", "linear_attention"), ("bamba", "linear_attention"), ("minimax", "linear_attention")],
)
def test_linear_layers_block(scan_type, model_type, kind):
    r = scan_type(model_type)
    assert r["verdict"] == "blocked"
    # never the transformers backend; vLLM's own implementation where it has one
    assert r["serve"]["implementation"] == ("native" if r["model"]["vllm_native"] else None)
    assert "--model-impl" not in (r["serve_command"] or "") and (r["serve_command"] is None) == (not r["model"]["vllm_native"])
    blocking = [layer for layer in r["layers"] if not layer["attention_interface"]]
    assert blocking and all(layer["type"] == kind for layer in blocking)
    (finding,) = [c for c in check(r, "HFC201") if c["status"] == "fail"]
    assert f"{kind} layers {blocking[0]['index']}" in finding["message"]


def test_qwen3_next_names_its_linear_layers(scan_type):
    r = scan_type("qwen3_next")
    blocking = [layer["index"] for layer in r["layers"] if not layer["attention_interface"]]
    assert blocking[:6] == [0, 1, 2, 4, 5, 6]


def test_falcon_h1_ssm_beside_attention_blocked(scan_type):
    r = scan_type("falcon_h1")
    assert r["verdict"] == "blocked"
    assert check(r, "HFC202")[0]["status"] == "fail"


def test_lfm2_conv_layers_blocked(scan_type):
    r = scan_type("lfm2", layer_types=["conv", "conv", "full_attention", "conv", "full_attention", "conv"], num_hidden_layers=6)
    assert r["verdict"] == "blocked"
    assert [layer["index"] for layer in r["layers"] if not layer["attention_interface"]] == [0, 1, 3, 5]


@pytest.mark.parametrize("model_type", ["t5", "bart"])
def test_encoder_decoder_refused(scan_type, model_type):
    r = scan_type(model_type)
    assert r["verdict"] == "blocked"
    assert check(r, "HFC204")[0]["status"] == "fail"


def test_gemma4_existence_guard_is_folded_before_the_alias_check(scan_type):
    # `value_states = self.v_proj(x) if self.v_proj is not None else key_states`: vLLM folds the
    # guard to True, so the else-branch alias does not block the qkv fusion
    r = scan_type("gemma4_text")
    assert fusions(r, "Gemma4TextAttention") == ["qkv"]


def test_heterogeneous_config_reads_largest_per_layer_value():
    from transformers import AutoConfig

    from hfcheck.analyzer.facts import collect_facts

    config = AutoConfig.for_model("gemma4_text").to_dict()
    facts, _ = collect_facts({**config, "architectures": ["Gemma4ForCausalLM"]})
    assert facts.head_dim and facts.head_dim >= 256


def test_deepseek_v2_block_taken_over_with_transformers_routing(scan_type):
    # the grouped-limited router is not one vLLM runs, but the shared expert moves into FusedMoE
    r = scan_type("deepseek_v2")
    (moe,) = r["moe"]
    assert moe["experts_replaceable"] and not moe["internal_routing"] and moe["block_taken_over"]


def test_cache_argument_is_concrete_none():
    # transformers 5.24 renamed past_key_values -> cache; both are traced as None, as vLLM does
    import torch
    from transformers import AutoConfig, AutoModel

    from hfcheck.analyzer.graph.tracer import trace_module
    from hfcheck.analyzer.instance import register_attention

    register_attention()
    config = AutoConfig.for_model("qwen3", num_hidden_layers=1)
    config._attn_implementation = "hfcheck"
    with torch.device("meta"):
        model = AutoModel.from_config(config)
    traced = trace_module(model.layers[0].self_attn)
    assert traced.complete, traced.error
    assert not [n for n in traced.graph.nodes if n.op == "placeholder" and n.target in ("cache", "past_key_values")]


def test_checkpoint_names_vllm_cannot_load_block(scan_type):
    """What vLLM 0.32 (CPU build) refused at load in the runtime cross-check, predicted statically:
    a head kept outside the base model and lm_head, and an ignore pattern that also matches a weight."""
    bert = scan_type("bert")
    (finding,) = check(bert, "HFC105")
    assert finding["status"] == "fail" and "cls.predictions" in finding["message"]
    assert bert["verdict"] == "blocked"
    gpt2 = scan_type("gpt2")
    (finding,) = check(gpt2, "HFC105")
    assert finding["status"] == "fail" and "transformer.h.0.attn.c_attn.bias" in finding["details"]["dropped"]
    for model_type in ("llama", "opt", "bloom"):  # heads named lm_head, no stray patterns
        (finding,) = check(scan_type(model_type), "HFC105")
        assert finding["status"] == "pass", (model_type, finding)


def test_vllm_release_modelled_moe_fuser(tmp_path):
    """vLLM 0.32's MoE block fuser (the CPU build's) does not match a router that scores after
    its top-k, so granitemoe_swa keeps transformers routing there (as vLLM 0.32 logged at runtime),
    while 0.33 routes it itself. The release is chosen with --vllm and reaches the workers."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HFCHECK_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("HFCHECK_VLLM", None)
    got = {}
    for release in ("0.32", "0.33.0"):
        proc = subprocess.run([sys.executable, "-m", "hfcheck", "sweep", "type:granitemoe_swa", "--vllm", release, "--format", "json",
                               "--no-atlas", "--jobs", "1"], capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr
        (report,) = json.loads(proc.stdout).values()
        got[release] = report
    assert got["0.32"]["vllm_version_modelled"] == "0.32.0" and got["0.33.0"]["vllm_version_modelled"] == "0.33.0"
    # each in the transformers release its vLLM runs with (the newest its pin admits), platform included
    assert got["0.32"]["target"]["transformers"] == "5.19.0" and got["0.32"]["target"]["platform"] == "cpu"
    assert got["0.33.0"]["target"]["transformers"] == "5.20.2" and got["0.33.0"]["target"]["platform"] == "cuda"
    assert got["0.32"]["target"]["transformers_source"] == "environment"  # no release hfcheck's setup installs is in 0.32's pin
    (old,), (new,) = got["0.32"]["moe"], got["0.33.0"]["moe"]
    assert not old["internal_routing"] and "0.32" in old["reason"] and got["0.32"]["verdict"] == "runs"
    assert new["internal_routing"] and got["0.33.0"]["verdict"] == "native-speed"
    bad = subprocess.run([sys.executable, "-m", "hfcheck", "sweep", "type:granitemoe", "--vllm", "0.31"], capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "hfcheck: error: vLLM 0.31 is not modelled (hfcheck models 0.32.0, 0.33.0, 0.34.0; scripts/vllm_release_drill.py adds a release)"]


@pytest.mark.parametrize(("release", "status"), [("0.32", "fail"), ("0.33", "pass")])
def test_moe_config_fields_per_release(tmp_path, monkeypatch, release, status):
    """Aria names its top-k `moe_topk`: vLLM 0.32's MoE backend reads only num_experts_per_tok /
    top_k and stops on an assert (as it did at runtime); 0.33 reads the alias."""
    from conftest import write_model

    from hfcheck.analyzer.analysis import analyse
    from hfcheck.analyzer.report import build_report
    from hfcheck.analyzer.sources import resolve

    monkeypatch.setenv("HFCHECK_VLLM", release)
    report = build_report(analyse(resolve(str(write_model(tmp_path, "aria_text")))))
    (finding,) = check(report, "HFC404")
    assert finding["status"] == status, finding
    assert report["vllm_version_modelled"] == f"{release}.0"
    assert (report["verdict"] == "blocked") == (status == "fail")


@pytest.mark.parametrize(("release", "status"), [("0.32", "fail"), ("0.33", "pass")])
def test_router_inputs_vllm_032_drops(tmp_path, monkeypatch, release, status):
    """MiniMax-M2 calls its router with the block's e_score_correction_bias; vLLM 0.32 takes the
    block over (as it logged at runtime) with the router's weight alone, so the bias is lost."""
    from conftest import write_model

    from hfcheck.analyzer.analysis import analyse
    from hfcheck.analyzer.report import build_report
    from hfcheck.analyzer.sources import resolve

    monkeypatch.setenv("HFCHECK_VLLM", release)
    report = build_report(analyse(resolve(str(write_model(tmp_path, "minimax_m2")))))
    (finding,) = check(report, "HFC405")
    assert finding["status"] == status, finding
    if status == "fail":
        assert "self.e_score_correction_bias" in finding["message"] and report["verdict"] == "blocked"


def test_experts_with_more_rows_than_vllms_expert_count(scan_type):
    # Measured on vLLM 0.32 (CPU build): LongCat-Flash routes among its real and zero-compute
    # experts, FusedMoE holds the real ones only: "size mismatch, got input (8), mat (8x64), vec (0)".
    r = scan_type("longcat_flash")
    (finding,) = check(r, "HFC407")
    assert finding["status"] == "fail" and "gate_up_proj has" in finding["message"] and "down_proj" not in finding["message"]
    assert r["verdict"] == "blocked"
    for model_type in ("qwen3_moe", "deepseek_v3", "mixtral"):
        assert check(scan_type(model_type), "HFC407")[0]["status"] == "pass", model_type


def test_linear_subclass_router_is_lost_to_vllms_linear(scan_type):
    # Measured on vLLM 0.32 (CPU build): PhiMoE's router (an nn.Linear subclass returning three
    # tensors) is replaced by vLLM's linear and the block fails: "too many values to unpack".
    r = scan_type("phimoe")
    (finding,) = check(r, "HFC106")
    assert finding["status"] == "fail" and "PhimoeTopKRouter" in finding["message"] and "tuple" in finding["message"]
    assert r["verdict"] == "blocked"
    assert check(scan_type("qwen3"), "HFC106")[0]["status"] == "pass"


def test_linear_forward_lost_runs_the_subclass_forward():
    from transformers.models.falcon.modeling_falcon import FalconLinear
    from transformers.models.phimoe.modeling_phimoe import PhimoeConfig, PhimoeTopKRouter

    from hfcheck.analyzer.analysis.observe import linear_forward_lost

    class ScaledHead(nn.Linear):  # dory's lm_head shape: a per-output scale after the product
        def __init__(self):
            super().__init__(8, 4, bias=False)
            self.scale = nn.Parameter(torch.ones(4))

        def forward(self, x):
            return super().forward(x) * self.scale

    assert linear_forward_lost(FalconLinear(8, 4, bias=True)) is None  # x @ W.T + b by hand: same numbers
    assert linear_forward_lost(nn.Linear(8, 4)) is None
    assert "more than" in linear_forward_lost(ScaledHead())
    router = PhimoeTopKRouter(PhimoeConfig(hidden_size=8, num_local_experts=4, num_experts_per_tok=2))
    assert "tuple" in linear_forward_lost(router)
    with torch.device("meta"):  # the structural instance lives on the meta device
        meta_router = PhimoeTopKRouter(PhimoeConfig(hidden_size=8, num_local_experts=4, num_experts_per_tok=2))
    assert "tuple" in linear_forward_lost(meta_router)


def test_one_process_scanning_two_sizes_of_a_class_answers_for_each(tmp_path):
    """A trace bakes the instance's sizes into the split (GPTBigCode's ``split((self.embed_dim,
    self.kv_dim, self.kv_dim))``). A port re-scans its shrunk candidate and then its output in
    one process: the second answer must not be the first size's (it once said "split sizes
    (64, 16, 16) do not divide by head_dim 32", 75/100, for a folder a fresh scan gives 96)."""
    import json

    from hfcheck.analyzer.analysis import analyse
    from hfcheck.analyzer.report import build_report
    from hfcheck.analyzer.sources import resolve

    def scan(width: int) -> dict:
        folder = tmp_path / f"bigcode-{width}"
        folder.mkdir()
        config = {"architectures": ["GPTBigCodeForCausalLM"], "model_type": "gpt_bigcode", "vocab_size": 256, "n_embd": width,
                  "n_layer": 2, "n_head": 4, "n_inner": 4 * width, "multi_query": True}
        (folder / "config.json").write_text(json.dumps(config))
        report = build_report(analyse(resolve(str(folder))))
        return {c["code"]: c["status"] for c in report["checks"]} | {"score": report["score"]}

    small, large = scan(64), scan(128)
    assert small["HFC301"] == "pass" and large["HFC301"] == "pass", (small, large)
    assert small["score"] == large["score"]


@pytest.mark.parametrize(("model_type", "taken_over"), [("qwen3_moe", True), ("deepseek_v2", True), ("gpt_oss", False)])
def test_moe_block_is_a_pattern(model_type, taken_over):
    """vLLM's MoE block fuser is a Pattern like the others: ``find`` on a block holding experts
    (nothing on any other module), ``validate`` passes where vLLM takes the block forward over
    and otherwise says why transformers keeps routing (the scan's own MoE reading)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from hfcheck.analyzer.fusions.moe import EXPERTS_NAME, MoEBlockFusion

    config = AutoConfig.for_model(model_type, num_hidden_layers=2, hidden_size=64, intermediate_size=64, moe_intermediate_size=32,
                                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=128)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    found = {path: (module, MoEBlockFusion.find(None, module)) for path, module in model.named_modules()}
    blocks = {path: (module, match) for path, (module, match) in found.items() if match is not None}
    assert blocks and all(dict(module.named_children()).get(EXPERTS_NAME) is not None for module, _ in blocks.values())
    assert not any(EXPERTS_NAME in dict(module.named_children()) for path, (module, match) in found.items() if match is None)
    ctx = FusionContext(head_size=16)
    for module, match in blocks.values():
        assert (match.fusion, match.projections) == ("moe", (EXPERTS_NAME,))
        reason = MoEBlockFusion.validate(match, module, ctx)
        assert (reason is None) == taken_over
        assert reason == (None if taken_over else MoEBlockFusion.analyse(module, ctx).routing_reason)
