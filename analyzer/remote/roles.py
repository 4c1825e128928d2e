"""Which local classes of the remote code play which part, as vLLM will meet them: the
``auto_map`` classes, the base model, its ``nn.ModuleList`` s of decoder layers, the decoder
layer classes and their attention modules. Read with ``ast`` only; shared by the check
families (``checks/``) and ``porter``'s codemods.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Any

from hfcheck.analyzer.remote.ast_helpers import dispatch_names, is_call_to
from hfcheck.analyzer.remote.index import ClassInfo, CodeIndex

ATTENTION_ATTRS = ("self_attn", "attn", "attention", "self_attention", "attn_layer", "mixer")  # mixer: MixFormer, phi-2's first code
_ATTENTION_NAME = re.compile(r"Attention|Attn", re.IGNORECASE)


@dataclass
class Roles:
    """Which local classes play which part, as vLLM will meet them."""

    auto_classes: dict[str, ClassInfo]  # auto_map key -> local class
    base_model: ClassInfo | None
    layer_lists: list[tuple[str, int, str]]  # (attr, line, file) of nn.ModuleList assignments in the base model
    decoder_layers: list[ClassInfo]
    attention: dict[str, tuple[ClassInfo, str | None]]  # class name -> (class, attr in the decoder layer)
    sequential: frozenset[str] = frozenset()  # layer lists that are an nn.Sequential: [0], [-1] are its one-off modules


def auto_map_classes(index: CodeIndex, config: dict[str, Any]) -> dict[str, ClassInfo]:
    auto_map = config.get("auto_map") if isinstance(config, dict) else None
    out: dict[str, ClassInfo] = {}
    if not isinstance(auto_map, dict):
        return out
    for key, value in auto_map.items():
        if not isinstance(key, str):
            continue
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if not isinstance(item, str) or "." not in item:
                continue
            body = item.partition("--")[2] if "--" in item else item
            module, _, cls = body.rpartition(".")
            file = index.by_module.get(module.rpartition(".")[2])
            if file is not None and cls in file.classes:
                out.setdefault(key, file.classes[cls])
    return out


def module_lists(index: CodeIndex, cls: ClassInfo) -> list[tuple[str, ast.expr, int, ClassInfo]]:
    """``self.x = nn.ModuleList(...)`` in ``cls.__init__`` (and its local bases), in source order;
    also ``self.x = nn.Sequential(...)`` holding repeated blocks (MixFormer keeps embedding,
    blocks and head in one), where the value is the comprehensions that build the blocks."""
    out: list[tuple[str, ast.expr, int, ClassInfo]] = []
    for c in index.mro(cls):
        for attr, assigns in c.self_assigns.items():
            for value, line, method in assigns:
                if method != "__init__" or any(a == attr for a, _, _, _ in out):
                    continue
                if is_call_to(index.file_of(c), value, "ModuleList"):
                    out.append((attr, value, line, c))
                elif is_call_to(index.file_of(c), value, "Sequential") and (blocks := _repeated_blocks(c)) is not None:
                    out.append((attr, blocks, line, c))
    order = {id(c): i for i, c in enumerate(index.mro(cls))}
    return sorted(out, key=lambda item: (-order[id(item[3])], item[2]))


def _repeated_blocks(cls: ClassInfo) -> ast.expr | None:
    """The comprehensions of ``cls.__init__`` that build modules (``[Block(config, i) for i in
    range(n)]``): the repeated layers an ``nn.Sequential`` holds beside its one-off modules."""
    init = cls.methods.get("__init__")
    if init is None:
        return None
    comps: list[ast.expr] = [n.elt for n in ast.walk(init) if isinstance(n, (ast.ListComp, ast.GeneratorExp)) and isinstance(n.elt, ast.Call)]
    return ast.List(elts=comps, ctx=ast.Load()) if comps else None


def base_of_head(index: CodeIndex, causal: ClassInfo) -> ClassInfo | None:
    """The base model a causal-LM class wraps (``self.model = XModel(config)``, or under
    ``transformer``/``backbone``/``language_model``)."""
    for attr in ("model", "transformer", "backbone", "language_model"):
        found = index.self_assign(causal, attr)
        if found is not None:
            inst = index.instantiated_classes(found[0], found[1])
            if inst:
                return inst[0]
    return None


def find_roles(index: CodeIndex, config: dict[str, Any]) -> Roles:
    autos = auto_map_classes(index, config)
    base = autos.get("AutoModel")
    if base is None:
        causal = next((c for k, c in autos.items() if k.startswith("AutoModelFor")), None)
        if causal is not None:
            base = base_of_head(index, causal)
    if base is None:
        candidates = [c for c in index.classes if index.is_module(c) and any(index.instantiated_classes(c, v) for _, v, _, _ in module_lists(index, c))]
        base = next((c for c in candidates if not c.name.endswith(("ForCausalLM", "LMHeadModel"))), None) or (candidates[0] if candidates else None)
    lists: list[tuple[str, int, str]] = []
    layers: list[ClassInfo] = []
    sequential: set[str] = set()
    if base is not None:
        for attr, value, line, owner in module_lists(index, base):
            lists.append((attr, line, owner.file))
            if isinstance(value, ast.List):  # the blocks of an nn.Sequential (module_lists)
                sequential.add(attr)
            for cls in index.instantiated_classes(owner, value):
                if not any(cls is c for c in layers):
                    layers.append(cls)
    attention: dict[str, tuple[ClassInfo, str | None]] = {}
    for layer in layers:
        for c in index.mro(layer):
            for attr, assigns in c.self_assigns.items():
                for value, _, method in assigns:
                    if method != "__init__":
                        continue
                    for cls in index.instantiated_classes(c, value):
                        if attr in ATTENTION_ATTRS or _ATTENTION_NAME.search(cls.name):
                            attention.setdefault(cls.name, (cls, attr))
    # a wrapper (norm -> attention -> norm) that does not dispatch itself: look one level in
    for name, (cls, _attr) in list(attention.items()):
        found = index.method(cls, "forward")
        if found is None or dispatch_names(found[1]):
            continue
        inner = [
            c
            for owner in index.mro(cls)
            for a, assigns in owner.self_assigns.items()
            for value, _, method in assigns
            if method == "__init__"
            for c in index.instantiated_classes(owner, value)
            if (a in ATTENTION_ATTRS or _ATTENTION_NAME.search(c.name)) and c is not cls
        ]
        dispatching = [c for c in inner if (m := index.method(c, "forward")) and dispatch_names(m[1])]
        if dispatching:
            del attention[name]
            for c in dispatching:
                attention.setdefault(c.name, (c, None))
    if not attention:
        for cls in index.classes:
            if _ATTENTION_NAME.search(cls.name) and index.is_module(cls) and "forward" in cls.methods and not index.is_pretrained_model(cls):
                attention.setdefault(cls.name, (cls, None))
    return Roles(autos, base, lists, layers, attention, frozenset(sequential))
