"""Per-layer kinds from configs: real Hub configs, each convention as a raw dict, and the dict
path checked against the config objects transformers builds for the same arguments."""

from __future__ import annotations

import json
import logging
import warnings
from collections import Counter
from pathlib import Path

import pytest

from hfcheck.analyzer.facts.layer_types import (
    KNOWN_KINDS,
    SOFTMAX_KINDS,
    layer_types,
    normalise_kind,
    num_layers,
)

transformers = pytest.importorskip("transformers")
from transformers import AutoConfig  # noqa: E402
from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES  # noqa: E402

transformers.logging.set_verbosity_error()

FIXTURES = Path("/work/shared/fixtures/hub")

F, S, L = "full_attention", "sliding_attention", "linear_attention"


def _fixture(name: str) -> dict:
    path = FIXTURES / name / "config.json"
    if not path.exists():
        pytest.skip(f"fixture {name} not present")
    data = json.loads(path.read_text())
    return data.get("text_config", data)


def _build(model_type: str, **kwargs):
    """transformers' own config object for these arguments (its text config)."""
    if model_type not in CONFIG_MAPPING_NAMES:
        pytest.skip(f"{model_type} is not in this transformers release")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.disable(logging.WARNING)
        try:
            config = AutoConfig.for_model(model_type, **kwargs)
        finally:
            logging.disable(logging.NOTSET)
    try:
        text = config.get_text_config()
    except Exception:  # noqa: BLE001 - a config without a text config
        text = config
    return text


# The dict-path conventions are read from transformers 5.24; older releases derive some
# defaults differently (llama4_text chunking, recurrent_gemma), and there hfcheck reads the
# config object itself, so for those types the dict-vs-object comparison only holds from 5.24 on.
OLDER_CONVENTIONS = frozenset({"llama4_text", "recurrent_gemma"})
"""Types whose dict path follows 5.24's convention (checked on 5.22.2 and 5.20.2: only these differ)."""
BEFORE_524 = tuple(int(x) for x in transformers.__version__.split(".")[:2]) < (5, 24)


def newest_convention(model_type: str) -> None:
    if BEFORE_524 and model_type in OLDER_CONVENTIONS:
        pytest.skip(f"{model_type}'s layer-type convention was read from transformers 5.24")


def _reference(model_type: str, **kwargs) -> list[str]:
    declared = _build(model_type, **kwargs).layer_types
    assert declared is not None, f"{model_type} keeps no layer_types"
    return [normalise_kind(k) for k in declared]


# --------------------------------------------------------------------------- vocabulary


def test_softmax_kinds_are_the_four_vllm_serves():
    assert {"full_attention", "sliding_attention", "chunked_attention", "window_attention"} == SOFTMAX_KINDS
    assert SOFTMAX_KINDS < KNOWN_KINDS


def test_known_kinds_cover_transformers_allowed_types():
    from transformers.configuration_utils import ALLOWED_ATTN_LAYER_TYPES

    assert set(ALLOWED_ATTN_LAYER_TYPES) <= KNOWN_KINDS


@pytest.mark.parametrize(
    ("raw", "kind"),
    [
        ("mamba", L),
        ("attention", F),
        ("deepseek_sparse_attention", "indexed_attention"),
        ("qwen_sparse_attention", "indexed_attention"),
        ("recurrent", L),
        ("Full_Attention", F),
        ("sliding-attention", S),
        ("hybrid", "hybrid"),
        ("SomethingNew", "somethingnew"),
    ],
)
def test_normalise_kind(raw, kind):
    assert normalise_kind(raw) == kind


def test_legacy_remap_matches_transformers():
    from transformers.configuration_utils import _LEGACY_LAYER_TYPE_REMAP

    for old, new in _LEGACY_LAYER_TYPE_REMAP.items():
        assert normalise_kind(old) == new


# --------------------------------------------------------------------------- real Hub configs


def test_qwen3_next_fixture_every_fourth_layer_full():
    kinds = layer_types(_fixture("Qwen__Qwen3-Next-80B-A3B-Instruct"))
    assert len(kinds) == 48
    assert kinds == [F if (i + 1) % 4 == 0 else L for i in range(48)]
    assert Counter(kinds) == {L: 36, F: 12}


def test_nemotron_h_fixture_follows_pattern():
    cfg = _fixture("nvidia__Nemotron-H-56B-Base-8K")
    pattern = cfg["hybrid_override_pattern"]
    kinds = layer_types(cfg)
    assert len(kinds) == len(pattern) == cfg["num_hidden_layers"] == 118
    assert kinds == [{"M": L, "*": F, "-": "mlp", "E": "moe"}[c] for c in pattern]
    assert Counter(kinds) == {L: 54, "mlp": 54, F: 10}
    assert [i for i, k in enumerate(kinds) if k == F][:2] == [pattern.index("*"), pattern.index("*", pattern.index("*") + 1)]


def test_gpt_oss_fixture_explicit_layer_types():
    cfg = _fixture("openai__gpt-oss-20b")
    kinds = layer_types(cfg)
    assert kinds == cfg["layer_types"]
    assert kinds == [S if i % 2 == 0 else F for i in range(24)]


def test_qwen3_4b_fixture_all_full():
    assert layer_types(_fixture("Qwen__Qwen3-4B")) == [F] * 36


@pytest.mark.parametrize(
    ("name", "count"),
    [
        ("Qwen__Qwen3-0.6B", 28),
        ("Qwen__Qwen3-32B", 64),
        ("Qwen__Qwen3-30B-A3B", 48),
        ("Qwen__Qwen3-235B-A22B-FP8", 94),
        ("deepseek-ai__DeepSeek-V3", 61),
        ("meta-llama__Llama-3.1-8B", 32),
        ("mistralai__Mixtral-8x7B-v0.1", 32),
        ("THUDM__chatglm3-6b", 28),  # remote code, count under `num_layers`
    ],
)
def test_softmax_only_fixtures_all_full(name, count):
    kinds = layer_types(_fixture(name))
    assert kinds == [F] * count


FIXTURE_NAMES = sorted(p.parent.name for p in FIXTURES.glob("*/config.json")) if FIXTURES.exists() else []


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_fixture_dict_matches_transformers_object(name):
    cfg = _fixture(name)
    model_type = cfg.get("model_type")
    if model_type not in CONFIG_MAPPING_NAMES:
        pytest.skip(f"{model_type} is remote code")
    kwargs = {k: v for k, v in cfg.items() if k != "model_type"}
    obj = _build(model_type, **kwargs)
    assert layer_types(obj) == layer_types(cfg)
    if getattr(obj, "layer_types", None) is not None:
        assert layer_types(cfg) == [normalise_kind(k) for k in obj.layer_types]


# --------------------------------------------------------------------------- precedence, counts


def test_explicit_list_wins_over_convention():
    cfg = {"model_type": "qwen3_next", "num_hidden_layers": 4, "full_attention_interval": 2,
           "layer_types": [F, F, L, L]}
    assert layer_types(cfg) == [F, F, L, L]


def test_explicit_list_of_wrong_length_is_ignored():
    cfg = {"model_type": "qwen3_next", "num_hidden_layers": 4, "layer_types": [F, F]}
    assert layer_types(cfg) == [L, L, L, F]


def test_explicit_list_with_trailing_mtp_entries_is_trimmed():
    cfg = {"model_type": "step3p5", "num_hidden_layers": 3, "layer_types": [F, S, F, F]}
    assert layer_types(cfg) == [F, S, F]


def test_explicit_legacy_names_are_remapped():
    cfg = {"model_type": "granitemoehybrid", "num_hidden_layers": 4,
           "layer_types": ["mamba", "mamba", "attention", "mamba"]}
    assert layer_types(cfg) == [L, L, F, L]


def test_unknown_kinds_pass_through_lower_cased():
    cfg = {"model_type": "remote_thing", "num_hidden_layers": 3, "layer_types": ["Full_Attention", "FooBar", "mamba"]}
    assert layer_types(cfg) == [F, "foobar", L]


@pytest.mark.parametrize("key", ["num_hidden_layers", "num_layers", "n_layer", "n_layers"])
def test_layer_count_aliases(key):
    cfg = {"model_type": "remote_thing", key: 5}
    assert num_layers(cfg) == 5
    assert layer_types(cfg) == [F] * 5


def test_default_is_all_full_attention():
    assert layer_types({"model_type": "llama", "num_hidden_layers": 3}) == [F] * 3
    assert layer_types({"num_layers": 2}) == [F] * 2


def test_no_count_anywhere_gives_empty_list():
    assert layer_types({"model_type": "remote_thing"}) == []


def test_missing_count_uses_transformers_class_default():
    assert len(layer_types({"model_type": "qwen3_next"})) == 48


# --------------------------------------------------------------------------- each convention, by hand


@pytest.mark.parametrize("model_type", ["mamba", "mamba2", "falcon_mamba", "rwkv", "xlstm"])
def test_pure_recurrent(model_type):
    assert layer_types({"model_type": model_type, "num_hidden_layers": 3}) == [L] * 3


def test_xlstm_num_blocks():
    assert layer_types({"model_type": "xlstm", "num_blocks": 2}) == [L, L]


@pytest.mark.parametrize("model_type", ["qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"])
def test_full_attention_interval(model_type):
    assert layer_types({"model_type": model_type, "num_hidden_layers": 8}) == [L, L, L, F] * 2
    assert layer_types({"model_type": model_type, "num_hidden_layers": 6, "full_attention_interval": 3}) == [L, L, F] * 2


def test_qwen4_exp_indexed():
    assert layer_types({"model_type": "qwen4_exp_text", "num_hidden_layers": 4}) == [L, L, L, "indexed_attention"]
    explicit = {"model_type": "qwen4_exp_text", "num_hidden_layers": 2, "layer_types": [L, F]}
    assert layer_types(explicit) == [L, "indexed_attention"]


def test_minimax_default_alternates_from_full():
    assert layer_types({"model_type": "minimax", "num_hidden_layers": 4}) == [F, L, F, L]


def test_minimax_attn_type_list():
    cfg = {"model_type": "minimax_text_01", "num_hidden_layers": 4, "attn_type_list": [0, 0, 0, 1]}
    assert layer_types(cfg) == [L, L, L, F]
    cfg["model_type"] = "minimax"
    assert layer_types(cfg) == [L, L, L, F]


def test_kimi_linear_one_indexed():
    cfg = {"model_type": "kimi_linear", "num_hidden_layers": 4,
           "linear_attn_config": {"full_attn_layers": [4], "kda_layers": [1, 2, 3]}}
    assert layer_types(cfg) == [L, L, L, F]


def test_lfm2_full_attn_idxs():
    cfg = {"model_type": "lfm2", "num_hidden_layers": 5, "full_attn_idxs": [1, 4]}
    assert layer_types(cfg) == ["conv", F, "conv", "conv", F]


def test_jamba_period_offset():
    assert layer_types({"model_type": "jamba", "num_hidden_layers": 9}) == [L] * 4 + [F] + [L] * 4
    cfg = {"model_type": "jamba", "num_hidden_layers": 4, "attn_layer_period": 2, "attn_layer_offset": 1}
    assert layer_types(cfg) == [L, F, L, F]


def test_bamba_attn_layer_indices():
    cfg = {"model_type": "bamba", "num_hidden_layers": 4, "attn_layer_indices": [2]}
    assert layer_types(cfg) == [L, L, F, L]


def test_falcon_h1_all_hybrid():
    assert layer_types({"model_type": "falcon_h1", "num_hidden_layers": 3}) == ["hybrid"] * 3


def test_zamba2_layers_block_type():
    cfg = {"model_type": "zamba2", "num_hidden_layers": 3, "layers_block_type": ["mamba", "hybrid", "mamba"]}
    assert layer_types(cfg) == [L, "hybrid", L]


def test_zamba_period_offset_and_block_list():
    assert layer_types({"model_type": "zamba", "num_hidden_layers": 9}) == [L, L, "hybrid", L, L, L, L, "hybrid", L]
    cfg = {"model_type": "zamba", "num_hidden_layers": 2, "layers_block_type": ["hybrid", "mamba"]}
    assert layer_types(cfg) == ["hybrid", L]


def test_nemotron_h_pattern_and_block_list():
    cfg = {"model_type": "nemotron_h", "num_hidden_layers": 4, "hybrid_override_pattern": "M*-E"}
    assert layer_types(cfg) == [L, F, "mlp", "moe"]
    cfg = {"model_type": "nemotron_h", "layers_block_type": ["mamba", "attention", "moe"]}
    assert layer_types(cfg) == [L, F, "moe"]


def test_recurrent_gemma_block_types_cycle():
    cfg = {"model_type": "recurrent_gemma", "num_hidden_layers": 5}
    # transformers: the attention blocks use local (sliding-window) attention
    assert layer_types(cfg) == [L, L, S, L, L]
    cfg["block_types"] = ["attention", "recurrent"]
    assert layer_types(cfg) == [S, L, S, L, S]


def test_qwen2_family_max_window_layers():
    base = {"num_hidden_layers": 4, "sliding_window": 128, "max_window_layers": 2}
    for mt in ("qwen2", "qwen3"):
        assert layer_types({"model_type": mt, **base, "use_sliding_window": False}) == [F] * 4
        assert layer_types({"model_type": mt, **base, "use_sliding_window": True}) == [F, F, S, S]
        assert layer_types({"model_type": mt, **base, "use_sliding_window": True, "sliding_window": None}) == [F] * 4


def test_qwen3_moe_slides_everywhere_when_enabled():
    base = {"model_type": "qwen3_moe", "num_hidden_layers": 3, "sliding_window": 64, "max_window_layers": 2}
    assert layer_types({**base, "use_sliding_window": False}) == [F] * 3
    assert layer_types({**base, "use_sliding_window": True}) == [S] * 3


def test_mistral_style_global_window():
    assert layer_types({"model_type": "mistral", "num_hidden_layers": 2, "sliding_window": 4096}) == [S, S]
    assert layer_types({"model_type": "mistral", "num_hidden_layers": 2, "sliding_window": None}) == [F, F]
    assert layer_types({"model_type": "phi3", "num_hidden_layers": 2, "sliding_window": 2047}) == [S, S]


def test_gemma_patterns():
    assert layer_types({"model_type": "gemma2", "num_hidden_layers": 4}) == [S, F, S, F]
    assert layer_types({"model_type": "gemma3_text", "num_hidden_layers": 6}) == [S] * 5 + [F]
    assert layer_types({"model_type": "gemma3_text", "num_hidden_layers": 4, "sliding_window_pattern": 2}) == [S, F, S, F]
    assert layer_types({"model_type": "gemma3_text", "num_hidden_layers": 3, "_sliding_window_pattern": 3}) == [S, S, F]


def test_gemma4_forces_last_layer_full():
    assert layer_types({"model_type": "gemma4_text", "num_hidden_layers": 4}) == [S, S, S, F]
    assert layer_types({"model_type": "gemma4_text", "num_hidden_layers": 2, "layer_types": [S, S]}) == [S, F]


def test_llama4_chunked():
    assert layer_types({"model_type": "llama4_text", "num_hidden_layers": 4}) == ["chunked_attention"] * 3 + [F]


def test_deepseek_v4_compress_ratios():
    cfg = {"model_type": "deepseek_v4", "num_hidden_layers": 3, "compress_ratios": [128, 4, 0, 4]}
    assert layer_types(cfg) == ["heavily_compressed_attention", "compressed_sparse_attention", S]


def test_exaone4_string_pattern_and_no_window():
    # both inputs make transformers 5.24's own Exaone4Config raise
    assert layer_types({"model_type": "exaone4", "num_hidden_layers": 4, "sliding_window_pattern": "LLLG"}) == [S, S, S, F]
    assert layer_types({"model_type": "exaone4", "num_hidden_layers": 2, "sliding_window": None}) == [F, F]


def test_mimo_hybrid_layer_pattern():
    cfg = {"model_type": "mimo_v2_flash", "num_hidden_layers": 4, "hybrid_layer_pattern": [0, 1, 1, 0]}
    assert layer_types(cfg) == [F, S, S, F]


# --------------------------------------------------------------------------- remote code (unknown model types)


@pytest.mark.parametrize(
    ("cfg", "expected"),
    [
        ({"full_attention_interval": 2, "num_hidden_layers": 4}, [L, F, L, F]),
        ({"hybrid_override_pattern": "MM*"}, [L, L, F]),
        ({"attn_layer_indices": [0], "num_hidden_layers": 2}, [F, L]),
        ({"attn_layer_period": 2, "attn_layer_offset": 0, "num_hidden_layers": 3}, [F, L, F]),
        ({"full_attn_idxs": [0], "num_hidden_layers": 2}, [F, "conv"]),
        ({"linear_attn_config": {"full_attn_layers": [2], "kda_layers": [1]}, "num_hidden_layers": 2}, [L, F]),
        ({"sliding_window": 512, "num_hidden_layers": 2}, [S, S]),
        ({"sliding_window": 512, "use_sliding_window": False, "num_hidden_layers": 2}, [F, F]),
        ({"sliding_window": 512, "use_sliding_window": True, "max_window_layers": 1, "num_hidden_layers": 3}, [F, S, S]),
        ({"sliding_window": 512, "sliding_window_pattern": 2, "num_hidden_layers": 4}, [S, F, S, F]),
        ({"sliding_window": 512, "sliding_window_pattern": "LG", "num_hidden_layers": 3}, [S, F, S]),
        ({"sliding_window": None, "num_hidden_layers": 2}, [F, F]),
        ({"attn_type_list": [1, 0]}, [F, L]),
    ],
)
def test_remote_code_conventions(cfg, expected):
    assert layer_types({"model_type": "some_remote_model", **cfg}) == expected


def test_unlimited_ocr_without_window_is_full():
    # transformers refuses sliding_window=None for this model; the dict path reads it as full
    assert layer_types({"model_type": "unlimited_ocr_text", "num_hidden_layers": 2, "sliding_window": None}) == [F, F]


def test_known_type_ignores_stray_sliding_window():
    # LlamaConfig has no sliding window: a stray field does not make its layers slide
    assert layer_types({"model_type": "llama", "num_hidden_layers": 2, "sliding_window": 4096}) == [F, F]


# --------------------------------------------------------------------------- against transformers


CASES: list[tuple[str, dict]] = [
    ("qwen3_next", {"num_hidden_layers": 48}),
    ("qwen3_next", {"num_hidden_layers": 10, "full_attention_interval": 3}),
    ("qwen3_5_text", {"num_hidden_layers": 12, "full_attention_interval": 2}),
    ("qwen3_5_moe_text", {"num_hidden_layers": 8}),
    ("qwen4_exp_text", {"num_hidden_layers": 8}),
    ("qwen4_exp_text", {"num_hidden_layers": 6, "full_attention_interval": 2}),
    ("qwen4_exp_text", {"num_hidden_layers": 4, "layer_types": [L, L, L, F]}),
    ("glm5_next_text", {"num_hidden_layers": 8}),
    ("glm5_next_text", {"num_hidden_layers": 2, "layer_types": [L, F]}),
    ("minimax", {"num_hidden_layers": 6}),
    ("minimax", {"num_hidden_layers": 3, "layer_types": [L, L, F]}),
    ("kimi_linear", {"num_hidden_layers": 9}),
    ("kimi_linear", {"num_hidden_layers": 6, "linear_attn_config": {"full_attn_layers": [3, 6], "kda_layers": [1, 2, 4, 5]}}),
    ("lfm2", {"num_hidden_layers": 6, "full_attn_idxs": [2, 5]}),
    ("lfm2", {"num_hidden_layers": 4}),
    ("lfm2", {"num_hidden_layers": 3, "layer_types": ["conv", F, "conv"]}),
    ("lfm3", {"num_hidden_layers": 9}),
    ("jamba", {"num_hidden_layers": 16}),
    ("jamba", {"num_hidden_layers": 12, "attn_layer_period": 4, "attn_layer_offset": 1}),
    ("bamba", {"num_hidden_layers": 8, "attn_layer_indices": [3, 7]}),
    ("bamba", {"num_hidden_layers": 4}),
    ("falcon_h1", {"num_hidden_layers": 5}),
    ("granitemoehybrid", {"num_hidden_layers": 4, "layer_types": ["mamba", "attention", "mamba", "mamba"]}),
    ("granitemoehybrid", {"num_hidden_layers": 3}),
    ("zamba", {"num_hidden_layers": 20}),
    ("zamba", {"num_hidden_layers": 12, "attn_layer_period": 3, "attn_layer_offset": 1}),
    ("zamba", {"num_hidden_layers": 4, "layers_block_type": ["mamba", "hybrid", "mamba", "mamba"]}),
    ("zamba2", {}),
    ("zamba2", {"num_hidden_layers": 4, "layers_block_type": ["mamba", "hybrid", "mamba", "hybrid"]}),
    ("nemotron_h", {"num_hidden_layers": 6, "hybrid_override_pattern": "M-M*E-"}),
    ("nemotron_h", {"hybrid_override_pattern": "ME*-M"}),
    ("nemotron_h", {"layers_block_type": ["mamba", "attention", "moe", "mlp"]}),
    ("nemotron_h", {}),
    ("recurrent_gemma", {"num_hidden_layers": 7}),
    ("recurrent_gemma", {"num_hidden_layers": 5, "block_types": ["recurrent", "attention"]}),
    ("mamba", {"num_hidden_layers": 3}),
    ("mamba2", {"num_hidden_layers": 3}),
    ("falcon_mamba", {"num_hidden_layers": 3}),
    ("qwen2", {"num_hidden_layers": 6, "use_sliding_window": True, "sliding_window": 64, "max_window_layers": 3}),
    ("qwen2", {"num_hidden_layers": 6, "use_sliding_window": False, "sliding_window": 64, "max_window_layers": 3}),
    ("qwen2", {"num_hidden_layers": 6, "use_sliding_window": True, "sliding_window": None, "max_window_layers": 3}),
    ("qwen3", {"num_hidden_layers": 6, "use_sliding_window": True, "sliding_window": 64, "max_window_layers": 2}),
    ("qwen3", {"num_hidden_layers": 6, "use_sliding_window": True}),
    ("qwen2_moe", {"num_hidden_layers": 6, "use_sliding_window": True, "max_window_layers": 4}),
    ("qwen2_vl_text", {"num_hidden_layers": 6, "use_sliding_window": True, "max_window_layers": 2}),
    ("qwen2_5_vl_text", {"num_hidden_layers": 6, "use_sliding_window": True, "max_window_layers": 2}),
    ("dots1", {"num_hidden_layers": 6, "max_window_layers": 4}),
    ("dots1", {"num_hidden_layers": 6, "sliding_window": None}),
    ("gpt_oss", {"num_hidden_layers": 6}),
    ("gemma2", {"num_hidden_layers": 5}),
    ("gemma3_text", {"num_hidden_layers": 12}),
    ("gemma3_text", {"num_hidden_layers": 12, "sliding_window_pattern": 3}),
    ("gemma3n_text", {"num_hidden_layers": 10}),
    ("gemma4_text", {"num_hidden_layers": 8}),
    ("gemma4_text", {"num_hidden_layers": 3, "layer_types": [S, F, S]}),
    ("embedding_gemma2_text", {"num_hidden_layers": 7, "sliding_window_pattern": 3}),
    ("t5gemma2_text", {"num_hidden_layers": 8, "sliding_window_pattern": 4}),
    ("vaultgemma", {"num_hidden_layers": 4}),
    ("cohere2", {"num_hidden_layers": 8}),
    ("cohere2", {"num_hidden_layers": 8, "sliding_window_pattern": 2}),
    ("cohere2_moe", {"num_hidden_layers": 10, "first_k_dense_replace": 2, "prefix_dense_sliding_window_pattern": 2}),
    ("exaone4", {"num_hidden_layers": 8}),
    ("exaone4", {"num_hidden_layers": 8, "sliding_window_pattern": 3}),
    ("afmoe", {"num_hidden_layers": 8, "global_attn_every_n_layers": 3}),
    ("modernbert", {"num_hidden_layers": 7, "global_attn_every_n_layers": 2}),
    ("modernbert-decoder", {"num_hidden_layers": 7}),
    ("olmo3", {"num_hidden_layers": 8}),
    ("olmo_hybrid", {"num_hidden_layers": 3}),
    ("olmo_hybrid", {"num_hidden_layers": 9}),
    ("bailing_hybrid", {"num_hidden_layers": 8, "layer_group_size": 4}),
    ("lara_mini", {"num_hidden_layers": 7}),
    ("llama4_text", {"num_hidden_layers": 8}),
    ("llama4_text", {"num_hidden_layers": 8, "attention_chunk_size": None}),
    ("llama4_text", {"num_hidden_layers": 4, "no_rope_layers": [1, 0, 1, 0]}),
    ("smollm3", {"num_hidden_layers": 8, "use_sliding_window": True, "sliding_window": 128}),
    ("smollm3", {"num_hidden_layers": 8}),
    ("ministral", {"num_hidden_layers": 4}),
    ("ministral", {"num_hidden_layers": 4, "sliding_window": None}),
    ("mimo_v2_flash", {"num_hidden_layers": 12}),
    ("deepseek_v4", {"num_hidden_layers": 6}),
    ("deepseek_v4", {"num_hidden_layers": 4, "compress_ratios": [0, 4, 128, 4, 0]}),
    ("deepseek_v32", {"num_hidden_layers": 3}),
    ("glm_moe_dsa", {"num_hidden_layers": 3}),
    ("step3p5", {"num_hidden_layers": 4, "sparse_attention_config": {"sparse_attention_freq": [1, 0, 1, 0]}}),
    ("minimax_m3_vl_text", {"num_hidden_layers": 4, "sparse_attention_config": {"sparse_attention_freq": [1, 0, 1, 0]}}),
    ("dots3_note_text", {"num_hidden_layers": 8}),
    ("dots3_note_text", {"num_hidden_layers": 8, "use_dsa": False}),
    ("dots3_note_text", {"num_hidden_layers": 8, "use_sliding_window": False}),
    ("inkling_text", {"num_hidden_layers": 8, "local_layer_ids": [0, 1, 2]}),
    ("inkling2_text", {"num_hidden_layers": 12}),
    ("ultrabert", {"num_hidden_layers": 4, "attention_windows": [128, 0, 128, 0]}),
    ("neomme", {"num_hidden_layers": 8}),
    ("beam", {"num_hidden_layers": 7}),
    ("flint", {"num_hidden_layers": 9}),
    ("cwm", {"num_hidden_layers": 6}),
    ("granite_swa", {"num_hidden_layers": 6}),
    ("kolibri1", {"num_hidden_layers": 6}),
    ("muse_glimmer_text", {"num_hidden_layers": 6}),
    ("unlimited_ocr_text", {"num_hidden_layers": 3}),
    ("zaya", {"num_hidden_layers": 3}),
]


@pytest.mark.parametrize(("model_type", "kwargs"), CASES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(CASES)])
def test_dict_matches_transformers(model_type, kwargs):
    newest_convention(model_type)
    expected = _reference(model_type, **kwargs)
    assert layer_types({"model_type": model_type, **kwargs}) == expected
    assert layer_types(_build(model_type, **kwargs)) == expected


# Model types whose transformers config keeps no layer_types: the object path and the dict path
# must agree (the object is read through to_dict()).
NO_LAYER_TYPES = [
    ("mistral", {"num_hidden_layers": 2}, [S, S]),
    ("mistral", {"num_hidden_layers": 2, "sliding_window": None}, [F, F]),
    ("mixtral", {"num_hidden_layers": 2, "sliding_window": 128}, [S, S]),
    ("starcoder2", {"num_hidden_layers": 2, "sliding_window": 128}, [S, S]),
    ("qwen3_moe", {"num_hidden_layers": 2, "use_sliding_window": True}, [S, S]),
    ("qwen3_moe", {"num_hidden_layers": 2}, [F, F]),
    ("llama", {"num_hidden_layers": 2}, [F, F]),
    ("deepseek_v3", {"num_hidden_layers": 2}, [F, F]),
    ("rwkv", {"num_hidden_layers": 2}, [L, L]),
    ("xlstm", {"num_hidden_layers": 2}, [L, L]),
]


@pytest.mark.parametrize(("model_type", "kwargs", "expected"), NO_LAYER_TYPES)
def test_config_objects_without_layer_types(model_type, kwargs, expected):
    obj = _build(model_type, **kwargs)
    assert getattr(obj, "layer_types", None) is None
    assert layer_types(obj) == expected
    assert layer_types({"model_type": model_type, **kwargs}) == expected


def test_every_transformers_model_type_default():
    """Each model type's own default convention, wherever its config derives layer_types:
    the dict path with only `model_type` (and a layer count) against the built object."""
    compared, mismatches = set(), []
    for model_type in sorted(CONFIG_MAPPING_NAMES):
        for kwargs in ({}, {"num_hidden_layers": 13}):
            try:
                obj = _build(model_type, **kwargs)
            except Exception:  # noqa: BLE001 - strict validation rejects these arguments (or the default)
                continue
            declared = getattr(obj, "layer_types", None)
            if declared is None or not getattr(obj, "num_hidden_layers", None):
                continue
            if obj.model_type != model_type:
                continue  # a wrapper: its text config has its own entry and the wrapper's defaults
            declared = [normalise_kind(k) for k in declared]
            if not set(declared) <= KNOWN_KINDS:
                continue  # vision backbones: layer_types names block shapes there
            if BEFORE_524 and model_type in OLDER_CONVENTIONS:
                continue
            compared.add(model_type)
            got = layer_types({"model_type": model_type, **kwargs})
            if got != declared or layer_types(obj) != declared:
                mismatches.append((model_type, kwargs, got, declared))
    assert mismatches == []
    assert len(compared) >= 75, sorted(compared)  # 78 in transformers 5.20.2, more in newer releases
