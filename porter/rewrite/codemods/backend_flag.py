"""HFC805: ``_supports_attention_backend = True`` on the PreTrainedModel subclass.

Set only once every attention module dispatches through the interface (the flag promises
vLLM exactly that). v4's ``_supports_flash_attn_2`` is renamed to v5's ``_supports_flash_attn``
on the way (the old name is ignored by transformers 5).
"""

from __future__ import annotations

import ast

import libcst as cst

from hfcheck.analyzer.remote.ast_helpers import dispatch_names
from hfcheck.porter.rewrite import cstutil as cu
from hfcheck.porter.rewrite.codemods.base import (
    Codemod,
    Place,
    class_attribute_name,
    parse,
    pretrained_roots,
    save,
    set_class_attribute,
)

TRUE = cst.Name("True")


class BackendFlag(Codemod):
    name = "backend-flag"
    codes = ("HFC805",)

    def apply(self, state) -> None:
        index, roles = state.roles()
        roots = pretrained_roots(index)
        if not roots:
            return
        not_dispatching = [n for n, (c, _) in roles.attention.items() if (m := index.method(c, "forward")) is None or not dispatch_names(m[1])]
        for root in roots:
            current = index.class_attr(root, "_supports_attention_backend")
            module = parse(state, root.file)
            cls = cu.top_class(module, root.name)
            if cls is None:
                continue
            changed = []
            names = [class_attribute_name(s) for s in cu.body_of(cls)]
            if "_supports_flash_attn_2" in names and "_supports_flash_attn" not in names:  # v4 name -> v5 name
                module = module.visit(RenameClassAttribute(root.name, "_supports_flash_attn_2", "_supports_flash_attn"))
                changed.append("renamed _supports_flash_attn_2 (v4) to _supports_flash_attn")
            if current is not None and _src(current[1]) == "True":
                pass
            elif not_dispatching:
                state.refuse("HFC805", root.file, root.name, f"not set: {', '.join(not_dispatching)} still compute attention outside the interface")
            else:
                module = set_class_attribute(module, root.name, "_supports_attention_backend", TRUE, Place.after_last_attribute) or module
                changed.append("set _supports_attention_backend = True")
                if index.class_attr(root, "_supports_sdpa") is None and not state.sdpa_unsupported:  # sdpa is one more backend
                    module = set_class_attribute(module, root.name, "_supports_sdpa", TRUE, Place.after_last_attribute) or module
                    changed.append("set _supports_sdpa = True")
            if changed:
                save(state, root.file, module)
                state.change("HFC805", root.file, root.name, "; ".join(changed),
                             "vLLM's gate is is_backend_compatible() (this flag); without it the class is refused as 'not compatible with vLLM'")


class RenameClassAttribute(cst.CSTTransformer):
    """``old = ...`` -> ``new = ...`` in the body of the top-level class ``cls`` (the value and the
    line's comments stay)."""

    def __init__(self, cls: str, old: str, new: str) -> None:
        super().__init__()
        self.cls, self.old, self.new = cls, old, new

    def leave_ClassDef(self, original: cst.ClassDef, updated: cst.ClassDef) -> cst.ClassDef:
        if updated.name.value != self.cls:
            return updated
        body = [_renamed(s, self.old, self.new) for s in cu.body_of(updated)]
        return cu.with_body(updated, body)


def _renamed(s: cst.BaseStatement, old: str, new: str) -> cst.BaseStatement:
    if class_attribute_name(s) != old:
        return s
    line = cst.ensure_type(s, cst.SimpleStatementLine)
    small = line.body[0]
    if isinstance(small, cst.Assign):
        return line.with_changes(body=[small.with_changes(targets=[cst.AssignTarget(cst.Name(new))])])
    return line.with_changes(body=[cst.ensure_type(small, cst.AnnAssign).with_changes(target=cst.Name(new))])


def _src(node) -> str:
    return ast.unparse(node)
