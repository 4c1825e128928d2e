"""What every proof shares: the result record, the error measure, the proof instance, the
attention stand-in, and per-module output recording (to name the first diverging module)."""

from __future__ import annotations

import copy
import math
import re
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from math import gcd
from typing import Any, cast

import torch
from torch import nn

from hfcheck.analyzer.instance import build_tiny, module_configs
from hfcheck.analyzer.terms import vocabulary as V
from hfcheck.analyzer.terms.tolerances import VERIFY_OUTPUT

TOLERANCE = VERIFY_OUTPUT
"""Largest relative error (max |out - ref| / max |ref|, float32) a proof accepts."""

ATTN = "hfcheck_verify"
"""Attention implementation the proofs run: transformers' sdpa (with its real masks, so
sliding windows are exercised) plus vLLM's static view of the module (scaling read from
source, MLA latents expanded inside attention, per-rank head counts)."""

STATUSES = ("proven", "failed", "not_applicable", "error")


@dataclass
class Proof:
    claim: str
    kind: str
    """``fusion``, ``tp``, ``pp`` or ``ep``."""
    status: str
    max_rel_error: float | None = None
    seconds: float = 0.0
    detail: str | None = None
    module: str | None = None
    """The first module whose output diverged (failed parallel proofs)."""

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if out["max_rel_error"] is not None and math.isfinite(out["max_rel_error"]):
            out["max_rel_error"] = float(f"{out['max_rel_error']:.3g}")
        elif out["max_rel_error"] is not None:
            out["max_rel_error"] = None
            out["detail"] = (out["detail"] + "; " if out["detail"] else "") + "non-finite error"
        out["seconds"] = round(out["seconds"], 3)
        return out


class Timer:
    def __init__(self) -> None:
        self.start = time.perf_counter()

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.start


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out - ref| / max |ref| in float64; inf on a shape mismatch or a non-finite value."""
    if out.shape != ref.shape:
        return math.inf
    out, ref = out.detach().double(), ref.detach().double()
    diff = (out - ref).abs().max().item() if out.numel() else 0.0
    scale = ref.abs().max().item() if ref.numel() else 0.0
    if not (math.isfinite(diff) and math.isfinite(scale)):
        return math.inf
    return diff / scale if scale > 0 else diff


def first_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], torch.Tensor):
        return value[0]
    if hasattr(value, "last_hidden_state") and isinstance(value.last_hidden_state, torch.Tensor):
        return value.last_hidden_state
    return None


# --- the attention stand-in ----------------------------------------------------------


def _verify_attention(module: nn.Module, query, key, value, attention_mask, **kwargs):
    """sdpa as transformers runs it, seen the way vLLM's attention layer sees the module."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    scaling = getattr(module, "_hfc_scaling", None)
    if scaling is not None:  # vLLM reads `scaling=` once, from source, at load time
        kwargs["scaling"] = scaling
    latent = getattr(module, "_hfc_mla", None)
    if latent is not None:  # the rewritten MLA forward hands the latent to attention
        key, value = _expand_latent(module, latent, key, value)
    groups = max(1, query.shape[1] // max(1, key.shape[1]))
    if getattr(module, "num_key_value_groups", groups) != groups:
        module.num_key_value_groups = groups  # per-rank heads under TP (vLLM builds its own)
    if kwargs.get("softcap") is not None or kwargs.get("s_aux") is not None:
        return _eager_attention(module, query, key, value, attention_mask, groups, **kwargs)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def _eager_attention(module, query, key, value, mask, groups, scaling=None, softcap=None, s_aux=None, dropout=0.0, **_):
    """Attention with logit soft-capping and/or sinks (sdpa has neither), in float32."""
    if groups > 1:
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    scaling = scaling if scaling is not None else query.shape[-1] ** -0.5
    logits = (query @ key.transpose(2, 3)).float() * scaling
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    q_len, kv_len = query.shape[2], key.shape[2]
    if mask is None:
        mask = torch.ones(q_len, kv_len, dtype=torch.bool).tril(kv_len - q_len)[None, None]
    if mask.dtype == torch.bool:
        logits = logits.masked_fill(~mask[..., :kv_len], float("-inf"))
    else:
        logits = logits + mask[..., :kv_len].float()
    if s_aux is not None:
        sinks = s_aux.float()
        heads = query.shape[1]
        if sinks.shape[0] > heads:  # TP: this rank's heads' sinks (vLLM shards them with the heads)
            import torch.distributed as dist

            start = (dist.get_rank() if dist.is_initialized() else 0) * heads
            sinks = sinks[start:start + heads]
        sinks = sinks.reshape(1, -1, 1, 1).expand(query.shape[0], -1, q_len, 1)
        probs = torch.cat([logits, sinks], dim=-1).softmax(-1)[..., :-1]
    else:
        probs = logits.softmax(-1)
    out = (probs.to(value.dtype) @ value).transpose(1, 2).contiguous()
    return out, probs


def _expand_latent(module: nn.Module, latent: dict, kv_c: torch.Tensor, k_pe: torch.Tensor):
    """What vLLM's MLA attention computes from ``(kv_c_normed, k_pe)``: kv_b_proj expands the
    latent into per-head (k_nope, v); k_pe is shared by every head."""
    kv_b = module.get_submodule(latent["kv_b_proj"])
    nope, v_dim = latent["nope"], latent["v"]
    batch, _, seq, _ = kv_c.shape
    kv = kv_b(kv_c.reshape(batch, seq, -1)).view(batch, seq, -1, nope + v_dim).transpose(1, 2)
    k_nope, value = kv.split([nope, v_dim], dim=-1)
    key = torch.cat([k_nope, k_pe.expand(-1, k_nope.shape[1], -1, -1)], dim=-1)
    return key, value


def register_attention() -> None:
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    from transformers.modeling_utils import AttentionInterface

    AttentionInterface.register(ATTN, _verify_attention)
    AttentionMaskInterface.register(ATTN, sdpa_mask)


def use_verify_attention(model: nn.Module) -> None:

    register_attention()
    for config in module_configs(model):
        configs = [config]
        if hasattr(config, "get_text_config"):
            configs.append(config.get_text_config())
        for c in configs:
            c._attn_implementation = ATTN


# --- the proof instance --------------------------------------------------------------


@dataclass
class Subject:
    """One model to prove claims on: the tiny instance plus what the proofs need."""

    model: nn.Module
    text_config: Any
    input_ids: torch.Tensor
    shrink: str
    head_dim: int
    num_heads: int
    num_kv_heads: int
    layers: int


def _retune_heads(facts, text: Any) -> bool:
    """Head counts that keep the real model's divisibility by 2 and 4 (so TP 2 and 4 behave
    as they would on the real widths): KV heads gcd(real, 4), query heads a multiple of the
    real query heads' gcd with 4. Widths follow the head count as in ``build_tiny``."""
    heads = next((getattr(text, f) for f in V.HEAD_FIELDS if isinstance(getattr(text, f, None), int)), None)
    kv = next((getattr(text, f) for f in V.KV_HEAD_FIELDS if isinstance(getattr(text, f, None), int)), None)
    hidden = next((getattr(text, f) for f in V.HIDDEN_FIELDS if isinstance(getattr(text, f, None), int)), None)
    real_heads, real_kv = facts.num_heads, facts.num_kv_heads or facts.num_heads
    if not (isinstance(heads, int) and isinstance(real_heads, int) and isinstance(real_kv, int) and real_kv > 0):
        return False
    kv = kv or heads
    new_kv = gcd(real_kv, 4)
    ratio = min(max(1, heads // max(1, kv)), 2) if real_heads // real_kv > 1 else 1
    need = gcd(real_heads, 4)
    while (new_kv * ratio) % need:
        ratio += 1
    new_heads = new_kv * ratio
    if (new_heads, new_kv) == (heads, kv):
        return False
    for name in V.HEAD_FIELDS:
        if isinstance(getattr(text, name, None), int):
            setattr(text, name, new_heads)
    for name in V.KV_HEAD_FIELDS:
        if isinstance(getattr(text, name, None), int):
            setattr(text, name, new_kv)
    head_dim = getattr(text, "head_dim", None)
    if isinstance(hidden, int) and isinstance(head_dim, int) and hidden == heads * head_dim and not facts.uses_mla:
        new_hidden = new_heads * head_dim
        for name in V.HIDDEN_FIELDS:
            if isinstance(getattr(text, name, None), int):
                setattr(text, name, new_hidden)
        for name in ("intermediate_size", "ffn_hidden_size", "n_inner"):
            if getattr(text, name, None) == 2 * hidden:
                setattr(text, name, 2 * new_hidden)
        for name in ("moe_intermediate_size", "shared_expert_intermediate_size"):
            if getattr(text, name, None) == hidden:
                setattr(text, name, new_hidden)
    return True


def _at_least_two_layers(text: Any) -> bool:
    layers = next((getattr(text, f) for f in V.LAYER_FIELDS if isinstance(getattr(text, f, None), int)), None)
    if not isinstance(layers, int) or layers >= 2:
        return False
    for name in V.LAYER_FIELDS:
        if isinstance(getattr(text, name, None), int):
            setattr(text, name, 2 * layers)
    kinds = getattr(text, "layer_types", None)
    if isinstance(kinds, (list, tuple)) and len(kinds) == layers:
        text.layer_types = list(kinds) * 2
    return True


def _sharpen(model: nn.Module, seed: int) -> None:
    """Random-init leaves norms at 1 (or 0), routers and biases at 0: perturb them so a wrong
    weight slice, a wrong zero-centering or a wrong expert choice changes the output."""
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for _name, p in model.named_parameters():
            if p.ndim == 1:
                p.add_(0.1 * torch.randn(p.shape, generator=gen))
            elif p.numel() and not p.abs().max().item():
                p.copy_(0.02 * torch.randn(p.shape, generator=gen))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.add_(0.01 * torch.randn(b.shape, generator=gen))


def build_subject(facts, cfg_obj, seed: int = 0, batch: int = 2, seq: int = 12) -> Subject:
    """The tiny runnable instance (``build_tiny``), re-sized so TP 2/4 and PP 2 can be shown."""
    from transformers import AutoModel


    inst = build_tiny(facts, cfg_obj, seed=seed)
    model, config = inst.model, inst.config
    if inst.shrink == "tiny":
        candidate = copy.deepcopy(config)
        text = candidate.get_text_config()
        changed = _retune_heads(facts, text)
        changed = _at_least_two_layers(text) or changed
        if changed:
            torch.manual_seed(seed)
            try:
                model = AutoModel.from_config(candidate, dtype=torch.float32).eval()
                config = model.config
            except Exception:  # noqa: BLE001 - a candidate config that does not build: the structural instance's
                model, config = inst.model, inst.config
    use_verify_attention(model)
    _sharpen(model, seed)
    text = config.get_text_config()
    gen = torch.Generator().manual_seed(seed + 2)
    vocab = input_embeddings(model).num_embeddings
    ids = torch.randint(0, vocab, (batch, seq), generator=gen)
    heads = next((getattr(text, f) for f in V.HEAD_FIELDS if isinstance(getattr(text, f, None), int)), 0)
    kv = next((getattr(text, f) for f in V.KV_HEAD_FIELDS if isinstance(getattr(text, f, None), int)), heads)
    layers = next((getattr(text, f) for f in V.LAYER_FIELDS if isinstance(getattr(text, f, None), int)), 0)
    head_dim = getattr(text, "head_dim", None) or (text.hidden_size // heads if heads else 0)
    return Subject(model.eval(), text, ids, inst.shrink, head_dim, heads, kv, layers)


# --- running and recording -----------------------------------------------------------


def input_embeddings(model: nn.Module) -> nn.Embedding:
    """The input embedding table of a transformers model (``get_input_embeddings``, which
    nn.Module's typing does not know)."""
    return cast(Any, model).get_input_embeddings()


def logits_of(model: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """Logits through the (tied) vocab table: what vLLM's lm_head computes."""
    weight = input_embeddings(model).weight
    return hidden @ weight.t()


@torch.no_grad()
def run_model(model: nn.Module, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    hidden = model(input_ids=input_ids).last_hidden_state
    return hidden, logits_of(model, hidden)


class Recorder:
    """Forward hooks on every module: each call's first output tensor, keyed (path, call)."""

    def __init__(self, model: nn.Module, skip: tuple[str, ...] = ()):
        self.model = model
        self.skip = skip
        self.order: list[tuple[str, int]] = []
        self.values: dict[tuple[str, int], torch.Tensor] = {}
        self.stack: list[str] = []
        self._calls: dict[str, int] = defaultdict(int)
        self._handles: list = []

    def _skipped(self, path: str) -> bool:
        return any(path == s or path.startswith(s + ".") for s in self.skip)

    def __enter__(self) -> Recorder:
        for path, module in self.model.named_modules():
            if not path or self._skipped(path):
                continue
            self._handles.append(module.register_forward_pre_hook(self._pre(path)))
            self._handles.append(module.register_forward_hook(self._post(path)))
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _pre(self, path: str):
        def hook(module, args):
            self.stack.append(path)

        return hook

    def _post(self, path: str):
        def hook(module, args, output):
            if self.stack and self.stack[-1] == path:
                self.stack.pop()
            key = (path, self._calls[path])
            self._calls[path] += 1
            tensor = first_tensor(output)
            if tensor is not None and tensor.is_floating_point():
                self.record(key, tensor)

        return hook

    @property
    def last_finished(self) -> str | None:
        return self.order[-1][0] if self.order else None

    def record(self, key: tuple[str, int], tensor: torch.Tensor) -> None:
        self.order.append(key)
        self.values[key] = tensor.detach().clone()

    @property
    def failing_module(self) -> str | None:
        """The innermost module still running (after an exception)."""
        return self.stack[-1] if self.stack else None


class Comparator(Recorder):
    """Compares each module's output with the reference recording as it is produced.

    A sharded output is compared through the columns it holds (``_hfc_cols``, set by the
    sharded layers); outputs that cannot be mapped back to the reference are skipped."""

    def __init__(self, model: nn.Module, reference: dict[tuple[str, int], torch.Tensor], skip: tuple[str, ...] = ()):
        super().__init__(model, skip)
        self.reference = reference
        self.errors: list[tuple[str, float]] = []

    def record(self, key: tuple[str, int], tensor: torch.Tensor) -> None:
        ref = self.reference.get(key)
        if ref is None:
            return
        if tensor.shape == ref.shape:
            err = rel_error(tensor, ref)
        else:
            cols = getattr(tensor, "_hfc_cols", None)
            if cols is None or tensor.shape[:-1] != ref.shape[:-1] or cols.numel() != tensor.shape[-1]:
                return
            err = rel_error(tensor, ref[..., cols])
        self.order.append(key)
        self.errors.append((key[0], err))

    def first_divergence(self, tol: float = TOLERANCE) -> tuple[str, float] | None:
        return next(((p, e) for p, e in self.errors if not e <= tol), None)

    def worst(self) -> tuple[str, float] | None:
        return max(self.errors, key=lambda pe: pe[1] if math.isfinite(pe[1]) else math.inf, default=None)


@contextmanager
def single_thread() -> Iterator[None]:
    """Tiny models run fastest on one thread: intra-op threads only contend (and spin) on a
    busy 2-core machine (measured: fusion proofs 2.2 s on 2 threads, 0.08 s on 1)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def generic(path: str) -> str:
    """``layers.3.mlp`` -> ``layers.*.mlp`` (the form of tp plans and of scan's report)."""

    return re.sub(r"(^|\.)\d+(?=\.|$)", r"\1*", path)
