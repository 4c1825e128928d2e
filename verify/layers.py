"""Stand-ins for the vLLM layers a fused or sharded model runs, written for CPU and gloo.

Each computes what its vLLM counterpart computes (same weight layout, same collective),
nothing faster: ``MergedLinear`` (Merged/QKVParallelLinear), ``ActAndMul`` (SiluAndMul,
GeluAndMul), ``RMSNorm`` (vLLM's RMSNorm, TP-aware), ``StackedExperts`` (FusedMoE's w13/w2),
``ColumnLinear``/``RowLinear`` (Column/RowParallelLinear), ``vocab_parallel`` (VocabParallelEmbedding).
"""

from __future__ import annotations

from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

# --- collectives ------------------------------------------------------------------------


def all_reduce(t: torch.Tensor, group=None) -> torch.Tensor:
    t = t.contiguous()
    dist.all_reduce(t, group=group)
    return t


def all_gather_last(t: torch.Tensor, group=None) -> torch.Tensor:
    t = t.contiguous()
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, t, group=group)
    return torch.cat(parts, dim=-1)


def mark_cols(t: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """Say which columns of the unsharded output a local output holds (for the comparator)."""
    t._hfc_cols = cols  # type: ignore[attr-defined]
    return t


# --- fused layers (TP 1) -------------------------------------------------------------------


class MergedLinear(nn.Linear):
    """One GEMM for several projections; the rewritten forward splits it by ``output_sizes``
    (vLLM stores each shard's size times ``tp_size`` and divides back)."""

    def __init__(self, parts: list[nn.Linear]):
        first = parts[0]
        super().__init__(first.in_features, sum(p.out_features for p in parts), bias=first.bias is not None)
        with torch.no_grad():
            self.weight.copy_(torch.cat([p.weight for p in parts], dim=0))
            if self.bias is not None:
                self.bias.copy_(torch.cat([p.bias for p in parts], dim=0))
        self.output_sizes = [p.out_features for p in parts]
        self.tp_size = 1


def act_and_mul_fn(kernel: str):
    if kernel in ("silu", "swish"):
        return F.silu
    if kernel in ("gelu", "geglu"):
        return F.gelu
    if kernel in ("gelu_pytorch_tanh", "gelu_tanh"):
        return lambda x: F.gelu(x, approximate="tanh")
    raise ValueError(f"no act-and-mul kernel {kernel!r} in the verifier")


class ActAndMul(nn.Module):
    """``act(x[..., :d]) * x[..., d:]`` with the kernel vLLM picks for the activation's name."""

    def __init__(self, kernel: str):
        super().__init__()
        self.kernel = kernel
        self._fn = act_and_mul_fn(kernel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        return self._fn(x[..., :d]) * x[..., d:]


class RMSNorm(nn.Module):
    """vLLM's RMSNorm / GemmaRMSNorm (forward_native), with the TP modes a plan can give it:

    - ``tp_aware`` (vLLM): an input narrower than the weight is TP-sharded: all-gather it,
      normalise the full width, keep this rank's slice;
    - ``colwise`` (a naive plan): slice the weight by the input's columns, normalise locally;
    - ``replicate``: use the full weight as is (fails on a sharded input)."""

    def __init__(self, weight: torch.Tensor | None, eps: float, zero_centered: bool, mode: str = "tp_aware", group=None):
        super().__init__()
        self.weight = nn.Parameter(weight.detach().clone()) if weight is not None else None
        self.eps = eps
        self.zero_centered = zero_centered
        self.mode = mode
        self.group = group

    def _norm(self, x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        if weight is None:
            return h.to(dtype)
        if self.zero_centered:
            return (h * (1.0 + weight.float())).to(dtype)
        return h.to(dtype) * weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        full = self.weight.shape[0] if self.weight is not None else x.shape[-1]
        cols = getattr(x, "_hfc_cols", None)
        if self.group is None or x.shape[-1] >= full or self.mode == "replicate":
            out = self._norm(x, self.weight)
            return mark_cols(out, cols) if cols is not None else out
        world, rank = dist.get_world_size(self.group), dist.get_rank(self.group)
        if self.mode == "colwise":
            if cols is None:
                width = x.shape[-1]
                cols = torch.arange(rank * width, (rank + 1) * width)
            weight = self.weight[cols] if self.weight is not None else None
            return mark_cols(self._norm(x, weight), cols)
        if x.shape[-1] * world != full:
            raise ValueError(
                f"cannot gather a norm of width {full}: a TP-sharded input of width {x.shape[-1]} "
                f"does not tile it across {world} ranks (replicated or uneven sharding)"
            )
        gathered = all_gather_last(x, self.group)
        out = self._norm(gathered, self.weight).chunk(world, dim=-1)[rank]
        width = x.shape[-1]
        return mark_cols(out.contiguous(), torch.arange(rank * width, (rank + 1) * width))


# --- experts -------------------------------------------------------------------------------


def expert_weights(experts: nn.Module, hidden: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(w13 [E, 2I, H] as [gate; up], w2 [E, H, I]) from 3-D parameters or a ModuleList."""
    if isinstance(experts, nn.ModuleList):
        w13s: list[torch.Tensor] = []
        w2s: list[torch.Tensor] = []
        for e in experts:
            names = dict(e.named_children())
            gate = names.get("gate_proj") or names.get("w1")
            up = names.get("up_proj") or names.get("w3")
            down = names.get("down_proj") or names.get("w2")
            if gate is None or up is None or down is None:
                raise ValueError(f"expert {type(e).__name__} has no gate/up/down (or w1/w3/w2) projections")
            # the projections' weights (nn.Module's typing reads any attribute as Tensor | Module)
            w13s.append(torch.cat([cast(torch.Tensor, gate.weight), cast(torch.Tensor, up.weight)], dim=0))
            w2s.append(cast(torch.Tensor, down.weight))
        return torch.stack(w13s), torch.stack(w2s)
    params = dict(experts.named_parameters())
    w13: torch.Tensor
    w2: torch.Tensor | None
    if "gate_up_proj" in params:
        w13 = params["gate_up_proj"]
        if w13.shape[-1] != hidden or getattr(experts, "is_transposed", False):
            w13 = w13.transpose(1, 2)
    elif "gate_proj" in params and "up_proj" in params:
        gate_w: torch.Tensor = params["gate_proj"]
        up_w: torch.Tensor = params["up_proj"]
        if gate_w.shape[-1] != hidden:
            gate_w, up_w = gate_w.transpose(1, 2), up_w.transpose(1, 2)
        w13 = torch.cat([gate_w, up_w], dim=1)
    else:
        raise ValueError(f"{type(experts).__name__} holds no gate_up_proj / gate_proj+up_proj")
    w2 = params.get("down_proj")
    if w2 is None:
        raise ValueError(f"{type(experts).__name__} holds no down_proj")
    if w2.shape[1] != hidden or getattr(experts, "is_transposed", False):
        w2 = w2.transpose(1, 2)
    return w13.detach(), w2.detach()


class StackedExperts(nn.Module):
    """FusedMoE's computation: per selected expert ``w2 @ act_and_mul(w13 @ x)`` weighted by the
    router, summed; under TP each rank holds an intermediate slice of every expert, under EP a
    slice of the experts; the partial sums are all-reduced."""

    def __init__(self, w13: torch.Tensor, w2: torch.Tensor, expert_ids: list[int], kernel: str = "silu", group=None):
        super().__init__()
        self.w13 = nn.Parameter(w13.detach().clone().contiguous())
        self.w2 = nn.Parameter(w2.detach().clone().contiguous())
        self.expert_ids = expert_ids
        self.act = ActAndMul(kernel)
        self.group = group

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(hidden_states)
        for local, expert in enumerate(self.expert_ids):
            token, slot = torch.where(top_k_index == expert)
            if token.numel() == 0:
                continue
            h = self.act(F.linear(hidden_states[token], self.w13[local]))
            h = F.linear(h, self.w2[local]) * top_k_weights[token, slot, None].to(h.dtype)
            out.index_add_(0, token, h.to(out.dtype))
        if self.group is not None:
            out = all_reduce(out, self.group)
        return out


# --- tensor-parallel linears ------------------------------------------------------------


class ColumnLinear(nn.Module):
    """ColumnParallelLinear holding the output rows ``rows``; ``gather`` all-gathers the output."""

    output_sizes: list[int]  # packed QKV only, set by the planner (verify/shard.py), as MergedLinear's
    tp_size: int

    def __init__(self, linear: nn.Linear, rows: torch.Tensor, gather: bool, group):
        super().__init__()
        self.weight = nn.Parameter(linear.weight.detach()[rows].clone())
        self.bias = nn.Parameter(linear.bias.detach()[rows].clone()) if linear.bias is not None else None
        self.rows = rows
        self.gather = gather
        self.group = group
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias)
        if self.gather:
            return all_gather_last(y, self.group)
        return mark_cols(y, self.rows)


class RowLinear(nn.Module):
    """RowParallelLinear holding the input columns ``cols``; all-reduces, adds the bias once."""

    def __init__(self, linear: nn.Linear, cols: torch.Tensor, split_input: bool, group):
        super().__init__()
        self.weight = nn.Parameter(linear.weight.detach()[:, cols].clone())
        self.bias = nn.Parameter(linear.bias.detach().clone()) if linear.bias is not None else None
        self.cols = cols
        self.split_input = split_input
        self.group = group
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.split_input:  # rowwise_split_input: the input is full, take this rank's part
            x = x[..., self.cols]
        y = all_reduce(F.linear(x, self.weight), self.group)
        return y + self.bias if self.bias is not None else y


class _VocabParallel(nn.Embedding):
    """Placed after the model's own embedding class in the MRO (as vLLM rebases it), so a
    subclass's ``super().forward(ids)`` (e.g. Gemma's scaled embedding) reaches this lookup."""

    _hfc_range: tuple[int, int]  # set by vocab_parallel: this rank's rows [start, end)
    _hfc_group: Any

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        start, end = self._hfc_range
        inside = (input_ids >= start) & (input_ids < end)
        local = torch.where(inside, input_ids - start, torch.zeros_like(input_ids))
        out = F.embedding(local, self.weight) * inside.unsqueeze(-1).to(self.weight.dtype)
        return all_reduce(out, self._hfc_group)


_REBASED: dict[type, type] = {}


def vocab_parallel(embedding: nn.Embedding, rank: int, world: int, group) -> torch.Tensor:
    """Shard ``embedding``'s rows over the ranks in place; returns the full table (for logits)."""
    full = embedding.weight.detach().clone()
    vocab = full.shape[0]
    per = -(-vocab // world)
    start, end = min(rank * per, vocab), min((rank + 1) * per, vocab)
    cls = type(embedding)
    if cls not in _REBASED:
        _REBASED[cls] = _VocabParallel if cls is nn.Embedding else type(cls.__name__, (cls, _VocabParallel), {})
    embedding.__class__ = _REBASED[cls]
    embedding.weight = nn.Parameter(full[start:end].clone())
    rebased = cast(_VocabParallel, embedding)  # its class now has _VocabParallel in the MRO
    rebased._hfc_range = (start, end)
    rebased._hfc_group = group
    embedding.padding_idx = None
    return full


class PassThrough(nn.Module):
    """PPMissingLayer: a module that is not on this pipeline stage returns its input."""

    def __init__(self, returns_tuple: bool = False):
        super().__init__()
        self.returns_tuple = returns_tuple

    def forward(self, *args, **kwargs):
        value = args[0] if args else kwargs.get("hidden_states", next(iter(kwargs.values()), None))
        return (value,) if self.returns_tuple else value
