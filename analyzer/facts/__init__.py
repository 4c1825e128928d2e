"""config.json -> ModelFacts: everything the rules need that the config alone decides.

Facts are raw observations (Scorecard style): no judgement here. A config that
transformers knows is read through its real config class (so v5 defaults and derived
fields such as ``layer_types`` are right); remote-code configs are read as plain dicts,
never by executing their code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from hfcheck.analyzer.facts.config_fields import (
    TEXT_SUBCONFIG_KEYS,
    as_count,
    check_config,
    check_subconfig,
    text_config_of,
    text_subconfig,
)
from hfcheck.analyzer.facts.errors import FactsError
from hfcheck.analyzer.facts.layer_types import layer_types as derive_layer_types
from hfcheck.analyzer.remote.index import config_class_keys
from hfcheck.analyzer.terms import vocabulary as V
from hfcheck.analyzer.vllm.native_fit import native_fit
from hfcheck.analyzer.vllm.registry import resolve_auto


@dataclass
class ModelFacts:
    model_type: str
    architectures: list[str]
    text_model_type: str
    known_to_transformers: bool
    auto_map: dict[str, Any]
    is_encoder_decoder: bool
    num_layers: int
    hidden_size: int | None
    num_heads: int | None
    num_kv_heads: int | None
    head_dim: int | None
    intermediate_size: int | None
    vocab_size: int | None
    layer_types: list[str]
    num_experts: int = 0
    top_k: int | None = None
    moe_intermediate_size: int | None = None
    num_shared_experts: int = 0
    first_dense_layers: int = 0
    kv_lora_rank: int | None = None
    q_lora_rank: int | None = None
    qk_nope_head_dim: int | None = None
    qk_rope_head_dim: int | None = None
    v_head_dim: int | None = None
    quant_method: str | None = None
    weight_block_size: list[int] | None = None
    dtype: str = "bfloat16"
    tie_word_embeddings: bool = False
    sliding_window: int | None = None
    max_position_embeddings: int | None = None
    routed_scaling_factor: float = 1.0
    vllm_native: bool | None = None
    vllm_native_mismatch: str | None = None
    """Why vLLM's native class of this name does not compute this model (``native_fit``): None when it does."""
    vllm_table_version: str = ""
    """The vLLM release whose registry answered (the one predicted for)."""
    vllm_auto: str = "unnamed"
    """What ``--model-impl auto`` picks (``registry.AutoResolution.how``): native | listed | fallback | unnamed."""
    vllm_auto_note: str = ""
    """``AutoResolution.describe()``: the registry's answer in one line, with its release."""
    multimodal: bool = False
    """The config nests its text config (``config.get_text_config() is not config``): what vLLM
    reads as multimodal (``_get_transformers_backend_cls`` and ``Base._get_attn_cls``)."""
    towers: list[str] = field(default_factory=list)
    """The config's non-text sub-configs that build encoders (``vision_config``, ``audio_config``)."""
    text_config_key: str | None = None
    """Where a plain-dict (remote) config keeps its text model's fields, when not at the top."""
    notes: list[str] = field(default_factory=list)

    @property
    def uses_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def first_of(source: Any, names: tuple[str, ...], default: Any = None) -> Any:
    """The first field among ``names`` that is set (attribute or key), else ``default``.

    Heterogeneous v5 configs (per-layer geometry, e.g. Gemma 4) raise on model-wide reads
    of per-layer fields; there the largest per-layer value is the model-wide one, as in
    vLLM's config conversion."""
    for name in names:
        if isinstance(source, dict):
            value = source.get(name)
        else:
            try:
                value = getattr(source, name, None)
            except Exception:  # noqa: BLE001 - a property that raises on an incomplete config
                value = _largest_per_layer(source, name)
        if value is not None:
            return value
    return default


def _largest_per_layer(config: Any, name: str) -> Any:
    try:
        layers = getattr(config, "per_layer_config", None)
        values = [getattr(layer, name, None) for layer in (layers or [])]
    except Exception:  # noqa: BLE001 - a property that raises on an incomplete config
        return None
    numbers = [v for v in values if isinstance(v, (int, float))]
    return max(numbers) if numbers else None


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


def transformers_config(config: dict[str, Any]):
    """The real transformers config object for a known model_type, else None."""
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        return None
    kwargs = {k: v for k, v in config.items() if k not in ("model_type", "transformers_version")}
    try:
        return AutoConfig.for_model(model_type, **kwargs)
    except Exception as exc:  # noqa: BLE001 - transformers' own default that does not build: one line of reason
        if isinstance((config.get("auto_map") or {}).get("AutoConfig"), str):
            return None  # the repo's own config class reads it (Replit's MPT with grouped-query attention): its raw keys are the facts
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()] or [type(exc).__name__]
        reason = lines[0] if not lines[0].endswith(":") or len(lines) == 1 else f"{lines[0]} {lines[1]}"
        raise FactsError(f"config.json is not a valid {model_type} config: {reason[:240]}") from None


TOWER_KEYS = ("vision_config", "audio_config", "vision_tower_config", "visual", "speech_config", "encoder_config")
"""Sub-configs of encoders whose outputs a multimodal model feeds its language model."""


def _text_view(config: dict[str, Any], cfg_obj: Any) -> tuple[Any, str, str | None]:
    """The text config (object when known, else dict), its model_type, and (plain-dict configs)
    the key it was found under when it is not the top level."""
    if cfg_obj is not None:

        text = text_config_of(cfg_obj)
        return text, getattr(text, "model_type", None) or config.get("model_type", ""), None
    if first_of(config, V.LAYER_FIELDS) is None:
        found = text_subconfig(config)  # wherever the decoder's fields are (InfiMM: ``language``), not a list of names
        if found is not None:
            key, sub = found
            check_subconfig(sub, key)
            return sub, sub.get("model_type", config.get("model_type", "")), key
    return config, config.get("model_type", ""), None


def is_multimodal(config: dict[str, Any], cfg_obj: Any) -> bool:
    """vLLM's test (``config != config.get_text_config()``): the config nests a text config.
    A plain-dict (remote) config counts when it holds one under a name ``get_text_config`` looks
    for (a remote config class that overrides ``get_text_config`` is not executed, so not seen)."""
    if cfg_obj is not None:
        try:
            return cfg_obj.get_text_config() is not cfg_obj
        except ValueError:  # several text configs: transformers refuses to choose, so does vLLM
            return True
    return any(isinstance(config.get(k), dict) for k in ("text_encoder", "decoder", "generator", "text_config"))


def tower_keys(config: dict[str, Any], cfg_obj: Any) -> list[str]:
    """The encoder sub-configs the config declares (known to transformers or plain dicts)."""
    out = []
    for key in TOWER_KEYS:
        value = getattr(cfg_obj, key, None) if cfg_obj is not None else None
        if value is None:
            value = config.get(key)
        if value is not None and not isinstance(value, (bool, int, float, str)):
            out.append(key)
    return out


def _count(value: Any) -> int | None:
    """A count as an int: per-layer lists give their largest entry (the model-wide value, as in
    vLLM's config conversion); anything that is no count gives None."""

    if isinstance(value, (list, tuple)):
        counts = [c for c in map(as_count, value) if c is not None]
        return max(counts) if counts else None
    return as_count(value)


def _scaling(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value else 1.0


def collect_facts(config: dict[str, Any], code_files: dict[str, str] | None = None) -> tuple[ModelFacts, Any]:
    """(facts, transformers config object or None) for a parsed config.json (and the remote code
    beside it, whose config class may set keys config.json lacks: read, never run).

    The config is type-checked first, once (``config_fields.check_config``); every value read
    after that is of the type its fact declares."""

    check_config(config)
    model_type = config.get("model_type")
    cfg_obj = _config_object(config, model_type)
    text, text_type, text_key = _text_view(config, cfg_obj)
    get = lambda *names, default=None: first_of(text, names, default)  # noqa: E731

    shape = _shape_fields(text, get)
    num_experts = _count(get(*V.EXPERT_COUNT_FIELDS, default=0)) or 0
    quant = _quantization(config, text)
    dtype = config.get("torch_dtype") or config.get("dtype") or get("torch_dtype", "dtype") or "bfloat16"
    native = _vllm_native_fields(config, config_class_keys(config, code_files or {}))
    types = derive_layer_types(text)
    facts = ModelFacts(
        **_identity_fields(config, cfg_obj, model_type, text_type),
        **shape,
        intermediate_size=_count(get(*V.INTERMEDIATE_FIELDS)),
        vocab_size=_count(get(*V.VOCAB_FIELDS)),
        layer_types=types,
        num_experts=num_experts,
        **_moe_fields(get),
        **_mla_fields(get),
        **_precision_fields(quant, dtype),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", get("tie_word_embeddings", default=False))),
        sliding_window=_count(get("sliding_window")) if not isinstance(get("sliding_window"), (list, tuple)) else None,
        max_position_embeddings=_count(get("max_position_embeddings", "seq_length", "n_positions")),
        routed_scaling_factor=_scaling(get("routed_scaling_factor", default=1.0)),
        **native,
        multimodal=is_multimodal(config, cfg_obj),
        towers=tower_keys(config, cfg_obj),
        text_config_key=text_key,
    )
    if text_key:
        facts.notes.append(f"the language model's fields are read from config.json's {text_key!r} (the nested object that holds a "
                           "decoder's layer count and attention geometry; the top level has no layer count)")
    _count_unnumbered_shared_expert(facts, get)
    return facts, cfg_obj


def _config_object(config: dict[str, Any], model_type: Any) -> Any:
    """The transformers config object (None: a plain dict), once config.json names a model something can read."""
    if not model_type and not config.get("architectures"):
        raise FactsError("config.json names neither model_type nor architectures")
    cfg_obj = transformers_config(config)
    if cfg_obj is None and not config.get("auto_map"):
        raise FactsError(
            f"model_type {model_type!r} is unknown to transformers {_transformers_version()} and config.json has no auto_map"
        )
    return cfg_obj


def _shape_fields(text: Any, get: Callable[..., Any]) -> dict[str, Any]:
    """The layer count (no facts without one) and the attention geometry, head_dim derived where unset."""
    num_layers = _count(get(*V.LAYER_FIELDS))
    if num_layers is None or num_layers <= 0:
        raise FactsError(
            "config.json has no layer count (num_hidden_layers), neither at the top nor in any nested object that"
            f" looks like a language model's decoder (a layer count with heads and hidden size; {', '.join(TEXT_SUBCONFIG_KEYS[:3])}, ...)"
        )
    hidden = _count(get(*V.HIDDEN_FIELDS))
    heads = _count(get(*V.HEAD_FIELDS))
    kv_heads = _count(get(*V.KV_HEAD_FIELDS, default=heads))
    if isinstance(text, dict) and text.get("multi_query_attention") is False:
        kv_heads = heads
    head_dim = _count(get(*V.HEAD_DIM_FIELDS))
    if head_dim is None and hidden and heads:
        head_dim = hidden // heads
    return {"num_layers": num_layers, "hidden_size": hidden, "num_heads": heads, "num_kv_heads": kv_heads, "head_dim": head_dim}


def _quantization(config: dict[str, Any], text: Any) -> dict[str, Any]:
    """The quantization_config (top level first, then a plain-dict text config's); {} when none is a dict."""
    quant = config.get("quantization_config") or (text.get("quantization_config") if isinstance(text, dict) else None) or {}
    return quant if isinstance(quant, dict) else {}


def _vllm_native_fields(config: dict[str, Any], class_keys: frozenset[str]) -> dict[str, Any]:
    """What vLLM's registry does with the architecture under ``--model-impl auto``, and whether a
    native class computes this model: the one answer scan and port give (``class_keys``: what the
    remote config class sets itself)."""
    resolution = resolve_auto(list(config.get("architectures") or []))
    native, table_version = resolution.native, resolution.version
    mismatch = None
    if native and config.get("auto_map"):  # a Hub repo's own code under a registry name: is it the generation vLLM implements?

        fit = native_fit(str((config.get("architectures") or [""])[0]), config, class_keys)
        if fit is not None and not fit.fits:
            native, mismatch = False, fit.describe()
    return {"vllm_native": native, "vllm_native_mismatch": mismatch, "vllm_table_version": table_version,
            "vllm_auto": resolution.how, "vllm_auto_note": resolution.describe()}


def _identity_fields(config: dict[str, Any], cfg_obj: Any, model_type: Any, text_type: Any) -> dict[str, Any]:
    """What the model is called and which code defines it (transformers' classes or the repo's auto_map)."""
    return {
        "model_type": str(model_type or ""),
        "architectures": list(config.get("architectures") or []),
        "text_model_type": str(text_type or model_type or ""),
        "known_to_transformers": cfg_obj is not None,
        "auto_map": dict(config.get("auto_map") or {}),
        "is_encoder_decoder": bool(config.get("is_encoder_decoder") or getattr(cfg_obj, "is_encoder_decoder", False)),
    }


def _moe_fields(get: Callable[..., Any]) -> dict[str, Any]:
    """The mixture-of-experts routing and sizes beyond the expert count."""
    return {
        "top_k": _count(get(*V.TOP_K_FIELDS)),
        "moe_intermediate_size": _count(get(*V.MOE_INTERMEDIATE_FIELDS)),
        "num_shared_experts": _count(get(*V.SHARED_EXPERT_FIELDS, default=0)) or 0,
        "first_dense_layers": _count(get("first_k_dense_replace", default=0)) or 0,
    }


def _mla_fields(get: Callable[..., Any]) -> dict[str, Any]:
    """Multi-head latent attention's ranks and head dims (DeepSeek style); None where the model has none."""
    return {
        "kv_lora_rank": _count(get("kv_lora_rank")),
        "q_lora_rank": _count(get("q_lora_rank")),
        "qk_nope_head_dim": _count(get("qk_nope_head_dim")),
        "qk_rope_head_dim": _count(get("qk_rope_head_dim")),
        "v_head_dim": _count(get("v_head_dim")),
    }


def _precision_fields(quant: dict[str, Any], dtype: Any) -> dict[str, Any]:
    """The quantization method and block size where well-typed, and the dtype without its ``torch.`` prefix."""
    return {
        "quant_method": quant.get("quant_method") if isinstance(quant.get("quant_method"), str) else None,
        "weight_block_size": quant.get("weight_block_size") if isinstance(quant.get("weight_block_size"), list) else None,
        "dtype": str(dtype).replace("torch.", ""),
    }


def _count_unnumbered_shared_expert(facts: ModelFacts, get: Callable[..., Any]) -> None:
    """A config that sizes a shared expert without counting any has one (``shared_expert_intermediate_size``)."""
    if facts.num_shared_experts == 0 and _count(get("shared_expert_intermediate_size")):
        facts.num_shared_experts = 1
