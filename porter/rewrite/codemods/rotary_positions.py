"""vLLM: a rotary table sized by the code's own cache length must also cover the positions vLLM
passes.

4.x-era attention sizes its rotary table from the sequence it sees plus its own tuple cache
(``cos, sin = self.rotary_emb(value_states, seq_len=kv_seq_len)``) and then indexes it with
``position_ids``. vLLM keeps the KV cache itself and passes only the new tokens with their true
positions, so at a decode step the table has one row and position 7 is out of range
("index 7 is out of bounds for dimension 0 with size 1"). The ``seq_len=`` of such a call in a
forward that receives ``position_ids`` becomes ``max(<it>, position_ids.max() + 1)``: unchanged
whenever the code's own length already covers the positions (transformers, with or without its
cache).
"""

from __future__ import annotations

from functools import partial

import libcst as cst

from hfcheck.porter.rewrite import cstutil as cu
from hfcheck.porter.rewrite.codemods.base import Codemod, parse, save

WIDE = "max({seq}, int(position_ids.max()) + 1) if position_ids is not None else {again}"
"""The table's length, widened to the positions vLLM passes (``{seq}``: the code's own length)."""


class RotaryPositions(Codemod):
    name = "rotary-positions"
    codes = ("HFC801",)

    def apply(self, state) -> None:
        index = state.index()
        for file in list(state.files):
            edits: list[str] = []
            for cls in index.files[file].classes.values():
                forward = cls.methods.get("forward")
                if forward is None or "position_ids" not in [a.arg for a in forward.args.args + forward.args.kwonlyargs]:
                    continue
                edits.append(cls.name)
            if not edits:
                continue
            module = parse(state, file)
            changed: list[str] = []
            for name in edits:
                def widen(func: cst.FunctionDef, owner=name) -> cst.FunctionDef:
                    def swap(node):
                        if not (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and cu.is_self_attr(node.func)
                                and "rotary" in node.func.attr.value.lower()):
                            return None
                        seq = cu.arg(node, 99, "seq_len")
                        if seq is None or "position_ids" in cu.code(seq):
                            return None
                        changed.append(f"{owner}.forward")
                        wide = cu.template_expr(WIDE, seq=seq, again=seq.deep_clone())
                        return node.with_changes(args=[a.with_changes(value=wide) if a.keyword is not None and a.keyword.value == "seq_len"
                                                       else a for a in node.args])

                    return cu.replace_nodes(func, swap)

                module = cu.edit_class(module, name, partial(cu.edit_method, name="forward", fn=widen))
            if changed:
                save(state, file, module)
                for where in dict.fromkeys(changed):
                    state.change("HFC801", file, where, "the rotary table also covers position_ids (seq_len=max(..., position_ids.max() + 1))",
                                 "vLLM keeps the KV cache and passes only new tokens with their true positions; a table sized by the "
                                 "code's own cache would be one row long at a decode step")
