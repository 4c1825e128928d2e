"""HFC301: q/k/v projections vLLM can fuse.

vLLM's qkv fuser rewrites the attention forward from its source and must see each projection
as ``self.q_proj(x)`` followed only by views of its result. v4 code often wraps them in a
one-line helper (``self._shape(self.q_proj(x), bsz, q_len)`` with ``return t.view(...)
.transpose(1, 2)``), which the fuser cannot see through. Such a call, in an attention forward,
is inlined: ``self.q_proj(x).view(bsz, q_len, self.num_heads, self.head_dim).transpose(1, 2)``.
Only helpers whose body is a single ``return`` of their parameters are inlined.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from hfcheck.porter.rewrite import cstutil as cu
from hfcheck.porter.rewrite.codemods.base import Codemod, add_init_assign, parse, save

WHY = "vLLM fuses q/k/v into one QKVParallelLinear only when the forward reads each as self.<proj>(x) followed by views"
ATOMS = (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.Integer, cst.Float, cst.SimpleString)


class InlineProjectionHelpers(Codemod):
    name = "projection-helpers"
    codes = ("HFC301",)

    def apply(self, state) -> None:
        index, roles = state.roles()
        attention = [c for _, (c, _) in roles.attention.items()]
        subclasses = [c for c in index.classes if c not in attention and any(b in attention for b in index.mro(c)[1:])]
        for cls in attention + subclasses:
            if "forward" not in cls.methods:
                continue
            linears = {a for c in index.mro(cls) for a, assigns in c.self_assigns.items() for v, _, method in assigns
                       if method == "__init__" and v.__class__.__name__ == "Call" and getattr(v.func, "attr", getattr(v.func, "id", "")).endswith("Linear")}
            helpers = {}
            for c in index.mro(cls):
                if c.file != cls.file:
                    continue
                module = parse(state, c.file)
                cdef = cu.top_class(module, c.name)
                for s in cu.body_of(cdef) if cdef is not None else []:
                    if isinstance(s, cst.FunctionDef) and s.name.value not in ("forward", "__init__") and s.name.value not in helpers:
                        body = cu.body_of(s)
                        p = s.params
                        returned = cu.simple(body[0]) if len(body) == 1 else None
                        if (isinstance(returned, cst.Return) and returned.value is not None
                                and not p.star_kwarg and not p.kwonly_params and not isinstance(p.star_arg, cst.Param)
                                and all(x.default is None for x in p.params) and not s.decorators):
                            helpers[s.name.value] = ([x.name.value for x in p.params][1:], returned.value)
            if not helpers:
                continue
            module = parse(state, cls.file)
            cdef = cu.the_class(module, cls.name)
            forward = cu.the_method(cdef, "forward")
            inlined: list[str] = []

            def inline(node):
                if not m.matches(node, m.Call(func=cu.self_attr(m.MatchIfTrue(lambda name: name in helpers)))):
                    return None
                params, body = helpers[node.func.attr.value]
                args = [a for a in node.args]
                if len(args) != len(params) or any(a.keyword is not None or a.star for a in args):
                    return None
                if not any(cu.find_calls(a.value, lambda c: any(cu.is_self_attr(c.func, lin) for lin in linears)) for a in args):
                    return None
                values = {p: a.value if isinstance(a.value, ATOMS) else a.value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
                          for p, a in zip(params, args)}
                inlined.append(node.func.attr.value)
                return body.visit(_Substitute(values))

            new_forward = cu.replace_nodes(forward, inline)
            if not inlined:
                continue
            module = cu.replace_top(module, cdef, cu.replace_in_body(cdef, forward, new_forward))
            save(state, cls.file, module)
            names = ", ".join(f"self.{n}(...)" for n in dict.fromkeys(inlined))
            state.change("HFC301", cls.file, f"{cls.name}.forward", f"inlined {names} around the q/k/v projections ({len(inlined)} call(s))", WHY)


class _Substitute(cst.CSTTransformer):
    def __init__(self, values: dict[str, cst.BaseExpression]):
        self.values = values

    def leave_Name(self, original, updated):
        return self.values.get(updated.value, updated)

    def leave_Attribute(self, original, updated):
        return updated.with_changes(attr=original.attr)

    def leave_Arg(self, original, updated):
        return updated.with_changes(keyword=original.keyword)


ACTIVATIONS = {"silu": "silu", "gelu": "gelu", "relu": "relu", "swish": "silu", "gelu_new": "gelu_new", "mish": "mish"}
WHY_GLU = "vLLM fuses gate/up into one GEMM with an act-and-mul kernel only when the activation is a child module (ACT2FN), not a function call"


class ActivationModule(Codemod):
    """HFC302: ``F.silu(self.gate_proj(x)) * self.up_proj(x)`` -> ``self.act_fn(...)`` with
    ``self.act_fn = ACT2FN["silu"]`` (the same function, as the module vLLM's GLU fuser reads)."""

    name = "activation-module"
    codes = ("HFC302",)

    def apply(self, state) -> None:
        index = state.index()
        for cls in index.classes:
            if "forward" not in cls.methods or "__init__" not in cls.methods or not index.is_module(cls):
                continue
            module = parse(state, cls.file)
            cdef = cu.top_class(module, cls.name)
            if cdef is None:
                continue
            forward = cu.the_method(cdef, "forward")
            found: list[str] = []
            attr = next(a for a in ("act_fn", "activation_fn", "act") if a not in cls.self_assigns)

            def swap(node):
                if not m.matches(node, m.BinaryOperation(operator=m.Multiply())):
                    return None
                for side in ("left", "right"):
                    call = getattr(node, side)
                    if not m.matches(call, m.Call(args=[m.Arg(keyword=None)])):
                        continue
                    name = cu.dotted(call.func) or ""
                    short = cu.short(name)
                    if short not in ACTIVATIONS or not (name.startswith(("F.", "torch.", "nn.functional.")) or "functional" in name):
                        continue
                    inner = call.args[0].value
                    if not m.matches(inner, m.Call(func=cu.self_attr())):
                        continue
                    if short == "gelu" and any(a.keyword is not None for a in call.args):
                        continue
                    found.append(ACTIVATIONS[short])
                    new_call = call.with_changes(func=cst.Attribute(cst.Name("self"), cst.Name(attr)))
                    return node.with_changes(**{side: new_call})
                return None

            new_forward = cu.replace_nodes(forward, swap)
            if len(set(found)) != 1:
                continue
            module = cu.replace_top(module, cdef, cu.replace_in_body(cdef, forward, new_forward))

            module = add_init_assign(module, cls.name, attr, f'ACT2FN["{found[0]}"]', "end")
            module = cu.ensure_import(module, "from transformers.activations import ACT2FN\n", "ACT2FN")
            save(state, cls.file, module)
            state.change("HFC302", cls.file, f"{cls.name}.forward", f"the {found[0]} function call -> self.{attr} = ACT2FN[\"{found[0]}\"] (same function, as a module)", WHY_GLU)
