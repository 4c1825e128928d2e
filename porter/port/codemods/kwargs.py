"""HFC804: ``**kwargs`` flow model -> decoder layer -> attention -> attention interface.

Each ``forward`` on the path (the causal-LM wrapper, the base model, every decoder layer,
every attention module) accepts ``**kwargs``, and each call to the next hop passes them on:
the wrapper's ``self.model(...)``, the base model's calls to the layers it loops over, the
layer's ``self.self_attn(...)`` and the attention's call of the bound interface function.
"""

from __future__ import annotations

import ast

import libcst as cst

from hfcheck.analyzer.remote.ast_helpers import dispatch_names
from hfcheck.analyzer.remote.roles import auto_map_classes as _auto_map_classes
from hfcheck.porter.port import cstutil as cu
from hfcheck.porter.port.codemods.base import Codemod, parse, save

WHY = "vLLM passes its attention state as keyword arguments through the base model's forward; a hop that drops **kwargs breaks it"


class KwargsPropagation(Codemod):
    name = "kwargs"
    codes = ("HFC804",)

    def apply(self, state) -> None:
        index, roles = state.roles()
        hops: list[tuple[str, str, callable]] = []  # (class, file, predicate on calls inside forward)
        list_attrs = {a for a, _, _ in roles.layer_lists}
        attn_attrs = {attr for _, (c, attr) in roles.attention.items() if attr}
        if roles.base_model is not None:
            base = roles.base_model
            autos = _auto_map_classes(index, state.config)
            for key, cls in autos.items():
                if key.startswith("AutoModelFor") and cls.name != base.name and "forward" in cls.methods:
                    inner = {a for a, assigns in cls.self_assigns.items() for v, _, m in assigns
                             if m == "__init__" and any(c.name == base.name for c in index.instantiated_classes(cls, v))}
                    if inner:
                        hops.append((cls.name, cls.file, _self_call(inner)))
            owner = index.method(base, "forward")
            if owner is not None:
                hops.append((owner[0].name, owner[0].file, _layer_call(list_attrs, owner[1], roles.sequential)))
        for layer in roles.decoder_layers:
            owner = index.method(layer, "forward")
            if owner is not None:
                hops.append((owner[0].name, owner[0].file, _self_call(attn_attrs)))
        for _, (cls, _) in roles.attention.items():
            owner = index.method(cls, "forward")
            if owner is not None:
                names = set(dispatch_names(owner[1]))
                hops.append((owner[0].name, owner[0].file, lambda c, names=names: isinstance(c.func, cst.Name) and c.func.value in names))
        seen = set()
        for class_name, file, predicate in hops:
            if (class_name, file) in seen:
                continue
            seen.add((class_name, file))
            self._hop(state, class_name, file, predicate)

    def _hop(self, state, class_name: str, file: str, predicate) -> None:
        module = parse(state, file)
        cls = cu.top_class(module, class_name)
        func = cu.method(cls, "forward") if cls is not None else None
        if func is None:
            return
        what = []
        name = cu.star_kwargs(func)
        if name is None:
            func = cu.add_star_kwargs(func, "kwargs")
            name = "kwargs"
            what.append("accepts **kwargs")
        passed = []

        def add(node):
            if isinstance(node, cst.Call) and predicate(node) and not any(a.star == "**" for a in node.args):
                passed.append(cu.code(node.func))
                return cu.add_star_kwargs_arg(node, name)
            return None

        func = cu.replace_nodes(func, add)
        if passed:
            what.append(f"passes **{name} to {', '.join(dict.fromkeys(passed))}")
        if not what:
            return
        module = cu.edit_class(module, class_name, lambda c: cu.edit_method(c, "forward", lambda _: func))
        save(state, file, module)
        state.change("HFC804", file, f"{class_name}.forward", "; ".join(what), WHY)


def _self_call(attrs: set[str]):
    return lambda c: any(cu.is_self_attr(c.func, a) for a in attrs)


def _layer_call(list_attrs: set[str], forward_ast, sequential: frozenset[str] = frozenset()):
    """Calls of the layers the base model loops over (``for layer in self.layers[...]: layer(...)``);
    in an ``nn.Sequential`` list a constant index (``self.layers[0](input_ids)``) is its
    embedding or head, which takes no layer kwargs."""

    loop_names: set[str] = set()
    for node in ast.walk(forward_ast):
        if isinstance(node, (ast.For, ast.AsyncFor)):
            attrs = {n.attr for n in ast.walk(node.iter) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self"}
            if attrs & list_attrs:
                t = node.target
                if isinstance(t, ast.Name):
                    loop_names.add(t.id)
                elif isinstance(t, ast.Tuple) and t.elts and isinstance(t.elts[-1], ast.Name):
                    loop_names.add(t.elts[-1].id)

    def predicate(c: cst.Call) -> bool:
        if isinstance(c.func, cst.Name) and c.func.value in loop_names:
            return True
        if not (isinstance(c.func, cst.Subscript) and any(cu.is_self_attr(c.func.value, a) for a in list_attrs)):
            return False
        return not (any(cu.is_self_attr(c.func.value, a) for a in sequential) and _constant_index(c.func))

    return predicate


def _constant_index(subscript: cst.Subscript) -> bool:
    if len(subscript.slice) != 1 or not isinstance(subscript.slice[0].slice, cst.Index):
        return False
    value = subscript.slice[0].slice.value
    if isinstance(value, cst.UnaryOperation) and isinstance(value.operator, cst.Minus):
        value = value.expression
    return isinstance(value, cst.Integer)
