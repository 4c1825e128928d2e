"""facts -> a tiny model instance that keeps the structure vLLM decides on.

Two shrinks, both from the real config object:
- ``structural`` (what ``scan`` uses): the shortest prefix of decoder layers that holds
  every distinct layer kind in order (dense-first and MoE layers included), at most 4
  experts (never fewer than 2, top-k clamped), real widths. Built on the meta device,
  so real widths cost nothing and every size check sees the real numbers.
- ``tiny`` (for numerical proofs): additionally shrinks widths while keeping the head
  ratio, GQA, MLA ranks and the MoE shape, falling back to ``structural`` widths when a
  strict v5 config rejects the smaller sizes.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hfcheck.analyzer import vocabulary as V
from hfcheck.analyzer.facts import ModelFacts
from hfcheck.analyzer.facts.config_fields import text_config_of

ATTN_IMPLEMENTATION = "hfcheck"
"""Name under which hfcheck registers a stand-in for vLLM's "vllm" attention function."""

MAX_PREFIX = 24


class InstanceError(Exception):
    """The tiny model could not be built; the message says why (recorded, not raised to users)."""


def register_attention() -> None:
    """Register the stand-in attention function (sdpa) under ``ATTN_IMPLEMENTATION``."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.modeling_utils import AttentionInterface

    if ATTN_IMPLEMENTATION not in AttentionInterface._global_mapping:
        AttentionInterface.register(ATTN_IMPLEMENTATION, sdpa_attention_forward)


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


def _cut_layers(text: Any, n: int) -> None:
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


def _cut_experts(text: Any, facts: ModelFacts) -> None:
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


def _cut_extras(text: Any) -> None:
    for name in ("num_nextn_predict_layers", "mtp_num_hidden_layers"):
        if isinstance(getattr(text, name, None), int):
            setattr(text, name, 0)


@dataclass
class TinyInstance:
    model: nn.Module
    config: Any
    kept_layers: int
    layer_types: list[str]
    shrink: str
    vllm_build_problem: str | None = None
    """Set when the model was built another way than vLLM builds it (``AutoModel`` with the
    vLLM attention implementation): vLLM itself would fail to construct it."""


def _error_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:240] if text else ''}".strip(": ")


def module_configs(model: nn.Module):
    """Each distinct config object held by ``model``'s modules (composite models hold several)."""
    seen: set[int] = set()
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and id(config) not in seen:
            seen.add(id(config))
            yield config


def _arch_class(config: Any) -> type | None:
    import transformers

    for arch in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, arch, None)
        if isinstance(cls, type):
            return cls
    return None


def build_structural(facts: ModelFacts, cfg_obj: Any) -> TinyInstance:
    """The meta-device base model of the structural shrink, built as vLLM builds it
    (``AutoModel.from_config`` with the vLLM attention implementation).

    Where that fails, other ways are tried so the rest can still be analysed, and the
    failure is kept in ``vllm_build_problem`` (vLLM would fail the same way): the full
    depth (layer cut rejected), eager attention (the model looks the implementation up
    in a table of its own), the ``architectures`` class (no ``AutoModel`` mapping), the
    decoder's text config alone."""
    from transformers import AutoModel

    if cfg_obj is None:
        raise InstanceError("no transformers config class for this model_type (remote code is not executed)")
    register_attention()

    def attempt(cut: bool, attn: str, how: str) -> TinyInstance:
        config = copy.deepcopy(cfg_obj)
        text = text_config_of(config)
        n = structural_prefix(facts, text) if cut else facts.num_layers
        if cut:
            _cut_layers(text, n)
        _cut_experts(text, facts)
        _cut_extras(text)
        text._attn_implementation = attn
        with torch.device("meta"):
            if how == "auto":
                model = AutoModel.from_config(config)
            elif how == "arch":
                cls = _arch_class(config)
                if cls is None:
                    raise InstanceError("no architectures class")
                sub = config if isinstance(config, cls.config_class) else text
                model = cls._from_config(sub)
                model = getattr(model, "model", model) if hasattr(model, "get_decoder") else model
            else:
                model = AutoModel.from_config(text)
        built = text_config_of(model.config) if hasattr(model, "config") else text
        kinds = list(getattr(built, "layer_types", None) or facts.layer_types[:n])
        return TinyInstance(model, model.config, n, kinds[:n], "structural" if cut else "full-depth")

    ways = [
        (ATTN_IMPLEMENTATION, "auto", None),
        ("eager", "auto", "the model does not accept vLLM's attention implementation"),
        (ATTN_IMPLEMENTATION, "arch", "AutoModel cannot build this config"),
        (ATTN_IMPLEMENTATION, "text", "AutoModel cannot build the full config, only its text config"),
    ]
    # each way first with the layer prefix, then at full depth (shared-KV or tied layers
    # can make a cut config invalid)
    plans = [(cut, attn, how, problem) for attn, how, problem in ways for cut in (True, False)]
    first: BaseException | None = None
    for cut, attn, how, problem in plans:
        try:
            instance = attempt(cut, attn, how)
        except Exception as exc:  # noqa: BLE001 - every failure of a third-party constructor is a fact
            first = first or exc
            continue
        if problem is not None:
            instance.vllm_build_problem = f"{problem} ({_error_line(first)})"
        return instance
    raise InstanceError(_error_line(first)) from None


TINY_HEAD_DIM = 16
TINY_VOCAB = 128


def _set_if_int(obj: Any, name: str, value: int) -> None:
    """Set an int field; a read-only property (Falcon's head_dim = hidden // heads) follows
    from the fields it is derived from and is left alone."""
    prop = getattr(type(obj), name, None)
    if isinstance(prop, property) and prop.fset is None:
        return
    if isinstance(getattr(obj, name, None), int) and not isinstance(getattr(obj, name), bool):
        setattr(obj, name, value)


def _shrink_widths(text: Any, facts: ModelFacts, head_dim: int = TINY_HEAD_DIM) -> None:
    """Small widths with the real head ratio (GQA/MQA), MoE shape and MLA structure."""
    heads, kv = facts.num_heads or 2, facts.num_kv_heads or facts.num_heads or 2
    tiny_kv = 1 if kv == 1 else 2
    ratio = max(1, heads // kv) if kv else 1
    tiny_heads = tiny_kv * min(ratio, 8)
    hidden = tiny_heads * head_dim
    for name in V.HEAD_FIELDS:
        _set_if_int(text, name, tiny_heads)
    for name in V.KV_HEAD_FIELDS:
        _set_if_int(text, name, tiny_kv)
    for name in V.HIDDEN_FIELDS:
        _set_if_int(text, name, hidden)
    for name in ("head_dim", "kv_channels", "attention_head_dim"):
        _set_if_int(text, name, head_dim)
    for name in ("intermediate_size", "ffn_hidden_size", "n_inner"):
        _set_if_int(text, name, 2 * hidden)
    for name in ("moe_intermediate_size", "shared_expert_intermediate_size"):
        _set_if_int(text, name, hidden)
    if facts.uses_mla:
        _set_if_int(text, "kv_lora_rank", 32)
        _set_if_int(text, "q_lora_rank", 32)
        _set_if_int(text, "qk_nope_head_dim", head_dim)
        # real MLA kernels take a latent of kv_lora_rank + rope = 576 (or 512, 320) only
        rope = 8 if head_dim < 32 else 64
        if head_dim >= 32:
            _set_if_int(text, "kv_lora_rank", 512)
        _set_if_int(text, "qk_rope_head_dim", rope)
        _set_if_int(text, "v_head_dim", head_dim)
        if isinstance(getattr(text, "head_dim", None), int):
            text.head_dim = rope  # transformers' MLA configs use the rope part as head_dim
        if hasattr(text, "qk_head_dim"):
            text.qk_head_dim = head_dim + rope
    for name in ("vocab_size", "padded_vocab_size", "vocab_size_per_layer_input"):
        _set_if_int(text, name, TINY_VOCAB)
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
    _cut_layers(text, n)
    _cut_experts(text, facts)
    _cut_extras(text)
    if shrink == "tiny":
        if getattr(text, "is_heterogeneous", False):
            _shrink_heterogeneous(text, facts, head_dim)
        else:
            _shrink_widths(text, facts, head_dim)
    return config, n


def _shrink_heterogeneous(text: Any, facts: ModelFacts, head_dim: int) -> None:
    """A config with per-layer overrides (Gemma 4's global layers: head_dim 512 beside 256):
    the global widths shrink as usual and each override keeps its ratio to the global value,
    so the small model is as heterogeneous as the real one."""
    text.allow_global_per_layer_attribute_access = True
    overrides = copy.deepcopy(text._heterogeneity_spec.per_layer_overrides)
    names = {name for layer in overrides.values() for name in layer}
    before = {name: getattr(text, name, None) for name in names}
    _shrink_widths(text, facts, head_dim)
    after = {name: getattr(text, name, None) for name in names}

    def scaled(name: str, value: Any) -> Any:
        old, new = before.get(name), after.get(name)
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in (value, old, new)) or not old or old == new:
            return value
        return max(1, value * new // old)

    kept = text.num_hidden_layers  # already cut to the structural prefix
    text.per_layer_config = {i: {name: scaled(name, v) for name, v in layer.items()} for i, layer in overrides.items() if i < kept}
    text.allow_global_per_layer_attribute_access = False


def build_tiny(facts: ModelFacts, cfg_obj: Any, device: str = "cpu", seed: int = 0) -> TinyInstance:
    """A small *runnable* instance (random weights, float32) for numerical proofs.

    Widths are shrunk with the real head ratio; where a strict config or an unusual
    layer rejects the small sizes, widths stay real (``shrink == "structural"``)."""
    from transformers import AutoModel

    if cfg_obj is None:
        raise InstanceError("no transformers config class for this model_type (remote code is not executed)")
    register_attention()
    attempts = ("tiny", "structural")
    last: Exception | None = None
    for shrink in attempts:
        config, n = shrunk_config(facts, cfg_obj, shrink)
        text = text_config_of(config)
        text._attn_implementation = ATTN_IMPLEMENTATION
        torch.manual_seed(seed)
        try:
            with torch.device(device):
                model = AutoModel.from_config(config, dtype=torch.float32)
        except Exception as exc:  # noqa: BLE001 - the next device is tried; the last error is reported
            last = exc
            continue
        built = text_config_of(model.config)
        kinds = list(getattr(built, "layer_types", None) or facts.layer_types[:n])
        return TinyInstance(model.eval(), model.config, n, kinds[:n], shrink)
    raise InstanceError(f"{type(last).__name__}: {str(last).splitlines()[0][:240] if str(last) else ''}")


@dataclass
class CheckpointNames:
    """How vLLM's weight loader meets the checkpoint of the ``architectures`` class.

    vLLM's transformers backend builds only the base model (``AutoModel``) and its own
    ``lm_head`` (a weight and an optional bias); every checkpoint name is mapped onto that pair.
    ``outside``: parameters of the class that live in neither (a head such as BERT's
    ``cls.predictions``, or RoBERTa's ``lm_head.dense``), which the loader has no module for. ``dropped``: base-model parameters whose checkpoint name matches one of
    the base model's ``_keys_to_ignore_on_load_unexpected`` patterns, which vLLM applies with
    ``re.search`` to every name and so discards (GPT-2's ``attn.bias`` also matches
    ``attn.c_attn.bias``), leaving them uninitialised."""

    architecture: str
    outside: list[str]
    dropped: list[str]


def generates(cls: type | None) -> bool:
    """Is ``cls`` a text-generation class: one of transformers' causal-LM classes (vLLM then
    serves it with its generate runner and its causal-LM wrapper)?"""
    if cls is None:
        return False
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return cls.__name__.endswith(("ForCausalLM", "LMHeadModel")) or cls.__name__ in set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())


def checkpoint_names(facts: ModelFacts, cfg_obj: Any, cls: type | None, base: nn.Module | None) -> CheckpointNames | None:
    """Read the causal-LM class's parameter names against its base model, on the meta
    device at the structural layer cut; None where vLLM's causal-LM wrapper does not apply
    (no transformers class, a composite or non-causal class) or the class does not build."""
    import re

    if base is None or cfg_obj is None or not generates(cls):
        return None
    config = copy.deepcopy(cfg_obj)
    text = text_config_of(config)
    if text is not config:
        return None  # composite configs go through vLLM's multimodal wrapper and its own mapper
    try:
        _cut_layers(text, structural_prefix(facts, text))
        _cut_experts(text, facts)
        _cut_extras(text)
        text._attn_implementation = "eager"
        with torch.device("meta"):
            model = cls._from_config(config)
    except Exception:  # noqa: BLE001 - a class that does not build is read elsewhere (HFC104)
        return None
    prefix = getattr(model, "base_model_prefix", "") or "model"
    base_ids = {id(p) for p in getattr(model, prefix, model).parameters()} if hasattr(model, prefix) else set()
    named = list(model.named_parameters(remove_duplicate=False))
    homes = base_ids | {id(p) for name, p in named if name in ("lm_head.weight", "lm_head.bias")}
    outside = sorted({id(p): name for name, p in reversed(named) if not name.startswith(f"{prefix}.") and id(p) not in homes}.values())
    patterns = [re.compile(p) for p in getattr(base, "_keys_to_ignore_on_load_unexpected", None) or []]
    outside = [n for n in outside if not any(p.search(n) for p in patterns)]
    dropped = sorted(
        f"{prefix}.{name}" for name, _ in base.named_parameters()
        if any(p.search(f"{prefix}.{name}") for p in patterns)
    )
    return CheckpointNames(cls.__name__, outside, dropped)
