"""facts -> a tiny model instance that keeps the structure vLLM decides on.

Two shrinks (the cuts themselves in ``analyzer/instance/shrink.py``), both from the real config object:
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
import re
from dataclasses import dataclass
from typing import Any, TypeGuard

import torch
from torch import nn

from hfcheck.analyzer.facts import ModelFacts
from hfcheck.analyzer.facts.config_fields import text_config_of
from hfcheck.analyzer.instance.shrink import (
    cut_experts,
    cut_extras,
    cut_layers,
    shrunk_config,
    structural_prefix,
)

ATTN_IMPLEMENTATION = "hfcheck"
"""Name under which hfcheck registers a stand-in for vLLM's "vllm" attention function."""

class InstanceError(Exception):
    """The tiny model could not be built; the message says why (recorded, not raised to users)."""


def register_attention() -> None:
    """Register the stand-in attention function (sdpa) under ``ATTN_IMPLEMENTATION``."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.modeling_utils import AttentionInterface

    if ATTN_IMPLEMENTATION not in AttentionInterface._global_mapping:
        AttentionInterface.register(ATTN_IMPLEMENTATION, sdpa_attention_forward)


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


def _arch_class(config: Any) -> type[Any] | None:
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
            cut_layers(text, n)
        cut_experts(text, facts)
        cut_extras(text)
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
            assert first is not None  # a way with a problem runs only after one failed
            instance.vllm_build_problem = f"{problem} ({_error_line(first)})"
        return instance
    assert first is not None  # every way failed
    raise InstanceError(_error_line(first)) from None


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


def generates(cls: type | None) -> TypeGuard[type[Any]]:
    """Is ``cls`` a text-generation class: one of transformers' causal-LM classes (vLLM then
    serves it with its generate runner and its causal-LM wrapper)?"""
    if cls is None:
        return False
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return cls.__name__.endswith(("ForCausalLM", "LMHeadModel")) or cls.__name__ in set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())


def checkpoint_names(facts: ModelFacts, cfg_obj: Any, cls: type[Any] | None, base: nn.Module | None) -> CheckpointNames | None:
    """Read the causal-LM class's parameter names against its base model, on the meta
    device at the structural layer cut; None where vLLM's causal-LM wrapper does not apply
    (no transformers class, a composite or non-causal class) or the class does not build."""

    if base is None or cfg_obj is None or not generates(cls):
        return None
    config = copy.deepcopy(cfg_obj)
    text = text_config_of(config)
    if text is not config:
        return None  # composite configs go through vLLM's multimodal wrapper and its own mapper
    try:
        cut_layers(text, structural_prefix(facts, text))
        cut_experts(text, facts)
        cut_extras(text)
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
