"""Find each attention core in the original's recorded dataflow, and prove what it computes.

The reference run records decoder layer 0 as it ran in the original's own release
(``porter/reference/record.py``): every torch op on tensor versions, every module call, and at
each source line the tensor locals of the remote frame. From that graph (networkx) this module
finds, for the attention module:

- the core: a ``scaled_dot_product_attention`` op, or ``softmax`` with the ``Q K^T`` product
  before it and the ``P V`` product after it, wherever it ran (in ``forward``, in a helper
  such as ``_attn``, in the branch of an ``if`` the run took);
- the output projection: the first ``nn.Linear`` call fed by the core's output; the frame
  that calls it is the attention ``forward``, and its argument's variable is the region's end;
- the region: the statements of the block holding that call, from the one that runs the core
  (widened backwards over statements that only reshape the core's inputs) up to the
  projection; q, k and v are the variables the region reads, as they were when it started
  (post-RoPE, before any head repeat).

Then it *proves* the region is ``softmax(scale * Q K^T + causal mask) V`` on the recorded
values (float64; the scale measured from the recorded scores, GQA from the recorded shapes):
only then may the codemod replace the region with one attention-interface call. A region that
computes something else is refused with the op that makes it differ (file:line), never
guessed. Nothing here runs model code: it reads what the reference run recorded.
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from hfcheck.analyzer.vocabulary import HEAD_FIELDS, KV_HEAD_FIELDS
from hfcheck.porter.port.weights import ROW_LAYOUTS, row_order

MATMUL = {"matmul", "__matmul__", "bmm", "baddbmm", "einsum", "__rmatmul__"}
SOFTMAX = {"softmax", "_softmax", "log_softmax"}
LAYOUT = {"view", "reshape", "permute", "transpose", "contiguous", "to", "float", "half", "bfloat16", "double", "type", "type_as",
          "expand", "expand_as", "repeat", "repeat_interleave", "__getitem__", "clone", "unsqueeze", "squeeze", "flatten", "unflatten",
          "split", "chunk", "unbind", "narrow", "detach", "mT", "T", "t", "movedim", "swapaxes", "select", "as_strided", "cat"}
HEAD_ATTRS = ("head_dim", "head_size", "hidden_size_per_head", "attention_head_size", "hidden_size_per_attention_head", "kv_channels",
              "attn_head_size", "dim_head")
TOLERANCE = 1e-4


@dataclass
class CorePlan:
    """A proven attention region of one class's ``forward``, in source terms."""

    cls: str
    file: str
    start_line: int  # first line of the region's first statement
    end_line: int  # last line of its last statement
    block_line: int  # a line of the statement that calls the output projection (same block)
    q: str
    k: str
    v: str  # expressions giving [batch, heads, seq, head_dim]
    out: str
    out_layout: str  # "bsD" | "bshd" | "bhsd": what the statements after the region expect
    weights: str | None
    mask: str
    scaling: str | None  # source of the scale ("self.x", "1.0", an expression for __init__) or None (1/sqrt(head_dim))
    scaling_init: str | None  # expression to store as self.<attr> in __init__, when scaling needs one
    dropout: str | None
    what: str
    max_rel_error: float
    notes: list[str] = field(default_factory=list)
    split: SplitPlan | CoreRefusal | None = None  # the packed q/k/v projection feeding it, if any
    groups: str | None = None  # __init__ expression for num_key_value_groups (sdpa repeats k/v by it) when heads are grouped
    softcap: float | None = None  # the logit softcap c of c * tanh(scores / c) (vLLM: config.attn_logit_softcapping)
    function: str = "forward"  # the method holding the region (a helper of forward, e.g. _forward_self_attn)
    returns: bool = False  # the region ends that helper: it will return q, k and v instead
    caller_line: int = 0  # the statement of forward that calls the helper (the interface call goes there: vLLM reads forward)
    caller_call: str = ""  # that call's source


@dataclass
class SplitPlan:
    """A packed q/k/v projection, its row order found by matching the recorded values column by
    column (whatever the idiom that cut it): the statements that cut it become one
    ``.split((self.q_size, self.kv_size, self.kv_size), dim=-1)`` and views, the form vLLM shards
    and fuses. Rows already [q | k | v] keep the weights; rows per head ([h, 3, d]) or per
    key/value group ([kv, g + 2, d]) are reordered to [q | k | v] by a weight rule."""

    packed: str  # the attribute of the packed nn.Linear
    packed_var: str  # what the split reads: the projection call itself, or the variable holding its output
    start_line: int
    end_line: int
    names: tuple[str, str, str]  # the variables q, k and v are bound to at the end of the cut
    views: tuple[str, str, str]  # each one's layout: "bsD" | "bshd" | "bhsd"
    q_size: str
    kv_size: str  # __init__ expressions
    head_attr: str | None
    regroup: dict[str, Any] | None = None  # rows not [q | k | v]: the weight rule that reorders them (porter.port.weights)


@dataclass
class CoreRefusal:
    cls: str
    file: str
    line: int
    code: str
    reason: str


def plans(result: dict[str, Any], tensors: dict[str, Any], files: dict[str, str], input_ids: list[list[int]],
          config: dict[str, Any] | None = None) -> list[CorePlan | CoreRefusal]:
    """One plan (or refusal) per attention class whose core ran in the recorded layer
    (``input_ids``: the token ids of the recorded run, for its batch and sequence sizes;
    ``config``: its config, whose keys a weight rule may name)."""
    df = result.get("dataflow")
    if not df or not df.get("ops") or df.get("failed") or df.get("truncated"):
        return []  # nothing (complete) was recorded: the statement patterns decide
    graph = Dataflow(df, tensors, result)
    graph.files = files
    graph.tokens = (len(input_ids), len(input_ids[0]) if input_ids else 0)
    graph.config = dict(config or {})
    out: list[CorePlan | CoreRefusal] = []
    seen: set[str] = set()
    for core in graph.cores():
        try:
            plan = _plan(graph, core, files, result)
        except _Refuse as exc:
            plan = CoreRefusal(exc.cls, exc.file, exc.line, exc.code, exc.reason)
        if plan is None or plan.cls in seen:
            continue
        seen.add(plan.cls)
        out.append(plan)
    return out


# ---------------------------------------------------------------------- the graph


class _Refuse(Exception):
    def __init__(self, cls: str, file: str, line: int, code: str, reason: str):
        super().__init__(reason)
        self.cls, self.file, self.line, self.code, self.reason = cls, file, line, code, reason


@dataclass
class Core:
    op: int  # index of the sdpa / P V op
    kind: str  # "sdpa" | "softmax"
    q: int
    k: int
    v: int
    out: int
    scores: int | None = None  # softmax input (the masked, scaled scores)
    softmax_op: int | None = None
    qk_op: int | None = None
    scale: float | None = None  # sdpa's scale= (None: its default)


class Dataflow:
    """The recorded layer as a graph: op nodes ("o<i>") and value nodes (int)."""

    def __init__(self, df: dict[str, Any], tensors: dict[str, Any], result: dict[str, Any]):
        self.df = df
        self.ops: list[dict] = df["ops"]
        self.frames: list[dict] = df["frames"]
        self.tensors = tensors
        self.files: dict[str, str] = {}
        self.tokens: tuple[int, int] = (0, 0)  # (batch, seq) of the recorded run
        self.config: dict[str, Any] = {}  # the config of the recorded run
        self.g = nx.DiGraph()
        self.producer: dict[int, int] = {}
        for i, op in enumerate(self.ops):
            for n in op["in"]:
                self.g.add_edge(n, ("op", i))
            for n in op["out"]:
                if n not in op["in"]:  # an op returning its input (x.float() on float) adds no value
                    self.g.add_edge(("op", i), n)
                    self.producer[n] = i
        self.modules_by_name = {m["name"]: m for m in result.get("modules", [])}

    def value(self, node: int):
        return self.tensors.get(f"df.{node}")

    def shape(self, node: int) -> list[int]:
        return self.df["nodes"][node]["shape"]

    def ancestors(self, node: int) -> set:
        return nx.ancestors(self.g, node) if node in self.g else set()

    def descendants(self, node: int) -> set:
        return nx.descendants(self.g, node) if node in self.g else set()

    def at(self, op: int) -> list[list[int]]:
        return self.ops[op]["at"]

    def where(self, op: int) -> tuple[str, int]:
        stack = self.at(op)
        if not stack:
            return "?", 0
        uid, line = stack[0]
        return self.frames[uid]["file"], line

    # ------------------------------------------------------------------ cores

    def cores(self) -> list[Core]:
        found = []
        for i, op in enumerate(self.ops):
            name = op["op"]
            if name == "scaled_dot_product_attention" and len(op["in"]) >= 3:
                scale = op["kwargs"].get("scale")
                found.append(Core(i, "sdpa", op["in"][0], op["in"][1], op["in"][2], op["out"][0],
                                  scale=scale if isinstance(scale, (int, float)) else None))
            elif name in SOFTMAX and op["in"]:
                core = self._hand_core(i)
                if core is not None:
                    found.append(core)
        return found

    def _hand_core(self, i: int) -> Core | None:
        scores, probs = self.ops[i]["in"][0], self.ops[i]["out"][0]
        qk = self._nearest_producer(scores, MATMUL, backwards=True)
        if qk is None:
            return None
        q_in, kt_in = self.ops[qk]["in"][-2:]
        after = self.descendants(probs)
        for j in range(i + 1, len(self.ops)):
            op = self.ops[j]
            if op["op"] in MATMUL and len(op["in"]) >= 2 and op["in"][-2] in (after | {probs}):
                return Core(j, "softmax", q_in, self._untransposed(kt_in), op["in"][-1], op["out"][0], scores=scores, softmax_op=i, qk_op=qk)
        return None

    def _untransposed(self, node: int) -> int:
        """K for the K^T operand (the transpose op's input), else the operand itself."""
        p = self.producer.get(node)
        if p is not None and self.ops[p]["op"] in ("transpose", "mT", "permute", "t", "T") and self.ops[p]["in"]:
            return self.ops[p]["in"][0]
        return node

    def _nearest_producer(self, node: int, names: set[str], backwards: bool) -> int | None:
        seen = {node}
        frontier = [node]
        while frontier:
            nxt = []
            for n in frontier:
                p = self.producer.get(n)
                if p is None:
                    continue
                if self.ops[p]["op"] in names:
                    return p
                for m in self.ops[p]["in"]:
                    if m not in seen:
                        seen.add(m)
                        nxt.append(m)
            frontier = nxt
        return None

    def output_projection(self, core: Core) -> dict | None:
        after = self.descendants(core.out) | {core.out}
        for m in self.df["modules"]:
            if m["linear"] and m["start"] > core.op and m["in"] and m["in"][0] in after:
                return m
        return None


# ---------------------------------------------------------------------- source side


def _block_of(body: list[ast.stmt], line: int) -> tuple[list[ast.stmt], int] | None:
    """(innermost statement list holding ``line``, index of the statement there)."""
    for i, s in enumerate(body):
        if not (s.lineno <= line <= (s.end_lineno or s.lineno)):
            continue
        for attr in ("body", "orelse", "finalbody"):
            inner = getattr(s, attr, None)
            if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                found = _block_of(inner, line)
                if found is not None:
                    return found
        for handler in getattr(s, "handlers", []) or []:
            found = _block_of(handler.body, line)
            if found is not None:
                return found
        return body, i
    return None


def _span(s: ast.stmt) -> tuple[int, int]:
    first = min([s.lineno] + [d.lineno for d in getattr(s, "decorator_list", [])])
    return first, s.end_lineno or s.lineno


def _reads(nodes: list[ast.stmt]) -> set[str]:
    out = set()
    for s in nodes:
        for n in ast.walk(s):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
                out.add(n.id)
    return out


def _live(name: str, stmts: list[ast.stmt]) -> bool:
    """Whether ``name`` is read in ``stmts`` (in order) before a plain assignment replaces it."""
    for s in stmts:
        if name in _reads([s]):
            return True
        if isinstance(s, (ast.Assign, ast.AnnAssign)) and name in _binds([s]):
            return False
    return False


def _binds(nodes: list[ast.stmt]) -> set[str]:
    out = set()
    for s in nodes:
        for n in ast.walk(s):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                out.add(n.id)
    return out


def _method(tree: ast.Module, cls: str, name: str) -> ast.FunctionDef | None:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    return item
    return None


# ---------------------------------------------------------------------- planning


def _plan(g: Dataflow, core: Core, files: dict[str, str], result: dict[str, Any]) -> CorePlan | CoreRefusal | None:
    """The region in forward, else in a helper method of the same module that forward calls
    (q, k and v may exist only there, as in MixFormer's ``_forward_self_attn``)."""
    try:
        return _plan_in_forward(g, core, files, result)
    except _Refuse as first:
        try:
            found = _plan_in_helper(g, core, files)
        except _Refuse:
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
    refuse = _refuser(cls, file)
    text = files.get(file)
    tree = ast.parse(text) if text else None
    func = _method(tree, cls, helper["function"]) if tree else None
    forward = _method(tree, cls, "forward") if tree else None
    if func is None or forward is None:
        return None
    located = _block_of(func.body, helper_line)
    if located is None or located[0] is not func.body or not isinstance(func.body[-1], ast.Return) or func.body[-1].value is None:
        raise refuse(helper_line, f"{cls}.{helper['function']} does not end by returning the attention's output")
    block, c_idx = located
    # what forward received: the variable its calling statement binds
    call_in_forward = stack[depth][1]
    fwd = _block_of(forward.body, call_in_forward)
    if fwd is None:
        return None
    stmt = fwd[0][fwd[1]]
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
        raise refuse(call_in_forward, f"forward does not bind {cls}.{helper['function']}(...)'s result to one variable")
    target = stmt.targets[0].id
    after = next((names for u, line, _n, names in g.df["lines"] if u == uid and line > _span(stmt)[1]), {})
    x = after.get(target)
    if x is None:
        return None
    events = [(line, n_ops, names) for u, line, n_ops, names in g.df["lines"] if u == helper_uid]

    def names_at(st: ast.stmt) -> dict[str, int | None]:
        lo, hi = _span(st)
        return next((names for line, _n, names in events if lo <= line <= hi), {})

    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == helper["function"]]
    if len(calls) != 1 or calls[0] is not stmt.value:
        raise refuse(call_in_forward, f"{cls}.{helper['function']} is called from more than this statement of forward")
    core_file, core_line = g.where(core.op)
    plan = _region(g, core, text, func, block, c_idx, len(block), helper_uid, helper, names_at, {}, target, x, helper_line, core_file,
                   core_line, refuse)
    plan.function, plan.returns, plan.caller_line = helper["function"], True, _span(stmt)[0]
    plan.caller_call = ast.get_source_segment(text, stmt.value) or ""
    if plan.mask != "None":  # the helper's parameter -> what forward passes for it
        params = [a.arg for a in func.args.args][1:]
        call = stmt.value
        given = next((k.value for k in call.keywords if k.arg == plan.mask), None)
        if given is None and plan.mask in params and params.index(plan.mask) < len(call.args):
            given = call.args[params.index(plan.mask)]
        plan.mask = ast.get_source_segment(text, given) if given is not None else "None"
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
    refuse = _refuser(cls, file)
    if frame["function"] != "forward":
        raise refuse(call_line, f"the output projection is called from {cls}.{frame['function']}, not from forward")
    text = files.get(file)
    if text is None:
        return None
    tree = ast.parse(text)
    func = _method(tree, cls, "forward")
    if func is None:
        raise refuse(call_line, f"{cls}.forward is not defined in {file} (inherited)")
    first_op = min(i for i in (core.qk_op, core.softmax_op, core.op) if i is not None)  # the region starts where QK^T does
    in_frame = [line for u, line in g.at(first_op) if u == uid]
    if not in_frame:
        raise refuse(core_line, "the attention is computed outside the module that projects its output")
    located = _block_of(func.body, call_line)
    if located is None:
        raise refuse(call_line, "the output projection's statement is not in forward's body")
    block, o_idx = located
    c_idx = next((i for i, s in enumerate(block[: o_idx + 1]) if _span(s)[0] <= in_frame[0] <= _span(s)[1]), None)
    if c_idx is None:
        raise refuse(in_frame[0], "the attention and its output projection are in different blocks of forward")
    if c_idx == o_idx:
        raise refuse(call_line, "the attention and the output projection are one statement; split it so the projection's input is a variable")
    events = [(line, n_ops, names) for u, line, n_ops, names in g.df["lines"] if u == uid]

    def names_at(stmt: ast.stmt) -> dict[str, int | None]:
        lo, hi = _span(stmt)
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
        lo, hi = _span(prev)
        ran = [i for i, op in enumerate(g.ops) if any(u == uid and lo <= line <= hi for u, line in op["at"])]
        if not ran or any(g.ops[i]["op"] not in LAYOUT for i in ran) or not all(set(g.ops[i]["out"]) & needed for i in ran):
            break
        start -= 1
    for s_idx in range(start, c_idx):
        try:
            return _region(g, core, text, func, block, s_idx, o_idx, uid, frame, names_at, at_proj, out_name, x, call_line, core_file,
                           core_line, refuse)
        except _Refuse:
            continue
    return _region(g, core, text, func, block, c_idx, o_idx, uid, frame, names_at, at_proj, out_name, x, call_line, core_file, core_line,
                   refuse)


def _region(g, core, text, func, block, start, o_idx, uid, frame, names_at, at_proj, out_name, x, call_line, core_file, core_line, refuse):
    """The plan for the region ``block[start:o_idx]``, proven, or a refusal."""
    cls, file = frame["self_class"], frame["file"]
    before = names_at(block[start])
    named = {}
    for name, node in before.items():
        if node is not None:
            named.setdefault(node, []).append(name)
    region = block[start:o_idx]
    region_src = "\n".join(ast.get_source_segment(text, s) or "" for s in region)

    def pick(names: list[str]) -> str:
        return next((n for n in names if n in region_src), names[0])

    def boundary(node: int, what: str) -> tuple[str, int]:
        cur, steps = node, 0
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
        raise refuse(_span(block[start])[0], f"the attention's {what} does not come from a variable of forward before the attention starts")

    q_name, q_node = boundary(core.q, "query")
    k_name, k_node = boundary(core.k, "key")
    v_name, v_node = boundary(core.v, "value")

    # names the region binds that forward reads afterwards
    after = [s for s in func.body if _span(s)[0] > _span(region[-1])[1]]
    after += [s for s in block[o_idx:]]
    weights = None
    for name in sorted(n for n in _binds(region) - {out_name} if _live(n, after)):
        value = at_proj.get(name, "absent")
        probs = g.ops[core.softmax_op]["out"][0] if core.softmax_op is not None else None
        if value is None or (probs is not None and value in (g.descendants(probs) | {probs}) and value not in g.descendants(core.out)):
            if weights is None:
                weights = name
                continue
        line = next(s.lineno for s in region for n in ast.walk(s) if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store))
        raise refuse(line, f"`{name}` is set inside the attention and read after it; only the output and the weights can be")

    proof = _prove(g, core, q_node, k_node, v_node, x)
    if proof is None:
        raise _Refuse(cls, *_culprit(g, core, file, core_line))
    layouts, scale, err, softcap = proof
    module = g.modules_by_name.get(frame["self_module"] or "", {})
    scalars = module.get("scalars", {})
    head_dim = g.shape(core.q)[-1]
    exprs = []
    for name, layout in zip((q_name, k_name, v_name), layouts):
        exprs.append(_to_bhsd(name, layout, head_dim, scalars, refuse, _span(block[start])[0]))
    scaling, scaling_init = _scaling_source(scale, head_dim, scalars)
    if scaling is None and scaling_init is None and not _close(scale, head_dim**-0.5):
        file_s, line_s = g.where(core.qk_op) if core.qk_op is not None else (file, core_line)
        raise refuse(line_s, f"the scores are scaled by {scale:.6g}, which no attribute of {cls} gives; store it as self.scaling in __init__")
    groups = None
    q_heads = _as_bhsd(g.value(q_node), layouts[0], head_dim, g.tokens[0]).shape[1]
    kv_heads = _as_bhsd(g.value(k_node), layouts[1], head_dim, g.tokens[0]).shape[1]
    if kv_heads != q_heads and scalars.get("num_key_value_groups") != q_heads // kv_heads:
        h_attr = _attr_like(scalars, q_heads, ("head",), ("kv", "key_value", "group", "query_groups"))
        kv_attr = _attr_like(scalars, kv_heads, ("kv", "key_value", "group"), ())
        if kv_heads == 1:
            groups = h_attr
        elif h_attr and kv_attr:
            groups = f"{h_attr} // {kv_attr}"
        if groups is None:
            raise refuse(_span(block[start])[0], f"k and v have {kv_heads} heads for {q_heads} query heads, and the module keeps no attributes "
                                                 "for the two counts (the sdpa backend needs num_key_value_groups)")
    mask = _mask_argument(g, core, func, before)
    dropout = _dropout(g, core, frame["self_module"])
    what = (f"scaled_dot_product_attention at {core_file}:{core_line}" if core.kind == "sdpa"
            else f"softmax(QK^T)V written by hand ({core_file}:{g.where(core.softmax_op)[1]})")
    plan = CorePlan(cls, file, _span(block[start])[0], _span(region[-1])[1], call_line, exprs[0], exprs[1], exprs[2], out_name, layouts[3],
                    weights, mask, scaling, scaling_init, dropout, what, err)
    plan.groups = groups
    plan.softcap = softcap
    try:
        plan.split = _split_plan(g, frame, uid, text, func, (q_node, k_node, v_node), scalars, _span(block[start])[0])
    except _Refuse as exc:
        plan.split = CoreRefusal(exc.cls, exc.file, exc.line, "HFC813", exc.reason)
    return plan


def _refuser(cls: str, file: str):
    def make(line: int, reason: str, code: str = "HFC803") -> _Refuse:
        return _Refuse(cls, file, line, code, reason)

    return make


def _close(a: float, b: float, rel: float = 1e-5) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-12)


# ---------------------------------------------------------------------- the numerical proof


def _candidates(shape: list[int], batch: int, seq: int, merged_batch: bool = False) -> list[str]:
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


def _as_bhsd(t, layout: str, head_dim: int, batch: int | None = None):
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


def _outputs(o):
    """The interface's [batch, seq, heads, head_dim] output in each layout a projection may read."""
    return (("bsD", o.flatten(2)), ("bshd", o), ("bhsd", o.transpose(1, 2)), ("sbD", o.transpose(0, 1).flatten(2)),
            ("sbhd", o.transpose(0, 1)))


def _attend(q, k, v, scale: float, softcap: float | None = None):
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


def _softcaps(g: Dataflow, core: Core) -> list[tuple[float, int]]:
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


def _measured_scale(g: Dataflow, core: Core, q, k, softcap: tuple[float, int] | None = None) -> float | None:
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


def _prove(g: Dataflow, core: Core, qn: int, kn: int, vn: int, xn: int):
    """((q, k, v, out layouts), scale, max relative error) when the region is attention."""
    values = [g.value(n) for n in (qn, kn, vn, xn)]
    if any(v is None for v in values):
        return None
    qv, kv, vv, xv = (v.double() for v in values)
    batch, seq = g.tokens
    head_dim = g.shape(core.q)[-1]
    best = None
    for lq in _candidates(list(qv.shape), batch, seq):
        for lk in _candidates(list(kv.shape), batch, seq):
            for lv in _candidates(list(vv.shape), batch, seq):
                try:
                    q, k, v = _as_bhsd(qv, lq, head_dim), _as_bhsd(kv, lk, head_dim), _as_bhsd(vv, lv, head_dim)
                except RuntimeError:
                    continue
                for cap in [None] + _softcaps(g, core):
                    measured = _measured_scale(g, core, q, k, cap)
                    for scale in [s for s in (measured, core.scale, head_dim**-0.5, 1.0) if s is not None]:
                        try:
                            o = _attend(q, k, v, scale, cap[0] if cap else None)
                        except RuntimeError:
                            continue
                        if o is None:
                            continue
                        for lo, expect in _outputs(o):
                            if list(expect.shape) != list(xv.shape):
                                continue
                            err = float((expect - xv).abs().max() / max(float(xv.abs().max()), 1e-12))
                            if best is None or err < best[2]:
                                best = ((lq, lk, lv, lo), scale, err, cap[0] if cap else None)
    if best is None or best[2] > TOLERANCE or not math.isfinite(best[2]):
        return None
    return best


def _culprit(g: Dataflow, core: Core, file: str, core_line: int) -> tuple[str, int, str, str]:
    """The op that keeps the region from being softmax attention: (file, line, code, reason),
    at the innermost remote frame that ran it (a helper's line, not its call site)."""
    found = _culprit_op(g, core)
    if found is None:
        return (file, core_line, "HFC803", "the attention region does not compute softmax(scale * QK^T + causal mask) V on the recorded values "
                "(no layout, scale or head grouping reproduces it), so it cannot become one attention-interface call")
    i, reason = found
    where, line = g.where(i)
    text = g.files.get(where, "")
    rows = text.splitlines()
    code = rows[line - 1].strip() if 0 < line <= len(rows) else ""
    return where, line, "HFC803", f"`{code}`: {reason}"


def _culprit_op(g: Dataflow, core: Core) -> tuple[int, str] | None:
    bias_why = ("adds a position bias to the scores (finite, varying values, e.g. ALiBi); vLLM's transformers backend passes no such "
                "bias to its attention, so its meaning would be lost")
    if core.kind == "sdpa":
        op = g.ops[core.op]
        if len(op["in"]) > 3 and g.value(op["in"][3]) is not None and _is_bias(g.value(op["in"][3])):
            return core.op, "its attn_mask " + bias_why.replace("adds", "carries", 1)
        return None
    chain: set = set()
    if core.qk_op is not None:
        qk_out = g.ops[core.qk_op]["out"][0]
        chain = g.descendants(qk_out) | {qk_out}
        qk = g.ops[core.qk_op]
        if qk["op"] == "baddbmm" and g.value(qk["in"][0]) is not None and _is_bias(g.value(qk["in"][0])):
            return core.qk_op, bias_why
    for i in range((core.qk_op or core.op) + 1, core.softmax_op or core.op):
        op = g.ops[i]
        if op["op"] == "tanh":
            return i, ("a tanh between QK^T and softmax that is not a logit softcap c * tanh(scores / c) after the scale (the one form "
                       "vLLM applies, from config.attn_logit_softcapping)")
        if op["op"] in ("add", "__add__", "__radd__", "add_", "__iadd__") and len(op["in"]) >= 2:
            if any(n not in chain and g.value(n) is not None and _is_bias(g.value(n)) for n in op["in"]):
                return i, bias_why
    return None


def _is_bias(t) -> bool:
    import torch

    t = t.double()
    finite = t[torch.isfinite(t) & (t > -1e4)]
    return finite.numel() > 1 and float(finite.max() - finite.min()) > 1e-6 and float(finite.abs().max()) < 1e4 and t.dim() >= 2 and not bool((finite == 0).all())


# ---------------------------------------------------------------------- source expressions


def _head_attr(head_dim: int, scalars: dict[str, Any]) -> str | None:
    for name in HEAD_ATTRS:
        if scalars.get(name) == head_dim:
            return f"self.{name}"
    for name, value in scalars.items():
        if isinstance(value, int) and not isinstance(value, bool) and value == head_dim and "head" in name:
            return f"self.{name}"
    return None


def _to_bhsd(name: str, layout: str, head_dim: int, scalars: dict[str, Any], refuse, line: int) -> str:
    if layout == "bhsd":
        return name
    if layout == "bshd":
        return f"{name}.transpose(1, 2)"
    if layout == "sbhd":
        return f"{name}.permute(1, 2, 0, 3)"
    attr = _head_attr(head_dim, scalars)
    if attr is None:
        raise refuse(line, f"`{name}` holds all heads in one dimension and the module keeps no head size attribute to split it by")
    if layout == "sbD":
        return f"{name}.view(*{name}.shape[:-1], -1, {attr}).permute(1, 2, 0, 3)"
    return f"{name}.view(*{name}.shape[:-1], -1, {attr}).transpose(1, 2)"


def _scaling_source(scale: float, head_dim: int, scalars: dict[str, Any]) -> tuple[str | None, str | None]:
    """(scaling= source, or None for the default 1/sqrt(head_dim); expression for __init__)."""
    if _close(scale, head_dim**-0.5):
        attr = _head_attr(head_dim, scalars)
        return (None, f"{attr}**-0.5") if attr else (None, None)
    if _close(scale, 1.0):
        return "1.0", None
    for name, value in scalars.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            continue
        if _close(float(value), scale):
            return f"self.{name}", None
        if _close(float(value) ** -0.5, scale):
            return None, f"self.{name}**-0.5"
        if _close(1.0 / float(value), scale):
            return None, f"1 / self.{name}"
    return None, None


def _mask_argument(g: Dataflow, core: Core, func: ast.FunctionDef, before: dict[str, int | None]) -> str:
    """The forward parameter to pass as the attention mask: the one the original used (or that
    was None in the run), else None (the original's branch applied only the causal mask)."""
    params = [a.arg for a in func.args.args + func.args.kwonlyargs]
    used = g.ancestors(core.scores) if core.scores is not None else g.ancestors(core.out)
    for name in params:
        if "mask" not in name or "head" in name:
            continue
        node = before.get(name, "absent")
        if node is None or (node != "absent" and node in used):
            return name
    return "None"


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


# ---------------------------------------------------------------------- packed q/k/v projections


def _split_plan(g: Dataflow, frame: dict, uid: int, text: str, func: ast.FunctionDef, boundary: tuple[int, int, int],
                scalars: dict[str, Any], region_start: int) -> SplitPlan | None:
    owner = frame["self_module"] or ""
    refuse = _refuser(frame["self_class"], frame["file"])
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
        path = _path(g, packed, b)
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
        for layout in _candidates(list(value.shape), batch, seq, merged_batch=True) + ["bhsd"] * (len(value.shape) == 4):
            try:
                flat = _as_bhsd(value.double(), layout, head_dim, batch).transpose(1, 2).reshape(batch, seq, -1)
                if pv.shape[0] == seq and pv.shape[1] == batch and seq != batch:  # a sequence-first projection output
                    flat = flat.transpose(0, 1)
            except RuntimeError:
                continue
            idx = _columns(pv.double(), flat)
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
    located = _block_of(func.body, call_line)
    if located is None:
        return None
    block, p_idx = located
    events = [(line, names) for u, line, _n, names in g.df["lines"] if u == uid]
    packed_var = None
    for line, names in events:
        if line > _span(block[p_idx])[1]:
            packed_var = next((n for n, v in names.items() if v == packed), None)
            break
    if packed_var is None:
        raise refuse(call_line, f"self.{attr}(...) is not assigned to a variable")
    bound_at: dict[int, tuple[int, str]] = {}
    for i in range(p_idx + 1, len(block)):
        lo, hi = _span(block[i])
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
    if _span(block[end])[1] >= region_start:
        return None
    ran = {i for i, op in enumerate(g.ops) for u, line in op["at"] if u == uid and _span(block[p_idx + 1])[0] <= line <= _span(block[end])[1]}
    if any(g.ops[i]["op"] not in LAYOUT for i in ran):
        raise refuse(_span(block[p_idx + 1])[0], "the statements that cut the packed output also compute something else")
    names = tuple(bound_at[n][1] for n in cut)
    stores = _binds(block[p_idx + 1:end + 1]) - set(names)
    later = [s for s in func.body if _span(s)[0] > _span(block[end])[1]] + list(block[end + 1:])
    if any(_live(n, later) for n in stores):
        raise refuse(_span(block[p_idx + 1])[0], "the statements that cut the packed output bind other variables used later")
    heads = _attr_of(scalars, q_heads, ("num_heads", "num_attention_heads", "n_head", "n_heads", "num_head")) \
        or _attr_like(scalars, q_heads, ("head",), ("kv", "key_value", "group", "query_groups"))
    kv = kv_heads
    kv_attr = heads if kv == q_heads else (_attr_of(scalars, kv, ("num_kv", "num_key_value_heads", "num_kv_heads", "n_kv_heads", "kv_heads"))
                                           or _attr_like(scalars, kv, ("kv", "key_value", "group"), ()))
    head_attr = _head_attr(head_dim, scalars)
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
            and not call.value.keywords and not _live(packed_var, list(block[end + 1:]) + later)):
        start, receiver = p_idx, ast.get_source_segment(text, call.value) or packed_var
    return SplitPlan(attr, receiver, _span(block[start])[0], _span(block[end])[1], names, tuple(layouts), q_size, kv_size, head_attr,
                     regroup)


def _path(g: Dataflow, src: int, dst: int) -> list[int] | None:
    """Value nodes from ``src`` to ``dst`` along first inputs (the data path of a layout chain)."""
    chain = [dst]
    cur = dst
    for _ in range(400):
        if cur == src:
            return list(reversed(chain))
        p = g.producer.get(cur)
        if p is None or not g.ops[p]["in"]:
            return None
        cur = g.ops[p]["in"][0]
        chain.append(cur)
    return None


def _columns(packed, flat) -> list[int] | None:
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


def _attr_like(scalars: dict[str, Any], value: int, want: tuple[str, ...], avoid: tuple[str, ...]) -> str | None:
    """``self.<attr>`` of an int attribute equal to ``value`` whose name has one of ``want``
    and none of ``avoid`` (a head count, a key/value group count)."""
    for name, v in scalars.items():
        low = name.lower()
        if isinstance(v, int) and not isinstance(v, bool) and v == value and any(w in low for w in want) and not any(a in low for a in avoid):
            return f"self.{name}"
    return None


def _attr_of(scalars: dict[str, Any], value: int, preferred: tuple[str, ...]) -> str | None:
    for name in preferred:
        if scalars.get(name) == value and not isinstance(scalars.get(name), bool):
            return f"self.{name}"
    return None
