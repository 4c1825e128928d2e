"""The border: every config.json field hfcheck reads, type-checked once, before anything uses it.

``check_config`` runs first in ``collect_facts``, which every path takes (``hfcheck scan``, the
sweep, the TUI, the porter), before the config reaches transformers' config classes, hfcheck's
layer-kind rules or the report. A field of the wrong type, or a count no model can have (a
billion layers would make transformers build a billion-entry ``layer_types`` list and hang),
raises ``FactsError`` with one line naming the field, the value and what was expected; the CLI
prints it and exits 2. Absent fields and ``null`` are always accepted: transformers' defaults,
or hfcheck's "unknown", take their place. Fields hfcheck does not read are left to
transformers' own validation (its errors become the same one-line ``FactsError``).

Per-layer lists of counts (OpenELM's ``num_kv_heads``, Gemma 4's per-layer widths) are valid
where a count is: ``collect_facts`` takes their largest entry as the model-wide value.

A plain-dict (remote-code) config without a layer count at its top keeps its decoder in a
nested object: ``text_subconfig`` finds it under whatever key (``text_config``, InternVL's
``llm_config``, InfiMM's ``language``) and ``check_subconfig`` holds it to the same rules.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from hfcheck.analyzer.facts.errors import FactsError
from hfcheck.analyzer.terms import vocabulary as V

MAX_LAYERS = 10_000
MAX_HEADS = 1 << 16
MAX_WIDTH = 1 << 22
MAX_VOCAB = 1 << 26
MAX_EXPERTS = 1 << 16
MAX_POSITIONS = 1 << 40

# field -> (smallest, largest) accepted integer
COUNTS: dict[str, tuple[int, int]] = {
    **{f: (1, MAX_LAYERS) for f in V.LAYER_FIELDS},
    **{f: (1, MAX_HEADS) for f in V.HEAD_FIELDS + V.KV_HEAD_FIELDS},
    **{f: (1, MAX_WIDTH) for f in V.HIDDEN_FIELDS},
    **{f: (0, MAX_WIDTH) for f in V.HEAD_DIM_FIELDS},  # 0: derived from hidden / heads (glm5_next)
    **{f: (0, MAX_WIDTH) for f in V.INTERMEDIATE_FIELDS + V.MOE_INTERMEDIATE_FIELDS + ("shared_expert_intermediate_size",)},
    **{f: (1, MAX_VOCAB) for f in V.VOCAB_FIELDS},
    **{f: (0, MAX_EXPERTS) for f in V.EXPERT_COUNT_FIELDS + V.TOP_K_FIELDS + V.SHARED_EXPERT_FIELDS},
    "first_k_dense_replace": (0, MAX_LAYERS),
    "max_window_layers": (0, MAX_LAYERS),
    **{f: (0, MAX_WIDTH) for f in ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")},
    **{f: (0, MAX_POSITIONS) for f in ("max_position_embeddings", "seq_length", "n_positions")},
}
"""Every count hfcheck reads (the field names of ``vocabulary``), with its plausible range."""

NUMBERS = ("routed_scaling_factor",)
STRINGS = ("model_type", "torch_dtype", "dtype")
OBJECTS = ("text_config", "quantization_config")
NESTED = "_config"
"""Sub-configs (``text_config``, ``vision_config``, ...) are checked with the same rules."""


def check_config(config: Any) -> None:
    """Raise FactsError naming the first field whose type or value no model can have."""

    if not isinstance(config, Mapping):
        raise FactsError("config.json does not hold a JSON object")
    problem = _problem(config, "")
    if problem:
        raise FactsError(f"config.json: {problem}")


def _problem(config: Mapping[str, Any], prefix: str) -> str | None:
    for key, value in config.items():
        if value is None:
            continue
        name = f"{prefix}{key}"
        if key in COUNTS:
            lo, hi = COUNTS[key]
            if not _count_ok(value, lo, hi):
                return f"{name} is {_show(value)}, expected an integer from {lo} to {hi}"
        elif key in NUMBERS:
            if not _number(value):
                return f"{name} is {_show(value)}, expected a number"
        elif key in STRINGS:
            if not isinstance(value, str):
                return f"{name} is {_show(value)}, expected a string"
            if key == "model_type" and not prefix and not value:
                return f"{name} is an empty string, expected the model type"
        elif key == "architectures" and not prefix:
            if not isinstance(value, list) or not all(isinstance(a, str) and a for a in value):
                return f"{name} is {_show(value)}, expected a list of class names"
        elif key == "auto_map" and not prefix:
            if not isinstance(value, Mapping):
                return f"{name} is {_show(value)}, expected an object mapping Auto classes to 'module.Class' references"
            for auto, ref in value.items():
                refs = ref if isinstance(ref, list) else [ref]
                if not all(r is None or isinstance(r, str) for r in refs):
                    return f"{name}.{auto} is {_show(ref)}, expected a 'module.Class' reference (or a list of them)"
        elif key == "layer_types":
            if not isinstance(value, list) or not all(isinstance(k, str) for k in value):
                return f"{name} is {_show(value)}, expected a list of layer kinds (strings)"
        elif key in OBJECTS or (key.endswith(NESTED) and isinstance(value, Mapping)):
            if not isinstance(value, Mapping):
                return f"{name} is {_show(value)}, expected an object"
            if key == "quantization_config":
                problem = _quantization(value, name)
            else:
                problem = _problem(value, f"{name}.")
            if problem:
                return problem
    return None


def _quantization(quant: Mapping[str, Any], name: str) -> str | None:
    method, block = quant.get("quant_method"), quant.get("weight_block_size")
    if method is not None and not isinstance(method, str):
        return f"{name}.quant_method is {_show(method)}, expected a string"
    if block is not None and not (isinstance(block, list) and all(_count_ok(b, 1, MAX_WIDTH) and not isinstance(b, list) for b in block)):
        return f"{name}.weight_block_size is {_show(block)}, expected a list of positive integers"
    return None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def as_count(value: Any) -> int | None:
    """An integer count, also when JSON spells it ``1200.0``; None for anything else."""
    if _is_int(value):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _count_ok(value: Any, lo: int, hi: int) -> bool:
    if isinstance(value, list):  # per-layer values
        return bool(value) and all(_count_ok(v, lo, hi) for v in value if not isinstance(v, (list, Mapping)))
    if isinstance(value, Mapping):  # per-part values (lxmert: {"vision": 5, "language": 9, ...})
        return all(_count_ok(v, lo, hi) for v in value.values() if not isinstance(v, (list, Mapping)))
    count = as_count(value)
    return count is not None and lo <= count <= hi


def _number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) and not (isinstance(value, float) and math.isnan(value))


def _show(value: Any) -> str:
    """The value as JSON spells it (shortened), and its JSON type when that is not a number."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    text = text if len(text) <= 40 else text[:37] + "..."
    kind = {bool: "a boolean", str: "a string", list: "a list", dict: "an object"}.get(type(value))
    return f"{text} ({kind})" if kind else text


def text_config_of(config: Any) -> Any:
    """The decoder's text config (composite configs with several text configs: the decoder)."""
    try:
        return config.get_text_config(decoder=True)
    except TypeError:
        return config.get_text_config()


TEXT_SUBCONFIG_KEYS = ("text_config", "llm_config", "language_config", "language_model_config", "decoder", "generator", "text_model_config")
"""Names real composite configs give their language model's sub-config, preferred in this order
when several hold a decoder: transformers' own names first (``get_text_config``), then the ones
real remote VLMs use (InternVL's ``llm_config``, DeepSeek-VL's ``language_config``). Any other
key is found too (``text_subconfig``): InfiMM keeps its language model under ``language``."""

TOWER_WORDS = ("vision", "visual", "vit", "image", "video", "audio", "speech", "whisper", "siglip", "clip", "encoder",
               "projector", "resampler", "perceiver", "qformer", "aligner", "connector", "talker", "vae")
"""Words in a sub-config's key or model_type that mark an encoder tower or a connector, never the
decoder: a vision tower has a layer count and heads too (``vision_config``, InfiMM's ``visual``)."""

MAX_SUBCONFIG_DEPTH = 2
"""How deep ``text_subconfig`` looks (``thinker_config.text_config`` is two levels down)."""


def text_subconfig(config: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]] | None:
    """(key, sub-config) of the language model's decoder in a plain-dict composite config whose
    top level has no layer count; None when no nested object looks like one.

    A list of names misses the next model's spelling, so every nested object is a candidate
    when it states a layer count and is not an encoder tower (``TOWER_WORDS`` in its key or
    model_type). A name from ``TEXT_SUBCONFIG_KEYS`` is taken on its layer count alone (as before);
    any other key must also state the attention geometry (head count and hidden size), as a
    decoder does. Among several: the known names in their order, then the ones with a
    vocabulary (a decoder embeds tokens; a tower does not), then the shallower, then file order.
    The key is dotted for a nested one (``thinker_config.text_config``)."""
    found = [(_rank(path, sub, i), ".".join(path), sub) for i, (path, sub) in enumerate(_nested_objects(config, ()))
             if _looks_like_decoder(path, sub)]
    if not found:
        return None
    _, key, sub = min(found, key=lambda c: c[0])
    return key, sub


def _nested_objects(config: Mapping[str, Any], path: tuple[str, ...]) -> list[tuple[tuple[str, ...], Mapping[str, Any]]]:
    """Every nested object down to ``MAX_SUBCONFIG_DEPTH``, towers' insides left out."""
    out: list[tuple[tuple[str, ...], Mapping[str, Any]]] = []
    for key, value in config.items():
        if isinstance(value, Mapping) and isinstance(key, str) and key not in ("quantization_config", "auto_map"):
            here = (*path, key)
            out.append((here, value))
            if len(here) < MAX_SUBCONFIG_DEPTH and not _is_tower(here, value):
                out.extend(_nested_objects(value, here))
    return out


def _is_tower(path: tuple[str, ...], sub: Mapping[str, Any]) -> bool:
    model_type = sub.get("model_type")
    names = [p.lower() for p in path] + ([model_type.lower()] if isinstance(model_type, str) else [])
    return any(word in name for name in names for word in TOWER_WORDS)


def _stated(sub: Mapping[str, Any], names: tuple[str, ...]) -> bool:
    return any(sub.get(n) is not None and not isinstance(sub.get(n), (bool, Mapping)) for n in names)


def _looks_like_decoder(path: tuple[str, ...], sub: Mapping[str, Any]) -> bool:
    if _is_tower(path, sub) or not _stated(sub, V.LAYER_FIELDS):
        return False
    return path[-1] in TEXT_SUBCONFIG_KEYS or (_stated(sub, V.HEAD_FIELDS) and _stated(sub, V.HIDDEN_FIELDS))


def _rank(path: tuple[str, ...], sub: Mapping[str, Any], order: int) -> tuple[int, int, int, int]:
    known = TEXT_SUBCONFIG_KEYS.index(path[-1]) if path[-1] in TEXT_SUBCONFIG_KEYS else len(TEXT_SUBCONFIG_KEYS)
    return known, 0 if _stated(sub, V.VOCAB_FIELDS) else 1, len(path), order


def check_subconfig(sub: Mapping[str, Any], key: str) -> None:
    """Raise FactsError for a field of the sub-config the language model is read from (``key``)
    that no model can have: ``check_config`` only walks ``*_config`` objects, and a decoder kept
    under another key (``language``) is read just the same."""
    problem = _problem(sub, f"{key}.")
    if problem:
        raise FactsError(f"config.json: {problem}")
