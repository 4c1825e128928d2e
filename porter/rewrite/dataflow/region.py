"""The region of forward (or of the helper that holds q, k and v) between the attention's inputs
and the output projection, with its boundary variables, weights, mask, dropout and scale.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hfcheck.porter.rewrite.dataflow.graph import LAYOUT, Core, Dataflow
from hfcheck.porter.rewrite.dataflow.packed import split_plan
from hfcheck.porter.rewrite.dataflow.plan import CorePlan, CoreRefusal, Refuse, refuser
from hfcheck.porter.rewrite.dataflow.proof import as_bhsd, close, culprit, prove_region
from hfcheck.porter.rewrite.dataflow.source import (
    attr_like,
    block_of,
    bound_names,
    head_size_attr,
    live_after,
    method_of,
    scaling_source,
    stmt_span,
    to_bhsd_source,
)


@dataclass(frozen=True)
class Scope:
    """The function whose statements hold the region: its source, its tree, the block the region is in,
    its recorded frame (``uid``, ``frame``), the names bound before each statement, and its refuser."""

    text: str
    func: ast.FunctionDef
    block: list[ast.stmt]
    uid: int
    frame: dict[str, Any]
    names_at: Callable[[ast.stmt], dict[str, int | None]]
    refuse: Callable[[int, str], Refuse]


@dataclass(frozen=True)
class RegionEnd:
    """Where the region ends: the output projection's statement ``block[index]``, the names bound when it
    starts, the variable it reads (``name``, dataflow node ``node``) and the line it is called on."""

    index: int
    names: dict[str, int | None]
    name: str
    node: int
    call_line: int


def plan_core(g: Dataflow, core: Core, files: dict[str, str], result: dict[str, Any]) -> CorePlan | CoreRefusal | None:
    """The region in forward, else in a helper method of the same module that forward calls
    (q, k and v may exist only there, as in MixFormer's ``_forward_self_attn``)."""
    try:
        return _plan_in_forward(g, core, files, result)
    except Refuse as first:
        try:
            found = _plan_in_helper(g, core, files)
        except Refuse:
            raise first from None
        if found is None:
            raise
        return found


def _plan_in_helper(g: Dataflow, core: Core, files: dict[str, str]) -> CorePlan | None:
    proj = g.output_projection(core)
    if proj is None or not proj["at"]:
        return None
    uid, _call_line = proj["at"][0]
    owner = g.frames[uid]["self_module"]
    first_op = min(i for i in (core.qk_op, core.softmax_op, core.op) if i is not None)
    stack = g.at(first_op)
    depth = next((i for i, (u, _) in enumerate(stack) if u == uid), None)
    if depth is None or depth == 0:
        return None
    helper_uid, helper_line = stack[depth - 1]
    helper = g.frames[helper_uid]
    if helper["self_module"] != owner or helper["function"] == "forward" or helper["file"] != g.frames[uid]["file"]:
        return None
    cls, file = helper["self_class"], helper["file"]
    refuse = refuser(cls, file)
    text = files.get(file)
    if not text:
        return None
    tree = ast.parse(text)
    func = method_of(tree, cls, helper["function"])
    forward = method_of(tree, cls, "forward")
    if func is None or forward is None:
        return None
    located = block_of(func.body, helper_line)
    if located is None or located[0] is not func.body or not isinstance(func.body[-1], ast.Return) or func.body[-1].value is None:
        raise refuse(helper_line, f"{cls}.{helper['function']} does not end by returning the attention's output")
    block, c_idx = located
    # what forward received: the variable its calling statement binds
    call_in_forward = stack[depth][1]
    fwd = block_of(forward.body, call_in_forward)
    if fwd is None:
        return None
    stmt = fwd[0][fwd[1]]
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
        raise refuse(call_in_forward, f"forward does not bind {cls}.{helper['function']}(...)'s result to one variable")
    target = stmt.targets[0].id
    after: dict[str, int | None] = next((names for u, line, _n, names in g.df["lines"] if u == uid and line > stmt_span(stmt)[1]), {})
    x = after.get(target)
    if x is None:
        return None
    events = [(line, n_ops, names) for u, line, n_ops, names in g.df["lines"] if u == helper_uid]

    def names_at(st: ast.stmt) -> dict[str, int | None]:
        lo, hi = stmt_span(st)
        return next((names for line, _n, names in events if lo <= line <= hi), {})

    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == helper["function"]]
    if len(calls) != 1 or calls[0] is not stmt.value:
        raise refuse(call_in_forward, f"{cls}.{helper['function']} is called from more than this statement of forward")
    plan = _region(g, core, Scope(text, func, block, helper_uid, helper, names_at, refuse), RegionEnd(len(block), {}, target, x, helper_line), c_idx)
    plan.function, plan.returns, plan.caller_line = helper["function"], True, stmt_span(stmt)[0]
    plan.caller_call = ast.get_source_segment(text, stmt.value) or ""
    if plan.mask != "None":  # the helper's parameter -> what forward passes for it
        params = [a.arg for a in func.args.args][1:]
        call = stmt.value
        given = next((k.value for k in call.keywords if k.arg == plan.mask), None)
        if given is None and plan.mask in params and params.index(plan.mask) < len(call.args):
            given = call.args[params.index(plan.mask)]
        plan.mask = (ast.get_source_segment(text, given) or "None") if given is not None else "None"
    return plan


def _plan_in_forward(g: Dataflow, core: Core, files: dict[str, str], result: dict[str, Any]) -> CorePlan | CoreRefusal | None:
    proj = g.output_projection(core)
    if proj is None or not proj["at"]:
        return None  # no projection follows: not a decoder attention (or not one to port)
    uid, call_line = proj["at"][0]
    frame = g.frames[uid]
    cls, file = frame["self_class"], frame["file"]
    core_file, core_line = g.where(core.op)
    if cls is None:
        return None
    refuse = refuser(cls, file)
    if frame["function"] != "forward":
        raise refuse(call_line, f"the output projection is called from {cls}.{frame['function']}, not from forward")
    text = files.get(file)
    if text is None:
        return None
    tree = ast.parse(text)
    func = method_of(tree, cls, "forward")
    if func is None:
        raise refuse(call_line, f"{cls}.forward is not defined in {file} (inherited)")
    first_op = min(i for i in (core.qk_op, core.softmax_op, core.op) if i is not None)  # the region starts where QK^T does
    in_frame = [line for u, line in g.at(first_op) if u == uid]
    if not in_frame:
        raise refuse(core_line, "the attention is computed outside the module that projects its output")
    located = block_of(func.body, call_line)
    if located is None:
        raise refuse(call_line, "the output projection's statement is not in forward's body")
    block, o_idx = located
    c_idx = next((i for i, s in enumerate(block[: o_idx + 1]) if stmt_span(s)[0] <= in_frame[0] <= stmt_span(s)[1]), None)
    if c_idx is None:
        raise refuse(in_frame[0], "the attention and its output projection are in different blocks of forward")
    if c_idx == o_idx:
        raise refuse(call_line, "the attention and the output projection are one statement; split it so the projection's input is a variable")
    events = [(line, n_ops, names) for u, line, n_ops, names in g.df["lines"] if u == uid]

    def names_at(stmt: ast.stmt) -> dict[str, int | None]:
        lo, hi = stmt_span(stmt)
        for line, _n, names in events:
            if lo <= line <= hi:
                return names
        return {}

    # the region's end: the variable the projection reads, as it is when its statement starts
    at_proj = names_at(block[o_idx])
    x = proj["in"][0]
    out_names = [n for n, v in at_proj.items() if v == x]
    if not out_names:
        raise refuse(call_line, "the output projection's input is an expression, not a variable; assign it first")
    source_o = ast.get_source_segment(text, block[o_idx]) or ""
    out_name = next((n for n in out_names if n in source_o), out_names[0])

    # widen backwards over statements that only reshape or repeat the core's inputs (a head
    # repeat before the core leaves k and v with the kv heads); the widest start that proves wins
    start = c_idx
    needed = g.ancestors(core.q) | g.ancestors(core.k) | g.ancestors(core.v) | {core.q, core.k, core.v}
    while start > 0:
        prev = block[start - 1]
        lo, hi = stmt_span(prev)
        ran = [i for i, op in enumerate(g.ops) if any(u == uid and lo <= line <= hi for u, line in op["at"])]
        if not ran or any(g.ops[i]["op"] not in LAYOUT for i in ran) or not all(set(g.ops[i]["out"]) & needed for i in ran):
            break
        start -= 1
    scope, end = Scope(text, func, block, uid, frame, names_at, refuse), RegionEnd(o_idx, at_proj, out_name, x, call_line)
    for s_idx in range(start, c_idx):
        try:
            return _region(g, core, scope, end, s_idx)
        except Refuse:
            continue
    return _region(g, core, scope, end, c_idx)


def _region(g: Dataflow, core: Core, scope: Scope, end: RegionEnd, start: int) -> CorePlan:
    """The plan for the region ``block[start:end.index]``, proven, or a refusal."""
    text, func, block, uid, frame, names_at, refuse = scope.text, scope.func, scope.block, scope.uid, scope.frame, scope.names_at, scope.refuse
    o_idx, at_proj, out_name, x, call_line = end.index, end.names, end.name, end.node, end.call_line
    core_file, core_line = g.where(core.op)
    cls, file = frame["self_class"], frame["file"]
    before = names_at(block[start])
    named: dict[int, list[str]] = {}
    for name, node in before.items():
        if node is not None:
            named.setdefault(node, []).append(name)
    region = block[start:o_idx]
    region_src = "\n".join(ast.get_source_segment(text, s) or "" for s in region)

    def pick(names: list[str]) -> str:
        return next((n for n in names if n in region_src), names[0])

    def boundary(node: int, what: str) -> tuple[str, int]:
        cur: int | None = node
        steps = 0
        while cur is not None and steps < 200:
            if cur in named:
                return pick(named[cur]), cur
            p = g.producer.get(cur)
            op = g.ops[p] if p is not None else None
            if op is not None and op["op"] == "unbind" and op["in"] and op["in"][0] in named:
                # q, k and v still packed in one variable ([..., 3, heads, dim]): read them out of it
                dim = op["kwargs"].get("dim", op["args"][0] if op["args"] else 0)
                return f"{pick(named[op['in'][0]])}.unbind({dim})[{op['out'].index(cur)}]", cur
            cur = g.ops[p]["in"][0] if p is not None and g.ops[p]["in"] else None
            steps += 1
        raise refuse(stmt_span(block[start])[0], f"the attention's {what} does not come from a variable of forward before the attention starts")

    q_name, q_node = boundary(core.q, "query")
    k_name, k_node = boundary(core.k, "key")
    v_name, v_node = boundary(core.v, "value")

    # names the region binds that forward reads afterwards
    after = [s for s in func.body if stmt_span(s)[0] > stmt_span(region[-1])[1]]
    after += [s for s in block[o_idx:]]
    weights = None
    for name in sorted(n for n in bound_names(region) - {out_name} if live_after(n, after)):
        value = at_proj.get(name, "absent")
        probs = g.ops[core.softmax_op]["out"][0] if core.softmax_op is not None else None
        if value is None or (probs is not None and value in (g.descendants(probs) | {probs}) and value not in g.descendants(core.out)):
            if weights is None:
                weights = name
                continue
        line = next(s.lineno for s in region for n in ast.walk(s) if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store))
        raise refuse(line, f"`{name}` is set inside the attention and read after it; only the output and the weights can be")

    proof = prove_region(g, core, q_node, k_node, v_node, x)
    if proof is None:
        raise Refuse(cls, *culprit(g, core, file, core_line))
    layouts, scale, err, softcap = proof
    module = g.modules_by_name.get(frame["self_module"] or "", {})
    scalars = module.get("scalars", {})
    head_dim = g.shape(core.q)[-1]
    exprs = []
    for name, layout in zip((q_name, k_name, v_name), layouts):
        exprs.append(to_bhsd_source(name, layout, head_dim, scalars, refuse, stmt_span(block[start])[0]))
    scaling, scaling_init = scaling_source(scale, head_dim, scalars)
    if scaling is None and scaling_init is None and not close(scale, head_dim**-0.5):
        file_s, line_s = g.where(core.qk_op) if core.qk_op is not None else (file, core_line)
        raise refuse(line_s, f"the scores are scaled by {scale:.6g}, which no attribute of {cls} gives; store it as self.scaling in __init__")
    groups = None
    q_heads = as_bhsd(g.value(q_node), layouts[0], head_dim, g.tokens[0]).shape[1]
    kv_heads = as_bhsd(g.value(k_node), layouts[1], head_dim, g.tokens[0]).shape[1]
    if kv_heads != q_heads and scalars.get("num_key_value_groups") != q_heads // kv_heads:
        h_attr = attr_like(scalars, q_heads, ("head",), ("kv", "key_value", "group", "query_groups"))
        kv_attr = attr_like(scalars, kv_heads, ("kv", "key_value", "group"), ())
        if kv_heads == 1:
            groups = h_attr
        elif h_attr and kv_attr:
            groups = f"{h_attr} // {kv_attr}"
        if groups is None:
            raise refuse(stmt_span(block[start])[0], f"k and v have {kv_heads} heads for {q_heads} query heads, and the module keeps no attributes "
                                                 "for the two counts (the sdpa backend needs num_key_value_groups)")
    mask = _mask_argument(g, core, func, before)
    dropout = _dropout(g, core, frame["self_module"])
    what = (f"scaled_dot_product_attention at {core_file}:{core_line}" if core.kind == "sdpa"
            else f"softmax(QK^T)V written by hand ({core_file}:{g.where(core.softmax_op)[1] if core.softmax_op is not None else '?'})")
    plan = CorePlan(cls, file, stmt_span(block[start])[0], stmt_span(region[-1])[1], call_line, exprs[0], exprs[1], exprs[2], out_name, layouts[3],
                    weights, mask, scaling, scaling_init, dropout, what, err)
    plan.groups = groups
    plan.head_attr = head_size_attr(head_dim, scalars)
    plan.softcap = softcap
    try:
        plan.split = split_plan(g, frame, uid, text, func, (q_node, k_node, v_node), scalars, stmt_span(block[start])[0])
    except Refuse as exc:
        plan.split = CoreRefusal(exc.cls, exc.file, exc.line, "HFC813", exc.reason)
    return plan


def _mask_argument(g: Dataflow, core: Core, func: ast.FunctionDef, before: dict[str, int | None]) -> str:
    """The forward parameter to pass as the attention mask: the one the original used (or that
    was None in the run), else None (the original's branch applied only the causal mask); a bool
    mask the original read as True-where-masked goes in inverted, the interface's convention."""
    params = [a.arg for a in func.args.args + func.args.kwonlyargs]
    used = g.ancestors(core.scores) if core.scores is not None else g.ancestors(core.out)
    for name in params:
        if "mask" not in name or "head" in name:
            continue
        if name not in before:
            continue
        node = before[name]
        if node is None:
            return name
        if node in used:
            if core.softmax_op is not None and _masks_where_true(g.value(node), g.value(g.ops[core.softmax_op]["out"][0])):
                # a Bloom-style bool mask, True where masked; the interface keeps where True
                return f"None if {name} is None else ~{name}"
            return name
    return "None"


def _masks_where_true(mask: Any, probs: Any) -> bool:
    """Whether the recorded bool ``mask`` is True exactly where the recorded attention weights are 0
    (the positions it masked): the convention of ``masked_fill(scores, mask, min)``, the opposite of
    the attention interface's, which keeps the positions where a bool mask is True."""
    import torch

    if not isinstance(mask, torch.Tensor) or not isinstance(probs, torch.Tensor) or mask.dtype != torch.bool:
        return False
    if mask.dim() < 2 or probs.dim() < 2 or mask.shape[-2:] != probs.shape[-2:]:
        return False
    q, k = probs.shape[-2:]
    masked = probs.reshape(-1, q, k)[0] == 0
    flagged = mask.reshape(-1, q, k)[0]
    return bool(masked.any()) and bool(torch.equal(masked, flagged))


def _dropout(g: Dataflow, core: Core, owner: str | None) -> str | None:
    if not owner:
        return None
    first = core.qk_op if core.qk_op is not None else core.op
    for m in g.df["modules"]:
        if m["dropout"] and first <= m["start"] <= core.op and m["name"].startswith(owner + "."):
            rest = m["name"][len(owner) + 1:]
            if rest.isidentifier():
                return f"self.{rest}.p"
    return None
