"""The numerical proof: a region is softmax(scale * QK^T [capped] + causal mask) V on the recorded
values (float64), under every layout and scale the recording allows; else the op that differs.
"""

from __future__ import annotations

import math

from hfcheck.analyzer.terms.tolerances import ATTENTION_REGION, SCALE_MATCH
from hfcheck.porter.rewrite.dataflow.graph import Core, Dataflow

TOLERANCE = ATTENTION_REGION


def close(a: float, b: float, rel: float = SCALE_MATCH) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-12)


def layout_candidates(shape: list[int], batch: int, seq: int, merged_batch: bool = False) -> list[str]:
    """Layouts a [batch, seq]-token activation of heads can have: batch-first (``bhsd``, ``bshd``,
    ``bsD`` with heads merged), sequence-first (``sbhd``, ``sbD``: ChatGLM, Megatron-style) and,
    for a packed cut, ``Bsd`` ([batch * heads, seq, head_dim])."""
    out = []
    if len(shape) == 4:
        if shape[0] == batch and shape[2] == seq:
            out.append("bhsd")
        if shape[0] == batch and shape[1] == seq:
            out.append("bshd")
        if shape[0] == seq and shape[1] == batch and seq != batch:
            out.append("sbhd")
    elif len(shape) == 3:
        if shape[0] == batch and shape[1] == seq:
            out.append("bsD")
        if shape[0] == seq and shape[1] == batch and seq != batch:
            out.append("sbD")
        if merged_batch and shape[0] % batch == 0 and shape[0] > batch and shape[1] == seq:
            out.append("Bsd")  # [batch * heads, seq, head_dim]
    return out


def as_bhsd(t, layout: str, head_dim: int, batch: int | None = None):
    if layout == "bhsd":
        return t
    if layout == "bshd":
        return t.transpose(1, 2)
    if layout == "sbhd":
        return t.permute(1, 2, 0, 3)
    if layout == "sbD":
        return t.reshape(t.shape[0], t.shape[1], -1, head_dim).permute(1, 2, 0, 3)
    if layout == "Bsd":
        return t.reshape(batch, -1, t.shape[1], t.shape[2])
    return t.reshape(t.shape[0], t.shape[1], -1, head_dim).transpose(1, 2)


def output_layouts(o):
    """The interface's [batch, seq, heads, head_dim] output in each layout a projection may read."""
    return (("bsD", o.flatten(2)), ("bshd", o), ("bhsd", o.transpose(1, 2)), ("sbD", o.transpose(0, 1).flatten(2)),
            ("sbhd", o.transpose(0, 1)))


def attend(q, k, v, scale: float, softcap: float | None = None):
    import torch

    rep = q.shape[1] // k.shape[1]
    if rep * k.shape[1] != q.shape[1]:
        return None
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    s = (q @ k.transpose(-1, -2)) * scale
    if softcap:  # as vLLM's kernels apply logits_soft_cap: after the scale, before the mask
        s = torch.tanh(s / softcap) * softcap
    ql, kl = q.shape[2], k.shape[2]
    future = torch.ones(ql, kl, dtype=torch.bool).triu(kl - ql + 1)
    s = s.masked_fill(future, float("-inf"))
    return (torch.softmax(s, dim=-1) @ v).transpose(1, 2)  # [b, s, h, d]


def softcap_candidates(g: Dataflow, core: Core) -> list[tuple[float, int]]:
    """Candidate logit softcaps c, with the tanh op, for ``c * tanh(x / c)`` between QK^T and
    softmax: read off the scalar of the op that feeds the tanh or scales its output."""
    if core.qk_op is None or core.softmax_op is None:
        return []
    out = []
    for i in range(core.qk_op + 1, core.softmax_op):
        if g.ops[i]["op"] != "tanh":
            continue
        feeder = g.producer.get(g.ops[i]["in"][0])
        users = [j for j in range(i + 1, core.softmax_op) if g.ops[i]["out"][0] in g.ops[j]["in"]]
        for j, invert in [(feeder, g.ops[feeder]["op"] in ("mul", "__mul__") if feeder is not None else False)] + [(u, False) for u in users]:
            if j is None:
                continue
            for a in g.ops[j]["args"]:
                if isinstance(a, (int, float)) and not isinstance(a, bool) and a:
                    out.append((1.0 / a if invert else float(a), i))
    return out


def measured_scale(g: Dataflow, core: Core, q, k, softcap: tuple[float, int] | None = None) -> float | None:
    if core.scores is None:
        return None
    import torch

    s = g.value(core.scores)
    if softcap is not None:  # measure before the cap: the tanh's input times c
        s = g.value(g.ops[softcap[1]]["in"][0])
        s = s * softcap[0] if s is not None else None
    if s is None:
        return None
    rep = q.shape[1] // max(k.shape[1], 1)
    raw = q @ k.repeat_interleave(rep, dim=1).transpose(-1, -2)
    if s.numel() != raw.numel():
        return None
    s = s.double().reshape(raw.shape)
    keep = torch.isfinite(s) & (s > -1e4) & (raw.abs() > 1e-6)
    if not bool(keep.any()):
        return None
    return float((s[keep] / raw[keep]).median())


def prove_region(g: Dataflow, core: Core, qn: int, kn: int, vn: int, xn: int):
    """((q, k, v, out layouts), scale, max relative error) when the region is attention."""
    values = [g.value(n) for n in (qn, kn, vn, xn)]
    if any(v is None for v in values):
        return None
    qv, kv, vv, xv = (v.double() for v in values)
    batch, seq = g.tokens
    head_dim = g.shape(core.q)[-1]
    best = None
    for lq in layout_candidates(list(qv.shape), batch, seq):
        for lk in layout_candidates(list(kv.shape), batch, seq):
            for lv in layout_candidates(list(vv.shape), batch, seq):
                try:
                    q, k, v = as_bhsd(qv, lq, head_dim), as_bhsd(kv, lk, head_dim), as_bhsd(vv, lv, head_dim)
                except RuntimeError:
                    continue
                for cap in [None] + softcap_candidates(g, core):
                    measured = measured_scale(g, core, q, k, cap)
                    for scale in [s for s in (measured, core.scale, head_dim**-0.5, 1.0) if s is not None]:
                        try:
                            o = attend(q, k, v, scale, cap[0] if cap else None)
                        except RuntimeError:
                            continue
                        if o is None:
                            continue
                        for lo, expect in output_layouts(o):
                            if list(expect.shape) != list(xv.shape):
                                continue
                            err = float((expect - xv).abs().max() / max(float(xv.abs().max()), 1e-12))
                            if best is None or err < best[2]:
                                best = ((lq, lk, lv, lo), scale, err, cap[0] if cap else None)
    if best is None or best[2] > TOLERANCE or not math.isfinite(best[2]):
        return None
    return best


def culprit(g: Dataflow, core: Core, file: str, core_line: int) -> tuple[str, int, str, str]:
    """The op that keeps the region from being softmax attention: (file, line, code, reason),
    at the innermost remote frame that ran it (a helper's line, not its call site)."""
    found = culprit_op(g, core)
    if found is None:
        return (file, core_line, "HFC803", "the attention region does not compute softmax(scale * QK^T + causal mask) V on the recorded values "
                "(no layout, scale or head grouping reproduces it), so it cannot become one attention-interface call")
    i, reason = found
    where, line = g.where(i)
    text = g.files.get(where, "")
    rows = text.splitlines()
    code = rows[line - 1].strip() if 0 < line <= len(rows) else ""
    return where, line, "HFC803", f"`{code}`: {reason}"


def culprit_op(g: Dataflow, core: Core) -> tuple[int, str] | None:
    bias_why = ("adds a position bias to the scores (finite, varying values, e.g. ALiBi); vLLM's transformers backend passes no such "
                "bias to its attention, so its meaning would be lost")
    if core.kind == "sdpa":
        op = g.ops[core.op]
        if len(op["in"]) > 3 and g.value(op["in"][3]) is not None and is_bias(g.value(op["in"][3])):
            return core.op, "its attn_mask " + bias_why.replace("adds", "carries", 1)
        return None
    chain: set = set()
    if core.qk_op is not None:
        qk_out = g.ops[core.qk_op]["out"][0]
        chain = g.descendants(qk_out) | {qk_out}
        qk = g.ops[core.qk_op]
        if qk["op"] == "baddbmm" and g.value(qk["in"][0]) is not None and is_bias(g.value(qk["in"][0])):
            return core.qk_op, bias_why
    for i in range((core.qk_op or core.op) + 1, core.softmax_op or core.op):
        op = g.ops[i]
        if op["op"] == "tanh":
            return i, ("a tanh between QK^T and softmax that is not a logit softcap c * tanh(scores / c) after the scale (the one form "
                       "vLLM applies, from config.attn_logit_softcapping)")
        if op["op"] in ("add", "__add__", "__radd__", "add_", "__iadd__") and len(op["in"]) >= 2:
            if any(n not in chain and g.value(n) is not None and is_bias(g.value(n)) for n in op["in"]):
                return i, bias_why
    return None


def is_bias(t) -> bool:
    import torch

    t = t.double()
    finite = t[torch.isfinite(t) & (t > -1e4)]
    return finite.numel() > 1 and float(finite.max() - finite.min()) > 1e-6 and float(finite.abs().max()) < 1e4 and t.dim() >= 2 and not bool((finite == 0).all())
