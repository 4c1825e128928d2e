"""Parallel plans: what vLLM will shard (the predicted plan), and sharding a model by a plan.

A plan maps module path patterns (``layers.*.self_attn.q_proj``, as in transformers' tp
plans and scan's report) to styles:

- linears: ``colwise``, ``rowwise``, ``colwise_gather_output``, ``rowwise_split_input`` (vLLM's
  plan styles), ``qkv_q`` / ``qkv_k`` / ``qkv_v`` (a QKVParallelLinear shard: whole heads per
  rank, KV heads replicated when TP >= their count), ``packed_qkv(q,kv)`` (a packed
  projection sharded as QKVParallelLinear, its split rewritten to per-rank sizes), ``replicate``;
- RMSNorms: ``tp_aware`` (vLLM: all-gather a sharded input), ``colwise`` (naive: slice the
  weight, normalise locally), ``replicate``;
- the vocab embedding: ``vocab_parallel``; experts: ``moe_tp`` (intermediate sliced) or
  ``moe_ep`` (experts spread).

Modules no pattern names stay replicated, as in vLLM.
"""

from __future__ import annotations

import re
import types
from typing import Any

import torch
from torch import nn

from hfcheck.analyzer.fusions.base import Match
from hfcheck.analyzer.fusions.detect import fused_forward
from hfcheck.analyzer.terms import vocabulary as V
from hfcheck.verify import layers as L
from hfcheck.verify.common import Subject, generic
from hfcheck.verify.fusion import Site, _eps_of, find_sites, fusion_context


class PlanError(ValueError):
    """The plan cannot be applied at this size (vLLM would refuse to load or crash)."""

    def __init__(self, module: str, message: str):
        super().__init__(f"{module}: {message}")
        self.module = module


def predicted_plan(subject: Subject, facts, tp_size: int, sites: list[Site] | None = None) -> dict[str, str]:
    """vLLM's effective plan: the declared plan for linears (styles vLLM does not shard become
    replicated), overridden by what the fusers shard (fused projections, their row-parallel
    consumers, TP-aware RMSNorms, FusedMoE experts), plus the vocab-parallel embedding."""
    model = subject.model
    if sites is None:
        sites = find_sites(model, fusion_context(subject, facts, tp_size))
    plan: dict[str, str] = {}
    linears = [p for p, m in model.named_modules() if isinstance(m, nn.Linear)]
    declared = getattr(model, "tp_plan", None) or getattr(model, "_tp_plan", None) or {}
    for pattern, style in dict(declared).items():
        rx = pattern_regex(pattern)
        if any(rx.fullmatch(p) for p in linears):
            plan[pattern] = style if style in V.TP_STYLES_SHARDED else "replicate"
    for site in sites:
        at = lambda name, site=site: generic(f"{site.path}.{name}" if site.path else name)  # noqa: E731
        if site.fusion == "qkv":
            for name, role in zip(site.projections, "qkv"):
                plan[at(name)] = f"qkv_{role}"
        elif site.fusion in ("glu", "merged_column"):
            for name in site.projections:
                plan[at(name)] = "colwise"
        elif site.fusion == "packed_qkv":
            plan[at(site.projections[0])] = f"packed_qkv({site.details['q_size']},{site.details['kv_size']})"
        elif site.fusion == "mla":
            module = model.get_submodule(site.path)
            named = {site.details.get("q_a_proj"), site.details["kv_a_proj"], site.details["kv_b_proj"], site.row_parallel}
            for name in site.projections:
                plan[at(name)] = "replicate"  # fused_qkv_a_proj is built with disable_tp
            plan[at(site.details["kv_b_proj"])] = "colwise"
            for name, child in module.named_children():  # q_b_proj (or q_proj without q-LoRA)
                if isinstance(child, nn.Linear) and name not in named:
                    plan[at(name)] = "colwise"
        elif site.fusion == "rms_norm":
            plan[generic(site.path)] = "tp_aware"
        elif site.fusion == "moe":
            plan[at("experts")] = "moe_tp"
        if site.row_parallel and site.fusion in ("qkv", "glu", "packed_qkv", "mla"):
            plan[at(site.row_parallel)] = "rowwise"
    vocab = getattr(subject.text_config, "vocab_size", None)
    for path, module in model.named_modules():
        if isinstance(module, nn.Embedding) and module.num_embeddings == vocab:
            plan[generic(path)] = "vocab_parallel"
    return plan


def pattern_regex(pattern: str) -> re.Pattern:
    return re.compile(re.escape(pattern).replace(r"\*", r"[^.]+"))


def style_for(plan_rx: list[tuple[re.Pattern, str]], path: str) -> str | None:
    for rx, style in plan_rx:
        if rx.fullmatch(path):
            return style
    return None


def _chunk(n: int, world: int, rank: int, module: str, what: str) -> torch.Tensor:
    if n % world:
        raise PlanError(module, f"{what} ({n}) do not divide by TP {world}")
    per = n // world
    return torch.arange(rank * per, (rank + 1) * per)


def _head_dim(parent: nn.Module, subject: Subject) -> int:
    value = getattr(parent, "head_dim", None)
    return value if isinstance(value, int) and value > 0 else subject.head_dim


def _qkv_rows(linear: nn.Linear | types.SimpleNamespace, role: str, head_dim: int, world: int, rank: int, path: str) -> torch.Tensor:
    heads = linear.out_features // head_dim
    if role == "q" or heads >= world:
        index = _chunk(heads, world, rank, path, "heads")
    else:  # QKVParallelLinear replicates KV heads when TP exceeds them
        if world % heads:
            raise PlanError(path, f"TP {world} is not a multiple of {heads} KV heads")
        index = torch.tensor([rank // (world // heads)])
    return (index[:, None] * head_dim + torch.arange(head_dim)[None, :]).reshape(-1)


def _packed_rows(style: str, linear: nn.Linear, head_dim: int, world: int, rank: int, path: str) -> tuple[torch.Tensor, list[int]]:
    q, kv = (int(x) for x in style[len("packed_qkv("):-1].split(","))
    fake = lambda n: types.SimpleNamespace(out_features=n)  # noqa: E731
    parts = [_qkv_rows(fake(q), "q", head_dim, world, rank, path),
             q + _qkv_rows(fake(kv), "k", head_dim, world, rank, path),
             q + kv + _qkv_rows(fake(kv), "v", head_dim, world, rank, path)]
    return torch.cat(parts), [p.numel() * world for p in parts]


def shard(model: nn.Module, plan: dict[str, str], subject: Subject, sites: list[Site], rank: int, world: int, group=None) -> dict[str, Any]:
    """Shard ``model`` in place for ``rank``; returns what the caller needs (the full vocab table)."""
    plan_rx = [(pattern_regex(k), v) for k, v in plan.items()]
    norms = {s.path: s for s in sites if s.fusion == "rms_norm"}
    info: dict[str, Any] = {"vocab_table": None}
    for path, module in list(model.named_modules()):
        style = style_for(plan_rx, path)
        if style is None or (style == "replicate" and path not in norms):
            continue  # replicated: the module stays as it is (a norm still becomes vLLM's RMSNorm)
        parent_path, _, name = path.rpartition(".")
        parent = model.get_submodule(parent_path) if parent_path else model
        new: nn.Module | None = None
        if isinstance(module, nn.Linear):
            if style in ("colwise", "colwise_gather_output"):
                new = L.ColumnLinear(module, _chunk(module.out_features, world, rank, path, "out features"), style == "colwise_gather_output", group)
            elif style in ("rowwise", "rowwise_split_input"):
                new = L.RowLinear(module, _chunk(module.in_features, world, rank, path, "in features"), style == "rowwise_split_input", group)
            elif style.startswith("qkv_"):
                new = L.ColumnLinear(module, _qkv_rows(module, style[-1], _head_dim(parent, subject), world, rank, path), False, group)
            elif style.startswith("packed_qkv("):
                rows, sizes = _packed_rows(style, module, _head_dim(parent, subject), world, rank, path)
                new = L.ColumnLinear(module, rows, False, group)
                forward = _packed_forward(parent, name)
                parent.forward = types.MethodType(forward, parent)
                new.output_sizes, new.tp_size = sizes, world
            else:
                raise PlanError(path, f"unknown linear style {style!r}")
        elif path in norms:
            if style not in ("tp_aware", "colwise", "replicate"):
                raise PlanError(path, f"unknown norm style {style!r}")
            new = L.RMSNorm(getattr(module, "weight", None), _eps_of(module), bool(norms[path].details.get("zero_centered")), style, group)
        elif isinstance(module, nn.Embedding):
            if style == "vocab_parallel":
                info["vocab_table"] = L.vocab_parallel(module, rank, world, group)
            continue
        elif name == "experts" and style in ("moe_tp", "moe_ep"):
            new = _sharded_experts(module, style, subject, world, rank, path, group)
        else:
            raise PlanError(path, f"style {style!r} does not apply to {type(module).__name__}")
        setattr(parent, name, new)
    return info


def _packed_forward(module: nn.Module, name: str):
    return fused_forward(module, Match("packed_qkv", (name,)))


def _sharded_experts(experts: nn.Module, style: str, subject: Subject, world: int, rank: int, path: str, group) -> nn.Module:
    w13, w2 = L.expert_weights(experts, subject.text_config.hidden_size)
    count, inter = w13.shape[0], w13.shape[1] // 2
    if style == "moe_tp":
        cols = _chunk(inter, world, rank, path, "expert intermediate features")
        w13 = torch.cat([w13[:, cols], w13[:, inter + cols]], dim=1)
        return L.StackedExperts(w13, w2[:, :, cols], list(range(count)), "silu", group)
    ids = _chunk(count, world, rank, path, "experts")
    return L.StackedExperts(w13[ids], w2[ids], ids.tolist(), "silu", group)
