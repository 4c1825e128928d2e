"""HFC814: ``x.cuda()`` in the model code becomes ``x``.

The loader places the model (transformers by ``device_map``, vLLM by building it under its
device), so a ``.cuda()`` only adds a failure wherever torch has no CUDA: vLLM's CPU build,
the CPU proof of this port. Whatever it moved is created beside the module's other tensors
and follows the module when the loader moves it (buffers, parameters) — the function is the
same. Written with LibCST matchers: only calls of exactly ``<expr>.cuda(...)`` are touched.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m
from libcst.metadata import PositionProvider

from hfcheck.porter.rewrite.codemods.base import Codemod

WHY = "the loader places the model (vLLM builds it under its device); .cuda() fails wherever torch has no CUDA, vLLM's CPU build included"

CUDA_CALL = m.Call(func=m.Attribute(attr=m.Name("cuda")))


class _DropCuda(cst.CSTTransformer):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[int] = []

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        if m.matches(updated, CUDA_CALL):
            self.lines.append(self.get_metadata(PositionProvider, original).start.line)
            return cst.ensure_type(updated.func, cst.Attribute).value  # CUDA_CALL: x.cuda()
        return updated


class DevicePlacement(Codemod):
    name = "device-placement"
    codes = ("HFC814",)

    def apply(self, state) -> None:
        for file, text in list(state.files.items()):
            if ".cuda(" not in text:
                continue
            wrapper = cst.MetadataWrapper(cst.parse_module(text))
            dropper = _DropCuda()
            module = wrapper.visit(dropper)
            if dropper.lines:
                state.files[file] = module.code
                where = ", ".join(f"line {n}" for n in dropper.lines)
                state.change("HFC814", file, where, f"dropped .cuda() ({len(dropper.lines)} call{'s' if len(dropper.lines) > 1 else ''})", WHY)
