"""The tiny instances keep the structure vLLM decides on."""

from __future__ import annotations

import pytest
import torch
from conftest import causal_lm_architecture
from transformers import AutoConfig

from hfcheck.analyzer.facts import collect_facts
from hfcheck.analyzer.instance import build_structural, build_tiny
from hfcheck.analyzer.instance.shrink import (
    CROSS_CHECK_LAYERS,
    cut_every_layer_list,
    cut_layers,
    structural_prefix,
)


def facts_for(model_type: str, **overrides):
    config = AutoConfig.for_model(model_type, **overrides).to_dict()
    config["architectures"] = [causal_lm_architecture(model_type)]
    return collect_facts(config)


def test_structural_prefix_keeps_every_kind_in_order():
    facts, cfg = facts_for("qwen3_next")  # every 4th layer full attention
    inst = build_structural(facts, cfg)
    assert inst.kept_layers == 4
    assert inst.layer_types == ["linear_attention"] * 3 + ["full_attention"]
    assert all(p.is_meta for p in inst.model.parameters())


def test_structural_prefix_keeps_dense_first_and_moe_layers():
    facts, cfg = facts_for("deepseek_v3", first_k_dense_replace=3)
    assert structural_prefix(facts, cfg.get_text_config()) == 4
    inst = build_structural(facts, cfg)
    mlps = [type(layer.mlp).__name__ for layer in inst.model.layers]
    assert mlps == ["DeepseekV3MLP"] * 3 + ["DeepseekV3MoE"]
    assert len(inst.model.layers[3].mlp.experts.gate_up_proj) == 4  # experts cut to 4, real widths


def test_structural_keeps_real_widths_on_meta():
    facts, cfg = facts_for("qwen3", hidden_size=2560, intermediate_size=9728, num_attention_heads=32, num_key_value_heads=8, head_dim=128, num_hidden_layers=36)
    inst = build_structural(facts, cfg)
    attn = inst.model.layers[0].self_attn
    assert attn.q_proj.out_features == 32 * 128 and attn.k_proj.out_features == 8 * 128
    assert inst.kept_layers == 1


def test_tiny_keeps_gqa_ratio_and_runs_on_cpu():
    facts, cfg = facts_for("qwen3", num_attention_heads=32, num_key_value_heads=8)
    inst = build_tiny(facts, cfg)
    assert inst.shrink == "tiny"
    text = inst.config.get_text_config()
    assert text.num_attention_heads // text.num_key_value_heads == 4
    assert text.num_key_value_heads == 2
    out = inst.model(input_ids=torch.tensor([[1, 2, 3, 4]]))
    assert out.last_hidden_state.shape == (1, 4, text.hidden_size)
    assert torch.isfinite(out.last_hidden_state).all()


@pytest.mark.parametrize("model_type", ["qwen3_moe", "deepseek_v3", "gemma3_text", "gpt_oss", "mixtral", "olmo2", "phi3", "gpt2"])
def test_tiny_runs_forward(model_type):
    facts, cfg = facts_for(model_type)
    inst = build_tiny(facts, cfg)
    assert inst.shrink == "tiny"
    assert sum(p.numel() for p in inst.model.parameters()) < 5_000_000
    out = inst.model(input_ids=torch.tensor([[1, 2, 3, 4, 5]]))
    assert torch.isfinite(out.last_hidden_state).all()
    if facts.is_moe:
        text = inst.config.get_text_config()
        experts = next(getattr(text, f) for f in ("num_experts", "n_routed_experts", "num_local_experts") if isinstance(getattr(text, f, None), int))
        assert experts >= 2


def test_tiny_mla_ranks_kept():
    facts, cfg = facts_for("deepseek_v3")
    inst = build_tiny(facts, cfg)
    text = inst.config.get_text_config()
    assert text.kv_lora_rank == 32 and text.q_lora_rank == 32


def test_tiny_keeps_per_layer_overrides_in_proportion():
    """Gemma 4's global layers override head_dim (512 beside 256): the tiny instance keeps one
    such layer, with the same 2:1 ratio, and per-layer embeddings small enough to run."""
    facts, cfg = facts_for("gemma4_text")
    inst = build_tiny(facts, cfg)
    assert inst.shrink == "tiny"
    text = inst.model.config.get_text_config()
    head_dims = [layer.head_dim for layer in text.per_layer_config]
    assert head_dims[-1] == 2 * head_dims[0] and set(head_dims[:-1]) == {head_dims[0]}
    assert inst.layer_types[-1] == "full_attention"
    assert sum(p.numel() for p in inst.model.parameters()) < 5_000_000
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        assert inst.model(input_ids=ids).last_hidden_state.shape[:2] == (1, 3)


def test_tiny_leaves_read_only_config_properties():
    from transformers import AutoModelForCausalLM

    from hfcheck.analyzer.instance.shrink import shrunk_config

    facts, cfg = facts_for("falcon")  # FalconConfig.head_dim is hidden_size // num_attention_heads
    small, _ = shrunk_config(facts, cfg, "tiny", head_dim=32)
    assert small.head_dim == 32 and small.hidden_size < cfg.hidden_size
    model = AutoModelForCausalLM.from_config(small)
    assert model.transformer.h[0].self_attention.head_dim == 32


def test_the_cross_check_cut_shortens_every_per_layer_list():
    """The cross-check harness builds vLLM's and hfcheck's model from one cut (analyzer/instance/shrink.py,
    beside the scan's): every list as long as the layer count is cut with it, where the scan's
    ``cut_layers`` keeps the lists it does not name (llama4_text's ``no_rope_layers``)."""
    config = AutoConfig.for_model("llama4_text")
    text = config.get_text_config()
    full = text.num_hidden_layers
    assert full > CROSS_CHECK_LAYERS and len(text.no_rope_layers) == full
    assert cut_every_layer_list(config) == (full, CROSS_CHECK_LAYERS)
    assert text.num_hidden_layers == len(text.no_rope_layers) == len(text.layer_types) == CROSS_CHECK_LAYERS
    assert cut_every_layer_list(config) == (CROSS_CHECK_LAYERS, CROSS_CHECK_LAYERS)  # a second cut changes nothing

    scan_cut = AutoConfig.for_model("llama4_text").get_text_config()
    cut_layers(scan_cut, CROSS_CHECK_LAYERS)
    assert scan_cut.num_hidden_layers == CROSS_CHECK_LAYERS and len(scan_cut.no_rope_layers) == full
