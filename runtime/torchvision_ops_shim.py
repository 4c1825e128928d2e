"""Copied into vLLM's CPU environment as ``_hfcheck_torchvision_ops`` (with a ``.pth`` line that
imports it): lets torchvision's Python half import over the CPU build of torch.

PyPI's torchvision wheel is built against torch's CUDA build; its C extension (``_C.so``) cannot
load beside the CPU build, so hfcheck installs the wheel without it (``runtime.environment``).
torchvision then runs on plain torch ops (its ``transforms.v2``, which transformers' image and
video processors use) except that ``_meta_registrations`` registers fake kernels for
``torchvision::nms`` and ``torchvision::qnms`` unconditionally, which fails ("operator
torchvision::nms does not exist") unless the operators are declared. This module declares the
two schemas, with no kernel, the moment ``torchvision`` is first imported (never before, so no
process pays for importing torch here). Calling either operator raises torch's own "could not
run 'torchvision::nms' with arguments from the 'CPU' backend": a path that reaches a C op fails,
naming it; nothing computes differently.
"""

from __future__ import annotations

import importlib.abc
import sys
from typing import Any

SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
_LIBRARY: list[Any] = []  # keeps the torch.library.Library (and with it the declarations) alive


class _DeclareOnFirstImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "torchvision":
            sys.meta_path.remove(self)
            import torch

            library = torch.library.Library("torchvision", "DEF")
            for schema in SCHEMAS:
                library.define(schema)
            _LIBRARY.append(library)
        return None  # the normal finders import torchvision itself


if not any(isinstance(f, _DeclareOnFirstImport) for f in sys.meta_path):
    sys.meta_path.insert(0, _DeclareOnFirstImport())
