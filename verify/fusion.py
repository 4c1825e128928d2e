"""Fusion proofs: apply each fusion scan predicts to the tiny instance the way vLLM applies it,
and compare the output with the unfused model.

How each fusion is applied (vLLM 0.33's fusers, re-done here on CPU). The forward is rewritten
by the analyzer's own code (``analyzer.fusions.detect.fused_forward``: each pattern's
``rewrite``, the one home of vLLM's forward rewrite, which scan ran to predict the fusion);
this module only swaps the modules and compares the numbers:
- ``qkv`` / ``merged_column``: the forward source is rewritten so one merged linear (the
  projections' weights concatenated in shard order) runs once and ``.split`` gives the parts back;
- ``glu``: ``act(gate(x)) * up(x)`` becomes ``act_and_mul(gate_up(x))`` with the kernel vLLM
  picks for the activation's name (SiluAndMul, GeluAndMul(tanh) ...);
- ``packed_qkv``: the packed projection's ``.split`` is rewritten to per-rank sizes;
- ``mla``: q_a and kv_a merge into ``fused_qkv_a_proj`` (split at the top of the forward) and
  the kv expansion call is bypassed, so attention receives the latent and expands it itself;
- ``rms_norm``: the module becomes vLLM's RMSNorm (zero-centred for Gemma), eps read from
  the module;
- ``attention``: the softmax scale is the one read statically from ``scaling=``;
- MoE: experts stacked into FusedMoE's 3-D w13/w2 with vLLM's activation ("silu"), routed by
  vLLM's router (softmax/sigmoid top-k, groups, renormalisation, scaling factor) where scan
  predicts internal routing, else by the model's own router.
"""

from __future__ import annotations

import copy
import types
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import nn
from torch.nn import functional as F

from hfcheck.analyzer.fusions.base import Match
from hfcheck.analyzer.fusions.context import fusion_context as scan_context
from hfcheck.analyzer.fusions.detect import BY_NAME, fused_forward
from hfcheck.analyzer.fusions.glu import act_and_mul_name
from hfcheck.analyzer.fusions.moe import EXPERTS_NAME
from hfcheck.analyzer.graph.forward_source import RewriteRefused, resolve_expression
from hfcheck.analyzer.terms import vocabulary as V
from hfcheck.verify import layers as L
from hfcheck.verify.common import (
    ATTN,
    TOLERANCE,
    Proof,
    Subject,
    Timer,
    generic,
    rel_error,
    run_model,
    single_thread,
)


@dataclass
class Site:
    """One predicted fusion on one module instance of the subject."""

    path: str
    cls: str
    fusion: str
    projections: tuple[str, ...] = ()
    row_parallel: str | None = None
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def group(self) -> tuple[str, str]:
        return (self.fusion, self.cls)

    @property
    def match(self) -> Match:
        return Match(self.fusion, self.projections, self.row_parallel, dict(self.details))


def fusion_context(subject: Subject, facts, tp_size: int = 1):
    """scan's ``fusion_context`` (the fp16 routing rule included), with the shrunk instance's head size."""

    return scan_context(facts, tp_size, head_size=subject.head_dim or 1, attn_implementation=ATTN)


def find_sites(model: nn.Module, ctx) -> list[Site]:
    """The fusions vLLM would apply to ``model``: scan's own ``recursive_replace`` walk
    (``analyzer.analysis.observe``) on this instance, read back as sites to apply."""
    from hfcheck.analyzer.analysis.observe import observe

    observations = observe(model, ctx)
    sites = [
        Site(m.path, m.cls, match.fusion, tuple(match.projections), match.row_parallel, dict(match.details))
        for m in observations.modules
        for match in m.matches
    ]
    for path, block in observations.moe_blocks:
        if not block.experts_replaceable:
            continue
        details = {"internal": block.internal_routing, "scoring": block.scoring, "shared": block.shared_expert,
                   "shared_gate": block.shared_gate, "gate": block.gate, "experts_class": block.experts_class}
        sites.append(Site(path, block.block_class, "moe", (EXPERTS_NAME,), None, details))
    return sites


# --- applying one site ------------------------------------------------------------------

def _bind(module: nn.Module, forward) -> None:
    module.forward = types.MethodType(forward, module)


def merged_name(site: Site) -> str | None:
    """The name vLLM gives the fused projection (the pattern's ``merged_name``)."""
    return BY_NAME[site.fusion].merged_name(site.match)


def _eps_of(module: nn.Module) -> float:
    floats = {k: v for k, v in vars(module).items() if isinstance(v, float) and not isinstance(v, bool)}
    named = [v for k, v in floats.items() if "eps" in k.lower()]
    if named:
        return named[0]
    if len(floats) == 1:
        return next(iter(floats.values()))
    return torch.finfo(torch.float32).eps


def _linear(module: nn.Module, name: str) -> nn.Linear:
    """A projection the analyzer matched: an nn.Linear child (subclasses included)."""
    return cast(nn.Linear, module.get_submodule(name))


def _set_child(model: nn.Module, path: str, new: nn.Module) -> None:
    parent, _, name = path.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, name, new)


def apply_site(model: nn.Module, site: Site, text_config: Any) -> None:
    module = model.get_submodule(site.path) if site.path else model
    f = site.fusion
    if f == "qkv" or f == "merged_column":
        names = site.projections
        merged = merged_name(site)
        assert merged is not None  # qkv and merged_column name their merged linear
        forward = fused_forward(module, site.match)
        setattr(module, merged, L.MergedLinear([_linear(module, n) for n in names]))
        for n in names:
            delattr(module, n)
        _bind(module, forward)
    elif f == "glu":

        gate, up = site.projections
        act = site.details["act"]
        kernel = act_and_mul_name(module.get_submodule(act))
        if kernel is None:
            raise ValueError(f"no act-and-mul kernel for {type(module.get_submodule(act)).__name__}")
        forward = fused_forward(module, site.match)
        gate_up = L.MergedLinear([_linear(module, gate), _linear(module, up)])
        merged = merged_name(site)
        assert merged is not None  # glu names its merged linear
        delattr(module, gate)
        delattr(module, up)
        setattr(module, merged, gate_up)
        setattr(module, act, L.ActAndMul(kernel))
        _bind(module, forward)
    elif f == "packed_qkv":
        (name,) = site.projections
        q, kv = site.details["q_size"], site.details["kv_size"]
        forward = fused_forward(module, site.match)
        linear = _linear(module, name)
        parts = [nn.Linear(linear.in_features, s, bias=linear.bias is not None) for s in (q, kv, kv)]
        with torch.no_grad():
            for part, w, b in zip(parts, linear.weight.split([q, kv, kv]), (linear.bias.split([q, kv, kv]) if linear.bias is not None else (None,) * 3)):
                part.weight.copy_(w)
                if b is not None:
                    part.bias.copy_(b)
        setattr(module, name, L.MergedLinear(parts))
        _bind(module, forward)
    elif f == "mla":
        kv_b = site.details["kv_b_proj"]
        q_a, kv_a = site.details.get("q_a_proj"), site.details["kv_a_proj"]
        forward = fused_forward(module, site.match)
        if q_a is not None:
            merged = merged_name(site)
            assert merged is not None  # mla with q_a_proj names its merged down-projection
            setattr(module, merged, L.MergedLinear([_linear(module, q_a), _linear(module, kv_a)]))
            delattr(module, q_a)
            delattr(module, kv_a)
        nope = getattr(module, "qk_nope_head_dim", None) or text_config.qk_nope_head_dim
        v_dim = getattr(module, "v_head_dim", None) or text_config.v_head_dim
        # torch types nn.Module.__setattr__'s value as Tensor | Module; any value is stored
        module._hfc_mla = {"kv_b_proj": kv_b, "nope": nope, "v": v_dim}  # type: ignore[assignment]
        _bind(module, forward)
    elif f == "rms_norm":
        weight = getattr(module, "weight", None)
        _set_child(model, site.path, L.RMSNorm(weight, _eps_of(module), bool(site.details.get("zero_centered"))))
    elif f == "attention":

        value = resolve_expression(site.details.get("scaling"), module)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            module._hfc_scaling = float(value)  # type: ignore[assignment]  # as _hfc_mla above
    elif f == "moe":
        apply_moe(module, site, text_config)
    else:  # pragma: no cover - a fusion added to the analyzer but not to the verifier
        raise ValueError(f"the verifier cannot apply fusion {f!r}")


# --- MoE --------------------------------------------------------------------------------


def _config_value(text: Any, names: tuple[str, ...], default: Any = None) -> Any:
    for n in names:
        v = getattr(text, n, None)
        if v is not None:
            return v
    return default


def vllm_route(logits: torch.Tensor, top_k: int, scoring: str, renormalize: bool, n_group: int | None,
               topk_group: int | None, bias: torch.Tensor | None, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's routing: scores over every expert, optional grouped top-k with a correction bias."""
    scores = logits.float().softmax(-1) if scoring == "softmax" else logits.float().sigmoid()
    choice = scores + bias.float() if bias is not None else scores
    if n_group and topk_group and n_group > 1:
        tokens, experts = choice.shape
        grouped = choice.view(tokens, n_group, experts // n_group)
        group_scores = grouped.topk(2, dim=-1)[0].sum(-1) if bias is not None else grouped.max(-1).values
        keep = torch.zeros_like(group_scores).scatter_(1, group_scores.topk(topk_group, dim=-1, sorted=False)[1], 1.0)
        mask = keep.unsqueeze(-1).expand(-1, -1, experts // n_group).reshape(tokens, experts).bool()
        choice = choice.masked_fill(~mask, float("-inf"))
    ids = choice.topk(top_k, dim=-1, sorted=False)[1]
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    if scale != 1.0:
        weights = weights * scale
    return weights, ids


def apply_moe(block: nn.Module, site: Site, text: Any) -> None:
    experts = block.get_submodule("experts")
    hidden = text.hidden_size
    w13, w2 = L.expert_weights(experts, hidden)
    arch = " ".join(getattr(text, "architectures", None) or []).lower()
    kernel = "swigluoai" if "gptoss" in arch.replace("-", "").replace("_", "") else "silu"
    block.experts = L.StackedExperts(w13, w2, list(range(w13.shape[0])), kernel)
    if not site.details.get("internal"):
        return
    gate = block.get_submodule(site.details["gate"])
    top_k = _config_value(text, V.TOP_K_FIELDS)
    norm = getattr(text, "norm_topk_prob", None)
    renormalize = bool(norm) if norm is not None else top_k > 1
    n_group, topk_group = getattr(text, "n_group", None), getattr(text, "topk_group", None)
    scale = float(getattr(text, "routed_scaling_factor", 1.0) or 1.0)
    shared, shared_gate = site.details.get("shared"), site.details.get("shared_gate")
    scoring = site.details.get("scoring") or "softmax"

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, shape[-1])
        logits = F.linear(x.float(), cast(torch.Tensor, gate.weight).float())  # the router's [experts, hidden] weight
        weights, ids = vllm_route(logits, top_k, scoring, renormalize, n_group, topk_group,
                                  getattr(gate, "e_score_correction_bias", None), scale)
        out = self.experts(x, ids, weights.to(x.dtype))
        if shared is not None:
            extra = self.get_submodule(shared)(x)
            if shared_gate is not None:
                extra = torch.sigmoid(self.get_submodule(shared_gate)(x)) * extra
            out = out + extra
        return out.reshape(shape)

    _bind(block, forward)


# --- proofs -----------------------------------------------------------------------------


def describe(group: tuple[str, str], sites: list[Site]) -> str:
    fusion, cls = group
    s = sites[0]
    if fusion == "qkv":
        return f"fusion qkv: {cls} ({' + '.join(s.projections)} -> qkv_proj, split back)"
    if fusion == "merged_column":
        return f"fusion merged_column: {cls} ({' + '.join(s.projections)} -> one merged linear)"
    if fusion == "glu":
        return f"fusion glu: {cls} ({' + '.join(s.projections)} -> gate_up_proj + act-and-mul)"
    if fusion == "packed_qkv":
        return f"fusion packed_qkv: {cls} ({s.projections[0]} as QKVParallelLinear)"
    if fusion == "mla":
        merged = f"{s.details['q_a_proj']} + {s.details['kv_a_proj']} -> fused_qkv_a_proj; " if s.details.get("q_a_proj") else ""
        return f"fusion mla: {cls} ({merged}latent expanded in attention)"
    if fusion == "rms_norm":
        kind = "GemmaRMSNorm" if s.details.get("zero_centered") else "RMSNorm"
        return f"fusion rms_norm: {cls} -> vLLM {kind}"
    if fusion == "attention":
        return f"attention: {cls} (scale read from source: {s.details.get('scaling') or 'default'})"
    if fusion == "moe":
        routing = f"vLLM {s.details.get('scoring')} routing" if s.details.get("internal") else "model's own routing"
        return f"fusion moe: {cls} ({s.details.get('experts_class')} -> stacked 3-D experts, {routing})"
    return f"fusion {fusion}: {cls}"


_ORDER = {"mla": 0, "glu": 1, "qkv": 2, "packed_qkv": 3, "merged_column": 4, "moe": 5, "attention": 6, "rms_norm": 7}


def apply_all(model: nn.Module, sites: list[Site], text: Any) -> None:
    for site in sorted(sites, key=lambda s: _ORDER.get(s.fusion, 9)):
        apply_site(model, site, text)


def _prove(subject: Subject, reference: tuple[torch.Tensor, torch.Tensor], sites: list[Site], claim: str) -> Proof:
    timer = Timer()
    try:
        model = copy.deepcopy(subject.model)
        apply_all(model, sites, subject.text_config)
        hidden, logits = run_model(model, subject.input_ids)
    except Exception as exc:  # noqa: BLE001 - a failed application is this proof's result
        return Proof(claim, "fusion", "failed" if isinstance(exc, RewriteRefused) else "error", None, timer.seconds,
                     f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}")
    err = max(rel_error(hidden, reference[0]), rel_error(logits, reference[1]))
    status = "proven" if err <= TOLERANCE else "failed"
    detail = None if status == "proven" else f"output differs from the unfused model (relative error {err:.3g} > {TOLERANCE:g})"
    return Proof(claim, "fusion", status, err, timer.seconds, detail)


def prove_fusions(subject: Subject, facts, observed: set[tuple[str, str]] | None = None) -> list[Proof]:
    """One proof per (fusion, module class), then all of them together.

    ``observed``: scan's (generic path, fusion) pairs; a difference from what the tiny instance
    decides is reported (the proofs then do not cover exactly scan's claims)."""
    with single_thread():
        return _prove_fusions(subject, facts, observed)


def _prove_fusions(subject: Subject, facts, observed: set[tuple[str, str]] | None) -> list[Proof]:
    timer = Timer()
    try:
        sites = find_sites(subject.model, fusion_context(subject, facts))
    except Exception as exc:  # noqa: BLE001
        return [Proof("fusions on the tiny instance", "fusion", "error", None, timer.seconds, f"{type(exc).__name__}: {exc}")]
    try:
        reference = run_model(subject.model, subject.input_ids)
    except Exception as exc:  # noqa: BLE001 - the unfused tiny model itself does not run
        return [Proof("the tiny instance runs", "fusion", "error", None, timer.seconds,
                      f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}")]
    proofs: list[Proof] = []
    if observed is not None:
        tiny = {(generic(s.path), s.fusion) for s in sites if s.fusion not in ("attention", "moe")}
        missing = sorted(observed - tiny)  # (the tiny instance may hold more layers, so more fusions)
        if missing:
            listed = ", ".join(f"{f} at {p}" for p, f in missing[:4])
            proofs.append(Proof("the tiny instance fuses as scan predicts", "fusion", "error", None, 0.0,
                                f"scan predicts but the tiny instance does not take: {listed} (not proven)"))
    groups: dict[tuple[str, str], list[Site]] = defaultdict(list)
    for s in sites:
        groups[s.group].append(s)
    for group in sorted(groups, key=lambda g: (_ORDER.get(g[0], 9), g[1])):
        proofs.append(_prove(subject, reference, groups[group], describe(group, groups[group])))
    if len(groups) > 1:
        proofs.append(_prove(subject, reference, sites, f"all {len(sites)} fusions together ({len(groups)} kinds)"))
    elif not groups:
        proofs.append(Proof("fusions", "fusion", "not_applicable", None, timer.seconds, "scan predicts no fusion"))
    return proofs
