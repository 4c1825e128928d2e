"""Every way hfcheck makes a model small, in one place: the scan's instance and the port's proofs.

**A transformers config object** (``shrunk_config``, the scan's ``instance``): the shortest
prefix of decoder layers holding every distinct layer kind (``structural_prefix``; dense-first
and MoE layers included), at most 4 experts, and, for ``tiny``, small widths at the real head
ratio, GQA, MLA ranks and MoE shape. Fields are set on the config class's own attributes.
M-RoPE sections follow the small head width (``scale_mrope``): every tiny copy of a Qwen2-VL /
GLM-4.1V style model, the scan's, verify's and the runtime's small VLM folders, cuts them here.

**A remote config dict** (``shrink_config``, the port's reference run and proofs, where the
code's config class is not hfcheck's to build): the same architecture at a size a proof can
afford. The proof must not build the model at full width (a 13B model does not fit the 2 GB budget).
The copy keeps what decides the function: the layer pattern (at least two decoder layers),
the attention head grouping (MHA, GQA with the real q/kv ratio up to 8, MQA), the MoE shape
(experts, top-k, shared experts, dense first layers), MLA ranks, and every scalar field
(eps, rope base, flags). Widths shrink: ``head_dim`` (default 16), the hidden size
``heads * head_dim``, the MLP width at the real ratio to the hidden size, and the vocabulary.

Remote configs name the same quantity many ways (``n_head``, ``num_attention_heads``,
``n_heads``...); ``FIELDS`` lists the spellings this module knows, and every spelling present
gets the new value, so code that reads any of them sees one consistent model.

Both read the field spellings from ``vocabulary``.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import math
import re
from typing import Any

from hfcheck.analyzer.facts import ModelFacts
from hfcheck.analyzer.facts.config_fields import text_config_of, text_subconfig
from hfcheck.analyzer.terms import vocabulary as V

# --------------------------------------------------------------------------- a config object

MAX_PREFIX = 24


def is_moe_layer(facts: ModelFacts, text: Any, i: int) -> bool:
    if not facts.is_moe or i < facts.first_dense_layers:
        return False
    step = getattr(text, "decoder_sparse_step", None) or getattr(text, "moe_layer_freq", None) or 1
    only_mlp = getattr(text, "mlp_only_layers", None) or []
    if isinstance(step, int) and step > 1 and (i + 1) % step:
        return False
    return i not in only_mlp


def structural_prefix(facts: ModelFacts, text: Any) -> int:
    """Shortest layer prefix holding every distinct (layer kind, MoE or dense) pair."""
    wanted = {(t, is_moe_layer(facts, text, i)) for i, t in enumerate(facts.layer_types)}
    seen: set[tuple[str, bool]] = set()
    for i, kind in enumerate(facts.layer_types):
        seen.add((kind, is_moe_layer(facts, text, i)))
        if seen == wanted:
            return max(1, min(i + 1, MAX_PREFIX, facts.num_layers))
    return min(facts.num_layers, MAX_PREFIX)


def cut_layers(text: Any, n: int) -> None:
    """Cut every per-layer field of ``text`` to the first ``n`` layers (raises when the
    config refuses, e.g. prophetnet's layer count; the caller then keeps the full depth)."""
    for name in V.LAYER_FIELDS:
        if isinstance(getattr(text, name, None), int):
            setattr(text, name, n)
    for name in ("layer_types", "mlp_layer_types", "attention_layers", "layers_block_type", "block_types", "mlp_only_layers_list"):
        value = getattr(text, name, None)
        if isinstance(value, (list, tuple)) and len(value) > n:
            setattr(text, name, list(value)[:n])
    pattern = getattr(text, "hybrid_override_pattern", None)
    if isinstance(pattern, str) and len(pattern) > n:
        text.hybrid_override_pattern = pattern[:n]
    for name in ("attn_layer_indices", "full_attn_idxs", "mlp_only_layers"):
        value = getattr(text, name, None)
        if isinstance(value, (list, tuple)):
            setattr(text, name, [i for i in value if isinstance(i, int) and i < n])
    lac = getattr(text, "linear_attn_config", None)
    if isinstance(lac, dict):
        for key in ("full_attn_layers", "kda_layers"):
            if isinstance(lac.get(key), list):
                lac[key] = [i for i in lac[key] if i <= n]


CROSS_CHECK_LAYERS = 4
"""How many decoder layers the cross-check harness builds of each model type."""


def cut_every_layer_list(config: Any, max_layers: int = CROSS_CHECK_LAYERS) -> tuple[int | None, int | None]:
    """The cross-check harness's cut (``scripts/crosscheck``: vLLM's side and hfcheck's build
    the same model from it): the text config to ``min(n, max_layers)`` layers, in place, with
    *every* list as long as the layer count cut too (``cut_layers`` names its fields, and so
    keeps e.g. llama4_text's ``no_rope_layers`` or laguna's per-layer head counts whole: moving
    the harness onto it changes which models are compared, so it waits for a behaviour step).
    Returns the (old, new) layer counts; (None, None) for a config without an int layer count."""
    text = config.get_text_config()
    n = getattr(text, "num_hidden_layers", None)
    if not isinstance(n, int):
        return None, None
    new = min(n, max_layers)
    if new == n:
        return n, new
    text.num_hidden_layers = new
    for name, value in list(vars(text).items()):
        if not name.startswith("_") and isinstance(value, (list, tuple)) and len(value) == n:
            setattr(text, name, list(value)[:new])
    # layer_types may be a property / attribute-mapped name not in vars()
    lt = getattr(text, "layer_types", None)
    if isinstance(lt, (list, tuple)) and len(lt) > new:
        try:
            text.layer_types = list(lt)[:new]
        except Exception:  # noqa: BLE001, S110 - a config that refuses the cut keeps its list
            pass
    for name in ("attn_layer_indices", "full_attn_idxs", "mlp_only_layers"):  # per-layer index lists
        value = getattr(text, name, None)
        if isinstance(value, (list, tuple)) and value and all(isinstance(i, int) for i in value) and len(value) != new:
            setattr(text, name, [i for i in value if i < new])
    value = getattr(text, "hybrid_override_pattern", None)  # one character per layer
    if isinstance(value, str) and len(value) > new:
        text.hybrid_override_pattern = value[:new]
    return n, new


def cut_experts(text: Any, facts: ModelFacts) -> None:
    if not facts.is_moe:
        return
    experts = max(2, min(facts.num_experts, 4))
    for name in V.EXPERT_COUNT_FIELDS:
        if isinstance(getattr(text, name, None), int) and getattr(text, name) > 0:
            setattr(text, name, experts)
    for name in V.TOP_K_FIELDS:
        value = getattr(text, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            setattr(text, name, max(1, min(value, experts - 1 if experts > 2 else 2)))
    if isinstance(getattr(text, "n_group", None), int) and text.n_group > 1:
        text.n_group = 2
        if isinstance(getattr(text, "topk_group", None), int):
            text.topk_group = 1


def cut_extras(text: Any) -> None:
    for name in ("num_nextn_predict_layers", "mtp_num_hidden_layers"):
        if isinstance(getattr(text, name, None), int):
            setattr(text, name, 0)


TINY_HEAD_DIM = 16
TINY_VOCAB = 128


def set_if_int(obj: Any, name: str, value: int) -> None:
    """Set an int field; a read-only property (Falcon's head_dim = hidden // heads) follows
    from the fields it is derived from and is left alone."""
    prop = getattr(type(obj), name, None)
    if isinstance(prop, property) and prop.fset is None:
        return
    if isinstance(getattr(obj, name, None), int) and not isinstance(getattr(obj, name), bool):
        setattr(obj, name, value)


def shrink_widths(text: Any, facts: ModelFacts, head_dim: int = TINY_HEAD_DIM) -> None:
    """Small widths with the real head ratio (GQA/MQA), MoE shape and MLA structure."""
    heads, kv = facts.num_heads or 2, facts.num_kv_heads or facts.num_heads or 2
    tiny_kv = 1 if kv == 1 else 2
    ratio = max(1, heads // kv) if kv else 1
    tiny_heads = tiny_kv * min(ratio, 8)
    hidden = tiny_heads * head_dim
    for name in V.HEAD_FIELDS:
        set_if_int(text, name, tiny_heads)
    for name in V.KV_HEAD_FIELDS:
        set_if_int(text, name, tiny_kv)
    for name in V.HIDDEN_FIELDS:
        set_if_int(text, name, hidden)
    for name in ("head_dim", "kv_channels", "attention_head_dim"):
        set_if_int(text, name, head_dim)
    for name in ("intermediate_size", "ffn_hidden_size", "n_inner"):
        set_if_int(text, name, 2 * hidden)
    for name in ("moe_intermediate_size", "shared_expert_intermediate_size"):
        set_if_int(text, name, hidden)
    if facts.uses_mla:
        set_if_int(text, "kv_lora_rank", 32)
        set_if_int(text, "q_lora_rank", 32)
        set_if_int(text, "qk_nope_head_dim", head_dim)
        # real MLA kernels take a latent of kv_lora_rank + rope = 576 (or 512, 320) only
        rope = 8 if head_dim < 32 else 64
        if head_dim >= 32:
            set_if_int(text, "kv_lora_rank", 512)
        set_if_int(text, "qk_rope_head_dim", rope)
        set_if_int(text, "v_head_dim", head_dim)
        if isinstance(getattr(text, "head_dim", None), int):
            text.head_dim = rope  # transformers' MLA configs use the rope part as head_dim
        if hasattr(text, "qk_head_dim"):
            text.qk_head_dim = head_dim + rope
    for name in ("vocab_size", "padded_vocab_size", "vocab_size_per_layer_input"):
        set_if_int(text, name, TINY_VOCAB)
    if (getattr(text, "hidden_size_per_layer_input", 0) or 0) > 0:  # Gemma 3n/4 per-layer embeddings; 0 means none
        text.hidden_size_per_layer_input = head_dim
    for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
        value = getattr(text, name, None)
        if isinstance(value, int) and value >= TINY_VOCAB:
            setattr(text, name, TINY_VOCAB - 1)
    if isinstance(getattr(text, "sliding_window", None), int):
        text.sliding_window = min(text.sliding_window, 8)


def shrunk_config(facts: ModelFacts, cfg_obj: Any, shrink: str = "tiny", head_dim: int = TINY_HEAD_DIM) -> tuple[Any, int]:
    """(a copy of the config cut to the structural prefix of layers and a few experts, with
    small widths when ``shrink == "tiny"``; the layers kept)."""
    config = copy.deepcopy(cfg_obj)
    text = text_config_of(config)
    n = structural_prefix(facts, text)
    cut_layers(text, n)
    cut_experts(text, facts)
    cut_extras(text)
    if shrink == "tiny":
        if getattr(text, "is_heterogeneous", False):
            shrink_heterogeneous(text, facts, head_dim)
        else:
            shrink_widths(text, facts, head_dim)
        scale_mrope(text, pin_head_dim=not facts.uses_mla)
    return config, n


# --------------------------------------------------------------------------- M-RoPE sections

MROPE_DEFAULT = re.compile(r"""get\(\s*["']mrope_section["']\s*,\s*\[([\d,\s]+)\]""")
"""The modeling code's own default sections, where the config has none (``rope_parameters.get(
"mrope_section", [8, 12, 12])`` in GLM-4.1V, ``[16, 24, 24]`` in Qwen2.5-VL)."""


def _rope_dicts(text: Any) -> list[dict[str, Any]]:
    """The text config's rope parameter dicts: ``rope_parameters`` (v5; ``rope_scaling`` is the same
    object there) or ``rope_scaling`` (v4), and per layer type where they are kept that way."""
    found: list[dict[str, Any]] = []
    for name in ("rope_parameters", "rope_scaling"):
        value = getattr(text, name, None)
        if not isinstance(value, dict) or any(value is f for f in found):
            continue
        nested = [v for v in value.values() if isinstance(v, dict)]
        found.extend(nested if nested and all(isinstance(v, dict) for v in value.values()) else [value])
    return found


def code_default_mrope(text: Any) -> list[int] | None:
    """The sections the modeling code falls back to when the config names none, read from the
    source of the text config's modeling module (never executed beyond import)."""
    module = type(text).__module__.replace(".configuration_", ".modeling_")
    try:
        source = inspect.getsource(importlib.import_module(module))
    except (ImportError, OSError, TypeError):
        return None
    found = MROPE_DEFAULT.search(source)
    return [int(x) for x in found.group(1).split(",") if x.strip()] if found else None


def rotary_half(text: Any, rope: dict[str, Any]) -> int | None:
    """How many frequencies M-RoPE's sections split: half the rotary width, which is the head
    width (``head_dim``, else hidden // heads) times ``partial_rotary_factor`` (GLM-4.1V: 0.5)."""
    head_dim = getattr(text, "head_dim", None)
    heads, hidden = getattr(text, "num_attention_heads", None), getattr(text, "hidden_size", None)
    if not isinstance(head_dim, int) or isinstance(head_dim, bool) or head_dim <= 0:
        head_dim = hidden // heads if isinstance(hidden, int) and isinstance(heads, int) and heads > 0 else None
    if head_dim is None:
        return None
    factor = rope.get("partial_rotary_factor", getattr(text, "partial_rotary_factor", None))
    factor = factor if isinstance(factor, (int, float)) and not isinstance(factor, bool) and 0 < factor <= 1 else 1.0
    return int(head_dim * factor) // 2


def scaled_sections(section: list[int], target: int) -> list[int]:
    """``section`` scaled to sum to ``target``, proportions kept (largest remainders get the
    rest), every section at least 1 (taken from the largest) so no position axis vanishes."""
    total = sum(section)
    scaled = [s * target // total for s in section]
    for i in sorted(range(len(section)), key=lambda i: (-(section[i] * target % total), i))[: target - sum(scaled)]:
        scaled[i] += 1
    for i in range(len(scaled)):
        while scaled[i] < 1 and max(scaled) > 1:
            scaled[scaled.index(max(scaled))] -= 1
            scaled[i] += 1
    return scaled


def scale_mrope(text: Any, pin_head_dim: bool = True) -> None:
    """M-RoPE's sections (``mrope_section``: how the rotary frequencies are split between the
    temporal, height and width positions) sum to half the rotary width; a shrink that cuts
    ``head_dim`` must cut them too, or the model's first forward fails
    (``split_with_sizes expects split_sizes to sum exactly to 32 ... got [16, 24, 24]``).
    Scaled to the shrunk width with their proportions kept; where the config names none, the
    modeling code's default is scaled and written into the config. ``pin_head_dim``: a config
    that derives its head width (hidden // heads) gets it written down, so a later change of
    the head count (verify's re-tuning for TP 2/4) keeps the width the sections were cut for."""
    ropes = _rope_dicts(text)
    if not ropes:
        return
    for rope in ropes:
        section = rope.get("mrope_section")
        if section is None:
            if rope.get("rope_type", rope.get("type")) not in ("default", "mrope", None):
                continue
            section = code_default_mrope(text)
        if not (isinstance(section, list) and section and all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in section)):
            continue
        target = rotary_half(text, rope)
        if target is None or target < len(section):
            continue
        if sum(section) != target:
            rope["mrope_section"] = scaled_sections(section, target)
        if pin_head_dim and getattr(text, "head_dim", None) is None and not isinstance(getattr(type(text), "head_dim", None), property):
            heads, hidden = getattr(text, "num_attention_heads", None), getattr(text, "hidden_size", None)
            if isinstance(heads, int) and isinstance(hidden, int) and heads > 0:
                text.head_dim = hidden // heads


def shrink_heterogeneous(text: Any, facts: ModelFacts, head_dim: int) -> None:
    """A config with per-layer overrides (Gemma 4's global layers: head_dim 512 beside 256):
    the global widths shrink as usual and each override keeps its ratio to the global value,
    so the small model is as heterogeneous as the real one."""
    text.allow_global_per_layer_attribute_access = True
    overrides = copy.deepcopy(text._heterogeneity_spec.per_layer_overrides)
    names = {name for layer in overrides.values() for name in layer}
    before = {name: getattr(text, name, None) for name in names}
    shrink_widths(text, facts, head_dim)
    after = {name: getattr(text, name, None) for name in names}

    def scaled(name: str, value: Any) -> Any:
        old, new = before.get(name), after.get(name)
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in (value, old, new)) or not old or old == new:
            return value
        return max(1, value * new // old)

    kept = text.num_hidden_layers  # already cut to the structural prefix
    text.per_layer_config = {i: {name: scaled(name, v) for name, v in layer.items()} for i, layer in overrides.items() if i < kept}
    text.allow_global_per_layer_attribute_access = False


# --------------------------------------------------------------------------- a remote config dict



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


def _nested_decoders(config: dict[str, Any]) -> list[str]:
    """The sub-configs ``shrink_config`` shrinks with the top level: the usual names, and the one
    the facts read the decoder from where the top level has none (InfiMM's ``language``)."""
    keys = ["text_config", "llm_config", "language_config"]
    found = text_subconfig(config) if first(config, "layers") is None else None
    if found is not None and "." not in found[0] and found[0] not in keys:
        keys.append(found[0])
    return keys


def shrink_config(config: dict[str, Any], *, layers: int = 2, head_dim: int = 16, vocab: int = 512, max_heads: int = MAX_TINY_HEADS) -> dict[str, Any]:
    """The shrunk copy of ``config`` (a new dict; the original is not changed)."""
    out = copy.deepcopy(config)
    for nested in _nested_decoders(config):
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
        kv_slot = _nested_kv(out)
        if kv_slot is not None:
            kv_slot[0][kv_slot[1]] = tiny_kv
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


# --- a real checkpoint cut to its first layers and vocabulary rows (the port's proof on real
# weights, porter/reference/realweights.py): both sides run the same cut within the 2 GB budget.

TENSOR_BUDGET_BYTES = 1024**3  # float32 weights per process; the rest of the 2 GB is torch and activations
VOCAB_ROWS = 2048


def truncation(meta_params: dict[str, list[int]], layers_path: str, layers: int, vocab: int, hidden: int, offset: int = 0) -> tuple[int, int, int]:
    """(layers kept, vocabulary rows kept, bytes of one float32 layer)."""
    prefix = f"{layers_path}.{offset}."
    layer_bytes = 4 * sum(math.prod(shape) for key, shape in meta_params.items() if key.startswith(prefix))
    rows = min(vocab, VOCAB_ROWS)
    room = TENSOR_BUDGET_BYTES - 2 * 4 * rows * hidden
    keep = 0 if layer_bytes <= 0 else max(0, min(2, layers, room // layer_bytes))
    return int(keep), rows, layer_bytes


def moved_after_layers(meta_params: dict[str, list[int]], layers_path: str, offset: int, layers: int, keep: int) -> list[tuple[str, str]]:
    """Where the layers share an nn.Sequential with what follows them (MixFormer's head), the
    truncated model's index of each such module against the checkpoint's."""
    if not offset or keep >= layers:
        return []
    pattern = re.compile(re.escape(layers_path) + r"\.(\d+)\.")
    after = sorted({int(m.group(1)) for k in meta_params if (m := pattern.match(k)) and int(m.group(1)) >= offset + layers})
    return [(f"{layers_path}.{i - layers + keep}.", f"{layers_path}.{i}.") for i in after]


def within_rows(config: dict[str, Any], rows: int) -> dict[str, Any]:
    """A copy of ``config`` whose special token ids lie within a vocabulary cut to its first ``rows``
    (an id past the cut becomes the last row: an embedding's ``padding_idx`` must lie inside it; the
    ids both sides of a comparison run are the same either way)."""
    out = dict(config)
    for name in TOKEN_ID_FIELDS:
        value = out.get(name)
        if isinstance(value, list):
            out[name] = [rows - 1 if isinstance(v, int) and not isinstance(v, bool) and v >= rows else v for v in value]
        elif isinstance(value, int) and not isinstance(value, bool) and value >= rows:
            out[name] = rows - 1
    return out


def set_int_fields(config: dict[str, Any], kind: str, value: int) -> dict[str, Any]:
    """A copy of ``config`` with every integer field of ``kind`` (``FIELDS``) set to ``value``."""
    out = dict(config)
    for name in FIELDS[kind]:
        if name in out and isinstance(out[name], int) and not isinstance(out[name], bool):
            out[name] = value
    return out


# --- models made small for vLLM's CPU build (runtime/): the kernels its attention takes want a
# head size of 32, so the runtime's folders are cut to it, text and towers alike.

CPU_KERNEL_HEAD_DIM = 32


def cpu_text_sizes(vocab: int) -> dict[str, Any]:
    """A two-layer text model at the CPU build's head size (one key/value head for two query heads),
    its pad/bos/eos at a word tokenizer's first ids."""
    return {"vocab_size": vocab, "hidden_size": 2 * CPU_KERNEL_HEAD_DIM, "intermediate_size": 4 * CPU_KERNEL_HEAD_DIM, "num_hidden_layers": 2,
            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": CPU_KERNEL_HEAD_DIM, "max_position_embeddings": 128,
            "pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 3}


def cpu_vision_sizes(image_side: int, patch: int) -> dict[str, Any]:
    """A two-layer vision tower at the CPU build's head size for ``image_side`` images in ``patch`` patches."""
    return {"hidden_size": 2 * CPU_KERNEL_HEAD_DIM, "intermediate_size": 4 * CPU_KERNEL_HEAD_DIM, "num_hidden_layers": 2,
            "num_attention_heads": 2, "image_size": image_side, "patch_size": patch}


TOWER_WIDTHS = {"hidden_size": 2 * CPU_KERNEL_HEAD_DIM, "embed_dim": 2 * CPU_KERNEL_HEAD_DIM, "intermediate_size": 4 * CPU_KERNEL_HEAD_DIM,
                "num_attention_heads": 2, "num_heads": 2, "num_hidden_layers": 2, "depth": 2, "num_key_value_heads": 2}
"""A published tower's widths at small size (head_dim 32, two layers); its image and patch sizes
stay the defaults, so the processor's defaults still describe it."""


def shrink_tower(tower: Any) -> None:
    """A tower sub-config at ``TOWER_WIDTHS`` (its integer fields of those names) and the CPU build's head size."""
    for field_name, value in TOWER_WIDTHS.items():
        if isinstance(getattr(tower, field_name, None), int) and not isinstance(getattr(tower, field_name), bool):
            setattr(tower, field_name, value)
    if isinstance(getattr(tower, "head_dim", None), int):
        tower.head_dim = CPU_KERNEL_HEAD_DIM

