"""HFC805: ``_supports_attention_backend = True`` on the PreTrainedModel subclass.

Set only once every attention module dispatches through the interface (the flag promises
vLLM exactly that). v4's ``_supports_flash_attn_2`` is renamed to v5's ``_supports_flash_attn``
on the way (the old name is ignored by transformers 5).
"""

from __future__ import annotations

import ast

import libcst as cst
import libcst.matchers as m

from hfcheck.analyzer.remote.ast_helpers import dispatch_names
from hfcheck.porter.rewrite import cstutil as cu
from hfcheck.porter.rewrite.codemods.base import Codemod, parse, save

SET_BACKEND = cst.parse_statement("_supports_attention_backend = True\n")
SET_SDPA = cst.parse_statement("_supports_sdpa = True\n")


class BackendFlag(Codemod):
    name = "backend-flag"
    codes = ("HFC805",)

    def apply(self, state) -> None:
        index, roles = state.roles()
        roots = [c for c in index.classes if any(b.rpartition(".")[2] in ("PreTrainedModel", "PretrainedModel") for b in c.bases)]
        if not roots:
            return
        not_dispatching = [n for n, (c, _) in roles.attention.items() if (m := index.method(c, "forward")) is None or not dispatch_names(m[1])]
        for root in roots:
            current = index.class_attr(root, "_supports_attention_backend")
            module = parse(state, root.file)
            cls = cu.top_class(module, root.name)
            if cls is None:
                continue
            body = cu.body_of(cls)
            changed = []
            # v4 name -> v5 name
            has_v5 = any(_class_attr(s) == "_supports_flash_attn" for s in body)
            for i, s in enumerate(body):
                if _class_attr(s) == "_supports_flash_attn_2" and not has_v5:
                    small = cu.simple(s)
                    body[i] = s.with_changes(body=[small.with_changes(targets=[cst.AssignTarget(cst.Name("_supports_flash_attn"))])])
                    changed.append("renamed _supports_flash_attn_2 (v4) to _supports_flash_attn")
            if current is not None and _src(current[1]) == "True":
                pass
            elif not_dispatching:
                state.refuse("HFC805", root.file, root.name, f"not set: {', '.join(not_dispatching)} still compute attention outside the interface")
            else:
                done = False
                for i, s in enumerate(body):
                    if _class_attr(s) == "_supports_attention_backend":
                        small = cu.simple(s)
                        body[i] = s.with_changes(body=[small.with_changes(value=cst.Name("True"))])
                        done = True
                if not done:
                    last = max((i for i, s in enumerate(body) if _class_attr(s) is not None), default=-1)
                    body.insert(last + 1, SET_BACKEND)
                changed.append("set _supports_attention_backend = True")
                if index.class_attr(root, "_supports_sdpa") is None and not state.sdpa_unsupported:  # sdpa is one more backend
                    last = max((i for i, s in enumerate(body) if _class_attr(s) is not None), default=-1)
                    body.insert(last + 1, SET_SDPA)
                    changed.append("set _supports_sdpa = True")
            if changed:
                save(state, root.file, cu.replace_top(module, cls, cu.with_body(cls, body)))
                state.change("HFC805", root.file, root.name, "; ".join(changed),
                             "vLLM's gate is is_backend_compatible() (this flag); without it the class is refused as 'not compatible with vLLM'")


def _class_attr(s) -> str | None:
    """The name a class-body line ``name = ...`` or ``name: T = ...`` binds."""
    small = cu.simple(s)
    if m.matches(small, m.Assign(targets=[m.AssignTarget(target=m.Name())])):
        return small.targets[0].target.value
    if m.matches(small, m.AnnAssign(target=m.Name())):
        return small.target.value
    return None


def _src(node) -> str:
    return ast.unparse(node)
