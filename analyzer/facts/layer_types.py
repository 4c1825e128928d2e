"""Per-layer kind of a decoder stack, read from a config without building the model.

`layer_types(config)` returns one entry per decoder layer in transformers' vocabulary
(`configuration_utils.ALLOWED_ATTN_LAYER_TYPES`): the softmax kinds `full_attention`,
`sliding_attention`, `chunked_attention`, `window_attention` (the ones vLLM's attention
interface serves, see `SOFTMAX_KINDS`), and the rest: `indexed_attention`,
`compressed_sparse_attention`, `heavily_compressed_attention`, `minimax_m3_sparse`, `conv`,
`moe`, `mlp`, `hybrid`, `hybrid_sliding`, `reference_sliding_attention`, `linear_attention`.

`config` is the *text* config (the caller resolves `text_config`), either

* a transformers config object: its own `layer_types` (v5 configs compute it in
  `__post_init__`, or expose it as a property) is used as is, after the legacy remap; objects
  without one are read like a dict through `to_dict()`;
* a raw `config.json` mapping (remote code is never executed): an explicit `layer_types` list
  of the right length wins, then the model type's own convention (each one mirrors
  `transformers/models/<type>/configuration_<type>.py` of transformers 5.24, defaults
  included), then conventions recognised from field names alone (for model types transformers
  does not know), then every layer `full_attention`.

Unknown kinds are passed through lower-cased rather than rejected.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeGuard

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PretrainedConfig

__all__ = [
    "SOFTMAX_KINDS",
    "KNOWN_KINDS",
    "layer_types",
    "normalise_kind",
    "num_layers",
]

#: Kinds served by vLLM's attention interface (plain softmax attention, possibly windowed).
SOFTMAX_KINDS: frozenset[str] = frozenset(
    {"full_attention", "sliding_attention", "chunked_attention", "window_attention"}
)

#: transformers 5.24 `ALLOWED_ATTN_LAYER_TYPES` plus the nemotron_h block kind `mlp`.
KNOWN_KINDS: frozenset[str] = SOFTMAX_KINDS | {
    "indexed_attention",
    "compressed_sparse_attention",
    "heavily_compressed_attention",
    "minimax_m3_sparse",
    "conv",
    "moe",
    "mlp",
    "hybrid",
    "hybrid_sliding",
    "reference_sliding_attention",
    "linear_attention",
}

# transformers `configuration_utils._LEGACY_LAYER_TYPE_REMAP`, applied at config init.
_LEGACY_REMAP = {
    "mamba": "linear_attention",
    "attention": "full_attention",
    "deepseek_sparse_attention": "indexed_attention",
    "qwen_sparse_attention": "indexed_attention",
}

# Other spellings seen in older or remote-code configs (recurrent_gemma's "recurrent", ...).
_ALIASES = {
    "mamba2": "linear_attention",
    "ssm": "linear_attention",
    "recurrent": "linear_attention",
    "linear": "linear_attention",
    "linear_attn": "linear_attention",
    "full": "full_attention",
    "full_attn": "full_attention",
    "global": "full_attention",
    "global_attention": "full_attention",
    "sliding": "sliding_attention",
    "sliding_window": "sliding_attention",
    "sliding_window_attention": "sliding_attention",
    "swa": "sliding_attention",
    "local": "sliding_attention",
    "local_attention": "sliding_attention",
    "chunked": "chunked_attention",
}

# Character codes of nemotron_h's `hybrid_override_pattern` (also Megatron's hybrid pattern).
_PATTERN_CHARS = {"M": "linear_attention", "E": "moe", "*": "full_attention", "-": "mlp"}

_COUNT_KEYS = ("num_hidden_layers", "num_layers", "n_layer", "n_layers")

_MISSING = object()


def normalise_kind(kind: Any) -> str:
    """One layer kind in transformers' current vocabulary; unknown kinds come back lower-cased."""
    text = str(kind).strip().lower()
    key = text.replace("-", "_").replace(" ", "_")
    if key in KNOWN_KINDS:
        return key
    return _LEGACY_REMAP.get(key) or _ALIASES.get(key) or text


def layer_types(config: Mapping[str, Any] | PretrainedConfig) -> list[str]:
    """One kind per decoder layer of the text config `config` (see the module docstring)."""
    if isinstance(config, Mapping):
        return _from_mapping(config)
    return _from_object(config)


def num_layers(config: Mapping[str, Any] | PretrainedConfig) -> int | None:
    """The decoder layer count of `config` (aliases included), or None where it has none."""
    if isinstance(config, Mapping):
        return _count(config, _model_type(config))
    for key in _COUNT_KEYS:
        value = _safe_getattr(config, key)
        if _is_int(value):
            return value
    return None


# --------------------------------------------------------------------------- objects


def _safe_getattr(obj: Any, name: str) -> Any:
    try:
        return getattr(obj, name, None)
    except Exception:  # noqa: BLE001 - a property that raises on an incomplete config
        return None


def _from_object(config: Any) -> list[str]:
    declared = _safe_getattr(config, "layer_types")
    if _is_kind_list(declared):
        kinds = [normalise_kind(k) for k in declared]
        n = num_layers(config)
        if n is not None and len(kinds) > n:  # trailing MTP entries (step3p5, deepseek_v4)
            kinds = kinds[:n]
        if n is None or len(kinds) == n:
            return kinds
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):
        data = dict(to_dict())
    else:
        data = dict(vars(config))
    if "model_type" not in data and isinstance(getattr(config, "model_type", None), str):
        data["model_type"] = config.model_type
    return _from_mapping(data)


# --------------------------------------------------------------------------- mappings


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_kind_list(value: Any) -> TypeGuard[Sequence[str]]:
    return (
        isinstance(value, Sequence)
        and not isinstance(value, (str, bytes))
        and len(value) > 0
        and all(isinstance(v, str) for v in value)
    )


def _model_type(cfg: Mapping[str, Any]) -> str:
    value = cfg.get("model_type")
    return value.strip().lower() if isinstance(value, str) else ""


def _get(cfg: Mapping[str, Any], key: str, default: Any = None) -> Any:
    """`cfg[key]` where present (an explicit None stays None), else `default`."""
    return cfg.get(key, default)


def _int(cfg: Mapping[str, Any], key: str, default: int) -> int:
    value = cfg.get(key)
    return value if _is_int(value) else default


def _positive(cfg: Mapping[str, Any], key: str, default: int) -> int:
    value = cfg.get(key)
    return value if _is_int(value) and value > 0 else default


def _count(cfg: Mapping[str, Any], model_type: str) -> int | None:
    for key in _COUNT_KEYS:
        value = cfg.get(key)
        if _is_int(value) and value >= 0:
            return value
    if model_type == "xlstm" and _is_int(cfg.get("num_blocks")):
        return cfg["num_blocks"]
    return None


@functools.cache
def _transformers_config_class(model_type: str) -> Any:
    """transformers' config class for `model_type`, or None (never instantiated)."""
    if not model_type:
        return None
    try:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    except Exception:  # noqa: BLE001  # pragma: no cover - transformers is a dependency
        return None
    try:
        return CONFIG_MAPPING[model_type]
    except Exception:  # noqa: BLE001 - an unknown model type
        return None


def _known_to_transformers(model_type: str) -> bool:
    return _transformers_config_class(model_type) is not None


def _class_default(model_type: str, field: str) -> Any:
    cls = _transformers_config_class(model_type)
    if cls is None:
        return None
    if dataclasses.is_dataclass(cls):
        for f in dataclasses.fields(cls):
            if f.name == field and f.default is not dataclasses.MISSING:
                return f.default
    value = cls.__dict__.get(field, _MISSING)
    return None if value is _MISSING or isinstance(value, property) else value


def _from_mapping(cfg: Mapping[str, Any]) -> list[str]:
    mt = _model_type(cfg)
    n = _count(cfg, mt)

    explicit = _explicit_list(cfg)
    if explicit is not None:
        if mt in _LIST_SETS_COUNT or n is None:
            n = len(explicit)
        if len(explicit) >= n:
            return _postprocess(mt, cfg, [normalise_kind(k) for k in explicit[:n]])

    if n is None:
        n = _count_from_fields(cfg)
    if n is None:
        default = _class_default(mt, "num_hidden_layers")
        n = default if _is_int(default) else None
    if n is None and mt in _LIST_SETS_COUNT:
        n = 0  # its rule returns the default block list whatever the count
    if n is None:
        return []

    kinds: list[str] | None = None
    rule = _RULES.get(mt) or _RULES.get(_WRAPPER_TEXT_TYPE.get(mt, ""))
    if rule is not None:
        kinds = rule(cfg, n)
    if kinds is None:
        kinds = _generic(cfg, n, known=_known_to_transformers(mt))
    if kinds is None:
        kinds = ["full_attention"] * n
    return _postprocess(mt, cfg, kinds)


def _explicit_list(cfg: Mapping[str, Any]) -> list[str] | None:
    for key in ("layer_types", "layers_block_type"):
        value = cfg.get(key)
        if _is_kind_list(value):
            return list(value)
    return None


def _count_from_fields(cfg: Mapping[str, Any]) -> int | None:
    """Layer count implied by a per-layer field, for configs that state no count."""
    pattern = cfg.get("hybrid_override_pattern")
    if isinstance(pattern, str) and pattern:
        return len(pattern)
    for key in ("attn_type_list", "hybrid_layer_pattern", "compress_ratios"):
        value = cfg.get(key)
        if isinstance(value, (list, tuple)) and value:
            return len(value)
    return None


# nemotron_h derives `num_hidden_layers` from its block list (a stale count is ignored).
_LIST_SETS_COUNT = frozenset({"nemotron_h"})


def _postprocess(mt: str, cfg: Mapping[str, Any], kinds: list[str]) -> list[str]:
    """Fix-ups transformers applies to explicit and derived lists alike."""
    if mt in _FULL_IS_INDEXED:
        kinds = ["indexed_attention" if k == "full_attention" else k for k in kinds]
    if mt in _DOTS3_NOTE:
        use_dsa = _get(cfg, "use_dsa", None if "per_layer_config" in cfg else True)
        if use_dsa is not None:
            old, new = ("full_attention", "indexed_attention") if use_dsa else ("indexed_attention", "full_attention")
            kinds = [new if k == old else k for k in kinds]
    if mt in _LAST_LAYER_FULL and kinds and kinds[-1] != "full_attention":
        kinds = kinds[:-1] + ["full_attention"]
    return kinds


# qwen4_exp and glm5_next checkpoints write "full_attention" for their indexer layers.
_FULL_IS_INDEXED = frozenset({"qwen4_exp", "qwen4_exp_text", "glm5_next", "glm5_next_text"})
_DOTS3_NOTE = frozenset({"dots3_note", "dots3_note_text"})
# Gemma-4 style configs force the last layer to full attention (with a warning).
_GEMMA4_STYLE = (
    "gemma4",
    "gemma4_text",
    "gemma4_unified",
    "gemma4_unified_text",
    "gemma4_unified_assistant",
    "diffusion_gemma",
    "diffusion_gemma_text",
)
"""Gemma 4 and the models written from it: five sliding layers, then one full."""
_LAST_LAYER_FULL = frozenset({*_GEMMA4_STYLE, "embedding_gemma2", "embedding_gemma2_text"})


# --------------------------------------------------------------------------- helpers

Rule = Callable[[Mapping[str, Any], int], "list[str] | None"]
ListRule = Callable[[Mapping[str, Any], int], "list[str]"]
"""A rule that always answers."""


def _each(n: int, fn: Callable[[int], str]) -> list[str]:
    return [fn(i) for i in range(n)]


def _all(kind: str) -> Rule:
    return lambda cfg, n: [kind] * n


def _every(period: int, hit: str, miss: str, *, last_hit: bool = False, first_hit: bool = False) -> ListRule:
    """`hit` on layers i with (i + 1) % period == 0 (optionally also the last / first), else `miss`."""

    def rule(cfg: Mapping[str, Any], n: int) -> list[str]:
        return _each(
            n,
            lambda i: hit
            if (i + 1) % period == 0 or (last_hit and i == n - 1) or (first_hit and i == 0)
            else miss,
        )

    return rule


def _interval(default: int, hit: str, miss: str) -> Rule:
    """qwen3_next: layer i is `miss` unless (i + 1) % full_attention_interval == 0."""

    def rule(cfg: Mapping[str, Any], n: int) -> list[str]:
        period = _positive(cfg, "full_attention_interval", default)
        return _each(n, lambda i: hit if (i + 1) % period == 0 else miss)

    return rule


def _pattern_kinds(pattern: str) -> list[str]:
    return [_PATTERN_CHARS.get(ch, ch.lower()) for ch in pattern]


def _sliding_from_pattern(period: int, n: int) -> list[str]:
    """Gemma-style: sliding unless (i + 1) % period == 0."""
    return _each(n, lambda i: "sliding_attention" if (i + 1) % period else "full_attention")


def _qwen2_window(sliding_default: int | None, max_window_default: int, *, gated: bool = True) -> Rule:
    """Qwen2/Qwen3: `sliding_window` only counts when `use_sliding_window`; layers
    `i >= max_window_layers` then slide."""

    def rule(cfg: Mapping[str, Any], n: int) -> list[str]:
        window = _get(cfg, "sliding_window", sliding_default)
        if gated and not _get(cfg, "use_sliding_window", False):
            window = None
        configured = cfg.get("max_window_layers")
        start = configured if _is_int(configured) else max_window_default
        return _each(n, lambda i: "sliding_attention" if window is not None and i >= start else "full_attention")

    return rule


def _global_window(sliding_default: int | None, *, gated: bool = False) -> ListRule:
    """Mistral-style: one `sliding_window` for every layer (transformers keeps no layer_types)."""

    def rule(cfg: Mapping[str, Any], n: int) -> list[str]:
        window = _get(cfg, "sliding_window", sliding_default)
        if gated and not _get(cfg, "use_sliding_window", False):
            window = None
        return [("sliding_attention" if window is not None else "full_attention")] * n

    return rule


# --------------------------------------------------------------------------- per-model rules


def _qwen2_moe(cfg: Mapping[str, Any], n: int) -> list[str]:
    # transformers 5.24 Qwen2MoeConfig: even layers below max_window_layers slide (note `<`,
    # the opposite of Qwen2's `>=`), and `sliding_window` itself is not consulted.
    use = bool(_get(cfg, "use_sliding_window", False))
    start = _int(cfg, "max_window_layers", 28)
    return _each(n, lambda i: "sliding_attention" if (i + 1) % 2 and i < start and use else "full_attention")


def _minimax(cfg: Mapping[str, Any], n: int) -> list[str]:
    attn = _attn_type_list(cfg, n)
    if attn is not None:
        return attn
    # MiniMaxConfig default: even layers full attention, odd layers linear (lightning) attention.
    return _each(n, lambda i: "full_attention" if (i + 1) % 2 else "linear_attention")


def _kimi_linear(cfg: Mapping[str, Any], n: int) -> list[str]:
    default = _each(n, lambda i: "full_attention" if i and i % 4 == 0 else "linear_attention")
    lac = cfg.get("linear_attn_config")
    if isinstance(lac, Mapping) and "full_attn_layers" in lac and "kda_layers" in lac:
        kinds = list(default)
        for key, kind in (("full_attn_layers", "full_attention"), ("kda_layers", "linear_attention")):
            for layer in lac.get(key) or ():
                if _is_int(layer) and 1 <= layer <= n:  # 1-indexed in the checkpoint
                    kinds[layer - 1] = kind
        return kinds
    return default


def _lfm2(cfg: Mapping[str, Any], n: int) -> list[str]:
    idxs = cfg.get("full_attn_idxs")
    full = set(idxs) if isinstance(idxs, (list, tuple)) else set(range(n))
    return _each(n, lambda i: "full_attention" if i in full else "conv")


def _lfm3(cfg: Mapping[str, Any], n: int) -> list[str]:
    return _each(
        n,
        lambda i: "full_attention" if i % 4 == 2 else "sliding_attention" if i % 4 == 0 and i > 0 else "conv",
    )


def _jamba(cfg: Mapping[str, Any], n: int) -> list[str]:
    period = _positive(cfg, "attn_layer_period", 8)
    offset = _int(cfg, "attn_layer_offset", 4)
    return _each(n, lambda i: "full_attention" if i % period == offset else "linear_attention")


def _bamba(cfg: Mapping[str, Any], n: int) -> list[str]:
    idxs = cfg.get("attn_layer_indices")
    full = set(idxs) if isinstance(idxs, (list, tuple)) else set()
    return _each(n, lambda i: "full_attention" if i in full else "linear_attention")


def _zamba(cfg: Mapping[str, Any], n: int) -> list[str]:
    # The shared-attention layers are "hybrid" (a transformer block feeding a mamba block).
    period = _positive(cfg, "attn_layer_period", 6)
    offset = _int(cfg, "attn_layer_offset", 4)
    head = ["linear_attention", "linear_attention", "hybrid"][:n]
    return head + [
        "hybrid" if i % period == offset else "linear_attention" for i in range(max(n - 3, 0))
    ]


_ZAMBA2_DEFAULT = (
    ["linear_attention"]
    + (["linear_attention"] * 5 + ["hybrid"]) * 7
    + ["linear_attention"] * 4
    + ["hybrid"]
    + ["linear_attention"] * 3
    + ["hybrid"]
    + ["linear_attention"] * 2
)


def _zamba2(cfg: Mapping[str, Any], n: int) -> list[str]:
    # Zamba2Config's default block list is fixed (54 layers); other sizes get its period.
    if n == len(_ZAMBA2_DEFAULT):
        return list(_ZAMBA2_DEFAULT)
    return _each(n, lambda i: "hybrid" if i % 6 == 0 and i else "linear_attention")


def _nemotron_h(cfg: Mapping[str, Any], n: int) -> list[str]:
    pattern = cfg.get("hybrid_override_pattern")
    if isinstance(pattern, str) and pattern:
        return _pattern_kinds(pattern)  # the pattern sets the layer count
    # NemotronHConfig default block list (its num_hidden_layers follows the list).
    return ["linear_attention", "moe", "full_attention", "mlp"]


def _recurrent_gemma(cfg: Mapping[str, Any], n: int) -> list[str]:
    configured = cfg.get("block_types")
    blocks = configured if _is_kind_list(configured) else ["recurrent", "recurrent", "attention"]
    kinds = []
    for i in range(n):
        block = str(blocks[i % len(blocks)]).strip().lower()
        # transformers: the attention blocks always use local (sliding window) attention.
        if block == "recurrent":
            kinds.append("linear_attention")
        elif block == "attention":
            kinds.append("sliding_attention")
        else:
            kinds.append(normalise_kind(block))
    return kinds


def _gemma3(cfg: Mapping[str, Any], n: int) -> list[str]:
    period = cfg.get("sliding_window_pattern", cfg.get("_sliding_window_pattern"))
    return _sliding_from_pattern(period if _is_int(period) and period > 0 else 6, n)


def _pattern_kwarg(default: int) -> Rule:
    """Configs that read a legacy `sliding_window_pattern` int (cohere2, t5gemma2, embedding_gemma2)."""

    def rule(cfg: Mapping[str, Any], n: int) -> list[str]:
        return _sliding_from_pattern(_positive(cfg, "sliding_window_pattern", default), n)

    return rule


def _cohere2_moe(cfg: Mapping[str, Any], n: int) -> list[str]:
    first = _int(cfg, "first_k_dense_replace", 0)
    prefix_period = _positive(cfg, "prefix_dense_sliding_window_pattern", 1)
    period = _positive(cfg, "sliding_window_pattern", 4)
    prefix = _sliding_from_pattern(prefix_period, min(first, n))
    return prefix + _sliding_from_pattern(period, max(n - first, 0))


def _exaone4(cfg: Mapping[str, Any], n: int) -> list[str]:
    # Exaone4Config: `sliding_window_pattern` int (default 4). Two inputs make transformers
    # 5.24 itself raise (sliding_window None: modulo by zero; a "LLLG" string: TypeError);
    # read them the way the field is documented instead.
    if _get(cfg, "sliding_window", 4096) is None:
        return ["full_attention"] * n
    pattern = _get(cfg, "sliding_window_pattern", 4)
    if isinstance(pattern, str) and pattern:
        return _each(n, lambda i: "full_attention" if pattern[i % len(pattern)].upper() == "G" else "sliding_attention")
    return _sliding_from_pattern(pattern if _is_int(pattern) and pattern > 0 else 4, n)


def _afmoe(cfg: Mapping[str, Any], n: int) -> list[str]:
    return _sliding_from_pattern(_positive(cfg, "global_attn_every_n_layers", 4), n)


def _modernbert(cfg: Mapping[str, Any], n: int) -> list[str]:
    period = _positive(cfg, "global_attn_every_n_layers", 3)
    return _each(n, lambda i: "sliding_attention" if i % period else "full_attention")


def _olmo_hybrid(cfg: Mapping[str, Any], n: int) -> list[str]:
    kinds = _each(n, lambda i: "full_attention" if i % 4 == 3 else "linear_attention")
    if kinds and "full_attention" not in kinds:
        kinds[-1] = "full_attention"
    return kinds


def _bailing_hybrid(cfg: Mapping[str, Any], n: int) -> list[str]:
    group = _positive(cfg, "layer_group_size", 6)
    return _each(n, lambda i: "full_attention" if (i + 1) % group == 0 else "linear_attention")


def _beam(cfg: Mapping[str, Any], n: int) -> list[str]:
    return _every(6, "full_attention", "sliding_attention", last_hit=True)(cfg, n)


def _dots3_note(cfg: Mapping[str, Any], n: int) -> list[str]:
    use_dsa = _get(cfg, "use_dsa", None if "per_layer_config" in cfg else True)
    use_window = _get(cfg, "use_sliding_window", True)
    full = "full_attention" if use_dsa is False else "indexed_attention"
    return _each(n, lambda i: full if not use_window or i < 2 or i % 4 == 1 else "sliding_attention")


def _inkling(cfg: Mapping[str, Any], n: int) -> list[str]:
    ids = cfg.get("local_layer_ids")
    local = set(ids) if isinstance(ids, (list, tuple)) else {i for i in range(n) if (i + 1) % 6}
    return _each(n, lambda i: "hybrid_sliding" if i in local else "hybrid")


_LARA_MINI = ("linear_attention", "sliding_attention", "linear_attention", "full_attention", "sliding_attention")


def _lara_mini(cfg: Mapping[str, Any], n: int) -> list[str]:
    return _each(n, lambda i: _LARA_MINI[i % len(_LARA_MINI)])


def _no_rope_layers(cfg: Mapping[str, Any], n: int) -> list[Any]:
    layers = cfg.get("no_rope_layers")
    if isinstance(layers, (list, tuple)) and layers:
        return list(layers) + [1] * max(n - len(layers), 0)
    interval = _positive(cfg, "no_rope_layer_interval", 4)
    return [int((i + 1) % interval != 0) for i in range(n)]


def _llama4(cfg: Mapping[str, Any], n: int) -> list[str]:
    chunk = _get(cfg, "attention_chunk_size", 8192)
    no_rope = _no_rope_layers(cfg, n)
    return _each(n, lambda i: "chunked_attention" if no_rope[i] and chunk is not None else "full_attention")


def _smollm3(cfg: Mapping[str, Any], n: int) -> list[str]:
    window = _get(cfg, "sliding_window", None)
    use = _get(cfg, "use_sliding_window", False)
    has_rope = _no_rope_layers(cfg, n)  # 1 = this layer applies RoPE
    return _each(
        n, lambda i: "sliding_attention" if use and window is not None and not has_rope[i] else "full_attention"
    )


def _ministral(cfg: Mapping[str, Any], n: int) -> list[str]:
    return _global_window(4096)(cfg, n)


def _mimo_v2_flash(cfg: Mapping[str, Any], n: int) -> list[str]:
    hybrid = _hybrid_layer_pattern(cfg, n)
    if hybrid is not None:
        return hybrid
    return _each(n, lambda i: "full_attention" if i == 0 or (i + 1) % 6 == 0 else "sliding_attention")


def _muse_text(cfg: Mapping[str, Any], n: int) -> list[str]:
    return _each(n, lambda i: "full_attention" if (n - 1 - i) % 4 == 0 else "sliding_attention")


def _muse_vision(cfg: Mapping[str, Any], n: int) -> list[str]:
    return _each(n, lambda i: "full_attention" if (i + 1) % 4 == 0 or i == n - 1 else "window_attention")


def _ultrabert(cfg: Mapping[str, Any], n: int) -> list[str]:
    windows = cfg.get("attention_windows")
    if isinstance(windows, (list, tuple)) and len(windows) >= n:
        return ["sliding_attention" if w else "full_attention" for w in windows[:n]]
    return _sliding_from_pattern(3, n)


def _unlimited_ocr(cfg: Mapping[str, Any], n: int) -> list[str]:
    window = _get(cfg, "sliding_window", 128)
    return [("reference_sliding_attention" if window is not None else "full_attention")] * n


_COMPRESS_RATIO_KINDS = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}


def _deepseek_v4(cfg: Mapping[str, Any], n: int) -> list[str]:
    ratios = cfg.get("compress_ratios")
    if isinstance(ratios, (list, tuple)) and len(ratios) >= n:
        return [_COMPRESS_RATIO_KINDS.get(r, str(r).lower()) for r in ratios[:n]]
    tail = ["compressed_sparse_attention" if i % 2 else "heavily_compressed_attention" for i in range(max(n - 2, 0))]
    return ["heavily_compressed_attention"] * min(n, 2) + tail


def _sparse_freq(cfg: Mapping[str, Any], n: int) -> list[str] | None:
    sparse = cfg.get("sparse_attention_config")
    freq = sparse.get("sparse_attention_freq") if isinstance(sparse, Mapping) else None
    if isinstance(freq, (list, tuple)) and len(freq) >= n:
        return ["minimax_m3_sparse" if f else "full_attention" for f in freq[:n]]
    return None


def _minimax_m3(cfg: Mapping[str, Any], n: int) -> list[str]:
    return _sparse_freq(cfg, n) or ["full_attention"] * n


def _lfm3_vl_vision(cfg: Mapping[str, Any], n: int) -> list[str]:
    return _each(n, lambda i: "conv" if i < 2 or i % 2 else "full_attention")


_PURE_RECURRENT = ("mamba", "mamba2", "falcon_mamba", "rwkv", "xlstm")

_RULES: dict[str, Rule] = {
    **{mt: _all("linear_attention") for mt in _PURE_RECURRENT},
    # Gated DeltaNet hybrids: every `full_attention_interval`-th layer is softmax attention.
    **{
        mt: _interval(4, "full_attention", "linear_attention")
        for mt in ("qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text")
    },
    "qwen4_exp": _interval(4, "indexed_attention", "linear_attention"),
    "qwen4_exp_text": _interval(4, "indexed_attention", "linear_attention"),
    "glm5_next": lambda cfg, n: _each(n, lambda i: "indexed_attention" if i % 4 == 3 else "linear_attention"),
    "glm5_next_text": lambda cfg, n: _each(n, lambda i: "indexed_attention" if i % 4 == 3 else "linear_attention"),
    "minimax": _minimax,
    "kimi_linear": _kimi_linear,
    "lfm2": _lfm2,
    "lfm3": _lfm3,
    "lfm3_vl_vision": _lfm3_vl_vision,
    "jamba": _jamba,
    "bamba": _bamba,
    "falcon_h1": _all("hybrid"),
    "zaya": _all("hybrid"),
    "granitemoehybrid": _all("linear_attention"),  # GraniteMoeHybridConfig default
    "zamba": _zamba,
    "zamba2": _zamba2,
    "nemotron_h": _nemotron_h,
    "recurrent_gemma": _recurrent_gemma,
    "olmo_hybrid": _olmo_hybrid,
    "bailing_hybrid": _bailing_hybrid,
    "lara_mini": _lara_mini,
    "inkling_text": _inkling,
    **{mt: _every(6, "hybrid", "hybrid_sliding") for mt in ("inkling2_text", "inkling2_loop_text")},
    # Qwen2 family: `use_sliding_window` + `max_window_layers`.
    "qwen2": _qwen2_window(4096, 28),
    "qwen3": _qwen2_window(4096, 28),
    "qwen2_vl_text": _qwen2_window(4096, 80),
    "qwen2_5_vl_text": _qwen2_window(4096, 80),
    "qwen2_5_omni_text": _qwen2_window(32768, 28),
    "qwen2_5_omni_talker": _qwen2_window(32768, 28),
    "deepseek_ocr2_encoder": _qwen2_window(4096, 28),
    "dots1": _qwen2_window(4096, 62, gated=False),
    "qwen3_omni_moe_talker_code_predictor": _qwen2_window(None, 28, gated=False),
    "qwen2_moe": _qwen2_moe,
    # Mistral style: one `sliding_window` for all layers (transformers keeps no layer_types).
    "qwen3_moe": _global_window(4096, gated=True),
    "mistral": _global_window(4096),
    "voxtral_realtime_text": _global_window(4096),
    **{
        mt: _global_window(None)
        for mt in ("mixtral", "ministral3", "phi3", "phimoe", "phi4_multimodal", "starcoder2", "doge")
    },
    "ministral": _ministral,
    "unlimited_ocr_text": _unlimited_ocr,
    # Gemma style alternation / patterns.
    **{
        mt: _every(2, "full_attention", "sliding_attention")
        for mt in ("gemma2", "vaultgemma", "t5_gemma_module", "t5gemma", "gpt_oss")
    },
    "gemma3": _gemma3,
    "gemma3_text": _gemma3,
    **{
        mt: _pattern_kwarg(6)
        for mt in ("t5gemma2_text", "t5gemma2_encoder", "t5gemma2_decoder", "embedding_gemma2", "embedding_gemma2_text")
    },
    **{
        mt: _every(6, "full_attention", "sliding_attention")
        for mt in _GEMMA4_STYLE
    },
    "gemma3n": _every(5, "full_attention", "sliding_attention"),
    "gemma3n_text": _every(5, "full_attention", "sliding_attention"),
    "cohere2": _pattern_kwarg(4),
    "cohere2_moe": _cohere2_moe,
    "exaone4": _exaone4,
    "exaone_moe": _exaone4,
    "afmoe": _afmoe,
    "modernbert": _modernbert,
    "modernbert-decoder": _modernbert,
    "modernbert_decoder": _modernbert,
    "olmo3": _every(4, "full_attention", "sliding_attention"),
    "dory": _every(4, "full_attention", "sliding_attention"),
    "kolibri1": _every(5, "full_attention", "sliding_attention"),
    "neomme": _every(6, "full_attention", "sliding_attention", last_hit=True),
    "beam": _beam,
    "cwm": lambda cfg, n: _each(n, lambda i: "full_attention" if i % 4 == 0 else "sliding_attention"),
    "granite_swa": lambda cfg, n: _each(n, lambda i: "full_attention" if i % 4 == 0 else "sliding_attention"),
    "granitemoe_swa": lambda cfg, n: _each(n, lambda i: "full_attention" if i % 4 == 0 else "sliding_attention"),
    "flint": lambda cfg, n: _each(
        n, lambda i: "full_attention" if i < 2 or i % 4 == 1 or i == n - 1 else "sliding_attention"
    ),
    "mimo_v2_flash": _mimo_v2_flash,
    "muse_glimmer_text": _muse_text,
    "muse_spark_text": _muse_text,
    "muse_glimmer_vision": _muse_vision,
    "muse_spark_vision": _muse_vision,
    "muse_glimmer_assistant": _all("sliding_attention"),
    "ultrabert": _ultrabert,
    "llama4_text": _llama4,
    "smollm3": _smollm3,
    "dots3_note_text": _dots3_note,
    # Indexer (DSA-style) sparse attention on every layer.
    **{
        mt: _all("indexed_attention")
        for mt in ("axk2", "deepseek_v32", "glm_moe_dsa", "hy_v4", "hy_v4_vl_text", "mistral_large4_text")
    },
    "deepseek_v4": _deepseek_v4,
    # Step3p7TextConfig fills layer_types with full_attention before it reads
    # `sparse_attention_config`, so step3p5's sparse frequency list never takes effect there.
    "step3p5": _all("full_attention"),
    "minimax_m3_vl_text": _minimax_m3,
}


# Multimodal wrappers whose text fields may sit at the top level (Qwen2-VL's flat configs) or
# whose caller did not resolve `text_config`: read them with the text model's rule.
_WRAPPER_TEXT_TYPE = {
    "qwen2_vl": "qwen2_vl_text",
    "qwen2_5_vl": "qwen2_5_vl_text",
    "qwen2_5_omni": "qwen2_5_omni_text",
    "qwen2_5_omni_thinker": "qwen2_5_omni_text",
    "jev": "qwen3_5_text",
    "minicpmv4_6": "qwen3_5_text",
    "minicpmv4_7": "qwen3_5_text",
    "minicpm_ocr": "qwen3_5_text",
    "llama4": "llama4_text",
    "lfm2_vl": "lfm2",
    "lfm3_vl": "lfm3",
    "exaone4_5": "exaone4",
    "aya_vision": "cohere2",
    "cohere2_vision": "cohere2",
    "shieldgemma2": "gemma3_text",
    "nemotron_h_omni": "nemotron_h",
    "nemo_speechlm": "nemotron_h",
    "dots3_note": "dots3_note_text",
    "hy_v4_vl": "hy_v4_vl_text",
    "mistral_large4": "mistral_large4_text",
    "minimax_m3_vl": "minimax_m3_vl_text",
    "step3p7": "step3p5",
    "muse_glimmer": "muse_glimmer_text",
    "muse_spark": "muse_spark_text",
    "inkling_mm_model": "inkling_text",
    "inkling2": "inkling2_text",
    "inkling2_loop": "inkling2_loop_text",
    "t5gemma2": "t5gemma2_text",
}


# --------------------------------------------------------------------------- generic conventions


def _attn_type_list(cfg: Mapping[str, Any], n: int) -> list[str] | None:
    """MiniMax-Text-01 / M1 / M2 remote code: 1 = softmax attention, 0 = lightning (linear)."""
    values = cfg.get("attn_type_list")
    if isinstance(values, (list, tuple)) and len(values) >= n:
        return ["full_attention" if v == 1 else "linear_attention" if v == 0 else normalise_kind(v) for v in values[:n]]
    return None


def _hybrid_layer_pattern(cfg: Mapping[str, Any], n: int) -> list[str] | None:
    """MiMo-V2 `hybrid_layer_pattern` list (0 = full, 1 = sliding) or a Megatron pattern string."""
    value = cfg.get("hybrid_layer_pattern")
    if isinstance(value, (list, tuple)) and len(value) >= n:
        return ["sliding_attention" if v == 1 else "full_attention" if v == 0 else normalise_kind(v) for v in value[:n]]
    if isinstance(value, str) and len(value) >= n:
        return _pattern_kinds(value[:n])
    return None


def _generic(cfg: Mapping[str, Any], n: int, *, known: bool) -> list[str] | None:
    """Conventions recognised from field names, for model types without a rule.

    Per-layer lists and patterns apply to every model type; the sliding-window guesses only to
    model types transformers does not know (for a known type without a rule, transformers
    ignores such fields).
    """
    for reader in (_attn_type_list, _hybrid_layer_pattern, _sparse_freq):
        kinds = reader(cfg, n)
        if kinds is not None:
            return kinds
    pattern = cfg.get("hybrid_override_pattern")
    if isinstance(pattern, str) and len(pattern) >= n:
        return _pattern_kinds(pattern[:n])
    if known:
        return None

    if _is_int(cfg.get("full_attention_interval")):
        return _interval(4, "full_attention", "linear_attention")(cfg, n)
    lac = cfg.get("linear_attn_config")
    if isinstance(lac, Mapping) and "full_attn_layers" in lac and "kda_layers" in lac:
        return _kimi_linear(cfg, n)
    if isinstance(cfg.get("full_attn_idxs"), (list, tuple)):
        return _lfm2(cfg, n)
    if isinstance(cfg.get("attn_layer_indices"), (list, tuple)):
        return _bamba(cfg, n)
    if _is_int(cfg.get("attn_layer_period")) and _is_int(cfg.get("attn_layer_offset")):
        return _jamba(cfg, n)

    window = cfg.get("sliding_window")
    if window is None or window is False or (_is_int(window) and window <= 0):
        return None
    if "use_sliding_window" in cfg and not cfg["use_sliding_window"]:
        return None
    period = cfg.get("sliding_window_pattern", cfg.get("_sliding_window_pattern"))
    if isinstance(period, str) and period:
        return _each(n, lambda i: "full_attention" if period[i % len(period)].upper() == "G" else "sliding_attention")
    if _is_int(period) and period > 0:
        return _sliding_from_pattern(period, n)
    if _is_int(cfg.get("max_window_layers")):
        start = cfg["max_window_layers"]
        return _each(n, lambda i: "sliding_attention" if i >= start else "full_attention")
    return ["sliding_attention"] * n
