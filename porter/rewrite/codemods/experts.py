"""HFC808: experts in the layout vLLM replaces with its fused MoE kernel.

- A ModuleList of GLU expert MLPs under another name (``self.moe_experts = nn.ModuleList(
  [Expert(config) for _ in range(n)])``, each ``down(act(gate(x)) * up(x))`` without biases)
  becomes ``self.experts = <Prefix>Experts(config)``: a new class holding ``gate_up_proj
  [E, 2I, H]`` and ``down_proj [E, H, I]`` with the ``forward(hidden_states, top_k_index,
  top_k_weights)`` transformers' own MoE models use. The block's loop over the experts
  (``out = zeros_like(x)``; ``for ... in self.moe_experts: out = out + expert(x) * w``) becomes
  ``out = self.experts(x, top_k_index, top_k_weights)``; the checkpoint's per-expert
  ``gate_proj``/``up_proj``/``down_proj`` weights are stacked (streamed per layer).
- An ``experts`` module whose forward takes the routing weights before the expert indices gets
  its parameters reordered and renamed to ``(hidden_states, top_k_index, top_k_weights)``, and
  every ``self.experts(...)`` call its arguments swapped.
- Biases or Linear layers inside the experts are refused: vLLM's fused MoE for this backend has
  no expert bias, so those experts keep running as plain PyTorch.
"""

from __future__ import annotations

import ast
import re

import libcst as cst
import libcst.matchers as m

from hfcheck.analyzer.remote.ast_helpers import is_call_to
from hfcheck.analyzer.remote.checks.moe import counts_experts, looks_swapped, param_rank
from hfcheck.porter.rewrite import cstutil as cu
from hfcheck.porter.rewrite.codemods.base import Codemod, parse, save

WHY = "vLLM replaces exactly a child named `experts` (3-D gate_up_proj/down_proj, forward(hidden_states, top_k_index, top_k_weights)) with FusedMoE; otherwise the experts run unfused, one matmul per expert"

EXPERTS_DOC = '''"""The experts of {block}, stacked (hfcheck port): gate_up_proj [E, 2I, H], down_proj [E, H, I],
    called as experts(hidden_states, top_k_index, top_k_weights), the layout vLLM replaces with its
    fused MoE kernel."""'''
EXPERTS = '''class {name}(nn.Module):
    {doc}

    def __init__(self, {config_param}):
        super().__init__()
        self.num_experts = {num}
        self.gate_up_proj = nn.Parameter(torch.empty(self.num_experts, 2 * {inter}, {hidden}))
        self.down_proj = nn.Parameter(torch.empty(self.num_experts, {hidden}, {inter}))
        self.act_fn = {act}

    def forward(self, hidden_states, top_k_index, top_k_weights):
        final_hidden_states = torch.zeros_like(hidden_states)
        with torch.no_grad():
            expert_mask = torch.nn.functional.one_hot(top_k_index, num_classes=self.num_experts).permute(2, 1, 0)
            expert_hit = torch.greater(expert_mask.sum(dim=(-1, -2)), 0).nonzero()
        for expert_idx in expert_hit:
            expert_idx = expert_idx[0]
            top_k_pos, token_idx = torch.where(expert_mask[expert_idx])
            current_state = hidden_states[token_idx]
            gate, up = torch.nn.functional.linear(current_state, self.gate_up_proj[expert_idx]).chunk(2, dim=-1)
            current_hidden_states = self.act_fn(gate) * up
            current_hidden_states = torch.nn.functional.linear(current_hidden_states, self.down_proj[expert_idx])
            current_hidden_states = current_hidden_states * top_k_weights[token_idx, top_k_pos, None]
            final_hidden_states.index_add_(0, token_idx, current_hidden_states.to(final_hidden_states.dtype))
        return final_hidden_states
'''


class Refused(Exception):
    pass


class ExpertsLayout(Codemod):
    name = "experts"
    codes = ("HFC808",)

    def apply(self, state) -> None:
        index = state.index()
        for cls in list(index.classes):
            if not index.is_module(cls):
                continue
            for attr, assigns in cls.self_assigns.items():
                for value, _, method in assigns:
                    if method != "__init__" or attr == "experts" or not is_call_to(index.file_of(cls), value, "ModuleList"):
                        continue
                    inner = index.instantiated_classes(cls, value)
                    if not (counts_experts(value) or any(re.search(r"Expert(?!s)", c.name) for c in inner)):
                        continue
                    try:
                        self._stack(state, index, cls, attr, value, inner)
                    except Refused as exc:
                        state.refuse("HFC808", cls.file, f"{cls.name}.{attr}", str(exc))
                    index = state.index()
        index = state.index()
        for cls in list(index.classes):
            for value, _, method in cls.self_assigns.get("experts", []):
                if method != "__init__":
                    continue
                for experts in index.instantiated_classes(cls, value):
                    self._check_params(state, index, experts)
                    self._swap(state, experts.name)
                    index = state.index()

    # ------------------------------------------------------------------ ModuleList -> stacked experts

    def _stack(self, state, index, block, attr: str, value: ast.Call, inner) -> None:
        if not inner:
            raise Refused("the expert class is not defined in the model code")
        expert = inner[0]
        comp = value.args[0] if value.args else None
        if not (isinstance(comp, ast.ListComp) and isinstance(comp.elt, ast.Call) and len(comp.generators) == 1):
            raise Refused("the experts are not built as nn.ModuleList([Expert(config) for _ in range(n)])")
        rng = comp.generators[0].iter
        if not (isinstance(rng, ast.Call) and isinstance(rng.func, ast.Name) and rng.func.id == "range" and len(rng.args) == 1):
            raise Refused("the expert count is not a range(n)")
        num_src = ast.unparse(rng.args[0])
        linears, act_src = self._glu_expert(index, expert)
        gate, up, down = linears
        hidden, inter = gate[1], gate[2]
        if (up[1], up[2]) != (hidden, inter) or (down[1], down[2]) != (inter, hidden):
            raise Refused(f"{expert.name}'s gate/up/down sizes are not (H->I, H->I, I->H)")
        init = expert.methods["__init__"]
        config_param = init.args.args[1].arg if len(init.args.args) > 1 else "config"
        module = parse(state, block.file)
        blockdef = cu.the_class(module, block.name)
        forward = cu.method(blockdef, "forward")
        if forward is None:
            raise Refused("the block has no forward")
        new_forward, routing = self._rewrite_loop(forward, attr)
        existing = cu.bound_names(module) | {c.name for c in index.classes}
        prefix = re.sub(r"(Expert|MLP|Mlp|FFN|Ffn)+$", "", expert.name) or block.name
        name = next(n for n in (f"{prefix}Experts", f"{prefix}StackedExperts", f"{block.name}Experts", f"{block.name}StackedExperts") if n not in existing)
        init_body = cu.body_of(cu.the_method(blockdef, "__init__"))
        at = next(i for i, s in enumerate(init_body) if cu.self_assign_of(s)[0] == attr)  # the index found it in __init__
        block_config = ast.unparse(comp.elt.args[0]) if comp.elt.args else config_param
        new_assign = cu.carry_leading(init_body[at], cu.template("self.experts = {cls}({block_config})\n", cls=name, block_config=block_config))
        blockdef = cu.replace_in_body(blockdef, cu.the_method(blockdef, "__init__"), cu.with_body(cu.the_method(blockdef, "__init__"), init_body[:at] + [new_assign] + init_body[at + 1:]))
        blockdef = cu.replace_in_body(blockdef, cu.the_method(blockdef, "forward"), new_forward)
        if f"self.{attr}" in cu.code(blockdef).replace("self.experts", ""):
            raise Refused(f"{block.name} uses self.{attr} outside the expert loop")
        module = cu.replace_top(module, cu.the_class(module, block.name), blockdef)
        num = num_src.replace(block_config, config_param) if block_config != config_param else num_src
        experts = cu.template(EXPERTS, name=name, doc=cst.SimpleString(EXPERTS_DOC.format(block=block.name)), config_param=config_param,
                              num=num, inter=inter, hidden=hidden, act=act_src)
        module = cu.insert_before_class(module, block.name, [experts.with_changes(leading_lines=[])])
        module = _blank_before(module, name)
        module = cu.ensure_import(module, "import torch\n", "torch")
        module = cu.ensure_import(module, "from torch import nn\n", "nn")
        save(state, block.file, module)
        num_field = re.fullmatch(r"\w+\.(\w+)", num_src)
        state.weight_rules.append({
            "kind": "stack_experts",
            "pattern": rf"^(?P<pre>(?:.*\.)?){re.escape(attr)}\.(?P<e>\d+)\.(?P<proj>{gate[0]}|{up[0]}|{down[0]})\.weight$",
            "num": {"field": num_field.group(1)} if num_field else {"value": int(num_src)} if num_src.isdigit() else {"value": None},
            "gate": gate[0], "up": up[0], "down": down[0],
            "gate_up": "{pre}experts.gate_up_proj", "down_out": "{pre}experts.down_proj",
        })
        state.change("HFC808", block.file, f"{block.name}.__init__", f"self.{attr} (nn.ModuleList of {expert.name}) -> self.experts = {name}(...) with 3-D gate_up_proj/down_proj", WHY)
        state.change("HFC808", block.file, f"{block.name}.forward", f"the loop over self.{attr} -> self.experts({', '.join(routing)})", WHY)
        state.change("HFC808", block.file, name, f"added {name}: stacked experts with forward(hidden_states, top_k_index, top_k_weights)", WHY)

    def _glu_expert(self, index, expert):
        """((gate, up, down) as (attr, in_src, out_src), act source) of a bias-free GLU MLP."""
        init, forward = expert.methods.get("__init__"), expert.methods.get("forward")
        if init is None or forward is None:
            raise Refused(f"{expert.name} does not define __init__ and forward")
        lins, acts = {}, {}
        for attr, assigns in expert.self_assigns.items():
            for value, _, method in assigns:
                if method != "__init__":
                    continue
                if isinstance(value, ast.Call) and ast.unparse(value.func).endswith("Linear"):
                    kw = {k.arg: k.value for k in value.keywords}
                    args = list(value.args)
                    bias = kw.get("bias", args[2] if len(args) > 2 else None)
                    if not (isinstance(bias, ast.Constant) and bias.value is False):
                        raise Refused(f"{expert.name}.{attr} has a bias: vLLM's fused MoE for this backend has no expert bias")
                    in_f = kw.get("in_features", args[0] if args else None)
                    out_f = kw.get("out_features", args[1] if len(args) > 1 else None)
                    lins[attr] = (ast.unparse(in_f), ast.unparse(out_f))
                else:
                    acts[attr] = ast.unparse(value)
        rets = [n for n in ast.walk(forward) if isinstance(n, ast.Return)]
        x = forward.args.args[1].arg if len(forward.args.args) > 1 else None
        body_ok = len(forward.body) == 1 and len(rets) == 1
        ret = rets[0].value if rets else None

        def self_call(node, allowed):
            return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name) and node.func.value.id == "self" and node.func.attr in allowed

        if not (body_ok and self_call(ret, lins) and len(ret.args) == 1):
            raise Refused(f"{expert.name}.forward is not `return self.down(act(self.gate(x)) * self.up(x))`")
        down = ret.func.attr
        prod = ret.args[0]
        if not (isinstance(prod, ast.BinOp) and isinstance(prod.op, ast.Mult)):
            raise Refused(f"{expert.name}.forward is not a gated (GLU) MLP")
        act_call, up_call = prod.left, prod.right
        if self_call(act_call, lins):
            act_call, up_call = up_call, act_call
        if not (isinstance(act_call, ast.Call) and len(act_call.args) == 1 and self_call(act_call.args[0], lins) and self_call(up_call, lins)):
            raise Refused(f"{expert.name}.forward is not a gated (GLU) MLP")
        gate, up = act_call.args[0].func.attr, up_call.func.attr
        for call in (act_call.args[0], up_call):
            if not (len(call.args) == 1 and isinstance(call.args[0], ast.Name) and call.args[0].id == x):
                raise Refused(f"{expert.name}.forward does not apply gate and up to its input")
        if isinstance(act_call.func, ast.Attribute) and isinstance(act_call.func.value, ast.Name) and act_call.func.value.id == "self":
            act_src = acts.get(act_call.func.attr)
            if act_src is None:
                raise Refused(f"{expert.name}.{act_call.func.attr} is not assigned in __init__")
        else:
            act_src = ast.unparse(act_call.func)
        return ((gate, *lins[gate]), (up, *lins[up]), (down, *lins[down])), act_src

    def _rewrite_loop(self, forward: cst.FunctionDef, attr: str):
        body = cu.body_of(forward)
        for i, s in enumerate(body):
            if not isinstance(s, cst.For) or f"self.{attr}" not in cu.code(s.iter):
                continue
            if i == 0:
                break
            targets, init_value = cu.assign_of(body[i - 1])
            if not (targets and len(targets) == 1 and isinstance(init_value, cst.Call) and cu.short(cu.call_name(init_value)) in ("zeros_like", "zeros")):
                raise Refused("the expert loop is not preceded by `out = torch.zeros_like(x)`")
            out = targets[0]
            loop_vars = cu.names_in(s.target)
            calls = cu.find_calls(s, lambda c: m.matches(c.func, m.Name(m.MatchIfTrue(lambda n: n in loop_vars))
                                                         | m.Subscript(value=cu.self_attr(attr))))
            if len(calls) != 1 or len(calls[0].args) != 1:
                raise Refused("the expert loop does not call one expert on one input")
            x_src = cu.code(calls[0].args[0].value)
            used = cu.names_in(s.body) - loop_vars - cu.names_in(calls[0].args[0].value) - {out, "torch", "self", "F", "nn"}
            assigned_in_loop = set()
            for st in cu.body_of(s):
                t, _ = cu.assign_of(st)
                assigned_in_loop |= set(t or [])
            routing = sorted(used - assigned_in_loop)
            if len(routing) != 2:
                raise Refused(f"the expert loop reads {len(routing)} routing tensors ({', '.join(routing)}), expected weights and indices")
            index_name = None
            for cmp in _comparisons(s):
                if isinstance(cmp.left, cst.Name) and cmp.left.value in routing and cu.names_in(cmp.comparisons[0].comparator) & loop_vars:
                    index_name = cmp.left.value
            if index_name is None:
                raise Refused("cannot tell the expert indices from the routing weights in the loop")
            weights_name = next(r for r in routing if r != index_name)
            new = cu.carry_leading(body[i - 1], cu.template("{out} = self.experts({x}, {index}, {weights})\n", out=out, x=x_src, index=index_name,
                                                            weights=weights_name))
            return cu.with_body(forward, body[: i - 1] + [new] + body[i + 1:]), (x_src, index_name, weights_name)
        raise Refused(f"no `for` loop over self.{attr} in the block's forward")

    # ------------------------------------------------------------------ existing `experts`

    def _check_params(self, state, index, experts) -> None:
        for c in index.mro(experts):
            file = index.file_of(c)
            for attr, assigns in c.self_assigns.items():
                for value, _, method in assigns:
                    rank = param_rank(file, value) if method == "__init__" else None
                    if rank is not None and rank != 3:
                        state.refuse("HFC808", c.file, f"{experts.name}.{attr}",
                                     f"a {rank}-D parameter inside the experts (e.g. an expert bias): vLLM's fused MoE has none, so these experts stay unfused (fold or drop it by hand if it is zero)")
                    elif method == "__init__" and (is_call_to(file, value, "Linear") or is_call_to(file, value, "Embedding")):
                        state.refuse("HFC808", c.file, f"{experts.name}.{attr}", "a Linear/Embedding inside the experts module: only 3-D expert parameters can be replaced")

    def _swap(self, state, experts_name: str) -> None:
        index = state.index()
        cls = next((c for c in index.classes if c.name == experts_name), None)
        if cls is None or "forward" not in cls.methods:
            return
        fwd = cls.methods["forward"]
        params = [a.arg for a in fwd.args.args[1:]]
        if len(params) < 3 or not looks_swapped(params[1], params[2]):
            return
        weights, indices = params[1], params[2]
        module = parse(state, cls.file)
        classdef = cu.the_class(module, experts_name)
        func = cu.the_method(classdef, "forward")
        if {"top_k_index", "top_k_weights"} & (cu.names_in(func) - {weights, indices}):
            state.refuse("HFC808", cls.file, f"{experts_name}.forward", "cannot rename the routing arguments: top_k_index/top_k_weights are already used")
            return
        func = cst.ensure_type(func.visit(_Rename({weights: "top_k_weights", indices: "top_k_index"})), cst.FunctionDef)
        plist = list(func.params.params)
        plist[2], plist[3] = plist[3].with_changes(comma=plist[2].comma), plist[2].with_changes(comma=plist[3].comma)
        func = func.with_changes(params=func.params.with_changes(params=plist))
        module = cu.replace_top(module, classdef, cu.replace_in_body(classdef, cu.the_method(classdef, "forward"), func))
        save(state, cls.file, module)
        state.change("HFC808", cls.file, f"{experts_name}.forward", f"({', '.join(params[:3])}) -> ({params[0]}, top_k_index, top_k_weights)", WHY)
        # callers: self.experts(a, weights, indices) -> self.experts(a, indices, weights)
        index = state.index()
        for block in index.classes:
            if not any(experts_name in {c.name for c in index.instantiated_classes(block, v)} for v, _, method in block.self_assigns.get("experts", []) if method == "__init__"):
                continue
            module = parse(state, block.file)
            swapped = []

            def swap(node):
                if m.matches(node, m.Call(func=cu.self_attr("experts"))):
                    args = list(node.args)
                    pos = [i for i, a in enumerate(args) if a.keyword is None and not a.star]
                    if len(pos) >= 3:
                        a, b = pos[1], pos[2]
                        args[a], args[b] = args[b].with_changes(comma=args[a].comma), args[a].with_changes(comma=args[b].comma)
                    names = {weights: "top_k_weights", indices: "top_k_index"}
                    args = [x.with_changes(keyword=cst.Name(names[x.keyword.value])) if x.keyword is not None and x.keyword.value in names else x for x in args]
                    swapped.append(block.name)
                    return node.with_changes(args=args)
                return None

            blockdef = cu.the_class(module, block.name)
            new = cu.replace_nodes(blockdef, swap)
            if swapped:
                save(state, block.file, cu.replace_top(module, blockdef, new))
                state.change("HFC808", block.file, f"{block.name}.forward", "calls self.experts(hidden_states, top_k_index, top_k_weights)", WHY)


class _Rename(cst.CSTTransformer):
    def __init__(self, names: dict[str, str]):
        self.names = names

    def leave_Name(self, original, updated):
        return updated.with_changes(value=self.names[updated.value]) if updated.value in self.names else updated

    def leave_Attribute(self, original, updated):
        return updated.with_changes(attr=original.attr)

    def leave_Arg(self, original, updated):
        return updated.with_changes(keyword=original.keyword)


def _comparisons(node) -> list[cst.Comparison]:
    """Every ``a == b`` under ``node`` (where an expert loop selects its tokens)."""
    return [cst.ensure_type(c, cst.Comparison) for c in m.findall(node, m.Comparison(comparisons=[m.ComparisonTarget(operator=m.Equal())]))]


def _blank_before(module: cst.Module, name: str) -> cst.Module:
    """Two blank lines above the new class, and above the class that follows it."""
    body = list(module.body)
    for i, s in enumerate(body):
        if m.matches(s, m.ClassDef(name=m.Name(name))):
            body[i] = s.with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])
            if i + 1 < len(body):
                nxt = body[i + 1]
                body[i + 1] = nxt.with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()] + [line for line in nxt.leading_lines if line.comment is not None])
    return module.with_changes(body=body)
