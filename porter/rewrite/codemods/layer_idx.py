"""HFC806: give every attention module the index of its decoder layer (``self.layer_idx``).

The attention ``__init__`` gets a ``layer_idx=None`` parameter and stores it; every place that
builds the attention passes ``layer_idx=layer_idx``. When that place is a decoder layer's
``__init__`` without the index, the parameter is threaded one level up the same way, down to
the base model's ``nn.ModuleList([Layer(config) for _ in range(n)])``, whose loop variable
becomes the index (``for layer_idx in range(n)``). A layer built any other way is refused.
"""

from __future__ import annotations

import libcst as cst

from hfcheck.analyzer.remote.index import ClassInfo
from hfcheck.porter.rewrite import cstutil as cu
from hfcheck.porter.rewrite.codemods.base import (
    Codemod,
    add_init_assign,
    assigned,
    init_owner,
    parse,
    save,
)

WHY = "vLLM maps each attention module to its KV-cache slot by the int layer_idx; without it the layer counts as not dispatching"


class LayerIndex(Codemod):
    name = "layer-idx"
    codes = ("HFC806",)

    def apply(self, state) -> None:
        index, roles = state.roles()
        owners: list[ClassInfo] = []
        for _, (cls, _) in roles.attention.items():
            if assigned(index, cls, "layer_idx"):
                continue
            owner = init_owner(index, cls)
            if owner is None:
                continue  # __init__ inherited from transformers: it stores layer_idx
            if owner.name not in [o.name for o in owners]:
                owners.append(owner)
        for owner in owners:
            self._thread(state, owner.name, store=True, depth=0)

    def _thread(self, state, class_name: str, store: bool, depth: int) -> None:
        index = state.index()
        cls = next((c for c in index.classes if c.name == class_name), None)
        if cls is None or depth > 3:
            return
        module = parse(state, cls.file)
        init = cu.the_method(cu.the_class(module, class_name), "__init__")
        if "layer_idx" not in cu.param_names(init):
            module = cu.edit_class(module, class_name, lambda c: cu.edit_method(c, "__init__", lambda f: cu.add_param(f, "layer_idx", "None")))
        if store:
            module = add_init_assign(module, class_name, "layer_idx", "layer_idx", "start")
            state.change("HFC806", cls.file, f"{class_name}.__init__", "takes layer_idx and stores self.layer_idx", WHY)
        save(state, cls.file, module)
        # every class that builds it: the subclasses sharing this __init__ count as the class
        index = state.index()
        builders = {class_name} | {c.name for c in index.classes if "__init__" not in c.methods and any(b.name == class_name for b in index.mro(c)[1:])}
        upstream: list[str] = []
        for file in list(state.files):
            module = parse(state, file)
            t = _PassIndex(builders)
            new = module.visit(t)
            if t.sites:
                save(state, file, new)
                for where in t.sites:
                    state.change("HFC806", file, where, f"passes layer_idx when building {', '.join(sorted(builders & t.built))}", WHY)
            for where in t.refused:
                state.refuse("HFC806", file, where, f"builds {class_name} outside an __init__ or comprehension that knows the layer index")
            upstream.extend(c for c in t.upstream if c not in upstream)
        for c in upstream:
            self._thread(state, c, store=False, depth=depth + 1)


class _PassIndex(cst.CSTTransformer):
    def __init__(self, builders: set[str]):
        self.builders = builders
        self.classes: list[str] = []
        self.funcs: list[tuple[str, list[str]]] = []
        self.comps: list[dict] = []
        self.sites: list[str] = []
        self.refused: list[str] = []
        self.upstream: list[str] = []
        self.built: set[str] = set()

    def visit_ClassDef(self, node):
        self.classes.append(node.name.value)

    def leave_ClassDef(self, original, updated):
        self.classes.pop()
        return updated

    def visit_FunctionDef(self, node):
        self.funcs.append((node.name.value, cu.param_names(node)))

    def leave_FunctionDef(self, original, updated):
        self.funcs.pop()
        return updated

    def _visit_comp(self, node):
        target = node.for_in.target
        self.comps.append({"target": target.value if isinstance(target, cst.Name) else None, "rename": False})

    def _leave_comp(self, updated):
        info = self.comps.pop()
        if info["rename"]:
            return updated.with_changes(for_in=updated.for_in.with_changes(target=cst.Name("layer_idx")))
        return updated

    def visit_ListComp(self, node):
        self._visit_comp(node)

    def leave_ListComp(self, original, updated):
        return self._leave_comp(updated)

    def visit_GeneratorExp(self, node):
        self._visit_comp(node)

    def leave_GeneratorExp(self, original, updated):
        return self._leave_comp(updated)

    def leave_Call(self, original, updated):
        if not (isinstance(updated.func, cst.Name) and updated.func.value in self.builders):
            return updated
        if any(a.keyword is not None and a.keyword.value == "layer_idx" for a in updated.args) or any(a.star for a in updated.args):
            return updated
        where = f"{self.classes[-1]}.{self.funcs[-1][0]}" if self.classes and self.funcs else (self.funcs[-1][0] if self.funcs else "module")
        self.built.add(updated.func.value)
        if self.comps and self.comps[-1]["target"] is not None:
            info = self.comps[-1]
            if info["target"] == "_":
                info["rename"] = True
                value = "layer_idx"
            else:
                value = info["target"]
            self.sites.append(where)
            return cu.add_kwarg(updated, "layer_idx", value)
        if self.funcs:
            name, params = self.funcs[-1]
            if "layer_idx" in params:
                self.sites.append(where)
                return cu.add_kwarg(updated, "layer_idx", "layer_idx")
            if name == "__init__" and self.classes:
                self.sites.append(where)
                if self.classes[-1] not in self.upstream:
                    self.upstream.append(self.classes[-1])
                return cu.add_kwarg(updated, "layer_idx", "layer_idx")
        self.refused.append(where)
        return updated
