"""A shrunk copy of a remote config: the same architecture at a size a proof can afford.

The proof must not build the model at full width (a 13B model does not fit the 2 GB budget).
The copy keeps what decides the function: the layer pattern (at least two decoder layers),
the attention head grouping (MHA, GQA with the real q/kv ratio up to 8, MQA), the MoE shape
(experts, top-k, shared experts, dense first layers), MLA ranks, and every scalar field
(eps, rope base, flags). Widths shrink: ``head_dim`` (default 16), the hidden size
``heads * head_dim``, the MLP width at the real ratio to the hidden size, and the vocabulary.

Remote configs name the same quantity many ways (``n_head``, ``num_attention_heads``,
``n_heads``...); ``FIELDS`` lists the spellings this module knows, and every spelling present
gets the new value, so code that reads any of them sees one consistent model.
"""

from __future__ import annotations

import copy
from typing import Any

from hfcheck.analyzer import vocabulary as V

FIELDS: dict[str, tuple[str, ...]] = {
    "layers": V.LAYER_FIELDS,
    "hidden": V.HIDDEN_FIELDS,
    "heads": V.HEAD_FIELDS,
    "kv_heads": V.KV_HEAD_FIELDS,
    "head_dim": V.HEAD_DIM_FIELDS,
    "intermediate": V.INTERMEDIATE_FIELDS,
    "vocab": V.VOCAB_FIELDS,
    "experts": V.EXPERT_COUNT_FIELDS,
    "top_k": V.TOP_K_FIELDS,
    "moe_intermediate": ("moe_intermediate_size", "expert_intermediate_size", "shared_expert_intermediate_size"),
    "first_dense": ("first_k_dense_replace",),
}
MLA_FIELDS = {"q_lora_rank": 32, "kv_lora_rank": 32, "qk_rope_head_dim": 16, "qk_nope_head_dim": 16, "v_head_dim": 16}
TOKEN_ID_FIELDS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "sep_token_id", "unk_token_id")
MAX_TINY_GROUP = 8
MAX_TINY_HEADS = 4
"""Query heads of a shrunk copy (fewer where the model has fewer)."""


def first(config: dict[str, Any], kind: str) -> Any:
    for name in FIELDS[kind]:
        value = config.get(name)
        if value is not None and not isinstance(value, bool):
            return value
    return None


def _set_all(config: dict[str, Any], kind: str, value: Any) -> None:
    for name in FIELDS[kind]:
        if name in config and config[name] is not None and not isinstance(config[name], bool):
            config[name] = value


NESTED_ATTENTION = {"attn_config": "kv_n_heads"}
"""Attention settings kept in a nested dict, and their key/value head field (MPT's grouped-query attention)."""


def _nested_kv(config: dict[str, Any]) -> tuple[dict[str, Any], str] | None:
    for key, field_name in NESTED_ATTENTION.items():
        nested = config.get(key)
        if isinstance(nested, dict) and isinstance(nested.get(field_name), int) and not isinstance(nested[field_name], bool):
            return nested, field_name
    return None


def head_counts(config: dict[str, Any]) -> tuple[int | None, int | None]:
    """(query heads, key/value heads) as the config states them (MQA flags included)."""
    heads = first(config, "heads")
    kv = first(config, "kv_heads")
    nested = _nested_kv(config)
    if kv is None and nested is not None:
        kv = nested[0][nested[1]]
    if kv is None and (config.get("multi_query") is True or (config.get("multi_query_attention") is True and kv is None)):
        kv = 1
    if config.get("multi_query_attention") is False:
        kv = heads
    return (heads if isinstance(heads, int) else None), (kv if isinstance(kv, int) else (heads if isinstance(heads, int) else None))


def _token_ids(config: dict[str, Any]) -> list[int]:
    ids = []
    for name in TOKEN_ID_FIELDS:
        value = config.get(name)
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
                ids.append(v)
    return ids


def shrink_config(config: dict[str, Any], *, layers: int = 2, head_dim: int = 16, vocab: int = 512, max_heads: int = MAX_TINY_HEADS) -> dict[str, Any]:
    """The shrunk copy of ``config`` (a new dict; the original is not changed)."""
    out = copy.deepcopy(config)
    for nested in ("text_config", "llm_config", "language_config"):
        if isinstance(out.get(nested), dict):
            out[nested] = shrink_config(out[nested], layers=layers, head_dim=head_dim, vocab=vocab, max_heads=max_heads)
    real_layers = first(config, "layers")
    dense = first(config, "first_dense")
    n_layers = layers + (1 if isinstance(dense, int) and dense > 0 else 0)
    if isinstance(real_layers, int) and real_layers > n_layers:
        _set_all(out, "layers", n_layers)
        for key, value in list(out.items()):
            if isinstance(value, list) and len(value) == real_layers:
                out[key] = value[:n_layers]
    if isinstance(dense, int) and dense > 1:
        _set_all(out, "first_dense", 1)

    heads, kv = head_counts(config)
    hidden = first(config, "hidden")
    if isinstance(heads, int) and heads > 0:
        kv = kv if isinstance(kv, int) and 0 < kv <= heads and heads % kv == 0 else heads
        group = heads // kv
        if group == 1:
            tiny_heads = tiny_kv = min(heads, max_heads)
        elif kv == 1:
            tiny_kv, tiny_heads = 1, min(group, max_heads)
        else:
            tiny_kv = min(kv, 2)
            tiny_heads = tiny_kv * min(group, MAX_TINY_GROUP)
        _set_all(out, "heads", tiny_heads)
        _set_all(out, "kv_heads", tiny_kv)
        nested = _nested_kv(out)
        if nested is not None:
            nested[0][nested[1]] = tiny_kv
        real_head_dim = first(config, "head_dim")
        if real_head_dim is None and isinstance(hidden, int):
            real_head_dim = hidden // heads
        new_hidden = tiny_heads * head_dim
        _set_all(out, "head_dim", head_dim)
        if isinstance(hidden, int):
            _set_all(out, "hidden", new_hidden)
            inter = first(config, "intermediate")
            if isinstance(inter, int) and inter > 0:
                ratio = inter / hidden
                _set_all(out, "intermediate", max(32, int(round(ratio * new_hidden / 16)) * 16))
        # rotary dimension given in absolute numbers (rotary_dim, rotary_ndims) follows head_dim
        for key in ("rotary_dim", "rotary_ndims", "rope_dim"):
            if isinstance(out.get(key), int) and isinstance(real_head_dim, int) and real_head_dim:
                out[key] = max(2, int(round(out[key] * head_dim / real_head_dim / 2)) * 2)
    experts = first(config, "experts")
    if isinstance(experts, int) and experts > 0:
        tiny_experts = min(experts, 4)
        _set_all(out, "experts", tiny_experts)
        k = first(config, "top_k")
        if isinstance(k, int):
            _set_all(out, "top_k", min(k, 2, tiny_experts))
        if isinstance(first(config, "moe_intermediate"), int):
            _set_all(out, "moe_intermediate", 32)
        for key in ("n_group", "topk_group"):
            if isinstance(out.get(key), int):
                out[key] = 1
    for key, value in MLA_FIELDS.items():
        if isinstance(out.get(key), int):
            out[key] = value
    real_vocab = first(config, "vocab")
    if isinstance(real_vocab, int) and real_vocab > vocab:
        ids = [i for i in _token_ids(config) if i < real_vocab]
        _set_all(out, "vocab", max([vocab] + [i + 1 for i in ids]))
    return out
