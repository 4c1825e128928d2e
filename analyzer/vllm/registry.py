"""What vLLM's model registry holds: read from the installed vLLM where it imports, else from
the table generated from vLLM's source (``scripts/generate_vllm_registry.py`` ->
``analyzer/data/vllm_architectures.json``). Scan, port and the runtime decisions ask here."""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any


@lru_cache(maxsize=1)
def vllm_architecture_table() -> dict[str, Any]:
    data = resources.files("hfcheck.analyzer").joinpath("data/vllm_architectures.json").read_text()
    return json.loads(data)


def vllm_has_native(architectures: list[str]) -> tuple[bool | None, str]:
    """Whether vLLM's registry has a native class: from the installed vLLM when it
    imports, else from the table generated from vLLM's registry."""
    try:  # pragma: no cover - exercised only where vLLM is installed
        import vllm
        from vllm.model_executor.models import registry

        native = set(registry._VLLM_MODELS) - set(registry._TRANSFORMERS_SUPPORTED_MODELS) - set(registry._TRANSFORMERS_BACKEND_MODELS)
        version = f"{vllm.__version__} (installed)"
    except Exception:  # noqa: BLE001 - no usable vLLM installed: the bundled registry table
        table = vllm_architecture_table()
        native, version = set(table["native"]), str(table["vllm_version"])
    if not architectures:
        return None, version
    return any(a in native for a in architectures), version
