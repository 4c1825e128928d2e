"""What vLLM's model registry does with an architecture name, for the release predicted for.

Read from the release's generated table (``analyzer/data/vllm/<version>/tables.json``, from its
wheel: ``scripts/generate_vllm_tables.py``), never from an installed vLLM of another release.
``--model-impl auto`` (vLLM's default, ``ModelRegistry.inspect_model_cls``) picks, for the first
architecture the registry knows:

- ``native``: vLLM's own class;
- ``listed``: an entry of ``_TRANSFORMERS_SUPPORTED_MODELS``: the transformers backend, under the
  backend class the registry names (0.34 moved Gemma, OLMoE, StableLM and Aria there);
- ``fallback``: no entry at all: the transformers backend, when transformers (or ``auto_map``)
  has a class that passes the compatibility gate, else "not supported" (with the release that
  dropped a formerly native class, ``_PREVIOUSLY_SUPPORTED_MODELS``).

Scan, port and the runtime decisions ask here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hfcheck.analyzer.vllm.release import modelled_version, tables


def registry_table(version: str | None = None) -> dict[str, Any]:
    return tables(version)["registry"]


@dataclass(frozen=True)
class AutoResolution:
    """What ``--model-impl auto`` does with a config's ``architectures`` in one release."""

    version: str
    architecture: str | None  # the name the registry resolves (the first it knows), else the first named
    how: str  # native | listed | fallback | unnamed
    backend_class: str | None = None  # listed: the backend class the registry names
    previously_supported: str | None = None  # fallback: the last release with a native class of that name
    hosted_on_backend: tuple[str, ...] = ()  # native: sub-models it builds under names listed to the backend

    @property
    def native(self) -> bool | None:
        """Whether ``auto`` picks a native class (None: no architecture named)."""
        return None if self.how == "unnamed" else self.how == "native"

    @property
    def auto_uses_backend(self) -> bool:
        return self.how in ("listed", "fallback")

    def describe(self) -> str:
        """One line for HFC103 and the serve note."""
        src = f"vLLM {self.version} registry"
        arch = self.architecture
        if self.how == "native":
            line = f"vLLM has a native implementation of {arch} ({src}); `--model-impl auto` would use it"
            if self.hosted_on_backend:
                line += (f"; it builds its language model as {', '.join(self.hosted_on_backend)}, which this release serves through the "
                         "transformers backend")
            return line
        if self.how == "listed":
            return (f"vLLM lists {arch} to the transformers backend ({src}: `_TRANSFORMERS_SUPPORTED_MODELS` -> {self.backend_class}): "
                    "the default `--model-impl auto` serves it through the backend analysed here")
        if self.how == "fallback":
            dropped = f"; vLLM dropped its native {arch} after {self.previously_supported}" if self.previously_supported else ""
            return f"no native vLLM implementation ({src}): vLLM falls back to the transformers backend{dropped}"
        return f"config.json names no architecture ({src}): vLLM has nothing to resolve"


def resolve_auto(architectures: list[str], version: str | None = None) -> AutoResolution:
    """``--model-impl auto``'s choice for ``architectures`` in release ``version`` (default: the one predicted for)."""
    version = version or modelled_version()
    table = registry_table(version)
    if not architectures:
        return AutoResolution(version, None, "unnamed")
    native, listed = set(table["native"]), table["transformers_supported"]
    for arch in architectures:  # vLLM walks the names in order and takes the first it knows
        if arch in listed:
            return AutoResolution(version, arch, "listed", backend_class=listed[arch])
        if arch in native:
            hosts = tuple(a for a in (table.get("native_hosts") or {}).get(arch, ()) if a in listed)
            return AutoResolution(version, arch, "native", hosted_on_backend=hosts)
    previous = (table.get("previously_supported") or {}).get(architectures[0])
    return AutoResolution(version, architectures[0], "fallback", previously_supported=previous)


def vllm_has_native(architectures: list[str]) -> tuple[bool | None, str]:
    """(whether ``auto`` picks a native class, the release whose registry said so)."""
    resolution = resolve_auto(architectures)
    return resolution.native, resolution.version
