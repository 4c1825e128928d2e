"""Packed q/k/v projections: the row order of the packed output, matched column by column on the
recorded values, and the statements that cut it.
"""

from __future__ import annotations

import ast
from typing import Any

from hfcheck.analyzer.vocabulary import HEAD_FIELDS, KV_HEAD_FIELDS
from hfcheck.porter.port.dataflow.graph import LAYOUT, Dataflow, first_input_path
from hfcheck.porter.port.dataflow.plan import SplitPlan, refuser
from hfcheck.porter.port.dataflow.proof import as_bhsd, layout_candidates
from hfcheck.porter.port.dataflow.source import (
    attr_like,
    attr_of,
    block_of,
    bound_names,
    head_size_attr,
    live_after,
    stmt_span,
)
from hfcheck.porter.port.weights import ROW_LAYOUTS, row_order


def split_plan(g: Dataflow, frame: dict, uid: int, text: str, func: ast.FunctionDef, boundary: tuple[int, int, int],
                scalars: dict[str, Any], region_start: int) -> SplitPlan | None:
    owner = frame["self_module"] or ""
    refuse = refuser(frame["self_class"], frame["file"])
    feeding = []
    for m in g.df["modules"]:
        if m["linear"] and m["name"].startswith(owner + ".") and m["out"]:
            out = m["out"][0]
            hits = [b for b in boundary if out in g.ancestors(b)]
            if len(hits) >= 2:
                feeding.append(m)
    if not feeding:
        return None
    m = feeding[0]
    attr = m["name"][len(owner) + 1:]
    if not attr.isidentifier():
        return None
    packed = m["out"][0]
    call_line = m["at"][0][1]
    # the cut: walking from the packed output towards each of q, k, v, the first variable of
    # forward reached through reshapes and slices alone (what the split statement binds)
    in_frame = {v for u, _l, _n, names in g.df["lines"] if u == uid for v in names.values() if v is not None}
    cut = []
    for b in boundary:
        path = first_input_path(g, packed, b)
        if path is None:
            raise refuse(call_line, f"self.{attr} does not feed all of q, k and v")
        last = packed
        for node in path[1:]:
            if g.ops[g.producer[node]]["op"] not in LAYOUT - {"cat"}:
                break
            if node in in_frame:
                last = node
                break
        if last == packed:
            raise refuse(call_line, f"q, k and v are cut from self.{attr}'s output with arithmetic, not reshapes and slices alone")
        cut.append(last)
    pv = g.value(packed)
    values = [g.value(n) for n in cut]
    if pv is None or any(v is None for v in values):
        return None
    head_dim = g.shape(boundary[0])[-1]
    batch, seq = g.tokens
    columns = []
    layouts = []
    for value in values:
        found = None
        for layout in layout_candidates(list(value.shape), batch, seq, merged_batch=True) + ["bhsd"] * (len(value.shape) == 4):
            try:
                flat = as_bhsd(value.double(), layout, head_dim, batch).transpose(1, 2).reshape(batch, seq, -1)
                if pv.shape[0] == seq and pv.shape[1] == batch and seq != batch:  # a sequence-first projection output
                    flat = flat.transpose(0, 1)
            except RuntimeError:
                continue
            idx = matching_columns(pv.double(), flat)
            if idx is not None:
                found = (layout, idx)
                break
        if found is None:
            raise refuse(call_line, f"q, k or v is not a plain slice of self.{attr}'s output (columns do not match)")
        layouts.append(found[0])
        columns.append(found[1])
    q_heads, kv_heads = len(columns[0]) // head_dim, len(columns[1]) // head_dim
    layout = next((name for name in ROW_LAYOUTS if row_order(name, q_heads, kv_heads, head_dim) == columns[0] + columns[1] + columns[2]), None)
    if layout is None:
        raise refuse(call_line, f"self.{attr}'s output rows hold q, k and v in an order that is neither [q | k | v], per head nor per "
                                "key/value group")
    regroup = None
    if layout != "qkv":
        h_key = next((k for k in HEAD_FIELDS if g.config.get(k) == q_heads), None)
        kv_key = next((k for k in KV_HEAD_FIELDS if g.config.get(k) == kv_heads), None) or (h_key if kv_heads == q_heads else None)
        if h_key is None or kv_key is None:
            raise refuse(call_line, f"self.{attr}'s rows are grouped ({layout}) and the config names no head counts to regroup them by")
        regroup = {"layout": layout, "heads": {"field": h_key}, "kv_heads": {"field": kv_key}}
    # the statements that cut it: after the one calling the projection, up to the one binding the last cut value
    located = block_of(func.body, call_line)
    if located is None:
        return None
    block, p_idx = located
    events = [(line, names) for u, line, _n, names in g.df["lines"] if u == uid]
    packed_var = None
    for line, names in events:
        if line > stmt_span(block[p_idx])[1]:
            packed_var = next((n for n, v in names.items() if v == packed), None)
            break
    if packed_var is None:
        raise refuse(call_line, f"self.{attr}(...) is not assigned to a variable")
    bound_at: dict[int, tuple[int, str]] = {}
    for i in range(p_idx + 1, len(block)):
        lo, hi = stmt_span(block[i])
        after = next((names for line, names in events if line > hi), None)
        if after is None:
            break
        for n in cut:
            if n not in bound_at:
                name = next((k for k, v in after.items() if v == n), None)
                if name is not None:
                    bound_at[n] = (i, name)
        if len(bound_at) == 3:
            break
    if len(bound_at) != 3:
        raise refuse(call_line, "q, k and v are not each held by a variable right after the cut")
    end = max(i for i, _ in bound_at.values())
    if stmt_span(block[end])[1] >= region_start:
        return None
    ran = {i for i, op in enumerate(g.ops) for u, line in op["at"] if u == uid and stmt_span(block[p_idx + 1])[0] <= line <= stmt_span(block[end])[1]}
    if any(g.ops[i]["op"] not in LAYOUT for i in ran):
        raise refuse(stmt_span(block[p_idx + 1])[0], "the statements that cut the packed output also compute something else")
    names = tuple(bound_at[n][1] for n in cut)
    stores = bound_names(block[p_idx + 1:end + 1]) - set(names)
    later = [s for s in func.body if stmt_span(s)[0] > stmt_span(block[end])[1]] + list(block[end + 1:])
    if any(live_after(n, later) for n in stores):
        raise refuse(stmt_span(block[p_idx + 1])[0], "the statements that cut the packed output bind other variables used later")
    heads = attr_of(scalars, q_heads, ("num_heads", "num_attention_heads", "n_head", "n_heads", "num_head")) \
        or attr_like(scalars, q_heads, ("head",), ("kv", "key_value", "group", "query_groups"))
    kv = kv_heads
    kv_attr = heads if kv == q_heads else (attr_of(scalars, kv, ("num_kv", "num_key_value_heads", "num_kv_heads", "n_kv_heads", "kv_heads"))
                                           or attr_like(scalars, kv, ("kv", "key_value", "group"), ()))
    head_attr = head_size_attr(head_dim, scalars)
    if heads is None or head_attr is None or (kv_attr is None and kv != 1):
        raise refuse(call_line, "the module keeps no attributes for its head count, key/value head count and head size")
    q_size = f"{heads} * {head_attr}"
    kv_size = f"{kv_attr} * {head_attr}" if kv_attr else head_attr
    # vLLM finds the split by the projection's attribute inside the split's receiver: fold
    # `x = self.<packed>(h)` into it when x is used nowhere else
    start, receiver = p_idx + 1, packed_var
    call = block[p_idx]
    if (isinstance(call, ast.Assign) and len(call.targets) == 1 and isinstance(call.targets[0], ast.Name)
            and call.targets[0].id == packed_var and isinstance(call.value, ast.Call) and len(call.value.args) == 1
            and not call.value.keywords and not live_after(packed_var, list(block[end + 1:]) + later)):
        start, receiver = p_idx, ast.get_source_segment(text, call.value) or packed_var
    return SplitPlan(attr, receiver, stmt_span(block[start])[0], stmt_span(block[end])[1], names, tuple(layouts), q_size, kv_size, head_attr,
                     regroup)


def matching_columns(packed, flat) -> list[int] | None:
    """For each column of ``flat`` [b, s, n], the column of ``packed`` [b, s, N] equal to it."""
    if packed.shape[:2] != flat.shape[:2]:
        return None
    p = packed.reshape(-1, packed.shape[-1]).T  # [N, b*s]
    f = flat.reshape(-1, flat.shape[-1]).T
    out = []
    for col in f:
        hit = ((p - col).abs().max(dim=1).values == 0).nonzero()
        if hit.numel() != 1:
            return None
        out.append(int(hit[0]))
    return out
