"""transformers APIs that old remote code still imports, and the release each vanished in.

Every ``gone_in`` / ``last_seen`` pair was read from the published wheels (the file or the
definition is present in ``last_seen`` and absent in ``gone_in``): 4.47.1, 4.48.0, 4.52.4,
4.53.0, 4.54.0, 4.55.0, 4.57.6, 5.0.0, 5.2.0, 5.3.0, 5.4.0, 5.5.0, 5.10.1, 5.20.2, 5.22.0,
5.23.0, 5.24.0. Beside them, ``data/transformers_removed.json`` (``scripts/generate_removed_apis.py``) holds
every module and public name of the modules remote code imports from that 4.57.6 had and a
5.x release lacks, read off the releases themselves: an import the curated entries do not
know is matched there (``generated``), with the first surveyed release that lacks it.
Whether the *installed* transformers still has each one is asked at run time
(``installed_has``): a module is looked up with ``importlib.util.find_spec`` and a name with
``getattr`` on the installed, trusted transformers; the remote files are never imported.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any


@dataclass(frozen=True)
class RemovedAPI:
    kind: str  # "module" (an import of it or below it), "name" (an imported name), "attr" (``x.<attr>`` anywhere)
    names: tuple[str, ...]  # dotted: modules, or module.Name where it used to live; attr: the attribute
    gone_in: str
    last_seen: str
    replacement: str

    @property
    def label(self) -> str:
        return self.names[0]


REMOVED: tuple[RemovedAPI, ...] = (
    RemovedAPI(
        "module", ("transformers.modeling_attn_mask_utils",), "5.24", "5.23",
        "build masks with transformers.masking_utils (create_causal_mask / create_sliding_window_causal_mask), or leave them to the attention interface",
    ),
    RemovedAPI("module", ("transformers.utils.fx",), "5.0", "4.57", "drop HFTracer support; torch.fx / torch.export work on v5 models"),
    RemovedAPI(
        "name", ("transformers.models.llama.modeling_llama.LlamaFlashAttention2", "transformers.LlamaFlashAttention2"), "4.48", "4.47",
        "use LlamaAttention, which dispatches through ALL_ATTENTION_FUNCTIONS for every backend",
    ),
    RemovedAPI(
        "name", ("transformers.models.llama.modeling_llama.LlamaSdpaAttention", "transformers.LlamaSdpaAttention"), "4.48", "4.47",
        "use LlamaAttention, which dispatches through ALL_ATTENTION_FUNCTIONS for every backend",
    ),
    RemovedAPI("name", ("transformers.cache_utils.HybridCache", "transformers.HybridCache"), "5.0", "4.57", "use DynamicCache (per-layer sliding windows come from config.layer_types)"),
    RemovedAPI(
        "name", ("transformers.cache_utils.MambaCache", "transformers.MambaCache", "transformers.models.mamba.modeling_mamba.MambaCache"), "5.5", "5.4",
        "keep the recurrent state in your own cache class (vLLM serves no SSM layers through this backend anyway)",
    ),
    RemovedAPI(
        "name", ("transformers.utils.is_torch_fx_available", "transformers.utils.import_utils.is_torch_fx_available", "transformers.is_torch_fx_available"), "5.0", "4.57",
        "delete the `if is_torch_fx_available(): ... torch.fx.wrap(...)` block",
    ),
    RemovedAPI("attr", ("from_legacy_cache",), "5.0", "4.57", "pass and return Cache objects (DynamicCache(config=...)); tuples of tensors are gone"),
    RemovedAPI("attr", ("to_legacy_cache",), "5.0", "4.57", "return the Cache object itself"),
    RemovedAPI("attr", ("get_usable_length",), "4.54", "4.53", "use cache.get_seq_length(layer_idx)"),
    RemovedAPI("attr", ("seen_tokens",), "4.54", "4.53", "use cache.get_seq_length()"),
)

_ATTR_OWNER = "transformers.cache_utils.DynamicCache"
GENERATED_REPLACEMENT = "no drop-in replacement is recorded: see transformers' v5 migration guide (MIGRATION_GUIDE_V5.md) for its successor"


@cache
def generated_table() -> dict[str, Any]:
    return json.loads(resources.files("hfcheck.analyzer").joinpath("data/transformers_removed.json").read_text())


def _generated(module: str, name: str | None) -> RemovedAPI | None:
    """An import of a module or name the releases show removed (``data/transformers_removed.json``)."""
    table = generated_table()
    parts = module.split(".")
    for i in range(len(parts), 0, -1):  # the module itself, or a package above it, is gone
        span = table["modules"].get(".".join(parts[:i]))
        if span:
            return RemovedAPI("module", (".".join(parts[:i]),), span[1], span[0], GENERATED_REPLACEMENT)
    if name:
        span = (table["names"].get(module) or {}).get(name)
        if span:
            return RemovedAPI("name", (f"{module}.{name}",), span[1], span[0], GENERATED_REPLACEMENT)
    return None


@cache
def installed_has(dotted: str, kind: str) -> bool:
    """Does the installed transformers still provide ``dotted``? (trusted, installed code)."""
    try:
        if kind == "module":
            return importlib.util.find_spec(dotted) is not None
        if kind == "attr":
            module, _, cls = _ATTR_OWNER.rpartition(".")
            return hasattr(getattr(importlib.import_module(module), cls), dotted)
        module, _, name = dotted.rpartition(".")
        return hasattr(importlib.import_module(module), name)
    except Exception:  # noqa: BLE001 - not importable: the API is not there
        return False


def transformers_version() -> str:
    try:
        import transformers

        return transformers.__version__
    except Exception:  # noqa: BLE001  # pragma: no cover
        return "?"


def match_import(module: str, name: str | None) -> RemovedAPI | None:
    """The removed API an absolute import refers to (``import module`` / ``from module import name``)."""
    qualified = f"{module}.{name}" if name else module
    for api in REMOVED:
        if api.kind == "module" and any(module == m or module.startswith(m + ".") or qualified == m for m in api.names):
            return api
        if api.kind == "name" and qualified in api.names:
            return api
    return _generated(module, name) if module == "transformers" or module.startswith("transformers.") else None


ADJACENT = {("4.57.6", "5.0.0")}
"""Surveyed release pairs with no release between them: the removal's release is exact."""


def when_removed(api: RemovedAPI) -> str:
    """When the API went, as precisely as the evidence says: the curated entries and adjacent
    surveyed releases name the release; a span of surveyed releases only bounds it."""
    if api.replacement != GENERATED_REPLACEMENT or (api.last_seen, api.gone_in) in ADJACENT:
        return f"removed in transformers {api.gone_in} (last in {api.last_seen})"
    return f"removed between transformers {api.last_seen} and {api.gone_in}"


def match_attribute(attr: str) -> RemovedAPI | None:
    for api in REMOVED:
        if api.kind == "attr" and attr in api.names:
            return api
    return None


def still_installed(api: RemovedAPI) -> bool:
    if api.kind == "attr":
        return installed_has(api.names[0], "attr")
    return any(installed_has(n, api.kind) for n in api.names)
