"""HFC813: a fused q/k/v projection vLLM cannot shard.

``self.Wqkv = nn.Linear(h, 3 * n)`` read as ``q, k, v = self.Wqkv(x).chunk(3, dim=-1)`` (also
through a temporary) becomes three projections ``q_proj``/``k_proj``/``v_proj`` (``n`` each),
called where the chunks were taken; the checkpoint's ``Wqkv.weight`` (and bias) is cut into
thirds along the output rows. That is what vLLM fuses into one QKVParallelLinear and shards.
When the packed output is used for more than the chunk, the projection is kept and the chunk
becomes the readable ``.split((self.q_size, self.kv_size, self.kv_size), dim=-1)`` instead
(no weight change).
"""

from __future__ import annotations

import ast
import re

import libcst as cst
import libcst.matchers as m

from hfcheck.analyzer.remote.checks.packed_qkv import PACKED_NAME
from hfcheck.porter.rewrite import cstutil as cu
from hfcheck.porter.rewrite.codemods.base import Codemod, parse, save

WHY = "vLLM shards q/k/v only as separate projections (qkv fusion) or a packed one read through .split((q, kv, kv)); .chunk(3) stays one replicated GEMM"


PROJECTION = "self.{name} = {linear}({in_features}, {out_features}, bias={bias})\n"
"""One of the three projections the packed one is cut into."""


class PackedQKV(Codemod):
    name = "packed-qkv"
    codes = ("HFC813",)

    def apply(self, state) -> None:
        index, roles = state.roles()
        observed = {p.cls for p in state.observed or []}
        for _name, (cls, attr) in roles.attention.items():
            if cls.name in observed:
                continue  # decided on the original's recorded dataflow (codemods/attention.py)
            linears = {a: v for a, assigns in cls.self_assigns.items() for v, _, method in assigns if method == "__init__" and _is_linear(v)}
            if any(re.fullmatch(r"(q|query)(_proj)?", a) for a in linears):
                continue
            packed = [a for a in linears if PACKED_NAME.search(a)]
            if not packed or "forward" not in cls.methods:
                continue
            try:
                self._split(state, cls, packed[0], attr)
            except ValueError as exc:
                state.refuse("HFC813", cls.file, f"{cls.name}.{packed[0]}", str(exc))

    def _split(self, state, info, packed: str, attn_attr: str | None) -> None:
        module = parse(state, info.file)
        cls = cu.the_class(module, info.name)
        init, forward = cu.method(cls, "__init__"), cu.method(cls, "forward")
        if init is None or forward is None:
            raise ValueError("the class does not define both __init__ and forward")
        init_body = cu.body_of(init)
        lin_at, lin_call = next(((i, v) for i, s in enumerate(init_body) for a, v in [cu.self_assign_of(s)] if a == packed and isinstance(v, cst.Call)), (None, None))
        if lin_call is None or lin_at is None:
            raise ValueError(f"self.{packed} is not assigned in __init__ as one statement")
        in_f, out_f, bias = cu.arg(lin_call, 0, "in_features"), cu.arg(lin_call, 1, "out_features"), cu.arg(lin_call, 2, "bias")
        if in_f is None or out_f is None:
            raise ValueError(f"cannot read the sizes of nn.Linear for self.{packed}")
        third = _third(out_f)
        body = cu.body_of(forward)
        proj_at = chunk_at = None
        packed_name = source = None
        outs: list[str] = []
        for i, s in enumerate(body):
            targets, value = cu.assign_of(s)
            if value is None:
                continue
            if proj_at is None and isinstance(value, cst.Call) and m.matches(value, m.Call(func=cu.self_attr(packed))) and targets and len(targets) == 1:
                proj_at, packed_name = i, targets[0]
                source = cu.code(value.args[0].value) if len(value.args) == 1 and value.args[0].keyword is None else None
                continue
            chunk = _chunk3(value)
            if chunk is not None and targets and len(targets) == 3:
                receiver, dim = chunk
                direct = m.matches(receiver, m.Call(func=cu.self_attr(packed)))
                via = packed_name is not None and m.matches(receiver, m.Name(packed_name))
                if direct or via:
                    if dim not in ("-1", "2"):
                        raise ValueError(f"the chunks are taken along dim {dim}, not the output features")
                    chunk_at, outs = i, targets
                    if direct:
                        source = cu.code(receiver.args[0].value) if len(receiver.args) == 1 and receiver.args[0].keyword is None else None
                        proj_at = None
                    break
        if chunk_at is None:
            raise ValueError(f"self.{packed}(...) is not split with .chunk(3, dim=-1) into three names")
        taken = {a for s in init_body for a, _ in [cu.self_assign_of(s)] if a}
        qn, kn, vn = ("q_proj", "k_proj", "v_proj") if not taken & {"q_proj", "k_proj", "v_proj"} else ("query_proj", "key_proj", "value_proj")
        temp_reused = packed_name is not None and proj_at is not None and sum(cu.count_name(s, packed_name) for s in body) != 2
        source_ok = source is not None and not _reassigned(body, proj_at if proj_at is not None else chunk_at, chunk_at, source)
        if temp_reused or source is None or not source_ok:
            self._readable_split(state, info, module, cls, init_body, lin_at, third, body, chunk_at, packed)
            return
        bias_src = cu.code(bias) if bias is not None else "True"
        linear = "torch.nn.Linear" if "nn" not in cu.bound_names(module) and cu.code(lin_call.func).startswith("torch.nn") else "nn.Linear"
        new_init = [cu.template(PROJECTION, name=n, linear=linear, in_features=in_f.deep_clone(), out_features=third, bias=bias_src)
                    for n in (qn, kn, vn)]
        new_init[0] = cu.carry_leading(init_body[lin_at], new_init[0])
        init = cu.with_body(init, init_body[:lin_at] + new_init + init_body[lin_at + 1:])
        q, k, v = outs
        new_fwd = [cu.template("{out} = self.{proj}({source})\n", out=o, proj=n, source=source) for o, n in ((q, qn), (k, kn), (v, vn))]
        new_fwd[0] = cu.carry_leading(body[chunk_at], new_fwd[0])
        if proj_at is not None:
            new_fwd[0] = cu.carry_leading(body[proj_at], new_fwd[0])
        new_body = []
        for i, s in enumerate(body):
            if i == chunk_at:
                new_body.extend(new_fwd)
            elif i != proj_at:
                new_body.append(s)
        forward = cu.with_body(forward, new_body)
        cls = cu.replace_in_body(cls, cu.the_method(cls, "__init__"), init)
        cls = cu.replace_in_body(cls, cu.the_method(cls, "forward"), forward)
        save(state, info.file, cu.replace_top(module, cu.the_class(module, info.name), cls))
        prefix = rf"(?:^|.*\.){re.escape(attn_attr)}\." if attn_attr else r"(?:^|.*\.)"
        state.weight_rules.append({
            "kind": "chunk_rows", "pattern": rf"^(?P<pre>{prefix}){re.escape(packed)}\.(?P<kind>weight|bias)$",
            "parts": [f"{{pre}}{qn}.{{kind}}", f"{{pre}}{kn}.{{kind}}", f"{{pre}}{vn}.{{kind}}"],
        })
        state.change("HFC813", info.file, f"{info.name}.__init__", f"split self.{packed} into {qn}, {kn}, {vn} ({third} outputs each)", WHY)
        state.change("HFC813", info.file, f"{info.name}.forward", f"{', '.join(outs)} = the three projections of {source} (was {packed}(...).chunk(3))", WHY)

    def _readable_split(self, state, info, module, cls, init_body, lin_at, third, body, chunk_at, packed) -> None:
        targets, value = cu.assign_of(body[chunk_at])
        receiver, _ = _chunk3(value)
        new_value = cu.template_expr("{packed}.split((self.q_size, self.kv_size, self.kv_size), dim=-1)", packed=receiver)
        line = cst.ensure_type(body[chunk_at], cst.SimpleStatementLine)  # found by assign_of: `q, k, v = ....chunk(3)`
        body[chunk_at] = line.with_changes(body=[cst.ensure_type(line.body[0], cst.Assign).with_changes(value=new_value)])
        sizes = [cu.template("self.{attr} = {size}\n", attr=attr, size=third) for attr in ("q_size", "kv_size")]
        init_body = init_body[:lin_at + 1] + sizes + init_body[lin_at + 1:]
        cls = cu.replace_in_body(cls, cu.the_method(cls, "__init__"), cu.with_body(cu.the_method(cls, "__init__"), init_body))
        cls = cu.replace_in_body(cls, cu.the_method(cls, "forward"), cu.with_body(cu.the_method(cls, "forward"), body))
        save(state, info.file, cu.replace_top(module, cu.the_class(module, info.name), cls))
        state.change("HFC813", info.file, f"{info.name}.forward", f"{packed}(...).chunk(3) -> .split((self.q_size, self.kv_size, self.kv_size), dim=-1)", WHY)


def _is_linear(value) -> bool:
    return isinstance(value, ast.Call) and (ast.unparse(value.func).endswith("Linear"))


def _third(out_f: cst.BaseExpression) -> str:
    factors = _factors(out_f)
    threes = [f for f in factors if isinstance(f, cst.Integer) and f.value == "3"]
    if threes and len(factors) > 1:
        rest = list(factors)
        rest.remove(threes[0])
        return " * ".join(cu.code(f) for f in rest)
    return f"({cu.code(out_f)}) // 3"


def _factors(e: cst.BaseExpression) -> list[cst.BaseExpression]:
    if isinstance(e, cst.BinaryOperation) and isinstance(e.operator, cst.Multiply) and not e.lpar:
        return _factors(e.left) + _factors(e.right)
    return [e]


def _chunk3(value):
    """(receiver, dim) of ``x.chunk(3, dim=d)`` / ``torch.chunk(x, 3, dim=d)``."""
    if not isinstance(value, cst.Call):
        return None
    if isinstance(value.func, cst.Attribute) and value.func.attr.value == "chunk":
        if cu.dotted(value.func) == "torch.chunk":
            receiver, n, dim = cu.arg(value, 0, "input"), cu.arg(value, 1, "chunks"), cu.arg(value, 2, "dim")
        else:
            receiver, n, dim = value.func.value, cu.arg(value, 0, "chunks"), cu.arg(value, 1, "dim")
        if n is not None and cu.code(n) == "3":
            return receiver, (cu.code(dim).replace(" ", "") if dim is not None else "0")
    return None


def _reassigned(body, start: int, end: int, name: str) -> bool:
    """Is ``name`` (a plain variable) rebound between statements ``start`` and ``end``?"""
    if not re.fullmatch(r"[A-Za-z_]\w*", name):
        return True
    for s in body[start + 1:end]:
        targets, _ = cu.assign_of(s)
        if targets and name in targets:
            return True
    return False
