"""HFC809 / HFC810: one ModuleList of decoder layers, and no reads of layer attributes in the
base model's forward.

HFC809: a second list of the *same* decoder-layer class (``self.extra_layers = nn.ModuleList(
[Layer(config, config.num_hidden_layers + i) for i in range(config.num_extra_layers)])``, run
after the first) is folded into the first: ``config.json`` counts them in ``num_hidden_layers``
(and sets the extra count to 0), the second list and its loop go, and the checkpoint's
``extra_layers.i.*`` become ``layers.(n + i).*``. vLLM then splits, caches and serves every
layer like the others (the extra layers now also get the KV cache, as vLLM gives them anyway).
A second list of another class (MTP heads, vision blocks, SSM layers) is refused.

HFC810: ``layer.attr`` read in the base model's forward, where every decoder-layer class sets
``self.attr`` to one constant, is replaced by that constant; an ``if`` whose test becomes a
constant is folded (a guard that can never fire disappears). Anything else is refused (read
``self.config.layer_types[i]`` instead).
"""

from __future__ import annotations

import ast
import json
import re

import libcst as cst
import libcst.matchers as m

from hfcheck.porter.rewrite import cstutil as cu
from hfcheck.porter.rewrite.codemods.base import Codemod, parse, save

WHY_LISTS = "vLLM's pipeline parallel splits the base model along its single ModuleList; with two it refuses PP ('multiple ModuleLists ... not supported yet')"
WHY_READS = "under pipeline parallel the layers of other ranks are placeholders without these attributes (AttributeError)"


class SingleLayerList(Codemod):
    name = "module-lists"
    codes = ("HFC809", "HFC810")

    def apply(self, state) -> None:
        index, roles = state.roles()
        if roles.base_model is not None and len(roles.layer_lists) > 1:
            try:
                self._merge(state, index, roles)
            except ValueError as exc:
                state.refuse("HFC809", roles.base_model.file, roles.base_model.name, str(exc))
        index, roles = state.roles()
        if roles.base_model is not None:
            self._constant_reads(state, index, roles)

    # ------------------------------------------------------------------ HFC809

    def _merge(self, state, index, roles) -> None:
        base = roles.base_model
        if len(roles.layer_lists) != 2:
            raise ValueError(f"{len(roles.layer_lists)} ModuleLists: only a second list of the same decoder layer is folded automatically")
        (main, _, _), (extra, _, _) = roles.layer_lists
        main_value = base.self_assigns[main][0][0]
        extra_value = base.self_assigns[extra][0][0]
        main_cls = index.instantiated_classes(base, main_value)
        extra_cls = index.instantiated_classes(base, extra_value)
        if [c.name for c in main_cls] != [c.name for c in extra_cls] or len(main_cls) != 1:
            raise ValueError(f"self.{extra} holds {', '.join(c.name for c in extra_cls) or 'other modules'}, not the decoder layer of self.{main}: fold it by hand or declare base_model_pp_plan")
        main_count = _range_field(main_value)
        extra_count = _range_field(extra_value)
        if main_count is None or extra_count is None:
            raise ValueError("the layer counts are not range(config.<field>)")
        if not _index_offset_ok(extra_value, main_count):
            raise ValueError(f"the layers of self.{extra} do not take the indices that follow self.{main}")
        module = parse(state, base.file)
        cls = cu.the_class(module, base.name)
        init = cu.the_method(cls, "__init__")
        body = [s for s in cu.body_of(init) if cu.self_assign_of(s)[0] != extra]
        forward = cu.the_method(cls, "forward")
        fbody = cu.body_of(forward)
        loops = [i for i, s in enumerate(fbody) if isinstance(s, cst.For) and f"self.{extra}" in cu.code(s.iter)]
        main_loops = [i for i, s in enumerate(fbody) if isinstance(s, cst.For) and f"self.{main}" in cu.code(s.iter)]
        if len(loops) != 1 or len(main_loops) != 1 or loops[0] < main_loops[0]:
            raise ValueError(f"the forward does not run self.{main} and then self.{extra} in one loop each")
        if any(f"self.{extra}" in cu.code(s) for i, s in enumerate(fbody) if i != loops[0]):
            raise ValueError(f"the forward uses self.{extra} outside its loop")
        fbody = fbody[: loops[0]] + fbody[loops[0] + 1:]
        cls = cu.replace_in_body(cls, init, cu.with_body(init, body))
        cls = cu.replace_in_body(cls, cu.the_method(cls, "forward"), cu.with_body(forward, fbody))
        save(state, base.file, cu.replace_top(module, cu.the_class(module, base.name), cls))
        state.config_edits.append({"op": "merge_layer_count", "layers_field": main_count, "count_field": extra_count,
                                   "default": state.config_value(extra_count, 0)})
        state.weight_rules.append({"kind": "offset_index", "pattern": rf"^(?P<pre>(?:.*\.)?){re.escape(extra)}\.(?P<i>\d+)\.(?P<rest>.*)$",
                                   "template": f"{{pre}}{main}.{{i}}.{{rest}}", "offset": {"field": main_count}})
        state.change("HFC809", base.file, f"{base.name}.__init__", f"folded self.{extra} into self.{main} (config.json: {main_count} += {extra_count}, {extra_count} = 0)", WHY_LISTS)
        state.change("HFC809", base.file, f"{base.name}.forward", f"dropped the loop over self.{extra}: its layers now run in the loop over self.{main} (with the cache, like every layer)", WHY_LISTS)

    # ------------------------------------------------------------------ HFC810

    def _constant_reads(self, state, index, roles) -> None:
        base = roles.base_model
        found = index.method(base, "forward")
        if found is None or found[0].name != base.name:
            return
        list_attrs = {a for a, _, _ in roles.layer_lists}
        constants: dict[str, object] = {}
        for layer in roles.decoder_layers:
            for attr, assigns in layer.self_assigns.items():
                if len(assigns) == 1 and assigns[0][2] == "__init__" and isinstance(assigns[0][0], ast.Constant):
                    constants.setdefault(attr, assigns[0][0].value)
        for layer in roles.decoder_layers:
            for attr in list(constants):
                if attr not in layer.self_assigns:
                    constants.pop(attr)
        module = parse(state, base.file)
        cls = cu.the_class(module, base.name)
        forward = cu.the_method(cls, "forward")
        loop_names = set()
        for s in cu.body_of(forward):
            if isinstance(s, cst.For) and any(f"self.{a}" in cu.code(s.iter) for a in list_attrs):
                loop_names |= cu.names_in(s.target)
        replaced: list[str] = []
        refused: list[str] = []

        def swap(node):
            if m.matches(node, m.Attribute(value=m.Name(m.MatchIfTrue(lambda name: name in loop_names)))):
                if node.attr.value in ("forward", "__call__", "training"):
                    return None
                if node.attr.value in constants:
                    replaced.append(f"{node.value.value}.{node.attr.value}")
                    value = constants[node.attr.value]
                    return cst.parse_expression(json.dumps(value) if isinstance(value, str) else repr(value))
                refused.append(f"{node.value.value}.{node.attr.value}")
            return None

        folded: list[str] = []
        new_forward = cst.ensure_type(forward.visit(_SwapAndFold(swap, folded)), cst.FunctionDef)
        for r in dict.fromkeys(refused):
            state.refuse("HFC810", base.file, f"{base.name}.forward", f"reads {r}, which is not a constant of the layer class: read it from the config (self.config.layer_types[i])")
        if not replaced:
            return
        cls = cu.replace_in_body(cls, forward, new_forward)
        save(state, base.file, cu.replace_top(module, cu.the_class(module, base.name), cls))
        what = f"replaced {', '.join(dict.fromkeys(replaced))} with the constant every layer sets"
        if folded:
            what += f"; removed the check that can never fire ({'; '.join(folded)})"
        state.change("HFC810", base.file, f"{base.name}.forward", what, WHY_READS)


class _SwapAndFold(cst.CSTTransformer):
    """Apply ``swap`` to attribute reads (not to method calls on the layer), then fold the
    ``if`` statements whose test became a comparison of literals."""

    def __init__(self, swap, folded: list[str]):
        self.swap, self.folded = swap, folded

    def leave_Attribute(self, original, updated):
        new = self.swap(updated)
        return updated if new is None else new

    def leave_Call(self, original, updated):
        if isinstance(original.func, cst.Attribute) and not isinstance(updated.func, cst.Attribute):
            return updated.with_changes(func=original.func)  # a method call on the layer stays
        return updated

    def leave_If(self, original, updated):
        if not _constant_test(updated.test):
            return updated
        tree = ast.parse(cu.code(updated.test).strip(), mode="eval")
        value = bool(eval(compile(tree, "<test>", "eval"), {"__builtins__": {}}, {}))  # literals only (checked above)
        self.folded.append(f"`if {cu.code(original.test).strip()}:`")
        if value:
            return cst.FlattenSentinel(list(updated.body.body))
        if updated.orelse is None:
            return cst.RemovalSentinel.REMOVE
        if isinstance(updated.orelse, cst.Else):
            return cst.FlattenSentinel(list(updated.orelse.body.body))
        return updated


def _constant_test(test) -> bool:
    """A comparison between literals only (``"a" != "a"``)."""
    node = ast.parse(cu.code(test).strip(), mode="eval").body
    return all(isinstance(n, (ast.Compare, ast.Constant, ast.cmpop, ast.BoolOp, ast.boolop, ast.UnaryOp, ast.unaryop)) for n in ast.walk(node)) and isinstance(node, (ast.Compare, ast.BoolOp, ast.UnaryOp))


def _range_field(value: ast.AST) -> str | None:
    for n in ast.walk(value):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "range" and len(n.args) == 1:
            arg = n.args[0]
            if isinstance(arg, ast.Attribute) and isinstance(arg.value, ast.Name):
                return arg.attr
    return None


def _index_offset_ok(value: ast.AST, main_count: str) -> bool:
    """The extra layers are built with index ``config.<main_count> + i`` (or without an index)."""
    for n in ast.walk(value):
        if isinstance(n, ast.ListComp) and isinstance(n.elt, ast.Call):
            args = list(n.elt.args[1:]) + [k.value for k in n.elt.keywords if k.arg == "layer_idx"]
            if not args:
                return True
            target = n.generators[0].target
            text = ast.unparse(args[0]).replace(" ", "")
            return isinstance(target, ast.Name) and text in (f"config.{main_count}+{target.id}", f"{target.id}+config.{main_count}")
    return False
