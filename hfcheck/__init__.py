"""hfcheck: will vLLM's transformers backend load, fuse and shard this model?"""

import sys

from hfcheck.shared.version import __version__ as __version__

ABSENT_FROM_VLLM = ("kernels",)
"""Packages transformers changes models with when they are installed, and that no modelled vLLM
release's environment has (``analyzer/data/vllm/<version>/environment.json``; a test holds the
two together). transformers 5.25 requires the ``kernels`` hub, and with it installed every
``@use_kernelized_func`` class gets a ``(*args, **kwargs)`` forward router and
``apply_rotary_pos_emb`` becomes an unregistered module: what vLLM traces (no ``kernels``,
the decorators do nothing) is the plain code. hfcheck analyses models as vLLM's environment
builds them, so these stay unimportable here (``import kernels`` raises; transformers'
availability check sees none), unless imported before hfcheck."""

for _name in ABSENT_FROM_VLLM:
    # None in sys.modules is the import system's documented "blocked" entry; typeshed omits it
    sys.modules.setdefault(_name, None)  # type: ignore[arg-type]
