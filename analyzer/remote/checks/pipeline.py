"""Pipeline parallelism, HFC809-810: one ModuleList of decoder layers; no reads of submodule attributes."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from hfcheck.analyzer.remote.ast_helpers import is_self_attr, self_attr_names
from hfcheck.analyzer.remote.checks.base import CodeFinding, RemoteCodeRule
from hfcheck.analyzer.remote.index import CodeIndex
from hfcheck.analyzer.remote.roles import Roles

# --------------------------------------------------------------------------- HFC809 / HFC810: pipeline parallel


def _declares_pp_plan(index: CodeIndex, roles: Roles) -> bool:
    """A ``base_model_pp_plan`` on a config class, or a ``_pp_plan`` on the base model itself
    (the causal-LM wrapper's ``_pp_plan`` covers only ``lm_head``)."""
    if roles.base_model is not None and index.class_attr(roles.base_model, "_pp_plan"):
        return True
    return any("base_model_pp_plan" in cls.class_assigns for cls in index.classes)


def check_pipeline(index: CodeIndex, roles: Roles) -> Iterator[CodeFinding]:
    base = roles.base_model
    if base is None:
        return
    lists = roles.layer_lists
    names = ", ".join(a for a, _, _ in lists)
    if len(lists) > 1:
        if _declares_pp_plan(index, roles):
            yield CodeFinding("HFC809", "pass", lists[0][2], lists[0][1], f"{base.name} holds {len(lists)} ModuleLists ({names}) but declares a pp plan")
        else:
            yield CodeFinding("HFC809", "fail", lists[1][2], lists[1][1],
                              f"{base.name} holds {len(lists)} ModuleLists ({names}): vLLM's pipeline parallel needs exactly one ('multiple ModuleLists ... not supported yet')",
                              "Keep every decoder layer in one nn.ModuleList, or declare base_model_pp_plan on the config class.")
    elif len(lists) == 1:
        yield CodeFinding("HFC809", "pass", lists[0][2], lists[0][1], f"{base.name}.{lists[0][0]} is the only ModuleList: pipeline parallel can split it")
    else:
        yield CodeFinding("HFC809", "fail", base.file, base.line, f"{base.name} holds no nn.ModuleList of decoder layers: vLLM cannot split it for pipeline parallel",
                          "Keep the decoder layers in one nn.ModuleList (e.g. self.layers).")
    yield from _forward_reads(index, roles)


def _forward_reads(index: CodeIndex, roles: Roles) -> Iterator[CodeFinding]:
    """HFC810: reading attributes of submodules (PP swaps them for nn.Identity placeholders)."""
    base = roles.base_model
    found = index.method(base, "forward") if base else None
    if found is None:
        return
    owner, forward = found
    file = index.file_of(owner)
    list_attrs = {a for a, _, _ in roles.layer_lists}
    loop_names: set[str] = set()
    for node in ast.walk(forward):
        if isinstance(node, (ast.For, ast.AsyncFor)) and list_attrs & self_attr_names(node.iter):
            t = node.target
            names = [t] if isinstance(t, ast.Name) else [e for e in getattr(t, "elts", []) if isinstance(e, ast.Name)][-1:]
            loop_names |= {n.id for n in names}
    custom_children = set()
    assert base is not None  # found a forward of it above
    for c in index.mro(base):
        for attr, assigns in c.self_assigns.items():
            for value, _, method in assigns:
                if method == "__init__" and attr not in list_attrs and index.instantiated_classes(c, value):
                    custom_children.add(attr)
    seen = 0
    for node in ast.walk(forward):
        if not isinstance(node, ast.Attribute) or not isinstance(node.ctx, ast.Load):
            continue
        parent = file.parent(node)
        if isinstance(parent, ast.Call) and parent.func is node:
            continue  # a method call on the layer (it exists on placeholders too when it is forward)
        if node.attr in ("__call__", "forward", "training"):
            continue
        base_node = node.value
        target = None
        if isinstance(base_node, ast.Name) and base_node.id in loop_names:
            target = f"{base_node.id}.{node.attr}"
        elif isinstance(base_node, ast.Subscript) and any(is_self_attr(base_node.value, a) for a in list_attrs):
            target = f"{ast.unparse(base_node)}.{node.attr}"
        elif is_self_attr(base_node) and base_node.attr in custom_children:
            target = f"self.{base_node.attr}.{node.attr}"
        if target is None:
            continue
        seen += 1
        yield CodeFinding("HFC810", "warn", owner.file, node.lineno,
                          f"{owner.name}.forward reads {target}: under pipeline parallel a layer on another rank is an nn.Identity placeholder without it",
                          "Read per-layer facts from the config (e.g. `self.config.layer_types[i]`), not from submodule attributes.")
    if not seen:
        yield CodeFinding("HFC810", "pass", owner.file, forward.lineno, f"{owner.name}.forward reads no submodule attributes")


# --------------------------------------------------------------------------- the codes, documented


class PipelineModuleLists(RemoteCodeRule):
    code = "HFC809"
    name = "remote-pp-module-lists"
    impact = "parallel"
    what = "The base model keeps its decoder layers in exactly one nn.ModuleList (or declares a pp plan)."
    why = "Without a pp plan vLLM splits the base model for pipeline parallelism along its single ModuleList; two refuse PP ('multiple ModuleLists ... not supported yet')."
    example = "self.layers = nn.ModuleList(...); self.mtp_layers = nn.ModuleList(...)"
    fix = "Keep all decoder layers in one ModuleList, or declare `base_model_pp_plan` on the config class."
    vllm_source = ("model_executor/models/transformers/base.py::Base.pipeline_parallel",)
    none = None
    observed_by = "HFC601"


class ForwardReadsSubmoduleAttributes(RemoteCodeRule):
    code = "HFC810"
    name = "remote-forward-reads-submodules"
    impact = "parallel"
    what = "The base model's forward does not read attributes of its decoder layers or custom submodules (transformers rule TRF011)."
    why = "Under pipeline parallelism layers on other ranks are nn.Identity placeholders; reading `layer.attention_type` there raises AttributeError."
    example = "for layer in self.layers:\n    mask = masks[layer.attention_type]"
    fix = "Read per-layer facts from the config: `self.config.layer_types[i]`."
    vllm_source = (
        "model_executor/models/transformers/base.py::Base.pipeline_parallel",
        "model_executor/models/utils.py::PPMissingLayer",
    )
    none = None


RULES = (PipelineModuleLists, ForwardReadsSubmoduleAttributes,)
