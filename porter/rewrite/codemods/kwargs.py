"""HFC804: ``**kwargs`` flow model -> decoder layer -> attention -> attention interface.

Each ``forward`` on the path (the causal-LM wrapper, the base model, every decoder layer,
every attention module) accepts ``**kwargs``, and each call to the next hop passes them on:
the wrapper's ``self.model(...)``, the base model's calls to the layers it loops over, the
layer's ``self.self_attn(...)`` and the attention's call of the bound interface function.
"""

from __future__ import annotations

from collections.abc import Callable

import libcst as cst
import libcst.matchers as m

from hfcheck.analyzer.remote.ast_helpers import dispatch_names, layer_loop_names
from hfcheck.analyzer.remote.roles import auto_map_classes
from hfcheck.porter.rewrite import cstutil as cu
from hfcheck.porter.rewrite.codemods.base import Codemod, parse, save

WHY = "vLLM passes its attention state as keyword arguments through the base model's forward; a hop that drops **kwargs breaks it"

CONSTANT_INDEX = m.SubscriptElement(slice=m.Index(value=m.Integer() | m.UnaryOperation(operator=m.Minus(), expression=m.Integer())))
"""``[0]``, ``[-1]``: in an ``nn.Sequential`` layer list, its embedding or its head."""


class KwargsPropagation(Codemod):
    name = "kwargs"
    codes = ("HFC804",)

    def apply(self, state) -> None:
        index, roles = state.roles()
        hops: list[tuple[str, str, Callable[[cst.Call], bool]]] = []  # (class, file, predicate on calls inside forward)
        list_attrs = {a for a, _, _ in roles.layer_lists}
        attn_attrs = {attr for _, (c, attr) in roles.attention.items() if attr}
        if roles.base_model is not None:
            base = roles.base_model
            autos = auto_map_classes(index, state.config)
            for key, cls in autos.items():
                if key.startswith("AutoModelFor") and cls.name != base.name and "forward" in cls.methods:
                    inner = {a for a, assigns in cls.self_assigns.items() for v, _, method in assigns
                             if method == "__init__" and any(c.name == base.name for c in index.instantiated_classes(cls, v))}
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
                hops.append((owner[0].name, owner[0].file, _name_call(names)))
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



def _name_call(names: set[str]) -> Callable[[cst.Call], bool]:
    """A call of one of ``names`` by its bare name (the attention function the forward dispatches to)."""
    return lambda c: isinstance(c.func, cst.Name) and c.func.value in names

def _self_call(attrs: set[str]):
    return lambda c: any(cu.is_self_attr(c.func, a) for a in attrs)


def _layer_call(list_attrs: set[str], forward_ast, sequential: frozenset[str] = frozenset()):
    """Calls of the layers the base model loops over (``for layer in self.layers[...]: layer(...)``);
    in an ``nn.Sequential`` list a constant index (``self.layers[0](input_ids)``) is its
    embedding or head, which takes no layer kwargs."""

    loop_names = layer_loop_names(forward_ast, list_attrs)

    def one_of(names: set[str] | frozenset[str]) -> m.MatchIfTrue[str]:
        return m.MatchIfTrue(lambda name: name in names)

    loop_call = m.Call(func=m.Name(one_of(loop_names)))
    list_item_call = m.Call(func=m.Subscript(value=cu.self_attr(one_of(list_attrs))))
    sequential_end = m.Call(func=m.Subscript(value=cu.self_attr(one_of(sequential)), slice=[CONSTANT_INDEX]))
    return lambda c: m.matches(c, loop_call) or (m.matches(c, list_item_call) and not m.matches(c, sequential_end))

