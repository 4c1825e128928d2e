"""Packed q/k/v projections: the row order of the packed output, matched column by column on the
recorded values, and the statements that cut it.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any

from hfcheck.analyzer.terms.vocabulary import HEAD_FIELDS, KV_HEAD_FIELDS
from hfcheck.porter.output.weights import ROW_LAYOUTS, row_order
from hfcheck.porter.rewrite.dataflow.graph import LAYOUT, Dataflow, first_input_path
from hfcheck.porter.rewrite.dataflow.plan import Refuse, SplitPlan, refuser
from hfcheck.porter.rewrite.dataflow.proof import as_bhsd, layout_candidates
from hfcheck.porter.rewrite.dataflow.source import (
    attr_like,
    attr_of,
    block_of,
    bound_names,
    head_size_attr,
    live_after,
    stmt_span,
)


def split_plan(g: Dataflow, frame: dict, uid: int, text: str, func: ast.FunctionDef, boundary: tuple[int, int, int],
                scalars: dict[str, Any], region_start: int) -> SplitPlan | None:
    """The packed q/k/v projection feeding this attention and the statements that cut it (None: none,
    or not judged here); Refuse names why its cut cannot become vLLM's split."""
    owner = frame["self_module"] or ""
    refuse = refuser(frame["self_class"], frame["file"])
    m = _feeding_projection(g, owner, boundary)
    if m is None:
        return None
    attr = m["name"][len(owner) + 1:]
    if not attr.isidentifier():
        return None
    packed, call_line = m["out"][0], m["at"][0][1]
    cut = _cut_values(g, uid, packed, boundary, refuse, call_line, attr)
    recorded = _recorded_values(g, packed, cut)
    if recorded is None:
        return None
    head_dim = g.shape(boundary[0])[-1]
    layouts, columns = _match_columns_of_cut(g, *recorded, head_dim, refuse, call_line, attr)
    q_heads, kv_heads = len(columns[0]) // head_dim, len(columns[1]) // head_dim
    regroup = _regroup_rule(g, columns, q_heads, kv_heads, head_dim, refuse, call_line, attr)
    # the statements that cut it: after the one calling the projection, up to the one binding the last cut value
    located = block_of(func.body, call_line)
    if located is None:
        return None
    block, p_idx = located
    events = [(line, names) for u, line, _n, names in g.df["lines"] if u == uid]
    packed_var = _packed_variable(events, block[p_idx], packed)
    if packed_var is None:
        raise refuse(call_line, f"self.{attr}(...) is not assigned to a variable")
    bound_at = _bound_after_cut(block, p_idx, events, cut)
    if len(bound_at) != 3:
        raise refuse(call_line, "q, k and v are not each held by a variable right after the cut")
    end = max(i for i, _ in bound_at.values())
    if stmt_span(block[end])[1] >= region_start:
        return None
    names = (bound_at[cut[0]][1], bound_at[cut[1]][1], bound_at[cut[2]][1])  # one per boundary: q, k, v
    later = _statements_after(func, block, end)
    _refuse_a_cut_that_does_more(g, uid, block, p_idx, end, names, later, refuse)
    q_size, kv_size, head_attr = _size_expressions(scalars, q_heads, kv_heads, head_dim, refuse, call_line)
    start, receiver = _split_receiver(text, block, p_idx, end, packed_var, later)
    return SplitPlan(attr, receiver, stmt_span(block[start])[0], stmt_span(block[end])[1], names, (layouts[0], layouts[1], layouts[2]), q_size, kv_size, head_attr,
                     regroup)


def _feeding_projection(g: Dataflow, owner: str, boundary: tuple[int, int, int]) -> dict | None:
    """The first linear module of the attention whose output reaches two or more of q, k and v: the packed projection."""
    feeding = []
    for m in g.df["modules"]:
        if m["linear"] and m["name"].startswith(owner + ".") and m["out"]:
            out = m["out"][0]
            hits = [b for b in boundary if out in g.ancestors(b)]
            if len(hits) >= 2:
                feeding.append(m)
    return feeding[0] if feeding else None


def _cut_values(g: Dataflow, uid: int, packed: int, boundary: tuple[int, int, int], refuse: Callable[[int, str], Refuse],
                call_line: int, attr: str) -> list[int]:
    """Where the split statement leaves q, k and v: walking from the packed output towards each, the first
    variable of forward reached through reshapes and slices alone."""
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
    return cut


def _recorded_values(g: Dataflow, packed: int, cut: list[int]) -> tuple[Any, list[Any]] | None:
    """The recorded packed output and cut values the row order is read from; None when any was not kept."""
    pv = g.value(packed)
    values = [g.value(n) for n in cut]
    if pv is None or any(v is None for v in values):
        return None
    return pv, values


def _match_columns_of_cut(g: Dataflow, pv: Any, values: list[Any], head_dim: int, refuse: Callable[[int, str], Refuse],
                          call_line: int, attr: str) -> tuple[list[str], list[list[int]]]:
    """Each cut value's layout and the packed output's columns it holds, whatever the idiom that cut it."""
    batch, seq = g.tokens
    columns = []
    layouts = []
    for value in values:
        found = _columns_of(pv, value, head_dim, batch, seq)
        if found is None:
            raise refuse(call_line, f"q, k or v is not a plain slice of self.{attr}'s output (columns do not match)")
        layouts.append(found[0])
        columns.append(found[1])
    return layouts, columns


def _columns_of(pv: Any, value: Any, head_dim: int, batch: int, seq: int) -> tuple[str, list[int]] | None:
    """The first layout under which a cut value flattens to columns of the packed output, and those columns."""
    for layout in layout_candidates(list(value.shape), batch, seq, merged_batch=True) + ["bhsd"] * (len(value.shape) == 4):
        try:
            flat = as_bhsd(value.double(), layout, head_dim, batch).transpose(1, 2).reshape(batch, seq, -1)
            if pv.shape[0] == seq and pv.shape[1] == batch and seq != batch:  # a sequence-first projection output
                flat = flat.transpose(0, 1)
        except RuntimeError:
            continue
        idx = matching_columns(pv.double(), flat)
        if idx is not None:
            return layout, idx
    return None


def _regroup_rule(g: Dataflow, columns: list[list[int]], q_heads: int, kv_heads: int, head_dim: int,
                  refuse: Callable[[int, str], Refuse], call_line: int, attr: str) -> dict[str, Any] | None:
    """The weight rule that reorders rows not already [q | k | v], by the config's head counts; None when they are."""
    layout = next((name for name in ROW_LAYOUTS if row_order(name, q_heads, kv_heads, head_dim) == columns[0] + columns[1] + columns[2]), None)
    if layout is None:
        raise refuse(call_line, f"self.{attr}'s output rows hold q, k and v in an order that is neither [q | k | v], per head nor per "
                                "key/value group")
    if layout == "qkv":
        return None
    h_key = next((k for k in HEAD_FIELDS if g.config.get(k) == q_heads), None)
    kv_key = next((k for k in KV_HEAD_FIELDS if g.config.get(k) == kv_heads), None) or (h_key if kv_heads == q_heads else None)
    if h_key is None or kv_key is None:
        raise refuse(call_line, f"self.{attr}'s rows are grouped ({layout}) and the config names no head counts to regroup them by")
    return {"layout": layout, "heads": {"field": h_key}, "kv_heads": {"field": kv_key}}


def _packed_variable(events: list[tuple[int, dict]], statement: ast.stmt, packed: int) -> str | None:
    """The variable holding the packed output after the projection's statement: what the split reads."""
    for line, names in events:
        if line > stmt_span(statement)[1]:
            return next((n for n, v in names.items() if v == packed), None)
    return None


def _bound_after_cut(block: list[ast.stmt], p_idx: int, events: list[tuple[int, dict]], cut: list[int]) -> dict[int, tuple[int, str]]:
    """For each cut value, the first statement after the projection's that leaves it in a variable, and that variable."""
    bound_at: dict[int, tuple[int, str]] = {}
    for i in range(p_idx + 1, len(block)):
        _lo, hi = stmt_span(block[i])
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
    return bound_at


def _statements_after(func: ast.FunctionDef, block: list[ast.stmt], end: int) -> list[ast.stmt]:
    """The statements that run after the cut: a variable they read must outlive it."""
    return [s for s in func.body if stmt_span(s)[0] > stmt_span(block[end])[1]] + list(block[end + 1:])


def _refuse_a_cut_that_does_more(g: Dataflow, uid: int, block: list[ast.stmt], p_idx: int, end: int, names: tuple[str, ...],
                                 later: list[ast.stmt], refuse: Callable[[int, str], Refuse]) -> None:
    """Refuse unless the cut statements only reshape and slice and bind nothing used later: they are replaced whole."""
    first, last = stmt_span(block[p_idx + 1])[0], stmt_span(block[end])[1]
    ran = {i for i, op in enumerate(g.ops) for u, line in op["at"] if u == uid and first <= line <= last}
    if any(g.ops[i]["op"] not in LAYOUT for i in ran):
        raise refuse(first, "the statements that cut the packed output also compute something else")
    stores = bound_names(block[p_idx + 1:end + 1]) - set(names)
    if any(live_after(n, later) for n in stores):
        raise refuse(first, "the statements that cut the packed output bind other variables used later")


def _size_expressions(scalars: dict[str, Any], q_heads: int, kv_heads: int, head_dim: int, refuse: Callable[[int, str], Refuse],
                      call_line: int) -> tuple[str, str, str]:
    """The __init__ expressions of q_size, kv_size and the head size, from the module's own attributes."""
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
    return q_size, kv_size, head_attr


def _split_receiver(text: str, block: list[ast.stmt], p_idx: int, end: int, packed_var: str,
                    later: list[ast.stmt]) -> tuple[int, str]:
    """The first statement replaced and what the split reads. vLLM finds the split by the projection's attribute
    inside the split's receiver: `x = self.<packed>(h)` is folded into it when x is used nowhere else."""
    start, receiver = p_idx + 1, packed_var
    call = block[p_idx]
    if (isinstance(call, ast.Assign) and len(call.targets) == 1 and isinstance(call.targets[0], ast.Name)
            and call.targets[0].id == packed_var and isinstance(call.value, ast.Call) and len(call.value.args) == 1
            and not call.value.keywords and not live_after(packed_var, list(block[end + 1:]) + later)):
        start, receiver = p_idx, ast.get_source_segment(text, call.value) or packed_var
    return start, receiver


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
